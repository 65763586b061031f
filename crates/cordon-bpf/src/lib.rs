//! cordon's eBPF pieces, kernel side of egress control and host-observed events.
//!
//! - [`Egress`]: a run's cgroup gets `cgroup/connect4`, `connect6`, `sendmsg4`, `sendmsg6`
//!   (refuse destinations outside an LPM-trie allowlist with `EPERM`) and `cgroup_skb/egress`
//!   (drops every other packet) plus `cgroup_skb/ingress` (block-all), pinned in bpffs so the
//!   boundary outlives cordon. [`Egress::block_all`] cuts everything with one map write;
//!   [`Egress::verify`] asks the kernel which programs are in force and probes actively.
//! - [`Observer`]: exec events (`sched_process_exec`) of the run's processes, filtered by
//!   cgroup id in the kernel, and the egress hooks' connect events, through one ring buffer.
//!
//! The programs are loaded once per boot and shared by every run ([`shared`]): a run creates
//! only its own maps, map entries and links, so attaching costs no BTF parse and no verifier
//! run after the first run of a boot.
//!
//! The programs are C (`bpf/*.bpf.c` at the repository root), compiled by `scripts/build-bpf`
//! into the committed objects embedded here, so building cordon needs no clang. Everything
//! here needs root on a kernel with cgroup v2, `CONFIG_CGROUP_BPF` and BTF.

pub mod allowlist;
pub mod bpffs;
pub mod egress;
pub mod observer;
pub mod probe;
pub mod shared;
pub mod sys;
pub mod tags;
pub mod wire;

pub use allowlist::{Allow, AllowlistError, Tries};
pub use bpffs::{Mounted, StaleRun, cleanup_stale};
pub use egress::{Egress, EgressError, EgressStats, ProbeStarted, block_pinned, pinned_blocked};
pub use observer::{Observer, ObserverError};
pub use shared::SharedError;
pub use wire::{ConnectEvent, Event, ExecEvent, Hook};

/// The compiled `bpf/egress.bpf.c` (committed; `scripts/check-bpf` keeps it in step).
pub static EGRESS_OBJECT: &[u8] = aya::include_bytes_aligned!("../../../bpf/obj/egress.bpf.o");

/// The compiled `bpf/observe.bpf.c`.
pub static OBSERVE_OBJECT: &[u8] = aya::include_bytes_aligned!("../../../bpf/obj/observe.bpf.o");

/// The outcome of a verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyState {
    /// Every check passed.
    Enforced,
    /// A check failed: `problems` says which.
    VerificationFailed,
}

impl std::fmt::Display for VerifyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VerifyState::Enforced => "ENFORCED",
            VerifyState::VerificationFailed => "VERIFICATION_FAILED",
        })
    }
}

/// What a provider's verification found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// Enforced only if `problems` is empty.
    pub state: VerifyState,
    /// The evidence (what was found in force), then the problems, in one line.
    pub detail: String,
    /// Each failed check, naming the program or map.
    pub problems: Vec<String>,
    /// The pids of probe processes run for this verification (their own events are real
    /// events of the run's cgroup and appear in the observer's stream).
    pub probe_pids: Vec<u32>,
}

impl Verification {
    pub(crate) fn from_problems(problems: Vec<String>, evidence: String, pid: Option<u32>) -> Self {
        let state = if problems.is_empty() {
            VerifyState::Enforced
        } else {
            VerifyState::VerificationFailed
        };
        let detail = if problems.is_empty() {
            evidence
        } else if evidence.is_empty() {
            problems.join("; ")
        } else {
            format!("{}; {evidence}", problems.join("; "))
        };
        Verification {
            state,
            detail,
            problems,
            probe_pids: pid.into_iter().collect(),
        }
    }

    /// Both verifications: enforced only if both are.
    pub fn and(self, other: Verification) -> Verification {
        let mut problems = self.problems;
        problems.extend(other.problems);
        let state = if problems.is_empty() {
            VerifyState::Enforced
        } else {
            VerifyState::VerificationFailed
        };
        let mut probe_pids = self.probe_pids;
        probe_pids.extend(other.probe_pids);
        Verification {
            state,
            detail: [self.detail, other.detail]
                .into_iter()
                .filter(|d| !d.is_empty())
                .collect::<Vec<_>>()
                .join("; "),
            problems,
            probe_pids,
        }
    }
}

// The handles can move to a supervisor thread (a compile-time check).
const _: () = {
    const fn send<T: Send>() {}
    send::<Egress>();
    send::<Observer>();
    send::<ProbeStarted>();
};
