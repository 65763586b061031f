//! Sequence rules through the policy file and the engine: windows,
//! argument conditions, consecutive steps, bounded state.

use cordon_policy::{Action, Engine, Verdict};
use serde_json::json;

use crate::{act, policy};

fn engine(sequence: &str) -> Engine {
    let text = format!(
        "[actions]\ncedar = '''@id(\"all\") permit(principal, action, resource);'''\n\n[[sequence]]\n{sequence}"
    );
    Engine::new(&policy(&text)).unwrap()
}

/// Verdicts for `(action, time)` pairs decided in order with one state.
fn verdicts(engine: &Engine, actions: &[(Action, u64)]) -> Vec<Verdict> {
    let mut state = engine.state();
    actions
        .iter()
        .map(|(a, t)| engine.decide(&mut state, a, *t).verdict)
        .collect()
}

use Verdict::{Allow, Deny, Halt};

#[test]
fn other_actions_may_come_between_steps() {
    let e = engine("name = \"s\"\nactions = [\"a\", \"b\", \"c\"]\ndecision = \"halt\"\n");
    let v = verdicts(
        &e,
        &[
            (act("a"), 0),
            (act("x"), 1),
            (act("b"), 2),
            (act("y"), 3),
            (act("c"), 4),
        ],
    );
    assert_eq!(v, [Allow, Allow, Allow, Allow, Halt]);
}

#[test]
fn consecutive_rules_need_adjacent_steps() {
    let e =
        engine("name = \"s\"\nactions = [\"a\", \"b\"]\ndecision = \"deny\"\nconsecutive = true\n");
    assert_eq!(
        verdicts(&e, &[(act("a"), 0), (act("x"), 1), (act("b"), 2)]),
        [Allow, Allow, Allow]
    );
    assert_eq!(verdicts(&e, &[(act("a"), 0), (act("b"), 1)]), [Allow, Deny]);
}

#[test]
fn action_windows_bound_the_whole_match() {
    let e =
        engine("name = \"s\"\nactions = [\"a\", \"b\"]\ndecision = \"deny\"\nwithin_actions = 3\n");
    assert_eq!(
        verdicts(&e, &[(act("a"), 0), (act("x"), 0), (act("b"), 0)]),
        [Allow, Allow, Deny]
    );
    assert_eq!(
        verdicts(
            &e,
            &[(act("a"), 0), (act("x"), 0), (act("x"), 0), (act("b"), 0)]
        ),
        [Allow, Allow, Allow, Allow]
    );
}

#[test]
fn time_windows_use_the_callers_clock() {
    let e = engine(
        "name = \"s\"\nactions = [\"a\", \"b\"]\ndecision = \"deny\"\nwithin_time = \"10s\"\n",
    );
    assert_eq!(
        verdicts(&e, &[(act("a"), 1_000), (act("b"), 11_000)]),
        [Allow, Deny]
    );
    assert_eq!(
        verdicts(&e, &[(act("a"), 1_000), (act("b"), 11_001)]),
        [Allow, Allow]
    );
    // A clock that steps back is held at the last committed time.
    assert_eq!(
        verdicts(&e, &[(act("a"), 50_000), (act("b"), 0)]),
        [Allow, Deny]
    );
}

#[test]
fn argument_conditions_select_the_steps() {
    let e = engine(
        r#"name = "exfiltration"
actions = ["read_file", "upload_file"]
decision = "halt"
where = [
  { step = 1, field = "resource", in = ["*.env"] },
  { step = 2, field = "args.destination", not_in = ["s3://corp-bucket/*"] },
]
"#,
    );
    let env = Action::new("a1", "read_file").with_resource("app/.env");
    let src = Action::new("a1", "read_file").with_resource("app/main.rs");
    let corp =
        Action::new("a1", "upload_file").with_args(json!({"destination": "s3://corp-bucket/x"}));
    let evil = Action::new("a1", "upload_file").with_args(json!({"destination": "s3://evil/x"}));
    let none = Action::new("a1", "upload_file");
    assert_eq!(
        verdicts(&e, &[(env.clone(), 0), (corp.clone(), 1)]),
        [Allow, Allow]
    );
    assert_eq!(verdicts(&e, &[(src, 0), (evil.clone(), 1)]), [Allow, Allow]);
    assert_eq!(
        verdicts(&e, &[(env.clone(), 0), (corp, 1), (evil, 2)]),
        [Allow, Allow, Halt]
    );
    assert_eq!(
        verdicts(&e, &[(env, 0), (none, 1)]),
        [Allow, Halt],
        "a missing destination is not in the allowlist"
    );
}

#[test]
fn the_agent_cannot_reset_its_history_through_its_input() {
    // Whatever the action says about itself, the history is the caller's.
    let e = engine("name = \"s\"\nactions = [\"a\", \"b\"]\ndecision = \"deny\"\n");
    let mut state = e.state();
    e.decide(&mut state, &act("a"), 0);
    let sneaky = Action::new("a1", "b").with_args(json!({"history": {"count": 0}, "reset": true}));
    assert_eq!(e.decide(&mut state, &sneaky, 1).verdict, Deny);
}

#[test]
fn state_size_does_not_grow_with_the_history() {
    let e = engine(
        "name = \"s\"\nactions = [\"a\", \"b\", \"c\"]\ndecision = \"halt\"\nwithin_actions = 100\n",
    );
    let mut state = e.state();
    let names = ["a", "x", "b", "y"];
    let mut sizes = Vec::new();
    for i in 0..20_000u64 {
        let name = names[usize::try_from(i % 4).unwrap()];
        assert_eq!(e.decide(&mut state, &act(name), i).verdict, Allow);
        if i == 99 || i == 19_999 {
            sizes.push(serde_json::to_vec(&state).unwrap().len());
        }
    }
    // Only the digits of counters and indices may grow.
    assert!(sizes[1] <= sizes[0] + 40, "{sizes:?}");
}

#[test]
fn history_counts_track_a_bounded_number_of_names() {
    let e = engine("name = \"s\"\nactions = [\"a\"]\ndecision = \"deny\"\n");
    let mut state = e.state();
    for i in 0..500u64 {
        e.decide(&mut state, &act(&format!("tool{i}")), i);
    }
    let json = serde_json::to_value(&state).unwrap();
    assert_eq!(
        json["counts"].as_object().unwrap().len(),
        cordon_policy::cedar::HISTORY_NAMES
    );
    assert_eq!(state.count(), 500);
}

#[test]
fn reasons_say_how_the_sequence_completed() {
    let e = engine("name = \"s\"\nactions = [\"a\", \"b\"]\ndecision = \"deny\"\n");
    let mut state = e.state();
    e.decide(&mut state, &act("a"), 0);
    e.decide(&mut state, &act("x"), 1);
    let d = e.decide(&mut state, &act("b"), 2);
    assert_eq!(
        d.reason,
        "a1 completed the sequence a → b (its first step was 2 allowed actions ago)"
    );
    let e = engine("name = \"one\"\nactions = [\"rm\"]\ndecision = \"halt\"\n");
    let d = e.decide(&mut e.state(), &act("rm"), 0);
    assert_eq!(
        (d.verdict, d.reason.as_str()),
        (Halt, "a1 rm matches sequence rule one")
    );
}
