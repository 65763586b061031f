//! One ledger entry: its fields, its hash, and its line in `ledger.jsonl`.
//!
//! An entry is the JSON object `{seq, ts, kind, data, prev, hash}`. Its `hash`
//! is SHA-256 over the RFC 8785 canonical form of the object without `hash`;
//! its Merkle leaf is `SHA-256(0x00 ‖ canonical form with hash)`.
//!
//! cordon writes every line in canonical form. Since `hash` sorts between
//! `data` and `kind`, the canonical form without `hash` is the line with the
//! member `"hash":"…",` cut out, so [`check_line`] can hash the line's own
//! bytes once it has confirmed, in one pass and without allocating, that they
//! are exactly canonical. Any other line (another writer's key order,
//! whitespace, escapes) takes the slow path: a strict parse and a
//! re-canonicalization. Both paths accept and reject the same entries; the
//! property tests and a fuzz target hold them to it.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::jcs::{self, JcsError, MAX_DEPTH, MAX_SAFE_INTEGER};
use crate::merkle::{self, Hash};

/// The longest line accepted, newline excluded. A longer line is an error
/// naming it, never an allocation of its size.
pub const MAX_LINE: usize = 1 << 20;

/// `prev` of entry 0.
pub const ZERO_HASH: Hash = [0; 32];

/// Why a line is not a well-formed entry.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EntryError {
    /// The line is not strict I-JSON.
    #[error("not valid JSON: {0}")]
    Parse(#[source] JcsError),
    /// The line is JSON but not an entry.
    #[error("{0}")]
    Shape(String),
    /// The entry cannot be canonicalized (a number out of range).
    #[error("{0}")]
    Canonicalize(#[source] JcsError),
    /// The line is longer than [`MAX_LINE`].
    #[error("line is {len} bytes long; entries are at most {MAX_LINE} bytes")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// Data offered to [`Entry::new`] is not acceptable.
    #[error("{0}")]
    Data(String),
}

/// An entry, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Position in the ledger, from 0.
    pub seq: u64,
    /// RFC 3339 time the writer assigned (the writer's clock).
    pub ts: String,
    /// What happened, e.g. `run.start`.
    pub kind: String,
    /// Details.
    pub data: Map<String, Value>,
    /// Hash of the previous entry, zeros for entry 0.
    pub prev: Hash,
    /// Hash of this entry's canonical form without `hash`.
    pub hash: Hash,
}

/// What [`check_line`] learns from one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// The `seq` field.
    pub seq: u64,
    /// The `prev` field.
    pub prev: Hash,
    /// The `hash` field, as written.
    pub claimed: Hash,
    /// The hash of the entry's content, as computed.
    pub computed: Hash,
    /// The Merkle leaf hash of the entry.
    pub leaf: Hash,
}

impl Checked {
    /// Whether the content matches the written hash.
    pub fn hash_ok(&self) -> bool {
        self.claimed == self.computed
    }
}

/// Parses and hashes one line (without its newline).
pub fn check_line(line: &[u8]) -> Result<Checked, EntryError> {
    if line.len() > MAX_LINE {
        return Err(EntryError::TooLong { len: line.len() });
    }
    if let Some(fast) = scan_canonical(line) {
        let mut h = Sha256::new();
        h.update(&line[..fast.hash_member.0]);
        h.update(&line[fast.hash_member.1..]);
        return Ok(Checked {
            seq: fast.seq,
            prev: fast.prev,
            claimed: fast.claimed,
            computed: h.finalize().into(),
            leaf: merkle::leaf_hash(line),
        });
    }
    let entry = Entry::parse(line)?;
    let with_hash = entry.canonical(true)?;
    Ok(Checked {
        seq: entry.seq,
        prev: entry.prev,
        claimed: entry.hash,
        computed: Sha256::digest(entry.canonical(false)?).into(),
        leaf: merkle::leaf_hash(&with_hash),
    })
}

impl Entry {
    /// Parses a line (strict I-JSON, exactly the six fields, each of its
    /// type). Does not check the hash: see [`Entry::compute_hash`].
    pub fn parse(line: &[u8]) -> Result<Entry, EntryError> {
        if line.len() > MAX_LINE {
            return Err(EntryError::TooLong { len: line.len() });
        }
        let Value::Object(mut map) = jcs::parse(line).map_err(EntryError::Parse)? else {
            return Err(shape("an entry must be a JSON object"));
        };
        if let Some(unknown) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(shape(format!(
                "unknown field {unknown:?}; an entry has exactly seq, ts, kind, data, prev, hash"
            )));
        }
        let mut take = |name: &str| {
            map.remove(name)
                .ok_or_else(|| shape(format!("missing field {name:?}")))
        };
        let seq = match take("seq")? {
            Value::Number(n) => n.as_u64(),
            _ => None,
        }
        .ok_or_else(|| shape("seq must be a non-negative integer"))?;
        let Value::String(ts) = take("ts")? else {
            return Err(shape("ts must be a string"));
        };
        let Value::String(kind) = take("kind")? else {
            return Err(shape("kind must be a string"));
        };
        let Value::Object(data) = take("data")? else {
            return Err(shape("data must be an object"));
        };
        let prev = hex_field("prev", take("prev")?)?;
        let hash = hex_field("hash", take("hash")?)?;
        check_fields(&ts, &kind)?;
        Ok(Entry {
            seq,
            ts,
            kind,
            data,
            prev,
            hash,
        })
    }

    /// Makes entry `seq` following `prev`, stamping its hash. `data` must be
    /// an object; integers above 2^53 in it are stored as decimal strings
    /// (see [`normalize`]).
    pub fn new(
        seq: u64,
        ts: String,
        kind: String,
        data: Value,
        prev: Hash,
    ) -> Result<Entry, EntryError> {
        let Value::Object(data) = normalize(data) else {
            return Err(EntryError::Data("data must be a JSON object".to_owned()));
        };
        check_fields(&ts, &kind).map_err(|e| EntryError::Data(e.to_string()))?;
        let mut entry = Entry {
            seq,
            ts,
            kind,
            data,
            prev,
            hash: ZERO_HASH,
        };
        entry.hash = entry.compute_hash()?;
        Ok(entry)
    }

    /// SHA-256 of the canonical form without `hash`.
    pub fn compute_hash(&self) -> Result<Hash, EntryError> {
        Ok(Sha256::digest(self.canonical(false)?).into())
    }

    /// The Merkle leaf hash of this entry.
    pub fn leaf_hash(&self) -> Result<Hash, EntryError> {
        Ok(merkle::leaf_hash(&self.canonical(true)?))
    }

    /// The entry as a JSON object.
    pub fn to_value(&self, with_hash: bool) -> Value {
        let mut map = Map::new();
        map.insert("seq".into(), self.seq.into());
        map.insert("ts".into(), self.ts.clone().into());
        map.insert("kind".into(), self.kind.clone().into());
        map.insert("data".into(), Value::Object(self.data.clone()));
        map.insert("prev".into(), hex::encode(self.prev).into());
        if with_hash {
            map.insert("hash".into(), hex::encode(self.hash).into());
        }
        Value::Object(map)
    }

    /// The canonical form, with or without `hash`.
    pub fn canonical(&self, with_hash: bool) -> Result<Vec<u8>, EntryError> {
        let data = canonical_data(&self.data)?;
        let mut kind = Vec::with_capacity(self.kind.len() + 2);
        jcs::write_str(&self.kind, &mut kind);
        let mut ts = Vec::with_capacity(self.ts.len() + 2);
        jcs::write_str(&self.ts, &mut ts);
        let hash = with_hash.then_some(&self.hash);
        Ok(assemble(&data, hash, &kind, &self.prev, self.seq, &ts))
    }

    /// The line cordon writes: canonical form with `hash`, and a newline.
    pub fn to_line(&self) -> Result<Vec<u8>, EntryError> {
        let mut line = self.canonical(true)?;
        line.push(b'\n');
        Ok(line)
    }
}

/// The canonical form of an entry's `data`, nested one level inside the
/// entry as far as the depth limit is concerned.
pub(crate) fn canonical_data(data: &Map<String, Value>) -> Result<Vec<u8>, EntryError> {
    let mut out = Vec::with_capacity(64);
    jcs::write_map_nested(data, &mut out, 1).map_err(EntryError::Canonicalize)?;
    Ok(out)
}

const FIELDS: [&str; 6] = ["data", "hash", "kind", "prev", "seq", "ts"];

fn shape(msg: impl Into<String>) -> EntryError {
    EntryError::Shape(msg.into())
}

fn hex_field(name: &str, v: Value) -> Result<Hash, EntryError> {
    let bad = || shape(format!("{name} must be 64 lowercase hex digits"));
    let Value::String(s) = v else {
        return Err(bad());
    };
    parse_hex_hash(s.as_bytes()).ok_or_else(bad)
}

/// Decodes 64 lowercase hex digits.
pub fn parse_hex_hash(s: &[u8]) -> Option<Hash> {
    /// Lowercase hex digit values; 0xff for every other byte.
    const NIBBLE: [u8; 256] = {
        let mut t = [0xff; 256];
        let mut i: u8 = 0;
        while i < 10 {
            t[(b'0' + i) as usize] = i;
            i += 1;
        }
        let mut i: u8 = 0;
        while i < 6 {
            t[(b'a' + i) as usize] = 10 + i;
            i += 1;
        }
        t
    };
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    let mut bad = 0u8;
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        let (hi, lo) = (NIBBLE[usize::from(pair[0])], NIBBLE[usize::from(pair[1])]);
        bad |= hi | lo;
        *o = (hi << 4) | (lo & 0xf);
    }
    // Any invalid digit set the high bits.
    (bad & 0xf0 == 0).then_some(out)
}

/// The checks on `ts` and `kind` both parsing paths share.
fn check_fields(ts: &str, kind: &str) -> Result<(), EntryError> {
    if !is_rfc3339(ts) {
        return Err(shape(format!("ts {ts:?} is not an RFC 3339 date-time")));
    }
    if kind.is_empty() {
        return Err(shape("kind must not be empty"));
    }
    Ok(())
}

/// Writes the canonical bytes of an entry from pre-canonicalized parts.
/// `kind` and `ts` are canonical JSON strings (quotes included).
pub(crate) fn assemble(
    data: &[u8],
    hash: Option<&Hash>,
    kind: &[u8],
    prev: &Hash,
    seq: u64,
    ts: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + kind.len() + ts.len() + 200);
    out.extend_from_slice(b"{\"data\":");
    out.extend_from_slice(data);
    if let Some(hash) = hash {
        out.extend_from_slice(b",\"hash\":\"");
        out.extend_from_slice(hex::encode(hash).as_bytes());
        out.push(b'"');
    }
    out.extend_from_slice(b",\"kind\":");
    out.extend_from_slice(kind);
    out.extend_from_slice(b",\"prev\":\"");
    out.extend_from_slice(hex::encode(prev).as_bytes());
    out.extend_from_slice(b"\",\"seq\":");
    out.extend_from_slice(seq.to_string().as_bytes());
    out.extend_from_slice(b",\"ts\":");
    out.extend_from_slice(ts);
    out.push(b'}');
    out
}

/// Replaces every number whose canonical form would be an integer above 2^53
/// in magnitude by the decimal string of that integer: the ledger's rule, so
/// that a consumer that reads integers exactly sees what was hashed.
pub fn normalize(value: Value) -> Value {
    match value {
        Value::Number(n) => {
            let big = match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => u > MAX_SAFE_INTEGER,
                (None, Some(i), _) => i.unsigned_abs() > MAX_SAFE_INTEGER,
                (None, None, Some(f)) => f.abs() > MAX_SAFE_INTEGER as f64 && f.abs() < 1e21,
                _ => false,
            };
            if !big {
                Value::Number(n)
            } else if n.is_f64() {
                Value::String(jcs::format_f64(n.as_f64().unwrap_or_default()).unwrap_or_default())
            } else {
                Value::String(n.to_string())
            }
        }
        Value::Array(items) => Value::Array(items.into_iter().map(normalize).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, normalize(v))).collect())
        }
        other => other,
    }
}

/// Whether `s` is an RFC 3339 `date-time` (with any fraction of a second and
/// `Z` or a numeric offset).
pub fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| {
        b.get(r.clone())
            .filter(|d| d.iter().all(u8::is_ascii_digit))
            .map(|d| d.iter().fold(0u32, |a, &x| a * 10 + u32::from(x - b'0')))
    };
    let (Some(year), Some(month), Some(day), Some(hour), Some(min), Some(sec)) = (
        digits(0..4),
        digits(5..7),
        digits(8..10),
        digits(11..13),
        digits(14..16),
        digits(17..19),
    ) else {
        return false;
    };
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return false;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    if day == 0 || day > days || hour > 23 || min > 59 || sec > 60 {
        return false;
    }
    let mut i = 19;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    match b.get(i) {
        Some(b'Z' | b'z') => i + 1 == b.len(),
        Some(b'+' | b'-') => {
            let (Some(oh), Some(om)) = (digits(i + 1..i + 3), digits(i + 4..i + 6)) else {
                return false;
            };
            b.get(i + 3) == Some(&b':') && oh <= 23 && om <= 59 && i + 6 == b.len()
        }
        _ => false,
    }
}

/// The current UTC time as RFC 3339 with microseconds.
pub fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format_rfc3339(now.as_secs(), now.subsec_micros())
}

/// Formats seconds since the Unix epoch (UTC) and microseconds.
pub fn format_rfc3339(secs: u64, micros: u32) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// What the fast path learns from a canonical line.
struct Fast {
    seq: u64,
    prev: Hash,
    claimed: Hash,
    /// Byte range of `,"hash":"…"` to cut for the entry hash.
    hash_member: (usize, usize),
}

/// Recognizes a line that is exactly the canonical form of a well-formed
/// entry. `None` means "not that", never "bad": the caller falls back to the
/// strict parser, which decides.
fn scan_canonical(line: &[u8]) -> Option<Fast> {
    std::str::from_utf8(line).ok()?;
    let mut s = Scanner { b: line, pos: 0 };
    s.lit(b"{\"data\":")?;
    if s.peek()? != b'{' {
        return None;
    }
    s.value(2)?;
    let hash_start = s.pos;
    s.lit(b",\"hash\":\"")?;
    let claimed = parse_hex_hash(s.take(64)?)?;
    s.lit(b"\"")?;
    let hash_end = s.pos;
    s.lit(b",\"kind\":")?;
    let kind = s.string()?;
    s.lit(b",\"prev\":\"")?;
    let prev = parse_hex_hash(s.take(64)?)?;
    s.lit(b"\",\"seq\":")?;
    let seq_start = s.pos;
    s.number()?;
    let seq_text = &line[seq_start..s.pos];
    if seq_text.first() == Some(&b'-') || seq_text.contains(&b'.') || seq_text.contains(&b'e') {
        return None;
    }
    let seq: u64 = std::str::from_utf8(seq_text).ok()?.parse().ok()?;
    s.lit(b",\"ts\":")?;
    let ts = s.string()?;
    s.lit(b"}")?;
    if s.pos != line.len() {
        return None;
    }
    // Canonical ts and kind need no unescaping unless they contain a
    // backslash; such a ts is invalid anyway, and a kind with one is left to
    // the slow path.
    let ts = std::str::from_utf8(&ts[1..ts.len() - 1]).ok()?;
    let kind = std::str::from_utf8(&kind[1..kind.len() - 1]).ok()?;
    if kind.contains('\\') || check_fields(ts, kind).is_err() {
        return None;
    }
    Some(Fast {
        seq,
        prev,
        claimed,
        hash_member: (hash_start, hash_end),
    })
}

/// A validator for canonical JSON that allocates nothing.
struct Scanner<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    fn lit(&mut self, lit: &[u8]) -> Option<()> {
        if self.b[self.pos..].starts_with(lit) {
            self.pos += lit.len();
            Some(())
        } else {
            None
        }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.b.get(self.pos..self.pos + n)?;
        self.pos += n;
        Some(out)
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => {
                if depth > MAX_DEPTH {
                    return None;
                }
                self.pos += 1;
                if self.peek()? == b'}' {
                    self.pos += 1;
                    return Some(());
                }
                let mut last: Option<&[u8]> = None;
                loop {
                    let key = self.string()?;
                    if let Some(prev) = last
                        && key_order(prev, key)? != std::cmp::Ordering::Less
                    {
                        return None;
                    }
                    last = Some(key);
                    self.lit(b":")?;
                    self.value(depth + 1)?;
                    match self.peek()? {
                        b',' => self.pos += 1,
                        b'}' => {
                            self.pos += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b'[' => {
                if depth > MAX_DEPTH {
                    return None;
                }
                self.pos += 1;
                if self.peek()? == b']' {
                    self.pos += 1;
                    return Some(());
                }
                loop {
                    self.value(depth + 1)?;
                    match self.peek()? {
                        b',' => self.pos += 1,
                        b']' => {
                            self.pos += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b'"' => self.string().map(drop),
            b't' => self.lit(b"true"),
            b'f' => self.lit(b"false"),
            b'n' => self.lit(b"null"),
            _ => self.number(),
        }
    }

    /// A canonical string; returns it with its quotes.
    fn string(&mut self) -> Option<&'a [u8]> {
        let start = self.pos;
        if self.peek()? != b'"' {
            return None;
        }
        self.pos += 1;
        loop {
            // Strings in entries are short: a table lookup per byte beats
            // memchr's setup here.
            const STOP: [bool; 256] = {
                let mut t = [false; 256];
                let mut i = 0;
                while i < 0x20 {
                    t[i] = true;
                    i += 1;
                }
                t[b'"' as usize] = true;
                t[b'\\' as usize] = true;
                t
            };
            let rest = &self.b[self.pos..];
            let i = rest.iter().position(|&c| STOP[usize::from(c)])?;
            self.pos += i;
            match self.b[self.pos] {
                b'"' => {
                    self.pos += 1;
                    return Some(&self.b[start..self.pos]);
                }
                b'\\' => {
                    let esc = self.b.get(self.pos + 1)?;
                    self.pos += 2;
                    match esc {
                        b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                        b'u' => {
                            let hex = self.take(4)?;
                            // Only control characters without a short form.
                            if &hex[..2] != b"00" || !matches!(hex[2], b'0' | b'1') {
                                return None;
                            }
                            if !matches!(hex[3], b'0'..=b'9' | b'a'..=b'f') {
                                return None;
                            }
                            let c = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                            if matches!(c, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d) {
                                return None;
                            }
                        }
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
    }

    /// A canonical number: what [`jcs::format_f64`] would print, and not an
    /// integer above 2^53.
    fn number(&mut self) -> Option<()> {
        let start = self.pos;
        while let Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        let text = &self.b[start..self.pos];
        let digits = text.strip_prefix(b"-").unwrap_or(text);
        if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) {
            // An integer token: no leading zero, no "-0", at most 2^53.
            if (digits[0] == b'0' && (digits.len() > 1 || text.len() > 1)) || digits.len() > 16 {
                return None;
            }
            let v: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
            return (v <= MAX_SAFE_INTEGER).then_some(());
        }
        let text = std::str::from_utf8(text).ok()?;
        if !text.bytes().next()?.is_ascii_digit() && !text.starts_with('-') {
            return None;
        }
        // Rust's float grammar is looser than JSON's ("inf", "1.", ".5");
        // comparing with the canonical form rejects all of those.
        let f: f64 = text.parse().ok()?;
        (jcs::format_f64(f).ok()? == text).then_some(())
    }
}

/// Orders two canonical member names (with quotes) by UTF-16 code units.
fn key_order(a: &[u8], b: &[u8]) -> Option<std::cmp::Ordering> {
    let plain = |k: &[u8]| k.iter().all(|&c| c < 0x80 && c != b'\\');
    if plain(a) && plain(b) {
        return Some(a[1..a.len() - 1].cmp(&b[1..b.len() - 1]));
    }
    let decode = |k: &[u8]| match jcs::parse(k) {
        Ok(Value::String(s)) => Some(s),
        _ => None,
    };
    Some(jcs::cmp_utf16(&decode(a)?, &decode(b)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(seq: u64, data: Value) -> Entry {
        Entry::new(
            seq,
            "2026-01-02T03:04:05.000006Z".into(),
            "test".into(),
            data,
            ZERO_HASH,
        )
        .unwrap()
    }

    #[test]
    fn cordon_lines_take_the_fast_path_and_agree_with_the_slow_one() {
        let e = entry(
            7,
            json!({"b": [1, 2.5, "x\ny"], "a": {"é": null, "z": true}}),
        );
        let line = e.canonical(true).unwrap();
        assert!(scan_canonical(&line).is_some());
        let fast = check_line(&line).unwrap();
        assert!(fast.hash_ok());
        assert_eq!(fast.computed, e.hash);
        assert_eq!(fast.leaf, e.leaf_hash().unwrap());
        assert_eq!(Entry::parse(&line).unwrap(), e);
    }

    #[test]
    fn a_reordered_line_takes_the_slow_path_and_hashes_the_same() {
        let e = entry(3, json!({"k": "v"}));
        let mut v = e.to_value(true);
        let Value::Object(map) = &mut v else {
            unreachable!()
        };
        let reordered: String = format!(
            "{{ \"ts\": {}, \"seq\": 3, \"prev\": {}, \"kind\": \"test\", \"hash\": {}, \"data\": {{\"k\":\"v\"}} }}",
            map["ts"], map["prev"], map["hash"]
        );
        assert!(scan_canonical(reordered.as_bytes()).is_none());
        let slow = check_line(reordered.as_bytes()).unwrap();
        assert_eq!(slow, check_line(&e.canonical(true).unwrap()).unwrap());
    }

    #[test]
    fn an_edit_changes_the_computed_hash_on_both_paths() {
        let e = entry(1, json!({"amount": 100}));
        let line = String::from_utf8(e.canonical(true).unwrap()).unwrap();
        let edited = line.replace("100", "900");
        let c = check_line(edited.as_bytes()).unwrap();
        assert!(!c.hash_ok());
        let spaced = edited.replacen(':', ": ", 1);
        assert!(scan_canonical(spaced.as_bytes()).is_none());
        assert!(!check_line(spaced.as_bytes()).unwrap().hash_ok());
    }

    #[test]
    fn malformed_lines_say_what_is_wrong() {
        let e = entry(1, json!({}));
        let good = String::from_utf8(e.canonical(true).unwrap()).unwrap();
        let cases = [
            ("not json", "not valid JSON"),
            ("[1]", "must be a JSON object"),
            (
                &good.replace("\"kind\"", "\"kinds\""),
                "unknown field \"kinds\"",
            ),
            (
                &good.replace("\"seq\":1", "\"seq\":-1"),
                "seq must be a non-negative integer",
            ),
            (&good.replace("\"seq\":1", "\"seq\":\"1\""), "seq must be"),
            (
                &good.replace("\"data\":{}", "\"data\":[]"),
                "data must be an object",
            ),
            (
                &good.replace("2026-01-02", "2026-02-30"),
                "not an RFC 3339 date-time",
            ),
            (
                &good.replace("\"kind\":\"test\"", "\"kind\":\"\""),
                "kind must not be empty",
            ),
            (
                &good.replace(&"0".repeat(64), &"0".repeat(63)),
                "prev must be 64 lowercase hex",
            ),
            (
                &good.replace("{\"data\":{}", "{\"data\":{\"a\":1,\"a\":2}"),
                "duplicate member",
            ),
            (
                &good.replace("{\"data\":{}", "{\"data\":{\"n\":12345678901234567890}}"),
                "above 2^53",
            ),
        ];
        for (line, want) in cases {
            let err = check_line(line.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(want), "{line}: {err}");
        }
        let long = vec![b' '; MAX_LINE + 1];
        assert_eq!(
            check_line(&long).unwrap_err(),
            EntryError::TooLong { len: MAX_LINE + 1 }
        );
    }

    #[test]
    fn big_integers_in_data_are_stored_as_strings() {
        let e = entry(
            0,
            json!({"big": 9007199254740993_u64, "neg": -9007199254740993_i64,
            "f": 1.5e20, "ok": 9007199254740992_u64, "exp": 1e21}),
        );
        assert_eq!(e.data["big"], json!("9007199254740993"));
        assert_eq!(e.data["neg"], json!("-9007199254740993"));
        assert_eq!(e.data["f"], json!("150000000000000000000"));
        assert_eq!(e.data["ok"], json!(9007199254740992_u64));
        assert_eq!(e.data["exp"], json!(1e21));
        assert!(check_line(&e.canonical(true).unwrap()).unwrap().hash_ok());
    }

    #[test]
    fn rfc3339() {
        for ok in [
            "2026-11-29T12:35:23Z",
            "2024-02-29T00:00:00.5+01:00",
            "1999-12-31t23:59:60z",
        ] {
            assert!(is_rfc3339(ok), "{ok}");
        }
        for bad in [
            "2026-11-29",
            "2026-11-29 12:35:23Z",
            "2023-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-11-29T12:35:23",
            "2026-11-29T12:35:23.Z",
            "2026-11-29T12:35:23+0100",
            "2026-11-29T24:00:00Z",
            "２026-11-29T12:35:23Z",
        ] {
            assert!(!is_rfc3339(bad), "{bad}");
        }
        assert_eq!(format_rfc3339(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            format_rfc3339(951_782_400, 7),
            "2000-02-29T00:00:00.000007Z"
        );
        assert_eq!(
            format_rfc3339(1_798_761_599, 999_999),
            "2026-12-31T23:59:59.999999Z"
        );
        assert!(is_rfc3339(&now_rfc3339()));
    }

    #[test]
    fn noncanonical_number_and_string_spellings_fall_back() {
        for (good, other) in [
            ("1", "1.0"),
            ("0.5", "5e-1"),
            ("\"a\"", "\"\\u0061\""),
            ("\"/\"", "\"\\/\""),
            ("\"\\u001f\"", "\"\\u001F\""),
            ("\"\\n\"", "\"\\u000a\""),
        ] {
            let a = entry(
                0,
                json!({"v": serde_json::from_str::<Value>(good).unwrap()}),
            );
            let line = String::from_utf8(a.canonical(true).unwrap()).unwrap();
            assert!(scan_canonical(line.as_bytes()).is_some(), "{line}");
            let alt = line.replacen(&format!("\"v\":{good}"), &format!("\"v\":{other}"), 1);
            assert_ne!(alt, line);
            assert!(scan_canonical(alt.as_bytes()).is_none(), "{alt}");
            let c = check_line(alt.as_bytes()).unwrap();
            assert!(c.hash_ok(), "{alt}");
            assert_eq!(c.leaf, a.leaf_hash().unwrap());
        }
    }
}
