//! The interface every isolation backend implements (the Linux process sandbox today; gVisor and
//! microVM backends later), and the evidence sink a run records into.

use std::time::Instant;

use serde_json::Value;

use crate::plan::Plan;
use crate::report::{ExitStatus, LedgerPosition, ProviderReport, Teardown};

/// Why the backend ended a run early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// The memory limit was exceeded (the kernel's OOM killer acted in the run's cgroup).
    Memory,
    /// The process limit was reached.
    Pids,
    /// The wall-clock limit passed.
    Timeout,
    /// cordon was told to stop (a signal it could not forward, or containment).
    Containment,
}

impl KillReason {
    /// The word used in reports and the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            KillReason::Memory => "memory",
            KillReason::Pids => "pids",
            KillReason::Timeout => "timeout",
            KillReason::Containment => "containment",
        }
    }
}

/// How waiting for a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The command ran and ended on its own terms (or by a signal it was sent).
    Exited(ExitStatus),
    /// The command never started: `code` is 126 (not executable) or 127 (not found).
    NotStarted {
        /// 126 or 127.
        code: i32,
        /// What the kernel said.
        reason: String,
    },
    /// The backend killed the run.
    Killed {
        /// Why.
        reason: KillReason,
        /// How the command's process ended, when that was observed.
        status: Option<ExitStatus>,
    },
}

/// A failure of the backend itself. Always fail-closed: the runtime turns it into a `FAILED` or
/// `KILLED` verdict, never into "nothing to report".
#[derive(Debug, thiserror::Error)]
#[error("{stage}: {message}")]
pub struct BackendError {
    /// Where it failed (`cgroup`, `clone`, `mounts`, `landlock`…).
    pub stage: String,
    /// What happened.
    pub message: String,
}

impl BackendError {
    /// Builds an error for a stage.
    pub fn new(stage: impl Into<String>, message: impl ToString) -> Self {
        BackendError {
            stage: stage.into(),
            message: message.to_string(),
        }
    }
}

/// An isolation backend.
pub trait Backend {
    /// A running sandbox.
    type Run: Running;

    /// A short name for reports (`linux-process`).
    fn name(&self) -> &'static str;

    /// What this backend would be able to enforce for `plan` on this host, without creating
    /// anything. A provider the plan needs that reports `Degraded` or `NotConfigured` makes the
    /// run refused unless the plan allows degradation.
    fn probe(&self, plan: &Plan) -> Vec<ProviderReport>;

    /// Creates the boundary and starts the command in it. The backend calls
    /// [`StartGate::begin`] as early as it can and [`StartGate::pass`] once, after the boundary
    /// is built and verified and before anything of the command runs; an `Err` from `pass` stops
    /// the launch (the runtime uses the gate to hold the command until the run's start is
    /// durably recorded). On error, everything created so far has been removed.
    fn launch(&mut self, plan: &Plan, gate: &mut dyn StartGate) -> Result<Self::Run, BackendError>;
}

/// How the runtime holds a command until the run's start is on record.
pub trait StartGate {
    /// Starts making the run's start durable, on a thread of its own. A backend calls it as soon
    /// as the calling process may have a second thread (the Linux backend clones the sandbox's
    /// first process from a single-threaded process where it can, and calls this right after);
    /// a second call does nothing.
    fn begin(&mut self);

    /// Waits until the run's start is durable (beginning the record if [`StartGate::begin`] was
    /// not called). `Err` means it could not be recorded: the command must not start.
    fn pass(&mut self) -> Result<(), String>;
}

/// Where a backend delivers host-observed events (`host.exec`, `host.connect`, …) while the run
/// goes on, a batch at a time, in the order the kernel produced them; the runtime records each
/// batch in the ledger (sharing one fsync) between the run's start and end.
pub type EventSink<'a> = &'a mut dyn FnMut(Vec<(String, Value)>);

/// A run in progress.
pub trait Running: Send {
    /// Waits until the command ends, a limit is hit, or `deadline` passes (then the run is
    /// killed and the outcome says so), delivering host-observed events to `events`.
    fn wait(
        &mut self,
        deadline: Option<Instant>,
        events: EventSink<'_>,
    ) -> Result<Outcome, BackendError>;

    /// Kills every process of the run now.
    fn kill(&mut self, reason: KillReason) -> Result<(), BackendError>;

    /// What each mechanism reported, as observed so far.
    fn enforcement(&self) -> Vec<ProviderReport>;

    /// How long each stage of setting up the boundary took: `(stage, microseconds)`.
    fn timings(&self) -> Vec<(String, u64)> {
        Vec::new()
    }

    /// Kills whatever is left, verifies that nothing remains, and removes the boundary's
    /// resources, delivering the last host-observed events. Infallible by signature: a failure
    /// is part of the returned evidence.
    fn teardown(&mut self, events: EventSink<'_>) -> Teardown;

    /// Removes what is left of the boundary once [`Running::teardown`] has shown every process
    /// gone (empty cgroup directories, registrations), and meanwhile calls `record_end`, which
    /// records the run's end, once, on the calling thread. Cleanup is housekeeping: the backend
    /// overlaps it with the record as suits its machine (the default records, then returns).
    /// Returns what was done, for the report.
    fn cleanup(self, record_end: &mut dyn FnMut()) -> Vec<String>
    where
        Self: Sized,
    {
        record_end();
        Vec::new()
    }
}

/// Where a run's evidence goes (the ledger, in production). `Send`, so that a record can be
/// made durable on another thread while the boundary is being built.
pub trait Evidence: Send {
    /// Appends one entry durably and returns its position.
    fn record(&mut self, kind: &str, data: Value) -> Result<LedgerPosition, String>;

    /// Appends entries durably, in order, and returns the position of the last one. Ledgers
    /// that can make a batch durable at once should override this.
    fn record_all(
        &mut self,
        entries: Vec<(String, Value)>,
    ) -> Result<Option<LedgerPosition>, String> {
        let mut last = None;
        for (kind, data) in entries {
            last = Some(self.record(&kind, data)?);
        }
        Ok(last)
    }
}
