//! A bucket's key (`"<number>:<id>"`, or with its window or the caller's numbers): built
//! once per decision, without a second allocation, and read back into its parts.

use std::fmt;
use std::sync::Arc;

use super::INLINE_NUMBER;
use cellrate_core::clock::CalendarPeriod;
use cellrate_core::gcra::{Limit, Window};

/// A bucket's key: `"<number>:<id>"` with a canonical id.
///
/// ```
/// use cellrate_limits::names::BucketKey;
/// let key = BucketKey::new(1, "2001:db8::1");
/// assert_eq!(key.as_str(), "1:2001:db8::1");
/// assert_eq!(key.parts(), (1, "2001:db8::1")); // split at the first colon only
/// assert_eq!(key.id(), "2001:db8::1");
/// ```
///
/// Beside the text, a key may name the share of the bucket table it counts against
/// ([`BucketKey::with_share`]): an envoyproxy/ratelimit-format rule's, whose buckets all
/// share one number (99) in their text. The share is not part of the key: two keys of one
/// text are equal, hash alike and name one bucket, whatever share they carry.
#[derive(Clone)]
pub struct BucketKey(Arc<str>, u16);

impl PartialEq for BucketKey {
    fn eq(&self, other: &BucketKey) -> bool {
        self.0 == other.0
    }
}

impl Eq for BucketKey {}

impl std::hash::Hash for BucketKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl PartialOrd for BucketKey {
    fn partial_cmp(&self, other: &BucketKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BucketKey {
    fn cmp(&self, other: &BucketKey) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

impl fmt::Debug for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BucketKey").field(&self.0).finish()
    }
}

impl BucketKey {
    /// The key of canonical `id` under name `number`.
    pub fn new(number: u32, id: &str) -> BucketKey {
        // Built by hand, not with format!: this runs for every item of every request.
        let mut digits = [0u8; 10];
        let mut n = number;
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        BucketKey::built(|text| {
            // ASCII digits pushed as chars: no UTF-8 check of what was just written.
            text.extend(digits[at..].iter().map(|&d| char::from(d)));
            text.push(':');
            text.push_str(id);
        })
    }

    /// The key `write` puts together, in one allocation, the Arc's own: the text is built
    /// in a buffer this thread keeps, not in a fresh String that the Arc would copy and
    /// free (the keys of every request, and of every `CL.THROTTLE`).
    fn built(write: impl FnOnce(&mut String)) -> BucketKey {
        thread_local! {
            static TEXT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        TEXT.with_borrow_mut(|text| {
            text.clear();
            write(text);
            let key = BucketKey(Arc::from(text.as_str()), 0);
            // A long id once must not keep its buffer on this thread for good.
            if text.capacity() > 256 {
                *text = String::new();
            }
            key
        })
    }

    /// The key of `id` under name `number` for a limit that counts in `window`: a GCRA
    /// limit's is [`BucketKey::new`]'s, a calendar limit's carries its period after the
    /// number (`"<number>@<period>:<id>"`). A bucket's stored value means something else in
    /// each kind (a TAT, or a window's end plus what it used), so a limit whose kind or
    /// window changes (a reload, a temporary override) starts from a fresh bucket instead
    /// of misreading the other kind's.
    ///
    /// ```
    /// use cellrate_core::clock::CalendarPeriod;
    /// use cellrate_core::gcra::Window;
    /// use cellrate_limits::names::BucketKey;
    /// let monthly = Window::Calendar(CalendarPeriod::Month);
    /// let key = BucketKey::windowed(101, "tenant1", monthly);
    /// assert_eq!(key.as_str(), "101@1mo:tenant1");
    /// assert_eq!(key.parts(), (101, "tenant1"));
    /// assert_eq!(BucketKey::windowed(101, "tenant1", Window::Gcra).as_str(), "101:tenant1");
    /// ```
    pub fn windowed(number: u32, id: &str, window: Window) -> BucketKey {
        match window {
            Window::Gcra => BucketKey::new(number, id),
            Window::Calendar(period) => BucketKey(Arc::from(format!("{number}@{period}:{id}")), 0),
            Window::Concurrency => BucketKey(Arc::from(format!("{number}@lease:{id}")), 0),
        }
    }

    /// The key of a bucket under a caller-given limit: `0:<kind>/<burst>/<count>/<period
    /// ns>/<rest>`, or `0:<kind>/<count>/<calendar period>/<rest>` for a calendar limit.
    /// The limit is part of the key, so a caller-given limit never reads or writes a
    /// configured bucket, nor a bucket of another limit. Kinds: `i` native inline (rest:
    /// the caller's key), `n` a configured name under a caller's limit (rest:
    /// `<number>:<id>`), `d` an unmatched Envoy descriptor (rest: a hash of domain and
    /// entries).
    ///
    /// ```
    /// use cellrate_core::clock::CalendarPeriod;
    /// use cellrate_core::gcra::Limit;
    /// use cellrate_limits::names::BucketKey;
    /// let limit = Limit::new(20, 10, 1_000_000_000).unwrap();
    /// let key = BucketKey::caller_given('i', &limit, "checkout");
    /// assert_eq!(key.as_str(), "0:i/20/10/1000000000/checkout");
    /// assert!(key.is_caller_given());
    /// assert!(!BucketKey::new(3, "12345").is_caller_given());
    /// let monthly = Limit::calendar(1000, CalendarPeriod::Month).unwrap();
    /// let key = BucketKey::caller_given('i', &monthly, "checkout");
    /// assert_eq!(key.as_str(), "0:i/1000/1mo/checkout");
    /// ```
    pub fn caller_given(kind: char, limit: &Limit, rest: &str) -> BucketKey {
        let key = match limit.window() {
            Window::Gcra => format!(
                "{kind}/{}/{}/{}/{rest}",
                limit.burst(),
                limit.count(),
                limit.period()
            ),
            Window::Calendar(period) => format!("{kind}/{}/{period}/{rest}", limit.count()),
            Window::Concurrency => {
                format!("{kind}/{}/lease/{}/{rest}", limit.count(), limit.period())
            }
        };
        BucketKey::new(INLINE_NUMBER, &key)
    }

    /// The key of a caller-given window whose limit is not part of its key:
    /// `0:<kind>/<period>/<rest>`. Kind `r`: a descriptor's own limit in
    /// envoyproxy/ratelimit's format counted in fixed windows (rest: the descriptor's
    /// bucket text), whose counter upstream keys by descriptor and window alone, so that
    /// its limit may change within the window (AI Gateway's budget from metadata) and the
    /// window keeps what it counted. Never one of [`BucketKey::caller_given`]'s: its second
    /// part is a period (`1h`), theirs a number.
    ///
    /// ```
    /// use cellrate_core::clock::CalendarPeriod;
    /// use cellrate_limits::names::BucketKey;
    /// let key = BucketKey::caller_window('r', CalendarPeriod::Hour, "d1g35t");
    /// assert_eq!(key.as_str(), "0:r/1h/d1g35t");
    /// assert!(key.is_caller_given());
    /// ```
    pub fn caller_window(kind: char, period: CalendarPeriod, rest: &str) -> BucketKey {
        BucketKey::new(INLINE_NUMBER, &format!("{kind}/{period}/{rest}"))
    }

    /// The key of a bucket under caller-given limits that are not part of its key:
    /// `0:<kind>/<rest>`. Kind `c`: a `CL.THROTTLE` key (rest: the caller's key), whose
    /// limits come with every call, as in redis-cell.
    ///
    /// ```
    /// use cellrate_limits::names::BucketKey;
    /// let key = BucketKey::caller_key('c', "user123");
    /// assert_eq!(key.as_str(), "0:c/user123");
    /// assert!(key.is_caller_given());
    /// ```
    pub fn caller_key(kind: char, rest: &str) -> BucketKey {
        BucketKey::built(|text| {
            text.push_str("0:");
            text.push(kind);
            text.push('/');
            text.push_str(rest);
        })
    }

    /// This key counting against share `tag` of the bucket table (an
    /// envoyproxy/ratelimit-format rule's, [`rule_share`]) instead of its number's.
    pub fn with_share(self, tag: u16) -> BucketKey {
        BucketKey(self.0, tag)
    }

    /// The share this key counts against, when not its number's.
    pub fn share(&self) -> Option<u16> {
        (self.1 != 0).then_some(self.1)
    }

    /// Whether this bucket is under a caller-given limit (bounded apart from the rest).
    pub fn is_caller_given(&self) -> bool {
        self.0.starts_with("0:")
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name number and the id, split at the first colon (a calendar key's period
    /// left out: see [`BucketKey::head`]).
    pub fn parts(&self) -> (u32, &str) {
        // By byte, as `id`: a char searcher costs ~140 instructions, and the memory store
        // reads the number of every bucket it creates (its name's share of the table).
        let key: &str = &self.0;
        let (head, id) = match key.bytes().position(|b| b == b':') {
            Some(colon) => (&key[..colon], &key[colon + 1..]),
            None => ("0", key),
        };
        let number = match head.bytes().position(|b| b == b'@') {
            Some(at) => &head[..at],
            None => head,
        };
        (number.parse().unwrap_or(INLINE_NUMBER), id)
    }

    /// The id alone: what [`BucketKey::parts`] gives second, without reading the number
    /// (counting a denial needs only the id).
    pub fn id(&self) -> &str {
        // By byte: `split_once(':')`'s char searcher cost ~100 instructions a denial.
        match self.0.bytes().position(|b| b == b':') {
            Some(colon) => &self.0[colon + 1..],
            None => &self.0,
        }
    }

    /// What precedes the id: the number, and a calendar key's `@<period>`.
    pub fn head(&self) -> &str {
        // By byte, as `id`.
        match self.0.bytes().position(|b| b == b':') {
            Some(colon) => &self.0[..colon],
            None => "0",
        }
    }
}

/// The share of the bucket table of an envoyproxy/ratelimit-format rule, by its label
/// (its `name`, else its place `domain.key_value.key`): one of 32 767 tags from 32 768 up,
/// by a hash of the label that every process computes alike (a snapshot keeps the tags of
/// its buckets). Two rules of one tag share one share; so do names numbered 32 768 and up
/// that meet a rule's tag (numbers are small in practice: one a declared name).
///
/// ```
/// use cellrate_limits::names::rule_share;
/// assert!(rule_share("edge.api_key") >= 32_768);
/// assert_eq!(rule_share("edge.api_key"), rule_share("edge.api_key"));
/// assert_ne!(rule_share("edge.api_key"), rule_share("edge.remote_address"));
/// ```
pub fn rule_share(label: &str) -> u16 {
    // FNV-1a, 32 bits: stable across processes and builds, unlike a keyed hash.
    let hash = label.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    32_768 + (hash % 32_767) as u16
}

impl fmt::Display for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_split_the_number_from_the_id_at_the_first_colon() {
        let key = |text: &str| BucketKey(Arc::from(text), 0);
        assert_eq!(key("7:2001:db8::1").parts(), (7, "2001:db8::1"));
        assert_eq!(key("101@1d:tenant").parts(), (101, "tenant"));
        assert_eq!(key("101@1mo@Europe/Paris:a:b").parts(), (101, "a:b"));
        assert_eq!(key("no colon").parts(), (0, "no colon"));
        assert_eq!(key("x@1d:id").parts(), (INLINE_NUMBER, "id"));
        assert_eq!(key("99999999999:id").parts(), (INLINE_NUMBER, "id"));
        assert_eq!(key(":id").parts(), (INLINE_NUMBER, "id"));
    }

    #[test]
    fn bucket_keys_are_built_exactly() {
        for number in [0, 7, 10, 100, 4_294_967_295] {
            assert_eq!(
                BucketKey::new(number, "id").as_str(),
                format!("{number}:id")
            );
        }
        // The thread's buffer grows for a long id (300 bytes) and is let go after; the
        // keys built before and after it are the same text either way.
        for len in [0, 1, 20, 600, 21] {
            let id = "é".repeat(len / 2) + &"x".repeat(len % 2);
            let number = 4_294_967_295;
            assert_eq!(
                BucketKey::new(number, &id).as_str(),
                format!("{number}:{id}")
            );
        }
    }
}
