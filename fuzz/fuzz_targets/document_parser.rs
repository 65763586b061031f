//! The other documents cordon reads from strangers: receipts, proofs and
//! keys. Never panic; whatever parses re-serializes to something that
//! parses to the same value (compared in canonical form: -2E5 and -200000
//! are one JSON number, though serde_json's Value tells them apart).
#![no_main]

use cordon_ledger::jcs;
use cordon_ledger::keys::{PrivateKey, VerifierKey};
use cordon_ledger::proof::Proof;
use cordon_ledger::receipt::Receipt;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Receipt::parse(data) {
        let json = r.to_json().unwrap();
        assert_eq!(Receipt::parse(&json).unwrap().to_json().unwrap(), json);
    }
    if let Ok(p) = Proof::parse(data) {
        let canonical = |p: &Proof| jcs::to_vec(&p.to_json()).unwrap();
        let doc = canonical(&p);
        assert_eq!(canonical(&Proof::parse(&doc).unwrap()), doc);
        let _ = p.verify(None, None);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(v) = VerifierKey::parse(text) {
            assert_eq!(v.to_vkey(), text);
        }
        if let Ok(k) = PrivateKey::parse(text) {
            assert!(PrivateKey::parse(&k.to_file_string()).is_ok());
        }
    }
});
