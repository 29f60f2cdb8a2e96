//! Fixtures for end-to-end tests over real loopback sockets: a test reads
//! "start upstream, start weir (or nginx/HAProxy/Redis), send, assert".
//!
//! - [`process`]: the spawned-process guard every server fixture is built on
//!   (own process group, logs to files, kill + reap on drop).
//! - [`dnsmasq`]: a DNS server answering only a test's records.
//! - [`nginx`], [`haproxy`], [`redis`]: real servers from a config string in
//!   a fresh temp dir on OS-chosen 127.0.0.1 ports (the load balancer in
//!   front of weir, or the state store behind it).
//! - [`weir`]: the weir binary under test, addresses from its ready file.
//! - [`weir_config`]: a test's weir config: the listener, pool and routes
//!   every test repeats, and the test's own tables.
//! - [`upstream`]: an in-test hyper server (echo, counters).
//! - [`client`]: raw and keep-alive HTTP clients with a chosen source address.
//! - [`tls`]: a self-signed certificate, and a client that takes any.
//! - [`chromium`]: headless Chromium, run to the end or driven over DevTools.
//! - [`eventually`]: `assert_eventually!` / `assert_eventually_async!`.
//! - [`json_lines`]: a JSON-lines log, once the lines expected are written.
//! - [`h2frames`]: a raw HTTP/2 client, frames and header blocks by hand.
//! - [`web_bot_auth`]: a crawler that signs its requests (Web Bot Auth).
//! - [`ordinary`]: ordinary traffic run through an upgrade or a restart,
//!   every failed request counted.
//!
//! Does not: install servers (scripts/install-test-deps.sh does) or touch any
//! address outside 127.0.0.0/8.

// Each test module uses a different slice of these fixtures.
#![allow(dead_code)]

pub mod chromium;
pub mod client;
pub mod dnsmasq;
#[macro_use]
pub mod eventually;
pub mod h2frames;
pub mod haproxy;
pub mod json_lines;
pub mod nginx;
pub mod ordinary;
pub mod ports;
pub mod process;
pub mod redis;
pub mod tls;
pub mod upstream;
pub mod web_bot_auth;
pub mod weir;
pub mod weir_config;

// Re-exported so tests import from `support` alone; not every test uses all.
#[allow(unused_imports)]
pub use client::{ClientError, HttpRequest, HttpResponse, KeepAliveClient, connect_from};
#[allow(unused_imports)]
pub use haproxy::Haproxy;
#[allow(unused_imports)]
pub use json_lines::json_lines;
#[allow(unused_imports)]
pub use nginx::Nginx;
#[allow(unused_imports)]
pub use process::{FixtureError, Signal};
#[allow(unused_imports)]
pub use redis::Redis;
#[allow(unused_imports)]
pub use upstream::{HttpUpstream, UpstreamRequest};
#[allow(unused_imports)]
pub use weir::{ReadyFile, Weir};
#[allow(unused_imports)]
pub use weir_config::WeirConfig;
