"""Redis failovers through Sentinel: grants lost and token regressions, with and without acks.

    python benchmarks/failover_redis.py [--failovers 20] [--lag-ms 0,300] [--cycles 2000]

Starts its own Redis primary, replica and three ``redis-sentinel`` processes on free
loopback ports (tests/servers.py's RedisSentinelGroup) and stops them at the end. For
each mode (replica in step; replica 0-300 ms behind; behind with ``min_replicas=1``) it
runs ``--failovers`` rounds of tests/redis_failover.py: eight workers churn leases
through one ``redis+sentinel://`` provider, the replica falls behind, the primary is
killed (SIGKILL), Sentinel promotes the replica, the workers go on, and every key a
live worker believed it held is acquired by a checker. Then the latency that
acknowledgement adds: ``--cycles`` acquire+release, one at a time, through the same
URL with ``min_replicas=0`` and ``1`` (replica in step).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# tests/servers.py starts the servers; tests/redis_failover.py is the workload.
sys.path.insert(0, str(ROOT / "tests"))


async def _measure(args: argparse.Namespace, group: object) -> dict[str, object]:
    from redis_failover import acquire_latency_ms, run_failovers  # noqa: PLC0415

    low, high = (float(x) / 1000 for x in args.lag_ms.split(","))
    modes = [
        ("replica in step", 0, (0.0, 0.0)),
        (f"replica {low * 1000:g}-{high * 1000:g} ms behind", 0, (low, high)),
        ("behind, min_replicas=1", 1, (low, high)),
    ]
    rows = []
    for index, (name, min_replicas, lag) in enumerate(modes):
        if args.modes and str(index + 1) not in args.modes.split(","):
            continue
        started = time.monotonic()
        totals = await run_failovers(
            group,  # type: ignore[arg-type]
            failovers=args.failovers,
            min_replicas=min_replicas,
            lag_range_s=lag,
            replica_timeout_ms=args.replica_timeout_ms,
            seed=100 + index,
            mode=name,
        )
        row = {
            "mode": name,
            "failovers": len(totals.rounds),
            "believed": totals.believed,
            "lost": totals.lost,
            "failovers_losing": totals.failovers_losing,
            "regressions": totals.regressions,
            "resurrected": totals.resurrected,
            "unknown_outcomes": totals.unknown_in_lag,
            "median_failover_s": sorted(r.failover_s for r in totals.rounds)[
                len(totals.rounds) // 2
            ],
            "seconds": round(time.monotonic() - started, 1),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    base = group.url  # type: ignore[attr-defined]
    latency = {}
    for min_replicas in (0, 1):
        url = f"{base}?min_replicas={min_replicas}&prefix=latency-{min_replicas}:"
        latency[min_replicas] = await acquire_latency_ms(url, cycles=args.cycles)
        print(json.dumps({"min_replicas": min_replicas, **latency[min_replicas]}), flush=True)
    return {"rows": rows, "latency": latency}


def _table(report: dict[str, object]) -> str:
    lines = [
        "| replication | failovers | grants lost | token regressions | resurrected leases "
        "| unknown outcomes |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:  # type: ignore[attr-defined]
        lost = f"{row['lost']} of {row['believed']} ({row['failovers_losing']} failovers)"
        lines.append(
            f"| {row['mode']} | {row['failovers']} | {lost} | {row['regressions']} "
            f"| {row['resurrected']} | {row['unknown_outcomes']} |"
        )
    latency = report["latency"]
    lines += [
        "",
        "| acquire, one at a time | p50 ms | p99 ms | mean ms |",
        "|---|---:|---:|---:|",
    ]
    for min_replicas, numbers in latency.items():  # type: ignore[attr-defined]
        lines.append(
            f"| min_replicas={min_replicas} | {numbers['p50']:.3f} | {numbers['p99']:.3f} "
            f"| {numbers['mean']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failovers", type=int, default=20)
    parser.add_argument("--lag-ms", default="0,300", help="the replica's lag, drawn from LOW,HIGH")
    parser.add_argument("--replica-timeout-ms", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--modes", default="", help="only these modes, as 1,2,3 (default all)")
    args = parser.parse_args(argv)
    from servers import RedisSentinelGroup, RedisSentinelServer, RedisServer  # noqa: PLC0415

    server, sentinel = RedisServer.find(), RedisSentinelServer.find()
    if server is None or sentinel is None:
        print("needs redis-server and redis-sentinel (apt-get install redis-server redis-sentinel)")
        return 2
    with (
        tempfile.TemporaryDirectory() as workdir,
        RedisSentinelGroup(server, sentinel, Path(workdir)) as group,
    ):
        report = asyncio.run(_measure(args, group))
    print()
    print(_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
