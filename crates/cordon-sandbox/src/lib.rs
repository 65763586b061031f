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
pub mod keeper;
pub mod landlock;
mod launcher;
pub mod mounts;
pub mod netns;
pub mod pool;
pub mod proto;
pub mod seccomp;
pub mod state;
pub mod sys;
pub mod thread;

pub use launcher::{LinuxBackend, LinuxRun, block_forwarded_signals};

/// Whether a unit test that needs root can run: without root it prints why and skips, and with
/// `CORDON_REQUIRE_PRIVILEGED=1` (set by CI) a skip is a failure.
#[cfg(test)]
pub(crate) fn privileged(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    let msg = format!("SKIP {test}: needs root");
    if std::env::var_os("CORDON_REQUIRE_PRIVILEGED").is_some_and(|v| v == "1") {
        panic!("{msg}; CORDON_REQUIRE_PRIVILEGED=1 turns this skip into a failure");
    }
    eprintln!("{msg}");
    false
}
