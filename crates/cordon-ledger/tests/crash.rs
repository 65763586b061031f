//! Crash tests: a writer process appending from several threads is killed
//! with SIGKILL at random moments, over and over; every entry it
//! acknowledged must survive, and the ledger must verify after reopening.
//!
//! The writer is this test binary itself, re-run with `CORDON_CRASH_LEDGER`
//! set (see [`writer`]): without the variable that test appends a bounded
//! number of entries and checks them, so it is a test in its own right.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cordon_ledger::chain::{VerifyOptions, verify};
use cordon_ledger::entry::Entry;
use cordon_ledger::{Ledger, Paths};
use serde_json::json;

const ENV: &str = "CORDON_CRASH_LEDGER";

/// Appends from 4 threads, printing `seq hash` for each acknowledged entry
/// only after `append` returned. Forever when run as the crash child.
#[test]
fn writer() {
    let child = std::env::var_os(ENV);
    let tmp = tempfile::tempdir().unwrap();
    let dir = child
        .as_ref()
        .map_or_else(|| tmp.path().to_owned(), std::path::PathBuf::from);
    let per_thread = if child.is_some() { usize::MAX } else { 50 };
    let ledger = Ledger::open(&dir).unwrap();
    let out = std::sync::Mutex::new(std::io::stdout());
    std::thread::scope(|s| {
        for t in 0..4 {
            let (ledger, out) = (ledger.clone(), &out);
            s.spawn(move || {
                for i in 0..per_thread {
                    // Some entries large enough to take several pages.
                    let pad = "x".repeat(if i % 7 == 0 { 200_000 } else { 100 });
                    let h = ledger
                        .append("crash.test", json!({"t": t, "i": i, "pad": pad}))
                        .unwrap();
                    let mut o = out.lock().unwrap();
                    writeln!(o, "ack {} {}", h.seq, h.hash_hex()).unwrap();
                    o.flush().unwrap();
                }
            });
        }
    });
    if child.is_none() {
        let r = verify(&Paths::resolve(&dir), &VerifyOptions::default()).unwrap();
        assert!(r.intact());
        assert_eq!(r.entries, 200);
    }
}

#[test]
fn every_acknowledged_entry_survives_kill_9_at_random_moments() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut acked: BTreeMap<u64, String> = BTreeMap::new();
    let mut rng = 0x9e3779b97f4a7c15_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let started = Instant::now();
    let mut rounds = 0;
    let mut repairs = 0;
    while rounds < 40 && (rounds < 8 || started.elapsed() < Duration::from_secs(8)) {
        rounds += 1;
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash::writer",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("ack ") {
                    let (seq, hash) = rest.split_once(' ').unwrap();
                    let _ = tx.send((seq.parse::<u64>().unwrap(), hash.to_owned()));
                }
            }
        });
        // Kill at a random moment once the writer is under way (however
        // slow a loaded machine makes its start).
        let first = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the writer acknowledged nothing");
        std::thread::sleep(Duration::from_millis(next() % 100));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        for (seq, hash) in std::iter::once(first).chain(rx.try_iter()) {
            assert!(
                acked.insert(seq, hash).is_none(),
                "seq {seq} acknowledged twice"
            );
        }
        // Reopen (repairing a torn tail if the kill left one), then check.
        let l = Ledger::open(dir.path()).unwrap();
        repairs += usize::from(l.repair().is_some());
        drop(l);
        let r = verify(&Paths::resolve(dir.path()), &VerifyOptions::default()).unwrap();
        assert!(r.intact(), "round {rounds}: {:?}", r.damage);
        let text = std::fs::read(dir.path().join("ledger.jsonl")).unwrap();
        let on_disk: BTreeMap<u64, String> = text
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let e = Entry::parse(l).unwrap();
                (e.seq, hex::encode(e.hash))
            })
            .collect();
        for (seq, hash) in &acked {
            assert_eq!(
                on_disk.get(seq),
                Some(hash),
                "round {rounds}: acknowledged seq {seq} lost"
            );
        }
    }
    assert!(
        acked.len() >= rounds,
        "every round acknowledged at least one entry"
    );
    eprintln!(
        "crash test: {rounds} kills, {} acknowledged entries, {repairs} repairs",
        acked.len()
    );
}
