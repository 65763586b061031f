//! The randomized tamper suite: random ledgers, random edits of every kind,
//! each detected and named; intact ledgers never reported.

use cordon_ledger::DamageKind::{self, *};
use cordon_ledger::entry::Entry;
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::util::{build, checkpoint_over, join, json_object, verify_bytes};

/// One way to damage a ledger of `n` lines.
#[derive(Debug, Clone)]
enum Tamper {
    /// Change entry k's data, leaving its hash.
    Edit(usize),
    /// Change entry k's data and recompute its hash.
    EditRehash(usize),
    /// Flip bits of one byte of line k.
    Flip { line: usize, at: usize, mask: u8 },
    /// Replace line k with junk.
    Junk(usize, Vec<u8>),
    /// Delete line k.
    Delete(usize),
    /// Insert a copy of line `from` before line `at`.
    Duplicate { from: usize, at: usize },
    /// Insert a well-hashed forged entry claiming seq k (prev = hash of k-1).
    Forge(usize),
    /// Swap lines k and k+1.
    Swap(usize),
    /// Move line `from` to position `to`.
    Move { from: usize, to: usize },
    /// Keep only the first k lines.
    Truncate(usize),
    /// Rewrite entry k and every later one with recomputed hashes.
    RewriteFrom(usize),
}

fn tamper(n: usize) -> impl Strategy<Value = Tamper> {
    let k = 0..n;
    prop_oneof![
        k.clone().prop_map(Tamper::Edit),
        k.clone().prop_map(Tamper::EditRehash),
        (k.clone(), any::<prop::sample::Index>(), 1u8..=255).prop_map(|(line, at, mask)| {
            Tamper::Flip {
                line,
                at: at.index(usize::MAX),
                mask,
            }
        }),
        (k.clone(), prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(k, junk)| Tamper::Junk(k, junk)),
        k.clone().prop_map(Tamper::Delete),
        (k.clone(), 0..=n).prop_map(|(from, at)| Tamper::Duplicate { from, at }),
        (1..n).prop_map(Tamper::Forge),
        (0..n - 1).prop_map(Tamper::Swap),
        (k.clone(), k.clone())
            .prop_filter("a move", |(a, b)| a != b)
            .prop_map(|(from, to)| Tamper::Move { from, to }),
        (0..n).prop_map(Tamper::Truncate),
        k.prop_map(Tamper::RewriteFrom),
    ]
}

fn reparse(line: &[u8]) -> Entry {
    Entry::parse(line).unwrap()
}

fn rehash(e: &mut Entry) -> Vec<u8> {
    e.hash = e.compute_hash().unwrap();
    e.canonical(true).unwrap()
}

/// Applies `t`, returning the tampered lines and what verification must
/// say: the acceptable kinds and the first bad seq (`None` when no seq can
/// be named), or `None` when the change is undetectable by design without
/// a checkpoint (then the caller verifies against one).
fn apply(lines: &[Vec<u8>], t: &Tamper) -> (Vec<Vec<u8>>, Vec<DamageKind>, Option<u64>) {
    let n = lines.len();
    let mut out = lines.to_vec();
    let edited = |line: &[u8]| {
        let mut e = reparse(line);
        e.data.insert("tampered".into(), json!(true));
        e
    };
    match *t {
        Tamper::Edit(k) => {
            let e = edited(&out[k]);
            out[k] = e.canonical(true).unwrap();
            (out, vec![Edited], Some(k as u64))
        }
        Tamper::EditRehash(k) => {
            let mut e = edited(&out[k]);
            out[k] = rehash(&mut e);
            if k + 1 < n {
                (out, vec![Edited], Some(k as u64))
            } else {
                (out, vec![CheckpointMismatch], None)
            }
        }
        Tamper::Flip { line, at, mask } => {
            let at = at % out[line].len();
            let before = reparse(&out[line]).canonical(true).unwrap();
            out[line][at] ^= mask;
            if out[line].contains(&b'\n') {
                // A flip to a newline splits the line: the first half is
                // malformed (or, rarely, the second half is).
                return (out, vec![Malformed, Edited], Some(line as u64));
            }
            // A flip that respells the same JSON (1e+30 → 1E+30, \u00e9
            // case) changes nothing hashed: JCS equivalence, not damage.
            if Entry::parse(&out[line]).is_ok_and(|e| e.canonical(true).unwrap() == before) {
                return (out, vec![], None);
            }
            (out, vec![Malformed, Edited], Some(line as u64))
        }
        Tamper::Junk(k, ref junk) => {
            let mut junk: Vec<u8> = junk
                .iter()
                .map(|&b| if b == b'\n' { b'x' } else { b })
                .collect();
            junk.insert(0, b'!');
            out[k] = junk;
            (out, vec![Malformed], Some(k as u64))
        }
        Tamper::Delete(k) => {
            out.remove(k);
            if k + 1 < n {
                (out, vec![Missing], Some(k as u64))
            } else {
                (out, vec![Truncated], Some(k as u64))
            }
        }
        Tamper::Duplicate { from, at } => {
            let copy = out[from].clone();
            out.insert(at, copy);
            if at > from {
                (out, vec![Inserted], Some(from as u64))
            } else {
                // Before its original, a copy looks like the original moved
                // early (reordered) until its twin is seen.
                (out, vec![Reordered, Inserted], Some(at as u64))
            }
        }
        Tamper::Forge(k) => {
            let prev = reparse(&out[k - 1]).hash;
            let forged = Entry::new(
                k as u64,
                "2026-01-01T00:00:00Z".into(),
                "forged".into(),
                json!({"forged": true}),
                prev,
            )
            .unwrap();
            out.insert(k, forged.canonical(true).unwrap());
            (out, vec![Inserted], Some(k as u64))
        }
        Tamper::Swap(k) => {
            out.swap(k, k + 1);
            (out, vec![Reordered], Some(k as u64))
        }
        Tamper::Move { from, to } => {
            let line = out.remove(from);
            out.insert(to, line);
            (out, vec![Reordered], Some(from.min(to) as u64))
        }
        Tamper::Truncate(k) => {
            out.truncate(k);
            (out, vec![Truncated], Some(k as u64))
        }
        Tamper::RewriteFrom(k) => {
            let mut prev = if k == 0 {
                cordon_ledger::entry::ZERO_HASH
            } else {
                reparse(&out[k - 1]).hash
            };
            for (i, line) in out.iter_mut().enumerate().skip(k) {
                let mut e = if i == k { edited(line) } else { reparse(line) };
                e.prev = prev;
                *line = rehash(&mut e);
                prev = e.hash;
            }
            (out, vec![CheckpointMismatch], None)
        }
    }
}

/// Ledgers of 2..24 entries with random data.
fn ledger() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(json_object(), 2..24).prop_map(|d| build(&d))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn intact_ledgers_verify_with_and_without_a_checkpoint(lines in ledger()) {
        let bytes = join(&lines);
        let r = verify_bytes(&bytes, None);
        prop_assert!(r.intact(), "{:?}", r.damage);
        prop_assert_eq!(r.entries, lines.len() as u64);
        for size in [0, lines.len() / 2, lines.len()] {
            let cp = checkpoint_over(&lines, size);
            let r = verify_bytes(&bytes, Some(&cp));
            prop_assert!(r.intact(), "size {}: {:?}", size, r.damage);
        }
    }

    #[test]
    fn every_single_tamper_is_detected_and_named(
        (lines, t) in ledger().prop_flat_map(|l| { let n = l.len(); (Just(l), tamper(n)) })
    ) {
        let (bad, kinds, seq) = apply(&lines, &t);
        let cp = checkpoint_over(&lines, lines.len());
        let r = verify_bytes(&join(&bad), Some(&cp));
        if kinds.is_empty() {
            prop_assert!(r.intact(), "{:?}: {:?}", t, r.damage);
            return Ok(());
        }
        let d = r.damage.clone();
        prop_assert!(d.is_some(), "{:?} went undetected", t);
        let d = d.unwrap();
        prop_assert!(kinds.contains(&d.kind), "{:?}: got {:?}", t, d);
        prop_assert_eq!(d.seq, seq, "{:?}: {:?}", t, d);
        // Without a checkpoint, everything but tail changes is still caught.
        let plain = verify_bytes(&join(&bad), None);
        if seq.is_some() && !kinds.contains(&Truncated) {
            prop_assert_eq!(plain.damage.map(|d| d.seq), Some(seq), "{:?}", t);
        }
    }

    #[test]
    fn multiple_edits_report_the_first(
        (lines, picks) in ledger().prop_flat_map(|l| {
            let n = l.len();
            (Just(l), prop::collection::btree_map(0..n, 0u8..3, 1..4))
        })
    ) {
        let mut bad = lines.clone();
        for (&k, &how) in &picks {
            let t = match how {
                0 => Tamper::Edit(k),
                1 => Tamper::Junk(k, b"{\"seq\":".to_vec()),
                // A re-hashed edit shows only in the next entry's prev; when
                // that entry is damaged too, the evidence of the first is gone.
                _ if picks.contains_key(&(k + 1)) => Tamper::Edit(k),
                _ => Tamper::EditRehash(k),
            };
            bad = apply(&bad, &t).0;
        }
        let first = *picks.keys().next().unwrap() as u64;
        let cp = checkpoint_over(&lines, lines.len());
        let r = verify_bytes(&join(&bad), Some(&cp));
        let d = r.damage.expect("multiple edits went undetected");
        match d.seq {
            Some(seq) => prop_assert_eq!(seq, first, "{:?}", d),
            // Only a re-hashed edit of the last entry has no seq to name.
            None => prop_assert_eq!(d.kind, CheckpointMismatch),
        }
    }
}

#[test]
fn respelled_ledgers_take_the_slow_path_and_still_verify() {
    // Another writer's spelling (key order, whitespace, escapes) is not
    // damage: the hash covers the canonical form.
    let lines = build(&[
        json!({"a": "é\u{1f600}", "n": 1.5})
            .as_object()
            .unwrap()
            .clone(),
        json!({"b": [1, 2, {"z": null, "y": "x"}]})
            .as_object()
            .unwrap()
            .clone(),
    ]);
    let respelled: Vec<Vec<u8>> = lines
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_slice(l).unwrap();
            let pretty = serde_json::to_string_pretty(&v).unwrap().replace('\n', " ");
            pretty
                .replace('é', "\\u00e9")
                .replace("1.5", "15e-1")
                .into_bytes()
        })
        .collect();
    assert_ne!(respelled, lines);
    let cp = checkpoint_over(&lines, 2);
    let r = verify_bytes(&join(&respelled), Some(&cp));
    assert!(r.intact(), "{:?}", r.damage);
}

#[test]
fn a_torn_tail_is_reported_but_is_not_damage() {
    let lines = build(&[serde_json::Map::new(), serde_json::Map::new()]);
    let mut bytes = join(&lines);
    bytes.extend_from_slice(b"{\"data\":{\"partial");
    let r = verify_bytes(&bytes, None);
    assert!(r.intact());
    assert_eq!(r.torn_tail, Some(17));
    assert_eq!(r.entries, 2);
}

#[test]
fn a_ten_megabyte_line_is_named_not_loaded() {
    let lines = build(&[serde_json::Map::new()]);
    let mut bytes = join(&lines);
    bytes.extend(std::iter::repeat_n(b'a', 10 << 20));
    bytes.push(b'\n');
    bytes.extend_from_slice(&join(&lines));
    let d = verify_bytes(&bytes, None).damage.unwrap();
    assert_eq!((d.kind, d.seq, d.line), (Malformed, Some(1), Some(2)));
    assert!(d.detail.contains("10485760 bytes long"), "{}", d.detail);
}

#[test]
fn binary_junk_is_malformed_at_line_one() {
    let junk: Vec<u8> = (0..=255u8)
        .cycle()
        .take(5000)
        .filter(|&b| b != b'\n')
        .collect();
    let mut bytes = junk;
    bytes.push(b'\n');
    let d = verify_bytes(&bytes, None).damage.unwrap();
    assert_eq!((d.kind, d.seq, d.line), (Malformed, Some(0), Some(1)));
}

#[test]
fn a_forged_signature_on_the_checkpoint_is_a_mismatch() {
    let lines = build(&[serde_json::Map::new()]);
    let cp = checkpoint_over(&lines, 1);
    let other = cordon_ledger::keys::SigningKey::generate("cordon.test/key").unwrap();
    let r = cordon_ledger::chain::verify_reader(
        std::path::Path::new("m"),
        &join(&lines)[..],
        Some(&cp),
        Some(&other.verifier()),
    )
    .unwrap();
    assert_eq!(r.damage.unwrap().kind, CheckpointMismatch);
}
