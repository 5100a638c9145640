//! Durations as the config and the flags write them (`1s`, `500ms`, `1h30m`, `7d`), in
//! exact nanoseconds.

use cellrate_core::clock::Nanos;

/// Parses a Go-style duration (`1s`, `500ms`, `180m`, `1h30m`, `1.5h`) plus `d` for days,
/// into exact nanoseconds.
///
/// ```
/// use cellrate_limits::duration::parse_duration;
/// assert_eq!(parse_duration("1h30m"), Ok(5_400_000_000_000));
/// assert_eq!(parse_duration("1.5s"), Ok(1_500_000_000));
/// assert!(parse_duration("10").is_err()); // a unit is required
/// ```
pub fn parse_duration(text: &str) -> Result<Nanos, String> {
    if text.is_empty() {
        return Err("empty duration (write e.g. 1s, 500ms, 180m, 1h30m, 7d)".to_string());
    }
    if text.starts_with('-') {
        return Err(format!("{text:?} is negative"));
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let int_end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int_part, after) = rest.split_at(int_end);
        rest = after;
        let mut frac = "";
        if let Some(after_dot) = rest.strip_prefix('.') {
            let frac_end = after_dot
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after_dot.len());
            (frac, rest) = after_dot.split_at(frac_end);
        }
        if int_part.is_empty() && frac.is_empty() {
            return Err(format!("{text:?}: expected a number before {rest:?}"));
        }
        if int_part.len() > 19 || frac.len() > 18 {
            return Err(format!("{text:?}: number too long"));
        }
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let (unit, after) = rest.split_at(unit_end);
        rest = after;
        let scale: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "" => return Err(format!("{text:?}: missing unit (ns, us, ms, s, m, h, d)")),
            other => {
                return Err(format!(
                    "{text:?}: unknown unit {other:?} (ns, us, ms, s, m, h, d)"
                ))
            }
        };
        let int_value: i128 = if int_part.is_empty() {
            0
        } else {
            int_part
                .parse()
                .map_err(|_| format!("{text:?}: bad number"))?
        };
        let mut value = int_value * scale;
        if !frac.is_empty() {
            let frac_value: i128 = frac.parse().map_err(|_| format!("{text:?}: bad number"))?;
            let denominator = 10i128.pow(frac.len() as u32);
            let scaled = frac_value * scale;
            if scaled % denominator != 0 {
                return Err(format!("{text:?} is finer than a nanosecond"));
            }
            value += scaled / denominator;
        }
        total += value;
        if total > i64::MAX as i128 {
            return Err(format!("{text:?} is longer than 64-bit nanoseconds allow"));
        }
    }
    Ok(total as Nanos)
}

/// Writes `nanos` (not negative) in the largest unit that divides it, as [`parse_duration`]
/// reads it back: how a flag's default period is shown by `--help`.
///
/// ```
/// use cellrate_limits::duration::{format_duration, parse_duration};
/// assert_eq!(format_duration(7 * 86_400 * 1_000_000_000), "7d");
/// assert_eq!(format_duration(90 * 60 * 1_000_000_000), "90m");
/// assert_eq!(format_duration(1_500_000_000), "1500ms");
/// assert_eq!(parse_duration(&format_duration(1_500_000_000)), Ok(1_500_000_000));
/// ```
pub fn format_duration(nanos: Nanos) -> String {
    const UNITS: [(&str, Nanos); 7] = [
        ("d", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let (unit, scale) = UNITS
        .into_iter()
        .find(|(_, scale)| nanos % scale == 0 && nanos != 0)
        .unwrap_or(("s", 1_000_000_000));
    format!("{}{unit}", nanos / scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cellrate_core::clock::SECOND;

    #[test]
    fn durations() {
        let ok = |t: &str| parse_duration(t).unwrap();
        assert_eq!(ok("1s"), SECOND);
        assert_eq!(ok("500ms"), SECOND / 2);
        assert_eq!(ok("180m"), 180 * 60 * SECOND);
        assert_eq!(ok("1h30m"), 90 * 60 * SECOND);
        assert_eq!(ok("7d"), 7 * 86_400 * SECOND);
        assert_eq!(ok("1.5h"), 90 * 60 * SECOND);
        assert_eq!(ok(".5s"), SECOND / 2);
        assert_eq!(ok("10ns"), 10);
        assert_eq!(ok("3us"), 3_000);
        assert_eq!(ok("3µs"), 3_000);
        assert_eq!(ok("1m0.000000001s"), 60 * SECOND + 1);
        assert_eq!(ok("0s"), 0);
        for bad in [
            "",
            "10",
            "1x",
            "-1s",
            "s",
            "1.5ns",
            "1..5s",
            "99999999999999999999d",
            "300000d",
            "1 s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn formatted_durations_read_back() {
        for nanos in [
            0,
            1,
            999,
            SECOND,
            61 * SECOND,
            3_600 * SECOND,
            732 * 86_400 * SECOND,
        ] {
            assert_eq!(parse_duration(&format_duration(nanos)), Ok(nanos));
        }
        assert_eq!(format_duration(0), "0s");
        assert_eq!(format_duration(3_600 * SECOND), "1h");
    }
}
