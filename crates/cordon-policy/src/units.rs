//! Sizes, durations and counts as people write them: `256M`, `2G`, `30s`,
//! `1h30m`, `256`.
//!
//! The policy file's `[limits]` section and the `cordon run` flags
//! (`--memory`, `--timeout`, `--pids`) share these parsers, so a value means
//! the same wherever it is written and a bad one is refused with the same
//! one-line reason.
//!
//! - A **size** is a non-negative decimal number with an optional binary unit:
//!   `K`, `M`, `G`, `T` (powers of 1024; case-insensitive; `Ki`/`KiB`/`KB`
//!   spellings mean the same). No unit means bytes. Fractions round down to
//!   whole bytes: `1.5G` is 1,610,612,736 bytes.
//! - A **duration** is one or more `<integer><unit>` parts with units `ms`,
//!   `s`, `m`, `h`, `d`: `500ms`, `30s`, `5m`, `1h30m`. A bare number is refused
//!   because `30` could mean seconds or minutes.
//! - A **count** is a positive integer.
//!
//! Zero is refused by all three: a limit of zero bytes, zero seconds or zero
//! processes cannot run anything, so a zero is far more likely a mistake than
//! a wish (leave the limit out instead).

use std::time::Duration;

/// Why a size, duration or count was refused. Each message names the input
/// and says how to write it instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitsError {
    /// [`parse_size`] refused its input.
    #[error("invalid size {input:?}: {reason}")]
    ParseSize {
        /// The text as given.
        input: String,
        /// What is wrong with it and what to write instead.
        reason: String,
    },
    /// [`parse_duration`] refused its input.
    #[error("invalid duration {input:?}: {reason}")]
    ParseDuration {
        /// The text as given.
        input: String,
        /// What is wrong with it and what to write instead.
        reason: String,
    },
    /// [`parse_count`] refused its input.
    #[error("invalid count {input:?}: {reason}")]
    ParseCount {
        /// The text as given.
        input: String,
        /// What is wrong with it and what to write instead.
        reason: String,
    },
}

/// Parses a size such as `256M` or `2G` into bytes (binary units).
///
/// ```
/// use cordon_policy::units::parse_size;
/// assert_eq!(parse_size("256M").unwrap(), 256 << 20);
/// assert_eq!(parse_size("2G").unwrap(), 2 << 30);
/// assert_eq!(
///     parse_size("12Q").unwrap_err().to_string(),
///     r#"invalid size "12Q": unknown unit "Q" (use K, M, G or T)"#
/// );
/// ```
pub fn parse_size(input: &str) -> Result<u64, UnitsError> {
    let fail = |reason: String| UnitsError::ParseSize {
        input: input.to_owned(),
        reason,
    };
    let text = input.trim();
    if text.is_empty() {
        return Err(fail(
            "empty size (write a number with a unit, e.g. \"256M\")".into(),
        ));
    }
    if text.starts_with('-') {
        return Err(fail("negative size (write e.g. \"256M\")".into()));
    }
    let digits_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let unit = unit.trim_start();
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0u32,
        "K" | "KB" | "KI" | "KIB" => 10,
        "M" | "MB" | "MI" | "MIB" => 20,
        "G" | "GB" | "GI" | "GIB" => 30,
        "T" | "TB" | "TI" | "TIB" => 40,
        _ => {
            return Err(fail(format!("unknown unit {unit:?} (use K, M, G or T)")));
        }
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    let whole = whole.replace('_', "");
    let fraction = fraction.replace('_', "");
    if whole.is_empty() && fraction.is_empty() {
        return Err(fail("missing number (write e.g. \"256M\")".into()));
    }
    if fraction.contains('.') || !fraction.chars().all(|c| c.is_ascii_digit()) {
        return Err(fail("malformed number (write e.g. \"1.5G\")".into()));
    }
    let too_large = || fail("too large (the largest size is 16E - 1 bytes)".into());
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_large())?
    };
    let mut bytes = whole
        .checked_shl(shift)
        .filter(|b| b >> shift == whole)
        .ok_or_else(too_large)?;
    if !fraction.is_empty() {
        // Exact fixed-point: fraction / 10^len * 2^shift, rounded down. At most
        // 18 digits keep 10^len within u64; further digits cannot change whole
        // bytes for any unit up to T.
        let digits = &fraction[..fraction.len().min(18)];
        let len = u32::try_from(digits.len()).unwrap_or(18);
        let numerator: u128 = digits.parse::<u128>().unwrap_or(0) << shift;
        let extra = numerator / 10u128.pow(len);
        let extra = u64::try_from(extra).map_err(|_| too_large())?;
        bytes = bytes.checked_add(extra).ok_or_else(too_large)?;
    }
    if bytes == 0 {
        return Err(fail(
            "zero size (a zero limit runs nothing; leave the limit out instead)".into(),
        ));
    }
    Ok(bytes)
}

/// Parses a duration such as `10s`, `5m` or `1h30m`.
///
/// ```
/// use std::time::Duration;
/// use cordon_policy::units::parse_duration;
/// assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
/// assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
/// assert_eq!(
///     parse_duration("-3s").unwrap_err().to_string(),
///     r#"invalid duration "-3s": negative duration (write e.g. "3s")"#
/// );
/// ```
pub fn parse_duration(input: &str) -> Result<Duration, UnitsError> {
    let fail = |reason: String| UnitsError::ParseDuration {
        input: input.to_owned(),
        reason,
    };
    let text = input.trim();
    if text.is_empty() {
        return Err(fail("empty duration (write e.g. \"30s\" or \"5m\")".into()));
    }
    if let Some(rest) = text.strip_prefix('-') {
        let example = if rest.is_empty() { "30s" } else { rest };
        return Err(fail(format!("negative duration (write e.g. {example:?})")));
    }
    let too_long = || fail("too long".into());
    let mut total_ms: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits_end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits_end == 0 {
            return Err(fail(format!(
                "expected a number at {rest:?} (write e.g. \"30s\" or \"1h30m\")"
            )));
        }
        let (number, after) = rest.split_at(digits_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let per_unit_ms: u64 = match unit.trim() {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => {
                return Err(fail(format!(
                    "missing unit after {number} (use ms, s, m, h or d, e.g. \"{number}s\")"
                )));
            }
            other if other.starts_with('.') => {
                return Err(fail(
                    "fractions are not accepted (use a smaller unit, e.g. \"1500ms\")".into(),
                ));
            }
            other => {
                return Err(fail(format!(
                    "unknown unit {other:?} (use ms, s, m, h or d)"
                )));
            }
        };
        let number: u64 = number.parse().map_err(|_| too_long())?;
        let part = number.checked_mul(per_unit_ms).ok_or_else(too_long)?;
        total_ms = total_ms.checked_add(part).ok_or_else(too_long)?;
        rest = after;
    }
    if total_ms == 0 {
        return Err(fail(
            "zero duration (a zero limit runs nothing; leave the limit out instead)".into(),
        ));
    }
    Ok(Duration::from_millis(total_ms))
}

/// Parses a positive count such as a `--pids` limit.
///
/// ```
/// use cordon_policy::units::parse_count;
/// assert_eq!(parse_count("256").unwrap(), 256);
/// assert!(parse_count("0").is_err());
/// ```
pub fn parse_count(input: &str) -> Result<u32, UnitsError> {
    let fail = |reason: &str| UnitsError::ParseCount {
        input: input.to_owned(),
        reason: reason.to_owned(),
    };
    let text = input.trim();
    if text.starts_with('-') {
        return Err(fail(
            "negative count (write a positive whole number, e.g. \"256\")",
        ));
    }
    if text.is_empty() || !text.chars().all(|c| c.is_ascii_digit()) {
        return Err(fail("not a whole number (write e.g. \"256\")"));
    }
    let n: u32 = text
        .parse()
        .map_err(|_| fail("too large (the largest count is 4294967295)"))?;
    if n == 0 {
        return Err(fail(
            "zero (a zero limit runs nothing; leave the limit out instead)",
        ));
    }
    Ok(n)
}

/// Writes a byte count the way [`parse_size`] reads it, in the largest unit
/// that divides it exactly (`2G`, `1536M`, `100`).
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Writes a duration the way [`parse_duration`] reads it (`30m`, `1h30m`,
/// `1500ms`).
pub fn format_duration(duration: Duration) -> String {
    let mut ms = duration.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit_ms, unit) in [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ] {
        if ms >= unit_ms {
            out.push_str(&format!("{}{unit}", ms / unit_ms));
            ms %= unit_ms;
        }
    }
    if ms > 0 {
        out.push_str(&format!("{ms}ms"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_use_binary_units() {
        assert_eq!(parse_size("256M").unwrap(), 268_435_456);
        assert_eq!(parse_size("2G").unwrap(), 2_147_483_648);
        assert_eq!(parse_size("2g").unwrap(), 2_147_483_648);
        assert_eq!(parse_size("2GiB").unwrap(), 2_147_483_648);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5G").unwrap(), 1_610_612_736);
        assert_eq!(parse_size("0.5K").unwrap(), 512);
        assert_eq!(parse_size("1_000").unwrap(), 1000);
    }

    #[test]
    fn bad_sizes_are_refused_with_a_reason() {
        let err = |s: &str| parse_size(s).unwrap_err().to_string();
        assert_eq!(
            err("12Q"),
            r#"invalid size "12Q": unknown unit "Q" (use K, M, G or T)"#
        );
        assert!(err("-1G").contains("negative size"), "{}", err("-1G"));
        assert!(err("").contains("empty size"));
        assert!(err("G").contains("missing number"));
        assert!(err("0").contains("zero size"));
        assert!(err("0M").contains("zero size"));
        assert!(err("1.2.3M").contains("malformed"));
        assert!(err("99999999999T").contains("too large"));
        assert!(err("18446744073709551616").contains("too large"));
    }

    #[test]
    fn durations_accept_units_and_compounds() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86_400));
        assert_eq!(
            parse_duration("1500ms").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
    }

    #[test]
    fn bad_durations_are_refused_with_a_reason() {
        let err = |s: &str| parse_duration(s).unwrap_err().to_string();
        assert_eq!(
            err("-3s"),
            r#"invalid duration "-3s": negative duration (write e.g. "3s")"#
        );
        assert!(err("30").contains("missing unit after 30"), "{}", err("30"));
        assert!(err("3x").contains(r#"unknown unit "x""#), "{}", err("3x"));
        assert!(err("1.5s").contains("fractions"), "{}", err("1.5s"));
        assert!(err("s").contains("expected a number"));
        assert!(err("0s").contains("zero duration"));
        assert!(err("").contains("empty"));
        assert!(err("99999999999999999d").contains("too long"));
    }

    #[test]
    fn counts_are_positive_integers() {
        assert_eq!(parse_count("256").unwrap(), 256);
        assert!(
            parse_count("-3")
                .unwrap_err()
                .to_string()
                .contains("negative")
        );
        assert!(parse_count("0").unwrap_err().to_string().contains("zero"));
        assert!(
            parse_count("12Q")
                .unwrap_err()
                .to_string()
                .contains("not a whole number")
        );
        assert!(
            parse_count("4294967296")
                .unwrap_err()
                .to_string()
                .contains("too large")
        );
    }

    #[test]
    fn formatting_round_trips() {
        for s in ["2G", "256M", "1536M", "100", "3K", "1T"] {
            assert_eq!(format_size(parse_size(s).unwrap()), s);
        }
        for s in ["30m", "1h30m", "1500ms", "10s", "1d"] {
            let d = parse_duration(s).unwrap();
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1s500ms");
    }
}
