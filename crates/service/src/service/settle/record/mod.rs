//! A kept Check as the table keeps it (opaque bytes to the table), in a versioned format
//! of its own: its items ([`ItemSpec`]s naming a configured limit or giving one inline),
//! and the token its spend was made under (`unknown.rs`).
//!
//! **Versions.** A record of version 2 or later begins with [`MARK`] and its version byte
//! (`MARK` is never the first byte of a protobuf message: its wire type, 7, does not
//! exist). A record without it is of version 1, the format of the releases up to 3ebe882
//! (`cellrate.v1.CheckRequest` encoded, its items as the native API's `Item`s, and the
//! token, when there is one, as 32 hex digits in its `request_id`): read, never written,
//! so that what an earlier release kept in Redis is settled and released after an upgrade.
//! A version this release does not know (written by a later one) cannot be read: a Settle
//! of it is INTERNAL and leaves it as it is, for a replica that can read it.
//!
//! Version 2: `MARK`, `2`, a flags byte (bit 0: a token follows, 16 bytes little-endian),
//! the number of items (a varint), then each item: a byte of its kind, mode and options,
//! then (varints for numbers, a varint length before each text)
//! - named: the name, the id; inline: the key, then the limit (GCRA: `0`, burst, count,
//!   period in nanoseconds; a calendar window: `1`, count, the period's text);
//!   an envoyproxy/ratelimit-format descriptor's bucket (an anonymous hold, `anonymous.rs`):
//!   its digest, its name, its unit's period text, a flags byte (shadow, every hit,
//!   caller-given), then its limit (`0` none, a zero limit; `1` GCRA: burst, count,
//!   period; `2` that format's window, every hit counted: count; `3` cellrate's window:
//!   count);
//! - the cost, if it has one; the lease id, if it has one.
//!
//! The items are at most [`super::MAX_RECORD`] bytes in this encoding, which is never
//! longer than version 1's for the same items.

mod ratelimit;

use std::borrow::Cow;

use prost::encoding::{decode_varint, encode_varint};
use prost::Message;
use ratelimit::{put_ratelimit, take_ratelimit};

use crate::proto::v1 as pb;
use crate::service::{ItemSpec, Target};
use cellrate_core::clock::{CalendarPeriod, SECOND};
use cellrate_core::gcra::{Limit, Mode, Window};

/// The first byte of a record of version 2 or later.
pub(super) const MARK: u8 = 0xFF;

/// The version this release writes.
pub(super) const VERSION: u8 = 2;

/// The modes, by their code in an item's first byte (bits 0-2).
const MODES: [Mode; 6] = [
    Mode::CheckAndSpend,
    Mode::CheckOnly,
    Mode::SpendOnly,
    Mode::Charge,
    Mode::Acquire,
    Mode::Release,
];

/// An item's first byte, beside its mode: it is inline (else named), it has a cost, it
/// has a lease id.
const INLINE: u8 = 0x08;
const COST: u8 = 0x10;
const LEASE: u8 = 0x20;
/// An envoyproxy/ratelimit-format descriptor's bucket (neither named nor inline).
const RATELIMIT: u8 = 0x40;

/// A record's flags: a token follows.
const TOKEN: u8 = 0x01;

/// A kept Check: its items, and the token its spend is made under (on a store that keeps
/// tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) items: Vec<ItemSpec<'static>>,
    pub(super) token: Option<u128>,
}

fn put_text(out: &mut Vec<u8>, text: &str) {
    encode_varint(text.len() as u64, out);
    out.extend_from_slice(text.as_bytes());
}

/// The items as a record of this version keeps them; `None` for an item a kept Check
/// cannot have (an Envoy descriptor's target, a caller-given limit, a concurrency limit
/// inline), which the front ends never give.
pub(super) fn items_bytes(items: &[ItemSpec<'_>]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(items.len() * 32);
    for item in items {
        if item.limit.is_some() {
            return None;
        }
        let mode = MODES.iter().position(|&m| m == item.mode)? as u8;
        let mut head = mode;
        match item.target {
            Target::Inline { .. } => head |= INLINE,
            Target::Ratelimit(_) => head |= RATELIMIT,
            _ => {}
        }
        if item.cost.is_some() {
            head |= COST;
        }
        if item.lease.is_some() {
            head |= LEASE;
        }
        out.push(head);
        match &item.target {
            Target::Named { name, id } => {
                put_text(&mut out, name);
                put_text(&mut out, id);
            }
            Target::Inline { key, limit } => {
                put_text(&mut out, key);
                match limit.window() {
                    Window::Gcra => {
                        out.push(0);
                        encode_varint(limit.burst(), &mut out);
                        encode_varint(limit.count(), &mut out);
                        encode_varint(u64::try_from(limit.period()).ok()?, &mut out);
                    }
                    Window::Calendar(period) => {
                        out.push(1);
                        encode_varint(limit.count(), &mut out);
                        put_text(&mut out, period.text());
                    }
                    Window::Concurrency => return None,
                }
            }
            Target::Ratelimit(target) => put_ratelimit(&mut out, target)?,
            _ => return None,
        }
        if let Some(cost) = item.cost {
            encode_varint(cost, &mut out);
        }
        if let Some(lease) = &item.lease {
            put_text(&mut out, lease);
        }
    }
    Some(out)
}

/// A record of this version: its `items` (as [`items_bytes`] gave them, `count` of
/// them) and `token`.
pub(super) fn record_bytes(count: usize, items: &[u8], token: Option<u128>) -> Vec<u8> {
    let mut out = Vec::with_capacity(items.len() + 24);
    out.extend_from_slice(&[MARK, VERSION]);
    out.push(if token.is_some() { TOKEN } else { 0 });
    if let Some(token) = token {
        out.extend_from_slice(&token.to_le_bytes());
    }
    encode_varint(count as u64, &mut out);
    out.extend_from_slice(items);
    out
}

/// A record, of any version this release reads; `None` if it cannot be read.
pub(super) fn read_record(bytes: &[u8]) -> Option<Record> {
    match bytes {
        [MARK, VERSION, rest @ ..] => version_2(rest),
        [MARK, ..] => None,
        _ => version_1(bytes),
    }
}

fn take_text(buf: &mut &[u8]) -> Option<String> {
    let len = usize::try_from(decode_varint(buf).ok()?).ok()?;
    let (text, rest) = buf.split_at_checked(len)?;
    *buf = rest;
    Some(std::str::from_utf8(text).ok()?.to_string())
}

fn take_u64(buf: &mut &[u8]) -> Option<u64> {
    decode_varint(buf).ok()
}

fn take_byte(buf: &mut &[u8]) -> Option<u8> {
    let (&byte, rest) = buf.split_first()?;
    *buf = rest;
    Some(byte)
}

fn version_2(mut buf: &[u8]) -> Option<Record> {
    let buf = &mut buf;
    let token = match take_byte(buf)? {
        0 => None,
        TOKEN => {
            let (token, rest) = buf.split_at_checked(16)?;
            *buf = rest;
            Some(u128::from_le_bytes(token.try_into().ok()?))
        }
        _ => return None,
    };
    let count = take_u64(buf)?;
    let mut items = Vec::with_capacity(usize::try_from(count).ok()?.min(crate::service::MAX_BATCH));
    for _ in 0..count {
        items.push(item_v2(buf)?);
    }
    buf.is_empty().then_some(Record { items, token })
}

fn item_v2(buf: &mut &[u8]) -> Option<ItemSpec<'static>> {
    let head = take_byte(buf)?;
    if head & !(0x07 | INLINE | COST | LEASE | RATELIMIT) != 0 {
        return None;
    }
    let mode = *MODES.get(usize::from(head & 0x07))?;
    let target = if head & RATELIMIT != 0 {
        Target::Ratelimit(take_ratelimit(buf)?)
    } else if head & INLINE == 0 {
        let name = take_text(buf)?;
        let id = take_text(buf)?;
        Target::Named {
            name: Cow::Owned(name),
            id: Cow::Owned(id),
        }
    } else {
        let key = take_text(buf)?;
        let limit = match take_byte(buf)? {
            0 => {
                let (burst, count) = (take_u64(buf)?, take_u64(buf)?);
                Limit::new(burst, count, i64::try_from(take_u64(buf)?).ok()?).ok()?
            }
            1 => {
                let count = take_u64(buf)?;
                Limit::calendar(count, CalendarPeriod::parse(&take_text(buf)?).ok()?).ok()?
            }
            _ => return None,
        };
        Target::Inline {
            key: Cow::Owned(key),
            limit,
        }
    };
    let cost = if head & COST != 0 {
        Some(take_u64(buf)?)
    } else {
        None
    };
    let lease = if head & LEASE != 0 {
        Some(Cow::Owned(take_text(buf)?))
    } else {
        None
    };
    Some(ItemSpec {
        target,
        cost,
        mode,
        limit: None,
        lease,
    })
}

/// Version 1: `cellrate.v1.CheckRequest`, as the native API gave its items (which were
/// checked then: read back as they were decided).
fn version_1(bytes: &[u8]) -> Option<Record> {
    let check = pb::CheckRequest::decode(bytes).ok()?;
    let text = check.request_id.as_str();
    let token = (text.len() == 32)
        .then(|| u128::from_str_radix(text, 16).ok())
        .flatten();
    let items = check.items.iter().map(item_v1).collect::<Option<_>>()?;
    Some(Record { items, token })
}

fn item_v1(item: &pb::Item) -> Option<ItemSpec<'static>> {
    let target = match &item.inline {
        None => Target::Named {
            name: Cow::Owned(item.name.clone()),
            id: Cow::Owned(item.id.clone()),
        },
        Some(inline) => {
            let limit = match (&inline.period, inline.calendar.as_str()) {
                (Some(period), "") => {
                    let nanos = period.seconds.checked_mul(SECOND)?;
                    let nanos = nanos.checked_add(i64::from(period.nanos))?;
                    Limit::new(inline.burst, inline.count, nanos).ok()?
                }
                (None, text) if !text.is_empty() => {
                    Limit::calendar(inline.count, CalendarPeriod::parse(text).ok()?).ok()?
                }
                _ => return None,
            };
            Target::Inline {
                key: Cow::Owned(inline.key.clone()),
                limit,
            }
        }
    };
    let mode = Mode::from(pb::Mode::try_from(item.mode).ok()?);
    Some(ItemSpec {
        target,
        cost: item.cost,
        mode,
        limit: None,
        lease: (!item.lease_id.is_empty()).then(|| Cow::Owned(item.lease_id.clone())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::ratelimit_bucket::window_limit;
    use crate::service::request::RatelimitTarget;
    use std::sync::Arc;
    const MINUTE: i64 = 60 * SECOND;

    fn named(name: &str, id: &str, cost: Option<u64>, mode: Mode) -> ItemSpec<'static> {
        ItemSpec {
            target: Target::Named {
                name: Cow::Owned(name.to_string()),
                id: Cow::Owned(id.to_string()),
            },
            cost,
            mode,
            limit: None,
            lease: None,
        }
    }

    fn inline(key: &str, limit: Limit, cost: Option<u64>) -> ItemSpec<'static> {
        ItemSpec {
            target: Target::Inline {
                key: Cow::Owned(key.to_string()),
                limit,
            },
            cost,
            mode: Mode::CheckAndSpend,
            limit: None,
            lease: None,
        }
    }

    /// The items of a kept Check as the native API gave them to 3ebe882.
    fn items_v1() -> Vec<pb::Item> {
        vec![
            pb::Item {
                name: "TokensPerTenant".into(),
                id: "acme".into(),
                cost: Some(2_000),
                ..Default::default()
            },
            pb::Item {
                name: "Requests".into(),
                id: "acme".into(),
                mode: pb::Mode::SpendOnly as i32,
                ..Default::default()
            },
            pb::Item {
                inline: Some(pb::InlineLimit {
                    key: "k1".into(),
                    burst: 20,
                    count: 10,
                    period: Some(prost_types::Duration {
                        seconds: 60,
                        nanos: 0,
                    }),
                    calendar: String::new(),
                }),
                cost: Some(3),
                ..Default::default()
            },
            pb::Item {
                inline: Some(pb::InlineLimit {
                    key: "k2".into(),
                    count: 500,
                    calendar: "1mo".into(),
                    ..Default::default()
                }),
                cost: Some(0),
                mode: pb::Mode::CheckOnly as i32,
                ..Default::default()
            },
        ]
    }

    /// The same items in the domain's terms.
    fn items_domain() -> Vec<ItemSpec<'static>> {
        vec![
            named("TokensPerTenant", "acme", Some(2_000), Mode::CheckAndSpend),
            named("Requests", "acme", None, Mode::SpendOnly),
            inline("k1", Limit::new(20, 10, MINUTE).unwrap(), Some(3)),
            ItemSpec {
                mode: Mode::CheckOnly,
                ..inline(
                    "k2",
                    Limit::calendar(500, CalendarPeriod::Month).unwrap(),
                    Some(0),
                )
            },
        ]
    }

    #[test]
    fn a_record_written_by_3ebe882_is_read_as_the_items_it_kept() {
        // Literally 3ebe882's bytes for one item (`Settler::open` there): a CheckRequest
        // holding only the items, field by field.
        let literal = [
            0x0a, 0x08, // items (field 1), 8 bytes
            0x0a, 0x01, b'T', // name "T"
            0x12, 0x01, b'a', // id "a"
            0x20, 0x05, // cost 5
        ];
        let encoded = pb::CheckRequest {
            items: vec![pb::Item {
                name: "T".into(),
                id: "a".into(),
                cost: Some(5),
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(encoded, literal, "the old encoding, as 3ebe882 wrote it");
        assert_eq!(
            read_record(&literal),
            Some(Record {
                items: vec![named("T", "a", Some(5), Mode::CheckAndSpend)],
                token: None
            })
        );
        // Every kind of item the native API keeps: named, inline GCRA and calendar, modes.
        let old = pb::CheckRequest {
            items: items_v1(),
            ..Default::default()
        };
        let read = read_record(&old.encode_to_vec()).expect("read");
        assert_eq!(read.items, items_domain());
        assert_eq!(read.token, None);
        // With the spend's token in its request_id, as the release before this one wrote
        // it (32 hex digits).
        let token = 0x0123_4567_89ab_cdef_0011_2233_4455_6677_u128;
        let with_token = pb::CheckRequest {
            items: items_v1(),
            request_id: format!("{token:032x}"),
            ..Default::default()
        };
        let read = read_record(&with_token.encode_to_vec()).expect("read");
        assert_eq!((read.items, read.token), (items_domain(), Some(token)));
    }

    #[test]
    fn a_record_of_this_version_reads_back_as_written_and_says_its_version() {
        let mut items = items_domain();
        items.push(ItemSpec {
            lease: Some(Cow::Owned("lease-1".into())),
            ..named("Zoned", "", Some(u64::MAX), Mode::Charge)
        });
        items.push(inline(
            "z",
            Limit::calendar(7, CalendarPeriod::parse("1mo@Europe/Berlin").unwrap()).unwrap(),
            None,
        ));
        // envoyproxy/ratelimit-format buckets (anonymous holds): fixed window, GCRA, zero.
        let hour = CalendarPeriod::parse("1h").unwrap();
        for (limit, flags) in [
            (window_limit(9, hour), 2),
            (Limit::new(4, 4, MINUTE).ok(), 5),
        ] {
            let (shadow, every_hit) = (flags & 1 != 0, flags & 2 != 0);
            for limit in [limit, None] {
                let (digest, name, caller_given) = ("ab".into(), Arc::from("d.k"), flags > 2);
                let t = RatelimitTarget {
                    digest,
                    limit,
                    unit: hour,
                    name,
                    shadow,
                    every_hit,
                    caller_given,
                };
                items.push(ItemSpec {
                    target: Target::Ratelimit(t),
                    ..named("", "", Some(9), Mode::Charge)
                });
            }
        }
        for token in [None, Some(u128::MAX), Some(7)] {
            let bytes = record_bytes(items.len(), &items_bytes(&items).unwrap(), token);
            assert_eq!(bytes[..2], [MARK, VERSION], "the version, first");
            let read = read_record(&bytes).expect("read");
            assert_eq!((read.items, read.token), (items.clone(), token));
            // A cut or lengthened record is not read as something else (cut to nothing,
            // it is no record of this version, and reads as version 1's empty Check).
            for cut in 1..bytes.len() {
                assert_eq!(read_record(&bytes[..cut]).map(|r| r.items), None, "{cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(read_record(&longer), None);
            // A version this release does not know (a later one's) is not read.
            let mut later = bytes.clone();
            later[1] = VERSION + 1;
            assert_eq!(read_record(&later), None);
        }
        // Targets a kept Check never has are not written.
        let descriptor = ItemSpec {
            target: Target::Descriptor {
                digest: "d".into(),
                limit: Limit::new(1, 1, MINUTE).unwrap(),
            },
            ..named("x", "y", None, Mode::CheckAndSpend)
        };
        assert_eq!(items_bytes(&[descriptor]), None);
    }

    #[test]
    fn the_items_never_take_more_bytes_than_in_3ebe882s_format() {
        // The bound on a kept Check (`MAX_RECORD`) refuses nothing that was kept before.
        let mut cases: Vec<(Vec<pb::Item>, Vec<ItemSpec<'static>>)> =
            vec![(items_v1(), items_domain())];
        for (name, id, cost) in [
            ("T", "", None),
            ("TokensPerTenant", "tenant-with-a-long-id-0000", Some(1)),
            (&"n".repeat(128)[..], &"i".repeat(300)[..], Some(u64::MAX)),
        ] {
            let item = pb::Item {
                name: name.into(),
                id: id.into(),
                cost,
                ..Default::default()
            };
            let spec = named(name, id, cost, Mode::CheckAndSpend);
            cases.push((vec![item.clone(); 40], vec![spec.clone(); 40]));
            cases.push((vec![item], vec![spec]));
        }
        for (old, new) in cases {
            let before = pb::CheckRequest {
                items: old,
                ..Default::default()
            }
            .encoded_len();
            let after = items_bytes(&new).unwrap().len();
            assert!(after <= before, "{after} > {before}");
        }
        // A one-item hold's whole record, with its token (docs/operations.md's figure).
        let token = Some(u128::MAX);
        let old = pb::CheckRequest {
            items: vec![pb::Item {
                name: "Released".into(),
                id: "tenant-00001".into(),
                cost: Some(2_000),
                ..Default::default()
            }],
            request_id: format!("{:032x}", u128::MAX),
            ..Default::default()
        };
        let item = named("Released", "tenant-00001", Some(2_000), Mode::CheckAndSpend);
        let new = record_bytes(1, &items_bytes(&[item]).unwrap(), token);
        assert_eq!((old.encoded_len(), new.len()), (63, 45));
    }
}
