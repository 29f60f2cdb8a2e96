#!/usr/bin/env python3
"""Opens N keep-alive HTTP connections to one address and holds them idle.

Owns: opening the connections from many 127.x.y.z source addresses (so no
single source runs out of ephemeral ports), one GET on each so the server has
a completed keep-alive request per connection, then holding them until stdin
closes. It runs as its own process because one process may hold at most
20,000 fds here, and the server under test needs its own.

Protocol on stdout: "ready OPEN FAILED" once every attempt finished. Each line
"count" on stdin is answered with the number of connections still open (the
server may close idle ones). EOF on stdin closes everything and exits.

Does not: measure anything; bench/proxy_bench.py reads the server's RSS.
"""
import asyncio
import resource
import sys


async def open_one(i, host, port, sem, state):
    src = f"127.1.{i // 250}.{i % 250 + 1}"
    async with sem:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, local_addr=(src, 0)), 10
            )
            writer.write(b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await asyncio.wait_for(reader.readexactly(length), 10)
        except Exception as e:  # counted, reported as FAILED
            state["failed"] += 1
            if state["failed"] <= 3:
                print(f"connection {i} from {src} failed: {e!r}", file=sys.stderr)
            return
    state["open"] += 1
    state["writers"].append(writer)
    # Holding: any read completing means the server closed (or sent junk).
    try:
        await reader.read(1)
    except Exception:
        pass
    state["open"] -= 1


async def main():
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    state = {"open": 0, "failed": 0, "writers": []}
    sem = asyncio.Semaphore(256)
    tasks = [asyncio.create_task(open_one(i, host, port, sem, state)) for i in range(n)]
    while state["open"] + state["failed"] < n and not all(t.done() for t in tasks):
        await asyncio.sleep(0.05)
    print(f"ready {state['open']} {state['failed']}", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        if line.strip() == "count":
            print(state["open"], flush=True)
    for w in state["writers"]:
        w.close()


if __name__ == "__main__":
    asyncio.run(main())
