//! The checks of the serve flags' values that clap has no parser for (ranges of sizes,
//! counts and periods, names): each says what it accepts when it refuses.

/// `--rlqs-max-bucket-bytes`: 64 KiB to 16 GiB.
pub(super) fn parse_bucket_bytes(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (64 << 10..=16 << 30).contains(&n) => Ok(n),
        _ => Err(format!("{text:?}: bytes from 65536 to 17179869184")),
    }
}

/// `--resp-auth-max-addresses`: 1 to 1 000 000.
pub(super) fn parse_auth_addresses(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(n),
        _ => Err(format!("{text:?}: a count from 1 to 1000000")),
    }
}

/// `--settle-max-records`, `--settle-max-holds-per-key`: 1 to 10 000 000.
pub(super) fn parse_settle_max(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=10_000_000).contains(&n) => Ok(n),
        _ => Err(format!("{text}: not a number from 1 to 10000000")),
    }
}

/// `--settle-window`: 1 s to 7 days.
pub(super) fn parse_settle_window(text: &str) -> Result<i64, String> {
    let window = parse_period(text)?;
    let (min, max) = (crate::clock::SECOND, 7 * crate::clock::DAY);
    if !(min..=max).contains(&window) {
        return Err(format!("{text}: not between 1s and 7d"));
    }
    Ok(window)
}

/// `--grpc-max-connection-age`: 100 ms to 365 days (shorter makes clients reconnect
/// all the time).
pub(super) fn parse_connection_age(text: &str) -> Result<i64, String> {
    let age = parse_period(text)?;
    if !(100 * crate::clock::MICROSECOND * 1_000..=365 * crate::clock::DAY).contains(&age) {
        return Err(format!("{text}: not between 100ms and 365d"));
    }
    Ok(age)
}

/// `--grpc-max-connection-age-grace`: 0 to 365 days.
pub(super) fn parse_connection_grace(text: &str) -> Result<i64, String> {
    let grace = parse_period(text)?;
    if grace > 365 * crate::clock::DAY {
        return Err(format!("{text}: more than 365d"));
    }
    Ok(grace)
}

/// `--client-san`: a DNS name or an IP address.
pub(super) fn parse_client_san(text: &str) -> Result<String, String> {
    crate::server::tls::client_name(text)?;
    Ok(text.to_string())
}

/// A period flag, in the limits files' duration syntax (`1s`, `90m`, `1d`).
pub(super) fn parse_period(text: &str) -> Result<i64, String> {
    crate::limits::duration::parse_duration(text)
}
