//! The run's empty network namespace, made by the launcher ahead of the clone (root only).
//!
//! A network namespace is the most expensive thing `clone3` creates (registering loopback and
//! the per-namespace sysctls: ~0.4 ms of a ~0.7 ms clone on the machine cordon is measured on).
//! As root, cordon makes it on a thread of its own, which unshares its network namespace, brings
//! loopback up and hands the namespace back, while the CLI validates the spec and opens the
//! ledger and the launcher creates the run's cgroup (`cordon run` starts the thread as soon as
//! it knows the run gets no network; the launcher does, at the latest, when it starts). The
//! launcher then enters it for the one `clone3` that makes init (which inherits it, instead of
//! creating one) and returns to the host's namespace at once.
//!
//! The namespace is as empty as one made by the clone (loopback only), and stronger in one way:
//! its owner is the host's user namespace, not the run's, so nothing in the sandbox, not even
//! init before it drops its capabilities, holds `CAP_NET_ADMIN` over it (no interface, route or
//! netfilter configuration: the network stack's surface that an owned namespace exposes).
//! The host checks that init is in exactly this namespace (its inode) before the command starts.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use rustix::thread::{LinkNameSpaceType, UnshareFlags};

use crate::sys;

/// A namespace being made on its thread.
#[derive(Debug)]
pub struct Pending(crate::thread::Thread<io::Result<NetNs>>);

/// An empty network namespace with loopback up, owned by the host's user namespace.
#[derive(Debug)]
pub struct NetNs {
    fd: OwnedFd,
    inode: u64,
    /// The namespace it was made from (the process's), to come back to after entering it.
    home: OwnedFd,
    /// The thread that made it (see [`NetNs::maker`]).
    maker: i32,
}

/// Starts making a namespace on a thread of its own (on another CPU than the caller's when
/// there is one: see [`sys::spawn_elsewhere`]).
pub fn prepare() -> io::Result<Pending> {
    sys::spawn_elsewhere("cordon-netns", 64 * 1024, make).map(Pending)
}

/// On the thread: a network namespace of its own (a thread may unshare this one alone), loopback
/// up, and a descriptor that keeps the namespace alive once the thread is gone. The descriptors
/// and the inode are taken here too, off the launcher's way.
fn make() -> io::Result<NetNs> {
    cordon_runtime::mark("netns: thread");
    let home = current()?;
    // SAFETY: only the network namespace is unshared; the descriptor table stays shared, so no
    // thread can be left with descriptors it cannot use (the concern `unshare_unsafe` names).
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNET) }?;
    cordon_runtime::mark("netns: unshared");
    loopback_up()?;
    cordon_runtime::mark("netns: loopback");
    let fd = current()?;
    let inode = rustix::fs::fstat(&fd)?.st_ino;
    cordon_runtime::mark("netns: made");
    let maker = rustix::thread::gettid().as_raw_nonzero().get();
    Ok(NetNs {
        fd,
        inode,
        home,
        maker,
    })
}

impl Pending {
    /// Waits for the thread: the namespace, once the thread has ended.
    pub fn wait(self) -> io::Result<NetNs> {
        cordon_runtime::mark("netns: joining");
        sys::join_elsewhere(self.0)
            .map_err(|_| io::Error::other("the network namespace thread panicked"))?
    }
}

impl AsFd for NetNs {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl NetNs {
    /// The namespace's inode number, as `/proc/<pid>/ns/net` of a process in it shows.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// The id of the thread that made it: once [`Pending::wait`] has returned, that thread has
    /// run the last of its code, though the kernel may list it a while longer.
    pub fn maker(&self) -> i32 {
        self.maker
    }

    /// Moves the calling thread into this namespace.
    pub fn enter(&self) -> io::Result<()> {
        enter(self.fd.as_fd())
    }

    /// Moves the calling thread back into the namespace this one was made from.
    pub fn leave(&self) -> io::Result<()> {
        enter(self.home.as_fd())
    }
}

/// The calling thread's current network namespace, to return to.
pub fn current() -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        "/proc/thread-self/ns/net",
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
#[cfg(test)]
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

    fn interfaces() -> Vec<String> {
        let dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
        dev.lines()
            .skip(2)
            .filter_map(|l| l.split(':').next())
            .map(|n| n.trim().to_owned())
            .collect()
    }

    /// The namespace made ahead is new, holds loopback alone and up, and a thread goes into it
    /// and back. Negative control: a namespace unshared without `loopback_up` has it down.
    #[test]
    fn made_ahead_entered_and_left() {
        if !crate::privileged("netns::made_ahead_entered_and_left") {
            return;
        }
        let ns = prepare().unwrap().wait().unwrap();
        // On threads of their own, so that the test's thread never leaves its namespace.
        let (host, inside, ifaces, up, back) = std::thread::spawn(move || {
            let host = ns_inode();
            let home = current().unwrap();
            ns.enter().unwrap();
            let seen = (ns_inode(), interfaces(), loopback_is_up().unwrap());
            enter(&home).unwrap();
            (host, seen.0, seen.1, seen.2, ns_inode())
        })
        .join()
        .unwrap();
        assert_ne!(inside, host, "a namespace of its own");
        assert_eq!(back, host, "and back in the host's");
        assert_eq!(ifaces, ["lo"]);
        assert!(up, "loopback up");

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
