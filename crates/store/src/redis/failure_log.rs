//! Store failures in the log, at WARN: a line per kind of failure (a missed deadline, a
//! refused or broken connection, anything else) and per breaker turn, at most one of each
//! every [`LINE_INTERVAL`], saying how many were left out since the last. Each line names
//! the store's address (never its password) and the flag that governs that kind; at start,
//! one line says whether the store answered.

use std::time::Duration;

use tokio::time::Instant;

use super::{FailurePolicy, RedisSettings};
use crate::{FailureKind, StoreError};
use cellrate_core::text::LogEvery;

/// The shortest time between two lines of one kind: an outage is a few lines a minute,
/// not one per request.
pub(super) const LINE_INTERVAL: Duration = Duration::from_secs(10);

/// Kinds of line: the failure kinds, then a breaker opened, then a breaker closed.
const OPENED: usize = FailureKind::ALL.len();
const CLOSED: usize = OPENED + 1;
const TOPICS: usize = CLOSED + 1;

/// The flag of each failure kind's line, but for the address flag (refused, reset, other).
const TIMEOUT_FLAG: &str = "--redis-timeout-ms";
/// What governs the breaker: its threshold and cool-down are fixed; what requests get
/// while it is open is the failure policy.
const BREAKER_FLAG: &str = "--redis-failure-policy";

/// The store's failure lines (see the module docs).
pub(super) struct FailureLog {
    /// Where the store is, as the operator gave it, without passwords.
    address: String,
    /// The flag that gave it.
    address_flag: &'static str,
    timeout: Duration,
    policy: &'static str,
    breaker_threshold: u32,
    breaker_cooldown: Duration,
    /// The start of `windows`' time.
    origin: Instant,
    windows: [LogEvery; TOPICS],
}

impl FailureLog {
    pub(super) fn new(settings: &RedisSettings) -> FailureLog {
        let (address, address_flag) = address(settings);
        FailureLog {
            address,
            address_flag,
            timeout: settings.timeout,
            policy: policy_name(settings.failure),
            breaker_threshold: settings.breaker_threshold,
            breaker_cooldown: settings.breaker_cooldown,
            origin: Instant::now(),
            windows: std::array::from_fn(|_| LogEvery::new(LINE_INTERVAL)),
        }
    }

    /// A call failed with `error`: its kind's line, unless one was written just now.
    /// Errors that are no failure of the store (an open breaker, a bad bucket) log nothing.
    pub(super) fn failed(&self, error: &StoreError) {
        let Some(kind) = error.failure_kind() else {
            return;
        };
        let Some(suppressed) = self.admit(kind.index(), Instant::now()) else {
            return;
        };
        let (flag, what) = match kind {
            FailureKind::Deadline => (TIMEOUT_FLAG, "redis store: no answer within the deadline"),
            FailureKind::Refused => (self.address_flag, "redis store: connection refused"),
            FailureKind::Reset => (self.address_flag, "redis store: connection reset"),
            FailureKind::Other => (self.address_flag, "redis store: call failed"),
        };
        tracing::warn!(
            kind = kind.name(),
            address = %self.address,
            flag,
            timeout_ms = self.timeout.as_millis() as u64,
            policy = self.policy,
            suppressed,
            error = %error,
            "{what}"
        );
    }

    /// A breaker opened (or closed): its line, unless one was written just now.
    pub(super) fn breaker_turned(&self, opened: bool, slot: usize) {
        let topic = if opened { OPENED } else { CLOSED };
        let Some(suppressed) = self.admit(topic, Instant::now()) else {
            return;
        };
        let (kind, what) = if opened {
            (
                "breaker_opened",
                "redis store: circuit breaker opened; calls fail fast and the failure policy answers",
            )
        } else {
            (
                "breaker_closed",
                "redis store: circuit breaker closed; calls go to redis again",
            )
        };
        tracing::warn!(
            kind,
            address = %self.address,
            flag = BREAKER_FLAG,
            policy = self.policy,
            slot,
            threshold = self.breaker_threshold,
            cooldown_ms = self.breaker_cooldown.as_millis() as u64,
            suppressed,
            "{what}"
        );
    }

    /// Whether the store answered the first call, made within `within`, and in how long.
    pub(super) fn at_start(
        &self,
        answer: Result<(), StoreError>,
        took: Duration,
        within: Duration,
    ) {
        match answer {
            Ok(()) => tracing::info!(
                address = %self.address,
                round_trip_ms = took.as_secs_f64() * 1e3,
                "redis store answered at start"
            ),
            Err(error) => tracing::warn!(
                kind = "unreachable_at_start",
                cause = error.failure_kind().unwrap_or(FailureKind::Other).name(),
                address = %self.address,
                flag = self.address_flag,
                within_ms = within.as_millis() as u64,
                policy = self.policy,
                error = %error,
                "redis store did not answer at start; the failure policy answers while it does not"
            ),
        }
    }

    /// Whether a line of `topic` may be written at `now`, and if so how many were left out
    /// since the last.
    fn admit(&self, topic: usize, now: Instant) -> Option<u64> {
        self.windows[topic].admit(now.saturating_duration_since(self.origin), 1)
    }
}

fn policy_name(policy: FailurePolicy) -> &'static str {
    match policy {
        FailurePolicy::Unavailable => "unavailable",
        FailurePolicy::Allow => "allow",
        FailurePolicy::Deny => "deny",
        FailurePolicy::Local => "local",
    }
}

/// The store's address as the operator gave it, without passwords, and the flag that gave
/// it.
fn address(settings: &RedisSettings) -> (String, &'static str) {
    let list = |nodes: &[String]| {
        nodes
            .iter()
            .map(|n| redacted(n))
            .collect::<Vec<_>>()
            .join(",")
    };
    if let Some(sentinel) = &settings.sentinel {
        let shown = format!(
            "master {:?} of sentinels {}",
            sentinel.master,
            list(&sentinel.nodes)
        );
        (shown, "--redis-sentinel")
    } else if !settings.cluster_nodes.is_empty() {
        (list(&settings.cluster_nodes), "--redis-cluster-nodes")
    } else {
        let url = settings.url.as_deref().unwrap_or("");
        (redacted(url), "--redis-url")
    }
}

/// `url` with its password left out: `scheme://user:***@host...` (a userinfo without a
/// colon is all password to Redis: `***@host`), and `***` for the value of a `pass` or
/// `password` query parameter (`redis+unix:///sock?pass=...`).
pub(super) fn redacted(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(at) => url.split_at(at + 3),
        None => ("", url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rfind('@') {
        Some(at) => {
            let (userinfo, host) = (&authority[..at], &authority[at + 1..]);
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***@{host}"),
                None => format!("***@{host}"),
            }
        }
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((key, _))
                        if key.eq_ignore_ascii_case("pass")
                            || key.eq_ignore_ascii_case("password") =>
                    {
                        format!("{key}=***")
                    }
                    _ => param.to_string(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_left_out_of_addresses() {
        let cases = [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://:s3cret@h:1/0", "redis://:***@h:1/0"),
            ("rediss://user:s3cret@h:1", "rediss://user:***@h:1"),
            ("redis://s3cret@h:1", "redis://***@h:1"),
            ("redis://u:p@ss:w@rd@h:1", "redis://u:***@h:1"),
            ("h:26379", "h:26379"),
            (
                "redis+unix:///run/r.sock?db=1&pass=s3cret",
                "redis+unix:///run/r.sock?db=1&pass=***",
            ),
            ("", ""),
            ("é@ü://?&=", "é@ü://?&="),
        ];
        for (url, shown) in cases {
            assert_eq!(redacted(url), shown, "{url}");
        }
    }

    #[test]
    fn a_kind_logs_once_per_interval_and_counts_what_it_left_out() {
        let log = FailureLog::new(&RedisSettings::default());
        let start = Instant::now();
        assert_eq!(log.admit(0, start), Some(0));
        for i in 1..=5 {
            assert_eq!(log.admit(0, start + Duration::from_secs(i)), None);
        }
        // Another kind has a window of its own.
        assert_eq!(log.admit(OPENED, start + Duration::from_secs(1)), Some(0));
        assert_eq!(log.admit(0, start + LINE_INTERVAL), Some(5));
        assert_eq!(log.admit(0, start + LINE_INTERVAL), None);
        assert_eq!(log.admit(0, start + 2 * LINE_INTERVAL), Some(1));
    }
}
