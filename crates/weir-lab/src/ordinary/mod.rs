//! Ordinary traffic through every operation (issue 35, "do no harm"): weir
//! in front of an app must never be worse than no weir.
//!
//! - [`app`]: an app with room to spare that serves pages, slow pages,
//!   uploads, downloads, long polls, server-sent events and WebSockets,
//!   over HTTP/1.1 and h2c.
//! - [`mix`]: the visitors: what a web app sees on a normal day, sent to a
//!   target and counted in a [`tally::Tally`].
//! - [`front`]: what stands in front of the app (nothing, nginx, weir) and
//!   the operations an operator performs on it; [`process`]: weir run as
//!   its binary, upgraded and restarted.
//! - [`run`]: one run (a front, an operation repeated while the mix runs)
//!   and the table of runs; [`soak`]: half an hour of it through reloads
//!   and upgrades, weir's memory, descriptors and threads sampled.
//!
//! `weir harm` ([`cli`]) prints the table; `tests/integration/harm.rs` asserts on a
//! short version of it.

pub mod app;
pub mod cli;
pub mod front;
pub mod mix;
pub mod process;
pub mod run;
pub mod soak;
pub mod tally;
