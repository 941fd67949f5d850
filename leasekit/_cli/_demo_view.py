"""How the demo looks: its live table and its closing report (rich is loaded only to draw)."""

from __future__ import annotations

from typing import Any

from .._demo import DemoReport, Holding, Views

__all__ = ["print_report", "render"]


def render(views: Views, elapsed_s: float, killed: str | None) -> Any:
    from rich.markup import escape  # noqa: PLC0415 (rich is loaded only when drawing)
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=f"leasekit demo  {elapsed_s:4.1f} s", title_justify="left", min_width=64)
    table.add_column("thread key")
    table.add_column("owner")
    # Keys and owners are user data: "[x]" in one must print as itself, not as markup.
    for key, owner in views.items():
        if owner is None:
            table.add_row(escape(key), "[dim]free[/dim]")
        elif owner == killed:
            table.add_row(escape(key), f"[red]{escape(owner)} (killed, expiring)[/red]")
        else:
            table.add_row(escape(key), f"[green]{escape(owner)}[/green]")
    if killed is not None:
        table.caption = escape(f"killed {killed} while it held a lease")
    return table


_SHOWN_VIOLATIONS = 10


def print_report(report: DemoReport, ttl_ms: int) -> None:
    calls = report.calls
    print()
    # A killed worker never writes its totals: its calls are not in these counts.
    survivors = "the workers" if report.killed is None else "the workers that were not killed"
    print(f"operations   {report.operations}   calls to the store by {survivors}:")
    print(
        f"               {calls.get('acquire_lease', 0)} acquires ({report.denials} denied: "
        "the key, or the place next in line for it, was held by another worker)"
    )
    print(f"               {report.renewals} renewals while working on a key")
    print(
        f"               {report.lookups} lookups (get_lease_owner: who owns a key, "
        "who is next in line)"
    )
    print(
        f"               {calls.get('transfer_lease', 0)} transfers, "
        f"{calls.get('release_lease', 0)} releases (of keys and of places in line)"
    )
    print(f"acquired     {report.acquired}   (keys won by an acquire; the rest were handed over)")
    print(f"routed       {report.routed}   (work sent to the current owner)")
    print(f"handoffs     {report.handoffs}   (transfers to a queued successor, never free)")
    print(f"takeovers    {report.takeovers}   (a killed owner's key taken after its TTL)")
    print(f"releases     {report.releases}   (keys let go with nobody next in line)")
    print(f"killed       {_describe_kill(report, ttl_ms)}")
    print(f"holdings     {len(report.holdings)}   (ownership intervals checked)")
    if report.exclusive:
        print("verdict      OK: zero overlapping ownerships")
        return
    print(
        f"verdict      VIOLATED: {len(report.overlaps)} overlapping ownerships, "
        f"{len(report.token_disorder)} fencing-token inversions"
    )
    origin = min(h.start_s for h in report.holdings)
    violations = report.overlaps + report.token_disorder
    for first, second in violations[:_SHOWN_VIOLATIONS]:
        print("  " + "  overlaps  ".join(_describe(h, origin) for h in (first, second)))
    if len(violations) > _SHOWN_VIOLATIONS:
        print(f"  and {len(violations) - _SHOWN_VIOLATIONS} more")


def _describe_kill(report: DemoReport, ttl_ms: int) -> str:
    if report.killed is None:
        return "nobody (no holder found in time)"
    held = f"{report.killed} while it held {report.killed_key}"
    if report.takeover_s is None:
        return f"{held}; nobody took {report.killed_key} over before the run ended"
    return (
        f"{held}; {report.taken_over_by} took it over {report.takeover_s:.2f} s later "
        f"(its TTL of {ttl_ms} ms ran out, then the next acquire won)"
    )


def _describe(holding: Holding, origin_s: float) -> str:
    token = f" #{holding.token}" if holding.token is not None else ""
    return (
        f"{holding.key}: {holding.owner}{token} "
        f"[{holding.start_s - origin_s:.3f}s, {holding.end_s - origin_s:.3f}s]"
    )
