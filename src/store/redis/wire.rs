//! The vocabulary of one script call, shared by the call itself (`connection.rs`) and the
//! batches that wait for it (`coalesce.rs`): what a call does ([`Op`]), an item as the
//! script reads it ([`Wire`]), and what the call read ([`Read`]).

use std::borrow::Cow;

use crate::clock::Nanos;

/// The operation a script call performs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Spend,
    Refund,
    Reset,
}

impl Op {
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::Spend => "spend",
            Op::Refund => "refund",
            Op::Reset => "reset",
        }
    }
}

/// What one script call read: `now` and each key's TAT.
pub(super) struct Read {
    pub(super) now: Nanos,
    pub(super) tats: Vec<Option<Nanos>>,
}

/// One item of a spend call, as the script reads it.
pub(super) struct Wire {
    pub(super) key: String,
    pub(super) increment: i64,
    pub(super) burst_offset: i64,
    /// "0" check_and_spend, "1" check_only, "2" spend_only, "3" charge; a calendar window
    /// adds its letter ("0o": check-and-spend in a monthly window), a zoned window its
    /// boundaries ("0x<b0>,<b1>,<b2>,<b3>").
    pub(super) mode: Cow<'static, str>,
}

impl Wire {
    /// Bytes this item adds to a call (key and arguments, roughly as sent).
    pub(super) fn bytes(&self) -> usize {
        self.key.len() + 48
    }
}
