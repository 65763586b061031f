//! cordon's run layer: the run specification and its validation, the launch plan a backend
//! receives, the backend interface, the run report, and [`execute`], which drives one run from
//! plan to verdict. It applies nothing itself; backends (`cordon-sandbox`) do.
#![forbid(unsafe_code)]

pub mod backend;
pub mod plan;
pub mod report;
pub mod run;
pub mod spec;

pub use backend::{
    Backend, BackendError, EventSink, Evidence, KillReason, Outcome, Running, StartGate,
};
pub use plan::{AllowRule, Identity, LandlockPlan, Mount, MountKind, NetPlan, Plan};
pub use report::{
    EnforcementState, ExitStatus, LedgerPosition, ProviderReport, Report, Teardown, Verdict,
};
pub use run::execute;
pub use spec::{Limits, NetSpec, RunSpec, SpecError};
