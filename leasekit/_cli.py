"""The ``leasekit`` command line: ``demo`` and ``backends``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from collections.abc import Sequence

from . import __version__, available_backends, connect
from ._demo import DemoReport, Holding, run_demo
from ._errors import LeaseError

EXIT_OK = 0
EXIT_VIOLATION = 1
EXIT_USAGE = 2
EXIT_BACKEND = 3


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leasekit", description="Distributed leases: demo, backends and more."
    )
    parser.add_argument("--version", action="version", version=f"leasekit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="workers contend for thread keys, hand them off and survive a crash",
        description="Workers contend for thread keys: owners renew and hand keys to queued "
        "successors, one worker crashes mid-lease and its key is taken over after the "
        "TTL. The verdict replays every worker's log and checks that no two owners ever "
        "overlapped. Exit status 1 if they did.",
    )
    demo.add_argument(
        "--url", help="backend URL (default: a fresh in-process memory:// store)", default=None
    )
    demo.add_argument("--workers", type=_positive_int, default=6, help="workers (default 6)")
    demo.add_argument("--keys", type=_positive_int, default=3, help="thread keys (default 3)")
    demo.add_argument(
        "--seconds", type=_positive_float, default=10.0, help="how long to run (default 10)"
    )
    demo.add_argument(
        "--ttl-ms", type=_positive_int, default=600, help="lease TTL in ms (default 600)"
    )
    demo.add_argument("--quiet", action="store_true", help="print only the verdict")

    commands.add_parser("backends", help="list URL schemes and whether they load here")
    return parser


def _print_views(views: dict[str, tuple[str | None, int | None]], elapsed_s: float) -> None:
    cells = []
    for key, (owner, token) in views.items():
        who = owner if owner is not None else "-"
        cells.append(f"{key}: {who}" + (f" #{token}" if token is not None else ""))
    print(f"[{elapsed_s:5.1f}s] " + " | ".join(cells), flush=True)


def _print_report(report: DemoReport) -> None:
    print()
    print(f"operations   {report.operations}")
    print(f"acquired     {report.acquired}")
    print(f"routed       {report.routed}   (work sent to the current owner)")
    print(f"handoffs     {report.handoffs}   (transfer to a queued successor, never free)")
    print(f"takeovers    {report.takeovers}   (a crashed owner's key taken after its TTL)")
    print(f"releases     {report.releases}")
    print(f"holdings     {len(report.holdings)}   (ownership intervals checked)")
    if report.exclusive:
        print("verdict      OK: zero overlapping ownerships")
        return
    print(
        f"verdict      VIOLATED: {len(report.overlaps)} overlapping ownerships, "
        f"{len(report.token_disorder)} fencing-token inversions"
    )
    origin = min(h.start_s for h in report.holdings)
    for first, second in (report.overlaps + report.token_disorder)[:10]:
        print("  " + "  overlaps  ".join(_describe(h, origin) for h in (first, second)))


def _describe(holding: Holding, origin_s: float) -> str:
    token = f" #{holding.token}" if holding.token is not None else ""
    return (
        f"{holding.key}: {holding.owner}{token} "
        f"[{holding.start_s - origin_s:.3f}s, {holding.end_s - origin_s:.3f}s]"
    )


async def _demo(args: argparse.Namespace) -> int:
    url = args.url or f"memory://leasekit-demo-{uuid.uuid4().hex[:8]}"
    async with connect(url) as provider:
        if not args.quiet:
            print(
                f"leasekit demo: {args.workers} workers, {args.keys} keys, "
                f"{args.seconds:g} s on {url}"
            )
        report = await run_demo(
            provider,
            workers=args.workers,
            keys=args.keys,
            seconds=args.seconds,
            ttl_ms=args.ttl_ms,
            on_tick=None if args.quiet else _print_views,
        )
    _print_report(report)
    return EXIT_OK if report.exclusive else EXIT_VIOLATION


def _backends() -> int:
    rows = [("SCHEME", "DISTRIBUTION", "TARGET", "LOADS")]
    for info in available_backends(check=True):
        status = "yes" if info.loadable else f"no: {info.error}"
        rows.append((info.scheme, info.distribution or "(registered)", info.target, status))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[3]
        )
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return asyncio.run(_demo(args))
        return _backends()
    except LeaseError as exc:
        print(f"leasekit: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_BACKEND
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
