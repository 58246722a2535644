//! Durations on the command line: `500ms`, `30s`, `2m`, `1h`.
//!
//! A bare number is refused rather than guessed: `--lease 30` could mean
//! seconds or milliseconds, and a lease off by a factor of 1000 is exactly
//! the mistake a lock must not let through.

use std::time::Duration;

/// Parses `<integer><unit>` with unit `ms`, `s`, `m` or `h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit: write e.g. 500ms, 30s, 2m or 1h"))?;
    let (digits, unit) = text.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number (e.g. 500ms, 30s)"))?;
    let millis = match unit {
        "ms" => Some(value),
        "s" => value.checked_mul(1_000),
        "m" => value.checked_mul(60_000),
        "h" => value.checked_mul(3_600_000),
        _ => {
            return Err(format!(
                "{text:?} has unknown unit {unit:?}: use ms, s, m or h"
            ))
        }
    }
    .ok_or_else(|| format!("{text:?} is too long"))?;
    Ok(Duration::from_millis(millis))
}

/// As [`parse_duration`], refusing zero (a period between two things).
pub fn parse_period(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        period if period.is_zero() => {
            Err(format!("{text:?} is zero: give a period of 1ms or more"))
        }
        period => Ok(period),
    }
}

/// A duration for people: `850ms`, `12.3s`, `4m05s`.
pub fn human_millis(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1_000.0)
    } else {
        let secs = ms / 1_000;
        format!("{}m{:02}s", secs / 60, secs % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_required_and_applied() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3_600)));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("3d").is_err());
    }

    #[test]
    fn human_form_picks_a_readable_unit() {
        assert_eq!(human_millis(850), "850ms");
        assert_eq!(human_millis(12_340), "12.3s");
        assert_eq!(human_millis(245_000), "4m05s");
    }
}
