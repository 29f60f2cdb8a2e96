//! Compiling what proves a client: `[sessions]` (a signed cookie, an auth
//! sub-request to the app), `[challenge]`, and the low-rate signal of
//! `[rules]`.

use std::sync::Arc;
use std::time::Duration;

use super::Gateway;
use crate::config::{
    AuthSubrequestSettings, ConfigError, KeyPath, LoadedConfig, SignedCookieConfig,
};
use crate::identity::session::{
    AuthSubrequest, AuthSubrequestConfig, SessionVerifier, SignedCookie, SigningKeys,
    SystemWallClock,
};
use crate::upstream::Pool;
use weir_limiter::Quota;

/// The session verifier; the previous gateway's (with its cache of
/// answers) when `[sessions]` did not change.
pub(super) fn sessions(
    loaded: &LoadedConfig,
    previous: Option<&Gateway>,
    pools: &[Arc<Pool>],
    errors: &mut Vec<ConfigError>,
) -> Option<Arc<SessionVerifier>> {
    match previous {
        Some(p) if p.loaded.config.sessions == loaded.config.sessions => p.sessions.clone(),
        _ => build_sessions(loaded, pools, errors),
    }
}

/// The challenge: `[challenge]` as configured, or with none, the learned
/// one's defaults (every class `learned` unless it says otherwise); `None`
/// only with `enabled = false`, when no class may ask for one. Without
/// `keys`, the key is weir's own ([`crate::challenge::keyfile`]).
pub(super) fn challenger(
    loaded: &LoadedConfig,
    errors: &mut Vec<ConfigError>,
) -> Option<Arc<crate::challenge::Challenger>> {
    use crate::challenge::ChallengeMode;
    let cfg = &loaded.config;
    let root = KeyPath::root();
    let mut c = cfg.challenge.clone().unwrap_or_default();
    if !c.enabled {
        for (name, class) in &cfg.classes {
            if matches!(
                class.challenge,
                ChallengeMode::UnderPressure | ChallengeMode::Always
            ) {
                errors.push(loaded.error_at(
                    &root.key("classes").key(name).key("challenge"),
                    "challenges while `challenge.enabled = false`",
                ));
            }
        }
        return None;
    }
    if c.keys.is_empty() {
        let keys = crate::challenge::keyfile::signing_keys(&cfg.state);
        c.keys.extend(keys.into_iter().map(Into::into));
    }
    match crate::challenge::Challenger::new(&c) {
        Ok(ch) => Some(Arc::new(ch)),
        Err(e) => {
            errors.push(loaded.error_at(&root.key("challenge"), e.to_string()));
            None
        }
    }
}

/// The visit cookie (`[visit]`), signed with the challenge's keys when it
/// has some, else with weir's own key (the challenge's, from the state
/// directory); `None` with `visit.enabled = false`.
pub(super) fn visits(
    loaded: &LoadedConfig,
    errors: &mut Vec<ConfigError>,
) -> Option<Arc<crate::visit::Visits>> {
    let cfg = &loaded.config;
    if !cfg.visit.enabled {
        return None;
    }
    let configured = cfg.challenge.as_ref().map(|c| c.keys.as_slice());
    let secrets = match configured {
        Some(keys) if !keys.is_empty() => keys.to_vec(),
        _ => (crate::challenge::keyfile::signing_keys(&cfg.state).into_iter())
            .map(Into::into)
            .collect(),
    };
    let secure = (cfg.challenge.as_ref()).map_or_else(Default::default, |c| c.secure_cookies);
    match crate::visit::Visits::new(&cfg.visit, &secrets, secure) {
        Ok(v) => Some(Arc::new(v)),
        Err(e) => {
            errors.push(loaded.error_at(&KeyPath::root().key("visit"), e.to_string()));
            None
        }
    }
}

/// `rules.low_rate_per_minute` as a quota: below it a refused client counts
/// as possibly a person (`low_rate`).
pub(super) fn low_rate(loaded: &LoadedConfig, errors: &mut Vec<ConfigError>) -> Option<Quota> {
    let per_minute = loaded.config.rules.low_rate_per_minute.max(1);
    match Quota::new(per_minute, Duration::from_secs(60), per_minute) {
        Ok(q) => Some(q),
        Err(e) => {
            errors.push(loaded.error_at(
                &KeyPath::root().key("rules").key("low_rate_per_minute"),
                e.to_string(),
            ));
            None
        }
    }
}

/// Builds the session verifier from `[sessions]`, or `None` when neither
/// method is configured.
fn build_sessions(
    loaded: &LoadedConfig,
    pools: &[Arc<Pool>],
    errors: &mut Vec<ConfigError>,
) -> Option<Arc<SessionVerifier>> {
    let cfg = &loaded.config.sessions;
    let at = KeyPath::root().key("sessions");
    let before = errors.len();
    let signed = cfg
        .signed_cookie
        .as_ref()
        .and_then(|s| build_signed_cookie(loaded, s, &at, errors));
    let subrequest = cfg
        .auth_subrequest
        .as_ref()
        .and_then(|a| build_auth_subrequest(loaded, a, pools, &at, errors));
    if errors.len() > before || (signed.is_none() && subrequest.is_none()) {
        return None;
    }
    Some(Arc::new(SessionVerifier::new(
        signed,
        subrequest,
        Arc::new(SystemWallClock),
    )))
}

/// The signed-cookie method from `[sessions.signed_cookie]`, or `None`
/// (with the errors reported) when its keys are invalid.
fn build_signed_cookie(
    loaded: &LoadedConfig,
    s: &SignedCookieConfig,
    at: &KeyPath,
    errors: &mut Vec<ConfigError>,
) -> Option<SignedCookie> {
    let at = at.key("signed_cookie");
    if s.cookie.trim().is_empty() {
        errors.push(loaded.error_at(&at.key("cookie"), "a cookie name is required"));
    }
    match SigningKeys::new(&s.keys) {
        Ok(keys) => Some(SignedCookie::new(&s.cookie, keys)),
        Err(e) => {
            errors.push(loaded.error_at(&at.key("keys"), e.to_string()));
            None
        }
    }
}

/// The auth-subrequest method from `[sessions.auth_subrequest]`, asking the
/// first server of its pool, or `None` (with the errors reported).
fn build_auth_subrequest(
    loaded: &LoadedConfig,
    a: &AuthSubrequestSettings,
    pools: &[Arc<Pool>],
    at: &KeyPath,
    errors: &mut Vec<ConfigError>,
) -> Option<AuthSubrequest> {
    let at = at.key("auth_subrequest");
    let Some(server) = pools
        .iter()
        .find(|p| &*p.name == a.pool.as_str())
        .and_then(|p| p.servers.first())
    else {
        errors.push(loaded.error_at(&at.key("pool"), format!("no pool named `{}`", a.pool)));
        return None;
    };
    let cookies: Vec<&str> = a.cookies.iter().map(String::as_str).collect();
    let mut c = AuthSubrequestConfig::new(server.addr, &cookies);
    c.path = a.path.clone();
    c.user_header = match a
        .user_header
        .as_deref()
        .map(|h| http::HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes()))
    {
        None => None,
        Some(Ok(h)) => Some(h),
        Some(Err(_)) => {
            errors.push(loaded.error_at(&at.key("user_header"), "not a header name"));
            None
        }
    };
    c.required_cookies = a.required_cookies.clone();
    c.user_json = a.user_json_pointer.clone();
    c.timeout = a.timeout.0;
    c.verified_ttl = a.verified_ttl.0;
    c.denied_ttl = a.denied_ttl.0;
    c.unknown_ttl = a.unknown_ttl.0;
    c.max_entries = a.max_entries;
    c.max_in_flight = a.max_in_flight;
    match AuthSubrequest::new(c, Arc::new(weir_limiter::MonotonicClock)) {
        Ok(s) => Some(s),
        Err(e) => {
            errors.push(loaded.error_at(&at, e.to_string()));
            None
        }
    }
}
