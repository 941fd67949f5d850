"""The ``leasekit`` command line.

Exit status: 0 done (acquired, renewed, owned, verdict clean); 1 the answer is no (held
elsewhere, not renewed, free, exclusivity violated); 2 usage error (bad arguments or
URL); 3 backend error (unavailable, unreachable, timed out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

from . import __version__, available_backends, connect
from ._capabilities import capabilities_of
from ._demo import DemoConfig, DemoReport, Holding, Views, run_demo
from ._errors import InvalidLeaseArgument, LeaseBackendTimeout, LeaseError
from .backend._records import SupportsInspect, SupportsMigrate, supports

EXIT_OK = 0
EXIT_NO = 1
EXIT_USAGE = 2
EXIT_BACKEND = 3


class _UsageError(Exception):
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


def _parser() -> argparse.ArgumentParser:
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

    def lease_command(name: str, help_text: str, *owners: str, ttl: bool) -> None:
        command = commands.add_parser(name, help=help_text, description=help_text)
        command.add_argument("url", metavar="URL")
        command.add_argument("key", metavar="KEY")
        for owner in owners:
            command.add_argument(owner.lower(), metavar=owner)
        if ttl:
            command.add_argument("--ttl-ms", type=_positive_int, required=True)
        command.add_argument("--json", action="store_true", help="JSON output")

    lease_command("acquire", "take KEY for OWNER (exit 1 if held elsewhere)", "OWNER", ttl=True)
    lease_command("owner", "print the live owner of KEY (exit 1 if free)", ttl=False)
    lease_command("renew", "extend OWNER's lease (exit 1 if not the holder)", "OWNER", ttl=True)
    lease_command("release", "free KEY if OWNER holds it", "OWNER", ttl=False)
    lease_command(
        "transfer",
        "hand KEY from FROM to TO (exit 1 if FROM is not the holder)",
        "FROM",
        "TO",
        ttl=True,
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


# -- demo -----------------------------------------------------------------------------------


def _render(views: Views, elapsed_s: float, killed: str | None) -> Any:
    from rich.markup import escape  # noqa: PLC0415 (rich is loaded only when drawing)
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=f"leasekit demo  {elapsed_s:4.1f} s", title_justify="left", min_width=64)
    table.add_column("thread key")
    table.add_column("owner")
    # Keys and owners are user data: "[x]" in one must print as itself, not as markup.
    for key, owner in views.items():
        if owner is None:
            table.add_row(escape(key), "[dim]free[/dim]")
        elif owner == killed:
            table.add_row(escape(key), f"[red]{escape(owner)} (killed, expiring)[/red]")
        else:
            table.add_row(escape(key), f"[green]{escape(owner)}[/green]")
    if killed is not None:
        table.caption = escape(f"killed {killed} while it held a lease")
    return table


_SHOWN_VIOLATIONS = 10


def _print_report(report: DemoReport, ttl_ms: int) -> None:
    calls = report.calls
    print()
    # A killed worker never writes its totals: its calls are not in these counts.
    survivors = "the workers" if report.killed is None else "the workers that were not killed"
    print(f"operations   {report.operations}   calls to the store by {survivors}:")
    print(
        f"               {calls.get('acquire_lease', 0)} acquires ({report.denials} denied: "
        "the key, or the place next in line for it, was held by another worker)"
    )
    print(f"               {report.renewals} renewals while working on a key")
    print(
        f"               {report.lookups} lookups (get_lease_owner: who owns a key, "
        "who is next in line)"
    )
    print(
        f"               {calls.get('transfer_lease', 0)} transfers, "
        f"{calls.get('release_lease', 0)} releases (of keys and of places in line)"
    )
    print(f"acquired     {report.acquired}   (keys won by an acquire; the rest were handed over)")
    print(f"routed       {report.routed}   (work sent to the current owner)")
    print(f"handoffs     {report.handoffs}   (transfers to a queued successor, never free)")
    print(f"takeovers    {report.takeovers}   (a killed owner's key taken after its TTL)")
    print(f"releases     {report.releases}   (keys let go with nobody next in line)")
    print(f"killed       {_describe_kill(report, ttl_ms)}")
    print(f"holdings     {len(report.holdings)}   (ownership intervals checked)")
    if report.exclusive:
        print("verdict      OK: zero overlapping ownerships")
        return
    print(
        f"verdict      VIOLATED: {len(report.overlaps)} overlapping ownerships, "
        f"{len(report.token_disorder)} fencing-token inversions"
    )
    origin = min(h.start_s for h in report.holdings)
    violations = report.overlaps + report.token_disorder
    for first, second in violations[:_SHOWN_VIOLATIONS]:
        print("  " + "  overlaps  ".join(_describe(h, origin) for h in (first, second)))
    if len(violations) > _SHOWN_VIOLATIONS:
        print(f"  and {len(violations) - _SHOWN_VIOLATIONS} more")


def _describe_kill(report: DemoReport, ttl_ms: int) -> str:
    if report.killed is None:
        return "nobody (no holder found in time)"
    held = f"{report.killed} while it held {report.killed_key}"
    if report.takeover_s is None:
        return f"{held}; nobody took {report.killed_key} over before the run ended"
    return (
        f"{held}; {report.taken_over_by} took it over {report.takeover_s:.2f} s later "
        f"(its TTL of {ttl_ms} ms ran out, then the next acquire won)"
    )


def _describe(holding: Holding, origin_s: float) -> str:
    token = f" #{holding.token}" if holding.token is not None else ""
    return (
        f"{holding.key}: {holding.owner}{token} "
        f"[{holding.start_s - origin_s:.3f}s, {holding.end_s - origin_s:.3f}s]"
    )


async def _demo(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="leasekit-demo-") as tmp:
        url = args.url or f"sqlite:///{Path(tmp) / 'demo.db'}"
        config = DemoConfig(
            url=url,
            workers=args.workers,
            keys=args.keys,
            seconds=args.seconds,
            ttl_ms=args.ttl_ms,
        )
        async with connect(url) as provider:
            mode = (
                "processes"
                if capabilities_of(provider).shared_across_processes
                else "tasks in one process"
            )
            print(
                f"leasekit demo: {args.workers} workers ({mode}), {args.keys} keys, "
                f"{args.seconds:g} s, TTL {args.ttl_ms} ms on {url}",
                flush=True,
            )
            if args.quiet:
                report = await run_demo(provider, config)
            else:
                from rich.console import Console  # noqa: PLC0415
                from rich.live import Live  # noqa: PLC0415

                console = Console()
                with Live(console=console, auto_refresh=False, transient=False) as live:

                    def tick(views: Views, elapsed_s: float, killed: str | None) -> None:
                        live.update(_render(views, elapsed_s, killed), refresh=True)

                    report = await run_demo(provider, config, on_tick=tick)
    _print_report(report, args.ttl_ms)
    return EXIT_OK if report.exclusive else EXIT_NO


def _demo_fencing(args: argparse.Namespace) -> int:
    from ._demo_fencing import run_fencing_demo  # noqa: PLC0415 (only this command needs it)

    def echo(line: str) -> None:
        if not args.quiet or line.startswith("verdict"):
            print(line, flush=True)

    verdict = run_fencing_demo(args.url, ttl_ms=args.ttl_ms, echo=echo)
    return EXIT_OK if verdict.fenced else EXIT_NO


# -- one-shot commands -------------------------------------------------------------------------


def _emit(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    print(json.dumps(payload) if args.json else text)


def _for_reading(url: str) -> dict[str, Any]:
    """Options that keep a read-only command from creating the store it reads."""
    # Opening a SQLite URL creates the file: a typo would leave a new, empty one behind.
    return {"create": False} if url.lower().startswith("sqlite:") else {}


async def _lease_command(args: argparse.Namespace) -> int:
    options = _for_reading(args.url) if args.command == "owner" else {}
    async with connect(args.url, **options) as provider:
        if args.command == "acquire":
            result = await provider.acquire_lease(args.key, args.owner, args.ttl_ms)
            _emit(
                args,
                {"key": args.key, **asdict(result)},
                f"acquired (token {result.token})"
                if result.acquired
                else f"held by {result.owner}",
            )
            return EXIT_OK if result.acquired else EXIT_NO
        if args.command == "owner":
            owner = await provider.get_lease_owner(args.key)
            _emit(args, {"key": args.key, "owner": owner}, owner if owner is not None else "free")
            return EXIT_OK if owner is not None else EXIT_NO
        if args.command == "renew":
            renewed = await provider.renew_lease(args.key, args.owner, args.ttl_ms)
            _emit(args, {"key": args.key, "renewed": renewed}, "renewed" if renewed else "not held")
            return EXIT_OK if renewed else EXIT_NO
        if args.command == "release":
            await provider.release_lease(args.key, args.owner)
            _emit(args, {"key": args.key, "released": True}, "released (if it was held)")
            return EXIT_OK
        moved = await provider.transfer_lease(args.key, getattr(args, "from"), args.to, args.ttl_ms)
        _emit(args, {"key": args.key, "transferred": moved}, "transferred" if moved else "not held")
        return EXIT_OK if moved else EXIT_NO


async def _inspect(args: argparse.Namespace) -> int:
    async with connect(args.url, **_for_reading(args.url)) as provider:
        if not supports(provider, SupportsInspect):
            raise _UsageError(f"the backend for {args.url.split(':', 1)[0]}:// cannot list leases")
        records = await cast("SupportsInspect", provider).inspect(args.prefix, limit=args.limit)
    if args.json:
        print(json.dumps([asdict(r) for r in records]))
    elif not records:
        under = f" under the prefix {args.prefix!r}" if args.prefix else ""
        print(f"no live leases{under}")
    else:
        for r in records:
            print(f"{r.key}\t{r.owner}\ttoken={r.token}\tremaining_ms={r.remaining_ms}")
    return EXIT_OK


async def _migrate(args: argparse.Namespace) -> int:
    provider = connect(args.url)
    try:
        if not supports(provider, SupportsMigrate):
            scheme = args.url.split(":", 1)[0]
            raise _UsageError(f"the backend for {scheme}:// has no schema to migrate")
        await cast("SupportsMigrate", provider).migrate()
        print(f"schema up to date: {provider!r}")
    finally:
        await provider.aclose()
    return EXIT_OK


def _backends(args: argparse.Namespace) -> int:
    infos = available_backends(check=True)
    if args.json:
        print(json.dumps([asdict(info) for info in infos]))
        return EXIT_OK
    from rich.console import Console  # noqa: PLC0415
    from rich.markup import escape  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    table = Table()
    for column in ("scheme", "distribution", "loads here", "capabilities"):
        table.add_column(column, overflow="fold")
    for info in infos:
        caps = info.capabilities
        flags = ""
        if caps is not None:
            names = [k for k, v in asdict(caps).items() if v is True]
            flags = f"{', '.join(names) or 'none'}; TTL step {caps.ttl_resolution_ms} ms"
        loads = "yes" if info.loadable else f"no: {info.error}"
        # Every cell is plain text: rich would read "leasekit[redis]" in a pip hint as
        # markup and print "leasekit".
        cells = (info.scheme, info.distribution or "(registered)", loads, flags)
        table.add_row(*(escape(cell) for cell in cells))
    Console(width=max(Console().width, 120)).print(table)
    return EXIT_OK


async def _probe(url: str, timeout_s: float) -> None:
    """Open ``url`` and make one call, all within ``timeout_s``.

    A store that is down then fails ``check`` with one line, instead of every test of
    the suite failing with its own traceback after its own timeout.
    """

    async def one_call() -> None:
        async with connect(url) as provider:
            await provider.get_lease_owner("leasekit-check/probe")

    try:
        await asyncio.wait_for(one_call(), timeout_s)
    except asyncio.TimeoutError:
        # The URL may carry a password: name the scheme only.
        scheme = url.split(":", 1)[0]
        raise LeaseBackendTimeout(
            f"the store gave no answer within {timeout_s:g} s; the conformance suite did not run",
            backend=scheme,
        ) from None


def _check(args: argparse.Namespace) -> int:
    try:
        import leasekit_contract  # noqa: F401, PLC0415
        import pytest  # noqa: F401, PLC0415
    except ImportError as exc:
        raise _UsageError(
            f"leasekit check needs the test extra ({exc.name} is missing): "
            "pip install 'leasekit[test]'"
        ) from exc
    asyncio.run(_probe(args.url, args.timeout_s))
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "leasekit_contract",
        # A check of a store leaves nothing behind in the directory it was run from.
        "-p",
        "no:cacheprovider",
        "--leasekit-url",
        args.url,
        "-q",
        *args.pytest_args,
    ]
    with tempfile.TemporaryDirectory(prefix="leasekit-check-") as scratch:
        env = {**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": scratch}
        return subprocess.call(command, env=env)  # noqa: S603 (our interpreter, list args)


def _bench(args: argparse.Namespace) -> int:
    from .bench import (  # noqa: PLC0415 (loaded for this command only)
        render_json,
        render_table,
        run_bench,
    )

    def progress(step: str) -> None:
        if sys.stderr.isatty():
            print(f"leasekit bench: {step}", file=sys.stderr, flush=True)

    cycles = [name for name in args.scenarios if name != "handoff"]
    if cycles:
        report = run_bench(
            args.url,
            seconds=args.seconds,
            scenarios=cycles,
            rounds=args.rounds,
            progress=progress,
        )
        if args.json:
            print(render_json(report))
        else:
            from rich.console import Console  # noqa: PLC0415

            Console(width=max(Console().width, 100)).print(render_table(report))
    if "handoff" in args.scenarios:
        from ._bench._handoff import format_report, run_handoff  # noqa: PLC0415

        progress("handoff")
        handoff = run_handoff(
            args.url,
            handoffs=args.handoffs,
            takeovers=max(1, args.rounds * 3),
            load_s=args.seconds,
        )
        if args.json:
            print(json.dumps({"scenario": "handoff", "url": handoff.url, "rows": handoff.rows()}))
        else:
            print(format_report(handoff))
    return EXIT_OK


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": lambda args: _demo_fencing(args) if args.fencing else asyncio.run(_demo(args)),
    "backends": _backends,
    "inspect": lambda args: asyncio.run(_inspect(args)),
    "check": _check,
    "migrate": lambda args: asyncio.run(_migrate(args)),
    "bench": _bench,
}


def _dispatch(args: argparse.Namespace) -> int:
    command = _COMMANDS.get(args.command)
    if command is None:  # acquire, owner, renew, release, transfer
        return asyncio.run(_lease_command(args))
    return command(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (InvalidLeaseArgument, _UsageError) as exc:
        _fail(args, exc)
        return EXIT_USAGE
    except LeaseError as exc:
        _fail(args, exc)
        return EXIT_BACKEND
    except KeyboardInterrupt:
        return 130


def _fail(args: argparse.Namespace, exc: BaseException) -> None:
    if args.debug:
        traceback.print_exception(exc)
    print(f"leasekit: error: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
