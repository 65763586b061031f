//! The few `bpf(2)` commands aya does not expose for cgroup programs: asking the kernel which
//! programs are in force on a cgroup (`BPF_PROG_QUERY`), what a link is attached to
//! (`BPF_OBJ_GET_INFO_BY_FD`), and detaching or re-pointing a link (`BPF_LINK_DETACH`,
//! `BPF_LINK_UPDATE`) — the last two exist so that tests can sabotage a run the way another
//! root process could.
//!
//! Each command has its own `#[repr(C)]` attribute struct laid out like the matching member of
//! the kernel's `union bpf_attr`; the size passed is the struct's, and the kernel zero-fills the
//! rest of its union.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Errors of raw `bpf(2)` commands, each naming the command and its argument.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    /// Opening a cgroup directory failed.
    #[error("opening cgroup {path}: {source}")]
    OpenCgroup {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// `BPF_PROG_QUERY` failed.
    #[error("querying the {attach} programs of cgroup {path}: {source}")]
    Query {
        /// The cgroup.
        path: PathBuf,
        /// The attach point.
        attach: &'static str,
        /// Why.
        source: io::Error,
    },
    /// `BPF_OBJ_GET_INFO_BY_FD` on a link failed.
    #[error("reading link information: {0}")]
    LinkInfo(io::Error),
    /// `BPF_LINK_DETACH` failed.
    #[error("detaching a link: {0}")]
    LinkDetach(io::Error),
    /// `BPF_LINK_UPDATE` failed.
    #[error("updating a link's program: {0}")]
    LinkUpdate(io::Error),
}

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_DETACH: libc::c_long = 34;
const BPF_F_QUERY_EFFECTIVE: u32 = 1;
/// The size of the info buffers passed to `BPF_OBJ_GET_INFO_BY_FD` (`[u64; 32]`).
const INFO_LEN: u32 = 256;

/// The cgroup attach points cordon uses, with the kernel's `enum bpf_attach_type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttachPoint {
    /// `BPF_CGROUP_INET_INGRESS`.
    SkbIngress,
    /// `BPF_CGROUP_INET_EGRESS`.
    SkbEgress,
    /// `BPF_CGROUP_INET4_CONNECT`.
    Connect4,
    /// `BPF_CGROUP_INET6_CONNECT`.
    Connect6,
    /// `BPF_CGROUP_UDP4_SENDMSG`.
    Sendmsg4,
    /// `BPF_CGROUP_UDP6_SENDMSG`.
    Sendmsg6,
}

impl AttachPoint {
    /// The kernel's number for it.
    pub fn kernel_value(self) -> u32 {
        match self {
            AttachPoint::SkbIngress => 0,
            AttachPoint::SkbEgress => 1,
            AttachPoint::Connect4 => 10,
            AttachPoint::Connect6 => 11,
            AttachPoint::Sendmsg4 => 14,
            AttachPoint::Sendmsg6 => 15,
        }
    }

    /// Its name in section names and messages (`cgroup/connect4`, `cgroup_skb/egress`).
    pub fn name(self) -> &'static str {
        match self {
            AttachPoint::SkbIngress => "cgroup_skb/ingress",
            AttachPoint::SkbEgress => "cgroup_skb/egress",
            AttachPoint::Connect4 => "cgroup/connect4",
            AttachPoint::Connect6 => "cgroup/connect6",
            AttachPoint::Sendmsg4 => "cgroup/sendmsg4",
            AttachPoint::Sendmsg6 => "cgroup/sendmsg6",
        }
    }
}

#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

#[repr(C)]
#[derive(Default)]
struct LinkDetachAttr {
    link_fd: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkUpdateAttr {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
}

/// `bpf(cmd, attr, sizeof attr)`.
///
/// # Safety
/// `attr` must be the attribute struct `cmd` expects, and every pointer stored in it must
/// point to memory valid for the kernel to read and write for the length stated beside it.
unsafe fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: the caller guarantees `attr` matches `cmd` and its pointers are valid; the size
    // passed is exactly that of `*attr`, which lives for the duration of the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            size_of::<T>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Opens a cgroup directory for `BPF_PROG_QUERY` and attaching.
pub fn open_cgroup(path: &Path) -> Result<OwnedFd, SysError> {
    std::fs::File::open(path)
        .map(OwnedFd::from)
        .map_err(|source| SysError::OpenCgroup {
            path: path.to_path_buf(),
            source,
        })
}

/// The ids of the programs in force for processes in the cgroup at `attach`, in the order the
/// kernel runs them (`BPF_F_QUERY_EFFECTIVE`: the cgroup's own and those inherited from its
/// ancestors).
pub fn effective_programs(cgroup: &Path, attach: AttachPoint) -> Result<Vec<u32>, SysError> {
    let fd = open_cgroup(cgroup)?;
    let err = |source| SysError::Query {
        path: cgroup.to_path_buf(),
        attach: attach.name(),
        source,
    };
    let mut ids = vec![0u32; 64];
    loop {
        let mut attr = QueryAttr {
            target_fd: fd.as_raw_fd() as u32,
            attach_type: attach.kernel_value(),
            query_flags: BPF_F_QUERY_EFFECTIVE,
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: u32::try_from(ids.len()).unwrap_or(u32::MAX),
            ..QueryAttr::default()
        };
        // SAFETY: `attr` is BPF_PROG_QUERY's struct; `prog_ids` points to `ids`, which holds
        // `prog_cnt` u32s and outlives the call.
        match unsafe { bpf(BPF_PROG_QUERY, &mut attr) } {
            Ok(_) => {
                ids.truncate(attr.prog_cnt as usize);
                return Ok(ids);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && ids.len() < 1 << 16 => {
                ids = vec![0u32; (attr.prog_cnt as usize).max(ids.len() * 2)];
            }
            Err(e) => return Err(err(e)),
        }
    }
}

/// What the kernel says about a cgroup link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLinkInfo {
    /// The link's id.
    pub link_id: u32,
    /// The program it runs.
    pub prog_id: u32,
    /// The cgroup it is attached to; 0 once the link was detached or its cgroup removed.
    pub cgroup_id: u64,
    /// The kernel's attach type number.
    pub attach_type: u32,
}

/// Reads a link's information (`BPF_OBJ_GET_INFO_BY_FD`), interpreted as a cgroup link.
pub fn cgroup_link_info(link: BorrowedFd<'_>) -> Result<CgroupLinkInfo, SysError> {
    // struct bpf_link_info: type, id, prog_id (u32 each), then a union at offset 16 whose
    // cgroup member is { u64 cgroup_id; u32 attach_type; }. The buffer is larger than any
    // kernel's struct and zeroed, as the kernel requires of bytes it does not know.
    let mut buf = [0u64; 32];
    let mut attr = InfoAttr {
        bpf_fd: link.as_raw_fd() as u32,
        info_len: INFO_LEN,
        info: buf.as_mut_ptr() as u64,
    };
    // SAFETY: `attr` is BPF_OBJ_GET_INFO_BY_FD's struct; `info` points to `buf`, which holds
    // `info_len` bytes and outlives the call.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }.map_err(SysError::LinkInfo)?;
    let lo = |w: u64| (w & 0xffff_ffff) as u32;
    let hi = |w: u64| (w >> 32) as u32;
    Ok(CgroupLinkInfo {
        link_id: hi(buf[0]),
        prog_id: lo(buf[1]),
        cgroup_id: buf[2],
        attach_type: lo(buf[3]),
    })
}

/// Detaches a link from its hook (`BPF_LINK_DETACH`): the program stops running although the
/// link object and its pins remain. What a root process could do to a run behind cordon's back.
pub fn link_detach(link: BorrowedFd<'_>) -> Result<(), SysError> {
    let mut attr = LinkDetachAttr {
        link_fd: link.as_raw_fd() as u32,
    };
    // SAFETY: `attr` is BPF_LINK_DETACH's struct and holds no pointers.
    unsafe { bpf(BPF_LINK_DETACH, &mut attr) }.map_err(SysError::LinkDetach)?;
    Ok(())
}

/// Makes a link run another program of the same type (`BPF_LINK_UPDATE`).
pub fn link_update(link: BorrowedFd<'_>, new_prog: BorrowedFd<'_>) -> Result<(), SysError> {
    let mut attr = LinkUpdateAttr {
        link_fd: link.as_raw_fd() as u32,
        new_prog_fd: new_prog.as_raw_fd() as u32,
        ..LinkUpdateAttr::default()
    };
    // SAFETY: `attr` is BPF_LINK_UPDATE's struct and holds no pointers.
    unsafe { bpf(BPF_LINK_UPDATE, &mut attr) }.map_err(SysError::LinkUpdate)?;
    Ok(())
}

/// Opens a pinned BPF object (a link or map pinned by cordon) by path (`BPF_OBJ_GET`).
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    #[repr(C)]
    #[derive(Default)]
    struct ObjAttr {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
    }
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        ..ObjAttr::default()
    };
    // SAFETY: `attr` is BPF_OBJ_GET's struct; `pathname` points to the NUL-terminated `c`,
    // alive for the call.
    let fd = unsafe { bpf(7, &mut attr) }?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: a non-negative return of BPF_OBJ_GET is a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens a link by its id (`BPF_LINK_GET_FD_BY_ID`), as any root process can.
pub fn link_by_id(id: u32) -> io::Result<OwnedFd> {
    #[repr(C)]
    #[derive(Default)]
    struct GetFdAttr {
        link_id: u32,
        next_id: u32,
        open_flags: u32,
    }
    let mut attr = GetFdAttr {
        link_id: id,
        ..GetFdAttr::default()
    };
    // SAFETY: `attr` is BPF_LINK_GET_FD_BY_ID's struct and holds no pointers.
    let fd = unsafe { bpf(BPF_LINK_GET_FD_BY_ID, &mut attr) }?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: a non-negative return is a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
