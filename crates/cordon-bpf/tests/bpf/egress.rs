//! Allow and deny for TCP, UDP, IPv4, IPv6, mapped addresses, raw sockets; block-all; release
//! and fail-closed attach. Every refusal is EPERM at once, and every test has its negative
//! control: the same probe from a cgroup without the programs succeeds.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use cordon_bpf::probe::{ProbeKind, ProbeResult};
use cordon_bpf::sys::{self, AttachPoint};
use cordon_bpf::{Egress, EgressError, VerifyState};

use crate::common::*;

const EPERM: ProbeResult = ProbeResult::Failed(libc::EPERM);

#[test]
fn tcp_connect_v4_allowed_and_refused() {
    if !privileged("tcp_connect_v4_allowed_and_refused") {
        return;
    }
    let allowed = TcpServer::start("127.0.0.2");
    let other = TcpServer::start("127.0.0.3");
    let cg = TestCgroup::new();
    let control = TestCgroup::new();
    let mut eg = EgressGuard::attach(&cg, &[allow("127.0.0.2/32", None)]);
    assert_eq!(
        probe_in(&cg.path, ProbeKind::TcpConnect, allowed.addr),
        ProbeResult::Ok
    );
    assert_eq!(probe_in(&cg.path, ProbeKind::TcpConnect, other.addr), EPERM);
    assert_eq!(
        probe_in(&control.path, ProbeKind::TcpConnect, other.addr),
        ProbeResult::Ok
    );
    let v = eg.get().verify();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
    let stats = eg.get().stats().unwrap();
    assert!(
        stats.connect_refused >= 1 && stats.connect_allowed >= 1,
        "{stats:?}"
    );
}

#[test]
fn tcp_connect_v6_allowed_and_refused_by_port() {
    if !privileged("tcp_connect_v6_allowed_and_refused_by_port") {
        return;
    }
    let allowed = TcpServer::start("::1");
    let other = TcpServer::start("::1");
    let cg = TestCgroup::new();
    let control = TestCgroup::new();
    let _eg = EgressGuard::attach(&cg, &[allow("::1/128", Some(allowed.addr.port()))]);
    assert_eq!(
        probe_in(&cg.path, ProbeKind::TcpConnect, allowed.addr),
        ProbeResult::Ok
    );
    assert_eq!(probe_in(&cg.path, ProbeKind::TcpConnect, other.addr), EPERM);
    assert_eq!(
        probe_in(&control.path, ProbeKind::TcpConnect, other.addr),
        ProbeResult::Ok
    );
}

#[test]
fn udp_v4_sendto_and_connect() {
    if !privileged("udp_v4_sendto_and_connect") {
        return;
    }
    let allowed = UdpServer::start("127.0.0.2");
    let other = UdpServer::start("127.0.0.3");
    let cg = TestCgroup::new();
    let control = TestCgroup::new();
    let _eg = EgressGuard::attach(&cg, &[allow("127.0.0.0/30", Some(allowed.addr.port()))]);
    // Unconnected sendto: the allowed datagram arrives, the refused one fails with EPERM and
    // does not.
    assert_eq!(
        probe_in(&cg.path, ProbeKind::UdpSendto, allowed.addr),
        ProbeResult::Ok
    );
    assert_eq!(allowed.count(Duration::from_millis(300)), 1);
    assert_eq!(probe_in(&cg.path, ProbeKind::UdpSendto, other.addr), EPERM);
    assert_eq!(other.count(Duration::from_millis(300)), 0);
    // Connected UDP: the connect itself is judged.
    assert_eq!(
        probe_in(&cg.path, ProbeKind::UdpConnect, allowed.addr),
        ProbeResult::Ok
    );
    assert_eq!(probe_in(&cg.path, ProbeKind::UdpConnect, other.addr), EPERM);
    // Negative control.
    assert_eq!(
        probe_in(&control.path, ProbeKind::UdpSendto, other.addr),
        ProbeResult::Ok
    );
    assert_eq!(other.count(Duration::from_millis(300)), 1);
    assert_eq!(
        probe_in(&control.path, ProbeKind::UdpConnect, other.addr),
        ProbeResult::Ok
    );
}

#[test]
fn udp_v6_sendto_and_connect() {
    if !privileged("udp_v6_sendto_and_connect") {
        return;
    }
    let allowed = UdpServer::start("::1");
    let other = UdpServer::start("::1");
    let cg = TestCgroup::new();
    let control = TestCgroup::new();
    let _eg = EgressGuard::attach(&cg, &[allow("::1/128", Some(allowed.addr.port()))]);
    assert_eq!(
        probe_in(&cg.path, ProbeKind::UdpSendto, allowed.addr),
        ProbeResult::Ok
    );
    assert_eq!(allowed.count(Duration::from_millis(300)), 1);
    assert_eq!(probe_in(&cg.path, ProbeKind::UdpSendto, other.addr), EPERM);
    assert_eq!(other.count(Duration::from_millis(300)), 0);
    assert_eq!(probe_in(&cg.path, ProbeKind::UdpConnect, other.addr), EPERM);
    assert_eq!(
        probe_in(&control.path, ProbeKind::UdpSendto, other.addr),
        ProbeResult::Ok
    );
    assert_eq!(other.count(Duration::from_millis(300)), 1);
}

#[test]
fn ipv4_mapped_destinations_follow_the_ipv4_list() {
    if !privileged("ipv4_mapped_destinations_follow_the_ipv4_list") {
        return;
    }
    let allowed = TcpServer::start("127.0.0.2");
    let other = TcpServer::start("127.0.0.3");
    let udp_other = UdpServer::start("127.0.0.3");
    let mapped = |a: std::net::SocketAddr| sa(&format!("[::ffff:{}]:{}", a.ip(), a.port()));
    let cg = TestCgroup::new();
    let control = TestCgroup::new();
    // Only IPv4 rules: the IPv6 list is empty, so a mapped destination can only pass through
    // the IPv4 list.
    let _eg = EgressGuard::attach(&cg, &[allow("127.0.0.2/32", None)]);
    assert_eq!(
        probe_in(&cg.path, ProbeKind::TcpConnect, mapped(allowed.addr)),
        ProbeResult::Ok
    );
    assert_eq!(
        probe_in(&cg.path, ProbeKind::TcpConnect, mapped(other.addr)),
        EPERM
    );
    assert_eq!(
        probe_in(&cg.path, ProbeKind::UdpSendto, mapped(udp_other.addr)),
        EPERM
    );
    assert_eq!(udp_other.count(Duration::from_millis(300)), 0);
    assert_eq!(
        probe_in(&control.path, ProbeKind::TcpConnect, mapped(other.addr)),
        ProbeResult::Ok
    );
    assert_eq!(
        probe_in(&control.path, ProbeKind::UdpSendto, mapped(udp_other.addr)),
        ProbeResult::Ok
    );
}

#[test]
fn a_mapped_rule_allows_ipv4_destinations() {
    if !privileged("a_mapped_rule_allows_ipv4_destinations") {
        return;
    }
    let server = TcpServer::start("127.0.0.2");
    let other = TcpServer::start("127.0.0.3");
    let cg = TestCgroup::new();
    let _eg = EgressGuard::attach(&cg, &[allow("::ffff:127.0.0.2/128", None)]);
    assert_eq!(
        probe_in(&cg.path, ProbeKind::TcpConnect, server.addr),
        ProbeResult::Ok
    );
    assert_eq!(probe_in(&cg.path, ProbeKind::TcpConnect, other.addr), EPERM);
}

#[test]
fn the_unspecified_address_is_judged_as_loopback() {
    if !privileged("the_unspecified_address_is_judged_as_loopback") {
        return;
    }
    // connect(0.0.0.0) reaches a server on the local host; a rule for 0.0.0.0 must not open
    // the host's loopback services.
    let server = TcpServer::start("0.0.0.0");
    let dest = sa(&format!("0.0.0.0:{}", server.addr.port()));
    let cg = TestCgroup::new();
    let control = TestCgroup::new();
    let _eg = EgressGuard::attach(&cg, &[allow("0.0.0.0/32", None)]);
    assert_eq!(probe_in(&cg.path, ProbeKind::TcpConnect, dest), EPERM);
    assert_eq!(
        probe_in(&control.path, ProbeKind::TcpConnect, dest),
        ProbeResult::Ok
    );
}

#[test]
fn loopback_is_not_implicitly_allowed() {
    if !privileged("loopback_is_not_implicitly_allowed") {
        return;
    }
    let v4 = TcpServer::start("127.0.0.1");
    let v6 = TcpServer::start("::1");
    let cg = TestCgroup::new();
    let control = TestCgroup::new();
    let _eg = EgressGuard::attach(&cg, &[allow("192.0.2.0/24", None)]);
    assert_eq!(probe_in(&cg.path, ProbeKind::TcpConnect, v4.addr), EPERM);
    assert_eq!(probe_in(&cg.path, ProbeKind::TcpConnect, v6.addr), EPERM);
    assert_eq!(
        probe_in(&control.path, ProbeKind::TcpConnect, v4.addr),
        ProbeResult::Ok
    );
    assert_eq!(
        probe_in(&control.path, ProbeKind::TcpConnect, v6.addr),
        ProbeResult::Ok
    );
}

/// A raw ICMP socket of the test process that watches for an echo request carrying `marker`.
struct IcmpWatch(std::os::fd::OwnedFd);

impl IcmpWatch {
    fn new() -> IcmpWatch {
        use std::os::fd::FromRawFd;
        // SAFETY: socket(2) with constant arguments.
        let fd = unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::IPPROTO_ICMP,
            )
        };
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: a new descriptor, owned by nobody else.
        IcmpWatch(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    fn saw(&self, marker: &str, limit: Duration) -> bool {
        use std::os::fd::AsRawFd;
        let start = std::time::Instant::now();
        let mut buf = [0u8; 2048];
        while start.elapsed() < limit {
            let mut pfd = libc::pollfd {
                fd: self.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, 50) } <= 0 {
                continue;
            }
            // SAFETY: reading into `buf`, which has `buf.len()` writable bytes.
            let n =
                unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n > 0
                && buf[..n as usize]
                    .windows(marker.len())
                    .any(|w| w == marker.as_bytes())
            {
                return true;
            }
        }
        false
    }
}

fn raw_icmp_from(cgroup: &std::path::Path, ip: &str, marker: &str) -> String {
    let out = Command::new(helper())
        .args(["--cgroup", cgroup.to_str().unwrap(), "raw-icmp", ip, marker])
        .output()
        .expect("run helper");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn raw_sockets_are_stopped_by_the_skb_backstop() {
    if !privileged("raw_sockets_are_stopped_by_the_skb_backstop") {
        return;
    }
    let watch = IcmpWatch::new();
    let cg = TestCgroup::new();
    let control = TestCgroup::new();
    let mut eg = EgressGuard::attach(&cg, &[allow("127.0.0.2/32", None)]);
    // Raw sockets bypass the address hooks; the backstop drops the packet and the kernel
    // reports the drop to the sender as EPERM.
    let refused = unique("raw-refused");
    assert_eq!(
        raw_icmp_from(&cg.path, "127.0.0.3", &refused),
        format!("err {}", libc::EPERM)
    );
    assert!(
        !watch.saw(&refused, Duration::from_millis(500)),
        "a dropped packet arrived"
    );
    assert!(eg.get().stats().unwrap().egress_dropped >= 1);
    // An allowed destination passes the backstop.
    let allowed = unique("raw-allowed");
    assert_eq!(raw_icmp_from(&cg.path, "127.0.0.2", &allowed), "ok");
    assert!(watch.saw(&allowed, Duration::from_secs(2)));
    // Negative control: the refused packet, sent from a cgroup without programs, arrives.
    let control_marker = unique("raw-control");
    assert_eq!(
        raw_icmp_from(&control.path, "127.0.0.3", &control_marker),
        "ok"
    );
    assert!(watch.saw(&control_marker, Duration::from_secs(2)));
}

/// A helper process in `cgroup` holding a TCP connection to `server`.
struct Held {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Held {
    fn connect(cgroup: &std::path::Path, server: std::net::SocketAddr) -> Held {
        let mut child = Command::new(helper())
            .args([
                "--cgroup",
                cgroup.to_str().unwrap(),
                "hold-tcp",
                &server.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn helper");
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut held = Held { child, out };
        assert_eq!(held.line(), "ok", "connect");
        held
    }

    fn line(&mut self) -> String {
        let mut s = String::new();
        self.out.read_line(&mut s).unwrap();
        s.trim().to_owned()
    }

    fn send(&mut self, text: &str) -> String {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "send {text}").unwrap();
        stdin.flush().unwrap();
        self.line()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn established_connection_after(block: bool) -> (bool, bool, String) {
    let server = TcpServer::start("127.0.0.2");
    let cg = TestCgroup::new();
    let mut eg = EgressGuard::attach(&cg, &[allow("127.0.0.2/32", None)]);
    let mut held = Held::connect(&cg.path, server.addr);
    let before = unique("before");
    assert_eq!(held.send(&before), "ok");
    let before_seen = server.saw(before.as_bytes(), Duration::from_secs(2));
    if block {
        eg.get().block_all().unwrap();
        assert!(eg.get().blocked().unwrap());
    }
    let after = unique("after");
    // The write itself may succeed (the data waits in the socket's queue): what counts is that
    // no packet carrying it leaves.
    let _ = held.send(&after);
    let after_seen = server.saw(after.as_bytes(), Duration::from_secs(1));
    let new_connect = format!(
        "{:?}",
        probe_in(&cg.path, ProbeKind::TcpConnect, server.addr)
    );
    (before_seen, after_seen, new_connect)
}

#[test]
fn block_all_stops_an_established_connection() {
    if !privileged("block_all_stops_an_established_connection") {
        return;
    }
    let (before, after, new_connect) = established_connection_after(true);
    assert!(before, "data before block-all must arrive");
    assert!(!after, "data sent after block-all arrived");
    assert_eq!(new_connect, format!("{EPERM:?}"));
}

#[test]
fn without_block_all_the_established_connection_carries_on() {
    if !privileged("without_block_all_the_established_connection_carries_on") {
        return;
    }
    // The negative control of the test above: same steps, no block.
    let (before, after, new_connect) = established_connection_after(false);
    assert!(before && after);
    assert_eq!(new_connect, format!("{:?}", ProbeResult::Ok));
}

#[test]
fn release_detaches_everything_and_removes_the_pins() {
    if !privileged("release_detaches_everything_and_removes_the_pins") {
        return;
    }
    let other = TcpServer::start("127.0.0.3");
    let cg = TestCgroup::new();
    let mut eg = EgressGuard::attach(&cg, &[allow("127.0.0.2/32", None)]);
    let egress = eg.0.take().unwrap();
    let ids = egress.program_ids();
    let dir = egress.pin_dir().to_path_buf();
    assert!(dir.exists());
    assert_eq!(probe_in(&cg.path, ProbeKind::TcpConnect, other.addr), EPERM);
    egress.release().unwrap();
    assert!(!dir.exists(), "{} left behind", dir.display());
    for at in [AttachPoint::Connect4, AttachPoint::SkbEgress] {
        let live = sys::effective_programs(&cg.path, at).unwrap();
        assert!(
            ids.iter().all(|(_, id)| !live.contains(id)),
            "{live:?} still holds {ids:?}"
        );
    }
    assert_eq!(
        probe_in(&cg.path, ProbeKind::TcpConnect, other.addr),
        ProbeResult::Ok
    );
}

#[test]
fn a_failed_attach_leaves_nothing_attached_or_pinned() {
    if !privileged("a_failed_attach_leaves_nothing_attached_or_pinned") {
        return;
    }
    // A directory that is not a cgroup: the maps load and are pinned, then the first attach
    // fails. Everything must be undone.
    let not_cgroup = std::env::temp_dir().join(unique("not-a-cgroup"));
    std::fs::create_dir(&not_cgroup).unwrap();
    let run_id = unique("failed");
    let err = Egress::attach(&run_id, &not_cgroup, &[allow("127.0.0.2/32", None)], None)
        .expect_err("attach to a plain directory");
    std::fs::remove_dir(&not_cgroup).unwrap();
    assert!(
        matches!(
            err,
            EgressError::Attach {
                name: "skb_egress",
                ..
            }
        ),
        "{err}"
    );
    let pins = cordon_bpf::bpffs::run_dir(std::path::Path::new("/sys/fs/bpf"), &run_id);
    assert!(!pins.exists(), "{} left behind", pins.display());

    // A bad allowlist is refused before anything is loaded: the cgroup stays untouched.
    let cg = TestCgroup::new();
    let many: Vec<_> = (1..=17).map(|p| allow("127.0.0.0/8", Some(p))).collect();
    let err = Egress::attach(&unique("toomany"), &cg.path, &many, None).expect_err("17 ports");
    assert!(matches!(err, EgressError::Allowlist(_)), "{err}");
    assert!(
        sys::effective_programs(&cg.path, AttachPoint::Connect4)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_run_id_in_use_is_refused() {
    if !privileged("a_run_id_in_use_is_refused") {
        return;
    }
    let cg = TestCgroup::new();
    let mut eg = EgressGuard::attach(&cg, &[allow("127.0.0.2/32", None)]);
    let run_id = eg.get().run_id().to_owned();
    let err = Egress::attach(&run_id, &cg.path, &[], None).expect_err("same run id");
    assert!(
        matches!(
            err,
            EgressError::Bpffs(cordon_bpf::bpffs::BpffsError::Exists(_))
        ),
        "{err}"
    );
    // The first run's boundary is untouched.
    let v = eg.get().verify();
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
}

/// A small deterministic generator (xorshift), so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn u32(&mut self) -> u32 {
        u32::try_from(self.next() >> 32).unwrap()
    }

    fn below(&mut self, n: u32) -> u32 {
        self.u32() % n
    }
}

#[test]
fn kernel_decisions_match_the_allowlist_model() {
    if !privileged("kernel_decisions_match_the_allowlist_model") {
        return;
    }
    use cordon_bpf::Tries;
    use cordon_bpf::probe::{self, Probe};
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    let mut rng = Rng(0x5eed_c0de_2026);
    // Nested rules whose ports must merge (10.x style, inside 127/8), then random ones.
    let mut rules = vec![
        allow("127.16.0.0/12", Some(1000)),
        allow("127.16.32.0/20", Some(1001)),
        allow("127.16.32.64/26", None),
    ];
    for _ in 0..12 {
        let prefix = 8 + u8::try_from(rng.below(25)).unwrap();
        let addr = Ipv4Addr::from(0x7f00_0000 | (rng.u32() & 0x00ff_ffff));
        let port = match rng.below(3) {
            0 => None,
            _ => Some(1000 + u16::try_from(rng.below(4)).unwrap()),
        };
        rules.push(cordon_bpf::Allow::new(IpAddr::V4(addr), prefix, port));
    }
    let model = Tries::build(&rules).unwrap();
    let cg = TestCgroup::new();
    let _eg = EgressGuard::attach(&cg, &rules);

    // First the merged-port case itself: 127.16.33.1 matches the /20 entry (port 1001), yet the
    // /12 rule allows port 1000 there too.
    let mut dests = vec![
        Probe {
            kind: ProbeKind::TcpConnect,
            dest: sa("127.16.33.1:1000"),
        },
        Probe {
            kind: ProbeKind::TcpConnect,
            dest: sa("127.16.33.1:1001"),
        },
    ];
    assert!(model.permits("127.16.33.1".parse().unwrap(), Some(1000)));
    for i in 0..190 {
        let ip = if i % 3 == 0 {
            Ipv4Addr::from(0x7f00_0000 | (rng.u32() & 0x00ff_ffff))
        } else {
            // Inside (or near) a rule: its network with random host bits.
            let r = rules[rng.below(u32::try_from(rules.len()).unwrap()) as usize];
            let IpAddr::V4(net) = r.net else {
                unreachable!()
            };
            let host_bits = 32 - u32::from(r.prefix);
            let mask = if host_bits == 32 {
                u32::MAX
            } else {
                (1u32 << host_bits) - 1
            };
            Ipv4Addr::from((u32::from(net) & !mask) | (rng.u32() & mask))
        };
        let port = 1000 + u16::try_from(rng.below(5)).unwrap();
        let kind = if i % 2 == 0 {
            ProbeKind::TcpConnect
        } else {
            ProbeKind::UdpSendto
        };
        // Every third destination goes through an IPv6 socket as a mapped address.
        let dest = if i % 4 == 1 {
            SocketAddr::new(IpAddr::V6(ip.to_ipv6_mapped()), port)
        } else {
            SocketAddr::new(IpAddr::V4(ip), port)
        };
        dests.push(Probe { kind, dest });
    }
    let mut mismatches = Vec::new();
    let (mut allowed, mut refused) = (0, 0);
    for chunk in dests.chunks(probe::MAX_PROBES) {
        let run = probe::connect_probes(&cg.path, chunk, Duration::from_secs(10)).unwrap();
        for (p, r) in chunk.iter().zip(&run.results) {
            let want = model.permits(p.dest.ip(), Some(p.dest.port()));
            let got = match r {
                ProbeResult::Failed(libc::EPERM) => false,
                ProbeResult::Ok | ProbeResult::Failed(libc::ECONNREFUSED) => true,
                other => panic!("{p:?}: unexpected {other:?}"),
            };
            if want {
                allowed += 1;
            } else {
                refused += 1;
            }
            if want != got {
                mismatches.push(format!("{p:?}: model {want}, kernel {got}"));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "rules {rules:?}\n{}",
        mismatches.join("\n")
    );
    // The sample exercised both answers, including the merged-port case.
    assert!(
        allowed > 20 && refused > 20,
        "allowed {allowed}, refused {refused}"
    );
    assert!(model.permits("127.16.32.70".parse().unwrap(), Some(1000)));
}

#[test]
fn the_active_probe_can_run_while_the_caller_works() {
    if !privileged("the_active_probe_can_run_while_the_caller_works") {
        return;
    }
    let cg = TestCgroup::new();
    let mut eg = EgressGuard::attach(&cg, &[allow("127.0.0.2/32", None)]);
    let started = eg.get().start_probe();
    let pid = started.pid().expect("probe process started");
    // Other work meanwhile: the attach-time checks.
    let attached = eg.get().verify_attached();
    let probe = started.finish();
    assert_eq!(probe.state, VerifyState::Enforced, "{}", probe.detail);
    assert_eq!(probe.probe_pids, [pid]);
    let v = attached.and(probe);
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
    // A probe dropped unfinished is reaped, not left behind (a zombie keeps its /proc entry).
    let unfinished = eg.get().start_probe();
    let pid = unfinished.pid().unwrap();
    drop(unfinished);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());

    // Negative control: with every candidate destination allowed, no probe is possible, and
    // the probe says so rather than pass.
    let open = TestCgroup::new();
    let mut all = EgressGuard::attach(&open, &[allow("127.0.0.0/8", None), allow("::1/128", None)]);
    let v = all.get().start_probe().finish();
    assert_eq!(v.state, VerifyState::VerificationFailed);
    assert!(
        v.problems[0].starts_with("no local destination"),
        "{:?}",
        v.problems
    );
}
