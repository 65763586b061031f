//! The pinned boundary outlives cordon (`kill -9`), can be blocked from another process, and
//! is cleaned up only once its cgroup is gone.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cordon_bpf::probe::{ProbeKind, ProbeResult};
use cordon_bpf::{block_pinned, cleanup_stale};

use crate::common::*;

const ROOT: &str = "/sys/fs/bpf";

fn stale_entry(run_id: &str) -> Option<cordon_bpf::StaleRun> {
    cleanup_stale(Path::new(ROOT))
        .unwrap()
        .into_iter()
        .find(|s| s.run_id == run_id)
}

#[test]
fn the_pinned_block_survives_kill_9_and_is_cleaned_after_the_cgroup() {
    if !privileged("the_pinned_block_survives_kill_9_and_is_cleaned_after_the_cgroup") {
        return;
    }
    let allowed = TcpServer::start("127.0.0.2");
    let refused = TcpServer::start("127.0.0.3");
    let cg = TestCgroup::new();
    let control = TestCgroup::new();
    let run_id = unique("persist");
    let mut cordon = Command::new(helper())
        .args([
            "attach-and-wait",
            &run_id,
            cg.path.to_str().unwrap(),
            "127.0.0.2/32",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn helper");
    let mut line = String::new();
    BufReader::new(cordon.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    // While the process lives, its run is not stale.
    assert_eq!(stale_entry(&run_id).map(|s| s.removed), Some(false));
    cordon.kill().unwrap(); // SIGKILL
    cordon.wait().unwrap();

    assert_eq!(
        probe_in(&cg.path, ProbeKind::TcpConnect, refused.addr),
        ProbeResult::Failed(libc::EPERM)
    );
    assert_eq!(
        probe_in(&cg.path, ProbeKind::TcpConnect, allowed.addr),
        ProbeResult::Ok
    );
    assert_eq!(
        probe_in(&control.path, ProbeKind::TcpConnect, refused.addr),
        ProbeResult::Ok
    );
    // The links still hold the cgroup: cleanup keeps them.
    let kept = stale_entry(&run_id).expect("run directory");
    assert!(!kept.removed, "{kept:?}");

    // The allowed connection is torn down before the block: a block cuts every packet, the
    // teardown's too, and a socket stranded half-closed would keep the cgroup (and so its
    // links) alive for tcp_fin_timeout after the cgroup is removed.
    assert!(allowed.wait_closed(1, Duration::from_secs(5)));
    // Block-all from another process, through the pinned control map.
    block_pinned(Path::new(ROOT), &run_id).unwrap();
    assert_eq!(
        probe_in(&cg.path, ProbeKind::TcpConnect, allowed.addr),
        ProbeResult::Failed(libc::EPERM)
    );

    // Once the cgroup is gone, the kernel detaches the links and cleanup removes the pins.
    let cg_path = cg.path.clone();
    drop(cg);
    assert!(!cg_path.exists());
    let start = Instant::now();
    loop {
        match stale_entry(&run_id) {
            None => break,
            Some(s) if s.removed => break,
            Some(s) => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "never stale: {s:?}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    assert!(!cordon_bpf::bpffs::run_dir(Path::new(ROOT), &run_id).exists());
}

#[test]
fn bpffs_is_mounted_once_when_absent_and_pins_go_there() {
    if !privileged("bpffs_is_mounted_once_when_absent_and_pins_go_there") {
        return;
    }
    use cordon_bpf::bpffs::{Mounted, ensure_mounted};
    let base = std::env::temp_dir().join(unique("cordon-bpffs"));
    let root = base.join("bpf");
    std::fs::create_dir_all(&root).unwrap();
    // Parallel starts on a host without bpffs: exactly one mounts it.
    let results: Vec<Mounted> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| ensure_mounted(&root).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mounted_now = results.iter().filter(|m| **m == Mounted::Now).count();
    let cg = TestCgroup::new();
    let run_id = unique("bpffs");
    let attached = cordon_bpf::Egress::attach_at(
        &root,
        &run_id,
        &cg.path,
        &[allow("127.0.0.2/32", None)],
        None,
    );
    let pinned = cordon_bpf::bpffs::run_dir(&root, &run_id)
        .join("egress/connect4")
        .exists();
    let released = attached.map(|e| e.release());
    let c = std::ffi::CString::new(root.to_str().unwrap()).unwrap();
    // SAFETY: umount2 of the mount made above, by a NUL-terminated path alive for the call.
    let unmounted = unsafe { libc::umount2(c.as_ptr(), 0) };
    std::fs::remove_dir_all(&base).unwrap();
    assert_eq!(mounted_now, 1, "{results:?}");
    assert!(pinned, "no pin under the new bpffs");
    assert!(matches!(released, Ok(Ok(()))), "{released:?}");
    assert_eq!(unmounted, 0);
}
