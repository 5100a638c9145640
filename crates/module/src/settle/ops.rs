//! The ops of `settle.lua`, each as the script does it. Before its first write, an op
//! checks what the script would fail on later (a key of another type, a field that is no
//! number), so that such a call gets an error and changes nothing.

use redis_module::{KeyType, RedisError};

use super::{error, lines, lua_number, text, Field, Ledger, Open, QUEUE_LAST, RESOLVE_AGAIN_MS};

type Items = Result<Vec<Field>, RedisError>;

fn costs_expected() -> RedisError {
    error("ERR CELLRATE.SETTLE: costs expected")
}

fn facts_expected() -> RedisError {
    error("ERR CELLRATE.SETTLE: facts expected")
}

/// A due (`u`) as the script compares it: an error when it is no number.
fn due_of(u: &[u8]) -> Result<f64, RedisError> {
    lua_number(u).ok_or_else(|| error("ERR CELLRATE.SETTLE: a record's due is no number"))
}

/// The place (from 1) of the first of the hold's keys with `most` live holds, if any.
fn crowded(l: &Ledger, open: &Open) -> Result<Option<usize>, RedisError> {
    let now = l.now.to_string();
    for (i, name) in open.names.iter().enumerate() {
        let z = l.per_key(name);
        l.write("ZREMRANGEBYSCORE", &[&z, b"-inf", now.as_bytes()])?;
        if l.read_int("ZCARD", &[&z])? as f64 >= open.most {
            return Ok(Some(i + 1));
        }
    }
    Ok(None)
}

pub(super) fn open(l: &Ledger, open: &Open) -> Items {
    let (index, key, holds) = (l.index(), l.record(), l.holds());
    l.sorted_set_or_none(index)?;
    let exists = l.read_int("EXISTS", &[key])? == 1;
    let joined = open.names.join(&b'\n');
    if !exists {
        l.sorted_set_or_none(holds)?;
        if open.hold > 0 {
            for name in open.names.iter().copied().chain(lines(&joined)) {
                l.sorted_set_or_none(&l.per_key(name))?;
            }
        }
    }
    let now = l.now.to_string();
    l.write("ZREMRANGEBYSCORE", &[index, b"-inf", now.as_bytes()])?;
    if exists {
        return Ok(vec![text(b"0"), text(b"0")]);
    }
    l.write("ZREM", &[holds, key])?;
    if open.hold > 0 {
        if let Some(at) = crowded(l, open)? {
            return Ok(vec![
                text(b"3"),
                text(b"0"),
                text(at.to_string().as_bytes()),
            ]);
        }
    }
    if l.read_int("ZCARD", &[holds])? as f64 >= open.max {
        return Ok(vec![text(b"2"), text(b"0")]);
    }
    let mut evicted: i64 = 0;
    while (l.read_int("ZCARD", &[index])? + l.read_int("ZCARD", &[holds])?) as f64 >= open.max {
        let oldest = l.write_fields("ZPOPMIN", &[index])?;
        let Some(Some(record)) = oldest.into_iter().next() else {
            break;
        };
        evicted += l.write_int("DEL", &[&record])?;
    }
    l.write(
        "HSET",
        &[key, b"s", b"p", b"c", open.check, b"o", &l.now_us],
    )?;
    if open.hold > 0 {
        let due = (l.now + open.hold).to_string();
        l.write("HSET", &[key, b"u", due.as_bytes()])?;
        if !open.names.is_empty() {
            l.write("HSET", &[key, b"b", &joined])?;
        }
        let ttl = (open.hold + open.window).to_string();
        l.write("PEXPIRE", &[key, ttl.as_bytes()])?;
        l.write("ZADD", &[holds, due.as_bytes(), key])?;
        l.count(key)?;
    } else {
        let (ttl, until) = (open.window.to_string(), (l.now + open.window).to_string());
        l.write("PEXPIRE", &[key, ttl.as_bytes()])?;
        l.write("ZADD", &[index, until.as_bytes(), key])?;
    }
    Ok(vec![text(b"1"), text(evicted.to_string().as_bytes())])
}

pub(super) fn decide(l: &Ledger, facts: Option<&[u8]>) -> Items {
    let key = l.record();
    if l.state_of(key)?.as_deref() != Some(b"p") {
        return Ok(vec![text(b"0")]);
    }
    let facts = facts.ok_or_else(facts_expected)?;
    l.write("HSET", &[key, b"s", b"d", b"f", facts, b"t", &l.now_us])?;
    Ok(vec![text(b"1")])
}

/// Before `k` is moved out of the live holds (`unhold`): what that move writes to.
fn guard_unhold(l: &Ledger, k: &[u8]) -> Result<(), RedisError> {
    if l.held(k)? {
        l.guard_release(k)?;
        l.sorted_set_or_none(l.index())?;
    }
    Ok(())
}

pub(super) fn forget(l: &Ledger) -> Items {
    let (index, key, holds) = (l.index(), l.record(), l.holds());
    l.sorted_set_or_none(holds)?;
    l.sorted_set_or_none(index)?;
    if l.held(key)? {
        l.guard_release(key)?;
    }
    l.release(key)?;
    l.write("DEL", &[key])?;
    l.write("ZREM", &[index, key])?;
    l.write("ZREM", &[holds, key])?;
    Ok(vec![text(b"1")])
}

pub(super) fn claim(l: &Ledger, costs: Option<&[u8]>) -> Items {
    let key = l.record();
    let s = match l.state_of(key)? {
        None => return Ok(vec![text(b"0")]),
        Some(s) if s == b"p" => return Ok(vec![text(b"3")]),
        Some(s) => s,
    };
    let mut r = l.read_fields("HMGET", &[key, b"c", b"f", b"o", b"t", b"k", b"u"])?;
    r.resize(6, None);
    if s == b"d" {
        if let Some(u) = &r[5] {
            if due_of(u)? <= l.now as f64 {
                return Ok(vec![text(b"4")]);
            }
        }
        let costs = costs.ok_or_else(costs_expected)?;
        l.sorted_set_or_none(l.holds())?;
        guard_unhold(l, key)?;
        l.write("HSET", &[key, b"s", b"s", b"k", costs])?;
        l.unhold(key)?;
        r.truncate(4);
        return Ok([vec![text(b"1")], r, vec![Some(l.now_us.clone())]].concat());
    }
    if r[4].as_deref() == Some(b"") {
        return Ok(vec![text(b"4")]);
    }
    let settled = r[4].take();
    r.truncate(4);
    Ok([vec![text(b"2"), settled], r, vec![Some(l.now_us.clone())]].concat())
}

pub(super) fn reopen(l: &Ledger, facts: Option<&[u8]>) -> Items {
    let (index, key, holds) = (l.index(), l.record(), l.holds());
    if l.state_of(key)?.as_deref() != Some(b"s") {
        return Ok(vec![text(b"1")]);
    }
    let facts = facts.ok_or_else(facts_expected)?;
    let due = l.read_field("HGET", &[key, b"u"])?;
    if let Some(due) = &due {
        l.sorted_set_or_none(index)?;
        if l.read_field("ZSCORE", &[index, key])?.is_some() {
            l.sorted_set_or_none(holds)?;
            let score = std::str::from_utf8(due)
                .ok()
                .and_then(|d| d.parse::<f64>().ok());
            if score.is_none_or(f64::is_nan) {
                return Err(error("ERR CELLRATE.SETTLE: a record's due is no score"));
            }
            l.guard_counts(key)?;
        }
    }
    l.write("HSET", &[key, b"s", b"d", b"f", facts])?;
    l.write("HDEL", &[key, b"k"])?;
    let due = l.read_field("HGET", &[key, b"u"])?;
    if let Some(due) = due {
        if l.write_int("ZREM", &[index, key])? == 1 {
            l.write("ZADD", &[holds, &due, key])?;
            l.count(key)?;
        }
    }
    Ok(vec![text(b"1")])
}

pub(super) fn due(l: &Ledger, most: i64) -> Items {
    let holds = l.holds();
    let (now, most) = (l.now.to_string(), most.to_string());
    let args: [&[u8]; 6] = [
        holds,
        b"-inf",
        now.as_bytes(),
        b"LIMIT",
        b"0",
        most.as_bytes(),
    ];
    let ready = l.read_fields("ZRANGEBYSCORE", &args)?;
    let ready: Vec<Vec<u8>> = ready.into_iter().flatten().collect();
    let states = ready
        .iter()
        .map(|k| l.state_of(k))
        .collect::<Result<Vec<Field>, RedisError>>()?;
    for (k, s) in ready.iter().zip(states) {
        if s.as_deref() != Some(b"p") {
            guard_unhold(l, k)?;
        }
    }
    let mut out = vec![Some(l.now_us.clone())];
    let again = (l.now + RESOLVE_AGAIN_MS).to_string();
    for k in &ready {
        let k = k.as_slice();
        // Read again where the script reads it: after the records before it.
        let s = l.state_of(k)?;
        if s.as_deref() == Some(b"p") {
            l.write("ZADD", &[holds, again.as_bytes(), k])?;
            let mut r = l.read_fields("HMGET", &[k, b"c", b"o"])?;
            r.resize(2, None);
            out.extend([text(k), r[0].take(), text(b""), r[1].clone(), r[1].take()]);
        } else {
            l.unhold(k)?;
            l.write("ZREM", &[holds, k])?;
        }
        if s.as_deref() == Some(b"d") {
            l.write("HSET", &[k, b"s", b"s", b"k", b""])?;
            let mut r = l.read_fields("HMGET", &[k, b"c", b"f", b"o", b"t"])?;
            r.resize(4, None);
            out.push(text(k));
            out.extend(r);
        }
    }
    Ok(out)
}

pub(super) fn queue(l: &Ledger) -> Items {
    let (key, holds, q) = (l.record(), l.holds(), l.queue());
    l.sorted_set_or_none(holds)?;
    if !l.held(key)? {
        return Ok(vec![text(b"1")]);
    }
    match l.type_of(key) {
        // Expired while still counted a live hold: queuing it would write a hash that
        // never expires.
        KeyType::Empty => return Ok(vec![text(b"1")]),
        KeyType::Hash => {}
        _ => return Err(RedisError::WrongType),
    }
    if l.read_field("HGET", &[key, b"q"])?.is_some() {
        return Ok(vec![text(b"1")]);
    }
    l.sorted_set_or_none(q)?;
    l.write("HSET", &[key, b"q", q])?;
    l.write("ZADD", &[q, b"NX", &l.now_us, key])?;
    let left = l.read_int("PTTL", &[key])?;
    if left > l.read_int("PTTL", &[q])? {
        l.write("PEXPIRE", &[q, left.to_string().as_bytes()])?;
    }
    Ok(vec![text(b"1")])
}

/// The first record of queue `q`'s first 32 that `oldest` would claim, checked: an
/// error if the script would fail before it (a due that is no number) or on it.
fn oldest_candidate(l: &Ledger, costs: Option<&[u8]>) -> Result<(), RedisError> {
    let q = l.queue();
    l.sorted_set_or_none(q)?;
    for k in l
        .read_fields("ZRANGE", &[q, b"0", QUEUE_LAST])?
        .into_iter()
        .flatten()
    {
        if !l.held(&k)? || l.state_of(&k)?.as_deref() != Some(b"d") {
            continue;
        }
        let Some(u) = l.read_field("HGET", &[&k, b"u"])? else {
            continue;
        };
        if due_of(&u)? > l.now as f64 {
            costs.ok_or_else(costs_expected)?;
            return guard_unhold(l, &k);
        }
    }
    Ok(())
}

pub(super) fn oldest(l: &Ledger, costs: Option<&[u8]>) -> Items {
    let (q, holds) = (l.queue(), l.holds());
    oldest_candidate(l, costs)?;
    for k in l
        .read_fields("ZRANGE", &[q, b"0", QUEUE_LAST])?
        .into_iter()
        .flatten()
    {
        if l.read_field("ZSCORE", &[holds, &k])?.is_none() {
            l.write("ZREM", &[q, &k])?;
        } else if l.state_of(&k)?.as_deref() == Some(b"d") {
            let mut r = l.read_fields("HMGET", &[&k, b"c", b"f", b"o", b"t", b"u"])?;
            r.resize(5, None);
            let live = match &r[4] {
                Some(u) => due_of(u)? > l.now as f64,
                None => false,
            };
            if live {
                let costs = costs.ok_or_else(costs_expected)?;
                l.write("HSET", &[&k, b"s", b"s", b"k", costs])?;
                l.unhold(&k)?;
                l.write("ZREM", &[q, &k])?;
                r.truncate(4);
                return Ok([vec![text(b"1"), text(&k)], r, vec![Some(l.now_us.clone())]].concat());
            }
        }
    }
    Ok(vec![text(b"0")])
}
