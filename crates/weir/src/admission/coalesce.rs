//! Request coalescing (opt-in): identical anonymous GETs in flight at the same
//! time share one upstream request.
//!
//! The first request for a [`CoalesceKey`] becomes the [`Leader`] and goes
//! upstream; later ones become [`Follower`]s and wait for it. If the leader's
//! response is shareable ([`shareable`]: cacheable status, no `Set-Cookie`,
//! not `private`/`no-store`, no `Vary: *`, body buffered within a size cap)
//! the followers answer with a copy; otherwise (or if the leader fails or is
//! dropped) each follower is told to go upstream itself. A crawler storm on
//! one popular page then costs one worker, not hundreds.
//!
//! What is *anonymous* is the caller's decision (no verified session, no
//! `Authorization`); [`CoalesceKey::for_request`] refuses requests that carry
//! credentials or are not GET/HEAD as a second line of defence. This module
//! does not cache: an entry lives only while its leader is in flight. It does
//! not buffer or forward anything either; `proxy::handle` does, and decides
//! when a request is eligible.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use tokio::sync::watch;
use weir_http::target::Target;

/// What makes two requests identical: method, authority, path and query, and
/// the request headers a shared response commonly varies on; optionally the
/// pool it goes to (two routes may send one URL to different pools).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CoalesceKey {
    pool: Option<Arc<str>>,
    method: Method,
    authority: String,
    path_and_query: String,
    accept_encoding: Option<HeaderValue>,
    accept_language: Option<HeaderValue>,
}

impl CoalesceKey {
    /// The key of a request, or `None` if it must never be coalesced
    /// (not GET/HEAD, or carrying `Cookie`/`Authorization`, a `Range`, an
    /// `Upgrade` or a condition). A conditional request is left out because
    /// its likely `304` cannot be shared: as a leader it would make every
    /// follower wait for nothing.
    ///
    /// The authority and path are the target's canonical ones: the host the
    /// app receives, not a URI's that `Host` contradicts (one such request
    /// once made its followers share a page rendered for another host).
    pub fn for_request(target: &Target, headers: &HeaderMap) -> Option<CoalesceKey> {
        let method = target.method();
        if method != Method::GET && method != Method::HEAD {
            return None;
        }
        let refused = [
            header::COOKIE,
            header::AUTHORIZATION,
            header::RANGE,
            header::UPGRADE,
            header::IF_NONE_MATCH,
            header::IF_MODIFIED_SINCE,
            header::IF_MATCH,
            header::IF_UNMODIFIED_SINCE,
            header::IF_RANGE,
        ];
        if refused.iter().any(|h| headers.contains_key(h)) {
            return None;
        }
        let authority = target.authority()?.as_str().to_owned();
        Some(CoalesceKey {
            pool: None,
            method: method.clone(),
            authority,
            path_and_query: target.path_and_query().to_owned(),
            accept_encoding: headers.get(header::ACCEPT_ENCODING).cloned(),
            accept_language: headers.get(header::ACCEPT_LANGUAGE).cloned(),
        })
    }

    /// The same key, for requests going to `pool` only.
    pub fn in_pool(mut self, pool: &Arc<str>) -> CoalesceKey {
        self.pool = Some(pool.clone());
        self
    }
}

/// Request headers a shared response may vary on: those in the key, and the
/// credentials a coalesced request never carries.
const VARY_WITHIN_KEY: [&str; 4] = [
    "accept-encoding",
    "accept-language",
    "cookie",
    "authorization",
];

/// A fully buffered response that followers may copy.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Whether a response may be handed to other clients.
pub fn shareable(
    status: StatusCode,
    headers: &HeaderMap,
    body_len: usize,
    max_bytes: usize,
) -> bool {
    // Heuristically cacheable statuses (RFC 9110 §15.1).
    let cacheable_status = matches!(
        status.as_u16(),
        200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    );
    let cache_control_forbids = headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|d| d.trim().to_ascii_lowercase())
        .any(|d| d == "private" || d == "no-store" || d.starts_with("private="));
    // A response that varies on a header outside the key (or on `*`) may
    // differ between two requests with the same key: a follower could get
    // the leader's `User-Agent` or `Accept` variant.
    let varies_outside_key = headers.get_all(header::VARY).iter().any(|v| {
        v.to_str().map_or(true, |v| {
            v.split(',')
                .map(|f| f.trim().to_ascii_lowercase())
                .any(|f| !f.is_empty() && !VARY_WITHIN_KEY.contains(&f.as_str()))
        })
    });
    cacheable_status
        && !headers.contains_key(header::SET_COOKIE)
        && !cache_control_forbids
        && !varies_outside_key
        && body_len <= max_bytes
}

#[derive(Debug, Clone)]
enum Outcome {
    Pending,
    Shared(Arc<SharedResponse>),
    NotShared,
}

type InFlight = Mutex<HashMap<CoalesceKey, watch::Receiver<Outcome>>>;

/// The map of in-flight leaders. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct Coalescer {
    in_flight: Arc<InFlight>,
}

/// What a request does after [`Coalescer::join`].
#[derive(Debug)]
pub enum Role {
    /// Go upstream, then [`Leader::finish`].
    Leader(Leader),
    /// Wait for the leader with [`Follower::wait`].
    Follower(Follower),
}

impl Coalescer {
    pub fn new() -> Coalescer {
        Coalescer::default()
    }

    /// Leaders in flight now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CoalesceKey, watch::Receiver<Outcome>>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Becomes the leader for `key`, or a follower of the current one.
    pub fn join(&self, key: CoalesceKey) -> Role {
        let mut map = self.lock();
        if let Some(rx) = map.get(&key) {
            return Role::Follower(Follower { rx: rx.clone() });
        }
        let (tx, rx) = watch::channel(Outcome::Pending);
        map.insert(key.clone(), rx);
        Role::Leader(Leader {
            owner: self.in_flight.clone(),
            key: Some(key),
            tx,
        })
    }
}

/// The request that goes upstream for everyone. Dropping it unfinished tells
/// the followers to go upstream themselves.
#[derive(Debug)]
pub struct Leader {
    owner: Arc<InFlight>,
    key: Option<CoalesceKey>,
    tx: watch::Sender<Outcome>,
}

impl Leader {
    /// Publishes the response: `Some` if [`shareable`] said yes and it is
    /// fully buffered, `None` to send the followers upstream.
    pub fn finish(mut self, response: Option<SharedResponse>) {
        let outcome = response.map_or(Outcome::NotShared, |r| Outcome::Shared(Arc::new(r)));
        self.publish(outcome);
    }

    fn publish(&mut self, outcome: Outcome) {
        if let Some(key) = self.key.take() {
            // Leave the map first: a request arriving from now on starts
            // afresh instead of copying a response it did not wait for.
            self.owner
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
            self.tx.send_replace(outcome);
        }
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.publish(Outcome::NotShared);
    }
}

/// A request waiting for its leader.
#[derive(Debug)]
pub struct Follower {
    rx: watch::Receiver<Outcome>,
}

impl Follower {
    /// The leader's response, or `None`: go upstream yourself.
    pub async fn wait(mut self) -> Option<Arc<SharedResponse>> {
        let outcome = self
            .rx
            .wait_for(|o| !matches!(o, Outcome::Pending))
            .await
            .ok()?;
        match &*outcome {
            Outcome::Shared(r) => Some(r.clone()),
            Outcome::Pending | Outcome::NotShared => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_http::target::PathPolicy;

    fn target(method: &str, target: &str, host: &str) -> Target {
        Target::parse(method, target, Some(host), PathPolicy::default()).unwrap()
    }

    fn key(path: &str) -> CoalesceKey {
        CoalesceKey::for_request(&target("GET", path, "wiki.example"), &HeaderMap::new()).unwrap()
    }

    #[test]
    fn keys_name_the_host_and_path_the_app_receives() {
        // Issue 17: the key took the URI's host while the app got `Host`'s.
        // Now the two must agree (else 400), and the key is the canonical one.
        let absolute = target("GET", "http://Wiki.Example/w//index.php", "wiki.example");
        let origin = target("GET", "/w/index.php", "wiki.example");
        let none = HeaderMap::new();
        assert_eq!(
            CoalesceKey::for_request(&absolute, &none),
            CoalesceKey::for_request(&origin, &none)
        );
        let other = target("GET", "/w/index.php", "evil.example");
        assert_ne!(
            CoalesceKey::for_request(&other, &none),
            CoalesceKey::for_request(&origin, &none)
        );
        let no_host = Target::parse("GET", "/w/index.php", None, PathPolicy::default()).unwrap();
        assert_eq!(CoalesceKey::for_request(&no_host, &none), None);
    }

    fn response(body: &'static str) -> SharedResponse {
        SharedResponse {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::from_static(body.as_bytes()),
        }
    }

    fn leader(role: Role) -> Leader {
        match role {
            Role::Leader(l) => l,
            Role::Follower(_) => panic!("expected a leader"),
        }
    }

    fn follower(role: Role) -> Follower {
        match role {
            Role::Follower(f) => f,
            Role::Leader(_) => panic!("expected a follower"),
        }
    }

    #[tokio::test]
    async fn followers_share_the_leaders_response() {
        let c = Coalescer::new();
        let lead = leader(c.join(key("/wiki/Main")));
        let waits: Vec<_> = (0..3)
            .map(|_| tokio::spawn(follower(c.join(key("/wiki/Main"))).wait()))
            .collect();
        let other = leader(c.join(key("/wiki/Other")));
        assert_eq!(c.len(), 2);
        lead.finish(Some(response("page")));
        for w in waits {
            let got = w.await.unwrap().expect("shared");
            assert_eq!(got.body, Bytes::from_static(b"page"));
        }
        drop(other);
        assert!(c.is_empty());
    }

    #[tokio::test]
    async fn unshareable_or_dropped_leader_sends_followers_upstream() {
        let c = Coalescer::new();
        let lead = leader(c.join(key("/a")));
        let f = follower(c.join(key("/a")));
        lead.finish(None);
        assert_eq!(f.wait().await, None);

        let lead = leader(c.join(key("/b")));
        let f = follower(c.join(key("/b")));
        drop(lead);
        assert_eq!(f.wait().await, None);
    }

    #[tokio::test]
    async fn after_finish_the_next_request_leads_again() {
        let c = Coalescer::new();
        leader(c.join(key("/a"))).finish(Some(response("old")));
        assert!(matches!(c.join(key("/a")), Role::Leader(_)));
    }

    #[test]
    fn keys_refuse_personal_requests() {
        let mut with_cookie = HeaderMap::new();
        with_cookie.insert(header::COOKIE, HeaderValue::from_static("s=1"));
        let mut with_auth = HeaderMap::new();
        with_auth.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic x"));
        let mut conditional = HeaderMap::new();
        conditional.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"v1\""));
        let mut with_upgrade = HeaderMap::new();
        with_upgrade.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        let cases = [
            ("GET", HeaderMap::new(), true),
            ("HEAD", HeaderMap::new(), true),
            ("POST", HeaderMap::new(), false),
            ("GET", with_cookie, false),
            ("GET", with_auth, false),
            ("GET", with_upgrade, false),
            ("GET", conditional, false),
        ];
        for (method, headers, want) in cases {
            let t = target(method, "/x?y=1", "wiki.example");
            let got = CoalesceKey::for_request(&t, &headers).is_some();
            assert_eq!(got, want, "{method} {headers:?}");
        }
        let get = target("GET", "/x?y=1", "wiki.example");
        let mut gzip = HeaderMap::new();
        gzip.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        assert_ne!(
            CoalesceKey::for_request(&get, &gzip),
            CoalesceKey::for_request(&get, &HeaderMap::new()),
            "different encodings are different responses"
        );
        let plain = CoalesceKey::for_request(&get, &HeaderMap::new()).unwrap();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        assert_ne!(
            plain.clone().in_pool(&a),
            plain.in_pool(&b),
            "one URL sent to two pools is two requests"
        );
    }

    #[test]
    fn shareable_table() {
        let h = |pairs: &[(header::HeaderName, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(k.clone(), HeaderValue::from_static(v));
            }
            m
        };
        let cases = [
            (200, h(&[]), 10, true),
            (404, h(&[]), 10, true),
            (500, h(&[]), 10, false),
            (302, h(&[]), 10, false),
            (200, h(&[(header::SET_COOKIE, "s=1")]), 10, false),
            (
                200,
                h(&[(header::CACHE_CONTROL, "max-age=0, private")]),
                10,
                false,
            ),
            (200, h(&[(header::CACHE_CONTROL, "no-store")]), 10, false),
            (200, h(&[(header::CACHE_CONTROL, "no-cache")]), 10, true),
            (200, h(&[(header::VARY, "Accept-Encoding, *")]), 10, false),
            (
                200,
                h(&[(header::VARY, "Accept-Encoding, Cookie")]),
                10,
                true,
            ),
            (200, h(&[(header::VARY, "user-agent")]), 10, false),
            (200, h(&[(header::VARY, "Accept")]), 10, false),
            (200, h(&[]), 2_000_000, false),
        ];
        for (status, headers, len, want) in cases {
            let got = shareable(
                StatusCode::from_u16(status).unwrap(),
                &headers,
                len,
                1 << 20,
            );
            assert_eq!(got, want, "{status} {headers:?} {len}");
        }
    }
}
