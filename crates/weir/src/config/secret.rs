//! A configured secret: a signing key, a password, a token, a URL that may
//! carry a password. It reads as the string it is, and never shows in a
//! `Debug` (a config dumped in a log, a panic message, a test's failure).
//!
//! Owns: the type. Does not: load secrets (the config loader does, `${ENV}`
//! included) or check their strength (each stage that uses one does).

use serde::Deserialize;

/// A string the configuration holds that must not be printed.
#[derive(Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The secret itself, for the code that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"[redacted]\"")
    }
}

impl std::ops::Deref for Secret {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Secret {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl AsRef<[u8]> for Secret {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Secret {
        Secret(text.to_owned())
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Secret {
        Secret(text)
    }
}

#[cfg(test)]
mod tests {

    /// Regression (issue 54): `ChallengeConfig` derived `Debug` with its keys.
    #[test]
    fn no_secret_in_any_debug() {
        let key = "0123456789abcdef0123456789abcdef-the-key";
        let challenge = crate::challenge::ChallengeConfig {
            keys: vec![key.into()],
            ..Default::default()
        };
        let toml = format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n[pools.app]\nservers = [\"127.0.0.1:1\"]\n\
             [admin]\ntoken = \"{key}\"\n[state]\nredis_url = \"redis://:{key}@127.0.0.1/\"\n\
             [state.redis_sentinel]\nmaster = \"m\"\nnodes = [\"127.0.0.1:26379\"]\npassword = \"{key}\"\n\
             [sessions.signed_cookie]\ncookie = \"s\"\nkeys = [\"{key}\"]\n\
             [challenge]\nkeys = [\"{key}\"]\n"
        );
        let config: crate::config::Config = toml::from_str(&toml).unwrap();
        for shown in [
            format!("{challenge:?}"),
            format!("{config:?}"),
            format!("{config:#?}"),
        ] {
            assert!(!shown.contains("the-key"), "a secret in Debug: {shown}");
            assert!(shown.contains("[redacted]"));
        }
        assert_eq!(config.admin.token.as_deref(), Some(key));
    }
}
