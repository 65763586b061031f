//! Keys: Ed25519 signing keys in the Go `note` encoding, their signed-note
//! verifier keys (`vkey`), and HMAC-SHA-256 secrets; generation, and files
//! that only their owner can read.
//!
//! Formats (one line each, newline-terminated):
//! - Ed25519 private key: `PRIVATE+KEY+<name>+<hex key id>+<base64(0x01 ‖ seed)>`,
//!   as `golang.org/x/mod/sumdb/note` writes it.
//! - Ed25519 verifier key: `<name>+<hex key id>+<base64(0x01 ‖ public key)>`
//!   (C2SP signed-note), where the key id is the first 4 bytes of
//!   `SHA-256(name ‖ 0x0A ‖ 0x01 ‖ public key)`.
//! - HMAC key: the 32-byte secret as 64 hex digits.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::Signer;
use rand_core::{OsRng, RngCore};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// The signed-note signature type byte for Ed25519.
pub const ALG_ED25519: u8 = 0x01;

/// Key files are small; anything larger is not a key.
const MAX_KEY_FILE: u64 = 4096;

/// What went wrong with a key or a key file.
#[derive(Debug, Error)]
pub enum KeyError {
    /// A key string does not parse.
    #[error("{what}: {reason}")]
    Parse {
        /// Which kind of key was expected.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A key name is not usable in a signed note.
    #[error("key name {name:?} is not valid: {reason}")]
    Name {
        /// The name.
        name: String,
        /// Why not.
        reason: &'static str,
    },
    /// A key file could not be read.
    #[error("cannot read key file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A private key file can be read by others.
    #[error(
        "key file {path} is readable by others (mode {mode:04o}); \
         a private key must be the owner's alone: run `chmod 600 {path}`"
    )]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A key file could not be written.
    #[error("cannot write key file {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A key file holds something else.
    #[error("key file {path}: {reason}")]
    Content {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Checks a signed-note key name: non-empty, no `+`, no whitespace or
/// control characters.
pub fn check_name(name: &str) -> Result<(), KeyError> {
    let bad = |reason| {
        Err(KeyError::Name {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.contains('+') {
        return bad("it contains '+'");
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("it contains whitespace or a control character");
    }
    Ok(())
}

/// The 4-byte signed-note key id of an Ed25519 public key under `name`.
pub fn key_id(name: &str, public: &[u8; 32]) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update([b'\n', ALG_ED25519]);
    h.update(public);
    let d = h.finalize();
    [d[0], d[1], d[2], d[3]]
}

/// An Ed25519 signing key with its signed-note name.
#[derive(Clone)]
pub struct SigningKey {
    name: String,
    key: ed25519_dalek::SigningKey,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("name", &self.name)
            .field("key_id", &hex::encode(self.key_id()))
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Generates a fresh key from the operating system's random source.
    pub fn generate(name: &str) -> Result<SigningKey, KeyError> {
        check_name(name)?;
        let mut seed = [0u8; 32];
        OsRng.fill_bytes(&mut seed);
        Ok(SigningKey::from_seed(name, seed))
    }

    fn from_seed(name: &str, seed: [u8; 32]) -> SigningKey {
        SigningKey {
            name: name.to_owned(),
            key: ed25519_dalek::SigningKey::from_bytes(&seed),
        }
    }

    /// Parses `PRIVATE+KEY+<name>+<hex id>+<base64(0x01 ‖ seed)>`.
    pub fn parse(s: &str) -> Result<SigningKey, KeyError> {
        let err = |reason: &str| KeyError::Parse {
            what: "Ed25519 private key",
            reason: reason.to_owned(),
        };
        let rest = s
            .strip_prefix("PRIVATE+KEY+")
            .ok_or_else(|| err("it does not start with PRIVATE+KEY+"))?;
        let mut parts = rest.splitn(3, '+');
        let (Some(name), Some(id), Some(b64)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(err("expected PRIVATE+KEY+<name>+<key id>+<key>"));
        };
        check_name(name)?;
        let raw = B64
            .decode(b64)
            .map_err(|_| err("the key is not valid base64"))?;
        if raw.len() != 33 || raw[0] != ALG_ED25519 {
            return Err(err(
                "the key is not 0x01 followed by a 32-byte Ed25519 seed",
            ));
        }
        let mut seed = [0u8; 32];
        seed.copy_from_slice(&raw[1..]);
        let key = SigningKey::from_seed(name, seed);
        if hex::encode(key.key_id()) != id {
            return Err(err("the key id does not match the name and key"));
        }
        Ok(key)
    }

    /// The private key string.
    pub fn to_skey(&self) -> String {
        let mut raw = vec![ALG_ED25519];
        raw.extend_from_slice(self.key.as_bytes());
        format!(
            "PRIVATE+KEY+{}+{}+{}",
            self.name,
            hex::encode(self.key_id()),
            B64.encode(raw)
        )
    }

    /// The key's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The signed-note key id.
    pub fn key_id(&self) -> [u8; 4] {
        key_id(&self.name, self.key.verifying_key().as_bytes())
    }

    /// The matching verifier key.
    pub fn verifier(&self) -> VerifierKey {
        VerifierKey {
            name: self.name.clone(),
            id: self.key_id(),
            key: self.key.verifying_key(),
        }
    }

    /// Signs `msg`.
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        self.key.sign(msg).to_bytes()
    }
}

/// An Ed25519 verifier key in signed-note form.
#[derive(Clone, PartialEq, Eq)]
pub struct VerifierKey {
    name: String,
    id: [u8; 4],
    key: ed25519_dalek::VerifyingKey,
}

impl fmt::Debug for VerifierKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_vkey())
    }
}

impl VerifierKey {
    /// Parses `<name>+<hex id>+<base64(0x01 ‖ public key)>`.
    pub fn parse(s: &str) -> Result<VerifierKey, KeyError> {
        let err = |reason: &str| KeyError::Parse {
            what: "verifier key",
            reason: reason.to_owned(),
        };
        let mut parts = s.splitn(3, '+');
        let (Some(name), Some(id), Some(b64)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(err("expected <name>+<key id>+<base64 key>"));
        };
        check_name(name)?;
        if id.len() != 8 || !id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(err("the key id is not 8 lowercase hex digits"));
        }
        let raw = B64
            .decode(b64)
            .map_err(|_| err("the key is not valid base64"))?;
        if raw.len() != 33 || raw[0] != ALG_ED25519 {
            return Err(err(
                "the key is not 0x01 followed by a 32-byte Ed25519 public key",
            ));
        }
        let mut public = [0u8; 32];
        public.copy_from_slice(&raw[1..]);
        let key = ed25519_dalek::VerifyingKey::from_bytes(&public)
            .map_err(|_| err("the public key is not a valid Ed25519 point"))?;
        let want = key_id(name, &public);
        if hex::encode(want) != id {
            return Err(err("the key id does not match the name and key"));
        }
        Ok(VerifierKey {
            name: name.to_owned(),
            id: want,
            key,
        })
    }

    /// The `vkey` string.
    pub fn to_vkey(&self) -> String {
        let mut raw = vec![ALG_ED25519];
        raw.extend_from_slice(self.key.as_bytes());
        format!("{}+{}+{}", self.name, hex::encode(self.id), B64.encode(raw))
    }

    /// The key's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The signed-note key id.
    pub fn key_id(&self) -> [u8; 4] {
        self.id
    }

    /// Whether `sig` is this key's signature of `msg` (strict RFC 8032
    /// verification: no malleable or small-order forms).
    pub fn verify(&self, msg: &[u8], sig: &[u8]) -> bool {
        let Ok(sig) = ed25519_dalek::Signature::from_slice(sig) else {
            return false;
        };
        self.key.verify_strict(msg, &sig).is_ok()
    }
}

/// A 32-byte HMAC-SHA-256 secret.
#[derive(Clone)]
pub struct HmacKey {
    secret: [u8; 32],
}

impl fmt::Debug for HmacKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HmacKey")
            .field("key_id", &self.key_id())
            .finish_non_exhaustive()
    }
}

impl HmacKey {
    /// Generates a fresh secret.
    pub fn generate() -> HmacKey {
        let mut secret = [0u8; 32];
        OsRng.fill_bytes(&mut secret);
        HmacKey { secret }
    }

    /// Parses 64 hex digits.
    pub fn parse(s: &str) -> Result<HmacKey, KeyError> {
        let err = |reason: String| KeyError::Parse {
            what: "HMAC key",
            reason,
        };
        if s.len() != 64 {
            return Err(err(format!(
                "expected 64 hex digits (a 32-byte secret), found {} characters",
                s.chars().count()
            )));
        }
        let mut secret = [0u8; 32];
        hex::decode_to_slice(s, &mut secret).map_err(|_| err("not hex digits".to_owned()))?;
        Ok(HmacKey { secret })
    }

    /// The secret.
    pub fn secret(&self) -> &[u8; 32] {
        &self.secret
    }

    /// The file form: 64 hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.secret)
    }

    /// A public name for the secret: the first 4 bytes of
    /// `SHA-256("cordon-hmac-key-id\n" ‖ secret)`, in hex. Tells keys apart
    /// without revealing anything usable about them.
    pub fn key_id(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"cordon-hmac-key-id\n");
        h.update(self.secret);
        hex::encode(&h.finalize()[..4])
    }
}

/// A private key of either kind, as read from a key file.
#[derive(Debug, Clone)]
pub enum PrivateKey {
    /// An Ed25519 signing key (boxed: it is much larger than an HMAC key).
    Ed25519(Box<SigningKey>),
    /// An HMAC secret.
    Hmac(HmacKey),
}

impl PrivateKey {
    /// Parses either private key form.
    pub fn parse(s: &str) -> Result<PrivateKey, KeyError> {
        if s.starts_with("PRIVATE+KEY+") {
            SigningKey::parse(s).map(|k| PrivateKey::Ed25519(Box::new(k)))
        } else if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
            HmacKey::parse(s).map(PrivateKey::Hmac)
        } else {
            Err(KeyError::Parse {
                what: "private key",
                reason: "expected an Ed25519 key (PRIVATE+KEY+…) or an HMAC key (64 hex digits)"
                    .to_owned(),
            })
        }
    }

    /// The file form (without newline).
    pub fn to_file_string(&self) -> String {
        match self {
            PrivateKey::Ed25519(k) => k.to_skey(),
            PrivateKey::Hmac(k) => k.to_hex(),
        }
    }
}

/// Writes a private key to a new file created with mode 0600; refuses to
/// overwrite an existing file.
pub fn write_private(path: &Path, key: &PrivateKey) -> Result<(), KeyError> {
    let werr = |source| KeyError::Write {
        path: path.to_owned(),
        source,
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(werr)?;
    // The mode given to open is filtered by the umask; 0600 survives any
    // umask, but set it explicitly so the file is never wider.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(werr)?;
    f.write_all(format!("{}\n", key.to_file_string()).as_bytes())
        .map_err(werr)?;
    f.sync_all().map_err(werr)
}

/// Writes a public file (a verifier key); refuses to overwrite.
pub fn write_public(path: &Path, contents: &str) -> Result<(), KeyError> {
    let werr = |source| KeyError::Write {
        path: path.to_owned(),
        source,
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map_err(werr)?;
    f.write_all(format!("{contents}\n").as_bytes())
        .map_err(werr)?;
    f.sync_all().map_err(werr)
}

/// Reads a key file's single line. With `private`, refuses a file whose mode
/// lets group or others read, write or execute it (checked on the opened
/// file, so a swap between check and read cannot pass).
pub fn read_key_file(path: &Path, private: bool) -> Result<String, KeyError> {
    let (line, mode) = read_key_line(path)?;
    if private {
        check_private_mode(path, mode)?;
    }
    Ok(line)
}

fn check_private_mode(path: &Path, mode: u32) -> Result<(), KeyError> {
    if mode & 0o077 != 0 {
        return Err(KeyError::Permissions {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

/// A key file's single line and the permission bits of the file it was
/// read from.
fn read_key_line(path: &Path) -> Result<(String, u32), KeyError> {
    let rerr = |source| KeyError::Read {
        path: path.to_owned(),
        source,
    };
    let f = File::open(path).map_err(rerr)?;
    let meta = f.metadata().map_err(rerr)?;
    if !meta.is_file() {
        return Err(KeyError::Content {
            path: path.to_owned(),
            reason: "not a regular file".to_owned(),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    let mut buf = Vec::new();
    f.take(MAX_KEY_FILE + 1)
        .read_to_end(&mut buf)
        .map_err(rerr)?;
    let content = |reason: &str| KeyError::Content {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    if buf.len() as u64 > MAX_KEY_FILE {
        return Err(content("too large to be a key file"));
    }
    let text = String::from_utf8(buf).map_err(|_| content("not UTF-8 text"))?;
    let line = text.strip_suffix('\n').unwrap_or(&text);
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.contains('\n') {
        return Err(content("expected exactly one line"));
    }
    if line.is_empty() {
        return Err(content("empty"));
    }
    Ok((line.to_owned(), mode))
}

/// Reads a private key file (mode must deny group and others).
pub fn load_private(path: &Path) -> Result<PrivateKey, KeyError> {
    let line = read_key_file(path, true)?;
    PrivateKey::parse(&line).map_err(|e| KeyError::Content {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// A key that checks signatures: a verifier key, or an HMAC secret.
#[derive(Debug, Clone)]
pub enum CheckKey {
    /// Ed25519 verifier key.
    Ed25519(VerifierKey),
    /// HMAC secret (can also sign: keep it private).
    Hmac(HmacKey),
}

/// Resolves `--key ARG`: a file holding a vkey, an HMAC key or a private
/// Ed25519 key (whose verifier is used), or else an inline vkey string.
pub fn load_check_key(arg: &str) -> Result<CheckKey, KeyError> {
    let path = Path::new(arg);
    if path.exists() {
        let (line, mode) = read_key_line(path)?;
        let content = |e: KeyError| KeyError::Content {
            path: path.to_owned(),
            reason: e.to_string(),
        };
        if line.starts_with("PRIVATE+KEY+") || (line.len() == 64 && !line.contains('+')) {
            // A secret: hold it to the private-file rule.
            check_private_mode(path, mode)?;
            return Ok(match PrivateKey::parse(&line).map_err(content)? {
                PrivateKey::Ed25519(k) => CheckKey::Ed25519(k.verifier()),
                PrivateKey::Hmac(k) => CheckKey::Hmac(k),
            });
        }
        return VerifierKey::parse(&line)
            .map(CheckKey::Ed25519)
            .map_err(content);
    }
    if arg.contains('+') {
        return VerifierKey::parse(arg).map(CheckKey::Ed25519);
    }
    Err(KeyError::Read {
        path: path.to_owned(),
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such file (and not an inline verifier key name+id+key)",
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SKEY: &str =
        "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz";
    const VKEY: &str = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";

    #[test]
    fn go_note_example_keys_round_trip() {
        let k = SigningKey::parse(SKEY).unwrap();
        assert_eq!(k.to_skey(), SKEY);
        assert_eq!(k.verifier().to_vkey(), VKEY);
        assert_eq!(VerifierKey::parse(VKEY).unwrap(), k.verifier());
        assert_eq!(hex::encode(k.key_id()), "c74f20a3");
    }

    #[test]
    fn mangled_keys_are_refused() {
        for bad in [
            VKEY.replace("c74f20a3", "c74f20a4"),
            VKEY.replace("PeterNeumann", "PeterNeuman"),
            VKEY.replace("+ARpc", "+AZpc"),
            format!("{VKEY}AA=="),
            VKEY.replace("c74f20a3", "C74F20A3"),
            "PeterNeumann+c74f20a3".to_owned(),
        ] {
            assert!(VerifierKey::parse(&bad).is_err(), "{bad}");
        }
        assert!(SigningKey::parse(&SKEY.replace("c74f20a3", "c74f20a4")).is_err());
        assert!(SigningKey::parse(&SKEY.replace("+AYEK", "+AIEK")).is_err());
        for bad in ["", "a+b", "a b", "a\tb"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hmac_keys_need_exactly_32_bytes_of_hex() {
        let k = HmacKey::generate();
        assert_eq!(HmacKey::parse(&k.to_hex()).unwrap().secret(), k.secret());
        let short = HmacKey::parse(&"ab".repeat(31)).unwrap_err().to_string();
        assert!(short.contains("expected 64 hex digits"), "{short}");
        assert!(HmacKey::parse(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn private_key_files_are_0600_and_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let key = PrivateKey::Ed25519(Box::new(SigningKey::generate("test").unwrap()));
        write_private(&path, &key).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(load_private(&path).is_ok());
        // Never overwritten.
        assert!(matches!(
            write_private(&path, &key),
            Err(KeyError::Write { .. })
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = load_private(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        // The negative control: the same file at 0600 loads.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load_private(&path).is_ok());
    }

    #[test]
    fn check_keys_resolve_from_files_and_inline_strings() {
        assert!(matches!(
            load_check_key(VKEY).unwrap(),
            CheckKey::Ed25519(_)
        ));
        let dir = tempfile::tempdir().unwrap();
        let vpath = dir.path().join("v");
        std::fs::write(&vpath, format!("{VKEY}\n")).unwrap();
        assert!(matches!(
            load_check_key(vpath.to_str().unwrap()).unwrap(),
            CheckKey::Ed25519(_)
        ));
        let hpath = dir.path().join("h");
        write_private(&hpath, &PrivateKey::Hmac(HmacKey::generate())).unwrap();
        assert!(matches!(
            load_check_key(hpath.to_str().unwrap()).unwrap(),
            CheckKey::Hmac(_)
        ));
        assert!(load_check_key("/nonexistent/key").is_err());
        let junk = dir.path().join("junk");
        std::fs::write(&junk, [0xff, 0, 1, 2]).unwrap();
        assert!(load_check_key(junk.to_str().unwrap()).is_err());
    }
}
