//! Host-observed events of one run: a BTF tracepoint on `sched_process_exec` reports the execs
//! of processes in the run's cgroup (or below it) — filtered in the kernel by cgroup id — and,
//! when the run's [`crate::Egress`] is attached with this observer, its hooks report every
//! connection attempt into the same ring buffer, so [`Observer::poll`] returns both in the
//! kernel's order.
//!
//! The ring buffer and its lost-event counter are pinned under
//! `/sys/fs/bpf/cordon/<run_id>/observer/` while the observer lives, so that the egress object
//! (loaded separately) can share them. Nothing here is pinned to outlive cordon: an observer is
//! useless without its reader.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aya::maps::{Array, HashMap, MapData, RingBuf};
use aya::programs::BtfTracePoint;
use aya::programs::links::FdLink;
use aya::{Btf, Ebpf, EbpfLoader};

use crate::bpffs::{self, BpffsError, Mounted};
use crate::probe::{self, ProbeError};
use crate::wire::{self, DecodeError, Event};
use crate::{OBSERVE_OBJECT, Verification};

/// Errors of the observer, each naming the operation and its object.
#[derive(Debug, thiserror::Error)]
pub enum ObserverError {
    /// bpffs could not be mounted or the pin directory made.
    #[error("bpffs: {0}")]
    Bpffs(#[from] BpffsError),
    /// The cgroup directory could not be read.
    #[error("reading cgroup {path}: {source}")]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The kernel's BTF could not be read.
    #[error("reading the kernel's BTF (/sys/kernel/btf/vmlinux): {0}")]
    Btf(#[source] Box<aya::BtfError>),
    /// Loading the object failed.
    #[error("loading the observer object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    /// A map is missing or has the wrong type.
    #[error("map {name}: {source}")]
    Map {
        /// The map.
        name: &'static str,
        /// Why.
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// Loading or attaching the exec program failed.
    #[error("{op} program on_exec: {source}")]
    Program {
        /// `loading` or `attaching`.
        op: &'static str,
        /// Why (the verifier log is inside).
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// Pinning a map failed.
    #[error("pinning {name} at {path}: {source}")]
    Pin {
        /// The map.
        name: &'static str,
        /// The pin path.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<aya::pin::PinError>,
    },
    /// Waiting for the ring buffer failed.
    #[error("polling the ring buffer: {0}")]
    Poll(io::Error),
    /// A record of the ring buffer could not be decoded.
    #[error("decoding an event: {0}")]
    Decode(#[from] DecodeError),
    /// An exec probe could not run.
    #[error("exec probe: {0}")]
    Probe(#[from] ProbeError),
}

fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> ObserverError {
    move |source| ObserverError::Map {
        name,
        source: Box::new(source),
    }
}

/// Observes one run's cgroup. See the module documentation.
pub struct Observer {
    cgroup_dir: PathBuf,
    cgroup_id: u64,
    pin_dir: PathBuf,
    bpffs: Mounted,
    ring: RingBuf<MapData>,
    lost: Array<MapData, u64>,
    watched: HashMap<MapData, u64, u32>,
    queue: VecDeque<Event>,
    prog_id: u32,
    link: Option<FdLink>,
    _bpf: Ebpf,
    /// Marks the run as live for `cleanup_stale` in other processes.
    _lock: bpffs::RunLock,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("cgroup_dir", &self.cgroup_dir)
            .field("cgroup_id", &self.cgroup_id)
            .field("pin_dir", &self.pin_dir)
            .field("prog_id", &self.prog_id)
            .field("queued", &self.queue.len())
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// Starts observing the cgroup (v2) at `cgroup_dir` and its descendants, with bpffs at
    /// [`bpffs::DEFAULT_ROOT`] (mounted if absent). Needs root (`CAP_BPF`, `CAP_PERFMON`).
    pub fn attach(run_id: &str, cgroup_dir: &Path) -> Result<Observer, ObserverError> {
        Self::attach_at(Path::new(bpffs::DEFAULT_ROOT), run_id, cgroup_dir)
    }

    /// [`Observer::attach`] with bpffs at `root`.
    pub fn attach_at(
        root: &Path,
        run_id: &str,
        cgroup_dir: &Path,
    ) -> Result<Observer, ObserverError> {
        let cgroup_id = std::fs::metadata(cgroup_dir)
            .map_err(|source| ObserverError::Cgroup {
                path: cgroup_dir.to_path_buf(),
                source,
            })?
            .ino();
        let mounted = bpffs::ensure_mounted(root)?;
        let (dir, lock) = bpffs::create_part_dir(root, run_id, "observer")?;
        match Self::build(&dir, cgroup_dir, cgroup_id, mounted, lock) {
            Ok(o) => Ok(o),
            Err(e) => {
                let _ = bpffs::remove_part_dir(&dir);
                Err(e)
            }
        }
    }

    fn build(
        dir: &Path,
        cgroup_dir: &Path,
        cgroup_id: u64,
        mounted: Mounted,
        lock: bpffs::RunLock,
    ) -> Result<Observer, ObserverError> {
        let btf = Btf::from_sys_fs().map_err(|e| ObserverError::Btf(Box::new(e)))?;
        let mut bpf = EbpfLoader::new()
            .btf(Some(&btf))
            .load(OBSERVE_OBJECT)
            .map_err(|e| ObserverError::Load(Box::new(e)))?;
        let take = |bpf: &mut Ebpf, name: &'static str| {
            let map = bpf.take_map(name).ok_or(ObserverError::Map {
                name,
                source: Box::new(aya::maps::MapError::InvalidName {
                    name: name.to_owned(),
                }),
            })?;
            map.pin(dir.join(name))
                .map_err(|source| ObserverError::Pin {
                    name,
                    path: dir.join(name),
                    source: Box::new(source),
                })?;
            Ok::<_, ObserverError>(map)
        };
        let ring: RingBuf<MapData> =
            RingBuf::try_from(take(&mut bpf, "events")?).map_err(map_err("events"))?;
        let lost: Array<MapData, u64> =
            Array::try_from(take(&mut bpf, "lost")?).map_err(map_err("lost"))?;
        let mut watched: HashMap<MapData, u64, u32> =
            HashMap::try_from(take(&mut bpf, "watched")?).map_err(map_err("watched"))?;
        watched
            .insert(cgroup_id, 1, 0)
            .map_err(map_err("watched"))?;
        let prog: &mut BtfTracePoint = bpf
            .program_mut("on_exec")
            .ok_or(ObserverError::Map {
                name: "on_exec",
                source: Box::new(aya::maps::MapError::InvalidName {
                    name: "on_exec".into(),
                }),
            })?
            .try_into()
            .map_err(|e| ObserverError::Program {
                op: "loading",
                source: Box::new(e),
            })?;
        let perr = |op| {
            move |e| ObserverError::Program {
                op,
                source: Box::new(e),
            }
        };
        prog.load("sched_process_exec", &btf)
            .map_err(perr("loading"))?;
        let prog_id = prog.info().map_err(perr("loading"))?.id();
        let id = prog.attach().map_err(perr("attaching"))?;
        let link: FdLink = prog.take_link(id).map_err(perr("attaching"))?.into();
        Ok(Observer {
            cgroup_dir: cgroup_dir.to_path_buf(),
            cgroup_id,
            pin_dir: dir.to_path_buf(),
            bpffs: mounted,
            ring,
            lost,
            watched,
            queue: VecDeque::new(),
            prog_id,
            link: Some(link),
            _bpf: bpf,
            _lock: lock,
        })
    }

    pub(crate) fn events_pin(&self) -> PathBuf {
        self.pin_dir.join("events")
    }

    pub(crate) fn lost_pin(&self) -> PathBuf {
        self.pin_dir.join("lost")
    }

    /// The observed cgroup's id.
    pub fn cgroup_id(&self) -> u64 {
        self.cgroup_id
    }

    /// The kernel's id of the exec program's link.
    pub fn link_id(&self) -> Option<u32> {
        self.link
            .as_ref()
            .and_then(|l| l.info().ok())
            .map(|i| i.id())
    }

    /// Where the observer's maps are pinned.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Whether bpffs was already mounted or mounted by this attach.
    pub fn bpffs(&self) -> Mounted {
        self.bpffs
    }

    /// Events the ring buffer had no room for (exec and connect), as counted in the kernel.
    pub fn lost(&self) -> Result<u64, ObserverError> {
        self.lost.get(&0, 0).map_err(map_err("lost"))
    }

    /// Moves every record now in the ring buffer into the queue.
    fn fill(&mut self) -> Result<(), ObserverError> {
        while let Some(item) = self.ring.next() {
            let event = wire::decode(&item)?;
            self.queue.push_back(event);
        }
        Ok(())
    }

    /// Every event available now, in the kernel's order (without waiting).
    pub fn drain(&mut self) -> Result<Vec<Event>, ObserverError> {
        self.fill()?;
        Ok(self.queue.drain(..).collect())
    }

    /// Waits up to `timeout` for at least one event, then returns every event available, in
    /// the kernel's order (empty on timeout).
    pub fn poll(&mut self, timeout: Duration) -> Result<Vec<Event>, ObserverError> {
        let start = Instant::now();
        loop {
            self.fill()?;
            if !self.queue.is_empty() {
                return Ok(self.queue.drain(..).collect());
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(Vec::new());
            }
            let mut pfd = libc::pollfd {
                fd: self.ring.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
            // SAFETY: `pfd` is one valid pollfd on the ring buffer's descriptor.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(ObserverError::Poll(e));
                }
            }
        }
    }

    /// Both checks: [`Observer::verify_attached`] and [`Observer::verify_probe`].
    pub fn verify(&mut self) -> Verification {
        let attached = self.verify_attached();
        let probe = self.verify_probe();
        attached.and(probe)
    }

    /// Checks that the exec program's link still runs this observer's program and that the
    /// in-kernel filter still names the run's cgroup.
    pub fn verify_attached(&self) -> Verification {
        let mut problems = Vec::new();
        match self.link.as_ref().map(FdLink::info) {
            Some(Ok(info)) if info.program_id() == self.prog_id => {}
            Some(Ok(info)) => problems.push(format!(
                "on_exec: link runs program {} (expected {})",
                info.program_id(),
                self.prog_id
            )),
            Some(Err(e)) => problems.push(format!("on_exec: link unreadable: {e}")),
            None => problems.push("on_exec: no link".into()),
        }
        match self.watched.get(&self.cgroup_id, 0) {
            Ok(_) => {}
            Err(aya::maps::MapError::KeyNotFound) => problems.push(format!(
                "watched: cgroup {} is no longer in the filter",
                self.cgroup_id
            )),
            Err(e) => problems.push(format!("watched: {e}")),
        }
        Verification::from_problems(
            problems,
            format!(
                "on_exec (prog {}) watching cgroup {}",
                self.prog_id, self.cgroup_id
            ),
            None,
        )
    }

    /// An active probe: a process born in the cgroup execs `/bin/true`, and its exec event
    /// must arrive within two seconds. Events read meanwhile stay queued for the next
    /// [`Observer::poll`] (the probe's own exec event among them: its pid is in the result).
    pub fn verify_probe(&mut self) -> Verification {
        let (pid, code) = match probe::exec_probe(
            &self.cgroup_dir,
            Path::new("/bin/true"),
            &["true", "cordon-probe"],
            Duration::from_secs(5),
        ) {
            Ok(r) => r,
            Err(e) => {
                return Verification::from_problems(
                    vec![format!("probe: {e}")],
                    String::new(),
                    None,
                );
            }
        };
        if code != 0 {
            return Verification::from_problems(
                vec![format!("probe pid {pid}: /bin/true exited {code}")],
                String::new(),
                Some(pid),
            );
        }
        let start = Instant::now();
        let limit = Duration::from_secs(2);
        loop {
            if let Err(e) = self.fill() {
                return Verification::from_problems(vec![e.to_string()], String::new(), Some(pid));
            }
            if self
                .queue
                .iter()
                .any(|e| matches!(e, Event::Exec(x) if x.pid == pid && x.filename == "/bin/true"))
            {
                return Verification::from_problems(
                    Vec::new(),
                    format!("probe pid {pid}: exec of /bin/true observed"),
                    Some(pid),
                );
            }
            if start.elapsed() >= limit {
                return Verification::from_problems(
                    vec![format!(
                        "probe pid {pid} exec'd /bin/true in cgroup {} but no exec event arrived within {limit:?}",
                        self.cgroup_id
                    )],
                    String::new(),
                    Some(pid),
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops observing and removes the pins (`<root>/cordon/<run_id>/observer`, and the run
    /// directory when nothing else is left in it). Events still queued are returned.
    pub fn release(mut self) -> Result<Vec<Event>, ObserverError> {
        let rest = self.drain()?;
        bpffs::remove_part_dir(&self.pin_dir)?;
        Ok(rest)
    }
}

impl Drop for Observer {
    /// The observer's pins serve only while it lives (an egress object loaded meanwhile keeps
    /// its own reference to the ring buffer).
    fn drop(&mut self) {
        let _ = bpffs::remove_part_dir(&self.pin_dir);
    }
}
