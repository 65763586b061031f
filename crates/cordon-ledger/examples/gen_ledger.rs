//! Writes a valid ledger of about MEGABYTES megabytes of run events, for
//! benchmarking verification (`scripts/bench-verify`). Entries are built in
//! memory and written at once: appending them one fsync at a time would
//! measure the disk, not the verifier.
//!
//! Usage: `cargo run --release -p cordon-ledger --example gen_ledger -- OUT.jsonl MEGABYTES`

use std::io::Write;

use cordon_ledger::entry::{Entry, ZERO_HASH, format_rfc3339};
use serde_json::json;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(out), Some(mb)) = (args.get(1), args.get(2).and_then(|m| m.parse::<u64>().ok()))
    else {
        eprintln!("usage: gen_ledger OUT.jsonl MEGABYTES");
        std::process::exit(2);
    };
    let target = mb << 20;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(out).unwrap());
    let (mut prev, mut written, mut seq) = (ZERO_HASH, 0u64, 0u64);
    let events = ["exec", "open", "connect", "policy.decision", "limit"];
    while written < target {
        let data = json!({
            "run_id": format!("run-{:06}", seq / 50),
            "event": events[(seq % 5) as usize],
            "argv": ["/usr/bin/python3", "-c", "import urllib.request as u; u.urlopen('https://example.com')"],
            "pid": 4000 + seq % 997,
            "decision": {"rule": "prevent-download-upload-delete", "verdict": "DENY", "cost_ms": 0.25},
            "detail": format!("agent step {seq}: tool call observed at the boundary; path=/workspace/src/file-{}.py", seq % 113),
        });
        let e = Entry::new(
            seq,
            format_rfc3339(1_790_000_000 + seq, 0),
            "run.event".into(),
            data,
            prev,
        )
        .unwrap();
        let line = e.to_line().unwrap();
        w.write_all(&line).unwrap();
        written += line.len() as u64;
        prev = e.hash;
        seq += 1;
    }
    w.flush().unwrap();
    eprintln!(
        "gen_ledger: {seq} entries, {written} bytes, {} bytes/entry",
        written / seq
    );
}
