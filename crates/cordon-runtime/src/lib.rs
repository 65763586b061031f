//! cordon's run layer: the run specification and its validation, the launch plan a backend
//! receives, the backend interface, the run report, and [`execute`], which drives one run from
//! plan to verdict. It applies nothing itself; backends (`cordon-sandbox`) do.
#![forbid(unsafe_code)]

pub mod backend;
pub mod dir;
pub mod plan;
pub mod report;
pub mod run;
pub mod spec;

pub use backend::{
    Backend, BackendError, EventSink, Evidence, KillReason, Outcome, Running, StartGate,
};
pub use plan::{AllowRule, HOSTNAME, Identity, LandlockPlan, Mount, MountKind, NetPlan, Plan};
pub use report::{
    EnforcementState, ExitStatus, LedgerPosition, ProviderReport, Report, Teardown, Verdict,
};
pub use run::execute;
pub use spec::{Limits, NetSpec, RunSpec, SpecError};

/// Marks a point of a run on the process-wide timeline printed to standard error, `TIMELINE
/// <ms since the first mark> <label>`: a diagnostic for where a whole `cordon run` spends its
/// time, compiled in only with the `timeline` feature (`scripts/bench-run --timeline`), a no-op
/// otherwise.
#[inline(always)]
pub fn mark(label: &str) {
    #[cfg(feature = "timeline")]
    {
        static T0: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let t0 = *T0.get_or_init(std::time::Instant::now);
        // One write per point: init and the launcher print to the same stream at once.
        let line = format!(
            "TIMELINE {:8.3} {label}\n",
            t0.elapsed().as_secs_f64() * 1e3
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }
    #[cfg(not(feature = "timeline"))]
    let _ = label;
}
