//! Egress control of one run's cgroup. The six programs of `bpf/egress.bpf.c` are loaded once
//! per boot and shared by every run ([`crate::shared`]); a run claims a slot of the shared
//! map-in-maps, fills the maps at it (the allowlist tries, the control array, counters),
//! attaches the shared programs to its cgroup with six links, and names its slot in the
//! attachments' cgroup storage, so the programs use its maps. Links and maps are pinned under
//! `/sys/fs/bpf/cordon/<run_id>/egress/`.
//!
//! Fail closed: the maps are filled before any program is attached (and until the storage
//! names the slot, its programs match no run and refuse everything); if any step of
//! [`Egress::attach`] fails, everything attached so far is detached, the entries removed and
//! the pins removed before the error returns. Block-all is one map write. Dropping an
//! [`Egress`] leaves the pins — and so the boundary — in place; [`Egress::release`] removes them.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{Array, Map, MapData};

use crate::Verification;
use crate::allowlist::{Allow, AllowlistError, Tries};
use crate::bpffs::{self, BpffsError, Mounted};
use crate::observer::Observer;
use crate::probe::{self, Probe, ProbeKind, ProbeResult};
use crate::shared::{self, EgressShared, Generation, SharedError};
use crate::sys::{self, AttachPoint, RawMap, SysError};
use crate::wire::{self, ALLOW_VAL_LEN, AllowVal};

/// One program of the egress object and where it attaches.
#[derive(Debug)]
pub(crate) struct HookSpec {
    /// The C function (the program's name and its pin's file name).
    pub program: &'static str,
    /// Where it attaches.
    pub attach: AttachPoint,
}

/// The programs, in attach order: the skb backstop first, so that no moment exists in which
/// the address hooks are in force but raw packets are not filtered.
pub(crate) const HOOKS: [HookSpec; 6] = [
    HookSpec {
        program: "skb_egress",
        attach: AttachPoint::SkbEgress,
    },
    HookSpec {
        program: "skb_ingress",
        attach: AttachPoint::SkbIngress,
    },
    HookSpec {
        program: "connect4",
        attach: AttachPoint::Connect4,
    },
    HookSpec {
        program: "connect6",
        attach: AttachPoint::Connect6,
    },
    HookSpec {
        program: "sendmsg4",
        attach: AttachPoint::Sendmsg4,
    },
    HookSpec {
        program: "sendmsg6",
        attach: AttachPoint::Sendmsg6,
    },
];

/// Errors of egress control, each naming the operation and its object.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The allowlist cannot be represented.
    #[error("allowlist: {0}")]
    Allowlist(#[from] AllowlistError),
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
    /// A map is missing or has the wrong type.
    #[error("map {name}: {source}")]
    Map {
        /// The map.
        name: &'static str,
        /// Why.
        #[source]
        source: Box<aya::maps::MapError>,
    },
    /// Attaching a program to the cgroup failed.
    #[error("attaching {name} to {path}: {source}")]
    Attach {
        /// The program.
        name: &'static str,
        /// The cgroup.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The cgroup already has the egress control of another live run.
    #[error("cgroup {cgroup_id} ({path}) already has the egress control of another run")]
    CgroupInUse {
        /// The cgroup's id.
        cgroup_id: u64,
        /// Its directory.
        path: PathBuf,
    },
    /// The observer given is under another bpffs root.
    #[error("the observer's shared objects are in {observer}, not under {root}")]
    ObserverRoot {
        /// The observer's generation directory.
        observer: PathBuf,
        /// The root asked for.
        root: PathBuf,
    },
    /// Pinning a link or map failed.
    #[error("pinning {name} at {path}: {source}")]
    Pin {
        /// The link or map.
        name: &'static str,
        /// The pin path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Opening a pinned object failed.
    #[error("opening pin {path}: {source}")]
    OpenPin {
        /// The pin path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A raw `bpf()` command failed.
    #[error(transparent)]
    Sys(#[from] sys::SysError),
    /// Reading or writing a map entry failed.
    #[error("{op} map {name}: {source}")]
    MapAccess {
        /// What was done.
        op: &'static str,
        /// The map.
        name: &'static str,
        /// Why.
        #[source]
        source: Box<aya::maps::MapError>,
    },
}

fn map_err(name: &'static str) -> impl FnOnce(aya::maps::MapError) -> EgressError {
    move |source| EgressError::Map {
        name,
        source: Box::new(source),
    }
}

fn access_err(
    op: &'static str,
    name: &'static str,
) -> impl FnOnce(aya::maps::MapError) -> EgressError {
    move |source| EgressError::MapAccess {
        op,
        name,
        source: Box::new(source),
    }
}

/// One attached program.
#[derive(Debug)]
struct Attached {
    hook: &'static HookSpec,
    prog_id: u32,
    pin: PathBuf,
    /// The link (keeps it alive even if the pin is removed by others).
    link: OwnedFd,
}

/// Counters kept by the egress programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EgressStats {
    /// Connection attempts allowed by the address hooks.
    pub connect_allowed: u64,
    /// Connection attempts refused (EPERM) by the address hooks.
    pub connect_refused: u64,
    /// Packets dropped by the egress backstop.
    pub egress_dropped: u64,
    /// Packets dropped on ingress (block-all).
    pub ingress_dropped: u64,
}

/// The egress boundary of one run. See the module documentation.
pub struct Egress {
    run_id: String,
    cgroup_dir: PathBuf,
    cgroup_id: u64,
    pin_dir: PathBuf,
    bpffs: Mounted,
    tries: Tries,
    attached: Vec<Attached>,
    control: Array<MapData, u32>,
    stats: Array<MapData, u64>,
    allow4: LpmTrie<MapData, [u8; 4], [u8; ALLOW_VAL_LEN]>,
    allow6: LpmTrie<MapData, [u8; 16], [u8; ALLOW_VAL_LEN]>,
    /// The ids of the run's maps, in [`shared::EGRESS_INNER`] order.
    inner_ids: [u32; 4],
    /// The slot they are at.
    slot: u32,
    /// The `run_ref` written to the attachments' storage.
    run_ref: [u8; shared::RUN_REF_LEN],
    shared: EgressShared,
    /// Holds the shared objects' generation (it is not retired while a handle lives).
    _generation: Generation,
    /// Marks the run as live for `cleanup_stale` in other processes.
    _lock: bpffs::RunLock,
    /// Whether this handle set block-all (verification then requires it still set).
    block_requested: bool,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("run_id", &self.run_id)
            .field("cgroup_dir", &self.cgroup_dir)
            .field("cgroup_id", &self.cgroup_id)
            .field("pin_dir", &self.pin_dir)
            .field("programs", &self.program_ids())
            .finish_non_exhaustive()
    }
}

/// Path of the run's egress pin directory under `root` (`<root>/cordon/<run_id>/egress`).
pub fn pin_dir(root: &Path, run_id: &str) -> PathBuf {
    bpffs::run_dir(root, run_id).join("egress")
}

/// The run's maps as aya handles (for the tries, the control flag and the counters).
type Typed = (
    LpmTrie<MapData, [u8; 4], [u8; ALLOW_VAL_LEN]>,
    LpmTrie<MapData, [u8; 16], [u8; ALLOW_VAL_LEN]>,
    Array<MapData, u32>,
    Array<MapData, u64>,
);

/// What `build` made, before it becomes an [`Egress`].
struct Built {
    attached: Vec<Attached>,
    typed: Typed,
    inner_ids: [u32; 4],
    slot: u32,
    run_ref: [u8; shared::RUN_REF_LEN],
}

/// The run's maps as aya handles.
fn typed(inner: Vec<OwnedFd>) -> Result<Typed, EgressError> {
    let mut it = inner.into_iter();
    let mut next = |name: &'static str| {
        let fd = it.next().ok_or(EgressError::Map {
            name,
            source: Box::new(aya::maps::MapError::InvalidName { name: name.into() }),
        })?;
        MapData::from_fd(fd).map_err(map_err(name))
    };
    let allow4 = LpmTrie::try_from(Map::LpmTrie(next("allow4")?)).map_err(map_err("allow4"))?;
    let allow6 = LpmTrie::try_from(Map::LpmTrie(next("allow6")?)).map_err(map_err("allow6"))?;
    let control = Array::try_from(Map::Array(next("control")?)).map_err(map_err("control"))?;
    let stats = Array::try_from(Map::Array(next("stats")?)).map_err(map_err("stats"))?;
    Ok((allow4, allow6, control, stats))
}

impl Egress {
    /// Attaches egress control to the cgroup (v2) directory `cgroup_dir` with bpffs at
    /// [`bpffs::DEFAULT_ROOT`] (mounted if absent). `allow` lists what the run may reach;
    /// nothing else is implicit — not loopback, not DNS. With `observer`, every connection
    /// attempt is also reported as an event in the observer's ring buffer. Needs root
    /// (`CAP_BPF`, `CAP_NET_ADMIN`, `CAP_SYS_ADMIN` for the mount).
    pub fn attach(
        run_id: &str,
        cgroup_dir: &Path,
        allow: &[Allow],
        observer: Option<&Observer>,
    ) -> Result<Egress, EgressError> {
        Self::attach_at(
            Path::new(bpffs::DEFAULT_ROOT),
            run_id,
            cgroup_dir,
            allow,
            observer,
        )
    }

    /// [`Egress::attach`] with bpffs at `root`.
    pub fn attach_at(
        root: &Path,
        run_id: &str,
        cgroup_dir: &Path,
        allow: &[Allow],
        observer: Option<&Observer>,
    ) -> Result<Egress, EgressError> {
        let tries = Tries::build(allow)?;
        bpffs::check_run_id(run_id)?;
        let cgroup_id = std::fs::metadata(cgroup_dir)
            .map_err(|source| EgressError::Cgroup {
                path: cgroup_dir.to_path_buf(),
                source,
            })?
            .ino();
        let cgroup_fd = sys::open_cgroup(cgroup_dir)?;
        let mounted = bpffs::ensure_mounted(root)?;
        // With an observer, the same generation as its own: the programs must deliver into
        // the `rings` map that holds its ring buffer.
        let (generation, shared) = match observer {
            Some(o) => {
                let generation = o
                    .generation()
                    .try_clone()
                    .map_err(|source| SharedError::Io {
                        op: "sharing the lock of",
                        path: o.generation().dir().to_path_buf(),
                        source,
                    })?;
                if generation.dir() != shared::generation_dir(root) {
                    return Err(EgressError::ObserverRoot {
                        observer: generation.dir().to_path_buf(),
                        root: root.to_path_buf(),
                    });
                }
                let shared = generation.egress()?;
                (generation, shared)
            }
            None => Generation::take(root, Generation::egress)?,
        };
        let events = observer.map_or(0, Observer::cgroup_id);
        let (dir, lock) = bpffs::create_part_dir(root, run_id, "egress")?;
        let mut built = Self::build(
            &dir, cgroup_dir, cgroup_id, &cgroup_fd, &tries, events, &shared,
        );
        if matches!(built, Err(EgressError::CgroupInUse { .. })) {
            // Perhaps a run whose cgroup lost its links left the entries: clean up once, then
            // try again.
            let _ = bpffs::cleanup_stale(root);
            built = Self::build(
                &dir, cgroup_dir, cgroup_id, &cgroup_fd, &tries, events, &shared,
            );
        }
        match built {
            Ok(b) => {
                let (allow4, allow6, control, stats) = b.typed;
                Ok(Egress {
                    run_id: run_id.to_owned(),
                    cgroup_dir: cgroup_dir.to_path_buf(),
                    cgroup_id,
                    pin_dir: dir,
                    bpffs: mounted,
                    tries,
                    attached: b.attached,
                    control,
                    stats,
                    allow4,
                    allow6,
                    inner_ids: b.inner_ids,
                    slot: b.slot,
                    run_ref: b.run_ref,
                    shared,
                    _generation: generation,
                    _lock: lock,
                    block_requested: false,
                })
            }
            Err(e) => {
                // Fail closed: `build` undid its links and entries; the pins are the only
                // references left that outlive this function.
                let _ = bpffs::remove_part_dir(&dir);
                Err(e)
            }
        }
    }

    /// Claims an egress slot and refills its maps (tries, control, counters), pins them,
    /// attaches the shared programs to the cgroup (the skb backstop first), pins the links, and
    /// names the slot in the attachments' storage. On error, undoes what it did (but the pins,
    /// which the caller removes with the directory).
    #[allow(clippy::too_many_arguments)]
    fn build(
        dir: &Path,
        cgroup_dir: &Path,
        cgroup_id: u64,
        cgroup_fd: &OwnedFd,
        tries: &Tries,
        events: u64,
        shared: &EgressShared,
    ) -> Result<Built, EgressError> {
        let key = cgroup_id.to_ne_bytes();
        // One egress per cgroup: a storage naming a slot that this cgroup's run owns means
        // another run's boundary is (or, its cordon dead, still stays) in force here.
        let mut prior = [0u8; shared::RUN_REF_LEN];
        let has_storage = shared
            .run_of
            .lookup(&key, &mut prior)
            .map_err(SysError::bpf("reading", shared::RUN_OF))?;
        if has_storage
            && let Some(slot) = shared::run_ref_slot(&prior)
            && shared.slots.owner.get_u64_at_u32(slot).ok().flatten() == Some(cgroup_id)
        {
            return Err(EgressError::CgroupInUse {
                cgroup_id,
                path: cgroup_dir.to_path_buf(),
            });
        }
        std::fs::create_dir(dir.join(shared::marker(cgroup_id))).map_err(|source| {
            EgressError::Pin {
                name: "cgroup marker",
                path: dir.join(shared::marker(cgroup_id)),
                source,
            }
        })?;
        let claimed = shared.slots.claim(cgroup_id)?;
        let slot = claimed.slot;
        let release = || shared.slots.release(slot, cgroup_id);
        let inner = claimed.maps;
        let mut inner_ids = [0u32; 4];
        for (id, map) in inner_ids.iter_mut().zip(&inner) {
            *id = map.id();
        }
        let run_ref = shared::run_ref(slot, events);
        let filled = (|| -> Result<(), EgressError> {
            // Maps first: the programs must never run over an empty allowlist or control map.
            // A reused slot is blocked while it is emptied and refilled.
            let [allow4, allow6, control, stats] = &inner;
            control
                .update(
                    &wire::CONTROL_BLOCKED.to_ne_bytes(),
                    &1u32.to_ne_bytes(),
                    sys::BPF_ANY,
                )
                .map_err(SysError::bpf("writing", "control"))?;
            if !claimed.fresh {
                for (map, name) in [(allow4, "allow4"), (allow6, "allow6")] {
                    for k in map.keys().map_err(SysError::bpf("listing", name))? {
                        map.delete(&k).map_err(SysError::bpf("emptying", name))?;
                    }
                }
            }
            for ((addr, prefix), val) in &tries.v4 {
                let mut k = u32::from(*prefix).to_ne_bytes().to_vec();
                k.extend_from_slice(addr);
                allow4
                    .update(&k, &val.encode(), sys::BPF_ANY)
                    .map_err(SysError::bpf("inserting into", "allow4"))?;
            }
            for ((addr, prefix), val) in &tries.v6 {
                let mut k = u32::from(*prefix).to_ne_bytes().to_vec();
                k.extend_from_slice(addr);
                allow6
                    .update(&k, &val.encode(), sys::BPF_ANY)
                    .map_err(SysError::bpf("inserting into", "allow6"))?;
            }
            for index in 0..wire::STATS_LEN {
                stats
                    .update(&index.to_ne_bytes(), &0u64.to_ne_bytes(), sys::BPF_ANY)
                    .map_err(SysError::bpf("zeroing", "stats"))?;
            }
            let emit = u32::from(events != 0);
            for (index, value) in [
                (wire::CONTROL_EMIT_EVENTS, emit),
                (wire::CONTROL_BLOCKED, 0),
            ] {
                control
                    .update(&index.to_ne_bytes(), &value.to_ne_bytes(), sys::BPF_ANY)
                    .map_err(SysError::bpf("writing", "control"))?;
            }
            // Each map is pinned in the run's directory, so `block_pinned` and inspection find
            // it.
            for ((name, _), map) in shared::EGRESS_INNER.iter().zip(&inner) {
                let pin = dir.join(name);
                sys::obj_pin(map.as_fd(), &pin).map_err(|source| EgressError::Pin {
                    name,
                    path: pin.clone(),
                    source,
                })?;
            }
            // A storage left from an earlier run of this cgroup names a slot that may be
            // another run's now: point it here before any link can use it.
            if has_storage {
                shared
                    .run_of
                    .update(&key, &run_ref, sys::BPF_EXIST)
                    .map_err(SysError::bpf("writing", shared::RUN_OF))?;
            }
            Ok(())
        })()
        .and_then(|()| typed(inner.into_iter().map(RawMap::into_fd).collect()));
        let typed = match filled {
            Ok(t) => t,
            Err(e) => {
                if has_storage {
                    let _ = shared
                        .run_of
                        .update(&key, &[0u8; shared::RUN_REF_LEN], sys::BPF_EXIST);
                }
                release();
                return Err(e);
            }
        };

        let mut attached: Vec<Attached> = Vec::new();
        let undo = |attached: &[Attached]| {
            for a in attached {
                let _ = sys::link_detach(a.link.as_fd());
            }
            // The storage names no slot again (it exists only if a link was ever attached).
            let _ = shared
                .run_of
                .update(&key, &[0u8; shared::RUN_REF_LEN], sys::BPF_EXIST);
            release();
        };
        for prog in &shared.progs {
            let hook = prog.hook;
            // Links created with BPF_LINK_CREATE are always "multi" on cgroups: the run's
            // programs add to those of the host's ancestors, never replace them, and a child
            // cgroup cannot override them.
            let link =
                match sys::link_create_cgroup(prog.fd.as_fd(), cgroup_fd.as_fd(), hook.attach) {
                    Ok(l) => l,
                    Err(source) => {
                        undo(&attached);
                        return Err(EgressError::Attach {
                            name: hook.program,
                            path: cgroup_dir.to_path_buf(),
                            source,
                        });
                    }
                };
            let pin = dir.join(hook.program);
            if let Err(source) = sys::obj_pin(link.as_fd(), &pin) {
                let _ = sys::link_detach(link.as_fd());
                undo(&attached);
                return Err(EgressError::Pin {
                    name: hook.program,
                    path: pin,
                    source,
                });
            }
            attached.push(Attached {
                hook,
                prog_id: prog.id,
                pin,
                link,
            });
        }
        // Name the slot in the attachments' storage: until now the programs matched no run (a
        // new storage is zero) or already this slot (written above).
        if let Err(e) = shared.run_of.update(&key, &run_ref, sys::BPF_EXIST) {
            undo(&attached);
            return Err(SysError::bpf("writing", shared::RUN_OF)(e).into());
        }
        Ok(Built {
            attached,
            typed,
            inner_ids,
            slot,
            run_ref,
        })
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The cgroup's id (inode number of its directory).
    pub fn cgroup_id(&self) -> u64 {
        self.cgroup_id
    }

    /// Where the links and maps are pinned.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// The slot of the shared map-in-maps that holds this run's maps.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Whether bpffs was already mounted or mounted by this attach.
    pub fn bpffs(&self) -> Mounted {
        self.bpffs
    }

    /// The ids of the programs attached, by program name (`connect4`, `skb_egress`, ...). The
    /// programs are shared by every run on the boot; the links are this run's.
    pub fn program_ids(&self) -> Vec<(&'static str, u32)> {
        self.attached
            .iter()
            .map(|a| (a.hook.program, a.prog_id))
            .collect()
    }

    /// The merged allowlist in force (what the tries should hold).
    pub fn tries(&self) -> &Tries {
        &self.tries
    }

    /// Cuts every connection of the run: from now on every address hook refuses and both skb
    /// programs drop every packet, so established connections stop at their next packet. One
    /// map write; it stays in force through the pins if cordon dies.
    pub fn block_all(&mut self) -> Result<(), EgressError> {
        self.block_requested = true;
        self.control
            .set(wire::CONTROL_BLOCKED, 1, 0)
            .map_err(access_err("writing", "control"))
    }

    /// Whether block-all is in force (read from the kernel's map).
    pub fn blocked(&self) -> Result<bool, EgressError> {
        Ok(self
            .control
            .get(&wire::CONTROL_BLOCKED, 0)
            .map_err(access_err("reading", "control"))?
            != 0)
    }

    /// The programs' counters.
    pub fn stats(&self) -> Result<EgressStats, EgressError> {
        let get = |i| {
            self.stats
                .get(&i, 0)
                .map_err(access_err("reading", "stats"))
        };
        Ok(EgressStats {
            connect_allowed: get(wire::STAT_CONNECT_ALLOWED)?,
            connect_refused: get(wire::STAT_CONNECT_REFUSED)?,
            egress_dropped: get(wire::STAT_SKB_EGRESS_DROPPED)?,
            ingress_dropped: get(wire::STAT_SKB_INGRESS_DROPPED)?,
        })
    }

    /// Both checks: [`Egress::verify_attached`] and [`Egress::verify_probe`].
    pub fn verify(&self) -> Verification {
        let attached = self.verify_attached();
        let probe = self.verify_probe();
        attached.and(probe)
    }

    /// Asks the kernel which programs are in force on the cgroup at each attach point
    /// (`BPF_PROG_QUERY`, effective) and requires this run's program ids among them; checks
    /// that every pinned link still reports this cgroup and program, that the shared maps
    /// still route this cgroup to this run's maps (and its storage names this run), that the
    /// tries hold exactly the allowlist, and that block-all, once set by this handle, is still
    /// set.
    pub fn verify_attached(&self) -> Verification {
        let mut problems = Vec::new();
        let mut seen = Vec::new();
        for a in &self.attached {
            match sys::effective_programs(&self.cgroup_dir, a.hook.attach) {
                Ok(ids) if ids.contains(&a.prog_id) => {
                    seen.push(format!("{} (prog {})", a.hook.program, a.prog_id))
                }
                Ok(ids) => problems.push(format!(
                    "{}: program {} is not in force on {} (effective: {:?})",
                    a.hook.program,
                    a.prog_id,
                    a.hook.attach.name(),
                    ids
                )),
                Err(e) => problems.push(format!("{}: {e}", a.hook.program)),
            }
            match sys::cgroup_link_info(a.link.as_fd()) {
                Ok(info) if info.cgroup_id == self.cgroup_id && info.prog_id == a.prog_id => {}
                Ok(info) => problems.push(format!(
                    "{}: link {} now runs program {} on cgroup {} (expected {} on {})",
                    a.hook.program,
                    info.link_id,
                    info.prog_id,
                    info.cgroup_id,
                    a.prog_id,
                    self.cgroup_id
                )),
                Err(e) => problems.push(format!("{}: {e}", a.hook.program)),
            }
            if !a.pin.exists() {
                problems.push(format!(
                    "{}: pin {} is gone",
                    a.hook.program,
                    a.pin.display()
                ));
            }
        }
        problems.extend(
            self.shared
                .slots
                .check(self.slot, self.cgroup_id, &self.inner_ids),
        );
        let mut run_ref = [0u8; shared::RUN_REF_LEN];
        match self
            .shared
            .run_of
            .lookup(&self.cgroup_id.to_ne_bytes(), &mut run_ref)
        {
            Ok(true) if run_ref == self.run_ref => {}
            Ok(true) => problems.push(format!(
                "run_of: the storage of cgroup {} names slot {:?} (expected {})",
                self.cgroup_id,
                shared::run_ref_slot(&run_ref),
                self.slot
            )),
            Ok(false) => problems.push(format!("run_of: cgroup {} has no storage", self.cgroup_id)),
            Err(e) => problems.push(format!("run_of: {e}")),
        }
        match self.read_tries() {
            Ok(t) if t == self.tries => {}
            Ok(t) => problems.push(format!(
                "allowlist altered: the tries hold {} IPv4 and {} IPv6 entries that differ from the {} and {} written",
                t.v4.len(),
                t.v6.len(),
                self.tries.v4.len(),
                self.tries.v6.len()
            )),
            Err(e) => problems.push(format!("allowlist unreadable: {e}")),
        }
        match self.blocked() {
            Ok(false) if self.block_requested => {
                problems.push("control: block-all was set and has been cleared".into())
            }
            Ok(blocked) => seen.push(format!("block-all {}", if blocked { "on" } else { "off" })),
            Err(e) => problems.push(format!("control unreadable: {e}")),
        }
        Verification::from_problems(
            problems,
            format!(
                "in force on cgroup {}: {}",
                self.cgroup_dir.display(),
                seen.join(", ")
            ),
            None,
        )
    }

    /// Reads both tries back from the kernel.
    pub fn read_tries(&self) -> Result<Tries, EgressError> {
        let mut t = Tries::default();
        for item in self.allow4.iter() {
            let (k, v) = item.map_err(access_err("reading", "allow4"))?;
            t.v4.insert((k.data(), prefix_u8(k.prefix_len())), AllowVal::decode(&v));
        }
        for item in self.allow6.iter() {
            let (k, v) = item.map_err(access_err("reading", "allow6"))?;
            t.v6.insert((k.data(), prefix_u8(k.prefix_len())), AllowVal::decode(&v));
        }
        Ok(t)
    }

    /// Destinations on this host that the allowlist refuses, for the active probe: never an
    /// address off the machine, so a failing boundary cannot send traffic anywhere.
    fn probe_destinations(&self) -> Vec<Probe> {
        const PORT: u16 = 9;
        let mut out = Vec::new();
        let v4 = [
            Ipv4Addr::new(127, 255, 255, 254),
            Ipv4Addr::new(127, 0, 0, 254),
            Ipv4Addr::new(127, 1, 2, 3),
            Ipv4Addr::LOCALHOST,
        ]
        .into_iter()
        .find(|a| !self.tries.permits(IpAddr::V4(*a), Some(PORT)));
        if let Some(a) = v4 {
            let dest = SocketAddr::new(IpAddr::V4(a), PORT);
            out.push(Probe {
                kind: ProbeKind::TcpConnect,
                dest,
            });
            out.push(Probe {
                kind: ProbeKind::UdpSendto,
                dest,
            });
            out.push(Probe {
                kind: ProbeKind::TcpConnect,
                dest: SocketAddr::new(IpAddr::V6(a.to_ipv6_mapped()), PORT),
            });
        }
        if !self
            .tries
            .permits(IpAddr::V6(Ipv6Addr::LOCALHOST), Some(PORT))
        {
            let dest = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), PORT);
            out.push(Probe {
                kind: ProbeKind::TcpConnect,
                dest,
            });
            out.push(Probe {
                kind: ProbeKind::UdpSendto,
                dest,
            });
        }
        out
    }

    /// An active probe: a process born in the cgroup tries TCP connects and UDP sends to local
    /// destinations the allowlist refuses (IPv4, IPv6, IPv4-mapped) and must get `EPERM` from
    /// each at once. If the allowlist admits every candidate destination, no probe is possible
    /// and verification fails rather than claim what was not shown.
    pub fn verify_probe(&self) -> Verification {
        self.start_probe().finish()
    }

    /// [`Egress::verify_probe`] in two halves: starts the probe process and returns at once, so
    /// that the caller can do other work while it runs (its cost, mostly the `fork`, is then
    /// off the critical path); [`ProbeStarted::finish`] waits for it and judges its results.
    pub fn start_probe(&self) -> ProbeStarted {
        let probes = self.probe_destinations();
        let started = if probes.is_empty() {
            Err("no local destination outside the allowlist to probe (127.0.0.0/8 and ::1 are allowed)".to_owned())
        } else {
            probe::start_connect_probes(&self.cgroup_dir, &probes, Duration::from_secs(5))
                .map_err(|e| format!("probe: {e}"))
        };
        ProbeStarted { probes, started }
    }

    /// Detaches the programs, takes the run's maps out of the shared maps, and removes the
    /// pins (`<root>/cordon/<run_id>/egress`, and the run directory when nothing else is left
    /// in it). Other runs' links and entries are untouched.
    pub fn release(mut self) -> Result<(), EgressError> {
        let dir = self.pin_dir.clone();
        // The links die when their last reference goes: the pins (removed here) and the
        // descriptors held by `self` (dropped here). Detach explicitly too, so that nothing
        // that still holds a descriptor (a crashed probe, a copy) keeps the programs running.
        for a in &self.attached {
            let _ = sys::link_detach(a.link.as_fd());
        }
        // The slot goes back to the pool blocked, its storage here naming none.
        let _ = self.shared.run_of.update(
            &self.cgroup_id.to_ne_bytes(),
            &[0u8; shared::RUN_REF_LEN],
            sys::BPF_EXIST,
        );
        let _ = self.control.set(wire::CONTROL_BLOCKED, 1, 0);
        self.shared.slots.release(self.slot, self.cgroup_id);
        drop(self);
        bpffs::remove_part_dir(&dir)?;
        Ok(())
    }
}

/// An active probe of [`Egress::start_probe`], running.
#[derive(Debug)]
pub struct ProbeStarted {
    probes: Vec<Probe>,
    started: Result<probe::Started, String>,
}

impl ProbeStarted {
    /// The probe process's pid, if it started (its connect attempts are real events of the
    /// run's cgroup).
    pub fn pid(&self) -> Option<u32> {
        self.started.as_ref().ok().map(probe::Started::pid)
    }

    /// Waits for the probe (at most 5 s from its start) and judges it: every attempt must have
    /// got `EPERM`.
    pub fn finish(self) -> Verification {
        let started = match self.started {
            Ok(s) => s,
            Err(problem) => return Verification::from_problems(vec![problem], String::new(), None),
        };
        match started.wait() {
            Ok(run) => {
                let mut problems = Vec::new();
                let mut shown = Vec::new();
                for (p, r) in self.probes.iter().zip(&run.results) {
                    let what = format!("{:?} {}", p.kind, p.dest);
                    match r {
                        ProbeResult::Failed(libc::EPERM) => shown.push(format!("{what}: EPERM")),
                        other => problems.push(format!("{what} was not refused: {other:?}")),
                    }
                }
                Verification::from_problems(
                    problems,
                    format!("probe pid {} refused: {}", run.pid, shown.join(", ")),
                    Some(run.pid),
                )
            }
            Err(e) => Verification::from_problems(vec![format!("probe: {e}")], String::new(), None),
        }
    }
}

/// A prefix length read back from a trie (≤ 128); an impossible one reads as 255, which no
/// written entry has, so a comparison with the written tries fails.
fn prefix_u8(len: u32) -> u8 {
    u8::try_from(len).unwrap_or(u8::MAX)
}

fn pinned_control(root: &Path, run_id: &str) -> Result<Array<MapData, u32>, EgressError> {
    bpffs::check_run_id(run_id)?;
    let path = pin_dir(root, run_id).join("control");
    let data = MapData::from_pin(&path).map_err(access_err("opening", "control"))?;
    Array::try_from(Map::Array(data)).map_err(map_err("control"))
}

/// Sets block-all for a pinned run from any process (cordon's own handle may be gone): opens
/// `<root>/cordon/<run_id>/egress/control` and writes the flag.
pub fn block_pinned(root: &Path, run_id: &str) -> Result<(), EgressError> {
    pinned_control(root, run_id)?
        .set(wire::CONTROL_BLOCKED, 1, 0)
        .map_err(access_err("writing", "control"))
}

/// Whether block-all is in force for a pinned run, read from its control map by any process
/// (`<root>/cordon/<run_id>/egress/control`): what [`block_pinned`] wrote, as the programs see
/// it.
pub fn pinned_blocked(root: &Path, run_id: &str) -> Result<bool, EgressError> {
    Ok(pinned_control(root, run_id)?
        .get(&wire::CONTROL_BLOCKED, 0)
        .map_err(access_err("reading", "control"))?
        != 0)
}
