"""Client instructions per 1-task acquire+release cycle, counted by valgrind's cachegrind.

    python benchmarks/instructions.py URL [--low 300] [--high 1500] [--contender floor]

Runs the bench's 1-task cycle (16 keys, one owner, through the contender
``leasekit bench`` calls ``leasekit``, or the scheme's raw-driver ``floor``) under
``valgrind --tool=cachegrind --cache-sim=no`` twice, at ``--low`` and ``--high``
cycles, and prints ``(count at high - count at low) / (high - low)``: the user-space
instructions one cycle costs, start-up, imports and warm-up cancelled out. Unlike a
wall or CPU time it is the same on every run, whatever else the machine is doing,
which is why ``docs/benchmarks.md`` compares code changes with it (within 3 %).

To compare two trees, run it with each on ``PYTHONPATH`` (a worktree of the older
commit), against the same server. Needs ``valgrind`` (Debian's package). Point it at
a server you can spare: it writes keys named ``leasekit-bench-<id>...`` and deletes them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid

from leasekit.bench import LEASEKIT, BenchTarget, Contender, scheme_bench

TTL_MS = 30_000
KEYS = 16
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


def contender_of(url: str, name: str) -> Contender:
    if name == "leasekit":
        return LEASEKIT
    bench = scheme_bench(url.split("://", 1)[0])
    for contender in bench.contenders:
        if contender.role == name and contender.open_async is not None:
            return contender
    raise SystemExit(f"no async {name} declared for {url.split('://', 1)[0]}://")


def run_cycles(url: str, name: str, cycles: int) -> None:
    """The measured child: ``cycles`` cycles of one contender, one task, 16 keys."""
    contender = contender_of(url, name)
    open_async = contender.open_async
    assert open_async is not None
    target = BenchTarget(url, TTL_MS, f"leasekit-bench-{uuid.uuid4().hex[:10]}")

    async def run() -> None:
        cycler = await open_async(target)
        keys = [f"{target.namespace}:count:{i}" for i in range(KEYS)]
        owner = f"{target.namespace}:owner"
        try:
            for i in range(cycles):
                await cycler.cycle(keys[i % KEYS], owner)
        finally:
            await cycler.aclose()
        cleanup = scheme_bench(url.split("://", 1)[0]).cleanup
        if cleanup is not None:
            await cleanup(target)

    asyncio.run(run())


def count(url: str, name: str, cycles: int) -> int:
    """Instructions of a whole child run of ``cycles`` cycles, by cachegrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as scratch:
        out = subprocess.run(  # noqa: S603 (valgrind on this interpreter and this file)
            [
                valgrind,
                "--tool=cachegrind",
                "--cache-sim=no",
                f"--cachegrind-out-file={os.path.join(scratch, 'out')}",
                sys.executable,
                __file__,
                url,
                "--child",
                str(cycles),
                "--contender",
                name,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    found = _REFS.search(out.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("url")
    parser.add_argument("--low", type=int, default=300)
    parser.add_argument("--high", type=int, default=1500)
    parser.add_argument("--contender", choices=("leasekit", "floor"), default="leasekit")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        run_cycles(args.url, args.contender, args.child)
        return 0
    if not 0 < args.low < args.high:
        parser.error("--low and --high: 0 < low < high")
    low = count(args.url, args.contender, args.low)
    high = count(args.url, args.contender, args.high)
    per_cycle = (high - low) / (args.high - args.low)
    scheme = args.url.split("://", 1)[0]
    print(
        f"{scheme}:// {args.contender}: {per_cycle:,.0f} instructions per cycle "
        f"({high:,} at {args.high} cycles, {low:,} at {args.low})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
