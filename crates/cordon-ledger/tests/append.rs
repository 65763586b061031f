//! Appending: durability bookkeeping, group commit under concurrency,
//! processes sharing a ledger, and torn-tail repair.

use std::collections::BTreeMap;
use std::sync::Arc;

use cordon_ledger::chain::{VerifyOptions, verify};
use cordon_ledger::entry::Entry;
use cordon_ledger::ledger::{LedgerError, Options};
use cordon_ledger::{Head, Ledger};
use serde_json::json;

fn entries(dir: &std::path::Path) -> Vec<Entry> {
    std::fs::read(dir.join("ledger.jsonl"))
        .unwrap()
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| Entry::parse(l).unwrap())
        .collect()
}

fn assert_intact(dir: &std::path::Path) -> u64 {
    let r = verify(
        &cordon_ledger::Paths::resolve(dir),
        &VerifyOptions::default(),
    )
    .unwrap();
    assert!(r.intact(), "{:?}", r.damage);
    r.entries
}

#[test]
fn append_creates_the_ledger_and_acknowledges_seq_and_hash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new/evidence");
    let l = Ledger::open(&path).unwrap();
    assert_eq!(l.head(), None);
    let a = l.append("run.start", json!({"run_id": "r1"})).unwrap();
    let b = l
        .append("run.end", json!({"big": 18446744073709551615_u64}))
        .unwrap();
    assert_eq!((a.seq, b.seq), (0, 1));
    assert_eq!(l.head(), Some(b));
    let e = entries(&path);
    assert_eq!(e[0].hash, a.hash);
    assert_eq!(e[1].prev, a.hash);
    assert_eq!(e[1].data["big"], json!("18446744073709551615"));
    assert_eq!(assert_intact(&path), 2);
    // The .jsonl file names the same ledger.
    let again = Ledger::open(path.join("ledger.jsonl")).unwrap();
    assert_eq!(again.head(), Some(b));
}

#[test]
fn append_refuses_what_is_not_an_entry() {
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::open(dir.path()).unwrap();
    for (kind, data) in [("k", json!([1])), ("k", json!("s")), ("", json!({}))] {
        let err = l.append(kind, data).unwrap_err();
        assert!(matches!(err, LedgerError::Entry(_)), "{err}");
    }
    let huge = json!({"blob": "x".repeat(2 << 20)});
    assert!(
        l.append("k", huge)
            .unwrap_err()
            .to_string()
            .contains("at most")
    );
    // Refusals leave no trace and do not poison the handle.
    assert_eq!(l.append("k", json!({})).unwrap().seq, 0);
}

fn hammer(ledgers: &[Ledger], threads: usize, per_thread: usize) -> Vec<Head> {
    let acks = Arc::new(std::sync::Mutex::new(Vec::new()));
    std::thread::scope(|s| {
        for t in 0..threads {
            let l = ledgers[t % ledgers.len()].clone();
            let acks = Arc::clone(&acks);
            s.spawn(move || {
                for i in 0..per_thread {
                    let h = l.append("t", json!({"thread": t, "i": i})).unwrap();
                    acks.lock().unwrap().push(h);
                }
            });
        }
    });
    Arc::try_unwrap(acks).unwrap().into_inner().unwrap()
}

fn check_acks(dir: &std::path::Path, acks: &[Head]) {
    let on_disk: BTreeMap<u64, [u8; 32]> = entries(dir).iter().map(|e| (e.seq, e.hash)).collect();
    assert_eq!(on_disk.len(), acks.len(), "every entry acknowledged once");
    for a in acks {
        assert_eq!(on_disk.get(&a.seq), Some(&a.hash), "ack {a:?} not on disk");
    }
    assert_eq!(assert_intact(dir), acks.len() as u64);
}

#[test]
fn concurrent_appenders_share_fsyncs_and_each_is_acknowledged_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::open(dir.path()).unwrap();
    let acks = hammer(&[l], 16, 40);
    check_acks(dir.path(), &acks);
}

#[test]
fn without_group_commit_appends_are_still_correct() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        group_commit: false,
        ..Options::default()
    };
    let l = Ledger::open_with(dir.path(), opts).unwrap();
    let acks = hammer(&[l], 4, 25);
    check_acks(dir.path(), &acks);
}

#[test]
fn separate_handles_like_separate_processes_never_interleave() {
    // Each handle has its own open file and lock, as two processes would.
    let dir = tempfile::tempdir().unwrap();
    let handles: Vec<Ledger> = (0..3).map(|_| Ledger::open(dir.path()).unwrap()).collect();
    let acks = hammer(&handles, 9, 30);
    check_acks(dir.path(), &acks);
}

#[test]
fn torn_tail_at_every_offset_of_the_last_line_is_repaired_without_losing_entries() {
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::open(dir.path()).unwrap();
    for i in 0..3 {
        l.append("k", json!({"i": i, "pad": "é€😀"})).unwrap();
    }
    drop(l);
    let file = dir.path().join("ledger.jsonl");
    let full = std::fs::read(&file).unwrap();
    let last_start = full[..full.len() - 1]
        .iter()
        .rposition(|&b| b == b'\n')
        .unwrap()
        + 1;
    let committed = &full[..last_start];
    let last_line = &full[last_start..full.len() - 1];
    for cut in 1..last_line.len() {
        let case = tempfile::tempdir().unwrap();
        let mut torn = committed.to_vec();
        torn.extend_from_slice(&last_line[..cut]);
        std::fs::write(case.path().join("ledger.jsonl"), &torn).unwrap();
        let l = Ledger::open(case.path()).unwrap();
        let r = l.repair().expect("a torn tail is repaired").clone();
        assert_eq!(
            (r.action, r.offset, r.bytes),
            ("truncated", last_start as u64, cut as u64)
        );
        let saved = std::fs::read(r.saved_to.as_ref().unwrap()).unwrap();
        assert_eq!(saved, &last_line[..cut], "the cut bytes are kept");
        let e = entries(case.path());
        assert_eq!(e.len(), 3, "two committed entries and the repair record");
        assert_eq!(e[2].kind, "ledger.repair");
        assert_eq!(e[2].data["bytes"], json!(cut));
        assert_eq!(r.recorded_as.unwrap().seq, 2);
        assert_eq!(assert_intact(case.path()), 3);
    }
}

#[test]
fn a_whole_entry_missing_only_its_newline_is_completed_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::open(dir.path()).unwrap();
    l.append("k", json!({})).unwrap();
    let last = l.append("k", json!({"keep": "me"})).unwrap();
    drop(l);
    let file = dir.path().join("ledger.jsonl");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.pop();
    std::fs::write(&file, &bytes).unwrap();
    let l = Ledger::open(dir.path()).unwrap();
    assert_eq!(l.repair().unwrap().action, "completed");
    let e = entries(dir.path());
    assert_eq!(e[1].hash, last.hash);
    assert_eq!(e[2].kind, "ledger.repair");
    assert_eq!(assert_intact(dir.path()), 3);
}

#[test]
fn a_damaged_complete_last_line_is_refused_not_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::open(dir.path()).unwrap();
    l.append("k", json!({"amount": 100})).unwrap();
    drop(l);
    let file = dir.path().join("ledger.jsonl");
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("100", "900");
    std::fs::write(&file, &text).unwrap();
    let err = Ledger::open(dir.path()).unwrap_err();
    assert!(matches!(err, LedgerError::Damaged { .. }), "{err}");
    assert!(err.to_string().contains("does not match its hash"), "{err}");
    // Nothing was written.
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
}

#[test]
fn another_process_appending_is_seen_before_the_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let a = Ledger::open(dir.path()).unwrap();
    let b = Ledger::open(dir.path()).unwrap();
    assert_eq!(a.append("a", json!({})).unwrap().seq, 0);
    assert_eq!(b.append("b", json!({})).unwrap().seq, 1);
    assert_eq!(a.append("a", json!({})).unwrap().seq, 2);
    assert_eq!(assert_intact(dir.path()), 3);
}

#[test]
fn truncation_by_another_program_while_open_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let l = Ledger::open(dir.path()).unwrap();
    l.append("k", json!({})).unwrap();
    l.append("k", json!({})).unwrap();
    let file = dir.path().join("ledger.jsonl");
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(10).unwrap();
    let err = l.append("k", json!({})).unwrap_err();
    assert!(matches!(err, LedgerError::Shrunk { .. }), "{err}");
    // The handle stays refused: fail closed.
    assert!(matches!(
        l.append("k", json!({})),
        Err(LedgerError::Poisoned { .. })
    ));
}

/// `append_all` commits a batch in order and contiguously, even with other appenders at work,
/// and the ledger verifies.
#[test]
fn batches_are_contiguous_and_in_order_among_concurrent_appenders() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = cordon_ledger::Ledger::open(dir.path()).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let ledger = ledger.clone();
            s.spawn(move || {
                for b in 0..10 {
                    let batch: Vec<(String, serde_json::Value)> = (0..5)
                        .map(|i| {
                            (
                                "batch".to_owned(),
                                serde_json::json!({"thread": t, "batch": b, "i": i}),
                            )
                        })
                        .collect();
                    let heads = ledger.append_all(batch).unwrap();
                    let seqs: Vec<u64> = heads.iter().map(|h| h.seq).collect();
                    let first = seqs[0];
                    assert_eq!(seqs, (first..first + 5).collect::<Vec<_>>());
                }
            });
        }
    });
    let text = std::fs::read_to_string(dir.path().join("ledger.jsonl")).unwrap();
    let entries: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(entries.len(), 200);
    for chunk in entries.chunks(5) {
        let key = (&chunk[0]["data"]["thread"], &chunk[0]["data"]["batch"]);
        for (i, e) in chunk.iter().enumerate() {
            assert_eq!((&e["data"]["thread"], &e["data"]["batch"]), key);
            assert_eq!(e["data"]["i"], i);
        }
    }
    let report = cordon_ledger::verify(
        &cordon_ledger::Paths::resolve(dir.path()),
        &cordon_ledger::VerifyOptions::default(),
    )
    .unwrap();
    assert!(report.damage.is_none(), "{report:?}");
}
