"""``leasekit bench``: leasekit side by side with the raw driver and peer libraries.

One run, one server: every contender does acquire+release cycles in the same
scenarios, and the report gives cycles/s, p50/p99 latency per cycle and the ratio to
the raw-driver floor (the fewest round trips the driver needs for the same
guarantees). The package is generic and knows no backend: ``_model`` holds the data
(scenarios, contenders, results), ``_runner`` the timing loops, ``_report`` the
table and the JSON, ``_schemes`` the lookup of a scheme's floor and peers in the
``leasekit.bench`` entry-point group. Each backend ships its own bench module
(``leasekit_redis._bench``, ...), written against the public :mod:`leasekit.bench`
names and imported only when a URL of its scheme is benchmarked, so this package
costs nothing until ``leasekit bench`` runs.
"""

from __future__ import annotations

from ._model import (
    SCENARIOS,
    AsyncCycler,
    BenchReport,
    BenchTarget,
    Contender,
    ContenderResult,
    Scenario,
    SchemeBench,
    SyncCycler,
)
from ._peers import open_tooz
from ._report import render_json, render_table
from ._runner import LEASEKIT, LEASEKIT_SYNC, run_bench
from ._schemes import ENTRY_POINT_GROUP, register_scheme, scheme_bench

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
