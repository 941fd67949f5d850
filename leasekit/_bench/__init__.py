"""``leasekit bench``: leasekit side by side with the raw driver and peer libraries.

One run, one server: every contender does acquire+release cycles in the same
scenarios, and the report gives cycles/s, p50/p99 latency per cycle and the ratio to
the raw-driver floor (the fewest round trips the driver needs for the same
guarantees). ``_core`` holds what is generic (contenders, scenarios, the runner, the
report); each backend's floor and peers live in their own module (``_redis``,
``_sqlite``), imported only when a URL of that scheme is benchmarked, so this
package costs nothing until ``leasekit bench`` runs.
"""

from __future__ import annotations

from ._core import (
    SCENARIOS,
    AsyncCycler,
    BenchReport,
    BenchTarget,
    Contender,
    ContenderResult,
    Scenario,
    SchemeBench,
    SyncCycler,
    register_scheme,
    render_table,
    run_bench,
)

__all__ = [
    "SCENARIOS",
    "AsyncCycler",
    "BenchReport",
    "BenchTarget",
    "Contender",
    "ContenderResult",
    "Scenario",
    "SchemeBench",
    "SyncCycler",
    "register_scheme",
    "render_table",
    "run_bench",
]
