//! The `--since` of `mcp-context audit`: an RFC 3339 time (or a date), or a
//! span back from now (`90m`, `24h`, `7d`), checked here and written as the
//! records write theirs (UTC, milliseconds), so that every sink compares
//! like with like and no sink is handed text it would refuse in its own
//! words. Imports the record's time helpers and the error type.

use super::record::{days_from_civil, rfc3339};
use crate::error::{Error, Result};

/// `text` as the RFC 3339 UTC time it names (`2026-12-01T00:00:00.000Z`):
/// RFC 3339 with any offset or fraction (`2026-12-01T09:30:00+01:00`), a
/// date alone (midnight UTC), or `N` seconds, minutes, hours or days back
/// from now (`90s`, `90m`, `24h`, `7d`).
///
/// # Errors
///
/// [`Error::Audit`] saying what is accepted, for anything else.
pub fn since(text: &str) -> Result<String> {
    let t = text.trim();
    let parsed = relative(t).or_else(|| absolute(t));
    parsed.ok_or_else(|| {
        Error::audit(format!(
            "`{}` is not a time: write RFC 3339 (2026-12-01T00:00:00Z, or a date: 2026-12-01) or a span back from \
             now (90m, 24h, 7d)",
            crate::display::escape(t)
        ))
    })
}

/// `N{s,m,h,d}` back from now.
fn relative(t: &str) -> Option<String> {
    let unit = match t.chars().last()? {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return None,
    };
    let digits = &t[..t.len() - 1];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: i64 = digits.parse().ok()?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let back = now.as_secs() as i64 - n.checked_mul(unit)?;
    (back >= 0).then(|| rfc3339(back, now.subsec_millis()))
}

/// `YYYY-MM-DD`, or `YYYY-MM-DD[T ]HH:MM[:SS[.fff…]](Z|±HH:MM)`.
fn absolute(t: &str) -> Option<String> {
    let b = t.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let s = t.get(from..from + len)?;
        s.bytes().all(|c| c.is_ascii_digit()).then(|| s.parse().ok())?
    };
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    if !(1..=12).contains(&month) || day < 1 || day > days_in[(month - 1) as usize] {
        return None;
    }
    let date = days_from_civil(year, month, day) * 86_400;
    if b.len() == 10 {
        return Some(rfc3339(date, 0));
    }
    if !matches!(b[10], b'T' | b't' | b' ') || b.len() < 17 || b[13] != b':' {
        return None;
    }
    let (h, m) = (num(11, 2)?, num(14, 2)?);
    let mut i = 16;
    let mut sec = 0;
    let mut millis = 0u32;
    if b.get(i) == Some(&b':') {
        sec = num(i + 1, 2)?;
        i += 3;
        if b.get(i) == Some(&b'.') {
            let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            if digits == 0 {
                return None;
            }
            let frac = &t[i + 1..i + 1 + digits.min(3)];
            millis = format!("{frac:0<3}").parse().ok()?;
            i += 1 + digits;
        }
    }
    if h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let offset = match &t[i..] {
        "Z" | "z" => 0,
        o if o.len() == 6 && matches!(&o[..1], "+" | "-") && &o[3..4] == ":" => {
            let (oh, om) = (num(i + 1, 2)?, num(i + 4, 2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let sign = if &o[..1] == "-" { -1 } else { 1 };
            sign * (oh * 3600 + om * 60)
        }
        _ => return None,
    };
    Some(rfc3339(date + h * 3600 + m * 60 + sec.min(59) - offset, millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_and_written_as_the_records_write_theirs() {
        assert_eq!(since("2026-12-01").unwrap(), "2026-12-01T00:00:00.000Z");
        assert_eq!(since("2026-12-01T09:30:00Z").unwrap(), "2026-12-01T09:30:00.000Z");
        assert_eq!(since("2026-12-01T09:30:00.5+01:00").unwrap(), "2026-12-01T08:30:00.500Z");
        assert_eq!(since("2026-12-01 00:10-00:30").unwrap(), "2026-12-01T00:40:00.000Z");
        assert_eq!(since("2026-12-02T14:00:00.123456Z").unwrap(), "2026-12-02T14:00:00.123Z");
        assert!(since("24h").unwrap().ends_with('Z'));
        for bad in ["bogus", "", "2026-13-01", "2026-02-30", "2026-12-01T25:00:00Z", "-5h", "h", "2026-12-01T00:00:00"]
        {
            let e = since(bad).unwrap_err().to_string();
            assert!(e.contains("is not a time") && e.contains("24h"), "{bad}: {e}");
        }
    }
}
