"""Fail a PostgreSQL primary over to its standby, again and again; count grants lost and
fencing tokens that went back, per replication mode.

    python benchmarks/failover_postgres.py [--failovers 10] [--keys 50] [--modes ...]
    python benchmarks/failover_postgres.py --latency 1000

Starts a primary and a streaming standby with the test harness (``tests/servers.py``,
:class:`PostgresReplicatedPair`) for each mode:

- ``async``: asynchronous replication, the standby in step (it streams as usual);
- ``async-behind``: asynchronous, the standby receiving no WAL during the burst of
  grants (``primary_conninfo`` emptied), so it misses all of them, as a standby
  seconds behind would;
- ``sync``: ``synchronous_standby_names`` names the standby and the provider runs with
  ``synchronous_commit=on``: a grant returns once the standby has flushed it.

One provider per mode runs on the pair's multi-host URL
(``target_session_attrs=read-write``) for the whole run. Each failover: a burst of
grants (every key released by its holder and acquired by a new owner, ttl 60 s), then
``kill -9`` of the primary, ``pg_ctl promote`` of the standby, and for every key: is it
still held by the owner that believes it holds it (if not, the grant was **lost**);
then one more grant of the key to a new owner, whose token must exceed every token
issued for that key before (if not, a **token regression**). A new standby is then
built from the new primary (``pg_basebackup``) on the old primary's port. Before the
failovers, the median latency of an acquire (and of a release) is measured, 200 of
each. ``--latency N`` measures only what a synchronous standby adds: an asynchronous
and a synchronous pair at once, N acquires on each in turn. Exit status 1 on any token
regression, or on a lost grant in ``sync`` mode.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# tests/servers.py is the harness the test suite starts its servers with.
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402 (after the harness's path)
from leasekit_postgres import PostgresLeaseProvider  # noqa: E402
from servers import PostgresReplicatedPair, PostgresServer  # noqa: E402

MODES = ("async", "async-behind", "sync")
HOLD_MS = 60_000
LATENCY_SAMPLES = 200


@dataclass
class Tally:
    """What one mode's failovers came to."""

    mode: str
    failovers: int = 0
    grants: int = 0
    lost: int = 0
    regressions: int = 0
    lost_per_failover: list[int] = field(default_factory=list)
    reconnect_s: list[float] = field(default_factory=list)
    acquire_ms: float = 0.0
    release_ms: float = 0.0


def wait_caught_up(pair: PostgresReplicatedPair, limit_s: float = 20.0) -> None:
    """Wait until the standby has replayed everything the primary has written."""
    with psycopg.connect(primary_url(pair), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    target = row[0]
    deadline = time.monotonic() + limit_s
    with psycopg.connect(pair.standby.url, autocommit=True) as conn:
        while True:
            done = conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
            ).fetchone()
            if done is not None and done[0]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not catch up")
            time.sleep(0.01)


def stop_streaming(pair: PostgresReplicatedPair, limit_s: float = 20.0) -> None:
    """Cut the standby off the primary's WAL; return once its WAL receiver is gone."""
    pair.standby.stop_streaming()  # a reload: the receiver stops a moment later
    deadline = time.monotonic() + limit_s
    with psycopg.connect(pair.standby.url, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone()
            if row is not None and row[0] == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the standby's WAL receiver did not stop")
            time.sleep(0.01)


def primary_url(pair: PostgresReplicatedPair) -> str:
    return pair.primary.url


async def measure_latency(provider: PostgresLeaseProvider, tally: Tally) -> None:
    acquires, releases = [], []
    for i in range(LATENCY_SAMPLES):
        started = time.perf_counter()
        await provider.acquire_lease("latency", f"o{i}", HOLD_MS)
        acquired = time.perf_counter()
        await provider.release_lease("latency", f"o{i}")
        releases.append(time.perf_counter() - acquired)
        acquires.append(acquired - started)
    tally.acquire_ms = statistics.median(acquires) * 1000
    tally.release_ms = statistics.median(releases) * 1000


async def one_failover(
    pair: PostgresReplicatedPair,
    provider: PostgresLeaseProvider,
    keys: list[str],
    tally: Tally,
    *,
    holders: dict[str, str],
    highest: dict[str, int],
    behind: bool,
) -> None:
    """A burst of grants, the primary killed, the standby promoted, every key checked."""
    number = tally.failovers
    if behind:
        wait_caught_up(pair)
        stop_streaming(pair)

    async def regrant(key: str, new_owner: str) -> int:
        if key in holders:
            await provider.release_lease(key, holders[key])
        result = await provider.acquire_lease(key, new_owner, HOLD_MS)
        if not result.acquired or result.token is None:
            raise RuntimeError(f"{key}: {new_owner} was refused ({result})")
        if result.token <= highest.get(key, 0):
            tally.regressions += 1
        highest[key] = max(highest.get(key, 0), result.token)
        holders[key] = new_owner
        return result.token

    await asyncio.gather(*(regrant(key, f"f{number}-{key}") for key in keys))
    tally.grants += len(keys)
    pair.fail_over()
    promoted = time.monotonic()
    # Reads only: a synchronous primary has no standby to wait for yet.
    owners = [await provider.get_lease_owner(keys[0])]
    tally.reconnect_s.append(time.monotonic() - promoted)
    owners += [await provider.get_lease_owner(key) for key in keys[1:]]
    lost = 0
    for key, holder in zip(keys, owners, strict=True):
        if holder != holders[key]:
            lost += 1
            if holder is None:
                del holders[key]
            else:
                holders[key] = holder
    tally.lost += lost
    tally.lost_per_failover.append(lost)
    tally.failovers += 1
    pair.rebuild()
    # One more grant of every key, on the new primary: its token must be the highest yet.
    await asyncio.gather(*(regrant(key, f"after{number}-{key}") for key in keys))


async def run_mode(mode: str, binary: str, workdir: Path, failovers: int, keys: int) -> Tally:
    tally = Tally(mode)
    synchronous = mode == "sync"
    with PostgresReplicatedPair(binary, workdir / mode, synchronous=synchronous) as pair:
        options: dict[str, object] = {"timeout_s": 5.0, "table": "failover_leases"}
        if synchronous:
            options["synchronous_commit"] = "on"
        provider = PostgresLeaseProvider.from_url(pair.url, **options)
        async with provider:
            await measure_latency(provider, tally)
            names = [f"k{i}" for i in range(keys)]
            holders: dict[str, str] = {}
            highest: dict[str, int] = {}
            for _ in range(failovers):
                await one_failover(
                    pair,
                    provider,
                    names,
                    tally,
                    holders=holders,
                    highest=highest,
                    behind=mode == "async-behind",
                )
    return tally


async def interleaved_latency(binary: str, workdir: Path, samples: int) -> str:
    """What a synchronous standby adds, measured fairly on a busy machine.

    An asynchronous and a synchronous pair at once, one acquire (then one release) on
    each in turn, so both see the same load; medians and 90th percentiles.
    """
    with (
        PostgresReplicatedPair(binary, workdir / "lat-async") as plain,
        PostgresReplicatedPair(binary, workdir / "lat-sync", synchronous=True) as synced,
    ):
        providers = {
            "async": PostgresLeaseProvider.from_url(plain.url),
            "sync (synchronous_commit=on)": PostgresLeaseProvider.from_url(
                synced.url, synchronous_commit="on"
            ),
            "sync (synchronous_commit=remote_apply)": PostgresLeaseProvider.from_url(
                synced.url, synchronous_commit="remote_apply", table="leases_apply"
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in providers}
        for provider in providers.values():
            await provider.acquire_lease("warm", "o", HOLD_MS)
        for i in range(samples):
            for name, provider in providers.items():
                started = time.perf_counter()
                await provider.acquire_lease("latency", f"o{i}", HOLD_MS)
                times[name].append(time.perf_counter() - started)
                await provider.release_lease("latency", f"o{i}")
        for provider in providers.values():
            await provider.aclose()
    lines = ["| replication | acquire p50 | acquire p90 |", "|---|---:|---:|"]
    for name, values in times.items():
        cuts = statistics.quantiles(values, n=10)
        lines.append(f"| {name} | {cuts[4] * 1000:.2f} ms | {cuts[8] * 1000:.2f} ms |")
    return "\n".join(lines)


def table(tallies: list[Tally]) -> str:
    lines = [
        "| replication | failovers | grants lost | token regressions | acquire p50 | release p50 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {t.mode} | {t.failovers} | {t.lost} of {t.grants} | {t.regressions} | "
        f"{t.acquire_ms:.2f} ms | {t.release_ms:.2f} ms |"
        for t in tallies
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failovers", type=int, default=10)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--latency",
        type=int,
        metavar="N",
        default=0,
        help="only measure acquire latency, N samples per mode, interleaved",
    )
    args = parser.parse_args()
    binary = PostgresServer.find()
    if binary is None:
        print("PostgreSQL is not installed (apt-get install postgresql)", file=sys.stderr)
        return 2
    if args.latency:
        with tempfile.TemporaryDirectory(prefix="leasekit-failover-") as workdir:
            print(asyncio.run(interleaved_latency(binary, Path(workdir), args.latency)))
        return 0
    tallies = []
    with tempfile.TemporaryDirectory(prefix="leasekit-failover-") as workdir:
        for mode in args.modes:
            started = time.monotonic()
            tally = asyncio.run(run_mode(mode, binary, Path(workdir), args.failovers, args.keys))
            tallies.append(tally)
            print(
                f"{mode}: lost per failover {tally.lost_per_failover}, "
                f"{tally.regressions} token regressions, first call after "
                f"promotion answered in {max(tally.reconnect_s, default=0):.2f} s at most "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    print(table(tallies))
    bad = any(t.regressions for t in tallies) or any(t.lost for t in tallies if t.mode == "sync")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
