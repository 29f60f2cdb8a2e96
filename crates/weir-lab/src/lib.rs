//! The lab: stand-ins for the world around weir, for tests and for `weir sim`.
//!
//! - [`app`]: a simulated app server (MediaWiki + php-fpm in miniature): a real HTTP/1.1
//!   server whose only scarce resource is `W` workers and a bounded backlog, with a health
//!   check that needs a worker, a login that any crawler can reach and a logged-in cookie
//!   that only a real login yields.
//! - [`scenario`]: scenario files (`weir sim SCENARIO.toml`): app, weir variants, cohorts,
//!   checks; [`expect`]: the check grammar; [`addresses`]: client networks in 127/8.
//! - [`cohort`]: the load generator; [`nginx`] and [`haproxy`]: real rivals as the
//!   gateway (and nginx as the load balancer in front of weir, for incident 4), run by
//!   [`process`]; [`redis`]: the store a fleet of weir shares limits through;
//!   [`alerts`]: alert rules replayed over weir's metrics with promtool;
//!   [`runner`]: one variant's run; [`report`]: tables, JSON and HTML; [`cli`]: `weir sim`
//!   and `weir demo`.
//! - [`ordinary`]: ordinary traffic (pages, uploads, streams, WebSockets, HTTP/2) through
//!   every operation on weir, next to nginx and no gateway at all (`weir harm`).
//!
//! The lab deliberately contains no part of weir's request path: nothing here decides
//! anything about a request weir serves.
//!
//! ```
//! use weir_lab::app::{AppConfig, SimApp};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! // Incident 1's upstream: 10 workers, 64 waiting, everything else refused.
//! let cfg = AppConfig { workers: 10, backlog: 64, ..AppConfig::default() };
//! let app = SimApp::start(cfg, "127.0.0.1:0".parse().expect("literal address"))?;
//! assert_eq!(app.snapshot().workers, 10);
//! app.shutdown().await;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(
    test,
    allow(clippy::too_many_lines, reason = "a test reads as one story")
)]

pub mod addresses;
pub mod alerts;
pub mod app;
pub mod cli;
pub mod cohort;
pub mod expect;
pub mod haproxy;
pub mod nginx;
pub mod ordinary;
pub mod process;
pub mod redis;
pub mod report;
pub mod runner;
pub mod scenario;
