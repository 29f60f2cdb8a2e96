//! Who may change weir through the admin API.
//!
//! The admin API listens on loopback, but a browser on that host is a
//! loopback client too: any page it opens can send `POST /reload` there
//! (a "simple" cross-origin request needs no preflight), and with DNS
//! rebinding it can also read the answers. So a request that changes
//! something (any method but `GET` and `HEAD`) must show that no page sent
//! it:
//! - an `Origin`, if present, is the admin API's own (`http://` + `Host`);
//! - `Host` names an IP address or `localhost`, or one of `[admin] hosts`:
//!   a rebinding page reaches weir under a DNS name of its own;
//! - with `[admin] token` set, `Authorization: Bearer TOKEN` (compared in
//!   constant time).
//!
//! Reads (`/metrics`, `/livez`, `/readyz`, `/status`) stay open: scrapers
//! and probes often name weir by a DNS name, and reading changes nothing.
//! This module owns the check, not the listener (`admin::serve`).

use std::net::IpAddr;

use http::{HeaderMap, Method, StatusCode, header};
use subtle::ConstantTimeEq;

/// The shortest `[admin] token` accepted: 128 bits of hex or base64.
pub const MIN_TOKEN_LEN: usize = 16;

/// The admin API's rules for requests that change something, from
/// `[admin]`; rebuilt on reload, so a new token applies at once.
#[derive(Debug, Clone, Default)]
pub struct AdminGuard {
    token: Option<crate::config::Secret>,
    /// Lowercase names (without port) accepted in `Host` besides IP
    /// addresses and `localhost`.
    hosts: Vec<String>,
}

/// Why a mutating request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRefusal {
    /// `Origin` names another site: a web page sent it.
    CrossOrigin,
    /// `Host` is a name weir was not told it has (DNS rebinding).
    ForeignHost,
    /// `[admin] token` is set and the request carries no bearer token.
    MissingToken,
    /// The bearer token is not `[admin] token`.
    WrongToken,
}

impl AdminRefusal {
    pub fn status(self) -> StatusCode {
        match self {
            AdminRefusal::CrossOrigin | AdminRefusal::ForeignHost => StatusCode::FORBIDDEN,
            AdminRefusal::MissingToken | AdminRefusal::WrongToken => StatusCode::UNAUTHORIZED,
        }
    }

    /// The reason in the JSON answer.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminRefusal::CrossOrigin => "cross_origin",
            AdminRefusal::ForeignHost => "foreign_host",
            AdminRefusal::MissingToken => "token_required",
            AdminRefusal::WrongToken => "wrong_token",
        }
    }
}

impl AdminGuard {
    /// Whether `[admin] token` is set (the live page offers a reload only then).
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// `token`: already checked to be at least [`MIN_TOKEN_LEN`] long;
    /// `hosts`: names accepted in `Host`.
    pub fn new(token: Option<crate::config::Secret>, hosts: &[String]) -> AdminGuard {
        AdminGuard {
            token,
            hosts: hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
        }
    }

    /// Whether a request with `method` and `headers` may be served.
    pub fn check(&self, method: &Method, headers: &HeaderMap) -> Result<(), AdminRefusal> {
        if method == Method::GET || method == Method::HEAD {
            return Ok(());
        }
        let host = headers.get(header::HOST).map(|h| h.as_bytes());
        if let Some(origin) = headers.get(header::ORIGIN) {
            let own = host.is_some_and(|h| {
                origin.as_bytes().strip_prefix(b"http://") == Some(h)
                    || origin.as_bytes().strip_prefix(b"https://") == Some(h)
            });
            if !own {
                return Err(AdminRefusal::CrossOrigin);
            }
        }
        // A request without `Host` (HTTP/1.0 tools) came from no browser.
        if let Some(host) = host
            && !self.host_allowed(host)
        {
            return Err(AdminRefusal::ForeignHost);
        }
        let Some(token) = &self.token else {
            return Ok(());
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| bearer(v.as_bytes()))
            .ok_or(AdminRefusal::MissingToken)?;
        if bool::from(given.ct_eq(token.as_bytes())) {
            Ok(())
        } else {
            Err(AdminRefusal::WrongToken)
        }
    }

    /// `Host` (with or without a port) is an IP address, `localhost`, or
    /// one of `hosts`.
    fn host_allowed(&self, host: &[u8]) -> bool {
        let Ok(host) = std::str::from_utf8(host) else {
            return false;
        };
        let name = match host.strip_prefix('[') {
            // `[v6]` or `[v6]:port`
            Some(rest) => match rest.split_once(']') {
                Some((v6, port)) if port.is_empty() || port.starts_with(':') => {
                    return v6.parse::<std::net::Ipv6Addr>().is_ok();
                }
                _ => return false,
            },
            None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
        };
        if name.parse::<IpAddr>().is_ok() || name.eq_ignore_ascii_case("localhost") {
            return true;
        }
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(name))
    }
}

/// The token of `Bearer TOKEN` (the scheme in any case, RFC 9110 §11.1).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| token.trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(fields: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in fields {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn pages_cannot_post() {
        let guard = AdminGuard::default();
        let post = |fields: &[(&str, &str)]| guard.check(&Method::POST, &headers(fields));
        assert_eq!(post(&[("host", "127.0.0.1:9901")]), Ok(()));
        assert_eq!(post(&[("host", "[::1]:9901")]), Ok(()));
        assert_eq!(post(&[("host", "localhost:9901")]), Ok(()));
        assert_eq!(post(&[]), Ok(()));
        assert_eq!(
            post(&[
                ("host", "127.0.0.1:9901"),
                ("origin", "http://127.0.0.1:9901")
            ]),
            Ok(())
        );
        // The request: a page on evil.example, rebound to loopback.
        assert_eq!(
            post(&[("host", "evil.example"), ("origin", "http://evil.example")]),
            Err(AdminRefusal::ForeignHost)
        );
        assert_eq!(
            post(&[
                ("host", "127.0.0.1:9901"),
                ("origin", "http://evil.example")
            ]),
            Err(AdminRefusal::CrossOrigin)
        );
        assert_eq!(
            post(&[("host", "127.0.0.1:9901"), ("origin", "null")]),
            Err(AdminRefusal::CrossOrigin)
        );
        assert_eq!(post(&[("host", "[::1")]), Err(AdminRefusal::ForeignHost));
        assert_eq!(post(&[("host", "[::1]x")]), Err(AdminRefusal::ForeignHost));
        // Reads stay open whatever the names.
        let get = guard.check(
            &Method::GET,
            &headers(&[("host", "evil.example"), ("origin", "http://evil.example")]),
        );
        assert_eq!(get, Ok(()));
    }

    #[test]
    fn named_hosts_and_tokens() {
        let token = "0123456789abcdef0123".to_string();
        let guard = AdminGuard::new(Some(token.as_str().into()), &["Weir-Admin.internal".into()]);
        let post = |fields: &[(&str, &str)]| guard.check(&Method::POST, &headers(fields));
        let auth = format!("Bearer {token}");
        assert_eq!(
            post(&[
                ("host", "weir-admin.internal:9901"),
                ("authorization", &auth)
            ]),
            Ok(())
        );
        assert_eq!(
            post(&[
                ("host", "127.0.0.1"),
                ("authorization", &auth.to_lowercase())
            ]),
            Ok(()),
            "the scheme in any case"
        );
        assert_eq!(
            post(&[("host", "127.0.0.1")]),
            Err(AdminRefusal::MissingToken)
        );
        assert_eq!(
            post(&[("host", "127.0.0.1"), ("authorization", "Basic eDp5")]),
            Err(AdminRefusal::MissingToken)
        );
        assert_eq!(
            post(&[
                ("host", "127.0.0.1"),
                ("authorization", "Bearer 0123456789abcdef012")
            ]),
            Err(AdminRefusal::WrongToken)
        );
        assert_eq!(
            guard.check(&Method::GET, &headers(&[("host", "127.0.0.1")])),
            Ok(()),
            "reads need no token"
        );
    }
}
