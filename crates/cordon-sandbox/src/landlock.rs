//! Landlock: the kernel's own record of which files the command may read, write and execute,
//! whether it may bind or connect TCP ports, and that it may neither reach abstract UNIX sockets
//! nor signal processes outside its domain. The rules name the sandbox's own tree: they are made
//! inside it, after `pivot_root`, by init ([`apply`]) or, as root, by the thread that built the
//! tree ahead ([`prepare`], with the launcher adding `/proc`'s rule once it has mounted it,
//! [`Prepared::allow_proc`]), and init then only restricts itself with them ([`restrict`]).

use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
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
        source: std::io::Error,
    },
}

/// How completely the ruleset is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    let (created, _) = build(plan, false)?;
    let status = created.restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforcement::Full,
        RulesetStatus::PartiallyEnforced => Enforcement::Partial,
        RulesetStatus::NotEnforced => Enforcement::None,
    })
}

/// A ruleset made ahead of init, in the tree (see the module documentation), but for `/proc`'s
/// rule: a descriptor init inherits and restricts itself with ([`restrict`]), and how fully
/// the kernel will enforce it.
#[derive(Debug)]
pub struct Prepared {
    fd: std::os::fd::OwnedFd,
    enforcement: Enforcement,
}

/// Builds the ruleset for `plan` from inside the tree built ahead, all but `/proc`'s rule,
/// without restricting anyone. `None` when the kernel has no Landlock (init then finds out
/// itself, as without a tree built ahead).
pub fn prepare(plan: &LandlockPlan) -> Result<Option<Prepared>, LandlockError> {
    let (created, enforcement) = build(plan, true)?;
    let fd: Option<std::os::fd::OwnedFd> = created.into();
    Ok(fd.map(|fd| Prepared { fd, enforcement }))
}

impl Prepared {
    /// Adds `/proc`'s rule (read files, list directories), `/proc` as the calling thread sees
    /// it: the run's, mounted in the tree.
    pub fn allow_proc(&self) -> std::io::Result<()> {
        let proc = rustix::fs::open(
            "/proc",
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        let access = AccessFs::ReadFile | AccessFs::ReadDir;
        add_path_rule(&self.fd, &proc, access.bits())
    }

    /// The ruleset's descriptor, which a forked init inherits.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }

    /// How fully the kernel enforces it.
    pub fn enforcement(&self) -> Enforcement {
        self.enforcement
    }
}

/// `struct landlock_path_beneath_attr` (packed: 12 bytes).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// `landlock_add_rule(ruleset, LANDLOCK_RULE_PATH_BENEATH, {access, parent}, 0)`.
fn add_path_rule(
    ruleset: impl std::os::fd::AsFd,
    parent: impl std::os::fd::AsFd,
    access: u64,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: parent.as_fd().as_raw_fd(),
    };
    // SAFETY: landlock_add_rule reads the 12-byte attribute on this frame; both descriptors are
    // valid for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_fd().as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            std::ptr::addr_of!(attr),
            0u32,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Restricts the calling thread (and its future children) with a ruleset made ahead
/// ([`Prepared`], inherited as descriptor `fd`, closed here). `no_new_privs` must already be
/// set.
pub fn restrict(fd: std::os::fd::OwnedFd) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: landlock_restrict_self takes a ruleset descriptor and flags.
    let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The ruleset for `plan`, with every rule (but `/proc`'s when `defer_proc`), and how fully the
/// kernel enforces what is asked for (the ABI offers every right asked for, or some, or none).
fn build(
    plan: &LandlockPlan,
    defer_proc: bool,
) -> Result<(landlock::RulesetCreated, Enforcement), LandlockError> {
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
        .filter(|(p, _)| !(defer_proc && *p == "/proc"))
        .map(|(p, access)| (PathBuf::from(p), access, true))
        .collect();
    rules.extend(plan.read.iter().map(|p| (p.clone(), read, false)));
    rules.extend(plan.write.iter().map(|p| (p.clone(), write, false)));
    if let Some(exec) = &plan.exec {
        let run = AccessFs::Execute | AccessFs::ReadFile | AccessFs::ReadDir;
        rules.extend(exec.iter().map(|p| (p.clone(), run, false)));
    }
    for (path, access, optional) in rules {
        // One system call (the C library's `open` with `O_CLOEXEC` makes a second).
        let fd = match rustix::fs::open(
            &path,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(_) if optional && std::fs::symlink_metadata(&path).is_err() => continue,
            Err(e) => {
                return Err(LandlockError::Path {
                    path: path.clone(),
                    source: e.into(),
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

    // Every right asked for is one of TARGET_ABI's, and file rules carry file rights only: the
    // kernel's ABI alone decides how much of it is enforced.
    let enforcement = match kernel_abi() {
        0 => Enforcement::None,
        a if a < TARGET_ABI as i32 => Enforcement::Partial,
        _ => Enforcement::Full,
    };
    Ok((created, enforcement))
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
