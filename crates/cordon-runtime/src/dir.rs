//! Listing a directory with `getdents64` into a buffer of cordon's own.
//!
//! `std::fs::read_dir` goes through the C library's `opendir`, whose buffer musl's allocator
//! maps and unmaps on every listing (in a process with threads on other CPUs each unmap is a
//! TLB shootdown there), and allocates for every entry it returns. A run lists a few small
//! directories on its critical path (the dynamic loaders, the top-level links, its own threads),
//! which cost ~0.1 ms this way on the machine described in ARCHITECTURE.md.

use std::ffi::OsStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub use rustix::fs::FileType;

/// The entries of `dir` (following a link to it, as `read_dir` does), without `.` and `..`,
/// that `keep` accepts given their names and types, as paths below `dir` with their types.
/// A type the file system does not record in the directory is looked up (not following a
/// link); one that cannot be is `FileType::Unknown`.
pub fn entries(
    dir: &Path,
    mut keep: impl FnMut(&OsStr, FileType) -> bool,
) -> io::Result<Vec<(PathBuf, FileType)>> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
    let mut listing = rustix::fs::RawDir::new(&fd, &mut buf);
    let mut out = Vec::new();
    while let Some(entry) = listing.next() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let mut kind = entry.file_type();
        if kind == FileType::Unknown {
            kind = rustix::fs::statat(&fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                .map_or(FileType::Unknown, |st| FileType::from_raw_mode(st.st_mode));
        }
        if keep(name, kind) {
            out.push((dir.join(name), kind));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same entries, names and types as the standard library's listing, filtered or not.
    #[test]
    fn lists_what_read_dir_lists() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("file", dir.path().join("link")).unwrap();
        for i in 0..300 {
            // More than one buffer's worth of entries.
            std::fs::write(dir.path().join(format!("n{i:03}-{}", "x".repeat(40))), b"").unwrap();
        }
        let mut std_listing: Vec<(PathBuf, bool, bool, bool)> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let t = e.file_type().unwrap();
                (e.path(), t.is_file(), t.is_dir(), t.is_symlink())
            })
            .collect();
        std_listing.sort();
        let mut ours: Vec<(PathBuf, bool, bool, bool)> = entries(dir.path(), |_, _| true)
            .unwrap()
            .into_iter()
            .map(|(p, t)| {
                (
                    p,
                    t == FileType::RegularFile,
                    t == FileType::Directory,
                    t == FileType::Symlink,
                )
            })
            .collect();
        ours.sort();
        assert_eq!(ours, std_listing);
        assert_eq!(ours.len(), 303);

        let links = entries(dir.path(), |_, t| t == FileType::Symlink).unwrap();
        assert_eq!(links, [(dir.path().join("link"), FileType::Symlink)]);
        let named = entries(dir.path(), |n, _| n.as_bytes().starts_with(b"su")).unwrap();
        assert_eq!(named, [(dir.path().join("sub"), FileType::Directory)]);
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = entries(&dir.path().join("absent"), |_, _| true).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        std::fs::write(dir.path().join("file"), b"").unwrap();
        assert!(entries(&dir.path().join("file"), |_, _| true).is_err());
    }
}
