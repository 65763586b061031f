//! `cordon ledger …`: append to, verify, checkpoint and prove the evidence
//! ledger.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use cordon_ledger::chain::{self, ChainError, VerifyOptions};
use cordon_ledger::checkpoint::SignedCheckpoint;
use cordon_ledger::keys::{self, CheckKey, PrivateKey, VerifierKey};
use cordon_ledger::ledger::{self, LedgerError};
use cordon_ledger::proof::{Proof, ProofError};
use cordon_ledger::{Ledger, Paths};
use serde_json::{Value, json};

/// Exit codes of the ledger commands (see each command's help).
const INTACT: u8 = 0;
const TAMPERED: u8 = 1;

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Append one entry, durably, and print its seq and hash
    #[command(after_help = "\
Creates the ledger (a directory holding ledger.jsonl) if it does not exist. The entry is on disk
(fsynced) before its seq and hash are printed. Integers above 2^53 in DATA are stored as decimal
strings, so that every JSON reader sees the value that was hashed.

Examples:
  cordon ledger append ./evidence --kind run.start --data '{\"run_id\":\"r1\"}'
  cordon ledger append ./evidence/ledger.jsonl --kind note --data @details.json

Exit status: 0 appended; 2 unusable input (bad JSON, unwritable ledger, damaged last entry).")]
    Append(AppendArgs),
    /// Check every entry, the hash chain and a checkpoint; name the first damage
    #[command(after_help = "\
Streams the ledger in constant memory. Checks each entry's hash against its content, that seq runs
0, 1, 2, … and that each prev is the previous entry's hash; then that the entries hash to the
checkpoint's Merkle root (the checkpoint stored beside the ledger unless --checkpoint is given).
With --key, the checkpoint must carry that key's valid signature. Without a checkpoint, deleting
entries from the end cannot be detected: sign checkpoints with `cordon ledger checkpoint`.

Damage is named with the first bad seq: edited, missing, inserted, reordered, truncated,
checkpoint mismatch or malformed.

Examples:
  cordon ledger verify ./evidence
  cordon ledger verify ./evidence --checkpoint published.checkpoint --key cordon+1a2b3c4d+AQ…

Exit status: 0 intact; 1 tampered (the damage is printed); 2 unusable input.")]
    Verify(VerifyArgs),
    /// Sign a checkpoint (C2SP signed note) over the whole ledger
    #[command(after_help = "\
Verifies the ledger, computes the RFC 6962 Merkle root over all its entries and signs a
c2sp.org/tlog-checkpoint note with an Ed25519 key from `cordon key generate`. The checkpoint is
stored beside the ledger (ledger.checkpoint) and printed. Refuses when the ledger is damaged or is
not an extension of the checkpoint stored before: two inconsistent checkpoints are never signed.
Publish checkpoints somewhere the ledger's host cannot rewrite: that is what makes truncation
and rewriting detectable.

The default origin is cordon.local/ledger/<first 16 hex digits of entry 0's hash>.

Examples:
  cordon ledger checkpoint ./evidence --key ledger.key
  cordon ledger checkpoint ./evidence --key ledger.key --out /mnt/published/cp-$(date +%s)

Exit status: 0 signed; 1 refused (damaged or inconsistent ledger); 2 unusable input.")]
    Checkpoint(CheckpointArgs),
    /// Print an inclusion proof for one entry, or a consistency proof between two checkpoints
    #[command(after_help = "\
With --seq, proves that entry N is in the tree a checkpoint commits to (the ledger's stored
checkpoint unless --checkpoint is given). With --from OLD (and optionally --to NEW, default the
stored checkpoint), proves that OLD's ledger is a prefix of NEW's. The proof is JSON that carries
the checkpoints it relies on; check it anywhere with `cordon ledger verify-proof`.

Examples:
  cordon ledger prove ./evidence --seq 41 > entry41.proof
  cordon ledger prove ./evidence --from cp-old --to cp-new > consistency.proof

Exit status: 0 proof printed; 1 the ledger does not match the checkpoint (damaged or truncated);
2 unusable input.")]
    Prove(ProveArgs),
    /// Check a proof made by `cordon ledger prove`
    #[command(after_help = "\
Examples:
  cordon ledger verify-proof entry41.proof --key cordon+1a2b3c4d+AQ…
  cordon ledger verify-proof entry41.proof --checkpoint trusted.checkpoint --key ledger.vkey

Without --key the checkpoints' signatures are not checked: the proof then only shows internal
consistency. Exit status: 0 valid; 1 invalid; 2 unusable input.")]
    VerifyProof(VerifyProofArgs),
}

#[derive(Debug, Args)]
pub struct AppendArgs {
    /// Ledger directory, or its .jsonl file
    ledger: PathBuf,
    /// What happened, e.g. run.start
    #[arg(long)]
    kind: String,
    /// Details: a JSON object, or @FILE to read it from a file
    #[arg(long)]
    data: String,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Ledger directory, or its .jsonl file
    ledger: PathBuf,
    /// Checkpoint to compare with (default: the one stored beside the ledger)
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Verifier key (vkey string or file) whose signature the checkpoint must carry
    #[arg(long)]
    key: Option<String>,
    /// Print the result as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// Ledger directory, or its .jsonl file
    ledger: PathBuf,
    /// Ed25519 private key file (from `cordon key generate`)
    #[arg(long)]
    key: PathBuf,
    /// Origin line naming this log (default: derived from entry 0)
    #[arg(long)]
    origin: Option<String>,
    /// Also write the checkpoint to FILE
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ProveArgs {
    /// Ledger directory, or its .jsonl file
    ledger: PathBuf,
    /// Prove inclusion of the entry with this seq
    #[arg(long, conflicts_with = "from", required_unless_present = "from")]
    seq: Option<u64>,
    /// Checkpoint to prove inclusion in (default: the stored one)
    #[arg(long, requires = "seq")]
    checkpoint: Option<PathBuf>,
    /// Older checkpoint, for a consistency proof
    #[arg(long)]
    from: Option<PathBuf>,
    /// Newer checkpoint (default: the stored one)
    #[arg(long, requires = "from")]
    to: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct VerifyProofArgs {
    /// Proof file from `cordon ledger prove` (- for standard input)
    proof: PathBuf,
    /// Verifier key (vkey string or file) that must have signed the checkpoints
    #[arg(long)]
    key: Option<String>,
    /// Trusted checkpoint to check an inclusion proof against, instead of the one it carries
    #[arg(long)]
    checkpoint: Option<PathBuf>,
}

impl LedgerCommand {
    pub fn run(self) -> anyhow::Result<u8> {
        match self {
            LedgerCommand::Append(a) => append(a),
            LedgerCommand::Verify(a) => verify(a),
            LedgerCommand::Checkpoint(a) => checkpoint(a),
            LedgerCommand::Prove(a) => prove(a),
            LedgerCommand::VerifyProof(a) => verify_proof(a),
        }
    }
}

/// Reads a JSON argument given inline or as @FILE.
pub fn json_arg(flag: &str, arg: &str) -> anyhow::Result<Value> {
    let (source, bytes) = match arg.strip_prefix('@') {
        Some(file) => (
            file.to_owned(),
            cordon_ledger::proof::read_limited(Path::new(file), 1 << 20)
                .with_context(|| format!("{flag}: cannot read {file}"))?,
        ),
        None => (flag.to_owned(), arg.as_bytes().to_vec()),
    };
    // Integers above 2^53 become strings of their exact digits: the
    // ledger's rule (see `cordon ledger append --help`).
    cordon_ledger::jcs::parse_big_integers_as_strings(&bytes)
        .with_context(|| format!("{source}: not valid JSON"))
}

fn append(a: AppendArgs) -> anyhow::Result<u8> {
    let data = json_arg("--data", &a.data)?;
    if !data.is_object() {
        bail!("--data: must be a JSON object, e.g. '{{\"key\":\"value\"}}'");
    }
    let ledger = Ledger::open(&a.ledger)?;
    if let Some(r) = ledger.repair() {
        eprintln!(
            "cordon: {}: repaired an unfinished last line left by a crash ({} bytes at offset {}, {}{})",
            ledger.paths().file.display(),
            r.bytes,
            r.offset,
            r.action,
            r.saved_to
                .as_ref()
                .map(|p| format!(", saved to {}", p.display()))
                .unwrap_or_default()
        );
    }
    let head = ledger.append(&a.kind, data)?;
    println!("{}", json!({"seq": head.seq, "hash": head.hash_hex()}));
    Ok(0)
}

fn load_verifier(arg: &str) -> anyhow::Result<VerifierKey> {
    match keys::load_check_key(arg)? {
        CheckKey::Ed25519(k) => Ok(k),
        CheckKey::Hmac(_) => bail!(
            "--key {arg}: an HMAC key cannot verify a checkpoint; give the Ed25519 verifier key (vkey)"
        ),
    }
}

fn load_cp(path: &Path) -> anyhow::Result<SignedCheckpoint> {
    Ok(chain::read_checkpoint(path)?)
}

fn verify(a: VerifyArgs) -> anyhow::Result<u8> {
    let paths = Paths::resolve(&a.ledger);
    let opts = VerifyOptions {
        checkpoint: a.checkpoint.as_deref().map(load_cp).transpose()?,
        key: a.key.as_deref().map(load_verifier).transpose()?,
    };
    let report = match chain::verify(&paths, &opts) {
        Ok(r) => r,
        Err(ChainError::Open { path, source }) if source.kind() == std::io::ErrorKind::NotFound => {
            bail!(
                "{}: no such ledger (give a ledger directory or its .jsonl file)",
                path.display()
            )
        }
        Err(e) => return Err(e.into()),
    };
    let file = report.path.display();
    if a.json {
        let out = json!({
            "path": report.path.display().to_string(),
            "intact": report.intact(),
            "entries": report.entries,
            "bytes": report.bytes,
            "head": report.head.map(|(seq, h)| json!({"seq": seq, "hash": hex::encode(h)})),
            "root": hex::encode(report.root),
            "torn_tail_bytes": report.torn_tail,
            "checkpoint": report.checkpoint.as_ref().map(|c| json!({
                "origin": c.origin, "size": c.size, "signature_verified": c.signature_verified,
            })),
            "damage": report.damage.as_ref().map(|d| json!({
                "kind": d.kind.as_str(), "seq": d.seq, "line": d.line, "detail": d.detail,
            })),
        });
        println!("{out}");
    } else if let Some(d) = &report.damage {
        match d.line {
            Some(line) => println!("tampered: {file}:{line}: {d}"),
            None => println!("tampered: {file}: {d}"),
        }
    } else {
        let head = report
            .head
            .map(|(seq, h)| format!(", head seq {seq} hash {}", hex::encode(h)))
            .unwrap_or_default();
        let cp = match &report.checkpoint {
            Some(c) if c.signature_verified => {
                format!(
                    "; matches checkpoint {} at size {} (signature verified)",
                    c.origin, c.size
                )
            }
            Some(c) => format!(
                "; matches checkpoint {} at size {} (signature not checked: pass --key)",
                c.origin, c.size
            ),
            None => {
                "; no checkpoint to compare with (truncation at the end is undetectable)".to_owned()
            }
        };
        println!("intact: {file}: {} entries{head}{cp}", report.entries);
    }
    if let Some(torn) = report.torn_tail {
        eprintln!(
            "cordon: {file}: note: ends with {torn} bytes of an unfinished entry (a crash during \
             append; never acknowledged); the next append repairs it"
        );
    }
    Ok(if report.intact() { INTACT } else { TAMPERED })
}

fn checkpoint(a: CheckpointArgs) -> anyhow::Result<u8> {
    let key = match keys::load_private(&a.key)? {
        PrivateKey::Ed25519(k) => k,
        PrivateKey::Hmac(_) => bail!(
            "--key {}: checkpoints are signed with an Ed25519 key, not an HMAC key; make one with `cordon key generate --type ed25519`",
            a.key.display()
        ),
    };
    let signed = match ledger::sign_checkpoint(&a.ledger, &key, a.origin.as_deref()) {
        Ok(s) => s,
        Err(e @ (LedgerError::Unsound { .. } | LedgerError::Inconsistent { .. })) => {
            eprintln!("cordon: {e}");
            return Ok(TAMPERED);
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(out) = &a.out {
        std::fs::write(out, &signed.note)
            .with_context(|| format!("cannot write {}", out.display()))?;
    }
    std::io::stdout().write_all(signed.note.as_bytes())?;
    Ok(0)
}

fn read_text(path: &Path, what: &str) -> anyhow::Result<String> {
    const LIMIT: u64 = 1 << 22;
    let bytes = if path == Path::new("-") {
        let mut b = Vec::new();
        std::io::stdin()
            .take(LIMIT)
            .read_to_end(&mut b)
            .context("cannot read standard input")?;
        b
    } else {
        cordon_ledger::proof::read_limited(path, LIMIT)
            .with_context(|| format!("cannot read {what} {}", path.display()))?
    };
    String::from_utf8(bytes).with_context(|| format!("{}: not UTF-8 text", path.display()))
}

fn prove(a: ProveArgs) -> anyhow::Result<u8> {
    let paths = Paths::resolve(&a.ledger);
    let stored = || -> anyhow::Result<String> {
        if !paths.checkpoint.exists() {
            bail!(
                "{}: no checkpoint stored for this ledger; sign one with `cordon ledger checkpoint` or pass one",
                paths.checkpoint.display()
            );
        }
        read_text(&paths.checkpoint, "checkpoint")
    };
    let result = match (a.seq, &a.from) {
        (Some(seq), _) => {
            let cp = match &a.checkpoint {
                Some(p) => read_text(p, "checkpoint")?,
                None => stored()?,
            };
            Proof::inclusion(&a.ledger, seq, &cp)
        }
        (None, Some(from)) => {
            let old = read_text(from, "checkpoint")?;
            let new = match &a.to {
                Some(p) => read_text(p, "checkpoint")?,
                None => stored()?,
            };
            Proof::consistency(&a.ledger, &old, &new)
        }
        (None, None) => bail!("give --seq N or --from OLD"),
    };
    match result {
        Ok(p) => {
            println!("{}", p.to_json());
            Ok(0)
        }
        Err(e @ ProofError::Prove(_)) => {
            eprintln!("cordon: {}: {e}", paths.file.display());
            Ok(TAMPERED)
        }
        Err(e) => Err(e.into()),
    }
}

fn verify_proof(a: VerifyProofArgs) -> anyhow::Result<u8> {
    let text = read_text(&a.proof, "proof")?;
    let proof = Proof::parse(text.as_bytes()).with_context(|| format!("{}", a.proof.display()))?;
    let key = a.key.as_deref().map(load_verifier).transpose()?;
    let trusted = a.checkpoint.as_deref().map(load_cp).transpose()?;
    match proof.verify(key.as_ref(), trusted.as_ref()) {
        Ok(v) => {
            let note = if v.signature_verified {
                " (checkpoint signatures verified)"
            } else {
                " (checkpoint signatures NOT checked: pass --key)"
            };
            println!("valid: {}{note}", v.summary);
            Ok(0)
        }
        Err(e) => {
            println!("invalid: {}: {e}", a.proof.display());
            Ok(TAMPERED)
        }
    }
}
