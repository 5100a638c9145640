//! `cellrate serve`'s flags for Envoy's ShouldRateLimit answers. Their defaults are
//! cellrate's; the `ratelimit` personality sets envoyproxy/ratelimit's (see `answers` in
//! `ratelimit_behaviour.rs`), each one still opt-in there through its variable. Each default is
//! [`EnvoyOptions::default`]'s.

use super::flag_values::parse_period;
use crate::service::envoy::{
    check_header_name, parse_zero_check_hold, EnvoyOptions, Estimate, HeaderNames, HeaderStyle,
    MetadataStyle, RatelimitCounting, ResetStyle, ZeroCheckHolds,
};

#[derive(Debug, Clone, clap::Args)]
pub struct EnvoyArgs {
    /// Rate-limit headers in Envoy responses: off, draft03 (X-RateLimit-*), ietf
    /// (RateLimit-Policy and RateLimit), ratelimit (envoyproxy/ratelimit's
    /// RateLimit-Limit, -Remaining, -Reset, named by --ratelimit-header-names) or openai
    /// (x-ratelimit-limit-, -remaining-, -reset-requests and -tokens).
    #[arg(
        long,
        env = "CELLRATE_RATE_LIMIT_HEADERS",
        value_enum,
        default_value_t = EnvoyOptions::default().headers
    )]
    pub rate_limit_headers: HeaderStyle,

    /// The names of the ratelimit style's three headers: LIMIT,REMAINING,RESET.
    #[arg(
        long,
        env = "CELLRATE_RATELIMIT_HEADER_NAMES",
        value_name = "LIMIT,REMAINING,RESET",
        default_value_t = EnvoyOptions::default().header_names,
        value_parser = parse_header_names
    )]
    pub ratelimit_header_names: HeaderNames,

    /// envoyproxy/ratelimit's three fields (limit, remaining, seconds to reset) for the
    /// upstream request too (`request_headers_to_add`, which Envoy adds to a request it lets
    /// through), under these names: LIMIT,REMAINING,RESET. Of the same descriptor as the
    /// ratelimit style's response headers; on every answer that has a limit. Off unless
    /// given.
    #[arg(
        long,
        env = "CELLRATE_RATELIMIT_REQUEST_HEADERS",
        value_name = "LIMIT,REMAINING,RESET",
        value_parser = parse_header_names
    )]
    pub ratelimit_request_headers: Option<HeaderNames>,

    /// Retry-After on OVER_LIMIT answers (true or false).
    #[arg(long, env = "CELLRATE_RETRY_AFTER", default_value_t = EnvoyOptions::default().retry_after, action = clap::ArgAction::Set)]
    pub retry_after: bool,

    /// duration_until_reset: exact (to the nanosecond) or whole-seconds (rounded up; a
    /// fixed window's seconds left, as envoyproxy/ratelimit gives them).
    #[arg(
        long,
        env = "CELLRATE_ENVOY_RESETS",
        value_enum,
        default_value_t = EnvoyOptions::default().resets
    )]
    pub envoy_resets: ResetStyle,

    /// current_limit.name of a limit in envoyproxy/ratelimit's format: its name, else its
    /// full key (true); its name, else empty, as envoyproxy/ratelimit (false).
    #[arg(long, env = "CELLRATE_ENVOY_LIMIT_NAMES", default_value_t = EnvoyOptions::default().limit_names, action = clap::ArgAction::Set)]
    pub envoy_limit_names: bool,

    /// dynamic_metadata: cellrate (which limit fired, on OVER_LIMIT), ratelimit
    /// (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA, on every answer) or off.
    #[arg(
        long,
        env = "CELLRATE_ENVOY_METADATA",
        value_enum,
        default_value_t = EnvoyOptions::default().metadata
    )]
    pub envoy_metadata: MetadataStyle,

    /// envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT for its fixed-window
    /// counting: when a request takes a descriptor over its limit, the others are not
    /// counted.
    #[arg(long, env = "CELLRATE_STOP_INCREMENT_WHEN_OVER_LIMIT")]
    pub stop_increment_when_over_limit: bool,

    /// Global shadow mode for Envoy: decide, spend and count, but always answer OK.
    #[arg(long, env = "CELLRATE_SHADOW")]
    pub shadow: bool,

    /// envoyproxy/ratelimit's global QUOTA_MODE: every descriptor of a domain in its file
    /// format is in quota mode (OVER_LIMIT only when all of them are over).
    #[arg(long, env = "CELLRATE_QUOTA_MODE")]
    pub quota_mode: bool,

    /// envoyproxy/ratelimit's NEAR_LIMIT_RATIO: its `near_limit` statistic counts the hits
    /// above this share of a limit (0 to 1).
    #[arg(long, env = "CELLRATE_NEAR_LIMIT_RATIO", default_value_t = EnvoyOptions::default().near_limit_ratio, value_parser = parse_ratio)]
    pub near_limit_ratio: f32,

    /// How limits in envoyproxy/ratelimit's file format count: fixed-window (as it does)
    /// or gcra (cellrate's exact GCRA, all-or-nothing).
    #[arg(
        long,
        env = "CELLRATE_RATELIMIT_COUNTING",
        value_enum,
        default_value_t = EnvoyOptions::default().ratelimit_counting
    )]
    pub ratelimit_counting: RatelimitCounting,

    /// The check-0, charge-later pattern held (Envoy Gateway's and Envoy AI Gateway's
    /// token limits): on the limits of these domains or limit names, a descriptor asking
    /// with 0 hits holds ESTIMATE tokens in its bucket (admitted only when they fit), and
    /// one charging hits settles the bucket's oldest hold to them. SCOPE=ESTIMATE,
    /// comma-separated; ESTIMATE a number of tokens or `learned`. Off unless given.
    #[arg(
        long,
        env = "CELLRATE_ZERO_CHECK_HOLDS",
        value_name = "SCOPE=ESTIMATE",
        value_delimiter = ',',
        value_parser = parse_zero_check_hold
    )]
    pub zero_check_holds: Vec<(String, Estimate)>,

    /// How long a hold of --zero-check-holds lasts unless a charge settles it: then its
    /// estimate is given back.
    #[arg(long, env = "CELLRATE_ZERO_CHECK_HOLD", default_value = "10m", value_parser = parse_hold)]
    pub zero_check_hold: i64,
}

impl EnvoyArgs {
    pub fn options(&self) -> EnvoyOptions {
        EnvoyOptions {
            headers: self.rate_limit_headers,
            header_names: self.ratelimit_header_names.clone(),
            request_header_names: self.ratelimit_request_headers.clone(),
            shadow: self.shadow,
            ratelimit_counting: self.ratelimit_counting,
            limit_names: self.envoy_limit_names,
            resets: self.envoy_resets,
            retry_after: self.retry_after,
            metadata: self.envoy_metadata,
            stop_increment_when_over_limit: self.stop_increment_when_over_limit,
            upstream_keys: false,
            exact_upstream_keys: false,
            quota_mode: self.quota_mode,
            near_limit_ratio: self.near_limit_ratio,
            zero_check_holds: ZeroCheckHolds {
                scopes: self.zero_check_holds.clone(),
                hold: self.zero_check_hold,
            },
        }
    }
}

/// A hold's length, 1 s to 7 d as a reservation's (`--zero-check-hold`).
pub fn parse_hold(text: &str) -> Result<i64, String> {
    use crate::limits::config::{MAX_HOLD, MIN_HOLD};
    let hold = parse_period(text)?;
    if !(MIN_HOLD..=MAX_HOLD).contains(&hold) {
        return Err(format!("{text}: a hold is 1s to 7d"));
    }
    Ok(hold)
}

/// A ratio from 0 to 1 (`--near-limit-ratio`), as Go parses a float32.
pub fn parse_ratio(text: &str) -> Result<f32, String> {
    match text.trim().parse::<f32>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(format!(
            "{:?}: a ratio from 0 to 1 (0.8)",
            crate::text::first_chars(text, 40)
        )),
    }
}

/// `LIMIT,REMAINING,RESET`: three header names.
pub fn parse_header_names(text: &str) -> Result<HeaderNames, String> {
    let names: Vec<&str> = text.split(',').map(str::trim).collect();
    let [limit, remaining, reset] = names[..] else {
        return Err("three header names, LIMIT,REMAINING,RESET".to_string());
    };
    for name in [limit, remaining, reset] {
        check_header_name(name)?;
    }
    Ok(HeaderNames {
        limit: limit.to_string(),
        remaining: remaining.to_string(),
        reset: reset.to_string(),
    })
}
