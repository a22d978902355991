//! Human-readable sizes, durations and CPU quotas, with the bounds hatchery accepts.
//!
//! Every value a user types passes through here, so each parser refuses zero, negative,
//! fractional-byte and absurdly large input instead of clamping it: a limit that silently
//! became something else would be a limit that is not the one asked for.

use std::fmt;
use std::time::Duration;

/// Largest memory limit accepted (1 TiB). Anything larger is a typo, not a limit.
pub const MAX_MEMORY_BYTES: u64 = 1 << 40;
/// Smallest memory limit accepted: below this the kernel OOM-kills a shell before it starts.
pub const MIN_MEMORY_BYTES: u64 = 4 << 20;
/// Largest wall-clock timeout accepted (30 days).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);
/// Largest CPU quota accepted, in cores.
pub const MAX_CPUS: f64 = 1024.0;
/// Smallest CPU quota accepted, in cores (the kernel's minimum quota is 1 ms per 100 ms).
pub const MIN_CPUS: f64 = 0.01;
/// Largest pids limit accepted.
pub const MAX_PIDS: u64 = 4_194_304;
/// Smallest pids limit accepted: the sandbox's pid 1 (the reaper) and the command are two
/// tasks before the command starts anything; below that the command cannot even be forked.
pub const MIN_PIDS: u64 = 2;
/// Largest output cap accepted (1 TiB): a cap above it caps nothing.
pub const MAX_OUTPUT_BYTES: u64 = 1 << 40;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("{what} {input:?}: {why}")]
    Invalid {
        what: &'static str,
        input: String,
        why: String,
    },
}

fn invalid(what: &'static str, input: &str, why: impl fmt::Display) -> UnitError {
    UnitError::Invalid {
        what,
        input: input.to_string(),
        why: why.to_string(),
    }
}

/// Parses a size such as `64M`, `1G`, `512k`, `1048576` (bytes) or `1.5G`.
///
/// Suffixes are binary (K = 1024). The result must be an integral number of bytes.
pub fn parse_size(input: &str) -> Result<u64, UnitError> {
    const WHAT: &str = "size";
    let s = input.trim();
    if s.is_empty() {
        return Err(invalid(WHAT, input, "empty"));
    }
    if s.starts_with('-') || s.starts_with('+') {
        return Err(invalid(
            WHAT,
            input,
            "must be a positive number, like 64M or 1G",
        ));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let shift: u32 = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(invalid(WHAT, input, "unknown suffix (use K, M, G or T)")),
    };
    if num.is_empty() || num.matches('.').count() > 1 || num == "." {
        return Err(invalid(WHAT, input, "not a number"));
    }
    let bytes = if let Some((int, frac)) = num.split_once('.') {
        // Decimal: exact integer arithmetic on up to 6 fractional digits.
        if frac.len() > 6 {
            return Err(invalid(WHAT, input, "too many decimals"));
        }
        let int: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| invalid(WHAT, input, "too large"))?
        };
        let frac_digits = frac.len() as u32;
        let frac: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse()
                .map_err(|_| invalid(WHAT, input, "not a number"))?
        };
        let scale = 10u128.pow(frac_digits);
        let total = int
            .checked_mul(scale)
            .and_then(|v| v.checked_add(frac))
            .and_then(|v| v.checked_mul(1u128 << shift))
            .ok_or_else(|| invalid(WHAT, input, "too large"))?;
        if total % scale != 0 {
            return Err(invalid(WHAT, input, "not a whole number of bytes"));
        }
        u64::try_from(total / scale).map_err(|_| invalid(WHAT, input, "too large"))?
    } else {
        let n: u64 = num.parse().map_err(|_| invalid(WHAT, input, "too large"))?;
        n.checked_mul(1u64 << shift)
            .ok_or_else(|| invalid(WHAT, input, "too large"))?
    };
    if bytes == 0 {
        return Err(invalid(WHAT, input, "must be greater than zero"));
    }
    Ok(bytes)
}

/// Parses a memory limit: a size between [`MIN_MEMORY_BYTES`] and [`MAX_MEMORY_BYTES`].
pub fn parse_memory(input: &str) -> Result<u64, UnitError> {
    let bytes = parse_size(input)?;
    if bytes < MIN_MEMORY_BYTES {
        return Err(invalid(
            "memory limit",
            input,
            format!("below the minimum of {}", format_size(MIN_MEMORY_BYTES)),
        ));
    }
    if bytes > MAX_MEMORY_BYTES {
        return Err(invalid(
            "memory limit",
            input,
            format!("above the maximum of {}", format_size(MAX_MEMORY_BYTES)),
        ));
    }
    Ok(bytes)
}

/// Parses a duration such as `500ms`, `5s`, `1m`, `2h`, `1.5s`, or several of them run
/// together from the largest unit down (`1m30s`, `1h2m3s`, as Go and systemd write them).
/// A bare number means seconds.
pub fn parse_duration(input: &str) -> Result<Duration, UnitError> {
    const WHAT: &str = "duration";
    let s = input.trim();
    if s.is_empty() {
        return Err(invalid(WHAT, input, "empty"));
    }
    if s.starts_with('-') || s.starts_with('+') {
        return Err(invalid(
            WHAT,
            input,
            "must be positive, like 500ms, 5s or 1m30s",
        ));
    }
    let mut rest = s;
    let mut nanos: u128 = 0;
    let mut previous_unit: Option<u128> = None;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (suffix, tail) = tail.split_at(unit_len);
        let nanos_per_unit: u128 = match suffix {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "" if previous_unit.is_none() && tail.is_empty() => 1_000_000_000,
            "s" => 1_000_000_000,
            "m" | "min" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "" => {
                return Err(invalid(WHAT, input, "every part needs a unit (e.g. 1m30s)"));
            }
            _ => {
                return Err(invalid(
                    WHAT,
                    input,
                    "unknown unit (use ms, s, m, h or d, e.g. 500ms, 30s or 1m30s)",
                ));
            }
        };
        if previous_unit.is_some_and(|p| nanos_per_unit >= p) {
            return Err(invalid(
                WHAT,
                input,
                "parts must go from the largest unit down, each once (e.g. 1h2m3s)",
            ));
        }
        previous_unit = Some(nanos_per_unit);
        nanos = nanos
            .checked_add(part_nanos(input, num, nanos_per_unit)?)
            .ok_or_else(|| invalid(WHAT, input, "too large"))?;
        rest = tail;
    }
    if nanos == 0 {
        return Err(invalid(WHAT, input, "must be greater than zero"));
    }
    if nanos > MAX_TIMEOUT.as_nanos() {
        return Err(invalid(WHAT, input, "longer than 30 days"));
    }
    let secs =
        u64::try_from(nanos / 1_000_000_000).map_err(|_| invalid(WHAT, input, "too large"))?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// One part of a duration: `num` (digits, at most one `.`) times `nanos_per_unit`.
fn part_nanos(input: &str, num: &str, nanos_per_unit: u128) -> Result<u128, UnitError> {
    const WHAT: &str = "duration";
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return Err(invalid(WHAT, input, "not a number (e.g. 500ms or 30s)"));
    }
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if frac.len() > 9 {
        return Err(invalid(WHAT, input, "too many decimals"));
    }
    let int: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| invalid(WHAT, input, "too large"))?
    };
    let frac_val: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse()
            .map_err(|_| invalid(WHAT, input, "not a number"))?
    };
    let scale = 10u128.pow(frac.len() as u32);
    int.checked_mul(nanos_per_unit)
        .and_then(|v| v.checked_add(frac_val.checked_mul(nanos_per_unit)? / scale))
        .ok_or_else(|| invalid(WHAT, input, "too large"))
}

/// Parses a CPU quota in cores (`0.5`, `2`), between [`MIN_CPUS`] and [`MAX_CPUS`].
pub fn parse_cpus(input: &str) -> Result<f64, UnitError> {
    const WHAT: &str = "cpu quota";
    let s = input.trim();
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(invalid(
            WHAT,
            input,
            "must be a positive number of cores, like 0.5 or 2",
        ));
    }
    let v: f64 = s
        .parse()
        .map_err(|_| invalid(WHAT, input, "not a number"))?;
    if !v.is_finite() || v < MIN_CPUS {
        return Err(invalid(WHAT, input, format!("must be at least {MIN_CPUS}")));
    }
    if v > MAX_CPUS {
        return Err(invalid(WHAT, input, format!("must be at most {MAX_CPUS}")));
    }
    Ok(v)
}

/// Parses a pids limit (maximum number of tasks), between [`MIN_PIDS`] and [`MAX_PIDS`].
pub fn parse_pids(input: &str) -> Result<u64, UnitError> {
    const WHAT: &str = "pids limit";
    let s = input.trim();
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit()) {
        return Err(invalid(
            WHAT,
            input,
            "must be a positive whole number, like 64",
        ));
    }
    let v: u64 = s.parse().map_err(|_| invalid(WHAT, input, "too large"))?;
    if v < MIN_PIDS {
        return Err(invalid(
            WHAT,
            input,
            format!(
                "must be at least {MIN_PIDS}: the sandbox's pid 1 and the command count as tasks"
            ),
        ));
    }
    if v > MAX_PIDS {
        return Err(invalid(WHAT, input, format!("must be at most {MAX_PIDS}")));
    }
    Ok(v)
}

/// Parses an output cap (stdout and stderr together): a size between one byte and
/// [`MAX_OUTPUT_BYTES`].
pub fn parse_output_cap(input: &str) -> Result<u64, UnitError> {
    let bytes = parse_size(input)?;
    if bytes > MAX_OUTPUT_BYTES {
        return Err(invalid(
            "output cap",
            input,
            format!("above the maximum of {}", format_size(MAX_OUTPUT_BYTES)),
        ));
    }
    Ok(bytes)
}

/// Formats a byte count the way [`parse_size`] reads it back (largest exact binary unit).
pub fn format_size(bytes: u64) -> String {
    for (shift, suffix) in [(40u32, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= (1u64 << shift) && bytes % (1u64 << shift) == 0 {
            return format!("{}{}", bytes >> shift, suffix);
        }
    }
    format!("{bytes}")
}

/// Formats a duration the way [`parse_duration`] reads it back.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.subsec_nanos() % 1_000_000 != 0 {
        format!("{}us", d.as_micros())
    } else if ms % 1000 != 0 {
        format!("{ms}ms")
    } else {
        format!("{}s", d.as_secs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
    }

    #[test]
    fn sizes_reject_zero_negative_huge_and_garbage() {
        for bad in [
            "0",
            "-1M",
            "99999999T",
            "",
            "abc",
            "1.2.3M",
            "1X",
            "0.0001K",
            ".",
            "+5M",
        ] {
            assert!(parse_size(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn memory_limits_are_bounded() {
        assert!(parse_memory("1M").is_err());
        assert!(parse_memory("2T").is_err());
        assert_eq!(parse_memory("256M"), Ok(256 << 20));
    }

    #[test]
    fn output_caps_are_bounded() {
        assert_eq!(parse_output_cap("1"), Ok(1));
        assert_eq!(parse_output_cap("10K"), Ok(10 << 10));
        assert_eq!(parse_output_cap("1T"), Ok(MAX_OUTPUT_BYTES));
        for bad in ["0", "2T", "-5", "", "1X"] {
            assert!(parse_output_cap(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn durations_parse_common_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
    }

    #[test]
    fn durations_run_together_from_the_largest_unit_down() {
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1h2m3s"), Ok(Duration::from_secs(3723)));
        assert_eq!(parse_duration("1s500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1d12h"), Ok(Duration::from_secs(129_600)));
        for bad in ["1s1m", "1m1m", "1m30", "30s1", "1h-2m", "1mm", "m30s"] {
            assert!(parse_duration(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn durations_reject_garbage_zero_and_huge() {
        for bad in ["abc", "", "0", "0s", "-1s", "5x", "100d", "1..2s", "s"] {
            assert!(parse_duration(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn cpus_and_pids_are_bounded() {
        assert_eq!(parse_cpus("0.5"), Ok(0.5));
        for bad in ["0", "-1", "abc", "1e3", "inf", "NaN", "2000", "0.001"] {
            assert!(parse_cpus(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(parse_pids("64"), Ok(64));
        assert_eq!(parse_pids("2"), Ok(MIN_PIDS));
        for bad in ["0", "1", "-1", "1.5", "99999999999999999999", "x"] {
            assert!(parse_pids(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn formatted_values_parse_back() {
        for v in [1u64 << 20, 3 << 29, 4097, 1 << 40] {
            assert_eq!(parse_size(&format_size(v)), Ok(v));
        }
        for d in [
            Duration::from_millis(1500),
            Duration::from_secs(60),
            Duration::from_micros(15),
        ] {
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }

    proptest::proptest! {
        #[test]
        fn size_parser_never_panics(s in "\\PC{0,24}") {
            let _ = parse_size(&s);
            let _ = parse_duration(&s);
            let _ = parse_cpus(&s);
            let _ = parse_pids(&s);
            let _ = parse_output_cap(&s);
        }

        #[test]
        fn size_roundtrip(v in 1u64..(1u64 << 40)) {
            proptest::prop_assert_eq!(parse_size(&format_size(v)), Ok(v));
        }
    }
}
