"""``leasekit demo``: workers contend for thread keys, hand them off, and survive a kill.

Each worker is a separate process with its own connection (or, for a store that is
not shared across processes such as ``memory://``, a task in this process). Workers
acquire a thread key or learn its owner and route work there (queueing as its
successor); owners renew while they work, then hand the key to a queued successor
or release it. A third of the way in, the driver kills a worker that holds a key:
its lease is taken over once the TTL runs out.

Every worker appends what it believed to a log of its own, line by line, so a killed
worker's log survives. A belief starts when a grant returns and ends when the
worker starts to release or hand off, or when the lease must have expired counted
from *before* the last call that granted or renewed it: the conservative bound a
careful client uses. The verdict replays all logs and proves (or disproves) that no
two owners of a key ever overlapped, and that fencing tokens follow time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import multiprocessing
import os
import random
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._capabilities import capabilities_of
from ._contract import LeaseProvider

__all__ = ["DemoConfig", "DemoReport", "Holding", "find_overlaps", "judge", "run_demo"]

_SUCCESSOR_PATIENCE_MS = 1000  # how long a queued successor waits for a handoff
_START_FILE = "start"  # in the log directory: the run's deadline, once every worker is ready
_READY_PATIENCE_S = 120.0  # how long workers may take to start and connect


def _successor_slot(key: str) -> str:
    """The key whose lease says who is next in line for ``key``: queueing is a lease too,
    so a killed waiter leaves no stale entry behind."""
    return key + "\0next"


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """What one demo run does; picklable, so it travels to spawned workers."""

    url: str
    workers: int = 6
    keys: int = 3
    seconds: float = 10.0
    ttl_ms: int = 600
    log_dir: str = ""
    # time.monotonic(), one clock for every process on the host. Set by the driver once
    # every worker is connected; workers learn it from the start file (_START_FILE).
    deadline: float = 0.0

    @property
    def key_names(self) -> list[str]:
        return [f"thread-{i}" for i in range(self.keys)]


@dataclass(frozen=True, slots=True)
class Holding:
    """One interval during which ``owner`` believed it held ``key`` (monotonic seconds)."""

    key: str
    owner: str
    token: int | None
    start_s: float
    end_s: float
    how: str  # "acquired" or "handed over"
    ended: str  # "released", "transferred", "lost" or "killed"


@dataclass
class DemoReport:
    """What the workers did and what the verdict found."""

    operations: int = 0
    acquired: int = 0
    routed: int = 0
    handoffs: int = 0
    takeovers: int = 0
    releases: int = 0
    renewals: int = 0
    lookups: int = 0  # get_lease_owner: who owns a key, who is next in line for it
    denials: int = 0  # acquires refused because another owner held the key or the queue slot
    calls: dict[str, int] = field(default_factory=dict)  # per contract method
    killed: str | None = None
    killed_key: str | None = None
    killed_at_s: float | None = None  # time.monotonic() of the kill
    taken_over_by: str | None = None
    takeover_s: float | None = None  # from the kill to the next owner's grant on killed_key
    holdings: list[Holding] = field(default_factory=list)
    overlaps: list[tuple[Holding, Holding]] = field(default_factory=list)
    token_disorder: list[tuple[Holding, Holding]] = field(default_factory=list)

    @property
    def exclusive(self) -> bool:
        return not self.overlaps and not self.token_disorder


# -- the worker: the same code in a process or in a task ---------------------------------


class _Log:
    """One worker's append-only JSON-lines log; each line is flushed at once."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")
        self.counts: collections.Counter[str] = collections.Counter()

    def write(self, event: str, **fields: Any) -> None:
        self._file.write(json.dumps({"ev": event, **fields}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self.write("stats", **self.counts)
        self._file.close()


class _Worker:
    def __init__(self, provider: LeaseProvider, owner: str, config: DemoConfig) -> None:
        self.provider = provider
        self.owner = owner
        self.config = config
        self.ttl_ms = capabilities_of(provider).effective_ttl_ms(config.ttl_ms)
        self.ttl_s = self.ttl_ms / 1000
        self.rng = random.Random(owner)
        self.log = _Log(Path(config.log_dir) / f"{owner}.jsonl")

    async def op(self, name: str, *args: Any) -> Any:
        self.log.counts["operations"] += 1
        self.log.counts[f"call:{name}"] += 1
        result = await getattr(self.provider, name)(*args)
        if name == "acquire_lease" and not result.acquired:
            self.log.counts["denials"] += 1
        return result

    async def run(self) -> None:
        try:
            # The run starts when every worker is connected, so a slow start (spawning
            # interpreters on a loaded machine) never eats into the contention.
            deadline = await _wait_for_start(Path(self.config.log_dir))
            self.config = dataclasses.replace(self.config, deadline=deadline)
            while time.monotonic() < self.config.deadline:
                key = self.rng.choice(self.config.key_names)
                asked = time.monotonic()
                result = await self.op("acquire_lease", key, self.owner, self.ttl_ms)
                if result.acquired:
                    self.log.counts["acquired"] += 1
                    await self.own(key, result.token, asked, "acquired")
                else:
                    # Somebody owns the thread: route the work there, queue as successor.
                    self.log.counts["routed"] += 1
                    await self.wait_for_handoff(key)
        finally:
            self.log.close()

    async def own(self, key: str, token: int | None, granted_at: float, how: str) -> None:
        now = time.monotonic()
        self.log.write(
            "hold", key=key, owner=self.owner, token=token, start=now, granted=granted_at, how=how
        )
        for _ in range(self.rng.randint(1, 4)):
            await asyncio.sleep(self.ttl_s / 4)  # a slice of work on the thread
            asked = time.monotonic()
            if not await self.op("renew_lease", key, self.owner, self.ttl_ms):
                self.end(key, token, granted_at + self.ttl_s, "lost")
                return
            granted_at = asked
            self.log.write("renew", key=key, owner=self.owner, token=token, granted=granted_at)
        successor = await self.op("get_lease_owner", _successor_slot(key))
        ending = min(time.monotonic(), granted_at + self.ttl_s)
        if successor not in (None, self.owner) and await self.op(
            "transfer_lease", key, self.owner, successor, self.ttl_ms
        ):
            self.log.counts["handoffs"] += 1
            self.end(key, token, ending, "transferred")
            return
        await self.op("release_lease", key, self.owner)
        self.log.counts["releases"] += 1
        self.end(key, token, ending, "released")

    def end(self, key: str, token: int | None, end: float, ended: str) -> None:
        self.log.write("end", key=key, owner=self.owner, token=token, end=end, ended=ended)

    async def wait_for_handoff(self, key: str) -> None:
        """Queue up as ``key``'s successor and take it if its owner hands it over in time."""
        slot = _successor_slot(key)
        queued = await self.op("acquire_lease", slot, self.owner, _SUCCESSOR_PATIENCE_MS)
        if not queued.acquired:
            # Somebody else is next in line: try elsewhere after a pause.
            await asyncio.sleep(self.ttl_s / 6 * self.rng.uniform(0.5, 1.5))
            return
        until = time.monotonic() + _SUCCESSOR_PATIENCE_MS / 1000
        while time.monotonic() < min(until, self.config.deadline):
            await asyncio.sleep(self.ttl_s / 6 * self.rng.uniform(0.5, 1.5))
            if await self.op("get_lease_owner", key) == self.owner:
                asked = time.monotonic()
                # Idempotent re-acquire: confirms the lease and reads our token.
                result = await self.op("acquire_lease", key, self.owner, self.ttl_ms)
                await self.op("release_lease", slot, self.owner)
                if result.acquired:
                    await self.own(key, result.token, asked, "handed over")
                return
        await self.op("release_lease", slot, self.owner)


async def _wait_for_start(log_dir: Path) -> float:
    """The run's deadline, once the driver has written it into the start file."""
    path = log_dir / _START_FILE
    while not path.exists():  # noqa: ASYNC110 (another process writes it: no event to await)
        await asyncio.sleep(0.01)
    return float(path.read_text(encoding="utf-8"))


def _announce_start(log_dir: Path, deadline: float) -> None:
    """Write the start file in one step (a rename), so no worker reads half of it."""
    partial = log_dir / (_START_FILE + ".partial")
    partial.write_text(repr(deadline), encoding="utf-8")
    partial.replace(log_dir / _START_FILE)


async def _wait_until_ready(log_dir: Path, runners: dict[str, Any]) -> None:
    """Return once every worker has connected (its log file exists)."""
    give_up = time.monotonic() + _READY_PATIENCE_S
    while not all((log_dir / f"{owner}.jsonl").exists() for owner in runners):
        for owner, runner in runners.items():
            if isinstance(runner, asyncio.Task) and runner.done():
                runner.result()  # a worker that failed to start raises its error here
            elif not isinstance(runner, asyncio.Task) and runner.exitcode is not None:
                raise RuntimeError(f"demo worker {owner} exited with {runner.exitcode}")
        if time.monotonic() > give_up:
            raise RuntimeError(f"demo workers did not start within {_READY_PATIENCE_S:g} s")
        await asyncio.sleep(0.02)


def _worker_process(config: DemoConfig, owner: str) -> None:
    """Entry point of a spawned worker: its own event loop and its own connection."""
    from . import connect  # noqa: PLC0415 (spawned children import the package fresh)

    async def main() -> None:
        async with connect(config.url) as provider:
            await _Worker(provider, owner, config).run()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


# -- the driver ----------------------------------------------------------------------------


Views = dict[str, str | None]


async def run_demo(
    provider: LeaseProvider,
    config: DemoConfig,
    *,
    on_tick: Callable[[Views, float, str | None], None] | None = None,
) -> DemoReport:
    """Run the demo against the store behind ``provider`` and return the verdict.

    Workers are processes when the store is shared across processes, else tasks on
    this loop sharing ``provider``. ``provider`` itself is used to watch the keys.
    """
    in_processes = capabilities_of(provider).shared_across_processes
    with tempfile.TemporaryDirectory(prefix="leasekit-demo-") as log_dir:
        config = dataclasses.replace(config, log_dir=log_dir)
        owners = [f"worker-{i}-{uuid.uuid4().hex[:6]}" for i in range(config.workers)]
        runners = _start_workers(provider, config, owners, in_processes=in_processes)
        try:
            await _wait_until_ready(Path(log_dir), runners)
            start = time.monotonic()
            config = dataclasses.replace(config, deadline=start + config.seconds)
            _announce_start(Path(log_dir), config.deadline)
            kill = await _watch(provider, config, runners, start, on_tick)
            killed = kill.owner if kill is not None else None
            await _join(runners, config, killed)
        finally:
            for runner in runners.values():
                if isinstance(runner, asyncio.Task):
                    runner.cancel()
                elif runner.is_alive():
                    runner.kill()
        report = judge(Path(log_dir), config.ttl_ms / 1000)
        if kill is not None:
            _describe_takeover(report, kill)
        return report


@dataclass(frozen=True, slots=True)
class _Kill:
    owner: str
    key: str
    at_s: float  # time.monotonic(): one clock for every process on the host


def _describe_takeover(report: DemoReport, kill: _Kill) -> None:
    """Record who was killed holding which key, and who took that key over how soon."""
    report.killed, report.killed_key, report.killed_at_s = kill.owner, kill.key, kill.at_s
    successors = sorted(
        (
            h
            for h in report.holdings
            if h.key == kill.key and h.owner != kill.owner and h.start_s >= kill.at_s
        ),
        key=lambda h: h.start_s,
    )
    if successors:
        report.taken_over_by = successors[0].owner
        report.takeover_s = successors[0].start_s - kill.at_s


def _start_workers(
    provider: LeaseProvider, config: DemoConfig, owners: list[str], *, in_processes: bool
) -> dict[str, Any]:
    if not in_processes:
        return {
            owner: asyncio.create_task(_Worker(provider, owner, config).run()) for owner in owners
        }
    ctx = multiprocessing.get_context("spawn")
    runners: dict[str, Any] = {}
    for owner in owners:
        process = ctx.Process(target=_worker_process, args=(config, owner), daemon=True)
        process.start()
        runners[owner] = process
    return runners


async def _watch(
    provider: LeaseProvider,
    config: DemoConfig,
    runners: dict[str, Any],
    start: float,
    on_tick: Callable[[Views, float, str | None], None] | None,
) -> _Kill | None:
    """Show owners until the deadline; a third of the way in, kill a holder."""
    kill: _Kill | None = None
    kill_at = start + config.seconds / 3
    while time.monotonic() < config.deadline:
        await asyncio.sleep(0.25)
        views = {key: await provider.get_lease_owner(key) for key in config.key_names}
        if kill is None and time.monotonic() >= kill_at:
            kill = _kill_a_holder(views, runners)
        if on_tick is not None:
            on_tick(views, time.monotonic() - start, kill.owner if kill is not None else None)
    return kill


async def _join(runners: dict[str, Any], config: DemoConfig, killed: str | None) -> None:
    for owner, runner in runners.items():
        if isinstance(runner, asyncio.Task):
            with contextlib.suppress(asyncio.CancelledError):
                await runner
        else:
            # A worker finishes its current lease: at most a TTL and a few calls.
            await asyncio.to_thread(runner.join, 2 * config.ttl_ms / 1000 + 10)
            if runner.is_alive() and owner != killed:
                runner.kill()


def _kill_a_holder(views: Views, runners: dict[str, Any]) -> _Kill | None:
    """Kill one worker that holds a key right now, the way a crash or OOM kill would."""
    for key, owner in views.items():
        runner = runners.get(owner) if owner is not None else None
        if owner is None or runner is None:
            continue
        if isinstance(runner, asyncio.Task):
            runner.cancel()  # no finally-release in the worker: the lease is abandoned
        else:
            os.kill(runner.pid, signal.SIGKILL)
        return _Kill(owner, key, time.monotonic())
    return None


# -- the verdict -----------------------------------------------------------------------------


def _events(log_dir: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(log_dir.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line cut by the kill
                yield json.loads(line)


def judge(log_dir: Path, ttl_s: float) -> DemoReport:
    """Rebuild every worker's beliefs from its log and check exclusivity."""
    report = DemoReport()
    open_holds: dict[tuple[str, str], dict[str, Any]] = {}
    for event in _events(log_dir):
        kind = event["ev"]
        where = (event.get("key", ""), event.get("owner", ""))
        if kind == "hold":
            open_holds[where] = {**event, "last_grant": event["granted"]}
        elif kind == "renew" and where in open_holds:
            open_holds[where]["last_grant"] = event["granted"]
        elif kind == "end" and where in open_holds:
            hold = open_holds.pop(where)
            report.holdings.append(_holding(hold, event["end"], event["ended"]))
        elif kind == "stats":
            report.operations += event.get("operations", 0)
            report.acquired += event.get("acquired", 0)
            report.routed += event.get("routed", 0)
            report.handoffs += event.get("handoffs", 0)
            report.releases += event.get("releases", 0)
            report.denials += event.get("denials", 0)
            for name, count in event.items():
                if name.startswith("call:"):
                    method = name.removeprefix("call:")
                    report.calls[method] = report.calls.get(method, 0) + count
    report.renewals = report.calls.get("renew_lease", 0)
    report.lookups = report.calls.get("get_lease_owner", 0)
    # No "end": the worker died holding it, believing in it until the lease ran out.
    for hold in open_holds.values():
        report.holdings.append(_holding(hold, hold["last_grant"] + ttl_s, "killed"))
    report.overlaps, report.token_disorder = find_overlaps(report.holdings)
    by_key: dict[str, list[Holding]] = collections.defaultdict(list)
    for holding in report.holdings:
        by_key[holding.key].append(holding)
    for items in by_key.values():
        items.sort(key=lambda h: h.start_s)
        report.takeovers += sum(
            1 for before, after in itertools.pairwise(items) if before.ended == "killed"
        )
    return report


def _holding(hold: dict[str, Any], end: float, ended: str) -> Holding:
    return Holding(
        hold["key"], hold["owner"], hold["token"], hold["start"], end, hold["how"], ended
    )


def find_overlaps(
    holdings: list[Holding],
) -> tuple[list[tuple[Holding, Holding]], list[tuple[Holding, Holding]]]:
    """Per key: pairs of different owners overlapping in time, and pairs whose fencing
    tokens disagree with the order in which the holdings started."""
    overlaps: list[tuple[Holding, Holding]] = []
    disorder: list[tuple[Holding, Holding]] = []
    by_key: dict[str, list[Holding]] = collections.defaultdict(list)
    for holding in holdings:
        by_key[holding.key].append(holding)
    for items in by_key.values():
        items.sort(key=lambda h: h.start_s)
        for i, first in enumerate(items):
            for second in items[i + 1 :]:
                if second.start_s >= first.end_s:
                    break
                if second.owner != first.owner:
                    overlaps.append((first, second))
        tokened = sorted((h for h in items if h.token is not None), key=lambda h: h.token or 0)
        for earlier, later in itertools.pairwise(tokened):
            if later.token != earlier.token and later.start_s < earlier.start_s:
                disorder.append((earlier, later))
    return overlaps, disorder
