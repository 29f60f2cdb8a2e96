#!/usr/bin/env bash
# The public RFC 9113 suite (httpwg-cli, h2spec's cases in Rust) against
# weir's h2c listener, several runs, as a new user would run it (issue 59).
#
# Usage: scripts/httpwg.sh [RUNS] [MIN_PASSED]
#   e.g. scripts/httpwg.sh 10 104
#
# Installs httpwg-cli (crates.io, `--locked`: its own lock file builds; a
# fresh resolve does not) into target/httpwg when missing, builds
# target/release/weir, starts nginx as the app on 127.0.0.1 and weir in
# front of it with only a listener and a pool, then runs the suite RUNS
# times (10). Prints each run's count and the cases that failed; exits 1
# when a run passed fewer than MIN_PASSED (104) of the suite's cases.
# httpwg-cli speaks only h2c: the TLS listener is covered by the project's
# own suite (tests/integration/h2spec.rs, every case on h2c and TLS).
set -euo pipefail
cd "$(dirname "$0")/.."

runs="${1:-10}"
min_passed="${2:-104}"
target="${CARGO_TARGET_DIR:-target}"
scripts/install-test-deps.sh nginx

httpwg="$target/httpwg/bin/httpwg"
if [[ ! -x "$httpwg" ]]; then
    echo "httpwg: cargo install httpwg-cli --locked"
    cargo install httpwg-cli --locked --quiet --root "$target/httpwg"
fi
cargo build --release --bin weir --quiet

work="$(mktemp -d)"
cleanup() {
    [[ -f "$work/weir.pid" ]] && kill "$(cat "$work/weir.pid")" 2>/dev/null || true
    [[ -f "$work/nginx.pid" ]] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
app_port="$(free_port)"
weir_port="$(free_port)"

cat >"$work/nginx.conf" <<EOF
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx-error.log;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $work;
    server { listen 127.0.0.1:$app_port; location / { return 200 "hello\n"; } }
}
EOF
cat >"$work/weir.toml" <<EOF
[[listeners]]
address = "127.0.0.1:$weir_port"

[pools.app]
servers = ["127.0.0.1:$app_port"]

[[routes]]
pool = "app"
EOF

nginx -c "$work/nginx.conf"
"$target/release/weir" run -c "$work/weir.toml" >"$work/weir.log" 2>&1 &
echo $! >"$work/weir.pid"
for _ in $(seq 50); do
    curl -sf --http2-prior-knowledge "http://127.0.0.1:$weir_port/" >/dev/null && break
    sleep 0.1
done

worst=999
for i in $(seq "$runs"); do
    out="$("$httpwg" -a "127.0.0.1:$weir_port" 2>&1 || true)"
    passed="$(grep -a -o 'Passed [^ ]*' <<<"$out" | sed 's/\x1b\[[0-9;]*m//g; s/Passed //; s/\/.*//')"
    total="$(grep -a -o 'Passed [^ ]*' <<<"$out" | sed 's/\x1b\[[0-9;]*m//g; s/.*\///')"
    echo "run $i: $passed of $total"
    grep -a 'Test failed' <<<"$out" | sed 's/.*:: /    failed: /' || true
    ((passed < worst)) && worst="$passed"
done
echo "httpwg: the worst of $runs runs passed $worst (at least $min_passed wanted)"
((worst >= min_passed))
