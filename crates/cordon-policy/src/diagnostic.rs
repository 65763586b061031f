//! Located messages about a policy file: `file:line:column: message (help)`.

use std::fmt;

use serde::Serialize;

/// How serious a [`Diagnostic`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The policy is refused.
    Error,
    /// The policy loads, but something in it is probably not what its author
    /// meant.
    Warning,
}

/// One located message. Displays as
/// `policy.toml:12:1: unknown key "wirte" in [filesystem] (did you mean "write"?)`;
/// warnings carry `warning: ` before the message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// The file as the caller named it.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// What is wrong.
    pub message: String,
    /// What to do about it, when there is something to say.
    pub help: Option<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        f.write_str(&self.message)?;
        if let Some(help) = &self.help {
            write!(f, " ({help})")?;
        }
        Ok(())
    }
}

/// A source text and its name, turning byte offsets into lines and columns.
#[derive(Debug, Clone)]
pub(crate) struct Source<'a> {
    pub name: String,
    pub text: &'a str,
    line_starts: Vec<usize>,
}

impl<'a> Source<'a> {
    pub fn new(name: impl Into<String>, text: &'a str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Source {
            name: name.into(),
            text,
            line_starts,
        }
    }

    /// 1-based line and character column of a byte offset (clamped to the
    /// text).
    pub fn line_column(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = self.line_starts.partition_point(|&s| s <= offset).max(1);
        let start = self.line_starts[line - 1];
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count())
            + 1;
        (line, column)
    }

    pub fn diagnostic(
        &self,
        severity: Severity,
        offset: usize,
        message: impl Into<String>,
        help: Option<String>,
    ) -> Diagnostic {
        let (line, column) = self.line_column(offset);
        Diagnostic {
            severity,
            file: self.name.clone(),
            line,
            column,
            message: message.into(),
            help,
        }
    }
}

/// The candidate closest to `word` by edit distance, if it is close enough to
/// be a plausible typo (at most a third of the word's length, at least 1).
pub(crate) fn suggest<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .iter()
        .map(|c| (edit_distance(word, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, c)| c)
}

/// "did you mean ...?" help for `word` among `candidates`, or a list of the
/// valid choices when nothing is close.
pub(crate) fn did_you_mean(word: &str, candidates: &[&str]) -> String {
    match suggest(word, candidates) {
        Some(c) => format!("did you mean \"{c}\"?"),
        None => {
            let quoted: Vec<String> = candidates.iter().map(|c| format!("\"{c}\"")).collect();
            format!("expected one of {}", quoted.join(", "))
        }
    }
}

/// Levenshtein distance over characters, with adjacent transpositions
/// counting as one edit (`wirte` → `write` is 1).
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev2 = vec![0usize; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0usize; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(prev2[j - 2] + 1);
            }
            cur[j] = best;
        }
        std::mem::swap(&mut prev2, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based_characters() {
        let s = Source::new("p.toml", "ab\nçd\n\nx");
        assert_eq!(s.line_column(0), (1, 1));
        assert_eq!(s.line_column(1), (1, 2));
        assert_eq!(s.line_column(3), (2, 1));
        assert_eq!(s.line_column(5), (2, 2), "ç is one column though two bytes");
        assert_eq!(s.line_column(7), (3, 1));
        assert_eq!(s.line_column(8), (4, 1));
        assert_eq!(s.line_column(999), (4, 2));
    }

    #[test]
    fn suggestions_catch_typos_only() {
        let keys = ["read", "write", "exec"];
        assert_eq!(suggest("wirte", &keys), Some("write"));
        assert_eq!(suggest("raed", &keys), Some("read"));
        assert_eq!(suggest("exe", &keys), Some("exec"));
        assert_eq!(suggest("network", &keys), None);
        assert_eq!(did_you_mean("wirte", &keys), "did you mean \"write\"?");
        assert_eq!(
            did_you_mean("zzz", &keys),
            "expected one of \"read\", \"write\", \"exec\""
        );
    }

    #[test]
    fn displays_in_the_documented_format() {
        let d = Diagnostic {
            severity: Severity::Error,
            file: "policy.toml".into(),
            line: 12,
            column: 1,
            message: "unknown key \"wirte\" in [filesystem]".into(),
            help: Some("did you mean \"write\"?".into()),
        };
        assert_eq!(
            d.to_string(),
            "policy.toml:12:1: unknown key \"wirte\" in [filesystem] (did you mean \"write\"?)"
        );
        let w = Diagnostic {
            severity: Severity::Warning,
            help: None,
            ..d
        };
        assert_eq!(
            w.to_string(),
            "policy.toml:12:1: warning: unknown key \"wirte\" in [filesystem]"
        );
    }
}
