"""Benchmark leasekit on PostgreSQL against raw psycopg and tooz's PostgreSQL driver.

    python benchmarks/postgres_bench.py [URL] [leasekit bench options...]

With a URL this is ``leasekit bench URL ...``. Without one it starts its own
PostgreSQL (a fresh ``initdb`` cluster on a free loopback port, in a temporary
directory, fsync off) with the test harness in ``tests/servers.py``, benchmarks it,
and stops it: the machine's own server is never touched. Options (``--seconds``,
``--rounds``, ``--scenarios``, ``--json``) are those of ``leasekit bench``. See
``benchmarks/README.md``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from leasekit._cli import main as leasekit_main

ROOT = Path(__file__).resolve().parent.parent
# tests/servers.py is the harness the test suite starts its servers with (it imports
# pytest, installed with the test extra).
sys.path.insert(0, str(ROOT / "tests"))


def main(argv: list[str]) -> int:
    if argv and "://" in argv[0]:
        return leasekit_main(["bench", *argv])
    from servers import PostgresServer  # noqa: PLC0415 (after the sys.path entry above)

    binary = PostgresServer.find()
    if binary is None:
        print(f"postgres not found; install it ({PostgresServer.install_hint}) or pass a URL")
        return 2
    with (
        tempfile.TemporaryDirectory(prefix="leasekit-bench-") as workdir,
        PostgresServer(binary, Path(workdir)) as server,
    ):
        print(f"started postgres on {server.url}", file=sys.stderr, flush=True)
        return leasekit_main(["bench", server.url, *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
