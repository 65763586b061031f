//! The ledger on disk: opening (with torn-tail repair), durable appends with
//! group commit, and signing checkpoints.
//!
//! Invariants:
//! - `ledger.jsonl` only grows, one entry a line, each line written by a
//!   single `write` under an exclusive `flock` on `<stem>.lock`, so that
//!   processes sharing a ledger never interleave.
//! - [`Ledger::append`] returns only after an `fdatasync` that covers its
//!   entry. Concurrent appenders share one: whoever finds no write in
//!   progress becomes the leader, writes everything queued in one `write`,
//!   syncs once, and acknowledges each entry of that batch.
//! - A crash leaves at most an unterminated last line. Opening repairs it
//!   under the lock: a complete entry missing only its newline is finished;
//!   anything else is cut, saved beside the ledger as `<stem>.torn-<time>`,
//!   and a `ledger.repair` entry records the offset, length and SHA-256 of
//!   what was cut. A damaged *complete* last line is never repaired: that is
//!   not a crash, and appending is refused.
//! - A checkpoint is signed only over a ledger that verifies and extends the
//!   last checkpoint signed for it.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::chain::{self, Step, Walker};
use crate::checkpoint::Checkpoint;
use crate::entry::{self, EntryError, MAX_LINE, ZERO_HASH};
use crate::keys::SigningKey;
use crate::merkle::Hash;

/// Where a ledger's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// The directory.
    pub dir: PathBuf,
    /// The entries: `<dir>/ledger.jsonl` unless a `.jsonl` file was named.
    pub file: PathBuf,
    /// The lock file appenders hold while writing.
    pub lock: PathBuf,
    /// The last checkpoint signed for this ledger.
    pub checkpoint: PathBuf,
    stem: String,
}

impl Paths {
    /// Accepts a ledger directory or its `.jsonl` file.
    pub fn resolve(path: &Path) -> Paths {
        let is_file = path.extension().is_some_and(|e| e == "jsonl") || path.is_file();
        let (dir, file) = if is_file {
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
                _ => PathBuf::from("."),
            };
            (dir, path.to_owned())
        } else {
            (path.to_owned(), path.join("ledger.jsonl"))
        };
        let stem = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "ledger".to_owned());
        Paths {
            lock: dir.join(format!("{stem}.lock")),
            checkpoint: dir.join(format!("{stem}.checkpoint")),
            dir,
            file,
            stem,
        }
    }

    fn torn(&self, ts: &str) -> PathBuf {
        self.dir
            .join(format!("{}.torn-{}", self.stem, ts.replace(':', "")))
    }

    fn checkpoint_lock(&self) -> PathBuf {
        self.dir.join(format!("{}.checkpoint.lock", self.stem))
    }
}

/// An entry's position and hash: what an append acknowledges, and the head
/// of a ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The entry's `seq`.
    pub seq: u64,
    /// The entry's `hash`.
    pub hash: Hash,
}

impl Head {
    /// The hash in hex, as it appears in the ledger.
    pub fn hash_hex(&self) -> String {
        hex::encode(self.hash)
    }
}

/// What repair found and did when the ledger was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    /// `completed` (a whole entry lacked only its newline) or `truncated`.
    pub action: &'static str,
    /// Byte offset where the unfinished line began.
    pub offset: u64,
    /// Its length.
    pub bytes: u64,
    /// SHA-256 of its bytes, hex.
    pub sha256: String,
    /// Where the cut bytes were saved (for `truncated`).
    pub saved_to: Option<PathBuf>,
    /// The `ledger.repair` entry that records this.
    pub recorded_as: Option<Head>,
}

/// Tuning for [`Ledger`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Share one fsync among concurrent appenders. When false every append
    /// pays for its own (for comparison in benchmarks).
    pub group_commit: bool,
    /// Most entries written by one batch.
    pub max_batch: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            group_commit: true,
            max_batch: 4096,
        }
    }
}

/// What went wrong with the ledger on disk.
#[derive(Debug, Error, Clone)]
pub enum LedgerError {
    /// The ledger directory or file could not be created or opened.
    #[error("cannot open ledger {path}: {source}")]
    Open {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: Arc<io::Error>,
    },
    /// The lock could not be taken.
    #[error("cannot lock {path}: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The underlying error.
        source: Arc<io::Error>,
    },
    /// Reading the ledger failed.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: Arc<io::Error>,
    },
    /// Writing or syncing failed; the entries of the batch are not committed
    /// and this handle refuses further appends.
    #[error(
        "cannot write {path}: {source}; reopen the ledger (which repairs it) before appending again"
    )]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: Arc<io::Error>,
    },
    /// The ledger's last complete line is not a sound entry: damage, not a
    /// crash, so nothing is appended after it.
    #[error(
        "{path}: the last entry (at byte {offset}) {reason}; the ledger is damaged, not torn by a crash: run `cordon ledger verify {path}` and restore it from a copy"
    )]
    Damaged {
        /// The file.
        path: PathBuf,
        /// Offset of the bad line.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// Someone shrank the file while it was open.
    #[error(
        "{path} shrank from {was} to {now} bytes while open: it was truncated by another program; run `cordon ledger verify {path}`"
    )]
    Shrunk {
        /// The file.
        path: PathBuf,
        /// Length this handle last wrote.
        was: u64,
        /// Length now.
        now: u64,
    },
    /// An earlier write failed on this handle.
    #[error("ledger {path} is unusable after an earlier write error ({reason}); reopen it")]
    Poisoned {
        /// The file.
        path: PathBuf,
        /// The earlier error.
        reason: String,
    },
    /// The entry offered is not acceptable.
    #[error("invalid entry: {0}")]
    Entry(#[from] EntryError),
    /// The ledger does not exist (for operations that do not create it).
    #[error("no ledger at {0}: create one with `cordon ledger append`")]
    NotFound(PathBuf),
    /// The ledger fails verification, so nothing is signed over it.
    #[error("{path}: refusing to sign a checkpoint over a damaged ledger: {damage}")]
    Unsound {
        /// The file.
        path: PathBuf,
        /// The first damage.
        damage: String,
    },
    /// The ledger is not an extension of its last checkpoint.
    #[error("{path}: refusing to sign: {reason}")]
    Inconsistent {
        /// The file.
        path: PathBuf,
        /// How it differs.
        reason: String,
    },
    /// Signing or writing a checkpoint failed.
    #[error("cannot sign checkpoint for {path}: {reason}")]
    Sign {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

fn arc(e: io::Error) -> Arc<io::Error> {
    Arc::new(e)
}

/// A handle to an open ledger. Cheap to clone; clones share one writer, so
/// concurrent appends from many threads share fsyncs.
#[derive(Debug, Clone)]
pub struct Ledger {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    paths: Paths,
    opts: Options,
    state: Mutex<State>,
    cond: Condvar,
    io: Mutex<Io>,
    /// Held open for `flock`; see [`FileLock`].
    lock_file: File,
    repair: Option<Repair>,
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Pending>,
    next_ticket: u64,
    results: HashMap<u64, Result<Head, LedgerError>>,
    leader: bool,
    head: Option<Head>,
    poisoned: Option<String>,
}

#[derive(Debug)]
struct Pending {
    ticket: u64,
    /// Canonical JSON string of `kind`.
    kind: Vec<u8>,
    /// Canonical JSON of `data`.
    data: Vec<u8>,
}

#[derive(Debug)]
struct Io {
    file: File,
    /// File length after this handle's last write or check.
    len: u64,
    head: Option<Head>,
}

/// What the end of the file looks like.
struct Tail {
    /// The last complete entry.
    head: Option<Head>,
    /// Bytes after the last newline.
    torn: Option<(u64, u64)>,
}

fn lock_state(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the state lock leaves plain data behind; the
    // invariants that matter (what is on disk) do not live in it.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Ledger {
    /// Opens the ledger at `path` (a directory or its `.jsonl` file),
    /// creating it if needed and repairing a torn last line.
    pub fn open(path: impl AsRef<Path>) -> Result<Ledger, LedgerError> {
        Ledger::open_with(path, Options::default())
    }

    /// [`Ledger::open`] with options.
    pub fn open_with(path: impl AsRef<Path>, opts: Options) -> Result<Ledger, LedgerError> {
        let paths = Paths::resolve(path.as_ref());
        let oerr = |p: &Path| {
            let p = p.to_owned();
            move |e| LedgerError::Open {
                path: p,
                source: arc(e),
            }
        };
        std::fs::create_dir_all(&paths.dir).map_err(oerr(&paths.dir))?;
        let created = !paths.file.exists();
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&paths.file)
            .map_err(oerr(&paths.file))?;
        if created {
            sync_dir(&paths.dir).map_err(oerr(&paths.dir))?;
        }
        let lock = open_lock_file(&paths.lock)?;
        let mut io = Io {
            file,
            len: 0,
            head: None,
        };
        let repair = {
            let _guard = FileLock::take(&lock, &paths.lock)?;
            settle_and_record(&paths, &mut io)?
        };
        let state = State {
            head: io.head,
            ..State::default()
        };
        Ok(Ledger {
            inner: Arc::new(Inner {
                paths,
                opts,
                state: Mutex::new(state),
                cond: Condvar::new(),
                io: Mutex::new(io),
                lock_file: lock,
                repair,
            }),
        })
    }

    /// The ledger's files.
    pub fn paths(&self) -> &Paths {
        &self.inner.paths
    }

    /// The repair done when this handle was opened, if any.
    pub fn repair(&self) -> Option<&Repair> {
        self.inner.repair.as_ref()
    }

    /// The last entry this handle knows of (its own appends, and other
    /// processes' as of its last write).
    pub fn head(&self) -> Option<Head> {
        lock_state(&self.inner.state).head
    }

    /// Appends an entry of `kind` with `data` (a JSON object) and returns
    /// its `seq` and `hash` once it is on disk (fsynced). Integers above
    /// 2^53 in `data` are stored as decimal strings.
    pub fn append(&self, kind: &str, data: Value) -> Result<Head, LedgerError> {
        let mut heads = self.append_all(vec![(kind.to_owned(), data)])?;
        heads.pop().ok_or_else(|| LedgerError::Poisoned {
            path: self.inner.paths.file.clone(),
            reason: "an append acknowledged nothing".to_owned(),
        })
    }

    /// Appends several entries, consecutively and in order, and returns their `seq` and `hash`
    /// once all of them are on disk: they share the fsyncs (one, when they fit in a batch). On
    /// error none of them should be taken as committed.
    pub fn append_all(&self, entries: Vec<(String, Value)>) -> Result<Vec<Head>, LedgerError> {
        let inner = &*self.inner;
        let mut prepared = Vec::with_capacity(entries.len());
        for (kind, data) in entries {
            prepared.push(prepare(&kind, data)?);
        }
        let mut st = lock_state(&inner.state);
        let mut tickets = Vec::with_capacity(prepared.len());
        for mut pending in prepared {
            let ticket = st.next_ticket;
            st.next_ticket += 1;
            pending.ticket = ticket;
            tickets.push(ticket);
            st.queue.push_back(pending);
        }
        let mut heads: Vec<Option<Head>> = vec![None; tickets.len()];
        let mut missing = tickets.len();
        loop {
            for (i, ticket) in tickets.iter().enumerate() {
                if heads[i].is_none()
                    && let Some(r) = st.results.remove(ticket)
                {
                    match r {
                        Ok(h) => {
                            heads[i] = Some(h);
                            missing -= 1;
                        }
                        Err(e) => {
                            st.queue.retain(|p| !tickets.contains(&p.ticket));
                            for t in &tickets {
                                st.results.remove(t);
                            }
                            return Err(e);
                        }
                    }
                }
            }
            if missing == 0 {
                return Ok(heads.into_iter().flatten().collect());
            }
            if let Some(reason) = &st.poisoned {
                let reason = reason.clone();
                st.queue.retain(|p| !tickets.contains(&p.ticket));
                return Err(LedgerError::Poisoned {
                    path: inner.paths.file.clone(),
                    reason,
                });
            }
            if !st.leader {
                st.leader = true;
                let take = if inner.opts.group_commit {
                    inner.opts.max_batch.max(1)
                } else {
                    1
                };
                let n = take.min(st.queue.len());
                let batch: Vec<Pending> = st.queue.drain(..n).collect();
                drop(st);
                let mut guard = LeaderGuard { inner, armed: true };
                let outcome = {
                    let mut io = inner
                        .io
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    FileLock::take(&inner.lock_file, &inner.paths.lock).and_then(|_guard| {
                        let io = &mut *io;
                        settle_and_record(&inner.paths, io)?;
                        write_lines(&inner.paths, io, &batch)
                    })
                };
                guard.armed = false;
                drop(guard);
                st = lock_state(&inner.state);
                st.leader = false;
                match outcome {
                    Ok(heads) => {
                        st.head = heads.last().copied().or(st.head);
                        for (p, h) in batch.iter().zip(heads) {
                            st.results.insert(p.ticket, Ok(h));
                        }
                    }
                    Err(e) => {
                        st.poisoned = Some(e.to_string());
                        for p in &batch {
                            st.results.insert(p.ticket, Err(e.clone()));
                        }
                    }
                }
                inner.cond.notify_all();
                continue;
            }
            st = inner
                .cond
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

/// Hands leadership back if the leader unwinds mid-batch, so followers are
/// not left waiting forever; the handle is then refused (fail closed).
struct LeaderGuard<'a> {
    inner: &'a Inner,
    armed: bool,
}

impl Drop for LeaderGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut st = lock_state(&self.inner.state);
        st.leader = false;
        st.poisoned = Some("a writer thread panicked mid-batch".to_owned());
        self.inner.cond.notify_all();
    }
}

/// Checks and canonicalizes an entry's parts on the caller's thread, so the
/// writer only assembles lines.
fn prepare(kind: &str, data: Value) -> Result<Pending, LedgerError> {
    if kind.is_empty() {
        return Err(EntryError::Data("kind must not be empty".to_owned()).into());
    }
    let Value::Object(map) = entry::normalize(data) else {
        return Err(EntryError::Data("data must be a JSON object".to_owned()).into());
    };
    let data = entry::canonical_data(&map)?;
    let mut kind_json = Vec::with_capacity(kind.len() + 2);
    crate::jcs::write_str(kind, &mut kind_json);
    // seq, ts, prev and hash add at most ~250 bytes.
    let len = data.len() + kind_json.len() + 250;
    if len > MAX_LINE {
        return Err(EntryError::Data(format!(
            "the entry would be about {len} bytes; entries are at most {MAX_LINE} bytes"
        ))
        .into());
    }
    Ok(Pending {
        ticket: 0,
        kind: kind_json,
        data,
    })
}

/// Writes `batch` after the current head in one write, then fsyncs. The
/// caller holds the file lock and has settled the tail.
fn write_lines(paths: &Paths, io: &mut Io, batch: &[Pending]) -> Result<Vec<Head>, LedgerError> {
    let mut buf = Vec::with_capacity(batch.iter().map(|p| p.data.len() + 300).sum());
    let mut heads = Vec::with_capacity(batch.len());
    let mut head = io.head;
    for p in batch {
        let seq = head.map_or(0, |h| h.seq + 1);
        let prev = head.map_or(ZERO_HASH, |h| h.hash);
        let mut ts = Vec::with_capacity(32);
        crate::jcs::write_str(&entry::now_rfc3339(), &mut ts);
        let unhashed = entry::assemble(&p.data, None, &p.kind, &prev, seq, &ts);
        let hash: Hash = Sha256::digest(&unhashed).into();
        buf.extend_from_slice(&entry::assemble(
            &p.data,
            Some(&hash),
            &p.kind,
            &prev,
            seq,
            &ts,
        ));
        buf.push(b'\n');
        head = Some(Head { seq, hash });
        heads.push(Head { seq, hash });
    }
    let werr = |e| LedgerError::Write {
        path: paths.file.clone(),
        source: arc(e),
    };
    io.file.write_all(&buf).map_err(werr)?;
    io.file.sync_data().map_err(werr)?;
    io.len += buf.len() as u64;
    io.head = head;
    Ok(heads)
}

/// Brings `io` up to date with the file (another process may have appended
/// since) and repairs a torn tail. Returns the repair done, which the caller
/// must record. The caller holds the file lock.
fn settle(paths: &Paths, io: &mut Io) -> Result<Option<Repair>, LedgerError> {
    let rerr = |e| LedgerError::Read {
        path: paths.file.clone(),
        source: arc(e),
    };
    let len = io.file.metadata().map_err(rerr)?.len();
    if len == io.len && io.len > 0 {
        return Ok(None);
    }
    if len < io.len {
        return Err(LedgerError::Shrunk {
            path: paths.file.clone(),
            was: io.len,
            now: len,
        });
    }
    let tail = read_tail(paths, &io.file, len)?;
    io.head = tail.head;
    io.len = len;
    let Some((offset, bytes)) = tail.torn else {
        return Ok(None);
    };
    let mut torn = vec![0u8; usize::try_from(bytes.min(MAX_LINE as u64 + 1)).unwrap_or(0)];
    io.file.read_exact_at(&mut torn, offset).map_err(rerr)?;
    let mut hasher = Sha256::new();
    if bytes <= MAX_LINE as u64 {
        hasher.update(&torn);
        // A whole entry that lacks only its newline: finish it.
        if let Ok(c) = entry::check_line(&torn) {
            let next = io.head.map_or(0, |h| h.seq + 1);
            let prev = io.head.map_or(ZERO_HASH, |h| h.hash);
            if c.hash_ok() && c.seq == next && c.prev == prev {
                let werr = |e| LedgerError::Write {
                    path: paths.file.clone(),
                    source: arc(e),
                };
                io.file.write_all(b"\n").map_err(werr)?;
                io.file.sync_data().map_err(werr)?;
                io.len += 1;
                io.head = Some(Head {
                    seq: c.seq,
                    hash: c.claimed,
                });
                return Ok(Some(Repair {
                    action: "completed",
                    offset,
                    bytes,
                    sha256: hex::encode(hasher.finalize()),
                    saved_to: None,
                    recorded_as: None,
                }));
            }
        }
    }
    // Save the unfinished bytes beside the ledger, then cut them off.
    let saved = paths.torn(&entry::now_rfc3339());
    let werr = |p: &Path| {
        let p = p.to_owned();
        move |e| LedgerError::Write {
            path: p,
            source: arc(e),
        }
    };
    let mut side = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&saved)
        .map_err(werr(&saved))?;
    let mut src = io.file.try_clone().map_err(rerr)?;
    src.seek(io::SeekFrom::Start(offset)).map_err(rerr)?;
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; 1 << 16];
    let mut left = bytes;
    while left > 0 {
        let n = src.read(&mut chunk).map_err(rerr)?;
        if n == 0 {
            break;
        }
        let n = n.min(usize::try_from(left).unwrap_or(usize::MAX));
        hasher.update(&chunk[..n]);
        side.write_all(&chunk[..n]).map_err(werr(&saved))?;
        left -= n as u64;
    }
    side.sync_all().map_err(werr(&saved))?;
    sync_dir(&paths.dir).map_err(werr(&paths.dir))?;
    io.file.set_len(offset).map_err(werr(&paths.file))?;
    io.file.sync_all().map_err(werr(&paths.file))?;
    io.len = offset;
    Ok(Some(Repair {
        action: "truncated",
        offset,
        bytes,
        sha256: hex::encode(hasher.finalize()),
        saved_to: Some(saved),
        recorded_as: None,
    }))
}

/// [`settle`], then records a repair, if one was done, as a
/// `ledger.repair` entry before anything else is written.
fn settle_and_record(paths: &Paths, io: &mut Io) -> Result<Option<Repair>, LedgerError> {
    let Some(mut r) = settle(paths, io)? else {
        return Ok(None);
    };
    let data = json!({
        "action": r.action,
        "offset": r.offset,
        "bytes": r.bytes,
        "sha256": r.sha256,
        "saved_to": r.saved_to.as_ref().map(|p| p.display().to_string()),
    });
    let heads = write_lines(paths, io, &[prepare("ledger.repair", data)?])?;
    r.recorded_as = heads.last().copied();
    Ok(Some(r))
}

/// Finds the last complete line and any bytes after it, reading backwards
/// from `len`.
fn read_tail(paths: &Paths, file: &File, len: u64) -> Result<Tail, LedgerError> {
    let rerr = |e| LedgerError::Read {
        path: paths.file.clone(),
        source: arc(e),
    };
    let last_nl = rfind_newline(file, len, u64::MAX).map_err(rerr)?;
    let committed = last_nl.map_or(0, |p| p + 1);
    let torn = (committed < len).then_some((committed, len - committed));
    let Some(end) = last_nl else {
        return Ok(Tail { head: None, torn });
    };
    let start = rfind_newline(file, end, MAX_LINE as u64 + 1)
        .map_err(rerr)?
        .map_or(0, |p| p + 1);
    let damaged = |reason: String| LedgerError::Damaged {
        path: paths.file.clone(),
        offset: start,
        reason,
    };
    if end - start > MAX_LINE as u64 {
        return Err(damaged(format!("is longer than {MAX_LINE} bytes")));
    }
    let mut line = vec![0u8; usize::try_from(end - start).unwrap_or(0)];
    file.read_exact_at(&mut line, start).map_err(rerr)?;
    let c = entry::check_line(&line).map_err(|e| damaged(format!("is not a valid entry: {e}")))?;
    if !c.hash_ok() {
        return Err(damaged("does not match its hash".to_owned()));
    }
    Ok(Tail {
        head: Some(Head {
            seq: c.seq,
            hash: c.claimed,
        }),
        torn,
    })
}

/// The offset of the last `\n` before `end`, looking back at most `limit`
/// bytes.
fn rfind_newline(file: &File, end: u64, limit: u64) -> io::Result<Option<u64>> {
    // Windows grow from 8 KiB (most entries are shorter: one read finds the newline) to 64 KiB.
    let mut buf = vec![0u8; 1 << 13];
    let mut hi = end;
    let floor = end.saturating_sub(limit);
    while hi > floor {
        if hi < end && buf.len() < 1 << 16 {
            buf.resize(buf.len() * 2, 0);
        }
        let lo = hi.saturating_sub(buf.len() as u64).max(floor);
        let chunk = &mut buf[..usize::try_from(hi - lo).unwrap_or(0)];
        file.read_exact_at(chunk, lo)?;
        // A plain scan, not memchr's: the newline is almost always the last byte, and memchr's
        // first call detects the CPU's features (a dozen CPUID instructions, each a trap to the
        // hypervisor in a VM: ~0.1 ms of every `cordon run` here).
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(Some(lo + i as u64));
        }
        hi = lo;
    }
    Ok(None)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// An exclusive `flock`, released on drop.
struct FileLock<'a>(&'a File);

impl<'a> FileLock<'a> {
    fn take(file: &'a File, path: &Path) -> Result<FileLock<'a>, LedgerError> {
        file.lock().map_err(|e| LedgerError::Lock {
            path: path.to_owned(),
            source: arc(e),
        })?;
        Ok(FileLock(file))
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        // Closing the file would release it too; an unlock error leaves
        // nothing to do.
        let _ = self.0.unlock();
    }
}

/// A freshly signed checkpoint.
#[derive(Debug, Clone)]
pub struct Signed {
    /// The signed note, as written to the ledger's checkpoint file.
    pub note: String,
    /// Its content.
    pub checkpoint: Checkpoint,
    /// The checkpoint it extends, if there was one.
    pub previous: Option<Checkpoint>,
}

/// The origin used when none is given: `cordon.local/ledger/` and the first
/// 16 hex digits of entry 0's hash, which names this ledger and no other.
pub fn default_origin(first_hash: &Hash) -> String {
    format!("cordon.local/ledger/{}", &hex::encode(first_hash)[..16])
}

/// Signs a checkpoint over the whole ledger at `path` and stores it as the
/// ledger's checkpoint file. Refuses when the ledger does not verify, or is
/// not an extension of the checkpoint stored before (so two inconsistent
/// checkpoints are never signed for one ledger).
pub fn sign_checkpoint(
    path: &Path,
    key: &SigningKey,
    origin: Option<&str>,
) -> Result<Signed, LedgerError> {
    let paths = Paths::resolve(path);
    if !paths.file.exists() {
        return Err(LedgerError::NotFound(paths.file.clone()));
    }
    let oerr = |p: &Path| {
        let p = p.to_owned();
        move |e| LedgerError::Open {
            path: p,
            source: arc(e),
        }
    };
    let sign_err = |reason: String| LedgerError::Sign {
        path: paths.file.clone(),
        reason,
    };
    // One signer at a time per ledger.
    let cp_lock_path = paths.checkpoint_lock();
    let cp_lock = open_lock_file(&cp_lock_path)?;
    let _cp_guard = FileLock::take(&cp_lock, &cp_lock_path)?;
    // Only what appenders have fsynced: read the length under their lock.
    let file = File::open(&paths.file).map_err(oerr(&paths.file))?;
    let committed = {
        let lock = open_lock_file(&paths.lock)?;
        let _g = FileLock::take(&lock, &paths.lock)?;
        file.metadata().map_err(oerr(&paths.file))?.len()
    };
    let previous = if paths.checkpoint.exists() {
        Some(
            chain::read_checkpoint(&paths.checkpoint)
                .map_err(|e| sign_err(e.to_string()))?
                .checkpoint,
        )
    } else {
        None
    };
    let mut walker = Walker::new(file.take(committed));
    let mut first: Option<Hash> = None;
    let mut root_at_previous = None;
    let rerr = |e| LedgerError::Read {
        path: paths.file.clone(),
        source: arc(e),
    };
    if previous.as_ref().is_some_and(|p| p.size == 0) {
        root_at_previous = Some(crate::merkle::empty_root());
    }
    loop {
        match walker.step().map_err(rerr)? {
            Step::Entry(c) => {
                first.get_or_insert(c.claimed);
                if previous
                    .as_ref()
                    .is_some_and(|p| p.size == walker.frontier.size())
                {
                    root_at_previous = Some(walker.frontier.root());
                }
            }
            Step::End { .. } => break,
            Step::Damage(d) => {
                return Err(LedgerError::Unsound {
                    path: paths.file.clone(),
                    damage: d.to_string(),
                });
            }
        }
    }
    let size = walker.frontier.size();
    let inconsistent = |reason: String| LedgerError::Inconsistent {
        path: paths.file.clone(),
        reason,
    };
    if let Some(prev) = &previous {
        if size < prev.size {
            return Err(inconsistent(format!(
                "the ledger has {size} entries but its last checkpoint committed to {}: it was \
                 truncated",
                prev.size
            )));
        }
        if root_at_previous != Some(prev.root) {
            return Err(inconsistent(format!(
                "entries 0..{} no longer hash to the root of the last checkpoint: the ledger \
                 was rewritten, and is not an extension of what was signed",
                prev.size
            )));
        }
        if let Some(o) = origin
            && o != prev.origin
        {
            return Err(inconsistent(format!(
                "this ledger's checkpoints have origin {:?}, not {o:?}",
                prev.origin
            )));
        }
    }
    let origin = match (origin, &previous, first) {
        (Some(o), _, _) => o.to_owned(),
        (None, Some(p), _) => p.origin.clone(),
        (None, None, Some(h)) => default_origin(&h),
        (None, None, None) => {
            return Err(sign_err(
                "the ledger is empty; pass --origin to checkpoint an empty ledger".to_owned(),
            ));
        }
    };
    let checkpoint = Checkpoint {
        origin,
        size,
        root: walker.frontier.root(),
        extensions: Vec::new(),
    };
    let note = checkpoint.sign(key).map_err(|e| sign_err(e.to_string()))?;
    write_atomic(&paths.checkpoint, note.as_bytes(), &paths.dir)
        .map_err(|e| sign_err(format!("writing {}: {e}", paths.checkpoint.display())))?;
    Ok(Signed {
        note,
        checkpoint,
        previous,
    })
}

/// Opens (creating it if needed) a lock file readable and writable by its owner only: `flock`
/// works on any descriptor, so a lock file others may open is a lock others may hold, and an
/// appender (or a contained command that can read the ledger) could stall every writer. A lock
/// file left more open by an older version is narrowed when this process owns it.
fn open_lock_file(path: &Path) -> Result<File, LedgerError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|source| LedgerError::Open {
            path: path.to_path_buf(),
            source: arc(source),
        })?;
    if let Ok(meta) = file.metadata()
        && meta.permissions().mode() & 0o077 != 0
    {
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o600));
    }
    Ok(file)
}

/// Writes `bytes` to `path` by way of a temporary file and a rename, with
/// fsyncs, so readers see the old or the new content, never a mix.
pub fn write_atomic(path: &Path, bytes: &[u8], dir: &Path) -> io::Result<()> {
    let tmp = path.with_extension(format!(
        "{}tmp",
        path.extension()
            .map(|e| format!("{}.", e.to_string_lossy()))
            .unwrap_or_default()
    ));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    sync_dir(dir)
}
