//! Parsing and formatting of human-readable byte sizes (`512MiB`, `2GB`, `1.5 GiB`).

use std::fmt;

/// Examples shown in every [`SizeError`] so the user sees what is accepted.
const EXAMPLES: &str = "examples: 1048576, 512KiB, 512MiB, 2GB, 1.5GiB, 1T";

/// Most fractional digits accepted (`1.123456789GiB`); more is an error, not a silent round.
const MAX_FRACTION_DIGITS: usize = 9;

/// A size string could not be parsed.
///
/// Display names the offending input, the reason and valid examples, e.g.
/// ``invalid size `12XB`: unknown unit `XB` (examples: ...)``.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError {
    /// The input exactly as given.
    pub input: String,
    /// What was wrong with it.
    pub reason: String,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid size `{}`: {} ({}; units K/KiB/M/MiB/G/GiB/T/TiB are powers of 1024, KB/MB/GB/TB powers of 1000, case-insensitive)",
            self.input, self.reason, EXAMPLES
        )
    }
}

impl std::error::Error for SizeError {}

/// Multiplier for a (lower-cased, trimmed) unit suffix.
fn unit_multiplier(unit: &str) -> Option<u64> {
    const KI: u64 = 1 << 10;
    const K: u64 = 1000;
    Some(match unit {
        "" | "b" => 1,
        "k" | "kib" => KI,
        "kb" => K,
        "m" | "mib" => KI.pow(2),
        "mb" => K.pow(2),
        "g" | "gib" => KI.pow(3),
        "gb" => K.pow(3),
        "t" | "tib" => KI.pow(4),
        "tb" => K.pow(4),
        _ => return None,
    })
}

/// Parse a byte size such as `1048576`, `512MiB`, `2GB`, `1.5 GiB` or `4k`.
///
/// * A plain number is bytes (`B` is also accepted).
/// * `KB`/`MB`/`GB`/`TB` are decimal (1000-based); `KiB`/`MiB`/`GiB`/`TiB` and the bare
///   letters `K`/`M`/`G`/`T` are binary (1024-based), as in most CLI tools.
/// * Units are case-insensitive; whitespace may separate number and unit.
/// * Decimals are allowed (up to 9 fractional digits); the result is rounded down to whole bytes.
///
/// Errors (with the input and examples in the message) on empty input, a missing or
/// malformed number, negative numbers, unknown units, too many decimals, and results
/// above `u64::MAX`.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let err = |reason: String| SizeError {
        input: s.to_string(),
        reason,
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(err("empty size".into()));
    }
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(num_end);
    if num.is_empty() {
        return Err(err("expected a non-negative number before the unit".into()));
    }
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if frac_part.contains('.') {
        return Err(err("more than one decimal point".into()));
    }
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err("expected digits".into()));
    }
    if num.ends_with('.') {
        return Err(err("expected digits after the decimal point".into()));
    }
    if frac_part.len() > MAX_FRACTION_DIGITS {
        return Err(err(format!(
            "more than {MAX_FRACTION_DIGITS} digits after the decimal point"
        )));
    }
    let unit_trim = unit.trim();
    let mult = unit_multiplier(&unit_trim.to_ascii_lowercase())
        .ok_or_else(|| err(format!("unknown unit `{unit_trim}`")))?;

    let overflow = || err(format!("larger than the maximum {} bytes", u64::MAX));
    // Digits only (checked above), so parse can only fail on overflow.
    let int: u128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse::<u128>().map_err(|_| overflow())?
    };
    let whole = int.checked_mul(u128::from(mult)).ok_or_else(overflow)?;
    let frac_bytes = if frac_part.is_empty() {
        0
    } else {
        let frac: u128 = frac_part.parse().map_err(|_| overflow())?;
        let scale = 10u128.pow(frac_part.len() as u32);
        frac * u128::from(mult) / scale
    };
    let total = whole.checked_add(frac_bytes).ok_or_else(overflow)?;
    u64::try_from(total).map_err(|_| overflow())
}

/// Format bytes with binary units and two decimals: `512 B`, `1.50 GiB`, `2.00 TiB`.
///
/// Values below 1 KiB are printed as exact bytes.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_bytes() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("1048576").unwrap(), 1_048_576);
        assert_eq!(parse_size("  42  ").unwrap(), 42);
        assert_eq!(parse_size("42B").unwrap(), 42);
        assert_eq!(parse_size("42 b").unwrap(), 42);
    }

    #[test]
    fn binary_and_decimal_units() {
        assert_eq!(parse_size("1K").unwrap(), 1024);
        assert_eq!(parse_size("1KiB").unwrap(), 1024);
        assert_eq!(parse_size("1KB").unwrap(), 1000);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2MB").unwrap(), 2_000_000);
        assert_eq!(parse_size("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        assert_eq!(parse_size("1TB").unwrap(), 1_000_000_000_000);
        assert_eq!(parse_size("3TiB").unwrap(), 3 << 40);
    }

    #[test]
    fn case_and_whitespace() {
        assert_eq!(parse_size("512mib").unwrap(), 512 << 20);
        assert_eq!(parse_size("512 MIB").unwrap(), 512 << 20);
        assert_eq!(parse_size("2 gb").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("\t2\tGiB\n").unwrap(), 2 << 30);
        assert_eq!(parse_size("4k").unwrap(), 4096);
    }

    #[test]
    fn decimals() {
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("1.5 GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("0.5K").unwrap(), 512);
        assert_eq!(parse_size(".5K").unwrap(), 512);
        // Rounded down to whole bytes.
        assert_eq!(parse_size("1.5").unwrap(), 1);
        assert_eq!(parse_size("0.001KiB").unwrap(), 1);
        assert_eq!(parse_size("1.123456789GiB").unwrap(), 1_206_302_541);
    }

    #[test]
    fn overflow() {
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
        assert!(parse_size("18446744073709551616").is_err());
        assert!(parse_size("16777216TiB").is_err()); // exactly 2^64
        assert_eq!(parse_size("16777215TiB").unwrap(), 16_777_215u64 << 40);
        assert!(parse_size("99999999999999999999999999999999999999999999GiB").is_err());
        let e = parse_size("20000000TB").unwrap_err();
        assert!(e.reason.contains("maximum"), "{e}");
    }

    #[test]
    fn garbage() {
        for bad in [
            "",
            "   ",
            "GiB",
            "-1",
            "-1GiB",
            "1..5G",
            "1.5.2G",
            "1.",
            ".",
            "12XB",
            "1 2G",
            "1e9",
            "0x10",
            "1GiBs",
            "1.1234567891G",
            "abc",
        ] {
            let e = parse_size(bad).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&format!("`{bad}`")), "names input: {msg}");
            assert!(msg.contains("512MiB"), "shows examples: {msg}");
        }
        assert!(parse_size("12XB")
            .unwrap_err()
            .reason
            .contains("unknown unit `XB`"));
    }

    #[test]
    fn formatting() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1024), "1.00 KiB");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
        assert_eq!(format_size(512 << 20), "512.00 MiB");
        assert_eq!(format_size(2 << 40), "2.00 TiB");
        assert_eq!(format_size(u64::MAX), "16.00 EiB");
    }

    #[test]
    fn roundtrip_binary() {
        for b in [1u64 << 10, 5 << 20, 3 << 29, 7 << 40] {
            let s = format_size(b).replace(' ', "");
            assert_eq!(parse_size(&s).unwrap(), b, "{s}");
        }
    }
}
