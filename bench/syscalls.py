#!/usr/bin/env python3
"""System calls per proxied request, weir against nginx doing the same work
(`proxy_bench.NGINX_SAME_WORK`), counted by `strace -c` attached to the
proxy while h2load sends a fixed number of requests: the kernel's side of
issue 39's ratios, which callgrind (user space only) does not see. Prints
calls per request in total and for the calls that matter (reads, writes,
epoll waits: a wait is a wake-up).

    bench/syscalls.py target/release/weir
    bench/syscalls.py --proto h2 --conns 1000 target/release/weir

strace slows the proxy a great deal: the counts are what to read, not the
time. Each binary (and nginx, first) is measured on the same upstream, on
127.0.0.1, and stopped when done.

Does not: build anything; count the upstream's or h2load's calls.
"""
import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import proxy_bench  # noqa: E402  (the benchmark's own processes and config)
from callgrind import load_argv  # noqa: E402  (the same load, by --proto)

# Summed into the rows printed (the rest only in the total).
GROUPS = {
    "read": ("read", "recvfrom", "recvmsg", "readv"),
    "write": ("write", "sendto", "sendmsg", "writev"),
    "epoll_wait": ("epoll_wait", "epoll_pwait", "epoll_pwait2"),
    "epoll_ctl": ("epoll_ctl",),
}


def parse_summary(path):
    """Calls by syscall from `strace -c -o path`'s table."""
    calls = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            # % time, seconds, usecs/call, calls, [errors], syscall
            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                try:
                    calls[parts[-1]] = int(parts[3])
                except ValueError:
                    continue
    return calls


def measure(name, server, port, args, work):
    """Calls by syscall while `args.requests` requests go through `port`."""
    subprocess.run(load_argv(port, args, seconds=args.warmup), capture_output=True,
                   timeout=600)
    out = os.path.join(work, f"{name}.strace")
    # Every process of the server (nginx's worker) and every thread (-f).
    pids = [server.proc.pid] + proxy_bench.children(server.proc.pid)
    argv = ["strace", "-c", "-f", "-o", out]
    for p in pids:
        argv += ["-p", str(p)]
    tracer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)  # attached
    text = subprocess.run(load_argv(port, args, requests=args.requests),
                          capture_output=True, text=True, timeout=3600).stdout
    tracer.send_signal(signal.SIGINT)
    tracer.wait(timeout=60)
    requests = proxy_bench.parse_h2load(text)["requests"]
    return requests, parse_summary(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binaries", nargs="+", help="weir binaries (nginx is measured first)")
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--proto", choices=["h1", "tls", "h2"], default="h1")
    ap.add_argument("--streams", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="weir-syscalls-")
    upstream = proxy_bench.start_upstream(work, None)
    tls = proxy_bench.self_signed(work) if args.proto != "h1" else None
    rows = []
    try:
        server = proxy_bench.start_nginx_proxy(work, upstream.port, None, "nginx",
                                               tls=tls)
        try:
            rows.append(("nginx",) + measure("nginx", server, server.port, args, work))
        finally:
            server.stop()
        for i, b in enumerate(args.binaries):
            name = f"weir-{i}"
            server = proxy_bench.start_weir(work, name, proxy_bench.weir_config(
                upstream.port, tls=tls), b, None)
            try:
                port = server.port if args.proto == "h1" else server.ports[1]
                rows.append((b,) + measure(name, server, port, args, work))
            finally:
                server.stop()
    finally:
        upstream.stop()
    print(f"{args.proto}, {args.conns} connections, {args.requests} requests: "
          "system calls a request")
    print(f"{'proxy':32} {'total':>7} " + " ".join(f"{g:>10}" for g in GROUPS))
    for name, requests, calls in rows:
        per = collections.Counter()
        for group, names in GROUPS.items():
            per[group] = sum(calls.get(n, 0) for n in names) / max(requests, 1)
        total = sum(calls.values()) / max(requests, 1)
        print(f"{name:32} {total:>7.2f} " + " ".join(f"{per[g]:>10.2f}" for g in GROUPS))
    print("the most frequent, a request:")
    for name, requests, calls in rows:
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:6]
        print(f"  {name}: " + ", ".join(f"{c} {n / max(requests, 1):.2f}" for c, n in top))


if __name__ == "__main__":
    main()
