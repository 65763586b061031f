//! Landlock: the kernel's own record of which files the command may read, write and execute,
//! whether it may bind or connect TCP ports, and that it may neither reach abstract UNIX sockets
//! nor signal processes outside its domain. Applied inside the sandbox after `pivot_root`, so the
//! rules name the sandbox's own tree.

use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

use cordon_runtime::LandlockPlan;

/// The ABI whose rights cordon asks for: filesystem incl. `REFER`, `TRUNCATE`, `IOCTL_DEV`; TCP
/// bind/connect; abstract-UNIX and signal scoping.
pub const TARGET_ABI: ABI = ABI::V6;

/// Errors building or applying the ruleset.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// The ruleset could not be created or restricted.
    #[error("landlock: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    /// A rule's path could not be opened.
    #[error("landlock rule for {path}: {source}")]
    Path {
        /// The path.
        path: PathBuf,
        /// Why.
        source: landlock::PathFdError,
    },
}

/// How completely the ruleset is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// Every right asked for is enforced.
    Full,
    /// The kernel lacks some of the rights asked for.
    Partial,
    /// The kernel has no Landlock.
    None,
}

/// Paths the sandbox itself provides, with the access the command gets to them.
fn sandbox_paths(exec_anywhere: bool) -> Vec<(&'static str, BitFlags<AccessFs>)> {
    let abi = TARGET_ABI;
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let dev_rw = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
    let mut scratch = AccessFs::from_all(abi) & !AccessFs::MakeChar & !AccessFs::MakeBlock;
    if !exec_anywhere {
        scratch &= !AccessFs::Execute;
    }
    vec![
        // Listing directories of the (minimal, read-only) root is harmless and expected.
        ("/", AccessFs::ReadDir.into()),
        ("/proc", read),
        ("/etc/passwd", AccessFs::ReadFile.into()),
        ("/etc/group", AccessFs::ReadFile.into()),
        ("/etc/hosts", AccessFs::ReadFile.into()),
        ("/dev", AccessFs::ReadDir.into()),
        ("/dev/null", dev_rw),
        ("/dev/zero", dev_rw),
        ("/dev/full", dev_rw),
        ("/dev/random", dev_rw),
        ("/dev/urandom", dev_rw),
        ("/dev/tty", dev_rw),
        ("/dev/pts", dev_rw | AccessFs::ReadDir),
        ("/dev/ptmx", dev_rw),
        ("/dev/shm", scratch),
        ("/tmp", scratch),
    ]
}

/// Builds the ruleset for `plan` and restricts the calling thread (and its future children).
/// `no_new_privs` must already be set.
pub fn apply(plan: &LandlockPlan) -> Result<Enforcement, LandlockError> {
    let abi = TARGET_ABI;
    let exec_anywhere = plan.exec.is_none();
    let execute: BitFlags<AccessFs> = AccessFs::Execute.into();
    let mut read = AccessFs::from_read(abi);
    let mut write = AccessFs::from_all(abi);
    if !exec_anywhere {
        read &= !execute;
        write &= !execute;
    }

    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        .scope(Scope::from_all(abi))?;
    if plan.restrict_tcp {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
    }
    let mut created = ruleset.create()?;

    // (path, access, whether the sandbox itself provides it: then it may be absent)
    let mut rules: Vec<(PathBuf, BitFlags<AccessFs>, bool)> = sandbox_paths(exec_anywhere)
        .into_iter()
        .map(|(p, access)| (PathBuf::from(p), access, true))
        .collect();
    rules.extend(plan.read.iter().map(|p| (p.clone(), read, false)));
    rules.extend(plan.write.iter().map(|p| (p.clone(), write, false)));
    if let Some(exec) = &plan.exec {
        let run = AccessFs::Execute | AccessFs::ReadFile | AccessFs::ReadDir;
        rules.extend(exec.iter().map(|p| (p.clone(), run, false)));
    }
    for (path, access, optional) in rules {
        let fd = match PathFd::new(&path) {
            Ok(fd) => fd,
            Err(_) if optional && std::fs::symlink_metadata(&path).is_err() => continue,
            Err(source) => {
                return Err(LandlockError::Path {
                    path: path.clone(),
                    source,
                });
            }
        };
        // A rule on a non-directory may only carry file rights (the opened file's type, not
        // another walk of the path).
        let is_dir = rustix::fs::fstat(&fd).is_ok_and(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
        });
        let access = if is_dir {
            access
        } else {
            access & AccessFs::from_file(abi)
        };
        created = created.add_rule(PathBeneath::new(fd, access))?;
    }
    // No TCP port rules: with `restrict_tcp` every bind and connect is refused.

    let status = created.restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforcement::Full,
        RulesetStatus::PartiallyEnforced => Enforcement::Partial,
        RulesetStatus::NotEnforced => Enforcement::None,
    })
}

/// The Landlock ABI the running kernel offers (0 when it has none).
pub fn kernel_abi() -> i32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only returns the
    // ABI version; no memory is read or written.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}
