//! The example policies under policies/ load without errors or warnings and
//! behave as their comments say.

use std::path::{Path, PathBuf};

use cordon_policy::load::load;
use cordon_policy::{Action, Engine, NetMode, Policy, Verdict};
use serde_json::json;

fn policies_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies")
}

fn load_example(name: &str) -> Policy {
    let dir = cordon_policy::paths::normalize(&policies_dir());
    let file = dir.join(name);
    let text = std::fs::read_to_string(&file).unwrap();
    let loaded = load(name, &text, &dir, &mut |p| {
        std::fs::read_to_string(p).map_err(|e| e.to_string())
    })
    .unwrap_or_else(|e| panic!("{name}:\n{e}"));
    assert!(loaded.warnings.is_empty(), "{name}: {:?}", loaded.warnings);
    loaded.policy
}

#[test]
fn every_example_policy_loads_cleanly() {
    let mut names: Vec<String> = std::fs::read_dir(policies_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "coding-agent.toml",
            "data-analysis.toml",
            "locked-down.toml"
        ]
    );
    for name in &names {
        let policy = load_example(name);
        Engine::new(&policy).unwrap();
    }
}

#[test]
fn coding_agent() {
    let p = load_example("coding-agent.toml");
    assert_eq!(p.limits.memory, Some(2 << 30));
    assert_eq!(p.limits.pids, Some(256));
    assert_eq!(p.limits.timeout, Some(std::time::Duration::from_secs(1800)));
    assert_eq!(p.network.mode, NetMode::None);
    let workspace = cordon_policy::paths::normalize(&policies_dir()).join("workspace");
    assert_eq!(
        p.filesystem.write,
        vec![workspace.clone()],
        "relative to the policy file"
    );
    assert_eq!(p.process.cwd, Some(workspace));
    let engine = Engine::new(&p).unwrap();
    let mut s = engine.state();
    let sudo = Action::new("a", "run_command").with_args(json!({"command": "sudo reboot"}));
    let make = Action::new("a", "run_command").with_args(json!({"command": "make test"}));
    assert_eq!(engine.decide(&mut s, &make, 0).verdict, Verdict::Allow);
    let inside = Action::new("a", "write_file").with_resource("workspace/src/lib.rs");
    let escape = Action::new("a", "write_file").with_resource("workspace/../.bashrc");
    assert_eq!(engine.decide(&mut s, &inside, 0).rule, "write-workspace");
    assert_eq!(engine.decide(&mut s, &escape, 0).rule, "no-parent-dirs");
    let d = engine.decide(&mut s, &sudo, 1);
    assert_eq!(
        (d.verdict, d.rule.as_str()),
        (Verdict::Halt, "no-privilege-escalation")
    );
}

#[test]
fn data_analysis() {
    let p = load_example("data-analysis.toml");
    assert_eq!(p.network.mode, NetMode::Allow);
    assert_eq!(p.network.allow.len(), 2);
    let engine = Engine::new(&p).unwrap();
    let mut s = engine.state();
    let select = Action::new("a", "query_db").with_args(json!({"sql": "SELECT * FROM t"}));
    let drop = Action::new("a", "query_db").with_args(json!({"sql": "SELECT 1; DROP TABLE t"}));
    let export =
        Action::new("a", "upload_file").with_args(json!({"destination": "https://x.example"}));
    assert_eq!(engine.decide(&mut s, &select, 0).verdict, Verdict::Allow);
    assert_eq!(
        engine.decide(&mut s, &export, 60_000).rule,
        "no-export-after-query"
    );
    assert_eq!(
        engine.decide(&mut s, &export, 601_000).verdict,
        Verdict::Allow,
        "outside 10m"
    );
    assert_eq!(engine.decide(&mut s, &drop, 602_000).verdict, Verdict::Halt);
}

#[test]
fn locked_down() {
    let p = load_example("locked-down.toml");
    assert!(p.filesystem.write.is_empty());
    assert_eq!(p.network.mode, NetMode::None);
    assert_eq!(p.limits.memory, Some(256 << 20));
    let engine = Engine::new(&p).unwrap();
    let mut s = engine.state();
    assert_eq!(
        engine
            .decide(&mut s, &Action::new("a", "read_file"), 0)
            .verdict,
        Verdict::Allow
    );
    assert_eq!(
        engine
            .decide(&mut s, &Action::new("a", "write_file"), 0)
            .rule,
        "default-deny"
    );
    assert_eq!(
        engine
            .decide(&mut s, &Action::new("a", "run_command"), 0)
            .verdict,
        Verdict::Halt
    );
}
