//! Allow and deny for TCP, UDP, IPv4, IPv6, mapped addresses, raw sockets; block-all.

use std::time::Duration;

use cordon_bpf::VerifyState;
use cordon_bpf::probe::{ProbeKind, ProbeResult};

use crate::common::*;

#[test]
fn tcp_connect_v4_allowed_and_refused() {
    if !privileged("tcp_connect_v4_allowed_and_refused") {
        return;
    }
    let allowed = TcpServer::start("127.0.0.2");
    let other = TcpServer::start("127.0.0.3");
    let cg = TestCgroup::new();
    let control = TestCgroup::new();
    // Negative control first: both reachable from a cgroup without programs.
    assert_eq!(
        probe_in(&control.path, ProbeKind::TcpConnect, other.addr),
        ProbeResult::Ok
    );
    let mut eg = EgressGuard::attach(&cg, &[allow("127.0.0.2/32", None)]);
    assert_eq!(
        probe_in(&cg.path, ProbeKind::TcpConnect, allowed.addr),
        ProbeResult::Ok
    );
    assert_eq!(
        probe_in(&cg.path, ProbeKind::TcpConnect, other.addr),
        ProbeResult::Failed(libc::EPERM)
    );
    assert_eq!(
        probe_in(&control.path, ProbeKind::TcpConnect, other.addr),
        ProbeResult::Ok
    );
    let v = eg.get().verify();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
    let _ = Duration::ZERO;
}
