//! The sandbox's file system: a fresh tmpfs root holding only what the plan grants (read-only or
//! read-write binds of host paths at the same paths), a fresh `/proc` for the sandbox's own pid
//! namespace, a minimal `/dev`, a private `/tmp`, and nothing of the host's root. Runs in init,
//! inside the new user and mount namespaces, before any capability is dropped.
//!
//! Order: every source is captured first as a detached clone (`open_tree`), so that mounting the
//! new root cannot hide a source; then the root is assembled, `pivot_root` makes it `/`, the old
//! root is detached, and `/` itself is remounted read-only.
//!
//! As root the whole mount namespace is made ahead, on the host ([`build_ahead`], on a thread of
//! its own while the launcher creates the cgroup and the run's network namespace is made on
//! another): a mount namespace of that thread's own, made private first, in which the tree is
//! assembled with the file-system identity the command has (the plan's host uid and gid, no
//! supplementary groups, so no access that identity lacks) and then made the root, the old one
//! detached. The launcher enters that namespace for the one `clone3` that makes init, which so
//! starts inside the finished tree ([`Tree`]); the run's `/proc`, which needs the run's pid
//! namespace, is mounted by the launcher right after the clone, before init is let go. Init
//! makes no mount at all, and the clone copies none of the host's: ~0.45 ms less on the path to
//! the command's start on the machine of ARCHITECTURE.md. Otherwise ([`build`]: an ordinary
//! user's run, or an init executed by a launcher with other threads, which may not enter a
//! mount namespace) init assembles the tree itself, in the same steps, and pivots into it.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::mount::{
    MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags, mount,
    mount_change, mount_remount, move_mount, open_tree, unmount,
};

use cordon_runtime::{MountKind, Plan};

use crate::sys;

/// Errors building the tree, each naming the path and the step.
#[derive(Debug, thiserror::Error)]
#[error("{step} {path}: {source}")]
pub struct MountError {
    /// What was being done (`bind`, `mkdir`, `mount proc on`…).
    pub step: &'static str,
    /// The path involved.
    pub path: PathBuf,
    /// Why it failed.
    pub source: io::Error,
}

fn err<E: Into<io::Error>>(step: &'static str, path: &Path) -> impl FnOnce(E) -> MountError {
    let path = path.to_path_buf();
    move |e| MountError {
        step,
        path,
        source: e.into(),
    }
}

/// Where the new root is assembled before `pivot_root`. Any existing directory does: the mount
/// lives in the sandbox's private mount namespace and the sources are captured beforehand.
const STAGING: &str = "/tmp";

/// Device nodes bound from the host into the sandbox's `/dev`.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// Builds the tree for `plan` and makes it the root. Returns how many mounts were made.
pub fn build(plan: &Plan) -> Result<usize, MountError> {
    make_private()?;
    let count = assemble(plan, Path::new(STAGING), Build::Init)?;
    enter(Path::new(STAGING))?;
    Ok(count)
}

/// A tree built ahead on the host ([`build_ahead`]): the root of a mount namespace of its own
/// (owned by the host's user namespace, so nothing in the sandbox may change its mounts), which
/// the launcher enters for the clone that makes init ([`Tree::enter`], [`Tree::leave`]), with
/// the run's `/proc` mounted in it right after ([`Tree::mount_proc`]).
#[derive(Debug)]
pub struct Tree {
    /// The mount namespace whose root the tree is.
    ns: OwnedFd,
    /// Its inode, as `/proc/<pid>/ns/mnt` of a process in it shows.
    inode: u64,
    /// Where the launcher comes back to after the clone.
    home: Home,
    /// The mounts the tree holds (`/proc` not among them).
    mounts: usize,
    /// The Landlock ruleset made in the tree, but for `/proc`'s rule (`None`: init makes it).
    landlock: Option<crate::landlock::Prepared>,
}

/// The launcher's mount namespace, root and working directory, taken before the tree's thread
/// left them: entering a mount namespace moves the caller's root and working directory to its
/// root, and coming back to its own namespace would leave them at that namespace's root (out of
/// a `chroot` cordon was started in).
#[derive(Debug)]
struct Home {
    ns: OwnedFd,
    root: OwnedFd,
    cwd: OwnedFd,
}

impl Home {
    fn take() -> io::Result<Home> {
        use rustix::fs::{Mode, OFlags};
        let dir = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        Ok(Home {
            ns: crate::netns::current("mnt")?,
            root: rustix::fs::open("/", dir, Mode::empty())?,
            cwd: rustix::fs::open(".", dir, Mode::empty())?,
        })
    }
}

impl Tree {
    /// The mount namespace's inode number, as `/proc/<pid>/ns/mnt` of a process in it shows.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// The mounts it holds (its `/proc` is not among them).
    pub fn mounts(&self) -> usize {
        self.mounts
    }

    /// The Landlock ruleset made in the tree, all but `/proc`'s rule (which the launcher adds
    /// once it has mounted the run's `/proc`): `None` when it could not be made there (init
    /// then makes it, and reports why it cannot).
    pub fn landlock(&self) -> Option<&crate::landlock::Prepared> {
        self.landlock.as_ref()
    }

    /// Moves the calling thread into the tree's mount namespace, its root and working directory
    /// to the tree's root. The kernel allows it only to a thread that shares its file-system
    /// attributes with no other (a single-threaded launcher, or threads that unshared them).
    pub fn enter(&self) -> io::Result<()> {
        rustix::thread::move_into_link_name_space(
            self.ns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Mount),
        )?;
        Ok(())
    }

    /// Between [`Tree::enter`] and [`Tree::leave`]: mounts, at the tree's `/proc`, a fresh proc
    /// for the pid namespace of the process `pidfd` refers to (init, just cloned into that
    /// namespace). `nosuid,nodev,noexec`, as init's own would be.
    pub fn mount_proc(&self, pidfd: impl AsFd) -> Result<(), MountError> {
        use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags};
        let at = Path::new("/proc");
        let pid_ns =
            sys::pidfd_pid_namespace(pidfd).map_err(err("find the pid namespace for", at))?;
        let fs = rustix::mount::fsopen("proc", FsOpenFlags::FSOPEN_CLOEXEC)
            .map_err(err("open a proc file system for", at))?;
        rustix::mount::fsconfig_set_string(&fs, "source", "proc")
            .map_err(err("name the proc of", at))?;
        rustix::mount::fsconfig_set_fd(&fs, "pidns", &pid_ns)
            .map_err(err("give the run's pid namespace to the proc of", at))?;
        rustix::mount::fsconfig_create(&fs).map_err(err("create the proc of", at))?;
        let proc = rustix::mount::fsmount(
            &fs,
            FsMountFlags::FSMOUNT_CLOEXEC,
            MountAttrFlags::MOUNT_ATTR_NOSUID
                | MountAttrFlags::MOUNT_ATTR_NODEV
                | MountAttrFlags::MOUNT_ATTR_NOEXEC,
        )
        .map_err(err("mount proc on", at))?;
        move_mount(
            proc.as_fd(),
            "",
            rustix::fs::CWD,
            at,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .map_err(err("mount proc on", at))
    }

    /// Moves the calling thread back into the mount namespace, root and working directory it
    /// had when the tree was started (each step tried, the first error returned).
    pub fn leave(&self) -> io::Result<()> {
        let h = &self.home;
        rustix::thread::move_into_link_name_space(
            h.ns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Mount),
        )?;
        let root = rustix::process::fchdir(&h.root).and_then(|()| rustix::process::chroot("."));
        let cwd = rustix::process::fchdir(&h.cwd);
        root.and(cwd)?;
        Ok(())
    }

    /// The mount namespace, which keeps the tree alive while it is held.
    pub fn into_namespace(self) -> OwnedFd {
        self.ns
    }
}

/// [`build_ahead`] on a thread of its own, started on another CPU than the caller's
/// (`sys::spawn_elsewhere`).
#[derive(Debug)]
pub struct Ahead {
    thread: crate::thread::Thread<(i32, Result<Tree, MountError>)>,
    plan: Plan,
}

impl Ahead {
    /// Starts building the tree for `plan`.
    pub fn start(plan: &Plan) -> io::Result<Ahead> {
        Self::start_after(plan, || {})
    }

    /// Starts building the tree for `plan` once `first` has run on the thread, before it
    /// leaves the host's mount namespace.
    pub fn start_after(plan: &Plan, first: impl FnOnce() + Send + 'static) -> io::Result<Ahead> {
        let for_thread = plan.clone();
        let thread = sys::spawn_elsewhere("cordon-tree", 256 * 1024, move || {
            first();
            cordon_runtime::mark("layout (tree's thread)");
            let tid = rustix::thread::gettid().as_raw_nonzero().get();
            let tree = build_ahead(&for_thread);
            cordon_runtime::mark("tree built");
            (tid, tree)
        })?;
        Ok(Ahead {
            thread,
            plan: plan.clone(),
        })
    }

    /// Whether this is the tree of `plan` (a launch uses no other).
    pub fn is_for(&self, plan: &Plan) -> bool {
        self.plan == *plan
    }

    /// Waits for the thread: its id (once this returns it has run the last of its code, though
    /// the kernel may list it a while longer) and the tree, or why it could not be built.
    /// `None` if the thread panicked.
    pub fn wait(self) -> Option<(i32, Result<Tree, MountError>)> {
        sys::join_elsewhere(self.thread).ok()
    }
}

/// On a thread of the launcher (root), which this leaves in a mount namespace of its own, rooted
/// in the tree, and with the file-system identity of `plan.identity`'s host ids: builds the
/// tree for `plan` as [`build`] does, without `/proc` (only its directory), read-only, and makes
/// it the root of that namespace. The thread must do nothing else afterwards (its identity,
/// root and mounts are no longer the process's).
pub fn build_ahead(plan: &Plan) -> Result<Tree, MountError> {
    let root = Path::new("/");
    let home = Home::take().map_err(err("open the launcher's namespace and root at", root))?;
    // SAFETY: only the file-system attributes (root, cwd, umask) and the mount namespace are
    // unshared, and only for this thread: the descriptor table and memory stay shared.
    unsafe {
        rustix::thread::unshare_unsafe(
            rustix::thread::UnshareFlags::FS | rustix::thread::UnshareFlags::NEWNS,
        )
    }
    .map_err(err("unshare the mount namespace for", root))?;
    // The namespace is held by descriptor from the start: once the tree is the root, no /proc
    // is there to name it by.
    let (ns, inode) = crate::netns::current("mnt")
        .and_then(crate::netns::with_inode)
        .map_err(err("open the new mount namespace of", root))?;
    make_private()?;
    sys::take_fs_identity(plan.identity.host_uid, plan.identity.host_gid)
        .map_err(err("take the command's file-system identity for", root))?;
    // That took `CAP_MKNOD` too, which making `/dev`'s nodes needs (nothing else here does).
    crate::caps::raise_effective(crate::caps::CAP_MKNOD)
        .map_err(err("raise CAP_MKNOD for", root))?;
    let staging = Path::new(STAGING);
    let mounts = assemble(plan, staging, Build::Ahead)?;
    enter(staging)?;
    // The Landlock rules name the tree's files, as init's would, with the command's identity;
    // off init's way (~0.35 ms of it here). A ruleset that cannot be made here is init's to
    // make, and to report on.
    let landlock = crate::landlock::prepare(&plan.landlock).ok().flatten();
    Ok(Tree {
        ns,
        inode,
        home,
        mounts,
        landlock,
    })
}

/// Makes every mount of the calling thread's namespace private: nothing done in it may
/// propagate back to the host's mount namespace.
fn make_private() -> Result<(), MountError> {
    let root = Path::new("/");
    mount_change(
        root,
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(err("make private", root))
}

/// A fresh `/proc` at `at` for the calling process's pid namespace.
fn mount_proc(at: &Path) -> Result<(), MountError> {
    mount(
        "proc",
        at,
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        c"",
    )
    .map_err(err("mount proc on", at))
}

/// Who assembles the tree: init, in its user and mount namespaces, or a thread of the launcher
/// on the host, ahead (as root).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Build {
    Init,
    Ahead,
}

/// Assembles the tree for `plan` on a tmpfs mounted at `staging` (steps 1-7; `/proc` only when
/// init builds, else just its directory). Returns how many mounts were made.
fn assemble(plan: &Plan, staging: &Path, how: Build) -> Result<usize, MountError> {
    // 1. Capture every source before anything is mounted over anything. Each is reached without
    //    following a symlink and must still be the file the spec was checked against, so a
    //    grant cannot be swapped (by another run, another user) between check and mount.
    let mut sources: Vec<(PathBuf, OwnedFd, bool)> = Vec::new();
    for m in &plan.mounts {
        let writable = match &m.kind {
            MountKind::ReadOnly => false,
            MountKind::ReadWrite => true,
            MountKind::Symlink(_) => continue,
        };
        let (fd, is_dir) = capture(&m.path, m.id)?;
        let mut set = libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV;
        if !writable {
            set |= libc::MOUNT_ATTR_RDONLY;
        } else if noexec_when_exec_restricted(plan, &m.path) {
            set |= libc::MOUNT_ATTR_NOEXEC;
        }
        sys::mount_setattr(fd.as_fd(), true, set, 0, None).map_err(err("restrict", &m.path))?;
        sources.push((m.path.clone(), fd, is_dir));
    }
    let devices = match how {
        Build::Init => {
            let mut bound = Vec::new();
            for d in DEVICES {
                let host = Path::new("/dev").join(d);
                if host.exists() {
                    let fd = open_tree(
                        rustix::fs::CWD,
                        &host,
                        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
                    )
                    .map_err(err("bind", &host))?;
                    // Made nosuid and noexec once in place, with the rest of /dev (`build_dev`).
                    bound.push((d, fd));
                }
            }
            Devices::Bound(bound)
        }
        Build::Ahead => {
            let mut nodes = Vec::new();
            for d in DEVICES {
                let host = Path::new("/dev").join(d);
                // Only character devices are made; anything else at that path is left out, as
                // a missing one is.
                if let Ok(st) = rustix::fs::lstat(&host)
                    && rustix::fs::FileType::from_raw_mode(st.st_mode)
                        == rustix::fs::FileType::CharacterDevice
                {
                    nodes.push((d, st.st_mode & 0o777, st.st_rdev));
                }
            }
            Devices::Made(nodes)
        }
    };

    // 2. The new root: a small tmpfs that will be read-only once assembled.
    mount(
        "cordon-root",
        staging,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        c"mode=0755,size=4m,nr_inodes=4096",
    )
    .map_err(err("mount root tmpfs on", staging))?;
    let at = |p: &Path| staging.join(p.strip_prefix("/").unwrap_or(p));
    let mut count = 1;
    let mut dirs = Dirs::new(staging);

    // 3. A private /tmp (unless the host's is granted), first, so that grants below /tmp land
    //    inside it rather than under it.
    if !plan.mounts.iter().any(|m| m.path == Path::new("/tmp")) {
        let tmp = at(Path::new("/tmp"));
        dirs.ensure(&tmp)?;
        let size = plan
            .limits
            .memory
            .map_or("size=50%".to_owned(), |m| format!("size={}", m / 2));
        let opts = std::ffi::CString::new(format!("mode=1777,{size}"))
            .map_err(|e| err("mount tmpfs on", &tmp)(io::Error::other(e)))?;
        let mut flags = MountFlags::NOSUID | MountFlags::NODEV;
        if noexec_when_exec_restricted(plan, Path::new("/tmp")) {
            flags |= MountFlags::NOEXEC;
        }
        mount("tmpfs", &tmp, "tmpfs", flags, opts.as_c_str())
            .map_err(err("mount tmpfs on", &tmp))?;
        count += 1;
    }

    // 4. Grants, parents before children (the plan is sorted so).
    let mut sources = sources.into_iter();
    for m in &plan.mounts {
        let target = at(&m.path);
        if let MountKind::Symlink(to) = &m.kind {
            if fs::symlink_metadata(&target).is_err() {
                dirs.ensure(target.parent().unwrap_or(staging))?;
                std::os::unix::fs::symlink(to, &target).map_err(err("symlink", &target))?;
            }
            continue;
        }
        let (path, fd, is_dir) = sources.next().ok_or_else(|| MountError {
            step: "bind",
            path: m.path.clone(),
            source: io::Error::other("source list out of step with the plan"),
        })?;
        debug_assert_eq!(path, m.path);
        make_mountpoint(&mut dirs, &target, is_dir)?;
        move_mount(
            fd.as_fd(),
            "",
            rustix::fs::CWD,
            &target,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .map_err(err("attach", &m.path))?;
        // What is below a bind is the host's, not this tree's: nothing under it is known.
        dirs.forget_below(&target);
        count += 1;
    }

    // 5. /proc for the sandbox's own pid namespace (mounted from inside it: by init).
    let proc_dir = at(Path::new("/proc"));
    dirs.ensure(&proc_dir)?;
    if how == Build::Init {
        mount_proc(&proc_dir)?;
        count += 1;
    }

    // 6. A minimal /dev.
    count += build_dev(&mut dirs, &at(Path::new("/dev")), devices)?;

    // 7. /etc basics when /etc is not granted.
    write_etc(&mut dirs, staging, plan)?;
    Ok(count)
}

/// Step 8: makes the tree at `staging` the root, lets go of the old one, and makes `/`
/// read-only.
fn enter(staging: &Path) -> Result<(), MountError> {
    let root = Path::new("/");
    std::env::set_current_dir(staging).map_err(err("chdir", staging))?;
    rustix::process::pivot_root(".", ".").map_err(err("pivot_root", staging))?;
    unmount(".", UnmountFlags::DETACH).map_err(err("detach old root", staging))?;
    std::env::set_current_dir("/").map_err(err("chdir", root))?;
    mount_remount(
        root,
        MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
        c"",
    )
    .map_err(err("remount read-only", root))?;
    Ok(())
}

/// A detached clone of the tree at `path`, reached without following any symlink and checked
/// to be the `(device, inode)` recorded when the spec was validated. Returns whether it is a
/// directory.
fn capture(path: &Path, id: Option<(u64, u64)>) -> Result<(OwnedFd, bool), MountError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let at = rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS,
    )
    .map_err(err("open without following symlinks", path))?;
    let st = rustix::fs::fstat(&at).map_err(err("stat", path))?;
    if let Some((dev, ino)) = id
        && (st.st_dev, st.st_ino) != (dev, ino)
    {
        return Err(MountError {
            step: "bind",
            path: path.to_path_buf(),
            source: io::Error::other(
                "the path no longer names the file that was checked (replaced since)",
            ),
        });
    }
    let fd = open_tree(
        &at,
        "",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_RECURSIVE
            | OpenTreeFlags::AT_EMPTY_PATH,
    )
    .map_err(err("bind", path))?;
    let is_dir = rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory;
    Ok((fd, is_dir))
}

/// Under `--exec`, whether a writable tree is mounted `noexec`: Landlock's execute right covers
/// `execve` but not the dynamic loader mapping a file (`ld.so ./written-binary`), which `noexec`
/// refuses. A writable tree that holds an exec path (or lies inside one) stays executable.
fn noexec_when_exec_restricted(plan: &Plan, writable: &Path) -> bool {
    match &plan.landlock.exec {
        None => false,
        Some(exec) => !exec
            .iter()
            .any(|e| e.starts_with(writable) || writable.starts_with(e)),
    }
}

/// The device nodes of the sandbox's `/dev`: the host's own, bound (init, in its user namespace,
/// may not make any), or made alike (as root, on the host: the same device numbers and modes,
/// without a mount each).
enum Devices {
    Bound(Vec<(&'static str, OwnedFd)>),
    Made(Vec<(&'static str, u32, u64)>),
}

fn build_dev(dirs: &mut Dirs, dev: &Path, devices: Devices) -> Result<usize, MountError> {
    dirs.ensure(dev)?;
    mount(
        "cordon-dev",
        dev,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        c"mode=0755,size=64k,nr_inodes=64",
    )
    .map_err(err("mount tmpfs on", dev))?;
    let mut count = 1;
    match devices {
        Devices::Bound(bound) => {
            for (name, fd) in bound {
                // A fresh tmpfs: nothing is there yet.
                let node = dev.join(name);
                create_file(&node)?;
                move_mount(
                    fd.as_fd(),
                    "",
                    rustix::fs::CWD,
                    &node,
                    MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
                )
                .map_err(err("attach", &node))?;
                count += 1;
            }
        }
        Devices::Made(nodes) => {
            for (name, mode, rdev) in nodes {
                let node = dev.join(name);
                let mode = rustix::fs::Mode::from_raw_mode(mode);
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &node,
                    rustix::fs::FileType::CharacterDevice,
                    mode,
                    rdev,
                )
                .map_err(err("make device node", &node))?;
                // Whatever the umask took away.
                rustix::fs::chmod(&node, mode).map_err(err("chmod", &node))?;
            }
        }
    }
    let pts = dev.join("pts");
    dirs.ensure(&pts)?;
    mount(
        "devpts",
        &pts,
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        c"newinstance,ptmxmode=0666,mode=0620",
    )
    .map_err(err("mount devpts on", &pts))?;
    count += 1;
    let shm = dev.join("shm");
    dirs.ensure(&shm)?;
    mount(
        "shm",
        &shm,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        c"mode=1777,size=64m",
    )
    .map_err(err("mount tmpfs on", &shm))?;
    count += 1;
    for (link, to) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let l = dev.join(link);
        std::os::unix::fs::symlink(to, &l).map_err(err("symlink", &l))?;
    }
    // Every mount of /dev (device nodes, devpts, shm, the tmpfs itself) nosuid and noexec, in
    // one call (once per device node cost five more system calls), before anything but init
    // can see it.
    let tree = rustix::fs::open(
        dev,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(err("open", dev))?;
    sys::mount_setattr(
        tree.as_fd(),
        true,
        libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NOEXEC,
        0,
        None,
    )
    .map_err(err("restrict", dev))?;
    mount_remount(
        dev,
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NOEXEC,
        c"mode=0755",
    )
    .map_err(err("remount read-only", dev))?;
    Ok(count)
}

/// `/etc/passwd`, `/etc/group` and `/etc/hosts` naming the sandbox's user and loopback, where no
/// grant provides them (when `/etc` itself is granted, the host's files are what the command sees).
fn write_etc(dirs: &mut Dirs, staging: &Path, plan: &Plan) -> Result<(), MountError> {
    if plan.mounts.iter().any(|m| m.path == Path::new("/etc")) {
        return Ok(());
    }
    let etc = staging.join("etc");
    dirs.ensure(&etc)?;
    let id = plan.identity;
    let files = [
        (
            "passwd",
            format!(
                "root:x:0:0::/:/usr/sbin/nologin\ncordon:x:{}:{}:cordon sandbox:/tmp:/bin/sh\n",
                id.uid, id.gid
            ),
        ),
        ("group", format!("root:x:0:\ncordon:x:{}:\n", id.gid)),
        (
            "hosts",
            "127.0.0.1 localhost cordon\n::1 localhost\n".to_owned(),
        ),
    ];
    for (name, text) in files {
        let p = etc.join(name);
        if fs::symlink_metadata(&p).is_ok() {
            continue;
        }
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&p)
            .and_then(|mut f| io::Write::write_all(&mut f, text.as_bytes()))
            .map_err(err("write", &p))?;
    }
    Ok(())
}

/// The directories of the tree being built that are known to exist, so that each is made (or
/// checked) once rather than before every file placed in it.
struct Dirs {
    known: std::collections::HashSet<PathBuf>,
}

impl Dirs {
    fn new(root: &Path) -> Self {
        Dirs {
            known: std::iter::once(root.to_path_buf()).collect(),
        }
    }

    /// Makes `p` and its missing parents (mode 0755).
    fn ensure(&mut self, p: &Path) -> Result<(), MountError> {
        if self.known.contains(p) {
            return Ok(());
        }
        match fs::DirBuilder::new().mode(0o755).create(p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(parent) = p.parent() {
                    self.ensure(parent)?;
                }
                fs::DirBuilder::new()
                    .mode(0o755)
                    .create(p)
                    .map_err(err("mkdir", p))?;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if !fs::metadata(p).is_ok_and(|m| m.is_dir()) {
                    return Err(err("mkdir", p)(e));
                }
            }
            Err(e) => return Err(err("mkdir", p)(e)),
        }
        self.known.insert(p.to_path_buf());
        Ok(())
    }

    /// Forgets what is known below `p` (a mount now covers it).
    fn forget_below(&mut self, p: &Path) {
        self.known.retain(|k| !k.starts_with(p) || k == p);
    }
}

fn create_file(p: &Path) -> Result<(), MountError> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(p)
        .map(drop)
        .map_err(err("create", p))
}

/// Creates an empty directory or file to mount on, unless something is already there (a nested
/// grant inside a parent's bind finds its own directory already present).
fn make_mountpoint(dirs: &mut Dirs, target: &Path, dir: bool) -> Result<(), MountError> {
    if dirs.known.contains(target) || fs::symlink_metadata(target).is_ok() {
        return Ok(());
    }
    if dir {
        dirs.ensure(target)
    } else {
        dirs.ensure(target.parent().unwrap_or(Path::new("/")))?;
        create_file(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_runtime::RunSpec;

    fn plan(run_id: &str, read: &str) -> Plan {
        RunSpec {
            command: vec!["/bin/true".into()],
            read: vec![PathBuf::from("/usr"), PathBuf::from(read)],
            base_dir: PathBuf::from("/"),
            caller: (0, 0),
            ..RunSpec::default()
        }
        .validate(run_id)
        .unwrap()
    }

    /// A tree built ahead is the root of a mount namespace of its own: a thread that enters it
    /// finds the tree at `/` (the grants, `/dev`, a `/tmp`, an empty `/proc` until the run's is
    /// mounted) and none of the host's root; leaving brings back its namespace, root and
    /// working directory (those the launcher had when the tree was started). Negative control:
    /// before entering, the same thread sees the host's.
    #[test]
    fn a_tree_built_ahead_is_the_root_of_its_own_namespace() {
        if !crate::privileged("mounts::a_tree_built_ahead_is_the_root_of_its_own_namespace") {
            return;
        }
        let tree = Ahead::start(&plan("r-tree-ns", "/etc"))
            .unwrap()
            .wait()
            .unwrap()
            .1
            .unwrap();
        let host_dir = tempfile::tempdir().unwrap();
        std::fs::write(host_dir.path().join("host-only"), "").unwrap();
        let marker = host_dir.path().to_path_buf();
        let started_in = std::env::current_dir().unwrap();
        let seen = std::thread::spawn(move || {
            // A thread may enter a mount namespace once its file-system attributes are its own.
            // SAFETY: this thread's file-system attributes only; it ends right after.
            unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FS) }.unwrap();
            let host_ns = std::fs::read_link("/proc/thread-self/ns/mnt").unwrap();
            let before = marker.join("host-only").exists();
            tree.enter().unwrap();
            let mut inside: Vec<String> = std::fs::read_dir("/")
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            inside.sort();
            let proc_empty = std::fs::read_dir("/proc").unwrap().next().is_none();
            let host_visible = marker.join("host-only").exists();
            tree.leave().unwrap();
            let back_ns = std::fs::read_link("/proc/thread-self/ns/mnt").unwrap();
            let cwd = std::env::current_dir().unwrap();
            (
                before,
                inside,
                proc_empty,
                host_visible,
                host_ns == back_ns,
                cwd == started_in,
            )
        })
        .join()
        .unwrap();
        let (before, inside, proc_empty, host_visible, same_ns, same_cwd) = seen;
        assert!(before, "control: the host's files are there before");
        for dir in ["dev", "etc", "proc", "tmp", "usr"] {
            assert!(inside.iter().any(|d| d == dir), "{dir} in {inside:?}");
        }
        assert!(
            !inside.iter().any(|d| d == "root" || d == "home"),
            "{inside:?}"
        );
        assert!(proc_empty, "/proc waits for the run's own");
        assert!(!host_visible, "the host's files are out of reach inside");
        assert!(
            same_ns && same_cwd,
            "back in the host's namespace and directory"
        );
    }

    /// A tree started ahead serves the plan it was started for and no other: not another run's
    /// (another id), not one granting other paths. Negative control: the same plan is served.
    #[test]
    fn a_tree_built_ahead_serves_its_own_plan_only() {
        if !crate::privileged("mounts::a_tree_built_ahead_serves_its_own_plan_only") {
            return;
        }
        let a = plan("r-tree-a", "/etc");
        let ahead = Ahead::start(&a).unwrap();
        assert!(ahead.is_for(&a), "its own plan");
        assert!(!ahead.is_for(&plan("r-tree-b", "/etc")), "another run");
        assert!(!ahead.is_for(&plan("r-tree-a", "/var")), "other grants");
        let (_, tree) = ahead.wait().unwrap();
        let tree = tree.unwrap();
        assert!(tree.mounts() >= 4, "{} mounts", tree.mounts());
    }
}
