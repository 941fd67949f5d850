"""The report of a run: a rich table for people, JSON for tools.

:meth:`BenchReport.to_json <leasekit.bench.BenchReport.to_json>` is the JSON form's
dict; :func:`render_json` its text, exactly what ``leasekit bench --json`` prints;
:func:`render_table` the table ``leasekit bench`` draws.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ._model import SCENARIOS, BenchReport

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["render_json", "render_table"]


def render_json(report: BenchReport) -> str:
    """The report as one line of JSON: :meth:`BenchReport.to_json`, serialized."""
    return json.dumps(report.to_json())


def render_table(report: BenchReport) -> Table:
    """The report as a rich table: one section per scenario, one row per contender."""
    from rich.markup import escape  # noqa: PLC0415 (rich loads only when a table is drawn)
    from rich.table import Table  # noqa: PLC0415

    contended = any(SCENARIOS[s].shared_key for s in report.scenarios)
    server = f" ({report.server})" if report.server else ""
    fastest = f", fastest of {report.rounds} rounds" if report.rounds > 1 else ""
    machine = report.machine
    table = Table(
        title=escape(
            f"leasekit bench {report.url}{server}: {report.seconds:g} s per scenario "
            f"after {report.warmup_s:g} s warmup{fastest}"
        ),
        title_justify="left",
        caption=escape(_caption(report, machine)),
        caption_justify="left",
    )
    table.add_column("scenario")
    table.add_column("contender")
    for name in ("cycles/s", "p50 ms", "p99 ms", "CPU us", "x floor"):
        table.add_column(name, justify="right")
    if contended:
        table.add_column("denied/s", justify="right")
    for scenario in report.scenarios:
        rows = [r for r in report.results if r.scenario == scenario]
        for index, r in enumerate(rows):
            first = SCENARIOS[scenario].label if index == 0 else ""
            name = escape(r.label)
            if r.role == "leasekit":
                name = f"[bold]{name}[/bold]"
            elif r.role == "floor":
                name = f"{name} [dim](floor)[/dim]"
            if r.error is not None:
                cells = [f"[red]failed: {escape(r.error)}[/red]", "", "", "", ""]
            else:
                ratio = "-" if r.ratio_to_floor is None else f"{r.ratio_to_floor:.2f}"
                cells = [
                    f"{r.cycles_per_s:,.0f}",
                    f"{r.p50_ms:.3f}",
                    f"{r.p99_ms:.3f}",
                    f"{r.cpu_us:,.0f}",
                    ratio,
                ]
            if contended:
                shows_denials = SCENARIOS[scenario].shared_key and r.error is None
                cells.append(f"{r.denied_per_s:,.0f}" if shows_denials else "")
            table.add_row(first, name, *cells, end_section=index == len(rows) - 1)
    return table


def _caption(report: BenchReport, machine: dict[str, Any]) -> str:
    lines = [
        "cycle = acquire without waiting + release; cycles/s counts successful cycles; "
        "latency and CPU us (this process's CPU time) per attempt; "
        "x floor = cycles/s over the raw driver's",
        "async contenders run asyncio tasks on one loop; sync ones one thread per task, "
        "sharing one client",
        f"{machine.get('python')} on {machine.get('cpu')} x{machine.get('cpus')}",
    ]
    lines.extend(
        f"floor ({c['label']}): {c['how']}" for c in report.contenders if c["role"] == "floor"
    )
    lines.extend(f"skipped {s['label']}: {s['reason']}" for s in report.skipped)
    lines.extend(report.notes)
    return "\n".join(lines)
