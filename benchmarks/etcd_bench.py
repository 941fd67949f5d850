"""Benchmark leasekit on etcd against the raw aetcd floor and python-etcd3's ``Lock``.

    python benchmarks/etcd_bench.py [URL] [--seconds S] [--tasks N] [--json]

Without a URL it starts its own single-member etcd (free loopback ports, a temporary
data dir) with the test harness in ``tests/servers.py``, and stops it at the end: the
machine's own etcd is never touched. Each contender does acquire+release cycles on
keys of its own, first one at a time (latency-bound), then ``--tasks`` at once (64 by
default: asyncio tasks for the async contenders, threads for python-etcd3).

- **leasekit**: ``EtcdLeaseProvider``: ``acquire_lease`` + ``release_lease``.
- **aetcd floor**: the fewest round trips that give the same guarantees with raw
  aetcd: grant an etcd lease, one transaction (create if absent), one transaction
  (delete if still ours), revoke the etcd lease. No read first, no fencing token.
- **python-etcd3 Lock**: ``etcd3.Lock(key, ttl)``: ``acquire(timeout=0)``, ``release``.
  python-etcd3 0.12's generated protobuf code cannot load under protobuf 4 and newer
  (it builds descriptors directly, which the C implementation refuses), so it runs in
  a child process with ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``, the
  pure-Python protobuf. Its ``release`` does not revoke its etcd lease: every cycle
  leaves one behind until its TTL runs out.

The round trips per cycle are measured, not assumed: the RPCs the server counted
(its ``/metrics``) during each run, divided by the cycles. That needs the URL's first
endpoint to serve ``/metrics`` over plain HTTP (etcd's default); otherwise "-".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the harness that starts servers for the tests

TTL_S = 30  # long enough that no lease expires mid-cycle: every cycle releases its own

# -- measuring --------------------------------------------------------------------------------


def rpc_counts(url: str) -> dict[str, int] | None:
    """RPCs started on the first endpoint so far, by method; None without /metrics."""
    host_port = (
        url.split("://", 1)[1].split(",", maxsplit=1)[0].split("?", maxsplit=1)[0].rstrip("/")
    )
    try:
        with urllib.request.urlopen(f"http://{host_port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    counts: dict[str, int] = {}
    for match in re.finditer(
        r'^grpc_server_started_total\{grpc_method="(\w+)".*\} (\d+)', text, re.MULTILINE
    ):
        counts[match.group(1)] = counts.get(match.group(1), 0) + int(match.group(2))
    return counts


def per_cycle(before: dict[str, int] | None, after: dict[str, int] | None, cycles: int) -> str:
    if before is None or after is None or cycles == 0:
        return "-"
    spent = {m: n - before.get(m, 0) for m, n in after.items() if n - before.get(m, 0) > 0}
    parts = [f"{m} {n / cycles:.2g}" for m, n in sorted(spent.items())]
    total = sum(spent.values()) / cycles
    return f"{total:.2f} ({', '.join(parts)})"


async def run_async(
    cycle: Callable[[str], Awaitable[None]], tasks: int, seconds: float, namespace: str
) -> tuple[int, float]:
    """Cycles done by ``tasks`` concurrent tasks in ``seconds``, and the time taken."""
    stop_at = time.perf_counter() + seconds
    done = 0

    async def worker(index: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < stop_at:
            await cycle(f"{namespace}/t{index}/k{i % 16}")
            i += 1
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(t) for t in range(tasks)))
    return done, time.perf_counter() - started


# -- the async contenders ---------------------------------------------------------------------


async def bench_leasekit(url: str, tasks: int, seconds: float) -> tuple[int, float]:
    from leasekit_etcd import EtcdLeaseProvider  # noqa: PLC0415

    namespace = f"leasekit-bench-{uuid.uuid4().hex[:8]}"
    async with EtcdLeaseProvider.from_url(url, prefix=f"{namespace}/") as provider:
        owner = f"owner-{uuid.uuid4().hex[:8]}"

        async def cycle(key: str) -> None:
            if (await provider.acquire_lease(key, owner, TTL_S * 1000)).acquired:
                await provider.release_lease(key, owner)

        return await run_async(cycle, tasks, seconds, namespace)


async def bench_aetcd_floor(url: str, tasks: int, seconds: float) -> tuple[int, float]:
    import aetcd  # noqa: PLC0415

    host, _, port = (
        url.split("://", 1)[1].split(",", maxsplit=1)[0].split("?", maxsplit=1)[0].rpartition(":")
    )
    namespace = f"leasekit-bench-{uuid.uuid4().hex[:8]}"
    owner = f"owner-{uuid.uuid4().hex[:8]}".encode()
    async with aetcd.Client(host=host, port=int(port)) as client:
        txn = client.transactions

        async def cycle(key: str) -> None:
            name = key.encode()
            lease = await client.lease(TTL_S)
            won, _ = await client.transaction(
                compare=[txn.create(name) == 0],
                success=[txn.put(name, owner, lease=lease.id)],
                failure=[txn.get(name)],
            )
            if won:
                await client.transaction(
                    compare=[txn.value(name) == owner], success=[txn.delete(name)], failure=[]
                )
            await client.revoke_lease(lease.id)

        return await run_async(cycle, tasks, seconds, namespace)


# -- python-etcd3, in a child process -----------------------------------------------------------

_ETCD3_CHILD = r"""
import json, sys, threading, time, uuid
import etcd3

host, port, tasks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seconds, ttl = float(sys.argv[4]), int(sys.argv[5])
client = etcd3.client(host=host, port=port)
namespace = f"leasekit-bench-{uuid.uuid4().hex[:8]}"
counts = [0] * tasks

def worker(index):
    stop_at = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < stop_at:
        lock = client.lock(f"{namespace}/t{index}/k{i % 16}", ttl=ttl)
        if lock.acquire(timeout=0):
            lock.release()
        i += 1
        counts[index] += 1

threads = [threading.Thread(target=worker, args=(t,)) for t in range(tasks)]
started = time.perf_counter()
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"cycles": sum(counts), "seconds": time.perf_counter() - started}))
"""


def bench_etcd3_lock(url: str, tasks: int, seconds: float) -> tuple[int, float]:
    host, _, port = (
        url.split("://", 1)[1].split(",", maxsplit=1)[0].split("?", maxsplit=1)[0].rpartition(":")
    )
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    done = subprocess.run(  # noqa: S603 (our own interpreter and script)
        [sys.executable, "-W", "ignore", "-c", _ETCD3_CHILD, host, port, str(tasks),
         str(seconds), str(TTL_S)],
        env=env, capture_output=True, text=True, timeout=seconds + 120, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr else "failed")
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    return int(reply["cycles"]), float(reply["seconds"])


# -- the report -------------------------------------------------------------------------------


def measure(url: str, name: str, run: Callable[[], tuple[int, float]]) -> dict[str, Any]:
    before = rpc_counts(url)
    try:
        cycles, elapsed = run()
    except Exception as exc:  # noqa: BLE001 (a contender that cannot run is reported)
        return {"contender": name, "error": f"{type(exc).__name__}: {exc}"}
    after = rpc_counts(url)
    return {
        "contender": name,
        "cycles": cycles,
        "seconds": round(elapsed, 3),
        "cycles_per_s": round(cycles / elapsed, 1) if elapsed else 0.0,
        "rpcs_per_cycle": per_cycle(before, after, cycles),
    }


def run_all(url: str, seconds: float, tasks: int) -> list[dict[str, Any]]:
    results = []
    for label, n in (("1 task", 1), (f"{tasks} tasks", tasks)):
        for name, run in (
            ("leasekit", lambda n=n: asyncio.run(bench_leasekit(url, n, seconds))),
            ("aetcd floor", lambda n=n: asyncio.run(bench_aetcd_floor(url, n, seconds))),
            ("python-etcd3 Lock", lambda n=n: bench_etcd3_lock(url, n, seconds)),
        ):
            print(f"etcd bench: {name}, {label} ...", file=sys.stderr, flush=True)
            results.append({"scenario": label, **measure(url, name, run)})
    return results


def render(results: list[dict[str, Any]]) -> str:
    lines = [f"{'scenario':<10} {'contender':<18} {'cycles/s':>9} {'vs etcd3':>8}  RPCs per cycle"]
    for row in results:
        if "error" in row:
            lines.append(f"{row['scenario']:<10} {row['contender']:<18} error: {row['error']}")
            continue
        peer = next(
            (
                r
                for r in results
                if r["scenario"] == row["scenario"]
                and r["contender"] == "python-etcd3 Lock"
                and "cycles_per_s" in r
            ),
            None,
        )
        ratio = f"{row['cycles_per_s'] / peer['cycles_per_s']:.2f}x" if peer else "-"
        lines.append(
            f"{row['scenario']:<10} {row['contender']:<18} {row['cycles_per_s']:>9.0f} "
            f"{ratio:>8}  {row['rpcs_per_cycle']}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", help="etcd://host:port (default: start our own)")
    parser.add_argument("--seconds", type=float, default=5.0, help="per run (default 5)")
    parser.add_argument("--tasks", type=int, default=64, help="concurrent tasks (default 64)")
    parser.add_argument("--json", action="store_true", help="JSON output")
    args = parser.parse_args(argv)

    def report(url: str) -> int:
        results = run_all(url, args.seconds, args.tasks)
        print(json.dumps(results, indent=2) if args.json else render(results))
        return 0

    if args.url:
        return report(args.url)
    from servers import EtcdServer  # noqa: PLC0415 (after the sys.path entry above)

    binary = EtcdServer.find()
    if binary is None:
        print(f"etcd not found; install it ({EtcdServer.install_hint}) or pass a URL")
        return 2
    with (
        tempfile.TemporaryDirectory(prefix="leasekit-bench-") as workdir,
        EtcdServer(binary, Path(workdir)) as server,
    ):
        print(f"started etcd on {server.url}", file=sys.stderr, flush=True)
        return report(server.url)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
