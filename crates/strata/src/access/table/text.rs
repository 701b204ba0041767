//! The text forms of values, shared by CSV import and export and by JSON output.
//!
//! | type    | text form                                                              |
//! |---------|------------------------------------------------------------------------|
//! | `i64`   | optional sign and decimal digits (`-12`, `+7`, `42`)                   |
//! | `f64`   | shortest form that reads back to the same bits ([`format_f64`]); `NaN`, `inf`, `-inf` |
//! | `date`  | `YYYY-MM-DD`, proleptic Gregorian, years 0000–9999 ([`parse_date`])    |
//! | `bool`  | `true` / `false` (also `TRUE`, `True`, `FALSE`, `False`)               |
//! | `str`   | the string itself                                                      |
//! | `bytes` | `\x` and two lowercase hex digits per byte, as PostgreSQL writes bytea |
//!
//! Every `format_*` function writes a form its `parse_*` counterpart reads back to the same
//! value, bit for bit (for `f64`, NaN payloads aside: every NaN reads back as the one NaN).

use std::num::IntErrorKind;

use super::schema::{ColumnType, Value};

/// Days from 1970-01-01 to `y`-`m`-`d` in the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`). `m` is 1..=12, `d` 1..=31; any year.
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400); // [0, 399]
    let mp = i64::from((m + 9) % 12); // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// The inverse of [`days_from_civil`]: (year, month, day) of `z` days after 1970-01-01.
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let d = doy - (153 * mp + 2) / 5 + 1; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 }; // [1, 12]
    let y = yoe + era * 400 + i64::from(m <= 2);
    // Both casts are of values in the ranges noted above.
    (y, m as u32, d as u32)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

pub(crate) fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Parses a strict `YYYY-MM-DD` date (four-digit year 0000–9999, two-digit month and day, a
/// day that exists in that month, leap years included) to days since 1970-01-01.
pub fn parse_date(s: &str) -> Option<i32> {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> { b[r].iter().try_fold(0u32, |acc, &c| c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))) };
    let (y, m, d) = (i64::from(num(0..4)?), num(5..7)?, num(8..10)?);
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    // Years 0..=9999 are well inside i32's ±5.8 million years of days.
    i32::try_from(days_from_civil(y, m, d)).ok()
}

/// Formats days since 1970-01-01 as `YYYY-MM-DD`. Years outside 0000–9999 (which
/// [`parse_date`] does not read) are written with a sign and at least four digits, as ISO 8601's
/// expanded form does: `-0001-12-31`, `+10000-01-01`.
pub fn format_date(days: i32) -> String {
    let (y, m, d) = civil_from_days(i64::from(days));
    if (0..=9999).contains(&y) {
        format!("{y:04}-{m:02}-{d:02}")
    } else {
        format!("{y:+05}-{m:02}-{d:02}")
    }
}

/// The shortest text that reads back (with [`parse_f64`]) to the identical `f64`: Rust's
/// `{:?}` form, which always shows that the number is a float (`1.0`, `0.1`, `-0.0`) and
/// switches to exponent form for very large or small magnitudes (`1e300`, `5e-324`).
/// Non-finite values are `NaN`, `inf` and `-inf`.
pub fn format_f64(v: f64) -> String {
    // Debug already writes "NaN", "inf" and "-inf"; spelled out so the contract is visible here.
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.to_owned()
    } else {
        format!("{v:?}")
    }
}

/// Parses an `f64`: whatever Rust's `f64` parser accepts (`1`, `-2.5`, `.5`, `1e-7`, `inf`,
/// `-infinity`, `NaN`, case-insensitive for the words), which includes everything
/// [`format_f64`] writes.
pub fn parse_f64(s: &str) -> Option<f64> {
    s.parse().ok()
}

/// Lowercase hex after `\x`, as PostgreSQL writes `bytea`: `[0x00, 0xAB]` → `\x00ab`.
pub fn format_bytes(b: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 + 2 * b.len());
    s.push_str("\\x");
    for &byte in b {
        s.push(char::from(HEX[usize::from(byte >> 4)]));
        s.push(char::from(HEX[usize::from(byte & 15)]));
    }
    s
}

/// Parses `\x` followed by an even number of hex digits (either case) into bytes.
pub fn parse_bytes(s: &str) -> Option<Vec<u8>> {
    let hex = s.strip_prefix("\\x")?.as_bytes();
    if hex.len() % 2 != 0 {
        return None;
    }
    let digit = |c: u8| char::from(c).to_digit(16).and_then(|d| u8::try_from(d).ok());
    hex.chunks_exact(2).map(|p| Some(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

/// Parses `true`/`false` in lowercase, uppercase or capitalized form.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "true" | "TRUE" | "True" => Some(true),
        "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// `s` cut to its first 64 characters, and whether it was cut.
fn cut(s: &str) -> (&str, bool) {
    match s.char_indices().nth(64) {
        None => (s, false),
        Some((end, _)) => (&s[..end], true),
    }
}

/// At most 64 characters of `s`, quoted and escaped, for messages.
pub(crate) fn show(s: &str) -> String {
    let (head, was_cut) = cut(s);
    format!("{head:?}{}", if was_cut { "..." } else { "" })
}

/// Whether `s` is an optional sign followed by one or more ASCII digits.
pub(crate) fn is_integer_literal(s: &str) -> bool {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit())
}

/// Parses one field's text as a value of type `ty`. The error is the problem alone (the
/// caller adds where it is), e.g. `number 99999999999999999999 is too large for i64` or
/// `"abc" is not a date (YYYY-MM-DD)`. NULL is not decided here: the CSV reader maps an empty
/// unquoted field to NULL before calling this; an empty string is a `str` and nothing else.
pub fn parse_value(ty: ColumnType, field: &str) -> Result<Value, String> {
    match ty {
        ColumnType::I64 => field.parse::<i64>().map(Value::I64).map_err(|e| match e.kind() {
            IntErrorKind::PosOverflow | IntErrorKind::NegOverflow => {
                // Only sign and digits overflow, so the text needs no quoting.
                let (head, was_cut) = cut(field);
                format!("number {head}{} is too large for i64", if was_cut { "..." } else { "" })
            }
            _ => format!("{} is not an i64", show(field)),
        }),
        ColumnType::F64 => parse_f64(field).map(Value::F64).ok_or_else(|| format!("{} is not a f64", show(field))),
        ColumnType::Date => parse_date(field).map(Value::Date).ok_or_else(|| format!("{} is not a date (YYYY-MM-DD)", show(field))),
        ColumnType::Bool => parse_bool(field).map(Value::Bool).ok_or_else(|| format!("{} is not a bool (true or false)", show(field))),
        ColumnType::Str => Ok(Value::Str(field.to_owned())),
        ColumnType::Bytes => parse_bytes(field).map(Value::Bytes).ok_or_else(|| format!("{} is not bytes (\\x and an even number of hex digits)", show(field))),
    }
}

/// The text form of a value (see the module doc); `None` for NULL.
pub fn value_to_text(v: &Value) -> Option<String> {
    Some(match v {
        Value::Null => return None,
        Value::I64(i) => i.to_string(),
        Value::F64(f) => format_f64(*f),
        Value::Date(d) => format_date(*d),
        Value::Bool(b) => b.to_string(),
        Value::Str(s) => s.clone(),
        Value::Bytes(b) => format_bytes(b),
    })
}

/// A value as JSON: `i64` and finite `f64` as JSON numbers (an `f64` in [`format_f64`]'s
/// shortest round-trip form, e.g. `0.1`, `1.0`, `-0.0`, except that serde_json spells a
/// positive exponent `1e+300`), non-finite `f64` as the strings
/// `"NaN"`, `"inf"`, `"-inf"`, dates as `"YYYY-MM-DD"`, booleans as `true`/`false`, strings
/// as strings, bytes as `"\x..."` strings and NULL as `null`.
pub fn value_to_json(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::Null => J::Null,
        Value::I64(i) => J::from(*i),
        Value::F64(f) if !f.is_finite() => J::String(format_f64(*f)),
        // format_f64's finite forms are valid JSON numbers (digits, '.', 'e', '-'); with the
        // workspace's `arbitrary_precision` feature the Number keeps that text (exponent
        // signs aside); without it, it holds the f64 itself. Either way it reads back exactly.
        Value::F64(f) => format_f64(*f).parse::<serde_json::Number>().ok().or_else(|| serde_json::Number::from_f64(*f)).map_or(J::Null, J::Number),
        Value::Date(d) => J::String(format_date(*d)),
        Value::Bool(b) => J::Bool(*b),
        Value::Str(s) => J::String(s.clone()),
        Value::Bytes(b) => J::String(format_bytes(b)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn dates() {
        assert_eq!(parse_date("1970-01-01"), Some(0));
        assert_eq!(parse_date("1970-01-02"), Some(1));
        assert_eq!(parse_date("1969-12-31"), Some(-1));
        assert_eq!(parse_date("2000-03-01"), Some(11_017));
        assert_eq!(parse_date("2024-02-29"), Some(19_782));
        assert_eq!(parse_date("0000-01-01"), Some(-719_528));
        assert_eq!(parse_date("9999-12-31"), Some(2_932_896));
        assert_eq!(parse_date("0000-02-29"), Some(-719_469), "year 0 is a leap year");
        for bad in [
            "2023-02-29",
            "1900-02-29",
            "2024-02-30",
            "2024-04-31",
            "2024-13-01",
            "2024-00-10",
            "2024-01-00",
            "2024-1-01",
            "24-01-01",
            "2024/01/01",
            "2024-01-01 ",
            " 2024-01-01",
            "+202-01-01",
            "2024-0a-01",
            "",
            "10000-01-01",
            "2024-01-011",
            "２０２４-01-01",
        ] {
            assert_eq!(parse_date(bad), None, "{bad:?}");
        }
        assert_eq!(parse_date("2000-02-29"), Some(11_016));
        assert_eq!(format_date(0), "1970-01-01");
        assert_eq!(format_date(19_782), "2024-02-29");
        assert_eq!(format_date(-719_528), "0000-01-01");
        assert_eq!(format_date(-719_529), "-0001-12-31");
        assert_eq!(format_date(2_932_897), "+10000-01-01");
        // The extremes do not overflow.
        assert!(format_date(i32::MIN).starts_with('-'));
        assert!(format_date(i32::MAX).starts_with('+'));
    }

    #[test]
    fn every_date_of_years_0_to_9999_round_trips() {
        let mut expected = parse_date("0000-01-01").unwrap();
        for y in 0..=9999i64 {
            for m in 1..=12 {
                for d in 1..=days_in_month(y, m) {
                    let s = format!("{y:04}-{m:02}-{d:02}");
                    assert_eq!(parse_date(&s), Some(expected), "{s}");
                    assert_eq!(format_date(expected), s);
                    expected += 1;
                }
            }
        }
        assert_eq!(expected - 1, parse_date("9999-12-31").unwrap());
    }

    #[test]
    fn floats() {
        assert_eq!(format_f64(0.1), "0.1");
        assert_eq!(format_f64(1.0), "1.0");
        assert_eq!(format_f64(-0.0), "-0.0");
        assert_eq!(format_f64(1e300), "1e300");
        assert_eq!(format_f64(5e-324), "5e-324");
        assert_eq!(format_f64(f64::NAN), "NaN");
        assert_eq!(format_f64(f64::INFINITY), "inf");
        assert_eq!(format_f64(f64::NEG_INFINITY), "-inf");
        for v in [0.1, 1.0 / 3.0, -0.0, 0.0, f64::MAX, f64::MIN, f64::MIN_POSITIVE, 5e-324, 1e300, 123456789.125, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(parse_f64(&format_f64(v)).unwrap().to_bits(), v.to_bits(), "{v:?}");
        }
        assert!(parse_f64("NaN").unwrap().is_nan());
        for ok in ["1", "+1.5", "-.5", "1.", "1E5", "infinity", "-Infinity", "nan"] {
            assert!(parse_f64(ok).is_some(), "{ok}");
        }
        for bad in ["", "1,5", "0x10", " 1", "1 ", "e5", "--1"] {
            assert!(parse_f64(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn bytes_and_bools() {
        assert_eq!(format_bytes(&[]), "\\x");
        assert_eq!(format_bytes(&[0, 0xab, 0x7f, 0xff]), "\\x00ab7fff");
        assert_eq!(parse_bytes("\\x00ab7FFF"), Some(vec![0, 0xab, 0x7f, 0xff]));
        assert_eq!(parse_bytes("\\x"), Some(vec![]));
        for bad in ["", "x00", "\\x0", "\\x0g", "\\X00", "\\x+0", "\\x é"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
        assert_eq!(parse_bool("True"), Some(true));
        assert_eq!(parse_bool("FALSE"), Some(false));
        for bad in ["", "t", "1", "yes", "tRue"] {
            assert_eq!(parse_bool(bad), None, "{bad}");
        }
    }

    #[test]
    fn parse_value_messages() {
        use ColumnType::*;
        assert_eq!(parse_value(I64, "-42"), Ok(Value::I64(-42)));
        assert_eq!(parse_value(I64, "+7"), Ok(Value::I64(7)));
        assert_eq!(parse_value(I64, "9223372036854775807"), Ok(Value::I64(i64::MAX)));
        assert_eq!(parse_value(I64, "-9223372036854775808"), Ok(Value::I64(i64::MIN)));
        assert_eq!(parse_value(I64, "99999999999999999999").unwrap_err(), "number 99999999999999999999 is too large for i64");
        assert_eq!(parse_value(I64, "-9223372036854775809").unwrap_err(), "number -9223372036854775809 is too large for i64");
        assert_eq!(parse_value(I64, "1.5").unwrap_err(), "\"1.5\" is not an i64");
        assert_eq!(parse_value(I64, "").unwrap_err(), "\"\" is not an i64");
        assert_eq!(parse_value(F64, "abc").unwrap_err(), "\"abc\" is not a f64");
        assert_eq!(parse_value(Date, "abc").unwrap_err(), "\"abc\" is not a date (YYYY-MM-DD)");
        assert_eq!(parse_value(Bool, "yes").unwrap_err(), "\"yes\" is not a bool (true or false)");
        assert!(parse_value(Bytes, "\\x1").unwrap_err().contains("is not bytes"));
        assert_eq!(parse_value(Str, ""), Ok(Value::Str(String::new())));
        assert_eq!(parse_value(Date, "2024-02-29"), Ok(Value::Date(19_782)));
        // Long fields are cut in messages.
        let long = "x".repeat(1000);
        assert!(parse_value(I64, &long).unwrap_err().len() < 100);
        let long_unicode = "é".repeat(1000);
        assert!(parse_value(I64, &long_unicode).unwrap_err().contains("..."));
    }

    #[test]
    fn text_and_json_forms() {
        assert_eq!(value_to_text(&Value::Null), None);
        assert_eq!(value_to_text(&Value::Bool(true)).as_deref(), Some("true"));
        assert_eq!(value_to_text(&Value::Date(0)).as_deref(), Some("1970-01-01"));
        assert_eq!(value_to_text(&Value::Bytes(vec![1])).as_deref(), Some("\\x01"));
        assert_eq!(value_to_text(&Value::F64(2.5)).as_deref(), Some("2.5"));
        let row = [
            Value::Null,
            Value::I64(i64::MIN),
            Value::F64(0.1),
            Value::F64(1.0),
            Value::F64(1e300),
            Value::F64(-0.0),
            Value::F64(f64::NAN),
            Value::F64(f64::NEG_INFINITY),
            Value::Date(19_782),
            Value::Bool(false),
            Value::Str("a\"b".into()),
            Value::Bytes(vec![0xff]),
        ];
        let json = serde_json::Value::Array(row.iter().map(value_to_json).collect()).to_string();
        assert_eq!(json, r#"[null,-9223372036854775808,0.1,1.0,1e+300,-0.0,"NaN","-inf","2024-02-29",false,"a\"b","\\xff"]"#);
        assert!(value_to_json(&Value::I64(5)).is_number());
        assert!(value_to_json(&Value::F64(5.5)).is_number());
        assert_eq!(value_to_json(&Value::I64(i64::MAX)).as_i64(), Some(i64::MAX));
    }

    proptest! {
        #[test]
        fn f64_text_round_trips(bits in any::<u64>()) {
            let v = f64::from_bits(bits);
            let back = parse_f64(&format_f64(v)).unwrap();
            prop_assert!(back.to_bits() == v.to_bits() || (v.is_nan() && back.is_nan()));
            if v.is_finite() {
                // The JSON number reads back to the same bits too.
                let json = value_to_json(&Value::F64(v)).to_string();
                prop_assert_eq!(json.parse::<f64>().unwrap().to_bits(), v.to_bits());
            }
        }

        #[test]
        fn date_text_round_trips(days in any::<i32>()) {
            let s = format_date(days);
            match parse_date(&s) {
                Some(back) => prop_assert_eq!(back, days),
                None => prop_assert!(s.starts_with('+') || s.starts_with('-')),
            }
        }

        #[test]
        fn bytes_text_round_trips(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(parse_bytes(&format_bytes(&b)), Some(b));
        }

        #[test]
        fn parsers_never_panic(s in "\\PC{0,16}") {
            for ty in ColumnType::ALL {
                let _ = parse_value(ty, &s);
            }
        }
    }
}
