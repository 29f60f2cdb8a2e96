//! Log timestamps by hand: nginx/Apache `$time_local` and RFC 3339, to Unix nanoseconds.
//!
//! Hand-written because these run once per log line and the goal is a million lines per
//! second per core; a general date library spends most of that budget on format strings and
//! time-zone tables. Only numeric UTC offsets are understood (that is all these formats
//! write). This module does not know about leap seconds (neither do the logs).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time as nanoseconds since the Unix epoch (negative before 1970).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct UnixNanos(pub i64);

impl UnixNanos {
    pub fn from_secs(secs: i64) -> UnixNanos {
        UnixNanos(secs.saturating_mul(1_000_000_000))
    }

    pub fn as_secs(self) -> i64 {
        self.0.div_euclid(1_000_000_000)
    }

    pub fn to_system_time(self) -> SystemTime {
        if self.0 >= 0 {
            UNIX_EPOCH + Duration::from_nanos(self.0 as u64)
        } else {
            UNIX_EPOCH - Duration::from_nanos(self.0.unsigned_abs())
        }
    }

    pub fn saturating_add_secs(self, secs: i64) -> UnixNanos {
        UnixNanos(self.0.saturating_add(secs.saturating_mul(1_000_000_000)))
    }

    pub fn saturating_sub(self, d: Duration) -> UnixNanos {
        let nanos = i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        UnixNanos(self.0.saturating_sub(nanos))
    }
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

fn digits(b: &[u8]) -> Option<u32> {
    let mut n = 0u32;
    if b.is_empty() {
        return None;
    }
    for &c in b {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u32::from(c - b'0');
    }
    Some(n)
}

fn month_of(b: &[u8]) -> Option<u32> {
    // Case-sensitive as nginx and Apache write them.
    Some(match b {
        b"Jan" => 1,
        b"Feb" => 2,
        b"Mar" => 3,
        b"Apr" => 4,
        b"May" => 5,
        b"Jun" => 6,
        b"Jul" => 7,
        b"Aug" => 8,
        b"Sep" => 9,
        b"Oct" => 10,
        b"Nov" => 11,
        b"Dec" => 12,
        _ => return None,
    })
}

#[allow(clippy::too_many_arguments)]
fn assemble(
    year: u32,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    nanos: u32,
    offset_secs: i64,
) -> Option<UnixNanos> {
    let year = i64::from(year);
    let valid = (1..=12).contains(&month)
        && day >= 1
        && day <= days_in_month(year, month)
        && hour < 24
        && minute < 60
        && second < 61; // 60: a leap second as written; it folds into the next minute
    if !valid {
        return None;
    }
    let secs = weir::calendar::days_from_civil(year, month, day) * 86_400
        + i64::from(hour) * 3600
        + i64::from(minute) * 60
        + i64::from(second)
        - offset_secs;
    // Nanoseconds since 1970 in an i64 end in 2262: a later year (a typo,
    // a fuzzer's 2426) is no time weir can replay, not an overflow.
    let ns = secs
        .checked_mul(1_000_000_000)?
        .checked_add(i64::from(nanos))?;
    Some(UnixNanos(ns))
}

/// `±hhmm` (nginx) or `±hh:mm` (RFC 3339) to seconds east of UTC.
fn offset(b: &[u8]) -> Option<i64> {
    let (sign, rest) = match b.split_first()? {
        (b'+', rest) => (1, rest),
        (b'-', rest) => (-1, rest),
        _ => return None,
    };
    let (h, m) = match rest.len() {
        4 => (&rest[..2], &rest[2..]),
        5 if rest[2] == b':' => (&rest[..2], &rest[3..]),
        _ => return None,
    };
    let (h, m) = (digits(h)?, digits(m)?);
    if h > 23 || m > 59 {
        return None;
    }
    Some(sign * i64::from(h * 3600 + m * 60))
}

/// nginx `$time_local` / Apache `%t` without brackets: `10/Oct/2026:13:55:36 +0900`.
pub fn parse_time_local(s: &str) -> Option<UnixNanos> {
    let b = s.as_bytes();
    if b.len() != 26 || b[2] != b'/' || b[6] != b'/' || b[11] != b':' || b[14] != b':' {
        return None;
    }
    if b[17] != b':' || b[20] != b' ' {
        return None;
    }
    let day = digits(&b[0..2])?;
    let month = month_of(&b[3..6])?;
    let year = digits(&b[7..11])?;
    let hour = digits(&b[12..14])?;
    let minute = digits(&b[15..17])?;
    let second = digits(&b[18..20])?;
    let off = offset(&b[21..26])?;
    assemble(year, month, day, hour, minute, second, 0, off)
}

/// The last `$time_local` parsed and its value. Consecutive lines of a log
/// mostly share their second, and comparing the 26 bytes costs a tenth of
/// parsing them.
#[derive(Debug, Clone, Default)]
pub struct TimeLocalMemo {
    text: [u8; 26],
    value: Option<UnixNanos>,
}

impl TimeLocalMemo {
    /// The UTC offset (seconds east) of the text parsed last.
    pub fn offset(&self) -> Option<i64> {
        self.value?;
        offset(&self.text[21..26])
    }

    /// [`parse_time_local`], answered from the memo when `s` is the text it
    /// parsed last.
    pub fn parse(&mut self, s: &str) -> Option<UnixNanos> {
        if let Some(value) = self.value
            && s.as_bytes() == self.text
        {
            return Some(value);
        }
        let value = parse_time_local(s)?;
        // Only 26-byte texts parse.
        if let Ok(text) = <[u8; 26]>::try_from(s.as_bytes()) {
            self.text = text;
            self.value = Some(value);
        }
        Some(value)
    }
}

/// RFC 3339: `2026-09-23T17:00:00.123Z`, `2026-09-23T17:00:00+09:00`; up to 9 fraction
/// digits; `t`, `z` and a space separator are accepted too.
pub fn parse_rfc3339(s: &str) -> Option<UnixNanos> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    if !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let year = digits(&b[0..4])?;
    let month = digits(&b[5..7])?;
    let day = digits(&b[8..10])?;
    let hour = digits(&b[11..13])?;
    let minute = digits(&b[14..16])?;
    let second = digits(&b[17..19])?;
    let mut rest = &b[19..];
    let mut nanos = 0u32;
    if let Some((b'.', frac)) = rest.split_first() {
        let n = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 || n > 9 {
            return None;
        }
        nanos = digits(&frac[..n])? * 10u32.pow(9 - n as u32);
        rest = &frac[n..];
    }
    let off = match rest {
        b"Z" | b"z" => 0,
        _ => offset(rest)?,
    };
    assemble(year, month, day, hour, minute, second, nanos, off)
}

/// Unix seconds as a (fractional) JSON number, as Caddy writes `ts`.
pub fn from_unix_float(secs: f64) -> Option<UnixNanos> {
    // ±292 years around 1970 fit in i64 nanoseconds.
    if !secs.is_finite() || secs.abs() > 9.0e9 {
        return None;
    }
    // Whole seconds and fraction apart: `secs * 1e9` would round the fraction at the
    // precision of the whole number (about 240 ns today) instead of the fraction's own.
    let whole = secs.floor();
    let nanos = ((secs - whole) * 1e9).round() as i64;
    Some(UnixNanos(whole as i64 * 1_000_000_000 + nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_local_memo_answers_as_parsing_does() {
        let texts = [
            "10/Oct/2026:13:55:36 +0900",
            "10/Oct/2026:13:55:36 +0900",
            "10/Oct/2026:13:55:37 +0900",
            "10/Oct/2026:13:55:36 +0900",
            "10/Oct/2026:13:55:36 +0000",
            "10/Foo/2026:13:55:36 +0900",
            "10/Oct/2026:13:55:36 +0900",
            "",
            "10/Oct/2026:13:55:36 +090",
            "31/Feb/2026:00:00:00 +0000",
            "31/Feb/2026:00:00:00 +0000",
            "10/Oct/2026:13:55:36 +0900",
        ];
        let mut memo = TimeLocalMemo::default();
        for t in texts {
            assert_eq!(memo.parse(t), parse_time_local(t), "{t:?}");
        }
    }

    #[test]
    fn years_past_2262_are_no_time_not_an_overflow() {
        // Found by the replay_line fuzz target (a panic in debug builds, a
        // wrapped time in release).
        assert_eq!(parse_time_local("10/Oct/2426:13:55:36 +0900"), None);
        assert_eq!(parse_rfc3339("9999-12-31T23:59:59Z"), None);
        assert!(parse_time_local("10/Mar/2262:01:00:00 +0000").is_some());
    }

    #[test]
    fn time_local_table() {
        let cases: &[(&str, Option<i64>)] = &[
            ("01/Jan/1970:00:00:00 +0000", Some(0)),
            ("10/Oct/2026:13:55:36 +0900", Some(1_791_608_136)),
            ("10/Oct/2026:04:55:36 +0000", Some(1_791_608_136)),
            ("09/Oct/2026:23:55:36 -0500", Some(1_791_608_136)),
            ("29/Feb/2024:12:00:00 +0000", Some(1_709_208_000)),
            ("29/Feb/2026:12:00:00 +0000", None),
            ("31/Dec/1999:23:59:59 +0000", Some(946_684_799)),
            ("10/oct/2026:13:55:36 +0900", None),
            ("10/Oct/2026:24:00:00 +0900", None),
            ("10/Oct/2026:13:55:36 0900", None),
            ("10/Oct/2026:13:55:36 +09:00", None),
            ("1/Oct/2026:13:55:36 +0900", None),
            ("10/Oct/2026 13:55:36 +0900", None),
            ("", None),
        ];
        for (text, want) in cases {
            let got = parse_time_local(text).map(|t| t.as_secs());
            assert_eq!(got, *want, "{text}");
        }
    }

    #[test]
    fn rfc3339_table() {
        let cases: &[(&str, Option<i64>)] = &[
            ("2026-10-10T04:55:36Z", Some(1_791_608_136_000_000_000)),
            ("2026-10-10T04:55:36.123Z", Some(1_791_608_136_123_000_000)),
            (
                "2026-10-10T04:55:36.000000001Z",
                Some(1_791_608_136_000_000_001),
            ),
            ("2026-10-10T13:55:36+09:00", Some(1_791_608_136_000_000_000)),
            ("2026-10-10t04:55:36z", Some(1_791_608_136_000_000_000)),
            ("2026-10-10 04:55:36Z", Some(1_791_608_136_000_000_000)),
            ("2026-10-10T04:55:36", None),
            ("2026-10-10T04:55:36.Z", None),
            ("2026-10-10T04:55:36.1234567890Z", None),
            ("2026-13-10T04:55:36Z", None),
            ("2026-10-10T04:55:36+0900x", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_rfc3339(text).map(|t| t.0), *want, "{text}");
        }
    }

    #[test]
    fn unix_float_and_system_time() {
        let t = from_unix_float(1_695_000_000.25).expect("finite");
        assert_eq!(t.0, 1_695_000_000_250_000_000);
        assert_eq!(from_unix_float(f64::NAN), None);
        assert_eq!(
            UnixNanos::from_secs(10).to_system_time(),
            UNIX_EPOCH + Duration::from_secs(10)
        );
    }
}
