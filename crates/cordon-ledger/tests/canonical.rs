//! The fast path (hash a canonical line's bytes) and the slow path (parse,
//! re-canonicalize) must agree on every line, accepted or not.

use cordon_ledger::entry::{Entry, check_line};
use cordon_ledger::jcs;
use proptest::prelude::*;
use serde_json::Value;

use crate::util::{build, json_object, json_value};

/// What the slow path alone makes of a line.
fn slow(line: &[u8]) -> Option<([u8; 32], [u8; 32], u64)> {
    let e = Entry::parse(line).ok()?;
    Some((e.compute_hash().ok()?, e.leaf_hash().ok()?, e.seq))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn canonical_form_round_trips(v in json_value()) {
        let bytes = jcs::to_vec(&v);
        prop_assume!(bytes.is_ok());
        let bytes = bytes.unwrap();
        let back = jcs::parse(&bytes).unwrap();
        prop_assert_eq!(jcs::to_vec(&back).unwrap(), bytes);
    }

    #[test]
    fn fast_and_slow_paths_agree_on_cordon_lines(data in prop::collection::vec(json_object(), 1..4)) {
        for line in build(&data) {
            let fast = check_line(&line).unwrap();
            prop_assert!(fast.hash_ok());
            prop_assert_eq!(Some((fast.computed, fast.leaf, fast.seq)), slow(&line));
        }
    }

    #[test]
    fn fast_and_slow_paths_agree_on_mutated_lines(
        data in json_object(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut line = build(&[data]).remove(0);
        for (at, byte) in edits {
            let i = at.index(line.len());
            line[i] = byte;
        }
        match check_line(&line) {
            Ok(c) => {
                // Whatever was accepted, the slow path accepts identically.
                prop_assert_eq!(Some((c.computed, c.leaf, c.seq)), slow(&line));
            }
            Err(_) => prop_assert!(slow(&line).is_none()),
        }
    }
}

#[test]
fn depth_limit_is_the_same_on_both_paths() {
    // data nested to exactly the limit is accepted; one more level is not.
    let mut v = Value::Null;
    for _ in 0..jcs::MAX_DEPTH - 2 {
        v = Value::Array(vec![v]);
    }
    let ok = serde_json::json!({ "v": v });
    let lines = build(&[ok.as_object().unwrap().clone()]);
    assert!(check_line(&lines[0]).unwrap().hash_ok());
    let deeper = serde_json::json!({ "v": [v] });
    let e = Entry::new(
        0,
        "2026-01-01T00:00:00Z".into(),
        "k".into(),
        deeper,
        cordon_ledger::entry::ZERO_HASH,
    );
    assert!(e.is_err(), "an entry the verifier would refuse was made");
}
