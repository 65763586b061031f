//! Egress verification catches a state changed behind cordon's back, as another root process
//! could change it: a link detached, a link re-pointed to a permissive program, the allowlist
//! widened. Each starts from a verification that passes (the negative control).

use std::os::fd::AsFd;
use std::path::Path;

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, Map, MapData};
use aya::programs::CgroupSockAddr;
use cordon_bpf::wire::{ALLOW_VAL_LEN, AllowVal};
use cordon_bpf::{EGRESS_OBJECT, VerifyState};
use cordon_bpf::{bpffs, shared, sys};

use crate::common::*;

fn enforced_egress(cg: &TestCgroup) -> EgressGuard {
    let mut eg = EgressGuard::attach(cg, &[allow("127.0.0.2/32", None)]);
    let v = eg.get().verify();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
    eg
}

#[test]
fn a_detached_program_fails_verification() {
    if !privileged("a_detached_program_fails_verification") {
        return;
    }
    let cg = TestCgroup::new();
    let mut eg = enforced_egress(&cg);
    let link = sys::obj_get(&eg.get().pin_dir().join("connect4")).unwrap();
    sys::link_detach(link.as_fd()).unwrap();
    let v = eg.get().verify_attached();
    assert_eq!(v.state, VerifyState::VerificationFailed);
    assert!(
        v.problems
            .iter()
            .any(|p| p.starts_with("connect4: program")),
        "{:?}",
        v.problems
    );
    assert!(
        v.problems.iter().all(|p| p.starts_with("connect4")),
        "{:?}",
        v.problems
    );
}

#[test]
fn a_replaced_program_fails_verification() {
    if !privileged("a_replaced_program_fails_verification") {
        return;
    }
    let cg = TestCgroup::new();
    let mut eg = enforced_egress(&cg);
    // A copy of the same program whose maps admit everything for this run: its own
    // map-in-maps hold, at the run's slot, a trie with 0.0.0.0/0 and an unblocked control
    // array. It shares the attachment's cgroup storage (`run_of`, which names the slot): Linux
    // 6.18 re-points a cgroup link only at a program using the same cgroup storage maps as the
    // one it runs, and refuses (EINVAL) a copy with its own `run_of` or a program with none,
    // which older kernels took. So this is the swap an attacker with root makes.
    let generation = shared::generation_dir(Path::new(bpffs::DEFAULT_ROOT));
    let run_of_pin = generation.join(shared::RUN_OF);
    let run_of_id = {
        // The pin must exist (aya would otherwise create and pin a new map there), and be the
        // storage the attached program uses.
        let run_of = sys::RawMap::open(&run_of_pin).unwrap();
        let attached = sys::obj_get(&generation.join("connect4")).unwrap();
        let attached = sys::prog_info(attached.as_fd()).unwrap();
        assert!(
            attached.map_ids.contains(&run_of.id()),
            "connect4 does not use {}",
            run_of_pin.display()
        );
        run_of.id()
    };
    let mut bpf = aya::EbpfLoader::new()
        .map_pin_path(shared::RUN_OF, run_of_pin.as_path())
        .load(EGRESS_OBJECT)
        .unwrap();
    let any = AllowVal {
        any_port: true,
        ports: vec![],
    }
    .encode();
    let outer = |bpf: &aya::Ebpf, name: &str| {
        let Some(aya::maps::Map::ArrayOfMaps(m)) = bpf.map(name) else {
            panic!("no map-in-maps {name} in the object")
        };
        sys::RawMap::from_fd(m.fd().as_fd().try_clone_to_owned().unwrap()).unwrap()
    };
    let trie = sys::map_create(
        &sys::MapSpec {
            map_type: sys::MapType::LpmTrie,
            key_size: 8,
            value_size: u32::try_from(ALLOW_VAL_LEN).unwrap(),
            max_entries: 1024,
            flags: sys::BPF_F_NO_PREALLOC,
        },
        "permissive",
    )
    .unwrap();
    let control = sys::map_create(
        &sys::MapSpec {
            map_type: sys::MapType::Array,
            key_size: 4,
            value_size: 4,
            max_entries: 2,
            flags: 0,
        },
        "unblocked",
    )
    .unwrap();
    {
        let slot = eg.get().slot();
        outer(&bpf, "allow4_of")
            .set_slot(slot, trie.as_fd())
            .unwrap();
        outer(&bpf, "control_of")
            .set_slot(slot, control.as_fd())
            .unwrap();
    }
    let mut all: LpmTrie<_, [u8; 4], [u8; ALLOW_VAL_LEN]> =
        LpmTrie::try_from(Map::LpmTrie(MapData::from_fd(trie).unwrap())).unwrap();
    all.insert(&Key::new(0, [0u8; 4]), any, 0).unwrap();
    let prog: &mut CgroupSockAddr = bpf.program_mut("connect4").unwrap().try_into().unwrap();
    prog.load().unwrap();
    let prog_fd = prog.fd().unwrap().as_fd();
    let replacement = sys::prog_info(prog_fd).unwrap();
    assert!(
        replacement.map_ids.contains(&run_of_id),
        "{:?}",
        replacement.map_ids
    );
    let link = sys::obj_get(&eg.get().pin_dir().join("connect4")).unwrap();
    sys::link_update(link.as_fd(), prog_fd).unwrap();
    assert_eq!(
        sys::cgroup_link_info(link.as_fd()).unwrap().prog_id,
        replacement.id,
        "the link must now run the permissive copy"
    );

    let v = eg.get().verify();
    assert_eq!(v.state, VerifyState::VerificationFailed);
    assert!(
        v.problems.iter().any(|p| p.starts_with("connect4: link")),
        "{:?}",
        v.problems
    );
    // The active probe sees it too: the IPv4 TCP connect is no longer refused.
    assert!(
        v.problems.iter().any(|p| p.starts_with("TcpConnect 127.")),
        "{:?}",
        v.problems
    );
}

#[test]
fn a_widened_allowlist_fails_verification() {
    if !privileged("a_widened_allowlist_fails_verification") {
        return;
    }
    let cg = TestCgroup::new();
    let mut eg = enforced_egress(&cg);
    let pin = eg.get().pin_dir().join("allow4");
    let data = MapData::from_pin(&pin).unwrap();
    let mut trie: LpmTrie<_, [u8; 4], [u8; ALLOW_VAL_LEN]> =
        LpmTrie::try_from(Map::LpmTrie(data)).unwrap();
    let any = AllowVal {
        any_port: true,
        ports: vec![],
    }
    .encode();
    trie.insert(&Key::new(0, [0u8; 4]), any, 0).unwrap();
    let v = eg.get().verify();
    assert_eq!(v.state, VerifyState::VerificationFailed);
    assert!(
        v.problems
            .iter()
            .any(|p| p.starts_with("allowlist altered")),
        "{:?}",
        v.problems
    );
    assert!(
        v.problems.iter().any(|p| p.contains("was not refused")),
        "{:?}",
        v.problems
    );
}

#[test]
fn a_cleared_block_fails_verification() {
    if !privileged("a_cleared_block_fails_verification") {
        return;
    }
    let cg = TestCgroup::new();
    let mut eg = enforced_egress(&cg);
    eg.get().block_all().unwrap();
    assert!(eg.get().blocked().unwrap());
    // Negative control: blocked, and verification agrees.
    let v = eg.get().verify_attached();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
    let data = MapData::from_pin(Path::new(&eg.get().pin_dir().join("control"))).unwrap();
    let mut control: Array<_, u32> = Array::try_from(Map::Array(data)).unwrap();
    control.set(0, 0, 0).unwrap();
    assert!(
        !eg.get().blocked().unwrap(),
        "blocked() must read the kernel's map"
    );
}
