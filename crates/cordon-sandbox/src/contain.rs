//! Containment on demand: stop a run now, and show that it stopped.
//!
//! Order: block egress (so nothing more leaves) → freeze (so nothing more happens, and the process
//! tree holds still) → record the process tree → kill → verify that the cgroup is empty. Each step
//! reports its own state; a step that cannot be shown to have worked is `VERIFICATION_FAILED`,
//! and the following steps still run (containment never stops half-way). A contained run stays
//! dead: there is no recovery.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use cordon_runtime::EnforcementState;

use crate::cgroup::{CgroupError, RunCgroup};

/// How long each step may wait for the kernel's confirmation.
const STEP_LIMIT: Duration = Duration::from_secs(2);

/// One step of a containment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// `egress-block`, `freeze`, `record`, `kill`, `verify`.
    pub action: String,
    /// What the step's own check showed.
    pub state: EnforcementState,
    /// The evidence.
    pub detail: String,
    /// Microseconds from the start of the containment to the end of this step.
    pub at_us: u64,
}

/// A process of the run as it was when frozen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// Host pid.
    pub pid: i32,
    /// Host parent pid.
    pub ppid: i32,
    /// The command line (NUL-separated arguments joined by spaces), at most 256 bytes.
    pub cmdline: String,
}

/// The outcome of [`contain`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Containment {
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// The process tree recorded while frozen.
    pub processes: Vec<Process>,
    /// The kernel showed the run's cgroup empty afterwards.
    pub verified_dead: bool,
    /// Microseconds from the call to verified-dead (or to giving up).
    pub total_us: u64,
}

impl Containment {
    /// Whether every step was shown to work (egress may be `NOT_CONFIGURED`: the run had none).
    pub fn complete(&self) -> bool {
        self.verified_dead
            && self.steps.iter().all(|s| {
                matches!(
                    s.state,
                    EnforcementState::Enforced | EnforcementState::NotConfigured
                )
            })
    }
}

/// A way to block the run's egress and confirm it is blocked; `Ok` carries the evidence.
pub type EgressBlock<'a> = &'a mut dyn FnMut() -> Result<String, String>;

/// Contains the run in `cgroup`: block egress (when the run has an egress provider), freeze,
/// record, kill, verify.
pub fn contain(cgroup: &RunCgroup, egress: Option<EgressBlock<'_>>) -> Containment {
    let start = Instant::now();
    let at = || u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
    let mut steps = Vec::new();
    let mut step = |action: &str, state: EnforcementState, detail: String| {
        steps.push(Step {
            action: action.to_owned(),
            state,
            detail,
            at_us: at(),
        });
    };
    use EnforcementState::*;

    match egress {
        Some(block) => match block() {
            Ok(evidence) => step("egress-block", Enforced, evidence),
            Err(e) => step("egress-block", VerificationFailed, e),
        },
        None => step(
            "egress-block",
            NotConfigured,
            "the run has no egress provider (no network, or the host's)".into(),
        ),
    }

    match cgroup.freeze(STEP_LIMIT) {
        Ok(Some(t)) => step(
            "freeze",
            Enforced,
            format!("cgroup.events: frozen 1 after {:.3} ms", ms(t)),
        ),
        Ok(None) => step(
            "freeze",
            VerificationFailed,
            "cgroup.events did not show frozen 1 within 2 s".into(),
        ),
        Err(e) => step("freeze", VerificationFailed, e.to_string()),
    }

    let processes = match cgroup.procs_recursive() {
        Ok(pids) => {
            let procs = describe_all(&pids);
            step(
                "record",
                Enforced,
                format!("{} processes recorded while frozen", procs.len()),
            );
            procs
        }
        Err(e) => {
            step("record", VerificationFailed, e.to_string());
            Vec::new()
        }
    };

    match cgroup.kill() {
        Ok(()) => step("kill", Enforced, "cgroup.kill written".into()),
        Err(e) => step("kill", VerificationFailed, e.to_string()),
    }

    let mut verified_dead = false;
    // A directory under the run's name that is no longer the run's cgroup means the run's was
    // removed, which the kernel allows only once it is empty.
    let waited = match cgroup.check_identity() {
        Err(CgroupError::Replaced { .. }) => Err(CgroupError::Read {
            path: cgroup.v2.clone(),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        }),
        _ => cgroup.wait_empty(STEP_LIMIT),
    };
    match waited {
        // The run's own supervisor saw its init die and removed the cgroup: the kernel removes
        // a cgroup only when no process is left in it, and nothing of the run can leave it.
        Err(CgroupError::Read { source, .. })
            if matches!(source.raw_os_error(), Some(libc::ENODEV | libc::ENOENT)) =>
        {
            verified_dead = true;
            step(
                "verify",
                Enforced,
                "the run's cgroup was removed after the kill (the kernel removes only empty cgroups)"
                    .into(),
            );
        }
        Ok(Some(t)) => {
            verified_dead = true;
            step(
                "verify",
                Enforced,
                format!("cgroup.events: populated 0 after {:.3} ms", ms(t)),
            );
        }
        other => {
            // Fallback: SIGKILL every listed process, then look again; reported as such.
            let pids = cgroup.procs_recursive().unwrap_or_default();
            for pid in &pids {
                // SAFETY: kill(2) with a pid read from the run's cgroup and SIGKILL; no memory.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            let first = match other {
                Err(e) => e.to_string(),
                _ => "still populated after 2 s".to_owned(),
            };
            match cgroup.wait_empty(STEP_LIMIT) {
                Ok(Some(t)) => {
                    verified_dead = true;
                    step(
                        "verify",
                        Degraded,
                        format!(
                            "cgroup.kill did not empty the cgroup ({first}); SIGKILL to {} pids, then populated 0 after {:.3} ms",
                            pids.len(),
                            ms(t)
                        ),
                    );
                }
                _ => step(
                    "verify",
                    VerificationFailed,
                    format!(
                        "{first}; SIGKILL to {} pids did not empty it either",
                        pids.len()
                    ),
                ),
            }
        }
    }

    Containment {
        steps,
        processes,
        verified_dead,
        total_us: at(),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Describes every process, in order, on up to as many threads as the machine has cores (the
/// processes are frozen: nothing changes while they are read).
fn describe_all(pids: &[i32]) -> Vec<Process> {
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(pids.len() / 16)
        .max(1);
    if threads == 1 {
        let mut buf = [0u8; 1024];
        return pids.iter().map(|&p| describe(p, &mut buf)).collect();
    }
    let chunk = pids.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let parts: Vec<_> = pids
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let mut buf = [0u8; 1024];
                    part.iter()
                        .map(|&p| describe(p, &mut buf))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

/// Reads a process's parent and command line from `/proc` (best effort: it may already be
/// gone): one open and one read of each file, into `buf`.
fn describe(pid: i32, buf: &mut [u8; 1024]) -> Process {
    let stat = read_proc(pid, "stat", buf);
    // The command name is in parentheses and may contain spaces: parse after the last ')'.
    let ppid = stat
        .iter()
        .rposition(|&b| b == b')')
        .and_then(|i| std::str::from_utf8(&stat[i + 1..]).ok())
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let raw = read_proc(pid, "cmdline", buf);
    let raw = &raw[..raw.len().min(256)];
    let cmdline = String::from_utf8_lossy(raw)
        .split('\0')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    Process { pid, ppid, cmdline }
}

/// `/proc/<pid>/<name>`, at most `buf.len()` bytes of it (empty when unreadable).
fn read_proc<'b>(pid: i32, name: &str, buf: &'b mut [u8; 1024]) -> &'b [u8] {
    use rustix::fs::{Mode, OFlags};
    let Ok(fd) = rustix::fs::open(
        format!("/proc/{pid}/{name}"),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return &[];
    };
    match rustix::io::read(&fd, &mut buf[..]) {
        Ok(n) => &buf[..n],
        Err(_) => &[],
    }
}
