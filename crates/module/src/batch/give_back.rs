//! `refund` and `reset`, as `batch.lua` makes them: each item from what the items before
//! it left (a bucket named twice is refunded or reset twice). Every argument and every
//! key's type is checked first: an error changes nothing.

use std::collections::HashMap;

use cellrate_core::clock::Nanos;
use cellrate_core::gcra::stored;
use redis_module::{Context, KeyType, RedisError, RedisString};

use super::leases;
use super::shapes::{bad, number, utf8, Calendar};
use crate::keys::{self, Stored};

/// What one refund item gives back.
enum Back<'a> {
    /// A lease taken back (a cross-slot batch's compensation).
    Lease(&'a [u8]),
    /// A calendar window's tokens.
    Window(Calendar, i64),
    /// A GCRA increment.
    Gcra(Nanos),
}

fn back_of(arg: &RedisString) -> Result<Back<'_>, RedisError> {
    if let Some(id) = arg.as_slice().strip_prefix(b"#") {
        return Ok(Back::Lease(id));
    }
    let text = utf8(arg)?;
    match text.as_bytes().first() {
        Some(b'x') => {
            let (bounds, cost) = text.split_once(':').unwrap_or((text, ""));
            Ok(Back::Window(Calendar::parse(bounds)?, number(cost)?))
        }
        Some(c) if c.is_ascii_alphabetic() => Ok(Back::Window(
            Calendar::parse(&text[..1])?,
            number(&text[1..])?,
        )),
        _ => Ok(Back::Gcra(number(text)?)),
    }
}

/// Every key's value (by name), read once, checked to be a bucket (or, for `lease` items,
/// a lease key): `None` for none.
fn read_all<'k>(
    ctx: &Context,
    keys: &'k [RedisString],
    lease: impl Fn(usize) -> bool,
) -> Result<HashMap<&'k [u8], Option<String>>, RedisError> {
    let mut values = HashMap::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let value = match keys::read(ctx, key)? {
            Stored::Absent => None,
            Stored::Other(KeyType::ZSet) if lease(i) => None,
            Stored::Text(text) if !lease(i) => Some(String::from_utf8_lossy(&text).into_owned()),
            _ => return Err(keys::wrong_type()),
        };
        values.entry(key.as_slice()).or_insert(value);
    }
    Ok(values)
}

/// `refund`: never fuller than full, never a new bucket; a bucket refunded to full is
/// deleted. The reply's values: per item what it found (`""` for none).
pub(super) fn refund(
    ctx: &Context,
    keys: &[RedisString],
    args: &[RedisString],
    now: Nanos,
) -> Result<Vec<String>, RedisError> {
    if args.len() != keys.len() {
        return Err(bad("a refund needs one value per key"));
    }
    let backs = args.iter().map(back_of).collect::<Result<Vec<_>, _>>()?;
    let mut current = read_all(ctx, keys, |i| matches!(backs[i], Back::Lease(_)))?;
    for (back, key) in backs.iter().zip(keys) {
        if let (Back::Window(..) | Back::Gcra(_), Some(Some(v))) =
            (back, current.get(key.as_slice()))
        {
            if keys::tat_of(v.as_bytes()).is_none() {
                return Err(bad("a refunded key holds no bucket"));
            }
        }
    }
    let mut out = vec![now.to_string()];
    for (back, key) in backs.iter().zip(keys) {
        let name = key.as_slice();
        let found = match back {
            Back::Lease(id) => {
                leases::take_back(ctx, name, id)?;
                None
            }
            _ => current.get(name).cloned().flatten(),
        };
        out.push(found.clone().unwrap_or_default());
        let Some(tat) = found.as_deref().and_then(|v| keys::tat_of(v.as_bytes())) else {
            continue;
        };
        let left = match *back {
            Back::Lease(_) => continue,
            Back::Window(calendar, cost) => {
                let end = calendar.end(now)?;
                let used = stored::window_used(end, Some(tat));
                if used == 0 {
                    continue;
                }
                let left = stored::window_give_back(used, cost);
                (left > 0).then(|| end + left)
            }
            Back::Gcra(increment) => match stored::give_back(now, Some(tat), increment) {
                Some(new) if new < tat => (now < new).then_some(new),
                _ => continue,
            },
        };
        match left {
            Some(value) => {
                let text = value.to_string();
                keys::set(ctx, key, &text, keys::ttl_ms(value, now))?;
                current.insert(name, Some(text));
            }
            None => {
                keys::delete(ctx, key)?;
                current.insert(name, None);
            }
        }
    }
    Ok(out)
}

/// `reset`: every key deleted; the reply's values what each held (a lease key's latest live
/// expiry), `""` for none.
pub(super) fn reset(
    ctx: &Context,
    keys: &[RedisString],
    now: Nanos,
) -> Result<Vec<String>, RedisError> {
    let mut current: HashMap<&[u8], Option<String>> = HashMap::with_capacity(keys.len());
    let mut types = Vec::with_capacity(keys.len());
    for key in keys {
        let stored = keys::read(ctx, key)?;
        if let Stored::Other(kind) = &stored {
            if *kind != KeyType::ZSet {
                return Err(keys::wrong_type());
            }
        }
        types.push(stored);
    }
    let mut out = vec![now.to_string()];
    for (key, stored) in keys.iter().zip(types) {
        let name = key.as_slice();
        let found = match current.get(name) {
            Some(value) => value.clone(),
            None => match stored {
                Stored::Absent => None,
                Stored::Text(text) => Some(String::from_utf8_lossy(&text).into_owned()),
                Stored::Other(_) => leases::reset(ctx, key, now)?,
            },
        };
        if found.is_some() {
            keys::delete(ctx, key)?;
        }
        current.insert(name, None);
        out.push(found.unwrap_or_default());
    }
    Ok(out)
}
