//! RFC 8785 JSON Canonicalization Scheme (JCS), and a strict I-JSON parser.
//!
//! [`to_vec`] writes a [`Value`] in canonical form: no whitespace, object
//! members sorted by their names' UTF-16 code units, strings with only the
//! escapes RFC 8785 §3.2.2.2 requires, numbers formatted as ECMAScript's
//! `Number.prototype.toString` does ([`format_f64`]).
//!
//! One rule is stricter than the RFC, and it is the ledger's: a number whose
//! canonical form is an integer of magnitude above 2^53 is refused. Such a
//! number cannot survive a round trip through an IEEE double, and parsers that
//! keep integers exact (Python, Go's `json.Number`) would read a different
//! value than the one that was hashed. Integers that large must be written as
//! strings. [`parse`] refuses the same numbers, so what one side writes the
//! other reads, byte for byte.
//!
//! [`parse`] accepts only I-JSON (RFC 7493): no duplicate member names, no
//! lone surrogates, nesting at most [`MAX_DEPTH`] deep.

use std::cmp::Ordering;

use serde_json::{Map, Number, Value};
use thiserror::Error;

/// The deepest nesting of arrays and objects accepted, counting the outermost
/// container as 1.
pub const MAX_DEPTH: usize = 64;

/// 2^53: the largest magnitude up to which every integer is an IEEE double.
pub const MAX_SAFE_INTEGER: u64 = 1 << 53;

/// What went wrong while canonicalizing or parsing.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum JcsError {
    /// A value cannot be written in canonical form.
    #[error("cannot canonicalize {pointer}: {reason}")]
    Canonicalize {
        /// JSON pointer (RFC 6901) to the offending value; empty for the root.
        pointer: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Input is not strict I-JSON.
    #[error("byte {offset}: {reason}")]
    Parse {
        /// Offset of the offending byte in the input.
        offset: usize,
        /// What is wrong there.
        reason: String,
    },
}

/// Writes `value` in RFC 8785 canonical form.
pub fn to_vec(value: &Value) -> Result<Vec<u8>, JcsError> {
    let mut out = Vec::with_capacity(128);
    write(value, &mut out)?;
    Ok(out)
}

/// Appends the canonical form of `value` to `out`. On error, `out` holds a
/// partial serialization and must be discarded.
pub fn write(value: &Value, out: &mut Vec<u8>) -> Result<(), JcsError> {
    write_nested(value, out, 0)
}

/// Like [`write`], for a value nested `depth` containers deep in a document,
/// so that the depth limit counts the containers around it.
pub(crate) fn write_nested(value: &Value, out: &mut Vec<u8>, depth: usize) -> Result<(), JcsError> {
    write_value(value, out, depth).map_err(pointer_error)
}

/// Writes an object nested `depth` containers deep; see [`write_nested`].
pub(crate) fn write_map_nested(
    map: &Map<String, Value>,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), JcsError> {
    write_map(map, out, depth).map_err(pointer_error)
}

fn pointer_error((mut path, reason): WriteError) -> JcsError {
    path.reverse();
    let mut pointer = String::new();
    for segment in path {
        pointer.push('/');
        pointer.push_str(&segment.replace('~', "~0").replace('/', "~1"));
    }
    JcsError::Canonicalize { pointer, reason }
}

type WriteError = (Vec<String>, String);

fn write_value(value: &Value, out: &mut Vec<u8>, depth: usize) -> Result<(), WriteError> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out).map_err(|reason| (Vec::new(), reason))?,
        Value::String(s) => write_str(s, out),
        Value::Array(items) => {
            if depth + 1 > MAX_DEPTH {
                return Err((Vec::new(), too_deep()));
            }
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out, depth + 1).map_err(|(mut p, r)| {
                    p.push(i.to_string());
                    (p, r)
                })?;
            }
            out.push(b']');
        }
        Value::Object(map) => write_map(map, out, depth)?,
    }
    Ok(())
}

fn write_map(map: &Map<String, Value>, out: &mut Vec<u8>, depth: usize) -> Result<(), WriteError> {
    if depth + 1 > MAX_DEPTH {
        return Err((Vec::new(), too_deep()));
    }
    out.push(b'{');
    for (i, (key, item)) in sorted_members(map).into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(key, out);
        out.push(b':');
        write_value(item, out, depth + 1).map_err(|(mut p, r)| {
            p.push(key.clone());
            (p, r)
        })?;
    }
    out.push(b'}');
    Ok(())
}

fn too_deep() -> String {
    format!("nested more than {MAX_DEPTH} levels deep")
}

/// The members of `map` in RFC 8785 order: by the UTF-16 code units of their
/// names.
pub fn sorted_members(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut members: Vec<_> = map.iter().collect();
    members.sort_by(|a, b| cmp_utf16(a.0, b.0));
    members
}

/// Compares two strings by their UTF-16 code units, as RFC 8785 §3.2.3 sorts
/// member names. Differs from byte order only when a character at or above
/// U+E000 meets one above U+FFFF.
pub fn cmp_utf16(a: &str, b: &str) -> Ordering {
    if a.is_ascii() && b.is_ascii() {
        return a.as_bytes().cmp(b.as_bytes());
    }
    a.encode_utf16().cmp(b.encode_utf16())
}

/// Appends `s` as a canonical JSON string: only `"`, `\` and control
/// characters are escaped, with the short forms where JSON has them.
pub fn write_str(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0a => b"\\n",
            0x0c => b"\\f",
            0x0d => b"\\r",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

fn write_number(n: &Number, out: &mut Vec<u8>) -> Result<(), String> {
    if let Some(u) = n.as_u64() {
        check_safe_integer(u, false)?;
        out.extend_from_slice(u.to_string().as_bytes());
    } else if let Some(i) = n.as_i64() {
        check_safe_integer(i.unsigned_abs(), i < 0)?;
        out.extend_from_slice(i.to_string().as_bytes());
    } else {
        let f = n
            .as_f64()
            .ok_or_else(|| "number is not finite".to_owned())?;
        let text = format_f64(f).map_err(|e| e.to_owned())?;
        if !text.contains(['.', 'e']) && f.abs() > MAX_SAFE_INTEGER as f64 {
            return Err(big_integer(&text));
        }
        out.extend_from_slice(text.as_bytes());
    }
    Ok(())
}

fn check_safe_integer(magnitude: u64, negative: bool) -> Result<(), String> {
    if magnitude > MAX_SAFE_INTEGER {
        let sign = if negative { "-" } else { "" };
        return Err(big_integer(&format!("{sign}{magnitude}")));
    }
    Ok(())
}

fn big_integer(text: &str) -> String {
    format!("integer {text} is above 2^53 in magnitude; write it as a string")
}

/// Formats a double as ECMAScript's `Number.prototype.toString` does, which
/// is RFC 8785's number serialization: the shortest digits that round-trip,
/// plain notation for magnitudes in [1e-6, 1e21), exponent notation outside.
pub fn format_f64(f: f64) -> Result<String, &'static str> {
    if !f.is_finite() {
        return Err("NaN and infinities have no JSON form");
    }
    if f == 0.0 {
        return Ok("0".to_owned());
    }
    // `{:e}` gives the shortest round-tripping digits: "d.ddde-7", "de23".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').ok_or("unexpected float format")?;
    let exp: i32 = exp.parse().map_err(|_| "unexpected float format")?;
    let mut digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    round_half_even(f.abs(), &mut digits, exp);
    let k = i32::try_from(digits.len()).map_err(|_| "unexpected float format")?;
    let n = exp + 1; // value = 0.digits × 10^n
    let mut s = String::with_capacity(32);
    if f < 0.0 {
        s.push('-');
    }
    if k <= n && n <= 21 {
        s.push_str(&digits);
        s.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(n as usize);
        s.push_str(int);
        s.push('.');
        s.push_str(frac);
    } else if -6 < n && n <= 0 {
        s.push_str("0.");
        s.extend(std::iter::repeat_n('0', (-n) as usize));
        s.push_str(&digits);
    } else {
        let (first, rest) = digits.split_at(1);
        s.push_str(first);
        if !rest.is_empty() {
            s.push('.');
            s.push_str(rest);
        }
        s.push('e');
        s.push(if n - 1 < 0 { '-' } else { '+' });
        s.push_str(&(n - 1).unsigned_abs().to_string());
    }
    Ok(s)
}

/// ECMAScript breaks a tie between two shortest digit strings that are
/// equally close to the value by choosing the even one; Rust's shortest
/// formatting may choose the odd one (0x43143ff3c1cb0959 is exactly
/// 1424953923781206.25: Rust prints …06.3, ECMAScript …06.2). Only an odd
/// last digit can be wrong, and only when the value is exactly halfway.
fn round_half_even(f: f64, digits: &mut String, exp: i32) {
    // Below 16 digits no two decimals share a double (10^15 < 2^53), so no
    // neighbour round-trips and there is no tie to break.
    if digits.len() < 16 {
        return;
    }
    let Some(last) = digits.bytes().last().map(|b| b - b'0') else {
        return;
    };
    if last % 2 == 0 {
        return;
    }
    for even in [last - 1, last + 1] {
        if even > 9 {
            continue;
        }
        let mut candidate = digits[..digits.len() - 1].to_owned();
        candidate.push(char::from(b'0' + even));
        let sci = |d: &str| format!("{}.{}e{exp}", &d[..1], &d[1..]);
        if sci(&candidate).parse::<f64>() != Ok(f) {
            continue;
        }
        // Both round-trip: a tie only if f is exactly the midpoint, whose
        // digits are the smaller candidate followed by a 5. The exact
        // expansion of a double has at most 767 significant digits.
        let low = if even < last { &candidate } else { &*digits };
        let exact = format!("{f:.800e}");
        let Some((mantissa, e)) = exact.split_once('e') else {
            return;
        };
        let exact_digits: String = mantissa.chars().filter(|c| *c != '.').collect();
        let midpoint = format!("{low}5");
        if e.parse() == Ok(exp)
            && exact_digits.starts_with(&midpoint)
            && exact_digits[midpoint.len()..].bytes().all(|b| b == b'0')
        {
            *digits = candidate;
        }
        return;
    }
}

/// Parses strict I-JSON into a [`Value`]: one value, optionally surrounded by
/// JSON whitespace, with no duplicate member names, no lone surrogates, no
/// integer above 2^53 in magnitude and nesting at most [`MAX_DEPTH`] deep.
pub fn parse(input: &[u8]) -> Result<Value, JcsError> {
    parse_inner(input, false)
}

/// Like [`parse`], but an integer above 2^53 in magnitude becomes the string
/// of its digits instead of an error: lossless, and what the ledger stores
/// for such integers. For reading user input, never for verification.
pub fn parse_big_integers_as_strings(input: &[u8]) -> Result<Value, JcsError> {
    parse_inner(input, true)
}

fn parse_inner(input: &[u8], big_as_strings: bool) -> Result<Value, JcsError> {
    let mut p = Parser {
        input,
        pos: 0,
        big_as_strings,
    };
    p.skip_ws();
    let value = p.value(0)?;
    p.skip_ws();
    if p.pos != input.len() {
        return Err(p.error("unexpected data after the JSON value"));
    }
    Ok(value)
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
    big_as_strings: bool,
}

impl Parser<'_> {
    fn error(&self, reason: impl Into<String>) -> JcsError {
        JcsError::Parse {
            offset: self.pos,
            reason: reason.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), JcsError> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.unexpected(&format!("'{}'", char::from(byte))))
        }
    }

    fn unexpected(&self, wanted: &str) -> JcsError {
        match self.peek() {
            None => self.error(format!("unexpected end of input, expected {wanted}")),
            Some(b) if b.is_ascii_graphic() => {
                self.error(format!("unexpected '{}', expected {wanted}", char::from(b)))
            }
            Some(b) => self.error(format!("unexpected byte 0x{b:02x}, expected {wanted}")),
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, JcsError> {
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            _ => Err(self.unexpected("a JSON value")),
        }
    }

    fn literal(&mut self, word: &str, value: Value) -> Result<Value, JcsError> {
        if self.input[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(self.unexpected("a JSON value"))
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, JcsError> {
        if depth > MAX_DEPTH {
            return Err(self.error(too_deep()));
        }
        self.pos += 1;
        let mut map = Map::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(map));
        }
        loop {
            self.skip_ws();
            let key_at = self.pos;
            if self.peek() != Some(b'"') {
                return Err(self.unexpected("a member name"));
            }
            let key = self.string()?;
            self.skip_ws();
            self.expect(b':')?;
            self.skip_ws();
            let value = self.value(depth)?;
            if map.contains_key(&key) {
                return Err(JcsError::Parse {
                    offset: key_at,
                    reason: format!("duplicate member name {key:?}"),
                });
            }
            map.insert(key, value);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(map));
                }
                _ => return Err(self.unexpected("',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, JcsError> {
        if depth > MAX_DEPTH {
            return Err(self.error(too_deep()));
        }
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.unexpected("',' or ']'")),
            }
        }
    }

    fn string(&mut self) -> Result<String, JcsError> {
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            let start = self.pos;
            let rest = &self.input[start..];
            let Some(stop) = rest
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
            else {
                self.pos = self.input.len();
                return Err(self.error("unterminated string"));
            };
            let chunk = std::str::from_utf8(&rest[..stop]).map_err(|e| JcsError::Parse {
                offset: start + e.valid_up_to(),
                reason: "invalid UTF-8 in string".to_owned(),
            })?;
            out.push_str(chunk);
            self.pos = start + stop;
            match self.input[self.pos] {
                b'"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                b'\\' => out.push(self.escape()?),
                b => {
                    return Err(
                        self.error(format!("control character 0x{b:02x} in string (escape it)"))
                    );
                }
            }
        }
    }

    fn escape(&mut self) -> Result<char, JcsError> {
        self.pos += 1; // backslash
        let Some(b) = self.peek() else {
            return Err(self.error("unterminated escape"));
        };
        self.pos += 1;
        Ok(match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let at = self.pos - 2;
                let first = self.hex4()?;
                let code = if (0xd800..0xdc00).contains(&first) {
                    if !self.input[self.pos..].starts_with(b"\\u") {
                        return Err(JcsError::Parse {
                            offset: at,
                            reason: "lone surrogate in string".to_owned(),
                        });
                    }
                    self.pos += 2;
                    let second = self.hex4()?;
                    if !(0xdc00..0xe000).contains(&second) {
                        return Err(JcsError::Parse {
                            offset: at,
                            reason: "lone surrogate in string".to_owned(),
                        });
                    }
                    0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
                } else if (0xdc00..0xe000).contains(&first) {
                    return Err(JcsError::Parse {
                        offset: at,
                        reason: "lone surrogate in string".to_owned(),
                    });
                } else {
                    first
                };
                char::from_u32(code).ok_or_else(|| self.error("invalid \\u escape"))?
            }
            _ => {
                self.pos -= 1;
                return Err(self.error("invalid escape in string"));
            }
        })
    }

    fn hex4(&mut self) -> Result<u32, JcsError> {
        let digits = self
            .input
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.error("truncated \\u escape"))?;
        let mut v = 0u32;
        for &d in digits {
            let nibble = char::from(d)
                .to_digit(16)
                .ok_or_else(|| self.error("invalid hex digit in \\u escape"))?;
            v = v * 16 + nibble;
        }
        self.pos += 4;
        Ok(v)
    }

    fn number(&mut self) -> Result<Value, JcsError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.unexpected("a digit")),
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.pos += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.unexpected("a digit"));
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            integer = false;
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.unexpected("a digit"));
            }
            self.digits();
        }
        // Only ASCII digits, signs, '.', 'e' and 'E' were consumed.
        let text = std::str::from_utf8(&self.input[start..self.pos]).unwrap_or_default();
        let error = |reason: String| JcsError::Parse {
            offset: start,
            reason,
        };
        if integer {
            let magnitude = text.trim_start_matches('-');
            match magnitude.parse::<u64>() {
                Ok(m) if m <= MAX_SAFE_INTEGER => {
                    if text.starts_with('-') {
                        // m ≤ 2^53, so the negation fits.
                        Ok(Value::Number(Number::from(-(m as i64))))
                    } else {
                        Ok(Value::Number(Number::from(m)))
                    }
                }
                _ if self.big_as_strings => Ok(Value::String(text.to_owned())),
                _ => Err(error(big_integer(text))),
            }
        } else {
            let f: f64 = text
                .parse()
                .map_err(|_| error(format!("invalid number {text}")))?;
            let n = Number::from_f64(f)
                .ok_or_else(|| error(format!("number {text} is out of range")))?;
            Ok(Value::Number(n))
        }
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(input: &str) -> String {
        String::from_utf8(to_vec(&parse(input.as_bytes()).unwrap()).unwrap()).unwrap()
    }

    #[test]
    fn rfc8785_section_3_2_2_example() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        assert_eq!(
            canon(input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn rfc8785_section_3_2_3_sorting_example() {
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let keys: Vec<String> = match parse(input.as_bytes()).unwrap() {
            Value::Object(map) => sorted_members(&map)
                .into_iter()
                .map(|(k, _)| k.clone())
                .collect(),
            _ => unreachable!(),
        };
        assert_eq!(
            keys,
            [
                "\r",
                "1",
                "\u{80}",
                "\u{f6}",
                "\u{20ac}",
                "\u{1f600}",
                "\u{fb33}"
            ]
        );
        assert!(canon(input).starts_with(r#"{"\r":"Carriage Return","1":"One","#));
    }

    #[test]
    fn rfc8785_appendix_b_numbers() {
        let table = [
            (0x0000000000000000_u64, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for (bits, want) in table {
            assert_eq!(
                format_f64(f64::from_bits(bits)).unwrap(),
                want,
                "{bits:016x}"
            );
        }
        assert!(format_f64(f64::from_bits(0x7fffffffffffffff)).is_err());
        assert!(format_f64(f64::from_bits(0x7ff0000000000000)).is_err());
    }

    #[test]
    fn rfc8785_appendix_b_round_trip_through_parse() {
        // Every finite Appendix B value that is not an integer above 2^53
        // survives parse → canonicalize unchanged.
        for text in [
            "5e-324",
            "1.7976931348623157e+308",
            "9007199254740992",
            "1e+23",
            "9.999999999999997e-7",
            "0.000001",
            "333333333.33333325",
            "1424953923781206.2",
            "-0.0000033333333333333333",
        ] {
            assert_eq!(canon(text), text);
        }
    }

    #[test]
    fn strings_escape_only_what_rfc8785_requires() {
        let mut out = Vec::new();
        write_str(
            "a\"b\\c\u{1}\u{8}\t\n\u{c}\r\u{1f}\u{7f}/\u{2028}é😀",
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\"a\\\"b\\\\c\\u0001\\b\\t\\n\\f\\r\\u001f\u{7f}/\u{2028}é😀\""
        );
    }

    #[test]
    fn utf16_order_differs_from_byte_order_above_the_bmp() {
        // U+1F600 is the surrogate pair D83D DE00 in UTF-16, and D83D < FB33,
        // so the emoji sorts first there, but last by code point (and bytes).
        assert_eq!(cmp_utf16("\u{1f600}", "\u{fb33}"), Ordering::Less);
        assert_eq!("\u{1f600}".cmp("\u{fb33}"), Ordering::Greater);
    }

    #[test]
    fn integers_above_2_pow_53_are_refused_both_ways() {
        assert!(parse(b"9007199254740992").is_ok());
        assert!(parse(b"-9007199254740992").is_ok());
        for text in [
            "9007199254740993",
            "-9007199254740993",
            "18446744073709551616",
            "100000000000000000000000000000",
        ] {
            let err = parse(text.as_bytes()).unwrap_err();
            assert!(err.to_string().contains("write it as a string"), "{err}");
        }
        assert_eq!(
            parse_big_integers_as_strings(b"[-100000000000000000000000000001]").unwrap(),
            json!(["-100000000000000000000000000001"])
        );
        assert!(to_vec(&json!(9007199254740993_u64)).is_err());
        assert!(to_vec(&json!(-9007199254740993_i64)).is_err());
        // A double that prints as a plain integer above 2^53 is refused too …
        assert!(to_vec(&json!(1.5e20)).is_err());
        // … but one that prints in exponent form is not an integer token.
        assert_eq!(to_vec(&json!(1e21)).unwrap(), b"1e+21");
        assert_eq!(to_vec(&json!(1.0)).unwrap(), b"1");
    }

    #[test]
    fn duplicate_names_are_refused_even_when_spelled_differently() {
        let err = parse(br#"{"a":1,"\u0061":2}"#).unwrap_err();
        assert_eq!(
            err,
            JcsError::Parse {
                offset: 7,
                reason: "duplicate member name \"a\"".to_owned()
            }
        );
    }

    #[test]
    fn malformed_input_is_refused_with_an_offset() {
        let cases: &[(&[u8], usize)] = &[
            (b"", 0),
            (b"{", 1),
            (b"{\"a\" 1}", 5),
            (b"[1,]", 3),
            (b"01", 1),
            (b"1.", 2),
            (b"\"\\ud800\"", 1),
            (b"\"\\udc00x\"", 1),
            (b"\"a\x01\"", 2),
            (b"\"\xff\"", 1),
            (b"nul", 0),
            (b"1e999", 0),
            (b"{} x", 3),
            (b"\"\\x\"", 2),
        ];
        for &(input, offset) in cases {
            match parse(input) {
                Err(JcsError::Parse { offset: got, .. }) => {
                    assert_eq!(got, offset, "{:?}", String::from_utf8_lossy(input));
                }
                other => panic!("{:?} parsed as {other:?}", String::from_utf8_lossy(input)),
            }
        }
    }

    #[test]
    fn nesting_is_bounded_without_recursing_off_the_stack() {
        let deep = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(parse(deep.as_bytes()).is_ok());
        let deeper = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(
            parse(deeper.as_bytes())
                .unwrap_err()
                .to_string()
                .contains("nested")
        );
        let huge = "[".repeat(1_000_000);
        assert!(parse(huge.as_bytes()).is_err());
        let mut v = json!(0);
        for _ in 0..MAX_DEPTH + 1 {
            v = json!([v]);
        }
        assert!(to_vec(&v).is_err());
    }

    #[test]
    fn errors_point_at_the_offending_value() {
        let err = to_vec(&json!({"a": [1, {"b/c": 9007199254740993_u64}]})).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot canonicalize /a/1/b~1c: integer 9007199254740993 is above 2^53 in magnitude; \
             write it as a string"
        );
    }
}
