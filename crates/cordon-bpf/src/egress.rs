//! Egress control of one run's cgroup: load a fresh copy of `bpf/egress.bpf.c` (maps private
//! to the run), fill the allowlist tries, attach the six programs to the cgroup, pin their
//! links and the control map under `/sys/fs/bpf/cordon/<run_id>/egress/`.
//!
//! Fail closed: if any step of [`Egress::attach`] fails, everything attached so far is
//! detached and the pins removed before the error returns. Block-all is one map write.
//! Dropping an [`Egress`] leaves the pins — and so the boundary — in place; [`Egress::release`]
//! removes them.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, Map, MapData};
use aya::programs::links::FdLink;
use aya::programs::{CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, CgroupSockAddr};
use aya::{Ebpf, EbpfLoader};

use crate::allowlist::{Allow, AllowlistError, Tries};
use crate::bpffs::{self, BpffsError, Mounted};
use crate::observer::Observer;
use crate::probe::{self, Probe, ProbeKind, ProbeResult};
use crate::sys::{self, AttachPoint};
use crate::wire::{self, ALLOW_VAL_LEN, AllowVal};
use crate::{EGRESS_OBJECT, Verification};

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
    /// Loading the object (maps, BTF) failed.
    #[error("loading the egress object: {0}")]
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
    /// A program is missing from the object.
    #[error("program {0} is missing from the egress object")]
    MissingProgram(&'static str),
    /// Loading (verifying) a program failed.
    #[error("loading program {name}: {source}")]
    LoadProgram {
        /// The program.
        name: &'static str,
        /// Why (the verifier log is inside).
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// Attaching a program to the cgroup failed.
    #[error("attaching {name} to {path}: {source}")]
    Attach {
        /// The program.
        name: &'static str,
        /// The cgroup.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// Pinning a link or map failed.
    #[error("pinning {name} at {path}: {source}")]
    Pin {
        /// The link or map.
        name: &'static str,
        /// The pin path.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<aya::pin::PinError>,
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
    /// The link, opened from its pin (keeps it alive even if the pin is removed by others).
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
    /// Keeps the programs loaded for as long as the handle lives.
    _bpf: Ebpf,
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
        let cgroup_id = std::fs::metadata(cgroup_dir)
            .map_err(|source| EgressError::Cgroup {
                path: cgroup_dir.to_path_buf(),
                source,
            })?
            .ino();
        let cgroup_fd = sys::open_cgroup(cgroup_dir)?;
        let mounted = bpffs::ensure_mounted(root)?;
        let (dir, lock) = bpffs::create_part_dir(root, run_id, "egress")?;
        match Self::build(&dir, cgroup_dir, cgroup_fd, &tries, observer) {
            Ok((bpf, attached, maps)) => Ok(Egress {
                run_id: run_id.to_owned(),
                cgroup_dir: cgroup_dir.to_path_buf(),
                cgroup_id,
                pin_dir: dir,
                bpffs: mounted,
                tries,
                attached,
                control: maps.0,
                stats: maps.1,
                allow4: maps.2,
                allow6: maps.3,
                _bpf: bpf,
                _lock: lock,
                block_requested: false,
            }),
            Err(e) => {
                // Fail closed: the pins are the only references that outlive this function
                // (the links' descriptors close as `build` unwinds), so removing them detaches
                // everything that was attached.
                let _ = bpffs::remove_part_dir(&dir);
                Err(e)
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn build(
        dir: &Path,
        cgroup_dir: &Path,
        cgroup_fd: OwnedFd,
        tries: &Tries,
        observer: Option<&Observer>,
    ) -> Result<
        (
            Ebpf,
            Vec<Attached>,
            (
                Array<MapData, u32>,
                Array<MapData, u64>,
                LpmTrie<MapData, [u8; 4], [u8; ALLOW_VAL_LEN]>,
                LpmTrie<MapData, [u8; 16], [u8; ALLOW_VAL_LEN]>,
            ),
        ),
        EgressError,
    > {
        let mut loader = EbpfLoader::new();
        if let Some(obs) = observer {
            loader
                .map_pin_path("events", obs.events_pin())
                .map_pin_path("lost", obs.lost_pin());
        }
        let mut bpf = loader
            .load(EGRESS_OBJECT)
            .map_err(|e| EgressError::Load(Box::new(e)))?;

        // Maps first: the programs must never run over an empty allowlist or control map.
        // Each map is pinned as it is taken, so `block_pinned` and inspection find it.
        let take = |bpf: &mut Ebpf, name: &'static str| -> Result<Map, EgressError> {
            let map = bpf.take_map(name).ok_or(EgressError::Map {
                name,
                source: Box::new(aya::maps::MapError::InvalidName {
                    name: name.to_owned(),
                }),
            })?;
            map.pin(dir.join(name)).map_err(|source| EgressError::Pin {
                name,
                path: dir.join(name),
                source: Box::new(source),
            })?;
            Ok(map)
        };
        let mut allow4: LpmTrie<MapData, [u8; 4], [u8; ALLOW_VAL_LEN]> =
            LpmTrie::try_from(take(&mut bpf, "allow4")?).map_err(map_err("allow4"))?;
        let mut allow6: LpmTrie<MapData, [u8; 16], [u8; ALLOW_VAL_LEN]> =
            LpmTrie::try_from(take(&mut bpf, "allow6")?).map_err(map_err("allow6"))?;
        let mut control: Array<MapData, u32> =
            Array::try_from(take(&mut bpf, "control")?).map_err(map_err("control"))?;
        let stats: Array<MapData, u64> =
            Array::try_from(take(&mut bpf, "stats")?).map_err(map_err("stats"))?;
        for ((addr, prefix), val) in &tries.v4 {
            allow4
                .insert(&Key::new(u32::from(*prefix), *addr), val.encode(), 0)
                .map_err(access_err("inserting into", "allow4"))?;
        }
        for ((addr, prefix), val) in &tries.v6 {
            allow6
                .insert(&Key::new(u32::from(*prefix), *addr), val.encode(), 0)
                .map_err(access_err("inserting into", "allow6"))?;
        }
        control
            .set(wire::CONTROL_BLOCKED, 0, 0)
            .map_err(access_err("writing", "control"))?;
        control
            .set(wire::CONTROL_EMIT_EVENTS, u32::from(observer.is_some()), 0)
            .map_err(access_err("writing", "control"))?;

        let mut attached = Vec::new();
        for hook in &HOOKS {
            let prog = bpf
                .program_mut(hook.program)
                .ok_or(EgressError::MissingProgram(hook.program))?;
            let load_err = |source| EgressError::LoadProgram {
                name: hook.program,
                source: Box::new(source),
            };
            let attach_err = |source| EgressError::Attach {
                name: hook.program,
                path: cgroup_dir.to_path_buf(),
                source: Box::new(source),
            };
            // Links created with BPF_LINK_CREATE are always "multi" on cgroups: the run's
            // programs add to those of the host's ancestors, never replace them, and a child
            // cgroup cannot override them.
            let link: FdLink = match hook.attach {
                AttachPoint::SkbEgress | AttachPoint::SkbIngress => {
                    let p: &mut CgroupSkb = prog.try_into().map_err(load_err)?;
                    p.load().map_err(load_err)?;
                    let at = if hook.attach == AttachPoint::SkbEgress {
                        CgroupSkbAttachType::Egress
                    } else {
                        CgroupSkbAttachType::Ingress
                    };
                    let id = p
                        .attach(cgroup_fd.as_fd(), at, CgroupAttachMode::Single)
                        .map_err(attach_err)?;
                    p.take_link(id).map_err(attach_err)?.try_into().map_err(
                        |e: aya::programs::links::LinkError| {
                            attach_err(aya::programs::ProgramError::IOError(io::Error::other(
                                e.to_string(),
                            )))
                        },
                    )?
                }
                _ => {
                    let p: &mut CgroupSockAddr = prog.try_into().map_err(load_err)?;
                    p.load().map_err(load_err)?;
                    let id = p
                        .attach(cgroup_fd.as_fd(), CgroupAttachMode::Single)
                        .map_err(attach_err)?;
                    p.take_link(id).map_err(attach_err)?.try_into().map_err(
                        |e: aya::programs::links::LinkError| {
                            attach_err(aya::programs::ProgramError::IOError(io::Error::other(
                                e.to_string(),
                            )))
                        },
                    )?
                }
            };
            let pin = dir.join(hook.program);
            link.pin(&pin).map_err(|source| EgressError::Pin {
                name: hook.program,
                path: pin.clone(),
                source: Box::new(source),
            })?;
            let link = sys::obj_get(&pin).map_err(|source| EgressError::OpenPin {
                path: pin.clone(),
                source,
            })?;
            let info = sys::cgroup_link_info(link.as_fd())?;
            attached.push(Attached {
                hook,
                prog_id: info.prog_id,
                pin,
                link,
            });
        }
        Ok((bpf, attached, (control, stats, allow4, allow6)))
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

    /// Whether bpffs was already mounted or mounted by this attach.
    pub fn bpffs(&self) -> Mounted {
        self.bpffs
    }

    /// The ids of the programs attached, by program name (`connect4`, `skb_egress`, ...).
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
    /// that every pinned link still reports this cgroup and program, that the tries hold
    /// exactly the allowlist, and that block-all, once set by this handle, is still set.
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
        let probes = self.probe_destinations();
        if probes.is_empty() {
            return Verification::from_problems(
                vec!["no local destination outside the allowlist to probe (127.0.0.0/8 and ::1 are allowed)".into()],
                String::new(),
                None,
            );
        }
        match probe::connect_probes(&self.cgroup_dir, &probes, Duration::from_secs(5)) {
            Ok(run) => {
                let mut problems = Vec::new();
                let mut shown = Vec::new();
                for (p, r) in probes.iter().zip(&run.results) {
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

    /// Detaches the programs and removes the pins (`<root>/cordon/<run_id>/egress`, and the run
    /// directory when nothing else is left in it).
    pub fn release(self) -> Result<(), EgressError> {
        let dir = self.pin_dir.clone();
        // The links die when their last reference goes: the pins (removed here) and the
        // descriptors held by `self` (dropped here). Detach explicitly too, so that nothing
        // that still holds a descriptor (a crashed probe, a copy) keeps the programs running.
        for a in &self.attached {
            let _ = sys::link_detach(a.link.as_fd());
        }
        drop(self);
        bpffs::remove_part_dir(&dir)?;
        Ok(())
    }
}

/// A prefix length read back from a trie (≤ 128); an impossible one reads as 255, which no
/// written entry has, so a comparison with the written tries fails.
fn prefix_u8(len: u32) -> u8 {
    u8::try_from(len).unwrap_or(u8::MAX)
}

/// Sets block-all for a pinned run from any process (cordon's own handle may be gone): opens
/// `<root>/cordon/<run_id>/egress/control` and writes the flag.
pub fn block_pinned(root: &Path, run_id: &str) -> Result<(), EgressError> {
    bpffs::check_run_id(run_id)?;
    let path = pin_dir(root, run_id).join("control");
    let data = MapData::from_pin(&path).map_err(access_err("opening", "control"))?;
    let mut control: Array<MapData, u32> =
        Array::try_from(Map::Array(data)).map_err(map_err("control"))?;
    control
        .set(wire::CONTROL_BLOCKED, 1, 0)
        .map_err(access_err("writing", "control"))
}
