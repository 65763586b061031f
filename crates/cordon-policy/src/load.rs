//! Reading a policy file: TOML text in, a validated [`Policy`] (or every
//! problem, located) out.
//!
//! This module does no I/O. The caller passes the file's text, the name to
//! use in messages, the directory that relative paths are relative to, and a
//! reader for `cedar_file` (which it may refuse). Validation is strict and
//! collects every problem rather than stopping at the first: unknown keys
//! (with a "did you mean"), wrong types, a writable `/`, a `/0` allow entry
//! without `i_understand = true`, invalid Cedar (located in the TOML file for
//! inline text, in the `.cedar` file otherwise), and more; see
//! `docs/policy.md`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::cedar::{CedarRules, Problem, RESERVED_IDS, valid_rule_id};
use crate::diagnostic::{Diagnostic, Severity, Source, did_you_mean};
use crate::document::{Actions, Filesystem, Limits, Network, Policy, Process, check_env_name};
use crate::net::{NetDest, NetMode};
use crate::paths;
use crate::sequence::{Condition, Field, SequenceDecision, SequenceRule, Step};
use crate::units;

/// The most steps a sequence rule may have.
pub const MAX_STEPS: usize = 64;

/// Host paths whose writability deserves a warning: a command that may
/// write them (or an ancestor) can change the host itself.
const CRITICAL: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/sbin", "/sys", "/usr",
    "/var",
];

const SECTIONS: &[&str] = &[
    "filesystem",
    "network",
    "limits",
    "process",
    "actions",
    "sequence",
];

/// A loaded policy and the warnings about it.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The policy.
    pub policy: Policy,
    /// Things that are allowed but probably not meant.
    pub warnings: Vec<Diagnostic>,
}

/// Why a policy file was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// The file has errors; `diagnostics` holds every error and warning, in
    /// file order.
    #[error("{}", render(diagnostics))]
    Invalid {
        /// The file as the caller named it.
        file: String,
        /// Every error and warning found.
        diagnostics: Vec<Diagnostic>,
    },
}

impl LoadError {
    /// All diagnostics (errors and warnings).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            LoadError::Invalid { diagnostics, .. } => diagnostics,
        }
    }
}

fn render(diagnostics: &[Diagnostic]) -> String {
    let lines: Vec<String> = diagnostics.iter().map(ToString::to_string).collect();
    lines.join("\n")
}

/// Loads a policy from `text`.
///
/// - `file` names the file in messages (e.g. `policies/agent.toml`); it also
///   names a `cedar_file` in messages, joined onto its directory.
/// - `base_dir` is the directory relative paths in the file (in
///   `[filesystem]`, `[process] cwd` and `cedar_file`) are relative to: the
///   policy file's directory, made absolute. Resolution is lexical.
/// - `read` returns the text of a `cedar_file` at the resolved path, or an
///   error message.
pub fn load(
    file: &str,
    text: &str,
    base_dir: &Path,
    read: &mut dyn FnMut(&Path) -> Result<String, String>,
) -> Result<Loaded, LoadError> {
    let mut walker = Walker {
        src: Source::new(file, text),
        base_dir,
        diagnostics: Vec::new(),
        extra: Vec::new(),
    };
    let policy = walker.document(read);
    let Walker {
        mut diagnostics,
        extra,
        ..
    } = walker;
    // Main file first, in file order; then other files.
    diagnostics.sort_by_key(|d| (d.line, d.column));
    diagnostics.extend(extra);
    if diagnostics.iter().any(|d| d.severity == Severity::Error) {
        return Err(LoadError::Invalid {
            file: file.to_owned(),
            diagnostics,
        });
    }
    Ok(Loaded {
        policy,
        warnings: diagnostics,
    })
}

/// Loads a policy that may not use `cedar_file` (no reader is available).
pub fn parse(file: &str, text: &str, base_dir: &Path) -> Result<Loaded, LoadError> {
    load(file, text, base_dir, &mut |_| {
        Err("no files can be read here (use inline cedar = '''...''')".into())
    })
}

type Value<'i> = Spanned<DeValue<'i>>;

struct Walker<'a> {
    src: Source<'a>,
    base_dir: &'a Path,
    diagnostics: Vec<Diagnostic>,
    /// Diagnostics located in other files (cedar_file).
    extra: Vec<Diagnostic>,
}

fn start<T>(v: &Spanned<T>) -> usize {
    v.span().start
}

fn type_name(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a date",
        DeValue::Array(_) => "a list",
        DeValue::Table(_) => "a table",
    }
}

impl<'a> Walker<'a> {
    fn error(&mut self, offset: usize, message: impl Into<String>, help: Option<String>) {
        let d = self.src.diagnostic(Severity::Error, offset, message, help);
        self.diagnostics.push(d);
    }

    fn warn(&mut self, offset: usize, message: impl Into<String>, help: Option<String>) {
        let d = self
            .src
            .diagnostic(Severity::Warning, offset, message, help);
        self.diagnostics.push(d);
    }

    fn document(&mut self, read: &mut dyn FnMut(&Path) -> Result<String, String>) -> Policy {
        let mut policy = Policy::default();
        let (root, errors) = DeTable::parse_recoverable(self.src.text);
        if !errors.is_empty() {
            for e in errors {
                let offset = e.span().map_or(0, |s| s.start);
                self.error(
                    offset,
                    format!("invalid TOML: {}", e.message().trim_end()),
                    None,
                );
            }
            return policy;
        }
        let root = root.get_ref();
        for (key, value) in root.iter() {
            match key.get_ref().as_ref() {
                "filesystem" => {
                    if let Some(t) = self.table(value, "[filesystem]") {
                        policy.filesystem = self.filesystem(t);
                    }
                }
                "network" => {
                    if let Some(t) = self.table(value, "[network]") {
                        policy.network = self.network(t, start(value));
                    }
                }
                "limits" => {
                    if let Some(t) = self.table(value, "[limits]") {
                        policy.limits = self.limits(t);
                    }
                }
                "process" => {
                    if let Some(t) = self.table(value, "[process]") {
                        policy.process = self.process(t);
                    }
                }
                "actions" => {
                    if let Some(t) = self.table(value, "[actions]") {
                        policy.actions = self.actions(t, start(value), read);
                    }
                }
                "sequence" => policy.sequences = self.sequences(value),
                other => {
                    let help = if other == "sequences" {
                        "did you mean \"sequence\"? (write [[sequence]])".to_owned()
                    } else {
                        did_you_mean(other, SECTIONS)
                    };
                    self.error(start(key), format!("unknown section [{other}]"), Some(help));
                }
            }
        }
        self.cross_check(&policy, root);
        policy
    }

    /// Rule ids must be unique across Cedar and sequence rules.
    fn cross_check(&mut self, policy: &Policy, root: &DeTable<'_>) {
        let cedar: BTreeSet<&str> = policy.actions.rules.iter().map(|r| r.id.as_str()).collect();
        let Some(DeValue::Array(items)) = root.get("sequence").map(Spanned::get_ref) else {
            return;
        };
        for item in items.iter() {
            let Some(name) = item.get_ref().get("name") else {
                continue;
            };
            if let Some(n) = name.get_ref().as_str()
                && cedar.contains(n)
            {
                self.error(
                    start(name),
                    format!("sequence name {n:?} is also the @id of a cedar rule"),
                    Some("rule ids must be unique, so decisions name one rule".into()),
                );
            }
        }
    }

    fn table<'v, 'i>(&mut self, value: &'v Value<'i>, what: &str) -> Option<&'v DeTable<'i>> {
        match value.get_ref() {
            DeValue::Table(t) => Some(t),
            other => {
                self.error(
                    start(value),
                    format!("{what} must be a table, found {}", type_name(other)),
                    Some(format!("write it as a section: {what}")),
                );
                None
            }
        }
    }

    /// Reports keys of `table` not in `allowed`; returns nothing, the caller
    /// ignores such keys.
    fn check_keys(&mut self, table: &DeTable<'_>, allowed: &[&str], section: &str) {
        for (key, _) in table.iter() {
            let k: &str = key.get_ref().as_ref();
            if !allowed.contains(&k) {
                self.error(
                    start(key),
                    format!("unknown key {k:?} in {section}"),
                    Some(did_you_mean(k, allowed)),
                );
            }
        }
    }

    fn string<'v>(&mut self, value: &'v Value<'_>, what: &str, example: &str) -> Option<&'v str> {
        match value.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.error(
                    start(value),
                    format!("{what} must be a string, found {}", type_name(other)),
                    Some(format!("write e.g. {example}")),
                );
                None
            }
        }
    }

    fn boolean(&mut self, value: &Value<'_>, what: &str) -> Option<bool> {
        match value.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            other => {
                self.error(
                    start(value),
                    format!("{what} must be true or false, found {}", type_name(other)),
                    None,
                );
                None
            }
        }
    }

    /// A non-negative integer.
    fn integer(&mut self, value: &Value<'_>, what: &str, example: &str) -> Option<u64> {
        match value.get_ref() {
            DeValue::Integer(i) => {
                let n = i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()).ok();
                match n {
                    Some(n) if n < 0 => {
                        self.error(
                            start(value),
                            format!("{what} must not be negative"),
                            Some(format!("write e.g. {example}")),
                        );
                        None
                    }
                    Some(n) => u64::try_from(n).ok(),
                    None => {
                        self.error(start(value), format!("{what} is too large"), None);
                        None
                    }
                }
            }
            other => {
                self.error(
                    start(value),
                    format!("{what} must be a whole number, found {}", type_name(other)),
                    Some(format!("write e.g. {example}")),
                );
                None
            }
        }
    }

    /// A list of strings with their offsets.
    fn strings(&mut self, value: &Value<'_>, what: &str, example: &str) -> Vec<(String, usize)> {
        let DeValue::Array(items) = value.get_ref() else {
            self.error(
                start(value),
                format!(
                    "{what} must be a list of strings, found {}",
                    type_name(value.get_ref())
                ),
                Some(format!("write e.g. {example}")),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for item in items.iter() {
            match item.get_ref() {
                DeValue::String(s) => out.push((s.to_string(), start(item))),
                other => self.error(
                    start(item),
                    format!(
                        "{what} must contain only strings, found {}",
                        type_name(other)
                    ),
                    Some(format!("write e.g. {example}")),
                ),
            }
        }
        out
    }

    /// A path from the file, resolved against the base directory.
    fn path(&mut self, text: &str, offset: usize, what: &str) -> Option<PathBuf> {
        if text.is_empty() {
            self.error(
                offset,
                format!("empty path in {what}"),
                Some("write e.g. \"./workspace\"".into()),
            );
            return None;
        }
        if text.contains('\0') {
            self.error(offset, format!("path in {what} contains a NUL byte"), None);
            return None;
        }
        if text.starts_with('~') {
            self.error(
                offset,
                format!("{text:?} in {what}: '~' is not expanded"),
                Some("write the absolute path, or a path relative to the policy file".into()),
            );
            return None;
        }
        Some(paths::resolve(self.base_dir, Path::new(text)))
    }

    /// Paths with their offsets; a path listed twice is reported and kept
    /// once.
    fn path_list(&mut self, value: &Value<'_>, what: &str) -> Vec<(PathBuf, usize)> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for (text, offset) in self.strings(value, what, "[\"/usr\", \"./workspace\"]") {
            if let Some(p) = self.path(&text, offset, what) {
                if seen.insert(p.clone()) {
                    out.push((p, offset));
                } else {
                    self.warn(offset, format!("{what} lists {} twice", p.display()), None);
                }
            }
        }
        out
    }

    fn filesystem(&mut self, t: &DeTable<'_>) -> Filesystem {
        self.check_keys(t, &["read", "write", "exec"], "[filesystem]");
        let mut fs = Filesystem::default();
        if let Some(v) = t.get("read") {
            for (p, offset) in self.path_list(v, "[filesystem] read") {
                if p == Path::new("/") {
                    self.warn(
                        offset,
                        "[filesystem] read includes \"/\": the command may read every file on the host, secrets included",
                        Some("name the directories it needs, e.g. \"/usr\"".into()),
                    );
                }
                fs.read.push(p);
            }
        }
        if let Some(v) = t.get("write") {
            let what = "[filesystem] write";
            let mut seen = BTreeSet::new();
            for (text, offset) in self.strings(v, what, "[\"./workspace\"]") {
                let Some(p) = self.path(&text, offset, what) else {
                    continue;
                };
                // Every spelling of "/" ("//", "/./", "/..") is an error where
                // it is written, before duplicates are dropped.
                if p == Path::new("/") {
                    let shown = if text == "/" {
                        String::new()
                    } else {
                        format!(" ({text:?} is \"/\")")
                    };
                    self.error(
                        offset,
                        format!("{what} includes the whole host file system{shown}"),
                        Some(
                            "name the directories the command must change, e.g. \"./workspace\""
                                .into(),
                        ),
                    );
                    continue;
                }
                if !seen.insert(p.clone()) {
                    self.warn(offset, format!("{what} lists {} twice", p.display()), None);
                    continue;
                }
                if let Some(c) = CRITICAL.iter().find(|c| paths::is_within(Path::new(c), &p)) {
                    self.warn(
                        offset,
                        format!(
                            "{what} {} covers {c}: the command could change the host itself",
                            p.display()
                        ),
                        Some("write only to a work directory, e.g. \"./workspace\"".into()),
                    );
                }
                fs.write.push(p);
            }
        }
        if let Some(v) = t.get("exec") {
            fs.exec = Some(
                self.path_list(v, "[filesystem] exec")
                    .into_iter()
                    .map(|(p, _)| p)
                    .collect(),
            );
        }
        fs
    }

    fn network(&mut self, t: &DeTable<'_>, section_offset: usize) -> Network {
        self.check_keys(t, &["mode", "allow", "i_understand"], "[network]");
        let mut net = Network::default();
        let mut mode_offset = section_offset;
        let mut mode_known = true;
        if let Some(v) = t.get("mode") {
            mode_offset = start(v);
            mode_known = false;
            if let Some(s) = self.string(v, "[network] mode", "mode = \"none\"") {
                match NetMode::parse(s) {
                    Ok(m) => {
                        net.mode = m;
                        mode_known = true;
                    }
                    Err(_) => self.error(
                        start(v),
                        format!("unknown network mode {s:?}"),
                        Some(did_you_mean(s, &["none", "host", "allow"])),
                    ),
                }
            }
        }
        if let Some(v) = t.get("i_understand") {
            net.i_understand = self.boolean(v, "[network] i_understand").unwrap_or(false);
        }
        let mut everything = false;
        let mut written = 0;
        if let Some(v) = t.get("allow") {
            let entries = self.strings(
                v,
                "[network] allow",
                "[\"10.1.2.0/24\", \"api.example.com:443\"]",
            );
            written = entries.len();
            for (text, offset) in entries {
                match NetDest::parse(&text) {
                    Ok(dest) => {
                        if dest.is_everything() {
                            everything = true;
                            if !net.i_understand {
                                self.error(
                                    offset,
                                    format!("[network] allow {text:?} allows every address"),
                                    Some("set i_understand = true in [network] if you mean it, or name the destinations".into()),
                                );
                            }
                        }
                        if net.allow.contains(&dest) {
                            self.warn(offset, format!("[network] allow lists {dest} twice"), None);
                        } else {
                            net.allow.push(dest);
                        }
                    }
                    Err(e) => self.error(offset, format!("[network] allow: {e}"), None),
                }
            }
            if mode_known && net.mode != NetMode::Allow && !net.allow.is_empty() {
                self.error(
                    start(v),
                    format!(
                        "[network] allow is only used with mode = \"allow\" (mode is {:?})",
                        net.mode.as_str()
                    ),
                    Some("set mode = \"allow\", or remove allow".into()),
                );
            }
        }
        // (When entries were written but refused, those errors say enough.)
        if net.mode == NetMode::Allow && written == 0 {
            self.error(
                mode_offset,
                "[network] mode = \"allow\" with an empty allow list",
                Some("list destinations in allow, or use mode = \"none\"".into()),
            );
        }
        if net.mode == NetMode::Host {
            self.warn(
                mode_offset,
                "[network] mode = \"host\" shares the host's network: there is no network boundary",
                Some("use mode = \"allow\" with the destinations the command needs".into()),
            );
        }
        if net.i_understand && !everything {
            self.warn(
                t.get("i_understand").map_or(section_offset, start),
                "[network] i_understand = true has no effect: no allow entry covers every address",
                Some("remove it".into()),
            );
        }
        net
    }

    fn limits(&mut self, t: &DeTable<'_>) -> Limits {
        self.check_keys(t, &["memory", "pids", "timeout", "cpu"], "[limits]");
        let mut limits = Limits::default();
        if let Some(v) = t.get("memory") {
            limits.memory = match v.get_ref() {
                DeValue::String(s) => match units::parse_size(s) {
                    Ok(n) => Some(n),
                    Err(e) => {
                        self.error(start(v), format!("[limits] memory: {e}"), None);
                        None
                    }
                },
                DeValue::Integer(_) => {
                    match self.integer(v, "[limits] memory", "memory = \"2G\"") {
                        Some(0) => {
                            self.error(
                                start(v),
                                "[limits] memory = 0 runs nothing",
                                Some("leave the limit out, or write e.g. \"2G\"".into()),
                            );
                            None
                        }
                        n => n,
                    }
                }
                other => {
                    self.error(
                        start(v),
                        format!(
                            "[limits] memory must be a size like \"2G\", found {}",
                            type_name(other)
                        ),
                        None,
                    );
                    None
                }
            };
        }
        if let Some(v) = t.get("pids") {
            limits.pids = match self.integer(v, "[limits] pids", "pids = 256") {
                Some(0) => {
                    self.error(
                        start(v),
                        "[limits] pids = 0 runs nothing",
                        Some("leave the limit out, or write e.g. 256".into()),
                    );
                    None
                }
                Some(n) => match u32::try_from(n) {
                    Ok(n) => Some(n),
                    Err(_) => {
                        self.error(
                            start(v),
                            "[limits] pids is too large",
                            Some("the largest is 4294967295".into()),
                        );
                        None
                    }
                },
                None => None,
            };
        }
        if let Some(v) = t.get("timeout") {
            limits.timeout = match v.get_ref() {
                DeValue::String(s) => match units::parse_duration(s) {
                    Ok(d) => Some(d),
                    Err(e) => {
                        self.error(start(v), format!("[limits] timeout: {e}"), None);
                        None
                    }
                },
                other => {
                    self.error(
                        start(v),
                        format!(
                            "[limits] timeout must be a duration string, found {}",
                            type_name(other)
                        ),
                        Some("write e.g. timeout = \"30m\"".into()),
                    );
                    None
                }
            };
        }
        if let Some(v) = t.get("cpu") {
            let cores = match v.get_ref() {
                DeValue::Integer(_) => self.integer(v, "[limits] cpu", "cpu = 2").map(|n| n as f64),
                DeValue::Float(f) => f.as_str().replace('_', "").parse::<f64>().ok(),
                other => {
                    self.error(
                        start(v),
                        format!(
                            "[limits] cpu must be a number of cores, found {}",
                            type_name(other)
                        ),
                        Some("write e.g. cpu = 1.5".into()),
                    );
                    None
                }
            };
            if let Some(cores) = cores {
                if (0.001..=4096.0).contains(&cores) {
                    // In range, so the product fits in u32.
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let millis = (cores * 1000.0).round() as u32;
                    limits.cpu_millicores = Some(millis);
                } else {
                    self.error(
                        start(v),
                        "[limits] cpu must be between 0.001 and 4096 cores",
                        Some("write e.g. cpu = 1.5".into()),
                    );
                }
            }
        }
        limits
    }

    fn process(&mut self, t: &DeTable<'_>) -> Process {
        self.check_keys(t, &["env", "cwd"], "[process]");
        let mut process = Process::default();
        if let Some(v) = t.get("env")
            && let Some(env) = self.table(v, "[process] env")
        {
            for (key, value) in env.iter() {
                let name: &str = key.get_ref().as_ref();
                if let Err(reason) = check_env_name(name) {
                    self.error(start(key), format!("[process] env: {reason}"), None);
                    continue;
                }
                let what = format!("[process] env {name}");
                if let Some(s) = self.string(value, &what, &format!("{name} = \"1\"")) {
                    if s.contains('\0') {
                        self.error(start(value), format!("{what} contains a NUL byte"), None);
                        continue;
                    }
                    process.env.insert(name.to_owned(), s.to_owned());
                }
            }
        }
        if let Some(v) = t.get("cwd")
            && let Some(s) = self.string(v, "[process] cwd", "cwd = \"./workspace\"")
        {
            process.cwd = self.path(s, start(v), "[process] cwd");
        }
        process
    }

    fn actions(
        &mut self,
        t: &DeTable<'_>,
        section_offset: usize,
        read: &mut dyn FnMut(&Path) -> Result<String, String>,
    ) -> Actions {
        self.check_keys(t, &["cedar", "cedar_file"], "[actions]");
        let mut actions = Actions::default();
        match (t.get("cedar"), t.get("cedar_file")) {
            (Some(_), Some(file)) => {
                self.error(
                    start(file),
                    "[actions] has both cedar and cedar_file",
                    Some("keep one: inline text or a file".into()),
                );
            }
            (None, None) => {
                self.warn(
                    section_offset,
                    "[actions] has no cedar rules: every action will be denied",
                    Some("add cedar = '''...''' or cedar_file = \"agent.cedar\"".into()),
                );
            }
            (Some(v), None) => {
                if let Some(text) = self.string(
                    v,
                    "[actions] cedar",
                    "cedar = '''@id(\"read-ok\") permit(...);'''",
                ) {
                    let text = text.to_owned();
                    let map = ContentMap::new(&self.src.text[v.span()], start(v), &text);
                    match CedarRules::compile(&text) {
                        Ok(rules) => actions.rules = rules.rules().to_vec(),
                        Err(problems) => {
                            for Problem {
                                offset,
                                message,
                                help,
                            } in problems
                            {
                                self.error(map.offset(offset), message, help);
                            }
                        }
                    }
                    actions.source = Some("inline".into());
                    actions.cedar = text;
                }
            }
            (None, Some(v)) => {
                if let Some(name) =
                    self.string(v, "[actions] cedar_file", "cedar_file = \"agent.cedar\"")
                    && let Some(path) = self.path(name, start(v), "[actions] cedar_file")
                {
                    let shown = match Path::new(&self.src.name).parent() {
                        Some(dir) if Path::new(name).is_relative() => {
                            paths::normalize(&dir.join(name)).display().to_string()
                        }
                        _ => name.to_owned(),
                    };
                    match read(&path) {
                        Err(e) => self.error(
                            start(v),
                            format!("cannot read cedar file {name:?} ({}): {e}", path.display()),
                            Some("the path is relative to the policy file's directory".into()),
                        ),
                        Ok(text) => {
                            let cedar_src = Source::new(shown.clone(), &text);
                            match CedarRules::compile(&text) {
                                Ok(rules) => actions.rules = rules.rules().to_vec(),
                                Err(problems) => {
                                    for Problem {
                                        offset,
                                        message,
                                        help,
                                    } in problems
                                    {
                                        self.extra.push(cedar_src.diagnostic(
                                            Severity::Error,
                                            offset,
                                            message,
                                            help,
                                        ));
                                    }
                                    self.error(
                                        start(v),
                                        format!("cedar file {shown} has errors (listed below)"),
                                        None,
                                    );
                                }
                            }
                            actions.source = Some(path.display().to_string());
                            actions.cedar = text;
                        }
                    }
                }
            }
        }
        actions
    }

    fn sequences(&mut self, value: &Value<'_>) -> Vec<SequenceRule> {
        let DeValue::Array(items) = value.get_ref() else {
            self.error(
                start(value),
                format!(
                    "sequence must be a list of tables, found {}",
                    type_name(value.get_ref())
                ),
                Some("write each rule as a [[sequence]] table".into()),
            );
            return Vec::new();
        };
        let mut rules = Vec::new();
        let mut names: BTreeSet<String> = BTreeSet::new();
        for item in items.iter() {
            let Some(t) = self.table(item, "[[sequence]]") else {
                continue;
            };
            if let Some(rule) = self.sequence(t, start(item), &mut names) {
                rules.push(rule);
            }
        }
        rules
    }

    fn sequence(
        &mut self,
        t: &DeTable<'_>,
        offset: usize,
        names: &mut BTreeSet<String>,
    ) -> Option<SequenceRule> {
        const KEYS: &[&str] = &[
            "name",
            "actions",
            "decision",
            "consecutive",
            "within_actions",
            "within_time",
            "reason",
            "where",
        ];
        self.check_keys(t, KEYS, "[[sequence]]");
        let mut ok = true;
        let name = match t.get("name") {
            None => {
                self.error(
                    offset,
                    "[[sequence]] has no name",
                    Some("add name = \"...\": decisions name the rule".into()),
                );
                None
            }
            Some(v) => match self.string(v, "[[sequence]] name", "name = \"prevent-exfiltration\"")
            {
                Some(n) if !valid_rule_id(n) => {
                    self.error(
                        start(v),
                        format!("invalid sequence name {n:?}"),
                        Some("use a non-empty name without spaces".into()),
                    );
                    None
                }
                Some(n) if RESERVED_IDS.contains(&n) => {
                    self.error(
                        start(v),
                        format!("sequence name {n:?} is reserved for the engine's own decisions"),
                        Some("pick another name".into()),
                    );
                    None
                }
                Some(n) if !names.insert(n.to_owned()) => {
                    self.error(
                        start(v),
                        format!("duplicate sequence name {n:?}"),
                        Some("names must be unique".into()),
                    );
                    None
                }
                other => other.map(str::to_owned),
            },
        };
        let label = t
            .get("name")
            .and_then(|v| v.get_ref().as_str())
            .map(str::to_owned);
        let what = |field: &str| match &label {
            Some(n) => format!("sequence {n:?} {field}"),
            None => format!("[[sequence]] {field}"),
        };
        let mut steps: Vec<Step> = Vec::new();
        match t.get("actions") {
            None => {
                self.error(
                    offset,
                    format!("{} is missing", what("actions")),
                    Some("write e.g. actions = [\"download_file\", \"upload_file\"]".into()),
                );
                ok = false;
            }
            Some(v) => {
                let list =
                    self.strings(v, &what("actions"), "[\"download_file\", \"upload_file\"]");
                for (action, at) in &list {
                    if action.is_empty() {
                        self.error(
                            *at,
                            format!("empty action name in {}", what("actions")),
                            None,
                        );
                        ok = false;
                    }
                }
                if list.is_empty() && matches!(v.get_ref(), DeValue::Array(_)) {
                    self.error(
                        start(v),
                        format!("{} is empty", what("actions")),
                        Some("name at least one action".into()),
                    );
                }
                if list.len() > MAX_STEPS {
                    self.error(
                        start(v),
                        format!(
                            "{} has {} steps; the most is {MAX_STEPS}",
                            what("actions"),
                            list.len()
                        ),
                        None,
                    );
                    ok = false;
                }
                steps = list
                    .into_iter()
                    .map(|(action, _)| Step {
                        action,
                        conditions: Vec::new(),
                    })
                    .collect();
            }
        }
        let decision = match t.get("decision") {
            None => {
                self.error(
                    offset,
                    format!("{} is missing", what("decision")),
                    Some("write decision = \"deny\" or decision = \"halt\"".into()),
                );
                None
            }
            Some(v) => match self.string(v, &what("decision"), "decision = \"halt\"") {
                Some("deny") => Some(SequenceDecision::Deny),
                Some("halt") => Some(SequenceDecision::Halt),
                Some(other) => {
                    self.error(
                        start(v),
                        format!("unknown {} {other:?}", what("decision")),
                        Some(did_you_mean(other, &["deny", "halt"])),
                    );
                    None
                }
                None => None,
            },
        };
        let consecutive = t
            .get("consecutive")
            .and_then(|v| self.boolean(v, &what("consecutive")))
            .unwrap_or(false);
        let mut within_actions = None;
        if let Some(v) = t.get("within_actions") {
            match self.integer(v, &what("within_actions"), "within_actions = 20") {
                Some(n) if !steps.is_empty() && n < steps.len() as u64 => {
                    self.error(
                        start(v),
                        format!(
                            "{} = {n} can never be met: the sequence has {} steps",
                            what("within_actions"),
                            steps.len()
                        ),
                        Some(format!("use at least {}", steps.len())),
                    );
                }
                Some(0) => self.error(
                    start(v),
                    format!("{} must be at least 1", what("within_actions")),
                    None,
                ),
                n => within_actions = n,
            }
        }
        let mut within_time = None;
        if let Some(v) = t.get("within_time")
            && let Some(s) = self.string(v, &what("within_time"), "within_time = \"5m\"")
        {
            match units::parse_duration(s) {
                Ok(d) => within_time = Some(d),
                Err(e) => self.error(start(v), format!("{}: {e}", what("within_time")), None),
            }
        }
        let reason = t
            .get("reason")
            .and_then(|v| self.string(v, &what("reason"), "reason = \"...\""))
            .map(str::to_owned);
        if let Some(v) = t.get("where") {
            let conditions: Vec<&Value<'_>> = match v.get_ref() {
                DeValue::Array(items) => items.iter().collect(),
                DeValue::Table(_) => vec![v],
                other => {
                    self.error(
                        start(v),
                        format!("{} must be a table or a list of tables, found {}", what("where"), type_name(other)),
                        Some("write where = { step = 2, field = \"args.destination\", not_in = [\"s3://corp/*\"] }".into()),
                    );
                    Vec::new()
                }
            };
            for c in conditions {
                match self.condition(c, &what("where"), steps.len()) {
                    Some((step, condition)) => {
                        if let Some(s) = steps.get_mut(step) {
                            s.conditions.push(condition);
                        }
                    }
                    None => ok = false,
                }
            }
        }
        if !ok || steps.is_empty() {
            return None;
        }
        Some(SequenceRule {
            name: name?,
            steps,
            decision: decision?,
            consecutive,
            within_actions,
            within_time,
            reason,
        })
    }

    /// One `where` condition: the 0-based step it applies to and the
    /// condition.
    fn condition(&mut self, v: &Value<'_>, what: &str, steps: usize) -> Option<(usize, Condition)> {
        let t = self.table(v, what)?;
        self.check_keys(t, &["step", "field", "in", "not_in"], what);
        let step = match t.get("step") {
            None => {
                self.error(
                    start(v),
                    format!("{what} has no step"),
                    Some("write step = 2 for the second action of the sequence".into()),
                );
                None
            }
            Some(s) => match self.integer(s, &format!("{what} step"), "step = 2") {
                Some(n) if n >= 1 && n <= steps as u64 => usize::try_from(n - 1).ok(),
                Some(n) => {
                    self.error(
                        start(s),
                        format!("{what} step = {n} is not a step of the sequence"),
                        Some(format!("steps are numbered 1 to {steps}")),
                    );
                    None
                }
                None => None,
            },
        };
        let field = match t.get("field") {
            None => {
                self.error(
                    start(v),
                    format!("{what} has no field"),
                    Some("write field = \"args.<name>\" or field = \"resource\"".into()),
                );
                None
            }
            Some(f) => {
                match self.string(f, &format!("{what} field"), "field = \"args.destination\"") {
                    Some(text) => match Field::parse(text) {
                        Some(field) => Some(field),
                        None => {
                            let help = if text.contains('.') || text.is_empty() {
                                "use \"resource\" or \"args.<name>\", e.g. \"args.destination\""
                                    .to_owned()
                            } else {
                                format!(
                                    "use \"resource\" or \"args.<name>\"; did you mean \"args.{text}\"?"
                                )
                            };
                            self.error(
                                start(f),
                                format!("unknown field {text:?} in {what}"),
                                Some(help),
                            );
                            None
                        }
                    },
                    None => None,
                }
            }
        };
        let test = match (t.get("in"), t.get("not_in")) {
            (Some(_), Some(n)) => {
                self.error(
                    start(n),
                    format!("{what} has both in and not_in"),
                    Some("keep one; write two conditions for both".into()),
                );
                None
            }
            (None, None) => {
                self.error(
                    start(v),
                    format!("{what} has neither in nor not_in"),
                    Some("write e.g. not_in = [\"s3://corp-bucket/*\"]".into()),
                );
                None
            }
            (Some(list), None) => Some((false, list)),
            (None, Some(list)) => Some((true, list)),
        };
        let (negated, patterns) = match test {
            Some((negated, list)) => {
                let patterns: Vec<String> = self
                    .strings(
                        list,
                        &format!("{what} patterns"),
                        "[\"s3://corp-bucket/*\"]",
                    )
                    .into_iter()
                    .map(|(s, _)| s)
                    .collect();
                if patterns.is_empty() && matches!(list.get_ref(), DeValue::Array(_)) {
                    self.error(
                        start(list),
                        format!("{what} has an empty pattern list"),
                        Some("list at least one pattern".into()),
                    );
                    return None;
                }
                (negated, patterns)
            }
            None => return None,
        };
        Some((
            step?,
            Condition {
                field: field?,
                negated,
                patterns,
            },
        ))
    }
}

/// Maps byte offsets in a TOML string's *content* back to offsets in the
/// file, given the raw token (quotes included) and where it starts.
struct ContentMap {
    /// For each content byte, its file offset; one extra for the end.
    offsets: Vec<usize>,
    fallback: usize,
}

impl ContentMap {
    fn new(raw: &str, token_start: usize, content: &str) -> Self {
        let fallback = token_start;
        let (open, multiline) = if raw.starts_with("'''") || raw.starts_with("\"\"\"") {
            (3, true)
        } else {
            (1, false)
        };
        let literal = raw.starts_with('\'');
        let mut body_start = open;
        if multiline {
            if raw[open..].starts_with("\r\n") {
                body_start += 2;
            } else if raw[open..].starts_with('\n') {
                body_start += 1;
            }
        }
        let body = &raw[body_start..raw.len().saturating_sub(open).max(body_start)];
        let base = token_start + body_start;
        let offsets = if literal {
            (0..=body.len()).map(|i| base + i).collect()
        } else {
            decode_offsets(body, base)
        };
        // Trust the map only if it describes the content exactly.
        let offsets = if offsets.len() == content.len() + 1 {
            offsets
        } else {
            Vec::new()
        };
        ContentMap { offsets, fallback }
    }

    fn offset(&self, content_offset: usize) -> usize {
        self.offsets
            .get(content_offset)
            .copied()
            .unwrap_or(self.fallback)
    }
}

/// For a basic (double-quoted) string body, the file offset of each byte
/// of the decoded content, plus the end.
fn decode_offsets(body: &str, base: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(body.len() + 1);
    let mut chars = body.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c != '\\' {
            out.extend(
                std::iter::repeat_n(base + i, c.len_utf8())
                    .enumerate()
                    .map(|(k, o)| o + k),
            );
            continue;
        }
        let Some(&(_, e)) = chars.peek() else { break };
        let decoded_len = match e {
            'b' | 't' | 'n' | 'f' | 'r' | '"' | '\\' | 'e' => {
                chars.next();
                1
            }
            'x' | 'u' | 'U' => {
                chars.next();
                let n = match e {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let mut hex = String::new();
                for _ in 0..n {
                    if let Some((_, h)) = chars.next() {
                        hex.push(h);
                    }
                }
                u32::from_str_radix(&hex, 16)
                    .ok()
                    .and_then(char::from_u32)
                    .map_or(1, char::len_utf8)
            }
            w if w.is_whitespace() => {
                // Line-ending backslash: skip white space and newlines.
                while chars.peek().is_some_and(|(_, w)| w.is_whitespace()) {
                    chars.next();
                }
                0
            }
            _ => {
                chars.next();
                1
            }
        };
        out.extend(std::iter::repeat_n(base + i, decoded_len));
    }
    out.push(base + body.len());
    out
}

/// Where the value of a key starts, for callers that build their own
/// messages: used by tests.
#[cfg(test)]
fn span_of(text: &str, needle: &str) -> std::ops::Range<usize> {
    let s = text.find(needle).unwrap_or(0);
    s..s + needle.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_map_handles_literal_and_basic_strings() {
        let text = "x = '''\nabc'''";
        let tok = span_of(text, "'''\nabc'''");
        let m = ContentMap::new(&text[tok.clone()], tok.start, "abc");
        assert_eq!(m.offset(0), text.find('a').unwrap());
        let text = r#"x = "a\tb""#;
        let tok = span_of(text, r#""a\tb""#);
        let m = ContentMap::new(&text[tok.clone()], tok.start, "a\tb");
        assert_eq!(m.offset(2), text.find('b').unwrap());
        let text = "x = \"\"\"\nab \\\n   cd\"\"\"";
        let tok = span_of(text, "\"\"\"\nab");
        let tok = tok.start..text.len();
        let m = ContentMap::new(&text[tok.clone()], tok.start, "ab cd");
        assert_eq!(m.offset(3), text.find('c').unwrap());
        let m = ContentMap::new("\"zz\"", 10, "mismatch");
        assert_eq!(
            m.offset(1),
            10,
            "falls back to the token when the map disagrees"
        );
    }
}
