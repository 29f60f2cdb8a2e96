#!/usr/bin/env bash
# Benchmarks weir against nginx, HAProxy and a direct connection to the same
# fast upstream, in one run of interleaved rounds. See bench/README.md.
#
# Usage: bench/proxy.sh [proxy_bench.py options]
#   e.g. bench/proxy.sh --rounds 3 --duration 5 --targets direct,nginx
#
# Installs nginx, haproxy and wrk when missing, builds target/release/weir and
# the profile-guided target/pgo/weir (scripts/build-pgo.sh; a failed build
# skips its target instead of stopping the run), then runs
# bench/proxy_bench.py. Results: bench/runs/<date>-<host>/.
set -euo pipefail
cd "$(dirname "$0")/.."

# nghttp2-client: h2load, for the HTTP/2 targets and bench/callgrind.py (the
# bench only: CI does not install it).
scripts/install-test-deps.sh nginx haproxy wrk nghttp2-client
if ! command -v python3 >/dev/null 2>&1; then
    scripts/install-test-deps.sh python3
fi
if ! command -v taskset >/dev/null 2>&1; then
    scripts/install-test-deps.sh util-linux
fi

weir_bin="${CARGO_TARGET_DIR:-target}/release/weir"
pgo_bin="${CARGO_TARGET_DIR:-target}/pgo/weir"
if [[ "${WEIR_BENCH_SKIP_BUILD:-0}" != 1 ]]; then
    echo "bench: cargo build --release --bin weir"
    if ! cargo build --release --bin weir --quiet; then
        echo "bench: weir release build failed; the weir target will be skipped" >&2
        weir_bin=/nonexistent/weir
    fi
    if ! scripts/build-pgo.sh; then
        echo "bench: profile-guided build failed; the weir-pgo target will be skipped" >&2
        pgo_bin=/nonexistent/weir
    fi
fi

exec python3 bench/proxy_bench.py --weir-bin "$weir_bin" --weir-pgo-bin "$pgo_bin" "$@"
