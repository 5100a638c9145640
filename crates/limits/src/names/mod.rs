//! Limit names and bucket keys (ids and their formats are [`super::ids`]).
//!
//! Every limit has a [`Name`] with a stable number; a bucket's key is `"<number>:<id>"`
//! with the id in its format's canonical form ([`BucketKey`]). Numbers are part of stored
//! state (Redis keys), so they are never reused or renumbered. The nine built-in names
//! carry Boulder's numbers; users declare their own (number >= 100) in `names.yaml`.

use std::sync::Arc;

use crate::hash::ConfigMap;
use crate::ids::{IdError, IdFormat};

mod key;
pub use key::{rule_share, BucketKey};

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

#[cfg(test)]
mod tests {
    use super::*;

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
