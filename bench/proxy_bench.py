#!/usr/bin/env python3
"""Reverse-proxy benchmark: direct vs nginx vs HAProxy vs weir, in one run.

Owns: starting a fast upstream (nginx, `return 200`, ~100-byte body) and each
proxy in front of it (weir twice: `cargo build --release` and the
profile-guided build of scripts/build-pgo.sh) on loopback, running wrk (-t1)
in interleaved rounds (every round visits every target, order rotated) so
drift on a shared 2-core machine hits all targets alike, CPU microseconds per
request of each proxy's processes from /proc/PID/stat, idle keep-alive memory
with a separate client process, raw CSV + configs + wrk output under
bench/runs/<date>-<host>/, and the summary table.

Does not: install or build anything (bench/proxy.sh does), pin CPUs unless
--pin is given, or judge results. Unfair-comparison notes are in README.md.
"""
import argparse
import csv
import datetime
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")
# ~100 bytes: a small page or API answer, so proxy overhead dominates.
BODY = "weir-bench " + "x" * 88 + "\n"
START_DEADLINE = 15.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, deadline, logs):
    end = time.time() + deadline
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}\n{read_logs(logs)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} not accepting after {deadline}s\n{read_logs(logs)}")


def read_logs(paths):
    out = []
    for p in paths:
        try:
            with open(p, errors="replace") as f:
                out.append(f"--- {p} ---\n{f.read()[-4000:]}")
        except OSError as e:
            out.append(f"--- {p}: {e}")
    return "\n".join(out)


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def cpu_ticks(pids):
    """(user, system) clock ticks of the processes, summed."""
    user = system = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            # after the comm field: state is [0], utime [11], stime [12]
            user += int(fields[11])
            system += int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return user, system


# A row's proxy counts, with the digits their medians keep.
PROXY_COUNTS = [("proxy_cpu_us_per_req", 2), ("proxy_user_us_per_req", 2),
                ("proxy_sys_us_per_req", 2), ("proxy_faults_per_kreq", 2),
                ("proxy_wakeups_per_req", 3), ("proxy_preempted_per_kreq", 2)]


def proc_events(pids):
    """(minor page faults, voluntary context switches, involuntary ones) of
    the processes, summed over their threads: a thread that sleeps in
    epoll_wait and is woken switches voluntarily once a wake-up; a fault
    is kernel time no system call count shows."""
    faults = voluntary = involuntary = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                faults += int(f.read().rsplit(")", 1)[1].split()[7])
            tasks = os.listdir(f"/proc/{pid}/task")
        except (OSError, IndexError, ValueError):
            continue
        for tid in tasks:
            status = status_numbers(f"/proc/{pid}/task/{tid}/status")
            voluntary += status.get("voluntary_ctxt_switches", 0)
            involuntary += status.get("nonvoluntary_ctxt_switches", 0)
    return faults, voluntary, involuntary


def status_numbers(path):
    """The leading number of each field of a /proc status file ({} if gone)."""
    numbers = {}
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(":")
                first = value.split()[:1]
                if first and first[0].isdigit():
                    numbers[name] = int(first[0])
    except OSError:
        pass
    return numbers


def rss_kib(pids):
    return sum(status_numbers(f"/proc/{pid}/status").get("VmRSS", 0) for pid in pids)


class Server:
    """One started process (and its children), stopped and reaped by stop()."""

    def __init__(self, name, argv, workdir, port, logs, pin=None, stdout_null=False):
        self.name, self.port, self.logs = name, port, logs
        # weir's admin address (its ready file), where it has one.
        self.admin = None
        self.stdout = open(os.devnull if stdout_null else os.path.join(workdir, f"{name}.stdout"), "w")
        self.stderr_path = os.path.join(workdir, f"{name}.stderr")
        self.stderr = open(self.stderr_path, "w")
        self.logs = logs + [self.stderr_path]
        if pin is not None:
            argv = ["taskset", "-c", pin] + argv
        self.proc = subprocess.Popen(
            argv, stdout=self.stdout, stderr=self.stderr, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def pids(self):
        return [self.proc.pid] + children(self.proc.pid)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.stdout.close()
        self.stderr.close()


def nginx_main(d, workers, conns):
    # bench/callgrind.py measures nginx as one process (`master_process off`).
    master = "off" if nginx_single_process else "on"
    return (
        f"daemon off;\nmaster_process {master};\nworker_processes {workers};\n"
        f"worker_rlimit_nofile 20000;\npid {d}/nginx.pid;\nerror_log {d}/error.log notice;\n"
        f"events {{ worker_connections {conns}; }}\n"
    )


def nginx_http_common(d):
    return (
        f"client_body_temp_path {d}/cb; proxy_temp_path {d}/px; fastcgi_temp_path {d}/fc;\n"
        f"uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;\n"
        "keepalive_timeout 300s; keepalive_requests 1000000;\n"
    )


def start_nginx(name, conf_text, workdir, port, pin):
    d = os.path.join(workdir, name)
    os.makedirs(d, exist_ok=True)
    os.chmod(workdir, 0o755)
    os.chmod(d, 0o755)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(conf_text(d))
    err = os.path.join(d, "error.log")
    argv = nginx_prefix + ["nginx", "-p", d, "-c", conf, "-e", err]
    s = Server(name, argv, d, port, [err], pin)
    wait_port(port, s.proc, START_DEADLINE, s.logs)
    return s


def start_upstream(workdir, pin):
    port = free_port()
    # As many connections as the proxies may open: HTTP/2 at 1,000
    # connections x 10 streams puts 10,000 requests in flight, each on an
    # upstream connection of its own beyond the idle pool (4,096 had made
    # both nginx and weir answer errors for the upstream's refusals).
    def conf(d):
        return nginx_main(d, 1, 19000) + (
            "http {\n" + nginx_http_common(d) + "access_log off;\n"
            f"server {{ listen 127.0.0.1:{port} backlog=4096; default_type text/plain;\n"
            f"  location / {{ return 200 \"{BODY.strip()}\\n\"; }}\n"
            # Connections the upstream accepted: a proxy that reuses its
            # upstream connections opens none after its first round.
            f"  location = {UPSTREAM_STATUS} {{ stub_status; }} }}\n}}\n"
        )
    return start_nginx("upstream", conf, workdir, port, pin)


UPSTREAM_STATUS = "/weir-bench-upstream-status"


def upstream_accepts(port):
    """Connections the upstream nginx has accepted so far, not counting the
    one this reading opens (stub_status counts it)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{UPSTREAM_STATUS}", timeout=5) as r:
        text = r.read().decode()
    # "Active connections: N \nserver accepts handled requests\n A H R \n..."
    return int(text.splitlines()[2].split()[0]) - 1


def worker_connections(admin):
    """weir's open client connections per worker thread, from its
    `weir_worker_connections{worker}` gauges (the accept balance's own
    counts, `edge::balance`): a list, one count a worker."""
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("weir_worker_connections{")]


def run_sampling_balance(run, server, duration):
    """Runs `run()` (a load generator, returning its output) and, halfway
    through, reads how many connections each of `server`'s workers holds:
    (output, max/min of the counts), or NaN where there is nothing to read
    (one worker, no admin address)."""
    if not getattr(server, "admin", None):
        return run(), float("nan")
    counts = []

    def sample():
        time.sleep(duration / 2)
        try:
            counts.extend(worker_connections(server.admin))
        except OSError:
            pass
    t = threading.Thread(target=sample)
    t.start()
    text = run()
    t.join()
    if len(counts) < 2 or min(counts) <= 0:
        return text, float("nan")
    return text, round(max(counts) / min(counts), 3)


# What "the same work" as weir's bench config means for nginx (issue 39):
# a rate limit on the client address that never refuses (weir's rule charges
# three levels; nginx has no /24 or /16 key without a map, so one), and a
# JSON access line with the fields weir's line carries, buffered as weir's
# writer is, to /dev/null as weir's; the request id passed upstream as weir
# does. `--nginx-work plain` runs the nginx of the earlier runs instead (the
# default log format, no limit).
NGINX_SAME_WORK = (
    "limit_req_zone $binary_remote_addr zone=perip:10m rate=1000000r/s;\n"
    "log_format weir escape=json '{\"time\":\"$time_iso8601\",\"request_id\":\"$request_id\","
    "\"client\":\"$remote_addr\",\"method\":\"$request_method\",\"path\":\"$uri\","
    "\"query\":\"$args\",\"proto\":\"$server_protocol\",\"tls\":\"$ssl_protocol\","
    "\"alpn\":\"$ssl_alpn_protocol\",\"user_agent\":\"$http_user_agent\","
    "\"referer\":\"$http_referer\",\"status\":$status,\"bytes_in\":$request_length,"
    "\"bytes_out\":$bytes_sent,\"duration_s\":$request_time,\"upstream\":\"$upstream_addr\","
    "\"upstream_status\":\"$upstream_status\",\"upstream_s\":\"$upstream_response_time\"}';\n"
    "access_log /dev/null weir buffer=64k flush=1s;\n"
)
NGINX_SAME_WORK_LOCATION = (
    "    limit_req zone=perip burst=1000000 nodelay;\n"
    "    proxy_set_header X-Request-Id $request_id;\n"
)
NGINX_WORK = {"same": (NGINX_SAME_WORK, NGINX_SAME_WORK_LOCATION),
              "plain": ("access_log /dev/null;\n", "")}
# Set by main (`--nginx-work`).
nginx_work = "same"
# Set by bench/callgrind.py: nginx as one process, started through a wrapper
# (valgrind) given as a command prefix.
nginx_single_process = False
nginx_prefix = []


def start_nginx_proxy(workdir, upstream_port, pin, name="nginx", workers=1, tls=None):
    """nginx in front of the upstream: `workers` worker processes; with
    `tls` = (cert, key), HTTPS (OpenSSL) with HTTP/2 offered by ALPN. It does
    the work `nginx_work` names (`NGINX_WORK`: the same as weir's, or plain)."""
    port = free_port()
    listen = f"listen 127.0.0.1:{port} backlog=4096"
    if tls:
        listen += (f" ssl http2; ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]};\n"
                   "  ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:tls:10m")
    http_work, location_work = NGINX_WORK[nginx_work]
    def conf(d):
        # Enough connections for 10,000 idle clients + upstream.
        return nginx_main(d, workers, 19000) + (
            "http {\n" + nginx_http_common(d) + http_work
            + f"upstream app {{ server 127.0.0.1:{upstream_port}; keepalive 1024; }}\n"
            f"server {{ {listen};\n"
            "  location / { proxy_pass http://app; proxy_http_version 1.1;\n"
            "    proxy_set_header Connection \"\";\n" + location_work
            + "    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; } }\n}\n"
        )
    return start_nginx(name, conf, workdir, port, pin)


def self_signed(workdir):
    """A self-signed certificate and key (P-256) for the TLS targets."""
    cert, key = os.path.join(workdir, "cert.pem"), os.path.join(workdir, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost"],
        check=True, capture_output=True, timeout=60)
    return cert, key


def start_haproxy(workdir, upstream_port, pin):
    port = free_port()
    d = os.path.join(workdir, "haproxy")
    os.makedirs(d, exist_ok=True)
    cfg = os.path.join(d, "haproxy.cfg")
    with open(cfg, "w") as f:
        f.write(
            f"global\n    nbthread 1\n    maxconn 4096\n    pidfile {d}/haproxy.pid\n"
            "    log stdout format raw local0\n"
            "defaults\n    mode http\n    log global\n    option httplog\n"
            "    option forwardfor\n    timeout connect 5s\n    timeout client 300s\n"
            "    timeout server 30s\n    timeout http-keep-alive 300s\n"
            f"frontend fe\n    bind 127.0.0.1:{port}\n    default_backend app\n"
            f"backend app\n    http-reuse always\n    server s1 127.0.0.1:{upstream_port}\n"
        )
    # stdout carries the access log (logging on, like the others) -> /dev/null.
    s = Server("haproxy", ["haproxy", "-db", "-f", cfg], d, port, [], pin, stdout_null=True)
    wait_port(port, s.proc, START_DEADLINE, s.logs)
    return s


PAGE_ROUTE = '[[routes]]\npool = "app"\nclass = "page"\n\n'
# Issue 21: the bench runs weir with every protection on. A rule at three
# levels (address, /24, /16) that never refuses: every request is charged at
# each level, as on a protected site, and none is turned away.
BENCH_ROUTES = PAGE_ROUTE + (
    '[[classes.page.rules]]\nname = "page-rate"\nlimits = [\n'
    '  { per = "ip", rate = 100000000, window = "1m" },\n'
    '  { per = "subnet", rate = 100000000, window = "1m" },\n'
    '  { per = "network", rate = 100000000, window = "1m" },\n]\n\n'
)


def weir_config(upstream_port, admission=False, tls=None, routes=BENCH_ROUTES, workers=1):
    """The benchmark's weir config, every protection on as issue 21 asks:
    the access log (to /dev/null), metrics, a three-level rate rule that
    never refuses (`BENCH_ROUTES`) and admission (on for every pool by
    default: a queue whose limit is learned from latency). (bench/pgo_train.py
    adds a TLS listener, `tls` = (cert, key), and its own `routes` and
    classes.)"""
    listeners = '[[listeners]]\naddress = "127.0.0.1:0"\n\n'
    if tls:
        listeners += ('[[listeners]]\naddress = "127.0.0.1:0"\n'
                      f'tls = {{ cert = "{tls[0]}", key = "{tls[1]}" }}\n\n')
    return (
        listeners
        + '[admin]\naddress = "127.0.0.1:0"\n\n'
        '[access_log]\ntarget = "/dev/null"\n\n'
        f'[pools.app]\nservers = ["127.0.0.1:{upstream_port}"]\n'
        # Idle upstream connections kept, as nginx's `keepalive 1024`.
        'max_idle_per_server = 1024\n\n'
        # `weir-admission`: the same with an admission queue whose limit
        # is never reached, so the difference is the queue's own cost.
        + ('[pools.app.admission]\nmax_in_flight = 5000\nmax_queued = 5000\n\n' if admission else '')
        + routes
        # wrk is one address holding up to 1,000 connections: weir's
        # per-address defaults (256 connections, 128 in flight) would
        # rightly treat it as a flood. The bench measures proxying.
        + '[limits]\nmax_connections_per_ip = 20000\nmax_requests_in_flight_per_ip = 20000\n\n'
        # One worker thread, as nginx (1 worker) and HAProxy (1 thread);
        # the `-w2` targets run two, against nginx with two workers.
        f'[process]\nworkers = {workers}\n'
    )


def start_weir(workdir, name, config, weir_bin, pin):
    """Starts `weir run` with `config` (TOML text); its `port` is the first
    listener's, `ports` all of them (from the ready file)."""
    d = os.path.join(workdir, name)
    os.makedirs(d, exist_ok=True)
    cfg = os.path.join(d, "weir.toml")
    ready = os.path.join(d, "ready.json")
    with open(cfg, "w") as f:
        f.write(config)
    # A ready file left by an earlier instance in this directory would name its port.
    if os.path.exists(ready):
        os.remove(ready)
    s = Server(name, [weir_bin, "run", "-c", cfg, "--ready-file", ready], d, None, [], pin)
    end = time.time() + START_DEADLINE
    while True:
        if s.proc.poll() is not None:
            s.stop()
            raise RuntimeError(f"exited with {s.proc.returncode}\n{read_logs(s.logs)}")
        try:
            with open(ready) as f:
                info = json.load(f)
            s.ports = [int(a.rsplit(":", 1)[1]) for a in info["listeners"]]
            s.port = s.ports[0]
            s.admin = info.get("admin")
            break
        except (OSError, ValueError, KeyError, IndexError):
            pass
        if time.time() > end:
            s.stop()
            raise RuntimeError(f"no ready file after {START_DEADLINE}s\n{read_logs(s.logs)}")
        time.sleep(0.05)
    try:
        wait_port(s.port, s.proc, START_DEADLINE, s.logs)
    except Exception:
        s.stop()
        raise
    return s


def parse_duration_ms(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not m:
        return float("nan")
    v, unit = float(m.group(1)), m.group(2)
    return v * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def parse_wrk(out):
    res = {"requests": 0, "seconds": float("nan"), "rps": 0.0, "p50_ms": float("nan"),
           "p99_ms": float("nan"), "socket_errors": 0, "non_2xx": 0}
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", out)
    if m:
        res["requests"] = int(m.group(1))
        res["seconds"] = parse_duration_ms(m.group(2) + m.group(3)) / 1000
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if m:
        res["rps"] = float(m.group(1))
    for pct, key in (("50", "p50_ms"), ("99", "p99_ms")):
        m = re.search(rf"^\s+{pct}(?:\.000)?%\s+(\S+)", out, re.M)
        if m:
            res[key] = parse_duration_ms(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        res["socket_errors"] = sum(int(g) for g in m.groups())
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        res["non_2xx"] = int(m.group(1))
    return res


def run_wrk(port, conns, duration, pin, scheme="http"):
    argv = ["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--latency", "--timeout", "5s",
            f"{scheme}://127.0.0.1:{port}/"]
    if pin is not None:
        argv = ["taskset", "-c", pin] + argv
    return subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60).stdout


def run_h2load(port, conns, duration, pin, streams):
    """HTTP/2 over TLS (ALPN h2): `conns` connections, `streams` requests in
    flight on each, one thread, for `duration` seconds."""
    argv = ["h2load", "-t1", f"-c{conns}", f"-m{streams}", f"-D{duration}",
            f"https://127.0.0.1:{port}/"]
    if pin is not None:
        argv = ["taskset", "-c", pin] + argv
    return subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60).stdout


def parse_h2load(out):
    """wrk's fields from h2load's report (h2load gives no percentiles: the
    latency columns are its mean request time for p50, NaN for p99)."""
    res = {"requests": 0, "seconds": float("nan"), "rps": 0.0, "p50_ms": float("nan"),
           "p99_ms": float("nan"), "socket_errors": 0, "non_2xx": 0}
    m = re.search(r"finished in ([\d.]+)(us|ms|s|m), ([\d.]+) req/s", out)
    if m:
        res["seconds"] = parse_duration_ms(m.group(1) + m.group(2)) / 1000
        res["rps"] = float(m.group(3))
    m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, "
                  r"(\d+) failed, (\d+) errored, (\d+) timeout", out)
    if m:
        res["requests"] = int(m.group(2))
        res["socket_errors"] = int(m.group(4)) + int(m.group(5))
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    if m:
        res["non_2xx"] = int(m.group(3)) + int(m.group(4))
    m = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", out)
    if m:
        res["p50_ms"] = parse_duration_ms(m.group(1))
    return res


# Targets whose ratios are taken against another nginx than the 1-worker
# plain one: the same protocol and worker count on both sides.
BASELINE = {"weir-w2": "nginx-w2", "weir-tls": "nginx-tls", "weir-h2": "nginx-h2"}
# Targets loaded with h2load (HTTP/2) instead of wrk; https for wrk.
H2_TARGETS = {"nginx-h2", "weir-h2"}
# Two workers, and the one-worker target of the same kind their CPU a
# request is paired with (issue 39: within 5%).
ONE_WORKER = {"weir-w2": "weir", "nginx-w2": "nginx"}
TWO_WORKER_WEIRS = {"weir-w2"}
TLS_TARGETS = {"nginx-tls", "weir-tls"}


def baseline_of(target):
    return BASELINE.get(target, "nginx")


def idle_memory(target, server, n, here):
    """RSS of the proxy's processes before and while holding n idle connections."""
    before = rss_kib(server.pids())
    client = subprocess.Popen(
        [sys.executable, os.path.join(here, "idle_conns.py"), "127.0.0.1", str(server.port), str(n)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        line = client.stdout.readline().split()
        opened, failed = (int(line[1]), int(line[2])) if len(line) == 3 else (0, n)
        # Held idle for 3 s: weir gives an idle connection's read buffer back
        # after 1 s (its sweep runs every 0.5 s) and jemalloc returns freed
        # pages within 1 s; nginx frees its buffers at once. Both are
        # measured in their steady idle state.
        time.sleep(3.0)
        during = rss_kib(server.pids())
        client.stdin.write("count\n")
        client.stdin.flush()
        still_open = int(client.stdout.readline().strip() or 0)
    finally:
        if client.stdin:
            client.stdin.close()
        try:
            client.wait(30)
        except subprocess.TimeoutExpired:
            client.kill()
            client.wait()
    per_conn = (during - before) * 1024 / still_open if still_open else float("nan")
    return {"target": target, "connections": n, "opened": opened, "failed": failed,
            "still_open": still_open, "rss_before_kib": before, "rss_during_kib": during,
            "bytes_per_conn": round(per_conn)}


def paired_ratio(rows, target, conns, key, base=None):
    """Median over rounds of target's `key` divided by its nginx's (see
    `BASELINE`), or `base`'s, in that round."""
    ratios = []
    base = base or baseline_of(target)
    for r in {x["round"] for x in rows}:
        a = [x[key] for x in rows if (x["round"], x["target"], x["conns"]) == (r, target, conns)]
        b = [x[key] for x in rows if (x["round"], x["target"], x["conns"]) == (r, base, conns)]
        if a and b and isinstance(a[0], (int, float)) and isinstance(b[0], (int, float)) and b[0]:
            ratios.append(a[0] / b[0])
    return round(statistics.median(ratios), 3) if ratios else float("nan")


def fmt(v, spec):
    return "-" if v is None or (isinstance(v, float) and v != v) else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--conns", default="50,1000")
    ap.add_argument("--targets", default="direct,nginx,haproxy,weir,weir-pgo,"
                    "nginx-w2,weir-w2,nginx-tls,weir-tls,nginx-h2,weir-h2",
                    help="-w2: two workers each; -tls: HTTPS (wrk); -h2: HTTP/2 over TLS "
                         "(h2load); their ratios are against the nginx of the same kind")
    ap.add_argument("--h2-streams", type=int, default=10,
                    help="requests in flight per HTTP/2 connection (h2load -m)")
    ap.add_argument("--idle-conns", type=int, default=10000)
    ap.add_argument("--idle-targets", default="nginx,weir")
    ap.add_argument("--weir-bin", default="target/release/weir")
    ap.add_argument("--weir-pgo-bin", default="target/pgo/weir",
                    help="weir built profile-guided (scripts/build-pgo.sh)")
    ap.add_argument("--weir-base-bin", default=None,
                    help="a previous weir (another commit's release build), measured as "
                         "target weir-base in the same rounds: what a change cost, paired")
    ap.add_argument("--out", default=None)
    ap.add_argument("--pin", action="store_true",
                    help="pin upstream+wrk to CPU 1 and the proxy to CPU 0")
    ap.add_argument("--nginx-work", choices=sorted(NGINX_WORK), default="same",
                    help="same: nginx does weir's work (a rate limit on the client address, "
                         "a buffered JSON access line, the request id upstream); plain: "
                         "the default log and no limit, as in runs before 2026-12-06")
    args = ap.parse_args()
    global nginx_work
    nginx_work = args.nginx_work

    here = os.path.dirname(os.path.abspath(__file__))
    host = socket.gethostname().split(".")[0]
    stamp = datetime.datetime.now().strftime("%Y-%m-%dT%H%M%S")
    out = args.out or os.path.join(here, "runs", f"{stamp}-{host}")
    os.makedirs(os.path.join(out, "wrk"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="weir-bench-")
    pin_proxy, pin_other = ("0", "1") if args.pin else (None, None)
    conns_list = [int(c) for c in args.conns.split(",") if c]
    wanted = [t for t in args.targets.split(",") if t]

    servers, skipped = {}, {}
    upstream = start_upstream(work, pin_other)
    tls = self_signed(work) if any(t in TLS_TARGETS | H2_TARGETS for t in wanted) else None

    def weir_tls(name, cfg_workers=1):
        """weir with a TLS listener (HTTP/2 and HTTP/1.1 by ALPN): its port."""
        s = start_weir(work, name, weir_config(upstream.port, tls=tls, workers=cfg_workers),
                       args.weir_bin, pin_proxy)
        s.port = s.ports[1]
        return s

    try:
        starters = {
            "nginx": lambda: start_nginx_proxy(work, upstream.port, pin_proxy),
            "nginx-w2": lambda: start_nginx_proxy(work, upstream.port, pin_proxy, "nginx-w2", 2),
            "nginx-tls": lambda: start_nginx_proxy(work, upstream.port, pin_proxy, "nginx-tls",
                                                   tls=tls),
            "nginx-h2": lambda: start_nginx_proxy(work, upstream.port, pin_proxy, "nginx-h2",
                                                  tls=tls),
            "weir-w2": lambda: start_weir(work, "weir-w2", weir_config(upstream.port, workers=2),
                                          args.weir_bin, pin_proxy),
            "weir-tls": lambda: weir_tls("weir-tls"),
            "weir-h2": lambda: weir_tls("weir-h2"),
            "haproxy": lambda: start_haproxy(work, upstream.port, pin_proxy),
            "weir": lambda: start_weir(work, "weir", weir_config(upstream.port),
                                       args.weir_bin, pin_proxy),
            "weir-pgo": lambda: start_weir(work, "weir-pgo", weir_config(upstream.port),
                                           args.weir_pgo_bin, pin_proxy),
            "weir-base": lambda: start_weir(work, "weir-base", weir_config(upstream.port),
                                            args.weir_base_bin, pin_proxy),
            "weir-admission": lambda: start_weir(work, "weir-admission",
                                                 weir_config(upstream.port, admission=True),
                                                 args.weir_bin, pin_proxy),
        }
        targets = []
        for t in wanted:
            if t == "direct":
                targets.append(t)
                continue
            binary = {"weir-pgo": args.weir_pgo_bin,
                      "weir-base": args.weir_base_bin}.get(t, args.weir_bin)
            if t.startswith("weir") and not (binary and os.access(binary, os.X_OK)):
                skipped[t] = f"{binary} not found (build failed?)"
            else:
                try:
                    servers[t] = starters[t]()
                    targets.append(t)
                except Exception as e:  # a target that cannot start is skipped, said loudly
                    skipped[t] = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
                    with open(os.path.join(out, f"{t}-start-failure.txt"), "w") as f:
                        f.write(str(e))
            if t in skipped:
                print(f"SKIPPED {t}: failed to start: {skipped[t]}", flush=True)

        port_of = {t: (upstream.port if t == "direct" else servers[t].port) for t in targets}
        rows = []
        total = args.rounds * len(conns_list) * len(targets)
        print(f"{total} runs of {args.duration}s: targets {targets}, conns {conns_list}, "
              f"rounds {args.rounds}; raw results in {out}", flush=True)
        for r in range(args.rounds):
            for c in conns_list:
                # Rotate the order each round so no target always runs first.
                order = targets[r % len(targets):] + targets[:r % len(targets)]
                for t in order:
                    proxy_pids = servers[t].pids() if t in servers else []
                    up_pids = upstream.pids()
                    (pu0, ps0), u0 = cpu_ticks(proxy_pids), sum(cpu_ticks(up_pids))
                    e0 = proc_events(proxy_pids)
                    a0 = upstream_accepts(upstream.port)
                    if t in H2_TARGETS:
                        load = lambda: run_h2load(port_of[t], c, args.duration, pin_other,
                                                  args.h2_streams)
                    else:
                        load = lambda: run_wrk(port_of[t], c, args.duration, pin_other,
                                               "https" if t in TLS_TARGETS else "http")
                    if t in TWO_WORKER_WEIRS:
                        text, balance = run_sampling_balance(load, servers[t], args.duration)
                    else:
                        text, balance = load(), float("nan")
                    (pu1, ps1), u1 = cpu_ticks(proxy_pids), sum(cpu_ticks(up_pids))
                    e1 = proc_events(proxy_pids)
                    # Minus the reading of a0's own connection.
                    opened = upstream_accepts(upstream.port) - a0 - 1
                    p0, p1 = pu0 + ps0, pu1 + ps1
                    with open(os.path.join(out, "wrk", f"r{r + 1}-{t}-c{c}.txt"), "w") as f:
                        f.write(text)
                    w = parse_h2load(text) if t in H2_TARGETS else parse_wrk(text)
                    req = w["requests"] or 1
                    row = {"round": r + 1, "target": t, "conns": c, **w,
                           "proxy_cpu_s": (p1 - p0) / CLK_TCK if proxy_pids else "",
                           "proxy_cpu_us_per_req": round((p1 - p0) / CLK_TCK * 1e6 / req, 2) if proxy_pids else "",
                           "proxy_user_us_per_req": round((pu1 - pu0) / CLK_TCK * 1e6 / req, 2) if proxy_pids else "",
                           "proxy_sys_us_per_req": round((ps1 - ps0) / CLK_TCK * 1e6 / req, 2) if proxy_pids else "",
                           "proxy_faults_per_kreq": round((e1[0] - e0[0]) * 1000 / req, 2) if proxy_pids else "",
                           "proxy_wakeups_per_req": round((e1[1] - e0[1]) / req, 3) if proxy_pids else "",
                           "proxy_preempted_per_kreq": round((e1[2] - e0[2]) * 1000 / req, 2) if proxy_pids else "",
                           "upstream_cpu_us_per_req": round((u1 - u0) / CLK_TCK * 1e6 / req, 2),
                           "upstream_conns_opened": opened,
                           "worker_conns_max_min": balance}
                    rows.append(row)
                    print(f"  round {r + 1} c={c:<5} {t:<9} {w['rps']:>10.0f} req/s  "
                          f"p50 {fmt(w['p50_ms'], '.2f')} ms  p99 {fmt(w['p99_ms'], '.2f')} ms  "
                          f"cpu {fmt(row['proxy_cpu_us_per_req'] or None, '.1f')} us/req "
                          f"(sys {fmt(row['proxy_sys_us_per_req'] or None, '.1f')})  "
                          f"wake {fmt(row['proxy_wakeups_per_req'] or None, '.3f')}/req  "
                          f"faults {fmt(row['proxy_faults_per_kreq'] or None, '.1f')}/kreq  "
                          f"upstream +{opened} conns"
                          + (f"  ERRORS {w['socket_errors']} non2xx {w['non_2xx']}"
                             if w["socket_errors"] or w["non_2xx"] else ""), flush=True)

        with open(os.path.join(out, "rounds.csv"), "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["round"])
            wr.writeheader()
            wr.writerows(rows)

        summary = []
        med = lambda xs: statistics.median(xs) if xs else float("nan")
        for c in conns_list:
            base = {}
            for t in targets:
                rs = [x for x in rows if x["target"] == t and x["conns"] == c]
                if not rs:  # --rounds 0: idle memory only
                    continue
                base[t] = {
                    "target": t, "conns": c, "rounds": len(rs),
                    "rps_median": round(med([x["rps"] for x in rs])),
                    "p50_ms": round(med([x["p50_ms"] for x in rs]), 3),
                    "p99_ms": round(med([x["p99_ms"] for x in rs]), 3),
                    # The proxy's own counts (none for `direct`).
                    **{key: round(med([x[key] for x in rs]), digits) if t in servers else float("nan")
                       for key, digits in PROXY_COUNTS},
                    "upstream_cpu_us_per_req": round(med([x["upstream_cpu_us_per_req"] for x in rs]), 2),
                    "errors": sum(x["socket_errors"] + x["non_2xx"] for x in rs),
                    # After warm-up: every round but the target's first at
                    # this connection count (the pool fills in that one).
                    "upstream_conns_after_warmup": sum(x["upstream_conns_opened"] for x in rs[1:]),
                    # Two workers: the largest of the rounds' max/min of
                    # connections per worker, sampled halfway through.
                    "worker_conns_max_min": max((x["worker_conns_max_min"] for x in rs
                                                 if x["worker_conns_max_min"] == x["worker_conns_max_min"]),
                                                default=float("nan")),
                }
            for t in base:
                s = base[t]
                s["vs_direct"] = round(s["rps_median"] / base["direct"]["rps_median"], 3) \
                    if "direct" in base and base["direct"]["rps_median"] else float("nan")
                b = baseline_of(t)
                s["vs_nginx"] = round(s["rps_median"] / base[b]["rps_median"], 3) \
                    if b in base and base[b]["rps_median"] else float("nan")
                # Paired: the median of each round's ratio to nginx in the same
                # round. Neighbouring runs share the machine's state, so this
                # moves less with the machine than a ratio of medians does.
                s["cpu_vs_nginx_paired"] = paired_ratio(rows, t, c, "proxy_cpu_us_per_req")
                s["p99_vs_nginx_paired"] = paired_ratio(rows, t, c, "p99_ms")
                # Two workers against one: CPU a request, paired by round.
                s["cpu_vs_one_worker_paired"] = paired_ratio(
                    rows, t, c, "proxy_cpu_us_per_req", base=ONE_WORKER.get(t)) \
                    if t in ONE_WORKER else float("nan")
                summary.append(s)

        with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(summary[0].keys()) if summary else ["target"])
            wr.writeheader()
            wr.writerows(summary)

        idle = []
        for t in [t for t in args.idle_targets.split(",") if t]:
            if t not in servers:
                print(f"SKIPPED idle memory for {t}: not running", flush=True)
                continue
            if args.idle_conns > 0:
                # A fresh instance: after the load rounds, freed buffers stay in
                # the allocator and would hide the cost of idle connections.
                servers.pop(t).stop()
                servers[t] = starters[t]()
                idle.append(idle_memory(t, servers[t], args.idle_conns, here))
        if idle:
            with open(os.path.join(out, "idle_memory.csv"), "w", newline="") as f:
                wr = csv.DictWriter(f, fieldnames=list(idle[0].keys()))
                wr.writeheader()
                wr.writerows(idle)

        with open(os.path.join(out, "meta.txt"), "w") as f:
            f.write(f"date {stamp}\nhost {host}\nnproc {os.cpu_count()}\n"
                    f"rounds {args.rounds}\nduration_s {args.duration}\nconns {conns_list}\n"
                    f"pin {args.pin}\nnginx_work {args.nginx_work}\nskipped {skipped}\n")
            for cmd in (["nginx", "-v"], ["haproxy", "-v"], ["wrk", "-v"], ["uname", "-a"]):
                r = subprocess.run(cmd, capture_output=True, text=True)
                f.write((r.stdout + r.stderr).splitlines()[0] if (r.stdout + r.stderr) else "")
                f.write("\n")
        # Keep the setup with the numbers.
        os.makedirs(os.path.join(out, "configs"), exist_ok=True)
        for root, _, files in os.walk(work):
            for name in files:
                if name.endswith((".conf", ".cfg", ".toml")):
                    with open(os.path.join(root, name)) as src, \
                         open(os.path.join(out, "configs", f"{os.path.basename(root)}-{name}"), "w") as dst:
                        dst.write(src.read())

        print()
        print(f"wrk -t1 (h2load -t1 -m{args.h2_streams} for -h2), {args.rounds} interleaved "
              f"rounds x {args.duration}s, medians of rounds; cpu = proxy processes' user+sys "
              f"CPU per request; x nginx: against the nginx of the same kind (-w2, -tls, -h2); "
              f"h2load gives no p99, its p50 is the mean")
        hdr = f"{'target':<9} {'conns':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} " \
              f"{'vs direct':>9} {'vs nginx':>8} {'cpu us/req':>10} {'errors':>6} {'reconn':>6}"
        print(hdr)
        print("-" * len(hdr))
        for s in summary:
            print(f"{s['target']:<9} {s['conns']:>5} {s['rps_median']:>9} {fmt(s['p50_ms'], '.2f'):>8} "
                  f"{fmt(s['p99_ms'], '.2f'):>8} {fmt(s['vs_direct'], '.2f'):>9} "
                  f"{fmt(s['vs_nginx'], '.2f'):>8} {fmt(s['proxy_cpu_us_per_req'], '.1f'):>10} "
                  f"{s['errors']:>6} {s['upstream_conns_after_warmup']:>6}")
        print("reconn: upstream connections opened after the first round (for direct: wrk's own)")
        print()
        print("proxy CPU split (medians, us/req) and paired ratios to nginx "
              "(median of each round's ratio)")
        hdr = f"{'target':<9} {'conns':>5} {'user':>6} {'sys':>6} {'cpu x nginx':>11} {'p99 x nginx':>11}"
        print(hdr)
        print("-" * len(hdr))
        for s in summary:
            if s["target"] not in servers:
                continue
            print(f"{s['target']:<9} {s['conns']:>5} {fmt(s['proxy_user_us_per_req'], '.1f'):>6} "
                  f"{fmt(s['proxy_sys_us_per_req'], '.1f'):>6} "
                  f"{fmt(s['cpu_vs_nginx_paired'], '.2f'):>11} {fmt(s['p99_vs_nginx_paired'], '.2f'):>11}")
        for s in summary:
            if s["target"] in ONE_WORKER:
                print(f"{s['target']} at {s['conns']} conns: cpu/req x"
                      f"{fmt(s['cpu_vs_one_worker_paired'], '.2f')} against "
                      f"{ONE_WORKER[s['target']]} (paired)"
                      + (f", connections per worker max/min {fmt(s['worker_conns_max_min'], '.2f')}"
                         if s["target"] in TWO_WORKER_WEIRS else ""))
        # Admission's own cost: the same weir with a queue that never fills.
        by = {(s["target"], s["conns"]): s for s in summary}
        for c in conns_list:
            a, b = by.get(("weir-admission", c)), by.get(("weir", c))
            if a and b and b["rps_median"] and b["proxy_cpu_us_per_req"]:
                print(f"admission overhead at {c} conns: req/s x{a['rps_median'] / b['rps_median']:.2f}, "
                      f"cpu/req x{a['proxy_cpu_us_per_req'] / b['proxy_cpu_us_per_req']:.2f} "
                      f"(weir-admission / weir)")
        if idle:
            print()
            print(f"{'idle':<8} {'conns':>6} {'open':>6} {'RSS before':>11} {'RSS held':>10} {'bytes/conn':>10}")
            for i in idle:
                print(f"{i['target']:<8} {i['connections']:>6} {i['still_open']:>6} "
                      f"{i['rss_before_kib'] / 1024:>8.1f} MiB {i['rss_during_kib'] / 1024:>6.1f} MiB "
                      f"{i['bytes_per_conn']:>10}")
        for t, why in skipped.items():
            print(f"SKIPPED {t}: {why}")
        print(f"\nraw results: {out}")
    finally:
        for s in servers.values():
            s.stop()
        upstream.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
