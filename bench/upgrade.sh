#!/usr/bin/env bash
# Measures in-place upgrades under load: time from SIGUSR2 to the new process
# serving and to the old process's exit, and wrk's p99 latency while upgrading
# against steady state (same weir, same wrk settings, interleaved). Prints the
# ratio. See docs/operations.md.
#
# Usage: bench/upgrade.sh [seconds per phase (default 10)] [upgrades per phase (default 10)]
#   WEIR_BIN=path   weir binary (default: target/release/weir, built if missing)
#   WRK_CONNS=50    wrk connections
#
# Installs nginx (the upstream, `return 200`) and wrk when missing. Everything
# listens on 127.0.0.1 and stops when the script ends.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-10}"
upgrades="${2:-10}"
conns="${WRK_CONNS:-50}"
scripts/install-test-deps.sh nginx wrk >/dev/null

weir_bin="${WEIR_BIN:-${CARGO_TARGET_DIR:-target}/release/weir}"
if [[ ! -x "$weir_bin" ]]; then
    echo "bench: cargo build --release --bin weir"
    cargo build --release --bin weir --quiet
fi

dir="$(mktemp -d /tmp/weir-upgrade-bench.XXXXXX)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    if [[ -f "$dir/ready.json" ]]; then
        kill "$(ready_pid)" 2>/dev/null || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
# No python here: it is polled every few ms while timing an upgrade.
ready_pid() { local t; t="$(<"$dir/ready.json")"; t="${t##*\"pid\":}"; echo "${t%%[!0-9]*}"; }
now_ms() { date +%s%3N; }
# Exited (or a zombie nobody reaped yet: also exited).
gone() { [[ ! -e /proc/$1 ]] || grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null; }

up_port="$(free_port)"
mkdir -p "$dir/nginx"
cat >"$dir/nginx.conf" <<NGINX
daemon off;
master_process off;
worker_processes 1;
pid $dir/nginx/nginx.pid;
error_log $dir/nginx/error.log;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $dir/nginx;
    proxy_temp_path $dir/nginx;
    fastcgi_temp_path $dir/nginx;
    uwsgi_temp_path $dir/nginx;
    scgi_temp_path $dir/nginx;
    keepalive_requests 1000000;
    server { listen 127.0.0.1:$up_port; location / { return 200 "ok\n"; } }
}
NGINX
nginx -c "$dir/nginx.conf" &
pids+=($!)

cat >"$dir/weir.toml" <<TOML
[process]
watch_config = false
drain_timeout = "10s"
[admin]
address = "127.0.0.1:0"
[access_log]
target = "off"
[[listeners]]
address = "127.0.0.1:0"
[pools.app]
servers = ["127.0.0.1:$up_port"]
[[routes]]
pool = "app"
TOML
"$weir_bin" run -c "$dir/weir.toml" --ready-file "$dir/ready.json" \
    --upgrade-socket "$dir/upgrade.sock" 2>"$dir/weir.log" &
first=$!
for _ in $(seq 200); do [[ -s "$dir/ready.json" ]] && break; sleep 0.05; done
url="http://$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["listeners"][0])' "$dir/ready.json")/"
echo "bench: weir $(ready_pid) at $url, upstream nginx on $up_port, wrk -t1 -c$conns -d${secs}s"

# p99 in ms from wrk --latency output.
p99_ms() {
    awk '$1=="99%" { v=$2; u=v; sub(/[0-9.]+/,"",u); sub(/[a-z]+$/,"",v);
         f = (u=="us") ? 0.001 : (u=="ms") ? 1 : (u=="s") ? 1000 : 60000; printf "%.2f", v*f }' "$1"
}
summary() {
    local out="$1"
    printf '%s req/s, p99 %s ms, errors: %s\n' \
        "$(awk '/Requests\/sec/ {print $2}' "$out")" "$(p99_ms "$out")" \
        "$(grep -E 'Socket errors|Non-2xx' "$out" | tr -s ' ' | paste -sd';' - || true)"
}

steady() {
    wrk -t1 -c"$conns" -d"${secs}s" --latency "$url" >"$dir/steady.$1.txt"
    echo "steady   $1: $(summary "$dir/steady.$1.txt")"
}

upgrading() {
    wrk -t1 -c"$conns" -d"${secs}s" --latency "$url" >"$dir/upgrade.$1.txt" &
    local wrk_pid=$! gap
    gap="$(python3 -c "print(max(0.2, $secs / ($upgrades + 1)))")"
    sleep "$gap"
    for _ in $(seq "$upgrades"); do
        local old new t0 t_ready t_exit
        old="$(ready_pid)"
        t0="$(now_ms)"
        kill -USR2 "$old"
        while new="$(ready_pid 2>/dev/null)"; [[ "$new" == "$old" ]]; do sleep 0.002; done
        t_ready="$(now_ms)"
        while ! gone "$old"; do sleep 0.002; done
        t_exit="$(now_ms)"
        echo "$((t_ready - t0)) $((t_exit - t0))" >>"$dir/times.txt"
        sleep "$gap"
    done
    wait "$wrk_pid"
    echo "upgrading $1: $(summary "$dir/upgrade.$1.txt")"
}

: >"$dir/times.txt"
for round in 1 2; do
    steady "$round"
    upgrading "$round"
done

echo
python3 - "$dir" <<'PY'
import re, sys, statistics
d = sys.argv[1]
times = [tuple(map(int, l.split())) for l in open(f"{d}/times.txt") if l.strip()]
def p99(path):
    for line in open(path):
        m = re.match(r"\s*99%\s+([\d.]+)(us|ms|s)", line)
        if m:
            return float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000}[m.group(2)]
def rate(path):
    for line in open(path):
        if line.startswith("Requests/sec"):
            return float(line.split()[1])
steady = [p99(f"{d}/steady.{r}.txt") for r in (1, 2)]
upg = [p99(f"{d}/upgrade.{r}.txt") for r in (1, 2)]
ready = sorted(t[0] for t in times)
exit_ = sorted(t[1] for t in times)
q = lambda xs, f: xs[min(len(xs) - 1, int(len(xs) * f))]
print(f"upgrades: {len(times)}")
print(f"SIGUSR2 -> new process ready: median {statistics.median(ready):.0f} ms, max {max(ready)} ms")
print(f"SIGUSR2 -> old process exit:  median {statistics.median(exit_):.0f} ms, max {max(exit_)} ms")
print(f"throughput steady {statistics.mean(rate(f'{d}/steady.{r}.txt') for r in (1,2)):.0f} req/s, "
      f"upgrading {statistics.mean(rate(f'{d}/upgrade.{r}.txt') for r in (1,2)):.0f} req/s")
print(f"p99 steady {steady} ms, upgrading {upg} ms: ratio {statistics.mean(upg) / statistics.mean(steady):.2f}")
PY
echo "old processes' drain reports:"
grep -c "drained; exiting" "$dir/weir.log" || true
