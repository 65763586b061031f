//! Lexical path handling: no file system access, so no symlink resolution.
//!
//! Paths are compared component by component, never as strings: `/home/ab`
//! is not under `/home/a`.

use std::path::{Component, Path, PathBuf};

/// Joins `path` onto `base` (when `path` is relative) and removes `.`, `..`
/// and repeated separators without touching the file system. `..` at the
/// root stays at the root, as the kernel does: `/..` is `/`.
///
/// ```
/// use std::path::Path;
/// use cordon_policy::paths::resolve;
/// assert_eq!(resolve(Path::new("/srv/policy"), Path::new("./workspace")), Path::new("/srv/policy/workspace"));
/// assert_eq!(resolve(Path::new("/srv"), Path::new("//.//..")), Path::new("/"));
/// ```
pub fn resolve(base: &Path, path: &Path) -> PathBuf {
    let joined;
    let path = if path.is_absolute() {
        path
    } else {
        joined = base.join(path);
        &joined
    };
    normalize(path)
}

/// Removes `.`, `..` and repeated separators lexically. A relative path keeps
/// leading `..` components it cannot remove.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    let mut depth = 0usize; // normal components in `out`
    for component in path.components() {
        match component {
            Component::Prefix(p) => out.push(p.as_os_str()),
            Component::RootDir => {
                out.push(Component::RootDir.as_os_str());
                depth = 0;
            }
            Component::CurDir => {}
            Component::ParentDir => {
                if depth > 0 {
                    out.pop();
                    depth -= 1;
                } else if !out.has_root() {
                    out.push("..");
                }
            }
            Component::Normal(name) => {
                out.push(name);
                depth += 1;
            }
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

/// Whether `path` is `ancestor` or lies beneath it, comparing whole
/// components of the two (already normalized) paths.
pub fn is_within(path: &Path, ancestor: &Path) -> bool {
    path.starts_with(ancestor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_lexically() {
        let n = |s: &str| normalize(Path::new(s));
        assert_eq!(n("/"), Path::new("/"));
        assert_eq!(n("//"), Path::new("/"));
        assert_eq!(n("/./"), Path::new("/"));
        assert_eq!(n("/.."), Path::new("/"));
        assert_eq!(n("/a/../.."), Path::new("/"));
        assert_eq!(n("/a/./b//c/"), Path::new("/a/b/c"));
        assert_eq!(n("/a/b/../c"), Path::new("/a/c"));
        assert_eq!(n("a/../../b"), Path::new("../b"));
        assert_eq!(n("."), Path::new("."));
    }

    #[test]
    fn resolves_relative_to_base() {
        let base = Path::new("/srv/p");
        assert_eq!(resolve(base, Path::new("w")), Path::new("/srv/p/w"));
        assert_eq!(resolve(base, Path::new("../w")), Path::new("/srv/w"));
        assert_eq!(resolve(base, Path::new("/abs")), Path::new("/abs"));
        assert_eq!(resolve(base, Path::new("../../../..")), Path::new("/"));
    }

    #[test]
    fn within_compares_components() {
        assert!(is_within(Path::new("/home/a/src"), Path::new("/home/a")));
        assert!(is_within(Path::new("/home/a"), Path::new("/home/a")));
        assert!(!is_within(Path::new("/home/ab"), Path::new("/home/a")));
        assert!(is_within(Path::new("/x"), Path::new("/")));
    }
}
