//! Capabilities: the sandbox's init holds every capability in its own user namespace while it
//! builds the mount tree; before anything of the command runs, all of them go, from every set
//! (bounding, ambient, inheritable, permitted, effective), and the securebits are locked so that
//! no uid transition can bring them back.

use std::io;

/// `SECBIT_*` values (`include/uapi/linux/securebits.h`).
const SECBIT_NOROOT: u32 = 1 << 0;
const SECBIT_NOROOT_LOCKED: u32 = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: u32 = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: u32 = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: u32 = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: u32 = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: u32 = 1 << 7;

/// `_LINUX_CAPABILITY_VERSION_3` (`include/uapi/linux/capability.h`).
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `CAP_MKNOD`.
pub const CAP_MKNOD: u32 = 27;

/// Raises `cap` (below 32) into the calling thread's effective set, from its permitted set
/// (`capset` applies to the calling thread alone).
pub fn raise_effective(cap: u32) -> io::Result<()> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: `header` is a valid v3 header and `data` the two-element array v3 requires; both
    // live across the call, which writes only `data`.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    data[0].effective |= 1 << cap;
    // SAFETY: as above; capset only reads `data`.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> io::Result<()> {
    // SAFETY: the prctl options used here take integer arguments only and touch no memory.
    let r = unsafe { libc::prctl(option, arg2, 0 as libc::c_ulong, 0 as libc::c_ulong, 0) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Makes every capability of the current user namespace survive the next `execve`: fills the
/// inheritable set and raises each capability into the ambient set (ambient capabilities are
/// kept across exec of an ordinary binary). Used between `clone` and the exec of the sandbox's
/// init, which needs its namespace capabilities to build the boundary and drops them all itself.
///
/// Async-signal-safe: only `capset` and `prctl`, on stack data.
pub fn keep_across_exec(last_cap: u32) -> io::Result<()> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let all = CapData {
        effective: u32::MAX,
        permitted: u32::MAX,
        inheritable: u32::MAX,
    };
    let data = [all; 2];
    // SAFETY: `header` is a valid v3 header and `data` the two-element array v3 requires; both
    // live across the call, which only reads `data`. Bits the kernel does not know are ignored
    // by masking against the bounding set (the kernel rejects none of them for a full set).
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    for cap in 0..=last_cap {
        prctl_ambient_raise(cap)?;
    }
    Ok(())
}

fn prctl_ambient_raise(cap: u32) -> io::Result<()> {
    // SAFETY: PR_CAP_AMBIENT/PR_CAP_AMBIENT_RAISE take integer arguments only.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
            libc::c_ulong::from(cap),
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The highest capability number this kernel knows.
pub fn last_cap() -> u32 {
    crate::sys::read_text("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// Drops every capability from every set and locks the securebits. Needs `CAP_SETPCAP` in the
/// current user namespace on entry (the sandbox's init has it).
pub fn drop_all() -> io::Result<()> {
    for cap in 0..=last_cap() {
        match prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap)) {
            Ok(()) => {}
            // Capabilities newer than the headers the kernel was built with.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
    )?;
    let bits = SECBIT_NOROOT
        | SECBIT_NOROOT_LOCKED
        | SECBIT_NO_SETUID_FIXUP
        | SECBIT_NO_SETUID_FIXUP_LOCKED
        | SECBIT_KEEP_CAPS_LOCKED
        | SECBIT_NO_CAP_AMBIENT_RAISE
        | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    prctl(libc::PR_SET_SECUREBITS, libc::c_ulong::from(bits))?;

    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: `header` is a valid v3 header and `data` the two-element array v3 requires; both
    // outlive the call, which only reads `data`.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The capability sets of a process as `/proc/<pid>/status` shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusCaps {
    /// `CapInh`, `CapPrm`, `CapEff`, `CapBnd`, `CapAmb`.
    pub sets: [u64; 5],
    /// `NoNewPrivs`.
    pub no_new_privs: bool,
    /// `Seccomp` mode (2 = filter).
    pub seccomp_mode: u32,
    /// `Seccomp_filters`.
    pub seccomp_filters: u32,
    /// `Threads` (0 when the line is missing: never "one thread" by default). A process cloned
    /// from a single-threaded one may do anything its parent could; one cloned from a
    /// multithreaded one only async-signal-safe things (another thread may hold a lock, the
    /// allocator's among them, that stays held forever in the copy).
    pub threads: u32,
}

impl StatusCaps {
    /// Parses the fields of interest from `/proc/<pid>/status` text.
    /// A field the text lacks reads as "everything" (all bits set, no `no_new_privs`, no
    /// seccomp), so that a truncated or foreign file can never pass for a confined process.
    pub fn parse(status: &str) -> Self {
        let mut out = StatusCaps {
            sets: [u64::MAX; 5],
            ..StatusCaps::default()
        };
        for line in status.lines() {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let v = v.trim();
            let hex = || u64::from_str_radix(v, 16).unwrap_or(u64::MAX);
            match k {
                "CapInh" => out.sets[0] = hex(),
                "CapPrm" => out.sets[1] = hex(),
                "CapEff" => out.sets[2] = hex(),
                "CapBnd" => out.sets[3] = hex(),
                "CapAmb" => out.sets[4] = hex(),
                "NoNewPrivs" => out.no_new_privs = v == "1",
                "Seccomp" => out.seccomp_mode = v.parse().unwrap_or(0),
                "Seccomp_filters" => out.seccomp_filters = v.parse().unwrap_or(0),
                "Threads" => out.threads = v.parse().unwrap_or(0),
                _ => {}
            }
        }
        out
    }

    /// Reads `/proc/<pid>/status`.
    pub fn read(pid: i32) -> io::Result<Self> {
        Ok(Self::parse(&crate::sys::read_text(format!(
            "/proc/{pid}/status"
        ))?))
    }

    /// Whether every capability set is empty.
    pub fn no_capabilities(&self) -> bool {
        self.sets.iter().all(|&s| s == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status() {
        let s = "Name:\tsh\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
                 CapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n\
                 NoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t3\n";
        let c = StatusCaps::parse(s);
        assert!(c.no_capabilities());
        assert!(c.no_new_privs);
        assert_eq!((c.seccomp_mode, c.seccomp_filters), (2, 3));
        let root = StatusCaps::parse("CapEff:\t000001ffffffffff\n");
        assert!(!root.no_capabilities());
    }

    #[test]
    fn missing_fields_fail_closed() {
        let c = StatusCaps::parse("Name:\tx\n");
        assert!(!c.no_capabilities());
        assert!(!c.no_new_privs);
        assert_eq!(c.seccomp_mode, 0);
    }
}
