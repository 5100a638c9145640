//! `spend`: one or more batches decided in order, each all-or-nothing against the state the
//! batches before it left, exactly as `batch.lua` decides them (its header tells the call).

use std::collections::HashMap;

use cellrate_core::clock::Nanos;
use redis_module::{Context, KeyType, RedisError, RedisString};

use super::leases;
use super::shapes::{
    self, bad, number, utf8, Shape, ACQUIRE, CHARGE, CHECK_ONLY, RELEASE, SPEND_ONLY,
};
use crate::keys::{self, Stored};

/// One item of a batch: its key's place in KEYS, its shape, its lease id.
struct Item<'a> {
    key: usize,
    shape: usize,
    id: Option<&'a [u8]>,
}

/// The shapes and batches of a spend's ARGV (after the op and now), checked whole.
fn parse<'a>(
    keys: usize,
    args: &'a [RedisString],
) -> Result<(Vec<Shape>, Vec<Vec<Item<'a>>>), RedisError> {
    let count = usize::try_from(number(utf8(
        args.first().ok_or_else(|| bad("no shapes"))?,
    )?)?)
    .map_err(|_| bad("too many shapes"))?;
    if count
        .checked_mul(3)
        .is_none_or(|numbers| args.len() < 1 + numbers)
    {
        return Err(bad("fewer shape numbers than shapes"));
    }
    let mut shapes = Vec::with_capacity(count);
    for three in args[1..1 + 3 * count].chunks(3) {
        shapes.push(Shape::parse(
            utf8(&three[0])?,
            utf8(&three[1])?,
            utf8(&three[2])?,
        )?);
    }
    let mut batches = Vec::new();
    let (mut at, mut first) = (1 + 3 * count, 0);
    while at < args.len() {
        let n = usize::try_from(number(utf8(&args[at])?)?).map_err(|_| bad("too many items"))?;
        at += 1;
        if at + n > args.len() || first + n > keys {
            return Err(bad("a batch names more items than the call has"));
        }
        let mut items = Vec::with_capacity(n);
        for (i, arg) in args[at..at + n].iter().enumerate() {
            let raw = arg.as_slice();
            let (shape, id) = match raw.iter().position(|&b| b == b':') {
                Some(colon) => (&raw[..colon], Some(&raw[colon + 1..])),
                None => (raw, None),
            };
            let shape =
                std::str::from_utf8(shape).map_err(|_| bad("a shape number is not text"))?;
            let shape = usize::try_from(number(shape)?).unwrap_or(0);
            if shape == 0 || shape > shapes.len() {
                return Err(bad("an item names no shape"));
            }
            items.push(Item {
                key: first + i,
                shape: shape - 1,
                id,
            });
        }
        batches.push(items);
        at += n;
        first += n;
    }
    if first != keys {
        return Err(bad("the batches name fewer items than the call has keys"));
    }
    Ok((shapes, batches))
}

/// A bucket as the call knows it: its value as text (`""` for none), the TAT in it when it
/// is one, and whether the call wrote it.
struct Bucket {
    key: usize,
    text: String,
    tat: Option<Nanos>,
    dirty: bool,
}

/// Decides the batches of `args` over `keys` at `now`: the reply (`now`, then per item its
/// bucket's value before its batch, or a lease key's line), and whether anything was
/// written.
pub(super) fn spend(
    ctx: &Context,
    keys: &[RedisString],
    args: &[RedisString],
    now: Nanos,
) -> Result<(Vec<String>, bool), RedisError> {
    let (shapes, batches) = parse(keys.len(), args)?;
    // Every bucket read first (the script's one MGET), and every type checked before a
    // write: a key of another type is an error that changes nothing.
    let mut buckets: HashMap<&[u8], Bucket> = HashMap::with_capacity(keys.len());
    for item in batches.iter().flatten() {
        let name = keys[item.key].as_slice();
        if shapes[item.shape].is_lease() {
            match keys::read(ctx, &keys[item.key])? {
                Stored::Absent | Stored::Other(KeyType::ZSet) => {}
                _ => return Err(keys::wrong_type()),
            }
            continue;
        }
        if buckets.contains_key(name) {
            continue;
        }
        let text = match keys::read(ctx, &keys[item.key])? {
            Stored::Absent => Vec::new(),
            Stored::Text(text) => text,
            Stored::Other(_) => return Err(keys::wrong_type()),
        };
        let tat = keys::tat_of(&text);
        let text = String::from_utf8_lossy(&text).into_owned();
        let key = item.key;
        buckets.insert(
            name,
            Bucket {
                key,
                text,
                tat,
                dirty: false,
            },
        );
    }
    let mut out = Vec::with_capacity(keys.len() + 1);
    out.push(now.to_string());
    let mut wrote = false;
    for batch in &batches {
        wrote |= decide_batch(ctx, keys, &shapes, batch, now, &mut buckets, &mut out)?;
    }
    for bucket in buckets.values() {
        if let (true, Some(tat)) = (bucket.dirty, bucket.tat) {
            keys::set(ctx, &keys[bucket.key], &bucket.text, keys::ttl_ms(tat, now))?;
            wrote = true;
        }
    }
    Ok((out, wrote))
}

/// One batch: every item decided against the state before it, then written only if every
/// counting item is allowed (charges whatever it decides, lease releases too), unless one
/// of its buckets holds no TAT (then it writes nothing and its reply carries that value).
fn decide_batch(
    ctx: &Context,
    keys: &[RedisString],
    shapes: &[Shape],
    batch: &[Item<'_>],
    now: Nanos,
    buckets: &mut HashMap<&[u8], Bucket>,
    out: &mut Vec<String>,
) -> Result<bool, RedisError> {
    let (mut allowed, mut decidable) = (true, true);
    let mut decided = Vec::with_capacity(batch.len());
    let mut leases = Vec::new();
    for item in batch {
        let shape = &shapes[item.shape];
        let name = keys[item.key].as_slice();
        if let shapes::Kind::Lease { count, .. } = shape.kind {
            let d = leases::decide(ctx, name, now, shape.mode == ACQUIRE, count, item.id)?;
            if shape.mode == ACQUIRE && !d.ok {
                allowed = false;
            }
            out.push(String::new());
            leases.push((out.len() - 1, d));
            decided.push(None);
            continue;
        }
        let bucket = &buckets[name];
        out.push(bucket.text.clone());
        if !bucket.text.is_empty() && bucket.tat.is_none() {
            (allowed, decidable) = (false, false);
            decided.push(None);
            continue;
        }
        let (ok, value) = shape.decide(now, bucket.tat)?;
        if !ok && shape.mode != SPEND_ONLY {
            allowed = false;
        }
        decided.push(Some((ok, value)));
    }
    let mut wrote = false;
    let mut leases = leases.into_iter();
    for item in batch.iter().filter(|i| shapes[i.shape].is_lease()) {
        let shape = &shapes[item.shape];
        let (at, d) = leases.next().expect("one decision per lease item");
        let hold = match shape.kind {
            shapes::Kind::Lease { hold, .. } => hold,
            _ => 0,
        };
        let name = keys[item.key].as_slice();
        let modes = (shape.mode == ACQUIRE, shape.mode == RELEASE);
        let (reply, w) = leases::write(
            ctx,
            name,
            now,
            modes,
            hold,
            item.id,
            d,
            (decidable, allowed),
        )?;
        out[at] = reply;
        wrote |= w;
    }
    if !decidable {
        return Ok(wrote);
    }
    for (item, decided) in batch.iter().zip(decided) {
        let Some((ok, value)) = decided else { continue };
        let shape = &shapes[item.shape];
        let write = if shape.mode == CHARGE {
            !shape.zero && value < shapes::MAX_TAT
        } else {
            allowed && ok && shape.mode != CHECK_ONLY && !shape.zero
        };
        if write {
            let bucket = buckets
                .get_mut(keys[item.key].as_slice())
                .expect("a read bucket");
            (bucket.text, bucket.tat, bucket.dirty) = (value.to_string(), Some(value), true);
        }
    }
    Ok(wrote)
}
