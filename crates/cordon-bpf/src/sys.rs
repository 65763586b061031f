//! The `bpf(2)` commands cordon issues itself: asking the kernel which programs are in force on
//! a cgroup (`BPF_PROG_QUERY`), what a link, program or map is (`BPF_OBJ_GET_INFO_BY_FD`),
//! detaching or re-pointing a link (`BPF_LINK_DETACH`, `BPF_LINK_UPDATE` — the latter exists so
//! that tests can sabotage a run the way another root process could), and the whole per-run
//! path of a run that uses the shared objects (`crate::shared`): creating its maps
//! (`BPF_MAP_CREATE`), their entries (`BPF_MAP_*_ELEM`), pins (`BPF_OBJ_PIN`, `BPF_OBJ_GET`) and
//! cgroup links (`BPF_LINK_CREATE`). That path never goes through aya's loader, which parses the
//! kernel's BTF on every construction.
//!
//! Each command has its own `#[repr(C)]` attribute struct laid out like the matching member of
//! the kernel's `union bpf_attr`; the size passed is the struct's, and the kernel zero-fills the
//! rest of its union.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
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
    /// Another command failed.
    #[error("{op} {what}: {source}")]
    Bpf {
        /// The command (`creating map`, `pinning`, ...).
        op: &'static str,
        /// Its object (a map or program name, a path).
        what: String,
        /// Why.
        source: io::Error,
    },
}

impl SysError {
    /// A [`SysError::Bpf`] for `op` on `what`.
    pub fn bpf(op: &'static str, what: impl Into<String>) -> impl FnOnce(io::Error) -> SysError {
        let what = what.into();
        move |source| SysError::Bpf { op, what, source }
    }

    /// The errno, if the kernel gave one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            SysError::OpenCgroup { source, .. }
            | SysError::Query { source, .. }
            | SysError::Bpf { source, .. } => source.raw_os_error(),
            SysError::LinkInfo(e) | SysError::LinkDetach(e) | SysError::LinkUpdate(e) => {
                e.raw_os_error()
            }
        }
    }
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_CREATE: libc::c_long = 28;
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

#[repr(C)]
#[derive(Default)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// A non-negative return of a command that makes a descriptor, as an [`OwnedFd`].
fn new_fd(ret: libc::c_long) -> io::Result<OwnedFd> {
    let fd = i32::try_from(ret).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: callers pass only the return value of a command that, on success, returns a new
    // descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens a pinned BPF object (a link, program or map) by path (`BPF_OBJ_GET`).
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        ..ObjAttr::default()
    };
    // SAFETY: `attr` is BPF_OBJ_GET's struct; `pathname` points to the NUL-terminated `c`,
    // alive for the call.
    new_fd(unsafe { bpf(BPF_OBJ_GET, &mut attr) }?)
}

/// Discards every record in a ring buffer map: the consumer position is moved to the producer's.
/// Maps only the two position pages (the consumer page read-write, the first producer page
/// read-only), not the ring itself. Meant for a ring no producer writes to meanwhile (a slot
/// being taken over before its cgroup is entered into the filter). With `keep_mapped` the two
/// pages stay mapped, for the process's exit to take down (see
/// [`crate::observer::leave_mappings_to_exit`]).
pub fn ringbuf_discard(ring: BorrowedFd<'_>, keep_mapped: bool) -> io::Result<()> {
    // SAFETY: sysconf takes an integer and reads no memory.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .map_err(|_| io::Error::other("no page size"))?;
    let map = |prot, offset: usize| -> io::Result<*mut libc::c_void> {
        // SAFETY: a new shared mapping of one page of the ring buffer map at `offset`; the
        // kernel refuses offsets and protections a ring buffer does not allow.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                prot,
                libc::MAP_SHARED,
                ring.as_raw_fd(),
                libc::off_t::try_from(offset).map_err(io::Error::other)?,
            )
        };
        if p == libc::MAP_FAILED {
            Err(io::Error::last_os_error())
        } else {
            Ok(p)
        }
    };
    let consumer = map(libc::PROT_READ | libc::PROT_WRITE, 0)?;
    let producer = match map(libc::PROT_READ, page) {
        Ok(p) => p,
        Err(e) => {
            // SAFETY: the one-page mapping made above.
            unsafe { libc::munmap(consumer, page) };
            return Err(e);
        }
    };
    use std::sync::atomic::{AtomicU64, Ordering};
    // SAFETY: the producer page is mapped, page-aligned (so aligned for an AtomicU64) and starts
    // with the kernel's `unsigned long` producer position, which is only read here.
    let producer_pos = unsafe { &*producer.cast::<AtomicU64>() };
    // SAFETY: as above for the consumer page and position, which a reader advances.
    let consumer_pos = unsafe { &*consumer.cast::<AtomicU64>() };
    consumer_pos.store(producer_pos.load(Ordering::Acquire), Ordering::Release);
    if keep_mapped {
        return Ok(());
    }
    // SAFETY: the producer mapping made above; the reference into it is not used again.
    unsafe { libc::munmap(producer, page) };
    // SAFETY: the consumer mapping made above; likewise.
    unsafe { libc::munmap(consumer, page) };
    Ok(())
}

/// Pins a BPF object at `path` in bpffs (`BPF_OBJ_PIN`); the pin is one more reference to it.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd() as u32,
        ..ObjAttr::default()
    };
    // SAFETY: `attr` is BPF_OBJ_PIN's struct; `pathname` points to the NUL-terminated `c`,
    // alive for the call.
    unsafe { bpf(BPF_OBJ_PIN, &mut attr) }?;
    Ok(())
}

/// The kernel's map types cordon creates (`enum bpf_map_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapType {
    /// `BPF_MAP_TYPE_HASH`.
    Hash = 1,
    /// `BPF_MAP_TYPE_ARRAY`.
    Array = 2,
    /// `BPF_MAP_TYPE_PERCPU_ARRAY`.
    PercpuArray = 6,
    /// `BPF_MAP_TYPE_LPM_TRIE`.
    LpmTrie = 11,
    /// `BPF_MAP_TYPE_ARRAY_OF_MAPS`.
    ArrayOfMaps = 12,
    /// `BPF_MAP_TYPE_HASH_OF_MAPS`.
    HashOfMaps = 13,
    /// `BPF_MAP_TYPE_CGROUP_STORAGE`.
    CgroupStorage = 19,
    /// `BPF_MAP_TYPE_RINGBUF`.
    Ringbuf = 27,
}

/// `BPF_F_NO_PREALLOC`.
pub const BPF_F_NO_PREALLOC: u32 = 1;
/// Update flag: create or replace.
pub const BPF_ANY: u64 = 0;
/// Update flag: create only.
pub const BPF_NOEXIST: u64 = 1;
/// Update flag: replace only.
pub const BPF_EXIST: u64 = 2;

/// What a map is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSpec {
    /// Its type.
    pub map_type: MapType,
    /// Key bytes.
    pub key_size: u32,
    /// Value bytes.
    pub value_size: u32,
    /// Entries (bytes for a ring buffer).
    pub max_entries: u32,
    /// `BPF_F_*` flags.
    pub flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    map_ifindex: u32,
    btf_fd: u32,
    btf_key_type_id: u32,
    btf_value_type_id: u32,
    btf_vmlinux_value_type_id: u32,
    map_extra: u64,
}

/// Creates a map (`BPF_MAP_CREATE`) named `name` (at most 15 bytes are kept).
pub fn map_create(spec: &MapSpec, name: &str) -> Result<OwnedFd, SysError> {
    let mut map_name = [0u8; 16];
    for (d, s) in map_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    let mut attr = MapCreateAttr {
        map_type: spec.map_type as u32,
        key_size: spec.key_size,
        value_size: spec.value_size,
        max_entries: spec.max_entries,
        map_flags: spec.flags,
        map_name,
        ..MapCreateAttr::default()
    };
    // SAFETY: `attr` is BPF_MAP_CREATE's struct (up to `map_extra`) and holds no pointers.
    let ret =
        unsafe { bpf(BPF_MAP_CREATE, &mut attr) }.map_err(SysError::bpf("creating map", name))?;
    new_fd(ret).map_err(SysError::bpf("creating map", name))
}

#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// A map by descriptor, with the key and value sizes the kernel reported when it was opened:
/// every access checks its buffers against them, so the kernel never reads or writes past one.
#[derive(Debug)]
pub struct RawMap {
    fd: OwnedFd,
    info: MapInfo,
}

impl RawMap {
    /// Wraps a map descriptor (reads its information).
    pub fn from_fd(fd: OwnedFd) -> io::Result<RawMap> {
        let info = map_info(fd.as_fd())?;
        Ok(RawMap { fd, info })
    }

    /// Opens a pinned map.
    pub fn open(path: &Path) -> io::Result<RawMap> {
        RawMap::from_fd(obj_get(path)?)
    }

    /// What the kernel said about the map when it was opened.
    pub fn info(&self) -> &MapInfo {
        &self.info
    }

    /// Its id.
    pub fn id(&self) -> u32 {
        self.info.id
    }

    /// The descriptor.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    fn check(&self, key: usize, value: Option<usize>) -> io::Result<()> {
        let bad = key != self.info.key_size as usize
            || value.is_some_and(|v| v != self.info.value_size as usize);
        if bad {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "map {} has {}-byte keys and {}-byte values",
                    self.info.name, self.info.key_size, self.info.value_size
                ),
            ));
        }
        Ok(())
    }

    /// Reads the entry at `key` into `value` (`BPF_MAP_LOOKUP_ELEM`); `false` if there is none.
    /// For a map-in-maps the value is the inner map's id (4 bytes).
    pub fn lookup(&self, key: &[u8], value: &mut [u8]) -> io::Result<bool> {
        self.check(key.len(), Some(value.len()))?;
        let mut attr = ElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: value.as_mut_ptr() as u64,
            ..ElemAttr::default()
        };
        // SAFETY: `attr` is BPF_MAP_LOOKUP_ELEM's struct; `key` and `value` are live buffers
        // of exactly the map's key and value sizes (checked above), so the kernel reads and
        // writes only inside them.
        match unsafe { bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) } {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes the entry at `key` (`BPF_MAP_UPDATE_ELEM`); for a map-in-maps `value` is the
    /// inner map's descriptor (4 bytes).
    pub fn update(&self, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
        self.check(key.len(), Some(value.len()))?;
        let mut attr = ElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: value.as_ptr() as u64,
            flags,
            ..ElemAttr::default()
        };
        // SAFETY: `attr` is BPF_MAP_UPDATE_ELEM's struct; `key` and `value` are live buffers of
        // exactly the map's key and value sizes (checked above), which the kernel only reads.
        unsafe { bpf(BPF_MAP_UPDATE_ELEM, &mut attr) }?;
        Ok(())
    }

    /// Deletes the entry at `key` (`BPF_MAP_DELETE_ELEM`); `false` if there was none.
    pub fn delete(&self, key: &[u8]) -> io::Result<bool> {
        self.check(key.len(), None)?;
        let mut attr = ElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            ..ElemAttr::default()
        };
        // SAFETY: `attr` is BPF_MAP_DELETE_ELEM's struct; `key` is a live buffer of exactly
        // the map's key size (checked above), which the kernel only reads.
        match unsafe { bpf(BPF_MAP_DELETE_ELEM, &mut attr) } {
            Ok(_) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every key of the map, in the kernel's order.
    pub fn keys(&self) -> io::Result<Vec<Vec<u8>>> {
        let len = self.info.key_size as usize;
        let mut out: Vec<Vec<u8>> = Vec::new();
        loop {
            let mut next = vec![0u8; len];
            let mut attr = ElemAttr {
                map_fd: self.fd.as_raw_fd() as u32,
                key: out.last().map_or(0, |k| k.as_ptr() as u64),
                value: next.as_mut_ptr() as u64,
                ..ElemAttr::default()
            };
            // SAFETY: `attr` is BPF_MAP_GET_NEXT_KEY's struct; `key` is null (first key) or
            // points to the previous key, and `next` to a writable buffer, both of the map's
            // key size.
            match unsafe { bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) } {
                Ok(_) => {
                    out.push(next);
                    if out.len() > 1 << 20 {
                        return Err(io::Error::other("a map keeps yielding keys"));
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
                Err(e) => return Err(e),
            }
        }
    }

    /// Every key of a map whose keys are `u64` (cgroup ids).
    pub fn keys_u64(&self) -> io::Result<Vec<u64>> {
        self.check(8, None)?;
        Ok(self
            .keys()?
            .iter()
            .map(|k| u64::from_ne_bytes(k[..8].try_into().unwrap_or_default()))
            .collect())
    }

    /// Every key of a map whose keys are `u32` (slots).
    pub fn keys_u32(&self) -> io::Result<Vec<u32>> {
        self.check(4, None)?;
        Ok(self
            .keys()?
            .iter()
            .map(|k| u32::from_ne_bytes(k[..4].try_into().unwrap_or_default()))
            .collect())
    }

    /// The `u64` value at a `u32` key.
    pub fn get_u64_at_u32(&self, key: u32) -> io::Result<Option<u64>> {
        let mut v = [0u8; 8];
        Ok(self
            .lookup(&key.to_ne_bytes(), &mut v)?
            .then(|| u64::from_ne_bytes(v)))
    }

    /// The `u32` value at a `u64` key.
    pub fn get_u32_at_u64(&self, key: u64) -> io::Result<Option<u32>> {
        let mut v = [0u8; 4];
        Ok(self
            .lookup(&key.to_ne_bytes(), &mut v)?
            .then(|| u32::from_ne_bytes(v)))
    }

    /// The inner map id at a slot of a map-in-maps keyed by `u32`, if any.
    pub fn slot_id(&self, slot: u32) -> io::Result<Option<u32>> {
        let mut v = [0u8; 4];
        Ok(self
            .lookup(&slot.to_ne_bytes(), &mut v)?
            .then(|| u32::from_ne_bytes(v)))
    }

    /// Puts `inner` at `slot` of a map-in-maps keyed by `u32`.
    pub fn set_slot(&self, slot: u32, inner: BorrowedFd<'_>) -> io::Result<()> {
        self.update(
            &slot.to_ne_bytes(),
            &inner.as_raw_fd().to_ne_bytes(),
            BPF_ANY,
        )
    }
}

/// Opens a map by its id (`BPF_MAP_GET_FD_BY_ID`), as any root process can.
pub fn map_by_id(id: u32) -> io::Result<OwnedFd> {
    #[repr(C)]
    #[derive(Default)]
    struct GetFdAttr {
        map_id: u32,
        next_id: u32,
        open_flags: u32,
    }
    let mut attr = GetFdAttr {
        map_id: id,
        ..GetFdAttr::default()
    };
    // SAFETY: `attr` is BPF_MAP_GET_FD_BY_ID's struct and holds no pointers.
    new_fd(unsafe { bpf(BPF_MAP_GET_FD_BY_ID, &mut attr) }?)
}

impl AsFd for RawMap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    _rest: [u64; 4],
}

/// Attaches a cgroup program (`BPF_LINK_CREATE`): the link adds the program to those in force
/// on the cgroup (always "multi"), and lives while a descriptor or pin of it does.
pub fn link_create_cgroup(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach: AttachPoint,
) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_fd: cgroup.as_raw_fd() as u32,
        attach_type: attach.kernel_value(),
        ..LinkCreateAttr::default()
    };
    // SAFETY: `attr` is BPF_LINK_CREATE's struct (the union after `flags` zeroed) and holds no
    // pointers.
    new_fd(unsafe { bpf(BPF_LINK_CREATE, &mut attr) }?)
}

/// `BPF_OBJ_GET_INFO_BY_FD` into a zeroed 256-byte buffer, with `prepare` filling the request
/// fields (pointers for variable-length members) first.
fn obj_info(fd: BorrowedFd<'_>, buf: &mut [u64; 32]) -> io::Result<()> {
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: INFO_LEN,
        info: buf.as_mut_ptr() as u64,
    };
    // SAFETY: `attr` is BPF_OBJ_GET_INFO_BY_FD's struct; `info` points to `buf`, which holds
    // `info_len` bytes and outlives the call; any pointer the caller stored in `buf` points to
    // a live buffer of the length stored beside it.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    Ok(())
}

fn lo(w: u64) -> u32 {
    (w & 0xffff_ffff) as u32
}

fn hi(w: u64) -> u32 {
    (w >> 32) as u32
}

fn name16(words: &[u64]) -> String {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// What the kernel says about a map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapInfo {
    /// `enum bpf_map_type`.
    pub map_type: u32,
    /// The map's id.
    pub id: u32,
    /// Key bytes.
    pub key_size: u32,
    /// Value bytes.
    pub value_size: u32,
    /// Entries.
    pub max_entries: u32,
    /// `BPF_F_*` flags.
    pub flags: u32,
    /// Its name (at most 15 bytes).
    pub name: String,
}

impl MapInfo {
    /// Whether the map is made as `spec` says.
    pub fn matches(&self, spec: &MapSpec) -> bool {
        self.map_type == spec.map_type as u32
            && self.key_size == spec.key_size
            && self.value_size == spec.value_size
            && self.max_entries == spec.max_entries
            && self.flags == spec.flags
    }
}

/// Reads a map's information.
pub fn map_info(map: BorrowedFd<'_>) -> io::Result<MapInfo> {
    // struct bpf_map_info: type, id, key_size, value_size, max_entries, map_flags (u32 each),
    // then char name[16].
    let mut buf = [0u64; 32];
    obj_info(map, &mut buf)?;
    Ok(MapInfo {
        map_type: lo(buf[0]),
        id: hi(buf[0]),
        key_size: lo(buf[1]),
        value_size: hi(buf[1]),
        max_entries: lo(buf[2]),
        flags: hi(buf[2]),
        name: name16(&buf[3..5]),
    })
}

/// What the kernel says about a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgInfo {
    /// `enum bpf_prog_type`.
    pub prog_type: u32,
    /// The program's id.
    pub id: u32,
    /// The kernel's tag: the first 8 bytes of the SHA-1 of its instructions as loaded (map
    /// references zeroed).
    pub tag: [u8; 8],
    /// Its name (at most 15 bytes).
    pub name: String,
    /// The ids of the maps it uses.
    pub map_ids: Vec<u32>,
}

/// Reads a program's information, with the ids of the maps it uses.
pub fn prog_info(prog: BorrowedFd<'_>) -> io::Result<ProgInfo> {
    // struct bpf_prog_info: type, id (u32), tag[8], jited_prog_len, xlated_prog_len (u32),
    // jited_prog_insns, xlated_prog_insns, load_time (u64), created_by_uid, nr_map_ids (u32),
    // map_ids (u64 pointer), char name[16].
    let mut ids = vec![0u32; 64];
    let mut buf = [0u64; 32];
    buf[6] = u64::from(u32::try_from(ids.len()).unwrap_or(0)) << 32;
    buf[7] = ids.as_mut_ptr() as u64;
    obj_info(prog, &mut buf)?;
    let n = (hi(buf[6]) as usize).min(ids.len());
    ids.truncate(n);
    Ok(ProgInfo {
        prog_type: lo(buf[0]),
        id: hi(buf[0]),
        tag: buf[1].to_ne_bytes(),
        name: name16(&buf[8..10]),
        map_ids: ids,
    })
}

/// What the kernel says about a raw tracepoint link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawTpLinkInfo {
    /// `enum bpf_link_type` (1: raw tracepoint).
    pub link_type: u32,
    /// The link's id.
    pub link_id: u32,
    /// The program it runs.
    pub prog_id: u32,
    /// The tracepoint's name.
    pub tp_name: String,
}

/// `BPF_LINK_TYPE_RAW_TRACEPOINT`.
pub const LINK_TYPE_RAW_TRACEPOINT: u32 = 1;

/// Reads a raw tracepoint link's information (its tracepoint's name included).
pub fn raw_tp_link_info(link: BorrowedFd<'_>) -> io::Result<RawTpLinkInfo> {
    // struct bpf_link_info: type, id, prog_id (u32), then at offset 16 the raw_tracepoint
    // member { u64 tp_name (pointer); u32 tp_name_len; }.
    let mut name = [0u8; 64];
    let mut buf = [0u64; 32];
    buf[2] = name.as_mut_ptr() as u64;
    buf[3] = name.len() as u64;
    obj_info(link, &mut buf)?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(RawTpLinkInfo {
        link_type: lo(buf[0]),
        link_id: hi(buf[0]),
        prog_id: lo(buf[1]),
        tp_name: String::from_utf8_lossy(&name[..end]).into_owned(),
    })
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
    new_fd(unsafe { bpf(BPF_LINK_GET_FD_BY_ID, &mut attr) }?)
}
