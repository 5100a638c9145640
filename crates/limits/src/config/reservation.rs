//! A limit's reservation policy (`reservation:` on its entry in `defaults.yaml`): how long
//! the estimate of a native `Check` made with a `request_id` waits for its `Settle`, what
//! becomes of it when none comes, and how large one estimate may be (docs/concurrency.md,
//! "Reservations").

use serde::Deserialize;

use crate::duration::parse_duration;
use cellrate_core::clock::{Nanos, DAY, SECOND};

/// The shortest hold.
pub const MIN_HOLD: Nanos = SECOND;

/// The longest hold: `--settle-window`'s own maximum.
pub const MAX_HOLD: Nanos = 7 * DAY;

/// `max_share` is kept in millionths of the burst.
const PER_MILLION: u64 = 1_000_000;

/// A limit's reservation policy, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// How long an estimate waits for its `Settle`.
    pub hold: Nanos,
    /// At the hold's end an unsettled estimate is given back (`unsettled: release`), or
    /// stands (`keep`).
    pub release: bool,
    /// The most of the limit's burst one estimate may take, in millionths.
    pub max_share_ppm: u64,
    /// Through Envoy, a descriptor asking with 0 hits holds this estimate anonymously,
    /// and one charging hits settles the bucket's oldest hold (`zero_checks:`,
    /// docs/token-budgets.md).
    pub zero_checks: Option<Estimate>,
}

/// What a check of 0 hits holds (`zero_checks:`, or `--zero-check-holds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Estimate {
    /// This many tokens (at most what one hold may take).
    Fixed(u64),
    /// The largest of the bucket's last few charges one replica saw; before any, a
    /// sixteenth of the limit's count (at least 1).
    Learned,
}

impl Estimate {
    /// `learned` or a number of tokens, at least 1.
    ///
    /// ```
    /// use cellrate_limits::config::Estimate;
    /// assert_eq!(Estimate::parse("1000"), Ok(Estimate::Fixed(1000)));
    /// assert_eq!(Estimate::parse("learned"), Ok(Estimate::Learned));
    /// assert!(Estimate::parse("0").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Estimate, String> {
        match text {
            "learned" => Ok(Estimate::Learned),
            n => match n.parse::<u64>() {
                Ok(n) if n > 0 => Ok(Estimate::Fixed(n)),
                _ => Err(format!(
                    "{:?}: a number of tokens, at least 1, or `learned`",
                    cellrate_core::text::first_chars(text, 40)
                )),
            },
        }
    }
}

impl Reservation {
    /// The largest estimate one hold may take of a limit of `burst`: its share, rounded
    /// down, and at least 1 token.
    pub fn cap(&self, burst: u64) -> u64 {
        let cap = u128::from(burst) * u128::from(self.max_share_ppm) / u128::from(PER_MILLION);
        u64::try_from(cap).unwrap_or(u64::MAX).max(1)
    }

    /// `max_share` as written (a fraction of the burst).
    pub fn max_share(&self) -> f64 {
        self.max_share_ppm as f64 / PER_MILLION as f64
    }
}

/// `unsettled:` as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawUnsettled {
    #[default]
    Release,
    Keep,
}

/// `reservation:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReservation {
    hold: String,
    #[serde(default)]
    unsettled: RawUnsettled,
    #[serde(default)]
    max_share: Option<f64>,
    /// A number or `learned` (YAML reads a number as one).
    #[serde(default)]
    zero_checks: Option<serde_yaml_ng::Value>,
}

impl RawReservation {
    /// The policy, or an error naming the field.
    pub(super) fn build(&self) -> Result<Reservation, String> {
        let hold = parse_duration(&self.hold).map_err(|e| format!("reservation.hold: {e}"))?;
        if !(MIN_HOLD..=MAX_HOLD).contains(&hold) {
            return Err(format!(
                "reservation.hold: {} is not between 1s and 7d",
                self.hold
            ));
        }
        let share = self.max_share.unwrap_or(1.0);
        if !(share > 0.0 && share <= 1.0) {
            return Err(format!(
                "reservation.max_share: {share} is not a fraction of the burst above 0 and \
                 at most 1"
            ));
        }
        let zero_checks = match &self.zero_checks {
            None => None,
            Some(serde_yaml_ng::Value::Number(n)) => Some(Estimate::parse(&n.to_string())),
            Some(serde_yaml_ng::Value::String(s)) => Some(Estimate::parse(s)),
            Some(_) => Some(Err("a number of tokens or `learned`".to_string())),
        };
        let zero_checks =
            (zero_checks.transpose()).map_err(|e| format!("reservation.zero_checks: {e}"))?;
        Ok(Reservation {
            hold,
            zero_checks,
            release: self.unsettled == RawUnsettled::Release,
            max_share_ppm: ((share * PER_MILLION as f64).round() as u64).clamp(1, PER_MILLION),
        })
    }
}
