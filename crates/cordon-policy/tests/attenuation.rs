//! Capabilities: a child never holds what its parent lacks, and revocation
//! reaches every descendant, checked on random trees.

use cordon_policy::{Access, AgentTree, Capability, CapabilitySet, NetDest};
use proptest::prelude::*;

fn arb_path() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec!["a", "ab", "b", "src", ".."]),
        0..4,
    )
    .prop_map(|parts| format!("/{}", parts.join("/")))
}

fn arb_access() -> impl Strategy<Value = Access> {
    prop::sample::select(vec!["r", "w", "x", "rw", "rx", "rwx"])
        .prop_map(|s| Access::parse(s).unwrap())
}

fn arb_capability() -> impl Strategy<Value = Capability> {
    prop_oneof![
        prop::sample::select(vec!["*", "read_file", "write_file", "run"])
            .prop_map(Capability::tool),
        (arb_path(), arb_access()).prop_map(|(p, a)| Capability::path(p, a)),
        prop::sample::select(vec![
            "10.0.0.0/8",
            "10.1.0.0/16",
            "10.1.0.0/16:443",
            "10.1.2.3",
            "192.168.0.0/16",
            "0.0.0.0/0",
            "::/0",
            "2001:db8::/32",
            "api.example.com:443",
            "api.example.com",
        ])
        .prop_map(|s| Capability::Net(NetDest::parse(s).unwrap())),
    ]
}

fn arb_set() -> impl Strategy<Value = CapabilitySet> {
    prop::collection::vec(arb_capability(), 0..6).prop_map(|v| v.into_iter().collect())
}

#[derive(Debug, Clone)]
enum Op {
    /// Spawn a child of agent `parent % n` asking for a set.
    Spawn(usize, CapabilitySet),
    /// Revoke a capability from agent `agent % n`.
    Revoke(usize, Capability),
}

fn arb_ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            3 => (any::<usize>(), arb_set()).prop_map(|(p, s)| Op::Spawn(p, s)),
            1 => (any::<usize>(), arb_capability()).prop_map(|(a, c)| Op::Revoke(a, c)),
        ],
        0..12,
    )
}

/// Builds a tree from a root holding `root` by applying `ops`; returns the
/// tree, agent ids in creation order, and the revocations made (agent,
/// capability).
fn build(root: CapabilitySet, ops: &[Op]) -> (AgentTree, Vec<String>, Vec<(String, Capability)>) {
    let mut tree = AgentTree::new();
    tree.add_root("root", root).unwrap();
    let mut ids = vec!["root".to_owned()];
    let mut revoked = Vec::new();
    for op in ops {
        match op {
            Op::Spawn(p, set) => {
                let parent = ids[p % ids.len()].clone();
                let child = format!("agent{}", ids.len());
                tree.spawn(&parent, child.clone(), set).unwrap();
                ids.push(child);
            }
            Op::Revoke(a, cap) => {
                let agent = ids[a % ids.len()].clone();
                tree.revoke(&agent, cap).unwrap();
                revoked.push((agent, cap.clone()));
            }
        }
    }
    (tree, ids, revoked)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn a_child_never_holds_what_its_parent_lacks(
        root in arb_set(),
        ops in arb_ops(),
        queries in prop::collection::vec(arb_capability(), 1..12),
    ) {
        let (tree, ids, _) = build(root, &ops);
        for id in &ids {
            let Some(parent) = tree.parent(id) else { continue };
            prop_assert!(tree.held(id).unwrap().is_subset_of(tree.held(parent).unwrap()));
            for q in &queries {
                prop_assert!(
                    !tree.allows(id, q) || tree.allows(parent, q),
                    "{id} may use {q} but its parent {parent} may not"
                );
            }
        }
    }

    #[test]
    fn revocation_reaches_every_descendant_for_good(
        root in arb_set(),
        ops in arb_ops(),
        queries in prop::collection::vec(arb_capability(), 1..12),
        later in arb_set(),
    ) {
        let (mut tree, ids, revoked) = build(root, &ops);
        // Children spawned after the revocations, below every agent, asking
        // for everything, must not get any revoked part back.
        for (i, id) in ids.iter().enumerate() {
            let mut ask: Vec<Capability> = later.iter().cloned().collect();
            ask.extend(revoked.iter().map(|(_, c)| c.clone()));
            tree.spawn(id, format!("late{i}"), &ask.into_iter().collect()).unwrap();
        }
        for (agent, cap) in &revoked {
            for d in tree.subtree(agent) {
                prop_assert!(!tree.allows(&d, cap), "{d} below {agent} may still use {cap}");
                for q in queries.iter().filter(|q| q.overlaps(cap)) {
                    prop_assert!(!tree.allows(&d, q), "{d} below {agent} may use {q}, part of revoked {cap}");
                }
            }
        }
    }

    #[test]
    fn intersection_is_commutative_idempotent_and_exact(
        a in arb_set(),
        b in arb_set(),
        queries in prop::collection::vec(arb_capability(), 1..16),
    ) {
        let ab = a.intersect(&b);
        prop_assert_eq!(&ab, &b.intersect(&a));
        prop_assert_eq!(&a.intersect(&a), &a);
        prop_assert!(ab.is_subset_of(&a) && ab.is_subset_of(&b));
        for q in &queries {
            prop_assert_eq!(ab.allows(q), a.allows(q) && b.allows(q), "query {}", q);
        }
    }
}

#[test]
fn path_prefixes_compare_by_component() {
    let mut tree = AgentTree::new();
    let parent: CapabilitySet = [Capability::path("/home/a", Access::READ_WRITE)]
        .into_iter()
        .collect();
    tree.add_root("p", parent).unwrap();
    let ask: CapabilitySet = [
        Capability::path("/home/ab", Access::READ_WRITE),
        Capability::path("/home/a/src", Access::READ),
        Capability::path("/home", Access::WRITE),
    ]
    .into_iter()
    .collect();
    let got = tree.spawn("p", "c", &ask).unwrap();
    let got: Vec<String> = got.iter().map(ToString::to_string).collect();
    assert_eq!(got, ["path /home/a (w)", "path /home/a/src (r)"]);
    assert!(!tree.allows("c", &Capability::path("/home/ab/x", Access::READ)));
}
