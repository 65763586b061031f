//! What the eBPF pieces cost, as ratios measured in one run (root only):
//!
//! - `connect`: a TCP `connect()` to a loopback listener (and `close`), and to a closed
//!   loopback port (refused by a reset), from this process while it sits in a cgroup without
//!   programs vs one with the egress programs attached;
//! - `exec`: fork + exec + wait of `/bin/true` with no observer, with one more shared exec
//!   program attached (a generation of its own, on a fresh bpffs) whose filter watches another
//!   cgroup (the cost every process on the host pays once a run has loaded the program), and
//!   with an observer watching this process's cgroup (events produced and drained).
//!
//! - `attach`: what a run pays to set up, check and take down its eBPF pieces: an observer
//!   (attach + `verify_attached` + release), an egress boundary (attach + `verify`, active
//!   probe included, + release), and both as `cordon run` uses them (observer, egress with
//!   it, both checks, both releases). "first_run" cases start each iteration on a freshly
//!   mounted, empty bpffs — the first run of a boot, which loads the shared programs (kernel
//!   BTF parse, verifier) — "next_run" cases on the shared programs already loaded. A first
//!   run inside this process pays aya's one-time feature probe only once (~0.4 ms).
//!
//! Criterion measures each case; then an interleaved A/B loop (blocks of the two cases
//! alternating, medians of the blocks) prints the ratios, so that drift of a shared machine
//! falls on both sides, and the attach cases print their medians and 90th percentiles. Run:
//! `cargo bench -p cordon-bpf --bench bpf`.

use std::fs;
use std::hint::black_box;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cordon_bpf::{Allow, Egress, Observer, VerifyState};
use criterion::Criterion;

fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions and touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        if std::env::var("CORDON_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
            panic!("cordon-bpf benchmarks need root and CORDON_REQUIRE_PRIVILEGED=1");
        }
        eprintln!("SKIPPED cordon-bpf benchmarks: not root");
    }
    root
}

/// This process's v2 cgroup directory.
fn own_v2() -> PathBuf {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount = info
        .lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mp = pre.split(' ').nth(4)?;
            post.starts_with("cgroup2 ").then(|| PathBuf::from(mp))
        })
        .expect("cgroup v2 mount");
    let rel = fs::read_to_string("/proc/self/cgroup")
        .unwrap()
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

/// Moves this whole process into `cgroup`.
fn enter(cgroup: &Path) {
    fs::write(cgroup.join("cgroup.procs"), "0")
        .unwrap_or_else(|e| panic!("joining {}: {e}", cgroup.display()));
}

/// The bench's cgroups, the egress and observers; undone on drop (back to the home cgroup).
struct Setup {
    home: PathBuf,
    plain: PathBuf,
    guarded: PathBuf,
    elsewhere: PathBuf,
    egress: Option<Egress>,
    listener: SocketAddr,
    /// A loopback port nobody listens on: connect() is answered by a reset.
    closed: SocketAddr,
}

impl Setup {
    fn new() -> Setup {
        let home = own_v2();
        let name = |s: &str| home.join(format!("cordon-bpf-bench-{}-{s}", std::process::id()));
        let (plain, guarded, elsewhere) = (name("plain"), name("egress"), name("elsewhere"));
        for d in [&plain, &guarded, &elsewhere] {
            fs::create_dir(d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                drop(conn);
            }
        });
        let egress = Egress::attach(
            &format!("bench-{}", std::process::id()),
            &guarded,
            // Every port of 127.0.0.1: the listener shares the cgroup (membership is per
            // process), and its replies go to the client's ephemeral ports.
            &[Allow::new(addr.ip(), 32, None)],
            None,
        )
        .expect("attach egress");
        Setup {
            home,
            plain,
            guarded,
            elsewhere,
            egress: Some(egress),
            listener: addr,
            closed,
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        enter(&self.home);
        if let Some(e) = self.egress.take() {
            let _ = e.release();
        }
        for d in [&self.plain, &self.guarded, &self.elsewhere] {
            let _ = fs::remove_dir(d);
        }
    }
}

/// One connect, closed with a reset (`SO_LINGER` 0) so that no TIME_WAIT is left behind to
/// collide with a later connect's port and stall it for a SYN retransmission.
fn connect_once(addr: SocketAddr) {
    use std::os::fd::AsRawFd;
    let stream = TcpStream::connect(addr).expect("connect");
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `linger` is a valid struct linger for the call; the descriptor is `stream`'s.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            8, // sizeof(struct linger)
        )
    };
    black_box(stream);
}

fn connect_refused_once(addr: SocketAddr) {
    let err = TcpStream::connect(addr).expect_err("nobody listens");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
}

fn exec_once() {
    let status = Command::new("/bin/true").status().expect("spawn /bin/true");
    assert!(status.success());
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Alternates `rounds` blocks of `per_block` runs of `a` (in its state) and `b`; returns the
/// medians of the per-op block means, in µs.
fn interleaved(
    rounds: usize,
    per_block: usize,
    mut a: impl FnMut() -> Duration,
    mut b: impl FnMut() -> Duration,
) -> (f64, f64) {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t: Duration = (0..per_block).map(|_| a()).sum();
        xs.push(t.as_secs_f64() * 1e6 / per_block as f64);
        let t: Duration = (0..per_block).map(|_| b()).sum();
        ys.push(t.as_secs_f64() * 1e6 / per_block as f64);
    }
    (median(xs), median(ys))
}

fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn connect_bench(c: &mut Criterion, s: &Setup, quick: bool) {
    let addr = s.listener;
    let mut g = c.benchmark_group("connect");
    g.bench_function("without_egress", |b| {
        enter(&s.plain);
        b.iter(|| connect_once(addr));
    });
    g.bench_function("with_egress", |b| {
        enter(&s.guarded);
        b.iter(|| connect_once(addr));
    });
    // The same path without a listener (SYN out, reset in): no accept queue, no TIME_WAIT,
    // so none of the stalls a busy machine gives a listener.
    let closed = s.closed;
    g.bench_function("refused_without_egress", |b| {
        enter(&s.plain);
        b.iter(|| connect_refused_once(closed));
    });
    g.bench_function("refused_with_egress", |b| {
        enter(&s.guarded);
        b.iter(|| connect_refused_once(closed));
    });
    g.finish();
    if quick {
        return;
    }
    let (without, with) = interleaved(
        20,
        200,
        || {
            enter(&s.plain);
            timed(|| connect_once(addr))
        },
        || {
            enter(&s.guarded);
            timed(|| connect_once(addr))
        },
    );
    println!(
        "ratio connect() to a listener: with egress {with:.1} µs / without {without:.1} µs = {:.3}",
        with / without
    );
    let (without, with) = interleaved(
        20,
        200,
        || {
            enter(&s.plain);
            timed(|| connect_refused_once(closed))
        },
        || {
            enter(&s.guarded);
            timed(|| connect_refused_once(closed))
        },
    );
    enter(&s.home);
    println!(
        "ratio connect() to a closed port: with egress {with:.1} µs / without {without:.1} µs = {:.3}",
        with / without
    );
}

/// An observer of its own generation: one more exec program attached to the host, as the
/// first run of a boot adds. Detached (bpffs unmounted) on drop.
struct ExtraProgram {
    observer: Option<Observer>,
    _fs: FreshBpffs,
}

impl ExtraProgram {
    fn attach(n: u32, cg: &Path) -> ExtraProgram {
        let fs = FreshBpffs::new(1000 + n);
        let observer =
            Observer::attach_at(&fs.root, &format!("bench-x-{n}"), cg).expect("attach observer");
        ExtraProgram {
            observer: Some(observer),
            _fs: fs,
        }
    }
}

impl Drop for ExtraProgram {
    fn drop(&mut self) {
        if let Some(o) = self.observer.take() {
            let _ = o.release();
        }
    }
}

fn exec_bench(c: &mut Criterion, s: &Setup, quick: bool) {
    let mut g = c.benchmark_group("exec");
    enter(&s.plain);
    g.bench_function("without_observer", |b| b.iter(exec_once));
    let extra = ExtraProgram::attach(0, &s.elsewhere);
    g.bench_function("observer_elsewhere", |b| b.iter(exec_once));
    drop(extra);
    let mut watched = Observer::attach(&format!("bench-o2-{}", std::process::id()), &s.plain)
        .expect("attach observer");
    g.bench_function("observer_watching", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters {
                total += timed(exec_once);
                if i % 64 == 63 {
                    black_box(watched.drain().expect("drain"));
                }
            }
            black_box(watched.drain().expect("drain"));
            total
        })
    });
    g.finish();
    let lost = watched.lost().expect("lost counter");
    drop(watched);
    if !quick {
        // Each ratio from its own interleaved loop: the program or observer is attached and
        // detached between blocks, so both sides share the machine's state.
        let run = std::cell::Cell::new(0u32);
        let extra: std::cell::RefCell<Option<ExtraProgram>> = std::cell::RefCell::new(None);
        let (without, with) = interleaved(
            20,
            100,
            || {
                extra.replace(None);
                timed(exec_once)
            },
            || {
                let mut slot = extra.borrow_mut();
                if slot.is_none() {
                    run.set(run.get() + 1);
                    *slot = Some(ExtraProgram::attach(run.get(), &s.elsewhere));
                }
                timed(exec_once)
            },
        );
        extra.replace(None);
        println!(
            "ratio fork+exec+wait /bin/true: one more shared exec program (watching another cgroup) {with:.1} µs / without it {without:.1} µs = {:.3}",
            with / without
        );
        let observer: std::cell::RefCell<Option<Observer>> = std::cell::RefCell::new(None);
        let (without, with) = interleaved(
            20,
            100,
            || {
                observer.replace(None);
                timed(exec_once)
            },
            || {
                let mut slot = observer.borrow_mut();
                if slot.is_none() {
                    run.set(run.get() + 1);
                    *slot = Some(
                        Observer::attach(
                            &format!("bench-o3-{}-{}", std::process::id(), run.get()),
                            &s.plain,
                        )
                        .expect("attach observer"),
                    );
                }
                let t = timed(exec_once);
                if let Some(o) = slot.as_mut() {
                    black_box(o.drain().expect("drain"));
                }
                t
            },
        );
        observer.replace(None);
        println!(
            "ratio fork+exec+wait /bin/true: observer watching this cgroup {with:.1} µs / not watched {without:.1} µs = {:.3}",
            with / without
        );
    }
    enter(&s.home);
    println!("events lost while benchmarking the watching observer: {lost}");
}

/// A bpffs mounted on a fresh directory: no shared programs yet, as on a new boot.
struct FreshBpffs {
    base: PathBuf,
    root: PathBuf,
}

impl FreshBpffs {
    fn new(n: u32) -> FreshBpffs {
        let base =
            std::env::temp_dir().join(format!("cordon-bpf-bench-fs-{}-{n}", std::process::id()));
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

fn enforced(v: &cordon_bpf::Verification) {
    assert_eq!(v.state, VerifyState::Enforced, "{}", v.detail);
}

/// What each attach case does, on bpffs at `root`, for the cgroup `cg`.
#[derive(Clone, Copy)]
enum Case {
    Observer,
    Egress,
    Run,
}

impl Case {
    fn once(self, root: &Path, run: &str, cg: &Path, allow: &[Allow]) {
        match self {
            Case::Observer => {
                let o = Observer::attach_at(root, run, cg).expect("attach observer");
                enforced(&o.verify_attached());
                black_box(o.release().expect("release observer"));
            }
            Case::Egress => {
                let e = Egress::attach_at(root, run, cg, allow, None).expect("attach egress");
                enforced(&e.verify());
                e.release().expect("release egress");
            }
            Case::Run => {
                let o = Observer::attach_at(root, run, cg).expect("attach observer");
                let e = Egress::attach_at(root, run, cg, allow, Some(&o)).expect("attach egress");
                enforced(&o.verify_attached());
                enforced(&e.verify());
                e.release().expect("release egress");
                black_box(o.release().expect("release observer"));
            }
        }
    }
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[(v.len() * 9 / 10).min(v.len() - 1)])
}

fn attach_bench(c: &mut Criterion, s: &Setup, quick: bool) {
    let allow = [Allow::new("192.0.2.0".parse().unwrap(), 24, None)];
    let cg = s.elsewhere.clone();
    let default_root = Path::new(cordon_bpf::bpffs::DEFAULT_ROOT);
    let n = std::cell::Cell::new(0u32);
    let next = || {
        n.set(n.get() + 1);
        format!("bench-a-{}-{}", std::process::id(), n.get())
    };
    let first = |case: Case| {
        let fresh = FreshBpffs::new(n.get());
        let run = next();
        let t = Instant::now();
        case.once(&fresh.root, &run, &cg, &allow);
        let d = t.elapsed();
        drop(fresh);
        d
    };
    let later = |case: Case| {
        let run = next();
        let t = Instant::now();
        case.once(default_root, &run, &cg, &allow);
        t.elapsed()
    };
    // The shared programs on the default bpffs exist from here on.
    later(Case::Run);
    let cases = [
        ("observer", Case::Observer),
        ("egress", Case::Egress),
        ("run", Case::Run),
    ];
    let mut g = c.benchmark_group("attach");
    g.sample_size(10);
    for (name, case) in cases {
        g.bench_function(format!("{name}_first_run"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| first(case)).sum())
        });
    }
    g.finish();
    let mut g = c.benchmark_group("attach");
    for (name, case) in cases {
        g.bench_function(format!("{name}_next_run"), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| later(case)).sum())
        });
    }
    // The active probe alone, on an attached boundary.
    let e = Egress::attach(&next(), &cg, &allow, None).expect("attach egress");
    g.bench_function("egress_verify_probe", |b| {
        b.iter(|| enforced(&e.verify_probe()))
    });
    g.bench_function("egress_verify_attached", |b| {
        b.iter(|| enforced(&e.verify_attached()))
    });
    e.release().expect("release egress");
    g.finish();
    if quick {
        return;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (name, case) in cases {
        let (f50, f90) = percentiles((0..10).map(|_| ms(first(case))).collect());
        let (n50, n90) = percentiles((0..200).map(|_| ms(later(case))).collect());
        println!(
            "per-run {name} (attach + verify + release): first run of a boot median {f50:.2} ms (p90 {f90:.2}), next runs median {n50:.3} ms (p90 {n90:.3}), ratio {:.0}",
            f50 / n50
        );
    }
}

fn main() {
    let listing = std::env::args().any(|a| a == "--list");
    // `cargo test --benches` / nextest run each benchmark once: no ratio loops then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    if listing {
        for name in [
            "connect/without_egress",
            "connect/with_egress",
            "connect/refused_without_egress",
            "connect/refused_with_egress",
            "exec/without_observer",
            "exec/observer_elsewhere",
            "exec/observer_watching",
            "attach/observer_first_run",
            "attach/egress_first_run",
            "attach/run_first_run",
            "attach/observer_next_run",
            "attach/egress_next_run",
            "attach/run_next_run",
            "attach/egress_verify_probe",
            "attach/egress_verify_attached",
        ] {
            println!("{name}: benchmark");
        }
        return;
    }
    if !privileged() {
        return;
    }
    let setup = Setup::new();
    attach_bench(&mut c, &setup, quick);
    connect_bench(&mut c, &setup, quick);
    exec_bench(&mut c, &setup, quick);
    drop(setup);
    c.final_summary();
}
