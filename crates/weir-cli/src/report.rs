//! How the CLI says why it failed: one line of context and cause, each said once.
//!
//! weir's error types quote their cause in their own message (`cannot listen on
//! 127.0.0.1:80: permission denied`) and also expose it as `source()`, so a
//! library caller that prints only the top error still learns the cause. anyhow's
//! `{:#}` prints the whole chain, which then said every cause twice or three times
//! (`invalid configuration: X: invalid configuration: X: X`). This module owns
//! only the printing; it does not change any error.

/// `error` and its causes joined by `: `, leaving out a cause whose text the
/// message before it already carries.
pub fn describe(error: &anyhow::Error) -> String {
    let mut said = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if said.is_empty() {
            said = text;
        } else if !said.contains(&text) {
            said.push_str(": ");
            said.push_str(&text);
        }
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("invalid configuration:\n{0}")]
    struct Quoting(#[source] std::io::Error);

    #[test]
    fn a_cause_the_message_quotes_is_said_once() {
        let quoted = anyhow::Error::from(Quoting(std::io::Error::other("line 6: bad key")));
        assert_eq!(describe(&quoted), "invalid configuration:\nline 6: bad key");
    }

    #[test]
    fn a_cause_behind_plain_context_is_still_said() {
        let e = anyhow::Error::from(std::io::Error::other("permission denied"))
            .context("writing the ready file");
        assert_eq!(describe(&e), "writing the ready file: permission denied");
    }
}
