//! Verification of a ledger file: the hash chain, the sequence, and the
//! Merkle tree against a checkpoint, streamed line by line in constant
//! memory (one line buffer, the previous hash, an O(log n) Merkle frontier).
//!
//! The first damage found is named with its `seq` and its kind:
//! - `malformed`: a line that is not an entry (not JSON, wrong fields, too long);
//! - `edited`: an entry whose content does not match its hash, or whose hash
//!   was recomputed after an edit (the next entry's `prev` still names the
//!   original);
//! - `missing`: a gap in `seq` whose entries appear nowhere later;
//! - `reordered`: a gap whose entry does appear later;
//! - `inserted`: a second entry with a `seq` already seen;
//! - `truncated`: fewer entries than a checkpoint commits to;
//! - `checkpoint mismatch`: the entries do not hash to the checkpoint's root,
//!   or its signature does not verify.

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::checkpoint::{CheckpointError, SignedCheckpoint};
use crate::entry::{self, Checked, MAX_LINE, ZERO_HASH};
use crate::keys::VerifierKey;
use crate::merkle::{Frontier, Hash};

/// The kinds of damage verification names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DamageKind {
    /// A line that is not a well-formed entry.
    Malformed,
    /// Content that does not match its hash (or a re-hashed edit).
    Edited,
    /// Entries absent from the sequence.
    Missing,
    /// An extra entry.
    Inserted,
    /// Entries out of order.
    Reordered,
    /// Fewer entries than a checkpoint commits to.
    Truncated,
    /// The entries do not match a checkpoint.
    CheckpointMismatch,
}

impl DamageKind {
    /// The word the CLI prints.
    pub fn as_str(self) -> &'static str {
        match self {
            DamageKind::Malformed => "malformed",
            DamageKind::Edited => "edited",
            DamageKind::Missing => "missing",
            DamageKind::Inserted => "inserted",
            DamageKind::Reordered => "reordered",
            DamageKind::Truncated => "truncated",
            DamageKind::CheckpointMismatch => "checkpoint mismatch",
        }
    }
}

impl fmt::Display for DamageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The first damage found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// What kind.
    pub kind: DamageKind,
    /// The first bad `seq`, when one can be named.
    pub seq: Option<u64>,
    /// The 1-based line of the file where it was found, if any.
    pub line: Option<u64>,
    /// What exactly is wrong.
    pub detail: String,
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(seq) = self.seq {
            write!(f, "seq {seq} {}: {}", self.kind, self.detail)
        } else {
            write!(f, "{}: {}", self.kind, self.detail)
        }
    }
}

/// Verification could not be carried out (unusable input), as opposed to
/// finding damage.
#[derive(Debug, Error)]
pub enum ChainError {
    /// The ledger file cannot be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Reading the ledger failed midway.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A checkpoint file cannot be read or parsed.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A key was given but there is no checkpoint for it to check.
    #[error(
        "--key was given but there is no checkpoint to check: pass --checkpoint FILE or sign one with `cordon ledger checkpoint`"
    )]
    NoCheckpoint,
}

/// One line as the reader sees it.
#[derive(Debug)]
pub(crate) enum Line<'a> {
    /// A newline-terminated line (newline excluded).
    Full(&'a [u8]),
    /// A line longer than [`MAX_LINE`]; its bytes were skipped.
    TooLong(u64),
    /// Bytes after the last newline at end of file: an unfinished write.
    Torn(u64),
}

/// The buffer grows from [`FIRST_BUF`] to [`READ_BUF`] as input keeps
/// filling it, so a small ledger (or a fuzz input) does not pay for 4 MiB.
const READ_BUF: usize = 4 << 20;
const FIRST_BUF: usize = 64 << 10;

/// Splits a byte stream into lines of at most [`MAX_LINE`] bytes, holding at
/// most one buffer of memory whatever the input.
pub(crate) struct LineReader<R> {
    r: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    /// Bytes consumed, through the end of the last line returned.
    pub(crate) offset: u64,
}

impl<R: Read> LineReader<R> {
    pub(crate) fn new(r: R) -> Self {
        LineReader {
            r,
            buf: vec![0; FIRST_BUF],
            start: 0,
            end: 0,
            eof: false,
            offset: 0,
        }
    }

    fn fill(&mut self) -> io::Result<()> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() && self.buf.len() < READ_BUF {
            // Full even after compaction: a long line.
            self.buf.resize((self.buf.len() * 2).min(READ_BUF), 0);
        }
        while self.end < self.buf.len() {
            match self.r.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => {
                    self.end += n;
                    if self.end == self.buf.len() && self.buf.len() < READ_BUF {
                        // The input outran the buffer: a large ledger, so
                        // fewer, larger reads from now on.
                        self.buf.resize((self.buf.len() * 2).min(READ_BUF), 0);
                    }
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub(crate) fn next_line(&mut self) -> io::Result<Option<Line<'_>>> {
        loop {
            if let Some(i) = memchr::memchr(b'\n', &self.buf[self.start..self.end]) {
                let range = self.start..self.start + i;
                self.start += i + 1;
                self.offset += i as u64 + 1;
                if i > MAX_LINE {
                    return Ok(Some(Line::TooLong(i as u64)));
                }
                return Ok(Some(Line::Full(&self.buf[range])));
            }
            if self.end - self.start > MAX_LINE {
                return self.skip_long_line().map(Some);
            }
            if self.eof {
                if self.start < self.end {
                    let len = (self.end - self.start) as u64;
                    self.offset += len;
                    self.start = self.end;
                    return Ok(Some(Line::Torn(len)));
                }
                return Ok(None);
            }
            self.fill()?;
        }
    }

    /// Skips the rest of a line longer than the limit, without keeping it.
    fn skip_long_line(&mut self) -> io::Result<Line<'static>> {
        let mut len = (self.end - self.start) as u64;
        self.start = self.end;
        loop {
            self.fill()?;
            if let Some(i) = memchr::memchr(b'\n', &self.buf[self.start..self.end]) {
                len += i as u64;
                self.start += i + 1;
                self.offset += len + 1;
                return Ok(Line::TooLong(len));
            }
            len += (self.end - self.start) as u64;
            self.start = self.end;
            if self.eof {
                self.offset += len;
                return Ok(Line::Torn(len));
            }
        }
    }
}

/// The outcome of one step of a [`Walker`].
#[derive(Debug)]
pub(crate) enum Step {
    /// An entry that continues the chain.
    Entry(Checked),
    /// End of the ledger, possibly with unfinished bytes after the last line.
    End {
        /// Length of the unterminated tail, if any.
        torn: Option<u64>,
    },
    /// The first damage.
    Damage(Damage),
}

/// Walks a ledger's lines, checking each entry and its link to the previous
/// one, and keeping the Merkle frontier.
pub(crate) struct Walker<R> {
    reader: LineReader<R>,
    line_no: u64,
    /// The `seq` the next entry must have.
    pub(crate) expected: u64,
    /// The hash of the last good entry.
    pub(crate) prev: Hash,
    pub(crate) frontier: Frontier,
}

impl<R: Read> Walker<R> {
    pub(crate) fn new(r: R) -> Self {
        Walker {
            reader: LineReader::new(r),
            line_no: 0,
            expected: 0,
            prev: ZERO_HASH,
            frontier: Frontier::new(),
        }
    }

    /// Bytes consumed so far.
    pub(crate) fn offset(&self) -> u64 {
        self.reader.offset
    }

    fn damage(&self, kind: DamageKind, seq: Option<u64>, detail: String) -> Step {
        Step::Damage(Damage {
            kind,
            seq,
            line: Some(self.line_no),
            detail,
        })
    }

    pub(crate) fn step(&mut self) -> io::Result<Step> {
        let expected = self.expected;
        let checked = match self.reader.next_line()? {
            None => return Ok(Step::End { torn: None }),
            Some(Line::Torn(len)) => return Ok(Step::End { torn: Some(len) }),
            Some(Line::TooLong(len)) => {
                self.line_no += 1;
                return Ok(self.damage(
                    DamageKind::Malformed,
                    Some(expected),
                    format!("line is {len} bytes long; entries are at most {MAX_LINE} bytes"),
                ));
            }
            Some(Line::Full(bytes)) => {
                self.line_no += 1;
                entry::check_line(bytes)
            }
        };
        let c = match checked {
            Ok(c) => c,
            Err(e) => {
                return Ok(self.damage(
                    DamageKind::Malformed,
                    Some(expected),
                    format!("line is not a valid entry: {e}"),
                ));
            }
        };
        if !c.hash_ok() {
            let detail = if c.seq == expected {
                "its content does not match its hash".to_owned()
            } else {
                format!(
                    "its content does not match its hash (its seq field now says {})",
                    c.seq
                )
            };
            return Ok(self.damage(DamageKind::Edited, Some(expected), detail));
        }
        if c.seq == expected && c.prev == self.prev {
            self.frontier.push(c.leaf);
            self.prev = c.claimed;
            self.expected += 1;
            return Ok(Step::Entry(c));
        }
        let here = self.line_no;
        if c.seq == expected {
            if expected == 0 {
                return Ok(self.damage(
                    DamageKind::Edited,
                    Some(0),
                    "seq 0's prev is not 64 zeros: the start of the ledger was rewritten"
                        .to_owned(),
                ));
            }
            // The link to the previous entry is broken. Either this entry
            // was inserted (then the real one follows with the same seq), or
            // the previous one was rewritten and re-hashed.
            return Ok(match self.peek_seq()? {
                Some(next) if next == expected => self.damage(
                    DamageKind::Inserted,
                    Some(expected),
                    format!(
                        "lines {here} and {} both hold seq {expected}; one was inserted",
                        here + 1
                    ),
                ),
                _ => self.damage(
                    DamageKind::Edited,
                    Some(expected - 1),
                    format!(
                        "seq {expected}'s prev does not match the hash of seq {}: seq {} was \
                         rewritten with a recomputed hash, or seq {expected} was replaced",
                        expected - 1,
                        expected - 1
                    ),
                ),
            });
        }
        if c.seq > expected {
            let missing = if c.seq == expected + 1 {
                format!("seq {expected}")
            } else {
                format!("seqs {expected}..{}", c.seq - 1)
            };
            return Ok(match self.find_later(expected)? {
                Some(line) => self.damage(
                    DamageKind::Reordered,
                    Some(expected),
                    format!(
                        "line {here} holds seq {} where seq {expected} belongs; seq {expected} \
                         appears later, at line {line}",
                        c.seq
                    ),
                ),
                None => self.damage(
                    DamageKind::Missing,
                    Some(expected),
                    format!("{missing} missing: line {here} holds seq {}", c.seq),
                ),
            });
        }
        Ok(self.damage(
            DamageKind::Inserted,
            Some(c.seq),
            format!(
                "line {here} holds seq {} again, after seq {}; an entry was inserted",
                c.seq,
                expected - 1
            ),
        ))
    }

    /// The seq of the next line, if it is an entry. Consumes it: only for
    /// use after damage has been found.
    fn peek_seq(&mut self) -> io::Result<Option<u64>> {
        Ok(match self.reader.next_line()? {
            Some(Line::Full(b)) => entry::check_line(b).ok().map(|c| c.seq),
            _ => None,
        })
    }

    /// Reads on to the end looking for an entry with `seq`; returns its
    /// line. Consumes the rest: only for use after damage has been found.
    fn find_later(&mut self, seq: u64) -> io::Result<Option<u64>> {
        let mut line = self.line_no;
        loop {
            match self.reader.next_line()? {
                None | Some(Line::Torn(_)) => return Ok(None),
                Some(Line::TooLong(_)) => line += 1,
                Some(Line::Full(b)) => {
                    line += 1;
                    if entry::check_line(b).is_ok_and(|c| c.seq == seq) {
                        return Ok(Some(line));
                    }
                }
            }
        }
    }
}

/// What to check a ledger against.
#[derive(Debug, Default, Clone)]
pub struct VerifyOptions {
    /// A checkpoint to compare with. Without one, the ledger's stored
    /// checkpoint is used if it exists.
    pub checkpoint: Option<SignedCheckpoint>,
    /// A key whose signature the checkpoint must carry.
    pub key: Option<VerifierKey>,
}

/// What checking against a checkpoint found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointCheck {
    /// The checkpoint's origin line.
    pub origin: String,
    /// Entries it commits to.
    pub size: u64,
    /// Whether its signature was verified with a given key.
    pub signature_verified: bool,
}

/// The result of verifying a ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The ledger file.
    pub path: PathBuf,
    /// Entries that verified before any damage.
    pub entries: u64,
    /// Bytes read.
    pub bytes: u64,
    /// `(seq, hash)` of the last good entry.
    pub head: Option<(u64, Hash)>,
    /// RFC 6962 root over the entries that verified.
    pub root: Hash,
    /// Length of an unfinished last line left by a crash, if any.
    pub torn_tail: Option<u64>,
    /// The checkpoint compared with, if any.
    pub checkpoint: Option<CheckpointCheck>,
    /// The first damage, or `None` when intact.
    pub damage: Option<Damage>,
}

impl Report {
    /// Whether no damage was found.
    pub fn intact(&self) -> bool {
        self.damage.is_none()
    }
}

/// Reads and parses a checkpoint file.
pub fn read_checkpoint(path: &Path) -> Result<SignedCheckpoint, ChainError> {
    let err = |reason: String| ChainError::Checkpoint {
        path: path.to_owned(),
        reason,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| {
            f.take(crate::note::MAX_NOTE as u64 + 1)
                .read_to_end(&mut bytes)
        })
        .map_err(|e| err(e.to_string()))?;
    SignedCheckpoint::parse(&bytes).map_err(|e: CheckpointError| err(e.to_string()))
}

/// Verifies the ledger at `paths`.
pub fn verify(paths: &crate::ledger::Paths, opts: &VerifyOptions) -> Result<Report, ChainError> {
    let checkpoint = match &opts.checkpoint {
        Some(cp) => Some(cp.clone()),
        None if paths.checkpoint.exists() => Some(read_checkpoint(&paths.checkpoint)?),
        None => None,
    };
    if opts.key.is_some() && checkpoint.is_none() {
        return Err(ChainError::NoCheckpoint);
    }
    let file = std::fs::File::open(&paths.file).map_err(|source| ChainError::Open {
        path: paths.file.clone(),
        source,
    })?;
    verify_reader(&paths.file, file, checkpoint.as_ref(), opts.key.as_ref())
}

/// Verifies a ledger read from `r` (named `path` in the report).
pub fn verify_reader(
    path: &Path,
    r: impl Read,
    checkpoint: Option<&SignedCheckpoint>,
    key: Option<&VerifierKey>,
) -> Result<Report, ChainError> {
    let mut report = Report {
        path: path.to_owned(),
        entries: 0,
        bytes: 0,
        head: None,
        root: crate::merkle::empty_root(),
        torn_tail: None,
        checkpoint: checkpoint.map(|cp| CheckpointCheck {
            origin: cp.checkpoint.origin.clone(),
            size: cp.checkpoint.size,
            signature_verified: false,
        }),
        damage: None,
    };
    if let (Some(cp), Some(key)) = (checkpoint, key) {
        if let Err(e) = cp.verify(key) {
            report.damage = Some(Damage {
                kind: DamageKind::CheckpointMismatch,
                seq: None,
                line: None,
                detail: e.to_string(),
            });
            return Ok(report);
        }
        if let Some(c) = &mut report.checkpoint {
            c.signature_verified = true;
        }
    }
    let cp = checkpoint.map(|c| &c.checkpoint);
    let mut walker = Walker::new(r);
    let rerr = |source| ChainError::Read {
        path: path.to_owned(),
        source,
    };
    let mismatch = |size: u64| Damage {
        kind: DamageKind::CheckpointMismatch,
        seq: None,
        line: None,
        detail: format!(
            "entries 0..{size} do not hash to the checkpoint's root: at least one of them \
             was rewritten (with its hashes recomputed) since the checkpoint was signed"
        ),
    };
    if let Some(cp) = cp
        && cp.size == 0
        && cp.root != crate::merkle::empty_root()
    {
        report.damage = Some(mismatch(0));
    }
    // A root mismatch says only that some entry before the checkpoint's size
    // changed. Keep walking: if the chain itself shows damage at a seq
    // inside that range, it names the entry, so it is reported instead.
    let mut mismatched: Option<Damage> = None;
    while report.damage.is_none() {
        match walker.step().map_err(rerr)? {
            Step::Entry(c) => {
                if mismatched.is_none() {
                    report.entries += 1;
                    report.head = Some((c.seq, c.claimed));
                }
                if let Some(cp) = cp
                    && walker.frontier.size() == cp.size
                    && walker.frontier.root() != cp.root
                {
                    mismatched = Some(mismatch(cp.size));
                }
            }
            Step::End { torn } => {
                report.torn_tail = torn;
                if let Some(m) = mismatched.take() {
                    report.damage = Some(m);
                    break;
                }
                if let Some(cp) = cp
                    && report.entries < cp.size
                {
                    report.damage = Some(Damage {
                        kind: DamageKind::Truncated,
                        seq: Some(report.entries),
                        line: None,
                        detail: format!(
                            "the checkpoint commits to {} entries but the ledger ends after \
                             {}: seq {}..{} are gone",
                            cp.size,
                            report.entries,
                            report.entries,
                            cp.size - 1
                        ),
                    });
                }
                break;
            }
            Step::Damage(d) => {
                let inside = |d: &Damage| d.seq.zip(cp).is_some_and(|(s, cp)| s < cp.size);
                report.damage = match mismatched.take() {
                    Some(m) if !inside(&d) => Some(m),
                    _ => Some(d),
                };
            }
        }
    }
    report.bytes = walker.offset();
    report.root = walker.frontier.root();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out at most `n` bytes per read, to exercise refills.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.1.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn lines(input: &[u8], chunk: usize) -> Vec<String> {
        let mut r = LineReader::new(Trickle(input, chunk));
        let mut out = Vec::new();
        while let Some(l) = r.next_line().unwrap() {
            out.push(match l {
                Line::Full(b) => format!("full {}", b.len()),
                Line::TooLong(n) => format!("long {n}"),
                Line::Torn(n) => format!("torn {n}"),
            });
        }
        assert_eq!(r.offset, input.len() as u64, "every byte accounted for");
        out
    }

    #[test]
    fn lines_are_bounded_whatever_the_read_sizes() {
        let mut input = Vec::new();
        input.extend(std::iter::repeat_n(b'a', MAX_LINE));
        input.push(b'\n');
        input.extend(std::iter::repeat_n(b'b', MAX_LINE + 1));
        input.push(b'\n');
        input.extend(std::iter::repeat_n(b'c', 5 * MAX_LINE));
        input.push(b'\n');
        input.extend_from_slice(b"x\n\n");
        input.extend(std::iter::repeat_n(b'd', 6 * MAX_LINE));
        let want = [
            format!("full {MAX_LINE}"),
            format!("long {}", MAX_LINE + 1),
            format!("long {}", 5 * MAX_LINE),
            "full 1".to_owned(),
            "full 0".to_owned(),
            format!("torn {}", 6 * MAX_LINE),
        ];
        for chunk in [usize::MAX, 1 << 20, 65_537, 4093] {
            assert_eq!(lines(&input, chunk), want, "chunk {chunk}");
        }
        assert_eq!(lines(b"", 7), Vec::<String>::new());
        assert_eq!(lines(b"ab", 1), ["torn 2"]);
    }
}
