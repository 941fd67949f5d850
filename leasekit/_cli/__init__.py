"""The ``leasekit`` command line: ``main`` parses, runs the command, maps errors to a status.

:mod:`._parser` holds the arguments and exit statuses, :mod:`._commands` what each
command does, :mod:`._demo_view` how the demo draws. Exit status: 0 yes/done, 1 no
(held elsewhere, not renewed, free, violation), 2 usage error, 3 backend error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import traceback
from collections.abc import Sequence

from .._errors import InvalidLeaseArgument, LeaseError
from ._commands import COMMANDS, lease_command
from ._parser import EXIT_BACKEND, EXIT_USAGE, UsageError, build_parser

__all__ = ["main"]


def _dispatch(args: argparse.Namespace) -> int:
    command = COMMANDS.get(args.command)
    if command is None:  # acquire, owner, renew, release, transfer
        return asyncio.run(lease_command(args))
    return command(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (InvalidLeaseArgument, UsageError) as exc:
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
