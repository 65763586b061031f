//! The BPF filesystem where a run's links and maps are pinned, so that its egress block
//! outlives the cordon process: `<root>/cordon/<run_id>/egress/` (and, while the observer
//! lives, `<root>/cordon/<run_id>/observer/`), `<root>` being `/sys/fs/bpf`. The objects shared
//! by all runs are under `<root>/cordon/shared/` ([`crate::shared`]), a name no run id may
//! take.
//!
//! Pins stay until removed. [`cleanup_stale`] removes what runs whose cordon is gone left: the
//! observer part at once (an observer is useless without its reader), the egress part once the
//! kernel reports none of its links attached to a cgroup any more (the run's cgroup was
//! removed, or the links were detached) — the kernel, not a list kept by cordon, decides what
//! is stale — each with the run's entries in the shared maps.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::sys;

/// Where bpffs is mounted on Linux by convention.
pub const DEFAULT_ROOT: &str = "/sys/fs/bpf";

/// `statfs.f_type` of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Errors of bpffs operations, each naming the path.
#[derive(Debug, thiserror::Error)]
pub enum BpffsError {
    /// `statfs` of the bpffs mount point failed.
    #[error("statfs {path}: {source}")]
    Statfs {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Mounting bpffs failed.
    #[error("mounting bpffs at {path}: {source}")]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A directory for pins could not be created.
    #[error("creating pin directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The pin directory of this run already exists.
    #[error(
        "pin directory {0} already exists: a run with this id is pinned (run cleanup_stale, or pick another id)"
    )]
    Exists(PathBuf),
    /// Listing or removing pins failed.
    #[error("removing pins under {path}: {source}")]
    Remove {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A run id that cannot name a directory.
    #[error(
        "run id {0:?} cannot name a pin directory (empty, \"shared\", or with '.', '/' or NUL, or over 200 bytes)"
    )]
    BadRunId(String),
}

/// How bpffs was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mounted {
    /// It was already mounted.
    Already,
    /// This process mounted it (the mount stays, like any `mount -t bpf`).
    Now,
}

/// Makes sure bpffs is mounted at `root`, mounting it (mode 0700) if not. Needs root for the
/// mount. Concurrent callers (parallel runs) are serialized by an exclusive `flock` on the
/// parent directory of `root`: two mounts stacked on one another would hide the first one's
/// pins from everyone.
pub fn ensure_mounted(root: &Path) -> Result<Mounted, BpffsError> {
    if is_bpffs(root)? {
        return Ok(Mounted::Already);
    }
    let parent = root.parent().unwrap_or(Path::new("/"));
    let lock_err = |source| BpffsError::Mount {
        path: root.to_path_buf(),
        source,
    };
    let lock = OwnedFd::from(fs::File::open(parent).map_err(lock_err)?);
    // SAFETY: flock on a descriptor owned here; no pointers. Released when `lock` closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(lock_err(io::Error::last_os_error()));
    }
    if is_bpffs(root)? {
        return Ok(Mounted::Already);
    }
    let c = cstring(root);
    // SAFETY: all pointers are NUL-terminated strings alive for the call; flags 0.
    let ret = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            c.as_ptr(),
            c"bpf".as_ptr(),
            0,
            c"mode=0700".as_ptr().cast(),
        )
    };
    if ret != 0 {
        return Err(BpffsError::Mount {
            path: root.to_path_buf(),
            source: io::Error::last_os_error(),
        });
    }
    if !is_bpffs(root)? {
        return Err(BpffsError::Mount {
            path: root.to_path_buf(),
            source: io::Error::other("mount succeeded but the directory is not bpffs"),
        });
    }
    Ok(Mounted::Now)
}

fn is_bpffs(path: &Path) -> Result<bool, BpffsError> {
    let c = cstring(path);
    // SAFETY: `statfs` is plain old data, valid when zeroed.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` a writable statfs, both alive for the call.
    let ret = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    if ret != 0 {
        return Err(BpffsError::Statfs {
            path: path.to_path_buf(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(st.f_type as i64 == BPF_FS_MAGIC)
}

fn cstring(path: &Path) -> CString {
    // Paths built by this crate never contain NUL (run ids are checked).
    CString::new(path.as_os_str().as_bytes()).unwrap_or_default()
}

/// Checks that a run id can name one directory of its own: not empty, at most 200 bytes, no
/// `/` or NUL, no `.` (bpffs refuses names with a dot), and not `shared` (cordon's own
/// directory, [`crate::shared::SHARED_DIR`]).
pub fn check_run_id(run_id: &str) -> Result<(), BpffsError> {
    if run_id.is_empty()
        || run_id == crate::shared::SHARED_DIR
        || run_id.contains('.')
        || run_id.len() > 200
        || run_id.contains('/')
        || run_id.contains('\0')
    {
        return Err(BpffsError::BadRunId(run_id.to_owned()));
    }
    Ok(())
}

/// `<root>/cordon/<run_id>`.
pub fn run_dir(root: &Path, run_id: &str) -> PathBuf {
    root.join("cordon").join(run_id)
}

/// A shared `flock` on a run's pin directory, held for as long as a handle ([`crate::Egress`],
/// [`crate::Observer`]) of the run lives in this process: [`cleanup_stale`] leaves locked
/// directories alone, so a run being set up (pins made, links not yet attached) is never
/// taken for a stale one. The kernel drops the lock when the process dies.
#[derive(Debug)]
pub struct RunLock(#[allow(dead_code)] OwnedFd);

fn lock_dir(dir: &Path, exclusive_nb: bool) -> io::Result<Option<OwnedFd>> {
    let fd = OwnedFd::from(fs::File::open(dir)?);
    let op = if exclusive_nb {
        libc::LOCK_EX | libc::LOCK_NB
    } else {
        libc::LOCK_SH
    };
    // SAFETY: flock on a descriptor this function owns; no pointers.
    if unsafe { libc::flock(fd.as_raw_fd(), op) } != 0 {
        let e = io::Error::last_os_error();
        if exclusive_nb && e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(fd))
}

/// Whether `fd` (an open directory) is still what `path` names.
fn same_dir(fd: &OwnedFd, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(by_path) = fs::metadata(path) else {
        return false;
    };
    let file = fs::File::from(fd.try_clone().expect("dup of a directory descriptor"));
    file.metadata()
        .is_ok_and(|m| m.ino() == by_path.ino() && m.dev() == by_path.dev())
}

/// Creates `<root>/cordon/<run_id>/<part>` under a shared lock of the run directory, refusing
/// if the part exists.
pub(crate) fn create_part_dir(
    root: &Path,
    run_id: &str,
    part: &str,
) -> Result<(PathBuf, RunLock), BpffsError> {
    check_run_id(run_id)?;
    let run = run_dir(root, run_id);
    // A concurrent cleanup may remove the run directory between our mkdir and our lock: then
    // the lock holds a deleted directory, and we start again.
    for _ in 0..10 {
        for dir in [root.join("cordon"), run.clone()] {
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(source) => return Err(BpffsError::CreateDir { path: dir, source }),
            }
        }
        let lock = match lock_dir(&run, false) {
            Ok(Some(fd)) => fd,
            Ok(None) => unreachable!("a blocking shared lock is granted or fails"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(BpffsError::CreateDir { path: run, source }),
        };
        if !same_dir(&lock, &run) {
            continue;
        }
        let dir = run.join(part);
        return match fs::create_dir(&dir) {
            Ok(()) => Ok((dir, RunLock(lock))),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(BpffsError::Exists(dir)),
            Err(source) => Err(BpffsError::CreateDir { path: dir, source }),
        };
    }
    Err(BpffsError::CreateDir {
        path: run,
        source: io::Error::other("removed by a concurrent cleanup ten times in a row"),
    })
}

/// Removes a part directory and its pins, then the run directory if that left it empty.
pub(crate) fn remove_part_dir(dir: &Path) -> Result<(), BpffsError> {
    remove_tree(dir)?;
    if let Some(run) = dir.parent() {
        // Another part (the observer's) may still be there: ENOTEMPTY is fine.
        let _ = fs::remove_dir(run);
    }
    Ok(())
}

pub(crate) fn remove_tree(dir: &Path) -> Result<(), BpffsError> {
    let err = |source| BpffsError::Remove {
        path: dir.to_path_buf(),
        source,
    };
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(err(e)),
    };
    for entry in entries {
        let entry = entry.map_err(err)?;
        let path = entry.path();
        if entry.file_type().map_err(err)?.is_dir() {
            remove_tree(&path)?;
        } else {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => return Err(BpffsError::Remove { path, source }),
            }
        }
    }
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(err(e)),
    }
}

/// What [`cleanup_stale`] found for one run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleRun {
    /// The run id (directory name).
    pub run_id: String,
    /// Whether its directory was removed (stale), or kept because a link is still attached or
    /// a live process holds the run.
    pub removed: bool,
    /// Why.
    pub reason: String,
}

/// Cleans what runs whose cordon is gone left under `<root>/cordon` (see the module
/// documentation): in each run directory no live process holds (see [`RunLock`]), the
/// observer part and its shared entries go at once; the egress part and its shared entries go
/// when none of its pinned links is attached to a cgroup any more (the kernel reports cgroup
/// id 0 once a link's cgroup is removed or the link detached), including parts with no links
/// at all (a start that died before attaching); the run directory goes when empty. A run whose
/// links still hold a cgroup keeps its egress part, with its block in force. Then the shared
/// objects of other builds that no live process uses are retired
/// ([`crate::shared::retire_idle`]). Returns one entry per run directory looked at.
pub fn cleanup_stale(root: &Path) -> Result<Vec<StaleRun>, BpffsError> {
    let base = root.join("cordon");
    let err = |source| BpffsError::Remove {
        path: base.clone(),
        source,
    };
    let entries = match fs::read_dir(&base) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(err(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(err)?;
        let run_id = entry.file_name().to_string_lossy().into_owned();
        // `shared` is cordon's own, not a run.
        if run_id == crate::shared::SHARED_DIR || !entry.file_type().map_err(err)?.is_dir() {
            continue;
        }
        let dir = entry.path();
        // A run with a live handle in some process holds a shared lock: not stale.
        let _lock = match lock_dir(&dir, true) {
            Ok(Some(fd)) => fd,
            Ok(None) => {
                out.push(StaleRun {
                    run_id,
                    removed: false,
                    reason: "in use by a live cordon process".into(),
                });
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(BpffsError::Remove { path: dir, source }),
        };
        let observer = dir.join("observer");
        if observer.exists() {
            if let Some(cgroup_id) = crate::shared::read_marker(&observer) {
                crate::shared::forget_observer(root, cgroup_id);
            }
            remove_tree(&observer)?;
        }
        let egress = dir.join("egress");
        let attached = attached_links(&egress);
        if attached.is_empty() {
            if let Some(cgroup_id) = crate::shared::read_marker(&egress) {
                crate::shared::forget_egress(root, cgroup_id);
            }
            remove_tree(&dir)?;
            out.push(StaleRun {
                run_id,
                removed: true,
                reason: "no pinned link is attached to a cgroup".into(),
            });
        } else {
            out.push(StaleRun {
                run_id,
                removed: false,
                reason: format!("links still attached: {}", attached.join(", ")),
            });
        }
    }
    let _ = crate::shared::retire_idle(root);
    Ok(out)
}

/// The pins under `dir` (recursively) that are links attached to a live cgroup.
fn attached_links(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            out.extend(attached_links(&path));
            continue;
        }
        let Ok(fd) = sys::obj_get(&path) else {
            continue;
        };
        use std::os::fd::AsFd;
        // Maps are pinned beside links; their info does not parse as a link's, and a map's
        // "cgroup id" word is never taken as evidence: only links with a nonzero cgroup id
        // whose link id is nonzero count.
        if let Ok(info) = sys::cgroup_link_info(fd.as_fd())
            && info.link_id != 0
            && info.cgroup_id != 0
            && is_link_pin(&path)
        {
            out.push(path.display().to_string());
        }
    }
    out
}

/// Link pins are named after their program (`connect4`, `skb_egress`, ...); maps are not.
fn is_link_pin(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| crate::egress::HOOKS.iter().any(|h| h.program == n))
}
