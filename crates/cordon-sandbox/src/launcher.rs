//! The host side of a run: create the cgroup, clone init into new namespaces (straight into the
//! cgroup), map its identity, let it build the boundary, check the boundary from the host, let
//! the command start, supervise it (signals, limits, timeout) and tear everything down.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordon_bpf::{Allow, Egress, Event, Observer, Verification, VerifyState};
use cordon_runtime::{
    Backend, BackendError, EnforcementState, EventSink, ExitStatus, KillReason, NetPlan, Outcome,
    Plan, ProviderReport, Running, StartGate, Teardown,
};

use crate::caps::StatusCaps;
use crate::cgroup::{CgroupLimits, Layout, LayoutKind, RunCgroup};
use crate::landlock;
use crate::mounts;
use crate::netns;
use crate::proto::{GO_BUILD, GO_EXEC, INIT_ARGV0, InitConfig, Message, Ready};
use crate::state::{RunState, StateDir};
use crate::sys::{self, Cloned, clone_flags};

/// Most host-observed events recorded one by one per run; beyond it they are counted by kind
/// (and the observer reports DEGRADED), so that a command cannot grow the ledger without bound.
const EVENT_BUDGET: usize = 100_000;

/// How often limits are polled while the command runs.
const LIMIT_POLL: Duration = Duration::from_millis(50);

/// How long the launcher waits for init's exit awake, once init has reported the command's
/// (`sys::spin_until_readable`), before it sleeps on it.
const INIT_EXIT_SPIN: Duration = Duration::from_millis(1);

/// Namespaces every run gets, and what `/proc/<pid>/ns` calls them.
const NAMESPACES: [&str; 6] = ["user", "pid", "mnt", "ipc", "uts", "cgroup"];

/// The Linux process backend.
#[derive(Debug)]
pub struct LinuxBackend {
    init_exe: PathBuf,
    privileged: bool,
    registry: Option<Registry>,
    /// The cgroup layout, read once (probe and launch both need it).
    layout: std::cell::OnceCell<Option<Layout>>,
    /// The layout as the tree's thread reads it first (see [`LinuxBackend::start_tree`]).
    layout_ahead: std::cell::RefCell<Option<std::sync::mpsc::Receiver<Option<Layout>>>>,
    /// The next run's network namespace, being made ahead (see `netns`).
    net: Option<netns::Pending>,
    /// The next run's tree, being built ahead (see `mounts::Ahead`).
    tree: Option<mounts::Ahead>,
}

/// Where runs are registered for `cordon contain`, and the ledger they record into.
#[derive(Debug, Clone)]
struct Registry {
    dir: StateDir,
    ledger: Option<PathBuf>,
}

impl LinuxBackend {
    /// A backend whose sandbox init is `init_exe` (a `cordon` binary, which dispatches on
    /// `argv[0] == "cordon-init"`).
    pub fn new(init_exe: PathBuf) -> Self {
        LinuxBackend {
            init_exe,
            privileged: rustix::process::geteuid().is_root(),
            registry: None,
            layout: std::cell::OnceCell::new(),
            layout_ahead: std::cell::RefCell::new(None),
            net: None,
            tree: None,
        }
    }

    /// As root, starts building the tree for `plan` on a thread of its own ([`mounts::Ahead`]),
    /// which first reads the host's cgroup layout for this backend (the launch waits for it
    /// when it needs it): off the caller's way, and before the thread copies the host's mount
    /// namespace, which a read of `/proc/self/mountinfo` would have to wait for. Hand the tree
    /// over with [`LinuxBackend::with_tree`]. `None` unprivileged, or if the thread cannot start
    /// (the layout is then read here when needed, and the launch starts its own tree).
    pub fn start_tree(&self, plan: &Plan) -> Option<mounts::Ahead> {
        if !self.privileged {
            return None;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let ahead = mounts::Ahead::start_after(plan, move || {
            let _ = tx.send(Layout::detect().ok().filter(Layout::writable));
        })
        .ok()?;
        *self.layout_ahead.borrow_mut() = Some(rx);
        Some(ahead)
    }

    /// Hands over the tree for the next run, started early ([`LinuxBackend::start_tree`]) by a
    /// caller (as root) that has the plan before the backend launches, so that it is built
    /// while the caller opens its ledger and probes the host. A tree of another plan is not
    /// used; without one the launch starts its own.
    pub fn with_tree(mut self, tree: mounts::Ahead) -> Self {
        self.tree = Some(tree);
        self
    }

    /// Hands over the network namespace for the next run with `NetPlan::None`, started early
    /// with [`netns::prepare`] by a caller that knows the plan before the backend launches, so
    /// that it is made while the caller opens its ledger and the cgroup is created. Without it
    /// (or when it fails) the launch makes its own.
    pub fn with_network_namespace(mut self, pending: netns::Pending) -> Self {
        self.net = Some(pending);
        self
    }

    /// Registers every run in `dir` (for `cordon contain`), naming the ledger it records into.
    pub fn with_state_dir(mut self, dir: StateDir, ledger: Option<PathBuf>) -> Self {
        self.registry = Some(Registry { dir, ledger });
        self
    }

    fn layout(&self) -> Option<Layout> {
        if !self.privileged {
            return None;
        }
        self.layout
            .get_or_init(|| {
                // As the tree's thread read it, if it did (it may have died first).
                let ahead = self.layout_ahead.borrow_mut().take();
                ahead
                    .and_then(|rx| rx.recv().ok())
                    .unwrap_or_else(|| Layout::detect().ok().filter(Layout::writable))
            })
            .clone()
    }
}

impl Backend for LinuxBackend {
    type Run = LinuxRun;

    fn name(&self) -> &'static str {
        "linux-process"
    }

    fn probe(&self, plan: &Plan) -> Vec<ProviderReport> {
        use EnforcementState::*;
        let mut out = Vec::new();
        let abi = landlock::kernel_abi();
        out.push(match abi {
            0 => ProviderReport::new("landlock", NotConfigured, "the kernel has no Landlock"),
            a if a < 6 => ProviderReport::new(
                "landlock",
                Degraded,
                format!("kernel Landlock ABI {a}: no signal/abstract-socket scoping"),
            ),
            a => ProviderReport::new("landlock", Enforced, format!("kernel Landlock ABI {a}")),
        });
        match self.layout() {
            Some(layout) => {
                let kind = match layout.kind() {
                    LayoutKind::Unified => "cgroup v2",
                    LayoutKind::Hybrid => "hybrid cgroup v1/v2",
                };
                out.push(ProviderReport::new(
                    "cgroup",
                    Enforced,
                    format!("{kind} below {}", layout.v2_base.display()),
                ));
                for (want, ctrl) in [
                    (plan.limits.memory.is_some(), "memory"),
                    (plan.limits.pids.is_some(), "pids"),
                ] {
                    if want {
                        out.push(match layout.controller_home(ctrl) {
                            Ok(home) => ProviderReport::new(ctrl, Enforced, home),
                            Err(e) => ProviderReport::new(ctrl, NotConfigured, e.to_string()),
                        });
                    }
                }
            }
            None => {
                let why = if self.privileged {
                    "no writable cgroup v2 hierarchy"
                } else {
                    "not root: no cgroup (no cgroup.kill; teardown relies on the pid namespace)"
                };
                out.push(ProviderReport::new("cgroup", NotConfigured, why));
                for (want, ctrl) in [
                    (plan.limits.memory.is_some(), "memory"),
                    (plan.limits.pids.is_some(), "pids"),
                ] {
                    if want {
                        out.push(ProviderReport::new(ctrl, NotConfigured, why));
                    }
                }
            }
        }
        let bpf = self.privileged && std::path::Path::new("/sys/kernel/btf/vmlinux").exists();
        if self.privileged {
            out.push(if bpf {
                ProviderReport::new("observer", Enforced, "eBPF exec observation (BTF present)")
            } else {
                ProviderReport::new("observer", NotConfigured, "the kernel exposes no BTF")
            });
        }
        if let NetPlan::Allow(_) = plan.net {
            out.push(if bpf {
                ProviderReport::new("egress", Enforced, "eBPF cgroup egress allowlist")
            } else if self.privileged {
                ProviderReport::new("egress", NotConfigured, "the kernel exposes no BTF")
            } else {
                ProviderReport::new(
                    "egress",
                    NotConfigured,
                    "not root: destination allowlists need eBPF programs on the run's cgroup",
                )
            });
        }
        out
    }

    fn launch(&mut self, plan: &Plan, gate: &mut dyn StartGate) -> Result<LinuxRun, BackendError> {
        let t0 = Instant::now();
        cordon_runtime::mark("launch");
        // As root the run's empty network namespace is made ahead on a thread of its own (see
        // `netns`), from here at the latest; if that thread cannot start, the clone makes it.
        let wanted = self.privileged && plan.net == NetPlan::None;
        // A thread joined before the clone, which the kernel may still list then.
        let mut joined = None;
        let net = match self.net.take() {
            Some(pending) if wanted => Some(pending),
            // Not wanted after all: its thread is joined, so that init can still be forked
            // from a single thread.
            Some(unwanted) => {
                joined = unwanted.wait().ok().map(|ns| ns.maker());
                None
            }
            None if wanted => netns::prepare().ok(),
            None => None,
        };
        // As root the run's tree is built ahead too, on a thread of its own (see
        // `mounts::build_ahead`), while the cgroup is made here and the namespace on its thread;
        // if that thread cannot start, init builds the tree.
        let tree = match self.tree.take() {
            Some(ahead) if self.privileged && ahead.is_for(plan) => Some(ahead),
            other => {
                // Another plan's: joined (its thread is the process's until then) and dropped.
                if let Some(other) = other {
                    joined = joined.or(other.wait().map(|(tid, _)| tid));
                }
                self.privileged
                    .then(|| mounts::Ahead::start(plan).ok())
                    .flatten()
            }
        };
        let cgroup = match self.layout() {
            Some(layout) => Some({
                RunCgroup::create(
                    &layout,
                    &plan.run_id,
                    CgroupLimits {
                        memory: plan.limits.memory,
                        pids: plan.limits.pids,
                    },
                )
                .map_err(|e| BackendError::new("cgroup", e))?
            }),
            None => None,
        };
        cordon_runtime::mark("cgroup");
        let mut started = Starting {
            cgroup,
            init: None,
            timings: vec![("cgroup".to_owned(), micros(t0.elapsed()))],
            registered: None,
            observer: None,
            egress: None,
            egress_probe: None,
            joined,
        };
        match started.launch(self, plan, net, tree, gate) {
            Ok(run) => Ok(run),
            Err(e) => {
                started.abort();
                Err(e)
            }
        }
    }
}

/// The resources of a launch in progress, released by [`Starting::abort`] if it fails.
struct Starting {
    cgroup: Option<RunCgroup>,
    init: Option<(i32, OwnedFd)>,
    timings: Vec<(String, u64)>,
    registered: Option<(StateDir, String)>,
    observer: Option<Observer>,
    egress: Option<Egress>,
    egress_probe: Option<cordon_bpf::egress::ProbeStarted>,
    /// The namespace thread, when it was joined before `launch` (its namespace not wanted).
    joined: Option<i32>,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Starting {
    fn abort(mut self) {
        // The boundary comes down in the reverse order: processes first, then their egress.
        let egress = self.egress.take();
        let observer = self.observer.take();
        if let Some((dir, run_id)) = self.registered.take() {
            dir.remove(&run_id);
        }
        if let Some((_, pidfd)) = &self.init {
            let _ = rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL);
            let _ = rustix::process::waitid(
                rustix::process::WaitId::PidFd(pidfd.as_fd()),
                rustix::process::WaitIdOptions::EXITED,
            );
        }
        let mut emptied = true;
        if let Some(cg) = self.cgroup.take() {
            let mut steps = Vec::new();
            emptied = cg.teardown(&mut steps);
        }
        // As at the end of a run: egress comes down only once nothing of the run is left;
        // otherwise its pinned block stays.
        if let Some(mut e) = egress {
            if emptied {
                let _ = e.release();
            } else {
                let _ = e.block_all();
            }
        }
        if let Some(o) = observer {
            let _ = o.release();
        }
    }

    /// Attaches the host-side observer and, for `--net allow:`, the egress allowlist to the
    /// run's cgroup (root only), and starts the egress probe.
    fn attach_bpf(&mut self, backend: &LinuxBackend, plan: &Plan) -> Result<(), BackendError> {
        if let Some(cg) = &self.cgroup
            && backend.privileged
        {
            let t = Instant::now();
            let observer = Observer::attach(&plan.run_id, &cg.v2)
                .map_err(|e| BackendError::new("observer", e))?;
            if let NetPlan::Allow(rules) = &plan.net {
                let allow: Vec<Allow> = rules
                    .iter()
                    .map(|r| Allow::new(r.net, r.prefix, r.port))
                    .collect();
                let egress = Egress::attach(&plan.run_id, &cg.v2, &allow, Some(&observer))
                    .map_err(|e| BackendError::new("egress", e))?;
                // The active probe runs in its own process while init builds the boundary.
                self.egress_probe = Some(egress.start_probe());
                self.egress = Some(egress);
            }
            self.observer = Some(observer);
            self.timings
                .push(("eBPF observer and egress".to_owned(), micros(t.elapsed())));
            cordon_runtime::mark("ebpf");
        }
        Ok(())
    }

    fn launch(
        &mut self,
        backend: &LinuxBackend,
        plan: &Plan,
        net: Option<netns::Pending>,
        tree: Option<mounts::Ahead>,
        gate: &mut dyn StartGate,
    ) -> Result<LinuxRun, BackendError> {
        let err = |stage: &'static str| move |e: io::Error| BackendError::new(stage, e);
        let launched_at = Instant::now();
        // What does not depend on the network namespace comes first, while its thread may still
        // be making it: the seccomp filter, compiled once so that a forked init finds it ready
        // (root only: otherwise init is executed and compiles its own), the pipes to init, and
        // the v1 cgroups carrying the limits, which the child joins itself, first thing.
        if backend.privileged {
            crate::seccomp::prepare().map_err(|e| BackendError::new("seccomp", e))?;
        }
        let (sync_r, sync_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| err("pipe")(e.into()))?;
        let (status_r, status_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| err("pipe")(e.into()))?;
        let joins = match &self.cgroup {
            Some(cg) => cg.v1_joins().map_err(|e| BackendError::new("cgroup", e))?,
            None => Vec::new(),
        };
        let join_fds: Vec<i32> = joins.iter().map(AsRawFd::as_raw_fd).collect();
        // Observation and egress control on the cgroup, before init is born into it (while the
        // threads making the namespace and the tree finish, which the clone waits for; since
        // the tree is built ahead, attaching them while init built was the longer side of that
        // phase). Both are verified before the command may start, so no moment of the command
        // is uncovered.
        self.attach_bpf(backend, plan)?;
        // What the kernel shows of them is checked now too, not after init is ready: programs
        // and filters are the host's, init cannot touch them (they are checked again when the
        // command ends).
        let observer_attached = self.observer.as_ref().map(Observer::verify_attached);
        let egress_attached = self.egress.as_ref().map(Egress::verify_attached);
        // The namespace made ahead, and the host's to come back to after the clone. Once its
        // thread and the tree's are joined this process has one thread again (see
        // `own_status`).
        // If it could not be made (a /proc without `thread-self`, say), the clone makes the
        // namespace as it would without one, init brings loopback up, and the report says which.
        // Namespaces made for another hostname are not used (the clone makes its own).
        let mut net = net
            .and_then(|pending| pending.wait().ok())
            .filter(|ns| ns.hostname() == plan.hostname);
        // A set taken from the pool stays pinned there until the run's keeper (or, without
        // one, the drop of this claim) unpins it, off the run's way (see `pool::Claim`).
        let claim = net.as_mut().and_then(netns::NetNs::take_claim);
        let pooled = claim.is_some();
        cordon_runtime::mark("netns joined");
        let tree = tree.and_then(mounts::Ahead::wait);
        cordon_runtime::mark("tree joined");

        // Init is this process cloned without an exec when that is safe: root (so that the
        // unprivileged user-namespace paths, which need init's own exec, do not apply) and a
        // single thread (so that the copy may allocate: no other thread holds a lock in it).
        // Otherwise (an embedder with threads) the `cordon` binary is executed as init, and
        // between the clone and that exec the child calls only async-signal-safe functions on
        // data prepared here.
        // One read of this process's status gives both its thread count and the seccomp
        // filters it runs under (init inherits them: the host-side check wants init's own on
        // top of these, not merely some).
        let joined: Vec<i32> = [
            net.as_ref().map(netns::NetNs::maker),
            self.joined,
            tree.as_ref().map(|(tid, _)| *tid),
        ]
        .into_iter()
        .flatten()
        .collect();
        let (own, single) = own_status(&joined)
            .map_err(|e| BackendError::new("init", format!("/proc/self/status: {e}")))?;
        let forked = backend.privileged && single;
        let inherited_filters = own.seccomp_filters;
        // The tree built ahead, which a forked init inherits; an executed init builds its own
        // (and reports why it cannot). A tree that could not be built refuses the run, as
        // init's failure to build it would.
        let tree = match tree {
            Some((_, Ok(tree))) if forked => Some(tree),
            Some((_, Err(e))) if forked => {
                return Err(BackendError::new("mounts", e.to_string()));
            }
            _ => None,
        };
        // Read while this thread still sees the host's /proc.
        let user_ns_limits = user_ns_limits();
        // Into the tree's mount namespace, root and working directory at the tree's root, from
        // here to the clone (nothing in between looks a path up): init starts in it. The
        // kernel refuses a thread that shares its file-system attributes with another; then
        // init is cloned into a new mount namespace and builds the tree itself.
        let tree = tree.filter(|t| t.enter().is_ok());
        let config = InitConfig {
            plan: plan.clone(),
            sync_fd: sync_r.as_raw_fd(),
            status_fd: status_w.as_raw_fd(),
            unprivileged: !backend.privileged,
            user_ns_limits,
            loopback: plan.net == NetPlan::None && net.is_none(),
            hostname: net.is_none(),
            // `/proc`, mounted by the launcher below, among the mounts.
            tree: tree.as_ref().map(|t| t.mounts() + 1),
            landlock: tree
                .as_ref()
                .and_then(mounts::Tree::landlock)
                .map(|l| (l.raw_fd(), l.enforcement())),
        };
        let exec = if forked {
            None
        } else {
            Some(ExecInit::prepare(&backend.init_exe, &config)?)
        };

        let mut flags = clone_flags::NEWUSER | clone_flags::NEWPID | clone_flags::NEWCGROUP;
        if tree.is_none() {
            flags |= clone_flags::NEWNS;
        }
        if net.is_none() {
            flags |= clone_flags::NEWIPC | clone_flags::NEWUTS;
            if plan.net == NetPlan::None {
                flags |= clone_flags::NEWNET;
            }
        }

        // Signals that must reach the command are held until `wait` forwards them; init inherits
        // the mask and sets its own.
        block_forwarded_signals();
        self.timings
            .push(("prepare".to_owned(), micros(launched_at.elapsed())));
        let t_clone = Instant::now();
        cordon_runtime::mark("clone");
        // Into the run's network, IPC and UTS namespaces for the clone alone: init inherits
        // them.
        if let Some(ns) = &net
            && let Err(e) = ns.enter()
        {
            if let Some(t) = &tree {
                let _ = t.leave();
            }
            return Err(BackendError::new("netns", e));
        }

        // SAFETY: forked, the child is a copy of this single-threaded process and never returns
        // into this frame (`init::forked` ends in `_exit`); otherwise it calls only write, fcntl,
        // execveat and _exit (async-signal-safe, no allocation) on data prepared above, which
        // the copied address space still holds.
        let cloned = unsafe { sys::clone3(flags, self.cgroup.as_ref().map(RunCgroup::dir_fd)) };
        // The parent only (init stays), whatever the clone did: the run's /proc in the tree,
        // from inside its mount namespace (where init waits for the first go), then back in the
        // host's namespaces.
        if !matches!(cloned, Ok(Cloned::Child)) {
            let mut back = Ok(());
            if let Some(t) = &tree {
                if let Ok(Cloned::Parent { pidfd, .. }) = &cloned {
                    back = t
                        .mount_proc(pidfd)
                        .map_err(|e| BackendError::new("mounts", e.to_string()));
                    // `/proc`'s Landlock rule, on the proc just mounted.
                    if let (Ok(()), Some(l)) = (&back, t.landlock()) {
                        back = l.allow_proc().map_err(|e| {
                            BackendError::new("landlock", format!("/proc's rule: {e}"))
                        });
                    }
                }
                if let Err(e) = t.leave() {
                    back = back.and(Err(BackendError::new(
                        "mounts",
                        format!("returning to the host's mount namespace: {e}"),
                    )));
                }
            }
            if let Some(ns) = &net
                && let Err(e) = ns.leave()
            {
                back = back.and(Err(BackendError::new(
                    "netns",
                    format!("returning to the host's namespaces: {e}"),
                )));
            }
            if let Err(e) = back {
                if let Ok(Cloned::Parent { pid, pidfd }) = cloned {
                    self.init = Some((pid, pidfd));
                }
                return Err(e);
            }
        }
        let cloned = cloned.map_err(err("clone3"))?;
        let (pid, pidfd) = match cloned {
            Cloned::Child => {
                // Limits first: into the v1 cgroups before anything else happens here.
                for fd in &join_fds {
                    if sys::write_all_raw(*fd, b"0").is_err() {
                        let _ = sys::write_all_raw(
                            status_w.as_raw_fd(),
                            b"{\"Error\":{\"stage\":\"cgroup\",\"message\":\"could not join the run's v1 cgroups\"}}\n",
                        );
                        sys::exit_now(125);
                    }
                }
                match &exec {
                    // SAFETY: cloned from a single-threaded process (checked above, and this
                    // frame starts no thread before the clone); `forked` never returns.
                    None => unsafe { crate::init::forked(&config) },
                    Some(exec) => exec.exec(status_w.as_raw_fd()),
                }
            }
            Cloned::Parent { pid, pidfd } => (pid, pidfd),
        };
        cordon_runtime::mark("cloned");
        self.init = Some((pid, pidfd.try_clone().map_err(err("clone3"))?));
        // Init holds the tree's namespace now (and its /proc is mounted); its inode is checked
        // below.
        let tree_ns = tree.as_ref().map(mounts::Tree::inode);
        drop((sync_r, status_w, joins, exec, tree));
        write_id_maps(pid, plan, backend.privileged).map_err(err("uid_map"))?;
        let mut sync = File::from(sync_w);
        sync.write_all(&[GO_BUILD]).map_err(err("sync"))?;
        // The run's start may now be recorded on a thread of its own: the clone is done. It
        // starts on this CPU: init, just cloned, is likely on the other, building the boundary,
        // which is what the command waits for; this thread only waits for it.
        sys::spawning_here_first(|| gate.begin());

        self.timings.push((
            if forked {
                "clone3 (init forked), id maps".to_owned()
            } else {
                "clone3 (init re-executed), id maps".to_owned()
            },
            micros(t_clone.elapsed()),
        ));
        let t_init = Instant::now();
        cordon_runtime::mark("GO sent");
        // Registered while init builds the boundary, before the command can start.
        if let (Some(reg), Some(cg)) = (&backend.registry, &self.cgroup) {
            let state = RunState {
                run_id: plan.run_id.clone(),
                cgroup: cg.handle(),
                init_pid: pid,
                ledger: reg.ledger.clone(),
                egress: self.egress.as_ref().map(|e| e.pin_dir().to_path_buf()),
                started_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                    .unwrap_or(0),
            };
            reg.dir
                .register(&state)
                .map_err(|e| BackendError::new("state", e))?;
            self.registered = Some((reg.dir.clone(), plan.run_id.clone()));
        }

        // While init builds: its namespaces, from the host, all through one open of its
        // `/proc/<pid>/ns` (each path walk through `/proc` was ~15 µs here).
        let init_ns = NsDir::open(pid);
        let prepared: Vec<(&str, u64)> = net
            .iter()
            .flat_map(netns::NetNs::inodes)
            .chain(tree_ns.map(|inode| ("mnt", inode)))
            .collect();
        let mut namespaces = verify_namespaces(init_ns.as_ref(), plan, &prepared);
        if pooled && namespaces.state == EnforcementState::Enforced {
            namespaces.detail.push_str(
                "; net, ipc, uts left in the pool by an earlier run, checked empty before use",
            );
        }
        drop(net);
        let ns_pid = init_ns.as_ref().and_then(|d| d.inode("pid"));
        // Held until init is gone, so that the last reference to the sandbox's mount namespace
        // is cordon's: taking its mounts down (an RCU grace period, the superblocks of its
        // tmpfs, proc and devpts) is then not part of init's exit, which the run's end waits
        // for, but done on a thread of its own while the run is torn down and `run.end` made
        // durable. No process is left in it by then (the pid namespace dies with init), and
        // nothing can enter it through this descriptor but cordon, as root.
        let mount_ns = init_ns.as_ref().and_then(|d| d.handle("mnt"));
        // Likewise the network namespace, let go of last: the kernel dismantles a network
        // namespace on a worker thread (unregistering loopback, RCU grace periods), which, set
        // off by init's exit, competed with this process for the CPUs while the run ended.
        let net_ns = (plan.net == NetPlan::None)
            .then(|| init_ns.as_ref().and_then(|d| d.handle("net")))
            .flatten();
        drop(init_ns);
        let mut status = BufReader::new(File::from(status_r));
        let mut ready =
            match read_message_within(&mut status, INIT_REPORT_LIMIT).map_err(err("status"))? {
                Some(Message::Ready(ready)) => ready,
                Some(Message::Error { stage, message }) => {
                    return Err(BackendError::new(stage, message));
                }
                Some(other) => {
                    return Err(BackendError::new("init", format!("unexpected {other:?}")));
                }
                None => {
                    return Err(BackendError::new(
                        "init",
                        "exited before the boundary was built",
                    ));
                }
            };

        self.timings.push((
            "init exec and boundary".to_owned(),
            micros(t_init.elapsed()),
        ));
        self.timings.extend(
            std::mem::take(&mut ready.timings)
                .into_iter()
                .map(|(k, v)| (format!("  {k}"), v)),
        );

        cordon_runtime::mark("Ready");
        // Check the boundary from the host before anything of the command runs.
        let mut enforcement = vec![namespaces];
        enforcement.extend(verify(
            pid,
            plan,
            &ready,
            inherited_filters,
            backend.privileged,
            self.cgroup.as_ref(),
        ));
        if ready.memfd_exec_refused == Some(false) {
            enforcement.push(ProviderReport::new(
                "exec",
                EnforcementState::Degraded,
                "not root: memfds stay executable (vm.memfd_noexec needs root), a way around --exec",
            ));
        }
        let mut probe_pids = Vec::new();
        if let Some(v) = &observer_attached {
            enforcement.push(bpf_report("observer", v));
        } else if !backend.privileged {
            enforcement.push(ProviderReport::new(
                "observer",
                EnforcementState::NotConfigured,
                "not root: no host-side observation of execs and connects",
            ));
        }
        if let (Some(e), Some(attached)) = (&self.egress, egress_attached) {
            let v = match self.egress_probe.take() {
                Some(probe) => attached.and(probe.finish()),
                None => attached.and(e.verify_probe()),
            };
            probe_pids.extend(v.probe_pids.iter().copied());
            enforcement.retain(|p| p.provider != "network");
            enforcement.push(bpf_report("egress", &v));
        }
        let refused: Vec<String> = enforcement
            .iter()
            .filter(|p| match p.state {
                EnforcementState::Enforced | EnforcementState::NotConfigured => false,
                EnforcementState::Degraded => !plan.allow_degraded,
                EnforcementState::VerificationFailed => true,
            })
            .map(|p| format!("{} {}: {}", p.provider, p.state, p.detail))
            .collect();
        if !refused.is_empty() {
            return Err(BackendError::new("verify", refused.join("; ")));
        }
        self.timings
            .push(("host-side verify".to_owned(), micros(t_init.elapsed())));
        let t_gate = Instant::now();
        gate.pass().map_err(|e| BackendError::new("evidence", e))?;
        self.timings.push((
            "wait at the gate for evidence".to_owned(),
            micros(t_gate.elapsed()),
        ));
        let t_exec = Instant::now();

        cordon_runtime::mark("verified+gate");
        sync.write_all(&[GO_EXEC]).map_err(err("sync"))?;
        drop(sync);
        // The threads for the run's end are started now, while init starts the command and it
        // runs: this thread only waits meanwhile. (While init built the boundary, this CPU
        // was the busier side: registering the run, checking init's namespaces and the run's
        // start being recorded.) Both start and stay on this CPU, off the command's. The
        // cleaner is kept here from the start (see `Cleaner`); without it (it could not be
        // started) the launcher cleans up itself. The unmounter is sent to another CPU when it
        // is handed its work (`let_go_of_mounts`). A one-shot process's keeper is started now
        // too (see `keeper`).
        let unmounter = mount_ns
            .is_some()
            .then(|| sys::spawning_here(Unmounter::start))
            .and_then(Result::ok);
        let cleaner = sys::spawning_here(Cleaner::start).ok();
        // As root the keeper leaves a set of empty namespaces for the next run (see `pool`).
        crate::thread::start_keeper(move || {
            backend
                .privileged
                .then(crate::pool::dir)
                .flatten()
                .and_then(|dir| crate::pool::Pool::open(&dir).ok())
                .and_then(|pool| pool.refill(&plan.run_id, claim))
        });
        // The event ring is read from the command's start on; mapping it waits no longer (a
        // short command has ended before init reports its start, and the run's end then waited
        // for the mapping). A failure shows at the first read.
        if let Some(o) = &mut self.observer {
            let _ = o.map_ring();
        }
        // Earlier runs' leftovers are looked for by one run in HOUSEKEEPING_EVERY, as root (the
        // state directory keeps the time); otherwise by every run.
        let due = backend
            .registry
            .as_ref()
            .is_none_or(|r| r.dir.housekeeping_due(HOUSEKEEPING_EVERY));
        let housekeeping = due.then(|| {
            housekeeping(
                plan.run_id.clone(),
                backend.layout(),
                backend.privileged,
                backend.registry.as_ref().map(|r| r.dir.clone()),
            )
        });
        let start =
            match read_message_within(&mut status, INIT_REPORT_LIMIT).map_err(err("status"))? {
                Some(Message::Started { .. }) => None,
                Some(Message::ExecFailed { errno, command }) => {
                    let code = if errno == libc::ENOENT { 127 } else { 126 };
                    let what = if code == 127 {
                        "command not found"
                    } else {
                        "command not executable"
                    };
                    Some(Outcome::NotStarted {
                        code,
                        reason: format!("{what}: {command}: {}", sys::errno_name(errno)),
                    })
                }
                Some(Message::Error { stage, message }) => {
                    return Err(BackendError::new(stage, message));
                }
                other => {
                    return Err(BackendError::new("init", format!("unexpected {other:?}")));
                }
            };

        self.timings.push((
            "fork and exec of the command".to_owned(),
            micros(t_exec.elapsed()),
        ));
        let (init_pid, init_fd) = self
            .init
            .take()
            .ok_or_else(|| BackendError::new("init", "lost"))?;
        Ok(LinuxRun {
            pid: init_pid,
            pidfd: init_fd,
            cgroup: self.cgroup.take(),
            status,
            enforcement,
            not_started: start,
            ns_pid,
            launched_at,
            killed: None,
            exit: None,
            timings: std::mem::take(&mut self.timings),
            registered: self.registered.take(),
            observer: self.observer.take(),
            egress: self.egress.take(),
            probe_pids,
            events_recorded: 0,
            events_over_budget: std::collections::BTreeMap::new(),
            housekeeping,
            emptied: false,
            mount_ns,
            unmounter,
            cleaner,
            net_ns,
        })
    }
}

/// A thread, started while init builds, that reaps init and takes the sandbox's
/// mounts down once init is gone (see `mount_ns` in `Starting::launch`): letting go of the mount
/// namespace waits for the kernel (an RCU grace period, the superblocks), and a thread started
/// for it only then, at the run's end, cost that end up to ~0.2 ms more on this machine than
/// handing it a descriptor. Reaping init (a zombie, out of its cgroup) is not the run's end's to
/// wait for either.
#[derive(Debug)]
struct Unmounter {
    /// The mount namespace, and a descriptor of init to reap it by.
    namespace: std::sync::mpsc::SyncSender<(OwnedFd, Option<OwnedFd>)>,
    thread: crate::thread::Thread<()>,
}

impl Unmounter {
    fn start() -> io::Result<Unmounter> {
        let (namespace, handed) = std::sync::mpsc::sync_channel::<(OwnedFd, Option<OwnedFd>)>(1);
        let thread = crate::thread::spawn("cordon-umount", 64 * 1024, move || {
            // Nothing handed over (the run ended otherwise): nothing to do here.
            if let Ok((ns, init)) = handed.recv() {
                if let Some(init) = init {
                    reap_now(&init);
                }
                drop(ns);
            }
        })?;
        Ok(Unmounter { namespace, thread })
    }
}

/// Reaps init if it is dead, without waiting: a live one (a run that teardown could not show
/// gone) stays for the kernel to reap with this process.
fn reap_now(pidfd: &OwnedFd) {
    let _ = rustix::process::waitid(
        rustix::process::WaitId::PidFd(pidfd.as_fd()),
        rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOHANG,
    );
}

/// A thread, started while init builds and kept on the launcher's CPU (its creator calls
/// [`Cleaner::start`] under `sys::spawning_here`), that cleans up after the run
/// (`LinuxRun::clean_up`) while the launcher records the run's end. Started only then, a thread cost the run's end
/// 0.2–0.3 ms on this machine (its stack, the clone, its first run), as long as the cleanup.
/// Its steps come back over a channel, not through a join: a thread's own exit (unmapping its
/// signal stack, releasing its stack's pages) is not the launcher's to wait for.
#[derive(Debug)]
struct Cleaner {
    run: std::sync::mpsc::SyncSender<Box<LinuxRun>>,
    steps: std::sync::mpsc::Receiver<Vec<String>>,
    thread: crate::thread::Thread<()>,
}

impl Cleaner {
    fn start() -> io::Result<Cleaner> {
        let (run, handed) = std::sync::mpsc::sync_channel::<Box<LinuxRun>>(1);
        let (done, steps) = std::sync::mpsc::sync_channel(1);
        let thread = crate::thread::spawn("cordon-cleanup", 256 * 1024, move || {
            // Nothing handed over (the run was dropped instead): nothing to do here.
            let Ok(run) = handed.recv() else { return };
            // Brought to the launcher's CPU (`sys::bring_here`), it stays there: the launcher,
            // which it may have preempted, goes on until it waits for the disk, and wakes on
            // this CPU when the steps come back. A panic drops `done`, which the launcher sees.
            std::thread::yield_now();
            let _ = done.send(run.clean_up());
        })?;
        Ok(Cleaner { run, steps, thread })
    }
}

/// How often, at most, a run as root looks for what earlier runs left behind ([`housekeeping`]).
/// Looking took ~0.2-0.4 ms of CPU per run here (reading the state directory, the run cgroups of
/// every hierarchy and the eBPF pins), which a run of a short command paid beside the command on
/// a machine of two CPUs (0.5-2.5 % of a `cordon run -- /bin/true`, in paired runs); leftovers
/// are rare (a cordon killed before its teardown) and wait this long at most, and a stale cgroup
/// is not removed before it is a minute old anyway.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(10);

/// Removes what runs whose cordon died before its teardown left behind — empty cgroups, eBPF
/// pins and slots, state entries — on a thread of its own at the lowest priority, while the
/// command runs (nothing of this run depends on it: the observer cleans up and retries by
/// itself when a stale entry is in its way). As root, one run in [`HOUSEKEEPING_EVERY`] does it.
fn housekeeping(
    own: String,
    layout: Option<Layout>,
    privileged: bool,
    registry: Option<StateDir>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        // The lowest ordinary priority (not SCHED_IDLE, which a busy command could starve).
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        // SAFETY: setpriority on the calling thread (its tid) with an integer niceness.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19) };
        // Runs still registered (this one among them) keep their cgroups.
        let mut active: Vec<String> = match &registry {
            Some(dir) => {
                dir.prune();
                dir.list().into_iter().map(|r| r.run_id).collect()
            }
            None => Vec::new(),
        };
        active.push(own);
        if let Some(layout) = &layout {
            crate::cgroup::remove_stale(layout, Duration::from_secs(60), &|name| {
                active.iter().any(|id| id == name)
            });
        }
        if privileged {
            let _ =
                cordon_bpf::cleanup_stale(std::path::Path::new(cordon_bpf::bpffs::DEFAULT_ROOT));
            if let Some(pool) = crate::pool::dir().and_then(|d| crate::pool::Pool::open(&d).ok()) {
                pool.sweep(Duration::from_secs(60));
            }
        }
    })
}

/// What the child needs to execute the `cordon` binary as init, prepared before the clone so
/// that the child only makes system calls.
struct ExecInit {
    exe: OwnedFd,
    /// The sealed config init reads (its number is in `argv`; kept open until the exec).
    _config_fd: OwnedFd,
    argv: sys::CStringArray,
    envp: sys::CStringArray,
    inherit: [i32; 3],
    last_cap: u32,
}

impl ExecInit {
    fn prepare(init_exe: &std::path::Path, config: &InitConfig) -> Result<Self, BackendError> {
        let err = |stage: &'static str| move |e: io::Error| BackendError::new(stage, e);
        let exe = rustix::fs::open(
            init_exe,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| BackendError::new("init", format!("{}: {e}", init_exe.display())))?;
        let config_fd = rustix::fs::memfd_create(
            "cordon-init-config",
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| err("config")(e.into()))?;
        {
            let json = serde_json::to_vec(config).map_err(|e| BackendError::new("config", e))?;
            let mut f = File::from(config_fd.try_clone().map_err(err("config"))?);
            f.write_all(&json).map_err(err("config"))?;
        }
        rustix::fs::seek(&config_fd, rustix::fs::SeekFrom::Start(0))
            .map_err(|e| err("config")(e.into()))?;
        rustix::fs::fcntl_add_seals(
            &config_fd,
            rustix::fs::SealFlags::WRITE
                | rustix::fs::SealFlags::GROW
                | rustix::fs::SealFlags::SHRINK
                | rustix::fs::SealFlags::SEAL,
        )
        .map_err(|e| err("config")(e.into()))?;
        let argv = sys::CStringArray::new([
            INIT_ARGV0.to_owned(),
            config_fd.as_raw_fd().to_string(),
            config.status_fd.to_string(),
        ])
        .map_err(err("init"))?;
        let envp = sys::CStringArray::new(Vec::<Vec<u8>>::new()).map_err(err("init"))?;
        let inherit = [config_fd.as_raw_fd(), config.sync_fd, config.status_fd];
        Ok(ExecInit {
            exe,
            _config_fd: config_fd,
            argv,
            envp,
            inherit,
            last_cap: crate::caps::last_cap(),
        })
    }

    /// In the cloned child: executes init. Async-signal-safe. Never returns.
    fn exec(&self, status_fd: i32) -> ! {
        // Nothing cordon inherited (a descriptor its caller left open, even one to a root-only
        // file) may reach the sandbox: every descriptor but the standard streams is closed at
        // the exec, except the three init is handed.
        if sys::cloexec_from(3).is_err() {
            sys::exit_now(125);
        }
        for fd in self.inherit {
            if sys::clear_cloexec(fd).is_err() {
                sys::exit_now(125);
            }
        }
        // The clone gave this process every capability in its new user namespace; an exec by
        // an unmapped uid would drop them, so they ride along as ambient ones.
        if crate::caps::keep_across_exec(self.last_cap).is_err() {
            let _ = sys::write_all_raw(
                status_fd,
                b"{\"Error\":{\"stage\":\"init\",\"message\":\"could not keep capabilities across exec\"}}\n",
            );
            sys::exit_now(125);
        }
        // SAFETY: argv and envp are NULL-terminated arrays of NUL-terminated strings owned by
        // `self`, alive in this copy of the address space.
        let _ =
            unsafe { sys::execveat(self.exe.as_raw_fd(), self.argv.as_ptr(), self.envp.as_ptr()) };
        let _ = sys::write_all_raw(
            status_fd,
            b"{\"Error\":{\"stage\":\"init\",\"message\":\"could not execute cordon's init\"}}\n",
        );
        sys::exit_now(125)
    }
}

/// Per-user kernel resources a user namespace's processes also charge to its creator: the run's
/// namespace gets a quarter of what this process's namespace allows, so that one run can never
/// exhaust them for every other process of the same user (root's daemons, other runs).
const SHARED_PER_USER: [&str; 2] = ["max_inotify_instances", "max_inotify_watches"];

fn user_ns_limits() -> Vec<(String, u64)> {
    SHARED_PER_USER
        .iter()
        .filter_map(|name| {
            let have: u64 = sys::read_text(format!("/proc/sys/user/{name}"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some(((*name).to_owned(), (have / 4).max(1)))
        })
        .collect()
}

/// Maps the sandbox's uid/gid to the plan's host identity. Nothing else is mapped: uid 0 inside
/// is nobody outside.
fn write_id_maps(pid: i32, plan: &Plan, privileged: bool) -> io::Result<()> {
    let id = plan.identity;
    let proc = PathBuf::from(format!("/proc/{pid}"));
    if !privileged {
        // An unprivileged writer may only map its own gid, and only once setgroups is denied.
        std::fs::write(proc.join("setgroups"), "deny")?;
    }
    std::fs::write(
        proc.join("uid_map"),
        format!("{} {} 1\n", id.uid, id.host_uid),
    )?;
    std::fs::write(
        proc.join("gid_map"),
        format!("{} {} 1\n", id.gid, id.host_gid),
    )?;
    Ok(())
}

/// How long init may take to build the boundary or start the command before the launch is
/// abandoned (a mount that hangs, a kernel that stalls): the run is then killed and refused.
const INIT_REPORT_LIMIT: Duration = Duration::from_secs(30);

/// [`read_message`], giving up with `TimedOut` when nothing arrives within `limit`.
fn read_message_within(r: &mut BufReader<File>, limit: Duration) -> io::Result<Option<Message>> {
    use rustix::event::{PollFd, PollFlags, poll};
    if r.buffer().is_empty() {
        let ts = rustix::time::Timespec {
            tv_sec: i64::try_from(limit.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(limit.subsec_nanos()),
        };
        loop {
            let mut fds = [PollFd::new(r.get_ref(), PollFlags::IN)];
            match poll(&mut fds, Some(&ts)) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the sandbox's init reported nothing for {} s",
                            limit.as_secs()
                        ),
                    ));
                }
                Ok(_) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
    read_message(r)
}

fn read_message(r: &mut BufReader<File>) -> io::Result<Option<Message>> {
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        if line.trim().is_empty() {
            continue;
        }
        return serde_json::from_str(&line)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e));
    }
}

/// A descriptor holding namespace `ns` of process `pid`.
/// A process's `/proc/<pid>/ns`, opened once: its namespaces' inodes and handles without a walk
/// through `/proc` for each. Bound to that process: once it is gone, nothing is found.
struct NsDir(OwnedFd);

impl NsDir {
    fn open(pid: i32) -> Option<NsDir> {
        use rustix::fs::OFlags;
        rustix::fs::open(
            format!("/proc/{pid}/ns"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok()
        .map(NsDir)
    }

    /// The inode of namespace `ns` (`mnt`, `net`…), as `stat` of its link shows.
    fn inode(&self, ns: &str) -> Option<u64> {
        rustix::fs::statat(&self.0, ns, rustix::fs::AtFlags::empty())
            .ok()
            .map(|st| st.st_ino)
    }

    /// A descriptor of namespace `ns`, which keeps it alive.
    fn handle(&self, ns: &str) -> Option<OwnedFd> {
        rustix::fs::openat(
            &self.0,
            ns,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok()
    }
}

fn ns_inode(pid: i32, ns: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/{ns}"))
        .ok()
        .map(|m| m.ino())
}

/// The host-side check of init's namespaces: `/proc/<pid>/ns/*` compared with cordon's own, and
/// those cordon made ahead (`prepared`: `net`, `ipc`, `uts` and their inodes) found to be
/// exactly those. Made while init builds the boundary (the namespaces came with the clone; a
/// process changes its own only by `unshare`/`setns`, which init does not call and its seccomp
/// filter then kills).
fn verify_namespaces(
    init: Option<&NsDir>,
    plan: &Plan,
    prepared: &[(&str, u64)],
) -> ProviderReport {
    use EnforcementState::*;
    let mut wanted: Vec<&str> = NAMESPACES.to_vec();
    if plan.net == NetPlan::None {
        wanted.push("net");
    }
    // A namespace cordon made ahead is checked to be exactly that one (below), which is new;
    // the others must differ from cordon's own.
    let made = |ns: &str| prepared.iter().any(|(p, _)| *p == ns);
    let me = NsDir::open(std::process::id() as i32);
    let mut same = Vec::new();
    for ns in wanted.iter().filter(|ns| !made(ns)) {
        match (
            init.and_then(|d| d.inode(ns)),
            me.as_ref().and_then(|d| d.inode(ns)),
        ) {
            (Some(a), Some(b)) if a != b => {}
            _ => same.push(*ns),
        }
    }
    if !same.is_empty() {
        return ProviderReport::new(
            "namespaces",
            VerificationFailed,
            format!("shared with the host: {}", same.join(", ")),
        );
    }
    let elsewhere: Vec<String> = prepared
        .iter()
        .filter(|(ns, made)| init.and_then(|d| d.inode(ns)) != Some(*made))
        .map(|(ns, made)| format!("{ns} (inode {made})"))
        .collect();
    if !elsewhere.is_empty() {
        return ProviderReport::new(
            "namespaces",
            VerificationFailed,
            format!(
                "init is not in the namespaces cordon made: {}",
                elsewhere.join(", ")
            ),
        );
    }
    if prepared.is_empty() {
        return ProviderReport::new(
            "namespaces",
            Enforced,
            format!("new {} (inodes differ from cordon's)", wanted.join(", ")),
        );
    }
    let made: Vec<&str> = prepared.iter().map(|(ns, _)| *ns).collect();
    ProviderReport::new(
        "namespaces",
        Enforced,
        format!(
            "new {} (inodes differ from cordon's; {} made by cordon ahead of the clone, owned by \
             the host's user namespace)",
            wanted.join(", "),
            made.join(", ")
        ),
    )
}

/// This process's status (for the seccomp filters it runs under), and whether the calling
/// thread is the only one that can still run code of this process. A helper thread that was
/// joined (in `joined`, their ids) has run the last of its code (its joiner is woken only once
/// the thread is done with the address space), but the kernel counts and lists it until it has
/// finished exiting, which took over a millisecond when the hypervisor left its CPU unrun: then
/// `/proc/self/task` must list no thread but the caller and those.
fn own_status(joined: &[i32]) -> io::Result<(StatusCaps, bool)> {
    let me = std::process::id() as i32;
    let status = StatusCaps::read(me)?;
    let single = match status.threads {
        1 => true,
        n if usize::try_from(n).is_ok_and(|n| n <= 1 + joined.len()) => {
            let allowed: Vec<i32> = std::iter::once(me).chain(joined.iter().copied()).collect();
            only_threads(&allowed)?
        }
        _ => false,
    };
    Ok((status, single))
}

/// Whether every thread `/proc/self/task` lists is one of `allowed`.
fn only_threads(allowed: &[i32]) -> io::Result<bool> {
    let mut others = false;
    cordon_runtime::dir::entries(Path::new("/proc/self/task"), |name, _| {
        let tid = name.to_str().and_then(|n| n.parse::<i32>().ok());
        others |= !tid.is_some_and(|t| allowed.contains(&t));
        false
    })?;
    Ok(!others)
}

/// The host-side check of the boundary init reports built: what `/proc/<pid>/status` and
/// `/proc/<pid>/ns/*` show, compared with what was asked for. Nothing init says about itself is
/// taken as the evidence, except Landlock's ruleset status, which only the restricted process can
/// see (reported as such).
fn verify(
    pid: i32,
    plan: &Plan,
    ready: &Ready,
    inherited_filters: u32,
    privileged: bool,
    cgroup: Option<&RunCgroup>,
) -> Vec<ProviderReport> {
    use EnforcementState::*;
    let Ready {
        landlock: landlock_state,
        landlock_abi: abi,
        seccomp_programs: programs,
        mounts,
        groups_dropped,
        ..
    } = ready;
    let mut out = Vec::new();

    out.push(ProviderReport::new(
        "mounts",
        Enforced,
        format!("pivot_root into a read-only tmpfs root with {mounts} mounts"),
    ));

    match StatusCaps::read(pid) {
        Ok(st) => {
            out.push(if st.no_capabilities() {
                ProviderReport::new(
                    "capabilities",
                    Enforced,
                    "CapInh/CapPrm/CapEff/CapBnd/CapAmb all 0 in /proc/<pid>/status",
                )
            } else {
                ProviderReport::new(
                    "capabilities",
                    VerificationFailed,
                    format!("/proc/<pid>/status shows capability sets {:x?}", st.sets),
                )
            });
            out.push(if st.no_new_privs {
                ProviderReport::new("no_new_privs", Enforced, "NoNewPrivs: 1")
            } else {
                ProviderReport::new("no_new_privs", VerificationFailed, "NoNewPrivs: 0")
            });
            out.push(
                // Exactly init's own programs on top of those cordon itself runs under (which
                // init inherited): a filter cordon was started with cannot stand in for them.
                if st.seccomp_mode == 2
                    && st.seccomp_filters as usize == inherited_filters as usize + *programs
                {
                    ProviderReport::new(
                        "seccomp",
                        Enforced,
                        format!(
                            "Seccomp: 2, Seccomp_filters: {} ({programs} default-kill allowlist \
                             on {inherited_filters} cordon runs under)",
                            st.seccomp_filters
                        ),
                    )
                } else {
                    ProviderReport::new(
                        "seccomp",
                        VerificationFailed,
                        format!(
                            "Seccomp: {}, Seccomp_filters: {} (expected 2 and {programs} on the \
                             {inherited_filters} cordon runs under)",
                            st.seccomp_mode, st.seccomp_filters
                        ),
                    )
                },
            );
        }
        Err(e) => {
            for p in ["capabilities", "no_new_privs", "seccomp"] {
                out.push(ProviderReport::new(
                    p,
                    VerificationFailed,
                    format!("/proc/{pid}/status unreadable: {e}"),
                ));
            }
        }
    }

    out.push(match landlock_state.as_str() {
        "full" => ProviderReport::new(
            "landlock",
            Enforced,
            format!(
                "ruleset fully enforced (kernel ABI {abi}, as reported by the restricted init)"
            ),
        ),
        "partial" => ProviderReport::new(
            "landlock",
            Degraded,
            format!("ruleset partially enforced (kernel ABI {abi})"),
        ),
        _ => ProviderReport::new("landlock", NotConfigured, "the kernel enforced no ruleset"),
    });

    if !groups_dropped {
        out.push(ProviderReport::new(
            "identity",
            Degraded,
            "unprivileged user namespace: supplementary groups could not be dropped",
        ));
    } else {
        out.push(ProviderReport::new(
            "identity",
            Enforced,
            format!(
                "uid {} gid {} inside = {}:{} on the host, no supplementary groups",
                plan.identity.uid,
                plan.identity.gid,
                plan.identity.host_uid,
                plan.identity.host_gid
            ),
        ));
    }

    match cgroup {
        Some(cg) => {
            let inside = sys::read_text(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let rel = cg
                .v2
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let member = inside
                .lines()
                .any(|l| l.starts_with("0::") && l.trim_end().ends_with(&rel))
                || cg.procs().map(|p| p.contains(&pid)).unwrap_or(false);
            out.push(if member {
                ProviderReport::new(
                    "cgroup",
                    Enforced,
                    format!("init is in {} (id {}) from birth", cg.v2.display(), cg.id),
                )
            } else {
                ProviderReport::new(
                    "cgroup",
                    VerificationFailed,
                    format!("init is not listed in {}/cgroup.procs", cg.v2.display()),
                )
            });
            if !cg.applied.is_empty() {
                out.push(match cg.check_v1_membership(&inside) {
                    Ok(joined) if joined.is_empty() => ProviderReport::new(
                        "limits",
                        Enforced,
                        format!("{} (read back)", cg.applied.join(", ")),
                    ),
                    Ok(joined) => ProviderReport::new(
                        "limits",
                        Enforced,
                        format!(
                            "{} (read back); init is in the run's v1 {} cgroups \
                             (/proc/<pid>/cgroup)",
                            cg.applied.join(", "),
                            joined.join(", ")
                        ),
                    ),
                    Err(e) => ProviderReport::new("limits", VerificationFailed, e),
                });
            }
        }
        None => {
            out.push(ProviderReport::new(
                "cgroup",
                if privileged {
                    VerificationFailed
                } else {
                    NotConfigured
                },
                "no cgroup: teardown relies on the pid namespace",
            ));
            if plan.limits.memory.is_some() || plan.limits.pids.is_some() {
                out.push(ProviderReport::new(
                    "limits",
                    NotConfigured,
                    "memory/pids limits need a cgroup",
                ));
            }
        }
    }
    if plan.net == NetPlan::Host {
        out.push(ProviderReport::new(
            "network",
            NotConfigured,
            "host network namespace, unrestricted (--net host)",
        ));
    } else {
        out.push(ProviderReport::new(
            "network",
            Enforced,
            "empty network namespace (loopback only); Landlock refuses TCP bind/connect",
        ));
    }
    out
}

/// A provider report from an eBPF verification.
fn bpf_report(provider: &str, v: &Verification) -> ProviderReport {
    let state = match v.state {
        VerifyState::Enforced => EnforcementState::Enforced,
        VerifyState::VerificationFailed => EnforcementState::VerificationFailed,
    };
    ProviderReport::new(provider, state, v.detail.clone())
}

/// An event as the ledger records it: its kind and data.
fn event_entry(event: &Event, probe_pids: &[u32]) -> (String, serde_json::Value) {
    let (kind, data) = event_data(event, probe_pids);
    (kind.to_owned(), data)
}

fn event_data(event: &Event, probe_pids: &[u32]) -> (&'static str, serde_json::Value) {
    let probe = probe_pids.contains(&event.pid());
    match event {
        Event::Exec(e) => (
            "host.exec",
            serde_json::json!({
                "ts_ns": e.ts_ns, "pid": e.pid, "ppid": e.ppid, "path": e.filename,
                "argv": e.argv, "argv_truncated": e.argv_truncated, "cgroup_id": e.cgroup_id,
                "probe": probe,
            }),
        ),
        Event::Connect(c) => (
            "host.connect",
            serde_json::json!({
                "ts_ns": c.ts_ns, "pid": c.pid, "hook": c.hook.name(), "protocol": c.protocol,
                "dest": c.dest.to_string(), "port": c.port, "mapped": c.mapped,
                "allowed": c.allowed, "cgroup_id": c.cgroup_id, "probe": probe,
            }),
        ),
    }
}

fn forwarded_set() -> libc::sigset_t {
    sys::sigset(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT])
}

/// Holds SIGINT, SIGTERM, SIGHUP and SIGQUIT for the calling thread (and threads it starts
/// later) until a run's `wait` forwards them to the command. Call it before starting threads.
pub fn block_forwarded_signals() {
    let set = forwarded_set();
    // SAFETY: pthread_sigmask with a valid set, on the calling thread only.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

fn unblock_forwarded_signals() {
    let set = forwarded_set();
    // SAFETY: as above.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
}

/// A running sandbox.
#[derive(Debug)]
pub struct LinuxRun {
    pid: i32,
    pidfd: OwnedFd,
    cgroup: Option<RunCgroup>,
    status: BufReader<File>,
    enforcement: Vec<ProviderReport>,
    not_started: Option<Outcome>,
    ns_pid: Option<u64>,
    launched_at: Instant,
    killed: Option<KillReason>,
    exit: Option<ExitStatus>,
    timings: Vec<(String, u64)>,
    registered: Option<(StateDir, String)>,
    observer: Option<Observer>,
    egress: Option<Egress>,
    /// Pids of the verification probes, whose events are labelled as such.
    probe_pids: Vec<u32>,
    /// Host-observed events recorded one by one so far.
    events_recorded: usize,
    /// Events beyond [`EVENT_BUDGET`], counted by kind.
    events_over_budget: std::collections::BTreeMap<String, u64>,
    /// The cleanup of earlier runs' leftovers, going on while the command runs.
    housekeeping: Option<std::thread::JoinHandle<()>>,
    /// Teardown showed every process of the run gone.
    emptied: bool,
    /// The sandbox's mount namespace, let go of once init is gone (`let_go_of_mounts`).
    mount_ns: Option<OwnedFd>,
    /// The thread that takes the sandbox's mounts down, joined in `cleanup`.
    unmounter: Option<Unmounter>,
    /// The thread that does the cleanup (`cleanup`).
    cleaner: Option<Cleaner>,
    /// The sandbox's network namespace, let go of at the end of `cleanup` (see `net_ns` in
    /// `Starting::launch`).
    net_ns: Option<OwnedFd>,
}

impl LinuxRun {
    /// The host pid of the sandbox's init.
    pub fn init_pid(&self) -> i32 {
        self.pid
    }

    /// The run's cgroup, when it has one.
    pub fn cgroup(&self) -> Option<&RunCgroup> {
        self.cgroup.as_ref()
    }

    fn drain_status(&mut self) {
        while let Ok(Some(msg)) = read_message(&mut self.status) {
            if let Message::Exited { code, signal } = msg {
                self.exit = Some(ExitStatus { code, signal });
            }
        }
    }

    fn limit_hit(&self) -> Option<KillReason> {
        let cg = self.cgroup.as_ref()?;
        if cg.oom_kills().unwrap_or(0) > 0 {
            return Some(KillReason::Memory);
        }
        if cg.pids_max_hits().unwrap_or(0) > 0 {
            return Some(KillReason::Pids);
        }
        None
    }

    /// Init is gone: the sandbox's mounts come down on a thread of their own (see
    /// `mount_ns`), while the run is torn down and its end recorded.
    fn let_go_of_mounts(&mut self) {
        if let Some(ns) = self.mount_ns.take() {
            match &self.unmounter {
                // Should its thread be gone, the descriptors come back in the error, dropped
                // here: the mounts then come down on this thread, and init is reaped in
                // `clean_up`.
                Some(u) => {
                    sys::send_elsewhere(&u.thread);
                    drop(u.namespace.try_send((ns, self.pidfd.try_clone().ok())));
                }
                None => drop(ns),
            }
        }
    }

    /// Waits until the sandbox's mounts are down: they came down meanwhile, on the
    /// `Unmounter`'s thread (its wait for the kernel overlaps the rest of the cleanup);
    /// if init's exit was never seen, they come down here.
    fn unmounted(&mut self) {
        drop(self.mount_ns.take());
        if let Some(u) = self.unmounter.take() {
            drop(u.namespace);
            let _ = sys::join_elsewhere(u.thread);
        }
    }

    fn reap_init(&self) {
        let _ = rustix::process::waitid(
            rustix::process::WaitId::PidFd(self.pidfd.as_fd()),
            rustix::process::WaitIdOptions::EXITED,
        );
    }
}

impl Running for LinuxRun {
    fn wait(
        &mut self,
        deadline: Option<Instant>,
        events: EventSink<'_>,
    ) -> Result<Outcome, BackendError> {
        let result = self.wait_inner(deadline, events);
        unblock_forwarded_signals();
        result
    }

    fn kill(&mut self, reason: KillReason) -> Result<(), BackendError> {
        self.killed.get_or_insert(reason);
        match &self.cgroup {
            Some(cg) => cg.kill().map_err(|e| BackendError::new("kill", e)),
            None => rustix::process::pidfd_send_signal(&self.pidfd, rustix::process::Signal::KILL)
                .map_err(|e| BackendError::new("kill", e)),
        }
    }

    fn enforcement(&self) -> Vec<ProviderReport> {
        self.enforcement.clone()
    }

    fn timings(&self) -> Vec<(String, u64)> {
        self.timings.clone()
    }

    fn teardown(&mut self, events: EventSink<'_>) -> Teardown {
        let mut steps = Vec::new();
        cordon_runtime::mark("teardown start");
        let verified = match &self.cgroup {
            // Init, dead or killed here, is reaped in `clean_up`.
            Some(cg) => cg.kill_and_verify(&mut steps),
            None => {
                // No cgroup: killing init tears down its pid namespace; then look for survivors.
                let _ =
                    rustix::process::pidfd_send_signal(&self.pidfd, rustix::process::Signal::KILL);
                self.reap_init();
                steps.push("SIGKILL to init (pid namespace teardown)".into());
                match self.ns_pid {
                    Some(ns) => {
                        let left = processes_in_pid_ns(ns);
                        steps.push(format!(
                            "/proc scan: {} processes left in pid namespace {ns}",
                            left
                        ));
                        left == 0
                    }
                    None => {
                        steps.push("pid namespace unknown; cannot verify".into());
                        false
                    }
                }
            }
        };
        cordon_runtime::mark("cgroup gone");
        if !self.events_over_budget.is_empty() {
            let total: u64 = self.events_over_budget.values().sum();
            events(vec![(
                "host.events-over-budget".to_owned(),
                serde_json::json!({
                    "budget": EVENT_BUDGET,
                    "counted_not_recorded": total,
                    "by_kind": self.events_over_budget,
                }),
            )]);
        }
        if verified {
            // The last events, before the run's end is recorded; the observer itself comes
            // down in `cleanup`: nothing of the run is left to make more.
            if let Some(o) = &mut self.observer {
                match o.drain() {
                    Ok(last) => events(
                        last.iter()
                            .map(|ev| event_entry(ev, &self.probe_pids))
                            .collect(),
                    ),
                    Err(err) => steps.push(format!("observer: the last events unreadable: {err}")),
                }
            }
        } else {
            // Processes of the run may be left: their egress is cut (the pinned block outlives
            // cordon), the observer comes down now with everything it saw, and the run stays
            // registered for `cordon contain`. All of it before the run's end is recorded.
            if let Some(e) = &mut self.egress {
                match e.block_all() {
                    Ok(()) => steps.push(
                        "egress left attached and pinned, blocking everything: the run's \
                         processes were not shown gone"
                            .into(),
                    ),
                    Err(err) => {
                        steps.push(format!("egress left attached; block-all failed: {err}"))
                    }
                }
            }
            if let Some(o) = self.observer.take() {
                match o.release() {
                    Ok(last) => {
                        events(
                            last.iter()
                                .map(|ev| event_entry(ev, &self.probe_pids))
                                .collect(),
                        );
                        steps.push("observer detached".into());
                    }
                    Err(err) => steps.push(format!("observer release failed: {err}")),
                }
            }
            steps.push("the run stays registered for cordon contain".into());
        }
        self.emptied = verified;
        steps.push(format!(
            "run lasted {:.1} ms",
            self.launched_at.elapsed().as_secs_f64() * 1e3
        ));
        Teardown {
            verified_empty: verified,
            steps,
        }
    }

    /// Recording the run's end is mostly a wait for the disk (its fdatasync); the cleanup is a
    /// few hundred microseconds of system calls, done meanwhile by the `Cleaner`, already
    /// started and waiting, brought to this CPU first (`sys::bring_here`): it has the CPU to
    /// itself while the record waits.
    fn cleanup(mut self, record_end: &mut dyn FnMut()) -> Vec<String> {
        let Some(cleaner) = self.cleaner.take() else {
            record_end();
            return self.clean_up();
        };
        sys::bring_here(&cleaner.thread);
        match cleaner.run.send(Box::new(self)) {
            Ok(()) => {
                record_end();
                // The thread is not joined: it ends by itself once it has sent the steps.
                cleaner
                    .steps
                    .recv()
                    .unwrap_or_else(|_| vec!["cleanup panicked".to_owned()])
            }
            // Its thread is gone: the run comes back in the error, cleaned up here.
            Err(std::sync::mpsc::SendError(run)) => {
                record_end();
                run.clean_up()
            }
        }
    }
}

impl LinuxRun {
    /// What `cleanup` does beside the record of the run's end.
    fn clean_up(mut self) -> Vec<String> {
        cordon_runtime::mark("cleanup: started");
        let mut steps = Vec::new();
        // Unless the unmounter did (a no-op then).
        reap_now(&self.pidfd);
        // Egress comes down only once every process of the run is shown gone; otherwise its
        // pinned block stays in force, beyond this process.
        // (Otherwise `teardown` blocked it, and dropping the handle leaves the pinned links and
        // the block in force.)
        if let Some(e) = self.egress.take()
            && self.emptied
        {
            match e.release() {
                Ok(()) => steps.push("egress programs detached and unpinned".into()),
                Err(err) => steps.push(format!("egress release failed: {err}")),
            }
        }
        cordon_runtime::mark("cleanup: egress");
        if let Some(o) = self.observer.take() {
            match o.release() {
                Ok(late) if late.is_empty() => steps.push("observer detached".into()),
                Ok(late) => steps.push(format!(
                    "observer detached; {} events arrived after the run's end was recorded",
                    late.len()
                )),
                Err(err) => steps.push(format!("observer release failed: {err}")),
            }
        }
        if !self.emptied {
            self.unmounted();
            return steps;
        }
        cordon_runtime::mark("cleanup: observer");
        if let Some(cg) = self.cgroup.take() {
            cg.remove(&mut steps);
        }
        cordon_runtime::mark("cleanup: cgroup");
        if let Some((dir, run_id)) = self.registered.take() {
            dir.remove(&run_id);
        }
        cordon_runtime::mark("cleanup: registered");
        // The cleanup of earlier runs' leftovers is not waited for: nothing depends on it, and
        // each of its steps is whole on its own.
        drop(self.housekeeping.take());
        cordon_runtime::mark("cleanup: housekeeping");
        self.unmounted();
        cordon_runtime::mark("cleanup: unmounted");
        // Last, the network namespace: the kernel's worker dismantles it from here on.
        drop(self.net_ns.take());
        cordon_runtime::mark("cleanup: done");
        steps
    }
}

impl LinuxRun {
    /// Delivers the observer's queued events; a read failure is reported as an event too.
    fn drain_events(&mut self, events: EventSink<'_>) {
        let Some(o) = &mut self.observer else {
            return;
        };
        match o.drain() {
            Ok(batch) => {
                let room = EVENT_BUDGET.saturating_sub(self.events_recorded);
                let recorded: Vec<_> = batch
                    .iter()
                    .take(room)
                    .map(|ev| event_entry(ev, &self.probe_pids))
                    .collect();
                self.events_recorded += recorded.len();
                for ev in batch.iter().skip(room) {
                    let key = match ev {
                        Event::Exec(e) => format!("exec {}", e.filename),
                        Event::Connect(c) => format!(
                            "connect {} {}:{} {}",
                            c.hook.name(),
                            c.dest,
                            c.port,
                            if c.allowed { "allowed" } else { "refused" }
                        ),
                    };
                    *self.events_over_budget.entry(key).or_insert(0) += 1;
                }
                events(recorded);
            }
            Err(e) => events(vec![(
                "host.observer-error".to_owned(),
                serde_json::json!({ "error": e.to_string() }),
            )]),
        }
    }

    /// Whether the eBPF programs are still attached, as the kernel says now.
    fn attached_now(&self) -> Vec<(&'static str, Verification)> {
        let mut late = Vec::new();
        if let Some(o) = &self.observer {
            late.push(("observer", o.verify_attached()));
        }
        if let Some(e) = &self.egress {
            late.push(("egress", e.verify_attached()));
        }
        late
    }

    /// Re-checks the eBPF providers at the end of the run: a program detached or a map changed
    /// behind cordon's back while the command ran (`attached`, from [`Self::attached_now`]), or
    /// events lost, turns the provider VERIFICATION_FAILED.
    fn reverify(&mut self, mut late: Vec<(&'static str, Verification)>) {
        if let Some(o) = &self.observer
            && let Ok(n) = o.lost()
            && n > 0
        {
            late.push((
                "observer",
                Verification {
                    state: VerifyState::VerificationFailed,
                    detail: format!("{n} events were lost (the ring buffer was full)"),
                    problems: vec![format!("{n} events lost")],
                    probe_pids: Vec::new(),
                },
            ));
        }
        if !self.events_over_budget.is_empty() {
            let total: u64 = self.events_over_budget.values().sum();
            for p in self
                .enforcement
                .iter_mut()
                .filter(|p| p.provider == "observer")
            {
                if p.state == EnforcementState::Enforced {
                    p.state = EnforcementState::Degraded;
                    p.detail = format!(
                        "{total} events beyond the budget of {EVENT_BUDGET} were counted by kind, \
                         not recorded one by one"
                    );
                }
            }
        }
        for (provider, v) in late {
            if v.state == VerifyState::VerificationFailed {
                for p in self
                    .enforcement
                    .iter_mut()
                    .filter(|p| p.provider == provider)
                {
                    p.state = EnforcementState::VerificationFailed;
                    p.detail = format!("at the end of the run: {}", v.detail);
                }
            }
        }
    }

    fn wait_inner(
        &mut self,
        deadline: Option<Instant>,
        events: EventSink<'_>,
    ) -> Result<Outcome, BackendError> {
        use rustix::event::{PollFd, PollFlags, poll};
        let sigfd = signalfd().map_err(|e| BackendError::new("signals", e))?;
        let poll_limits = self.cgroup.is_some();
        // Init reports the command's exit, then exits itself, which takes the kernel a few
        // hundred microseconds here (its pid namespace, its memory): the checks that need no
        // more than the command gone are made meanwhile.
        let mut status_open = true;
        let mut attached = None;
        loop {
            self.drain_events(events);
            if let Some(reason) = self.limit_hit() {
                self.kill(reason)?;
                break;
            }
            let mut timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if timeout == Some(Duration::ZERO) {
                self.kill(KillReason::Timeout)?;
                break;
            }
            if poll_limits {
                timeout = Some(timeout.map_or(LIMIT_POLL, |t| t.min(LIMIT_POLL)));
            }
            let ts = timeout.map(|t| rustix::time::Timespec {
                tv_sec: t.as_secs() as i64,
                tv_nsec: i64::from(t.subsec_nanos()),
            });
            // A message already read into the buffer is not announced by the pipe again.
            let buffered = status_open && !self.status.buffer().is_empty();
            // Once done with, the pipe is left out: its hangup would end every poll at once.
            let mut fds = vec![
                PollFd::new(&self.pidfd, PollFlags::IN),
                PollFd::new(&sigfd, PollFlags::IN),
            ];
            if status_open {
                fds.push(PollFd::new(self.status.get_ref(), PollFlags::IN));
            }
            let zero = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            match poll(&mut fds, if buffered { Some(&zero) } else { ts.as_ref() }) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(BackendError::new("poll", e)),
            }
            let exited = fds[0].revents().contains(PollFlags::IN);
            let signalled = fds[1].revents().contains(PollFlags::IN);
            let said = buffered
                || fds.get(2).is_some_and(|f| {
                    f.revents()
                        .intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR)
                });
            drop(fds);
            if said && !exited {
                // Init writes each message whole, in one write of less than a pipe's atomic
                // size: a readable pipe holds a whole line, and reading it does not block.
                match read_message(&mut self.status) {
                    Ok(Some(Message::Exited { code, signal })) => {
                        self.exit = Some(ExitStatus { code, signal });
                        status_open = false;
                        attached = Some(self.attached_now());
                        // Init exits right after (~0.1-0.3 ms here): its exit is waited for
                        // awake, so that this CPU does not halt in between.
                        sys::spin_until_readable(&self.pidfd, INIT_EXIT_SPIN);
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => status_open = false,
                }
            }
            if signalled {
                let mut info = [0u8; 128];
                if let Ok(n) = rustix::io::read(&sigfd, &mut info)
                    && n >= 4
                {
                    let signo = u32::from_ne_bytes([info[0], info[1], info[2], info[3]]);
                    if let Some(sig) = rustix::process::Signal::from_named_raw(signo as i32) {
                        let _ = rustix::process::pidfd_send_signal(&self.pidfd, sig);
                    }
                }
            }
            if exited {
                cordon_runtime::mark("init exited");
                break;
            }
        }
        // Init has exited (or everything was just killed): collect what it said and reap it.
        if self.killed.is_some()
            && let Some(cg) = &self.cgroup
        {
            let _ = cg.wait_empty(Duration::from_secs(2));
        }
        // Reaped by the unmounter or in `clean_up`, off the run's end: a zombie is out of its
        // cgroup already.
        if self.cgroup.is_none() {
            self.reap_init();
        }
        self.let_go_of_mounts();
        self.drain_status();
        self.drain_events(events);
        let attached = attached.unwrap_or_else(|| self.attached_now());
        self.reverify(attached);
        if let Some(outcome) = self.not_started.take() {
            return Ok(outcome);
        }
        if self.killed.is_none()
            && let Some(reason) = self.limit_hit()
        {
            self.killed = Some(reason);
        }
        if self.killed.is_none()
            && let Some((dir, run_id)) = &self.registered
            && dir.is_contained(run_id)
        {
            self.killed = Some(KillReason::Containment);
        }
        Ok(match self.killed {
            Some(reason) => Outcome::Killed {
                reason,
                status: self.exit,
            },
            None => match self.exit {
                Some(status) => Outcome::Exited(status),
                None => {
                    return Err(BackendError::new(
                        "init",
                        "the sandbox's init ended without reporting the command's exit",
                    ));
                }
            },
        })
    }
}

fn signalfd() -> io::Result<OwnedFd> {
    let set = forwarded_set();
    // SAFETY: signalfd(-1, set, flags) creates a new descriptor; `set` is valid for the call.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: signalfd returned a new descriptor that nothing else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// How many processes visible in `/proc` belong to the pid namespace with inode `ns`.
fn processes_in_pid_ns(ns: u64) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return usize::MAX;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| ns_inode(*pid, "pid") == Some(ns))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The threads `/proc/self/task` lists now.
    fn tids() -> Vec<i32> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
            .collect()
    }

    /// `only_threads` sees a thread it was not told of (the negative control), and accepts it
    /// once named.
    #[test]
    fn only_the_threads_named_may_be_listed() {
        let before = tids();
        assert!(only_threads(&before).unwrap());
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            tid_tx
                .send(rustix::thread::gettid().as_raw_nonzero().get())
                .unwrap();
            rx.recv().ok();
        });
        let tid = tid_rx.recv().unwrap();
        assert!(!only_threads(&before).unwrap(), "an unnamed thread is seen");
        let mut named = before.clone();
        named.push(tid);
        assert!(only_threads(&named).unwrap());
        drop(tx);
        other.join().unwrap();
    }

    /// A validated plan for `/bin/true` with `/usr` readable.
    fn plan() -> Plan {
        cordon_runtime::RunSpec {
            command: vec!["/bin/true".into()],
            read: vec!["/usr".into()],
            base_dir: std::env::temp_dir(),
            ..cordon_runtime::RunSpec::default()
        }
        .validate("t")
        .unwrap()
    }

    /// What init reports after building a full boundary (one seccomp program).
    fn ready() -> Ready {
        Ready {
            landlock: "full".to_owned(),
            landlock_abi: 7,
            seccomp_programs: 1,
            mounts: 10,
            groups_dropped: true,
            memfd_exec_refused: None,
            timings: Vec::new(),
        }
    }

    /// The host-side check must not pass a process that is not confined: run against a plain
    /// `sleep` (the negative control of every ENFORCED it reports for a real run), each
    /// mechanism reports VERIFICATION_FAILED.
    #[test]
    fn host_side_verification_fails_an_unconfined_process() {
        if !crate::privileged("host_side_verification_fails_an_unconfined_process") {
            return;
        }
        let plan = plan();
        let mut sleeper = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(sleeper.id()).unwrap();
        let ready = Ready {
            seccomp_programs: 3,
            ..ready()
        };
        let mut reports = verify(pid, &plan, &ready, 0, true, None);
        reports.push(verify_namespaces(NsDir::open(pid).as_ref(), &plan, &[]));
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        let state = |name: &str| {
            reports
                .iter()
                .find(|p| p.provider == name)
                .map(|p| p.state)
                .unwrap_or_else(|| panic!("no {name} in {reports:?}"))
        };
        for name in [
            "namespaces",
            "capabilities",
            "no_new_privs",
            "seccomp",
            "cgroup",
        ] {
            assert_eq!(
                state(name),
                EnforcementState::VerificationFailed,
                "{name}: {reports:?}"
            );
        }
    }

    /// Init must be in the very network namespace cordon made ahead: a process in it passes; one
    /// in another new (empty) namespace, and one in the host's, do not.
    #[test]
    fn init_must_be_in_the_network_namespace_made_for_it() {
        use std::os::unix::process::CommandExt;
        if !crate::privileged("init_must_be_in_the_network_namespace_made_for_it") {
            return;
        }
        let made = netns::prepare().unwrap().wait().unwrap();
        let sleep = || {
            let mut cmd = std::process::Command::new("/bin/sleep");
            cmd.arg("30");
            cmd
        };
        let mut inside = sleep();
        let fd = made.as_fd().try_clone_to_owned().unwrap();
        // SAFETY: the hook runs in the forked child before exec and makes one system call
        // (setns) on a descriptor the child inherited.
        unsafe { inside.pre_exec(move || netns::enter(&fd)) };
        let mut other = sleep();
        let unshare = || {
            // SAFETY: the network namespace alone, in a child about to exec.
            unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }
                .map_err(Into::into)
        };
        // SAFETY: as above, one system call (unshare).
        unsafe { other.pre_exec(unshare) };
        let mut children = [
            inside.spawn().unwrap(),
            other.spawn().unwrap(),
            sleep().spawn().unwrap(),
        ];
        let held: Vec<bool> = children
            .iter()
            .map(|c| {
                let pid = i32::try_from(c.id()).unwrap();
                NsDir::open(pid).and_then(|d| d.inode("net")) == Some(made.inode())
            })
            .collect();
        for c in &mut children {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        assert_eq!(held, [true, false, false]);
    }

    /// Namespaces cordon made ahead must be the very ones init is in: a process in new
    /// namespaces of every kind passes when each prepared inode is its own, and fails, naming
    /// the kind, when the prepared mount or network namespace is another one (the negative
    /// control, with the same process).
    #[test]
    fn init_must_be_in_every_namespace_made_for_it() {
        if !crate::privileged("init_must_be_in_every_namespace_made_for_it") {
            return;
        }
        let plan = plan();
        let mut inside = std::process::Command::new("unshare")
            .args([
                "--user", "--pid", "--mount", "--ipc", "--uts", "--cgroup", "--net", "--fork",
            ])
            .args(["/bin/sleep", "30"])
            .spawn()
            .unwrap();
        // The sleep, once unshare has forked it (the namespaces are the sleep's).
        let parent = i32::try_from(inside.id()).unwrap();
        let mut pid = None;
        for _ in 0..500 {
            pid = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
                .ok()
                .and_then(|c| c.split_whitespace().next().and_then(|p| p.parse().ok()))
                .filter(|p: &i32| {
                    std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c == "sleep\n")
                });
            if pid.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let pid = pid.expect("the unshared sleep did not start");
        let dir = NsDir::open(pid);
        let own = |ns: &str| dir.as_ref().and_then(|d| d.inode(ns)).unwrap();
        let mine = verify_namespaces(
            dir.as_ref(),
            &plan,
            &[
                ("net", own("net")),
                ("ipc", own("ipc")),
                ("uts", own("uts")),
                ("mnt", own("mnt")),
            ],
        );
        let host_mnt = ns_inode(std::process::id() as i32, "mnt").unwrap();
        let other_mnt = verify_namespaces(dir.as_ref(), &plan, &[("mnt", host_mnt)]);
        let other_net = verify_namespaces(dir.as_ref(), &plan, &[("net", own("net") + 1)]);
        // The sleep is pid 1 of its namespace: killed itself, it takes nothing along.
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::KILL,
        );
        inside.kill().unwrap();
        inside.wait().unwrap();
        assert_eq!(mine.state, EnforcementState::Enforced, "{mine:?}");
        assert!(
            mine.detail.contains("net, ipc, uts, mnt made by cordon"),
            "{mine:?}"
        );
        for (report, kind) in [(&other_mnt, "mnt"), (&other_net, "net")] {
            assert_eq!(
                report.state,
                EnforcementState::VerificationFailed,
                "{report:?}"
            );
            assert!(
                report.detail.contains(&format!("{kind} (inode")),
                "{report:?}"
            );
        }
    }

    /// A seccomp filter the process under check inherited does not count as init's own: a
    /// `sleep` under one allow-all filter passes the seccomp check when cordon runs under none,
    /// and fails it when cordon itself runs under one (the filter would then be cordon's).
    #[test]
    fn an_inherited_seccomp_filter_does_not_stand_in_for_inits() {
        if !crate::privileged("an_inherited_seccomp_filter_does_not_stand_in_for_inits") {
            return;
        }
        use std::os::unix::process::CommandExt;
        let plan = plan();
        let mut command = std::process::Command::new("/bin/sleep");
        command.arg("30");
        let allow_all = || -> std::io::Result<()> {
            let allow = [libc::sock_filter {
                code: 0x06,
                jt: 0,
                jf: 0,
                k: 0x7fff_0000,
            }];
            let prog = libc::sock_fprog {
                len: 1,
                filter: allow.as_ptr().cast_mut(),
            };
            // SAFETY: PR_SET_NO_NEW_PRIVS takes integers only.
            if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: the program lives on this stack frame for the call.
            let r = unsafe {
                libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &prog)
            };
            if r != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        // SAFETY: between fork and exec the child only makes two system calls on a filter
        // program that lives on its own stack.
        unsafe { command.pre_exec(allow_all) };
        let mut sleeper = command.spawn().unwrap();
        let pid = i32::try_from(sleeper.id()).unwrap();
        let ready = ready();
        let seccomp = |inherited| {
            verify(pid, &plan, &ready, inherited, true, None)
                .into_iter()
                .find(|p| p.provider == "seccomp")
                .unwrap()
        };
        let own = seccomp(0);
        let inherited = seccomp(1);
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        assert_eq!(own.state, EnforcementState::Enforced, "{own:?}");
        assert_eq!(
            inherited.state,
            EnforcementState::VerificationFailed,
            "{inherited:?}"
        );
    }
}
