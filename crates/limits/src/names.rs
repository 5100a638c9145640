//! Limit names and bucket keys (ids and their formats are [`super::ids`]).
//!
//! Every limit has a [`Name`] with a stable number; a bucket's key is `"<number>:<id>"`
//! with the id in its format's canonical form ([`BucketKey`]). Numbers are part of stored
//! state (Redis keys), so they are never reused or renumbered. The nine built-in names
//! carry Boulder's numbers; users declare their own (number >= 100) in `names.yaml`.

use std::fmt;
use std::sync::Arc;

use crate::hash::ConfigMap;
use crate::ids::{IdError, IdFormat};
use cellrate_core::gcra::{Limit, Window};

/// The smallest number a user-declared name may take.
pub const FIRST_USER_NUMBER: u32 = 100;

/// The number of caller-given limits' buckets (`"0:..."`, see [`BucketKey::caller_given`]),
/// apart from every name.
pub const INLINE_NUMBER: u32 = 0;

/// The number of the buckets of envoyproxy/ratelimit-format limits (`"99:<digest>"`, the
/// digest of the domain and the descriptor's entries), apart from every name.
pub const RATELIMIT_NUMBER: u32 = 99;

/// A limit name: its text, stable number and id format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name {
    pub text: Arc<str>,
    pub number: u32,
    pub format: IdFormat,
    pub description: Option<String>,
}

impl Name {
    /// The bucket key of `id` under this name, canonicalising the id.
    ///
    /// ```
    /// use cellrate_limits::names::Names;
    /// let names = Names::builtin();
    /// let orders = names.get("NewOrdersPerAccount").unwrap();
    /// assert_eq!(orders.bucket_key("012345678").unwrap().as_str(), "3:12345678");
    /// ```
    pub fn bucket_key(&self, id: &str) -> Result<BucketKey, IdError> {
        let canonical = self.format.canonicalize(id)?;
        Ok(BucketKey::new(self.number, &canonical))
    }
}

/// The built-in names, with Boulder's numbers.
const BUILTIN: [(&str, u32, IdFormat); 9] = [
    ("NewRegistrationsPerIPAddress", 1, IdFormat::IpAddress),
    ("NewRegistrationsPerIPv6Range", 2, IdFormat::Ipv6RangeCidr),
    ("NewOrdersPerAccount", 3, IdFormat::RegId),
    (
        "FailedAuthorizationsPerDomainPerAccount",
        4,
        IdFormat::RegIdFqdn,
    ),
    ("CertificatesPerDomain", 5, IdFormat::Domain),
    (
        "CertificatesPerDomainPerAccount",
        6,
        IdFormat::RegIdRegisteredDomain,
    ),
    ("CertificatesPerFQDNSet", 7, IdFormat::FqdnSet),
    (
        "FailedAuthorizationsForPausingPerDomainPerAccount",
        8,
        IdFormat::RegIdFqdn,
    ),
    ("LimitOverrideRequestsPerIPAddress", 9, IdFormat::IpAddress),
];

/// Why a user-declared name cannot be added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("name {0:?} must start with a letter and hold only letters, digits and '_'")]
    BadText(String),
    #[error("name {0:?} is already declared")]
    DuplicateName(String),
    #[error("number {number} of {name:?} is already taken by {other:?}")]
    DuplicateNumber {
        name: String,
        number: u32,
        other: String,
    },
    #[error(
        "number {number} of {name:?} is below {FIRST_USER_NUMBER} (reserved for built-in names)"
    )]
    ReservedNumber { name: String, number: u32 },
}

/// The registry of names: built-in plus user-declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    names: Vec<Name>,
    by_text: ConfigMap<Arc<str>, usize>,
    by_number: ConfigMap<u32, usize>,
}

impl Names {
    /// The nine built-in names.
    pub fn builtin() -> Names {
        let mut names = Names {
            names: Vec::new(),
            by_text: ConfigMap::default(),
            by_number: ConfigMap::default(),
        };
        for (text, number, format) in BUILTIN {
            names.insert(Name {
                text: text.into(),
                number,
                format,
                description: None,
            });
        }
        names
    }

    fn insert(&mut self, name: Name) {
        let index = self.names.len();
        self.by_text.insert(name.text.clone(), index);
        self.by_number.insert(name.number, index);
        self.names.push(name);
    }

    /// Declares a user name (number >= 100, a format users may choose).
    pub fn declare(
        &mut self,
        text: &str,
        number: u32,
        format: IdFormat,
        description: Option<String>,
    ) -> Result<(), NameError> {
        let well_formed = text.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && text.len() <= 128;
        if !well_formed {
            return Err(NameError::BadText(text.to_string()));
        }
        if self.by_text.contains_key(text) {
            return Err(NameError::DuplicateName(text.to_string()));
        }
        if number < FIRST_USER_NUMBER {
            return Err(NameError::ReservedNumber {
                name: text.to_string(),
                number,
            });
        }
        if let Some(&other) = self.by_number.get(&number) {
            return Err(NameError::DuplicateNumber {
                name: text.to_string(),
                number,
                other: self.names[other].text.to_string(),
            });
        }
        self.insert(Name {
            text: text.into(),
            number,
            format,
            description,
        });
        Ok(())
    }

    /// The name spelled `text`.
    pub fn get(&self, text: &str) -> Option<&Name> {
        self.by_text.get(text).map(|&i| &self.names[i])
    }

    /// The name numbered `number`.
    pub fn by_number(&self, number: u32) -> Option<&Name> {
        self.by_number.get(&number).map(|&i| &self.names[i])
    }

    /// Every name, built-in first, then in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = &Name> {
        self.names.iter()
    }

    /// The known name closest to the unknown `text`, if one is close enough to be a
    /// misspelling: at most one edit per five characters (at least one, at most three),
    /// letter case not counted. Bounded work: nothing is suggested for names longer than
    /// 128 bytes or among more than [`MAX_SUGGESTION_CANDIDATES`] names.
    ///
    /// ```
    /// use cellrate_limits::names::Names;
    /// let names = Names::builtin();
    /// assert_eq!(names.closest("NewOrderPerAccount"), Some("NewOrdersPerAccount"));
    /// assert_eq!(names.closest("neworderSperaccount"), Some("NewOrdersPerAccount"));
    /// assert_eq!(names.closest("Bandwidth"), None);
    /// ```
    pub fn closest(&self, text: &str) -> Option<&str> {
        if text.len() > 128 || self.names.len() > MAX_SUGGESTION_CANDIDATES {
            return None;
        }
        let budget = (text.len() / 5).clamp(1, 3);
        self.names
            .iter()
            .filter_map(|name| {
                let distance = edit_distance_within(text.as_bytes(), name.text.as_bytes(), budget)?;
                Some((distance, &*name.text))
            })
            .min_by_key(|&(distance, _)| distance)
            .map(|(_, text)| text)
    }

    /// `unknown limit name "x"`, with `(did you mean "y"?)` when a known name is close.
    pub fn unknown(&self, text: &str) -> String {
        match self.closest(text) {
            Some(close) => format!("unknown limit name {text:?} (did you mean {close:?}?)"),
            None => format!("unknown limit name {text:?}"),
        }
    }
}

/// Names compared when suggesting a spelling (beyond it, no suggestion: bounded work).
pub const MAX_SUGGESTION_CANDIDATES: usize = 1024;

/// The edit distance (insertions, deletions, substitutions; ASCII case ignored) between `a`
/// and `b` if it is at most `budget`, in O(len * budget) steps (a band of the table).
fn edit_distance_within(a: &[u8], b: &[u8], budget: usize) -> Option<usize> {
    if a.len().abs_diff(b.len()) > budget {
        return None;
    }
    let over = budget + 1;
    // previous[j]: the distance between a[..i] and b[..j]; `over` outside the band.
    let mut previous: Vec<usize> = (0..=b.len()).map(|j| j.min(over)).collect();
    let mut current = vec![over; b.len() + 1];
    for i in 1..=a.len() {
        let low = i.saturating_sub(budget).max(1);
        let high = (i + budget).min(b.len());
        current.fill(over);
        current[0] = i.min(over);
        let mut best = current[0];
        for j in low..=high {
            let same = a[i - 1].eq_ignore_ascii_case(&b[j - 1]);
            let value = (previous[j - 1] + usize::from(!same))
                .min(previous[j] + 1)
                .min(current[j - 1] + 1)
                .min(over);
            current[j] = value;
            best = best.min(value);
        }
        if best > budget {
            return None;
        }
        std::mem::swap(&mut previous, &mut current);
    }
    Some(previous[b.len()]).filter(|&d| d <= budget)
}

/// A bucket's key: `"<number>:<id>"` with a canonical id.
///
/// ```
/// use cellrate_limits::names::BucketKey;
/// let key = BucketKey::new(1, "2001:db8::1");
/// assert_eq!(key.as_str(), "1:2001:db8::1");
/// assert_eq!(key.parts(), (1, "2001:db8::1")); // split at the first colon only
/// assert_eq!(key.id(), "2001:db8::1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey(Arc<str>);

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
        // One allocation, the Arc's own: the text is put together in a buffer this thread
        // keeps, not in a fresh String that the Arc would copy and free.
        thread_local! {
            static TEXT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        TEXT.with_borrow_mut(|text| {
            text.clear();
            // ASCII digits pushed as chars: no UTF-8 check of what was just written.
            text.extend(digits[at..].iter().map(|&d| char::from(d)));
            text.push(':');
            text.push_str(id);
            let key = BucketKey(Arc::from(text.as_str()));
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
            Window::Calendar(period) => BucketKey(Arc::from(format!("{number}@{period}:{id}"))),
            Window::Concurrency => BucketKey(Arc::from(format!("{number}@lease:{id}"))),
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
        let mut key = String::with_capacity(4 + rest.len());
        key.push_str("0:");
        key.push(kind);
        key.push('/');
        key.push_str(rest);
        BucketKey(Arc::from(key))
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
        let (head, id) = self.0.split_once(':').unwrap_or(("0", &self.0));
        let number = head.split_once('@').map_or(head, |(number, _)| number);
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
        self.0.split_once(':').map_or("0", |(head, _)| head)
    }
}

impl fmt::Display for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::*;
    use std::borrow::Cow;

    /// The whole table, for reference.
    fn edit_distance(a: &[u8], b: &[u8]) -> usize {
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for i in 1..=a.len() {
            let mut diagonal = row[0];
            row[0] = i;
            for j in 1..=b.len() {
                let cost = usize::from(!a[i - 1].eq_ignore_ascii_case(&b[j - 1]));
                let value = (diagonal + cost).min(row[j] + 1).min(row[j - 1] + 1);
                diagonal = row[j];
                row[j] = value;
            }
        }
        row[b.len()]
    }

    #[test]
    fn the_banded_edit_distance_agrees_with_the_whole_table() {
        let words = [
            "",
            "a",
            "ab",
            "ba",
            "abc",
            "NewOrdersPerAccount",
            "NewOrderPerAccount",
            "neworderSperaccount",
            "NewOrdersPerAccounts",
            "NewRegistrationsPerIPAddress",
            "NewRegistrationsPerIPv6Range",
            "ApiRequestsPerKey",
            "ApiRequestsPerKeyDaily",
            "xNewOrdersPerAccountx",
            "NewOrdersPerAcount",
            "NweOrdersPerAccount",
        ];
        for a in words {
            for b in words {
                let full = edit_distance(a.as_bytes(), b.as_bytes());
                for budget in 0..5 {
                    let banded = edit_distance_within(a.as_bytes(), b.as_bytes(), budget);
                    let expected = (full <= budget).then_some(full);
                    assert_eq!(banded, expected, "{a:?} {b:?} within {budget}");
                }
            }
        }
    }

    #[test]
    fn suggestions_are_close_names_only() {
        let names = Names::builtin();
        assert_eq!(
            names.closest("NewOrdersPerAcount"),
            Some("NewOrdersPerAccount")
        );
        assert_eq!(
            names.closest("NweOrdersPerAccount"),
            Some("NewOrdersPerAccount")
        );
        assert_eq!(names.closest("Orders"), None);
        assert_eq!(names.closest(&"x".repeat(129)), None);
        assert_eq!(
            names.unknown("NewOrderPerAccount"),
            "unknown limit name \"NewOrderPerAccount\" (did you mean \"NewOrdersPerAccount\"?)"
        );
        assert_eq!(names.unknown("Nope"), "unknown limit name \"Nope\"");
    }

    fn ok(format: IdFormat, id: &str) -> String {
        format
            .canonicalize(id)
            .unwrap_or_else(|e| panic!("{format} {id:?}: {e}"))
    }

    fn bad(format: IdFormat, id: &str) -> String {
        match format.canonicalize(id) {
            Ok(c) => panic!("{format} {id:?} was accepted as {c:?}"),
            Err(e) => e.reason,
        }
    }

    #[test]
    fn ip_address_canonical_text() {
        use IdFormat::IpAddress as F;
        assert_eq!(ok(F, "10.0.0.1"), "10.0.0.1");
        assert_eq!(ok(F, "192.168.1.1"), "192.168.1.1"); // private is allowed
        assert_eq!(ok(F, "127.0.0.1"), "127.0.0.1");
        assert_eq!(
            ok(F, "2001:0db8:0000:0000:0000:ff00:0042:8329"),
            "2001:db8::ff00:42:8329"
        );
        assert_eq!(ok(F, "2001:DB8::1"), "2001:db8::1");
        assert_eq!(ok(F, "::ffff:10.1.2.3"), "10.1.2.3");
        assert_eq!(ok(F, "::1"), "::1");
        assert!(bad(F, "10.0.0.256").contains("not an IPv4"));
        assert!(bad(F, "010.0.0.1").contains("not an IPv4"));
        assert!(bad(F, "fe80::1%eth0").contains("zone"));
        assert!(bad(F, "").contains("not an IPv4"));
        assert!(bad(F, "example.com").contains("not an IPv4"));
        assert!(bad(F, " 10.0.0.1").contains("not an IPv4"));
    }

    #[test]
    fn ipv6_range_masks_to_48() {
        use IdFormat::Ipv6RangeCidr as F;
        assert_eq!(ok(F, "2001:0db8:0000::/48"), "2001:db8::/48");
        assert_eq!(ok(F, "2001:db8:1234:5678::1"), "2001:db8:1234::/48");
        assert_eq!(ok(F, "2001:db8:1234:ffff::/48"), "2001:db8:1234::/48");
        assert!(bad(F, "2001:db8::/64").contains("/64 is not /48"));
        assert!(bad(F, "10.0.0.1").contains("not an IPv6"));
        assert!(bad(F, "10.0.0.0/48").contains("not an IPv6"));
        assert!(bad(F, "fe80::1%lo/48").contains("zone"));
    }

    #[test]
    fn reg_id_is_unsigned_decimal() {
        use IdFormat::RegId as F;
        assert_eq!(ok(F, "12345678"), "12345678");
        assert_eq!(ok(F, "000123"), "123");
        assert_eq!(ok(F, "0"), "0");
        assert_eq!(ok(F, "18446744073709551615"), "18446744073709551615");
        assert!(bad(F, "18446744073709551616").contains("64 bits"));
        assert!(bad(F, "-1").contains("unsigned decimal"));
        assert!(bad(F, "+1").contains("unsigned decimal"));
        assert!(bad(F, "1e3").contains("unsigned decimal"));
        assert!(bad(F, "").contains("unsigned decimal"));
    }

    #[test]
    fn domain_reduces_to_registrable_domain() {
        use IdFormat::Domain as F;
        assert_eq!(ok(F, "example.com"), "example.com");
        assert_eq!(ok(F, "WWW.Example.COM"), "example.com");
        assert_eq!(ok(F, "a.b.example.co.uk."), "example.co.uk");
        assert_eq!(ok(F, "xn--bcher-kva.example"), "xn--bcher-kva.example");
        assert_eq!(ok(F, "build.corp.internal"), "corp.internal");
        assert!(bad(F, "co.uk").contains("public suffix"));
        assert!(bad(F, "com").contains("public suffix"));
        assert!(bad(F, "bücher.de").contains("A-labels"));
        assert!(bad(F, "-bad.example.com").contains("label"));
        assert!(bad(F, "a..example.com").contains("label"));
        assert!(bad(F, "under_score.com").contains("label"));
        assert!(bad(F, "10.0.0.1").contains("IP address"));
        assert!(bad(F, "").contains("1 to 253"));
        assert!(bad(F, &format!("{}.com", "a".repeat(64))).contains("label"));
    }

    #[test]
    fn fqdn_set_is_normalised_then_hashed() {
        use IdFormat::FqdnSet as F;
        let a = ok(F, "example.com,example.org");
        assert_eq!(a, ok(F, "EXAMPLE.org, example.com,example.com"));
        assert_eq!(a.len(), 64);
        assert!(a
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        // Exact names, not reduced to eTLD+1.
        assert_ne!(ok(F, "www.example.com"), ok(F, "example.com"));
        // SHA-256 of "example.com" (a one-name set).
        assert_eq!(
            ok(F, "example.com"),
            "a379a6f6eeafb9a55e378c118034e2751e682fab9f2d30ab13d2125586ce1947"
        );
        assert!(bad(F, "example.com,,example.org").contains("in the set"));
        assert!(bad(F, "").contains("in the set"));
    }

    #[test]
    fn string_is_printable_and_bounded() {
        use IdFormat::String as F;
        assert_eq!(ok(F, "key-abc-123"), "key-abc-123");
        assert_eq!(ok(F, "user name:with colon"), "user name:with colon");
        assert_eq!(ok(F, &"k".repeat(256)), "k".repeat(256));
        assert!(bad(F, &"k".repeat(257)).contains("1 to 256 bytes"));
        assert!(bad(F, "").contains("1 to 256 bytes"));
        assert!(bad(F, "a\nb").contains("control"));
        assert!(bad(F, "a\0b").contains("control"));
    }

    #[test]
    fn composite_reg_id_domain() {
        assert_eq!(
            ok(IdFormat::RegIdRegisteredDomain, "0042:WWW.Example.com"),
            "42:example.com"
        );
        assert_eq!(
            ok(IdFormat::RegIdFqdn, "42:WWW.Example.com"),
            "42:www.example.com"
        );
        assert!(bad(IdFormat::RegIdFqdn, "42").contains("regId:domain"));
        assert!(bad(IdFormat::RegIdFqdn, "x:example.com").contains("unsigned"));
        assert_eq!(IdFormat::RegIdFqdn.override_id("42:www.example.com"), "42");
        assert_eq!(IdFormat::IpAddress.override_id("::1"), "::1");
        assert_eq!(IdFormat::RegIdFqdn.override_format(), IdFormat::RegId);
    }

    #[test]
    fn canonical_ids_are_borrowed_and_keys_built_exactly() {
        assert!(matches!(
            IdFormat::String.canonicalize_cow("k-1"),
            Ok(Cow::Borrowed("k-1"))
        ));
        assert!(matches!(
            IdFormat::RegId.canonicalize_cow("42"),
            Ok(Cow::Borrowed("42"))
        ));
        assert!(matches!(
            IdFormat::RegId.canonicalize_cow("0"),
            Ok(Cow::Borrowed("0"))
        ));
        assert_eq!(IdFormat::RegId.canonicalize_cow("007").unwrap(), "7");
        assert!(IdFormat::RegId.canonicalize_cow("4x").is_err());
        assert!(IdFormat::String.canonicalize_cow("").is_err());
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

    #[test]
    fn error_messages_cut_long_ids() {
        let e = IdFormat::RegId.canonicalize(&"x".repeat(1000)).unwrap_err();
        assert!(e.id.len() < 100);
    }

    #[test]
    fn builtin_numbers_follow_boulder() {
        let names = Names::builtin();
        assert_eq!(names.get("NewOrdersPerAccount").unwrap().number, 3);
        assert_eq!(
            names.by_number(9).unwrap().text.as_ref(),
            "LimitOverrideRequestsPerIPAddress"
        );
        assert_eq!(names.iter().count(), 9);
        let key = names
            .get("CertificatesPerDomainPerAccount")
            .unwrap()
            .bucket_key("12345678:www.example.com")
            .unwrap();
        assert_eq!(key.as_str(), "6:12345678:example.com");
        assert_eq!(key.parts(), (6, "12345678:example.com"));
        assert_eq!(key.id(), key.parts().1);
    }

    #[test]
    fn user_names_are_checked() {
        let mut names = Names::builtin();
        names
            .declare("ApiRequestsPerKey", 100, IdFormat::String, None)
            .unwrap();
        assert_eq!(names.by_number(100).unwrap().format, IdFormat::String);
        assert!(matches!(
            names.declare("ApiRequestsPerKey", 101, IdFormat::String, None),
            Err(NameError::DuplicateName(_))
        ));
        assert!(matches!(
            names.declare("Other", 100, IdFormat::String, None),
            Err(NameError::DuplicateNumber { .. })
        ));
        assert!(matches!(
            names.declare("Low", 99, IdFormat::String, None),
            Err(NameError::ReservedNumber { .. })
        ));
        assert!(matches!(
            names.declare("NewOrdersPerAccount", 200, IdFormat::String, None),
            Err(NameError::DuplicateName(_))
        ));
        assert!(matches!(
            names.declare("9Lives", 201, IdFormat::String, None),
            Err(NameError::BadText(_))
        ));
        assert!(matches!(
            names.declare("has space", 202, IdFormat::String, None),
            Err(NameError::BadText(_))
        ));
    }
}
