//! `${VAR}` and `${VAR:-default}` substitution.
//!
//! Substitution happens on the raw text before parsing, and never introduces
//! line breaks, so TOML error line numbers still match the file on disk.
//! Lookups go through [`Env`] so tests pass a map instead of mutating the
//! process environment.

use std::borrow::Cow;
use std::collections::HashMap;

/// A source of environment values.
pub trait Env {
    fn get(&self, name: &str) -> Option<String>;
}

/// The real process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Env for HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).cloned()
    }
}

/// A substitution that could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubstError {
    pub line: usize,
    pub message: String,
}

/// Replaces `${NAME}` and `${NAME:-default}` in `text`. `$$` is a literal `$`.
/// All problems are collected, one per occurrence.
pub fn substitute(text: &str, env: &dyn Env) -> Result<String, Vec<SubstError>> {
    let mut out = String::with_capacity(text.len());
    let mut errors = Vec::new();
    let mut rest = text;
    let mut line = 1;
    while let Some(pos) = rest.find('$') {
        let (before, after) = rest.split_at(pos);
        line += before.matches('\n').count();
        out.push_str(before);
        if let Some(tail) = after.strip_prefix("$$") {
            out.push('$');
            rest = tail;
            continue;
        }
        let Some(body_start) = after.strip_prefix("${") else {
            out.push('$');
            rest = &after[1..];
            continue;
        };
        let Some(end) = body_start.find('}') else {
            errors.push(SubstError {
                line,
                message: "unterminated `${`: expected `}`".into(),
            });
            out.push_str(after);
            rest = "";
            break;
        };
        let body = &body_start[..end];
        rest = &body_start[end + 1..];
        match expand(body, env, line) {
            Ok(value) => out.push_str(&value),
            Err(e) => errors.push(e),
        }
    }
    out.push_str(rest);
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The replacement for one `${body}` (`NAME` or `NAME:-default`) on
/// `line`: the variable's value, or the default when it is unset or empty.
fn expand<'a>(body: &'a str, env: &dyn Env, line: usize) -> Result<Cow<'a, str>, SubstError> {
    let (name, default) = match body.split_once(":-") {
        Some((n, d)) => (n, Some(d)),
        None => (body, None),
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(SubstError {
            line,
            message: format!("`${{{body}}}` is not a valid variable name"),
        });
    }
    match (env.get(name), default) {
        (Some(v), _) if !(v.is_empty() && default.is_some()) => {
            if v.contains('\n') {
                Err(SubstError {
                    line,
                    message: format!("{name} contains a line break, which is not allowed"),
                })
            } else {
                Ok(Cow::Owned(v))
            }
        }
        (_, Some(d)) => Ok(Cow::Borrowed(d)),
        (None, None) | (Some(_), None) => Err(SubstError {
            line,
            message: format!(
                "{name} is not set and `${{{name}}}` has no default (use `${{{name}:-value}}`)"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> HashMap<String, String> {
        [("PORT", "8080"), ("EMPTY", ""), ("RATE", "20")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn substitution_table() {
        let ok = [
            ("a = ${PORT}", "a = 8080"),
            ("a = ${MISSING:-9}", "a = 9"),
            ("a = ${EMPTY:-x}", "a = x"),
            ("a = \"${RATE}/${PORT}\"", "a = \"20/8080\""),
            ("price = $$5", "price = $5"),
            ("plain $ sign", "plain $ sign"),
            ("a = ${MISSING:-}", "a = "),
        ];
        for (input, want) in ok {
            assert_eq!(substitute(input, &env()).unwrap(), want, "{input}");
        }
    }

    #[test]
    fn errors_name_variable_and_line() {
        let errs = substitute("a = 1\nb = ${NOPE}\nc = ${bad-name}\nd = ${X", &env()).unwrap_err();
        assert_eq!(errs.len(), 3);
        assert_eq!(errs[0].line, 2);
        assert!(errs[0].message.contains("NOPE"));
        assert_eq!(errs[1].line, 3);
        assert_eq!(errs[2].line, 4);
        assert!(errs[2].message.contains("unterminated"));
    }
}
