#!/usr/bin/env python3
"""How weir, nginx and HAProxy read the same awkward request targets.

Starts an upstream that answers with the request line and `Host` it
received, and in front of it weir, nginx (`proxy_pass` without a URI, so
the original target is forwarded) and HAProxy (defaults), each on its own
loopback port; sends each case of CASES to each of them; prints what every
proxy answered and, when it forwarded, what the upstream received (for
nginx also `$uri`, the path its `location` blocks match). Everything runs on
127.0.0.1 and stops when the cases are done.

The table in docs/request-path.md ("The canonical target") was made with it:

    cargo build --release && scripts/compare-targets.py target/release/weir

Needs nginx and haproxy (scripts/install-test-deps.sh nginx haproxy).
"""

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

CASES = [
    ("method with lowercase letters", b"get /x HTTP/1.1\r\nHost: a.example\r\n"),
    ("CONNECT", b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n"),
    ("HTTP/1.1 without Host", b"GET /x HTTP/1.1\r\n"),
    ("two different Host", b"GET /x HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n"),
    ("two equal Host", b"GET /x HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\n"),
    ("absolute form, other Host", b"GET http://a.example/x HTTP/1.1\r\nHost: admin.example\r\n"),
    ("authority form", b"GET a.example HTTP/1.1\r\nHost: a.example\r\n"),
    ("Host: [abc", b"GET /x HTTP/1.1\r\nHost: [abc\r\n"),
    ("Host: a..b", b"GET /x HTTP/1.1\r\nHost: a..b\r\n"),
    ('Host with "', b'GET /x HTTP/1.1\r\nHost: x", for=6.6.6.6\r\n'),
    ("port over 65535", b"GET /x HTTP/1.1\r\nHost: a.example:99999\r\n"),
    ("Host: A.Example.:0080", b"GET /x HTTP/1.1\r\nHost: A.Example.:0080\r\n"),
    ("%69ndex%2ephp", b"GET /w/%69ndex%2ephp HTTP/1.1\r\nHost: a\r\n"),
    ("%20 %3F %3a", b"GET /a%20b%3Fc%3a HTTP/1.1\r\nHost: a\r\n"),
    ("dot segments", b"GET /static/../w/./x HTTP/1.1\r\nHost: a\r\n"),
    ("%2e%2e", b"GET /static/%2e%2e/w HTTP/1.1\r\nHost: a\r\n"),
    ("repeated slashes", b"GET //w//x HTTP/1.1\r\nHost: a\r\n"),
    ("%2F", b"GET /w%2Fx HTTP/1.1\r\nHost: a\r\n"),
    ("backslash", b"GET /a\\b HTTP/1.1\r\nHost: a\r\n"),
    ("%5C", b"GET /a%5Cb HTTP/1.1\r\nHost: a\r\n"),
    ("%00", b"GET /a%00b HTTP/1.1\r\nHost: a\r\n"),
    ("%zz", b"GET /a%zz HTTP/1.1\r\nHost: a\r\n"),
    ("/..;/", b"GET /static/..;/admin HTTP/1.1\r\nHost: a\r\n"),
    (";parameters", b"GET /wiki/Foo;bar HTTP/1.1\r\nHost: a\r\n"),
    # Framing (the body follows the head's blank line).
    ("Transfer-Encoding: gzip, chunked",
     b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n"),
    ("two Transfer-Encoding",
     b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
     b"0\r\n\r\n"),
    ("Content-Length 2^63+",
     b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 9999999999999999999\r\n", b""),
    ("bare LF in a chunk line",
     b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n", b"3;x\nabc\r\n0\r\n\r\n"),
    ("empty chunk-size line",
     b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n", b"\r\nabc\r\n0\r\n\r\n"),
]

UPSTREAM, WEIR, NGINX, HAPROXY = 19700, 19701, 19702, 19703


def upstream(listener):
    """Answers each request with its request line and Host field(s)."""
    def serve(conn):
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            lines = data.split(b"\r\n")
            hosts = [l for l in lines if l.lower().startswith(b"host:")]
            body = lines[0] + b" | " + b"; ".join(hosts)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n" % len(body) + body)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def probe(port, request, body=b""):
    """(status, $uri if nginx said it, what the upstream received)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(request + b"Connection: close\r\n\r\n" + body)
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError as e:
        return ("err", "", str(e))
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = lines[0][9:12].decode(errors="replace")
    uri = next((l[6:].decode(errors="replace") for l in lines
                if l.lower().startswith(b"x-uri:")), "")
    received = body.decode(errors="replace") if status == "200" else ""
    return (status, uri, received)


def wait_for(port):
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on {port}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    weir = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="compare-targets-")
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", UPSTREAM))
    listener.listen(64)
    threading.Thread(target=upstream, args=(listener,), daemon=True).start()
    with open(os.path.join(tmp, "weir.toml"), "w") as f:
        f.write(f'[[listeners]]\naddress = "127.0.0.1:{WEIR}"\n[admin]\nenabled = false\n'
                f'[access_log]\ntarget = "off"\n'
                f'[pools.app]\nservers = ["127.0.0.1:{UPSTREAM}"]\n'
                f'[lifecycle]\nready_requires_upstream = false\n')
    with open(os.path.join(tmp, "nginx.conf"), "w") as f:
        f.write(f"daemon off; master_process off; pid {tmp}/nginx.pid; error_log {tmp}/nginx.err;\n"
                "events {}\nhttp { access_log off;\n"
                f" client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp};\n"
                f" uwsgi_temp_path {tmp}; scgi_temp_path {tmp};\n"
                f" server {{ listen 127.0.0.1:{NGINX}; location / {{\n"
                f"  proxy_pass http://127.0.0.1:{UPSTREAM}; proxy_set_header Host $host;\n"
                "  add_header X-Uri $uri always; } } }\n")
    with open(os.path.join(tmp, "haproxy.cfg"), "w") as f:
        f.write("global\n  maxconn 100\ndefaults\n  mode http\n  timeout connect 2s\n"
                "  timeout client 5s\n  timeout server 5s\n"
                f"frontend f\n  bind 127.0.0.1:{HAPROXY}\n  default_backend b\n"
                f"backend b\n  server s 127.0.0.1:{UPSTREAM}\n")
    log = open(os.path.join(tmp, "servers.log"), "w")
    procs = [
        subprocess.Popen([weir, "run", "-c", os.path.join(tmp, "weir.toml")],
                         stdout=log, stderr=log),
        subprocess.Popen(["nginx", "-c", os.path.join(tmp, "nginx.conf")],
                         stdout=log, stderr=log),
        subprocess.Popen(["haproxy", "-f", os.path.join(tmp, "haproxy.cfg")],
                         stdout=log, stderr=log),
    ]
    try:
        for port in (WEIR, NGINX, HAPROXY):
            wait_for(port)
        print(f"{'case':30} {'weir':34} {'nginx ($uri; forwarded)':44} haproxy")
        for name, request, *body in CASES:
            cells = []
            for port in (WEIR, NGINX, HAPROXY):
                status, uri, received = probe(port, request, *body)
                seen = f"{uri}; " if uri else ""
                cells.append(f"{status} {seen}{received}".strip())
            print(f"{name:30} {cells[0]:34} {cells[1]:44} {cells[2]}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
        listener.close()


if __name__ == "__main__":
    main()
