//! The run specification (what the operator asked for) and its validation into a [`Plan`] (what the
//! launcher will do). Validation happens before anything is created: a spec that is unsafe,
//! contradictory or refers to something that does not exist is refused here, with a reason.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::plan::{Identity, LandlockPlan, Mount, MountKind, NetPlan, Plan};

/// The smallest memory limit accepted: below this a shell cannot start, and a limit that makes
/// every run fail is a mistake, not a policy.
pub const MIN_MEMORY: u64 = 4 << 20;

/// Paths the sandbox builds itself; binding the host's over them would defeat the boundary.
const OWN_MOUNTS: [&str; 2] = ["/proc", "/dev"];

/// The network the command gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase", tag = "mode", content = "allow")]
pub enum NetSpec {
    /// A new, empty network namespace with only loopback: no network at all.
    #[default]
    None,
    /// The host's network namespace, unrestricted.
    Host,
    /// The host's network, restricted to these destinations (host names already resolved).
    Allow(Vec<crate::plan::AllowRule>),
}

/// Resource limits. `None` means "no limit of this kind asked for".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Limits {
    /// Memory, in bytes (cgroup memory limit).
    pub memory: Option<u64>,
    /// Most processes and threads alive at once (cgroup pids limit).
    pub pids: Option<u64>,
    /// Wall-clock limit for the whole run.
    #[serde(with = "duration_ms")]
    pub timeout: Option<Duration>,
}

/// What the operator asked for: a policy file's boundary sections merged with command-line flags.
/// Paths may be relative (to [`RunSpec::base_dir`]); nothing here has been checked yet.
#[derive(Debug, Clone, Default)]
pub struct RunSpec {
    /// The command and its arguments. The first element is looked up in the sandbox's `PATH`
    /// when it has no slash.
    pub command: Vec<String>,
    /// Paths the command may read.
    pub read: Vec<PathBuf>,
    /// Paths the command may read and write.
    pub write: Vec<PathBuf>,
    /// When `Some`, the only paths from which the command may execute files.
    pub exec: Option<Vec<PathBuf>>,
    /// Network access.
    pub net: NetSpec,
    /// Resource limits.
    pub limits: Limits,
    /// Environment variables set for the command (the host's are not inherited).
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox; `None` picks the base directory when it is visible
    /// inside, `/` otherwise.
    pub cwd: Option<PathBuf>,
    /// Directory relative paths are resolved against (normally the caller's working directory).
    pub base_dir: PathBuf,
    /// Paths the command must never be able to write (the ledger the run is recorded in, the
    /// state directory). A writable path that contains or lies inside one is refused.
    pub protected: Vec<PathBuf>,
    /// Run even when an enforcement asked for is not fully in force.
    pub allow_degraded: bool,
    /// `TERM` to pass through when it looks harmless (the caller reads it from its environment).
    pub term: Option<String>,
    /// The uid and gid of the process asking for the run.
    pub caller: (u32, u32),
}

/// The host identity used when nothing ties the run to a user: `nobody`/`nogroup`.
pub const NOBODY: (u32, u32) = (65534, 65534);

/// Why a spec was refused. Every variant names what was wrong; the CLI prints it on one line and
/// exits 125.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// No command was given.
    #[error("no command given (usage: cordon run [OPTIONS] -- COMMAND [ARGS...])")]
    EmptyCommand,
    /// An argument, variable or path contains a NUL byte, which no exec or path can carry.
    #[error("{what} contains a NUL byte")]
    NulByte {
        /// Which value.
        what: String,
    },
    /// A path does not exist or cannot be resolved.
    #[error("{kind} path {path}: {source}")]
    Path {
        /// `read`, `write`, `exec` or `cwd`.
        kind: &'static str,
        /// The path as given.
        path: PathBuf,
        /// Why it could not be resolved.
        source: std::io::Error,
    },
    /// `/` was asked to be writable.
    #[error("refusing a writable / (grant the directories the command needs instead)")]
    WritableRoot,
    /// A path the sandbox provides itself was asked for.
    #[error("{kind} path {path}: the sandbox mounts its own {own}; the host's cannot be granted")]
    OwnMount {
        /// `read` or `write`.
        kind: &'static str,
        /// The path as given.
        path: PathBuf,
        /// The sandbox's own mount it collides with.
        own: &'static str,
    },
    /// A grant goes through a symlink in a directory others can change.
    #[error(
        "{kind} path {path} goes through the symlink {link}, in a directory others than root can \
         change; grant the path it points to instead"
    )]
    UntrustedSymlink {
        /// `read`, `write` or `exec`.
        kind: &'static str,
        /// The path as given.
        path: PathBuf,
        /// The symlink.
        link: PathBuf,
    },
    /// A writable path would let the command rewrite a protected path (the evidence ledger).
    #[error(
        "write path {path} would let the command modify {protected}, which must stay out of its reach"
    )]
    WritesProtected {
        /// The writable path.
        path: PathBuf,
        /// The protected path it overlaps.
        protected: PathBuf,
    },
    /// A limit whose value would make every run fail.
    #[error("{0}")]
    Limit(String),
    /// An environment variable name that is not one.
    #[error(
        "invalid environment variable name {0:?} (letters, digits and _; not starting with a digit)"
    )]
    EnvName(String),
    /// The network spec is unusable.
    #[error("{0}")]
    Net(String),
    /// Started as root, a writable path owned by root that others cannot write: the command
    /// would need root's uid to write there, which cordon never gives it.
    #[error(
        "write path {0} is owned by root and not writable by others; cordon never runs a command \
         with root's uid. Give the path to the user the command should run as \
         (e.g. chown -R 65534:65534 {0})"
    )]
    RootOwnedWrite(PathBuf),
    /// Started as root, writable paths owned by different users.
    #[error(
        "write paths {0} and {1} belong to different users; the command runs as one user, \
         so give them the same owner"
    )]
    MixedOwners(PathBuf, PathBuf),
    /// The working directory would not be visible inside the sandbox.
    #[error("working directory {0} is not inside any path granted to the command")]
    CwdNotVisible(PathBuf),
}

impl RunSpec {
    /// Checks the spec and reduces it to the plan a launcher executes. Touches nothing but
    /// `stat`/`readlink` on the named paths.
    pub fn validate(&self, run_id: &str) -> Result<Plan, SpecError> {
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err(SpecError::EmptyCommand);
        }
        for (i, arg) in self.command.iter().enumerate() {
            no_nul(arg, || format!("argument {i}"))?;
        }

        let limits = self.validate_limits()?;
        let net = self.validate_net()?;
        let env = self.validate_env()?;

        let mut grants: BTreeMap<PathBuf, Grant> = BTreeMap::new();
        let mut symlinks: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
        let protected: Vec<PathBuf> = self
            .protected
            .iter()
            .map(|p| canonical_or_lexical(&self.absolute(p)))
            .collect();

        for (kind, paths) in [("read", &self.read), ("write", &self.write)] {
            for given in paths {
                let resolved = self.resolve(kind, given, &mut symlinks)?;
                if kind == "write" {
                    if resolved == Path::new("/") {
                        return Err(SpecError::WritableRoot);
                    }
                    for p in &protected {
                        if p.starts_with(&resolved) || resolved.starts_with(p) {
                            return Err(SpecError::WritesProtected {
                                path: given.clone(),
                                protected: p.clone(),
                            });
                        }
                    }
                }
                let grant = if kind == "write" {
                    Grant::Write
                } else {
                    Grant::Read
                };
                let entry = grants.entry(resolved).or_insert(grant);
                *entry = (*entry).max(grant);
            }
        }

        let loaders = dynamic_loaders();
        let mut exec_paths = None;
        if let Some(exec) = &self.exec {
            let mut resolved_exec = Vec::new();
            for given in exec {
                let resolved = self.resolve("exec", given, &mut symlinks)?;
                // Executing needs reading; an exec path no read/write grant covers is readable.
                if !grants.keys().any(|g| resolved.starts_with(g)) {
                    grants.insert(resolved.clone(), Grant::Read);
                }
                resolved_exec.push(resolved);
            }
            // The kernel opens a dynamic binary's ELF interpreter for execution too: without it
            // nothing dynamically linked could run. Only the loader file itself is added.
            for (_, loader) in &loaders {
                resolved_exec.push(loader.clone());
            }
            resolved_exec.sort();
            resolved_exec.dedup();
            exec_paths = Some(resolved_exec);
        }

        // Top-level compatibility links (`/bin` -> `usr/bin` on a merged-/usr system) are shown
        // as on the host whenever their target is granted: scripts say `#!/bin/sh`.
        if let Ok(links) =
            crate::dir::entries(Path::new("/"), |_, t| t == crate::dir::FileType::Symlink)
        {
            for (path, _) in links {
                if let Ok(target) = path.canonicalize()
                    && grants.keys().any(|g| target.starts_with(g))
                {
                    symlinks.entry(path).or_insert(target);
                }
            }
        }

        // Whatever else is granted, the dynamic loader must be reachable under the name
        // binaries carry (`/lib64/ld-linux-x86-64.so.2`), or nothing dynamically linked runs.
        for (name, loader) in loaders {
            if !grants.keys().any(|g| loader.starts_with(g)) {
                grants.insert(loader.clone(), Grant::Read);
            }
            if name != loader {
                symlinks.entry(name).or_insert(loader);
            }
        }

        let cwd = self.validate_cwd(&grants)?;
        let identity = self.identity(&grants)?;

        let mut mounts: Vec<Mount> = Vec::with_capacity(grants.len());
        for (path, grant) in &grants {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(path).map_err(|source| SpecError::Path {
                kind: if *grant == Grant::Write {
                    "write"
                } else {
                    "read"
                },
                path: path.clone(),
                source,
            })?;
            mounts.push(Mount {
                path: path.clone(),
                kind: match grant {
                    Grant::Read => MountKind::ReadOnly,
                    Grant::Write => MountKind::ReadWrite,
                },
                id: Some((meta.dev(), meta.ino())),
            });
        }
        for (link, target) in &symlinks {
            // A symlink shadowed by a granted directory (or the path itself) needs nothing more.
            if grants.contains_key(link) || grants.keys().any(|g| link.starts_with(g)) {
                continue;
            }
            mounts.push(Mount {
                path: link.clone(),
                kind: MountKind::Symlink(target.clone()),
                id: None,
            });
        }
        // Parents before children, so a nested grant is mounted on top of its parent's.
        mounts.sort_by(|a, b| {
            a.path
                .components()
                .count()
                .cmp(&b.path.components().count())
                .then_with(|| a.path.cmp(&b.path))
        });

        let landlock = LandlockPlan {
            read: grants
                .iter()
                .filter(|(_, g)| **g == Grant::Read)
                .map(|(p, _)| p.clone())
                .collect(),
            write: grants
                .iter()
                .filter(|(_, g)| **g == Grant::Write)
                .map(|(p, _)| p.clone())
                .collect(),
            exec: exec_paths,
            // Without a network of its own the command may neither bind nor connect TCP; with
            // the host's (restricted by eBPF or not) Landlock's port rules are not the boundary.
            restrict_tcp: matches!(net, NetPlan::None),
        };

        let mut plan = Plan {
            run_id: run_id.to_owned(),
            argv: self.command.clone(),
            env,
            cwd,
            mounts,
            landlock,
            net,
            limits,
            identity,
            hostname: crate::plan::HOSTNAME.to_owned(),
            allow_degraded: self.allow_degraded,
            spec_hash: String::new(),
        };
        plan.spec_hash = plan.digest();
        Ok(plan)
    }

    fn absolute(&self, p: &Path) -> PathBuf {
        normalize(&self.base_dir.join(p))
    }

    /// Resolves a granted path to its canonical form, remembering the symlink chain it went
    /// through so that the sandbox shows the same names as the host (`/bin` -> `/usr/bin`).
    fn resolve(
        &self,
        kind: &'static str,
        given: &Path,
        symlinks: &mut BTreeMap<PathBuf, PathBuf>,
    ) -> Result<PathBuf, SpecError> {
        no_nul_path(given, kind)?;
        let absolute = self.absolute(given);
        let canonical = absolute.canonicalize().map_err(|source| SpecError::Path {
            kind,
            path: given.to_path_buf(),
            source,
        })?;
        for own in OWN_MOUNTS {
            if canonical.starts_with(own) {
                return Err(SpecError::OwnMount {
                    kind,
                    path: given.to_path_buf(),
                    own,
                });
            }
        }
        if canonical != absolute {
            self.check_symlinks(kind, given, &absolute)?;
            symlinks.insert(absolute, canonical.clone());
        }
        Ok(canonical)
    }

    /// A grant may go through a symlink only when the symlink's directory can be changed by
    /// root (or, for an ordinary caller, by that caller) alone: otherwise whoever can replace the
    /// link (another run with a writable grant, another user) decides what this run is given.
    fn check_symlinks(
        &self,
        kind: &'static str,
        given: &Path,
        absolute: &Path,
    ) -> Result<(), SpecError> {
        use std::os::unix::fs::MetadataExt;
        let mut prefix = PathBuf::from("/");
        for c in absolute.components().skip(1) {
            prefix.push(c);
            let Ok(meta) = std::fs::symlink_metadata(&prefix) else {
                return Ok(()); // canonicalize succeeded, so the rest resolves; nothing to check
            };
            if !meta.file_type().is_symlink() {
                continue;
            }
            let dir = prefix.parent().unwrap_or(Path::new("/"));
            let dmeta = std::fs::metadata(dir).map_err(|source| SpecError::Path {
                kind,
                path: given.to_path_buf(),
                source,
            })?;
            let trusted_owner = dmeta.uid() == 0 || dmeta.uid() == self.caller.0;
            if !trusted_owner || dmeta.mode() & 0o022 != 0 {
                return Err(SpecError::UntrustedSymlink {
                    kind,
                    path: given.to_path_buf(),
                    link: prefix.clone(),
                });
            }
            // Continue from where the link points (it may itself go through further links).
            let target = prefix.canonicalize().map_err(|source| SpecError::Path {
                kind,
                path: given.to_path_buf(),
                source,
            })?;
            prefix = target;
        }
        Ok(())
    }

    /// The host uid/gid the command runs as. An ordinary caller: its own (an unprivileged user
    /// namespace can map nothing else). Root: the owner of the writable paths, so that what the
    /// command writes belongs to whoever owns the workspace; `nobody` when there are none or when
    /// they are writable by anyone. Never root.
    fn identity(&self, grants: &BTreeMap<PathBuf, Grant>) -> Result<Identity, SpecError> {
        use std::os::unix::fs::MetadataExt;
        let mut host = if self.caller.0 != 0 {
            Some((self.caller, PathBuf::new()))
        } else {
            None
        };
        if self.caller.0 == 0 {
            for (path, _) in grants.iter().filter(|(_, g)| **g == Grant::Write) {
                let meta = std::fs::metadata(path).map_err(|source| SpecError::Path {
                    kind: "write",
                    path: path.clone(),
                    source,
                })?;
                let owner = if meta.uid() == 0 {
                    if meta.mode() & 0o002 == 0 {
                        return Err(SpecError::RootOwnedWrite(path.clone()));
                    }
                    continue;
                } else {
                    (meta.uid(), primary_gid(meta.uid()))
                };
                match &host {
                    Some((o, first)) if o.0 != owner.0 => {
                        return Err(SpecError::MixedOwners(first.clone(), path.clone()));
                    }
                    Some(_) => {}
                    None => host = Some((owner, path.clone())),
                }
            }
        }
        let (host_uid, host_gid) = host.map_or(NOBODY, |(o, _)| o);
        Ok(Identity {
            host_uid,
            host_gid,
            ..Identity::default()
        })
    }

    fn validate_limits(&self) -> Result<Limits, SpecError> {
        let l = self.limits;
        if let Some(m) = l.memory
            && m < MIN_MEMORY
        {
            return Err(SpecError::Limit(format!(
                "memory limit of {m} bytes is below the minimum of {} MiB",
                MIN_MEMORY >> 20
            )));
        }
        if l.pids == Some(0) {
            return Err(SpecError::Limit(
                "pids limit of 0 leaves no room for the command itself (use at least 1)".into(),
            ));
        }
        if l.timeout == Some(Duration::ZERO) {
            return Err(SpecError::Limit(
                "timeout of 0 would kill the command before it starts".into(),
            ));
        }
        Ok(l)
    }

    fn validate_net(&self) -> Result<NetPlan, SpecError> {
        match &self.net {
            NetSpec::None => Ok(NetPlan::None),
            NetSpec::Host => Ok(NetPlan::Host),
            NetSpec::Allow(list) if list.is_empty() => Err(SpecError::Net(
                "--net allow: needs at least one destination (or use --net none)".into(),
            )),
            NetSpec::Allow(list) => Ok(NetPlan::Allow(list.clone())),
        }
    }

    fn validate_env(&self) -> Result<Vec<(String, String)>, SpecError> {
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        env.insert("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into());
        env.insert("HOME".into(), "/tmp".into());
        env.insert("LANG".into(), "C.UTF-8".into());
        let term = self
            .term
            .as_deref()
            .filter(|t| {
                !t.is_empty()
                    && t.len() <= 64
                    && t.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b))
            })
            .unwrap_or("dumb");
        env.insert("TERM".into(), term.into());
        for (name, value) in &self.env {
            let valid = !name.is_empty()
                && !name.as_bytes()[0].is_ascii_digit()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(SpecError::EnvName(name.clone()));
            }
            no_nul(value, || format!("value of {name}"))?;
            env.insert(name.clone(), value.clone());
        }
        Ok(env.into_iter().collect())
    }

    fn validate_cwd(&self, grants: &BTreeMap<PathBuf, Grant>) -> Result<PathBuf, SpecError> {
        let visible = |p: &Path| {
            p == Path::new("/") || p.starts_with("/tmp") || grants.keys().any(|g| p.starts_with(g))
        };
        match &self.cwd {
            Some(cwd) => {
                no_nul_path(cwd, "cwd")?;
                let abs = self.absolute(cwd);
                let canonical = abs.canonicalize().unwrap_or(abs);
                if visible(&canonical) {
                    Ok(canonical)
                } else {
                    Err(SpecError::CwdNotVisible(cwd.clone()))
                }
            }
            None => {
                let base = canonical_or_lexical(&self.base_dir);
                Ok(
                    if base != Path::new("/") && grants.keys().any(|g| base.starts_with(g)) {
                        base
                    } else {
                        PathBuf::from("/")
                    },
                )
            }
        }
    }
}

/// How much access a path is granted; the larger wins when a path is named twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Grant {
    Read,
    Write,
}

fn no_nul(s: &str, what: impl FnOnce() -> String) -> Result<(), SpecError> {
    if s.contains('\0') {
        Err(SpecError::NulByte { what: what() })
    } else {
        Ok(())
    }
}

fn no_nul_path(p: &Path, kind: &str) -> Result<(), SpecError> {
    use std::os::unix::ffi::OsStrExt;
    if p.as_os_str().as_bytes().contains(&0) {
        Err(SpecError::NulByte {
            what: format!("{kind} path {}", p.display()),
        })
    } else {
        Ok(())
    }
}

/// The group the command runs with when it runs as `uid`: that user's primary group from
/// `/etc/passwd`, never the workspace directory's group (which may be root's, or `docker`'s), and
/// never gid 0; `nogroup` when there is no such entry.
fn primary_gid(uid: u32) -> u32 {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|line| {
            let mut f = line.split(':');
            let (_, _, u, g) = (f.next()?, f.next()?, f.next()?, f.next()?);
            (u.parse::<u32>().ok()? == uid).then(|| g.parse::<u32>().ok())?
        })
        .filter(|&g| g != 0)
        .unwrap_or(NOBODY.1)
}

/// The dynamic loaders (ELF interpreters) installed on this host: the name binaries carry (in
/// `/lib64` or `/lib`) and the canonical file it resolves to.
fn dynamic_loaders() -> Vec<(PathBuf, PathBuf)> {
    let mut out = Vec::new();
    let loader_name = |name: &std::ffi::OsStr, _| {
        use std::os::unix::ffi::OsStrExt;
        let name = name.as_bytes();
        (name.starts_with(b"ld-linux") || name.starts_with(b"ld-musl"))
            && name.windows(3).any(|w| w == b".so")
    };
    for dir in ["/lib64", "/lib"] {
        let Ok(entries) = crate::dir::entries(Path::new(dir), loader_name) else {
            continue;
        };
        for (path, _) in entries {
            if let Ok(c) = path.canonicalize()
                && c.is_file()
            {
                out.push((path, c));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The canonical form of `p`, also when it does not exist yet: its deepest existing ancestor is
/// canonicalized (so a symlink on the way is seen through) and the rest appended.
fn canonical_or_lexical(p: &Path) -> PathBuf {
    let p = normalize(p);
    let mut missing = Vec::new();
    let mut at = p.as_path();
    loop {
        if let Ok(c) = at.canonicalize() {
            let mut out = c;
            out.extend(missing.iter().rev());
            return out;
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_owned());
                at = parent;
            }
            _ => return p,
        }
    }
}

/// Lexical normalization: removes `.` and resolves `..` against the preceding component
/// (never above `/`). Symlinks are not consulted; callers canonicalize where it matters.
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    out
}

mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

impl Plan {
    /// SHA-256 over the plan's JSON with `spec_hash` and `run_id` blank: two runs of the same
    /// spec have the same hash.
    fn digest(&self) -> String {
        let mut copy = self.clone();
        copy.spec_hash.clear();
        copy.run_id.clear();
        let json = serde_json::to_vec(&copy).unwrap_or_default();
        hex::encode(Sha256::digest(&json))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &Path) -> RunSpec {
        RunSpec {
            command: vec!["/bin/true".into()],
            read: vec!["/usr".into()],
            base_dir: dir.to_path_buf(),
            caller: (1000, 1000),
            ..RunSpec::default()
        }
    }

    #[test]
    fn identity_follows_the_workspace_and_is_never_root() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // An ordinary caller always runs as itself.
        let mut s = spec(dir.path());
        s.write = vec![dir.path().into()];
        let plan = s.validate("r").unwrap();
        assert_eq!(
            (plan.identity.host_uid, plan.identity.host_gid),
            (1000, 1000)
        );
        assert_eq!(plan.identity.uid, 1000);
        // Root with no writable paths: nobody.
        let mut s = spec(dir.path());
        s.caller = (0, 0);
        let plan = s.validate("r").unwrap();
        assert_eq!((plan.identity.host_uid, plan.identity.host_gid), NOBODY);
        if rustix_free_is_root(dir.path()) {
            // Root with a root-owned private workspace: refused.
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            s.write = vec![dir.path().into()];
            assert!(matches!(s.validate("r"), Err(SpecError::RootOwnedWrite(_))));
            // World-writable (like /tmp): nobody.
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
            let plan = s.validate("r").unwrap();
            assert_eq!(plan.identity.host_uid, NOBODY.0);
        }
    }

    #[test]
    fn the_host_group_is_never_root_even_when_the_workspace_is_roots_group() {
        use std::os::unix::fs::MetadataExt;
        // /proc/self belongs to the effective uid.
        if std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .unwrap_or(1)
            != 0
        {
            let msg = "SKIP the_host_group_is_never_root...: needs root to chown";
            if std::env::var_os("CORDON_REQUIRE_PRIVILEGED").is_some_and(|v| v == "1") {
                panic!("{msg}; CORDON_REQUIRE_PRIVILEGED=1 turns this skip into a failure");
            }
            eprintln!("{msg}");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        // Owned by a user with no passwd entry, group root: a plain `mkdir; chown 4321 ws`.
        std::os::unix::fs::chown(&ws, Some(4321), Some(0)).unwrap();
        let mut s = spec(dir.path());
        s.caller = (0, 0);
        s.write = vec![ws];
        let plan = s.validate("r").unwrap();
        assert_eq!(plan.identity.host_uid, 4321);
        assert_eq!(
            plan.identity.host_gid, NOBODY.1,
            "the workspace's group leaked in"
        );
    }

    /// Whether files created here belong to root (the test runs as root).
    fn rustix_free_is_root(dir: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir)
            .map(|m| m.uid() == 0)
            .unwrap_or(false)
    }

    #[test]
    fn writable_root_is_refused_however_spelled() {
        let dir = tempfile::tempdir().unwrap();
        for root in ["/", "//", "/./", "/usr/..", "/../.."] {
            let mut s = spec(dir.path());
            s.write = vec![root.into()];
            assert!(
                matches!(s.validate("r"), Err(SpecError::WritableRoot)),
                "{root} was accepted as writable"
            );
        }
    }

    #[test]
    fn missing_path_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec(dir.path());
        s.read.push("does-not-exist".into());
        let err = s.validate("r").unwrap_err();
        assert!(err.to_string().contains("does-not-exist"), "{err}");
    }

    #[test]
    fn host_proc_and_dev_cannot_be_granted() {
        let dir = tempfile::tempdir().unwrap();
        for p in ["/proc", "/proc/self", "/dev", "/dev/null"] {
            let mut s = spec(dir.path());
            s.read.push(p.into());
            assert!(
                matches!(s.validate("r"), Err(SpecError::OwnMount { .. })),
                "{p}"
            );
        }
    }

    #[test]
    fn protected_ledger_cannot_be_written() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger");
        std::fs::create_dir(&ledger).unwrap();
        let mut s = spec(dir.path());
        s.protected = vec![ledger.clone()];
        s.write = vec![dir.path().to_path_buf()];
        assert!(matches!(
            s.validate("r"),
            Err(SpecError::WritesProtected { .. })
        ));
        s.write = vec![ledger];
        assert!(matches!(
            s.validate("r"),
            Err(SpecError::WritesProtected { .. })
        ));
        // Reading it is fine: the ledger is public evidence.
        s.write.clear();
        s.read.push(dir.path().to_path_buf());
        assert!(s.validate("r").is_ok());
    }

    #[test]
    fn a_ledger_not_created_yet_is_protected_through_a_symlinked_parent() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        std::os::unix::fs::symlink(&ws, dir.path().join("link")).unwrap();
        let mut s = spec(dir.path());
        s.protected = vec![dir.path().join("link/not-yet/ledger")];
        s.write = vec![ws.clone()];
        assert!(matches!(
            s.validate("r"),
            Err(SpecError::WritesProtected { .. })
        ));
    }

    #[test]
    fn limits_that_make_every_run_fail_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec(dir.path());
        s.limits.pids = Some(0);
        assert!(matches!(s.validate("r"), Err(SpecError::Limit(_))));
        let mut s = spec(dir.path());
        s.limits.memory = Some(1024);
        assert!(matches!(s.validate("r"), Err(SpecError::Limit(_))));
        let mut s = spec(dir.path());
        s.limits.timeout = Some(Duration::ZERO);
        assert!(matches!(s.validate("r"), Err(SpecError::Limit(_))));
    }

    #[test]
    fn env_is_not_inherited_and_names_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec(dir.path());
        s.env.insert("GOOD_1".into(), "x".into());
        let plan = s.validate("r").unwrap();
        let names: Vec<&str> = plan.env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["GOOD_1", "HOME", "LANG", "PATH", "TERM"]);
        for bad in ["", "1X", "A=B", "A B"] {
            let mut s = spec(dir.path());
            s.env.insert(bad.into(), "x".into());
            assert!(
                matches!(s.validate("r"), Err(SpecError::EnvName(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn symlinked_grants_keep_their_host_names() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        let mut s = spec(dir.path());
        s.read = vec!["link".into()];
        let plan = s.validate("r").unwrap();
        let real = real.canonicalize().unwrap();
        assert!(
            plan.mounts
                .iter()
                .any(|m| m.path == real && m.kind == MountKind::ReadOnly)
        );
        assert!(
            plan.mounts
                .iter()
                .any(|m| m.kind == MountKind::Symlink(real.clone()))
        );
    }

    #[test]
    fn parents_are_mounted_before_children_and_write_wins() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        let mut s = spec(dir.path());
        s.read = vec![inner.clone(), dir.path().into(), inner.clone()];
        s.write = vec![inner.clone()];
        let plan = s.validate("r").unwrap();
        let pos = |p: &Path| plan.mounts.iter().position(|m| m.path == p).unwrap();
        let outer = dir.path().canonicalize().unwrap();
        let inner = inner.canonicalize().unwrap();
        assert!(pos(&outer) < pos(&inner));
        assert_eq!(plan.mounts[pos(&inner)].kind, MountKind::ReadWrite);
        assert_eq!(plan.mounts.iter().filter(|m| m.path == inner).count(), 1);
    }

    #[test]
    fn spec_hash_is_stable_and_sensitive() {
        let dir = tempfile::tempdir().unwrap();
        let a = spec(dir.path()).validate("one").unwrap();
        let b = spec(dir.path()).validate("two").unwrap();
        assert_eq!(a.spec_hash, b.spec_hash);
        let mut s = spec(dir.path());
        s.limits.pids = Some(5);
        assert_ne!(s.validate("one").unwrap().spec_hash, a.spec_hash);
    }

    #[test]
    fn nul_bytes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec(dir.path());
        s.command.push("a\0b".into());
        assert!(matches!(s.validate("r"), Err(SpecError::NulByte { .. })));
    }
}

#[cfg(test)]
mod compat_links {
    use super::*;

    #[test]
    fn top_level_links_follow_their_granted_targets() {
        let dir = tempfile::tempdir().unwrap();
        let spec = RunSpec {
            command: vec!["/bin/true".into()],
            read: vec!["/usr".into(), "/etc".into()],
            exec: Some(vec!["/usr/bin".into()]),
            base_dir: dir.path().to_path_buf(),
            caller: (0, 0),
            protected: vec!["/tmp/x/ledger".into()],
            ..RunSpec::default()
        };
        let plan = spec.validate("r").unwrap();
        let host_bin = std::fs::symlink_metadata("/bin").unwrap();
        if host_bin.file_type().is_symlink() {
            let target = Path::new("/bin").canonicalize().unwrap();
            assert!(
                plan.mounts
                    .iter()
                    .any(|m| m.path == Path::new("/bin")
                        && m.kind == MountKind::Symlink(target.clone())),
                "{:?}",
                plan.mounts
            );
        }
    }
}
