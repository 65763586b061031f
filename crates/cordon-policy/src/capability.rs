//! Capabilities and attenuation: what an agent may touch, and how a child
//! agent receives at most what its parent holds.
//!
//! A [`Capability`] is a tool class, a path prefix with an access set, or a
//! network destination. Intersections are *semantic*:
//!
//! - paths compare by whole components (`/home/ab` is not under `/home/a`);
//!   the intersection of two nested prefixes is the deeper one, with the
//!   access both grant;
//! - IP blocks are nested or disjoint, so their intersection is the smaller
//!   one; ports intersect as "any" ∩ p = p;
//! - the tool class `*` stands for every tool.
//!
//! An [`AgentTree`] records who spawned whom. [`AgentTree::spawn`] gives the
//! child the intersection of what it asks for and what its parent holds.
//! [`AgentTree::revoke`] takes a capability from an agent and from every
//! descendant, present and future: the revocation is recorded with each of
//! them and inherited by children spawned later, so no agent below the
//! revoking point can hold any part of it again. Checks go through
//! [`AgentTree::allows`], which consults both what the agent holds and what
//! was revoked from it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::net::NetDest;
use crate::paths;

/// Why a capability operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    /// [`AgentTree::add_root`] was given an id already in the tree.
    #[error("cannot add agent {agent:?}: an agent with that id already exists (pick a new id)")]
    AddRoot {
        /// The agent id.
        agent: String,
    },
    /// [`AgentTree::spawn`] was refused.
    #[error("cannot spawn agent {child:?} from {parent:?}: {reason}")]
    Spawn {
        /// The would-be parent.
        parent: String,
        /// The would-be child.
        child: String,
        /// Why.
        reason: String,
    },
    /// [`AgentTree::revoke`] named an agent not in the tree.
    #[error("cannot revoke from agent {agent:?}: no such agent")]
    Revoke {
        /// The agent id.
        agent: String,
    },
    /// [`Access::parse`] was given an unknown letter.
    #[error("invalid access {input:?}: use the letters r (read), w (write) and x (execute)")]
    ParseAccess {
        /// The text as given.
        input: String,
    },
}

/// A set of file access rights: read, write, execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Access(u8);

impl Access {
    /// Reading.
    pub const READ: Access = Access(1);
    /// Writing (creating, modifying, deleting).
    pub const WRITE: Access = Access(2);
    /// Executing.
    pub const EXEC: Access = Access(4);
    /// Reading and writing, as `[filesystem] write` grants.
    pub const READ_WRITE: Access = Access(3);
    /// No access at all.
    pub const NONE: Access = Access(0);

    /// Parses letters `r`, `w`, `x` in any order (`"rw"`, `"rx"`).
    pub fn parse(input: &str) -> Result<Access, CapabilityError> {
        let mut bits = 0u8;
        for c in input.chars() {
            bits |= match c {
                'r' => 1,
                'w' => 2,
                'x' => 4,
                _ => {
                    return Err(CapabilityError::ParseAccess {
                        input: input.to_owned(),
                    });
                }
            };
        }
        Ok(Access(bits))
    }

    /// The rights both grant.
    pub fn intersect(self, other: Access) -> Access {
        Access(self.0 & other.0)
    }

    /// Whether every right in `other` is in `self`.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether no right is granted.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (bit, c) in [(1, 'r'), (2, 'w'), (4, 'x')] {
            if self.0 & bit != 0 {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

impl Serialize for Access {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Access {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Access::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// One thing an agent may do.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    /// Call tools of this class (an action name); `*` is every tool.
    Tool(String),
    /// Access files at or beneath a path.
    Path {
        /// The prefix, normalized lexically.
        prefix: PathBuf,
        /// The rights granted there.
        access: Access,
    },
    /// Connect to a network destination.
    Net(NetDest),
}

impl Capability {
    /// A tool class; `*` is every tool.
    pub fn tool(class: impl Into<String>) -> Capability {
        Capability::Tool(class.into())
    }

    /// A path prefix (normalized lexically) with rights.
    pub fn path(prefix: impl AsRef<Path>, access: Access) -> Capability {
        Capability::Path {
            prefix: paths::normalize(prefix.as_ref()),
            access,
        }
    }

    /// Whether everything `other` permits, `self` permits too.
    pub fn contains(&self, other: &Capability) -> bool {
        match (self, other) {
            (Capability::Tool(a), Capability::Tool(b)) => a == "*" || a == b,
            (
                Capability::Path {
                    prefix: a,
                    access: x,
                },
                Capability::Path {
                    prefix: b,
                    access: y,
                },
            ) => paths::is_within(b, a) && x.contains(*y),
            (Capability::Net(a), Capability::Net(b)) => a.contains(b),
            _ => false,
        }
    }

    /// What both permit, or `None` when they have nothing in common.
    pub fn intersect(&self, other: &Capability) -> Option<Capability> {
        match (self, other) {
            (Capability::Tool(a), Capability::Tool(b)) => match (a.as_str(), b.as_str()) {
                ("*", _) => Some(other.clone()),
                (_, "*") => Some(self.clone()),
                _ if a == b => Some(self.clone()),
                _ => None,
            },
            (
                Capability::Path {
                    prefix: a,
                    access: x,
                },
                Capability::Path {
                    prefix: b,
                    access: y,
                },
            ) => {
                let access = x.intersect(*y);
                let prefix = if paths::is_within(a, b) {
                    a
                } else if paths::is_within(b, a) {
                    b
                } else {
                    return None;
                };
                (!access.is_empty()).then(|| Capability::Path {
                    prefix: prefix.clone(),
                    access,
                })
            }
            (Capability::Net(a), Capability::Net(b)) => a.intersect(b).map(Capability::Net),
            _ => None,
        }
    }

    /// Whether the two have anything in common.
    pub fn overlaps(&self, other: &Capability) -> bool {
        self.intersect(other).is_some()
    }

    fn is_void(&self) -> bool {
        matches!(self, Capability::Path { access, .. } if access.is_empty())
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Capability::Tool(class) => write!(f, "tool {class}"),
            Capability::Path { prefix, access } => {
                write!(f, "path {} ({access})", prefix.display())
            }
            Capability::Net(dest) => write!(f, "net {dest}"),
        }
    }
}

/// A set of capabilities, kept minimal: sorted, without duplicates, and
/// without a member that another member already contains.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "Vec<Capability>", into = "Vec<Capability>")]
pub struct CapabilitySet {
    members: Vec<Capability>,
}

impl From<Vec<Capability>> for CapabilitySet {
    fn from(members: Vec<Capability>) -> Self {
        members.into_iter().collect()
    }
}

impl From<CapabilitySet> for Vec<Capability> {
    fn from(set: CapabilitySet) -> Self {
        set.members
    }
}

impl FromIterator<Capability> for CapabilitySet {
    fn from_iter<I: IntoIterator<Item = Capability>>(iter: I) -> Self {
        let mut all: Vec<Capability> = iter.into_iter().filter(|c| !c.is_void()).collect();
        all.sort();
        all.dedup();
        let members = all
            .iter()
            .enumerate()
            .filter(|(i, c)| {
                !all.iter()
                    .enumerate()
                    .any(|(j, other)| j != *i && other.contains(c))
            })
            .map(|(_, c)| c.clone())
            .collect();
        CapabilitySet { members }
    }
}

impl CapabilitySet {
    /// The empty set.
    pub fn new() -> Self {
        CapabilitySet::default()
    }

    /// Whether some member contains `capability`.
    pub fn allows(&self, capability: &Capability) -> bool {
        self.members.iter().any(|m| m.contains(capability))
    }

    /// Every pairwise intersection of the two sets: what both permit.
    pub fn intersect(&self, other: &CapabilitySet) -> CapabilitySet {
        self.members
            .iter()
            .flat_map(|a| other.members.iter().filter_map(move |b| a.intersect(b)))
            .collect()
    }

    /// Whether each member is contained in some member of `other`.
    pub fn is_subset_of(&self, other: &CapabilitySet) -> bool {
        self.members.iter().all(|m| other.allows(m))
    }

    /// The members, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Capability> {
        self.members.iter()
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Node {
    parent: Option<String>,
    children: BTreeSet<String>,
    held: CapabilitySet,
    revoked: Vec<Capability>,
}

/// Agents, who spawned whom, and what each holds.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AgentTree {
    agents: BTreeMap<String, Node>,
}

impl AgentTree {
    /// An empty tree.
    pub fn new() -> Self {
        AgentTree::default()
    }

    /// Adds an agent with no parent, holding `capabilities`.
    pub fn add_root(
        &mut self,
        agent: impl Into<String>,
        capabilities: CapabilitySet,
    ) -> Result<(), CapabilityError> {
        let agent = agent.into();
        if self.agents.contains_key(&agent) {
            return Err(CapabilityError::AddRoot { agent });
        }
        self.agents.insert(
            agent,
            Node {
                parent: None,
                children: BTreeSet::new(),
                held: capabilities,
                revoked: Vec::new(),
            },
        );
        Ok(())
    }

    /// Adds `child` below `parent`, holding the intersection of `requested`
    /// and what `parent` holds, and inheriting everything revoked from
    /// `parent`. Returns what the child received.
    pub fn spawn(
        &mut self,
        parent: &str,
        child: impl Into<String>,
        requested: &CapabilitySet,
    ) -> Result<&CapabilitySet, CapabilityError> {
        let child = child.into();
        let fail = |reason: &str| CapabilityError::Spawn {
            parent: parent.to_owned(),
            child: child.clone(),
            reason: reason.to_owned(),
        };
        if self.agents.contains_key(&child) {
            return Err(fail("an agent with that id already exists (pick a new id)"));
        }
        let Some(p) = self.agents.get_mut(parent) else {
            return Err(fail("the parent is not in the tree (add it first)"));
        };
        p.children.insert(child.clone());
        let revoked = p.revoked.clone();
        let held: CapabilitySet = requested
            .intersect(&p.held)
            .members
            .into_iter()
            .filter(|c| !revoked.iter().any(|r| r.contains(c)))
            .collect();
        let node = self.agents.entry(child).or_insert(Node {
            parent: Some(parent.to_owned()),
            children: BTreeSet::new(),
            held,
            revoked,
        });
        Ok(&node.held)
    }

    /// Takes `capability` from `agent` and from every descendant. Members
    /// wholly inside it are dropped; members that merely overlap it stay,
    /// but [`allows`](Self::allows) refuses any part of the revoked
    /// capability from then on. Returns the agents affected, in order.
    pub fn revoke(
        &mut self,
        agent: &str,
        capability: &Capability,
    ) -> Result<Vec<String>, CapabilityError> {
        if !self.agents.contains_key(agent) {
            return Err(CapabilityError::Revoke {
                agent: agent.to_owned(),
            });
        }
        let affected = self.subtree(agent);
        for id in &affected {
            if let Some(node) = self.agents.get_mut(id) {
                node.held = node
                    .held
                    .members
                    .iter()
                    .filter(|c| !capability.contains(c))
                    .cloned()
                    .collect();
                if !node.revoked.contains(capability) {
                    node.revoked.push(capability.clone());
                }
            }
        }
        Ok(affected)
    }

    /// Whether `agent` may use `capability`: some held capability contains
    /// it and nothing revoked from the agent overlaps it. An unknown agent
    /// may use nothing.
    pub fn allows(&self, agent: &str, capability: &Capability) -> bool {
        self.agents.get(agent).is_some_and(|node| {
            node.held.allows(capability) && !node.revoked.iter().any(|r| r.overlaps(capability))
        })
    }

    /// What `agent` holds (before revocations that only overlap a member).
    pub fn held(&self, agent: &str) -> Option<&CapabilitySet> {
        self.agents.get(agent).map(|n| &n.held)
    }

    /// What has been revoked from `agent` or its ancestors.
    pub fn revoked(&self, agent: &str) -> Option<&[Capability]> {
        self.agents.get(agent).map(|n| n.revoked.as_slice())
    }

    /// The agent that spawned `agent`.
    pub fn parent(&self, agent: &str) -> Option<&str> {
        self.agents.get(agent)?.parent.as_deref()
    }

    /// `agent` and all its descendants, in order (depth first, children
    /// sorted).
    pub fn subtree(&self, agent: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![agent.to_owned()];
        while let Some(id) = stack.pop() {
            if let Some(node) = self.agents.get(&id) {
                stack.extend(node.children.iter().rev().cloned());
                out.push(id);
            }
        }
        out
    }

    /// Removes `agent` and its descendants (when they exit). Returns the ids
    /// removed.
    pub fn remove(&mut self, agent: &str) -> Vec<String> {
        let removed = self.subtree(agent);
        if let Some(parent) = self.parent(agent).map(str::to_owned)
            && let Some(p) = self.agents.get_mut(&parent)
        {
            p.children.remove(agent);
        }
        for id in &removed {
            self.agents.remove(id);
        }
        removed
    }

    /// All agent ids, in order.
    pub fn agents(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(caps: &[Capability]) -> CapabilitySet {
        caps.iter().cloned().collect()
    }

    fn net(s: &str) -> Capability {
        Capability::Net(NetDest::parse(s).unwrap())
    }

    #[test]
    fn path_intersection_is_by_component() {
        let rw = Access::READ_WRITE;
        let a = Capability::path("/home/a", rw);
        assert_eq!(
            Capability::path("/home/a/src", rw).intersect(&a),
            Some(Capability::path("/home/a/src", rw))
        );
        assert_eq!(Capability::path("/home", rw).intersect(&a), Some(a.clone()));
        assert_eq!(Capability::path("/home/ab", rw).intersect(&a), None);
        assert_eq!(
            Capability::path("/home", Access::READ).intersect(&a),
            Some(Capability::path("/home/a", Access::READ))
        );
        assert_eq!(Capability::path("/home", Access::EXEC).intersect(&a), None);
        assert!(a.contains(&Capability::path("/home/a/x/../y", Access::READ)));
        assert!(!a.contains(&Capability::path("/home/a/../b", Access::READ)));
    }

    #[test]
    fn spawn_attenuates() {
        let mut tree = AgentTree::new();
        tree.add_root(
            "root",
            set(&[
                Capability::path("/home/a", Access::READ_WRITE),
                Capability::tool("read_file"),
                net("10.0.0.0/8"),
            ]),
        )
        .unwrap();
        let got = tree
            .spawn(
                "root",
                "child",
                &set(&[
                    Capability::path("/home", Access::READ_WRITE),
                    Capability::path("/etc", Access::READ),
                    Capability::tool("*"),
                    Capability::tool("delete_file"),
                    net("10.1.0.0/16:443"),
                    net("0.0.0.0/0"),
                ]),
            )
            .unwrap()
            .clone();
        assert_eq!(
            got,
            set(&[
                Capability::path("/home/a", Access::READ_WRITE),
                Capability::tool("read_file"),
                net("10.0.0.0/8"),
                net("10.1.0.0/16:443"),
            ])
        );
        // 10.1.0.0/16:443 is inside 10.0.0.0/8 (any port), so the set keeps
        // only the larger one.
        assert_eq!(got.len(), 3);
        assert!(got.is_subset_of(tree.held("root").unwrap()));
        assert!(matches!(
            tree.spawn("nobody", "x", &CapabilitySet::new()),
            Err(CapabilityError::Spawn { .. })
        ));
        assert!(matches!(
            tree.spawn("root", "child", &CapabilitySet::new()),
            Err(CapabilityError::Spawn { .. })
        ));
        assert!(matches!(
            tree.add_root("root", CapabilitySet::new()),
            Err(CapabilityError::AddRoot { .. })
        ));
    }

    #[test]
    fn revocation_reaches_descendants_and_sticks() {
        let mut tree = AgentTree::new();
        tree.add_root("p", set(&[Capability::path("/home/a", Access::READ_WRITE)]))
            .unwrap();
        tree.spawn(
            "p",
            "c",
            &set(&[Capability::path("/home/a", Access::READ_WRITE)]),
        )
        .unwrap();
        tree.spawn(
            "c",
            "g",
            &set(&[Capability::path("/home/a/src", Access::READ_WRITE)]),
        )
        .unwrap();
        let secret = Capability::path("/home/a/secret", Access::WRITE);
        let affected = tree.revoke("c", &secret).unwrap();
        assert_eq!(affected, vec!["c".to_owned(), "g".to_owned()]);
        let write_secret = Capability::path("/home/a/secret/key", Access::WRITE);
        let read_secret = Capability::path("/home/a/secret/key", Access::READ);
        assert!(tree.allows("p", &write_secret), "the parent keeps it");
        assert!(!tree.allows("c", &write_secret));
        assert!(tree.allows("c", &read_secret), "only write was revoked");
        assert!(!tree.allows("c", &Capability::path("/home/a", Access::WRITE)));
        assert!(tree.allows("c", &Capability::path("/home/a/src", Access::WRITE)));
        // A new child of c cannot get it back.
        tree.spawn(
            "c",
            "late",
            &set(&[Capability::path("/home", Access::READ_WRITE)]),
        )
        .unwrap();
        assert!(!tree.allows("late", &write_secret));
        assert!(tree.allows("late", &read_secret));
        assert!(
            !tree.allows("stranger", &read_secret),
            "unknown agents get nothing"
        );
        assert_eq!(
            tree.remove("c"),
            vec!["c".to_owned(), "g".to_owned(), "late".to_owned()]
        );
        assert_eq!(tree.agents().collect::<Vec<_>>(), vec!["p"]);
    }

    #[test]
    fn access_round_trips() {
        assert_eq!(Access::parse("rw").unwrap(), Access::READ_WRITE);
        assert_eq!(Access::parse("xr").unwrap().to_string(), "rx");
        assert!(Access::parse("rq").is_err());
    }
}
