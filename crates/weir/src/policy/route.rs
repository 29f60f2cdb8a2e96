//! Route matching: request → (pool, [`RouteClass`]).
//!
//! A compiled [`RouteTable`] holds matchers that cannot be invalid (regexes
//! compiled, methods parsed, hosts lower-cased). It does not look at bodies and
//! does no I/O.

use std::sync::Arc;

use http::{HeaderMap, Method};
use regex::Regex;
use weir_http::target::Target;

/// The named class of a route (`page`, `expensive`, `upload`, ...): the unit
/// for limits, timeouts and metrics labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteClass(Arc<str>);

impl RouteClass {
    pub fn new(name: &str) -> Self {
        RouteClass(Arc::from(name))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as a shared string, for metric labels without allocation.
    pub fn shared(&self) -> std::sync::Arc<str> {
        self.0.clone()
    }
}

/// Host condition.
#[derive(Debug, Clone)]
pub enum HostMatch {
    Exact(String),
    /// `*.example.org` matches `a.example.org` and `example.org`.
    Suffix(String),
}

impl HostMatch {
    pub fn parse(pattern: &str) -> HostMatch {
        let p = pattern.to_ascii_lowercase();
        match p.strip_prefix("*.") {
            Some(rest) => HostMatch::Suffix(rest.to_string()),
            None => HostMatch::Exact(p),
        }
    }

    fn matches(&self, host: &str) -> bool {
        match self {
            HostMatch::Exact(h) => host.eq_ignore_ascii_case(h),
            HostMatch::Suffix(s) => {
                host.len() >= s.len()
                    && host[host.len() - s.len()..].eq_ignore_ascii_case(s)
                    && (host.len() == s.len() || host.as_bytes()[host.len() - s.len() - 1] == b'.')
            }
        }
    }
}

/// Per-class settings after defaults are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassSettings {
    /// What a request body may take: the wait between two chunks, the
    /// average rate, the size.
    pub body: weir_http::body::BodyLimits,
    /// `None`: use the pool's response timeout.
    pub response_timeout: Option<std::time::Duration>,
}

/// One compiled route.
#[derive(Debug, Clone)]
pub struct Route {
    pub pool: usize,
    pub class: RouteClass,
    pub settings: ClassSettings,
    /// The class's rules, in evaluation order.
    pub rules: std::sync::Arc<[super::rules::Rule]>,
    /// When the class challenges browser navigations.
    pub challenge: crate::challenge::ChallengeMode,
    pub host: Option<HostMatch>,
    pub path_prefix: Option<String>,
    pub path_regex: Option<Regex>,
    pub methods: Vec<Method>,
    pub query_keys: Vec<String>,
    pub headers: Vec<http::HeaderName>,
    pub cookies: Vec<String>,
}

/// What a request looks like to the matcher: its canonical target (the
/// decoded path, the host weir forwards, query keys as the app reads
/// them) and its fields.
pub struct RequestView<'a> {
    pub target: &'a Target,
    pub headers: &'a HeaderMap,
}

impl<'a> RequestView<'a> {
    pub fn new(target: &'a Target, headers: &'a HeaderMap) -> RequestView<'a> {
        RequestView { target, headers }
    }
}

impl Route {
    pub fn matches(&self, req: &RequestView<'_>) -> bool {
        let target = req.target;
        if !self.methods.is_empty() && !self.methods.contains(target.method()) {
            return false;
        }
        if let Some(h) = &self.host {
            match target.host() {
                Some(host) if h.matches(host) => {}
                _ => return false,
            }
        }
        let path = target.match_path();
        if let Some(p) = &self.path_prefix
            && !path.starts_with(p.as_str())
        {
            return false;
        }
        if let Some(r) = &self.path_regex
            && !r.is_match(path)
        {
            return false;
        }
        if !self.query_keys.is_empty() && !target.has_query_key(&self.query_keys) {
            return false;
        }
        if !self.headers.iter().all(|h| req.headers.contains_key(h)) {
            return false;
        }
        if !self
            .cookies
            .iter()
            .all(|c| has_cookie(req.headers, c.as_str()))
        {
            return false;
        }
        true
    }
}

/// Routes in match order.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    pub routes: Vec<Route>,
}

impl RouteTable {
    pub fn find(&self, req: &RequestView<'_>) -> Option<&Route> {
        self.routes.iter().find(|r| r.matches(req))
    }
}

/// Whether a `Cookie` header carries a cookie with this exact name.
pub fn has_cookie(headers: &HeaderMap, name: &str) -> bool {
    weir_http::cookie::value(headers, name).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_http::target::PathPolicy;

    fn route() -> Route {
        Route {
            pool: 0,
            class: RouteClass::new("x"),
            settings: ClassSettings {
                body: weir_http::body::BodyLimits::NONE,
                response_timeout: None,
            },
            rules: std::sync::Arc::from(Vec::new()),
            challenge: crate::challenge::ChallengeMode::Off,
            host: None,
            path_prefix: None,
            path_regex: None,
            methods: vec![],
            query_keys: vec![],
            headers: vec![],
            cookies: vec![],
        }
    }

    fn check(
        r: &Route,
        method: &str,
        uri: &str,
        host: Option<&str>,
        headers: &[(&str, &str)],
    ) -> bool {
        let mut req = http::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.header("host", host.unwrap_or("")).body(()).unwrap();
        let target = Target::of(&req, PathPolicy::default()).unwrap();
        r.matches(&RequestView {
            target: &target,
            headers: req.headers(),
        })
    }

    #[test]
    fn match_table() {
        let expensive = Route {
            path_prefix: Some("/w/index.php".into()),
            query_keys: vec!["diff".into(), "oldid".into(), "search".into()],
            ..route()
        };
        let host = Route {
            host: Some(HostMatch::parse("*.Example.org")),
            ..route()
        };
        let get_only = Route {
            methods: vec![Method::GET, Method::HEAD],
            ..route()
        };
        let regex = Route {
            path_regex: Some(Regex::new(r"^/api/v\d+/upload").unwrap()),
            ..route()
        };
        let cookie = Route {
            cookies: vec!["wikiUserID".into()],
            headers: vec![http::HeaderName::from_static("authorization")],
            ..route()
        };
        type Case<'a> = (
            &'a Route,
            &'a str,
            &'a str,
            Option<&'a str>,
            &'a [(&'a str, &'a str)],
            bool,
        );
        let cases: &[Case] = &[
            (
                &expensive,
                "GET",
                "/w/index.php?title=A&diff=2",
                None,
                &[],
                true,
            ),
            (&expensive, "GET", "/w/index.php?title=A", None, &[], false),
            (&expensive, "GET", "/w/index.php?diffx=1", None, &[], false),
            (&expensive, "GET", "/w/index.php?search", None, &[], true),
            (&expensive, "GET", "/wiki/A?diff=1", None, &[], false),
            // Issue 17: spellings of the same page match as the page.
            (&expensive, "GET", "//w/index.php?search=a", None, &[], true),
            (
                &expensive,
                "GET",
                "/static/%2e%2e/w/index.php?search=a",
                None,
                &[],
                true,
            ),
            (
                &expensive,
                "GET",
                "/w/%69ndex.php?search=a",
                None,
                &[],
                true,
            ),
            (
                &expensive,
                "GET",
                "/w/index.php?%73earch=a",
                None,
                &[],
                true,
            ),
            (
                &expensive,
                "GET",
                "/w/index.php?search[]=a",
                None,
                &[],
                true,
            ),
            (
                &expensive,
                "GET",
                "/w/index.php?search%3Da",
                None,
                &[],
                false,
            ),
            (&host, "GET", "/", Some("A.Example.ORG."), &[], true),
            (&host, "GET", "/", Some("a.example.org"), &[], true),
            (&host, "GET", "/", Some("example.org"), &[], true),
            (&host, "GET", "/", Some("badexample.org"), &[], false),
            (&host, "GET", "/", None, &[], false),
            (&get_only, "HEAD", "/", None, &[], true),
            (&get_only, "POST", "/", None, &[], false),
            (&regex, "POST", "/api/v2/upload/x", None, &[], true),
            (&regex, "POST", "/api/vx/upload", None, &[], false),
            (
                &cookie,
                "GET",
                "/",
                None,
                &[("cookie", "a=1; wikiUserID=5"), ("authorization", "x")],
                true,
            ),
            (
                &cookie,
                "GET",
                "/",
                None,
                &[("cookie", "xwikiUserID=5"), ("authorization", "x")],
                false,
            ),
            (
                &cookie,
                "GET",
                "/",
                None,
                &[("cookie", "wikiUserID=5")],
                false,
            ),
        ];
        for (i, (r, m, u, h, hdrs, want)) in cases.iter().enumerate() {
            assert_eq!(check(r, m, u, *h, hdrs), *want, "case {i}: {m} {u}");
        }
    }
}
