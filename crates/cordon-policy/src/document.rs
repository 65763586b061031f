//! The policy file's content as plain data: what [`load`](crate::load::load)
//! produces and what the run layer and the controller consume.
//!
//! Every type here is already validated when it comes out of `load`: paths
//! are absolute (resolved lexically against the policy file's directory,
//! never canonicalized), the network section is consistent, limits are
//! positive, sequence rules are well formed and the Cedar text compiles. The
//! file format itself is described in `docs/policy.md`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cedar::Rule;
use crate::net::{NetDest, NetMode};
use crate::sequence::SequenceRule;

/// Everything one policy file says.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Policy {
    /// `[filesystem]`: what the command may read, write and execute.
    pub filesystem: Filesystem,
    /// `[network]`: where it may connect.
    pub network: Network,
    /// `[limits]`: resource limits.
    pub limits: Limits,
    /// `[process]`: the command's environment and working directory.
    pub process: Process,
    /// `[actions]`: per-call Cedar rules for agent actions.
    pub actions: Actions,
    /// `[[sequence]]`: sequence rules, in file order.
    pub sequences: Vec<SequenceRule>,
}

/// `[filesystem]`. Paths are absolute and lexically normalized; the run
/// layer checks existence and symlinks at launch.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Filesystem {
    /// Trees the command may read.
    pub read: Vec<PathBuf>,
    /// Trees the command may read and write.
    pub write: Vec<PathBuf>,
    /// `None`: execution is not restricted by path. `Some(list)`: the
    /// command may execute files under these trees only (an empty list
    /// forbids execution everywhere).
    pub exec: Option<Vec<PathBuf>>,
}

/// `[network]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Network {
    /// `none` (default), `host` or `allow`.
    pub mode: NetMode,
    /// With `mode = allow`: the destinations. Host names are kept
    /// unresolved; the run layer resolves or refuses them at launch.
    pub allow: Vec<NetDest>,
    /// Whether the author acknowledged a `/0` block in `allow`.
    pub i_understand: bool,
}

/// `[limits]`. `None` means no limit of that kind.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Limits {
    /// Memory in bytes.
    pub memory: Option<u64>,
    /// Processes and threads alive at once.
    pub pids: Option<u32>,
    /// Wall-clock limit.
    pub timeout: Option<Duration>,
    /// CPU bandwidth in thousandths of a core (`cpu = 1.5` is 1500).
    pub cpu_millicores: Option<u32>,
}

/// `[process]`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Process {
    /// Variables set for the command (the host environment is not
    /// inherited).
    pub env: BTreeMap<String, String>,
    /// Working directory, absolute; `None` leaves it to the run layer.
    pub cwd: Option<PathBuf>,
}

/// `[actions]`: the Cedar rules, as text and as a summary.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Actions {
    /// Where the text came from: `None` when the policy has no `[actions]`
    /// section, `Some("inline")` for `cedar = …`, else the `cedar_file` path.
    pub source: Option<String>,
    /// The Cedar text ([`Engine::new`](crate::Engine::new) compiles it).
    pub cedar: String,
    /// The rules in it, in written order.
    pub rules: Vec<Rule>,
}

/// Checks an environment variable assignment `NAME=VALUE` as given to
/// `cordon run --env`, returning the name and value.
///
/// ```
/// use cordon_policy::document::parse_env_assignment;
/// assert_eq!(parse_env_assignment("LANG=C.UTF-8").unwrap(), ("LANG".into(), "C.UTF-8".into()));
/// assert!(parse_env_assignment("1X=y").is_err());
/// ```
pub fn parse_env_assignment(input: &str) -> Result<(String, String), DocumentError> {
    let Some((name, value)) = input.split_once('=') else {
        return Err(DocumentError::ParseEnv {
            input: input.to_owned(),
            reason: "missing '=' (write NAME=VALUE)".into(),
        });
    };
    check_env_name(name).map_err(|reason| DocumentError::ParseEnv {
        input: input.to_owned(),
        reason,
    })?;
    if value.contains('\0') {
        return Err(DocumentError::ParseEnv {
            input: input.to_owned(),
            reason: "the value contains a NUL byte".into(),
        });
    }
    Ok((name.to_owned(), value.to_owned()))
}

/// Whether `name` is a portable environment variable name: a letter or `_`,
/// then letters, digits or `_`.
pub(crate) fn check_env_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a variable name (use letters, digits and '_', not starting with a digit)"
        ))
    }
}

/// Why a value for the policy's boundary types was refused outside a file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    /// [`parse_env_assignment`] refused its input.
    #[error("invalid --env {input:?}: {reason}")]
    ParseEnv {
        /// The text as given.
        input: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_assignments() {
        assert_eq!(
            parse_env_assignment("A=b=c").unwrap(),
            ("A".to_owned(), "b=c".to_owned())
        );
        assert_eq!(
            parse_env_assignment("_X=").unwrap(),
            ("_X".to_owned(), String::new())
        );
        let err = |s: &str| parse_env_assignment(s).unwrap_err().to_string();
        assert!(err("NOEQUALS").contains("missing '='"));
        assert!(err("1A=b").contains("not a variable name"));
        assert!(err("A-B=c").contains("not a variable name"));
        assert!(err("=c").contains("not a variable name"));
        assert!(err("A=\0").contains("NUL"));
    }
}
