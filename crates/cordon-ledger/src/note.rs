//! C2SP signed notes (`c2sp.org/signed-note`): UTF-8 text ending in a
//! newline, a blank line, then one line per signature,
//! `— <name> <base64(key id ‖ signature)>`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use thiserror::Error;

use crate::keys::{SigningKey, VerifierKey, check_name};

/// Notes larger than this are refused unread.
pub const MAX_NOTE: usize = 1 << 20;

/// Most signature lines accepted on one note.
pub const MAX_SIGNATURES: usize = 100;

/// What is wrong with a note.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum NoteError {
    /// The bytes are not a signed note.
    #[error("malformed signed note: {0}")]
    Parse(String),
    /// Text offered for signing is not note text.
    #[error("cannot sign: {0}")]
    Sign(String),
    /// No signature by the key.
    #[error("note is not signed by key {0}")]
    Unsigned(String),
    /// A signature by the key does not verify.
    #[error("note signature by key {0} does not verify")]
    BadSignature(String),
}

/// One signature line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// The signer's key name.
    pub name: String,
    /// The signer's 4-byte key id.
    pub key_id: [u8; 4],
    /// The signature bytes (64 for Ed25519).
    pub sig: Vec<u8>,
}

/// A parsed signed note. Its text must be ignored until a trusted key's
/// signature on it has been verified ([`Note::verify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The signed text, ending in a newline.
    pub text: String,
    /// The signatures, in order.
    pub sigs: Vec<Signature>,
}

/// Checks text can be a note's body: valid UTF-8 (by type), non-empty,
/// ending in a newline, without a blank line, with no control characters
/// other than newline.
fn check_text(text: &str) -> Result<(), String> {
    if !text.ends_with('\n') {
        return Err("text must end with a newline".to_owned());
    }
    if text.contains("\n\n") || text.starts_with('\n') {
        return Err("text must not contain a blank line".to_owned());
    }
    if text.chars().any(|c| c.is_control() && c != '\n') {
        return Err("text contains a control character".to_owned());
    }
    Ok(())
}

impl Note {
    /// Parses a signed note, checking its form but no signature.
    pub fn parse(bytes: &[u8]) -> Result<Note, NoteError> {
        let err = |m: &str| NoteError::Parse(m.to_owned());
        if bytes.len() > MAX_NOTE {
            return Err(err("larger than 1 MiB"));
        }
        let s = std::str::from_utf8(bytes).map_err(|_| err("not UTF-8"))?;
        let split = s
            .rfind("\n\n")
            .ok_or_else(|| err("no blank line between text and signatures"))?;
        let (text, sigs) = (&s[..split + 1], &s[split + 2..]);
        check_text(text).map_err(NoteError::Parse)?;
        if sigs.is_empty() || !sigs.ends_with('\n') {
            return Err(err("signature lines must end with a newline"));
        }
        let mut out = Vec::new();
        for line in sigs[..sigs.len() - 1].split('\n') {
            if out.len() == MAX_SIGNATURES {
                return Err(err("more than 100 signatures"));
            }
            let rest = line
                .strip_prefix("\u{2014} ")
                .ok_or_else(|| err("a signature line must start with \"— \""))?;
            let (name, b64) = rest
                .split_once(' ')
                .ok_or_else(|| err("a signature line is \"— <name> <signature>\""))?;
            check_name(name).map_err(|e| NoteError::Parse(e.to_string()))?;
            let raw = B64
                .decode(b64)
                .map_err(|_| err("a signature is not valid base64"))?;
            if raw.len() < 5 {
                return Err(err("a signature is shorter than its key id"));
            }
            out.push(Signature {
                name: name.to_owned(),
                key_id: [raw[0], raw[1], raw[2], raw[3]],
                sig: raw[4..].to_vec(),
            });
        }
        Ok(Note {
            text: text.to_owned(),
            sigs: out,
        })
    }

    /// Signs `text` with `key`, returning the note's bytes.
    pub fn sign(text: &str, key: &SigningKey) -> Result<String, NoteError> {
        check_text(text).map_err(NoteError::Sign)?;
        let note = Note {
            text: text.to_owned(),
            sigs: vec![Signature {
                name: key.name().to_owned(),
                key_id: key.key_id(),
                sig: key.sign(text.as_bytes()).to_vec(),
            }],
        };
        Ok(note.to_string())
    }

    /// Checks that `key` signed this note: some signature line carries the
    /// key's name and id, and its signature verifies. Signatures by other
    /// keys are ignored (cosigners, witnesses).
    pub fn verify(&self, key: &VerifierKey) -> Result<(), NoteError> {
        let mut found = false;
        for s in &self.sigs {
            if s.name == key.name() && s.key_id == key.key_id() {
                found = true;
                if key.verify(self.text.as_bytes(), &s.sig) {
                    return Ok(());
                }
            }
        }
        if found {
            Err(NoteError::BadSignature(key.to_vkey()))
        } else {
            Err(NoteError::Unsigned(key.to_vkey()))
        }
    }
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.text)?;
        for s in &self.sigs {
            let mut raw = s.key_id.to_vec();
            raw.extend_from_slice(&s.sig);
            writeln!(f, "\u{2014} {} {}", s.name, B64.encode(raw))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SKEY: &str =
        "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz";
    const VKEY: &str = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
    const TEXT: &str = "If you think cryptography is the answer to your problem,\n\
                        then you don't know what your problem is.\n";
    const SIGNED: &str = "If you think cryptography is the answer to your problem,\n\
        then you don't know what your problem is.\n\
        \n\
        — PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n";

    #[test]
    fn go_note_example_signs_byte_for_byte() {
        let key = SigningKey::parse(SKEY).unwrap();
        assert_eq!(Note::sign(TEXT, &key).unwrap(), SIGNED);
    }

    #[test]
    fn go_note_example_verifies_and_round_trips() {
        let note = Note::parse(SIGNED.as_bytes()).unwrap();
        assert_eq!(note.text, TEXT);
        assert_eq!(note.to_string(), SIGNED);
        note.verify(&VerifierKey::parse(VKEY).unwrap()).unwrap();
    }

    #[test]
    fn c2sp_spec_example_verifies() {
        // The example in the c2sp.org/signed-note specification.
        let vkey = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k";
        let note = "This is an example message.\n\n\u{2014} example.com/foo \
            Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n";
        Note::parse(note.as_bytes())
            .unwrap()
            .verify(&VerifierKey::parse(vkey).unwrap())
            .unwrap();
    }

    #[test]
    fn edited_text_or_signature_fails_and_other_keys_are_ignored() {
        let key = VerifierKey::parse(VKEY).unwrap();
        let edited = SIGNED.replace("cryptography", "cryptographY");
        assert_eq!(
            Note::parse(edited.as_bytes()).unwrap().verify(&key),
            Err(NoteError::BadSignature(VKEY.to_owned()))
        );
        let other = SigningKey::generate("other").unwrap();
        let by_other = Note::sign(TEXT, &other).unwrap();
        assert_eq!(
            Note::parse(by_other.as_bytes()).unwrap().verify(&key),
            Err(NoteError::Unsigned(VKEY.to_owned()))
        );
        // Cosigned: a second, foreign signature line does not hurt.
        let cosigned = format!("{SIGNED}{}", by_other.rsplit("\n\n").next().unwrap());
        let note = Note::parse(cosigned.as_bytes()).unwrap();
        assert_eq!(note.sigs.len(), 2);
        note.verify(&key).unwrap();
        note.verify(&other.verifier()).unwrap();
    }

    #[test]
    fn malformed_notes_are_refused() {
        for bad in [
            "",
            "text\n",
            "text\n\n",
            "text\n\n— PeterNeumann x08go\n",
            "text\n\n- PeterNeumann AAAAAAAA\n",
            "text\n\n— Peter Neumann AAAAAAAA\n",
            "text\n\n— PeterNeumann AAAAAAAA",
            "te\u{1}xt\n\n— PeterNeumann AAAAAAAA\n",
            "text\n\n— PeterNeumann !!!!\n",
        ] {
            assert!(Note::parse(bad.as_bytes()).is_err(), "{bad:?}");
        }
        assert!(Note::parse(&[0xff, b'\n', b'\n']).is_err());
        let key = SigningKey::parse(SKEY).unwrap();
        assert!(Note::sign("no newline", &key).is_err());
        assert!(Note::sign("a\n\nb\n", &key).is_err());
    }
}
