//! Integration tests of cordon-policy, one module per topic.

mod attenuation;
mod decisions;
mod determinism;
mod examples;
mod sequences;
mod validation;

use std::path::Path;

use cordon_policy::load::{LoadError, parse};
use cordon_policy::{Action, AgentState, Decision, Engine, Policy};

/// Loads inline policy text (no `cedar_file`), relative to `/srv/policies`.
pub fn policy(text: &str) -> Policy {
    match parse("policy.toml", text, Path::new("/srv/policies")) {
        Ok(loaded) => loaded.policy,
        Err(e) => panic!("policy should load:\n{e}"),
    }
}

/// The rendered diagnostics of a policy that must not load.
pub fn errors(text: &str) -> Vec<String> {
    match parse("policy.toml", text, Path::new("/srv/policies")) {
        Ok(_) => panic!("policy should be refused:\n{text}"),
        Err(LoadError::Invalid { diagnostics, .. }) => {
            diagnostics.iter().map(ToString::to_string).collect()
        }
    }
}

/// The rendered warnings of a policy that loads.
pub fn warnings(text: &str) -> Vec<String> {
    match parse("policy.toml", text, Path::new("/srv/policies")) {
        Ok(loaded) => loaded.warnings.iter().map(ToString::to_string).collect(),
        Err(e) => panic!("policy should load:\n{e}"),
    }
}

/// Decides `actions` (agent "a1", times 1000 ms apart) in order with one
/// state, returning the decisions.
pub fn run(engine: &Engine, state: &mut AgentState, actions: &[Action]) -> Vec<Decision> {
    actions
        .iter()
        .enumerate()
        .map(|(i, a)| engine.decide(state, a, 1000 * i as u64))
        .collect()
}

pub fn act(name: &str) -> Action {
    Action::new("a1", name)
}
