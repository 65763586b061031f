//! The run's cgroup: membership from birth (`CLONE_INTO_CGROUP`), limits, and a kill whose result
//! is read back from the kernel.
//!
//! Two layouts are supported. On a pure cgroup v2 host everything lives in one v2 cgroup. On the
//! hybrid layout (v2 mounted beside v1 hierarchies that own the `memory` and `pids` controllers)
//! the v2 cgroup provides membership, `cgroup.kill`, `cgroup.freeze` and `cgroup.events`, and a
//! v1 cgroup per controller carries the limits. New cgroups are created below the cgroup cordon
//! itself runs in, never elsewhere.

use std::fs;
use std::io::{self, Read, Seek};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, poll};
use rustix::fs::{Mode, OFlags, open};

/// Errors of cgroup operations, each naming the file involved.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No cgroup v2 hierarchy is mounted: no membership, kill or events.
    #[error("no cgroup v2 hierarchy is mounted (looked in /proc/self/mountinfo)")]
    NoV2,
    /// Reading a file of the cgroup filesystem failed.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Writing a file of the cgroup filesystem failed.
    #[error("writing {value:?} to {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// Why.
        source: io::Error,
    },
    /// Creating a cgroup directory failed.
    #[error("creating cgroup {path}: {source}")]
    Create {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A limit read back differs from what was written.
    #[error("{path} reads back {got:?} after writing {wrote:?}")]
    ReadBack {
        /// The file.
        path: PathBuf,
        /// What was written.
        wrote: String,
        /// What the kernel reports.
        got: String,
    },
    /// The controller a limit needs is not available.
    #[error("the {0} controller is not available (neither in cgroup v2 nor as a v1 hierarchy)")]
    NoController(&'static str),
    /// The cgroup at the path is no longer the one created for the run.
    #[error("{path} was replaced: its cgroup id is {found}, the run's is {expected}")]
    Replaced {
        /// The directory.
        path: PathBuf,
        /// The id recorded at creation.
        expected: u64,
        /// The id found now.
        found: u64,
    },
}

/// Which cgroup layout the host uses, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutKind {
    /// Everything in cgroup v2.
    Unified,
    /// cgroup v2 for membership/kill/events, v1 hierarchies for some controllers.
    Hybrid,
}

/// Where the cgroup hierarchies are and where this process sits in them.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The v2 directory this process belongs to (where run cgroups are created below).
    pub v2_base: PathBuf,
    /// The v1 directory for the `memory` controller this process belongs to, if v1 owns it.
    pub memory_v1: Option<PathBuf>,
    /// The v1 directory for the `pids` controller, if v1 owns it.
    pub pids_v1: Option<PathBuf>,
    /// Controllers available in v2 at the base (`cgroup.controllers`).
    pub v2_controllers: Vec<String>,
}

impl Layout {
    /// Reads the layout from `/proc/self/mountinfo` and `/proc/self/cgroup`.
    pub fn detect() -> Result<Layout, CgroupError> {
        let mountinfo = read("/proc/self/mountinfo")?;
        let membership = read("/proc/self/cgroup")?;
        Self::parse(&mountinfo, &membership)
    }

    fn parse(mountinfo: &str, membership: &str) -> Result<Layout, CgroupError> {
        let mut v2_mount = None;
        let mut v1_mounts: Vec<(PathBuf, Vec<String>)> = Vec::new();
        for line in mountinfo.lines() {
            // Fields: id parent maj:min root mountpoint options [optional...] - fstype source superopts
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            if pre.len() < 5 || post.len() < 3 {
                continue;
            }
            let mountpoint = PathBuf::from(unescape(pre[4]));
            match post[0] {
                "cgroup2" => v2_mount = v2_mount.or(Some(mountpoint)),
                "cgroup" => {
                    let opts = post[2].split(',').map(str::to_owned).collect();
                    v1_mounts.push((mountpoint, opts));
                }
                _ => {}
            }
        }
        let v2_mount = v2_mount.ok_or(CgroupError::NoV2)?;

        let mut v2_rel = None;
        let mut v1_rel: Vec<(Vec<String>, String)> = Vec::new();
        for line in membership.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if ctrls.is_empty() {
                v2_rel = Some(path.to_owned());
            } else {
                v1_rel.push((
                    ctrls.split(',').map(str::to_owned).collect(),
                    path.to_owned(),
                ));
            }
        }
        let v2_base = join(&v2_mount, v2_rel.as_deref().unwrap_or("/"));
        let v1_dir = |ctrl: &str| -> Option<PathBuf> {
            let (mnt, _) = v1_mounts
                .iter()
                .find(|(_, o)| o.iter().any(|x| x == ctrl))?;
            let (_, rel) = v1_rel.iter().find(|(c, _)| c.iter().any(|x| x == ctrl))?;
            Some(join(mnt, rel))
        };
        let v2_controllers = crate::sys::read_text(v2_base.join("cgroup.controllers"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        Ok(Layout {
            memory_v1: v1_dir("memory"),
            pids_v1: v1_dir("pids"),
            v2_base,
            v2_controllers,
        })
    }

    /// Unified or hybrid.
    pub fn kind(&self) -> LayoutKind {
        if self.memory_v1.is_some() || self.pids_v1.is_some() {
            LayoutKind::Hybrid
        } else {
            LayoutKind::Unified
        }
    }

    fn has_v2(&self, controller: &str) -> bool {
        self.v2_controllers.iter().any(|c| c == controller)
    }

    /// Whether a limit on `controller` can be set, and how.
    pub fn controller_home(&self, controller: &'static str) -> Result<&'static str, CgroupError> {
        let v1 = match controller {
            "memory" => self.memory_v1.is_some(),
            "pids" => self.pids_v1.is_some(),
            _ => false,
        };
        if v1 {
            Ok("cgroup v1")
        } else if self.has_v2(controller) {
            Ok("cgroup v2")
        } else {
            Err(CgroupError::NoController(controller))
        }
    }

    /// Whether this process may create cgroups below its own (a write-access check only).
    pub fn writable(&self) -> bool {
        rustix::fs::access(&self.v2_base, rustix::fs::Access::WRITE_OK).is_ok()
    }
}

/// What identifies a run's cgroup across processes: its v2 directory, the kernel's id for it at
/// creation, and the v1 directories that carry its limits.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CgroupHandle {
    /// The v2 directory.
    pub v2: PathBuf,
    /// Its cgroup id (inode number) when the run created it.
    pub id: u64,
    /// `(controller, directory)` of the v1 cgroups.
    pub v1: Vec<(String, PathBuf)>,
}

/// Limits applied to the run's cgroup.
#[derive(Debug, Clone, Copy, Default)]
pub struct CgroupLimits {
    /// Bytes.
    pub memory: Option<u64>,
    /// Processes and threads.
    pub pids: Option<u64>,
}

/// One run's cgroup(s). Dropping it does not remove anything: call [`RunCgroup::teardown`].
#[derive(Debug)]
pub struct RunCgroup {
    /// The v2 directory (membership, kill, freeze, events).
    pub v2: PathBuf,
    /// The kernel's id for the v2 cgroup (its inode number), recorded at creation.
    pub id: u64,
    /// An open descriptor of the v2 directory, for `CLONE_INTO_CGROUP`.
    dir_fd: OwnedFd,
    /// v1 directories carrying limits (hybrid layout), with their controller.
    v1: Vec<(&'static str, PathBuf)>,
    /// Where the memory limit and its events live.
    memory_dir: Option<(PathBuf, bool)>,
    /// Where the pids limit and its events live.
    pids_dir: Option<PathBuf>,
    /// The memory and pids event files, opened at their first read and read again from the
    /// start after that (the kernel makes their text anew at offset 0): the last read, after
    /// init's exit, is on the run's tail.
    memory_events: std::sync::OnceLock<Option<fs::File>>,
    pids_events: std::sync::OnceLock<Option<fs::File>>,
    /// Descriptions of what was set, for the report.
    pub applied: Vec<String>,
}

impl RunCgroup {
    /// Creates `<base>/cordon/<name>` in v2 (and in the v1 hierarchies that carry limits), then
    /// writes and reads back the limits. On error, whatever was created is removed again.
    pub fn create(layout: &Layout, name: &str, limits: CgroupLimits) -> Result<Self, CgroupError> {
        let mut created: Vec<PathBuf> = Vec::new();
        let result = Self::create_inner(layout, name, limits, &mut created);
        if result.is_err() {
            for dir in created.iter().rev() {
                let _ = fs::remove_dir(dir);
            }
        }
        result
    }

    fn create_inner(
        layout: &Layout,
        name: &str,
        limits: CgroupLimits,
        created: &mut Vec<PathBuf>,
    ) -> Result<Self, CgroupError> {
        let v2 = make_dirs(&layout.v2_base, name, created)?;
        let meta = fs::metadata(&v2).map_err(|source| CgroupError::Read {
            path: v2.clone(),
            source,
        })?;
        let dir_fd = open(
            &v2,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| CgroupError::Read {
            path: v2.clone(),
            source: e.into(),
        })?;
        let mut cg = RunCgroup {
            v2: v2.clone(),
            id: meta.ino(),
            dir_fd,
            v1: Vec::new(),
            memory_dir: None,
            pids_dir: None,
            memory_events: std::sync::OnceLock::new(),
            pids_events: std::sync::OnceLock::new(),
            applied: Vec::new(),
        };

        if let Some(bytes) = limits.memory {
            if let Some(base) = &layout.memory_v1 {
                let dir = make_dirs(base, name, created)?;
                write_read_back(&dir.join("memory.limit_in_bytes"), bytes, true)?;
                // Without swap accounting the limit above already covers everything.
                let memsw = dir.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write_read_back(&memsw, bytes, true)?;
                }
                cg.applied
                    .push(format!("memory.limit_in_bytes={bytes} (cgroup v1)"));
                cg.v1.push(("memory", dir.clone()));
                cg.memory_dir = Some((dir, true));
            } else if layout.has_v2("memory") {
                enable_controller(&layout.v2_base, "memory")?;
                write_read_back(&v2.join("memory.max"), bytes, false)?;
                let swap = v2.join("memory.swap.max");
                if swap.exists() {
                    write_read_back(&swap, 0, false)?;
                }
                cg.applied.push(format!("memory.max={bytes} (cgroup v2)"));
                cg.memory_dir = Some((v2.clone(), false));
            } else {
                return Err(CgroupError::NoController("memory"));
            }
        }
        if let Some(n) = limits.pids {
            if let Some(base) = &layout.pids_v1 {
                let dir = make_dirs(base, name, created)?;
                write_read_back(&dir.join("pids.max"), n, false)?;
                cg.applied.push(format!("pids.max={n} (cgroup v1)"));
                cg.v1.push(("pids", dir.clone()));
                cg.pids_dir = Some(dir);
            } else if layout.has_v2("pids") {
                enable_controller(&layout.v2_base, "pids")?;
                write_read_back(&v2.join("pids.max"), n, false)?;
                cg.applied.push(format!("pids.max={n} (cgroup v2)"));
                cg.pids_dir = Some(v2.clone());
            } else {
                return Err(CgroupError::NoController("pids"));
            }
        }
        Ok(cg)
    }

    /// The v2 directory descriptor for `clone3(CLONE_INTO_CGROUP)`.
    pub fn dir_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.dir_fd.as_fd()
    }

    /// Descriptors with which a process joins the v1 cgroups that carry limits (the v2
    /// membership comes with `clone3`): each is a v1 `tasks` file opened for writing, and the
    /// process cloned into the run writes `0` ("the calling thread") to each before anything
    /// else. A thread moving itself is the one migration the kernel makes without taking the
    /// global `cgroup_threadgroup_rwsem` for writing, whose first writer waits for an RCU grace
    /// period (0.04–22 ms measured here, for writing a pid to `cgroup.procs`); for a
    /// single-threaded process, its one thread is the process. The kernel checks the opener's
    /// credentials, cordon's.
    pub fn v1_joins(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        self.v1
            .iter()
            .map(|(_, dir)| {
                let path = dir.join("tasks");
                open(&path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty()).map_err(|e| {
                    CgroupError::Write {
                        path,
                        value: "0 (opening for the child to join)".to_owned(),
                        source: e.into(),
                    }
                })
            })
            .collect()
    }

    /// Whether `text` (a process's `/proc/<pid>/cgroup`) shows it in each v1 cgroup that carries
    /// a limit; `Err` names the controllers it is not in.
    pub fn check_v1_membership(&self, text: &str) -> Result<Vec<&'static str>, String> {
        let mut missing = Vec::new();
        let mut joined = Vec::new();
        for (controller, dir) in &self.v1 {
            let leaf = dir.file_name().map(|n| n.to_string_lossy().into_owned());
            let member = text.lines().any(|line| {
                let mut parts = line.splitn(3, ':');
                let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
                controllers.is_some_and(|c| c.split(',').any(|c| c == *controller))
                    && path
                        .zip(leaf.as_deref())
                        .is_some_and(|(p, leaf)| p.trim_end().ends_with(&format!("/cordon/{leaf}")))
            });
            if member {
                joined.push(*controller);
            } else {
                missing.push(*controller);
            }
        }
        if missing.is_empty() {
            Ok(joined)
        } else {
            Err(format!(
                "not in the run's v1 {} cgroup (/proc/<pid>/cgroup)",
                missing.join(", ")
            ))
        }
    }

    /// Refuses to act on a path whose cgroup is not the one created for this run (deleted and
    /// recreated under the same name).
    pub fn check_identity(&self) -> Result<(), CgroupError> {
        let found = fs::metadata(&self.v2)
            .map_err(|source| CgroupError::Read {
                path: self.v2.clone(),
                source,
            })?
            .ino();
        if found == self.id {
            Ok(())
        } else {
            Err(CgroupError::Replaced {
                path: self.v2.clone(),
                expected: self.id,
                found,
            })
        }
    }

    /// Kills every process in the cgroup (`cgroup.kill`).
    pub fn kill(&self) -> Result<(), CgroupError> {
        self.check_identity()?;
        write_file(&self.v2.join("cgroup.kill"), "1")
    }

    /// Whether `cgroup.events` says `populated 1`.
    pub fn populated(&self) -> Result<bool, CgroupError> {
        let events = read(self.v2.join("cgroup.events"))?;
        Ok(key_value(&events, "populated") != Some(0))
    }

    /// Waits until `cgroup.events` shows `populated 0`, waking on the kernel's notification
    /// (`POLLPRI`), for at most `limit`. Returns how long it took, or `None` on timeout.
    pub fn wait_empty(&self, limit: Duration) -> Result<Option<Duration>, CgroupError> {
        self.wait_event("populated", 0, limit)
    }

    /// Waits until `cgroup.events` shows `key value`, woken by the kernel's notification
    /// (`POLLPRI` on the file), for at most `limit`. Returns how long it took, `None` on timeout.
    pub fn wait_event(
        &self,
        key: &str,
        value: u64,
        limit: Duration,
    ) -> Result<Option<Duration>, CgroupError> {
        let path = self.v2.join("cgroup.events");
        let start = Instant::now();
        let mut file = fs::File::open(&path).map_err(|source| CgroupError::Read {
            path: path.clone(),
            source,
        })?;
        let mut buf = String::new();
        let mut backoff = Duration::from_micros(25);
        loop {
            buf.clear();
            file.rewind()
                .and_then(|_| file.read_to_string(&mut buf))
                .map_err(|source| CgroupError::Read {
                    path: path.clone(),
                    source,
                })?;
            if key_value(&buf, key) == Some(value) {
                return Ok(Some(start.elapsed()));
            }
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(None);
            }
            // The kernel rate-limits `cgroup.events` notifications to one per 10 ms (a freeze
            // just before a kill delays the `populated 0` one), and does not notify the removal
            // of the cgroup at all (its supervisor may remove it as soon as it empties). So the
            // file is also read again on a short period: every 25 µs for the first 2 ms (a
            // freeze or the kill of a small tree is over by then), then growing to 10 ms.
            let slice = left.min(backoff);
            if start.elapsed() > Duration::from_millis(2) {
                backoff = (backoff * 2).min(Duration::from_millis(10));
            }
            let mut fds = [PollFd::new(&file, PollFlags::PRI | PollFlags::ERR)];
            let ts = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: i64::from(slice.subsec_nanos()),
            };
            match poll(&mut fds, Some(&ts)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(CgroupError::Read {
                        path,
                        source: e.into(),
                    });
                }
            }
        }
    }

    /// Freezes every process of the run (`cgroup.freeze`) and waits for the kernel to report
    /// `frozen 1`. Returns how long that took, or `None` when it was not seen within `limit`.
    pub fn freeze(&self, limit: Duration) -> Result<Option<Duration>, CgroupError> {
        self.check_identity()?;
        write_file(&self.v2.join("cgroup.freeze"), "1")?;
        self.wait_event("frozen", 1, limit)
    }

    /// Thaws the run and waits for `frozen 0`.
    pub fn thaw(&self, limit: Duration) -> Result<Option<Duration>, CgroupError> {
        self.check_identity()?;
        write_file(&self.v2.join("cgroup.freeze"), "0")?;
        self.wait_event("frozen", 0, limit)
    }

    /// Whether the freeze cordon asked for is in force: `cgroup.freeze` still says 1 and
    /// `cgroup.events` says `frozen 1` (every process of the run, including any added since,
    /// is frozen).
    pub fn frozen(&self) -> Result<bool, CgroupError> {
        self.check_identity()?;
        let asked = read(self.v2.join("cgroup.freeze"))?.trim() == "1";
        let events = read(self.v2.join("cgroup.events"))?;
        Ok(asked && key_value(&events, "frozen") == Some(1))
    }

    /// Every process in the run's cgroup and its descendants, and the ids of those cgroups.
    pub fn tree(&self) -> Result<(Vec<i32>, Vec<u64>), CgroupError> {
        let mut pids = Vec::new();
        let mut ids = vec![self.id];
        let mut dirs = vec![self.v2.clone()];
        while let Some(dir) = dirs.pop() {
            pids.extend(
                read(dir.join("cgroup.procs"))?
                    .lines()
                    .filter_map(|l| l.trim().parse::<i32>().ok()),
            );
            if let Ok(entries) = fs::read_dir(&dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        if let Ok(m) = e.metadata() {
                            ids.push(m.ino());
                        }
                        dirs.push(e.path());
                    }
                }
            }
        }
        pids.sort_unstable();
        Ok((pids, ids))
    }

    /// Every process in the run's cgroup and its descendants.
    pub fn procs_recursive(&self) -> Result<Vec<i32>, CgroupError> {
        self.tree().map(|(pids, _)| pids)
    }

    /// What identifies this cgroup for another process (`cordon contain`).
    pub fn handle(&self) -> CgroupHandle {
        CgroupHandle {
            v2: self.v2.clone(),
            id: self.id,
            v1: self
                .v1
                .iter()
                .map(|(c, d)| ((*c).to_owned(), d.clone()))
                .collect(),
        }
    }

    /// Re-opens a run's cgroup from its handle, refusing when the directory's cgroup id is not
    /// the recorded one (deleted and recreated under the same name).
    pub fn open(handle: &CgroupHandle) -> Result<RunCgroup, CgroupError> {
        let dir_fd = open(
            &handle.v2,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| CgroupError::Read {
            path: handle.v2.clone(),
            source: e.into(),
        })?;
        let v1 = handle
            .v1
            .iter()
            .filter_map(|(c, d)| {
                let c: &'static str = match c.as_str() {
                    "memory" => "memory",
                    "pids" => "pids",
                    _ => return None,
                };
                Some((c, d.clone()))
            })
            .collect::<Vec<_>>();
        let memory_dir = v1
            .iter()
            .find(|(c, _)| *c == "memory")
            .map(|(_, d)| (d.clone(), true));
        let pids_dir = v1
            .iter()
            .find(|(c, _)| *c == "pids")
            .map(|(_, d)| d.clone());
        let cg = RunCgroup {
            v2: handle.v2.clone(),
            id: handle.id,
            dir_fd,
            v1,
            memory_dir,
            pids_dir,
            memory_events: std::sync::OnceLock::new(),
            pids_events: std::sync::OnceLock::new(),
            applied: Vec::new(),
        };
        cg.check_identity()?;
        Ok(cg)
    }

    /// The pids currently in the v2 cgroup.
    pub fn procs(&self) -> Result<Vec<i32>, CgroupError> {
        Ok(read(self.v2.join("cgroup.procs"))?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// How many times the kernel's OOM killer acted in the run's memory cgroup.
    pub fn oom_kills(&self) -> Result<u64, CgroupError> {
        let Some((dir, v1)) = &self.memory_dir else {
            return Ok(0);
        };
        let file = if *v1 {
            "memory.oom_control"
        } else {
            "memory.events"
        };
        events_value(&self.memory_events, &dir.join(file), "oom_kill")
    }

    /// How many times a fork was refused by the pids limit.
    pub fn pids_max_hits(&self) -> Result<u64, CgroupError> {
        let Some(dir) = &self.pids_dir else {
            return Ok(0);
        };
        events_value(&self.pids_events, &dir.join("pids.events"), "max")
    }

    /// Kills what is left, verifies `populated 0` (falling back to SIGKILL of each listed pid if
    /// `cgroup.kill` does not empty it in time), and removes the directories. Each step and what
    /// it showed goes into `steps`; returns whether emptiness was observed.
    pub fn teardown(self, steps: &mut Vec<String>) -> bool {
        let verified = self.kill_and_verify(steps);
        self.remove(steps);
        verified
    }

    /// Kills what is left and verifies `populated 0`, falling back to SIGKILL of each listed pid
    /// if `cgroup.kill` does not empty it in time. Each step and what it showed goes into
    /// `steps`; returns whether emptiness was observed.
    pub fn kill_and_verify(&self, steps: &mut Vec<String>) -> bool {
        let mut verified = false;
        match self.kill() {
            Ok(()) => steps.push("cgroup.kill written".into()),
            Err(e) => steps.push(format!("cgroup.kill failed: {e}")),
        }
        match self.wait_empty(Duration::from_secs(2)) {
            Ok(Some(t)) => {
                steps.push(format!(
                    "cgroup.events: populated 0 after {:.3} ms",
                    t.as_secs_f64() * 1e3
                ));
                verified = true;
            }
            Ok(None) => steps.push("cgroup.events: still populated after 2 s".into()),
            Err(e) => steps.push(format!("cgroup.events unreadable: {e}")),
        }
        if !verified {
            // Fallback: kill each listed process, then look again. Reported as such.
            let pids = self.procs().unwrap_or_default();
            for pid in &pids {
                // SAFETY: kill(2) with a pid read from cgroup.procs and SIGKILL touches no memory.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            steps.push(format!(
                "fallback: SIGKILL sent to {} listed pids",
                pids.len()
            ));
            match self.wait_empty(Duration::from_secs(2)) {
                Ok(Some(t)) => {
                    steps.push(format!(
                        "cgroup.events: populated 0 after fallback, {:.3} ms",
                        t.as_secs_f64() * 1e3
                    ));
                    verified = true;
                }
                Ok(None) => steps.push("cgroup.events: still populated after fallback".into()),
                Err(e) => steps.push(format!("cgroup.events unreadable: {e}")),
            }
        }
        verified
    }

    /// Removes the run's directories (v1 ones first). A cgroup that still holds a process cannot
    /// be removed: call this after [`RunCgroup::kill_and_verify`].
    pub fn remove(self, steps: &mut Vec<String>) {
        let mut dirs: Vec<PathBuf> = self.v1.iter().map(|(_, d)| d.clone()).collect();
        dirs.push(self.v2.clone());
        for dir in dirs {
            match remove_dir_retry(&dir) {
                Ok(()) => steps.push(format!("removed {}", dir.display())),
                Err(e) => steps.push(format!("could not remove {}: {e}", dir.display())),
            }
        }
    }
}

/// Removes run cgroups left behind by a cordon that died before its teardown: directories under
/// `<base>/cordon/` (in v2 and in the v1 hierarchies) that hold no process, are older than
/// `min_age` (so a run being set up right now is never touched) and whose name `keep` does not
/// claim (a run still registered: its cgroup is empty for a moment between its init's exit and
/// its teardown). Returns how many were removed.
pub fn remove_stale(layout: &Layout, min_age: Duration, keep: &dyn Fn(&str) -> bool) -> usize {
    let mut bases = vec![layout.v2_base.clone()];
    bases.extend(layout.memory_v1.iter().cloned());
    bases.extend(layout.pids_v1.iter().cloned());
    let mut removed = 0;
    for base in bases {
        let Ok(entries) = fs::read_dir(base.join("cordon")) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let dir = e.path();
            if keep(&e.file_name().to_string_lossy()) {
                continue;
            }
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= min_age);
            let empty = read(dir.join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty());
            if old && empty && fs::remove_dir(&dir).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// Creates `<base>/cordon` (if needed) and `<base>/cordon/<name>`; records the new leaf. The
/// leaf is tried first: `<base>/cordon` exists after the first run.
fn make_dirs(base: &Path, name: &str, created: &mut Vec<PathBuf>) -> Result<PathBuf, CgroupError> {
    let parent = base.join("cordon");
    let dir = parent.join(name);
    match fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match fs::create_dir(&parent) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(source) => {
                    return Err(CgroupError::Create {
                        path: parent,
                        source,
                    });
                }
            }
            fs::create_dir(&dir).map_err(|source| CgroupError::Create {
                path: dir.clone(),
                source,
            })?;
        }
        Err(source) => {
            return Err(CgroupError::Create {
                path: dir.clone(),
                source,
            });
        }
    }
    created.push(dir.clone());
    Ok(dir)
}

/// Enables a controller for the children of `base/cordon` (pure v2). The `cordon` directory holds
/// no processes, so the "no internal processes" rule is satisfied there; `base` itself must
/// already delegate the controller.
fn enable_controller(base: &Path, controller: &str) -> Result<(), CgroupError> {
    let want = format!("+{controller}");
    let base_ctl = base.join("cgroup.subtree_control");
    let current = read(&base_ctl)?;
    if !current.split_whitespace().any(|c| c == controller) {
        // EBUSY here means the base cgroup holds processes (a login session's scope): cgroup v2
        // forbids enabling controllers there. Run cordon in a delegated subtree instead, e.g.
        // `systemd-run --scope -p Delegate=yes cordon run ...`.
        write_file(&base_ctl, &want)?;
    }
    write_file(&base.join("cordon").join("cgroup.subtree_control"), &want)
}

/// Writes a numeric limit and checks the kernel kept it. v1 memory limits are rounded down to a
/// page, which `page_rounded` allows for.
fn write_read_back(path: &Path, value: u64, page_rounded: bool) -> Result<(), CgroupError> {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let wrote = value.to_string();
    let werr = |source| CgroupError::Write {
        path: path.to_path_buf(),
        value: wrote.clone(),
        source,
    };
    // One descriptor for both: the kernel's answer is read back from offset 0 of the file the
    // value was written to (a new open each way cost two more system calls per limit).
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(werr)?;
    f.write_all(wrote.as_bytes()).map_err(werr)?;
    let mut buf = [0u8; 64];
    let n = f.read_at(&mut buf, 0).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let got = String::from_utf8_lossy(&buf[..n]).trim().to_owned();
    let expected = if page_rounded {
        let page = rustix::param::page_size() as u64;
        value / page * page
    } else {
        value
    };
    if got == expected.to_string() {
        Ok(())
    } else {
        Err(CgroupError::ReadBack {
            path: path.to_path_buf(),
            wrote: value.to_string(),
            got,
        })
    }
}

fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_owned(),
        source,
    })
}

fn read(path: impl AsRef<Path>) -> Result<String, CgroupError> {
    let path = path.as_ref();
    crate::sys::read_text(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The value of `key` (0 if absent) in the events file at `path`, read through `file`, opened at
/// the first call; if it cannot be opened, each call reads the path afresh (and reports why not).
fn events_value(
    file: &std::sync::OnceLock<Option<fs::File>>,
    path: &Path,
    key: &str,
) -> Result<u64, CgroupError> {
    use std::os::unix::fs::FileExt;
    let text = match file.get_or_init(|| fs::File::open(path).ok()) {
        Some(f) => {
            let mut buf = [0u8; 1024];
            let n = f.read_at(&mut buf, 0).map_err(|source| CgroupError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            if n == buf.len() {
                // Longer than any events file the kernel writes: read it whole instead.
                read(path)?
            } else {
                String::from_utf8_lossy(&buf[..n]).into_owned()
            }
        }
        None => read(path)?,
    };
    Ok(key_value(&text, key).unwrap_or(0))
}

/// The value of `key` in a flat-keyed file (`populated 0`, `oom_kill 3`).
fn key_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// `rmdir` of a cgroup, retried briefly: a v1 memory cgroup can stay busy for a moment after
/// its last task exits.
fn remove_dir_retry(dir: &Path) -> io::Result<()> {
    let mut last = None;
    for _ in 0..50 {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Err(last.unwrap_or_else(|| io::Error::other("rmdir failed")))
}

fn join(mount: &Path, rel: &str) -> PathBuf {
    let rel = rel.trim_start_matches('/');
    if rel.is_empty() {
        mount.to_path_buf()
    } else {
        mount.join(rel)
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTS: &str = "\
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
35 30 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
38 30 0:34 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
";
    const HYBRID_SELF: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n0::/\n";

    #[test]
    fn hybrid_layout_is_recognized() {
        let l = Layout::parse(HYBRID_MOUNTS, HYBRID_SELF).unwrap();
        assert_eq!(l.kind(), LayoutKind::Hybrid);
        assert_eq!(l.v2_base, Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(
            l.memory_v1.as_deref(),
            Some(Path::new("/sys/fs/cgroup/memory/process_api/abc"))
        );
        assert_eq!(l.pids_v1.as_deref(), Some(Path::new("/sys/fs/cgroup/pids")));
    }

    #[test]
    fn unified_layout_is_recognized() {
        let mounts = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let l = Layout::parse(mounts, "0::/user.slice/session-1.scope\n").unwrap();
        assert_eq!(l.kind(), LayoutKind::Unified);
        assert_eq!(
            l.v2_base,
            Path::new("/sys/fs/cgroup/user.slice/session-1.scope")
        );
    }

    #[test]
    fn no_v2_is_an_error() {
        let mounts = "35 30 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert!(matches!(
            Layout::parse(mounts, "4:memory:/\n"),
            Err(CgroupError::NoV2)
        ));
    }

    #[test]
    fn flat_keyed_values() {
        assert_eq!(key_value("populated 0\nfrozen 1\n", "populated"), Some(0));
        assert_eq!(key_value("populated 1\nfrozen 0\n", "frozen"), Some(0));
        assert_eq!(
            key_value("oom_kill_disable 0\noom_kill 3\n", "oom_kill"),
            Some(3)
        );
        assert_eq!(key_value("max 0\n", "populated"), None);
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/plain"), "/plain");
    }
}
