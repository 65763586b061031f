//! `cordon policy check` and `cordon policy eval`, run as a user would.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn cordon(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("cordon runs")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn check_accepts_every_example_policy() {
    for name in ["coding-agent", "data-analysis", "locked-down"] {
        let file = format!("policies/{name}.toml");
        let out = cordon(&["policy", "check", &file], &repo());
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
        let stdout = text(&out.stdout);
        assert!(stdout.starts_with(&format!("{file}: valid")), "{stdout}");
        assert!(stdout.contains("  network     "), "{stdout}");
        assert!(
            text(&out.stderr).is_empty(),
            "no warnings expected: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn check_summarizes_the_policy() {
    let out = cordon(&["policy", "check", "policies/coding-agent.toml"], &repo());
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("limits      memory 2G, pids 256, timeout 30m, cpu 2"),
        "{stdout}"
    );
    assert!(
        stdout.contains("actions     8 cedar rules (inline): 4 permit, 3 forbid, 1 halt"),
        "{stdout}"
    );
    assert!(
        stdout.contains("no-privilege-escalation (halt)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "prevent-download-upload-delete (halt): download_file → upload_file → delete_file"
        ),
        "{stdout}"
    );
}

#[test]
fn check_reports_located_errors_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("policy.toml"),
        "[filesystem]\nread = [\"/usr\"]\nwirte = [\"./x\"]\n\n[limits]\nmemory = \"12Q\"\n",
    )
    .unwrap();
    let out = cordon(&["policy", "check", "policy.toml"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "policy.toml:3:1: unknown key \"wirte\" in [filesystem] (did you mean \"write\"?)\n"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("policy.toml:6:10: [limits] memory: invalid size \"12Q\": unknown unit \"Q\" (use K, M, G or T)"),
        "{stderr}"
    );
    assert!(
        stderr.ends_with("policy.toml: invalid (2 errors)\n"),
        "{stderr}"
    );
    assert!(text(&out.stdout).is_empty());
}

#[test]
fn check_json_reports_the_same() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.toml"), "[network]\nmode = \"hots\"\n").unwrap();
    let out = cordon(&["policy", "check", "--json", "p.toml"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["valid"], false);
    assert_eq!(doc["diagnostics"][0]["line"], 2);
    assert_eq!(doc["diagnostics"][0]["help"], "did you mean \"host\"?");
    let out = cordon(
        &["policy", "check", "--json", "policies/locked-down.toml"],
        &repo(),
    );
    assert_eq!(out.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["policy"]["limits"]["pids"], 32);
    assert_eq!(doc["policy"]["network"]["mode"], "none");
}

#[test]
fn check_of_a_missing_file_is_unusable_input() {
    let out = cordon(&["policy", "check", "no-such.toml"], &repo());
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read policy file no-such.toml"));
}

#[test]
fn cedar_file_is_relative_to_the_policy_file() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("conf");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(
        sub.join("p.toml"),
        "[actions]\ncedar_file = \"agent.cedar\"\n",
    )
    .unwrap();
    std::fs::write(
        sub.join("agent.cedar"),
        "@id(\"ok\") permit(principal, action, resource);\n\n@id(\"bad\")\npermit(principal, acton, resource);\n",
    )
    .unwrap();
    let out = cordon(&["policy", "check", "conf/p.toml"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("conf/agent.cedar:4:19: invalid cedar"),
        "{stderr}"
    );
    std::fs::write(
        sub.join("agent.cedar"),
        "@id(\"ok\") permit(principal, action, resource);\n",
    )
    .unwrap();
    let out = cordon(&["policy", "check", "conf/p.toml"], dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("1 cedar rules"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn eval_replays_the_sample_trace() {
    let out = cordon(
        &[
            "policy",
            "eval",
            "policies/coding-agent.toml",
            "--trace",
            "policies/traces/coding-agent.jsonl",
        ],
        &repo(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let heads: Vec<String> = lines
        .iter()
        .map(|l| l.split(':').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        heads,
        [
            "1 a1 read_file ALLOW read-files",
            "2 a1 download_file ALLOW transfer-files",
            "3 a1 write_file ALLOW write-workspace",
            "4 a1 upload_file ALLOW transfer-files",
            "5 a1 delete_file HALT prevent-download-upload-delete",
            "6 a1 read_file HALT prevent-download-upload-delete",
            "7 a2 read_file DENY no-credentials",
            "8 a2 write_file DENY default-deny",
            "9 a2 read_file ALLOW read-files",
            "10 a2 upload_file DENY no-upload-after-env-read",
            "11 a2 upload_file ALLOW transfer-files",
            "12 a3 run_command HALT no-privilege-escalation",
        ]
    );
    assert!(
        lines[4].contains("download, upload, then delete"),
        "{}",
        lines[4]
    );
    assert_eq!(
        text(&out.stderr),
        "12 actions: 6 allowed, 3 denied, 3 halted\n"
    );
}

#[test]
fn eval_json_lines() {
    let out = cordon(
        &[
            "policy",
            "eval",
            "policies/coding-agent.toml",
            "--trace",
            "policies/traces/coding-agent.jsonl",
            "--json",
        ],
        &repo(),
    );
    assert_eq!(out.status.code(), Some(0));
    let docs: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(docs.len(), 12);
    assert_eq!(docs[4]["decision"], "HALT");
    assert_eq!(docs[4]["rule"], "prevent-download-upload-delete");
    assert_eq!(docs[4]["line"], 5);
}

#[test]
fn eval_refuses_a_malformed_trace_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let policy = repo().join("policies/coding-agent.toml");
    std::fs::write(
        dir.path().join("t.jsonl"),
        "{\"agent\": \"a1\", \"action\": \"read_file\"}\n\n{\"agent\": \"a1\", \"acton\": \"read_file\"}\n",
    )
    .unwrap();
    let out = cordon(
        &[
            "policy",
            "eval",
            policy.to_str().unwrap(),
            "--trace",
            "t.jsonl",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("cordon: t.jsonl:3: not a trace line"),
        "{stderr}"
    );
    assert!(stderr.contains("acton"), "{stderr}");
    assert!(
        text(&out.stdout).is_empty(),
        "nothing is replayed from a bad trace"
    );

    std::fs::write(
        dir.path().join("t.jsonl"),
        "{\"agent\": \"a1\", \"action\": \"x\", \"ts\": \"noon\"}\n",
    )
    .unwrap();
    let out = cordon(
        &[
            "policy",
            "eval",
            policy.to_str().unwrap(),
            "--trace",
            "t.jsonl",
        ],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("t.jsonl:1: ts \"noon\""),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn eval_time_windows_use_trace_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.toml"),
        r#"
[actions]
cedar = '''@id("all") permit(principal, action, resource);'''
[[sequence]]
name = "quick-a-then-b"
actions = ["a", "b"]
decision = "deny"
within_time = "1m"
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("t.jsonl"),
        concat!(
            "{\"agent\": \"x\", \"action\": \"a\", \"ts\": \"2026-01-01T00:00:00Z\"}\n",
            "{\"agent\": \"x\", \"action\": \"b\", \"ts\": \"2026-01-01T00:00:30Z\"}\n",
            "{\"agent\": \"y\", \"action\": \"a\", \"ts\": 0}\n",
            "{\"agent\": \"y\", \"action\": \"b\", \"ts\": 60001}\n",
        ),
    )
    .unwrap();
    let out = cordon(
        &["policy", "eval", "p.toml", "--trace", "t.jsonl"],
        dir.path(),
    );
    let stdout = text(&out.stdout);
    let verdicts: Vec<&str> = stdout
        .lines()
        .map(|l| l.split(' ').nth(3).unwrap())
        .collect();
    assert_eq!(verdicts, ["ALLOW", "DENY", "ALLOW", "ALLOW"], "{stdout}");
}

#[test]
fn eval_with_an_invalid_policy_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("p.toml"),
        "[actions]\ncedar = 'permit(principal, action, resource);'\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("t.jsonl"), "").unwrap();
    let out = cordon(
        &["policy", "eval", "p.toml", "--trace", "t.jsonl"],
        dir.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("p.toml:2:10: cedar policy has no @id annotation"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn help_teaches_with_examples() {
    let out = cordon(&["policy", "eval", "--help"], &repo());
    assert_eq!(out.status.code(), Some(0));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("cordon policy eval policies/coding-agent.toml --trace"),
        "{stdout}"
    );
    assert!(stdout.contains("Exit status"), "{stdout}");
    let out = cordon(&["policy", "check", "--help"], &repo());
    assert!(text(&out.stdout).contains("did you mean \"write\"?"));
}
