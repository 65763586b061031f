//! What the launcher and the sandbox's init tell each other.
//!
//! The launcher passes an [`InitConfig`] in a sealed memfd whose number is init's only argument,
//! and drives init through a sync pipe: one byte `G` ("your user namespace is mapped and your
//! cgroups joined: build the sandbox") and one byte `X` ("the boundary checked out: start the
//! command"). End of file on the sync pipe means "stop": init exits without starting anything.
//! Init answers with newline-delimited JSON [`Message`]s on the status pipe.

use serde::{Deserialize, Serialize};

use cordon_runtime::Plan;

/// Byte that lets init build the sandbox.
pub const GO_BUILD: u8 = b'G';
/// Byte that lets init start the command.
pub const GO_EXEC: u8 = b'X';

/// The first argument (`argv[0]`) init is started with; `cordon`'s `main` dispatches on it.
pub const INIT_ARGV0: &str = "cordon-init";

/// Everything init needs.
#[derive(Debug, Serialize, Deserialize)]
pub struct InitConfig {
    /// The plan.
    pub plan: Plan,
    /// The read end of the sync pipe.
    pub sync_fd: i32,
    /// The write end of the status pipe.
    pub status_fd: i32,
    /// Started by an ordinary user: supplementary groups cannot be dropped (`setgroups` is denied
    /// in an unprivileged user namespace).
    pub unprivileged: bool,
    /// `(name, value)` for `/proc/sys/user/<name>` in the run's user namespace: per-user kernel
    /// resources that count against the namespace's creator too, bounded below the creator's.
    pub user_ns_limits: Vec<(String, u64)>,
    /// Init brings loopback up itself: its empty network namespace came with the clone. (As root
    /// the launcher makes the namespace ahead, loopback up, and init has no say over it.)
    pub loopback: bool,
    /// Init names the host itself: its UTS namespace came with the clone. (As root the launcher
    /// makes the namespace ahead, named, and init has no say over it.)
    pub hostname: bool,
    /// The tree built ahead on the host (`mounts::build_ahead`; root, and init forked): init was
    /// cloned into its mount namespace, rooted in it, and the launcher mounted `/proc` there
    /// before the first go; the mounts it holds, `/proc` included. `None`: init builds the tree
    /// itself.
    pub tree: Option<usize>,
    /// The Landlock ruleset made in the tree built ahead (`mounts::Tree::landlock`): the
    /// descriptor init inherits and how fully it is enforced. `None`: init makes it.
    pub landlock: Option<(i32, crate::landlock::Enforcement)>,
}

/// What init reports once the boundary is in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    /// `full`, `partial` or `none`.
    pub landlock: String,
    /// The kernel's Landlock ABI.
    pub landlock_abi: i32,
    /// Number of seccomp programs installed.
    pub seccomp_programs: usize,
    /// Mounts made, for the evidence.
    pub mounts: usize,
    /// Whether supplementary groups were dropped.
    pub groups_dropped: bool,
    /// Under `--exec`: whether executing memfds is refused in the run's pid namespace
    /// (`vm.memfd_noexec = 2`; only root can set it). `None` without `--exec`.
    pub memfd_exec_refused: Option<bool>,
    /// How long each stage took inside, in microseconds, in order.
    pub timings: Vec<(String, u64)>,
}

/// A report from init.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// The boundary is in place; init waits for [`GO_EXEC`].
    Ready(Ready),
    /// The command was executed (its pid inside the sandbox).
    Started {
        /// Pid inside the sandbox's pid namespace.
        pid: i32,
    },
    /// The command could not be executed.
    ExecFailed {
        /// The errno of the last `execve` attempt that mattered.
        errno: i32,
        /// What was tried.
        command: String,
    },
    /// The command ended.
    Exited {
        /// Its exit code, if it exited.
        code: Option<i32>,
        /// The signal that killed it, if one did.
        signal: Option<i32>,
    },
    /// Building the sandbox failed.
    Error {
        /// The stage (`mounts`, `landlock`, …).
        stage: String,
        /// What happened.
        message: String,
    },
}
