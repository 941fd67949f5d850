"""Benchmark leasekit on etcd against raw aetcd and python-etcd3's ``Lock``, and count RPCs.

    python benchmarks/etcd_bench.py [URL] [leasekit bench options...]

First ``leasekit bench URL ...`` (options ``--seconds``, ``--rounds``, ``--scenarios``,
``--json`` are its own): leasekit, the raw aetcd floor and python-etcd3's ``Lock`` in
a child process (``backends/leasekit_etcd/_bench.py`` says how each cycle works). Then, unless
``--json``, the RPCs per cycle that the server counted (its ``/metrics``) while each
contender did 200 acquire+release cycles, one at a time: what a cycle costs on the
wire, measured, not assumed. That needs the URL's first endpoint to serve
``/metrics`` over plain HTTP (etcd's default).

Without a URL it starts its own single-member etcd (free loopback ports, a temporary
data dir) with the test harness in ``tests/servers.py``, and stops it at the end: the
machine's own etcd is never touched. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path

from leasekit._cli import main as leasekit_main
from leasekit.bench import LEASEKIT, BenchTarget, Contender, scheme_bench

ROOT = Path(__file__).resolve().parent.parent
# tests/servers.py is the harness the test suite starts its servers with.
sys.path.insert(0, str(ROOT / "tests"))

COUNTED_CYCLES = 200
TTL_MS = 30_000


def rpc_counts(url: str) -> dict[str, int] | None:
    """RPCs started on the first endpoint so far, by method; None without /metrics."""
    host_port = url.split("://", 1)[1].split(",", 1)[0].split("?", 1)[0].rpartition("@")[2]
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


def count_cycles(url: str, contender: Contender) -> str:
    """``COUNTED_CYCLES`` cycles of ``contender`` on fresh keys; the RPCs per cycle.

    Counted from after the contender connected (its connection check is not a cycle's)
    to after it closed (leasekit's background revocations are a cycle's).
    """
    target = BenchTarget(url, TTL_MS, f"leasekit-bench-{uuid.uuid4().hex[:10]}")
    keys = [f"{target.namespace}:rpc:{i}" for i in range(COUNTED_CYCLES)]
    owner = f"{target.namespace}:owner"
    counts: list[dict[str, int] | None] = []
    if contender.open_async is not None:
        open_async = contender.open_async

        async def run() -> None:
            cycler = await open_async(target)
            try:
                counts.append(rpc_counts(url))
                for key in keys:
                    assert await cycler.cycle(key, owner)
            finally:
                await cycler.aclose()
            counts.append(rpc_counts(url))

        asyncio.run(run())
    else:
        assert contender.open_sync is not None
        cycler = contender.open_sync(target)
        try:
            counts.append(rpc_counts(url))
            for key in keys:
                assert cycler.cycle(key, owner)
        finally:
            cycler.close()
        counts.append(rpc_counts(url))
    bench = scheme_bench("etcd")
    if bench.cleanup is not None:
        asyncio.run(bench.cleanup(target))
    before, after = counts
    if before is None or after is None:
        return "- (no /metrics)"
    spent = {m: n - before.get(m, 0) for m, n in after.items() if n > before.get(m, 0)}
    parts = [f"{m} {n / COUNTED_CYCLES:.2g}" for m, n in sorted(spent.items())]
    return f"{sum(spent.values()) / COUNTED_CYCLES:.2f} ({', '.join(parts)})"


def print_rpcs(url: str) -> None:
    print(f"\nRPCs per acquire+release cycle, as etcd counted them ({COUNTED_CYCLES} cycles):")
    for contender in (LEASEKIT, *scheme_bench("etcd").contenders):
        missing = contender.missing()
        if missing:
            counted = f"skipped: {', '.join(missing)} not installed"
        else:
            try:
                counted = count_cycles(url, contender)
            except Exception as exc:  # noqa: BLE001 (a contender that cannot run is reported)
                counted = f"failed: {type(exc).__name__}: {exc}"
        print(f"  {contender.label:<42} {counted}")


def bench(url: str, options: list[str]) -> int:
    status = leasekit_main(["bench", url, *options])
    if status == 0 and "--json" not in options:
        print_rpcs(url)
    return status


def main(argv: list[str]) -> int:
    if argv and "://" in argv[0]:
        return bench(argv[0], argv[1:])
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
        return bench(server.url, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
