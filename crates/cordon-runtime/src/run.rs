//! One run from plan to report: refuse what cannot be enforced, record, launch, wait, tear down,
//! decide the verdict, record again. Every failure path ends in a report whose verdict is not
//! `ALLOWED`: an error in the containment path never reads as "nothing to report".

use std::time::Instant;

use serde_json::json;

use crate::backend::{Backend, Evidence, KillReason, Outcome, Running, StartGate};
use crate::plan::Plan;
use crate::report::{
    EnforcementState, ExitStatus, LedgerPosition, ProviderReport, Report, Teardown, Verdict,
};

/// Runs `plan` on `backend`, recording into `evidence`, and returns the report.
pub fn execute<B: Backend>(plan: &Plan, backend: &mut B, evidence: &mut dyn Evidence) -> Report {
    let started = Instant::now();
    let mut report = Report {
        run_id: plan.run_id.clone(),
        verdict: Verdict::Failed,
        reasons: Vec::new(),
        exit: ExitStatus::default(),
        enforcement: Vec::new(),
        ledger: None,
        spec_hash: plan.spec_hash.clone(),
        backend: backend.name().to_owned(),
        teardown: Teardown::default(),
        duration_ms: 0,
        timings_us: Vec::new(),
    };

    let probe = backend.probe(plan);
    crate::mark("probed");
    let shortfalls: Vec<&ProviderReport> = probe
        .iter()
        .filter(|p| p.state != EnforcementState::Enforced)
        .collect();
    if !shortfalls.is_empty() && !plan.allow_degraded {
        report.enforcement = probe.clone();
        report.reasons = shortfalls
            .iter()
            .map(|p| format!("{} would be {}: {}", p.provider, p.state, p.detail))
            .collect();
        report
            .reasons
            .push("refused before start (pass --allow-degraded to run anyway)".into());
        finish(&mut report, evidence, "run.refused", started);
        return report;
    }

    let start_data = json!({
        "run_id": plan.run_id,
        "spec_hash": plan.spec_hash,
        "backend": backend.name(),
        "argv": plan.argv,
        "mounts": plan.mounts,
        "net": plan.net,
        "limits": plan.limits,
        "allow_degraded": plan.allow_degraded,
        "probe": probe,
    });
    // The start is recorded while the boundary is built, on a thread the backend lets begin
    // once its process may have one; the command is held at the gate until the record is
    // durable, so no command runs without evidence that it was started.
    let mut start_error: Option<String> = None;
    let (launched, gate_passed) = std::thread::scope(|scope| {
        let recorder = &mut *evidence;
        let mut gate = Gate {
            scope,
            job: Some(move || {
                crate::mark("run.start: begun");
                let r = recorder.record("run.start", start_data);
                crate::mark("run.start: durable");
                r
            }),
            pending: None,
            recorded: None,
            passed: false,
        };
        let launched = backend.launch(plan, &mut gate);
        // A launch that failed before the gate still owes the record (a run's end is never
        // recorded without its start), and its outcome.
        gate.begin();
        if let Some(recording) = gate.pending.take() {
            if let Err(e) = recording.outcome() {
                start_error = Some(match e {
                    StartFailure::Failed(e) => e,
                    StartFailure::Panicked => "the recording thread panicked".to_owned(),
                });
            }
            let _ = recording.thread.join();
        }
        // Joined only now, with the command running: the join unmaps the thread's stack.
        if let Some(thread) = gate.recorded.take() {
            let _ = thread.join();
        }
        (launched, gate.passed)
    });
    crate::mark("launched");
    // A backend that started the command without passing the gate broke the rule that nothing
    // runs without evidence of its start: the run is stopped and failed (with a start that
    // could not be recorded, reported just below).
    let launched = match launched {
        Ok(mut run) if !gate_passed || start_error.is_some() => {
            let _ = run.kill(KillReason::Containment);
            report.teardown = run.teardown(&mut |_| {});
            let _ = run.cleanup(&mut || {});
            Err(
                "the backend started the command without waiting for the record of its start"
                    .to_owned(),
            )
        }
        other => other.map_err(|e| e.to_string()),
    };
    if let Some(e) = start_error {
        report.enforcement = probe;
        report.reasons.push(format!(
            "ledger: could not record the run's start, so it was not started: {e}"
        ));
        report.duration_ms = millis(started.elapsed());
        return report;
    }
    let mut run = match launched {
        Ok(run) => run,
        Err(e) => {
            report.enforcement = probe;
            report.reasons.push(format!("launch failed: {e}"));
            finish(&mut report, evidence, "run.end", started);
            return report;
        }
    };

    let deadline = plan.limits.timeout.map(|t| started + t);
    // Host-observed events go into the ledger as they come, a batch every quarter second (or
    // every 256 events) so that a long run's evidence is durable as it goes; what is left at the
    // end is committed with the run's end under one fsync. One that cannot be recorded makes the
    // run unprovable, so it is remembered and the run is not ALLOWED.
    let mut event_errors: Vec<String> = Vec::new();
    let mut pending: Vec<(String, serde_json::Value)> = Vec::new();
    let mut last_flush = Instant::now();
    let mut sink = |batch: Vec<(String, serde_json::Value)>| {
        pending.extend(batch);
        if pending.len() >= EVENT_BATCH || last_flush.elapsed() >= EVENT_FLUSH {
            last_flush = Instant::now();
            let batch = std::mem::take(&mut pending);
            if batch.is_empty() {
                return;
            }
            let n = batch.len();
            let first = batch[0].0.clone();
            if let Err(e) = evidence.record_all(batch) {
                event_errors.push(format!("{n} entries from {first}: {e}"));
            }
        }
    };
    let outcome = run.wait(deadline, &mut sink);
    crate::mark("waited");
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            // Fail closed: we no longer know what the run is doing, so it is stopped.
            let killed = run.kill(KillReason::Containment);
            report
                .reasons
                .push(format!("backend failed while the command ran: {e}"));
            if let Err(k) = killed {
                report.reasons.push(format!("kill failed: {k}"));
            }
            Outcome::Killed {
                reason: KillReason::Containment,
                status: None,
            }
        }
    };
    report.enforcement = run.enforcement();
    report.timings_us = run.timings();
    report.teardown = run.teardown(&mut sink);
    crate::mark("teardown");
    let tail = std::mem::take(&mut pending);
    if !event_errors.is_empty() {
        report.reasons.push(format!(
            "ledger: {} batches of host-observed events could not be recorded (first: {})",
            event_errors.len(),
            event_errors[0]
        ));
    }

    match outcome {
        Outcome::Exited(status) => {
            report.exit = status;
            report.verdict = Verdict::Allowed;
        }
        Outcome::NotStarted { code, reason } => {
            report.exit = ExitStatus {
                code: Some(code),
                signal: None,
            };
            report.reasons.push(reason);
            report.verdict = Verdict::Failed;
        }
        Outcome::Killed { reason, status } => {
            report.exit = status.unwrap_or_default();
            report.reasons.push(format!("killed: {}", reason.as_str()));
            report.verdict = Verdict::Killed;
        }
    }

    // The boundary must be shown intact for a run to be ALLOWED.
    if !report.teardown.verified_empty {
        report
            .reasons
            .push("teardown: could not verify that every process of the run is gone".into());
        if report.verdict == Verdict::Allowed {
            report.verdict = Verdict::Failed;
        }
    }
    if !event_errors.is_empty() && report.verdict == Verdict::Allowed {
        report.verdict = Verdict::Failed;
    }
    for p in &report.enforcement {
        let acceptable = match p.state {
            EnforcementState::Enforced | EnforcementState::NotConfigured => true,
            EnforcementState::Degraded => plan.allow_degraded,
            EnforcementState::VerificationFailed => false,
        };
        if !acceptable {
            report
                .reasons
                .push(format!("{}: {}: {}", p.provider, p.state, p.detail));
            if report.verdict == Verdict::Allowed {
                report.verdict = Verdict::Failed;
            }
        }
    }

    // The run's end is recorded while what is left of the boundary (empty directories,
    // registrations) is removed, as the backend arranges; what the cleanup did joins the
    // report. A cleanup that panics still leaves the run's end recorded.
    let mut tail = Some(tail);
    let mut recorded = false;
    let cleaned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run.cleanup(&mut || {
            if let Some(tail) = tail.take() {
                finish_with(&mut report, evidence, tail, "run.end", started);
                recorded = true;
                crate::mark("run.end recorded");
            }
        })
    }));
    if !recorded {
        finish_with(
            &mut report,
            evidence,
            tail.take().unwrap_or_default(),
            "run.end",
            started,
        );
    }
    match cleaned {
        Ok(steps) => report.teardown.steps.extend(steps),
        Err(_) => report
            .teardown
            .steps
            .push("cleanup after the run's end panicked".to_owned()),
    }
    report
}

/// The runtime's [`StartGate`]: the run's start, recorded on a scoped thread.
struct Gate<'scope, 'env, F> {
    scope: &'scope std::thread::Scope<'scope, 'env>,
    job: Option<F>,
    pending: Option<Recording<'scope>>,
    /// The recording thread, once the gate has its outcome.
    recorded: Option<std::thread::ScopedJoinHandle<'scope, ()>>,
    passed: bool,
}

/// Why the run's start was not recorded.
enum StartFailure {
    /// The evidence refused it, for this reason.
    Failed(String),
    /// The recording thread panicked.
    Panicked,
}

/// The thread recording the run's start. Its outcome comes through a channel, so that waiting
/// for it is not joining the thread: a join unmaps the thread's stack, a TLB shootdown on the
/// other CPUs (~20-100 µs on the machine of ARCHITECTURE.md), which the gate would otherwise
/// add to the command's start. The thread is joined once the command runs.
struct Recording<'scope> {
    thread: std::thread::ScopedJoinHandle<'scope, ()>,
    result: std::sync::mpsc::Receiver<Result<LedgerPosition, String>>,
}

impl Recording<'_> {
    /// Waits for the record and says how it went (asked once: the gate or, when the gate was
    /// never reached, the launch's caller takes the recording).
    fn outcome(&self) -> Result<(), StartFailure> {
        match recv_awake(&self.result, GATE_SPIN) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(StartFailure::Failed(e)),
            // The sender went without sending: the job panicked.
            Err(_) => Err(StartFailure::Panicked),
        }
    }
}

/// How long the gate waits awake for the run's start to be durable before it sleeps on it.
const GATE_SPIN: std::time::Duration = std::time::Duration::from_millis(1);

/// Receives from `rx`, waiting awake for at most `limit` (asking without blocking and yielding
/// the CPU in between) before it blocks. The gate waits this way for the start record, due in
/// ~0.1-0.5 ms (the ledger's fdatasync): a thread that sleeps lets its virtual CPU halt, and the
/// wakeup that follows cost ~40-190 µs on the machine of ARCHITECTURE.md (up to ~0.8 ms under
/// load); the recording thread, woken by the disk on that same CPU (the Linux backend starts it
/// on the launcher's), runs at once in the yield's place.
fn recv_awake<T>(
    rx: &std::sync::mpsc::Receiver<T>,
    limit: std::time::Duration,
) -> Result<T, std::sync::mpsc::RecvError> {
    use std::sync::mpsc::TryRecvError;
    let until = std::time::Instant::now() + limit;
    loop {
        match rx.try_recv() {
            Ok(v) => return Ok(v),
            Err(TryRecvError::Disconnected) => return Err(std::sync::mpsc::RecvError),
            Err(TryRecvError::Empty) if std::time::Instant::now() >= until => return rx.recv(),
            Err(TryRecvError::Empty) => std::thread::yield_now(),
        }
    }
}

impl<'scope, F> StartGate for Gate<'scope, '_, F>
where
    F: FnOnce() -> Result<LedgerPosition, String> + Send + 'scope,
{
    fn begin(&mut self) {
        if let Some(job) = self.job.take() {
            let (tx, result) = std::sync::mpsc::sync_channel(1);
            let thread = self.scope.spawn(move || {
                let _ = tx.send(job());
            });
            self.pending = Some(Recording { thread, result });
        }
    }

    fn pass(&mut self) -> Result<(), String> {
        if std::mem::replace(&mut self.passed, true) {
            return Err("the gate was passed twice".to_owned());
        }
        self.begin();
        let recording = self.pending.take().ok_or("the start record was lost")?;
        let outcome = match recording.outcome() {
            Ok(()) => Ok(()),
            Err(StartFailure::Failed(e)) => {
                Err(format!("ledger: could not record the run's start: {e}"))
            }
            Err(StartFailure::Panicked) => Err("ledger: the recording thread panicked".to_owned()),
        };
        self.recorded = Some(recording.thread);
        outcome
    }
}

/// Most host-observed events held before they are written.
const EVENT_BATCH: usize = 256;
/// Longest time a host-observed event waits before it is written.
const EVENT_FLUSH: std::time::Duration = std::time::Duration::from_millis(250);

/// Records the report's final entry and stores its position in the report. A run whose end
/// cannot be recorded cannot be shown to anyone, so it is not `ALLOWED`.
fn finish(report: &mut Report, evidence: &mut dyn Evidence, kind: &str, started: Instant) {
    finish_with(report, evidence, Vec::new(), kind, started);
}

/// [`finish`], committing `before` (the last host-observed events) first, under the same fsync.
fn finish_with(
    report: &mut Report,
    evidence: &mut dyn Evidence,
    mut before: Vec<(String, serde_json::Value)>,
    kind: &str,
    started: Instant,
) {
    report.duration_ms = millis(started.elapsed());
    let data = json!({
        "run_id": report.run_id,
        "verdict": report.verdict,
        "reasons": report.reasons,
        "exit": report.exit,
        "enforcement": report.enforcement,
        "teardown": report.teardown,
        "spec_hash": report.spec_hash,
        "duration_ms": report.duration_ms,
    });
    before.push((kind.to_owned(), data));
    match evidence.record_all(before) {
        Ok(Some(pos)) => report.ledger = Some(pos),
        outcome => {
            let e = match outcome {
                Err(e) => e,
                _ => "nothing was acknowledged".to_owned(),
            };
            report
                .reasons
                .push(format!("ledger: could not record the run's end: {e}"));
            if report.verdict == Verdict::Allowed {
                report.verdict = Verdict::Failed;
            }
        }
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendError;
    use crate::spec::RunSpec;
    use serde_json::Value;

    #[derive(Default)]
    struct Recorder {
        entries: Vec<(String, Value)>,
        fail: bool,
        panic: bool,
    }

    impl Evidence for Recorder {
        fn record(&mut self, kind: &str, data: Value) -> Result<LedgerPosition, String> {
            if self.fail {
                return Err("disk full".into());
            }
            assert!(!(self.panic && kind == "run.start"), "the recorder panics");
            self.entries.push((kind.to_owned(), data));
            Ok(LedgerPosition {
                path: "mem".into(),
                seq: self.entries.len() as u64 - 1,
                head: "00".into(),
            })
        }
    }

    /// A backend whose behaviour each test scripts.
    struct Scripted {
        probe: Vec<ProviderReport>,
        outcome: Result<Outcome, String>,
        verified_empty: bool,
        launched: bool,
        /// Fail the launch before the gate.
        fail_launch: bool,
        /// Start without passing the gate (a broken backend).
        skip_gate: bool,
        cleanup: Cleanup,
    }

    /// What the scripted cleanup does with the run's end.
    #[derive(Clone, Copy)]
    enum Cleanup {
        /// The trait's default: record, nothing to clean.
        Default,
        /// Records it twice (a broken backend).
        RecordTwice,
        /// Panics before recording it.
        Panic,
    }

    struct ScriptedRun {
        outcome: Result<Outcome, String>,
        verified_empty: bool,
        cleanup: Cleanup,
    }

    impl Backend for Scripted {
        type Run = ScriptedRun;
        fn name(&self) -> &'static str {
            "scripted"
        }
        fn probe(&self, _: &Plan) -> Vec<ProviderReport> {
            self.probe.clone()
        }
        fn launch(
            &mut self,
            _: &Plan,
            gate: &mut dyn StartGate,
        ) -> Result<ScriptedRun, BackendError> {
            if self.fail_launch {
                return Err(BackendError::new("clone3", "no more processes"));
            }
            if !self.skip_gate {
                gate.pass().map_err(|e| BackendError::new("gate", e))?;
            }
            self.launched = true;
            Ok(ScriptedRun {
                outcome: self.outcome.clone(),
                verified_empty: self.verified_empty,
                cleanup: self.cleanup,
            })
        }
    }

    impl Running for ScriptedRun {
        fn wait(
            &mut self,
            _: Option<Instant>,
            events: crate::backend::EventSink<'_>,
        ) -> Result<Outcome, BackendError> {
            events(vec![(
                "host.exec".to_owned(),
                serde_json::json!({"path": "/bin/true"}),
            )]);
            self.outcome
                .clone()
                .map_err(|e| BackendError::new("wait", e))
        }
        fn kill(&mut self, _: KillReason) -> Result<(), BackendError> {
            Ok(())
        }
        fn enforcement(&self) -> Vec<ProviderReport> {
            vec![ProviderReport::new("x", EnforcementState::Enforced, "ok")]
        }
        fn teardown(&mut self, _: crate::backend::EventSink<'_>) -> Teardown {
            Teardown {
                verified_empty: self.verified_empty,
                steps: vec![],
            }
        }
        fn cleanup(self, record_end: &mut dyn FnMut()) -> Vec<String> {
            match self.cleanup {
                Cleanup::Default => {
                    record_end();
                    Vec::new()
                }
                Cleanup::RecordTwice => {
                    record_end();
                    record_end();
                    vec!["cleaned".to_owned()]
                }
                Cleanup::Panic => panic!("cleanup failed"),
            }
        }
    }

    fn plan() -> Plan {
        let dir = std::env::temp_dir();
        RunSpec {
            command: vec!["/bin/true".into()],
            base_dir: dir,
            ..RunSpec::default()
        }
        .validate("t")
        .unwrap()
    }

    fn backend(outcome: Result<Outcome, String>) -> Scripted {
        Scripted {
            probe: vec![ProviderReport::new("x", EnforcementState::Enforced, "ok")],
            outcome,
            verified_empty: true,
            launched: false,
            fail_launch: false,
            skip_gate: false,
            cleanup: Cleanup::Default,
        }
    }

    fn exited(code: i32) -> Result<Outcome, String> {
        Ok(Outcome::Exited(ExitStatus {
            code: Some(code),
            signal: None,
        }))
    }

    #[test]
    fn clean_run_is_allowed_and_recorded_twice() {
        let mut ev = Recorder::default();
        let r = execute(&plan(), &mut backend(exited(3)), &mut ev);
        assert_eq!(r.verdict, Verdict::Allowed);
        assert_eq!(r.exit_code(), 3);
        let kinds: Vec<&str> = ev.entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds, ["run.start", "host.exec", "run.end"]);
        assert_eq!(r.ledger.unwrap().seq, 2);
    }

    #[test]
    fn the_runs_end_is_recorded_once_whatever_the_cleanup_does() {
        for (cleanup, step) in [
            (Cleanup::RecordTwice, "cleaned"),
            (Cleanup::Panic, "cleanup after the run's end panicked"),
        ] {
            let mut b = backend(exited(0));
            b.cleanup = cleanup;
            let mut ev = Recorder::default();
            let r = execute(&plan(), &mut b, &mut ev);
            let kinds: Vec<&str> = ev.entries.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(kinds, ["run.start", "host.exec", "run.end"]);
            assert_eq!(r.ledger.unwrap().seq, 2);
            assert_eq!(r.teardown.steps, [step]);
            // Cleanup is housekeeping: the verdict is the run's.
            assert_eq!(r.verdict, Verdict::Allowed);
        }
    }

    #[test]
    fn a_launch_failing_before_the_gate_still_records_its_start_then_its_end() {
        let mut b = backend(exited(0));
        b.fail_launch = true;
        let mut ev = Recorder::default();
        let r = execute(&plan(), &mut b, &mut ev);
        assert_eq!(r.verdict, Verdict::Failed);
        assert_eq!(r.exit_code(), 125);
        let kinds: Vec<&str> = ev.entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds, ["run.start", "run.end"]);
        assert!(
            r.reasons.iter().any(|x| x.contains("no more processes")),
            "{:?}",
            r.reasons
        );
    }

    #[test]
    fn a_failed_start_record_with_a_failed_launch_records_nothing_more() {
        let mut b = backend(exited(0));
        b.fail_launch = true;
        let mut ev = Recorder {
            fail: true,
            ..Recorder::default()
        };
        let r = execute(&plan(), &mut b, &mut ev);
        assert_eq!(r.verdict, Verdict::Failed);
        assert!(ev.entries.is_empty());
        assert!(
            r.reasons
                .iter()
                .any(|x| x.contains("could not record the run's start")),
            "{:?}",
            r.reasons
        );
    }

    #[test]
    fn a_backend_that_skips_the_gate_is_stopped_and_failed() {
        let mut b = backend(exited(0));
        b.skip_gate = true;
        let mut ev = Recorder::default();
        let r = execute(&plan(), &mut b, &mut ev);
        assert_eq!(r.verdict, Verdict::Failed);
        assert!(
            r.reasons.iter().any(|x| x.contains("without waiting")),
            "{:?}",
            r.reasons
        );
        let kinds: Vec<&str> = ev.entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds, ["run.start", "run.end"]);
    }

    #[test]
    fn degraded_probe_refuses_without_touching_the_backend() {
        let mut b = backend(exited(0));
        b.probe = vec![ProviderReport::new(
            "cgroup",
            EnforcementState::NotConfigured,
            "no cgroup",
        )];
        let mut ev = Recorder::default();
        let r = execute(&plan(), &mut b, &mut ev);
        assert_eq!(r.verdict, Verdict::Failed);
        assert_eq!(r.exit_code(), 125);
        assert!(!b.launched, "a refused run must not be launched");
        assert_eq!(ev.entries[0].0, "run.refused");
    }

    #[test]
    fn degraded_probe_runs_when_allowed() {
        let mut b = backend(exited(0));
        b.probe = vec![ProviderReport::new(
            "cgroup",
            EnforcementState::Degraded,
            "v1",
        )];
        let mut p = plan();
        p.allow_degraded = true;
        let r = execute(&p, &mut b, &mut Recorder::default());
        assert_eq!(r.verdict, Verdict::Allowed);
    }

    #[test]
    fn backend_error_during_wait_fails_closed() {
        let r = execute(
            &plan(),
            &mut backend(Err("lost track".into())),
            &mut Recorder::default(),
        );
        assert_eq!(r.verdict, Verdict::Killed);
        assert_eq!(r.exit_code(), 137);
        assert!(r.reasons.iter().any(|x| x.contains("lost track")));
    }

    #[test]
    fn unverified_teardown_is_never_allowed() {
        let mut b = backend(exited(0));
        b.verified_empty = false;
        let r = execute(&plan(), &mut b, &mut Recorder::default());
        assert_eq!(r.verdict, Verdict::Failed);
        assert_eq!(r.exit_code(), 125);
    }

    #[test]
    fn unrecordable_start_means_no_run() {
        let mut b = backend(exited(0));
        let mut ev = Recorder {
            fail: true,
            ..Recorder::default()
        };
        let r = execute(&plan(), &mut b, &mut ev);
        assert_eq!(r.verdict, Verdict::Failed);
        assert!(!b.launched);
    }

    /// What the gate waits for awake is received whether it comes within the spin or after it,
    /// and a sender gone without sending is an error either way, never a value.
    #[test]
    fn recv_awake_gets_what_comes_early_or_late_and_fails_on_nothing() {
        use std::time::Duration;
        for delay in [Duration::ZERO, Duration::from_millis(20)] {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let sender = std::thread::spawn(move || {
                std::thread::sleep(delay);
                tx.send(7).unwrap();
            });
            assert_eq!(recv_awake(&rx, Duration::from_millis(1)), Ok(7));
            sender.join().unwrap();
        }
        for delay in [Duration::ZERO, Duration::from_millis(20)] {
            let (tx, rx) = std::sync::mpsc::sync_channel::<i32>(1);
            let sender = std::thread::spawn(move || {
                std::thread::sleep(delay);
                drop(tx);
            });
            assert!(recv_awake(&rx, Duration::from_millis(1)).is_err());
            sender.join().unwrap();
        }
    }

    /// A recorder that panics fails the gate as surely as one that refuses (the outcome comes
    /// through a channel; its sender is dropped unsent).
    #[test]
    fn a_panicking_start_record_means_no_run() {
        let mut b = backend(exited(0));
        let mut ev = Recorder {
            panic: true,
            ..Recorder::default()
        };
        let r = execute(&plan(), &mut b, &mut ev);
        assert_eq!(r.verdict, Verdict::Failed);
        assert!(!b.launched);
        assert!(
            r.reasons
                .iter()
                .any(|x| x.contains("recording thread panicked")),
            "{:?}",
            r.reasons
        );
    }

    #[test]
    fn limit_kill_is_killed_with_reason() {
        let r = execute(
            &plan(),
            &mut backend(Ok(Outcome::Killed {
                reason: KillReason::Memory,
                status: None,
            })),
            &mut Recorder::default(),
        );
        assert_eq!(r.verdict, Verdict::Killed);
        assert_eq!(r.reasons, ["killed: memory"]);
    }

    #[test]
    fn not_found_command_exits_127() {
        let r = execute(
            &plan(),
            &mut backend(Ok(Outcome::NotStarted {
                code: 127,
                reason: "not found".into(),
            })),
            &mut Recorder::default(),
        );
        assert_eq!(r.verdict, Verdict::Failed);
        assert_eq!(r.exit_code(), 127);
    }
}
