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

/// A process of the run as it was when frozen, as the kernel reports it through a pidfd. What it
/// was started with is in the run's `host.exec` events (the kernel's record of each exec):
/// `/proc/<pid>/cmdline` is memory the process can rewrite, so it is not evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// Host pid.
    pub pid: i32,
    /// Host parent pid.
    pub ppid: i32,
    /// Real uid, on the host.
    pub uid: u32,
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

    // The tree is recorded while everything is frozen: each process's parent, uid and cgroup,
    // from the kernel through a pidfd (which names the process, whatever becomes of its pid
    // number). Reading /proc instead cost ~19 us a process here.
    let processes = match cgroup.tree() {
        Ok((pids, cgroup_ids)) => {
            let leaf = cgroup
                .v2
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let (processes, strays) = record(&pids, &cgroup_ids, &leaf);
            let mut detail = format!(
                "{} processes recorded while frozen (pid, parent, uid through pidfds)",
                processes.len()
            );
            if strays > 0 {
                detail.push_str(&format!(
                    "; {strays} listed pids were gone or no longer the run's when opened"
                ));
            }
            step("record", Enforced, detail);
            processes
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

/// Opens a pidfd for each listed pid and asks the kernel, through it, for the process's parent,
/// uid and cgroup (`PIDFD_GET_INFO`, Linux 6.13): a listed pid reused by another process since
/// it was listed shows another cgroup and is left out, as is one already gone. On an older
/// kernel the same facts come from `/proc` (kept only if the pidfd shows the process still there
/// after the read). Returns the processes and how many were left out.
fn record(pids: &[i32], cgroup_ids: &[u64], leaf: &str) -> (Vec<Process>, usize) {
    let mut processes = Vec::with_capacity(pids.len());
    let mut strays = 0;
    for &pid in pids {
        let fd = rustix::process::Pid::from_raw(pid).and_then(|p| {
            rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
        });
        let Some(fd) = fd else {
            strays += 1;
            continue;
        };
        let info = match crate::sys::pidfd_info(&fd) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => {
                from_proc(pid, leaf, cgroup_ids[0]).filter(|_| !exited(&fd))
            }
            Err(_) => None,
            Ok(info) => Some(info),
        };
        match info {
            Some(info) if cgroup_ids.contains(&info.cgroup_id) && info.pid == pid => {
                processes.push(Process {
                    pid,
                    ppid: info.ppid,
                    uid: info.uid,
                });
            }
            _ => strays += 1,
        }
    }
    (processes, strays)
}

/// `PIDFD_GET_INFO`'s facts read from `/proc/<pid>/{stat,status,cgroup}` instead (kernels before
/// 6.13). The process is the run's when `/proc/<pid>/cgroup` names the run's cgroup (`leaf`) or
/// one below it.
fn from_proc(pid: i32, leaf: &str, run_id: u64) -> Option<crate::sys::PidfdInfo> {
    let stat = crate::sys::read_text(format!("/proc/{pid}/stat")).ok()?;
    let ppid = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())?;
    let status = crate::sys::read_text(format!("/proc/{pid}/status")).ok()?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let cgroup = crate::sys::read_text(format!("/proc/{pid}/cgroup")).ok()?;
    let v2 = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?.trim();
    let run = format!("/cordon/{leaf}");
    let member = v2.ends_with(&run) || v2.contains(&format!("{run}/"));
    Some(crate::sys::PidfdInfo {
        pid,
        ppid,
        // Named by path, not id: the run's own id stands for it and its descendants.
        cgroup_id: if member { run_id } else { 0 },
        uid,
    })
}

/// Whether the process behind `fd` has exited (its pidfd is readable).
fn exited(fd: &std::os::fd::OwnedFd) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll(&mut fds, Some(&zero)).map_or(true, |n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `/proc` reading for kernels without `PIDFD_GET_INFO`, on this test's own process: its
    /// parent and uid as the kernel says, and membership only of the cgroup it is in.
    #[test]
    fn proc_facts_match_the_process() {
        let me = i32::try_from(std::process::id()).unwrap();
        let own = crate::sys::read_text("/proc/self/cgroup").unwrap();
        let path = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
        // Our own cgroup plays the run's: "/cordon/<leaf>" must be its tail.
        let (parent, leaf) = path.trim().rsplit_once('/').unwrap();
        let info = from_proc(me, leaf, 7).unwrap();
        assert_eq!(
            info.ppid,
            i32::try_from(std::os::unix::process::parent_id()).unwrap()
        );
        assert_eq!(info.uid, rustix::process::getuid().as_raw());
        let member = parent.ends_with("/cordon");
        assert_eq!(info.cgroup_id, if member { 7 } else { 0 });
        assert_eq!(from_proc(me, "no-such-run", 7).unwrap().cgroup_id, 0);
    }

    /// The same, for a process in a run's cgroup: a member, with its parent; and the pidfd path
    /// agrees with it.
    #[test]
    fn proc_facts_name_a_run_member() {
        if !crate::privileged("proc_facts_name_a_run_member") {
            return;
        }
        let layout = crate::cgroup::Layout::detect().unwrap();
        let name = format!("unit-{}", std::process::id());
        let cg = RunCgroup::create(&layout, &name, crate::cgroup::CgroupLimits::default()).unwrap();
        let procs = cg.v2.join("cgroup.procs");
        let mut child = std::process::Command::new("/bin/sh")
            .args([
                "-c",
                &format!("echo $$ > {} && exec sleep 30", procs.display()),
            ])
            .spawn()
            .unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        while !cg.procs().unwrap().contains(&pid) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let me = i32::try_from(std::process::id()).unwrap();
        let info = from_proc(pid, &name, cg.id).unwrap();
        assert_eq!((info.pid, info.ppid, info.cgroup_id), (pid, me, cg.id));
        let (recorded, strays) = record(&[pid], &[cg.id], &name);
        assert_eq!(strays, 0);
        assert_eq!(
            recorded,
            [Process {
                pid,
                ppid: me,
                uid: 0
            }]
        );
        // Negative control: outside the run's cgroups, the same process is left out.
        let (recorded, strays) = record(&[pid], &[cg.id + 1], &name);
        assert_eq!((recorded.len(), strays), (0, 1));
        child.kill().unwrap();
        child.wait().unwrap();
        let mut steps = Vec::new();
        cg.teardown(&mut steps);
    }
}
