#!/usr/bin/env python3
"""Drives an instrumented weir with a mix of traffic, so that the profile it
writes on exit can guide the optimised build (scripts/build-pgo.sh).

Owns: the upstream for the mix (nginx: a small answer and a 64 KiB file), a
weir config like an operator's (a rate-limited class, a TLS listener,
forwarding fields from an untrusted client), and the wrk (and, for HTTP/2,
h2load) runs of the mix.

The mix is not the benchmark's request: it also holds bodies both ways, TLS,
HTTP/2, refusals (429) and larger answers, so that no path is laid out as cold only
because the benchmark does not visit it. The plain GET still carries most of
the weight, as it does in front of a real site.

Does not: build anything, measure anything, or merge the profile.
"""
import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proxy_bench import (  # noqa: E402
    BODY, PAGE_ROUTE, nginx_http_common, nginx_main, free_port, start_nginx, start_weir,
    weir_config,
)

# (what, connections, seconds, wrk arguments after the URL's scheme and host)
MIX = [
    ("GET small", 50, 6, ["/"]),
    ("GET small, 1,000 connections", 1000, 6, ["/"]),
    ("GET 64 KiB", 50, 3, ["/static/big"]),
    ("POST 4 KiB body", 50, 3, ["/api/items", "-s", "{post}"]),
    ("GET refused by a rate rule", 50, 3, ["/search?q=weir"]),
    ("GET with X-Forwarded-For from an untrusted client", 50, 2,
     ["/", "-H", "X-Forwarded-For: 192.0.2.1"]),
]
TLS_MIX = [("GET small over TLS", 50, 3, ["/"])]
# HTTP/2 over TLS, the path browsers take: (what, connections, streams a
# connection, seconds). Without it the profile laid HTTP/2 out as cold.
H2_MIX = [("GET small over HTTP/2", 100, 10, 3)]


def start_upstream(workdir):
    port = free_port()
    static = os.path.join(workdir, "static")
    os.makedirs(static, exist_ok=True)
    with open(os.path.join(static, "big"), "wb") as f:
        f.write(b"w" * 65536)

    def conf(d):
        return nginx_main(d, 1, 4096) + (
            "http {\n" + nginx_http_common(d) + "access_log off;\n"
            f"server {{ listen 127.0.0.1:{port} backlog=4096; default_type text/plain;\n"
            f"  location /static/ {{ root {workdir}; }}\n"
            f"  location / {{ return 200 \"{BODY.strip()}\\n\"; }} }}\n}}\n"
        )
    return start_nginx("upstream", conf, workdir, port, None)


# Generous for pages (never reached here), tight for search: the mix sees
# both a rule that passes and one that refuses.
ROUTES = (
    '[[routes]]\npool = "app"\nclass = "search"\npath_prefix = "/search"\n\n'
    + PAGE_ROUTE
    + '[[classes.page.rules]]\nname = "page-rate"\nlimits = [\n'
    '  { per = "ip", rate = 100000000, window = "1m" },\n'
    '  { per = "subnet", rate = 100000000, window = "1m" },\n]\n\n'
    '[[classes.search.rules]]\nname = "search-rate"\nlimits = [\n'
    '  { per = "ip", rate = 10, window = "1m" },\n]\n\n'
)


def self_signed(workdir):
    """A certificate and key for the TLS listener, or None without openssl."""
    cert, key = os.path.join(workdir, "cert.pem"), os.path.join(workdir, "key.pem")
    try:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost"],
            check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"pgo_train: no TLS in the mix ({e})", flush=True)
        return None
    return cert, key


def wrk(scheme, port, what, conns, seconds, argv, post):
    path, extra = argv[0], [a.replace("{post}", post) for a in argv[1:]]
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--timeout", "5s", *extra,
           f"{scheme}://127.0.0.1:{port}{path}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    line = next((x.strip() for x in out.stdout.splitlines() if "requests in" in x), "no requests")
    print(f"pgo_train: {what}: {line}", flush=True)
    if out.returncode != 0 or "requests in" not in out.stdout:
        raise RuntimeError(f"wrk failed for {what}:\n{out.stdout}\n{out.stderr}")


def h2load(port, what, conns, streams, seconds):
    cmd = ["h2load", "-t1", f"-c{conns}", f"-m{streams}", f"-D{seconds}",
           f"https://127.0.0.1:{port}/"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    line = next((x.strip() for x in out.stdout.splitlines() if x.startswith("finished in")),
                "no requests")
    print(f"pgo_train: {what}: {line}", flush=True)
    if out.returncode != 0 or "finished in" not in out.stdout:
        raise RuntimeError(f"h2load failed for {what}:\n{out.stdout}\n{out.stderr}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weir-bin", required=True, help="weir built with -Cprofile-generate")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="weir-pgo-")
    post = os.path.join(work, "post.lua")
    with open(post, "w") as f:
        f.write('wrk.method = "POST"\nwrk.body = string.rep("p", 4096)\n'
                'wrk.headers["Content-Type"] = "application/octet-stream"\n')
    tls = self_signed(work)
    upstream = start_upstream(work)
    try:
        config = weir_config(upstream.port, tls=tls, routes=ROUTES)
        weir = start_weir(work, "weir", config, args.weir_bin, None)
        try:
            for what, conns, seconds, argv in MIX:
                wrk("http", weir.ports[0], what, conns, seconds, argv, post)
            if tls:
                for what, conns, seconds, argv in TLS_MIX:
                    wrk("https", weir.ports[1], what, conns, seconds, argv, post)
                for what, conns, streams, seconds in H2_MIX:
                    h2load(weir.ports[1], what, conns, streams, seconds)
        finally:
            # SIGTERM: weir drains and exits 0, which writes the profile.
            weir.stop()
        if weir.proc.returncode != 0:
            raise RuntimeError(f"weir exited with {weir.proc.returncode}")
    finally:
        upstream.stop()


if __name__ == "__main__":
    main()
