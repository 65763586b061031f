//! The signed-note and checkpoint parsers on arbitrary bytes: never panic,
//! and whatever parses prints back to the same bytes and parses again to
//! the same value.
#![no_main]

use cordon_ledger::checkpoint::{Checkpoint, SignedCheckpoint};
use cordon_ledger::note::Note;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(note) = Note::parse(data) {
        let printed = note.to_string();
        assert_eq!(
            printed.as_bytes(),
            data,
            "a parsed note prints back differently"
        );
        assert_eq!(Note::parse(printed.as_bytes()).unwrap(), note);
    }
    if let Ok(cp) = SignedCheckpoint::parse(data) {
        let body = cp.checkpoint.body();
        assert_eq!(body, cp.note.text);
        assert_eq!(Checkpoint::parse_body(&body).unwrap(), cp.checkpoint);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(cp) = Checkpoint::parse_body(text) {
            assert_eq!(cp.body(), text);
        }
    }
});
