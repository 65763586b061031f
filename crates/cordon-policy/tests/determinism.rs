//! The same policy, state, action and time give the same decision, byte for
//! byte, across repeated runs and fresh engines.

use cordon_policy::{Action, Engine};
use proptest::prelude::*;
use serde_json::json;

use crate::policy;

const POLICY: &str = r#"
[actions]
cedar = '''
@id("p1") permit(principal, action, resource);
@id("p2") permit(principal, action == Action::"b", resource);
@id("p3") permit(principal, action == Action::"b", resource) when { context.args has n };
@id("f1") forbid(principal, action == Action::"c", resource);
@id("f2") forbid(principal, action == Action::"c", resource) when { context.args has n };
@id("h1") @effect("halt") forbid(principal, action == Action::"d", resource) when { context.args has n && context.args.n > 2 };
@id("h2") @effect("halt") forbid(principal, action == Action::"d", resource) when { context.args has n && context.args.n > 3 };
@id("e1") forbid(principal, action == Action::"e", resource) when { context.args.n > 1 };
@id("e2") forbid(principal, action == Action::"e", resource) when { context.args.m > 1 };
'''
[[sequence]]
name = "s1"
actions = ["a", "b"]
decision = "deny"
[[sequence]]
name = "s2"
actions = ["a", "c"]
decision = "halt"
within_actions = 4
"#;

fn replay(trace: &[(u8, Option<i64>)]) -> Vec<u8> {
    // A fresh load and engine each time: hash seeds differ between them.
    let engine = Engine::new(&policy(POLICY)).unwrap();
    let mut states = std::collections::BTreeMap::new();
    let mut out = Vec::new();
    for (i, (a, n)) in trace.iter().enumerate() {
        let name = ["a", "b", "c", "d", "e"][usize::from(*a % 5)];
        let agent = if a % 2 == 0 { "x" } else { "y" };
        let args = n.map_or(json!({}), |n| json!({ "n": n, "m": n }));
        let action = Action::new(agent, name).with_args(args);
        let state = states.entry(agent).or_insert_with(|| engine.state());
        let d = engine.decide(state, &action, i as u64 * 10);
        out.extend(serde_json::to_vec(&d).unwrap());
        out.push(b'\n');
    }
    out.extend(serde_json::to_vec(&states).unwrap());
    out
}

#[test]
fn several_matching_rules_are_named_in_a_fixed_order() {
    let trace = [
        (2, Some(5)),
        (3, Some(5)),
        (4, Some(5)),
        (0, None),
        (2, None),
    ];
    let first = replay(&trace);
    for _ in 0..20 {
        assert_eq!(replay(&trace), first);
    }
    let text = String::from_utf8(first).unwrap();
    assert!(text.contains(r#""rule":"f1","reason":"#), "{text}");
    assert!(text.contains(r#""also":["f2"]"#), "{text}");
    assert!(
        text.contains(r#""rule":"h1""#) && text.contains(r#""also":["h2"]"#),
        "{text}"
    );
}

#[test]
fn decisions_are_identical_across_threads() {
    let trace: Vec<(u8, Option<i64>)> = (0..200)
        .map(|i| (i % 7, (i % 3 != 0).then_some(i64::from(i % 6))))
        .collect();
    let expected = replay(&trace);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let t = trace.clone();
            std::thread::spawn(move || replay(&t))
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), expected);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn any_trace_replays_byte_for_byte(
        trace in prop::collection::vec((0u8..10, prop::option::of(-2i64..6)), 0..40)
    ) {
        prop_assert_eq!(replay(&trace), replay(&trace));
    }
}
