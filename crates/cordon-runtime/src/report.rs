//! The run report (its shape is fixed by the contract) and the enforcement states every
//! mechanism reports.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The outcome of a run as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    /// The command ran inside the boundary to its own end.
    Allowed,
    /// The run was killed: a limit, the timeout, a breach or containment.
    Killed,
    /// cordon refused or failed the run (nothing ran, or the boundary could not be shown intact).
    Failed,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Allowed => "ALLOWED",
            Verdict::Killed => "KILLED",
            Verdict::Failed => "FAILED",
        })
    }
}

/// The state of one enforcement mechanism. `Enforced` is only said after an independent check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EnforcementState {
    /// Applied and independently verified.
    Enforced,
    /// Applied, but the independent check failed.
    VerificationFailed,
    /// Applied only in part, or a weaker substitute is in force.
    Degraded,
    /// Not in force (not asked for, or not available).
    NotConfigured,
}

impl fmt::Display for EnforcementState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EnforcementState::Enforced => "ENFORCED",
            EnforcementState::VerificationFailed => "VERIFICATION_FAILED",
            EnforcementState::Degraded => "DEGRADED",
            EnforcementState::NotConfigured => "NOT_CONFIGURED",
        })
    }
}

/// What one mechanism reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderReport {
    /// `namespaces`, `mounts`, `landlock`, `seccomp`, `capabilities`, `cgroup`, `limits`…
    pub provider: String,
    /// Its state.
    pub state: EnforcementState,
    /// The evidence, or what is missing.
    pub detail: String,
}

impl ProviderReport {
    /// Builds a report.
    pub fn new(
        provider: impl Into<String>,
        state: EnforcementState,
        detail: impl Into<String>,
    ) -> Self {
        ProviderReport {
            provider: provider.into(),
            state,
            detail: detail.into(),
        }
    }
}

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ExitStatus {
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that killed it, when one did.
    pub signal: Option<i32>,
}

impl ExitStatus {
    /// The shell convention: the code, or 128 + the signal.
    pub fn shell_code(&self) -> u8 {
        match (self.code, self.signal) {
            (Some(c), _) => c.to_le_bytes()[0],
            (None, Some(s)) => 128 | (s & 0x7f).to_le_bytes()[0],
            (None, None) => 125,
        }
    }
}

/// Where in the ledger the run's final entry landed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerPosition {
    /// The ledger file.
    pub path: String,
    /// The sequence number of the run's last entry.
    pub seq: u64,
    /// Hex SHA-256 hash of that entry.
    pub head: String,
}

/// What teardown did and saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Teardown {
    /// Every process of the run was killed and the kernel confirmed none remained.
    pub verified_empty: bool,
    /// The steps taken and what each showed (`cgroup.kill written`, `populated 0 after 0.4 ms`…).
    pub steps: Vec<String>,
}

/// The run report (`--report`), as fixed by the contract, plus context.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The run's identifier.
    pub run_id: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Why: the limit hit, the refusal, the failure.
    pub reasons: Vec<String>,
    /// How the command ended (both `null` when it never started).
    pub exit: ExitStatus,
    /// What each mechanism reported.
    pub enforcement: Vec<ProviderReport>,
    /// The run's last ledger entry; `null` only when the ledger itself could not be written.
    pub ledger: Option<LedgerPosition>,
    /// Hex SHA-256 of the plan.
    pub spec_hash: String,
    /// The backend that ran it.
    pub backend: String,
    /// Teardown evidence.
    pub teardown: Teardown,
    /// Wall-clock duration of the run in milliseconds.
    pub duration_ms: u64,
    /// Where the time of setting up the boundary went: `(stage, microseconds)`, in order.
    #[serde(default)]
    pub timings_us: Vec<(String, u64)>,
}

impl Report {
    /// The process exit status the contract prescribes for this report.
    pub fn exit_code(&self) -> u8 {
        match self.verdict {
            Verdict::Allowed => self.exit.shell_code(),
            Verdict::Killed => 137,
            Verdict::Failed => match self.exit.code {
                Some(126) if self.exit.signal.is_none() => 126,
                Some(127) if self.exit.signal.is_none() => 127,
                _ => 125,
            },
        }
    }
}
