//! cordon's Linux process backend: runs a command inside a boundary built from kernel
//! mechanisms — a cgroup it is born into, new user/pid/mount/net/ipc/uts/cgroup namespaces, a
//! minimal read-only root, no capabilities, `no_new_privs`, Landlock and a default-kill seccomp
//! allowlist — checks that boundary from the host before the command starts, and tears it down
//! verifiably.
//!
//! The launcher ([`LinuxBackend`]) and the sandbox's init ([`init::main`]) are the two halves;
//! [`proto`] is what they say to each other.

pub mod caps;
pub mod cgroup;
pub mod contain;
pub mod init;
pub mod landlock;
mod launcher;
pub mod mounts;
pub mod proto;
pub mod seccomp;
pub mod state;
pub mod sys;

pub use launcher::{LinuxBackend, LinuxRun, block_forwarded_signals};
