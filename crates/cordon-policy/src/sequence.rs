//! Sequence rules: "these actions, in this order" as an automaton stepped once
//! per action.
//!
//! A rule with steps `s1 → s2 → … → sk` *completes* at an action when that
//! action matches `sk` and earlier actions of the agent's (committed) history
//! matched `s1 … s(k-1)` in order: any other actions may come between them,
//! unless the rule is `consecutive`. Optional windows bound the whole match,
//! from the action that matched `s1` to the completing one: `within_actions`
//! counts actions of the history (both ends included), `within_time` the
//! milliseconds between their timestamps.
//!
//! # State, and why it is enough
//!
//! For each prefix length `j < k` the automaton keeps only the *latest start*
//! (history index and time of the action matching `s1`) among all partial
//! matches of `s1 … sj` seen so far. That is enough: both windows constrain
//! only the start, and a later start satisfies every window an earlier one
//! does (history indices only grow, and times are kept monotone by the
//! caller's state), so the latest start dominates. By induction on the
//! history, the best start for `s1 … s(j+1)` after action `p` is either the one
//! before `p`, or, when `p` matches `s(j+1)`, the best start for `s1 … sj`
//! before `p`. Updating prefixes from the longest down uses only values from
//! before `p`, so one action never fills two steps. A step therefore costs
//! O(k) per rule and the state never grows with the history. The property
//! tests check this automaton against a brute-force search of the whole
//! history on random traces.
//!
//! For consecutive rules a partial match must end at the previous action, so
//! the same vector holds, for each prefix length, the start of the partial
//! match ending exactly there (or nothing).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a completed sequence does to the completing action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SequenceDecision {
    /// Refuse the completing action; the agent goes on.
    Deny,
    /// Refuse it and stop the agent.
    Halt,
}

/// A sequence rule, as loaded from a `[[sequence]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequenceRule {
    /// The rule's id, named in decisions.
    pub name: String,
    /// The steps, in order (at least one).
    pub steps: Vec<Step>,
    /// What happens when the sequence completes.
    pub decision: SequenceDecision,
    /// Whether the steps must be adjacent in the history.
    pub consecutive: bool,
    /// The most actions the whole match may span, both ends included.
    pub within_actions: Option<u64>,
    /// The longest time from the first step to the last.
    pub within_time: Option<Duration>,
    /// Text for the decision's reason, if the author gave one.
    pub reason: Option<String>,
}

/// One step of a sequence: an action name and conditions on its arguments or
/// resource, all of which must hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// The action (tool) name.
    pub action: String,
    /// Conditions on the action's arguments or resource.
    pub conditions: Vec<Condition>,
}

/// A condition on one value of an action: it is (`in`) or is not (`not_in`)
/// matched by one of the patterns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// Which value.
    pub field: Field,
    /// `false` for `in`, `true` for `not_in`.
    pub negated: bool,
    /// Glob patterns; `*` matches any run of characters, `/` included.
    pub patterns: Vec<String>,
}

/// The value a [`Condition`] looks at.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Field {
    /// The action's resource.
    Resource,
    /// A value inside the arguments: object keys, or array indices as
    /// decimal numbers. Written `args.a.b`.
    Args(Vec<String>),
}

impl Field {
    /// Parses `resource` or `args.<name>[.<name>…]`.
    pub fn parse(text: &str) -> Option<Field> {
        if text == "resource" {
            return Some(Field::Resource);
        }
        let path = text.strip_prefix("args.")?;
        let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
        if segments.iter().any(String::is_empty) {
            return None;
        }
        Some(Field::Args(segments))
    }
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::Resource => f.write_str("resource"),
            Field::Args(path) => write!(f, "args.{}", path.join(".")),
        }
    }
}

impl Condition {
    /// Whether the condition holds for an action's arguments and resource.
    ///
    /// A missing or `null` value is matched by no pattern: `in` fails and
    /// `not_in` holds. Numbers and booleans are matched by their JSON text.
    /// For an array, `in` holds when any element is matched, and `not_in`
    /// when any element is not: a list of destinations with one outside the
    /// allowlist is "not in" the allowlist.
    pub fn holds(&self, args: &serde_json::Value, resource: Option<&str>) -> bool {
        let value = match &self.field {
            Field::Resource => resource.map(Lookup::Str),
            Field::Args(path) => lookup(args, path).map(Lookup::Json),
        };
        match value {
            None => self.negated,
            Some(Lookup::Str(s)) => self.matched(s) != self.negated,
            Some(Lookup::Json(v)) => self.json_holds(v),
        }
    }

    fn json_holds(&self, value: &serde_json::Value) -> bool {
        use serde_json::Value;
        match value {
            Value::Null => self.negated,
            Value::String(s) => self.matched(s) != self.negated,
            Value::Array(items) => items.iter().any(|item| self.json_holds(item)),
            other => self.matched(&other.to_string()) != self.negated,
        }
    }

    fn matched(&self, text: &str) -> bool {
        self.patterns.iter().any(|p| glob_match(p, text))
    }
}

enum Lookup<'a> {
    Str(&'a str),
    Json(&'a serde_json::Value),
}

fn lookup<'a>(args: &'a serde_json::Value, path: &[String]) -> Option<&'a serde_json::Value> {
    let mut value = args;
    for segment in path {
        value = match value {
            serde_json::Value::Object(map) => map.get(segment)?,
            serde_json::Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(value)
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters
/// (including none and including `/`) and every other character itself.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p = pattern.as_bytes();
    let t = text.as_bytes();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Where and when a partial match started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Start {
    /// Index in the agent's committed history of the action that matched the
    /// first step.
    pub index: u64,
    /// Its time, in milliseconds.
    pub at_ms: u64,
}

/// One rule's automaton state: for each proper prefix length, the latest
/// start of a partial match (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    prefixes: Vec<Option<Start>>,
}

impl Progress {
    /// The state of a rule that has seen nothing.
    pub fn new(rule: &SequenceRule) -> Self {
        Progress {
            prefixes: vec![None; rule.steps.len().saturating_sub(1)],
        }
    }

    /// How many steps the furthest partial match has reached.
    pub fn furthest(&self) -> usize {
        self.prefixes
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |i| i + 1)
    }

    pub(crate) fn fits(&self, rule: &SequenceRule) -> bool {
        self.prefixes.len() == rule.steps.len().saturating_sub(1)
    }
}

/// An action as a sequence step sees it.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    /// The action name.
    pub action: &'a str,
    /// Its arguments.
    pub args: &'a serde_json::Value,
    /// Its resource.
    pub resource: Option<&'a str>,
    /// Its index in the committed history (the number of actions before it).
    pub index: u64,
    /// Its time in milliseconds.
    pub at_ms: u64,
}

impl SequenceRule {
    fn step_matches(&self, step: usize, event: &Event<'_>) -> bool {
        let step = &self.steps[step];
        step.action == event.action
            && step
                .conditions
                .iter()
                .all(|c| c.holds(event.args, event.resource))
    }

    fn in_window(&self, start: Start, event: &Event<'_>) -> bool {
        let span = event.index.saturating_sub(start.index).saturating_add(1);
        let actions_ok = self.within_actions.is_none_or(|n| span <= n);
        let elapsed = event.at_ms.saturating_sub(start.at_ms);
        let time_ok = self
            .within_time
            .is_none_or(|t| u128::from(elapsed) <= t.as_millis());
        actions_ok && time_ok
    }

    /// If `event` completes the sequence, the start of the completed match.
    /// Does not change `progress`.
    pub fn completes(&self, progress: &Progress, event: &Event<'_>) -> Option<Start> {
        let last = self.steps.len().checked_sub(1)?;
        if !self.step_matches(last, event) {
            return None;
        }
        let start = match last {
            0 => Start {
                index: event.index,
                at_ms: event.at_ms,
            },
            _ => progress.prefixes[last - 1]?,
        };
        self.in_window(start, event).then_some(start)
    }

    /// Records that `event` happened.
    pub fn advance(&self, progress: &mut Progress, event: &Event<'_>) {
        let prefixes = &mut progress.prefixes;
        // Longest prefix first, so each update reads values from before this
        // event.
        for j in (1..prefixes.len()).rev() {
            let extended = match prefixes[j - 1] {
                Some(s) if self.in_window(s, event) && self.step_matches(j, event) => Some(s),
                _ => None,
            };
            if self.consecutive {
                prefixes[j] = extended;
            } else if let Some(s) = extended {
                prefixes[j] = Some(prefixes[j].map_or(s, |old| old.max(s)));
            }
        }
        if let Some(first) = prefixes.first_mut() {
            if self.step_matches(0, event) {
                *first = Some(Start {
                    index: event.index,
                    at_ms: event.at_ms,
                });
            } else if self.consecutive {
                *first = None;
            }
        }
        // Starts outside the window now are outside it for every later event.
        for prefix in prefixes.iter_mut() {
            if prefix.is_some_and(|s| !self.in_window(s, event)) {
                *prefix = None;
            }
        }
    }

    /// The steps' action names joined by arrows, for messages.
    pub fn describe(&self) -> String {
        let names: Vec<&str> = self.steps.iter().map(|s| s.action.as_str()).collect();
        names.join(" → ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn rule(actions: &[&str], consecutive: bool) -> SequenceRule {
        SequenceRule {
            name: "r".into(),
            steps: actions
                .iter()
                .map(|a| Step {
                    action: (*a).into(),
                    conditions: vec![],
                })
                .collect(),
            decision: SequenceDecision::Halt,
            consecutive,
            within_actions: None,
            within_time: None,
            reason: None,
        }
    }

    /// Feeds `trace` (name, time) to `rule`, committing every action, and
    /// returns the indices at which the rule completed.
    fn run(rule: &SequenceRule, trace: &[(&str, u64)]) -> Vec<u64> {
        let mut progress = Progress::new(rule);
        let args = json!({});
        let mut fired = vec![];
        for (i, (name, t)) in trace.iter().enumerate() {
            let event = Event {
                action: name,
                args: &args,
                resource: None,
                index: i as u64,
                at_ms: *t,
            };
            if rule.completes(&progress, &event).is_some() {
                fired.push(i as u64);
            }
            rule.advance(&mut progress, &event);
        }
        fired
    }

    #[test]
    fn download_upload_delete_completes_on_the_third() {
        let r = rule(&["download_file", "upload_file", "delete_file"], false);
        let t = [("download_file", 0), ("upload_file", 1), ("delete_file", 2)];
        assert_eq!(run(&r, &t), vec![2]);
    }

    #[test]
    fn other_actions_may_come_between_unless_consecutive() {
        let t = [("a", 0), ("x", 1), ("b", 2), ("x", 3), ("c", 4)];
        assert_eq!(run(&rule(&["a", "b", "c"], false), &t), vec![4]);
        assert_eq!(run(&rule(&["a", "b", "c"], true), &t), Vec::<u64>::new());
        let t = [("x", 0), ("a", 1), ("b", 2), ("c", 3)];
        assert_eq!(run(&rule(&["a", "b", "c"], true), &t), vec![3]);
    }

    #[test]
    fn order_matters() {
        let t = [("c", 0), ("b", 1), ("a", 2)];
        assert!(run(&rule(&["a", "b", "c"], false), &t).is_empty());
    }

    #[test]
    fn one_action_never_fills_two_steps() {
        assert!(run(&rule(&["a", "a"], false), &[("a", 0)]).is_empty());
        assert_eq!(
            run(&rule(&["a", "a"], false), &[("a", 0), ("a", 1)]),
            vec![1]
        );
    }

    #[test]
    fn action_window_counts_the_whole_match() {
        let mut r = rule(&["a", "b"], false);
        r.within_actions = Some(3);
        assert_eq!(run(&r, &[("a", 0), ("x", 0), ("b", 0)]), vec![2]);
        assert!(run(&r, &[("a", 0), ("x", 0), ("x", 0), ("b", 0)]).is_empty());
        // A later start rescues the match.
        assert_eq!(
            run(&r, &[("a", 0), ("x", 0), ("a", 0), ("x", 0), ("b", 0)]),
            vec![4]
        );
    }

    #[test]
    fn time_window_is_from_first_to_last_step() {
        let mut r = rule(&["a", "b"], false);
        r.within_time = Some(Duration::from_secs(10));
        assert_eq!(run(&r, &[("a", 0), ("b", 10_000)]), vec![1]);
        assert!(run(&r, &[("a", 0), ("b", 10_001)]).is_empty());
    }

    #[test]
    fn conditions_select_arguments() {
        let cond = |negated, patterns: &[&str]| Condition {
            field: Field::parse("args.destination").unwrap(),
            negated,
            patterns: patterns.iter().map(|s| (*s).to_owned()).collect(),
        };
        let not_corp = cond(true, &["s3://corp-bucket/*"]);
        assert!(!not_corp.holds(&json!({"destination": "s3://corp-bucket/x"}), None));
        assert!(not_corp.holds(&json!({"destination": "s3://evil/x"}), None));
        assert!(
            not_corp.holds(&json!({}), None),
            "missing is not in the allowlist"
        );
        assert!(not_corp.holds(&json!({"destination": null}), None));
        assert!(not_corp.holds(
            &json!({"destination": ["s3://corp-bucket/a", "s3://evil"]}),
            None
        ));
        assert!(!not_corp.holds(&json!({"destination": ["s3://corp-bucket/a"]}), None));
        let is_corp = cond(false, &["s3://corp-bucket/*"]);
        assert!(is_corp.holds(&json!({"destination": "s3://corp-bucket/x"}), None));
        assert!(!is_corp.holds(&json!({}), None));
        let port = Condition {
            field: Field::parse("args.opts.port").unwrap(),
            negated: false,
            patterns: vec!["443".into()],
        };
        assert!(port.holds(&json!({"opts": {"port": 443}}), None));
        let first = Condition {
            field: Field::parse("args.files.0").unwrap(),
            negated: false,
            patterns: vec!["/etc/*".into()],
        };
        assert!(first.holds(&json!({"files": ["/etc/shadow"]}), None));
        let res = Condition {
            field: Field::Resource,
            negated: false,
            patterns: vec!["/etc/shadow".into()],
        };
        assert!(res.holds(&json!({}), Some("/etc/shadow")));
        assert!(!res.holds(&json!({}), None));
    }

    #[test]
    fn field_syntax() {
        assert_eq!(Field::parse("resource"), Some(Field::Resource));
        assert_eq!(
            Field::parse("args.a.b"),
            Some(Field::Args(vec!["a".into(), "b".into()]))
        );
        assert_eq!(Field::parse("args."), None);
        assert_eq!(Field::parse("destination"), None);
        assert_eq!(Field::parse("args.a.b").unwrap().to_string(), "args.a.b");
    }

    #[test]
    fn globs() {
        assert!(glob_match("s3://corp/*", "s3://corp/a/b"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exact2"));
        assert!(glob_match("*.example.com", "api.example.com"));
        assert!(glob_match("**a", "ba"));
    }

    /// Whether some increasing choice of indices in `history` (ending at the
    /// last entry) matches the rule: the O(history^k) definition the
    /// automaton must agree with.
    fn brute_completes(r: &SequenceRule, history: &[(u8, u64)]) -> bool {
        let k = r.steps.len();
        let n = history.len();
        let name = |i: usize| format!("a{}", history[i].0);
        fn choose(
            r: &SequenceRule,
            history: &[(u8, u64)],
            name: &dyn Fn(usize) -> String,
            step: usize,
            idx: usize,
            first: usize,
        ) -> bool {
            // `idx` matched step `step`; find the previous step.
            if step == 0 {
                let span = (history.len() - 1 - first + 1) as u64;
                let elapsed = history[history.len() - 1].1 - history[first].1;
                return r.within_actions.is_none_or(|w| span <= w)
                    && r.within_time
                        .is_none_or(|t| u128::from(elapsed) <= t.as_millis());
            }
            let candidates: Vec<usize> = if r.consecutive {
                idx.checked_sub(1).into_iter().collect()
            } else {
                (0..idx).collect()
            };
            candidates.into_iter().any(|prev| {
                name(prev) == r.steps[step - 1].action
                    && choose(r, history, name, step - 1, prev, prev)
            })
        }
        if n == 0 || name(n - 1) != r.steps[k - 1].action {
            return false;
        }
        choose(r, history, &name, k - 1, n - 1, n - 1)
    }

    fn arb_rule() -> impl Strategy<Value = SequenceRule> {
        (
            prop::collection::vec(0u8..3, 1..5),
            any::<bool>(),
            prop::option::of(1u64..8),
            prop::option::of(0u64..20),
        )
            .prop_map(|(steps, consecutive, within_actions, within_s)| {
                let names: Vec<String> = steps.iter().map(|s| format!("a{s}")).collect();
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                let mut r = rule(&refs, consecutive);
                r.within_actions = within_actions;
                r.within_time = within_s.map(Duration::from_secs);
                r
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn automaton_agrees_with_brute_force(
            r in arb_rule(),
            trace in prop::collection::vec((0u8..3, 0u64..5_000, any::<bool>()), 0..24),
        ) {
            let mut progress = Progress::new(&r);
            let args = json!({});
            let mut history: Vec<(u8, u64)> = vec![];
            let mut now = 0u64;
            for (a, dt, commit) in trace {
                now += dt;
                let name = format!("a{a}");
                let event = Event {
                    action: &name,
                    args: &args,
                    resource: None,
                    index: history.len() as u64,
                    at_ms: now,
                };
                let mut candidate = history.clone();
                candidate.push((a, now));
                prop_assert_eq!(
                    r.completes(&progress, &event).is_some(),
                    brute_completes(&r, &candidate),
                    "history {:?} rule {:?}", candidate, r
                );
                // Denied actions do not happen: commit only some of them.
                if commit {
                    r.advance(&mut progress, &event);
                    history = candidate;
                }
            }
        }
    }
}
