//! Deciding one agent action: Cedar rules, then sequence rules, combined.
//!
//! # The procedure
//!
//! [`Engine::evaluate`] decides without changing anything:
//!
//! 1. A state that belongs to another policy, or an agent already halted,
//!    decides at once (deny `state-mismatch`; halt naming the rule that
//!    halted it).
//! 2. The Cedar rules decide the call (see [`crate::cedar`]): a matching
//!    `forbid` denies, or halts if it carries `@effect("halt")` (halting
//!    forbids first, then the smallest id, name the decision); an evaluation
//!    error denies, naming the rule that failed (fail closed); otherwise a
//!    matching `permit` allows; otherwise `default-deny`.
//! 3. Each sequence rule that this action would complete adds its decision
//!    (deny or halt), named by the rule's `name`.
//! 4. The strongest verdict wins: halt > deny > allow. Among equals, the
//!    Cedar decision comes first, then sequence rules in file order. Every
//!    other rule that fired is listed in [`Decision::also`].
//!
//! [`Engine::commit`] then records the outcome in the caller's
//! [`AgentState`]: an allowed action enters the history (it happened: the
//! counters and every sequence automaton step once); a denied action does
//! not happen, so it changes nothing; a halt marks the state halted, and
//! every later action under that state is halted too.
//! [`Engine::decide`] is both in one call.
//!
//! Time is the caller's (`now_ms`, milliseconds on any fixed clock); the
//! library never reads a clock. A `now_ms` earlier than the last committed
//! action's is treated as equal to it, so time in the history never runs
//! backwards.
//!
//! Decisions are deterministic: the same policy, state, action and time give
//! the same [`Decision`], byte for byte when serialized.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cedar::{CedarRequest, CedarRules, HISTORY_NAMES};
use crate::document::Policy;
use crate::sequence::{Event, Progress, SequenceDecision, SequenceRule};

/// One thing an agent asks to do. Its JSON form is one line of an `eval`
/// trace: `{"agent": "a1", "action": "upload_file", "args": {...},
/// "resource": "optional"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    /// The agent's id.
    pub agent: String,
    /// The action (tool) name.
    #[serde(rename = "action")]
    pub name: String,
    /// The arguments as the agent gave them.
    #[serde(default)]
    pub args: serde_json::Value,
    /// What the action touches, if it names one thing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
}

impl Action {
    /// An action without arguments or resource.
    pub fn new(agent: impl Into<String>, name: impl Into<String>) -> Self {
        Action {
            agent: agent.into(),
            name: name.into(),
            args: serde_json::Value::Object(serde_json::Map::new()),
            resource: None,
        }
    }

    /// The same action with these arguments.
    #[must_use]
    pub fn with_args(mut self, args: serde_json::Value) -> Self {
        self.args = args;
        self
    }

    /// The same action touching `resource`.
    #[must_use]
    pub fn with_resource(mut self, resource: impl Into<String>) -> Self {
        self.resource = Some(resource.into());
        self
    }
}

/// The outcome for one action. Ordered by strength: `Allow < Deny < Halt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    /// The action may run.
    Allow,
    /// The action may not run; the agent goes on.
    Deny,
    /// The action may not run, and the agent must be stopped now.
    Halt,
}

impl Verdict {
    /// `ALLOW`, `DENY` or `HALT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "ALLOW",
            Verdict::Deny => "DENY",
            Verdict::Halt => "HALT",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A decision: the verdict, the rule that decided it, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Allow, deny or halt.
    pub verdict: Verdict,
    /// The id of the deciding rule: a Cedar `@id`, a sequence `name`, or one
    /// of the engine's own (`default-deny`, `unrepresentable-arguments`,
    /// `state-mismatch`).
    pub rule: String,
    /// A human-readable reason.
    pub reason: String,
    /// Other rules that also fired, in decision order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<String>,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.verdict, self.rule, self.reason)
    }
}

/// Why an agent is halted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Halted {
    /// The rule that halted it.
    pub rule: String,
    /// The reason given then.
    pub reason: String,
}

/// What the engine remembers about an agent (or a group of agents sharing
/// it): owned by the caller, never by input the agent supplies. Its size
/// depends on the policy, not on how long the history is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentState {
    policy: u64,
    count: u64,
    last_ms: u64,
    last_action: Option<String>,
    counts: BTreeMap<String, u64>,
    progress: Vec<Progress>,
    halted: Option<Halted>,
}

impl AgentState {
    /// How many actions were allowed and committed.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Why the agent is halted, if it is.
    pub fn halted(&self) -> Option<&Halted> {
        self.halted.as_ref()
    }

    /// The last committed action's name.
    pub fn last_action(&self) -> Option<&str> {
        self.last_action.as_deref()
    }
}

/// Why an [`Engine`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The policy's Cedar text does not compile (a policy from
    /// [`load`](crate::load::load) always does).
    #[error("cannot compile the policy's cedar rules: {problems}")]
    Compile {
        /// The problems, one per line.
        problems: String,
    },
}

/// A policy compiled for deciding: build once, decide many times.
#[derive(Debug, Clone)]
pub struct Engine {
    cedar: CedarRules,
    sequences: Vec<SequenceRule>,
    fingerprint: u64,
}

/// FNV-1a: a fixed, seedless hash, so fingerprints are the same in every
/// process.
fn fnv1a(bytes: &[u8], mut hash: u64) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

impl Engine {
    /// Compiles a policy's Cedar text and sequence rules.
    pub fn new(policy: &Policy) -> Result<Engine, EngineError> {
        let cedar = CedarRules::compile(&policy.actions.cedar).map_err(|problems| {
            EngineError::Compile {
                problems: problems
                    .iter()
                    .map(|p| format!("at byte {}: {}", p.offset, p.message))
                    .collect::<Vec<_>>()
                    .join("\n"),
            }
        })?;
        let mut fingerprint = fnv1a(policy.actions.cedar.as_bytes(), 0xcbf2_9ce4_8422_2325);
        for rule in &policy.sequences {
            let json = serde_json::to_vec(rule).unwrap_or_default();
            fingerprint = fnv1a(&json, fingerprint);
        }
        Ok(Engine {
            cedar,
            sequences: policy.sequences.clone(),
            fingerprint,
        })
    }

    /// A fresh state: no history, nothing halted.
    pub fn state(&self) -> AgentState {
        AgentState {
            policy: self.fingerprint,
            count: 0,
            last_ms: 0,
            last_action: None,
            counts: BTreeMap::new(),
            progress: self.sequences.iter().map(Progress::new).collect(),
            halted: None,
        }
    }

    /// The sequence rules.
    pub fn sequences(&self) -> &[SequenceRule] {
        &self.sequences
    }

    /// The Cedar rules.
    pub fn cedar(&self) -> &CedarRules {
        &self.cedar
    }

    fn fits(&self, state: &AgentState) -> bool {
        state.policy == self.fingerprint
            && state.progress.len() == self.sequences.len()
            && state
                .progress
                .iter()
                .zip(&self.sequences)
                .all(|(p, r)| p.fits(r))
    }

    fn event<'a>(state: &AgentState, action: &'a Action, now_ms: u64) -> Event<'a> {
        Event {
            action: &action.name,
            args: &action.args,
            resource: action.resource.as_deref(),
            index: state.count,
            at_ms: now_ms.max(state.last_ms),
        }
    }

    /// Decides `action` given `state`, changing nothing. Costs one Cedar
    /// evaluation plus O(steps) per sequence rule, whatever the history's
    /// length.
    ///
    /// Where the C library reports less than 256 KiB of stack left (musl,
    /// on a program's main thread, reports only what is mapped so far), the
    /// Cedar evaluation runs on a 4 MiB segment of its own, allocated for
    /// the call: Cedar gives up on a rule, and the action is denied, with
    /// under 100 KiB left.
    pub fn evaluate(&self, state: &AgentState, action: &Action, now_ms: u64) -> Decision {
        if !self.fits(state) {
            return Decision {
                verdict: Verdict::Deny,
                rule: "state-mismatch".into(),
                reason: "the agent state was made for a different policy; start a fresh state with Engine::state".into(),
                also: Vec::new(),
            };
        }
        if let Some(h) = &state.halted {
            return Decision {
                verdict: Verdict::Halt,
                rule: h.rule.clone(),
                reason: format!("the agent was already halted: {}", h.reason),
                also: Vec::new(),
            };
        }
        let outcome = self.cedar.evaluate(&CedarRequest {
            agent: &action.agent,
            action: &action.name,
            resource: action.resource.as_deref(),
            args: &action.args,
            count: state.count,
            counts: &state.counts,
            last_action: state.last_action.as_deref(),
        });
        let mut decision = Decision {
            verdict: outcome.verdict,
            rule: outcome.rule,
            reason: outcome.reason,
            also: outcome.also,
        };
        let event = Self::event(state, action, now_ms);
        for (rule, progress) in self.sequences.iter().zip(&state.progress) {
            let Some(start) = rule.completes(progress, &event) else {
                continue;
            };
            let verdict = match rule.decision {
                SequenceDecision::Deny => Verdict::Deny,
                SequenceDecision::Halt => Verdict::Halt,
            };
            if verdict > decision.verdict {
                let reason = rule.reason.clone().unwrap_or_else(|| {
                    let ago = state.count.saturating_sub(start.index);
                    match ago {
                        0 => format!("{} {} matches sequence rule {}", action.agent, action.name, rule.name),
                        1 => format!(
                            "{} completed the sequence {} (its first step was the previous allowed action)",
                            action.agent,
                            rule.describe()
                        ),
                        _ => format!(
                            "{} completed the sequence {} (its first step was {ago} allowed actions ago)",
                            action.agent,
                            rule.describe()
                        ),
                    }
                });
                let previous = std::mem::replace(&mut decision.rule, rule.name.clone());
                decision.also.insert(0, previous);
                decision.verdict = verdict;
                decision.reason = reason;
            } else {
                decision.also.push(rule.name.clone());
            }
        }
        decision
    }

    /// Records the outcome of `decision` (from [`evaluate`](Self::evaluate)
    /// on the same state, action and time) in `state`: an allowed action
    /// enters the history, a halt halts the state, a deny changes nothing.
    pub fn commit(
        &self,
        state: &mut AgentState,
        action: &Action,
        now_ms: u64,
        decision: &Decision,
    ) {
        if !self.fits(state) || state.halted.is_some() {
            return;
        }
        match decision.verdict {
            Verdict::Deny => {}
            Verdict::Halt => {
                state.halted = Some(Halted {
                    rule: decision.rule.clone(),
                    reason: decision.reason.clone(),
                });
            }
            Verdict::Allow => {
                let event = Self::event(state, action, now_ms);
                for (rule, progress) in self.sequences.iter().zip(state.progress.iter_mut()) {
                    rule.advance(progress, &event);
                }
                state.last_ms = event.at_ms;
                state.count += 1;
                if let Some(n) = state.counts.get_mut(&action.name) {
                    *n += 1;
                } else if state.counts.len() < HISTORY_NAMES {
                    state.counts.insert(action.name.clone(), 1);
                }
                if state.last_action.as_deref() != Some(action.name.as_str()) {
                    state.last_action = Some(action.name.clone());
                }
            }
        }
    }

    /// [`evaluate`](Self::evaluate), then [`commit`](Self::commit).
    ///
    /// ```
    /// use cordon_policy::{load::parse, Action, Engine, Verdict};
    /// let policy = parse("policy.toml", r#"
    /// [actions]
    /// cedar = '''@id("files-ok") permit(principal, action, resource);'''
    /// [[sequence]]
    /// name = "prevent-download-upload-delete"
    /// actions = ["download_file", "upload_file", "delete_file"]
    /// decision = "halt"
    /// "#, std::path::Path::new("/")).unwrap().policy;
    /// let engine = Engine::new(&policy).unwrap();
    /// let mut state = engine.state();
    /// let verdicts: Vec<Verdict> = ["download_file", "upload_file", "delete_file"]
    ///     .into_iter()
    ///     .enumerate()
    ///     .map(|(t, name)| engine.decide(&mut state, &Action::new("a1", name), t as u64).verdict)
    ///     .collect();
    /// assert_eq!(verdicts, [Verdict::Allow, Verdict::Allow, Verdict::Halt]);
    /// ```
    pub fn decide(&self, state: &mut AgentState, action: &Action, now_ms: u64) -> Decision {
        let decision = self.evaluate(state, action, now_ms);
        self.commit(state, action, now_ms, &decision);
        decision
    }
}
