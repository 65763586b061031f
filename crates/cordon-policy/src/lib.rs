//! Policy: the policy file, per-call Cedar rules, sequence automata and
//! attenuated capabilities. Pure: no I/O happens here.
//!
//! - [`load`] reads a policy file's text into a validated [`Policy`]
//!   (boundary sections for `cordon run`, Cedar rules, sequence rules), or
//!   reports every problem with its file, line and column.
//! - [`Engine`] decides agent [`Action`]s: [`Engine::decide`] returns a
//!   [`Decision`] (allow, deny or halt, with the deciding rule's id and a
//!   reason) and updates the caller's [`AgentState`].
//! - [`capability`] holds capabilities and the [`AgentTree`] that attenuates
//!   them from parent to child and revokes them down the tree.
//! - [`units`] and [`net`] parse sizes, durations, counts and network
//!   destinations for the policy file and the `cordon run` flags alike.
//!
//! Invariants: nothing here reads a clock, a file or the environment; the
//! same policy, state, action and time give the same decision, byte for
//! byte; default deny; forbid beats permit; halt > deny > allow; any error
//! during evaluation denies; the history lives in the caller's state; a child
//! agent never holds what its parent lacks.
#![forbid(unsafe_code)]

pub mod capability;
pub mod cedar;
pub mod decision;
pub mod diagnostic;
pub mod document;
pub mod load;
pub mod net;
pub mod paths;
pub mod sequence;
pub mod units;

pub use capability::{Access, AgentTree, Capability, CapabilitySet};
pub use decision::{Action, AgentState, Decision, Engine, Verdict};
pub use diagnostic::{Diagnostic, Severity};
pub use document::{Actions, Filesystem, Limits, Network, Policy, Process};
pub use load::{LoadError, Loaded};
pub use net::{Cidr, NetDest, NetMode};
pub use sequence::SequenceRule;
