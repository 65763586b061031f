//! The state directory: where active runs are registered so that another process (`cordon
//! contain`) can find them. Only root may write it: a run's entry names the cgroup a containment
//! kills, so whoever can write an entry could aim a kill. Entries are created atomically and
//! removed at teardown.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupHandle;

/// The state directory when none is named.
pub const DEFAULT_STATE_DIR: &str = "/run/cordon/runs";

/// Errors of the state directory, each naming the path.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The directory could not be created or read.
    #[error("state directory {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Someone other than root could write the directory (or one of its parents).
    #[error(
        "state directory {path} is writable by someone other than root (owner uid {uid}, mode {mode:o}); \
         refusing to trust it (fix with: chown root:root {path} && chmod 700 {path})"
    )]
    NotRootOnly {
        /// The path.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its mode.
        mode: u32,
    },
    /// No such run is registered.
    #[error("no active run {run_id} in {dir} (see `cordon contain --list`)")]
    NoSuchRun {
        /// The run.
        run_id: String,
        /// The state directory.
        dir: PathBuf,
    },
    /// A run id with characters that could leave the directory.
    #[error("invalid run id {0:?} (letters, digits and '-' only)")]
    BadRunId(String),
    /// An entry that does not parse.
    #[error("state entry {path}: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        message: String,
    },
}

/// One active run, as registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunState {
    /// The run.
    pub run_id: String,
    /// Its cgroup.
    pub cgroup: CgroupHandle,
    /// The host pid of its init.
    pub init_pid: i32,
    /// The ledger the run records into.
    pub ledger: Option<PathBuf>,
    /// The run's bpffs directory when it has an egress provider.
    pub egress: Option<PathBuf>,
    /// When it started (milliseconds since the Unix epoch).
    pub started_ms: u64,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
}

impl StateDir {
    /// Opens (creating it, mode 0700, if missing) a state directory that only root can write.
    pub fn open(path: &Path) -> Result<StateDir, StateError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|source| StateError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        let mut p = Some(path);
        while let Some(dir) = p {
            let meta = fs::metadata(dir).map_err(|source| StateError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
            // Sticky world-writable parents (/tmp) still let others replace our directory.
            if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
                return Err(StateError::NotRootOnly {
                    path: dir.to_path_buf(),
                    uid: meta.uid(),
                    mode: meta.mode() & 0o7777,
                });
            }
            p = dir.parent().filter(|d| !d.as_os_str().is_empty());
        }
        Ok(StateDir {
            path: path.to_path_buf(),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn entry(&self, run_id: &str, ext: &str) -> Result<PathBuf, StateError> {
        if run_id.is_empty()
            || run_id.len() > 128
            || !run_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(StateError::BadRunId(run_id.to_owned()));
        }
        Ok(self.path.join(format!("{run_id}.{ext}")))
    }

    /// Registers an active run (atomically: written aside, then renamed into place).
    pub fn register(&self, state: &RunState) -> Result<(), StateError> {
        let path = self.entry(&state.run_id, "json")?;
        let tmp = self.entry(&state.run_id, "json.tmp")?;
        let json = serde_json::to_vec_pretty(state).map_err(|e| StateError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let io = |source| StateError::Io {
            path: path.clone(),
            source,
        };
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        f.write_all(&json).map_err(io)?;
        fs::rename(&tmp, &path).map_err(io)?;
        Ok(())
    }

    /// Removes a run's entries (its registration and containment mark).
    pub fn remove(&self, run_id: &str) {
        for ext in ["json", "contained"] {
            if let Ok(p) = self.entry(run_id, ext) {
                let _ = fs::remove_file(p);
            }
        }
    }

    /// Loads a registered run.
    pub fn load(&self, run_id: &str) -> Result<RunState, StateError> {
        let path = self.entry(run_id, "json")?;
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(StateError::NoSuchRun {
                    run_id: run_id.to_owned(),
                    dir: self.path.clone(),
                });
            }
            Err(source) => return Err(StateError::Io { path, source }),
        };
        serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
            path,
            message: e.to_string(),
        })
    }

    /// Removes entries of runs whose cgroup is gone or is no longer theirs (their cordon was
    /// killed before its teardown). Returns the run ids removed.
    pub fn prune(&self) -> Vec<String> {
        let mut removed = Vec::new();
        for r in self.list() {
            let alive = fs::metadata(&r.cgroup.v2).is_ok_and(|m| m.ino() == r.cgroup.id);
            if !alive {
                self.remove(&r.run_id);
                removed.push(r.run_id);
            }
        }
        removed
    }

    /// Every registered run (entries that do not parse are skipped).
    pub fn list(&self) -> Vec<RunState> {
        let mut out: Vec<RunState> = fs::read_dir(&self.path)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let id = name.strip_suffix(".json")?;
                self.load(id).ok()
            })
            .collect();
        out.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        out
    }

    /// Marks a run as contained, before the containment acts, so that the run's own supervisor
    /// attributes the kill to containment.
    pub fn mark_contained(&self, run_id: &str) -> Result<(), StateError> {
        let path = self.entry(run_id, "contained")?;
        fs::write(&path, b"contained\n").map_err(|source| StateError::Io { path, source })
    }

    /// Whether a containment was started for the run.
    pub fn is_contained(&self, run_id: &str) -> bool {
        self.entry(run_id, "contained").is_ok_and(|p| p.exists())
    }

    /// Whether the removal of what earlier runs left behind is due: it last started `every` or
    /// longer ago, by the stamp file `.housekeeping` (no run id contains a dot), or never, or at
    /// a time the clock now puts in the future. When it is due the stamp is renewed at once, so
    /// that runs started meanwhile skip it; a stamp that cannot be renewed leaves it due every
    /// time (the removal is whole at each step, so runs doing it at once do no harm).
    pub fn housekeeping_due(&self, every: std::time::Duration) -> bool {
        let stamp = self.path.join(".housekeeping");
        let age = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| std::time::SystemTime::now().duration_since(t).ok());
        if age.is_some_and(|a| a < every) {
            return false;
        }
        let _ = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&stamp)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn root() -> bool {
        rustix::process::geteuid().is_root()
    }

    #[test]
    fn run_ids_cannot_leave_the_directory() {
        let d = StateDir {
            path: PathBuf::from("/nonexistent"),
        };
        for bad in ["", "../x", "a/b", "a.b", "x\0"] {
            assert!(
                matches!(d.load(bad), Err(StateError::BadRunId(_))),
                "{bad:?}"
            );
        }
    }

    /// Due the first time, not again within the interval, due once the stamp is older than it
    /// (and when the clock puts the stamp in the future).
    #[test]
    fn housekeeping_is_due_once_per_interval() {
        use std::time::{Duration, SystemTime};
        let base = tempfile::tempdir().unwrap();
        let d = StateDir {
            path: base.path().to_path_buf(),
        };
        let every = Duration::from_secs(10);
        assert!(d.housekeeping_due(every), "never done: due");
        assert!(!d.housekeeping_due(every), "just done: not due");
        assert!(!d.housekeeping_due(every), "still not due");
        let stamp = fs::File::options()
            .write(true)
            .open(base.path().join(".housekeeping"))
            .unwrap();
        stamp
            .set_modified(SystemTime::now() - Duration::from_secs(11))
            .unwrap();
        assert!(d.housekeeping_due(every), "older than the interval: due");
        assert!(!d.housekeeping_due(every), "and renewed");
        stamp
            .set_modified(SystemTime::now() + Duration::from_secs(3600))
            .unwrap();
        assert!(d.housekeeping_due(every), "a stamp in the future: due");
        assert!(d.list().is_empty(), "the stamp is not a run");
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        if !root() {
            eprintln!("SKIP a_directory_others_can_write_is_refused: needs root-owned dirs");
            return;
        }
        let base = tempfile::tempdir().unwrap();
        // tempdir's parent is /tmp: world-writable, so even a 0700 dir below it is refused.
        let below_tmp = base.path().join("state");
        assert!(matches!(
            StateDir::open(&below_tmp),
            Err(StateError::NotRootOnly { .. })
        ));
        // A root-only tree is accepted; making it group-writable is refused.
        let good = Path::new("/run/cordon-test-state").join(std::process::id().to_string());
        let d = StateDir::open(&good).unwrap();
        fs::set_permissions(&good, fs::Permissions::from_mode(0o770)).unwrap();
        assert!(matches!(
            StateDir::open(&good),
            Err(StateError::NotRootOnly { .. })
        ));
        fs::set_permissions(&good, fs::Permissions::from_mode(0o700)).unwrap();
        let state = RunState {
            run_id: "r1-abc".into(),
            cgroup: CgroupHandle {
                v2: "/sys/fs/cgroup/x".into(),
                id: 7,
                v1: vec![],
            },
            init_pid: 42,
            ledger: None,
            egress: None,
            started_ms: 1,
        };
        d.register(&state).unwrap();
        assert_eq!(d.load("r1-abc").unwrap(), state);
        assert_eq!(d.list(), vec![state.clone()]);
        assert!(!d.is_contained("r1-abc"));
        d.mark_contained("r1-abc").unwrap();
        assert!(d.is_contained("r1-abc"));
        d.remove("r1-abc");
        assert!(matches!(
            d.load("r1-abc"),
            Err(StateError::NoSuchRun { .. })
        ));
        // An entry whose cgroup is gone (its cordon died before teardown) is pruned.
        d.register(&state).unwrap();
        assert_eq!(d.prune(), vec!["r1-abc".to_owned()]);
        assert!(matches!(
            d.load("r1-abc"),
            Err(StateError::NoSuchRun { .. })
        ));
        let _ = fs::remove_dir_all("/run/cordon-test-state");
    }
}
