//! Host-observed events of one run. One raw tracepoint program on `sched_process_exec`, shared
//! by every run on the boot ([`crate::shared`]), reports the execs of processes in a watched
//! cgroup (or below it) — filtered in the kernel by cgroup id — into the ring buffer of the run
//! that watches it; when the run's [`crate::Egress`] is attached with this observer, its hooks
//! report every connection attempt into the same ring buffer, so [`Observer::poll`] returns both
//! in the kernel's order.
//!
//! A run claims a ring buffer slot (reusing the ring buffer of an earlier run, emptied) and
//! writes two entries keyed by its cgroup id (`lost`, then `watched` = its slot), and pins its
//! ring buffer (with the shared filter, for inspection) under
//! `/sys/fs/bpf/cordon/<run_id>/observer/` while the observer lives. Records carry the cgroup
//! they were delivered for; the reader keeps only its own, so nothing an earlier user of the
//! slot left or sent late can reach this run's events. Nothing here outlives the handle: an
//! observer is useless without its reader, so dropping it removes its entries and pins, and
//! [`crate::cleanup_stale`] removes those of a cordon that died.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aya::maps::{Map, MapData, RingBuf};

use crate::Verification;
use crate::bpffs::{self, BpffsError, Mounted};
use crate::probe::{self, ProbeError};
use crate::shared::{self, Generation, ObserverShared, SharedError};
use crate::sys::{self, SysError};
use crate::wire::{self, DecodeError, Event};

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
    /// The shared objects could not be loaded or opened.
    #[error(transparent)]
    Shared(#[from] SharedError),
    /// A `bpf()` command on the run's own maps failed.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// The cgroup is already watched by another live run.
    #[error("cgroup {cgroup_id} ({path}) is already observed by another run")]
    CgroupInUse {
        /// The cgroup's id.
        cgroup_id: u64,
        /// Its directory.
        path: PathBuf,
    },
    /// A map is missing or has the wrong type.
    #[error("map {name}: {source}")]
    Map {
        /// The map.
        name: &'static str,
        /// Why.
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// The ring buffer could not be mapped into this process (reported on every read after).
    #[error("mapping the ring buffer: {0}")]
    Mapping(String),
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

/// A run's ring buffer: the map, mapped into this process only when first read. Mapping 1 MiB
/// of ring (the kernel fills in every page table entry at `mmap`) cost ~0.2 ms of each run's
/// startup; the kernel writes records whether or not a reader has mapped it, so the mapping
/// waits until the command runs. Records an earlier user of the slot left are then dropped as
/// foreign, like any record not marked with this run's cgroup.
enum Ring {
    Unmapped(MapData),
    Mapped(RingBuf<MapData>),
    /// Mapping failed once; the error is reported again on every read.
    Failed(String),
}

impl Ring {
    fn mapped(&mut self) -> Result<&mut RingBuf<MapData>, ObserverError> {
        if let Ring::Unmapped(_) = self {
            let Ring::Unmapped(data) = std::mem::replace(self, Ring::Failed(String::new())) else {
                unreachable!("checked above")
            };
            *self = match RingBuf::try_from(Map::RingBuf(data)) {
                Ok(r) => Ring::Mapped(r),
                Err(e) => Ring::Failed(e.to_string()),
            };
        }
        match self {
            Ring::Mapped(r) => Ok(r),
            Ring::Failed(e) => Err(ObserverError::Mapping(e.clone())),
            Ring::Unmapped(_) => unreachable!("mapped above"),
        }
    }

    fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        match self {
            Ring::Unmapped(d) => Some(d.fd().as_fd()),
            Ring::Mapped(r) => Some(r.as_fd()),
            Ring::Failed(_) => None,
        }
    }
}

/// See [`leave_mappings_to_exit`].
static MAPPINGS_TO_EXIT: AtomicBool = AtomicBool::new(false);

/// Says that this process ends soon after its runs do (`cordon run`): from now on an observer
/// that is released or dropped leaves its ring buffer mapped (and its descriptor open), for
/// the process's exit to take down, and so do the two pages mapped to empty the ring when it
/// is claimed. Unmapping the ring (2 MiB of mapping, its pages filled in)
/// in a process with threads on other CPUs is a TLB shootdown there, ~0.1–0.3 ms on the end of
/// a run on the machine described in ARCHITECTURE.md; the exit of the last thread needs none.
/// The ring is a shared slot's (see [`crate::shared`]) and outlives the run anyway: nothing
/// but this process's address space holds on to it longer. A long-lived process (a daemon
/// running many runs) must not call this.
pub fn leave_mappings_to_exit() {
    MAPPINGS_TO_EXIT.store(true, Ordering::Relaxed);
}

/// Observes one run's cgroup. See the module documentation.
pub struct Observer {
    cgroup_dir: PathBuf,
    cgroup_id: u64,
    pin_dir: PathBuf,
    bpffs: Mounted,
    ring: Ring,
    ring_id: u32,
    slot: u32,
    /// Records of other cgroups found in the ring buffer (left by an earlier user of the slot)
    /// and dropped.
    foreign: u64,
    shared: ObserverShared,
    queue: VecDeque<Event>,
    /// Whether the shared entries are still this observer's to remove.
    entered: bool,
    /// Whether the pins are still there to remove.
    pinned: bool,
    /// Holds the shared objects' generation (it is not retired while a handle lives).
    generation: Generation,
    /// Marks the run as live for `cleanup_stale` in other processes.
    _lock: bpffs::RunLock,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("cgroup_dir", &self.cgroup_dir)
            .field("cgroup_id", &self.cgroup_id)
            .field("pin_dir", &self.pin_dir)
            .field("prog_id", &self.shared.prog_id)
            .field("ring_id", &self.ring_id)
            .field("queued", &self.queue.len())
            .finish_non_exhaustive()
    }
}

/// Deletes `key` from `map` (a shared map), ignoring a missing entry.
fn forget(map: &sys::RawMap, key: u64) {
    let _ = map.delete(&key.to_ne_bytes());
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
        bpffs::check_run_id(run_id)?;
        let cgroup_id = std::fs::metadata(cgroup_dir)
            .map_err(|source| ObserverError::Cgroup {
                path: cgroup_dir.to_path_buf(),
                source,
            })?
            .ino();
        let mounted = bpffs::ensure_mounted(root)?;
        let (generation, shared) = Generation::take(root, Generation::observer)?;
        let (dir, lock) = bpffs::create_part_dir(root, run_id, "observer")?;
        let mut built = Self::build(&dir, cgroup_dir, cgroup_id, &shared);
        if matches!(built, Err(ObserverError::CgroupInUse { .. })) {
            // Perhaps a cordon that died left the entry: clean up once, then try again.
            let _ = bpffs::cleanup_stale(root);
            built = Self::build(&dir, cgroup_dir, cgroup_id, &shared);
        }
        match built {
            Ok((ring, ring_id, slot)) => Ok(Observer {
                cgroup_dir: cgroup_dir.to_path_buf(),
                cgroup_id,
                pin_dir: dir,
                bpffs: mounted,
                ring,
                ring_id,
                slot,
                foreign: 0,
                shared,
                queue: VecDeque::new(),
                entered: true,
                pinned: true,
                generation,
                _lock: lock,
            }),
            Err(e) => {
                let _ = bpffs::remove_part_dir(&dir);
                Err(e)
            }
        }
    }

    /// Claims a ring buffer slot, empties its ring buffer, pins it, and enters the run into the
    /// shared maps: `lost` first, `watched` (the filter, naming the slot) last, so that the
    /// program never matches the cgroup before its ring buffer and counter are there.
    fn build(
        dir: &Path,
        cgroup_dir: &Path,
        cgroup_id: u64,
        shared: &ObserverShared,
    ) -> Result<(Ring, u32, u32), ObserverError> {
        let key = cgroup_id.to_ne_bytes();
        if shared
            .watched
            .get_u32_at_u64(cgroup_id)
            .ok()
            .flatten()
            .is_some()
        {
            return Err(ObserverError::CgroupInUse {
                cgroup_id,
                path: cgroup_dir.to_path_buf(),
            });
        }
        // The cgroup id, for `cleanup_stale` should this process die.
        let marker = dir.join(shared::marker(cgroup_id));
        match std::fs::create_dir(&marker) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(
                    SysError::bpf("recording the cgroup in", dir.display().to_string())(e).into(),
                );
            }
        }
        let claimed = shared.rings.claim(cgroup_id)?;
        let slot = claimed.slot;
        let [ring_map] = claimed.maps;
        let ring_id = ring_map.id();
        let entered = (|| {
            let pin = dir.join("events");
            sys::obj_pin(ring_map.as_fd(), &pin)
                .map_err(SysError::bpf("pinning", pin.display().to_string()))?;
            let pin = dir.join(shared::WATCHED);
            sys::obj_pin(shared.watched.as_fd(), &pin)
                .map_err(SysError::bpf("pinning", pin.display().to_string()))?;
            // What an earlier user of this slot left: nobody's events now. Discarded through the
            // ring's position pages only; the ring itself is mapped at the first read.
            sys::ringbuf_discard(ring_map.as_fd(), MAPPINGS_TO_EXIT.load(Ordering::Relaxed))
                .map_err(SysError::bpf("emptying", "the ring buffer".to_owned()))?;
            let data = MapData::from_fd(ring_map.into_fd()).map_err(map_err("events"))?;
            let ring = Ring::Unmapped(data);
            shared
                .lost
                .update(&key, &0u64.to_ne_bytes(), sys::BPF_ANY)
                .map_err(SysError::bpf("inserting into", shared::LOST))?;
            match shared
                .watched
                .update(&key, &slot.to_ne_bytes(), sys::BPF_NOEXIST)
            {
                Ok(()) => Ok(ring),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    Err(ObserverError::CgroupInUse {
                        cgroup_id,
                        path: cgroup_dir.to_path_buf(),
                    })
                }
                Err(e) => Err(SysError::bpf("inserting into", shared::WATCHED)(e).into()),
            }
        })();
        match entered {
            Ok(ring) => Ok((ring, ring_id, slot)),
            Err(e) => {
                if !matches!(e, ObserverError::CgroupInUse { .. }) {
                    forget(&shared.watched, cgroup_id);
                }
                if shared
                    .watched
                    .get_u32_at_u64(cgroup_id)
                    .ok()
                    .flatten()
                    .is_none()
                {
                    forget(&shared.lost, cgroup_id);
                }
                shared.rings.release(slot, cgroup_id);
                let _ = std::fs::remove_dir(dir.join(shared::marker(cgroup_id)));
                let _ = std::fs::remove_file(dir.join("events"));
                let _ = std::fs::remove_file(dir.join(shared::WATCHED));
                Err(e)
            }
        }
    }

    /// The shared objects' generation this observer uses (egress attached with it uses the same).
    pub(crate) fn generation(&self) -> &Generation {
        &self.generation
    }

    /// The observed cgroup's id.
    pub fn cgroup_id(&self) -> u64 {
        self.cgroup_id
    }

    /// The kernel's id of the exec program's link (shared by every run on the boot).
    pub fn link_id(&self) -> Option<u32> {
        Some(self.shared.link_id)
    }

    /// The kernel's id of the exec program.
    pub fn prog_id(&self) -> u32 {
        self.shared.prog_id
    }

    /// The kernel's id of this run's ring buffer.
    pub fn ring_id(&self) -> u32 {
        self.ring_id
    }

    /// The ring buffer slot this run uses.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Records of other cgroups found in this run's ring buffer and dropped (left or sent late
    /// by an earlier user of the slot); never part of the events returned.
    pub fn foreign(&self) -> u64 {
        self.foreign
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
        let mut v = [0u8; 8];
        let found = self
            .shared
            .lost
            .lookup(&self.cgroup_id.to_ne_bytes(), &mut v)
            .map_err(SysError::bpf("reading", shared::LOST))?;
        if !found {
            return Err(
                SysError::bpf("reading", shared::LOST)(io::Error::other(format!(
                    "cgroup {} has no loss counter",
                    self.cgroup_id
                )))
                .into(),
            );
        }
        Ok(u64::from_ne_bytes(v))
    }

    /// Moves every record now in the ring buffer into the queue.
    fn fill(&mut self) -> Result<(), ObserverError> {
        let ring = self.ring.mapped()?;
        while let Some(item) = ring.next() {
            if wire::record_run(&item) != Some(self.cgroup_id) {
                self.foreign += 1;
                continue;
            }
            let event = wire::decode(&item)?;
            self.queue.push_back(event);
        }
        Ok(())
    }

    /// Maps the ring buffer into this process now, rather than at the first read: for a
    /// caller with time to spare before it reads (the launcher while the command starts) when
    /// the first read would come at a worse moment (mapping 1 MiB took ~0.2 ms here; a command
    /// as short as `/bin/true` has ended by then). A failure is reported, and again at reads.
    pub fn map_ring(&mut self) -> Result<(), ObserverError> {
        self.ring.mapped().map(drop)
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
            let Some(fd) = self.ring.fd() else {
                return Err(ObserverError::Poll(io::Error::other(
                    "the ring buffer is not mapped",
                )));
            };
            let mut pfd = libc::pollfd {
                fd: fd.as_raw_fd(),
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

    /// Checks that the shared exec link (held open by this observer) still runs the program it
    /// ran at attach on `sched_process_exec`, that its pin still names it, and that the shared
    /// maps still hold this run: the cgroup in the filter, its own ring buffer, its counter.
    pub fn verify_attached(&self) -> Verification {
        let mut problems = Vec::new();
        let sh = &self.shared;
        match sys::raw_tp_link_info(sh.link.as_fd()) {
            Ok(l) if l.prog_id == sh.prog_id && l.tp_name == shared::EXEC_TRACEPOINT => {}
            Ok(l) => problems.push(format!(
                "on_exec: link {} runs program {} on {:?} (expected {} on {})",
                l.link_id,
                l.prog_id,
                l.tp_name,
                sh.prog_id,
                shared::EXEC_TRACEPOINT
            )),
            Err(e) => problems.push(format!("on_exec: link unreadable: {e}")),
        }
        let pin = self.generation.dir().join(shared::EXEC_LINK);
        match sys::obj_get(&pin).and_then(|fd| sys::raw_tp_link_info(fd.as_fd())) {
            Ok(l) if l.link_id == sh.link_id => {}
            Ok(l) => problems.push(format!(
                "on_exec: the shared pin {} names link {} (expected {})",
                pin.display(),
                l.link_id,
                sh.link_id
            )),
            Err(e) => problems.push(format!(
                "on_exec: the shared link pin {} is gone or unreadable ({e}); this observer's own reference keeps the link",
                pin.display()
            )),
        }
        let key = self.cgroup_id.to_ne_bytes();
        match sh.watched.get_u32_at_u64(self.cgroup_id) {
            Ok(Some(slot)) if slot == self.slot => {}
            Ok(Some(slot)) => problems.push(format!(
                "watched: cgroup {} now names ring slot {slot} (expected {})",
                self.cgroup_id, self.slot
            )),
            Ok(None) => problems.push(format!(
                "watched: cgroup {} is no longer in the filter",
                self.cgroup_id
            )),
            Err(e) => problems.push(format!("watched: {e}")),
        }
        problems.extend(sh.rings.check(self.slot, self.cgroup_id, &[self.ring_id]));
        let mut count = [0u8; 8];
        match sh.lost.lookup(&key, &mut count) {
            Ok(true) => {}
            Ok(false) => problems.push(format!(
                "lost: cgroup {} has no loss counter any more",
                self.cgroup_id
            )),
            Err(e) => problems.push(format!("lost: {e}")),
        }
        Verification::from_problems(
            problems,
            format!(
                "on_exec (prog {}, shared link {}) watching cgroup {} into ring buffer {} (slot {})",
                sh.prog_id, sh.link_id, self.cgroup_id, self.ring_id, self.slot
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

    /// Takes the run out of the shared maps — the filter first (if it still names this run's
    /// slot), then the counter (unless the filter names another run's slot now) — and frees the
    /// slot.
    fn leave(&mut self) {
        if !self.entered {
            return;
        }
        self.entered = false;
        let sh = &self.shared;
        match sh.watched.get_u32_at_u64(self.cgroup_id).ok().flatten() {
            Some(slot) if slot == self.slot => {
                forget(&sh.watched, self.cgroup_id);
                forget(&sh.lost, self.cgroup_id);
            }
            Some(_) => {}
            None => forget(&sh.lost, self.cgroup_id),
        }
        sh.rings.release(self.slot, self.cgroup_id);
    }

    /// Stops observing and removes the pins (`<root>/cordon/<run_id>/observer`, and the run
    /// directory when nothing else is left in it). Events still queued are returned.
    pub fn release(mut self) -> Result<Vec<Event>, ObserverError> {
        let rest = self.drain()?;
        self.leave();
        bpffs::remove_part_dir(&self.pin_dir)?;
        // Removed: not again on drop (a failed removal is tried once more there).
        self.pinned = false;
        Ok(rest)
    }
}

impl Drop for Observer {
    /// The observer's entries and pins serve only while it lives.
    fn drop(&mut self) {
        self.leave();
        if self.pinned {
            let _ = bpffs::remove_part_dir(&self.pin_dir);
        }
        if MAPPINGS_TO_EXIT.load(Ordering::Relaxed) && matches!(self.ring, Ring::Mapped(_)) {
            // Never dropped: the mapping and its descriptor go with the process.
            let ring = std::mem::replace(&mut self.ring, Ring::Failed(String::new()));
            let _kept = std::mem::ManuallyDrop::new(ring);
        }
    }
}
