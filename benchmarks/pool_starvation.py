"""More tasks than pooled connections: errors and cycles/s (issue 22, item 5).

    python benchmarks/pool_starvation.py [URL] [--tasks 10,20,40,500] [--seconds 10]
        [--pool-max-size 10] [--sweep-every 100] [--json]

T asyncio tasks share one provider (one connection pool, ``pool_max_size``
connections); each cycles ``acquire_lease``, ``renew_lease`` and ``release_lease`` on
a key of its own for ``--seconds``. Reported per T: cycles/s (completed cycles over
the window), errors (calls that raised, by exception class) and the slowest call.
A call that raised ends its cycle; the task starts the next one.

Without a URL it starts a private MariaDB with the test harness (``tests/servers.py``:
a fresh data directory, a free loopback port, stopped afterwards). With one, it works
in a database of its own (``leasekit_pool_<id>``), dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import leasekit
from leasekit.backend import Endpoint, parse_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the harness that starts private servers

TTL_MS = 30_000


@dataclass
class Row:
    tasks: int
    seconds: float
    cycles: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    slowest_s: float = 0.0

    @property
    def cycles_per_s(self) -> float:
        return self.cycles / self.seconds

    def line(self) -> str:
        errors = sum(self.errors.values())
        kinds = ", ".join(f"{name} {count}" for name, count in sorted(self.errors.items()))
        return (
            f"{self.tasks:>6} {self.cycles_per_s:>10.0f} {errors:>7} "
            f"{self.slowest_s:>9.3f}  {kinds}"
        )


async def run_one(url: str, tasks: int, seconds: float, options: dict[str, Any]) -> Row:
    row = Row(tasks, seconds)
    errors: Counter[str] = Counter()
    table = f"pool_{uuid.uuid4().hex[:12]}"
    async with leasekit.connect(url, table=table, **options) as provider:
        stop_at = 0.0

        async def timed(call: Any) -> Any:
            started = time.monotonic()
            try:
                return await call
            finally:
                row.slowest_s = max(row.slowest_s, time.monotonic() - started)

        async def worker(n: int) -> None:
            key, owner = f"key-{n}", f"owner-{n}"
            while time.monotonic() < stop_at:
                try:
                    await timed(provider.acquire_lease(key, owner, TTL_MS))
                    await timed(provider.renew_lease(key, owner, TTL_MS))
                    await timed(provider.release_lease(key, owner))
                except leasekit.LeaseError as exc:  # noqa: PERF203 (counting them)
                    errors[type(exc).__name__] += 1
                else:
                    row.cycles += 1

        await provider.get_lease_owner("warm-up")  # the schema, before the clock starts
        stop_at = time.monotonic() + seconds
        await asyncio.gather(*(worker(n) for n in range(tasks)))
    row.errors = dict(errors)
    return row


@contextlib.contextmanager
def server_url(url: str | None) -> Iterator[str]:
    """``url`` with a database of this run's own, or a private MariaDB's."""
    if url is None:
        from servers import MariaDBServer  # noqa: PLC0415

        binary = MariaDBServer.find()
        if binary is None:
            raise SystemExit("no mariadbd found: pass a mysql:// URL")
        with (
            tempfile.TemporaryDirectory() as workdir,
            MariaDBServer(binary, Path(workdir)) as server,
        ):
            yield server.url
        return
    base, _, query = url.partition("?")
    scheme, _, rest = base.partition("://")
    authority = rest.split("/", 1)[0]
    database = f"leasekit_pool_{uuid.uuid4().hex[:8]}"
    asyncio.run(admin(url, f"CREATE DATABASE `{database}`"))
    try:
        yield f"{scheme}://{authority}/{database}" + (f"?{query}" if query else "")
    finally:
        asyncio.run(admin(url, f"DROP DATABASE IF EXISTS `{database}`"))


async def admin(url: str, statement: str) -> None:
    """Run ``statement`` on a connection of the script's own."""
    import asyncmy  # noqa: PLC0415 (the mysql extra)

    parsed = parse_url(url, schemes=("mysql", "mariadb"), default_port=3306)
    endpoint = parsed.endpoints[0] if parsed.endpoints else Endpoint("127.0.0.1", 3306)
    conn = await asyncmy.connect(
        host=endpoint.host,
        port=endpoint.port or 3306,
        user=parsed.username or "root",
        password=parsed.password or "",
        autocommit=True,
    )
    try:
        async with conn.cursor() as cursor:
            await cursor.execute(statement)
    finally:
        await conn.ensure_closed()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?")
    parser.add_argument("--tasks", default="10,20,40,500")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--pool-max-size", type=int, default=10)
    parser.add_argument("--sweep-every", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    options = {"pool_max_size": args.pool_max_size, "sweep_every": args.sweep_every}
    counts = [int(part) for part in args.tasks.split(",")]
    with server_url(args.url) as url:
        if not args.json:
            print(f"pool_max_size={args.pool_max_size} sweep_every={args.sweep_every}")
            print(f"{'tasks':>6} {'cycles/s':>10} {'errors':>7} {'slowest s':>9}  by class")
        for tasks in counts:
            row = asyncio.run(run_one(url, tasks, args.seconds, options))
            if args.json:
                print(json.dumps({**asdict(row), "cycles_per_s": row.cycles_per_s}))
            else:
                print(row.line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
