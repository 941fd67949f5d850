"""What each ``leasekit`` command does, given its parsed arguments; returns the exit status.

:data:`COMMANDS` maps a command's name to its function; the five lease commands
(acquire, owner, renew, release, transfer) share :func:`lease_command`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import leasekit

from .. import (
    available_backends,
    connect,
    validate_key,
    validate_metadata,
    validate_owner,
    validate_ttl_ms,
)
from .._capabilities import capabilities_of
from .._demo import DemoConfig, Views, run_demo
from .._errors import LeaseBackendTimeout
from .._registry import scheme_of
from ..backend._records import (
    LeaseRecord,
    SupportsInspect,
    SupportsMigrate,
    SupportsRecords,
    SupportsReleaseReport,
    supports,
)
from ._demo_view import print_report, render
from ._parser import EXIT_NO, EXIT_OK, UsageError

__all__ = ["COMMANDS", "lease_command"]


# -- demo -----------------------------------------------------------------------------------

LEASE_IN_ONE_SENTENCE = (
    "A lease is a key that one owner at a time holds for a bounded time (its TTL): the "
    "holder renews it while it works, the others are told who holds it, and if the "
    "holder stops renewing, the key is free again when the TTL runs out."
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
            )
            print(LEASE_IN_ONE_SENTENCE, flush=True)
            if args.quiet:
                report = await run_demo(provider, config)
            else:
                from rich.console import Console  # noqa: PLC0415
                from rich.live import Live  # noqa: PLC0415

                console = Console()
                with Live(console=console, auto_refresh=False, transient=False) as live:

                    def tick(views: Views, elapsed_s: float, killed: str | None) -> None:
                        live.update(render(views, elapsed_s, killed), refresh=True)

                    report = await run_demo(provider, config, on_tick=tick)
    print_report(report, args.ttl_ms)
    return EXIT_OK if report.exclusive else EXIT_NO


def _demo_fencing(args: argparse.Namespace) -> int:
    from .._demo_fencing import run_fencing_demo  # noqa: PLC0415 (only this command needs it)

    def echo(line: str) -> None:
        if not args.quiet or line.startswith("verdict"):
            print(line, flush=True)

    verdict = run_fencing_demo(args.url, ttl_ms=args.ttl_ms, echo=echo)
    return EXIT_OK if verdict.fenced else EXIT_NO


# -- one-shot commands -------------------------------------------------------------------------


def _emit(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    print(json.dumps(payload) if args.json else text)


def _for_reading(url: str) -> dict[str, Any]:
    """Options that keep a read-only command from creating the store it reads.

    A backend whose opening can create its store (SQLite creates a missing file: a
    typo would leave a new, empty one behind) names them in its class attribute
    ``read_only_options`` (a mapping of ``from_url`` options); other backends open
    as they are.
    """
    declared = getattr(leasekit._registry.load(scheme_of(url)), "read_only_options", None)
    return dict(declared) if isinstance(declared, Mapping) else {}


def _validate_arguments(args: argparse.Namespace) -> None:
    """Refuse a bad key, owner, TTL or metadata before opening the store (which may create it)."""
    validate_key(args.key)
    for name, argument in (("owner", "owner"), ("from", "from_owner"), ("to", "to_owner")):
        if hasattr(args, name):
            validate_owner(getattr(args, name), argument)
    if hasattr(args, "ttl_ms"):
        validate_ttl_ms(args.ttl_ms)
    if getattr(args, "metadata", None) is not None:
        validate_metadata(args.metadata)


def _text(metadata: bytes | None) -> str | None:
    """Metadata for JSON and the terminal: its UTF-8 text, other bytes as backslash escapes."""
    return None if metadata is None else metadata.decode("utf-8", "backslashreplace")


def _record_row(record: LeaseRecord) -> dict[str, Any]:
    return {**asdict(record), "metadata": _text(record.metadata)}


async def lease_command(args: argparse.Namespace) -> int:
    _validate_arguments(args)
    options = _for_reading(args.url) if args.command == "owner" else {}
    provider = connect(args.url, **options)  # no I/O until entered
    if getattr(args, "metadata", None) is not None and not capabilities_of(provider).metadata:
        await provider.aclose()
        scheme = args.url.split(":", 1)[0]
        raise UsageError(f"the backend for {scheme}:// cannot store lease metadata")
    async with provider:
        if args.command == "acquire":
            acquire: Any = provider.acquire_lease
            if args.metadata is None:
                result = await acquire(args.key, args.owner, args.ttl_ms)
            else:
                result = await acquire(args.key, args.owner, args.ttl_ms, metadata=args.metadata)
            where = "" if result.metadata is None else f" (metadata {_text(result.metadata)})"
            _emit(
                args,
                {"key": args.key, **asdict(result), "metadata": _text(result.metadata)},
                f"acquired (token {result.token})"
                if result.acquired
                else f"held by {result.owner}{where}",
            )
            return EXIT_OK if result.acquired else EXIT_NO
        if args.command == "owner":
            return await _owner(args, provider)
        if args.command == "renew":
            renewed = await provider.renew_lease(args.key, args.owner, args.ttl_ms)
            _emit(args, {"key": args.key, "renewed": renewed}, "renewed" if renewed else "not held")
            return EXIT_OK if renewed else EXIT_NO
        if args.command == "release":
            return await _release(args, provider)
        transfer: Any = provider.transfer_lease
        handover = (args.key, getattr(args, "from"), args.to, args.ttl_ms)
        if args.metadata is None:
            moved = await transfer(*handover)
        else:
            moved = await transfer(*handover, metadata=args.metadata)
        _emit(args, {"key": args.key, "transferred": moved}, "transferred" if moved else "not held")
        return EXIT_OK if moved else EXIT_NO


async def _owner(args: argparse.Namespace, provider: leasekit.LeaseProvider) -> int:
    """The owner; with ``--json``, the whole record where the backend can read one."""
    if not supports(provider, SupportsRecords):
        owner = await provider.get_lease_owner(args.key)
        _emit(args, {"key": args.key, "owner": owner}, owner if owner is not None else "free")
        return EXIT_OK if owner is not None else EXIT_NO
    record = await cast("SupportsRecords", provider).get_lease_record(args.key)
    if record is None:
        _emit(args, {"key": args.key, "owner": None}, "free")
        return EXIT_NO
    _emit(args, _record_row(record), record.owner)
    return EXIT_OK


async def _release(args: argparse.Namespace, provider: leasekit.LeaseProvider) -> int:
    """Release; say whether it was released where the backend can tell, in the same step.

    Exit 0 either way (releasing a key one does not hold is a no-op, not a failure);
    ``released`` is ``null`` on a backend without ``release_if_held``.
    """
    if not supports(provider, SupportsReleaseReport):
        await provider.release_lease(args.key, args.owner)
        _emit(args, {"key": args.key, "released": None}, "released (if it was held)")
        return EXIT_OK
    released = await cast("SupportsReleaseReport", provider).release_if_held(args.key, args.owner)
    text = "released" if released else f"not released: {args.owner} did not hold it"
    _emit(args, {"key": args.key, "released": released}, text)
    return EXIT_OK


async def _inspect(args: argparse.Namespace) -> int:
    async with connect(args.url, **_for_reading(args.url)) as provider:
        if not supports(provider, SupportsInspect):
            raise UsageError(f"the backend for {args.url.split(':', 1)[0]}:// cannot list leases")
        records = await cast("SupportsInspect", provider).inspect(args.prefix, limit=args.limit)
    if args.json:
        print(json.dumps([_record_row(r) for r in records]))
    elif not records:
        under = f" under the prefix {args.prefix!r}" if args.prefix else ""
        print(f"no live leases{under}")
    else:
        for r in records:
            where = "" if r.metadata is None else f"\tmetadata={_text(r.metadata)}"
            print(f"{r.key}\t{r.owner}\ttoken={r.token}\tremaining_ms={r.remaining_ms}{where}")
    return EXIT_OK


async def _migrate(args: argparse.Namespace) -> int:
    provider = connect(args.url)
    try:
        if not supports(provider, SupportsMigrate):
            scheme = args.url.split(":", 1)[0]
            raise UsageError(f"the backend for {scheme}:// has no schema to migrate")
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
        if info.url_forms:
            flags += "\nalso: " + "; ".join(info.url_forms)
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
        raise UsageError(
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
    from ..bench import (  # noqa: PLC0415 (loaded for this command only)
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
        from .._bench._handoff import format_report, run_handoff  # noqa: PLC0415

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


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": lambda args: _demo_fencing(args) if args.fencing else asyncio.run(_demo(args)),
    "backends": _backends,
    "inspect": lambda args: asyncio.run(_inspect(args)),
    "check": _check,
    "migrate": lambda args: asyncio.run(_migrate(args)),
    "bench": _bench,
}
