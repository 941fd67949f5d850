"""Route every message of a conversation to the worker that owns it, and hand keys on.

Run it from a checkout after ``pip install -e .``::

    python examples/routing.py                          # a SQLite file in a temp dir
    python examples/routing.py redis://127.0.0.1:6379/0 --workers 4 --messages 400

The parent starts ``--workers`` worker processes. Each serves a small HTTP endpoint
(standard library only) and takes messages for conversation keys. A worker that gets a
message for a key tries to hold the key's lease, storing its own address as the lease's
metadata. If it wins, it handles the message; if another worker holds the key, the
denied acquire already names that worker's address (``LeaseHeld.metadata``), and the
message is forwarded there. Every ``--handoff-every`` messages the owner hands the key
to another worker with ``transfer_to`` (the key is never free in between), with the
successor's address as the new metadata.

Owner ids stay unique per acquisition (``worker-2/…`` plus a fresh id): the routing
address lives in the metadata, never in the owner id, so a stale worker can never
release or renew a lease that has moved on (see docs/routing.md).

The parent sends each key's messages one after another (several keys at once) to
random workers, then checks that every message was handled exactly once, by the
key's owner at the time: per key, fencing tokens never go back along the messages, and
each token belongs to one owner. It prints a JSON summary and exits 1 if a check fails.
"""

# ruff: noqa: T201  (an example program reports what it does by printing)

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import leasekit
import leasekit.sync

TTL_MS = 30_000
MAX_HOPS = 8  # a message forwarded more often than this reports an error
HTTP_TIMEOUT_S = 30.0


def post(address: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` as JSON to ``http://address/path``; the JSON answer."""
    request = urllib.request.Request(
        f"http://{address}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:  # noqa: S310
        answer: dict[str, Any] = json.loads(response.read())
    return answer


# -- a worker ------------------------------------------------------------------------------


class Worker:
    """One worker process: the leases it holds, and what it does with a message."""

    def __init__(self, name: str, leases: leasekit.sync.SyncLeaseProvider, handoff_every: int):
        self.name = name
        self.leases = leases
        self.handoff_every = handoff_every
        self.address = ""  # host:port, once the HTTP server listens
        self.peers: dict[str, str] = {}  # other workers: name -> address
        self.holds: dict[str, leasekit.sync.SyncLeaseHold] = {}
        self.adopting: dict[str, str] = {}  # key -> the owner id a predecessor hands us
        self.handled: dict[str, int] = {}
        self.locks: dict[str, threading.Lock] = {}
        self.lock = threading.Lock()

    def key_lock(self, key: str) -> threading.Lock:
        with self.lock:
            return self.locks.setdefault(key, threading.Lock())

    def message(self, key: str, seq: int, hops: int) -> dict[str, Any]:
        """Handle the message if this worker owns ``key`` (taking it if free), else forward."""
        with self.key_lock(key):
            held = self.holds.get(key)
            if held is None or held.lost.is_set():
                self.holds.pop(key, None)
                try:
                    held = self.take(key)
                except leasekit.LeaseHeld as busy:
                    # Someone else owns it: the denied acquire told us where it listens.
                    where = busy.metadata
                else:
                    return self.handle(key, seq, held)
            elif held.remaining() > 0:
                return self.handle(key, seq, held)
            else:
                where = None
        if hops >= MAX_HOPS:
            return {"error": f"{key!r} forwarded {hops} times"}
        if where is None:
            return self.message(key, seq, hops + 1)  # nowhere to send it yet: look again
        body = {"key": key, "seq": seq, "hops": hops + 1}
        answer = post(where.decode(), "/message", body)
        answer["forwarded_by"] = [self.name, *answer.get("forwarded_by", [])]
        return answer

    def take(self, key: str) -> leasekit.sync.SyncLeaseHold:
        """Hold ``key`` with this worker's address as its metadata, or raise ``LeaseHeld``."""
        # A predecessor handing us the key told us the owner id it transfers to: acquiring
        # with it is the idempotent re-acquire once the transfer has landed.
        owner = self.adopting.get(key) or leasekit.new_owner_id(self.name)
        held = leasekit.sync.hold(self.leases, key, owner, TTL_MS, metadata=self.address)
        held.__enter__()
        self.adopting.pop(key, None)
        self.holds[key] = held
        return held

    def handle(self, key: str, seq: int, held: leasekit.sync.SyncLeaseHold) -> dict[str, Any]:
        done = {"key": key, "seq": seq, "worker": self.name, "owner": held.owner}
        done["token"] = held.token
        count = self.handled[key] = self.handled.get(key, 0) + 1
        if count % self.handoff_every == 0 and self.peers:
            self.hand_on(key, held)
            done["handed_to"] = held.transferred_to
        return done

    def hand_on(self, key: str, held: leasekit.sync.SyncLeaseHold) -> None:
        """Transfer ``key`` to a random peer, announced first so it adopts the owner id."""
        peer = random.choice(sorted(self.peers))
        successor = leasekit.new_owner_id(peer)  # unique for this grant, minted for the peer
        post(self.peers[peer], "/adopt", {"key": key, "owner": successor})
        held.transfer_to(successor, metadata=self.peers[peer])
        held.__exit__(None, None, None)  # transferred: leaving does not release
        self.holds.pop(key, None)

    def close(self) -> None:
        for held in list(self.holds.values()):
            held.__exit__(None, None, None)
        self.holds.clear()


def serve(url: str, name: str, handoff_every: int) -> None:
    """A worker's main: print its address, then serve until stdin closes."""
    with leasekit.sync.connect(url) as leases:
        worker = Worker(name, leases, handoff_every)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/message":
                    answer = worker.message(body["key"], body["seq"], body.get("hops", 0))
                elif self.path == "/adopt":
                    worker.adopting[body["key"]] = body["owner"]
                    answer = {}
                elif self.path == "/peers":
                    worker.peers = {k: v for k, v in body.items() if k != worker.name}
                    answer = {}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        host, port = server.server_address[:2]
        worker.address = f"{host}:{port}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        print(worker.address, flush=True)
        sys.stdin.read()  # the parent closes our stdin to stop us
        server.shutdown()
        worker.close()


# -- the parent ----------------------------------------------------------------------------


def check(handled: list[dict[str, Any]], sent: dict[str, int]) -> list[str]:
    """What is wrong with ``handled`` (empty when every check passes)."""
    problems = [f"error: {h['error']}" for h in handled if "error" in h]
    ok = [h for h in handled if "error" not in h]
    for key, count in sent.items():
        mine = sorted((h for h in ok if h["key"] == key), key=lambda h: h["seq"])
        seqs = [h["seq"] for h in mine]
        if seqs != list(range(count)):
            problems.append(f"{key}: handled {seqs}, expected each of 0..{count - 1} once")
        owner_of: dict[int, str] = {}
        last = -1
        for h in mine:
            token, owner = h["token"], h["owner"]
            if not owner.startswith(h["worker"] + ":"):
                problems.append(f"{key}#{h['seq']}: handled by {h['worker']}, owned by {owner}")
            if token is not None:
                if owner_of.setdefault(token, owner) != owner:
                    problems.append(f"{key}: token {token} held by two owners")
                if token < last:
                    problems.append(f"{key}#{h['seq']}: token {token} after {last}")
                last = token
    return problems


def run(url: str, workers: int, keys: int, messages: int, handoff_every: int) -> int:
    procs = [
        subprocess.Popen(  # noqa: S603
            [
                sys.executable,
                __file__,
                url,
                "--serve",
                f"worker-{i}",
                f"--handoff-every={handoff_every}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(workers)
    ]
    try:
        addresses = {f"worker-{i}": p.stdout.readline().strip() for i, p in enumerate(procs)}  # type: ignore[union-attr]
        if not all(addresses.values()):
            print("a worker did not start", file=sys.stderr)
            return 1
        for address in addresses.values():
            post(address, "/peers", addresses)
        names = [f"conversation-{k}" for k in range(keys)]
        sent = dict.fromkeys(names, 0)
        for index in range(messages):
            sent[names[index % keys]] += 1

        def conversation(key: str) -> list[dict[str, Any]]:
            # One key's messages in order, each to a random worker.
            return [
                post(random.choice(list(addresses.values())), "/message", {"key": key, "seq": seq})
                for seq in range(sent[key])
            ]

        with ThreadPoolExecutor(max_workers=keys) as pool:
            handled = [h for answers in pool.map(conversation, names) for h in answers]
    finally:
        for p in procs:
            p.stdin.close()  # type: ignore[union-attr]
        for p in procs:
            p.wait(timeout=60)
    problems = check(handled, sent)
    summary = {
        "messages": len(handled),
        "forwarded": sum(1 for h in handled if h.get("forwarded_by")),
        "handoffs": sum(1 for h in handled if h.get("handed_to")),
        "owners": len({h.get("owner") for h in handled}),
        "problems": problems[:20],
    }
    print(json.dumps(summary))
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", help="a leasekit URL (default: a SQLite temp file)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--keys", type=int, default=6)
    parser.add_argument("--messages", type=int, default=120)
    parser.add_argument("--handoff-every", type=int, default=5)
    parser.add_argument("--serve", metavar="NAME", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.url, args.serve, args.handoff_every)
        return 0
    if args.url:
        return run(args.url, args.workers, args.keys, args.messages, args.handoff_every)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'leases.db'}"
        return run(url, args.workers, args.keys, args.messages, args.handoff_every)


if __name__ == "__main__":
    sys.exit(main())
