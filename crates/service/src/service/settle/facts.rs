//! What a kept Check spent, per item, as the table keeps it (opaque bytes to the table):
//! its tokens, the calendar period they count in, and its limit's reservation policy.

use cellrate_core::clock::CalendarPeriod;
use cellrate_store::shared::Kept;

/// What a Check wrote for one item: tokens, the calendar period they count in, and its
/// limit's reservation policy when it has one (`Some(release)`: given back at the hold's
/// end if `release`, else it stands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Spent {
    pub(super) tokens: u64,
    pub(super) period: Option<CalendarPeriod>,
    pub(super) hold: Option<bool>,
}

const SPENT_BYTES: usize = 9;

/// The code of a zoned period, whose text follows (a length byte, then the text).
const ZONED: u8 = 10;

/// Flags beside the period's code: the item's limit holds (and releases) estimates.
const HELD: u8 = 0x40;
const RELEASED: u8 = 0x80;

fn hold_flags(hold: Option<bool>) -> u8 {
    match hold {
        None => 0,
        Some(false) => HELD,
        Some(true) => HELD | RELEASED,
    }
}

fn hold_of(code: u8) -> Option<bool> {
    (code & HELD != 0).then_some(code & RELEASED != 0)
}

/// The facts of a record: per item its tokens (8 bytes) and period code (1 byte, with the
/// hold's flags), a zoned period's code followed by its text (`1mo@Europe/Berlin`: its
/// length, then its bytes).
pub(super) fn facts_bytes(spent: &[Spent]) -> Vec<u8> {
    let mut out = Vec::with_capacity(spent.len() * SPENT_BYTES);
    for s in spent {
        out.extend_from_slice(&s.tokens.to_le_bytes());
        if let Some(CalendarPeriod::Zoned(zoned)) = s.period {
            let text = zoned.text().as_bytes();
            out.push(ZONED | hold_flags(s.hold));
            out.push(text.len().min(255) as u8);
            out.extend_from_slice(&text[..text.len().min(255)]);
            continue;
        }
        // 0 is no window; a period's code is 1 + its place in CalendarPeriod::UNZONED.
        let code = (s.period.and_then(CalendarPeriod::unzoned_index)).map_or(0, |i| i as u8 + 1);
        out.push(code | hold_flags(s.hold));
    }
    out
}

pub(super) fn facts_of(mut bytes: &[u8]) -> Option<Vec<Spent>> {
    let mut spent = Vec::with_capacity(bytes.len() / SPENT_BYTES);
    while !bytes.is_empty() {
        let (head, rest) = bytes.split_at_checked(SPENT_BYTES)?;
        let tokens = u64::from_le_bytes(head[..8].try_into().ok()?);
        let hold = hold_of(head[8]);
        let period = match head[8] & !(HELD | RELEASED) {
            0 => None,
            ZONED => {
                let (&len, rest) = rest.split_first()?;
                let (text, rest) = rest.split_at_checked(usize::from(len))?;
                bytes = rest;
                let text = std::str::from_utf8(text).ok()?;
                spent.push(Spent {
                    tokens,
                    period: Some(CalendarPeriod::parse(text).ok()?),
                    hold,
                });
                continue;
            }
            code => Some(*CalendarPeriod::UNZONED.get(usize::from(code) - 1)?),
        };
        bytes = rest;
        spent.push(Spent {
            tokens,
            period,
            hold,
        });
    }
    Some(spent)
}

/// Whether a record holds an estimate (one of its items has a reservation policy).
pub(super) fn is_hold(kept: &Kept) -> bool {
    facts_of(&kept.facts).is_some_and(|spent| spent.iter().any(|s| s.hold.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_keep_a_zoned_period_and_refuse_a_cut_one() {
        let zoned = CalendarPeriod::parse("1mo~15@America/New_York").unwrap();
        let spent = vec![
            Spent {
                tokens: 3,
                period: Some(zoned),
                hold: Some(true),
            },
            Spent {
                tokens: 4,
                period: Some(CalendarPeriod::Day),
                hold: Some(false),
            },
            Spent {
                tokens: 5,
                period: None,
                hold: None,
            },
        ];
        let bytes = facts_bytes(&spent);
        assert_eq!(facts_of(&bytes), Some(spent));
        // A zoned period read back is the same window, not the UTC month nor none.
        assert_eq!(facts_of(&bytes[..9 + 10]), None, "a cut text");
        assert_eq!(facts_of(&bytes[..8]), None, "a cut item");
    }
}
