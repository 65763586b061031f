//! Helpers shared by the topic modules.

use cordon_ledger::chain::{self, Report};
use cordon_ledger::checkpoint::{Checkpoint, SignedCheckpoint};
use cordon_ledger::entry::{Entry, ZERO_HASH};
use cordon_ledger::keys::SigningKey;
use cordon_ledger::merkle;
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Lines (without newlines) of a well-formed ledger holding `data`, as
/// cordon writes them.
pub fn build(data: &[Map<String, Value>]) -> Vec<Vec<u8>> {
    let mut prev = ZERO_HASH;
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            let e = Entry::new(
                i as u64,
                format!("2026-01-01T00:00:{:02}.000000Z", i % 60),
                format!("kind.{}", i % 3),
                Value::Object(d.clone()),
                prev,
            )
            .unwrap();
            prev = e.hash;
            e.canonical(true).unwrap()
        })
        .collect()
}

pub fn join(lines: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(l);
        out.push(b'\n');
    }
    out
}

/// A checkpoint over the first `size` lines, signed by a throwaway key.
pub fn checkpoint_over(lines: &[Vec<u8>], size: usize) -> SignedCheckpoint {
    let leaves: Vec<_> = lines[..size].iter().map(|l| merkle::leaf_hash(l)).collect();
    let cp = Checkpoint {
        origin: "cordon.test/ledger".into(),
        size: size as u64,
        root: merkle::root(&leaves),
        extensions: vec![],
    };
    let key = SigningKey::generate("cordon.test/key").unwrap();
    SignedCheckpoint::parse(cp.sign(&key).unwrap().as_bytes()).unwrap()
}

pub fn verify_bytes(bytes: &[u8], cp: Option<&SignedCheckpoint>) -> Report {
    chain::verify_reader(std::path::Path::new("mem.jsonl"), bytes, cp, None).unwrap()
}

/// Arbitrary JSON values of the kinds entries carry, including strings
/// that need escaping and characters outside the BMP.
pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-(1i64 << 53)..=(1i64 << 53)).prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "[a-z\\\\\"\\n\\t\u{1}\u{7f}é\u{2028}\u{fb33}\u{1f600} ]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-zé\u{1f600}\u{fb33}]{0,5}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

pub fn json_object() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map("[a-z_]{1,8}", json_value(), 0..5)
        .prop_map(|m| m.into_iter().collect())
}
