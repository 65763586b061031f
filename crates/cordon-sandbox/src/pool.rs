//! The pool of empty namespaces made for the next run (root only).
//!
//! Making a run's empty network namespace (with its IPC and UTS namespaces, see [`netns`]) is
//! the most expensive single step of a launch: ~1.2 ms of kernel work on the machine described
//! in ARCHITECTURE.md (registering loopback and the per-namespace sysctls of every protocol),
//! which, even on a thread of its own, kept the second CPU busy for most of the time before
//! the clone. So a run, once its command is done and cordon has exited, leaves one such set
//! made for the next run: its [`keeper`](crate::keeper), which outlives cordon by a moment
//! anyway, unshares a network, an IPC and a UTS namespace, brings loopback up, names the host,
//! and pins the three in this directory with bind mounts (as `ip netns add` does), under a
//! name nothing else uses, then renames the set into one of [`SLOTS`] slots if one is free.
//! The next run's namespace thread claims a set by renaming its slot away (atomic: two runs
//! never get the same set), opens the three namespaces and checks them before use: each must
//! be a namespace of the right type, owned by the host's user namespace, the network one
//! holding loopback alone and up, the UTS one named [`HOSTNAME`](cordon_runtime::HOSTNAME). A
//! set that fails a check is dropped and the run makes its own, as it does when the pool is
//! empty. The claimed set stays pinned until that run's keeper unpins it, once cordon has
//! exited ([`Claim`]): unpinning waits for the kernel.
//!
//! The directory is root's alone (created 0700, refused if anyone else could write it or a
//! parent): whoever could place a set there could give a run a network. Namespaces made but
//! never claimed stay pinned (two sets at most, a few hundred kilobytes of kernel memory) until
//! a run claims them or the machine restarts (the bind mounts go with it; where `/run` is not a
//! tmpfs the empty files stay, and the claim's checks refuse them); sets left half made or half
//! claimed by a process that died are removed by a later run's housekeeping ([`Pool::sweep`]).
//!
//! [`netns`]: crate::netns

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the pool lives unless [`POOL_ENV`] says otherwise.
pub const POOL_DIR: &str = "/run/cordon/pool";

/// The environment variable naming another pool directory (which must be root's alone too), or,
/// set to `off`, turning the pool off: each run then makes its own namespaces and leaves none
/// behind (what a measurement of a cold start wants, and what tests that place sets in a pool
/// of their own use).
pub const POOL_ENV: &str = "CORDON_NETNS_POOL";

/// The pool directory in use: [`POOL_DIR`], another named by [`POOL_ENV`], or none.
pub fn dir() -> Option<PathBuf> {
    match std::env::var_os(POOL_ENV) {
        None => Some(PathBuf::from(POOL_DIR)),
        Some(v) if v == "off" || v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
    }
}

/// How many sets the pool holds at most.
pub const SLOTS: usize = 2;

/// The namespaces of a set, in the order [`Pool::claim`] returns them, as `/proc/<pid>/ns`
/// names them.
pub const KINDS: [&str; 3] = ["net", "ipc", "uts"];

/// The directory inside a set that holds the three bind mounts (itself a bind mount, private,
/// so that unpinning is one lazy unmount and nothing propagates).
const NS: &str = "ns";

/// A pool directory that only root can write.
#[derive(Debug, Clone)]
pub struct Pool {
    dir: PathBuf,
}

impl Pool {
    /// Opens (creating it, mode 0700, if missing) a pool directory that only root can write.
    pub fn open(dir: &Path) -> io::Result<Pool> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut p = Some(dir);
        while let Some(d) = p {
            let meta = fs::metadata(d)?;
            if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} is writable by someone other than root (owner uid {}, mode {:o})",
                        d.display(),
                        meta.uid(),
                        meta.mode() & 0o7777
                    ),
                ));
            }
            p = d.parent().filter(|d| !d.as_os_str().is_empty());
        }
        Ok(Pool {
            dir: dir.to_path_buf(),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn slot(&self, i: usize) -> PathBuf {
        self.dir.join(i.to_string())
    }

    /// Claims a set: the network, IPC and UTS namespaces (in [`KINDS`]'s order) of the first
    /// slot this call manages to rename away, and the [`Claim`] that still pins them. `None`
    /// when the pool is empty (a set that cannot be opened is unpinned and removed). The
    /// namespaces are not checked here; see `netns`.
    pub fn claim(&self) -> Option<([OwnedFd; 3], Claim)> {
        static CLAIMS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = CLAIMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let claimed = self.dir.join(format!("claim-{}-{n}", std::process::id()));
        for i in 0..SLOTS {
            if rustix::fs::renameat_with(
                rustix::fs::CWD,
                self.slot(i),
                rustix::fs::CWD,
                &claimed,
                rustix::fs::RenameFlags::NOREPLACE,
            )
            .is_err()
            {
                continue;
            }
            let Some(set) = SetPaths::at(&claimed) else {
                unpin(&claimed);
                continue;
            };
            let claim = Claim(Some(set));
            let open = |kind: &str| {
                rustix::fs::open(
                    claimed.join(NS).join(kind),
                    rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )
                .ok()
            };
            if let [Some(net), Some(ipc), Some(uts)] = KINDS.map(open) {
                return Some(([net, ipc, uts], claim));
            }
        }
        None
    }

    /// What a keeper needs to make a set for this pool once cordon has exited (see
    /// `keeper::start`): every path it touches, prepared now, and the run's own claimed set,
    /// which the keeper unpins first. `id` names the set while it is being made (the run's id:
    /// unique).
    pub fn refill(&self, id: &str, claimed: Option<Claim>) -> Option<Refill> {
        let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).ok();
        Some(Refill {
            slots: [c(&self.slot(0))?, c(&self.slot(1))?],
            build: SetPaths::at(&self.dir.join(format!(".build-{id}")))?,
            claimed,
        })
    }

    /// Removes what a process that died left half made (`.build-*`) or half claimed (`claim-*`)
    /// more than `older_than` ago.
    pub fn sweep(&self, older_than: Duration) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if !(name.starts_with(".build-") || name.starts_with("claim-")) {
                continue;
            }
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= older_than);
            if old {
                unpin(&e.path());
            }
        }
    }
}

/// Unpins a set (one lazy unmount of its `ns` bind mount takes the three namespace mounts with
/// it) and removes its files and directories, whatever is left of them.
fn unpin(set: &Path) {
    let ns = set.join(NS);
    let _ = rustix::mount::unmount(&ns, rustix::mount::UnmountFlags::DETACH);
    for kind in KINDS {
        let _ = fs::remove_file(ns.join(kind));
    }
    let _ = fs::remove_dir(&ns);
    let _ = fs::remove_dir(set);
}

/// The paths of a set, as C strings: the keeper makes raw system calls only.
#[derive(Debug)]
pub struct SetPaths {
    /// The set's directory.
    pub(crate) dir: CString,
    /// Its `ns` directory, bound onto itself.
    pub(crate) ns: CString,
    /// The three files the namespaces are bound onto, in [`KINDS`]'s order.
    pub(crate) files: [CString; 3],
}

impl SetPaths {
    fn at(dir: &Path) -> Option<SetPaths> {
        let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).ok();
        let ns = dir.join(NS);
        Some(SetPaths {
            dir: c(dir)?,
            ns: c(&ns)?,
            files: [
                c(&ns.join("net"))?,
                c(&ns.join("ipc"))?,
                c(&ns.join("uts"))?,
            ],
        })
    }
}

/// A set claimed by a run, still pinned in the pool directory (unpinning it waits for the
/// kernel: two directory removals and an unmount took ~0.5 ms here), so that it can be
/// unpinned off the run's way: by the run's keeper once cordon has exited (it is handed over in
/// [`Pool::refill`]), or, when there is none, when the claim is dropped. Until then the pins
/// keep the run's namespaces alive a little longer (nothing but root can reach them, and the
/// sandbox's processes are gone by the time cordon exits).
#[derive(Debug)]
pub struct Claim(Option<SetPaths>);

impl Claim {
    /// The set's paths, for the keeper, which unpins it once cordon has exited (the claim,
    /// handed over with the keeper's [`Refill`], is then never dropped).
    pub(crate) fn paths(&self) -> Option<&SetPaths> {
        self.0.as_ref()
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(set) = self.0.take() {
            unpin(Path::new(std::ffi::OsStr::from_bytes(set.dir.as_bytes())));
        }
    }
}

/// What a keeper makes ([`Pool::refill`]) and unpins once cordon has exited.
#[derive(Debug)]
pub struct Refill {
    /// The pool's slots, tried in order.
    pub(crate) slots: [CString; SLOTS],
    /// Where the new set is made before it is renamed into a slot.
    pub(crate) build: SetPaths,
    /// The run's own claimed set, unpinned first (by the keeper, or when this is dropped).
    pub(crate) claimed: Option<Claim>,
}

/// `NS_GET_NSTYPE`: the `CLONE_NEW*` type of a namespace descriptor (`linux/nsfs.h`).
const NS_GET_NSTYPE: libc::Ioctl = (0xb7 << 8) | 0x3;
/// `NS_GET_USERNS`: a descriptor of the user namespace owning a namespace.
const NS_GET_USERNS: libc::Ioctl = (0xb7 << 8) | 0x1;

/// Checks that `fd` is a namespace of type `kind` (`CLONE_NEW*`) owned by the user namespace
/// whose inode is `owner`.
pub(crate) fn check_namespace(fd: impl AsFd, kind: libc::c_int, owner: u64) -> io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let raw = fd.as_fd().as_raw_fd();
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the type or -1.
    let t = unsafe { libc::ioctl(raw, NS_GET_NSTYPE, 0) };
    if t != kind {
        return Err(io::Error::other(format!(
            "a namespace of type {t:#x}, not {kind:#x}"
        )));
    }
    // SAFETY: NS_GET_USERNS takes no argument and returns a new descriptor or -1.
    let user = unsafe { libc::ioctl(raw, NS_GET_USERNS, 0) };
    if user < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel returned, owned by nothing else.
    let user = unsafe { OwnedFd::from_raw_fd(user) };
    let ino = rustix::fs::fstat(&user)?.st_ino;
    if ino != owner {
        return Err(io::Error::other(format!(
            "owned by user namespace {ino}, not the host's ({owner})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::{check_pooled, current};
    use rustix::thread::LinkNameSpaceType;

    /// A pool of the test's own under /run (root's alone, as a pool must be), taken down with
    /// whatever is left pinned in it.
    struct TestPool {
        pool: Pool,
    }

    impl TestPool {
        fn new(name: &str) -> TestPool {
            let dir = PathBuf::from(format!(
                "/run/cordon-test-pool-{}-{name}",
                std::process::id()
            ));
            TestPool {
                pool: Pool::open(&dir).unwrap(),
            }
        }

        /// Makes a set as a keeper does, on a thread of its own (which it leaves in the set's
        /// namespaces).
        fn refill(&self, id: &str) {
            let refill = self.pool.refill(id, None).unwrap();
            std::thread::spawn(move || crate::keeper::refill_here(&refill))
                .join()
                .unwrap();
        }

        /// How many namespaces are bound in the pool.
        fn pinned(&self) -> usize {
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            let dir = self.pool.path().to_string_lossy().into_owned();
            mounts
                .lines()
                .filter(|l| l.contains(&dir) && l.contains(" - nsfs "))
                .count()
        }
    }

    impl Drop for TestPool {
        fn drop(&mut self) {
            for e in fs::read_dir(self.pool.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                unpin(&e.path());
            }
            let _ = fs::remove_dir(self.pool.path());
        }
    }

    fn home() -> [OwnedFd; 3] {
        [
            current("net").unwrap(),
            current("ipc").unwrap(),
            current("uts").unwrap(),
        ]
    }

    /// Runs `f` on a thread of its own, moved into the namespace `ns` of type `kind`.
    fn inside(ns: &OwnedFd, kind: LinkNameSpaceType, f: impl FnOnce() + Send + 'static) {
        let ns = ns.try_clone().unwrap();
        std::thread::spawn(move || {
            rustix::thread::move_into_link_name_space(ns.as_fd(), Some(kind)).unwrap();
            f();
        })
        .join()
        .unwrap();
    }

    /// Checks `set` on a thread of its own (the check goes into the namespaces and back).
    fn check(set: [OwnedFd; 3]) -> io::Result<()> {
        std::thread::spawn(move || check_pooled(&set, &home()))
            .join()
            .unwrap()
    }

    /// A set made as a keeper makes it is pinned in a slot, claimed once, passes the check, and
    /// is unpinned (its mounts and files gone) when its claim goes; a second set goes into the
    /// second slot, and a third finds the pool full and leaves nothing.
    #[test]
    fn a_set_made_for_the_pool_is_claimed_once_checked_and_unpinned() {
        if !crate::privileged("pool::a_set_made_for_the_pool_is_claimed_once_checked_and_unpinned")
        {
            return;
        }
        let tp = TestPool::new("claim");
        tp.refill("a");
        assert_eq!(tp.pinned(), 3, "net, ipc and uts pinned");
        tp.refill("b");
        tp.refill("c");
        assert_eq!(tp.pinned(), 6, "two sets at most");
        let names: Vec<String> = fs::read_dir(tp.pool.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");

        let (first, claim) = tp.pool.claim().unwrap();
        let (second, other) = tp.pool.claim().unwrap();
        assert!(tp.pool.claim().is_none(), "each set claimed once");
        check(first).unwrap();
        check(second).unwrap();
        drop((claim, other));
        assert_eq!(tp.pinned(), 0, "unpinned with their claims");
        assert_eq!(fs::read_dir(tp.pool.path()).unwrap().count(), 0);
    }

    /// Negative controls of the check: a set whose loopback was brought down, one whose host
    /// was renamed, and one handed over in the wrong order (a namespace of another kind where
    /// the network namespace should be) are refused; the same sets untouched pass.
    #[test]
    fn a_set_that_is_not_as_a_keeper_made_it_is_refused() {
        if !crate::privileged("pool::a_set_that_is_not_as_a_keeper_made_it_is_refused") {
            return;
        }
        let tp = TestPool::new("refuse");
        let claim = |tp: &TestPool| {
            tp.refill("x");
            tp.pool.claim().unwrap()
        };

        let (set, _pin) = claim(&tp);
        // Loopback down, from inside.
        inside(&set[0], LinkNameSpaceType::Network, || {
            let sock = rustix::net::socket(
                rustix::net::AddressFamily::INET,
                rustix::net::SocketType::DGRAM,
                None,
            )
            .unwrap();
            // SAFETY: `ifreq` is plain data for which zeroes are valid.
            let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
            for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
                *dst = *src as libc::c_char;
            }
            // SAFETY: SIOCSIFFLAGS reads the `ifreq` passed (flags 0: down).
            let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&sock), 0x8914, &req) };
            assert_eq!(r, 0);
        });
        let err = check(set).unwrap_err().to_string();
        assert!(err.contains("loopback up: false"), "{err}");

        let (set, _pin) = claim(&tp);
        inside(&set[2], LinkNameSpaceType::HostNameAndNISDomainName, || {
            rustix::system::sethostname(b"elsewhere").unwrap();
        });
        assert!(check(set).is_err(), "renamed host");

        let ([net, ipc, uts], _pin) = claim(&tp);
        assert!(check([uts, ipc, net]).is_err(), "kinds swapped");

        let (set, _pin) = claim(&tp);
        check(set).unwrap();
    }
}
