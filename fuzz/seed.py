#!/usr/bin/env python3
"""Writes the seed corpora (fuzz/corpus/NAME/seed-*), taken from the tests'
inputs. Rerun after adding a seed; campaigns add their finds beside them
(merged with `scripts/fuzz.sh merge`)."""
import os, struct, pathlib

here = pathlib.Path(__file__).resolve().parent
root = here.parent

def snapshot(sections):
    words = [int.from_bytes(b"WEIRLIMS", "little"), 1, 7, 1_790_000_000_000_000_000, len(sections)]
    for fp, entries in sections:
        words += [fp, len(entries)]
        for k, r in entries:
            words += [k, r]
    h = 0xcbf29ce484222325
    for w in words:
        h = (((h << 23) | (h >> 41)) & (2**64 - 1)) ^ w
        h = (h * 0x9E3779B97F4A7C15) & (2**64 - 1)
    words.append(h)
    return b"".join(struct.pack("<Q", w) for w in words)

def v2(fam_proto, addrs):
    return b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x21, fam_proto]) + struct.pack(">H", len(addrs)) + addrs

requests = [
    b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n",
    b"GET /w/index.php?search=a&title=Special%3ASearch HTTP/1.1\r\nHost: wiki.example\r\nUser-Agent: Mozilla/5.0\r\nAccept: text/html\r\nCookie: a=b; weir_pass=x\r\n\r\n",
    b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"GET http://a.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n",
    b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    b"PUT /x HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
    b"GET /chat HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: x\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n",
    b"GET //w/./index%2ephp?%73earch=a HTTP/1.1\r\nHost: WIKI.example.:80\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    b"GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
]

corpora = {
    "http1_request_head": requests,
    "http1_request_vs_hyper": requests,
    "chunked_body": [
        b"\x03" + b"5\r\nhello\r\n0\r\n\r\n",
        b"\x00" + b"a;ext=1\r\n0123456789\r\n3\r\nabc\r\n0\r\nTrailer: x\r\n\r\n",
        b"\x07" + b"FFFFFFFFFFFFFFFF\r\n",
        b"\x01" + b"1\nx\n0\n\n",
        b"\x0f" + b"\r\n",
    ],
    "response_head": [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nSet-Cookie: a=b\r\nSet-Cookie: c=d\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.0 304 Not Modified\r\nConnection: keep-alive\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
    ],
    "canonical_target": [
        b"GET\n/w/index.php?search=a\nwiki.example",
        b"GET\n//w/./index%2ephp?%73earch=a\nwiki.example",
        b"GET\n/static/%2e%2e/w/index.php\nh",
        b"GET\nhttp://a.example/x\nadmin.example",
        b"get\n/\nh",
        b"OPTIONS\n*\nh",
        b"CONNECT\nh.example:443\nh.example:443",
        b"GET\n/a%2Fb;x=1/%00\nh",
        b"GET\n/\n[abc",
        b"GET\n/x\n",
    ],
    "proxy_protocol": [
        b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET /",
        b"PROXY TCP6 2001:db8::1 2001:db8::2 4000 80\r\n",
        b"PROXY UNKNOWN\r\n",
        v2(0x11, bytes([192, 0, 2, 1, 198, 51, 100, 2]) + struct.pack(">HH", 56324, 443)),
        v2(0x21, bytes(16) + bytes(15) + b"\x01" + struct.pack(">HH", 1, 2)),
        b"\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00",
    ],
    "forwarded_headers": [
        b"203.0.113.9, 10.0.0.1",
        b"for=192.0.2.60;proto=http;by=203.0.113.43",
        b"for=\"[2001:db8:cafe::17]:4711\", for=10.0.0.2",
        b"unknown, 1.1.1.1\n2.2.2.2",
        b"for=_hidden, for=\"x\\\"y\"",
    ],
    "cookies": [
        b"a=b; weir_pass=xyz; session=abc",
        b"weir_pass=1\nweir_pass=2",
        b"=; ;;session=\"quoted\"",
    ],
    "challenge_answer": [
        b"nonce=abc&counter=12",
        b"nonce=&counter=&return=%2Fx",
        b"counter=18446744073709551615&nonce=" + b"A" * 200,
    ],
    "pass_token": [
        b"A" * 64,
        b"not-a-token",
        b"",
    ],
    "web_bot_auth": [
        b'sig1=("@authority");created=1735689600;keyid="poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U";alg="ed25519";expires=1735693200;nonce="mYotfW3CUjI68sbGw6oKd7kyXqPjZEtU8xFPGWFrqOAf5qC6MDe3pys3SWWCudB0MvwslHy32WXUpkR7u0lt/w==";tag="web-bot-auth"\n'
        b'sig1=:+NA/cssf4Y2bQTMTkyvTGRCaVzp9quyUevdwwMtMOWhhOOZ2T1subBj0BtvdnrpDEuwSAbiTeElXDzHL3WWKCw==:',
        b'sig2=("@authority" "signature-agent");created=1735689600;keyid="poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U";alg="ed25519";expires=1735693200;nonce="e8N7S2MFd/qrd6T2R3tdfAuuANngKI7LFtKYI/vowzk4lAZYadIX6wW25MwG7DCT9RUKAJ0qVkU0mEeLElW1qg==";tag="web-bot-auth"\n'
        b'sig2=:jdq0SqOwHdyHr9+r5jw3iYZH6aNGKijYp/EstF4RQTQdi5N5YYKrD+mCT1HA1nZDsi6nJKuHxUi/5Syp3rLWBA==:\n"https://signature-agent.test"',
        b'sig1=("@authority" "signature-agent";key="a" "@path" "x");created=1;expires=2;keyid="k";tag="web-bot-auth"\nsig1=:AAAA:\na="b"',
        b'sig1=(\nsig1=:\n',
    ],
    "replay_line": [
        b'203.0.113.9 - - [10/Oct/2026:13:55:36 +0900] "GET /w/index.php?title=A&diff=2 HTTP/1.1" 200 512 "https://ref/" "Mozilla/5.0 (X11)"',
        b'203.0.113.9 - - [10/Oct/2026:13:55:36 +0900] "GET /a HTTP/1.1" 200 5 "-" "say \\"hi\\""',
        b'{"level":"info","ts":1791608136.5,"logger":"http.log.access.log0","msg":"handled request","request":{"remote_ip":"10.0.0.1","remote_port":"5555","client_ip":"203.0.113.9","proto":"HTTP/2.0","method":"GET","host":"wiki.example","uri":"/w/index.php?diff=2","headers":{"User-Agent":["Mozilla/5.0"]}},"duration":0.0123,"size":2048,"status":200}',
        b'{"time":"2026-10-10T04:55:36.123Z","client":"203.0.113.9","peer":"10.0.0.1","client_source":"x_forwarded_for","method":"GET","host":"wiki.example","path":"/w/index.php?diff=2","proto":"HTTP/1.1","class":"expensive","decision":"reject","rule":"anon_expensive","pool":"app","upstream":null,"status":429,"upstream_status":null,"bytes_in":0,"bytes_out":17,"duration_ms":0.2,"queue_ms":0.0,"upstream_ms":null,"error":null}',
    ],
    "snapshot_file": [
        snapshot([]),
        snapshot([(0xABCDEF, [(1, 5_000_000_000), (2, 10)]), (0x1234, [(99, 1)])]),
        b"WEIRLIMS",
    ],
    "config_toml": [
        b'[[listeners]]\naddress = "127.0.0.1:0"\n[pools.app]\nservers = ["127.0.0.1:9000"]\n',
        b'[[listeners]]\naddress = "nope"\n[identity]\ntrusted_proxies = ["10.0.0.0/8", "10.1.2.3/8"]\n[limits]\nheader_read_timeout = "0s"\n',
    ] + [p.read_bytes() for p in sorted((root / "examples").glob("*.toml"))],
}

for name, seeds in corpora.items():
    d = here / "corpus" / name
    d.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(seeds):
        (d / f"seed-{i:02}").write_bytes(s)
print(f"{sum(len(s) for s in corpora.values())} seeds in {len(corpora)} corpora")
