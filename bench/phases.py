#!/usr/bin/env python3
"""Instructions per request by phase of the request path, from a callgrind
dump made with `--dump-instr=yes --compress-strings=no --compress-pos=no`
(bench/callgrind.py --phases makes one and calls this).

Why not callgrind_annotate's inclusive costs alone: in the release build
(fat LTO) most phases are inlined into the request's future
(`weir::proxy::serve::{{closure}}`), so they have no cost of their own in
the dump. Here every instruction address of weir's binary is mapped to its
inlined frames (`addr2line -i`), and each cost is given to the innermost
frame that names a phase:

- an instruction's own cost, by the frames at its address;
- a call's inclusive cost, by the frames at its call site, when they name a
  phase (then the callee's whole cost is that phase's);
- otherwise a function's cost is shared out as its callers' were (a
  function called from `forward` and from `log` is split in proportion).

So a `malloc` called by the access log counts as `log`, and a metric
incremented inside `forward` counts as `metrics`. What no phase names (the
scheduler, epoll, connection accept) is `runtime/edge`. With a dump made
under `--cache-sim=yes` the last-level data misses (`DLmr` + `DLmw`) are
given to the phases the same way, in a column of their own: where a
request's memory went cold while it waited.

    bench/phases.py DUMP BINARY REQUESTS [PHASE...]   (PHASE: list its top functions)

Does not: run anything but addr2line; measure (see bench/callgrind.py).
"""
import collections
import re
import subprocess
import sys

# Phase by function name, checked innermost frame first; in each frame the
# first pattern that matches wins (so `admission::coalesce` is coalescing).
PHASES = [
    ("metrics", r"weir::observe::metrics|prometheus_client|count_request|pool_handles"),
    ("log", r"weir::observe::access_log|weir::proxy::log::|weir::observe::request_id"),
    ("parse", r"weir_http::server::(scan_head|read_head|decide_head|parse_head|field_map"
              r"|next_head|body_framing|Wire::poll_fill)"
              r"|weir_http::framing::(HopFields|only_chunked|parse_content_length)"),
    ("write", r"weir_http::server::(write_response|write_body|encode_head|write_all|http_date"
              r"|out_framing)|weir_http::fields::|ResponseBody as http_body::Body"),
    ("target", r"weir::proxy::read_target|weir_http::target::"),
    ("identity", r"weir::proxy::identify|weir::identity::"),
    ("route", r"weir::proxy::route\b|weir::policy::route::"),
    # Two names each: the phase files as they are (proxy/deciding.rs,
    # coalescing.rs, forwarding.rs, responding.rs, weir_paths.rs) and as
    # they were before 2026-12-06 (policy.rs, upstream.rs), so older
    # builds still split.
    ("session", r"weir::proxy::(policy|deciding)::session"),
    ("rules", r"weir::proxy::(policy|deciding|weir_paths)::|weir::policy::|weir::challenge::"
              r"|weir_limiter::"),
    ("coalesce", r"weir::proxy::upstream::coalesce|weir::proxy::coalescing::|Routed::new"
                 r"|weir::admission::coalesce"),
    ("admission", r"weir::proxy::admit::|weir::admission::"),
    ("respond", r"weir::proxy::upstream::respond|CloseWhenAsked|weir::proxy::upstream::Answer"
                r"|weir::proxy::responding::"),
    ("forward", r"weir::proxy::upstream::|weir::proxy::forwarding::|weir::upstream::"
                r"|weir_http::connections::|weir_http::client::|weir_http::body::RequestBody"),
    # TLS and hyper's codecs (the TLS listener, HTTP/2): named by their
    # crates, since weir's own frames do not call into them.
    ("tls", r"rustls::|tokio_rustls::|ring::aead|ring_core_[0-9_]*_(aes|gcm|chacha)"),
    ("hyper", r"\bh2::|hyper::|weir::edge::serve::hyper_service"),
    ("request glue", r"weir::proxy::serve|weir::proxy::handle|weir::proxy::ConnHandler"
                     r"|weir::proxy::upstream\b|weir::proxy::send_again|weir::proxy::Boxed"
                     r"|weir::proxy::exchange::"),
]
# An async fn's inlined body is named `{async_fn#0}` by its debug info,
# without its path: such frames are placed by their source file.
FILES = [
    ("metrics", r"observe/metrics\.rs"),
    ("log", r"observe/access_log\.rs|proxy/log\.rs"),
    ("identity", r"/identity/"),
    ("rules", r"proxy/(policy|deciding|weir_paths)\.rs|/policy/|/challenge/|weir-limiter/"),
    ("coalesce", r"proxy/coalescing\.rs"),
    ("admission", r"proxy/admit\.rs|/admission/"),
    ("respond", r"proxy/responding\.rs"),
    ("forward", r"proxy/(upstream|forwarding)\.rs|/upstream/"
                r"|weir-http/src/(client|connections)\.rs"),
]
FILES_COMPILED = [(name, re.compile(p)) for name, p in FILES]
ORDER = ["parse", "target", "identity", "route", "session", "rules", "coalesce",
         "admission", "forward", "respond", "write", "log", "metrics", "tls", "hyper",
         "request glue",
         "runtime/edge"]
COMPILED = [(name, re.compile(p)) for name, p in PHASES]


def classify_name(name, file=""):
    for phase, rx in COMPILED:
        if rx.search(name):
            return phase
    if name.startswith("{"):
        for phase, rx in FILES_COMPILED:
            if rx.search(file):
                return phase
    return None


def parse_dump(path):
    """Self costs and calls per function: {fn: {"ob", "self": {addr: cost},
    "calls": [(site, callee, cost)]}}, a cost being (instructions,
    last-level data misses); the misses are 0 unless the dump was made with
    `--cache-sim=yes` (its `DLmr` and `DLmw` events)."""
    fns = collections.defaultdict(lambda: {"ob": None, "self": collections.defaultdict(lambda: [0, 0]),
                                           "calls": []})
    ob = fn = cfn = None
    pending_call = False
    events = None
    miss_at = ()
    with open(path) as f:
        for line in f:
            if line.startswith("events:"):
                events = line.split()[1:]
                # Columns after the address and the line number.
                miss_at = tuple(events.index(e) + 2 for e in ("DLmr", "DLmw") if e in events)
                continue
            c = line[0]
            if c == "0" and line.startswith("0x"):
                parts = line.split()
                addr = int(parts[0], 16)
                ir = int(parts[2]) if len(parts) > 2 else 0
                miss = sum(int(parts[i]) for i in miss_at if i < len(parts))
                if pending_call:
                    fns[fn]["calls"].append((addr, cfn, (ir, miss)))
                    pending_call = False
                else:
                    cost = fns[fn]["self"][addr]
                    cost[0] += ir
                    cost[1] += miss
            elif line.startswith("ob="):
                ob = line[3:].strip()
            elif line.startswith("fn="):
                fn = line[3:].strip()
                fns[fn]["ob"] = ob
            elif line.startswith("cfn="):
                cfn = line[4:].strip()
            elif line.startswith("calls="):
                pending_call = True
    assert events and events[0] == "Ir", f"{path}: Ir must be the first event ({events})"
    return fns


def inline_frames(binary, addrs):
    """{addr: [(function name, file:line), innermost first]} for addresses
    in `binary`."""
    addrs = sorted(addrs)
    out = subprocess.run(["addr2line", "-e", binary, "-a", "-f", "-i", "-C"],
                         input="".join(f"{a:#x}\n" for a in addrs),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    frames, cur, i = {}, None, 0
    while i < len(out):
        line = out[i]
        if line.startswith("0x"):
            cur = int(line, 16)
            frames[cur] = []
            i += 1
            continue
        frames[cur].append((line, out[i + 1] if i + 1 < len(out) else ""))
        i += 2  # the function, then its file:line
    return frames


def attribute(fns, binary):
    mine = [n for n, f in fns.items() if f["ob"] and f["ob"].endswith(binary.rsplit("/", 1)[-1])]
    addrs = set()
    for n in mine:
        addrs.update(fns[n]["self"])
        addrs.update(site for site, _, _ in fns[n]["calls"])
    frames = inline_frames(binary, addrs)

    def site_phase(fn, addr):
        chain = frames.get(addr) if fns[fn]["ob"] and fn in mine_set else None
        for name, file in (chain or []) + [(fn, "")]:
            p = classify_name(name, file)
            if p:
                return p
        return None

    mine_set = set(mine)
    # Callers of each function, with the phase each call site names (None:
    # the caller's own share).
    callers = collections.defaultdict(list)
    for fn, f in fns.items():
        for site, callee, (ir, _) in f["calls"]:
            if callee != fn:
                callers[callee].append((fn, site_phase(fn, site), ir))
    share = {}

    def shares(fn, depth=0):
        """{phase: fraction} of the contexts `fn` runs in."""
        if fn in share:
            return share[fn]
        share[fn] = {"runtime/edge": 1.0}  # a cycle's answer while it is worked out
        if depth > 200 or not callers.get(fn):
            return share[fn]
        acc = collections.Counter()
        for caller, phase, ir in callers[fn]:
            if phase:
                acc[phase] += ir
            else:
                for p, frac in shares(caller, depth + 1).items():
                    acc[p] += ir * frac
        total = sum(acc.values())
        share[fn] = {p: v / total for p, v in acc.items()} if total else {"runtime/edge": 1.0}
        return share[fn]

    sys.setrecursionlimit(10000)
    totals, misses = collections.Counter(), collections.Counter()
    detail = collections.defaultdict(collections.Counter)
    for fn, f in fns.items():
        for addr, (ir, miss) in f["self"].items():
            p = site_phase(fn, addr)
            chain = frames.get(addr) if fn in mine_set else None
            label = short(chain[0][0] if chain else fn)
            for q, frac in ({p: 1.0} if p else shares(fn)).items():
                totals[q] += ir * frac
                misses[q] += miss * frac
                detail[q][label] += ir * frac
    return totals, misses, detail


def short(name):
    """A function's name without generic arguments, for the detail lists."""
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)[-90:]


def report(dump, binary, requests, out=sys.stdout, detail_of=()):
    fns = parse_dump(dump)
    totals, misses, detail = attribute(fns, binary)
    allocator = sum(c[0] for n, f in fns.items() for c in f["self"].values()
                    if re.search(r"_rjem_|je_|jemalloc|^(malloc|free|realloc|sdallocx)$", n))
    memcpy = sum(c[0] for n, f in fns.items() for c in f["self"].values()
                 if re.search(r"memcpy|memmove", n))
    whole, missed = sum(totals.values()), sum(misses.values())
    # Last-level misses by phase, when the dump simulated the caches.
    miss_col = (lambda p: f"  {misses.get(p, 0) / requests:>9.1f}") if missed else (lambda p: "")
    print(f"  phase            instr/request  share   (of {whole / requests:,.0f})"
          + (f"  LL misses/request (of {missed / requests:.1f})" if missed else ""), file=out)
    for p in ORDER:
        v = totals.get(p, 0) / requests
        print(f"  {p:<16} {v:>13,.0f}  {100 * totals.get(p, 0) / whole:>4.1f}%" + miss_col(p),
              file=out)
    print(f"  (inside those: allocator {allocator / requests:,.0f}, memcpy "
          f"{memcpy / requests:,.0f} instructions/request)", file=out, flush=True)
    for p in detail_of:
        print(f"  {p}: where (innermost function, instructions/request)", file=out)
        for label, v in detail[p].most_common(25):
            print(f"    {v / requests:>8,.0f}  {label}", file=out)




if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    report(sys.argv[1], sys.argv[2], int(sys.argv[3]), detail_of=sys.argv[4:])
