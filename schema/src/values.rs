//! Validated value types shared by the HTTP intake and the consumers.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a value was refused. The message names the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValueError {
    #[error("{field} must be 1 to 32 characters without whitespace or control characters")]
    AccountId { field: &'static str },
    #[error(
        "{field} must be 1 to 32 characters, each a letter A-Z or a-z, a digit or one of . _ : @ + -, \
         and must not start with issuance: in any letter case (the issuance accounts' names)"
    )]
    NewAccountId { field: &'static str },
    #[error("{field} must be 3 uppercase letters (ISO 4217), e.g. \"BRL\"")]
    Currency { field: &'static str },
    #[error("{field} must be a positive integer number of cents that fits in 64 bits")]
    Amount { field: &'static str },
    #[error("{field} must be 1 to {max} characters, not blank, without control characters")]
    Text { field: &'static str, max: usize },
    /// `at` names the string or key: `lines[0].sku`, `a key of lines[0]`.
    #[error("{at} must not contain the NUL character (U+0000), which the database cannot store")]
    Nul { at: String },
    /// `at` names a number that `jsonb` keeps but that cannot be read back as JSON (its
    /// exact decimal, some 309 digits, overflows the reader).
    #[error("{at} is a number too large to be stored and read back; send it as a string")]
    Number { at: String },
}

/// An account id: 1..=32 characters, no whitespace or control characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AccountId(String);

impl AccountId {
    /// Validates `value` as an account id; `field` names it in the error.
    ///
    /// # Errors
    /// [`ValueError::AccountId`] when the value is empty, longer than 32 characters, or
    /// holds whitespace or control characters.
    pub fn parse(field: &'static str, value: &str) -> Result<Self, ValueError> {
        let len = value.chars().count();
        if len == 0 || len > 32 || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ValueError::AccountId { field });
        }
        Ok(Self(value.to_owned()))
    }

    /// Validates `value` as the id of an account to open, by the stricter rule of new ids:
    /// 1..=32 characters of ASCII letters, digits and `. _ : @ + -`, not starting with
    /// `issuance:` in any letter case. No two ids may then look alike: there is no
    /// invisible, right-to-left, look-alike or full-width character to hide a difference
    /// in, and letter case is the one difference left, which the database's uniqueness
    /// ignores (`accounts_id_folded`). Ids opened before the rule keep working: every other
    /// use of an id takes [`AccountId::parse`].
    ///
    /// # Errors
    /// [`ValueError::NewAccountId`] when the value breaks the rule.
    pub fn parse_new(field: &'static str, value: &str) -> Result<Self, ValueError> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "._:@+-".contains(c);
        let reserved = value.get(..ISSUANCE_PREFIX.len()).is_some_and(|p| p.eq_ignore_ascii_case(ISSUANCE_PREFIX));
        if value.is_empty() || value.len() > 32 || !value.chars().all(allowed) || reserved {
            return Err(ValueError::NewAccountId { field });
        }
        Ok(Self(value.to_owned()))
    }

    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    #[must_use]
    pub fn into_inner(self) -> String {
        self.0
    }
}

/// The prefix of the issuance accounts' ids (`issuance:BRL`), reserved in any letter case.
pub const ISSUANCE_PREFIX: &str = "issuance:";

impl fmt::Display for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An ISO 4217 style currency code: exactly 3 ASCII uppercase letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Currency([u8; 3]);

impl Currency {
    /// Validates `value` as a currency code; `field` names it in the error.
    ///
    /// # Errors
    /// [`ValueError::Currency`] unless the value is exactly 3 ASCII uppercase letters.
    pub fn parse(field: &'static str, value: &str) -> Result<Self, ValueError> {
        match value.as_bytes() {
            [a, b, c] if [a, b, c].iter().all(|x| x.is_ascii_uppercase()) => Ok(Self([*a, *b, *c])),
            _ => Err(ValueError::Currency { field }),
        }
    }

    #[must_use]
    pub fn as_str(&self) -> &str {
        // The bytes are ASCII uppercase letters by construction.
        std::str::from_utf8(&self.0).unwrap_or("???")
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// ISO 4217's active currency codes, sorted: national currencies, the funds codes and the
/// precious metals and supranational units (`XAU`, `XDR`, ...), without the codes for
/// testing (`XTS`) and for no currency (`XXX`), and without those withdrawn (`HRK`,
/// `CUC`, `SLL`, `ZWL`, `ANG` for `XCG`, `BGN` for the euro in 2026).
/// `ledger.extra_currencies` accepts others.
pub const ISO_4217_ACTIVE: &[&str] = &[
    "AED", "AFN", "ALL", "AMD", "AOA", "ARS", "AUD", "AWG", "AZN", "BAM", "BBD", "BDT", "BHD", "BIF", "BMD", "BND",
    "BOB", "BOV", "BRL", "BSD", "BTN", "BWP", "BYN", "BZD", "CAD", "CDF", "CHE", "CHF", "CHW", "CLF", "CLP", "CNY",
    "COP", "COU", "CRC", "CUP", "CVE", "CZK", "DJF", "DKK", "DOP", "DZD", "EGP", "ERN", "ETB", "EUR", "FJD", "FKP",
    "GBP", "GEL", "GHS", "GIP", "GMD", "GNF", "GTQ", "GYD", "HKD", "HNL", "HTG", "HUF", "IDR", "ILS", "INR", "IQD",
    "IRR", "ISK", "JMD", "JOD", "JPY", "KES", "KGS", "KHR", "KMF", "KPW", "KRW", "KWD", "KYD", "KZT", "LAK", "LBP",
    "LKR", "LRD", "LSL", "LYD", "MAD", "MDL", "MGA", "MKD", "MMK", "MNT", "MOP", "MRU", "MUR", "MVR", "MWK", "MXN",
    "MXV", "MYR", "MZN", "NAD", "NGN", "NIO", "NOK", "NPR", "NZD", "OMR", "PAB", "PEN", "PGK", "PHP", "PKR", "PLN",
    "PYG", "QAR", "RON", "RSD", "RUB", "RWF", "SAR", "SBD", "SCR", "SDG", "SEK", "SGD", "SHP", "SLE", "SOS", "SRD",
    "SSP", "STN", "SVC", "SYP", "SZL", "THB", "TJS", "TMT", "TND", "TOP", "TRY", "TTD", "TWD", "TZS", "UAH", "UGX",
    "USD", "USN", "UYI", "UYU", "UYW", "UZS", "VED", "VES", "VND", "VUV", "WST", "XAF", "XAG", "XAU", "XBA", "XBB",
    "XBC", "XBD", "XCD", "XCG", "XDR", "XOF", "XPD", "XPF", "XPT", "XSU", "XUA", "YER", "ZAR", "ZMW", "ZWG",
];

impl Currency {
    /// Whether this is one of [`ISO_4217_ACTIVE`].
    #[must_use]
    pub fn is_iso_4217_active(self) -> bool {
        ISO_4217_ACTIVE.binary_search(&self.as_str()).is_ok()
    }
}

/// Validates a JSON number as a positive amount of cents that fits in an `i64`.
///
/// # Errors
/// [`ValueError::Amount`] for zero, negative, fractional or out-of-range numbers.
pub fn parse_amount(field: &'static str, value: &serde_json::Number) -> Result<i64, ValueError> {
    match value.as_i64() {
        Some(n) if n > 0 => Ok(n),
        _ => Err(ValueError::Amount { field }),
    }
}

/// Validates free text such as an order's external reference: 1..=`max` characters (as
/// PostgreSQL's `VARCHAR(max)` counts them), not blank, no control characters.
///
/// # Errors
/// [`ValueError::Text`] when the value is empty, blank, too long, or holds a control
/// character.
pub fn parse_text(field: &'static str, value: &str, max: usize) -> Result<String, ValueError> {
    let len = value.chars().count();
    if len == 0 || len > max || value.trim().is_empty() || value.chars().any(char::is_control) {
        return Err(ValueError::Text { field, max });
    }
    Ok(value.to_owned())
}

/// Validates a JSON document kept as it is, such as an order's `lines`: no string and no
/// object key anywhere in it may hold U+0000, which PostgreSQL's `text` and `jsonb` refuse,
/// and no number may be one that `jsonb` gives back as a decimal too long to read.
/// (The string fields of a body meet the rule through their own: no control characters.)
///
/// # Errors
/// [`ValueError::Nul`] naming the first string or key that holds U+0000, by its path from
/// `field`: `lines[0].sku`, `a key of lines[0]`.
pub fn check_json_text(field: &'static str, value: &serde_json::Value) -> Result<(), ValueError> {
    let Some((flaw, mut path)) = flaw_in(value) else { return Ok(()) };
    path.reverse();
    let key = matches!(path.last(), Some(Step::Key));
    let mut at = field.to_owned();
    for step in path {
        match step {
            Step::Index(i) => at.push_str(&format!("[{i}]")),
            Step::Field(name) if !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                at.push('.');
                at.push_str(name);
            }
            Step::Field(name) => at.push_str(&format!("[{}]", serde_json::Value::from(name))),
            Step::Key => {}
        }
    }
    Err(match flaw {
        Flaw::Nul => ValueError::Nul { at: if key { format!("a key of {at}") } else { at } },
        Flaw::Number => ValueError::Number { at },
    })
}

/// What [`check_json_text`] refuses.
enum Flaw {
    Nul,
    Number,
}

/// The text PostgreSQL's `jsonb` gives back for number `n`: its exact decimal, never with
/// an exponent (`1e308` comes back as 1 and 308 zeros).
fn numeric_text(n: &serde_json::Number) -> String {
    let text = n.to_string();
    let (mantissa, exponent) = match text.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i64>().unwrap_or(0)),
        None => (text.as_str(), 0),
    };
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let point = i64::try_from(int.len()).unwrap_or(0) + exponent;
    let zeros = |n: i64| "0".repeat(usize::try_from(n).unwrap_or(0));
    let len = i64::try_from(digits.len()).unwrap_or(0);
    let body = if point <= 0 {
        format!("0.{}{digits}", zeros(-point))
    } else if point >= len {
        format!("{digits}{}", zeros(point - len))
    } else {
        let (a, b) = digits.split_at(usize::try_from(point).unwrap_or(0));
        format!("{a}.{b}")
    };
    format!("{sign}{body}")
}

/// One step of the path to a U+0000 in a JSON document.
enum Step<'a> {
    Index(usize),
    Field(&'a str),
    /// The object's key itself holds it.
    Key,
}

/// The first U+0000 in `value`, or number that could not be read back from `jsonb`, with
/// its path, innermost step first. Recursion is bounded by the nesting that `serde_json`
/// parses (128 levels).
fn flaw_in(value: &serde_json::Value) -> Option<(Flaw, Vec<Step<'_>>)> {
    use serde_json::Value;
    match value {
        Value::String(s) => s.contains('\0').then(|| (Flaw::Nul, Vec::new())),
        Value::Number(n) => {
            serde_json::from_str::<Value>(&numeric_text(n)).is_err().then(|| (Flaw::Number, Vec::new()))
        }
        Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
            flaw_in(item).map(|(flaw, mut path)| {
                path.push(Step::Index(i));
                (flaw, path)
            })
        }),
        Value::Object(fields) => fields.iter().find_map(|(name, item)| {
            if name.contains('\0') {
                return Some((Flaw::Nul, vec![Step::Key]));
            }
            flaw_in(item).map(|(flaw, mut path)| {
                path.push(Step::Field(name));
                (flaw, path)
            })
        }),
        Value::Null | Value::Bool(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_account_ids_have_no_look_alikes() {
        for ok in ["acc-alice", "A", "x".repeat(32).as_str(), "shop:1.2_3@eu+x", "Issuance-BRL", "issuance"] {
            assert!(AccountId::parse_new("id", ok).is_ok(), "{ok:?} refused");
        }
        for bad in [
            "",
            &"x".repeat(33),
            "acc\u{200b}-alice", // a zero-width space
            "acc-alice\u{200f}", // a right-to-left mark
            "\u{410}CC-1",       // a Cyrillic A
            "\u{ff21}CC-1",      // a full-width A
            "caf\u{e9}",         // any letter beyond ASCII
            "acc alice",
            "acc/alice",
            "issuance:BRL",
            "Issuance:BRL",
            "ISSUANCE:brl",
        ] {
            let refused = AccountId::parse_new("id", bad).expect_err(&format!("{bad:?} accepted"));
            assert!(refused.to_string().starts_with("id must be 1 to 32 characters"), "{refused}");
        }
        // Ids opened before the rule keep working everywhere else.
        assert!(AccountId::parse("sourceAccount", "caf\u{e9}").is_ok());
    }

    #[test]
    fn currencies_are_iso_4217_active_codes() {
        assert!(ISO_4217_ACTIVE.windows(2).all(|w| w[0] < w[1]), "sorted, for the binary search");
        assert!(ISO_4217_ACTIVE.iter().all(|c| Currency::parse("c", c).is_ok()));
        for active in ["BRL", "USD", "EUR", "JPY", "XAU", "ZWG", "AED"] {
            assert!(Currency::parse("c", active).expect("well formed").is_iso_4217_active(), "{active}");
        }
        for other in ["ZZZ", "XTS", "XXX", "HRK", "ABC"] {
            assert!(!Currency::parse("c", other).expect("well formed").is_iso_4217_active(), "{other}");
        }
    }

    #[test]
    fn json_text_refuses_nul_anywhere_and_names_it() {
        let check = |v: serde_json::Value| check_json_text("lines", &v).map_err(|e| e.to_string());
        assert_eq!(check(serde_json::json!([{"sku": "A", "qty": 1, "tags": ["x", null, true, 1.5]}])), Ok(()));
        assert_eq!(check(serde_json::json!([])), Ok(()));
        for (bad, at) in [
            (serde_json::json!(["\u{0}"]), "lines[0] must"),
            (serde_json::json!([{"sku": "A\u{0}"}]), "lines[0].sku must"),
            (serde_json::json!([{"ok": 1}, {"parts": [{"tags": ["x", "\u{0}"]}]}]), "lines[1].parts[0].tags[1] must"),
            (serde_json::json!([{"a b": "\u{0}"}]), "lines[0][\"a b\"] must"),
            (serde_json::json!([{"sku": "A", "no\u{0}te": "x"}]), "a key of lines[0] must"),
            (serde_json::json!("\u{0}"), "lines must"),
        ] {
            let refused = check(bad.clone()).expect_err(&format!("{bad} accepted"));
            assert!(refused.starts_with(at), "{bad}: {refused}");
        }
    }

    #[test]
    fn json_text_refuses_numbers_that_jsonb_would_give_back_unreadable() {
        let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        for (number, back) in [
            ("1e308", format!("1{}", "0".repeat(308))),
            ("-1.5e-7", "-0.00000015".to_owned()),
            ("1250", "1250".to_owned()),
            ("12.5", "12.5".to_owned()),
            ("1.25e2", "125.0".to_owned()),
        ] {
            let serde_json::Value::Number(n) = json(number) else { panic!("{number}") };
            assert_eq!(numeric_text(&n), back, "{number}");
        }
        let check = |v: serde_json::Value| check_json_text("lines", &v).map_err(|e| e.to_string());
        assert_eq!(check(json("[1e308, -1e-300, 1.5, 9223372036854775807]")), Ok(()));
        let refused = check(json(r#"[{"x": -1.7976931348623157e308}]"#)).expect_err("read back as too large");
        assert!(refused.starts_with("lines[0].x is a number too large"), "{refused}");
    }

    #[test]
    fn account_id_bounds() {
        assert!(AccountId::parse("id", "CC-001").is_ok());
        assert!(AccountId::parse("id", &"a".repeat(32)).is_ok());
        assert!(AccountId::parse("id", &"a".repeat(33)).is_err());
        assert!(AccountId::parse("id", "").is_err());
        assert!(AccountId::parse("id", "a b").is_err());
        assert!(AccountId::parse("id", "a\u{0}").is_err());
    }

    #[test]
    fn currency_is_three_uppercase_letters() {
        assert_eq!(Currency::parse("c", "BRL").map(|c| c.to_string()), Ok("BRL".into()));
        for bad in ["brl", "BR", "BRLX", "B1L", "", "ÄBC"] {
            assert!(Currency::parse("c", bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn amount_must_be_positive_i64() {
        let n = |s: &str| serde_json::from_str::<serde_json::Number>(s).map_err(|e| e.to_string());
        assert_eq!(parse_amount("a", &n("1").unwrap()), Ok(1));
        assert_eq!(parse_amount("a", &n("9223372036854775807").unwrap()), Ok(i64::MAX));
        for bad in ["0", "-5", "1.5", "9223372036854775808", "1e3"] {
            assert!(parse_amount("a", &n(bad).unwrap()).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn text_bounds() {
        assert_eq!(parse_text("t", "ORD-1 x", 8), Ok("ORD-1 x".to_owned()));
        assert!(parse_text("t", &"é".repeat(8), 8).is_ok(), "characters, not bytes");
        for bad in ["", "   ", "123456789", "a\nb", "a\u{7}"] {
            assert!(parse_text("t", bad, 8).is_err(), "{bad:?} accepted");
        }
    }
}

/// Whether `v` is a W3C `traceparent` of version 00 (55 characters, lower-case hex, trace
/// and span ids not all zero). Anything else is ignored where a traceparent is stored.
#[must_use]
pub fn is_valid_traceparent(v: &str) -> bool {
    let parts: Vec<&str> = v.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    parts.len() == 4
        && parts[0] == "00"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|b| b != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|b| b != b'0')
        && hex(parts[3], 2)
}

#[cfg(test)]
mod traceparent_tests {
    use super::is_valid_traceparent;

    #[test]
    fn traceparent_validation() {
        assert!(is_valid_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        assert!(!is_valid_traceparent("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"));
        assert!(!is_valid_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01"));
        assert!(!is_valid_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"));
        assert!(!is_valid_traceparent("garbage"));
    }
}
