//! Decision latency: a policy of 10 Cedar rules and 5 sequence rules, an
//! agent state primed with a 1,000-action history.
//!
//! `cargo bench -p cordon-policy --bench decide` first records the latency
//! of each of 200,000 single decisions on one thread and prints p50, p99 and
//! decisions per second, then runs the criterion benchmarks (mean and
//! median with confidence intervals). Under `cargo test` (no `--bench`) only
//! the criterion benchmarks run, once each, as a smoke test.

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use cordon_policy::{Action, AgentState, Engine};
use criterion::{BatchSize, Criterion};
use serde_json::json;

const POLICY: &str = r#"
[actions]
cedar = '''
@id("read") permit(principal, action == Action::"read_file", resource);
@id("write-workspace") permit(principal, action == Action::"write_file", resource)
  when { context.resource like "workspace/*" };
@id("run") permit(principal, action == Action::"run_command", resource);
@id("transfer") permit(principal, action in [Action::"download_file", Action::"upload_file", Action::"delete_file"], resource);
@id("list") permit(principal, action == Action::"list_dir", resource);
@id("no-ssh") forbid(principal, action == Action::"read_file", resource)
  when { context.resource like "*/.ssh/*" };
@id("no-rm-root") forbid(principal, action == Action::"run_command", resource)
  when { context.args has command && context.args.command like "*rm -rf /*" };
@id("no-sudo") @effect("halt") forbid(principal, action == Action::"run_command", resource)
  when { context.args has command && context.args.command like "sudo *" };
@id("write-budget") forbid(principal, action == Action::"write_file", resource)
  when { context.history.counts has write_file && context.history.counts.write_file > 100000 };
@id("no-paste") forbid(principal, action == Action::"upload_file", resource)
  when { context.args has destination && context.args.destination like "https://paste*" };
'''

[[sequence]]
name = "download-upload-delete"
actions = ["download_file", "upload_file", "delete_file"]
decision = "halt"

[[sequence]]
name = "env-then-upload"
actions = ["read_file", "upload_file"]
decision = "deny"
within_actions = 50
where = [
  { step = 1, field = "resource", in = ["*.env"] },
  { step = 2, field = "args.destination", not_in = ["s3://corp-bucket/*"] },
]

[[sequence]]
name = "directory-scan"
actions = ["list_dir", "list_dir", "list_dir", "list_dir"]
decision = "deny"
consecutive = true

[[sequence]]
name = "download-then-run"
actions = ["download_file", "run_command"]
decision = "halt"
within_time = "1m"
where = { step = 2, field = "args.command", in = ["*./downloaded*"] }

[[sequence]]
name = "read-write-run"
actions = ["read_file", "write_file", "run_command"]
decision = "deny"
within_actions = 20
"#;

/// A plausible history: reads, writes, commands and listings, none of which
/// completes a sequence.
fn history_action(i: u64) -> Action {
    match i % 6 {
        0 => Action::new("a1", "read_file").with_resource(format!("src/file{}.rs", i % 50)),
        1 => Action::new("a1", "write_file").with_resource(format!("workspace/out{}.txt", i % 20)),
        2 => Action::new("a1", "list_dir").with_resource("workspace"),
        3 => Action::new("a1", "read_file").with_resource("README.md"),
        4 => Action::new("a1", "download_file").with_args(json!({"url": "https://example.com/x"})),
        _ => Action::new("a1", "list_dir").with_resource("src"),
    }
}

fn setup() -> (Engine, AgentState, Action) {
    let loaded = cordon_policy::load::parse("bench.toml", POLICY, Path::new("/bench"))
        .expect("the bench policy loads");
    assert_eq!(loaded.policy.actions.rules.len(), 10);
    assert_eq!(loaded.policy.sequences.len(), 5);
    let engine = Engine::new(&loaded.policy).expect("the bench policy compiles");
    let mut state = engine.state();
    for i in 0..1_000 {
        let d = engine.decide(&mut state, &history_action(i), i * 100);
        assert_eq!(d.verdict, cordon_policy::Verdict::Allow, "priming: {d}");
    }
    assert_eq!(state.count(), 1_000);
    let probe = Action::new("a1", "upload_file").with_args(
        json!({"destination": "s3://corp-bucket/report.csv", "overwrite": true, "retries": 3}),
    );
    (engine, state, probe)
}

/// The same Cedar rules without the sequence rules, and a state primed
/// the same way: the difference to [`setup`] is what the automata cost.
fn setup_cedar_only() -> (Engine, AgentState) {
    let text = &POLICY[..POLICY.find("[[sequence]]").unwrap_or(POLICY.len())];
    let loaded = cordon_policy::load::parse("bench.toml", text, Path::new("/bench"))
        .expect("the cedar part loads");
    let engine = Engine::new(&loaded.policy).expect("the cedar part compiles");
    let mut state = engine.state();
    for i in 0..1_000 {
        engine.decide(&mut state, &history_action(i), i * 100);
    }
    (engine, state)
}

/// Per-decision latencies on this thread: p50, p99, decisions per second.
fn percentiles() {
    let (engine, state, probe) = setup();
    let (cedar_only, cedar_state) = setup_cedar_only();
    const N: usize = 200_000;
    let measure = |engine: &Engine, state: &AgentState| {
        for _ in 0..10_000 {
            black_box(engine.evaluate(state, &probe, 200_000));
        }
        let mut samples = Vec::with_capacity(N);
        let start = Instant::now();
        for _ in 0..N {
            let t = Instant::now();
            black_box(engine.evaluate(black_box(state), black_box(&probe), 200_000));
            samples.push(t.elapsed().as_nanos());
        }
        let total = start.elapsed();
        samples.sort_unstable();
        (samples, total)
    };
    let (cedar_samples, _) = measure(&cedar_only, &cedar_state);
    let (samples, total) = measure(&engine, &state);
    // Quantile in parts per ten thousand, in microseconds.
    let at = |s: &[u128], q: usize| s[N * q / 10_000] as f64 / 1000.0;
    println!(
        "cedar rules only (10 rules, no sequences): p50 {:.2} µs   p99 {:.2} µs",
        at(&cedar_samples, 5_000),
        at(&cedar_samples, 9_900)
    );
    let at = |q: usize| at(&samples, q);
    println!(
        "decide (10 cedar rules, 5 sequences, 1,000-action history), {N} decisions on one thread:\n  p50 {:.2} µs   p90 {:.2} µs   p99 {:.2} µs   p99.9 {:.2} µs   max {:.1} µs\n  {:.0} decisions/s (including timer overhead)",
        at(5_000),
        at(9_000),
        at(9_900),
        at(9_990),
        *samples.last().unwrap_or(&0) as f64 / 1000.0,
        N as f64 / total.as_secs_f64(),
    );
}

fn benches(c: &mut Criterion) {
    let (engine, state, probe) = setup();
    c.bench_function(
        "evaluate upload (10 cedar + 5 sequences, 1k history)",
        |b| b.iter(|| engine.evaluate(black_box(&state), black_box(&probe), 200_000)),
    );
    c.bench_function("decide upload incl. commit (state cloned per call)", |b| {
        b.iter_batched_ref(
            || state.clone(),
            |s| engine.decide(s, black_box(&probe), 200_000),
            BatchSize::SmallInput,
        )
    });
    let read = Action::new("a1", "read_file").with_resource("src/main.rs");
    c.bench_function("evaluate read_file, no arguments", |b| {
        b.iter(|| engine.evaluate(black_box(&state), black_box(&read), 200_000))
    });
}

fn main() {
    if std::env::args().any(|a| a == "--bench") {
        percentiles();
    }
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
}
