#!/usr/bin/env python3
"""Instructions per proxied request, counted by valgrind's callgrind: the
steady figure for weir's own code on a noisy machine (CPU time moves 10-30%
between rounds; instruction counts move well under 1%).

For each weir binary given: starts the benchmark's upstream and weir (the
benchmark's config: access log, metrics, a three-level rate rule and
admission on) under `valgrind --tool=callgrind`, warms it with wrk, zeroes
the counters, sends a fixed number of requests (h2load over HTTP/1.1,
keep-alive; `--requests 0` for wrk over `--seconds` instead, whose request
count varies with the machine's load and moves the per-request figure by a
few per cent), dumps, and prints user-space instructions per request;
`--phases` splits them by phase of the request path (bench/phases.py).
Binaries are measured one after the other, in the order given, on the same
upstream; everything runs on 127.0.0.1 and stops when done.

    bench/callgrind.py target/release/weir /tmp/weir-previous
    bench/callgrind.py --conns 20 --requests 20000 --phases target/release/weir

Does not: build anything, or simulate caches (add `--cache-sim` for that:
then last-level misses per request are printed too).
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


def measure(binary, upstream, work, args):
    name = f"weir-{len(os.listdir(work))}"
    out = os.path.join(work, name + ".callgrind")
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p",
            "--collect-atstart=yes"]
    if args.cache_sim:
        argv += ["--cache-sim=yes", "--LL=1048576,16,64"]
    if args.phases:
        # Costs per instruction address, names in full: bench/phases.py maps
        # each address to its inlined frames to split a request by phase.
        argv += ["--dump-instr=yes", "--compress-strings=no", "--compress-pos=no"]
    # proxy_bench.start_weir runs the binary it is given: a script that
    # execs valgrind on weir (so the process it starts is valgrind's).
    wrapper = os.path.join(work, name + ".sh")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\nexec " + " ".join(argv) + f" {os.path.abspath(binary)} \"$@\"\n")
    os.chmod(wrapper, 0o755)
    proxy_bench.START_DEADLINE = 120
    server = proxy_bench.start_weir(work, name, proxy_bench.weir_config(upstream.port),
                                    wrapper, None)
    try:
        proxy_bench.run_wrk(server.port, args.conns, args.warmup, None)
        pid = server.proc.pid
        subprocess.run(["callgrind_control", "--zero", str(pid)], check=True,
                       capture_output=True)
        if args.requests:
            # A fixed count: per-wakeup costs (epoll, timers) are spread over
            # the same number of requests whatever the machine's load.
            text = subprocess.run(
                ["h2load", "--h1", "-t1", f"-c{args.conns}", f"-n{args.requests}",
                 f"http://127.0.0.1:{server.port}/"],
                capture_output=True, text=True, timeout=3600).stdout
        else:
            text = proxy_bench.run_wrk(server.port, args.conns, args.seconds, None)
        subprocess.run(["callgrind_control", "--dump", str(pid)], check=True,
                       capture_output=True)
        time.sleep(1)
    finally:
        server.stop()
    parse = proxy_bench.parse_h2load if args.requests else proxy_bench.parse_wrk
    requests = parse(text)["requests"]
    # callgrind_control --dump writes `<out>.<pid>.1`; the exit writes `<out>.<pid>`.
    dumps = glob.glob(f"{out}.{pid}.1")
    if not dumps:
        sys.exit(f"no callgrind dump for {binary} in {work}")
    return requests, totals(dumps[0]), dumps[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--conns", type=int, default=20)
    ap.add_argument("--seconds", type=int, default=10,
                    help="with --requests 0: measure wrk for this long")
    ap.add_argument("--requests", type=int, default=20000,
                    help="requests measured (h2load --h1, HTTP/1.1 keep-alive like wrk); "
                         "0: wrk for --seconds instead")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cache-sim", action="store_true")
    ap.add_argument("--phases", action="store_true",
                    help="also print instructions per request by phase (bench/phases.py)")
    ap.add_argument("--keep", default=None,
                    help="directory to keep the callgrind dumps in (default: a temporary one)")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="weir-callgrind-")
    os.makedirs(work, exist_ok=True)
    upstream = proxy_bench.start_upstream(work, None)
    try:
        print(f"{'binary':40} {'requests':>9} {'instr/req':>10}"
              + (f" {'LL miss/req':>11}" if args.cache_sim else ""))
        for b in args.binaries:
            requests, t, dump = measure(b, upstream, work, args)
            per = t.get("Ir", 0) / max(requests, 1)
            line = f"{b:40} {requests:>9} {per:>10.0f}"
            if args.cache_sim:
                ll = (t.get("DLmr", 0) + t.get("DLmw", 0) + t.get("ILmr", 0)) / max(requests, 1)
                line += f" {ll:>11.1f}"
            print(line, flush=True)
            if args.phases:
                import phases
                phases.report(dump, b, requests)
    finally:
        upstream.stop()


if __name__ == "__main__":
    main()
