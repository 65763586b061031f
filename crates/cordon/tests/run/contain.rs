//! `cordon contain`: an active run is found, contained, and its ledger tells the story.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// Waits until `sleepers` processes of the run are up, then finds the run's id in the state
/// directory (the entry that names this area's ledger).
fn find_run(area: &Area, marker: &str, sleepers: usize) -> String {
    for _ in 0..500 {
        if host_sleepers(marker).len() >= sleepers {
            let list = Command::new(env!("CARGO_BIN_EXE_cordon"))
                .args(["contain", "--list"])
                .output()
                .unwrap();
            let found = stdout(&list).lines().find_map(|line| {
                let id = line.split('\t').next()?;
                let state = std::fs::read_to_string(format!("/run/cordon/runs/{id}.json")).ok()?;
                state
                    .contains(area.path("ledger").to_str().unwrap())
                    .then(|| id.to_owned())
            });
            if let Some(id) = found {
                return id;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the run never appeared in the state directory");
}

#[test]
fn contain_stops_an_active_run_and_records_every_step() {
    if !privileged("contain_stops_an_active_run_and_records_every_step") {
        return;
    }
    let area = Area::new();
    let marker = format!("9{}.777", std::process::id() % 1000);
    let script = format!("for i in 1 2 3; do sleep {marker} & done; exec sleep {marker}");
    let run = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["run", "--ledger"])
        .arg(area.path("ledger"))
        .arg("--report")
        .arg(area.path("report.json"))
        .args(["--", "/bin/sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run_id = find_run(&area, &marker, 4);
    // Negative control: the run's processes are alive before containment.
    assert_eq!(host_sleepers(&marker).len(), 4);

    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["contain", &run_id])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["complete"], true, "{report}");
    assert_eq!(report["verified_dead"], true);
    assert!(
        report["processes"].as_array().unwrap().len() >= 5,
        "{report}"
    );
    assert!(
        host_sleepers(&marker).is_empty(),
        "containment left processes alive"
    );

    let run = run.wait_with_output().unwrap();
    assert_eq!(run.status.code(), Some(137), "{run:?}");
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(area.path("report.json")).unwrap()).unwrap();
    assert_eq!(rep["verdict"], "KILLED");
    assert_eq!(rep["reasons"][0], "killed: containment", "{rep}");

    let ledger = std::fs::read_to_string(area.path("ledger/ledger.jsonl")).unwrap();
    let kinds: Vec<String> = ledger
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    for k in [
        "run.start",
        "contain.start",
        "contain.step",
        "contain.end",
        "run.end",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
    }
    assert_eq!(kinds.iter().filter(|k| *k == "contain.step").count(), 5);
    // Contained runs are gone from the state directory.
    assert!(!std::path::Path::new(&format!("/run/cordon/runs/{run_id}.json")).exists());
    // An unknown run is unusable input.
    let none = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["contain", "r0-00000000"])
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(2), "{none:?}");
}

#[test]
fn contain_blocks_the_egress_of_an_allowlisted_run_first() {
    if !privileged("contain_blocks_the_egress_of_an_allowlisted_run_first") {
        return;
    }
    let area = Area::new();
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let marker = format!("6{}.555", std::process::id() % 1000);
    let run = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["run", "--ledger"])
        .arg(area.path("ledger"))
        .args(["--net", &format!("allow:127.0.0.1/32:{port}")])
        .args(["--", "/bin/sh", "-c", &format!("exec sleep {marker}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run_id = find_run(&area, &marker, 1);
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["contain", &run_id])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["steps"][0]["action"], "egress-block");
    assert_eq!(report["steps"][0]["state"], "ENFORCED", "{report}");
    assert!(
        report["steps"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("read back"),
        "{report}"
    );
    let status = run.wait_with_output().unwrap().status;
    assert_eq!(status.code(), Some(137));
    drop(server);
}
