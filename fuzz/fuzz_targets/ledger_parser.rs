//! The ledger parser on arbitrary bytes: verifying a whole file must never
//! panic, and the fast path (canonical bytes hashed directly) must agree
//! with the slow path (strict parse, re-canonicalize) on every line it
//! accepts.
#![no_main]

use cordon_ledger::chain::verify_reader;
use cordon_ledger::entry::{Entry, check_line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = verify_reader(std::path::Path::new("fuzz.jsonl"), data, None, None);
    for line in data.split(|&b| b == b'\n') {
        match check_line(line) {
            Ok(c) => {
                let e = Entry::parse(line).expect("fast path accepted what the parser refuses");
                assert_eq!(e.seq, c.seq);
                assert_eq!(e.hash, c.claimed);
                assert_eq!(e.prev, c.prev);
                assert_eq!(e.compute_hash().unwrap(), c.computed);
                assert_eq!(e.leaf_hash().unwrap(), c.leaf);
                // What is accepted re-serializes to a line accepted the same.
                let again = check_line(&e.canonical(true).unwrap()).unwrap();
                assert_eq!(again.computed, c.computed);
            }
            Err(_) => assert!(
                Entry::parse(line).is_err() || {
                    // The parser may accept what cannot be canonicalized
                    // (a number out of the ledger's range): check_line must
                    // then have failed in canonicalization.
                    Entry::parse(line).unwrap().canonical(true).is_err()
                }
            ),
        }
    }
});
