//! Per-call rules in Cedar: compiling the `[actions]` text, and asking it
//! about one action.
//!
//! # Mapping an action to a Cedar request
//!
//! | Cedar | value |
//! |---|---|
//! | principal | `Agent::"<agent id>"` |
//! | action | `Action::"<action (tool) name>"` |
//! | resource | `Resource::"<resource>"`, `Resource::""` when the action names none |
//! | `context.resource` | the resource as a string (`""` when none), for `like` patterns |
//! | `context.args` | the action's arguments (see below) |
//! | `context.history.count` | how many actions of this agent were allowed before |
//! | `context.history.counts` | a record: action name → how many times it was allowed (the first [`HISTORY_NAMES`] distinct names) |
//! | `context.history.last_action` | the previous allowed action's name, `""` at first |
//!
//! No entity store is used: `principal in …` and attribute lookups on
//! entities find nothing. Arguments become Cedar values without any of the
//! JSON escapes (`__entity`, `__extn`) that Cedar's own JSON reader
//! interprets, so an agent cannot smuggle an entity reference or extension
//! call into its arguments. Strings, booleans and integers map directly;
//! arrays become sets (order and duplicates are lost); objects become
//! records; a `null` member of an object is left out (`has` is false); a
//! number with a fraction becomes a `decimal` when it has at most four
//! fractional digits and no exponent. Anything else (a `null` in an array, a
//! larger integer than 64 bits hold, a fraction Cedar cannot hold, nesting
//! deeper than [`MAX_DEPTH`]) cannot be represented, and the action is denied
//! with the reason.
//!
//! # Rules people wrote
//!
//! Every policy must carry `@id("…")`: decisions name it. `@effect("halt")`
//! on a `forbid` makes it halt the agent instead of only denying;
//! `@reason("…")` supplies the decision's human-readable reason;
//! `@description("…")` is documentation. Any other annotation is refused,
//! so a misspelt `@efect("halt")` cannot silently weaken a halt to a deny.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use cedar_policy::{
    ActionConstraint, Authorizer, Context, Effect, Entities, EntityId, EntityTypeName, EntityUid,
    PolicyId, PolicySet, PrincipalConstraint, Request, ResourceConstraint, RestrictedExpression,
};
use miette::Diagnostic as _;
use serde::{Deserialize, Serialize};

use crate::decision::Verdict;
use crate::diagnostic::did_you_mean;

/// How many distinct action names `context.history.counts` tracks.
pub const HISTORY_NAMES: usize = 64;

/// How deeply nested arguments may be.
pub const MAX_DEPTH: usize = 32;

/// Rule ids the engine itself uses in decisions; a policy may not take them.
pub const RESERVED_IDS: &[&str] = &[
    "default-deny",
    "unrepresentable-arguments",
    "state-mismatch",
];

/// Stack a call into cedar must have left, as the C library reports it, to run where it is
/// called: well above the 100 KiB below which cedar gives up (on a rule's evaluation, then
/// denied; on a request's context; on a type check).
const CEDAR_RED_ZONE: usize = 256 << 10;

/// Size of the stack segment a call into cedar is moved to when it does not have that much.
const CEDAR_STACK: usize = 4 << 20;

/// Runs `f`, a call into cedar, with the stack cedar requires. For a program's main thread
/// musl reports only what the kernel has mapped of it so far (~130 KiB at start, however far
/// it may grow), which is too little: there the call moves to a segment of its own, for the
/// call's duration. Elsewhere it stays where it is.
fn with_stack<T>(f: impl FnOnce() -> T) -> T {
    stacker::maybe_grow(CEDAR_RED_ZONE, CEDAR_STACK, f)
}

const ANNOTATIONS: &[&str] = &["id", "effect", "reason", "description"];

/// What a Cedar rule does when it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleEffect {
    /// `permit`.
    Permit,
    /// `forbid`.
    Forbid,
    /// `@effect("halt") forbid`.
    Halt,
}

/// A Cedar rule as written: its id, effect and reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// The `@id`.
    pub id: String,
    /// What it does.
    pub effect: RuleEffect,
    /// The `@reason`, if given.
    pub reason: Option<String>,
    /// The rule's text.
    pub text: String,
}

/// A problem found while compiling Cedar text, at a byte offset in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub offset: usize,
    pub message: String,
    pub help: Option<String>,
}

/// Splits Cedar text into statements: `(significant start, end)` byte
/// ranges, each ending after its `;` (the last may lack one). Strings and
/// `//` comments are skipped.
fn statements(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'"' => {
                start.get_or_insert(i);
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b';' => {
                out.push((start.unwrap_or(i), i + 1));
                start = None;
            }
            c if c.is_ascii_whitespace() => {}
            _ => {
                start.get_or_insert(i);
            }
        }
        i += 1;
    }
    // Text after the last ';' is a statement missing its ';': parsing it
    // reports that, rather than dropping it silently.
    if let Some(s) = start {
        out.push((s, bytes.len()));
    }
    out
}

/// The offset of annotation `@key` in `stmt`, or 0.
fn annotation_offset(stmt: &str, key: &str) -> usize {
    let needle = format!("@{key}");
    stmt.match_indices(&needle)
        .find(|(i, _)| {
            stmt[i + needle.len()..]
                .chars()
                .next()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
        })
        .map_or(0, |(i, _)| i)
}

/// The entity types a policy's scope names, with the type each must be:
/// `(what, written type, expected type)`.
fn scope_types(policy: &cedar_policy::Policy) -> Vec<(&'static str, String, &'static str)> {
    let mut out = Vec::new();
    match policy.principal_constraint() {
        PrincipalConstraint::Any => {}
        PrincipalConstraint::In(u) | PrincipalConstraint::Eq(u) => {
            out.push(("principal", u.type_name().to_string(), "Agent"));
        }
        PrincipalConstraint::Is(t) => out.push(("principal", t.to_string(), "Agent")),
        PrincipalConstraint::IsIn(t, u) => {
            out.push(("principal", t.to_string(), "Agent"));
            out.push(("principal", u.type_name().to_string(), "Agent"));
        }
    }
    match policy.action_constraint() {
        ActionConstraint::Any => {}
        ActionConstraint::Eq(u) => out.push(("action", u.type_name().to_string(), "Action")),
        ActionConstraint::In(us) => {
            out.extend(
                us.iter()
                    .map(|u| ("action", u.type_name().to_string(), "Action")),
            );
        }
    }
    match policy.resource_constraint() {
        ResourceConstraint::Any => {}
        ResourceConstraint::In(u) | ResourceConstraint::Eq(u) => {
            out.push(("resource", u.type_name().to_string(), "Resource"));
        }
        ResourceConstraint::Is(t) => out.push(("resource", t.to_string(), "Resource")),
        ResourceConstraint::IsIn(t, u) => {
            out.push(("resource", t.to_string(), "Resource"));
            out.push(("resource", u.type_name().to_string(), "Resource"));
        }
    }
    out
}

/// Whether `id` is usable as a rule id in decisions and in `eval` output:
/// non-empty, without white space or control characters.
pub(crate) fn valid_rule_id(id: &str) -> bool {
    !id.is_empty() && !id.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Compiled Cedar rules, ready to answer requests.
#[derive(Debug, Clone)]
pub struct CedarRules {
    /// For each action name some policy names: the policies that may apply.
    by_action: BTreeMap<String, PolicySet>,
    /// The policies that apply to any action (for names no policy names).
    any_action: PolicySet,
    rules: Vec<Rule>,
    by_id: BTreeMap<String, usize>,
    authorizer: Authorizer,
    entities: Entities,
    agent_type: EntityTypeName,
    action_type: EntityTypeName,
    resource_type: EntityTypeName,
}

impl CedarRules {
    /// Compiles Cedar text; problems carry byte offsets into `text`.
    pub(crate) fn compile(text: &str) -> Result<CedarRules, Vec<Problem>> {
        with_stack(|| Self::compile_here(text))
    }

    fn compile_here(text: &str) -> Result<CedarRules, Vec<Problem>> {
        let mut problems = Vec::new();
        let mut rules: Vec<Rule> = Vec::new();
        let mut by_id: BTreeMap<String, usize> = BTreeMap::new();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        // Each policy with the action names its scope admits (`None`: any).
        let mut scoped: Vec<(cedar_policy::Policy, Option<Vec<String>>)> = Vec::new();
        let mut prev_end = 0;
        // Each statement is parsed on its own, so problems in one do not hide
        // problems in the others.
        for (start, end) in statements(text) {
            let stmt = &text[prev_end..end];
            let base = prev_end;
            prev_end = end;
            let at = |key: &str| base + annotation_offset(stmt, key);
            let policy = match cedar_policy::Policy::parse(None, stmt) {
                Ok(p) => p,
                Err(_) if cedar_policy::Template::parse(None, stmt).is_ok() => {
                    problems.push(Problem {
                        offset: start,
                        message: "cedar templates (policies with ?principal or ?resource slots) are not supported".into(),
                        help: Some("write the entity directly, e.g. principal == Agent::\"a1\"".into()),
                    });
                    continue;
                }
                Err(errors) => {
                    problems.extend(errors.iter().map(|e| {
                        Problem {
                            offset: base
                                + e.labels()
                                    .and_then(|mut l| l.next())
                                    .map_or(start - base, |l| l.offset()),
                            message: format!("invalid cedar: {e}"),
                            help: e.help().map(|h| h.to_string()),
                        }
                    }));
                    continue;
                }
            };
            let mut bad = false;
            for (key, _) in policy.annotations() {
                if !ANNOTATIONS.contains(&key) {
                    problems.push(Problem {
                        offset: at(key),
                        message: format!("unknown annotation @{key}"),
                        help: Some(did_you_mean(key, ANNOTATIONS)),
                    });
                    bad = true;
                }
            }
            let id = match policy.annotation("id") {
                None => {
                    problems.push(Problem {
                        offset: start,
                        message: "cedar policy has no @id annotation".into(),
                        help: Some(
                            "write @id(\"some-name\") before permit or forbid: decisions name the rule that decided"
                                .into(),
                        ),
                    });
                    continue;
                }
                Some(id) if !valid_rule_id(id) => {
                    problems.push(Problem {
                        offset: at("id"),
                        message: format!("invalid rule id {id:?}"),
                        help: Some("use a non-empty id without spaces, e.g. \"read-ok\"".into()),
                    });
                    continue;
                }
                Some(id) if RESERVED_IDS.contains(&id) => {
                    problems.push(Problem {
                        offset: at("id"),
                        message: format!(
                            "rule id {id:?} is reserved for the engine's own decisions"
                        ),
                        help: Some("pick another id".into()),
                    });
                    continue;
                }
                Some(id) => id.to_owned(),
            };
            if !seen.insert(id.clone()) {
                problems.push(Problem {
                    offset: at("id"),
                    message: format!("duplicate rule id {id:?}"),
                    help: Some("another policy already uses it; ids must be unique".into()),
                });
                continue;
            }
            let effect = match (policy.effect(), policy.annotation("effect")) {
                (Effect::Permit, None) => RuleEffect::Permit,
                (Effect::Forbid, None) => RuleEffect::Forbid,
                (Effect::Forbid, Some("halt")) => RuleEffect::Halt,
                (Effect::Permit, Some(_)) => {
                    problems.push(Problem {
                        offset: at("effect"),
                        message: "@effect on a permit policy".into(),
                        help: Some("@effect(\"halt\") applies only to forbid policies".into()),
                    });
                    continue;
                }
                (Effect::Forbid, Some(other)) => {
                    problems.push(Problem {
                        offset: at("effect"),
                        message: format!("unknown @effect({other:?})"),
                        help: Some(
                            "the only effect is \"halt\"; leave @effect out for a plain deny"
                                .into(),
                        ),
                    });
                    continue;
                }
            };
            for (what, type_name, expected) in scope_types(&policy) {
                if type_name != expected {
                    let offset = stmt
                        .find(&format!("{type_name}::"))
                        .or_else(|| stmt.find(&type_name))
                        .map_or(start, |i| base + i);
                    problems.push(Problem {
                        offset,
                        message: format!(
                            "{what} of type {type_name} never matches: {what}s are {expected}::\"...\""
                        ),
                        help: Some(match what {
                            "principal" => "write e.g. principal == Agent::\"a1\"".into(),
                            "action" => "write e.g. action == Action::\"read_file\"".into(),
                            _ => "write e.g. resource == Resource::\"/etc/passwd\", or test context.resource".into(),
                        }),
                    });
                    bad = true;
                }
            }
            if bad {
                continue;
            }
            let renamed = policy.new_id(PolicyId::new(&id));
            let scope = match renamed.action_constraint() {
                ActionConstraint::Any => None,
                ActionConstraint::Eq(uid) => Some(vec![uid.id().unescaped().to_owned()]),
                ActionConstraint::In(uids) => {
                    Some(uids.iter().map(|u| u.id().unescaped().to_owned()).collect())
                }
            };
            scoped.push((renamed, scope));
            by_id.insert(id.clone(), rules.len());
            rules.push(Rule {
                id,
                effect,
                reason: policy.annotation("reason").map(str::to_owned),
                text: text[start..end].to_owned(),
            });
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        CedarRules::from_parts(&scoped, rules, by_id).map_err(|message| {
            vec![Problem {
                offset: 0,
                message,
                help: None,
            }]
        })
    }

    /// Builds one policy set per action name the policies mention, holding
    /// only the policies whose action scope admits that name, plus one for
    /// every other name. With no entity store, `action in [...]` holds
    /// exactly when `action ==` one of the list, so a policy left out of an
    /// action's set could never match (nor fail: Cedar checks the scope
    /// before the conditions); the decision is the same as with the whole
    /// set, at a fraction of the cost.
    fn from_parts(
        scoped: &[(cedar_policy::Policy, Option<Vec<String>>)],
        rules: Vec<Rule>,
        by_id: BTreeMap<String, usize>,
    ) -> Result<CedarRules, String> {
        let name = |n: &str| {
            EntityTypeName::from_str(n).map_err(|e| format!("internal: entity type {n}: {e}"))
        };
        let set_for = |action: Option<&str>| -> Result<PolicySet, String> {
            let mut set = PolicySet::new();
            for (policy, scope) in scoped {
                let admits = match (scope, action) {
                    (None, _) => true,
                    (Some(names), Some(a)) => names.iter().any(|n| n == a),
                    (Some(_), None) => false,
                };
                if admits {
                    set.add(policy.clone())
                        .map_err(|e| format!("cannot add cedar policy {}: {e}", policy.id()))?;
                }
            }
            Ok(set)
        };
        let mut by_action = BTreeMap::new();
        for (_, scope) in scoped {
            for action in scope.iter().flatten() {
                if !by_action.contains_key(action) {
                    by_action.insert(action.clone(), set_for(Some(action))?);
                }
            }
        }
        Ok(CedarRules {
            by_action,
            any_action: set_for(None)?,
            rules,
            by_id,
            authorizer: Authorizer::new(),
            entities: Entities::empty(),
            agent_type: name("Agent")?,
            action_type: name("Action")?,
            resource_type: name("Resource")?,
        })
    }

    /// The rules, in the order they were written.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    fn rule(&self, id: &str) -> Option<&Rule> {
        self.by_id.get(id).map(|&i| &self.rules[i])
    }

    /// Asks the rules about one action. Never fails: anything that stops the
    /// evaluation yields a deny carrying the reason.
    pub(crate) fn evaluate(&self, request: &CedarRequest<'_>) -> Outcome {
        with_stack(|| self.evaluate_here(request))
    }

    fn evaluate_here(&self, request: &CedarRequest<'_>) -> Outcome {
        let set = self
            .by_action
            .get(request.action)
            .unwrap_or(&self.any_action);
        self.evaluate_in(set, request)
    }

    fn evaluate_in(&self, set: &PolicySet, request: &CedarRequest<'_>) -> Outcome {
        let context = match build_context(request) {
            Ok(c) => c,
            Err(reason) => {
                return Outcome {
                    verdict: Verdict::Deny,
                    rule: "unrepresentable-arguments".into(),
                    reason,
                    also: Vec::new(),
                };
            }
        };
        let uid = |t: &EntityTypeName, id: &str| {
            EntityUid::from_type_name_and_id(t.clone(), EntityId::new(id))
        };
        let cedar_request = match Request::new(
            uid(&self.agent_type, request.agent),
            uid(&self.action_type, request.action),
            uid(&self.resource_type, request.resource.unwrap_or("")),
            context,
            None,
        ) {
            Ok(r) => r,
            Err(e) => {
                return Outcome {
                    verdict: Verdict::Deny,
                    rule: "unrepresentable-arguments".into(),
                    reason: format!("cannot build the cedar request: {e}"),
                    also: Vec::new(),
                };
            }
        };
        let response = self
            .authorizer
            .is_authorized(&cedar_request, set, &self.entities);
        let diagnostics = response.diagnostics();
        let mut matched: Vec<&str> = diagnostics.reason().map(AsRef::as_ref).collect();
        matched.sort_unstable();
        let mut errors: Vec<(&str, String)> = diagnostics
            .errors()
            .map(|e| {
                let cedar_policy::AuthorizationError::PolicyEvaluationError(inner) = e;
                (inner.policy_id().as_ref(), e.to_string())
            })
            .collect();
        errors.sort();
        let forbids: Vec<&Rule> = matched
            .iter()
            .filter_map(|id| self.rule(id))
            .filter(|r| r.effect != RuleEffect::Permit)
            .collect();
        // Halt before deny; then the smallest id.
        if let Some(decider) = forbids
            .iter()
            .find(|r| r.effect == RuleEffect::Halt)
            .or_else(|| forbids.first())
        {
            let verdict = if decider.effect == RuleEffect::Halt {
                Verdict::Halt
            } else {
                Verdict::Deny
            };
            let reason = decider.reason.clone().unwrap_or_else(|| {
                format!(
                    "{} {} is forbidden by cedar rule {}",
                    request.agent, request.action, decider.id
                )
            });
            return Outcome {
                verdict,
                rule: decider.id.clone(),
                reason,
                also: forbids
                    .iter()
                    .filter(|r| r.id != decider.id)
                    .map(|r| r.id.clone())
                    .collect(),
            };
        }
        if let Some((id, message)) = errors.first() {
            return Outcome {
                verdict: Verdict::Deny,
                rule: (*id).to_owned(),
                reason: format!(
                    "cedar rule {id} could not be evaluated, so the action is denied (fail closed): {message}"
                ),
                also: errors
                    .iter()
                    .skip(1)
                    .map(|(id, _)| (*id).to_owned())
                    .collect(),
            };
        }
        if let Some(decider) = matched.first().and_then(|id| self.rule(id)) {
            return Outcome {
                verdict: Verdict::Allow,
                rule: decider.id.clone(),
                reason: decider.reason.clone().unwrap_or_else(|| {
                    format!(
                        "{} {} is permitted by cedar rule {}",
                        request.agent, request.action, decider.id
                    )
                }),
                also: matched.iter().skip(1).map(|id| (*id).to_owned()).collect(),
            };
        }
        Outcome {
            verdict: Verdict::Deny,
            rule: "default-deny".into(),
            reason: format!("no cedar rule permits {} {}", request.agent, request.action),
            also: Vec::new(),
        }
    }
}

/// What the Cedar rules said about one action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub verdict: Verdict,
    pub rule: String,
    pub reason: String,
    pub also: Vec<String>,
}

/// The parts of an action and its history that Cedar sees.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CedarRequest<'a> {
    pub agent: &'a str,
    pub action: &'a str,
    pub resource: Option<&'a str>,
    pub args: &'a serde_json::Value,
    pub count: u64,
    pub counts: &'a BTreeMap<String, u64>,
    pub last_action: Option<&'a str>,
}

fn long(n: u64) -> RestrictedExpression {
    RestrictedExpression::new_long(i64::try_from(n).unwrap_or(i64::MAX))
}

fn build_context(request: &CedarRequest<'_>) -> Result<Context, String> {
    let args = match request.args {
        serde_json::Value::Null => {
            RestrictedExpression::new_record([]).map_err(|e| e.to_string())?
        }
        value => to_cedar(value, "args", 0)?,
    };
    let counts = RestrictedExpression::new_record(
        request
            .counts
            .iter()
            .map(|(name, n)| (name.clone(), long(*n))),
    )
    .map_err(|e| e.to_string())?;
    let history = RestrictedExpression::new_record([
        ("count".to_owned(), long(request.count)),
        ("counts".to_owned(), counts),
        (
            "last_action".to_owned(),
            RestrictedExpression::new_string(request.last_action.unwrap_or("").to_owned()),
        ),
    ])
    .map_err(|e| e.to_string())?;
    let resource = RestrictedExpression::new_string(request.resource.unwrap_or("").to_owned());
    Context::from_pairs([
        ("args".to_owned(), args),
        ("history".to_owned(), history),
        ("resource".to_owned(), resource),
    ])
    .map_err(|e| format!("cannot build the cedar context: {e}"))
}

/// Converts JSON to a Cedar value without interpreting any escapes. `path`
/// names the value in error messages.
fn to_cedar(
    value: &serde_json::Value,
    path: &str,
    depth: usize,
) -> Result<RestrictedExpression, String> {
    use serde_json::Value;
    if depth > MAX_DEPTH {
        return Err(format!(
            "{path} is nested more than {MAX_DEPTH} levels deep"
        ));
    }
    Ok(match value {
        Value::Null => {
            return Err(format!(
                "{path} is null, which cedar cannot represent inside a list"
            ));
        }
        Value::Bool(b) => RestrictedExpression::new_bool(*b),
        Value::String(s) => RestrictedExpression::new_string(s.clone()),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                RestrictedExpression::new_long(i)
            } else {
                let text = n.to_string();
                if !is_cedar_decimal(&text) {
                    return Err(format!(
                        "{path} is the number {text}, which cedar cannot represent (integers must fit in 64 bits; fractions need at most 4 decimal places and no exponent)"
                    ));
                }
                RestrictedExpression::new_decimal(text)
            }
        }
        Value::Array(items) => RestrictedExpression::new_set(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| to_cedar(v, &format!("{path}[{i}]"), depth + 1))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Value::Object(map) => {
            let mut fields = Vec::with_capacity(map.len());
            for (k, v) in map {
                if v.is_null() {
                    continue;
                }
                fields.push((k.clone(), to_cedar(v, &format!("{path}.{k}"), depth + 1)?));
            }
            RestrictedExpression::new_record(fields).map_err(|e| format!("{path}: {e}"))?
        }
    })
}

/// Whether `text` is a literal Cedar's `decimal()` accepts: digits, a point,
/// one to four digits, within ±922337203685477.5807.
fn is_cedar_decimal(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let Some((whole, frac)) = digits.split_once('.') else {
        return false;
    };
    !whole.is_empty()
        && (1..=4).contains(&frac.len())
        && whole.chars().all(|c| c.is_ascii_digit())
        && frac.chars().all(|c| c.is_ascii_digit())
        && whole.parse::<u64>().is_ok_and(|w| w <= 922_337_203_685_476)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ask(rules: &CedarRules, action: &str, args: serde_json::Value) -> Outcome {
        let counts = BTreeMap::new();
        rules.evaluate(&CedarRequest {
            agent: "a1",
            action,
            resource: None,
            args: &args,
            count: 0,
            counts: &counts,
            last_action: None,
        })
    }

    #[test]
    fn splits_statements_around_strings_and_comments() {
        let text = "// a; comment\n@id(\"x;y\") permit(principal, action, resource);\n  forbid(principal, action, resource) when { \"\\\";\" == \"\" };\n// trailing;";
        let st = statements(text);
        assert_eq!(st.len(), 2);
        assert!(text[st[0].0..st[0].1].starts_with("@id(\"x;y\")"));
        assert!(text[st[1].0..st[1].1].starts_with("forbid"));
        assert!(text[st[1].0..st[1].1].ends_with("};"));
    }

    #[test]
    fn forbid_beats_permit_and_halt_beats_forbid() {
        let rules = CedarRules::compile(
            r#"
            @id("all") permit(principal, action, resource);
            @id("no-rm") forbid(principal, action == Action::"rm", resource);
            @id("stop-rm") @effect("halt") forbid(principal, action == Action::"rm", resource) when { context.args has force };
            "#,
        )
        .unwrap();
        assert_eq!(ask(&rules, "ls", json!({})).verdict, Verdict::Allow);
        let deny = ask(&rules, "rm", json!({}));
        assert_eq!((deny.verdict, deny.rule.as_str()), (Verdict::Deny, "no-rm"));
        let halt = ask(&rules, "rm", json!({"force": true}));
        assert_eq!(
            (halt.verdict, halt.rule.as_str()),
            (Verdict::Halt, "stop-rm")
        );
        assert_eq!(halt.also, vec!["no-rm".to_owned()]);
    }

    #[test]
    fn default_deny_and_fail_closed() {
        let rules = CedarRules::compile(
            r#"@id("small") permit(principal, action == Action::"w", resource) when { context.args.n < 10 };"#,
        )
        .unwrap();
        assert_eq!(ask(&rules, "w", json!({"n": 3})).verdict, Verdict::Allow);
        let none = ask(&rules, "other", json!({}));
        assert_eq!(
            (none.verdict, none.rule.as_str()),
            (Verdict::Deny, "default-deny")
        );
        let err = ask(&rules, "w", json!({"n": "three"}));
        assert_eq!((err.verdict, err.rule.as_str()), (Verdict::Deny, "small"));
        assert!(err.reason.contains("fail closed"), "{}", err.reason);
    }

    #[test]
    fn arguments_cannot_smuggle_entities_or_unrepresentable_values() {
        let rules = CedarRules::compile(
            r#"@id("p") permit(principal, action == Action::"x", resource) when { context.args.x == Agent::"root" };
               @id("t") permit(principal, action == Action::"t", resource) when { context.args.t.lessThan(decimal("0.8")) };"#,
        )
        .unwrap();
        let escaped = ask(
            &rules,
            "x",
            json!({"x": {"__entity": {"type": "Agent", "id": "root"}}}),
        );
        assert_eq!(
            escaped.verdict,
            Verdict::Deny,
            "an escape stays a plain record"
        );
        assert_eq!(ask(&rules, "t", json!({"t": 0.7})).verdict, Verdict::Allow);
        let bad = ask(&rules, "t", json!({"t": 1e300}));
        assert_eq!(
            (bad.verdict, bad.rule.as_str()),
            (Verdict::Deny, "unrepresentable-arguments")
        );
        assert!(bad.reason.contains("args.t"), "{}", bad.reason);
        let null_in_list = ask(&rules, "t", json!({"l": [null]}));
        assert_eq!(null_in_list.rule, "unrepresentable-arguments");
        let mut deep = json!(1);
        for _ in 0..40 {
            deep = json!([deep]);
        }
        assert_eq!(
            ask(&rules, "t", json!({ "d": deep })).rule,
            "unrepresentable-arguments"
        );
    }

    #[test]
    fn per_action_sets_decide_as_the_whole_set_would() {
        let rules = CedarRules::compile(
            r#"
            @id("any") permit(principal, action, resource) when { context.args has ok };
            @id("eq") permit(principal, action == Action::"a", resource);
            @id("in") forbid(principal, action in [Action::"a", Action::"b"], resource) when { context.args has no };
            @id("err") forbid(principal, action == Action::"c", resource) when { context.args.n > 1 };
            @id("halt") @effect("halt") forbid(principal, action in [Action::"b", Action::"d"], resource) when { context.args has stop };
            @id("any-forbid") forbid(principal, action, resource) when { context.args has never };
            "#,
        )
        .unwrap();
        let mut whole = PolicySet::new();
        for set in rules.by_action.values().chain([&rules.any_action]) {
            for p in set.policies() {
                if whole.policy(p.id()).is_none() {
                    whole.add(p.clone()).unwrap();
                }
            }
        }
        assert_eq!(whole.policies().count(), 6);
        let counts = BTreeMap::new();
        for action in ["a", "b", "c", "d", "e"] {
            for args in [
                json!({}),
                json!({"ok": 1}),
                json!({"no": 1}),
                json!({"stop": 1, "ok": 1}),
                json!({"n": 5}),
                json!({"never": 1, "no": 1, "stop": 1}),
            ] {
                let request = CedarRequest {
                    agent: "a1",
                    action,
                    resource: None,
                    args: &args,
                    count: 0,
                    counts: &counts,
                    last_action: None,
                };
                assert_eq!(
                    rules.evaluate(&request),
                    rules.evaluate_in(&whole, &request),
                    "{action} {args}"
                );
            }
        }
    }

    #[test]
    fn scopes_naming_other_entity_types_are_refused() {
        let p =
            CedarRules::compile(r#"@id("a") permit(principal, action == Tool::"x", resource);"#)
                .unwrap_err();
        // Cedar itself insists on the `Action` type for actions.
        assert!(p[0].message.contains("type `Action`"), "{p:?}");
        let p = CedarRules::compile(
            r#"@id("a") permit(principal == User::"x", action, resource is File);"#,
        )
        .unwrap_err();
        assert_eq!(p.len(), 2);
        assert!(
            p[0].message.starts_with("principal of type User"),
            "{:?}",
            p
        );
        assert!(p[1].message.starts_with("resource of type File"), "{:?}", p);
        assert!(CedarRules::compile(
            r#"@id("a") permit(principal == Agent::"x", action in [Action::"r"], resource == Resource::"/x");"#
        )
        .is_ok());
    }

    #[test]
    fn decimals_are_checked_before_cedar_sees_them() {
        assert!(is_cedar_decimal("0.7"));
        assert!(is_cedar_decimal("-12.3456"));
        assert!(!is_cedar_decimal("1.23456"));
        assert!(!is_cedar_decimal("1e5"));
        assert!(!is_cedar_decimal("7"));
        assert!(!is_cedar_decimal("922337203685477.0"));
    }

    #[test]
    fn compile_problems() {
        let problems = |t: &str| CedarRules::compile(t).unwrap_err();
        let p = problems("permit(principal, action, resource);");
        assert!(p[0].message.contains("no @id"));
        let p = problems(r#"@id("a") @efect("halt") forbid(principal, action, resource);"#);
        assert_eq!(p[0].message, "unknown annotation @efect");
        assert_eq!(p[0].help.as_deref(), Some("did you mean \"effect\"?"));
        assert_eq!(p[0].offset, 9);
        let p = problems(r#"@id("a") @effect("stop") forbid(principal, action, resource);"#);
        assert!(p[0].message.contains("unknown @effect"));
        let p = problems(r#"@id("a") @effect("halt") permit(principal, action, resource);"#);
        assert!(p[0].message.contains("permit"));
        let p = problems(
            "@id(\"a\") permit(principal, action, resource);\n@id(\"a\") permit(principal, action, resource);",
        );
        assert!(p[0].message.contains("duplicate rule id"));
        let p = problems(r#"@id("default-deny") permit(principal, action, resource);"#);
        assert!(p[0].message.contains("reserved"));
        let p = problems(r#"@id("a b") permit(principal, action, resource);"#);
        assert!(p[0].message.contains("invalid rule id"));
        let p = problems(r#"@id("t") permit(principal == ?principal, action, resource);"#);
        assert!(p[0].message.contains("templates"));
        let p = problems("@id(\"a\")\npermit(principal, acton, resource);");
        assert!(
            p[0].message.starts_with("invalid cedar"),
            "{}",
            p[0].message
        );
        assert_eq!(p[0].offset, 27);
    }
}
