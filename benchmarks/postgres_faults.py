"""Churn leases on PostgreSQL through a fault schedule; report every overlap, with evidence.

    python benchmarks/postgres_faults.py [--runs N] [--keep DIR]

Starts its own PostgreSQL with the test harness (``tests/servers.py``) with every
statement logged (``log_min_duration_statement=0``, ``log_line_prefix='%m [%p] '``).
Each run (about 11 s) gets a fresh table, with an audit trigger that records every
change of a row on the server (the row before and after, ``clock_timestamp()``, the
backend's pid and the statement). Four worker processes of three owners each churn
eight keys (acquire, renew at once, hold up to 50 ms, renew, hold, release; ttl 1000 ms,
``timeout_s=2``) while the driver injects, in order: an immediate restart (SIGKILL of
every server process, then a start on the same data), ``pg_terminate_backend`` of
the workers' connections, and SIGSTOP of the postmaster and every backend for 3 s.

An overlap is judged from the callers' side, as an application sees it: an owner
holds a key from the return of its granted acquire until ``send time + ttl`` of its
last granted acquire or successful renew, cut at the send of its release or of a
refused renew. Two owners holding the same key at once is an overlap. A holding is
also reported as cut short when a renew was refused before that time had passed
(the server must have ended the lease early: a release). For each, the script prints
the owners' calls, the server's audit rows for the key and the server log lines of
the backends that wrote them. Exit status 1 if any run had either.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# tests/servers.py is the harness the test suite starts its servers with.
sys.path.insert(0, str(ROOT / "tests"))

KEYS = [f"k{i}" for i in range(8)]
WORKERS = 4
OWNERS_PER_WORKER = 3
TTL_MS = 1000
TIMEOUT_S = 2.0
HOLD_S = 0.05  # an owner holds a key up to this long between its two renews
APPLICATION = "leasekit-faults"
# The schedule, in seconds from the workers' start.
RESTART_AT, TERMINATE_AT, PAUSE_AT, PAUSE_S, END_AT = 1.5, 3.5, 5.0, 3.0, 10.5

AUDIT_SQL = """
CREATE TABLE {table}_audit (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    pid int NOT NULL DEFAULT pg_backend_pid(),
    op text NOT NULL,
    key bytea NOT NULL,
    old_owner bytea, old_token bigint, old_expires timestamptz,
    new_owner bytea, new_token bigint, new_expires timestamptz,
    query text NOT NULL DEFAULT current_query()
);
CREATE FUNCTION {table}_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {table}_audit (op, key, new_owner, new_token, new_expires)
        VALUES (TG_OP, NEW.key, NEW.owner, NEW.token, NEW.expires_at);
    ELSE
        INSERT INTO {table}_audit (op, key, old_owner, old_token, old_expires,
                                   new_owner, new_token, new_expires)
        VALUES (TG_OP, NEW.key, OLD.owner, OLD.token, OLD.expires_at,
                NEW.owner, NEW.token, NEW.expires_at);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER {table}_audit AFTER INSERT OR UPDATE ON {table}
    FOR EACH ROW EXECUTE FUNCTION {table}_audit_row();
"""


# -- a worker process ------------------------------------------------------------------------


async def churn(
    provider: Any, owner: str, until: float, out: list[dict[str, Any]], *, sticky: bool
) -> None:
    from leasekit import LeaseError  # noqa: PLC0415

    rng = random.Random(owner)
    failed: str | None = None

    async def call(op: str, key: str, *args: Any) -> Any:
        sent = time.time()
        entry: dict[str, Any] = {"owner": owner, "op": op, "key": key, "sent": sent}
        try:
            result = await getattr(provider, f"{op}_lease")(key, owner, *args)
        except LeaseError as exc:
            nonlocal failed
            entry.update(back=time.time(), error=type(exc).__name__)
            out.append(entry)
            failed = key if sticky else None
            return None
        entry["back"] = time.time()
        if op == "acquire":
            entry.update(acquired=result.acquired, token=result.token, holder=result.owner)
        elif op == "renew":
            entry["renewed"] = result
        out.append(entry)
        return result

    while time.time() < until:
        key, failed = failed or rng.choice(KEYS), None
        got = await call("acquire", key, TTL_MS)
        if got is None or not got.acquired:
            await asyncio.sleep(rng.uniform(0.005, 0.03))
            continue
        if await call("renew", key, TTL_MS):
            await asyncio.sleep(rng.uniform(0.0, HOLD_S))
            if await call("renew", key, TTL_MS):
                await asyncio.sleep(rng.uniform(0.0, HOLD_S))
        await call("release", key)


async def worker(url: str, table: str, index: int, *, sticky: bool) -> list[dict[str, Any]]:
    from leasekit_postgres import PostgresLeaseProvider  # noqa: PLC0415

    from leasekit import LeaseError  # noqa: PLC0415

    calls: list[dict[str, Any]] = []
    give_up = time.monotonic() + 30
    while True:  # the server may still be starting up after the last run's restart
        provider = PostgresLeaseProvider.from_url(url, table=table, timeout_s=TIMEOUT_S)
        try:
            await provider.__aenter__()
            break
        except LeaseError:
            if time.monotonic() > give_up:
                raise
            await asyncio.sleep(0.1)
    print("ready", flush=True)
    told = await asyncio.to_thread(sys.stdin.readline)
    if not told:  # the driver is gone
        await provider.aclose()
        return calls
    until = float(told)
    try:
        await asyncio.gather(
            *(
                churn(provider, f"w{index}-o{j}", until, calls, sticky=sticky)
                for j in range(OWNERS_PER_WORKER)
            )
        )
    finally:
        await provider.aclose()
    return calls


# -- the driver -------------------------------------------------------------------------------


@dataclass
class Holding:
    owner: str
    key: str
    token: int
    start: float  # the granted acquire's return
    end: float  # send + ttl of the last confirmation, cut at a release or refusal
    calls: list[dict[str, Any]]
    cut_short: bool = False


def holdings(calls: list[dict[str, Any]]) -> list[Holding]:
    """Each owner's holdings, as its own calls tell it (see the module docstring)."""
    found: list[Holding] = []
    by_owner: dict[str, list[dict[str, Any]]] = {}
    for entry in calls:
        by_owner.setdefault(entry["owner"], []).append(entry)
    for entries in by_owner.values():
        entries.sort(key=lambda e: e["sent"])
        current: Holding | None = None
        for entry in entries:
            if entry["op"] == "acquire" and entry.get("acquired"):
                current = Holding(
                    entry["owner"], entry["key"], entry["token"], entry["back"],
                    entry["sent"] + TTL_MS / 1000, [entry],
                )  # fmt: skip
                found.append(current)
            elif current is not None and entry["key"] == current.key:
                current.calls.append(entry)
                if entry["op"] == "renew" and entry.get("renewed"):
                    current.end = max(current.end, entry["sent"] + TTL_MS / 1000)
                elif entry["op"] == "renew" and entry.get("renewed") is False:
                    # Refused before the lease could have expired: ended under us.
                    current.cut_short = entry["back"] < current.end
                    current.end = min(current.end, entry["sent"])
                    current = None
                elif entry["op"] == "release":
                    current.end = min(current.end, entry["sent"])
                    current = None
    return found


def overlaps(calls: list[dict[str, Any]]) -> list[tuple[Holding, Holding]]:
    by_key: dict[str, list[Holding]] = {}
    for holding in holdings(calls):
        by_key.setdefault(holding.key, []).append(holding)
    found = []
    for held in by_key.values():
        held.sort(key=lambda h: h.start)
        for i, first in enumerate(held):
            for later in held[i + 1 :]:
                if later.start >= first.end:
                    break
                if later.owner != first.owner and later.start < first.end:
                    found.append((first, later))
    return found


def stamp(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}"


def describe(entry: dict[str, Any]) -> str:
    outcome = (
        entry.get("error")
        or {
            "acquire": lambda: f"acquired={entry.get('acquired')} token={entry.get('token')}",
            "renew": lambda: f"renewed={entry.get('renewed')}",
            "release": lambda: "ok",
        }[entry["op"]]()
    )
    return (
        f"  client {entry['owner']:6} {entry['op']:8} {entry['key']:3} sent {stamp(entry['sent'])}"
        f" back {stamp(entry['back'])}: {outcome}"
    )


def server_log_lines(log_path: Path, pids: set[int], low: float, high: float) -> list[str]:
    """The log's lines (with continuation lines) of ``pids`` between two times (UTC)."""
    lines: list[str] = []
    keep = False
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line[:4].isdigit() and " [" in line[:40]:
            keep = False
            try:
                at = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) - time.timezone
                at += float("0" + line[19:23])
                pid = int(line.split("[", 1)[1].split("]", 1)[0])
            except ValueError:
                continue
            keep = pid in pids and low <= at <= high
        if keep:
            lines.append("  " + line.rstrip()[:220])
    return lines


def resume_staggered(server: Any, spread_s: float, rng: random.Random) -> None:
    """SIGCONT the backends one by one in a random order over ``spread_s``, then the rest.

    As a loaded machine schedules them: some backends run well before others.
    """
    backends = server._backends()
    rng.shuffle(backends)
    for pid in backends:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)
        time.sleep(spread_s / max(1, len(backends)))
    server.resume()  # the postmaster, last, as the harness's resume does


def run_once(server: Any, number: int, workdir: Path, *, sticky: bool, stagger_s: float) -> int:
    import psycopg  # noqa: PLC0415

    table = f"faults_{number}"
    url = f"{server.url}?application_name={APPLICATION}"
    with psycopg.connect(server.url, autocommit=True) as conn:
        from leasekit_postgres._options import table_name  # noqa: PLC0415
        from leasekit_postgres._sql import Statements  # noqa: PLC0415

        conn.execute(Statements(table_name(table)).migrate)
        conn.execute(AUDIT_SQL.replace("{table}", table).encode())
    outs = [workdir / f"run{number}-worker{i}.jsonl" for i in range(WORKERS)]
    procs = [
        subprocess.Popen(  # noqa: S603 (this script, with arguments of its own)
            [sys.executable, __file__, "--worker", url, table, str(i), str(out)]
            + (["--sticky"] if sticky else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, out in enumerate(outs)
    ]
    # The schedule starts once every worker is connected (a loaded machine takes a
    # while to start four interpreters): each says "ready", and is told when to stop.
    for proc in procs:
        assert proc.stdout is not None
        proc.stdout.readline()
    start = time.time()
    until = start + END_AT
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{until}\n")
        proc.stdin.close()
    events: list[tuple[float, str]] = []

    def at(offset: float) -> None:
        time.sleep(max(0.0, start + offset - time.time()))

    at(RESTART_AT)
    events.append((time.time(), "restart (SIGKILL, start)"))
    server.restart()
    at(TERMINATE_AT)
    events.append((time.time(), "pg_terminate_backend of the workers' connections"))
    with psycopg.connect(server.url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (APPLICATION,),
        )
    at(PAUSE_AT)
    events.append((time.time(), "SIGSTOP"))
    server.pause()
    at(PAUSE_AT + PAUSE_S)
    if stagger_s:
        events.append((time.time(), f"SIGCONT, backends staggered over {stagger_s:g} s"))
        resume_staggered(server, stagger_s, random.Random(number))
    else:
        server.resume()
        events.append((time.time(), "SIGCONT"))
    for proc in procs:
        proc.wait(60)
    calls = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    found = overlaps(calls)
    found += [(held, held) for held in holdings(calls) if held.cut_short]
    errors = sum(1 for c in calls if "error" in c)
    granted = sum(1 for c in calls if c.get("acquired"))
    faults = ", ".join(
        f"{what.split(' ')[0].rstrip(',')} at {when - start:.1f} s" for when, what in events
    )
    first, last = min(c["sent"] for c in calls), max(c["back"] for c in calls)
    span = f"calls {first - start:.1f}-{last - start:.1f} s"
    print(
        f"run {number}: {len(calls)} calls ({span}), {granted} grants, {errors} errors, "
        f"{len(found)} overlaps or leases cut short; {faults}",
        flush=True,
    )
    if found:
        report(server, table, events, found)
    return len(found)


def report(
    server: Any, table: str, events: list[tuple[float, str]], found: list[tuple[Holding, Holding]]
) -> None:
    """Print each overlap: both owners' calls, the server's audit rows and log lines."""
    import psycopg  # noqa: PLC0415
    from psycopg import sql  # noqa: PLC0415

    for when, what in events:
        print(f"  fault {stamp(when)}: {what}")
    with psycopg.connect(server.url, autocommit=True) as conn:
        audit = conn.execute(
            sql.SQL(
                "SELECT extract(epoch FROM at)::float8, pid, op, convert_from(key, 'UTF8'),"
                " convert_from(old_owner, 'UTF8'), old_token,"
                " extract(epoch FROM old_expires)::float8, convert_from(new_owner, 'UTF8'),"
                " new_token, extract(epoch FROM new_expires)::float8,"
                " left(regexp_replace(query, '\\s+', ' ', 'g'), 60)"
                " FROM {} ORDER BY id"
            ).format(sql.Identifier(f"{table}_audit"))
        ).fetchall()
    for first, later in found:
        if first is later:
            print(f"CUT SHORT on {first.key}: {first.owner} (token {first.token})")
        else:
            print(
                f"OVERLAP on {first.key}: {first.owner} (token {first.token}) until "
                f"{stamp(first.end)}, {later.owner} (token {later.token}) from "
                f"{stamp(later.start)}"
            )
        entries = first.calls + ([] if first is later else later.calls)
        for entry in sorted(entries, key=lambda e: e["sent"]):
            print(describe(entry))
        low, high = first.calls[0]["sent"] - 4, max(later.start, first.calls[-1]["back"]) + 0.5
        pids: set[int] = set()
        for row in audit:
            if row[3] == first.key and low <= row[0] <= high:
                pids.add(row[1])
                old = f"{row[4]}/{row[5]}/{stamp(row[6])}" if row[4] else "-"
                print(
                    f"  server {stamp(row[0])} [{row[1]}] {row[2]:6} {old} -> "
                    f"{row[7]}/{row[8]}/{stamp(row[9])}  {row[10]}"
                )
        print("  server log of those backends:")
        print("\n".join(server_log_lines(server.log_path, pids, low, high)))


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--worker":
        url, table, index, out = argv[1:5]
        calls = asyncio.run(worker(url, table, int(index), sticky="--sticky" in argv))
        Path(out).write_text("".join(json.dumps(e) + "\n" for e in calls), encoding="utf-8")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep the server log and call logs here")
    parser.add_argument(
        "--stagger-ms",
        type=float,
        default=0,
        help="wake the frozen backends one by one in a random order over this long "
        "(default: all at once, then the postmaster)",
    )
    parser.add_argument(
        "--sticky",
        action="store_true",
        help="an owner whose call failed acquires the same key next (as a worker retrying "
        "its job does), which meets a late statement more often",
    )
    options = parser.parse_args(argv)
    # A SIGTERM unwinds like Ctrl-C: the server is stopped and its data removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from servers import PostgresServer  # noqa: PLC0415 (after the sys.path entry above)

    binary = PostgresServer.find()
    if binary is None:
        print(f"postgres not found; install it ({PostgresServer.install_hint})")
        return 2
    settings = {
        "log_min_duration_statement": "0",
        "log_line_prefix": "%m [%p] ",
        "log_parameter_max_length": "-1",
        "log_timezone": "UTC",
        "timezone": "UTC",
    }
    total = 0
    with tempfile.TemporaryDirectory(prefix="leasekit-faults-") as tmp:
        workdir = Path(tmp)
        with PostgresServer(binary, workdir / "postgres", extra_settings=settings) as server:
            for number in range(1, options.runs + 1):
                found = run_once(
                    server,
                    number,
                    workdir,
                    sticky=options.sticky,
                    stagger_s=options.stagger_ms / 1000,
                )
                total += found > 0
            if options.keep is not None:
                options.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(server.log_path, options.keep / "postgres.log")
                for path in workdir.glob("*.jsonl"):
                    shutil.copy(path, options.keep / path.name)
    print(f"{options.runs} runs, {total} with an overlap or a lease cut short")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
