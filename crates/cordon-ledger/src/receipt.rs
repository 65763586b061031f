//! Receipts (`cordon-receipt/1`): a JSON payload and a signature over its
//! RFC 8785 canonical bytes, by HMAC-SHA-256 (a shared secret: only holders
//! of the secret can check it, and each of them could have made it) or by
//! Ed25519 (anyone with the verifier key can check it).
//!
//! ```json
//! {"alg":"Ed25519","key_id":"c74f20a3","payload":{…},"sig":"<base64>","version":"cordon-receipt/1"}
//! ```
//! For Ed25519 `key_id` is the hex signed-note key id; for HMAC it is
//! [`HmacKey::key_id`].

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;
use thiserror::Error;

use crate::jcs::{self, JcsError};
use crate::keys::{CheckKey, HmacKey, PrivateKey};

/// The `version` of receipts this module reads and writes.
pub const VERSION: &str = "cordon-receipt/1";

/// Receipts larger than this are refused unread.
pub const MAX_RECEIPT: usize = 1 << 20;

/// What went wrong with a receipt.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ReceiptError {
    /// The receipt is not a well-formed `cordon-receipt/1` document.
    #[error("malformed receipt: {0}")]
    Parse(String),
    /// The payload cannot be canonicalized.
    #[error("payload: {0}")]
    Canonicalize(#[source] JcsError),
    /// The receipt does not verify under the given key.
    #[error("invalid receipt: {0}")]
    Verify(String),
}

/// The signature algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    /// HMAC-SHA-256 with a shared secret.
    HmacSha256,
    /// Ed25519.
    Ed25519,
}

impl Alg {
    /// The name in the receipt's `alg` field.
    pub fn name(self) -> &'static str {
        match self {
            Alg::HmacSha256 => "HMAC-SHA256",
            Alg::Ed25519 => "Ed25519",
        }
    }
}

/// A receipt.
#[derive(Debug, Clone, PartialEq)]
pub struct Receipt {
    /// The algorithm.
    pub alg: Alg,
    /// Which key signed it.
    pub key_id: String,
    /// What it attests.
    pub payload: Map<String, Value>,
    /// Signature over `JCS(payload)`.
    pub sig: Vec<u8>,
}

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &HmacKey) -> HmacSha256 {
    // HMAC accepts keys of any length; 32 bytes cannot fail.
    <HmacSha256 as Mac>::new_from_slice(key.secret()).unwrap_or_else(|_| unreachable!())
}

impl Receipt {
    /// Signs `payload` with `key`.
    pub fn sign(payload: Map<String, Value>, key: &PrivateKey) -> Result<Receipt, ReceiptError> {
        let bytes =
            jcs::to_vec(&Value::Object(payload.clone())).map_err(ReceiptError::Canonicalize)?;
        Ok(match key {
            PrivateKey::Hmac(k) => {
                let mut mac = hmac(k);
                mac.update(&bytes);
                Receipt {
                    alg: Alg::HmacSha256,
                    key_id: k.key_id(),
                    payload,
                    sig: mac.finalize().into_bytes().to_vec(),
                }
            }
            PrivateKey::Ed25519(k) => Receipt {
                alg: Alg::Ed25519,
                key_id: hex::encode(k.key_id()),
                payload,
                sig: k.sign(&bytes).to_vec(),
            },
        })
    }

    /// The receipt as canonical JSON (no trailing newline).
    pub fn to_json(&self) -> Result<Vec<u8>, ReceiptError> {
        let mut map = Map::new();
        map.insert("version".into(), VERSION.into());
        map.insert("alg".into(), self.alg.name().into());
        map.insert("key_id".into(), self.key_id.clone().into());
        map.insert("payload".into(), Value::Object(self.payload.clone()));
        map.insert("sig".into(), B64.encode(&self.sig).into());
        jcs::to_vec(&Value::Object(map)).map_err(ReceiptError::Canonicalize)
    }

    /// Parses a receipt document (strict I-JSON, exactly the five fields).
    pub fn parse(bytes: &[u8]) -> Result<Receipt, ReceiptError> {
        let err = |m: String| ReceiptError::Parse(m);
        if bytes.len() > MAX_RECEIPT {
            return Err(err("larger than 1 MiB".to_owned()));
        }
        let Value::Object(mut map) = jcs::parse(bytes).map_err(|e| err(e.to_string()))? else {
            return Err(err("a receipt must be a JSON object".to_owned()));
        };
        const FIELDS: [&str; 5] = ["alg", "key_id", "payload", "sig", "version"];
        if let Some(k) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(err(format!("unknown field {k:?}")));
        }
        let mut string = |name: &str| match map.remove(name) {
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(err(format!("{name} must be a string"))),
            None => Err(err(format!("missing field {name:?}"))),
        };
        let version = string("version")?;
        if version != VERSION {
            return Err(err(format!(
                "version is {version:?}; this cordon reads {VERSION:?} receipts"
            )));
        }
        let alg = match string("alg")?.as_str() {
            "HMAC-SHA256" => Alg::HmacSha256,
            "Ed25519" => Alg::Ed25519,
            other => {
                return Err(err(format!(
                    "alg {other:?} is not one of \"HMAC-SHA256\", \"Ed25519\""
                )));
            }
        };
        let key_id = string("key_id")?;
        // Standard base64, with or without padding.
        let sig = base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        )
        .decode(string("sig")?)
        .map_err(|_| err("sig is not valid base64".to_owned()))?;
        let payload = match map.remove("payload") {
            Some(Value::Object(p)) => p,
            Some(_) => return Err(err("payload must be an object".to_owned())),
            None => return Err(err("missing field \"payload\"".to_owned())),
        };
        // What cannot be canonicalized cannot have been signed.
        jcs::to_vec(&Value::Object(payload.clone())).map_err(|e| err(format!("payload: {e}")))?;
        Ok(Receipt {
            alg,
            key_id,
            payload,
            sig,
        })
    }

    /// Checks the signature with `key`. HMAC tags are compared in constant
    /// time.
    pub fn verify(&self, key: &CheckKey) -> Result<(), ReceiptError> {
        let bad = |m: String| Err(ReceiptError::Verify(m));
        let bytes = jcs::to_vec(&Value::Object(self.payload.clone()))
            .map_err(ReceiptError::Canonicalize)?;
        match (self.alg, key) {
            (Alg::HmacSha256, CheckKey::Hmac(k)) => {
                let mut mac = hmac(k);
                mac.update(&bytes);
                // verify_slice compares in constant time (subtle).
                if mac.verify_slice(&self.sig).is_err() {
                    return bad(format!(
                        "the HMAC-SHA256 signature does not match the payload under key {}",
                        k.key_id()
                    ));
                }
                // key_id is only a hint for HMAC (the contract fixes no
                // scheme for it): the tag is what proves the key.
                Ok(())
            }
            (Alg::Ed25519, CheckKey::Ed25519(v)) => {
                let id = hex::encode(v.key_id());
                if self.key_id != id {
                    return bad(format!(
                        "signed by key id {:?}, not by {} (id {id})",
                        self.key_id,
                        v.to_vkey()
                    ));
                }
                if !v.verify(&bytes, &self.sig) {
                    return bad(format!(
                        "the Ed25519 signature does not match the payload under {}",
                        v.to_vkey()
                    ));
                }
                Ok(())
            }
            (alg, key) => bad(format!(
                "the receipt is {} but the key is {}",
                alg.name(),
                match key {
                    CheckKey::Hmac(_) => "an HMAC key",
                    CheckKey::Ed25519(_) => "an Ed25519 verifier key",
                }
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::SigningKey;
    use serde_json::json;

    fn payload() -> Map<String, Value> {
        match json!({"run_id": "r1", "verdict": "ALLOWED", "n": 1.5}) {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn hmac_receipt_round_trip_and_tamper() {
        let key = HmacKey::generate();
        let r = Receipt::sign(payload(), &PrivateKey::Hmac(key.clone())).unwrap();
        let json = r.to_json().unwrap();
        let parsed = Receipt::parse(&json).unwrap();
        assert_eq!(parsed, r);
        parsed.verify(&CheckKey::Hmac(key.clone())).unwrap();
        // key_id is a hint for HMAC: another tool's naming still verifies.
        let mut renamed = parsed.clone();
        renamed.key_id = "k1".into();
        renamed.verify(&CheckKey::Hmac(key.clone())).unwrap();
        let unpadded = String::from_utf8(r.to_json().unwrap())
            .unwrap()
            .replace('=', "");
        Receipt::parse(unpadded.as_bytes())
            .unwrap()
            .verify(&CheckKey::Hmac(key.clone()))
            .unwrap();
        let tampered = String::from_utf8(json)
            .unwrap()
            .replace("ALLOWED", "KILLED");
        let t = Receipt::parse(tampered.as_bytes()).unwrap();
        assert!(matches!(
            t.verify(&CheckKey::Hmac(key)),
            Err(ReceiptError::Verify(_))
        ));
        assert!(r.verify(&CheckKey::Hmac(HmacKey::generate())).is_err());
    }

    #[test]
    fn ed25519_receipt_round_trip_and_tamper() {
        let key = SigningKey::generate("signer").unwrap();
        let r = Receipt::sign(payload(), &PrivateKey::Ed25519(Box::new(key.clone()))).unwrap();
        assert_eq!(r.key_id, hex::encode(key.key_id()));
        let parsed = Receipt::parse(&r.to_json().unwrap()).unwrap();
        parsed.verify(&CheckKey::Ed25519(key.verifier())).unwrap();
        let mut edited = parsed.clone();
        edited.payload.insert("verdict".into(), "KILLED".into());
        assert!(edited.verify(&CheckKey::Ed25519(key.verifier())).is_err());
        let other = SigningKey::generate("signer").unwrap();
        assert!(parsed.verify(&CheckKey::Ed25519(other.verifier())).is_err());
        assert!(parsed.verify(&CheckKey::Hmac(HmacKey::generate())).is_err());
    }

    #[test]
    fn signature_covers_the_canonical_payload_not_its_spelling() {
        let key = SigningKey::generate("s").unwrap();
        let r = Receipt::sign(payload(), &PrivateKey::Ed25519(Box::new(key.clone()))).unwrap();
        let sig = B64.encode(&r.sig);
        let respelled = format!(
            r#"{{ "version": "cordon-receipt/1", "alg": "Ed25519", "key_id": "{}",
                "payload": {{"verdict": "ALLOWED", "n": 15e-1, "run_id": "r\u0031"}}, "sig": "{sig}" }}"#,
            r.key_id
        );
        Receipt::parse(respelled.as_bytes())
            .unwrap()
            .verify(&CheckKey::Ed25519(key.verifier()))
            .unwrap();
    }

    #[test]
    fn malformed_receipts_say_what_is_wrong() {
        for (bad, want) in [
            ("[]", "must be a JSON object"),
            (
                r#"{"version":"cordon-receipt/2"}"#,
                "reads \"cordon-receipt/1\"",
            ),
            (
                r#"{"version":"cordon-receipt/1","alg":"RSA"}"#,
                "alg \"RSA\"",
            ),
            (r#"{"extra":1}"#, "unknown field \"extra\""),
            ("\u{0}\u{1}", "not valid JSON"),
        ] {
            let err = Receipt::parse(bad.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(want) || err.contains("byte"), "{bad}: {err}");
        }
    }
}
