#!/usr/bin/env bash
# weir's one test command (CI runs exactly this through .ci/run):
#   install test servers if missing -> cargo fmt --check -> clippy -D warnings
#   -> cargo test (doc tests first, then every target) -> the package test
#   (the .deb built, installed with dpkg, run, purged: scripts/test-package.sh).
#
# Tests build with [profile.test] from Cargo.toml: weir at opt-level 1 and
# dependencies at opt-level 2, debug assertions and overflow checks on. The
# end-to-end tests push real traffic through the weir binary, which at
# opt-level 0 is too slow for load-bearing tests; `cargo build`/`cargo run`
# (the dev profile) are unaffected. Times on the 2-core machine are in
# bench/README.md ("Test profile").
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s (%s)\n' "$1" "$(date +%T)"; }

step "test dependencies"
scripts/install-test-deps.sh

step "cargo fmt --check"
cargo fmt --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --quiet -- -D warnings

step "cargo test --doc"
cargo test --doc

# Library, binary and end-to-end tests. Benchmarks are only compiled (by
# clippy above): `--all-targets` would also run their mains, and the replay
# bench alone writes a 2.4 GB log.
step "cargo test --lib --bins --tests"
cargo test --lib --bins --tests

step "package: build the .deb, install it, run the packaged weir, purge it"
scripts/test-package.sh
