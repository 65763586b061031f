//! `cordon run`: run a command inside the boundary.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::Value;

use cordon_ledger::Ledger;
use cordon_policy::{NetMode, units};
use cordon_runtime::{AllowRule, Evidence, LedgerPosition, NetSpec, Report, RunSpec, Verdict};
use cordon_sandbox::LinuxBackend;

/// Exit status when cordon refuses or fails a run before the command starts.
pub const EXIT_REFUSED: u8 = 125;

/// The locked-down default (`policies/locked-down.toml`, built in): the system's programs and
/// configuration read-only, execution from `/usr/bin` only, no network, nothing writable but the
/// sandbox's own /tmp, small limits. Used when no `--policy` is given; flags add to it.
const LOCKED_DOWN: &str = include_str!("../../../../policies/locked-down.toml");

#[derive(Debug, Args)]
#[command(
    about = "Run a command inside a kernel-enforced boundary",
    long_about = "Run COMMAND inside a boundary built from kernel mechanisms: a cgroup it is born \
into (limits, kill), new user/pid/mount/network/ipc/uts/cgroup namespaces, a minimal read-only \
root holding only the paths granted, no capabilities, no_new_privs, Landlock and a default-kill \
seccomp allowlist. The boundary is checked from the host before COMMAND starts; when COMMAND ends \
(or is killed), every process it started is killed and the kernel's confirmation is recorded. \
Every run is appended to the evidence ledger.\n\n\
Without --policy a locked-down default applies (policies/locked-down.toml, built in): /usr and \
/etc read-only, execution from /usr/bin only, no network, a private /tmp, 256M of memory, 32 \
processes, 5 minutes. Flags add to the policy or the default.",
    after_help = "\
Examples:
  cordon run -- /bin/echo hello
  cordon run --write ./workspace --memory 512M --timeout 5m -- python3 build.py
  cordon run --policy policies/coding-agent.toml --report run.json -- make test
  cordon run --exec /usr/bin --write . -- sh -c 'cc -o t t.c && ./t'   # ./t refused: not under /usr/bin

Exit status: COMMAND's own (128+N if killed by signal N) when the verdict is ALLOWED;
125 cordon refused or failed the run; 126 COMMAND not executable; 127 COMMAND not found;
137 the run was KILLED (memory or pids limit, timeout, containment)."
)]
pub struct RunArgs {
    /// TOML policy; the flags below add to it
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// The command may read PATH (file or directory tree); repeatable
    #[arg(long, value_name = "PATH")]
    read: Vec<PathBuf>,
    /// The command may read and write PATH; repeatable
    #[arg(long, value_name = "PATH")]
    write: Vec<PathBuf>,
    /// The command may execute files under PATH; repeatable. When any is given, execution
    /// anywhere else is refused by the kernel
    #[arg(long, value_name = "PATH")]
    exec: Vec<PathBuf>,
    /// none (default): no network at all; host: the host's network; allow:CIDR[,CIDR...]
    #[arg(long, value_name = "none|host|allow:CIDR,...")]
    net: Option<String>,
    /// Memory limit, e.g. 256M, 2G
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    memory: Option<String>,
    /// Most processes and threads alive at once
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pids: Option<String>,
    /// Wall-clock limit, e.g. 10s, 5m
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    timeout: Option<String>,
    /// Set a variable (NAME=VALUE); repeatable. The host environment is NOT inherited (only
    /// PATH, HOME, LANG, TERM get safe defaults)
    #[arg(long = "env", value_name = "NAME=VALUE")]
    envs: Vec<String>,
    /// Write the run report (JSON) to FILE
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Evidence ledger directory [default: /var/lib/cordon/ledger as root, else
    /// $XDG_STATE_HOME/cordon/ledger]
    #[arg(long, value_name = "DIR")]
    ledger: Option<PathBuf>,
    /// Run even when an enforcement asked for is not fully in force (marked in the report)
    #[arg(long)]
    allow_degraded: bool,
    /// Where active runs are registered for `cordon contain` (root only)
    #[arg(long, value_name = "DIR", default_value = cordon_sandbox::state::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Print every mechanism's state and the teardown evidence to standard error
    #[arg(long, short)]
    verbose: bool,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// As root, a `cordon run` whose command line asks for no network (no `--net` but `none`, no
/// `--policy`, so the locked-down default's none applies) starts making the run's empty network
/// namespace before its arguments are even parsed: making it is the slowest part of a launch,
/// and its thread took up to ~0.4 ms more than the work before the clone that it overlaps. Any
/// other run starts it once the spec is built, if the spec asks for no network. A namespace
/// started for a command line that turns out invalid is dropped unused, with nothing in it.
pub fn net_ahead(args: &[std::ffi::OsString]) -> Option<cordon_sandbox::netns::Pending> {
    if !(rustix::process::geteuid().is_root() && asks_for_no_network(args)) {
        return None;
    }
    cordon_sandbox::netns::prepare().ok()
}

/// Whether `args` (the whole command line) is a `cordon run` that asks for no network, as far as
/// can be told before parsing: see [`net_ahead`]. Anything unclear counts as asking for one.
fn asks_for_no_network(args: &[std::ffi::OsString]) -> bool {
    if args.get(1).is_none_or(|a| a != "run") {
        return false;
    }
    let mut rest = args[2..].iter().map(|a| a.to_str());
    while let Some(arg) = rest.next() {
        let Some(arg) = arg else {
            return false;
        };
        match arg {
            "--" => return true,
            "--net" if rest.next().flatten() != Some("none") => return false,
            a if a.starts_with("--net=") && a != "--net=none" => return false,
            a if a == "--policy" || a.starts_with("--policy=") => return false,
            _ => {}
        }
    }
    true
}

/// Runs `cordon run` (`net`: the namespace [`net_ahead`] started, if any). Errors mean the run
/// was refused before anything started (exit 125).
pub fn run(args: RunArgs, net: Option<cordon_sandbox::netns::Pending>) -> anyhow::Result<u8> {
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let spec = build_spec(&args, &cwd)?;
    cordon_runtime::mark("spec built");
    let run_id = new_run_id();
    // As root, the run's empty network namespace is made on a thread of its own, from now on
    // at the latest, while the spec is validated, the ledger opened and the cgroup created (it
    // is the most expensive part of the clone). Nothing is in it; a refused spec just drops it,
    // and one the spec does not want is joined and dropped by the backend.
    let root = rustix::process::geteuid().is_root();
    let net = net.or_else(|| {
        (root && spec.net == cordon_runtime::NetSpec::None)
            .then(cordon_sandbox::netns::prepare)
            .and_then(Result::ok)
    });
    let plan = spec.validate(&run_id)?;
    cordon_runtime::mark("validated");
    let exe = std::env::current_exe().context("locating the cordon binary")?;
    let mut backend = LinuxBackend::new(exe);
    // As root the run's tree is built from now on, on a thread of its own, while the ledger is
    // opened and the host probed (see `mounts::Ahead`); that thread reads the cgroup layout
    // (root's only) first, for the backend.
    let tree = backend.start_tree(&plan);
    cordon_runtime::mark("tree started");

    // Open the report file now, before the command could plant a link where it will be.
    let report_file = match &args.report {
        Some(p) => Some(super::create_report_file(p)?),
        None => None,
    };
    let ledger_dir = ledger_dir(args.ledger.as_deref())?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&ledger_dir)
        .with_context(|| format!("creating ledger directory {}", ledger_dir.display()))?;
    let ledger = Ledger::open(&ledger_dir)
        .with_context(|| format!("opening ledger {}", ledger_dir.display()))?;
    cordon_runtime::mark("ledger open");
    let mut evidence = LedgerEvidence {
        path: ledger.paths().file.display().to_string(),
        ledger,
    };

    // From here on Ctrl-C and friends are held for the command (forwarded once it runs), also
    // in the thread that records the run's start.
    cordon_sandbox::block_forwarded_signals();
    if let Some(pending) = net {
        backend = backend.with_network_namespace(pending);
    }
    if let Some(tree) = tree {
        backend = backend.with_tree(tree);
    }
    if root {
        let dir = cordon_sandbox::state::StateDir::open(&args.state_dir)?;
        backend = backend.with_state_dir(dir, Some(ledger_dir.clone()));
    }
    cordon_runtime::mark("state dir");
    let report = cordon_runtime::execute(&plan, &mut backend, &mut evidence);
    cordon_runtime::mark("executed");

    if let Some(mut f) = report_file {
        let mut json = serde_json::to_vec_pretty(&report)?;
        json.push(b'\n');
        f.write_all(&json).context("writing the report")?;
    }
    summarize(&report, args.verbose);
    cordon_runtime::mark("summarized");
    Ok(report.exit_code())
}

fn summarize(report: &Report, verbose: bool) {
    if verbose {
        for p in &report.enforcement {
            eprintln!("cordon: {:<14} {:<20} {}", p.provider, p.state, p.detail);
        }
        for (stage, us) in &report.timings_us {
            eprintln!("cordon: time: {stage:<56} {:>8.3} ms", *us as f64 / 1e3);
        }
        for s in &report.teardown.steps {
            eprintln!("cordon: teardown: {s}");
        }
    }
    if report.verdict != Verdict::Allowed || verbose {
        let at = report
            .ledger
            .as_ref()
            .map(|l| format!(" (ledger seq {})", l.seq))
            .unwrap_or_default();
        eprintln!(
            "cordon: run {}: {}{}{}{at}",
            report.run_id,
            report.verdict,
            if report.reasons.is_empty() { "" } else { ": " },
            report.reasons.join("; "),
        );
    }
}

/// Merges the policy (or the locked-down default) with the flags.
fn build_spec(args: &RunArgs, cwd: &Path) -> anyhow::Result<RunSpec> {
    let mut spec = RunSpec {
        command: args.command.clone(),
        base_dir: cwd.to_path_buf(),
        allow_degraded: args.allow_degraded,
        term: std::env::var("TERM").ok(),
        caller: (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        ),
        ..RunSpec::default()
    };
    let mut exec: Vec<PathBuf> = Vec::new();
    let mut any_exec = false;

    let policy = match &args.policy {
        Some(path) => load_policy(path)?,
        None => builtin_default()?,
    };
    spec.read = policy.filesystem.read;
    spec.write = policy.filesystem.write;
    if let Some(e) = policy.filesystem.exec {
        any_exec = true;
        exec = e;
    }
    spec.net = net_spec(policy.network.mode, &policy.network.allow)?;
    spec.limits.memory = policy.limits.memory;
    spec.limits.pids = policy.limits.pids.map(u64::from);
    spec.limits.timeout = policy.limits.timeout;
    let mut env: BTreeMap<String, String> = policy.process.env;
    spec.cwd = policy.process.cwd;

    spec.read.extend(args.read.iter().cloned());
    spec.write.extend(args.write.iter().cloned());
    if !args.exec.is_empty() {
        any_exec = true;
        exec.extend(args.exec.iter().cloned());
    }
    spec.exec = any_exec.then_some(exec);
    if let Some(net) = &args.net {
        let (mode, allow) =
            cordon_policy::net::parse_net_flag(net).with_context(|| format!("--net {net}"))?;
        spec.net = net_spec(mode, &allow)?;
    }
    if let Some(m) = &args.memory {
        spec.limits.memory = Some(units::parse_size(m).with_context(|| format!("--memory {m}"))?);
    }
    if let Some(p) = &args.pids {
        spec.limits.pids = Some(u64::from(
            units::parse_count(p).with_context(|| format!("--pids {p}"))?,
        ));
    }
    if let Some(t) = &args.timeout {
        let d: Duration = units::parse_duration(t).with_context(|| format!("--timeout {t}"))?;
        spec.limits.timeout = Some(d);
    }
    for assignment in &args.envs {
        let (k, v) = cordon_policy::document::parse_env_assignment(assignment)
            .with_context(|| format!("--env {assignment}"))?;
        env.insert(k, v);
    }
    spec.env = env;
    // Out of the command's reach: its evidence, the registry containment relies on, and cordon
    // itself (a command that could replace the binary would run as root at the next run).
    let ledger = ledger_dir(args.ledger.as_deref())?;
    spec.protected = vec![ledger, args.state_dir.clone()];
    if let Ok(exe) = std::env::current_exe() {
        spec.protected.push(exe);
    }
    Ok(spec)
}

/// The built-in default's boundary. Its Cedar rules are for agents' actions, which a run does
/// not decide, so only the sections before `[actions]` are read (a test checks that this gives
/// the same boundary as the whole file).
fn builtin_default() -> anyhow::Result<cordon_policy::Policy> {
    let boundary = LOCKED_DOWN
        .split("\n[actions]")
        .next()
        .unwrap_or(LOCKED_DOWN);
    Ok(
        cordon_policy::load::parse("(built-in locked-down policy)", boundary, Path::new("/"))
            .map_err(|e| anyhow::anyhow!("the built-in default policy is invalid: {e}"))?
            .policy,
    )
}

/// The network part of the spec. Host names in an allowlist are resolved here, at launch: the
/// kernel filters addresses, so each name becomes one rule per address it has now.
fn net_spec(mode: NetMode, allow: &[cordon_policy::NetDest]) -> anyhow::Result<NetSpec> {
    use cordon_policy::NetDest;
    use std::net::ToSocketAddrs;
    Ok(match mode {
        NetMode::None => NetSpec::None,
        NetMode::Host => NetSpec::Host,
        NetMode::Allow => {
            let mut rules = Vec::new();
            for dest in allow {
                match dest {
                    NetDest::Cidr { net, port } => rules.push(AllowRule {
                        net: net.addr(),
                        prefix: net.prefix(),
                        port: *port,
                        source: dest.to_string(),
                    }),
                    NetDest::Host { name, port } => {
                        let addrs = (name.as_str(), port.unwrap_or(0))
                            .to_socket_addrs()
                            .with_context(|| {
                                format!("resolving {name} for the egress allowlist")
                            })?;
                        for a in addrs {
                            let ip = a.ip();
                            rules.push(AllowRule {
                                net: ip,
                                prefix: if ip.is_ipv4() { 32 } else { 128 },
                                port: *port,
                                source: dest.to_string(),
                            });
                        }
                    }
                }
            }
            NetSpec::Allow(rules)
        }
    })
}

fn load_policy(path: &Path) -> anyhow::Result<cordon_policy::Policy> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading policy {}", path.display()))?;
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let base = abs.parent().unwrap_or(Path::new("/")).to_path_buf();
    let name = path.display().to_string();
    match cordon_policy::load::load(&name, &text, &base, &mut |p| {
        std::fs::read_to_string(p).map_err(|e| e.to_string())
    }) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                eprintln!("cordon: {w}");
            }
            Ok(loaded.policy)
        }
        Err(e) => {
            for d in e.diagnostics() {
                eprintln!("{d}");
            }
            bail!("policy {} is invalid", path.display())
        }
    }
}

/// The ledger directory: the flag, or the default for this user.
pub fn ledger_dir(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = flag {
        return Ok(std::path::absolute(p)?);
    }
    if rustix::process::geteuid().is_root() {
        return Ok(PathBuf::from("/var/lib/cordon/ledger"));
    }
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .context("no HOME or XDG_STATE_HOME for the default ledger; pass --ledger DIR")?;
    Ok(state.join("cordon/ledger"))
}

/// A run id: UTC time and 32 random bits, sortable and unique enough for cgroup names.
fn new_run_id() -> String {
    let mut r = [0u8; 4];
    let _ = File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut r));
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("r{secs}-{}", hex::encode(r))
}

struct LedgerEvidence {
    ledger: Ledger,
    path: String,
}

impl Evidence for LedgerEvidence {
    fn record(&mut self, kind: &str, data: Value) -> Result<LedgerPosition, String> {
        let head = self.ledger.append(kind, data).map_err(|e| e.to_string())?;
        Ok(self.position(head))
    }

    fn record_all(
        &mut self,
        entries: Vec<(String, Value)>,
    ) -> Result<Option<LedgerPosition>, String> {
        let heads = self.ledger.append_all(entries).map_err(|e| e.to_string())?;
        Ok(heads.last().map(|h| self.position(*h)))
    }
}

impl LedgerEvidence {
    fn position(&self, head: cordon_ledger::Head) -> LedgerPosition {
        LedgerPosition {
            path: self.path.clone(),
            seq: head.seq,
            head: head.hash_hex(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_namespace_is_started_before_parsing_only_for_runs_without_network() {
        let asks = |line: &[&str]| {
            let args: Vec<std::ffi::OsString> = std::iter::once("cordon")
                .chain(line.iter().copied())
                .map(Into::into)
                .collect();
            asks_for_no_network(&args)
        };
        assert!(asks(&["run", "--", "/bin/true"]));
        assert!(asks(&[
            "run",
            "--net",
            "none",
            "--memory",
            "1G",
            "--",
            "/bin/true"
        ]));
        assert!(asks(&["run", "--net=none", "--", "/bin/true"]));
        // What comes after `--` is the command's.
        assert!(asks(&["run", "--", "curl", "--net", "host"]));
        assert!(!asks(&["run", "--net", "host", "--", "/bin/true"]));
        assert!(!asks(&["run", "--net=allow:10.0.0.0/8", "--", "/bin/true"]));
        assert!(!asks(&["run", "--net"]));
        // A policy file may grant a network.
        assert!(!asks(&["run", "--policy", "p.toml", "--", "/bin/true"]));
        assert!(!asks(&["run", "--policy=p.toml", "--", "/bin/true"]));
        assert!(!asks(&["ledger", "verify"]));
        assert!(!asks(&[]));
    }

    #[test]
    fn builtin_default_is_the_locked_down_policys_boundary() {
        let whole = cordon_policy::load::parse("locked-down.toml", LOCKED_DOWN, Path::new("/"))
            .unwrap()
            .policy;
        let boundary = builtin_default().unwrap();
        assert!(LOCKED_DOWN.contains("\n[actions]"), "the split point moved");
        assert_eq!(boundary.filesystem, whole.filesystem);
        assert_eq!(boundary.network, whole.network);
        assert_eq!(boundary.limits, whole.limits);
        assert_eq!(boundary.process, whole.process);
    }
}
