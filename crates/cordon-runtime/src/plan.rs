//! The launch plan: a small, already-checked description of the boundary, all the launcher
//! receives. Nothing in a plan needs validating again; the launcher only applies it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::spec::Limits;

/// Everything a backend needs to start one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Identifies the run in reports, cgroup names and the ledger.
    pub run_id: String,
    /// The command and its arguments.
    pub argv: Vec<String>,
    /// The complete environment of the command, sorted by name.
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox (absolute, visible inside).
    pub cwd: PathBuf,
    /// Host paths to make visible, parents before children, at the same path inside.
    pub mounts: Vec<Mount>,
    /// Kernel-enforced access rules (Landlock).
    pub landlock: LandlockPlan,
    /// Network.
    pub net: NetPlan,
    /// Resource limits.
    pub limits: Limits,
    /// Who the command runs as.
    pub identity: Identity,
    /// Hostname inside the sandbox's UTS namespace ([`HOSTNAME`]).
    pub hostname: String,
    /// Whether a mechanism that is not fully in force may be accepted (marked in the report).
    pub allow_degraded: bool,
    /// Hex SHA-256 of the plan without its run id: what the ledger records as "the spec".
    pub spec_hash: String,
}

/// The hostname every sandbox gets: a UTS namespace made ahead of a run (as root) is given it
/// before the plan is known.
pub const HOSTNAME: &str = "cordon";

/// One path made visible inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// The canonical host path, also the path inside.
    pub path: PathBuf,
    /// How it is made visible.
    pub kind: MountKind,
    /// For a bind: the `(device, inode)` the path named when the spec was checked. The
    /// launcher binds the path only if it still names the same file and is reached without
    /// following a symlink, so a grant cannot be swapped between the check and the mount.
    pub id: Option<(u64, u64)>,
}

/// How a path is made visible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MountKind {
    /// A read-only, nosuid, nodev bind of the host path.
    ReadOnly,
    /// A read-write, nosuid, nodev bind of the host path.
    ReadWrite,
    /// A symlink to the given path, as on the host (e.g. `/bin` -> `/usr/bin`).
    Symlink(PathBuf),
}

/// Access rules for Landlock. Paths are canonical and refer to the sandbox's own tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockPlan {
    /// Readable trees.
    pub read: Vec<PathBuf>,
    /// Readable and writable trees.
    pub write: Vec<PathBuf>,
    /// When `Some`, execution is allowed only beneath these paths; otherwise wherever readable.
    pub exec: Option<Vec<PathBuf>>,
    /// Refuse TCP bind and connect (every port): the command has no network, or its network is
    /// the allowlist's business (eBPF) and not a port list.
    pub restrict_tcp: bool,
}

/// The network a run gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NetPlan {
    /// A new network namespace with loopback only.
    None,
    /// The host's network namespace.
    Host,
    /// The host's network namespace, restricted to these destinations.
    Allow(Vec<AllowRule>),
}

/// One destination of an egress allowlist: an IP block and optionally one port. Host names in a
/// policy are resolved (at launch, by the caller) into one rule per address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllowRule {
    /// The network address.
    pub net: std::net::IpAddr,
    /// The prefix length.
    pub prefix: u8,
    /// The one port allowed, or every port.
    pub port: Option<u16>,
    /// What the policy or flag said (`api.example.com:443`), for the evidence.
    pub source: String,
}

/// The identity of the command: a non-root id inside its user namespace, mapped to a non-root id
/// on the host. Nothing else is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// User id inside the user namespace (never 0).
    pub uid: u32,
    /// Group id inside the user namespace (never 0).
    pub gid: u32,
    /// The host uid it maps to (never 0).
    pub host_uid: u32,
    /// The host gid it maps to (never 0).
    pub host_gid: u32,
}

impl Default for Identity {
    fn default() -> Self {
        Identity {
            uid: 1000,
            gid: 1000,
            host_uid: 65534,
            host_gid: 65534,
        }
    }
}
