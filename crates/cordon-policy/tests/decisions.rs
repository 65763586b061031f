//! Per-call decisions and how Cedar and sequence rules combine.

use cordon_policy::{Action, Engine, Verdict};
use serde_json::json;

use crate::{act, policy, run};

const SEED: &str = r#"
[actions]
cedar = '''
@id("files-ok") permit(principal, action in [Action::"download_file", Action::"upload_file", Action::"delete_file"], resource);
'''

[[sequence]]
name = "prevent-download-upload-delete"
actions = ["download_file", "upload_file", "delete_file"]
decision = "halt"
"#;

#[test]
fn seed_scenario_download_upload_delete_halts_on_the_third() {
    let engine = Engine::new(&policy(SEED)).unwrap();
    let mut state = engine.state();
    let d = run(
        &engine,
        &mut state,
        &[act("download_file"), act("upload_file"), act("delete_file")],
    );
    assert_eq!(d[0].verdict, Verdict::Allow);
    assert_eq!(d[0].rule, "files-ok");
    assert_eq!(d[1].verdict, Verdict::Allow);
    assert_eq!(d[1].rule, "files-ok");
    assert_eq!(d[2].verdict, Verdict::Halt);
    assert_eq!(d[2].rule, "prevent-download-upload-delete");
    assert_eq!(
        d[2].also,
        vec!["files-ok".to_owned()],
        "the overridden permit is kept"
    );
    assert!(
        d[2].reason
            .contains("download_file → upload_file → delete_file"),
        "{}",
        d[2].reason
    );
    // Halted means halted: every later action of this state is refused.
    let later = engine.decide(&mut state, &act("download_file"), 10_000);
    assert_eq!(later.verdict, Verdict::Halt);
    assert_eq!(later.rule, "prevent-download-upload-delete");
    assert!(state.halted().is_some());
}

#[test]
fn seed_scenario_negative_control_other_orders_do_not_halt() {
    let engine = Engine::new(&policy(SEED)).unwrap();
    let mut state = engine.state();
    let d = run(
        &engine,
        &mut state,
        &[act("delete_file"), act("upload_file"), act("download_file")],
    );
    assert!(d.iter().all(|d| d.verdict == Verdict::Allow), "{d:?}");
}

#[test]
fn default_deny_without_rules() {
    let engine = Engine::new(&policy("[limits]\npids = 5\n")).unwrap();
    let d = engine.evaluate(&engine.state(), &act("read_file"), 0);
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.rule, "default-deny");
    assert_eq!(d.reason, "no cedar rule permits a1 read_file");
}

#[test]
fn forbid_beats_permit_and_halt_beats_deny() {
    let p = policy(
        r#"
[actions]
cedar = '''
@id("everything") permit(principal, action, resource);
@id("z-no-rm") forbid(principal, action == Action::"rm", resource);
@id("a-no-rm-root") forbid(principal, action == Action::"rm", resource) when { context.resource == "/" };
@id("stop-rm-root") @effect("halt") forbid(principal, action == Action::"rm", resource) when { context.resource == "/" };
'''
"#,
    );
    let engine = Engine::new(&p).unwrap();
    let state = engine.state();
    let d = engine.evaluate(&state, &act("rm"), 0);
    assert_eq!((d.verdict, d.rule.as_str()), (Verdict::Deny, "z-no-rm"));
    let d = engine.evaluate(&state, &act("rm").with_resource("/"), 0);
    assert_eq!(
        (d.verdict, d.rule.as_str()),
        (Verdict::Halt, "stop-rm-root")
    );
    assert_eq!(
        d.also,
        vec!["a-no-rm-root".to_owned(), "z-no-rm".to_owned()]
    );
    let d = engine.evaluate(&state, &act("ls"), 0);
    assert_eq!((d.verdict, d.rule.as_str()), (Verdict::Allow, "everything"));
}

#[test]
fn cedar_halt_outranks_a_sequence_deny_and_names_both() {
    let p = policy(
        r#"
[actions]
cedar = '''
@id("all") permit(principal, action, resource);
@id("stop-b") @effect("halt") forbid(principal, action == Action::"b", resource);
'''
[[sequence]]
name = "a-then-b"
actions = ["a", "b"]
decision = "deny"
"#,
    );
    let engine = Engine::new(&p).unwrap();
    let mut state = engine.state();
    let d = run(&engine, &mut state, &[act("a"), act("b")]);
    assert_eq!(
        (d[1].verdict, d[1].rule.as_str()),
        (Verdict::Halt, "stop-b")
    );
    assert_eq!(d[1].also, vec!["a-then-b".to_owned()]);
}

#[test]
fn a_denied_action_does_not_advance_sequences() {
    let p = policy(
        r#"
[actions]
cedar = '''
@id("all") permit(principal, action, resource);
@id("no-upload-to-paste") forbid(principal, action == Action::"upload_file", resource)
  when { context.args has destination && context.args.destination like "https://paste.*" };
'''
[[sequence]]
name = "dud"
actions = ["download_file", "upload_file", "delete_file"]
decision = "halt"
"#,
    );
    let engine = Engine::new(&p).unwrap();
    let mut state = engine.state();
    let paste =
        Action::new("a1", "upload_file").with_args(json!({"destination": "https://paste.example"}));
    let d = run(
        &engine,
        &mut state,
        &[act("download_file"), paste, act("delete_file")],
    );
    assert_eq!(d[1].verdict, Verdict::Deny);
    assert_eq!(d[1].rule, "no-upload-to-paste");
    assert_eq!(d[2].verdict, Verdict::Allow, "the upload never happened");
    assert_eq!(state.count(), 2, "only allowed actions enter the history");
    // Negative control: the same upload, allowed, does complete the sequence.
    let mut state = engine.state();
    let d = run(
        &engine,
        &mut state,
        &[act("download_file"), act("upload_file"), act("delete_file")],
    );
    assert_eq!(d[2].verdict, Verdict::Halt);
}

#[test]
fn a_sequence_deny_repeats_until_the_history_changes() {
    let p = policy(
        r#"
[actions]
cedar = '''@id("all") permit(principal, action, resource);'''
[[sequence]]
name = "no-b-after-a"
actions = ["a", "b"]
decision = "deny"
"#,
    );
    let engine = Engine::new(&p).unwrap();
    let mut state = engine.state();
    let d = run(
        &engine,
        &mut state,
        &[act("a"), act("b"), act("b"), act("c")],
    );
    let v: Vec<Verdict> = d.iter().map(|d| d.verdict).collect();
    assert_eq!(
        v,
        [Verdict::Allow, Verdict::Deny, Verdict::Deny, Verdict::Allow]
    );
}

#[test]
fn evaluate_changes_nothing_and_commit_records() {
    let engine = Engine::new(&policy(SEED)).unwrap();
    let mut state = engine.state();
    let before = state.clone();
    let d = engine.evaluate(&state, &act("download_file"), 5);
    assert_eq!(state, before);
    engine.commit(&mut state, &act("download_file"), 5, &d);
    assert_eq!(state.count(), 1);
    assert_eq!(state.last_action(), Some("download_file"));
}

#[test]
fn history_summary_reaches_cedar() {
    let p = policy(
        r#"
[actions]
cedar = '''
@id("all") permit(principal, action, resource);
@id("three-reads") forbid(principal, action == Action::"read_file", resource)
  when { context.history.counts has read_file && context.history.counts.read_file >= 3 };
@id("no-write-right-after-fetch") forbid(principal, action == Action::"write_file", resource)
  when { context.history.last_action == "fetch" };
@id("first-ten-only") forbid(principal, action, resource) when { context.history.count >= 10 };
'''
"#,
    );
    let engine = Engine::new(&p).unwrap();
    let mut state = engine.state();
    let d = run(
        &engine,
        &mut state,
        &[
            act("read_file"),
            act("read_file"),
            act("read_file"),
            act("read_file"),
            act("fetch"),
            act("write_file"),
            act("ls"),
            act("write_file"),
        ],
    );
    let rules: Vec<&str> = d.iter().map(|d| d.rule.as_str()).collect();
    assert_eq!(
        rules,
        [
            "all",
            "all",
            "all",
            "three-reads",
            "all",
            "no-write-right-after-fetch",
            "all",
            "all"
        ]
    );
    for _ in 0..10 {
        engine.decide(&mut state, &act("ls"), 0);
    }
    assert_eq!(
        engine.evaluate(&state, &act("ls"), 0).rule,
        "first-ten-only"
    );
}

#[test]
fn evaluation_errors_deny_fail_closed() {
    let p = policy(
        r#"
[actions]
cedar = '''
@id("all") permit(principal, action, resource);
@id("unguarded") forbid(principal, action == Action::"write_file", resource) when { context.args.path like "/etc/*" };
'''
"#,
    );
    let engine = Engine::new(&p).unwrap();
    let state = engine.state();
    // No `path` argument: the forbid cannot be evaluated, so the write is
    // denied rather than allowed by the other permit.
    let d = engine.evaluate(&state, &act("write_file"), 0);
    assert_eq!((d.verdict, d.rule.as_str()), (Verdict::Deny, "unguarded"));
    assert!(d.reason.contains("fail closed"), "{}", d.reason);
    // Negative control: with the argument present the permit applies.
    let ok = Action::new("a1", "write_file").with_args(json!({"path": "/tmp/x"}));
    assert_eq!(engine.evaluate(&state, &ok, 0).verdict, Verdict::Allow);
}

#[test]
fn unrepresentable_arguments_deny_with_the_reason() {
    let engine = Engine::new(&policy(SEED)).unwrap();
    let a = Action::new("a1", "download_file").with_args(json!({"size": 1.0e40}));
    let d = engine.evaluate(&engine.state(), &a, 0);
    assert_eq!(
        (d.verdict, d.rule.as_str()),
        (Verdict::Deny, "unrepresentable-arguments")
    );
    assert!(d.reason.contains("args.size"), "{}", d.reason);
    // Null members are simply absent.
    let a = Action::new("a1", "download_file").with_args(json!({"size": null}));
    assert_eq!(
        engine.evaluate(&engine.state(), &a, 0).verdict,
        Verdict::Allow
    );
}

#[test]
fn a_state_from_another_policy_is_refused() {
    let a = Engine::new(&policy(SEED)).unwrap();
    let b = Engine::new(&policy(
        "[actions]\ncedar = '''@id(\"all\") permit(principal, action, resource);'''\n",
    ))
    .unwrap();
    let mut state = a.state();
    let d = b.decide(&mut state, &act("download_file"), 0);
    assert_eq!(
        (d.verdict, d.rule.as_str()),
        (Verdict::Deny, "state-mismatch")
    );
    assert_eq!(state, a.state(), "a refused state is left alone");
}

#[test]
fn states_round_trip_through_json() {
    let engine = Engine::new(&policy(SEED)).unwrap();
    let mut state = engine.state();
    run(
        &engine,
        &mut state,
        &[act("download_file"), act("upload_file")],
    );
    let saved = serde_json::to_string(&state).unwrap();
    let mut restored: cordon_policy::AgentState = serde_json::from_str(&saved).unwrap();
    let d = engine.decide(&mut restored, &act("delete_file"), 9_000);
    assert_eq!(d.verdict, Verdict::Halt);
}

#[test]
fn decisions_serialize_with_the_contract_words() {
    let engine = Engine::new(&policy(SEED)).unwrap();
    let d = engine.evaluate(&engine.state(), &act("download_file"), 0);
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["verdict"], "ALLOW");
    assert_eq!(json["rule"], "files-ok");
    assert_eq!(d.to_string(), format!("ALLOW files-ok: {}", d.reason));
}
