//! Containment latency: from the call to verified dead (and egress blocked, when the run has an
//! egress provider), for process trees of 1, 10 and 100. Root only.
//!
//! Beside it, in the same run, the kernel's own floor for the same trees: `cgroup.kill` then
//! `populated 0`, with no egress block, freeze or record; the ratio of the two medians is what
//! cordon's containment adds to what the kernel must do anyway.
//!
//! `cargo bench -p cordon-sandbox --bench contain` (criterion), which also prints the median and
//! p90 of the raw samples and the ratios.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

use cordon_bpf::{Allow, Egress};
use cordon_sandbox::cgroup::{CgroupLimits, Layout, RunCgroup};
use cordon_sandbox::contain::contain;

/// A cgroup holding a tree of `n` sleeping processes.
fn tree(layout: &Layout, n: usize, i: u64) -> (RunCgroup, Child) {
    let cg = RunCgroup::create(
        layout,
        &format!("bench-{}-{n}-{i}", std::process::id()),
        CgroupLimits::default(),
    )
    .expect("creating a cgroup (run as root)");
    let script = format!(
        "echo $$ > {} && for i in $(seq 2 {n}); do sleep 1000 & done; exec sleep 1000",
        cg.v2.join("cgroup.procs").display()
    );
    let child = Command::new("/bin/sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    while cg.procs().unwrap().len() < n {
        std::thread::sleep(Duration::from_millis(1));
    }
    (cg, child)
}

fn containment(c: &mut Criterion) {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIP containment benchmark: needs root");
        return;
    }
    let layout = Layout::detect().unwrap();
    let mut group = c.benchmark_group("contain");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(8));
    let mut counter = 0u64;
    let mut medians: std::collections::BTreeMap<(usize, &str), Duration> = Default::default();
    for n in [1usize, 10, 100] {
        let label = "kernel floor (cgroup.kill, populated 0)";
        let mut samples: Vec<Duration> = Vec::new();
        group.bench_with_input(BenchmarkId::new("kernel-floor", n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    counter += 1;
                    let (cg, mut child) = tree(&layout, n, counter);
                    let t = Instant::now();
                    cg.kill().unwrap();
                    assert!(cg.wait_empty(Duration::from_secs(2)).unwrap().is_some());
                    let took = t.elapsed();
                    total += took;
                    samples.push(took);
                    let _ = child.wait();
                    let mut steps = Vec::new();
                    cg.teardown(&mut steps);
                }
                total
            });
        });
        if let Some(m) = report(n, label, &mut samples) {
            medians.insert((n, "floor"), m);
        }
    }
    for with_egress in [false, true] {
        for n in [1usize, 10, 100] {
            let label = if with_egress {
                "verified-dead+egress-blocked"
            } else {
                "verified-dead"
            };
            let mut samples: Vec<Duration> = Vec::new();
            group.bench_with_input(BenchmarkId::new(label, n), &n, |b, &n| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        counter += 1;
                        let (cg, mut child) = tree(&layout, n, counter);
                        let run_id = format!("bench-{}-{counter}", std::process::id());
                        let egress = with_egress.then(|| {
                            let allow = [Allow::new("192.0.2.0".parse().unwrap(), 24, None)];
                            Egress::attach(&run_id, &cg.v2, &allow, None).expect("egress")
                        });
                        let root = std::path::Path::new(cordon_bpf::bpffs::DEFAULT_ROOT);
                        let mut block = || -> Result<String, String> {
                            cordon_bpf::block_pinned(root, &run_id).map_err(|e| e.to_string())?;
                            match cordon_bpf::egress::pinned_blocked(root, &run_id) {
                                Ok(true) => Ok("blocked".into()),
                                other => Err(format!("{other:?}")),
                            }
                        };
                        let t = Instant::now();
                        let outcome = if with_egress {
                            contain(&cg, Some(&mut block))
                        } else {
                            contain(&cg, None)
                        };
                        let took = t.elapsed();
                        assert!(outcome.complete(), "{outcome:#?}");
                        if std::env::var_os("CORDON_BENCH_STEPS").is_some() {
                            let at: Vec<String> = outcome
                                .steps
                                .iter()
                                .map(|s| format!("{}@{}", s.action, s.at_us))
                                .collect();
                            eprintln!("n={n} {}", at.join(" "));
                        }
                        total += took;
                        samples.push(took);
                        let _ = child.wait();
                        let mut steps = Vec::new();
                        cg.teardown(&mut steps);
                        if let Some(e) = egress {
                            e.release().expect("egress release");
                        }
                    }
                    total
                });
            });
            if let Some(m) = report(n, label, &mut samples) {
                medians.insert((n, label), m);
            }
        }
    }
    group.finish();
    for ((n, label), m) in &medians {
        if *label == "floor" {
            continue;
        }
        if let Some(floor) = medians.get(&(*n, "floor")) {
            println!(
                "ratio contain/kernel floor, {n:>3} processes ({label}): {:.2}",
                m.as_secs_f64() / floor.as_secs_f64()
            );
        }
    }
}

/// Prints the median and p90 of `samples`; returns the median (none when filtered out).
fn report(n: usize, label: &str, samples: &mut [Duration]) -> Option<Duration> {
    if samples.is_empty() {
        return None; // filtered out on the command line
    }
    samples.sort();
    let pct = |percent: usize| samples[(samples.len() - 1) * percent / 100];
    println!(
        "contain {n:>3} processes ({label}): median {:.3} ms, p90 {:.3} ms over {} containments",
        pct(50).as_secs_f64() * 1e3,
        pct(90).as_secs_f64() * 1e3,
        samples.len()
    );
    Some(pct(50))
}

criterion_group!(benches, containment);
criterion_main!(benches);
