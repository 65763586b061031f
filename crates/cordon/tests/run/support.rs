//! Helpers shared by the `cordon run` tests: running cordon, running the same probe on the host
//! (the negative control), privilege checks, and a safety net for resource attacks.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// The Python every probe runs with, on the host and inside the sandbox alike.
pub const PY: &str = "/usr/bin/python3";

/// `SIGSYS`: what seccomp's default action kills with.
pub const SIGSYS: i64 = 31;

/// Whether this test can run here. Without root (or a kernel feature) it prints why and skips;
/// with `CORDON_REQUIRE_PRIVILEGED=1` (set by CI) a skip is a failure.
pub fn privileged(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    let msg = format!("SKIP {test}: needs root (the sandbox's cgroup, limits and kill)");
    if std::env::var_os("CORDON_REQUIRE_PRIVILEGED").is_some_and(|v| v == "1") {
        panic!("{msg}; CORDON_REQUIRE_PRIVILEGED=1 turns this skip into a failure");
    }
    eprintln!("{msg}");
    false
}

/// A temporary area for one test: a ledger, a report path, and directories to grant.
pub struct Area {
    pub dir: tempfile::TempDir,
}

impl Area {
    pub fn new() -> Area {
        let dir = tempfile::Builder::new()
            .prefix("cordon-test-")
            .tempdir()
            .unwrap();
        // Traversable by the sandbox's user, as an ordinary workspace's parents are.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        Area { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A directory the sandbox user (host `nobody`) owns: a workspace to grant with `--write`.
    pub fn workspace(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        fs::create_dir_all(&p).unwrap();
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        p
    }

    /// A directory with a file in it that the probes try to reach.
    pub fn secret(&self) -> PathBuf {
        let d = self.path("outside");
        fs::create_dir_all(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        let f = d.join("secret.txt");
        fs::write(&f, "TOP-SECRET\n").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        f
    }

    /// Runs `cordon run [flags] -- cmd...` with this area's ledger and report.
    pub fn run(&self, flags: &[&str], cmd: &[&str]) -> Run {
        self.run_with(flags, cmd, |_| {})
    }

    pub fn run_with(&self, flags: &[&str], cmd: &[&str], adjust: impl FnOnce(&mut Command)) -> Run {
        let report = self.path("report.json");
        let _ = fs::remove_file(&report);
        let mut c = Command::new(env!("CARGO_BIN_EXE_cordon"));
        c.arg("run")
            .arg("--ledger")
            .arg(self.path("ledger"))
            .arg("--report")
            .arg(&report)
            .args(flags)
            .arg("--")
            .args(cmd)
            .stdin(Stdio::null());
        adjust(&mut c);
        let out = c.output().unwrap();
        let report = fs::read_to_string(&report)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        Run { out, report }
    }
}

/// What a `cordon run` did.
pub struct Run {
    pub out: Output,
    pub report: Value,
}

impl Run {
    pub fn code(&self) -> i32 {
        self.out.status.code().unwrap_or(-1)
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    pub fn verdict(&self) -> &str {
        self.report["verdict"].as_str().unwrap_or("")
    }
    /// The signal that killed the command, from the report.
    pub fn signal(&self) -> Option<i64> {
        self.report["exit"]["signal"].as_i64()
    }
    /// Fails the test with everything cordon said.
    pub fn explain(&self) -> String {
        format!(
            "exit {}\nstdout:\n{}\nstderr:\n{}\nreport: {}",
            self.code(),
            self.stdout(),
            self.stderr(),
            serde_json::to_string_pretty(&self.report).unwrap_or_default()
        )
    }
    /// Asserts the run was allowed and the command exited 0; returns its stdout.
    pub fn ok(&self) -> String {
        assert_eq!(self.code(), 0, "{}", self.explain());
        assert_eq!(self.verdict(), "ALLOWED", "{}", self.explain());
        assert_eq!(
            self.report["teardown"]["verified_empty"],
            true,
            "{}",
            self.explain()
        );
        self.stdout()
    }
    /// Asserts the command was killed by seccomp (SIGSYS).
    pub fn killed_by_seccomp(&self) {
        assert_eq!(self.signal(), Some(SIGSYS), "{}", self.explain());
        assert_eq!(self.code(), 128 + 31, "{}", self.explain());
    }
}

/// Runs a command directly on the host: the negative control.
pub fn host(cmd: &[&str]) -> Output {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A Python probe that performs `body` (which must print its own result) with `errno`-style
/// reporting: an `OSError` prints `ERR <errno name>`.
pub fn py(body: &str) -> Vec<String> {
    let script = format!(
        "import errno, os, sys, socket\ntry:\n{}\nexcept OSError as e:\n    print('ERR', errno.errorcode.get(e.errno, e.errno))\n",
        body.lines()
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    vec![PY.to_owned(), "-c".to_owned(), script]
}

pub fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Processes on the host running `sleep MARKER` (not cordon itself, whose own command line may
/// carry the marker too).
pub fn host_sleepers(marker: &str) -> Vec<i32> {
    let exact = format!("sleep\0{marker}\0");
    host_processes_with(marker)
        .into_iter()
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.ends_with(exact.as_bytes()) && c.starts_with(b"sleep"))
        })
        .collect()
}

/// Processes on the host whose command line contains `marker`, but cordon's keepers: a
/// keeper shares cordon's address space, hence its command line, which may carry the marker;
/// it is cordon's, outside the sandbox, and ends once cordon has (see
/// `the_address_space_keeper_holds_nothing_and_ends_with_cordon`).
pub fn host_processes_with(marker: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c == "cordon-keeper\n") {
            continue;
        }
        if let Ok(cmd) = fs::read(format!("/proc/{pid}/cmdline"))
            && String::from_utf8_lossy(&cmd).contains(marker)
        {
            out.push(pid);
        }
    }
    out
}

/// A safety net for a resource attack's negative control: a v2 cgroup to kill it with and v1
/// (or v2) limits on memory and processes, so the unbounded probe cannot hurt the host.
pub struct SafetyNet {
    v2: PathBuf,
    v1: Vec<PathBuf>,
}

impl SafetyNet {
    pub fn new(name: &str, memory: u64, pids: u64) -> SafetyNet {
        let v2 = PathBuf::from("/sys/fs/cgroup/unified").join(format!("cordon-test-{name}"));
        let v2 = if Path::new("/sys/fs/cgroup/unified").exists() {
            v2
        } else {
            PathBuf::from("/sys/fs/cgroup").join(format!("cordon-test-{name}"))
        };
        let _ = fs::create_dir(&v2);
        let mut v1 = Vec::new();
        let mem_base = own_v1("memory");
        let pids_base = own_v1("pids");
        if let Some(b) = mem_base {
            let d = b.join(format!("cordon-test-{name}"));
            let _ = fs::create_dir(&d);
            fs::write(d.join("memory.limit_in_bytes"), memory.to_string()).unwrap();
            v1.push(d);
        } else {
            fs::write(v2.join("memory.max"), memory.to_string()).unwrap();
        }
        if let Some(b) = pids_base {
            let d = b.join(format!("cordon-test-{name}"));
            let _ = fs::create_dir(&d);
            fs::write(d.join("pids.max"), pids.to_string()).unwrap();
            v1.push(d);
        } else {
            fs::write(v2.join("pids.max"), pids.to_string()).unwrap();
        }
        SafetyNet { v2, v1 }
    }

    /// Runs `cmd` inside the net (joined before exec) with a wall-clock limit; returns its output.
    pub fn run(&self, cmd: &[&str], limit_secs: u32) -> Output {
        let mut procs: Vec<String> = vec![self.v2.join("cgroup.procs").display().to_string()];
        procs.extend(
            self.v1
                .iter()
                .map(|d| d.join("cgroup.procs").display().to_string()),
        );
        let join = procs
            .iter()
            .map(|p| format!("echo $$ > {p}"))
            .collect::<Vec<_>>()
            .join(" && ");
        let quoted: Vec<String> = cmd.iter().map(|a| shell_quote(a)).collect();
        let script = format!(
            "{join} && exec timeout -s KILL {limit_secs} {}",
            quoted.join(" ")
        );
        let out = Command::new("/bin/sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        self.kill();
        out
    }

    /// The v1/v2 pids events counter: how often a fork was refused by the net.
    pub fn pids_max_hits(&self) -> u64 {
        for d in self.v1.iter().chain(std::iter::once(&self.v2)) {
            if let Ok(t) = fs::read_to_string(d.join("pids.events"))
                && let Some(v) = t.lines().find_map(|l| l.strip_prefix("max "))
            {
                return v.trim().parse().unwrap_or(0);
            }
        }
        0
    }

    fn kill(&self) {
        let _ = fs::write(self.v2.join("cgroup.kill"), "1");
        for _ in 0..200 {
            let events = fs::read_to_string(self.v2.join("cgroup.events")).unwrap_or_default();
            if events.contains("populated 0") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for SafetyNet {
    fn drop(&mut self) {
        self.kill();
        for d in &self.v1 {
            let _ = fs::remove_dir(d);
        }
        let _ = fs::remove_dir(&self.v2);
    }
}

fn own_v1(controller: &str) -> Option<PathBuf> {
    let base = Path::new("/sys/fs/cgroup").join(controller);
    if !base.join("cgroup.procs").exists() {
        return None;
    }
    let me = fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = me.lines().find_map(|l| {
        let mut p = l.splitn(3, ':');
        let (_, c, path) = (p.next()?, p.next()?, p.next()?);
        c.split(',')
            .any(|x| x == controller)
            .then(|| path.to_owned())
    })?;
    Some(base.join(rel.trim_start_matches('/')))
}

pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Evidence that keeps nothing, for launching runs in-process.
pub struct Memory;

impl cordon_runtime::Evidence for Memory {
    fn record(
        &mut self,
        _: &str,
        _: serde_json::Value,
    ) -> Result<cordon_runtime::LedgerPosition, String> {
        Ok(cordon_runtime::LedgerPosition {
            path: "memory".into(),
            seq: 0,
            head: String::new(),
        })
    }
}
