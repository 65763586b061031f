//! Checkpoints (`c2sp.org/tlog-checkpoint`): the signed note whose text is
//! the log's origin line, its size in entries, and the base64 RFC 6962 root
//! over those entries, optionally followed by extension lines.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use thiserror::Error;

use crate::keys::{SigningKey, VerifierKey};
use crate::merkle::Hash;
use crate::note::{Note, NoteError};

/// What is wrong with a checkpoint.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CheckpointError {
    /// The note is not well formed.
    #[error(transparent)]
    Note(#[from] NoteError),
    /// The note's text is not a checkpoint body.
    #[error("malformed checkpoint: {0}")]
    Parse(String),
    /// An origin that cannot be written in a checkpoint.
    #[error("origin {0:?} is not valid: it must be one non-empty line without control characters")]
    Origin(String),
}

/// A checkpoint's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Names the log; unique per log.
    pub origin: String,
    /// Number of entries committed to.
    pub size: u64,
    /// RFC 6962 Merkle tree head over entries `0..size`.
    pub root: Hash,
    /// Extension lines, if any.
    pub extensions: Vec<String>,
}

impl Checkpoint {
    /// The note text.
    pub fn body(&self) -> String {
        let mut s = format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            B64.encode(self.root)
        );
        for e in &self.extensions {
            s.push_str(e);
            s.push('\n');
        }
        s
    }

    /// Parses note text as a checkpoint body.
    pub fn parse_body(text: &str) -> Result<Checkpoint, CheckpointError> {
        let err = |m: &str| CheckpointError::Parse(m.to_owned());
        let body = text
            .strip_suffix('\n')
            .ok_or_else(|| err("text must end with a newline"))?;
        let mut lines = body.split('\n');
        let origin = lines.next().unwrap_or_default();
        check_origin(origin)?;
        let size_line = lines
            .next()
            .ok_or_else(|| err("missing the tree size line"))?;
        if size_line.is_empty()
            || !size_line.bytes().all(|b| b.is_ascii_digit())
            || (size_line.len() > 1 && size_line.starts_with('0'))
        {
            return Err(err(
                "the tree size must be a decimal number without leading zeros",
            ));
        }
        let size: u64 = size_line
            .parse()
            .map_err(|_| err("the tree size is too large"))?;
        let root_line = lines
            .next()
            .ok_or_else(|| err("missing the root hash line"))?;
        let root: Hash = B64
            .decode(root_line)
            .ok()
            .and_then(|r| r.try_into().ok())
            .ok_or_else(|| err("the root hash must be 32 bytes in base64"))?;
        let extensions: Vec<String> = lines.map(str::to_owned).collect();
        if extensions.iter().any(String::is_empty) {
            return Err(err("empty extension line"));
        }
        Ok(Checkpoint {
            origin: origin.to_owned(),
            size,
            root,
            extensions,
        })
    }

    /// Signs this checkpoint, returning the signed note's bytes.
    pub fn sign(&self, key: &SigningKey) -> Result<String, CheckpointError> {
        check_origin(&self.origin)?;
        Ok(Note::sign(&self.body(), key)?)
    }
}

fn check_origin(origin: &str) -> Result<(), CheckpointError> {
    if origin.is_empty() || origin.chars().any(char::is_control) {
        return Err(CheckpointError::Origin(origin.to_owned()));
    }
    Ok(())
}

/// A checkpoint together with the note that carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedCheckpoint {
    /// The content.
    pub checkpoint: Checkpoint,
    /// The note (text and signatures).
    pub note: Note,
}

impl SignedCheckpoint {
    /// Parses a signed checkpoint note. Checks form only: call
    /// [`SignedCheckpoint::verify`] before trusting it.
    pub fn parse(bytes: &[u8]) -> Result<SignedCheckpoint, CheckpointError> {
        let note = Note::parse(bytes)?;
        let checkpoint = Checkpoint::parse_body(&note.text)?;
        Ok(SignedCheckpoint { checkpoint, note })
    }

    /// Checks the signature of `key`.
    pub fn verify(&self, key: &VerifierKey) -> Result<(), CheckpointError> {
        Ok(self.note.verify(key)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_parse_verify_round_trip() {
        let key = SigningKey::generate("cordon.test/k").unwrap();
        let cp = Checkpoint {
            origin: "cordon.local/ledger/abc".into(),
            size: 42,
            root: [7; 32],
            extensions: vec![],
        };
        let signed = cp.sign(&key).unwrap();
        assert!(signed.starts_with(
            "cordon.local/ledger/abc\n42\nBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\n\n\u{2014} cordon.test/k "
        ));
        let parsed = SignedCheckpoint::parse(signed.as_bytes()).unwrap();
        assert_eq!(parsed.checkpoint, cp);
        parsed.verify(&key.verifier()).unwrap();
        let forged = signed.replace("\n42\n", "\n43\n");
        let forged = SignedCheckpoint::parse(forged.as_bytes()).unwrap();
        assert!(forged.verify(&key.verifier()).is_err());
    }

    #[test]
    fn malformed_bodies_are_refused() {
        let root = B64.encode([1u8; 32]);
        for bad in [
            "origin\n".to_owned(),
            format!("origin\n01\n{root}\n"),
            format!("origin\n-1\n{root}\n"),
            format!("origin\n18446744073709551616\n{root}\n"),
            "origin\n1\nAAAA\n".to_owned(),
            format!("\n1\n{root}\n"),
            format!("origin\n1\n{root}"),
        ] {
            assert!(Checkpoint::parse_body(&bad).is_err(), "{bad:?}");
        }
        let ok = Checkpoint::parse_body(&format!("o\n0\n{root}\next\n")).unwrap();
        assert_eq!(ok.extensions, ["ext"]);
    }
}
