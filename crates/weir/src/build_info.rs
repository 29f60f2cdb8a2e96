//! What this binary is: its version, the git commit it was built from and
//! the day it was built (stamped by `build.rs`). Shown by `weir --version`
//! and exported as `weir_build_info`, so a rollout or a CVE can be traced to
//! the running processes.

/// The crate version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The short git commit, or `unknown` when built outside a checkout.
pub const COMMIT: &str = env!("WEIR_GIT_COMMIT");
/// `YYYY-MM-DD`, UTC (or `SOURCE_DATE_EPOCH`'s day).
pub const BUILD_DATE: &str = env!("WEIR_BUILD_DATE");

/// `0.1.0 (commit 1a2b3c4d5e6f, built 2026-12-02)`: what `--version` prints
/// after the name.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("WEIR_GIT_COMMIT"),
    ", built ",
    env!("WEIR_BUILD_DATE"),
    ")"
);
