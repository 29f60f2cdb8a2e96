//! Loading: read a file, substitute `${VAR}`, parse TOML, and report errors
//! that name the file, the line and the key.
//!
//! Semantic checks (unknown pools, bad CIDRs, regexes) happen when the runtime
//! is built, but report through [`LoadedConfig::error_at`] so they carry the
//! same file/line/key context as syntax errors.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::env::{Env, substitute};
use super::schema::Config;

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, when loaded from one.
    pub file: Option<PathBuf>,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// The key, as a dotted path (`pools.app.servers[1]`), when known.
    pub key: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, "{}:{line}: ", file.display())?,
            (Some(file), None) => write!(f, "{}: ", file.display())?,
            (None, Some(line)) => write!(f, "line {line}: ")?,
            (None, None) => {}
        }
        if let Some(key) = &self.key {
            write!(f, "{key}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found in one load; loading reports them all at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// A path to a key in the TOML document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPath(Vec<Segment>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

impl KeyPath {
    pub fn root() -> Self {
        KeyPath(Vec::new())
    }
    pub fn key(&self, k: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Segment::Key(k.to_string()));
        p
    }
    pub fn index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Segment::Index(i));
        p
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            match s {
                Segment::Key(k) if i == 0 => f.write_str(k)?,
                Segment::Key(k) => write!(f, ".{k}")?,
                Segment::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A parsed configuration and the text it came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: Config,
    /// The file it was read from, if any.
    pub path: Option<PathBuf>,
    /// The text after `${VAR}` substitution; used to locate keys.
    text: Arc<str>,
    /// A digest of the file's raw bytes, to notice changes cheaply.
    pub digest: u64,
}

impl LoadedConfig {
    /// An error located at `key`: the line is found in the source text.
    pub fn error_at(&self, key: &KeyPath, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.path.clone(),
            line: locate(&self.text, key),
            key: Some(key.to_string()),
            message: message.into(),
        }
    }
}

/// Reads and parses a configuration file.
pub fn load_file(path: &Path, env: &dyn Env) -> Result<LoadedConfig, ConfigErrors> {
    let raw = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            file: Some(path.to_path_buf()),
            line: None,
            key: None,
            message: format!("cannot read the file: {e}"),
        }])
    })?;
    load_str(&raw, Some(path), env)
}

/// Parses configuration text; `path` only names the source in errors.
pub fn load_str(
    raw: &str,
    path: Option<&Path>,
    env: &dyn Env,
) -> Result<LoadedConfig, ConfigErrors> {
    let file = path.map(Path::to_path_buf);
    let text = substitute(raw, env).map_err(|errs| {
        ConfigErrors(
            errs.into_iter()
                .map(|e| ConfigError {
                    file: file.clone(),
                    line: Some(e.line),
                    key: None,
                    message: e.message,
                })
                .collect(),
        )
    })?;
    let config: Config = toml::from_str(&text).map_err(|e| {
        let line = e.span().map(|s| line_of(&text, s.start));
        // toml's message repeats the source excerpt; keep only its first line.
        let message = e
            .message()
            .lines()
            .next()
            .unwrap_or("invalid TOML")
            .to_string();
        ConfigErrors(vec![ConfigError {
            file: file.clone(),
            line,
            key: None,
            message,
        }])
    })?;
    Ok(LoadedConfig {
        config,
        path: file,
        text: Arc::from(text),
        digest: digest(raw.as_bytes()),
    })
}

/// FNV-1a: enough to notice that a file changed, and to key limits by a
/// header or cookie value (not a defence against chosen collisions).
pub(crate) fn digest(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The line (1-based) of byte `offset` in `text`.
pub fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Where keys are in a TOML text, for errors that name their line: weir's
/// configuration and the lab's scenario files read the same way. Parses
/// the text once, keeping spans (`toml_edit`); a text that does not parse
/// locates nothing.
pub struct TomlLocator<'a> {
    text: &'a str,
    doc: Option<toml_edit::Document<String>>,
}

impl<'a> TomlLocator<'a> {
    pub fn new(text: &'a str) -> TomlLocator<'a> {
        TomlLocator {
            text,
            doc: toml_edit::Document::parse(text.to_string()).ok(),
        }
    }

    /// The line of `key`, or of its deepest parent present in the text.
    pub fn line(&self, key: &KeyPath) -> Option<usize> {
        enum Node<'a> {
            Item(&'a toml_edit::Item),
            Table(&'a toml_edit::Table),
        }
        let mut node = Node::Table(self.doc.as_ref()?.as_table());
        let mut best = None;
        for seg in &key.0 {
            let next = match (&node, seg) {
                (Node::Table(t), Segment::Key(k)) => t.get(k).map(Node::Item),
                (Node::Item(i), Segment::Key(k)) => i.get(k.as_str()).map(Node::Item),
                (Node::Item(toml_edit::Item::ArrayOfTables(a)), Segment::Index(n)) => {
                    a.get(*n).map(Node::Table)
                }
                (Node::Item(i), Segment::Index(n)) => i.get(*n).map(Node::Item),
                (Node::Table(_), Segment::Index(_)) => None,
            };
            let Some(next) = next else { break };
            let span = match &next {
                Node::Item(i) => i.span(),
                Node::Table(t) => t.span(),
            };
            if span.is_some() {
                best = span;
            }
            node = next;
        }
        best.map(|s| line_of(self.text, s.start))
    }

    /// The keys written in the table at `key` (a table, or an element of an
    /// array of tables); none when it is not there.
    pub fn keys_of(&self, key: &KeyPath) -> Vec<String> {
        let Some(doc) = self.doc.as_ref() else {
            return Vec::new();
        };
        let mut item: Option<&toml_edit::Item> = None;
        let mut table: Option<&dyn toml_edit::TableLike> = Some(doc.as_table());
        for seg in &key.0 {
            let next = match (seg, item, table) {
                (Segment::Key(k), _, Some(t)) => t.get(k),
                (Segment::Index(n), Some(toml_edit::Item::ArrayOfTables(a)), _) => {
                    table = a.get(*n).map(|t| t as &dyn toml_edit::TableLike);
                    item = None;
                    continue;
                }
                (Segment::Index(n), Some(i), _) => i.get(*n),
                _ => None,
            };
            item = next;
            table = next.and_then(|i| i.as_table_like());
        }
        table
            .map(|t| t.iter().map(|(k, _)| k.to_string()).collect())
            .unwrap_or_default()
    }
}

/// Finds the line of `key` in `text`. When the full path does not exist,
/// the deepest existing parent is used.
fn locate(text: &str, key: &KeyPath) -> Option<usize> {
    TomlLocator::new(text).line(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn load(text: &str) -> Result<LoadedConfig, ConfigErrors> {
        load_str(text, Some(Path::new("weir.toml")), &HashMap::new())
    }

    #[test]
    fn syntax_error_names_line() {
        let err = load("[[listeners]]\naddress = \"127.0.0.1:80\"\n[pools.app\n").unwrap_err();
        assert_eq!(err.0[0].line, Some(3), "{err}");
        assert!(err.to_string().starts_with("weir.toml:3: "), "{err}");
    }

    #[test]
    fn unknown_key_is_an_error() {
        let err = load("[limits]\nmax_conections = 5\n").unwrap_err();
        assert_eq!(err.0[0].line, Some(2), "{err}");
        assert!(err.to_string().contains("max_conections"), "{err}");
    }

    #[test]
    fn bad_duration_names_value() {
        let err = load("[limits]\n\nheader_read_timeout = \"ten seconds\"\n").unwrap_err();
        assert_eq!(err.0[0].line, Some(3), "{err}");
        assert!(err.to_string().contains("ten seconds"), "{err}");
    }

    #[test]
    fn keys_written_in_a_table() {
        let text =
            "[[cohorts]]\nname = \"a\"\nrate = 1\n[[cohorts]]\nname = \"b\"\n[app]\nworkers = 2\n";
        let at = TomlLocator::new(text);
        let cohort = |n| KeyPath::root().key("cohorts").index(n);
        assert_eq!(at.keys_of(&cohort(0)), ["name", "rate"]);
        assert_eq!(at.keys_of(&cohort(1)), ["name"]);
        assert!(at.keys_of(&cohort(2)).is_empty());
        assert_eq!(at.keys_of(&KeyPath::root().key("app")), ["workers"]);
        assert_eq!(at.line(&cohort(1).key("name")), Some(5));
    }

    #[test]
    fn locate_keys() {
        let text = "[[listeners]]\naddress = \"a\"\n\n[pools.app]\nservers = [\n  \"x\",\n  \"y\",\n]\n[[routes]]\npool = \"app\"\n[[routes]]\npool = \"nope\"\n";
        let cfg = load(text).unwrap();
        let pools = KeyPath::root().key("pools").key("app").key("servers");
        assert_eq!(cfg.error_at(&pools.index(1), "x").line, Some(7));
        let route = KeyPath::root().key("routes").index(1).key("pool");
        assert_eq!(cfg.error_at(&route, "x").line, Some(12));
        assert_eq!(
            cfg.error_at(&route, "x").key.as_deref(),
            Some("routes[1].pool")
        );
    }
}
