//! weir's end-to-end tests: real sockets on loopback, one test binary for the
//! whole project (one link instead of one per file). Each module below is one
//! area; add new ones as `mod name;` lines with a comment saying what they cover.
//!
//! Servers (nginx, HAProxy, Redis) come from scripts/install-test-deps.sh;
//! `scripts/test.sh` runs it first.

#![allow(clippy::too_many_lines, reason = "a test or bench reads as one story")]

#[macro_use]
mod support;

// In-process fixtures: weir started from a TOML string, test upstreams,
// clients bound to chosen 127.x.y.z source addresses.
mod fixtures;

// The process fixtures themselves: nginx as a load balancer adding
// X-Forwarded-For, HAProxy sending PROXY v2, Redis answering PING, the weir
// binary's guard.
mod support_selftest;

// The canonical request target (issue 17): spellings of a page meet its
// rule, one host per request on HTTP/1.1 and HTTP/2, what the app receives
// is what was decided on, no `Forwarded` injection, no panic on a bad host.
mod target;

// The rescue: answers weir makes itself carry their reason, and a client's
// stalled or broken upload is the client's 408/400, not a 502.
mod rescue;

// Strict framing, the same on both listeners: codings other than chunked,
// duplicate Transfer-Encoding, huge lengths, bare LF in chunk lines,
// malformed trailers, an unasked 101.
mod framing;
// HTTP/2 to the letter: malformed requests frame by frame (issue 40 item 1).
mod http2;
// An h2spec-style RFC 9113 / HPACK suite on h2c and TLS (issue 40 item 1).
mod h2spec;

// Proxy semantics: methods, bodies both ways (1 GiB), HTTP/2, TLS, WebSocket,
// hop-by-hop headers, failover on connect errors.
mod proxy;

// Client identity behind trusted and untrusted peers, PROXY protocol.
mod identity;

// Connection caps, slow-header and idle timeouts, header limits, per-client
// in-flight limits.
mod edge;

// Reload (admin API, file change) and drain under load.
mod lifecycle;

// Do no harm (issue 35): ordinary traffic (uploads, slow readers, streams,
// WebSockets, HTTP/2) through weir with the defaults, in steady state and
// through reloads, upgrades, restarts and a blue/green switch.
mod harm;

// Priority, not gates (issue 19): rules that defer to the lowest lane
// instead of refusing, navigations challenged instead of refused.
mod priority;
// Issue 36: the challenge with zero configuration.
mod learned_challenge;

// Rate and concurrency rules per level, shadow mode, 429 responses, limiter
// state across restart and reload.
mod rules;

// weir as a process: behind a real nginx load balancer, behind HAProxy with
// PROXY protocol, signals under load.
mod topology;

// Operator docs kept true: config keys, metrics, alert runbooks.
mod docs;

// The fleet's deploy examples (Kubernetes, compose) match weir's config.
mod deploy_examples;

// The lab end to end: a tiny scenario's report against the app's own counts
// (weir, and nginx and HAProxy as rival gateways), the incidents (original
// config fails, recommended passes), the alert replay, a connection flood.
mod sim;

// Exemption only for verified sessions (signed cookie, auth sub-request).
mod sessions;

// The session verifier alone against the simulated app: login-page cookies
// stay anonymous, answers cached and coalesced, a stalled app is unknown.
mod session_verifier;

// Three weir processes sharing limits through a real Redis; Redis loss and
// recovery.
mod shared_limits;
// A fleet of instances sharing a Redis signs with one challenge key.
mod fleet;

// `weir replay`: nginx, Caddy and weir logs replay to the live decisions.
mod replay;
// `weir replay` for an operator: progress, zone, breakdowns, HTML report.
mod replay_report;

// The browser challenge in headless Chromium: solve, redirect, pass cookie;
// a screenshot at target/test-artifacts/challenge.png.
mod challenge;

// The challenge in weir's request path: navigations only, passes, token keys.
mod challenge_proxy;
// What a pass costs and who sees it (issue 54): never the app, the log or
// another site; `Secure` behind a TLS proxy; passes minted in a loop wait
// one network's turn.
mod pass;
// Clients that must never break under the challenge (issue 40, item 2):
// feed readers, curl, crawlers, previews, text browsers, Chromium without
// cookies and with two tabs.
mod clients;

// Verified crawlers: Web Bot Auth signatures and forward-confirmed reverse
// DNS (a real dnsmasq) buy the bots lane instead of the challenge; claims
// alone buy nothing.
mod bots;

// In-place upgrades under load (fd hand-off and limiter state), failed
// upgrades, SIGTERM/SIGQUIT, socket activation, start-up budget.
mod upgrade;
// Stop/start restarts under load: SO_REUSEPORT beside the old process,
// systemd-style socket activation, limits kept across each.
mod restart;

// Deadlines: send timeout, minimum body rate, body size (413), the verify
// endpoint's body.
mod deadlines;

// `weir check`: refuses what `weir run` would, names the key, warns.
mod check;

// /metrics through promtool, both exposition formats, alerted series at 0.
mod dashboard;
mod exposition;
mod live_page;

// A new generation's readiness: blue/green through a shared Redis (limits
// hold from the first request), the warm-up gate (`/readyz` waits for the
// pools, bounded), an upgrade that hands over only once the pools answer.
mod readiness;

// Admission queue (lanes, fair share, shedding with Retry-After), upstream
// health (slow, dead, panic mode), slow start and the retry budget, against
// the simulated app.
mod admission;

// Request coalescing: identical anonymous GETs share one upstream request;
// personal requests, unshareable responses and other classes never do.
mod coalesce;

// Client connections park between requests without losing bytes; upstream
// connections are kept alive, reused, and replaced when the upstream closed them.
mod connections;

// The access log's fields for triage and correlation (user agent, referer,
// request id to the app and back), its reopening on SIGUSR1, and the JSON
// process log (issue 20 item 3).
mod access_log;
// The visit cookie: pages weir counted as evidence of a person, never a
// Referer alone; kept from the app and from shared caches (issue 37).
mod visit;
