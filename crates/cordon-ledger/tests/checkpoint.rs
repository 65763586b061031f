//! Checkpoints over a real ledger: signing, refusing to sign inconsistent
//! ones, truncation behind a checkpoint, inclusion and consistency proofs.

use cordon_ledger::DamageKind;
use cordon_ledger::chain::{VerifyOptions, read_checkpoint, verify};
use cordon_ledger::entry::Entry;
use cordon_ledger::keys::SigningKey;
use cordon_ledger::ledger::{LedgerError, sign_checkpoint};
use cordon_ledger::proof::Proof;
use cordon_ledger::{Ledger, Paths};
use serde_json::json;

fn ledger_with(n: usize) -> (tempfile::TempDir, Ledger) {
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::open(dir.path()).unwrap();
    for i in 0..n {
        l.append("k", json!({"i": i})).unwrap();
    }
    (dir, l)
}

fn key() -> SigningKey {
    SigningKey::generate("cordon.test/ledger-key").unwrap()
}

#[test]
fn a_signed_checkpoint_is_stored_and_checked_by_verify() {
    let (dir, l) = ledger_with(5);
    let k = key();
    let s = sign_checkpoint(dir.path(), &k, None).unwrap();
    assert_eq!(s.checkpoint.size, 5);
    assert_eq!(l.head().unwrap().seq, 4);
    assert!(s.checkpoint.origin.starts_with("cordon.local/ledger/"));
    let paths = Paths::resolve(dir.path());
    assert_eq!(std::fs::read_to_string(&paths.checkpoint).unwrap(), s.note);
    let opts = VerifyOptions {
        key: Some(k.verifier()),
        ..VerifyOptions::default()
    };
    let r = verify(&paths, &opts).unwrap();
    assert!(r.intact(), "{:?}", r.damage);
    assert!(r.checkpoint.unwrap().signature_verified);
    // A different key's verifier does not accept it.
    let opts = VerifyOptions {
        key: Some(key().verifier()),
        ..VerifyOptions::default()
    };
    assert_eq!(
        verify(&paths, &opts).unwrap().damage.unwrap().kind,
        DamageKind::CheckpointMismatch
    );
}

#[test]
fn truncation_behind_a_checkpoint_is_detected() {
    let (dir, _l) = ledger_with(6);
    sign_checkpoint(dir.path(), &key(), None).unwrap();
    let file = dir.path().join("ledger.jsonl");
    let text = std::fs::read_to_string(&file).unwrap();
    let kept: String = text.lines().take(4).map(|l| format!("{l}\n")).collect();
    std::fs::write(&file, kept).unwrap();
    let d = verify(&Paths::resolve(dir.path()), &VerifyOptions::default())
        .unwrap()
        .damage
        .unwrap();
    assert_eq!((d.kind, d.seq), (DamageKind::Truncated, Some(4)));
    // And no new checkpoint is signed over the truncated ledger.
    let err = sign_checkpoint(dir.path(), &key(), None).unwrap_err();
    assert!(matches!(err, LedgerError::Inconsistent { .. }), "{err}");
}

#[test]
fn never_signs_a_checkpoint_inconsistent_with_the_last_one() {
    let (dir, l) = ledger_with(4);
    let k = key();
    let first = sign_checkpoint(dir.path(), &k, None).unwrap();
    l.append("k", json!({"more": true})).unwrap();
    let second = sign_checkpoint(dir.path(), &k, None).unwrap();
    assert_eq!(second.previous.as_ref().unwrap(), &first.checkpoint);
    assert_eq!(
        (second.checkpoint.size, second.checkpoint.origin.clone()),
        (5, first.checkpoint.origin.clone())
    );
    // Rewrite history with every hash recomputed: the chain verifies, but
    // it is not an extension of what was signed.
    let file = dir.path().join("ledger.jsonl");
    let mut prev = cordon_ledger::entry::ZERO_HASH;
    let mut out = String::new();
    for (i, line) in std::fs::read_to_string(&file).unwrap().lines().enumerate() {
        let mut e = Entry::parse(line.as_bytes()).unwrap();
        if i == 1 {
            e.data.insert("i".into(), json!(100));
        }
        e.prev = prev;
        e.hash = e.compute_hash().unwrap();
        prev = e.hash;
        out.push_str(&String::from_utf8(e.to_line().unwrap()).unwrap());
    }
    std::fs::write(&file, out).unwrap();
    let err = sign_checkpoint(dir.path(), &k, None).unwrap_err();
    assert!(matches!(err, LedgerError::Inconsistent { .. }), "{err}");
    let stored = read_checkpoint(&Paths::resolve(dir.path()).checkpoint).unwrap();
    assert_eq!(
        stored.checkpoint, second.checkpoint,
        "the stored checkpoint is untouched"
    );
    let d = verify(&Paths::resolve(dir.path()), &VerifyOptions::default())
        .unwrap()
        .damage
        .unwrap();
    assert_eq!(d.kind, DamageKind::CheckpointMismatch);
    // Nor with a different origin.
    let (dir2, _l2) = ledger_with(2);
    sign_checkpoint(dir2.path(), &k, Some("a.example/log")).unwrap();
    assert!(sign_checkpoint(dir2.path(), &k, Some("b.example/log")).is_err());
}

#[test]
fn a_damaged_ledger_gets_no_checkpoint() {
    let (dir, _l) = ledger_with(3);
    let file = dir.path().join("ledger.jsonl");
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replacen("\"i\":1", "\"i\":7", 1);
    std::fs::write(&file, text).unwrap();
    let err = sign_checkpoint(dir.path(), &key(), None).unwrap_err();
    assert!(matches!(err, LedgerError::Unsound { .. }), "{err}");
    assert!(err.to_string().contains("seq 1 edited"), "{err}");
}

#[test]
fn inclusion_proofs_for_every_entry_verify_and_forgeries_do_not() {
    let (dir, _l) = ledger_with(13);
    let k = key();
    let s = sign_checkpoint(dir.path(), &k, None).unwrap();
    for seq in 0..13 {
        let p = Proof::inclusion(dir.path(), seq, &s.note).unwrap();
        let doc = serde_json::to_vec(&p.to_json()).unwrap();
        let parsed = Proof::parse(&doc).unwrap();
        parsed.verify(Some(&k.verifier()), None).unwrap();
        // An edited entry in the proof fails.
        let Proof::Inclusion {
            checkpoint,
            mut entry,
            hashes,
        } = parsed.clone()
        else {
            unreachable!()
        };
        entry.data.insert("i".into(), json!(99));
        entry.hash = entry.compute_hash().unwrap();
        let forged = Proof::Inclusion {
            checkpoint,
            entry,
            hashes,
        };
        assert!(
            forged.verify(Some(&k.verifier()), None).is_err(),
            "seq {seq}"
        );
        // So does checking against another key.
        assert!(parsed.verify(Some(&key().verifier()), None).is_err());
    }
    assert!(
        Proof::inclusion(dir.path(), 13, &s.note).is_err(),
        "beyond the checkpoint"
    );
}

#[test]
fn consistency_proofs_link_old_and_new_checkpoints() {
    let (dir, l) = ledger_with(3);
    let k = key();
    let old = sign_checkpoint(dir.path(), &k, None).unwrap();
    for i in 0..9 {
        l.append("k", json!({"later": i})).unwrap();
    }
    let new = sign_checkpoint(dir.path(), &k, None).unwrap();
    let p = Proof::consistency(dir.path(), &old.note, &new.note).unwrap();
    let doc = serde_json::to_vec(&p.to_json()).unwrap();
    Proof::parse(&doc)
        .unwrap()
        .verify(Some(&k.verifier()), None)
        .unwrap();
    // A checkpoint of a different history does not link.
    let (other_dir, _o) = ledger_with(3);
    let other = sign_checkpoint(other_dir.path(), &k, Some(&old.checkpoint.origin)).unwrap();
    let Proof::Consistency { hashes, .. } = p else {
        unreachable!()
    };
    let forged = Proof::Consistency {
        old: other.note,
        new: new.note.clone(),
        hashes,
    };
    assert!(forged.verify(Some(&k.verifier()), None).is_err());
}
