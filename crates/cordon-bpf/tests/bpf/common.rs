//! Test cgroups, servers, probes and the privilege check.

use std::fs;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_bpf::probe::{self, Probe, ProbeKind, ProbeResult};
use cordon_bpf::{Allow, Egress};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Whether this host can run the privileged tests; with CORDON_REQUIRE_PRIVILEGED=1 a host
/// that cannot is a failure.
pub fn privileged(test: &str) -> bool {
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("not root");
    }
    if v2_mount().is_none() {
        missing.push("no cgroup v2 hierarchy");
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        missing.push("no kernel BTF");
    }
    if missing.is_empty() {
        return true;
    }
    let why = missing.join(", ");
    if std::env::var("CORDON_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        panic!("{test}: cannot run ({why}) and CORDON_REQUIRE_PRIVILEGED=1");
    }
    eprintln!("SKIPPED {test}: {why}");
    false
}

fn v2_mount() -> Option<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mountpoint = pre.split(' ').nth(4)?;
        post.starts_with("cgroup2 ")
            .then(|| PathBuf::from(mountpoint))
    })
}

/// This process's own v2 cgroup directory (test cgroups are made below it).
fn own_v2() -> PathBuf {
    let mount = v2_mount().expect("cgroup v2 mount");
    let rel = fs::read_to_string("/proc/self/cgroup")
        .expect("/proc/self/cgroup")
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        .expect("v2 membership");
    let rel = rel.trim_start_matches('/');
    if rel.is_empty() {
        mount
    } else {
        mount.join(rel)
    }
}

/// A unique name for this process: `<prefix>-<pid>-<n>`.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A v2 cgroup made for one test, killed and removed on drop.
#[derive(Debug)]
pub struct TestCgroup {
    pub path: PathBuf,
}

impl TestCgroup {
    pub fn new() -> TestCgroup {
        let path = own_v2().join(unique("cordon-bpf-test"));
        fs::create_dir(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        TestCgroup { path }
    }

    pub fn id(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&self.path).unwrap().ino()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = fs::write(self.path.join("cgroup.kill"), "1");
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            match fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        eprintln!("could not remove {}", self.path.display());
    }
}

/// An attached Egress, released on drop (even when the test fails).
#[derive(Debug)]
pub struct EgressGuard(pub Option<Egress>);

impl EgressGuard {
    pub fn attach(cg: &TestCgroup, allow: &[Allow]) -> EgressGuard {
        EgressGuard(Some(
            Egress::attach(&unique("test"), &cg.path, allow, None).expect("attach egress"),
        ))
    }

    pub fn get(&mut self) -> &mut Egress {
        self.0.as_mut().unwrap()
    }
}

impl Drop for EgressGuard {
    fn drop(&mut self) {
        if let Some(e) = self.0.take() {
            e.release().expect("release egress");
        }
    }
}

pub fn allow(cidr: &str, port: Option<u16>) -> Allow {
    let (net, prefix) = cidr.split_once('/').unwrap();
    Allow::new(net.parse().unwrap(), prefix.parse().unwrap(), port)
}

/// A TCP server on `ip` that accepts connections and collects what they send.
pub struct TcpServer {
    pub addr: SocketAddr,
    pub received: Arc<Mutex<Vec<u8>>>,
    /// Connections the server has read to the end and closed.
    pub closed: Arc<AtomicU32>,
}

impl TcpServer {
    pub fn start(ip: &str) -> TcpServer {
        let listener = TcpListener::bind((ip.parse::<std::net::IpAddr>().unwrap(), 0))
            .unwrap_or_else(|e| panic!("bind {ip}: {e}"));
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let closed = Arc::new(AtomicU32::new(0));
        let (r, c) = (received.clone(), closed.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { break };
                let (r, c) = (r.clone(), c.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = conn.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        r.lock().unwrap().extend_from_slice(&buf[..n]);
                    }
                    drop(conn);
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        TcpServer {
            addr,
            received,
            closed,
        }
    }

    /// Waits up to `limit` until `n` connections were closed by both sides (the server has
    /// read to the end and closed its side): a block set after that cannot strand them.
    pub fn wait_closed(&self, n: u32, limit: Duration) -> bool {
        let start = Instant::now();
        while self.closed.load(Ordering::SeqCst) < n {
            if start.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    /// Waits up to `limit` for `needle` to have arrived.
    pub fn saw(&self, needle: &[u8], limit: Duration) -> bool {
        let start = Instant::now();
        loop {
            if self
                .received
                .lock()
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle)
            {
                return true;
            }
            if start.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A UDP socket on `ip` that reports whether a datagram arrives.
pub struct UdpServer {
    pub addr: SocketAddr,
    sock: UdpSocket,
}

impl UdpServer {
    pub fn start(ip: &str) -> UdpServer {
        let sock = UdpSocket::bind((ip.parse::<std::net::IpAddr>().unwrap(), 0))
            .unwrap_or_else(|e| panic!("bind {ip}: {e}"));
        UdpServer {
            addr: sock.local_addr().unwrap(),
            sock,
        }
    }

    /// Datagrams that arrive within `limit` (stops at the first quiet `limit`).
    pub fn count(&self, limit: Duration) -> usize {
        self.sock.set_read_timeout(Some(limit)).unwrap();
        let mut n = 0;
        let mut buf = [0u8; 64];
        while self.sock.recv(&mut buf).is_ok() {
            n += 1;
        }
        n
    }
}

/// Runs one probe in a process born in `cgroup`.
pub fn probe_in(cgroup: &Path, kind: ProbeKind, dest: SocketAddr) -> ProbeResult {
    let run = probe::connect_probes(cgroup, &[Probe { kind, dest }], Duration::from_secs(5))
        .expect("probe process");
    run.results[0]
}

pub fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The path of the helper binary.
pub fn helper() -> &'static str {
    env!("CARGO_BIN_EXE_cordon-bpf-probe")
}

/// A bpffs mounted on a fresh directory (no shared programs yet, as after a boot), for tests
/// that damage or replace the shared objects without touching other tests' runs. Unmounted on
/// drop: declare it before every handle that uses it.
pub struct FreshBpffs {
    base: PathBuf,
    pub root: PathBuf,
}

impl FreshBpffs {
    pub fn new() -> FreshBpffs {
        let base = std::env::temp_dir().join(unique("cordon-bpffs"));
        let root = base.join("bpf");
        fs::create_dir_all(&root).unwrap();
        cordon_bpf::bpffs::ensure_mounted(&root).expect("mount bpffs");
        FreshBpffs { base, root }
    }
}

impl Drop for FreshBpffs {
    fn drop(&mut self) {
        let c = std::ffi::CString::new(self.root.to_str().unwrap()).unwrap();
        // SAFETY: umount2 of the mount made in `new`, by a NUL-terminated path alive for the
        // call; MNT_DETACH if something still holds it.
        if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
            // SAFETY: as above.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = fs::remove_dir_all(&self.base);
    }
}

/// An observer released on drop.
pub struct ObserverGuard(pub Option<cordon_bpf::Observer>);

impl ObserverGuard {
    pub fn get(&mut self) -> &mut cordon_bpf::Observer {
        self.0.as_mut().unwrap()
    }
}

impl Drop for ObserverGuard {
    fn drop(&mut self) {
        if let Some(o) = self.0.take() {
            o.release().expect("release observer");
        }
    }
}
