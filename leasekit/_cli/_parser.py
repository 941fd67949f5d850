"""The ``leasekit`` command's arguments and exit statuses: what it accepts, nothing it does.

Exit status: 0 done (acquired, renewed, owned, verdict clean); 1 the answer is no (held
elsewhere, not renewed, free, exclusivity violated); 2 usage error (bad arguments or
URL); 3 backend error (unavailable, unreachable, timed out).
"""

from __future__ import annotations

import argparse

from .. import __version__

__all__ = ["EXIT_BACKEND", "EXIT_NO", "EXIT_OK", "EXIT_USAGE", "UsageError", "build_parser"]

EXIT_OK = 0
EXIT_NO = 1
EXIT_USAGE = 2
EXIT_BACKEND = 3


class UsageError(Exception):
    """A command line mistake found after parsing (exit status 2)."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leasekit",
        description="Distributed leases from the command line.",
        epilog="Exit status: 0 yes/done, 1 no (held elsewhere, not renewed, free, "
        "violation), 2 usage error, 3 backend error.",
    )
    parser.add_argument("--version", action="version", version=f"leasekit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="worker processes contend for thread keys, hand off and survive a kill",
        description="Worker processes contend for thread keys on one store: owners renew "
        "and hand keys to queued successors, one worker is killed mid-lease and its key "
        "is taken over after the TTL. The verdict replays every worker's log and checks "
        "that no two owners ever overlapped. Exit status 1 if they did.",
    )
    demo.add_argument("--url", help="backend URL (default: a fresh temporary SQLite file)")
    demo.add_argument("--workers", type=_positive_int, default=6, help="workers (default 6)")
    demo.add_argument("--keys", type=_positive_int, default=3, help="thread keys (default 3)")
    demo.add_argument(
        "--seconds", type=_positive_float, default=10.0, help="how long to run (default 10)"
    )
    demo.add_argument(
        "--ttl-ms", type=_positive_int, default=600, help="lease TTL in ms (default 600)"
    )
    demo.add_argument("--quiet", action="store_true", help="no live view, only the verdict")
    demo.add_argument(
        "--fencing",
        action="store_true",
        help="instead, Kleppmann's scenario: a holder paused (SIGSTOP) past its TTL writes "
        "after another took the key, and a fencing guard must reject that stale write "
        "(resource: SQLite, or Redis with --url redis://...); uses --url and --ttl-ms",
    )

    backends = commands.add_parser("backends", help="list URL schemes and whether they load")
    backends.add_argument("--json", action="store_true", help="JSON output")

    def lease_command(
        name: str, help_text: str, *owners: str, ttl: bool, metadata: bool = False
    ) -> None:
        command = commands.add_parser(name, help=help_text, description=help_text)
        command.add_argument("url", metavar="URL")
        command.add_argument("key", metavar="KEY")
        for owner in owners:
            command.add_argument(owner.lower(), metavar=owner)
        if ttl:
            command.add_argument("--ttl-ms", type=_positive_int, required=True)
        if metadata:
            command.add_argument(
                "--metadata",
                metavar="TEXT",
                help="store TEXT with the grant (where to route work for KEY)",
            )
        command.add_argument("--json", action="store_true", help="JSON output")

    lease_command(
        "acquire", "take KEY for OWNER (exit 1 if held elsewhere)", "OWNER", ttl=True, metadata=True
    )
    lease_command("owner", "print the live owner of KEY (exit 1 if free)", ttl=False)
    lease_command("renew", "extend OWNER's lease (exit 1 if not the holder)", "OWNER", ttl=True)
    lease_command("release", "free KEY if OWNER holds it", "OWNER", ttl=False)
    lease_command(
        "transfer",
        "hand KEY from FROM to TO (exit 1 if FROM is not the holder)",
        "FROM",
        "TO",
        ttl=True,
        metadata=True,
    )

    inspect = commands.add_parser("inspect", help="list live leases (backends that can list)")
    inspect.add_argument("url", metavar="URL")
    inspect.add_argument("--prefix", help="only keys starting with this")
    inspect.add_argument("--limit", type=_positive_int, default=1000)
    inspect.add_argument("--json", action="store_true", help="JSON output")

    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the backend's schema (backends that have one)",
        description="Create or upgrade the tables a backend needs at URL, up front, for "
        "deployments whose application role may not run DDL (PostgreSQL). Idempotent.",
    )
    migrate.add_argument("url", metavar="URL")

    check = commands.add_parser(
        "check",
        # argparse shows a REMAINDER as required; the pytest arguments are optional.
        usage="leasekit check [-h] [--timeout-s S] URL [PYTEST_ARGS ...]",
        help="run the conformance suite against a live store",
        description="Run the leasekit conformance suite against URL (needs "
        "pip install 'leasekit[test]'), once one call to the store has answered. "
        "Arguments after URL go to pytest.",
    )
    check.add_argument(
        "--timeout-s",
        type=_positive_float,
        default=5.0,
        metavar="S",
        help="how long the store may take to answer the first call (default 5)",
    )
    check.add_argument("url", metavar="URL")
    check.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="PYTEST_ARGS")

    bench = commands.add_parser(
        "bench",
        help="benchmark leasekit against the raw driver and peer libraries",
        description="Measure acquire+release cycles/s and p50/p99 latency on URL for "
        "leasekit, the backend's raw-driver floor and every installed peer library, with "
        "1 task, 64 concurrent tasks, and 16 tasks contending for 1 key. Use a server you "
        "can spare: the run writes keys named leasekit-bench-<id>... and deletes them.",
    )
    bench.add_argument("url", metavar="URL")
    bench.add_argument(
        "--seconds", type=_positive_float, default=2.0, help="measured per scenario (default 2)"
    )
    bench.add_argument(
        "--rounds",
        type=_positive_int,
        default=1,
        help="run everything N times, interleaved; report each fastest round (default 1)",
    )
    bench.add_argument(
        "--scenarios",
        nargs="+",
        choices=("single", "concurrent", "contended", "parallel", "handoff"),
        default=["single", "concurrent", "contended"],
        metavar="NAME",
        help="any of single, concurrent, contended (default: these three), parallel "
        "(16 tasks, or threads, on distinct keys), and handoff: "
        "how soon a waiting task holds a released key, with notifications and polling",
    )
    bench.add_argument(
        "--handoffs", type=_positive_int, default=200, help="handoffs measured (default 200)"
    )
    bench.add_argument("--json", action="store_true", help="JSON output")
    return parser
