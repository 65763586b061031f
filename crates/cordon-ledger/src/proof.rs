//! Self-contained proofs a third party can check with only a verifier key:
//! that an entry is in the ledger a checkpoint commits to (inclusion), and
//! that one checkpoint's ledger is a prefix of another's (consistency).
//!
//! ```json
//! {"type":"cordon-inclusion-proof/1","checkpoint":"<signed note>","entry":{…},
//!  "seq":5,"tree_size":8,"proof":["<base64>",…]}
//! {"type":"cordon-consistency-proof/1","old_checkpoint":"<signed note>",
//!  "new_checkpoint":"<signed note>","old_size":2,"new_size":8,"proof":["<base64>",…]}
//! ```

use std::io::Read;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Map, Value};
use thiserror::Error;

use crate::chain::{Step, Walker};
use crate::checkpoint::SignedCheckpoint;
use crate::entry::Entry;
use crate::keys::VerifierKey;
use crate::ledger::Paths;
use crate::merkle::{self, Hash, RangeHasher};

/// `type` of an inclusion proof.
pub const INCLUSION: &str = "cordon-inclusion-proof/1";
/// `type` of a consistency proof.
pub const CONSISTENCY: &str = "cordon-consistency-proof/1";

/// What went wrong making or checking a proof.
#[derive(Debug, Error)]
pub enum ProofError {
    /// The ledger cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The ledger does not support the proof asked for.
    #[error("cannot prove: {0}")]
    Prove(String),
    /// A proof document is malformed.
    #[error("malformed proof: {0}")]
    Parse(String),
    /// A proof does not verify.
    #[error("proof does not verify: {0}")]
    Verify(String),
}

/// A proof, either kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Proof {
    /// Entry `entry.seq` is in the tree of `checkpoint`.
    Inclusion {
        /// The signed checkpoint note.
        checkpoint: String,
        /// The entry.
        entry: Entry,
        /// Audit path.
        hashes: Vec<Hash>,
    },
    /// The old checkpoint's tree is a prefix of the new one's.
    Consistency {
        /// The older signed checkpoint note.
        old: String,
        /// The newer signed checkpoint note.
        new: String,
        /// Consistency path.
        hashes: Vec<Hash>,
    },
}

/// What a verified proof established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// One line for humans.
    pub summary: String,
    /// Whether checkpoint signatures were checked with a key.
    pub signature_verified: bool,
}

fn parse_cp(note: &str) -> Result<SignedCheckpoint, ProofError> {
    SignedCheckpoint::parse(note.as_bytes()).map_err(|e| ProofError::Parse(e.to_string()))
}

/// Walks the ledger (verifying it) to `size` entries, feeding leaves to a
/// range hasher, and capturing entry `want` if asked.
fn walk(
    paths: &Paths,
    size: u64,
    ranges: &[merkle::Range],
    want: Option<u64>,
) -> Result<(Hash, Vec<Hash>, Option<Entry>), ProofError> {
    let file = std::fs::File::open(&paths.file).map_err(|source| ProofError::Read {
        path: paths.file.clone(),
        source,
    })?;
    let mut walker = Walker::new(file);
    let mut hasher = RangeHasher::new(ranges);
    let mut captured = None;
    while walker.frontier.size() < size {
        let before = walker.frontier.size();
        match walker.step().map_err(|source| ProofError::Read {
            path: paths.file.clone(),
            source,
        })? {
            Step::Entry(c) => {
                hasher.push(before, &c.leaf);
                if want == Some(c.seq) {
                    captured = Some(c);
                }
            }
            Step::End { .. } => {
                return Err(ProofError::Prove(format!(
                    "the checkpoint commits to {size} entries but the ledger has {before}: it was \
                     truncated"
                )));
            }
            Step::Damage(d) => {
                return Err(ProofError::Prove(format!("the ledger is damaged: {d}")));
            }
        }
    }
    let hashes = hasher
        .finish()
        .ok_or_else(|| ProofError::Prove("internal: incomplete proof ranges".to_owned()))?;
    let entry = match captured {
        Some(c) => Some(read_entry(paths, c.seq)?),
        None => None,
    };
    Ok((walker.frontier.root(), hashes, entry))
}

/// Reads entry `seq` (line `seq + 1`) of a ledger already verified to hold it.
fn read_entry(paths: &Paths, seq: u64) -> Result<Entry, ProofError> {
    let file = std::fs::File::open(&paths.file).map_err(|source| ProofError::Read {
        path: paths.file.clone(),
        source,
    })?;
    let mut reader = crate::chain::LineReader::new(file);
    let mut n = 0;
    while let Some(line) = reader.next_line().map_err(|source| ProofError::Read {
        path: paths.file.clone(),
        source,
    })? {
        if let crate::chain::Line::Full(bytes) = line
            && n == seq
        {
            return Entry::parse(bytes).map_err(|e| ProofError::Prove(e.to_string()));
        }
        n += 1;
    }
    Err(ProofError::Prove(format!(
        "seq {seq} vanished while reading"
    )))
}

impl Proof {
    /// Proves that entry `seq` of the ledger at `path` is in the tree that
    /// `checkpoint` (a signed note) commits to.
    pub fn inclusion(path: &Path, seq: u64, checkpoint: &str) -> Result<Proof, ProofError> {
        let paths = Paths::resolve(path);
        let cp = parse_cp(checkpoint)?.checkpoint;
        if seq >= cp.size {
            return Err(ProofError::Prove(format!(
                "seq {seq} is not covered by the checkpoint, which commits to entries 0..{}; \
                 sign a newer checkpoint with `cordon ledger checkpoint`",
                cp.size
            )));
        }
        let ranges = merkle::inclusion_ranges(seq, cp.size);
        let (root, hashes, entry) = walk(&paths, cp.size, &ranges, Some(seq))?;
        if root != cp.root {
            return Err(ProofError::Prove(format!(
                "the ledger's first {} entries do not hash to the checkpoint's root",
                cp.size
            )));
        }
        Ok(Proof::Inclusion {
            checkpoint: checkpoint.to_owned(),
            entry: entry.ok_or_else(|| ProofError::Prove(format!("seq {seq} not found")))?,
            hashes,
        })
    }

    /// Proves that the ledger at `old` checkpoint is a prefix of the one at
    /// `new`, from the ledger at `path`.
    pub fn consistency(path: &Path, old: &str, new: &str) -> Result<Proof, ProofError> {
        let paths = Paths::resolve(path);
        let (o, n) = (parse_cp(old)?.checkpoint, parse_cp(new)?.checkpoint);
        if o.origin != n.origin {
            return Err(ProofError::Prove(format!(
                "the checkpoints name different logs: {:?} and {:?}",
                o.origin, n.origin
            )));
        }
        if o.size > n.size {
            return Err(ProofError::Prove(format!(
                "the old checkpoint ({}) is larger than the new one ({}); swap them",
                o.size, n.size
            )));
        }
        let ranges = merkle::consistency_ranges(o.size, n.size);
        let mut all = ranges.clone();
        all.push((0, o.size));
        let (root, mut hashes, _) = walk(&paths, n.size, &all, None)?;
        let old_root = hashes.pop().unwrap_or_default();
        if root != n.root {
            return Err(ProofError::Prove(format!(
                "the ledger's first {} entries do not hash to the new checkpoint's root",
                n.size
            )));
        }
        if o.size > 0 && old_root != o.root {
            return Err(ProofError::Prove(format!(
                "the ledger's first {} entries do not hash to the old checkpoint's root: the \
                 ledger was rewritten since then",
                o.size
            )));
        }
        Ok(Proof::Consistency {
            old: old.to_owned(),
            new: new.to_owned(),
            hashes,
        })
    }

    /// The proof document.
    pub fn to_json(&self) -> Value {
        let hashes = |h: &[Hash]| Value::Array(h.iter().map(|x| B64.encode(x).into()).collect());
        let mut m = Map::new();
        match self {
            Proof::Inclusion {
                checkpoint,
                entry,
                hashes: h,
            } => {
                let size = parse_cp(checkpoint).map_or(0, |c| c.checkpoint.size);
                m.insert("type".into(), INCLUSION.into());
                m.insert("checkpoint".into(), checkpoint.clone().into());
                m.insert("entry".into(), entry.to_value(true));
                m.insert("seq".into(), entry.seq.into());
                m.insert("tree_size".into(), size.into());
                m.insert("proof".into(), hashes(h));
            }
            Proof::Consistency {
                old,
                new,
                hashes: h,
            } => {
                let size = |n: &str| parse_cp(n).map_or(0, |c| c.checkpoint.size);
                m.insert("type".into(), CONSISTENCY.into());
                m.insert("old_checkpoint".into(), old.clone().into());
                m.insert("new_checkpoint".into(), new.clone().into());
                m.insert("old_size".into(), size(old).into());
                m.insert("new_size".into(), size(new).into());
                m.insert("proof".into(), hashes(h));
            }
        }
        Value::Object(m)
    }

    /// Parses a proof document.
    pub fn parse(bytes: &[u8]) -> Result<Proof, ProofError> {
        let err = |m: &str| ProofError::Parse(m.to_owned());
        let Value::Object(m) =
            crate::jcs::parse(bytes).map_err(|e| ProofError::Parse(e.to_string()))?
        else {
            return Err(err("a proof must be a JSON object"));
        };
        let string = |k: &str| match m.get(k) {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(ProofError::Parse(format!("{k} must be a string"))),
        };
        let hashes = match m.get("proof") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .and_then(|s| B64.decode(s).ok())
                        .and_then(|b| Hash::try_from(b).ok())
                        .ok_or_else(|| err("proof must be a list of base64 SHA-256 hashes"))
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(err("proof must be a list of base64 SHA-256 hashes")),
        };
        if hashes.len() > 128 {
            return Err(err("proof is longer than any tree allows"));
        }
        match string("type")?.as_str() {
            INCLUSION => {
                let entry = match m.get("entry") {
                    Some(e @ Value::Object(_)) => {
                        let bytes =
                            crate::jcs::to_vec(e).map_err(|e| ProofError::Parse(e.to_string()))?;
                        Entry::parse(&bytes)
                            .map_err(|e| ProofError::Parse(format!("entry: {e}")))?
                    }
                    _ => return Err(err("entry must be an object")),
                };
                Ok(Proof::Inclusion {
                    checkpoint: string("checkpoint")?,
                    entry,
                    hashes,
                })
            }
            CONSISTENCY => Ok(Proof::Consistency {
                old: string("old_checkpoint")?,
                new: string("new_checkpoint")?,
                hashes,
            }),
            other => Err(ProofError::Parse(format!(
                "type {other:?} is not {INCLUSION:?} or {CONSISTENCY:?}"
            ))),
        }
    }

    /// Verifies the proof. With `key`, every checkpoint it relies on must
    /// carry that key's valid signature; with `trusted`, an inclusion proof
    /// is checked against that checkpoint instead of the one it carries.
    pub fn verify(
        &self,
        key: Option<&VerifierKey>,
        trusted: Option<&SignedCheckpoint>,
    ) -> Result<Verified, ProofError> {
        let bad = |m: String| ProofError::Verify(m);
        let check_sig = |cp: &SignedCheckpoint| -> Result<(), ProofError> {
            match key {
                Some(k) => cp.verify(k).map_err(|e| bad(e.to_string())),
                None => Ok(()),
            }
        };
        match self {
            Proof::Inclusion {
                checkpoint,
                entry,
                hashes,
            } => {
                let cp = match trusted {
                    Some(t) => t.clone(),
                    None => parse_cp(checkpoint)?,
                };
                check_sig(&cp)?;
                let computed = entry.compute_hash().map_err(|e| bad(e.to_string()))?;
                if computed != entry.hash {
                    return Err(bad(format!(
                        "entry seq {}'s content does not match its hash",
                        entry.seq
                    )));
                }
                let leaf = entry.leaf_hash().map_err(|e| bad(e.to_string()))?;
                let c = &cp.checkpoint;
                merkle::verify_inclusion(&leaf, entry.seq, c.size, hashes, &c.root)
                    .map_err(|e| bad(e.to_string()))?;
                Ok(Verified {
                    summary: format!(
                        "entry seq {} (hash {}) is included in {} at size {}",
                        entry.seq,
                        hex::encode(entry.hash),
                        c.origin,
                        c.size
                    ),
                    signature_verified: key.is_some(),
                })
            }
            Proof::Consistency { old, new, hashes } => {
                let (o, n) = (parse_cp(old)?, parse_cp(new)?);
                check_sig(&o)?;
                check_sig(&n)?;
                let (o, n) = (&o.checkpoint, &n.checkpoint);
                if o.origin != n.origin {
                    return Err(bad(format!(
                        "the checkpoints name different logs: {:?} and {:?}",
                        o.origin, n.origin
                    )));
                }
                merkle::verify_consistency(o.size, n.size, &o.root, &n.root, hashes)
                    .map_err(|e| bad(e.to_string()))?;
                Ok(Verified {
                    summary: format!(
                        "{} at size {} is a prefix of its tree at size {}",
                        o.origin, o.size, n.size
                    ),
                    signature_verified: key.is_some(),
                })
            }
        }
    }
}

/// Reads a file of at most `limit` bytes.
pub fn read_limited(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(path)?
        .take(limit + 1)
        .read_to_end(&mut buf)?;
    if buf.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(buf)
}
