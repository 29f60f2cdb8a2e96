#!/usr/bin/env python3
"""Instructions per proxied request, counted by valgrind's callgrind: the
steady figure for weir's own code on a noisy machine (CPU time moves 10-30%
between rounds; instruction counts move well under 1%).

For each binary given (a weir, or `nginx`: nginx doing the same work,
`proxy_bench.NGINX_SAME_WORK`, as one process): starts the benchmark's
upstream and the proxy (weir with the benchmark's config: access log,
metrics, a three-level rate rule and admission on) under `valgrind
--tool=callgrind`, warms it, zeroes the counters, sends a fixed number of
requests with h2load (`--proto`: HTTP/1.1 keep-alive, plain or over TLS, or
HTTP/2 over TLS), dumps, and prints user-space instructions per request
(TLS's crypto included, the kernel's time not); `--phases` splits a weir's
by phase of the request path (bench/phases.py). Binaries are measured one
after the other, in the order given, on the same upstream; everything runs
on 127.0.0.1 and stops when done.

    bench/callgrind.py target/release/weir /tmp/weir-previous
    bench/callgrind.py --conns 20 --requests 20000 --phases target/release/weir
    bench/callgrind.py --proto h2 --phases nginx target/release/weir

Does not: build anything, or simulate caches (add `--cache-sim` for that:
then last-level misses per request are printed too, by phase with `--phases`).
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proxy_bench  # noqa: E402  (the benchmark's own processes and config)


def totals(dump):
    """The `summary:` (or `totals:`) line of a callgrind dump, by event."""
    events, values = None, None
    with open(dump) as f:
        for line in f:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith(("summary:", "totals:")):
                values = [int(v) for v in line.split()[1:]]
    return dict(zip(events or [], values or []))


def load_argv(port, args, requests=None, seconds=None):
    """h2load's command for `--proto`: HTTP/1.1 keep-alive (plain or over
    TLS), or HTTP/2 over TLS with `--streams` requests in flight a
    connection; a request count, or a duration."""
    scheme = "http" if args.proto == "h1" else "https"
    argv = ["h2load", "-t1", f"-c{args.conns}"]
    argv += ["--h1"] if args.proto in ("h1", "tls") else [f"-m{args.streams}"]
    argv += [f"-n{requests}"] if requests else [f"-D{seconds}"]
    return argv + [f"{scheme}://127.0.0.1:{port}/"]


def measure(binary, upstream, work, args, tls):
    """Instructions per request of `binary` (a weir, or `nginx`: nginx doing
    the same work as weir, `proxy_bench.NGINX_SAME_WORK`, as one process)."""
    name = f"{os.path.basename(binary)}-{len(os.listdir(work))}"
    out = os.path.join(work, name + ".callgrind")
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p",
            "--collect-atstart=yes"]
    if args.cache_sim:
        argv += ["--cache-sim=yes", "--LL=1048576,16,64"]
    if args.phases:
        # Costs per instruction address, names in full: bench/phases.py maps
        # each address to its inlined frames to split a request by phase.
        argv += ["--dump-instr=yes", "--compress-strings=no", "--compress-pos=no"]
    proxy_bench.START_DEADLINE = 120
    if binary == "nginx":
        proxy_bench.nginx_single_process, proxy_bench.nginx_prefix = True, argv
        try:
            server = proxy_bench.start_nginx_proxy(work, upstream.port, None, name,
                                                   tls=tls if args.proto != "h1" else None)
        finally:
            proxy_bench.nginx_single_process, proxy_bench.nginx_prefix = False, []
        port = server.port
    else:
        # proxy_bench.start_weir runs the binary it is given: a script that
        # execs valgrind on weir (so the process it starts is valgrind's).
        wrapper = os.path.join(work, name + ".sh")
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\nexec " + " ".join(argv)
                    + f" {os.path.abspath(binary)} \"$@\"\n")
        os.chmod(wrapper, 0o755)
        config = proxy_bench.weir_config(upstream.port, tls=tls if args.proto != "h1" else None)
        server = proxy_bench.start_weir(work, name, config, wrapper, None)
        # The TLS listener is the second (`weir_config`).
        port = server.port if args.proto == "h1" else server.ports[1]
    try:
        subprocess.run(load_argv(port, args, seconds=args.warmup), capture_output=True,
                       timeout=600)
        pid = server.proc.pid
        subprocess.run(["callgrind_control", "--zero", str(pid)], check=True,
                       capture_output=True)
        # A fixed count: per-wakeup costs (epoll, timers) are spread over
        # the same number of requests whatever the machine's load.
        text = subprocess.run(load_argv(port, args, requests=args.requests),
                              capture_output=True, text=True, timeout=3600).stdout
        subprocess.run(["callgrind_control", "--dump", str(pid)], check=True,
                       capture_output=True)
        time.sleep(1)
    finally:
        server.stop()
    requests = proxy_bench.parse_h2load(text)["requests"]
    # callgrind_control --dump writes `<out>.<pid>.1`; the exit writes `<out>.<pid>`.
    dumps = glob.glob(f"{out}.{pid}.1")
    if not dumps:
        sys.exit(f"no callgrind dump for {binary} in {work}")
    return requests, totals(dumps[0]), dumps[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--conns", type=int, default=20)
    ap.add_argument("--requests", type=int, default=20000,
                    help="requests measured (h2load, a fixed count)")
    ap.add_argument("--proto", choices=["h1", "tls", "h2"], default="h1",
                    help="h1: HTTP/1.1 keep-alive, plain; tls: the same over TLS; "
                         "h2: HTTP/2 over TLS (ALPN h2), --streams a connection")
    ap.add_argument("--streams", type=int, default=10,
                    help="with --proto h2: requests in flight a connection (h2load -m)")
    ap.add_argument("--warmup", type=int, default=3, help="seconds of load before counting")
    ap.add_argument("--cache-sim", action="store_true")
    ap.add_argument("--phases", action="store_true",
                    help="also print instructions per request by phase (bench/phases.py)")
    ap.add_argument("--keep", default=None,
                    help="directory to keep the callgrind dumps in (default: a temporary one)")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="weir-callgrind-")
    os.makedirs(work, exist_ok=True)
    upstream = proxy_bench.start_upstream(work, None)
    tls = proxy_bench.self_signed(work) if args.proto != "h1" else None
    try:
        print(f"{'binary':40} {'requests':>9} {'instr/req':>10}"
              + (f" {'LL miss/req':>11}" if args.cache_sim else ""))
        for b in args.binaries:
            requests, t, dump = measure(b, upstream, work, args, tls)
            per = t.get("Ir", 0) / max(requests, 1)
            line = f"{b:40} {requests:>9} {per:>10.0f}"
            if args.cache_sim:
                ll = (t.get("DLmr", 0) + t.get("DLmw", 0) + t.get("ILmr", 0)) / max(requests, 1)
                line += f" {ll:>11.1f}"
            print(line, flush=True)
            if args.phases and b != "nginx":
                import phases
                phases.report(dump, b, requests)
    finally:
        upstream.stop()


if __name__ == "__main__":
    main()
