"""Handoff, takeover and waiting load: notifications against polling and the peers.

    python benchmarks/handoff.py [URL ...] [--handoffs N] [--takeovers N] [--load-s S]

Without a URL it starts its own redis-server (tests/servers.py, a free loopback port,
a temporary directory) and also measures memory:// and a temporary SQLite file. See
leasekit/_bench/_handoff.py for what each number means.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

from leasekit._bench._handoff import format_report, run_handoff

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls", nargs="*")
    parser.add_argument("--handoffs", type=int, default=200)
    parser.add_argument("--takeovers", type=int, default=10)
    parser.add_argument("--load-s", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        urls = list(args.urls)
        if not urls:
            from servers import RedisServer  # noqa: PLC0415 (after the sys.path entry)

            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            urls = ["memory://", f"sqlite:///{workdir}/handoff.db"]
            binary = RedisServer.find()
            if binary is not None:
                urls.append(stack.enter_context(RedisServer(binary, workdir / "redis")).url)
        for url in urls:
            report = run_handoff(
                url, handoffs=args.handoffs, takeovers=args.takeovers, load_s=args.load_s
            )
            if args.json:
                print(json.dumps({"url": report.url, "rows": report.rows()}))
            else:
                print(format_report(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
