//! The run's empty network namespace, and its IPC and UTS namespaces, made by the launcher ahead
//! of the clone (root only).
//!
//! A network namespace is the most expensive thing `clone3` creates (registering loopback and
//! the per-namespace sysctls: ~0.4 ms of a ~0.7 ms clone on the machine cordon is measured on),
//! and an IPC namespace (its message-queue filesystem) and a UTS namespace came next (~70 and
//! ~35 µs of the clone there). As root, cordon makes all three on a thread of its own, which
//! unshares them, brings loopback up, names the host [`HOSTNAME`] and hands the namespaces back,
//! while the CLI validates the spec and opens the ledger and the launcher creates the run's
//! cgroup (`cordon run` starts the thread as soon as it knows the run gets no network; the
//! launcher does, at the latest, when it starts). The launcher then enters them for the one
//! `clone3` that makes init (which inherits them, instead of creating them) and returns to the
//! host's namespaces at once.
//!
//! The namespaces are as empty as those made by the clone (loopback only; no IPC object; the
//! hostname the plan names), and stronger in one way: their owner is the host's user namespace,
//! not the run's, so nothing in the sandbox, not even init before it drops its capabilities,
//! holds a capability over them (`CAP_NET_ADMIN`: no interface, route or netfilter
//! configuration, the network stack's surface that an owned namespace exposes; nor the IPC
//! namespace's sysctls, nor `sethostname`). The host checks that init is in exactly these
//! namespaces (their inodes) before the command starts.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use cordon_runtime::HOSTNAME;
use rustix::thread::{LinkNameSpaceType, UnshareFlags};

use crate::sys;

/// The namespaces made ahead, in the order they are entered, with what `/proc/<pid>/ns` calls
/// them.
const KINDS: [(LinkNameSpaceType, &str); 3] = [
    (LinkNameSpaceType::Network, "net"),
    (LinkNameSpaceType::InterProcessCommunication, "ipc"),
    (LinkNameSpaceType::HostNameAndNISDomainName, "uts"),
];

/// Namespaces being made on their thread.
#[derive(Debug)]
pub struct Pending(crate::thread::Thread<io::Result<NetNs>>);

/// An empty network namespace with loopback up, and an IPC and a UTS namespace (hostname
/// [`HOSTNAME`]), all owned by the host's user namespace.
#[derive(Debug)]
pub struct NetNs {
    /// The namespaces made, in the order of [`KINDS`], each with its inode.
    made: [(OwnedFd, u64); 3],
    /// The namespaces they were made from (the process's), to come back to after entering.
    home: [OwnedFd; 3],
    /// The thread that made them (see [`NetNs::maker`]).
    maker: i32,
    /// When they came from the pool (see [`crate::pool`]) rather than being made here: the
    /// claim that still pins them there.
    claim: Option<crate::pool::Claim>,
}

/// Starts making the namespaces on a thread of their own (on another CPU than the caller's when
/// there is one: see [`sys::spawn_elsewhere`]).
pub fn prepare() -> io::Result<Pending> {
    sys::spawn_elsewhere("cordon-netns", 64 * 1024, make).map(Pending)
}

/// On the thread: network, IPC and UTS namespaces of its own (a thread may unshare these alone),
/// loopback up, the hostname set, and descriptors that keep the namespaces alive once the
/// thread is gone. The descriptors and the inodes are taken here too, off the launcher's way.
fn make() -> io::Result<NetNs> {
    cordon_runtime::mark("netns: thread");
    let home = [current("net")?, current("ipc")?, current("uts")?];
    let maker = rustix::thread::gettid().as_raw_nonzero().get();
    // The thread's file-system attributes (root, working directory, umask) become its own
    // copy: the launcher may enter a mount namespace for the clone only when no thread shares
    // them with it, and the kernel lets go of a joined thread's a while after it has ended.
    // SAFETY: only this thread's file-system attributes are unshared; the descriptor table
    // stays shared, so no thread can be left with descriptors it cannot use (the concern
    // `unshare_unsafe` names).
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::FS) }?;
    // A set an earlier run left in the pool, when there is one and it checks out.
    if let Some((made, claim)) = from_pool(&home) {
        cordon_runtime::mark("netns: from the pool");
        return Ok(NetNs {
            made,
            home,
            maker,
            claim: Some(claim),
        });
    }
    // SAFETY: only these namespaces are unshared, for this thread; the descriptor table stays
    // shared (as above).
    unsafe {
        rustix::thread::unshare_unsafe(
            UnshareFlags::NEWNET | UnshareFlags::NEWIPC | UnshareFlags::NEWUTS,
        )
    }?;
    cordon_runtime::mark("netns: unshared");
    loopback_up()?;
    rustix::system::sethostname(HOSTNAME.as_bytes())?;
    cordon_runtime::mark("netns: loopback");
    let made = |name| with_inode(current(name)?);
    let made = [made("net")?, made("ipc")?, made("uts")?];
    cordon_runtime::mark("netns: made");
    Ok(NetNs {
        made,
        home,
        maker,
        claim: None,
    })
}

/// A set claimed from the pool (see [`crate::pool`]), with the inodes, once checked: each a
/// namespace of its type owned by the host's user namespace, the network one holding loopback
/// alone and up, the UTS one named [`HOSTNAME`]. `None` when the pool is empty or unreadable,
/// or the set fails a check (then it is dropped, and with it the namespaces).
fn from_pool(home: &[OwnedFd; 3]) -> Option<([(OwnedFd, u64); 3], crate::pool::Claim)> {
    let pool = crate::pool::Pool::open(&crate::pool::dir()?).ok()?;
    let (claimed, claim) = pool.claim()?;
    check_pooled(&claimed, home).ok()?;
    let [net, ipc, uts] = claimed;
    let made = [with_inode(net), with_inode(ipc), with_inode(uts)];
    let [Ok(net), Ok(ipc), Ok(uts)] = made else {
        return None;
    };
    Some(([net, ipc, uts], claim))
}

/// The checks of [`from_pool`], made from the calling thread, which goes into the network and
/// UTS namespaces to look and comes back to `home`'s.
pub(crate) fn check_pooled(set: &[OwnedFd; 3], home: &[OwnedFd; 3]) -> io::Result<()> {
    let owner = rustix::fs::stat("/proc/thread-self/ns/user")?.st_ino;
    for (fd, kind) in set
        .iter()
        .zip([libc::CLONE_NEWNET, libc::CLONE_NEWIPC, libc::CLONE_NEWUTS])
    {
        crate::pool::check_namespace(fd, kind, owner)?;
    }
    let (net, uts) = (
        LinkNameSpaceType::Network,
        LinkNameSpaceType::HostNameAndNISDomainName,
    );
    rustix::thread::move_into_link_name_space(set[0].as_fd(), Some(net))?;
    let inside = rustix::thread::move_into_link_name_space(set[2].as_fd(), Some(uts))
        .map_err(io::Error::from)
        .and_then(|()| {
            let name = rustix::system::uname().nodename().to_bytes().to_vec();
            Ok((interfaces()?, loopback_is_up()?, name))
        });
    let back = rustix::thread::move_into_link_name_space(home[0].as_fd(), Some(net))
        .and_then(|()| rustix::thread::move_into_link_name_space(home[2].as_fd(), Some(uts)));
    let (ifaces, up, name) = inside?;
    back?;
    if ifaces != ["lo"] || !up {
        return Err(io::Error::other(format!(
            "network namespace with interfaces {ifaces:?} (loopback up: {up})"
        )));
    }
    if name != HOSTNAME.as_bytes() {
        return Err(io::Error::other("UTS namespace named otherwise"));
    }
    Ok(())
}

/// The network interfaces of the calling thread's network namespace.
fn interfaces() -> io::Result<Vec<String>> {
    let dev = crate::sys::read_text("/proc/thread-self/net/dev")?;
    Ok(dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(|n| n.trim().to_owned())
        .collect())
}

impl Pending {
    /// Waits for the thread: the namespaces, once the thread has ended.
    pub fn wait(self) -> io::Result<NetNs> {
        cordon_runtime::mark("netns: joining");
        sys::join_elsewhere(self.0)
            .map_err(|_| io::Error::other("the network namespace thread panicked"))?
    }
}

impl AsFd for NetNs {
    /// The network namespace.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.made[0].0.as_fd()
    }
}

impl NetNs {
    /// The network namespace's inode number, as `/proc/<pid>/ns/net` of a process in it shows.
    pub fn inode(&self) -> u64 {
        self.made[0].1
    }

    /// Each namespace made (`net`, `ipc`, `uts`, as `/proc/<pid>/ns` names them) and its inode.
    pub fn inodes(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        KINDS
            .iter()
            .zip(&self.made)
            .map(|((_, name), (_, inode))| (*name, *inode))
    }

    /// The claim that pins these in the pool, when they came from it (an earlier run's keeper
    /// left them, and they were checked): whoever takes it unpins them (see
    /// [`crate::pool::Claim`]).
    pub fn take_claim(&mut self) -> Option<crate::pool::Claim> {
        self.claim.take()
    }

    /// The hostname the UTS namespace was given.
    pub fn hostname(&self) -> &'static str {
        HOSTNAME
    }

    /// The id of the thread that made them: once [`Pending::wait`] has returned, that thread
    /// has run the last of its code, though the kernel may list it a while longer.
    pub fn maker(&self) -> i32 {
        self.maker
    }

    /// Moves the calling thread into these namespaces: all of them, or (back in its own) none.
    pub fn enter(&self) -> io::Result<()> {
        for ((kind, _), (fd, _)) in KINDS.iter().zip(&self.made) {
            if let Err(e) = rustix::thread::move_into_link_name_space(fd.as_fd(), Some(*kind)) {
                let _ = self.leave();
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Moves the calling thread back into the namespaces these were made from (each of them,
    /// whatever fails on the way: the first error is returned).
    pub fn leave(&self) -> io::Result<()> {
        let mut result = Ok(());
        for ((kind, _), fd) in KINDS.iter().zip(&self.home) {
            let back = rustix::thread::move_into_link_name_space(fd.as_fd(), Some(*kind));
            if result.is_ok() {
                result = back.map_err(io::Error::from);
            }
        }
        result
    }
}

/// A namespace descriptor with its inode, as `/proc/<pid>/ns` of a process in it shows.
pub(crate) fn with_inode(fd: OwnedFd) -> io::Result<(OwnedFd, u64)> {
    let inode = rustix::fs::fstat(&fd)?.st_ino;
    Ok((fd, inode))
}

/// The calling thread's current namespace `name` (`net`, `ipc`, `uts`, `mnt`…), to return to.
pub fn current(name: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        format!("/proc/thread-self/ns/{name}"),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?)
}

/// Moves the calling thread into the network namespace `fd` refers to.
pub fn enter(fd: impl AsFd) -> io::Result<()> {
    rustix::thread::move_into_link_name_space(fd.as_fd(), Some(LinkNameSpaceType::Network))?;
    Ok(())
}

/// `IFF_UP` as the `short` that `ifreq` carries.
const IFF_UP: libc::c_short = 0x1;

/// The interface-flags ioctls, in the C library's type for a request (glibc's `unsigned long`,
/// musl's `int`; the `libc` crate declares both as `c_ulong`), from `linux/sockios.h`.
const SIOCGIFFLAGS: libc::Ioctl = 0x8913;
const SIOCSIFFLAGS: libc::Ioctl = 0x8914;

/// Loopback's interface request in the calling thread's network namespace, with its flags read,
/// and the socket it was asked through.
fn loopback_flags() -> io::Result<(OwnedFd, libc::ifreq)> {
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )?;
    // SAFETY: `ifreq` is plain data for which zeroes are valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS fills the `ifreq` passed, which outlives the call; the socket is a
    // valid descriptor.
    if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((sock, req))
}

/// Brings up loopback in the calling thread's (empty) network namespace: what "no network"
/// still offers.
pub(crate) fn loopback_up() -> io::Result<()> {
    let (sock, mut req) = loopback_flags()?;
    // SAFETY: after SIOCGIFFLAGS the kernel initialized the union's flags member.
    unsafe { req.ifr_ifru.ifru_flags |= IFF_UP };
    // SAFETY: SIOCSIFFLAGS reads the `ifreq` passed, which outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether loopback is up in the calling thread's network namespace.
fn loopback_is_up() -> io::Result<bool> {
    let (_, req) = loopback_flags()?;
    // SAFETY: after SIOCGIFFLAGS the kernel initialized the union's flags member.
    Ok(unsafe { req.ifr_ifru.ifru_flags } & IFF_UP != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns_inode() -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
    }

    /// The namespaces made ahead are new (network, IPC, UTS), the network holds loopback alone
    /// and up, the host is named, and a thread goes into them and back. Negative control: a
    /// network namespace unshared without `loopback_up` has it down.
    #[test]
    fn made_ahead_entered_and_left() {
        if !crate::privileged("netns::made_ahead_entered_and_left") {
            return;
        }
        let ns = prepare().unwrap().wait().unwrap();
        let inode = |name: &str| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(format!("/proc/thread-self/ns/{name}"))
                .unwrap()
                .ino()
        };
        let made: Vec<(&str, u64)> = ns.inodes().collect();
        // On threads of their own, so that the test's thread never leaves its namespaces.
        let (host, inside, ifaces, up, name, back) = std::thread::spawn(move || {
            let all = || ["net", "ipc", "uts"].map(inode);
            let host = all();
            ns.enter().unwrap();
            let inside = all();
            let seen = (interfaces().unwrap(), loopback_is_up().unwrap());
            let name = rustix::system::uname().nodename().to_owned();
            ns.leave().unwrap();
            (host, inside, seen.0, seen.1, name, all())
        })
        .join()
        .unwrap();
        for i in 0..3 {
            assert_ne!(inside[i], host[i], "{}: a namespace of its own", made[i].0);
            assert_eq!(inside[i], made[i].1, "{}: the one made", made[i].0);
        }
        assert_eq!(back, host, "and back in the host's");
        assert_eq!(ifaces, ["lo"]);
        assert!(up, "loopback up");
        assert_eq!(name.to_str().unwrap(), HOSTNAME);
        assert_eq!(ns_inode(), host[0]);

        let control = std::thread::spawn(|| {
            // SAFETY: this thread's network namespace only; the thread ends right after.
            unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNET) }.unwrap();
            loopback_is_up().unwrap()
        })
        .join()
        .unwrap();
        assert!(!control, "a bare new namespace has loopback down");
    }
}
