"""What a benchmark run is made of: scenarios, contenders, and what they measured.

Plain data and the two cycler protocols, nothing that runs: :mod:`._runner` times
the cycles, :mod:`._report` draws them, :mod:`._schemes` finds a scheme's
:class:`SchemeBench`. A backend writes its floor and peers against these types,
through their public names in :mod:`leasekit.bench`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

__all__ = [
    "DEFAULT_SCENARIOS",
    "DEFAULT_TTL_MS",
    "KEYS_PER_TASK",
    "SCENARIOS",
    "AsyncCycler",
    "BenchReport",
    "BenchTarget",
    "Contender",
    "ContenderResult",
    "HandoffPeer",
    "Role",
    "Scenario",
    "SchemeBench",
    "SyncCycler",
]

Role = Literal["leasekit", "floor", "peer"]

DEFAULT_TTL_MS = 30_000
"""Long enough that no lease expires mid-cycle: every cycle releases what it took."""

KEYS_PER_TASK = 16
"""Uncontended tasks cycle through this many keys of their own: consecutive cycles
use distinct keys, and the number of keys a run writes stays bounded."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """How many tasks run at once, and whether they share one key."""

    name: str
    label: str
    tasks: int
    shared_key: bool


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("single", "1 task", tasks=1, shared_key=False),
        Scenario("concurrent", "64 tasks", tasks=64, shared_key=False),
        Scenario("contended", "16 tasks, 1 key", tasks=16, shared_key=True),
        Scenario("parallel", "16 tasks", tasks=16, shared_key=False),
    )
}
"""The scenarios, in the order they run: sequential cycles on distinct keys; 64
concurrent tasks on distinct keys; 16 tasks racing for one key (acquisitions and
denials counted); 16 tasks on distinct keys (for sync contenders: 16 threads), run
only when asked for."""

DEFAULT_SCENARIOS = ("single", "concurrent", "contended")
"""What ``leasekit bench`` runs unless told otherwise."""


@dataclass(frozen=True, slots=True)
class BenchTarget:
    """What a contender needs to open: the store, the TTL, and this run's namespace.

    ``namespace`` (``leasekit-bench-<hex>``) is part of every key the run writes, so
    a scheme's cleanup can find and delete them, and two runs never collide.
    """

    url: str
    ttl_ms: int
    namespace: str


class AsyncCycler(Protocol):
    """An open async contender."""

    async def cycle(self, key: str, owner: str) -> bool:
        """Acquire ``key`` for ``owner`` without waiting, release it if acquired.

        Returns whether it was acquired.
        """
        ...

    async def aclose(self) -> None:
        """Close every client the cycler opened."""
        ...


class SyncCycler(Protocol):
    """An open blocking contender; ``cycle`` is called from several threads at once."""

    def cycle(self, key: str, owner: str) -> bool:
        """Acquire ``key`` for ``owner`` without waiting, release it if acquired."""
        ...

    def close(self) -> None:
        """Close every client the cycler opened."""
        ...


@dataclass(frozen=True, slots=True)
class Contender:
    """One way to take and give back a lease: leasekit, a raw-driver floor, or a peer.

    Exactly one of ``open_async`` and ``open_sync`` is set. ``requires`` names the
    top-level modules it imports; when one is missing the contender is skipped and
    the report shows ``install``, the command that adds it. ``how`` says in one line
    what a cycle does on the wire.
    """

    id: str
    label: str
    role: Role
    open_async: Callable[[BenchTarget], Coroutine[Any, Any, AsyncCycler]] | None = None
    open_sync: Callable[[BenchTarget], SyncCycler] | None = None
    requires: tuple[str, ...] = ()
    install: str = ""
    how: str = ""

    def __post_init__(self) -> None:
        if (self.open_async is None) == (self.open_sync is None):
            raise ValueError(f"contender {self.id!r}: set exactly one of open_async, open_sync")

    @property
    def mode(self) -> str:
        return "async" if self.open_async is not None else "sync, one thread per task"

    def missing(self) -> list[str]:
        """The required modules that are not installed."""
        return [name for name in self.requires if importlib.util.find_spec(name) is None]


@dataclass(frozen=True, slots=True)
class HandoffPeer:
    """A peer lock library in the handoff benchmark: how soon its waiter gets a released key.

    ``measure(target, handoffs)`` runs ``handoffs`` rounds of: a holder takes a lock
    on a key containing ``target.namespace``, a waiter blocks on it the library's own
    way, the holder releases at t0 and the waiter holds the lock at t1 (then releases
    it); it returns t1 - t0 of each round, in milliseconds. A blocking library runs
    in a thread (:func:`asyncio.to_thread`). ``requires`` and ``install`` are as for
    :class:`Contender`: a peer with a missing module is left out of the report.
    """

    label: str
    measure: Callable[[BenchTarget, int], Coroutine[Any, Any, list[float]]]
    requires: tuple[str, ...] = ()
    install: str = ""

    def missing(self) -> list[str]:
        """The required modules that are not installed."""
        return [name for name in self.requires if importlib.util.find_spec(name) is None]


@dataclass(frozen=True, slots=True)
class SchemeBench:
    """What a URL scheme adds to the benchmark beyond leasekit itself.

    ``contenders``: its raw-driver floor (role ``"floor"``, at most one) and peers.
    ``cleanup`` deletes what the run wrote (every name containing the target's
    namespace); ``describe_server`` names the server and its version for the report.
    ``handoff_peers``: the peer libraries the handoff scenario measures beside
    leasekit's notifications and polling.
    """

    contenders: tuple[Contender, ...] = ()
    cleanup: Callable[[BenchTarget], Coroutine[Any, Any, None]] | None = None
    describe_server: Callable[[BenchTarget], Coroutine[Any, Any, str | None]] | None = None
    handoff_peers: tuple[HandoffPeer, ...] = ()

    def __post_init__(self) -> None:
        ids = [contender.id for contender in self.contenders]
        if "leasekit" in ids or len(set(ids)) != len(ids):
            raise ValueError(f"contender ids must be unique and not 'leasekit', got {ids}")
        floors = [contender.id for contender in self.contenders if contender.role == "floor"]
        if len(floors) > 1:
            raise ValueError(f"a scheme has at most one floor, got {floors}")
        others = [c.id for c in self.contenders if c.role == "leasekit" and c.id != "leasekit-sync"]
        if others:
            # The runner adds leasekit itself; a scheme may list leasekit.bench.LEASEKIT_SYNC.
            raise ValueError(f"leasekit's own contenders are leasekit's, got {others}")


# -- results ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContenderResult:
    """One contender in one scenario.

    A cycle is a successful acquire followed by its release: ``cycles_per_s`` counts
    those. ``attempts`` also counts denied acquires (``denied``; only the contended
    scenario should have any). Latencies are per attempt, in milliseconds;
    ``cpu_us`` is the CPU time the whole benchmark process (client library, event
    loop, threads) spent per attempt: where it approaches the time per cycle, the
    client, not the server, is what limits the rate.
    ``ratio_to_floor`` is ``cycles_per_s`` over the floor's in the same scenario
    (``None`` without a floor). With several rounds, the numbers are those of the
    fastest round and ``round_cycles_per_s`` lists every round's. ``error`` is set,
    and the numbers are zero, when the contender failed.
    """

    contender: str
    label: str
    role: Role
    mode: str
    scenario: str
    tasks: int
    attempts: int = 0
    cycles: int = 0
    denied: int = 0
    seconds: float = 0.0
    cycles_per_s: float = 0.0
    denied_per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    cpu_us: float = 0.0
    ratio_to_floor: float | None = None
    round_cycles_per_s: tuple[float, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class BenchReport:
    """Everything one run measured, in the order contenders and scenarios ran.

    ``namespace`` is part of every key the run wrote (``leasekit-bench-<hex>``).
    """

    url: str
    scheme: str
    namespace: str
    server: str | None
    seconds: float
    warmup_s: float
    rounds: int
    ttl_ms: int
    scenarios: tuple[str, ...]
    results: tuple[ContenderResult, ...]
    contenders: tuple[dict[str, str], ...] = ()
    skipped: tuple[dict[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    machine: dict[str, Any] = field(default_factory=dict)

    def result(self, contender: str, scenario: str) -> ContenderResult | None:
        return next(
            (r for r in self.results if r.contender == contender and r.scenario == scenario),
            None,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; ``leasekit bench --json`` prints exactly this."""
        return {
            "url": self.url,
            "scheme": self.scheme,
            "namespace": self.namespace,
            "server": self.server,
            "seconds": self.seconds,
            "warmup_s": self.warmup_s,
            "rounds": self.rounds,
            "ttl_ms": self.ttl_ms,
            "machine": self.machine,
            "scenarios": [
                {"name": s, **{k: v for k, v in asdict(SCENARIOS[s]).items() if k != "name"}}
                for s in self.scenarios
            ],
            "contenders": list(self.contenders),
            "results": [asdict(r) for r in self.results],
            "skipped": list(self.skipped),
            "notes": list(self.notes),
        }
