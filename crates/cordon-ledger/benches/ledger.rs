//! Append throughput (per-append fsync vs group commit, 1/8/64 writers) and
//! verify throughput. Run: `cargo bench -p cordon-ledger --bench ledger`.
//! The ratio against `sha256sum` on a 100+ MB ledger is measured by
//! `scripts/bench-verify`, which times both in the same run.

use std::hint::black_box;
use std::time::{Duration, Instant};

use cordon_ledger::Ledger;
use cordon_ledger::chain::verify_reader;
use cordon_ledger::entry::{Entry, ZERO_HASH, format_rfc3339};
use cordon_ledger::ledger::Options;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;

/// Appends `per_writer` entries from each of `writers` threads, returning
/// the wall time.
fn run_appends(ledger: &Ledger, writers: usize, per_writer: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for w in 0..writers {
            let l = ledger.clone();
            s.spawn(move || {
                for i in 0..per_writer {
                    black_box(
                        l.append(
                            "bench.append",
                            json!({"writer": w, "i": i, "note": "x".repeat(100)}),
                        )
                        .unwrap(),
                    );
                }
            });
        }
    });
    start.elapsed()
}

fn append(c: &mut Criterion) {
    let mut g = c.benchmark_group("append");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(8));
    for (name, group_commit) in [("per-append-fsync", false), ("group-commit", true)] {
        for writers in [1usize, 8, 64] {
            g.throughput(Throughput::Elements(writers as u64));
            g.bench_function(format!("{name}/{writers}-writers"), |b| {
                let dir = tempfile::tempdir().unwrap();
                let opts = Options {
                    group_commit,
                    ..Options::default()
                };
                let ledger = Ledger::open_with(dir.path(), opts).unwrap();
                // One iteration = one append by each writer.
                b.iter_custom(|iters| run_appends(&ledger, writers, iters));
            });
        }
    }
    g.finish();
}

fn verify(c: &mut Criterion) {
    // 8 MB of run events, built in memory (appending them one fsync at a
    // time would measure the disk).
    let mut bytes = Vec::new();
    let mut prev = ZERO_HASH;
    // Run as a test (no --bench), the benchmark only has to work.
    let n = if std::env::args().any(|a| a == "--bench") {
        24_000
    } else {
        500
    };
    for seq in 0..n {
        let data =
            json!({"run_id": format!("run-{}", seq / 50), "i": seq, "detail": "y".repeat(220)});
        let e = Entry::new(
            seq,
            format_rfc3339(1_790_000_000 + seq, 0),
            "run.event".into(),
            data,
            prev,
        )
        .unwrap();
        bytes.extend_from_slice(&e.to_line().unwrap());
        prev = e.hash;
    }
    let mut g = c.benchmark_group("verify");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("in-memory", |b| {
        b.iter(|| {
            let r = verify_reader(std::path::Path::new("bench"), &bytes[..], None, None).unwrap();
            assert!(r.intact());
            black_box(r.root)
        });
    });
    g.bench_function("sha256-of-same-bytes", |b| {
        use sha2::Digest;
        b.iter(|| black_box(sha2::Sha256::digest(&bytes)));
    });
    g.finish();
}

criterion_group!(benches, append, verify);
criterion_main!(benches);
