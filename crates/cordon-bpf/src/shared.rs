//! The eBPF objects every run on a boot shares: the exec observer (its program, attached once
//! to `sched_process_exec`) and the six egress programs, loaded once per boot by the first run
//! and pinned in bpffs, with the maps through which each run plugs its own state in:
//!
//! ```text
//! <root>/cordon/shared/<generation>/
//!     exec_prog, exec_link      the observer's program and its raw tracepoint link
//!     watched                   cgroup id -> slot of its run's ring buffer (the filter)
//!     lost                      cgroup id -> events its ring buffer had no room for
//!     rings, ring_owner         slot -> ring buffer; slot -> cgroup id of the run using it
//!     connect4 ... skb_ingress  the egress programs (attached by each run to its cgroup)
//!     run_of                    cgroup storage: which slot an attachment serves
//!     allow4_of, allow6_of,     slot -> a run's tries, control array, counters
//!     control_of, stats_of
//!     egress_owner              slot -> cgroup id of the run using it
//! ```
//!
//! **Slots.** Every update of a map-in-maps from user space waits for an RCU grace period
//! (`synchronize_rcu`, 8–16 ms here), so a run never makes one: a run claims a free slot (an
//! atomic `BPF_NOEXIST` insert into the owner map), reuses the maps already at that slot
//! (emptied and refilled), and frees it when it ends. Only when every slot is taken does a run
//! create a new one (paying those waits); slots therefore number the peak of concurrent runs.
//! An observer's slot is freed when its handle goes (or, after `kill -9`, by
//! [`crate::cleanup_stale`]); an egress slot only once the run's links are detached, because
//! its pinned links keep enforcing the slot's maps after cordon is gone.
//!
//! `<generation>` names the build: a hash of both embedded objects (and of this layout), so an
//! upgraded cordon with different programs gets its own directory, and the older one is removed
//! once no handle uses it ([`retire_idle`]). The kernel's BTF is parsed (once, inside aya's
//! loader) and the verifier runs only when a generation is created.
//!
//! Locks (`flock`): creating a generation takes `shared` exclusively, so two first starts never
//! load twice; every handle ([`crate::Observer`], [`crate::Egress`]) holds its generation's
//! directory shared for as long as it lives, and retiring one needs it exclusively (without
//! waiting), so a generation in use is never taken apart. What outlives a handle (an egress
//! run's pinned links) holds the programs, and through them the maps, by itself.
//!
//! Every run checks what it opens: the pins must be programs and maps of the expected types,
//! names and sizes; the programs must use exactly the pinned maps (their map ids); the exec
//! link must run the pinned program on `sched_process_exec`; and the egress programs' tags
//! (the kernel's hash of their instructions) must be those of this build's object
//! ([`crate::tags`]), so a pinned program replaced by a look-alike is refused.

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use aya::EbpfLoader;
use aya::programs::links::FdLink;
use aya::programs::{CgroupSkb, CgroupSockAddr, RawTracePoint};

use crate::egress::HOOKS;
use crate::sys::{self, AttachPoint, MapInfo, MapSpec, MapType, RawMap};
use crate::wire;
use crate::{EGRESS_OBJECT, OBSERVE_OBJECT};

/// The directory of the shared generations under `<root>/cordon`: a name no run id may take.
/// (bpffs refuses names with a dot, so it cannot be hidden as `.shared`.)
pub const SHARED_DIR: &str = "shared";

/// The layout of the pins and maps this code expects; part of the generation's name.
const LAYOUT: &[u8] = b"cordon-bpf shared objects v1";

const fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

/// This build's generation: FNV-1a of the layout and both objects. Not a security measure (the
/// objects' identity is checked by their tags); it only keeps builds apart.
pub const GENERATION: u64 = fnv1a(
    fnv1a(
        fnv1a(0xcbf2_9ce4_8422_2325, LAYOUT),
        include_bytes!("../../../bpf/obj/observe.bpf.o"),
    ),
    include_bytes!("../../../bpf/obj/egress.bpf.o"),
);

/// The name of this build's generation directory.
pub fn generation_name() -> String {
    format!("{GENERATION:016x}")
}

/// `<root>/cordon/shared`.
pub fn shared_dir(root: &Path) -> PathBuf {
    root.join("cordon").join(SHARED_DIR)
}

/// `<root>/cordon/shared/<generation>`: this build's shared objects.
pub fn generation_dir(root: &Path) -> PathBuf {
    shared_dir(root).join(generation_name())
}

/// Pin of the exec observer's program.
pub const EXEC_PROG: &str = "exec_prog";
/// Pin of the exec observer's raw tracepoint link.
pub const EXEC_LINK: &str = "exec_link";
/// The tracepoint it is attached to.
pub const EXEC_TRACEPOINT: &str = "sched_process_exec";
/// Pin of the cgroup id filter (cgroup id -> ring slot).
pub const WATCHED: &str = "watched";
/// Pin of slot -> ring buffer.
pub const RINGS: &str = "rings";
/// Pin of cgroup id -> events lost.
pub const LOST: &str = "lost";
/// Pin of slot -> the cgroup id of the observer using that ring buffer.
pub const RING_OWNER: &str = "ring_owner";
/// Pin of the egress attachments' cgroup storage.
pub const RUN_OF: &str = "run_of";
/// Pins of the egress map-in-maps (slot -> a run's `allow4`, `allow6`, `control`, `stats`).
pub const OUTER: [&str; 4] = ["allow4_of", "allow6_of", "control_of", "stats_of"];
/// Pin of slot -> the cgroup id of the egress run using those maps.
pub const EGRESS_OWNER: &str = "egress_owner";

/// `sizeof(struct run_ref)`.
pub const RUN_REF_LEN: usize = 16;

const BPF_PROG_TYPE_CGROUP_SKB: u32 = 8;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;

fn hash_spec(key_size: u32, value_size: u32) -> MapSpec {
    MapSpec {
        map_type: MapType::Hash,
        key_size,
        value_size,
        max_entries: wire::MAX_RUNS,
        flags: sys::BPF_F_NO_PREALLOC,
    }
}

/// `watched`: cgroup id -> slot.
pub(crate) fn watched_spec() -> MapSpec {
    hash_spec(8, 4)
}

/// `lost`: cgroup id -> u64.
pub(crate) fn lost_spec() -> MapSpec {
    hash_spec(8, 8)
}

/// An owner map: slot -> cgroup id.
pub(crate) fn owner_spec() -> MapSpec {
    hash_spec(4, 8)
}

/// A map-in-maps indexed by slot.
pub(crate) fn outer_spec() -> MapSpec {
    MapSpec {
        map_type: MapType::ArrayOfMaps,
        key_size: 4,
        value_size: 4,
        max_entries: wire::MAX_RUNS,
        flags: 0,
    }
}

/// `run_of`.
pub(crate) fn run_of_spec() -> MapSpec {
    MapSpec {
        map_type: MapType::CgroupStorage,
        key_size: 8,
        value_size: wire::size_u32(RUN_REF_LEN),
        max_entries: 0,
        flags: 0,
    }
}

/// A run's ring buffer.
pub(crate) fn ring_spec() -> MapSpec {
    MapSpec {
        map_type: MapType::Ringbuf,
        key_size: 0,
        value_size: 0,
        max_entries: wire::RING_BYTES,
        flags: 0,
    }
}

/// The `run_ref` naming `slot` (valid), with connect events for the observer of `events`.
pub(crate) fn run_ref(slot: u32, events: u64) -> [u8; RUN_REF_LEN] {
    let mut r = [0u8; RUN_REF_LEN];
    r[..4].copy_from_slice(&slot.to_ne_bytes());
    r[4..8].copy_from_slice(&1u32.to_ne_bytes());
    r[8..].copy_from_slice(&events.to_ne_bytes());
    r
}

/// The slot a `run_ref` names, if it is valid.
pub(crate) fn run_ref_slot(r: &[u8; RUN_REF_LEN]) -> Option<u32> {
    let valid = u32::from_ne_bytes([r[4], r[5], r[6], r[7]]);
    (valid == 1).then(|| u32::from_ne_bytes([r[0], r[1], r[2], r[3]]))
}

/// Errors of the shared objects, each naming the object.
#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    /// A file system operation in bpffs failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was done.
        op: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Loading an object (once per boot) failed.
    #[error("loading the {object} object: {source}")]
    Load {
        /// `observer` or `egress`.
        object: &'static str,
        /// Why.
        #[source]
        source: Box<aya::EbpfError>,
    },
    /// A program of an object is missing or failed to load, attach or pin.
    #[error("{op} program {name}: {source}")]
    Program {
        /// What was done.
        op: &'static str,
        /// The program.
        name: &'static str,
        /// Why (the verifier log is inside).
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// A map of an object is missing or failed to pin.
    #[error("map {name} of the {object} object: {detail}")]
    Map {
        /// `observer` or `egress`.
        object: &'static str,
        /// The map.
        name: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// A pin of this build's generation is missing or unreadable.
    #[error("shared eBPF object {path} is unusable: {source}")]
    Damaged {
        /// The pin.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A pin is not what this build pinned there.
    #[error("shared eBPF object {path} is not what cordon pinned: {detail}")]
    Mismatch {
        /// The pin.
        path: PathBuf,
        /// The difference.
        detail: String,
    },
    /// Every slot is taken.
    #[error("all {0} slots of the shared {1} maps are taken by live runs")]
    Full(u32, &'static str),
    /// A `bpf()` command on the shared maps failed.
    #[error("{op} {what}: {source}")]
    Bpf {
        /// What was done.
        op: &'static str,
        /// On what.
        what: String,
        /// Why.
        source: io::Error,
    },
    /// The generation is damaged and in use, so it cannot be replaced now.
    #[error(
        "the shared eBPF objects in {dir} are damaged ({why}) and in use by a live cordon process; they are replaced once it ends"
    )]
    DamagedInUse {
        /// The generation directory.
        dir: PathBuf,
        /// What is damaged.
        why: String,
    },
}

impl SharedError {
    fn io(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SharedError + use<> {
        let path = path.to_path_buf();
        move |source| SharedError::Io { op, path, source }
    }

    fn is_damage(&self) -> bool {
        matches!(
            self,
            SharedError::Damaged { .. } | SharedError::Mismatch { .. }
        )
    }
}

fn mkdir(path: &Path) -> Result<(), SharedError> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(SharedError::io("creating", path)(e)),
    }
}

/// `flock(op)` on `fd`; `Ok(false)` when a non-blocking request would block.
fn flock(fd: &OwnedFd, op: libc::c_int) -> io::Result<bool> {
    // SAFETY: flock on a descriptor owned by the caller; no pointers.
    if unsafe { libc::flock(fd.as_raw_fd(), op) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) && op & libc::LOCK_NB != 0 {
        Ok(false)
    } else {
        Err(e)
    }
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(OwnedFd::from(fs::File::open(path)?))
}

/// A generation of the shared objects, held shared (`flock`) while this handle lives.
#[derive(Debug)]
pub(crate) struct Generation {
    dir: PathBuf,
    _lock: OwnedFd,
}

impl Generation {
    /// The generation directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Another handle on the same generation (same lock).
    pub(crate) fn try_clone(&self) -> io::Result<Generation> {
        Ok(Generation {
            dir: self.dir.clone(),
            _lock: self._lock.try_clone()?,
        })
    }

    /// Takes this build's generation under `root`, creating it if it does not exist and
    /// replacing it if it is damaged and idle; then opens what `open` needs from it.
    pub(crate) fn take<T>(
        root: &Path,
        open: impl Fn(&Generation) -> Result<T, SharedError>,
    ) -> Result<(Generation, T), SharedError> {
        let shared = shared_dir(root);
        mkdir(&root.join("cordon"))?;
        mkdir(&shared)?;
        let dir = shared.join(generation_name());
        let mut repaired = false;
        for _ in 0..10 {
            let fd = match open_dir(&dir) {
                Ok(fd) => fd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    create(root)?;
                    continue;
                }
                Err(e) => return Err(SharedError::io("opening", &dir)(e)),
            };
            flock(&fd, libc::LOCK_SH).map_err(SharedError::io("locking", &dir))?;
            // Retired between our open and our lock: start again.
            if !same_dir(&fd, &dir) {
                continue;
            }
            let generation = Generation {
                dir: dir.clone(),
                _lock: fd,
            };
            match open(&generation) {
                Ok(t) => return Ok((generation, t)),
                Err(e) if e.is_damage() && !repaired => {
                    drop(generation);
                    repair(root, &e)?;
                    repaired = true;
                }
                Err(e) => return Err(e),
            }
        }
        Err(SharedError::io("opening", &dir)(io::Error::other(
            "the shared objects were replaced ten times in a row",
        )))
    }
}

/// Whether `fd` (an open directory) is still what `path` names.
fn same_dir(fd: &OwnedFd, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(by_path) = fs::metadata(path) else {
        return false;
    };
    let Ok(dup) = fd.try_clone() else {
        return false;
    };
    fs::File::from(dup)
        .metadata()
        .is_ok_and(|m| m.ino() == by_path.ino() && m.dev() == by_path.dev())
}

/// The exclusive lock on `shared` under which generations are created and removed.
fn lock_shared(root: &Path, wait: bool) -> Result<Option<OwnedFd>, SharedError> {
    let shared = shared_dir(root);
    let fd = open_dir(&shared).map_err(SharedError::io("opening", &shared))?;
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    Ok(flock(&fd, op)
        .map_err(SharedError::io("locking", &shared))?
        .then_some(fd))
}

/// Removes a damaged generation if nobody uses it (a live handle holds it shared).
fn repair(root: &Path, damage: &SharedError) -> Result<(), SharedError> {
    let _creating = lock_shared(root, true)?;
    let dir = generation_dir(root);
    if !try_remove_idle(&dir)? {
        return Err(SharedError::DamagedInUse {
            dir,
            why: damage.to_string(),
        });
    }
    Ok(())
}

/// Removes the generation directory `dir` (its pins) if no handle holds it; `true` if it is
/// gone. The caller holds the `shared` lock.
fn try_remove_idle(dir: &Path) -> Result<bool, SharedError> {
    let fd = match open_dir(dir) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(SharedError::io("opening", dir)(e)),
    };
    if !flock(&fd, libc::LOCK_EX | libc::LOCK_NB).map_err(SharedError::io("locking", dir))? {
        return Ok(false);
    }
    crate::bpffs::remove_tree(dir).map_err(|e| SharedError::Io {
        op: "removing",
        path: dir.to_path_buf(),
        source: io::Error::other(e.to_string()),
    })?;
    Ok(true)
}

/// What [`retire_idle`] did with one directory of `shared`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    /// The directory name (another build's generation, or a creation that died).
    pub name: String,
    /// Whether it was removed (false: a live handle holds it).
    pub removed: bool,
}

/// Removes the generations of other builds (and leftovers of creations that died) that no live
/// handle holds. Their pins go; runs attached to them keep their programs through their own
/// links. Skipped (empty result) while another process creates a generation.
pub fn retire_idle(root: &Path) -> Result<Vec<Retired>, SharedError> {
    let shared = shared_dir(root);
    if !shared.exists() {
        return Ok(Vec::new());
    }
    let Some(_lock) = lock_shared(root, false)? else {
        return Ok(Vec::new());
    };
    retire_locked(root)
}

fn retire_locked(root: &Path) -> Result<Vec<Retired>, SharedError> {
    let shared = shared_dir(root);
    let mine = generation_name();
    let mut out = Vec::new();
    for entry in fs::read_dir(&shared).map_err(SharedError::io("listing", &shared))? {
        let entry = entry.map_err(SharedError::io("listing", &shared))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == mine {
            continue;
        }
        let removed = try_remove_idle(&entry.path())?;
        out.push(Retired { name, removed });
    }
    Ok(out)
}

/// Creates this build's generation unless another process did meanwhile (`shared` locked
/// exclusively: concurrent first starts wait here and then use the one made). Loads both
/// objects into a temporary directory, then renames it into place, so the generation directory
/// is either complete or absent. Idle generations of other builds are retired after.
fn create(root: &Path) -> Result<(), SharedError> {
    let _lock = lock_shared(root, true)?;
    let dir = generation_dir(root);
    if dir.exists() {
        return Ok(());
    }
    // Nobody creates while we hold the lock: a temporary directory left is from a creation
    // that died, and goes with the other builds' idle generations.
    retire_locked(root)?;
    let tmp = shared_dir(root).join(format!("tmp-{}-{}", generation_name(), std::process::id()));
    mkdir(&tmp)?;
    let loaded = load(&tmp).and_then(|()| prefill(&tmp)).and_then(|()| {
        fs::rename(&tmp, &dir).map_err(SharedError::io("renaming into place", &tmp))
    });
    if let Err(e) = loaded {
        let _ = crate::bpffs::remove_tree(&tmp);
        return Err(e);
    }
    Ok(())
}

/// Makes slot 0 of both pools in the generation being created at `dir`, the entries of both
/// pools' map-in-maps waiting for the same grace period.
fn prefill(dir: &Path) -> Result<(), SharedError> {
    let generation = Generation {
        dir: dir.to_path_buf(),
        _lock: open_dir(dir).map_err(SharedError::io("opening", dir))?,
    };
    let o = generation.observer()?;
    let e = generation.egress()?;
    std::thread::scope(|scope| {
        let rings = scope.spawn(|| o.rings.prefill());
        let egress = e.slots.prefill();
        rings.join().unwrap_or_else(|_| {
            Err(SharedError::Io {
                op: "making",
                path: dir.to_path_buf(),
                source: io::Error::other("the thread panicked"),
            })
        })?;
        egress
    })
}

fn pin_map(
    bpf: &mut aya::Ebpf,
    object: &'static str,
    name: &'static str,
    dir: &Path,
) -> Result<(), SharedError> {
    let map = bpf.take_map(name).ok_or_else(|| SharedError::Map {
        object,
        name,
        detail: "missing from the object".into(),
    })?;
    map.pin(dir.join(name)).map_err(|e| SharedError::Map {
        object,
        name,
        detail: format!("pinning at {}: {e}", dir.join(name).display()),
    })
}

/// Loads both objects (one BTF parse: aya's loader makes it, and the observer's CO-RE
/// relocations use it; the egress object needs none) and pins everything under `dir`.
fn load(dir: &Path) -> Result<(), SharedError> {
    let rings = dir.join(RINGS);
    let lost = dir.join(LOST);
    let watched = dir.join(WATCHED);
    let mut loader = EbpfLoader::new();
    // Both objects use the observer's filter, ring buffers and loss counters: pinned by the
    // first load, opened by the second.
    loader
        .map_pin_path(RINGS, rings.as_path())
        .map_pin_path(LOST, lost.as_path())
        .map_pin_path(WATCHED, watched.as_path());
    let mut obs = loader.load(OBSERVE_OBJECT).map_err(|e| SharedError::Load {
        object: "observer",
        source: Box::new(e),
    })?;
    let perr = |op, name| {
        move |e| SharedError::Program {
            op,
            name,
            source: Box::new(e),
        }
    };
    let prog: &mut RawTracePoint = obs
        .program_mut("on_exec")
        .ok_or_else(|| SharedError::Map {
            object: "observer",
            name: "on_exec",
            detail: "program missing from the object".into(),
        })?
        .try_into()
        .map_err(perr("loading", "on_exec"))?;
    prog.load().map_err(perr("loading", "on_exec"))?;
    prog.pin(dir.join(EXEC_PROG))
        .map_err(|e| SharedError::Program {
            op: "pinning",
            name: "on_exec",
            source: Box::new(aya::programs::ProgramError::IOError(io::Error::other(
                e.to_string(),
            ))),
        })?;
    let id = prog
        .attach(EXEC_TRACEPOINT)
        .map_err(perr("attaching", "on_exec"))?;
    let link: FdLink = prog
        .take_link(id)
        .map_err(perr("attaching", "on_exec"))?
        .into();
    link.pin(dir.join(EXEC_LINK))
        .map_err(|e| SharedError::Program {
            op: "pinning the link of",
            name: "on_exec",
            source: Box::new(aya::programs::ProgramError::IOError(io::Error::other(
                e.to_string(),
            ))),
        })?;

    let mut eg = loader.load(EGRESS_OBJECT).map_err(|e| SharedError::Load {
        object: "egress",
        source: Box::new(e),
    })?;
    for hook in &HOOKS {
        let name = hook.program;
        let prog = eg.program_mut(name).ok_or_else(|| SharedError::Map {
            object: "egress",
            name,
            detail: "program missing from the object".into(),
        })?;
        let pin = dir.join(name);
        let pinned = match hook.attach {
            AttachPoint::SkbEgress | AttachPoint::SkbIngress => {
                let p: &mut CgroupSkb = prog.try_into().map_err(perr("loading", name))?;
                p.load().map_err(perr("loading", name))?;
                p.pin(&pin)
            }
            _ => {
                let p: &mut CgroupSockAddr = prog.try_into().map_err(perr("loading", name))?;
                p.load().map_err(perr("loading", name))?;
                p.pin(&pin)
            }
        };
        pinned.map_err(|e| SharedError::Program {
            op: "pinning",
            name,
            source: Box::new(aya::programs::ProgramError::IOError(io::Error::other(
                e.to_string(),
            ))),
        })?;
    }
    // Maps are taken (and their descriptors closed) only after the programs that refer to them
    // by descriptor are loaded.
    pin_map(&mut eg, "egress", RUN_OF, dir)?;
    for name in OUTER {
        pin_map(&mut eg, "egress", name, dir)?;
    }
    // The owner maps are cordon's own (no program uses them).
    for name in [RING_OWNER, EGRESS_OWNER] {
        let fd = sys::map_create(&owner_spec(), name).map_err(|e| SharedError::Map {
            object: "shared",
            name,
            detail: e.to_string(),
        })?;
        sys::obj_pin(fd.as_fd(), &dir.join(name))
            .map_err(SharedError::io("pinning", &dir.join(name)))?;
    }
    Ok(())
}

fn open_pin(dir: &Path, name: &str) -> Result<(PathBuf, OwnedFd), SharedError> {
    let path = dir.join(name);
    match sys::obj_get(&path) {
        Ok(fd) => Ok((path, fd)),
        Err(source) => Err(SharedError::Damaged { path, source }),
    }
}

fn open_map(dir: &Path, name: &str, spec: &MapSpec) -> Result<RawMap, SharedError> {
    let (path, fd) = open_pin(dir, name)?;
    let map = RawMap::from_fd(fd).map_err(|source| SharedError::Damaged {
        path: path.clone(),
        source,
    })?;
    check_map(&path, map.info(), spec)?;
    Ok(map)
}

fn check_map(path: &Path, info: &MapInfo, spec: &MapSpec) -> Result<(), SharedError> {
    if info.matches(spec) {
        return Ok(());
    }
    Err(SharedError::Mismatch {
        path: path.to_path_buf(),
        detail: format!("map {info:?}, expected {spec:?}"),
    })
}

fn mismatch(path: &Path, detail: String) -> SharedError {
    SharedError::Mismatch {
        path: path.to_path_buf(),
        detail,
    }
}

/// What a run's observer uses of the generation.
#[derive(Debug)]
pub(crate) struct ObserverShared {
    /// The exec link, opened from its pin: while this descriptor lives, the link does.
    pub link: OwnedFd,
    /// Its id.
    pub link_id: u32,
    /// The program it runs (the pinned one).
    pub prog_id: u32,
    /// cgroup id -> slot.
    pub watched: RawMap,
    /// cgroup id -> events lost.
    pub lost: RawMap,
    /// The ring buffers and their owners.
    pub rings: Pool<1>,
}

impl Generation {
    /// Opens and checks the observer's part.
    pub(crate) fn observer(&self) -> Result<ObserverShared, SharedError> {
        let dir = &self.dir;
        let watched = open_map(dir, WATCHED, &watched_spec())?;
        let rings = open_map(dir, RINGS, &outer_spec())?;
        let lost = open_map(dir, LOST, &lost_spec())?;
        let owner = open_map(dir, RING_OWNER, &owner_spec())?;
        let (prog_path, prog) = open_pin(dir, EXEC_PROG)?;
        let info = sys::prog_info(prog.as_fd()).map_err(|source| SharedError::Damaged {
            path: prog_path.clone(),
            source,
        })?;
        if info.prog_type != BPF_PROG_TYPE_RAW_TRACEPOINT || info.name != "on_exec" {
            return Err(mismatch(
                &prog_path,
                format!("program {:?} of type {}", info.name, info.prog_type),
            ));
        }
        for m in [&watched, &rings, &lost] {
            if !info.map_ids.contains(&m.id()) {
                return Err(mismatch(
                    &prog_path,
                    format!(
                        "the program does not use the pinned map {} (id {}; it uses {:?})",
                        m.info().name,
                        m.id(),
                        info.map_ids
                    ),
                ));
            }
        }
        let (link_path, link) = open_pin(dir, EXEC_LINK)?;
        let l = sys::raw_tp_link_info(link.as_fd()).map_err(|source| SharedError::Damaged {
            path: link_path.clone(),
            source,
        })?;
        if l.link_type != sys::LINK_TYPE_RAW_TRACEPOINT
            || l.prog_id != info.id
            || l.tp_name != EXEC_TRACEPOINT
        {
            return Err(mismatch(
                &link_path,
                format!(
                    "link of type {} runs program {} on {:?} (expected program {} on {EXEC_TRACEPOINT})",
                    l.link_type, l.prog_id, l.tp_name, info.id
                ),
            ));
        }
        Ok(ObserverShared {
            link,
            link_id: l.link_id,
            prog_id: info.id,
            watched,
            lost,
            rings: Pool {
                what: "ring buffer",
                outer: [rings],
                owner,
                inner: [("events", ring_spec())],
            },
        })
    }

    /// Opens and checks the egress part.
    pub(crate) fn egress(&self) -> Result<EgressShared, SharedError> {
        let dir = &self.dir;
        let run_of = open_map(dir, RUN_OF, &run_of_spec())?;
        let watched = open_map(dir, WATCHED, &watched_spec())?;
        let owner = open_map(dir, EGRESS_OWNER, &owner_spec())?;
        let mut outer = Vec::with_capacity(OUTER.len());
        for name in OUTER {
            outer.push(open_map(dir, name, &outer_spec())?);
        }
        let outer: [RawMap; 4] = outer
            .try_into()
            .unwrap_or_else(|_| unreachable!("four maps were opened"));
        let expected = crate::tags::egress_tags();
        let mut progs = Vec::with_capacity(HOOKS.len());
        for hook in &HOOKS {
            let (path, fd) = open_pin(dir, hook.program)?;
            let info = sys::prog_info(fd.as_fd()).map_err(|source| SharedError::Damaged {
                path: path.clone(),
                source,
            })?;
            let want_type = match hook.attach {
                AttachPoint::SkbEgress | AttachPoint::SkbIngress => BPF_PROG_TYPE_CGROUP_SKB,
                _ => BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            };
            if info.prog_type != want_type || info.name != hook.program {
                return Err(mismatch(
                    &path,
                    format!("program {:?} of type {}", info.name, info.prog_type),
                ));
            }
            // Every program reads the storage and the control arrays; the address hooks also
            // deliver events through the observer's filter.
            let mut uses = vec![run_of.id(), outer[2].id()];
            if !matches!(
                hook.attach,
                AttachPoint::SkbEgress | AttachPoint::SkbIngress
            ) {
                uses.push(watched.id());
            }
            if let Some(missing) = uses.iter().find(|id| !info.map_ids.contains(id)) {
                return Err(mismatch(
                    &path,
                    format!(
                        "the program does not use the pinned map {missing} (it uses {:?})",
                        info.map_ids
                    ),
                ));
            }
            match expected.as_ref().map(|t| t.get(hook.program)) {
                Ok(Some(tag)) if tag.matches(&info.tag) => {}
                Ok(tag) => {
                    return Err(mismatch(
                        &path,
                        format!(
                            "its instructions (tag {}) are not this build's (tag {})",
                            hex(&info.tag),
                            tag.map_or_else(|| "unknown".into(), |t| hex(&t.sha256))
                        ),
                    ));
                }
                Err(e) => {
                    return Err(mismatch(
                        &path,
                        format!("this build's tags cannot be computed: {e}"),
                    ));
                }
            }
            progs.push(SharedProg {
                hook,
                fd,
                id: info.id,
            });
        }
        Ok(EgressShared {
            progs,
            run_of,
            slots: Pool {
                what: "egress",
                outer,
                owner,
                inner: EGRESS_INNER,
            },
        })
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A run's own egress maps, in the order of [`OUTER`]: their pin names and how they are made.
pub(crate) const EGRESS_INNER: [(&str, MapSpec); 4] = [
    (
        "allow4",
        MapSpec {
            map_type: MapType::LpmTrie,
            key_size: 8,
            value_size: wire::size_u32(wire::ALLOW_VAL_LEN),
            max_entries: wire::size_u32(wire::MAX_PREFIXES),
            flags: sys::BPF_F_NO_PREALLOC,
        },
    ),
    (
        "allow6",
        MapSpec {
            map_type: MapType::LpmTrie,
            key_size: 20,
            value_size: wire::size_u32(wire::ALLOW_VAL_LEN),
            max_entries: wire::size_u32(wire::MAX_PREFIXES),
            flags: sys::BPF_F_NO_PREALLOC,
        },
    ),
    (
        "control",
        MapSpec {
            map_type: MapType::Array,
            key_size: 4,
            value_size: 4,
            max_entries: wire::CONTROL_LEN,
            flags: 0,
        },
    ),
    (
        "stats",
        MapSpec {
            map_type: MapType::Array,
            key_size: 4,
            value_size: 8,
            max_entries: wire::STATS_LEN,
            flags: 0,
        },
    ),
];

/// Slots of `N` map-in-maps that are used together, and their owner map (slot -> cgroup id).
#[derive(Debug)]
pub(crate) struct Pool<const N: usize> {
    /// What the slots hold (for messages).
    pub what: &'static str,
    /// The map-in-maps.
    pub outer: [RawMap; N],
    /// slot -> cgroup id of the run using it.
    pub owner: RawMap,
    /// How each inner map is named and made.
    pub inner: [(&'static str, MapSpec); N],
}

/// A slot claimed for a run.
#[derive(Debug)]
pub(crate) struct Claimed<const N: usize> {
    /// Its index.
    pub slot: u32,
    /// The maps at it, in the pool's order.
    pub maps: [RawMap; N],
    /// Whether the maps were made now (else they were an earlier run's, to be emptied).
    pub fresh: bool,
}

impl<const N: usize> Pool<N> {
    fn err(&self, op: &'static str, slot: u32) -> impl FnOnce(io::Error) -> SharedError + '_ {
        move |source| SharedError::Bpf {
            op,
            what: format!("{} slot {slot}", self.what),
            source,
        }
    }

    /// Claims a free slot for the run of cgroup `cgroup_id`: the first slot whose owner entry
    /// this call creates (`BPF_NOEXIST`, atomic between processes). Its maps are reused if the
    /// slot exists, else made and entered (the one case that pays map-in-map waits).
    pub(crate) fn claim(&self, cgroup_id: u64) -> Result<Claimed<N>, SharedError> {
        for slot in 0..wire::MAX_RUNS {
            match self.owner.update(
                &slot.to_ne_bytes(),
                &cgroup_id.to_ne_bytes(),
                sys::BPF_NOEXIST,
            ) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                Err(e) => return Err(self.err("claiming", slot)(e)),
            }
            match self.fill(slot) {
                Ok(c) => return Ok(c),
                Err(e) => {
                    let _ = self.owner.delete(&slot.to_ne_bytes());
                    return Err(e);
                }
            }
        }
        Err(SharedError::Full(wire::MAX_RUNS, self.what))
    }

    /// The maps at a claimed slot: opened by id where present, made and entered where not.
    fn fill(&self, slot: u32) -> Result<Claimed<N>, SharedError> {
        let mut maps: Vec<Option<RawMap>> = Vec::with_capacity(N);
        for outer in &self.outer {
            maps.push(
                match outer.slot_id(slot).map_err(self.err("reading", slot))? {
                    Some(id) => Some(
                        sys::map_by_id(id)
                            .and_then(RawMap::from_fd)
                            .map_err(self.err("opening a map of", slot))?,
                    ),
                    None => None,
                },
            );
        }
        let fresh = maps.iter().any(Option::is_none);
        if fresh {
            let made = self.make(slot, &maps)?;
            for (m, new) in maps.iter_mut().zip(made) {
                if m.is_none() {
                    *m = new;
                }
            }
        }
        let mut out = Vec::with_capacity(N);
        for (map, (name, spec)) in maps.into_iter().zip(&self.inner) {
            let map = map.ok_or_else(|| SharedError::Bpf {
                op: "making",
                what: format!("{name} of {} slot {slot}", self.what),
                source: io::Error::other("no map"),
            })?;
            if !map.info().matches(spec) {
                return Err(SharedError::Mismatch {
                    path: PathBuf::from(format!("{} slot {slot} ({name})", self.what)),
                    detail: format!("map {:?}, expected {spec:?}", map.info()),
                });
            }
            out.push(map);
        }
        let maps: [RawMap; N] = out
            .try_into()
            .unwrap_or_else(|_| unreachable!("one map per outer map"));
        Ok(Claimed { slot, maps, fresh })
    }

    /// Makes the maps missing at `slot` and enters them. Each entry waits for an RCU grace
    /// period in the kernel; made from one thread per map, the waits overlap (one grace period
    /// serves them all).
    fn make(&self, slot: u32, have: &[Option<RawMap>]) -> Result<Vec<Option<RawMap>>, SharedError> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .outer
                .iter()
                .zip(&self.inner)
                .zip(have)
                .map(|((outer, (name, spec)), had)| {
                    (had.is_none()).then(|| {
                        scope.spawn(move || -> Result<RawMap, SharedError> {
                            let err = |op| {
                                move |source: io::Error| SharedError::Bpf {
                                    op,
                                    what: format!("{name} for {} slot {slot}", self.what),
                                    source,
                                }
                            };
                            let fd = sys::map_create(spec, &format!("cordon_{name}"))
                                .map_err(|e| err("creating")(io::Error::other(e.to_string())))?;
                            outer.set_slot(slot, fd.as_fd()).map_err(err("entering"))?;
                            RawMap::from_fd(fd).map_err(err("reading"))
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h {
                    None => Ok(None),
                    Some(h) => h
                        .join()
                        .unwrap_or_else(|_| {
                            Err(SharedError::Bpf {
                                op: "making",
                                what: format!("{} slot {slot}", self.what),
                                source: io::Error::other("the thread panicked"),
                            })
                        })
                        .map(Some),
                })
                .collect()
        })
    }

    /// Makes slot 0 (free) if it does not exist, so that the first runs find one.
    pub(crate) fn prefill(&self) -> Result<(), SharedError> {
        let have: Vec<Option<RawMap>> = self
            .outer
            .iter()
            .map(|o| {
                o.slot_id(0)
                    .ok()
                    .flatten()
                    .and_then(|id| sys::map_by_id(id).and_then(RawMap::from_fd).ok())
            })
            .collect();
        if have.iter().any(Option::is_none) {
            self.make(0, &have)?;
        }
        Ok(())
    }

    /// Frees `slot` if the run of `cgroup_id` still owns it.
    pub(crate) fn release(&self, slot: u32, cgroup_id: u64) {
        if self.owner.get_u64_at_u32(slot).ok().flatten() == Some(cgroup_id) {
            let _ = self.owner.delete(&slot.to_ne_bytes());
        }
    }

    /// Whether the run of `cgroup_id` owns `slot` and the maps there are `ids`.
    pub(crate) fn check(&self, slot: u32, cgroup_id: u64, ids: &[u32; N]) -> Vec<String> {
        let mut problems = Vec::new();
        match self.owner.get_u64_at_u32(slot) {
            Ok(Some(c)) if c == cgroup_id => {}
            Ok(other) => problems.push(format!(
                "{} slot {slot}: owned by cgroup {other:?} (expected {cgroup_id})",
                self.what
            )),
            Err(e) => problems.push(format!("{} slot {slot}: {e}", self.what)),
        }
        for (i, outer) in self.outer.iter().enumerate() {
            let name = self.inner[i].0;
            match outer.slot_id(slot) {
                Ok(Some(id)) if id == ids[i] => {}
                Ok(other) => problems.push(format!(
                    "{}: slot {slot} holds map {other:?} (expected this run's {name} {})",
                    outer.info().name,
                    ids[i]
                )),
                Err(e) => problems.push(format!("{}: {e}", outer.info().name)),
            }
        }
        problems
    }
}

/// One shared egress program.
#[derive(Debug)]
pub(crate) struct SharedProg {
    /// Its hook.
    pub hook: &'static crate::egress::HookSpec,
    /// Its descriptor (to attach).
    pub fd: OwnedFd,
    /// Its id.
    pub id: u32,
}

/// What a run's egress uses of the generation.
#[derive(Debug)]
pub(crate) struct EgressShared {
    /// The programs, in [`HOOKS`] order.
    pub progs: Vec<SharedProg>,
    /// The attachments' cgroup storage.
    pub run_of: RawMap,
    /// The slots of `allow4_of`, `allow6_of`, `control_of`, `stats_of`.
    pub slots: Pool<4>,
}

/// The name of the marker directory a run's part directory holds: its cgroup id, which
/// [`crate::cleanup_stale`] needs once the cgroup (and so its links' report of it) is gone.
pub(crate) fn marker(cgroup_id: u64) -> String {
    format!("cgroup-{cgroup_id}")
}

/// The cgroup id recorded in a part directory by [`marker`].
pub(crate) fn read_marker(part: &Path) -> Option<u64> {
    fs::read_dir(part).ok()?.flatten().find_map(|e| {
        e.file_name()
            .to_str()?
            .strip_prefix("cgroup-")?
            .parse()
            .ok()
    })
}

/// What the shared maps of this build's generation hold: for inspection and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedState {
    /// The generation directory.
    pub dir: PathBuf,
    /// The exec link's id and the id of the program it runs.
    pub exec_link: (u32, u32),
    /// The egress programs' ids, by name.
    pub egress_progs: Vec<(&'static str, u32)>,
    /// Cgroups in the observer's filter, with their ring slots.
    pub watched: Vec<(u64, u32)>,
    /// Cgroups with a loss counter.
    pub lost: Vec<u64>,
    /// Ring buffer slots in use, with the cgroup of their run.
    pub ring_owners: Vec<(u32, u64)>,
    /// Ring buffer slots made (in use or free).
    pub ring_slots: u32,
    /// Egress slots in use, with the cgroup of their run.
    pub egress_owners: Vec<(u32, u64)>,
    /// Egress slots made (in use or free).
    pub egress_slots: u32,
}

fn owners<const N: usize>(pool: &Pool<N>) -> Result<Vec<(u32, u64)>, SharedError> {
    let mut out: Vec<(u32, u64)> = pool
        .owner
        .keys_u32()
        .map_err(pool.err("listing", 0))?
        .into_iter()
        .filter_map(|s| pool.owner.get_u64_at_u32(s).ok().flatten().map(|c| (s, c)))
        .collect();
    out.sort_unstable();
    Ok(out)
}

fn made<const N: usize>(pool: &Pool<N>) -> u32 {
    (0..wire::MAX_RUNS)
        .find(|s| pool.outer[0].slot_id(*s).ok().flatten().is_none())
        .unwrap_or(wire::MAX_RUNS)
}

/// Reads this build's generation under `root` without changing anything; `None` if there is
/// none yet.
pub fn state(root: &Path) -> Result<Option<SharedState>, SharedError> {
    let dir = generation_dir(root);
    if !dir.exists() {
        return Ok(None);
    }
    let lock = open_dir(&dir).map_err(SharedError::io("opening", &dir))?;
    flock(&lock, libc::LOCK_SH).map_err(SharedError::io("locking", &dir))?;
    let generation = Generation { dir, _lock: lock };
    let o = generation.observer()?;
    let e = generation.egress()?;
    let dir = generation.dir.clone();
    let io = |name: &str| SharedError::io("listing", &dir.join(name));
    let mut watched: Vec<(u64, u32)> = o
        .watched
        .keys_u64()
        .map_err(io(WATCHED))?
        .into_iter()
        .filter_map(|c| o.watched.get_u32_at_u64(c).ok().flatten().map(|s| (c, s)))
        .collect();
    watched.sort_unstable();
    let mut lost = o.lost.keys_u64().map_err(io(LOST))?;
    lost.sort_unstable();
    Ok(Some(SharedState {
        exec_link: (o.link_id, o.prog_id),
        egress_progs: e.progs.iter().map(|p| (p.hook.program, p.id)).collect(),
        watched,
        lost,
        ring_owners: owners(&o.rings)?,
        ring_slots: made(&o.rings),
        egress_owners: owners(&e.slots)?,
        egress_slots: made(&e.slots),
        dir: generation.dir.clone(),
    }))
}

/// Every generation directory under `root` (this build's and others'), for cleaning.
fn generations(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(shared_dir(root)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with("tmp-"))
        })
        .collect()
}

/// Takes the stale observer of cgroup `cgroup_id` out of every generation present: its filter
/// entry, its counter, its ring buffer slot.
pub(crate) fn forget_observer(root: &Path, cgroup_id: u64) {
    for dir in generations(root) {
        let key = cgroup_id.to_ne_bytes();
        if let Ok(m) = RawMap::open(&dir.join(WATCHED)) {
            let _ = m.delete(&key);
        }
        if let Ok(m) = RawMap::open(&dir.join(LOST)) {
            let _ = m.delete(&key);
        }
        if let Ok(owner) = RawMap::open(&dir.join(RING_OWNER)) {
            for slot in owner.keys_u32().unwrap_or_default() {
                if owner.get_u64_at_u32(slot).ok().flatten() == Some(cgroup_id) {
                    let _ = owner.delete(&slot.to_ne_bytes());
                }
            }
        }
    }
}

/// Frees the egress slot of the stale run of cgroup `cgroup_id` (whose links are detached) in
/// every generation present: its storage is marked invalid and its control array blocked
/// before the slot is freed, so nothing can run on it half-reset.
pub(crate) fn forget_egress(root: &Path, cgroup_id: u64) {
    for dir in generations(root) {
        if let Ok(run_of) = RawMap::open(&dir.join(RUN_OF)) {
            let _ = run_of.update(
                &cgroup_id.to_ne_bytes(),
                &[0u8; RUN_REF_LEN],
                sys::BPF_EXIST,
            );
        }
        let (Ok(owner), Ok(control_of)) = (
            RawMap::open(&dir.join(EGRESS_OWNER)),
            RawMap::open(&dir.join(OUTER[2])),
        ) else {
            continue;
        };
        for slot in owner.keys_u32().unwrap_or_default() {
            if owner.get_u64_at_u32(slot).ok().flatten() != Some(cgroup_id) {
                continue;
            }
            if let Some(control) = control_of
                .slot_id(slot)
                .ok()
                .flatten()
                .and_then(|id| sys::map_by_id(id).and_then(RawMap::from_fd).ok())
            {
                let _ = control.update(
                    &wire::CONTROL_BLOCKED.to_ne_bytes(),
                    &1u32.to_ne_bytes(),
                    sys::BPF_ANY,
                );
            }
            let _ = owner.delete(&slot.to_ne_bytes());
        }
    }
}
