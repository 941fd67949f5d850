"""The public benchmark API: what a backend needs to join ``leasekit bench``.

``leasekit bench URL`` measures leasekit beside the URL's *raw-driver floor* (the
fewest round trips the driver needs for the same job, written by hand) and *peers*
(other lock libraries) in the same run. leasekit itself is measured for every
scheme; the floor and the peers come from the backend, as a :class:`SchemeBench`
declared in the ``leasekit.bench`` entry-point group under the URL scheme::

    [project.entry-points."leasekit.bench"]
    mystore = "leasekit_mystore._bench:BENCH"

Only the module of the scheme under test is imported, when it is benchmarked. Each
:class:`Contender` opens a cycler (:class:`AsyncCycler`, or :class:`SyncCycler` run
one thread per task) for a :class:`BenchTarget`; ``cycle(key, owner)`` acquires
``key`` without waiting and releases it if that worked. Build the floor from the
backend's own URL parser, so that every option means the same to the floor as to
the provider. ``docs/benchmarks.md`` walks through one; :func:`register_scheme`
plugs one in from code, and :func:`run_bench` runs a benchmark in process.
"""

from __future__ import annotations

from ._bench._leasekit import LEASEKIT, LEASEKIT_SYNC
from ._bench._model import (
    SCENARIOS,
    AsyncCycler,
    BenchReport,
    BenchTarget,
    Contender,
    ContenderResult,
    HandoffPeer,
    Scenario,
    SchemeBench,
    SyncCycler,
)
from ._bench._peers import open_tooz
from ._bench._report import render_json, render_table
from ._bench._runner import run_bench
from ._bench._schemes import ENTRY_POINT_GROUP, register_scheme, scheme_bench

__all__ = [
    "ENTRY_POINT_GROUP",
    "LEASEKIT",
    "LEASEKIT_SYNC",
    "SCENARIOS",
    "AsyncCycler",
    "BenchReport",
    "BenchTarget",
    "Contender",
    "ContenderResult",
    "HandoffPeer",
    "Scenario",
    "SchemeBench",
    "SyncCycler",
    "open_tooz",
    "register_scheme",
    "render_json",
    "render_table",
    "run_bench",
    "scheme_bench",
]
