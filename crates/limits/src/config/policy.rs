//! What applies to a bucket ([`Policy`]) and how a limit behaves apart from its numbers
//! ([`Behaviour`], [`Headers`], [`Measures`]): what an override replaces and what it keeps.

use cellrate_core::gcra::{Limit, Window};

/// What applies to a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Decide with this limit's numbers (and its window kind, which is part of what the
    /// numbers mean), behaving as `behaviour` says.
    Limited { limit: Limit, behaviour: Behaviour },
    /// On the allow list: always allowed, nothing stored.
    Unlimited,
    /// On the deny list: always denied, nothing stored.
    Denied,
}

/// How a limit behaves, apart from its numbers: what a temporary override or a caller's
/// own numbers keep of the configured limit they replace ([`Policy::overridden_by`],
/// `service::resolve`), so that a field added here is carried by those places without
/// a change there. (A [`Limit`] scaled for the Redis store's local fallback keeps its
/// window kind the same way: [`Limit::divided`] replaces the numbers only.)
///
/// ```
/// use cellrate_limits::config::{Behaviour, Policy};
/// use cellrate_core::gcra::Limit;
/// let configured = Policy::Limited {
///     limit: Limit::new(10, 10, 1_000_000_000).unwrap(),
///     behaviour: Behaviour { shadow: true, ..Behaviour::default() },
/// };
/// let raised = Limit::new(100, 100, 1_000_000_000).unwrap();
/// let temporary = Policy::Limited { limit: raised, behaviour: Behaviour::default() };
/// assert_eq!(
///     Policy::overridden_by(Some(configured), temporary),
///     Policy::Limited { limit: raised, behaviour: configured.behaviour() },
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Behaviour {
    /// In shadow mode, Envoy's answers report OK even when the limit denies (the decision
    /// is still made, spent when allowed, and counted).
    pub shadow: bool,
    /// Every spend is recorded, into debt if need be ([`cellrate_core::gcra::charge`]).
    pub overdraw: bool,
    /// What rate-limit headers may say of the limit. The name's own: an override in a file
    /// takes its default's ([`LimitTable::from_files`]), a temporary one keeps it too.
    pub headers: Headers,
}

/// What the rate-limit headers of Envoy's answers say of a limit (`headers` and `measures`
/// in `defaults.yaml`).
///
/// ```
/// use cellrate_limits::config::{Headers, Measures};
/// let shown = Headers::default();
/// assert!(!shown.hidden);
/// assert_eq!(shown.measures, Measures::Requests);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Headers {
    /// `headers: hidden`: never in any rate-limit header, `Retry-After` or
    /// `dynamic_metadata` (an abuse guard tells a client nothing); it still denies.
    pub hidden: bool,
    /// What one token of the limit is, for the OpenAI-style headers' `-requests` and
    /// `-tokens` fields.
    pub measures: Measures,
}

/// What a limit counts (`measures: requests | tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Measures {
    /// Requests (the default): `x-ratelimit-*-requests`.
    #[default]
    Requests,
    /// Tokens of a model API: `x-ratelimit-*-tokens`.
    Tokens,
}

impl Policy {
    /// A limit with the default behaviour (enforced, no debt).
    pub fn limited(limit: Limit) -> Policy {
        Policy::Limited {
            limit,
            behaviour: Behaviour::default(),
        }
    }

    /// The limit's behaviour (the default for unlimited and denied).
    pub fn behaviour(&self) -> Behaviour {
        match self {
            Policy::Limited { behaviour, .. } => *behaviour,
            Policy::Unlimited | Policy::Denied => Behaviour::default(),
        }
    }

    /// What applies while `temporary` overrides `configured`: a temporary limit changes
    /// the numbers, not how the limit behaves. A limit configured `shadow` stays in shadow
    /// mode (raising it in an incident must not start enforcing it), one configured
    /// `overdraw` keeps charging; the whole [`Behaviour`] is kept, whatever it holds.
    /// A temporary `unlimited` or `deny`, or a limit over nothing limited, applies as it is.
    pub fn overridden_by(configured: Option<Policy>, temporary: Policy) -> Policy {
        match (temporary, configured) {
            (Policy::Limited { limit, .. }, Some(Policy::Limited { behaviour, .. })) => {
                Policy::Limited { limit, behaviour }
            }
            (temporary, _) => temporary,
        }
    }

    /// How a bucket under this policy counts (GCRA when nothing is stored).
    pub fn window(&self) -> Window {
        match self {
            Policy::Limited { limit, .. } => limit.window(),
            Policy::Unlimited | Policy::Denied => Window::Gcra,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellrate_core::clock::{CalendarPeriod, SECOND};

    #[test]
    fn an_override_replaces_the_numbers_and_keeps_the_whole_behaviour() {
        let configured = |shadow, overdraw| Policy::Limited {
            limit: Limit::new(10, 10, SECOND).unwrap(),
            behaviour: Behaviour {
                shadow,
                overdraw,
                headers: Headers::default(),
            },
        };
        let raised = Limit::new(100, 100, SECOND).unwrap();
        let monthly = Limit::calendar(1_000, CalendarPeriod::Month).unwrap();
        for (shadow, overdraw) in [(false, false), (true, false), (false, true), (true, true)] {
            for limit in [raised, monthly] {
                let over = Policy::overridden_by(
                    Some(configured(shadow, overdraw)),
                    Policy::limited(limit),
                );
                let behaviour = Behaviour {
                    shadow,
                    overdraw,
                    headers: Headers::default(),
                };
                assert_eq!(over, Policy::Limited { limit, behaviour });
                // The override's window kind is its own (the loader refuses one that
                // differs from the default's: `window_mismatch`).
                assert_eq!(over.window(), limit.window());
            }
            // Unlimited and deny apply as they are; so does a limit over no limit.
            for temporary in [Policy::Unlimited, Policy::Denied] {
                let over = Policy::overridden_by(Some(configured(shadow, overdraw)), temporary);
                assert_eq!(over, temporary);
            }
        }
        for configured in [None, Some(Policy::Unlimited), Some(Policy::Denied)] {
            let over = Policy::overridden_by(configured, Policy::limited(raised));
            assert_eq!(over, Policy::limited(raised));
        }
    }
}
