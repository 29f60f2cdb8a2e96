//! weir's end-to-end tests: one test binary for the whole project (one link
//! instead of one per file). Each module below is one area; add new ones as
//! `mod name;` lines with a comment saying what they cover.
//!
//! Servers (nginx, HAProxy, Redis) come from scripts/install-test-deps.sh;
//! `scripts/test.sh` runs it first.

#[macro_use]
mod support;

// The fixtures themselves: nginx as a load balancer adding X-Forwarded-For,
// HAProxy sending PROXY v2, Redis answering PING, the weir guard's contract.
mod support_selftest;
