//! One request's context, [`Exchange`]: what every phase after the target
//! reads (the connection, the gateway snapshot the request is decided
//! under, its client and its target) and its record ([`RequestLog`]: the
//! access-log line, what the client accepts, and the slots the request
//! holds until its response ends).
//!
//! `serve` makes it once the target is read and hands it to each phase with
//! that phase's own input; a phase returns its result. The answers weir
//! makes itself go through it, so they are built from the request's own
//! gateway and recorded once. Owns no decision, and is not shared: the
//! log goes with the response's body when the exchange ends.

use bytes::Bytes;
use http::{HeaderMap, Response};
use weir_http::body::ResponseBody;
use weir_http::target::Target;

use super::ConnCtx;
use super::log::{Held, RequestLog};
use crate::admission::Shape;
use crate::gateway::Gateway;
use crate::identity::ClientId;
use crate::respond::Reason;
use crate::runtime::Runtime;

/// One request's context (see the module doc). The references live as
/// long as the request's future; each accessor hands one out for that
/// whole life, so a phase can hold what it read while it writes the record.
pub(super) struct Exchange<'a> {
    conn: &'a ConnCtx,
    gw: &'a Gateway,
    client: &'a ClientId,
    target: &'a Target,
    log: Box<RequestLog>,
    /// Read on first ask, for the phases that ask after it (the visit, the
    /// challenge, admission): each reads the request's headers or hashes
    /// its path and query, some hundreds of instructions a time.
    navigation: Option<bool>,
    shape: Option<Shape>,
}

impl<'a> Exchange<'a> {
    pub fn new(
        conn: &'a ConnCtx,
        gw: &'a Gateway,
        client: &'a ClientId,
        target: &'a Target,
        log: Box<RequestLog>,
    ) -> Exchange<'a> {
        Exchange {
            conn,
            gw,
            client,
            target,
            log,
            navigation: None,
            shape: None,
        }
    }

    /// The process's tallies that outlive a request, for the phases that
    /// keep one: the rules' observer (activity, refused clients, shared
    /// limits) and the challenge's pressure. Others ask for what they use:
    /// [`Exchange::metrics`], [`Exchange::browsing`],
    /// [`Exchange::hold_client_slot`].
    pub(super) fn rt(&self) -> &'a Runtime {
        &self.conn.rt
    }

    /// The process's metrics, for a phase to count what it did.
    pub fn metrics(&self) -> &'a crate::observe::metrics::Metrics {
        &self.conn.rt.metrics
    }

    /// Admission's evidence of browsing, by address.
    pub fn browsing(&self) -> &'a crate::admission::BrowsingEvidence {
        &self.conn.rt.browsing
    }

    /// Takes one of the client's slots among requests in flight
    /// (`limits.max_requests_in_flight_per_ip`), held until the request's
    /// line is written; or the refusal, when it has none left.
    pub fn hold_client_slot(&mut self) -> Result<(), crate::policy::RejectReason> {
        let edge = &self.gw.edge;
        let max = edge.max_in_flight_per_ip;
        let slot = (self.conn.rt.client_in_flight)
            .acquire(self.client.client, max, edge.conn.ipv6_prefix)
            .ok_or(crate::policy::RejectReason::ClientInFlight { limit: max })?;
        self.held().in_flight = Some(slot);
        Ok(())
    }

    /// The connection: what the edge said of it.
    pub fn conn(&self) -> &'a ConnCtx {
        self.conn
    }

    /// The configuration this request is decided under, from its start to
    /// its end (a reload meanwhile applies to the next request).
    pub fn gw(&self) -> &'a Gateway {
        self.gw
    }

    pub fn client(&self) -> &'a ClientId {
        self.client
    }

    pub fn target(&self) -> &'a Target {
        self.target
    }

    /// Whether the request is a browser navigation
    /// ([`crate::challenge::is_navigation`] of `headers`, the request's
    /// own: read on the first ask only).
    pub fn navigation(&mut self, headers: &HeaderMap) -> bool {
        *(self.navigation).get_or_insert_with(|| crate::challenge::is_navigation(headers))
    }

    /// The target's shape, what admission learns costs by.
    pub fn shape(&mut self) -> Shape {
        *(self.shape).get_or_insert_with(|| Shape::of(self.target))
    }

    /// Whether the client reached weir over TLS: this listener's, or a
    /// trusted proxy's that says so (`identity::forwarded::proto_is_https`).
    pub fn client_tls(&self, headers: &HeaderMap) -> bool {
        let edge = &self.conn.edge;
        edge.tls.is_some() || crate::identity::forwarded::proto_is_https(headers, edge.peer_trusted)
    }

    /// Who asks the challenge: the client, the request's `headers`, and
    /// whether its connection is TLS.
    pub fn asker<'h>(&self, headers: &'h HeaderMap) -> crate::challenge::Asker<'h>
    where
        'a: 'h,
    {
        crate::challenge::Asker {
            client: self.client,
            headers,
            tls: self.client_tls(headers),
        }
    }

    /// When the challenge answers this request, with the process's budget.
    pub fn challenge_at(&self) -> crate::challenge::At<'a> {
        crate::challenge::At {
            now: std::time::SystemTime::now(),
            budget: &self.conn.rt.challenge_budget,
        }
    }

    /// The slots the request holds until its line is written.
    pub fn held(&mut self) -> &mut Held {
        &mut self.log.held
    }

    pub fn log(&self) -> &RequestLog {
        &self.log
    }

    pub fn log_mut(&mut self) -> &mut RequestLog {
        &mut self.log
    }

    /// Ends the exchange with weir's own answer for `reason` (the rescue),
    /// from this request's gateway.
    pub fn answer(self, reason: &(impl Reason + ?Sized)) -> Response<ResponseBody> {
        self.log.answer(reason, self.gw)
    }

    /// [`Exchange::answer`] for a request refused before any decision.
    pub fn reject(self, reason: &(impl Reason + ?Sized)) -> Response<ResponseBody> {
        self.log.reject(reason, self.gw)
    }

    /// Ends the exchange with a response weir made without a reason to
    /// record (the challenge's pages and script).
    pub fn respond_with(self, resp: Response<Bytes>) -> Response<ResponseBody> {
        self.log.respond_with(resp)
    }

    /// Ends the exchange, handing its record to whoever writes the
    /// response (the respond phase, a coalesced copy).
    pub fn into_log(self) -> Box<RequestLog> {
        self.log
    }
}
