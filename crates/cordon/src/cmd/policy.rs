//! `cordon policy check` and `cordon policy eval`: validate a policy file,
//! and replay recorded agent actions against it.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use cordon_policy::load::{LoadError, Loaded};
use cordon_policy::units::{format_duration, format_size};
use cordon_policy::{Action, Engine, NetMode, Policy, Verdict};
use serde::Deserialize;

/// Exit code: the policy file has errors.
const INVALID: u8 = 1;

/// Validate policy files and test them against recorded agent actions.
#[derive(Debug, Args)]
#[command(after_long_help = "\
Exit status: 0 success; 1 the policy has errors (each printed as FILE:LINE:COLUMN: message);
2 unusable input (a file that cannot be read, a malformed trace line, a bad command line).

The policy file format is described in docs/policy.md; examples are in policies/.")]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Debug, Subcommand)]
enum PolicyCommand {
    Check(CheckArgs),
    Eval(EvalArgs),
}

/// Validate a policy file and print a summary of it.
///
/// Every problem is reported with its location and, where possible, a
/// suggestion, e.g.
///   policy.toml:12:1: unknown key "wirte" in [filesystem] (did you mean "write"?)
/// Warnings (allowed but probably not meant) do not make the check fail.
#[derive(Debug, Args)]
#[command(after_long_help = "\
Examples:
  cordon policy check policies/coding-agent.toml
  cordon policy check --json policy.toml | jq .policy.limits

Exit status: 0 valid; 1 invalid (errors printed on standard error); 2 the file cannot be read.")]
struct CheckArgs {
    /// The policy file (TOML).
    file: PathBuf,
    /// Print the loaded policy (or the diagnostics) as one JSON document.
    #[arg(long)]
    json: bool,
}

/// Replay a trace of agent actions and print each decision.
///
/// The trace has one JSON object per line:
///   {"agent": "a1", "action": "upload_file", "args": {...}, "resource": "optional", "ts": 1700000000000}
/// `args`, `resource` and `ts` may be left out. `ts` is the action's time, in milliseconds
/// since the epoch or as an RFC 3339 string; sequence rules with `within_time` need it (a line
/// without one takes the previous line's time). Each agent has its own history.
///
/// Each action prints one line: the trace line number, the agent, the action, the decision
/// (ALLOW, DENY or HALT), the id of the deciding rule and the reason. Once an agent is halted,
/// its later actions are HALT too.
#[derive(Debug, Args)]
#[command(after_long_help = "\
Examples:
  cordon policy eval policies/coding-agent.toml --trace policies/traces/coding-agent.jsonl
    1 a1 read_file ALLOW read-files: reading files is allowed
    ...
    5 a1 delete_file HALT prevent-download-upload-delete: download, upload, then delete: ...
  cordon policy eval policy.toml --trace trace.jsonl --json

Exit status: 0 the trace was replayed (whatever the decisions); 1 the policy has errors;
2 unusable input: a file cannot be read, or a trace line is malformed (named as TRACE:LINE;
nothing is replayed then).")]
struct EvalArgs {
    /// The policy file (TOML).
    file: PathBuf,
    /// The recorded actions (JSON Lines).
    #[arg(long, value_name = "TRACE.jsonl")]
    trace: PathBuf,
    /// Print each decision as a JSON object instead of a line of text.
    #[arg(long)]
    json: bool,
}

impl PolicyArgs {
    /// Runs the subcommand, returning its exit code.
    pub fn run(self) -> Result<u8> {
        match self.command {
            PolicyCommand::Check(args) => check(&args),
            PolicyCommand::Eval(args) => eval(&args),
        }
    }
}

/// Reads and loads a policy file. `Ok(Err(_))` is an invalid policy (exit 1);
/// `Err(_)` an unreadable file (exit 2).
fn load_file(file: &Path) -> Result<std::result::Result<Loaded, LoadError>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read policy file {}", file.display()))?;
    let absolute = std::path::absolute(file)
        .with_context(|| format!("cannot make {} absolute", file.display()))?;
    let base_dir = absolute.parent().unwrap_or(Path::new("/"));
    let name = file.display().to_string();
    Ok(cordon_policy::load::load(
        &name,
        &text,
        base_dir,
        &mut |path| std::fs::read_to_string(path).map_err(|e| e.to_string()),
    ))
}

fn print_diagnostics(err: &LoadError, file: &Path) {
    let diagnostics = err.diagnostics();
    for d in diagnostics {
        eprintln!("{d}");
    }
    let errors = diagnostics
        .iter()
        .filter(|d| d.severity == cordon_policy::Severity::Error)
        .count();
    eprintln!(
        "{}: invalid ({errors} error{})",
        file.display(),
        if errors == 1 { "" } else { "s" }
    );
}

fn check(args: &CheckArgs) -> Result<u8> {
    let loaded = load_file(&args.file)?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    if args.json {
        let doc = match &loaded {
            Ok(l) => {
                serde_json::json!({ "valid": true, "policy": l.policy, "warnings": l.warnings })
            }
            Err(e) => serde_json::json!({ "valid": false, "diagnostics": e.diagnostics() }),
        };
        writeln!(out, "{doc}")?;
        out.flush()?;
        return Ok(if loaded.is_ok() { 0 } else { INVALID });
    }
    let loaded = match loaded {
        Ok(l) => l,
        Err(e) => {
            print_diagnostics(&e, &args.file);
            return Ok(INVALID);
        }
    };
    for w in &loaded.warnings {
        eprintln!("{w}");
    }
    write_summary(&mut out, &args.file, &loaded)?;
    out.flush()?;
    Ok(0)
}

fn join_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "nothing".into();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn write_summary(out: &mut impl Write, file: &Path, loaded: &Loaded) -> Result<()> {
    let Policy {
        filesystem,
        network,
        limits,
        process,
        actions,
        sequences,
    } = &loaded.policy;
    let warnings = loaded.warnings.len();
    writeln!(
        out,
        "{}: valid{}",
        file.display(),
        match warnings {
            0 => String::new(),
            1 => " (1 warning)".into(),
            n => format!(" ({n} warnings)"),
        }
    )?;
    let exec = match &filesystem.exec {
        None => "not restricted by path".to_owned(),
        Some(list) => join_paths(list),
    };
    writeln!(
        out,
        "  filesystem  read {}; write {}; exec {exec}",
        join_paths(&filesystem.read),
        join_paths(&filesystem.write)
    )?;
    let net = match network.mode {
        NetMode::Allow => format!(
            "allow {}",
            network
                .allow
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        mode => mode.to_string(),
    };
    writeln!(out, "  network     {net}")?;
    let mut parts = Vec::new();
    if let Some(m) = limits.memory {
        parts.push(format!("memory {}", format_size(m)));
    }
    if let Some(p) = limits.pids {
        parts.push(format!("pids {p}"));
    }
    if let Some(t) = limits.timeout {
        parts.push(format!("timeout {}", format_duration(t)));
    }
    if let Some(c) = limits.cpu_millicores {
        parts.push(format!("cpu {}", f64::from(c) / 1000.0));
    }
    writeln!(
        out,
        "  limits      {}",
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    )?;
    let cwd = process
        .cwd
        .as_ref()
        .map_or_else(|| "unset".to_owned(), |p| p.display().to_string());
    let env: Vec<&str> = process.env.keys().map(String::as_str).collect();
    writeln!(
        out,
        "  process     cwd {cwd}; env {}",
        if env.is_empty() {
            "empty".into()
        } else {
            env.join(", ")
        }
    )?;
    let count = |e: cordon_policy::cedar::RuleEffect| {
        actions.rules.iter().filter(|r| r.effect == e).count()
    };
    use cordon_policy::cedar::RuleEffect;
    match &actions.source {
        None => writeln!(out, "  actions     none: every agent action is denied")?,
        Some(source) => {
            writeln!(
                out,
                "  actions     {} cedar rules ({source}): {} permit, {} forbid, {} halt",
                actions.rules.len(),
                count(RuleEffect::Permit),
                count(RuleEffect::Forbid),
                count(RuleEffect::Halt)
            )?;
            for r in &actions.rules {
                let effect = match r.effect {
                    RuleEffect::Permit => "permit",
                    RuleEffect::Forbid => "forbid",
                    RuleEffect::Halt => "halt",
                };
                writeln!(out, "                {} ({effect})", r.id)?;
            }
        }
    }
    writeln!(out, "  sequences   {}", sequences.len())?;
    for s in sequences {
        let mut extra = Vec::new();
        if s.consecutive {
            extra.push("consecutive".to_owned());
        }
        if let Some(n) = s.within_actions {
            extra.push(format!("within {n} actions"));
        }
        if let Some(t) = s.within_time {
            extra.push(format!("within {}", format_duration(t)));
        }
        let conditions: usize = s.steps.iter().map(|st| st.conditions.len()).sum();
        if conditions > 0 {
            extra.push(format!(
                "{conditions} condition{}",
                if conditions == 1 { "" } else { "s" }
            ));
        }
        let decision = match s.decision {
            cordon_policy::sequence::SequenceDecision::Deny => "deny",
            cordon_policy::sequence::SequenceDecision::Halt => "halt",
        };
        writeln!(
            out,
            "                {} ({decision}): {}{}",
            s.name,
            s.describe(),
            if extra.is_empty() {
                String::new()
            } else {
                format!(" [{}]", extra.join(", "))
            }
        )?;
    }
    Ok(())
}

/// One line of a trace.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceLine {
    agent: String,
    action: String,
    #[serde(default)]
    args: serde_json::Value,
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    ts: Option<Timestamp>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Timestamp {
    Millis(u64),
    Text(String),
}

/// Reads a trace, refusing it whole at the first malformed line.
fn read_trace(path: &Path) -> Result<Vec<(usize, Action, u64)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read trace {}", path.display()))?;
    let mut out = Vec::new();
    let mut now = 0u64;
    for (i, line) in text.lines().enumerate() {
        let number = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{number}", path.display());
        let parsed: TraceLine = serde_json::from_str(line).with_context(|| {
            format!(
                "{}: not a trace line (expected {{\"agent\": ..., \"action\": ..., \"args\": {{...}}, \"resource\": ..., \"ts\": ...}})",
                at()
            )
        })?;
        match parsed.ts {
            None => {}
            Some(Timestamp::Millis(ms)) => now = ms,
            Some(Timestamp::Text(s)) => match parse_rfc3339_ms(&s) {
                Some(ms) => now = ms,
                None => bail!(
                    "{}: ts {s:?} is neither milliseconds nor an RFC 3339 time (write e.g. \"2026-01-31T12:00:00Z\")",
                    at()
                ),
            },
        }
        let action = Action {
            agent: parsed.agent,
            name: parsed.action,
            args: parsed.args,
            resource: parsed.resource,
        };
        out.push((number, action, now));
    }
    Ok(out)
}

fn eval(args: &EvalArgs) -> Result<u8> {
    let loaded = match load_file(&args.file)? {
        Ok(l) => l,
        Err(e) => {
            print_diagnostics(&e, &args.file);
            return Ok(INVALID);
        }
    };
    for w in &loaded.warnings {
        eprintln!("{w}");
    }
    let trace = read_trace(&args.trace)?;
    let engine = Engine::new(&loaded.policy).context("cannot compile the policy")?;
    let mut states = BTreeMap::new();
    let mut tally = [0usize; 3];
    let mut out = BufWriter::new(std::io::stdout().lock());
    for (line, action, now) in &trace {
        let state = states
            .entry(action.agent.clone())
            .or_insert_with(|| engine.state());
        let decision = engine.decide(state, action, *now);
        tally[match decision.verdict {
            Verdict::Allow => 0,
            Verdict::Deny => 1,
            Verdict::Halt => 2,
        }] += 1;
        if args.json {
            let doc = serde_json::json!({
                "line": line,
                "agent": action.agent,
                "action": action.name,
                "decision": decision.verdict,
                "rule": decision.rule,
                "reason": decision.reason,
                "also": decision.also,
            });
            writeln!(out, "{doc}")?;
        } else {
            writeln!(
                out,
                "{line} {} {} {} {}: {}",
                action.agent, action.name, decision.verdict, decision.rule, decision.reason
            )?;
        }
    }
    out.flush()?;
    eprintln!(
        "{} action{}: {} allowed, {} denied, {} halted",
        trace.len(),
        if trace.len() == 1 { "" } else { "s" },
        tally[0],
        tally[1],
        tally[2]
    );
    Ok(0)
}

/// Milliseconds since the epoch of an RFC 3339 time such as
/// `2026-01-31T12:00:00.250Z` or `2026-01-31T13:00:00+01:00`.
fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &s[19..];
    let mut millis = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let first3: String = frac[..digits].chars().chain("00".chars()).take(3).collect();
        millis = first3.parse().ok()?;
        rest = &frac[digits..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let r = rest.as_bytes();
            if r.len() != 6 || r[3] != b':' {
                return None;
            }
            let h: i64 = rest[1..3].parse().ok()?;
            let m: i64 = rest[4..6].parse().ok()?;
            sign * (h * 60 + m)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_min * 60;
    u64::try_from(secs * 1000 + millis).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:01.5Z"), Some(1500));
        assert_eq!(
            parse_rfc3339_ms("2000-03-01T00:00:00Z"),
            Some(951_868_800_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2000-03-01T01:00:00+01:00"),
            parse_rfc3339_ms("2000-03-01T00:00:00Z")
        );
        assert_eq!(parse_rfc3339_ms("2000-13-01T00:00:00Z"), None);
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
        assert_eq!(parse_rfc3339_ms("2000-03-01T00:00:00"), None);
    }
}
