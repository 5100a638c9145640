//! Ids and their formats: how a name's ids are written, and the canonical form a bucket
//! key holds (an IP address in RFC 5952 text, a domain reduced to its registrable domain,
//! a set of domains hashed, ...), so that one client cannot spell its id two ways.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use sha2::{Digest, Sha256};

/// The longest `string` id, in bytes.
pub const MAX_STRING_ID: usize = 256;

/// How a name's ids are written, and their canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdFormat {
    /// IPv4 or IPv6; canonical text (RFC 5952 for v6), IPv4-mapped v6 becomes v4.
    IpAddress,
    /// An IPv6 /48, `2001:db8::/48`; a plain IPv6 address is masked to its /48.
    Ipv6RangeCidr,
    /// An unsigned 64-bit decimal, leading zeros dropped.
    RegId,
    /// A domain reduced to its registrable domain (eTLD+1), lowercase.
    Domain,
    /// Comma-separated domains; the id is the SHA-256 hex of the lowercased,
    /// de-duplicated, sorted list.
    FqdnSet,
    /// An opaque id: 1..=256 bytes of printable text.
    String,
    /// `regId:domain` with the exact (lowercased) domain; overrides use the regId.
    RegIdFqdn,
    /// `regId:domain` with the domain reduced to eTLD+1; overrides use the regId.
    RegIdRegisteredDomain,
}

impl IdFormat {
    /// The formats a user-declared name may use, by their config spelling.
    pub fn from_config(text: &str) -> Option<IdFormat> {
        Some(match text {
            "ipAddress" => IdFormat::IpAddress,
            "ipv6RangeCIDR" => IdFormat::Ipv6RangeCidr,
            "regId" => IdFormat::RegId,
            "domain" => IdFormat::Domain,
            "fqdnSet" => IdFormat::FqdnSet,
            "string" => IdFormat::String,
            _ => return None,
        })
    }

    /// The config spellings accepted by [`IdFormat::from_config`].
    pub const CONFIG_NAMES: &'static str =
        "ipAddress, ipv6RangeCIDR, regId, domain, fqdnSet, string";

    /// Canonicalises `id`, or says why it does not fit this format.
    ///
    /// ```
    /// use cellrate_limits::ids::IdFormat;
    /// assert_eq!(IdFormat::IpAddress.canonicalize("2001:0db8:0000::0001").unwrap(), "2001:db8::1");
    /// assert_eq!(IdFormat::Domain.canonicalize("WWW.Example.CO.UK.").unwrap(), "example.co.uk");
    /// assert!(IdFormat::RegId.canonicalize("-1").is_err());
    /// ```
    pub fn canonicalize(self, id: &str) -> Result<String, IdError> {
        self.canonicalize_cow(id).map(Cow::into_owned)
    }

    /// As [`IdFormat::canonicalize`], borrowing `id` when it already is canonical (the
    /// common case for `string` and `regId` ids and IPv4 addresses: no copy on the
    /// request path).
    pub fn canonicalize_cow(self, id: &str) -> Result<Cow<'_, str>, IdError> {
        match self {
            IdFormat::String => check_string(id).map(|()| Cow::Borrowed(id)),
            IdFormat::IpAddress => canonical_ip(id),
            IdFormat::RegId if !id.starts_with('0') || id == "0" => {
                canonical_reg_id(id).map(|_| Cow::Borrowed(id))
            }
            other => other.canonicalize_owned(id).map(Cow::Owned),
        }
    }

    fn canonicalize_owned(self, id: &str) -> Result<String, IdError> {
        match self {
            IdFormat::IpAddress => canonical_ip(id).map(Cow::into_owned),
            IdFormat::Ipv6RangeCidr => canonical_ipv6_range(id),
            IdFormat::RegId => canonical_reg_id(id),
            IdFormat::Domain => registrable_domain(id),
            IdFormat::FqdnSet => fqdn_set_hash(id),
            IdFormat::String => check_string(id).map(|()| id.to_string()),
            IdFormat::RegIdFqdn | IdFormat::RegIdRegisteredDomain => {
                let (reg_id, domain) = id.split_once(':').ok_or_else(|| {
                    IdError::new(
                        id,
                        "expected \"regId:domain\", e.g. \"12345678:example.com\"",
                    )
                })?;
                let reg_id = canonical_reg_id(reg_id)?;
                let domain = if self == IdFormat::RegIdFqdn {
                    canonical_hostname(domain)?
                } else {
                    registrable_domain(domain)?
                };
                Ok(format!("{reg_id}:{domain}"))
            }
        }
    }

    /// The format of the ids that overrides list for this name: a composite
    /// `regId:domain` name is overridden per regId.
    pub fn override_format(self) -> IdFormat {
        match self {
            IdFormat::RegIdFqdn | IdFormat::RegIdRegisteredDomain => IdFormat::RegId,
            other => other,
        }
    }

    /// The part of a canonical id that overrides are looked up by.
    pub fn override_id(self, canonical: &str) -> &str {
        match self {
            IdFormat::RegIdFqdn | IdFormat::RegIdRegisteredDomain => canonical
                .split_once(':')
                .map_or(canonical, |(reg_id, _)| reg_id),
            _ => canonical,
        }
    }
}

impl fmt::Display for IdFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdFormat::IpAddress => "ipAddress",
            IdFormat::Ipv6RangeCidr => "ipv6RangeCIDR",
            IdFormat::RegId => "regId",
            IdFormat::Domain => "domain",
            IdFormat::FqdnSet => "fqdnSet",
            IdFormat::String => "string",
            IdFormat::RegIdFqdn => "regId:fqdn",
            IdFormat::RegIdRegisteredDomain => "regId:domain",
        })
    }
}

/// An id that does not fit its format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("id {id:?}: {reason}")]
pub struct IdError {
    pub id: String,
    pub reason: String,
}

impl IdError {
    fn new(id: &str, reason: impl Into<String>) -> IdError {
        // Long garbage ids are cut in messages; the reason says what was wrong.
        let id = match id.char_indices().nth(64) {
            Some((cut, _)) => format!("{}...", &id[..cut]),
            None => id.to_string(),
        };
        IdError {
            id,
            reason: reason.into(),
        }
    }
}

/// An address as its canonical text. A dotted quad that parses is already that text
/// unless a part has a leading zero (which std's parser refuses today): it is borrowed,
/// since formatting it again would cost more than the whole rest of the decision.
fn canonical_ip(id: &str) -> Result<Cow<'_, str>, IdError> {
    // The common case, seen without a parse (-160 instructions a request, #62).
    if is_canonical_ipv4(id.as_bytes()) {
        return Ok(Cow::Borrowed(id));
    }
    // Bytes, not chars: a char pattern's searcher cost more here than the parse.
    if id.as_bytes().contains(&b'%') {
        return Err(IdError::new(id, "IPv6 zone ids are not allowed"));
    }
    let ip: IpAddr = id
        .parse()
        .map_err(|_| IdError::new(id, "not an IPv4 or IPv6 address"))?;
    if ip.is_ipv4() && !has_leading_zero(id) {
        return Ok(Cow::Borrowed(id));
    }
    Ok(Cow::Owned(ip.to_canonical().to_string()))
}

/// Whether `text` is a dotted quad as its canonical form writes it: four decimal parts, each
/// at most 255, none with a leading zero (what std parses as IPv4 and `has_leading_zero`
/// passes, which a test holds).
fn is_canonical_ipv4(text: &[u8]) -> bool {
    let mut parts = 0;
    for part in text.split(|&b| b == b'.') {
        parts += 1;
        let canonical = match part {
            [digit] => digit.is_ascii_digit(),
            [b'1'..=b'9', rest @ ..] if rest.len() <= 2 => {
                // Three digits compare as their numbers do.
                rest.iter().all(u8::is_ascii_digit) && (part.len() < 3 || part <= &b"255"[..])
            }
            _ => false,
        };
        if !canonical || parts > 4 {
            return false;
        }
    }
    parts == 4
}

/// Whether a part of a dotted quad starts with a zero followed by a digit.
fn has_leading_zero(quad: &str) -> bool {
    let b = quad.as_bytes();
    (0..b.len().saturating_sub(1))
        .any(|i| b[i] == b'0' && (i == 0 || b[i - 1] == b'.') && b[i + 1].is_ascii_digit())
}

fn canonical_ipv6_range(id: &str) -> Result<String, IdError> {
    let addr = match id.split_once('/') {
        Some((addr, "48")) => addr,
        Some((_, other)) => {
            return Err(IdError::new(
                id,
                format!("prefix /{other} is not /48 (ipv6RangeCIDR is an IPv6 /48)"),
            ))
        }
        None => id,
    };
    if addr.contains('%') {
        return Err(IdError::new(id, "IPv6 zone ids are not allowed"));
    }
    let ip: Ipv6Addr = addr
        .parse()
        .map_err(|_| IdError::new(id, "not an IPv6 address or /48 range"))?;
    let masked = Ipv6Addr::from(u128::from(ip) & !(u128::MAX >> 48));
    Ok(format!("{masked}/48"))
}

fn canonical_reg_id(id: &str) -> Result<String, IdError> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(IdError::new(id, "not an unsigned decimal registration id"));
    }
    let n: u64 = id
        .parse()
        .map_err(|_| IdError::new(id, "registration id exceeds 64 bits"))?;
    Ok(n.to_string())
}

/// A hostname lowercased, without a trailing dot, checked label by label.
fn canonical_hostname(id: &str) -> Result<String, IdError> {
    if !id.is_ascii() {
        return Err(IdError::new(
            id,
            "domain is not ASCII: write internationalised names as A-labels (xn--...)",
        ));
    }
    let host = id.strip_suffix('.').unwrap_or(id).to_ascii_lowercase();
    if host.is_empty() || host.len() > 253 {
        return Err(IdError::new(id, "domain must be 1 to 253 characters"));
    }
    if host.parse::<IpAddr>().is_ok() {
        return Err(IdError::new(id, "an IP address is not a domain"));
    }
    for label in host.split('.') {
        let ok = (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(IdError::new(
                id,
                format!("label {label:?} is not 1 to 63 letters, digits or inner hyphens"),
            ));
        }
    }
    Ok(host)
}

fn registrable_domain(id: &str) -> Result<String, IdError> {
    let host = canonical_hostname(id)?;
    match psl::domain_str(&host) {
        Some(domain) => Ok(domain.to_string()),
        None => Err(IdError::new(
            id,
            "is a public suffix or has no registrable domain (eTLD+1)",
        )),
    }
}

fn fqdn_set_hash(id: &str) -> Result<String, IdError> {
    let mut names = id
        .split(',')
        .map(|name| canonical_hostname(name.trim()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| IdError::new(id, format!("in the set: {e}")))?;
    names.sort_unstable();
    names.dedup();
    let digest = Sha256::digest(names.join(",").as_bytes());
    Ok(hex::encode(digest))
}

#[inline]
fn check_string(id: &str) -> Result<(), IdError> {
    if id.is_empty() || id.len() > MAX_STRING_ID {
        return Err(IdError::new(
            id,
            format!("must be 1 to {MAX_STRING_ID} bytes, is {}", id.len()),
        ));
    }
    if id.chars().any(char::is_control) {
        return Err(IdError::new(id, "contains a control character"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_canonical_and_dotted_quads_borrowed() {
        let borrowed = |id| {
            matches!(
                IdFormat::IpAddress.canonicalize_cow(id),
                Ok(Cow::Borrowed(_))
            )
        };
        for id in ["10.0.0.1", "0.0.0.0", "255.255.255.255"] {
            assert!(borrowed(id), "{id}");
            assert_eq!(IdFormat::IpAddress.canonicalize(id).unwrap(), id);
        }
        // Rewritten: IPv6 and an IPv4-mapped address (one bucket with its IPv4 spelling).
        for (id, canonical) in [
            ("2001:0db8::0001", "2001:db8::1"),
            ("::ffff:10.0.0.1", "10.0.0.1"),
        ] {
            assert!(!borrowed(id), "{id}");
            assert_eq!(IdFormat::IpAddress.canonicalize(id).unwrap(), canonical);
        }
        for bad in [
            "010.0.0.1",
            "10.0.0.01",
            "10.0.0",
            "10.0.0.256",
            " 10.0.0.1",
            "fe80::1%eth0",
        ] {
            assert!(IdFormat::IpAddress.canonicalize_cow(bad).is_err(), "{bad}");
        }
        for zero in ["010.0.0.1", "10.0.0.01", "10.00.0.1", "00.0.0.0"] {
            assert!(has_leading_zero(zero), "{zero}");
        }
        for none in ["10.0.0.0", "0.0.0.0", "100.200.10.1", "0.10.0.0"] {
            assert!(!has_leading_zero(none), "{none}");
        }
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
    fn canonical_ids_are_borrowed_when_already_canonical() {
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
    }

    #[test]
    fn error_messages_cut_long_ids() {
        let e = IdFormat::RegId.canonicalize(&"x".repeat(1000)).unwrap_err();
        assert!(e.id.len() < 100);
    }

    #[test]
    fn canonical_dotted_quads_are_seen_as_the_parse_sees_them() {
        let parts = [
            "0", "1", "9", "10", "99", "100", "199", "249", "250", "255", "256", "300", "999",
            "00", "01", "010", "001", "", "a", "1a", "-1", "+1", "2555", " 1",
        ];
        let mut texts = Vec::new();
        for a in parts {
            texts.push(format!("{a}.1.2"));
            texts.push(format!("1.2.3.4.{a}"));
            for b in parts {
                for c in parts {
                    texts.push(format!("{a}.{b}.{c}.7"));
                    texts.push(format!("7.{a}.{b}.{c}"));
                }
            }
        }
        texts.extend(["::1", "1.2.3.4:80", "1.2.3.4.", ".1.2.3", "1..2.3"].map(String::from));
        for t in &texts {
            let parsed = t.parse::<std::net::Ipv4Addr>().is_ok() && !has_leading_zero(t);
            assert_eq!(is_canonical_ipv4(t.as_bytes()), parsed, "{t:?}");
        }
        assert_eq!(
            IdFormat::IpAddress.canonicalize_cow("10.0.255.1").unwrap(),
            Cow::<str>::Borrowed("10.0.255.1")
        );
    }
}
