//! A kept Check's item naming an envoyproxy/ratelimit-format descriptor's bucket (an
//! anonymous hold's, `anonymous.rs`), in the record's version 2 (see `mod.rs`): its
//! digest, its name, its unit's period text, a flags byte (shadow, every hit,
//! caller-given), then its limit.

use std::sync::Arc;

use prost::encoding::encode_varint;

use super::{put_text, take_byte, take_text, take_u64};
use crate::service::ratelimit_bucket::window_limit;
use crate::service::request::RatelimitTarget;
use cellrate_core::clock::CalendarPeriod;
use cellrate_core::gcra::{Limit, Window};

/// A ratelimit-format target's flags.
const SHADOW: u8 = 0x01;
const EVERY_HIT: u8 = 0x02;
const CALLER_GIVEN: u8 = 0x04;

/// A ratelimit-format target, after its item's first byte.
pub(super) fn put_ratelimit(out: &mut Vec<u8>, target: &RatelimitTarget) -> Option<()> {
    put_text(out, &target.digest);
    put_text(out, &target.name);
    put_text(out, target.unit.text());
    let flags = [
        (target.shadow, SHADOW),
        (target.every_hit, EVERY_HIT),
        (target.caller_given, CALLER_GIVEN),
    ];
    out.push((flags.iter()).fold(0, |f, &(on, bit)| if on { f | bit } else { f }));
    match target.limit.map(|limit| (limit, limit.window())) {
        None => out.push(0),
        Some((limit, Window::Gcra)) => {
            out.push(1);
            encode_varint(limit.burst(), out);
            encode_varint(limit.count(), out);
            encode_varint(u64::try_from(limit.period()).ok()?, out);
        }
        Some((limit, Window::Calendar(period))) => {
            // 2: this format's window (every hit counted), else cellrate's.
            let every_hit = Limit::fixed_window(limit.count(), period).ok() == Some(limit);
            out.push(if every_hit { 2 } else { 3 });
            encode_varint(limit.count(), out);
        }
        Some((_, Window::Concurrency)) => return None,
    }
    Some(())
}

/// A ratelimit-format target, as [`put_ratelimit`] wrote it.
pub(super) fn take_ratelimit(buf: &mut &[u8]) -> Option<RatelimitTarget> {
    let digest = take_text(buf)?;
    let name = take_text(buf)?;
    let unit = CalendarPeriod::parse(&take_text(buf)?).ok()?;
    let flags = take_byte(buf)?;
    if flags & !(SHADOW | EVERY_HIT | CALLER_GIVEN) != 0 {
        return None;
    }
    let limit = match take_byte(buf)? {
        0 => None,
        1 => {
            let (burst, count) = (take_u64(buf)?, take_u64(buf)?);
            Some(Limit::new(burst, count, i64::try_from(take_u64(buf)?).ok()?).ok()?)
        }
        2 => Some(window_limit(take_u64(buf)?, unit)?),
        3 => Some(Limit::calendar(take_u64(buf)?, unit).ok()?),
        _ => return None,
    };
    Some(RatelimitTarget {
        digest,
        limit,
        unit,
        name: Arc::from(name),
        shadow: flags & SHADOW != 0,
        every_hit: flags & EVERY_HIT != 0,
        caller_given: flags & CALLER_GIVEN != 0,
    })
}
