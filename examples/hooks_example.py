"""Lease events: a plugin of your own next to the built-in logging plugin.

Run it from a checkout after ``pip install -e .``::

    python examples/hooks_example.py

Plugins are registered first, then the provider is connected: connect() adds event
emission only when a plugin is registered at that moment.
"""

# ruff: noqa: T201  (an example program reports what it does by printing)

from __future__ import annotations

import asyncio
import logging
import sys

import leasekit
import leasekit.plugins


class Handovers:
    """Tracks who holds what, from events alone: an audit trail, a dashboard feed."""

    def __init__(self) -> None:
        self.holders: dict[str, str] = {}

    # A hook takes only the arguments it needs, by name.
    @leasekit.hookimpl
    def leasekit_acquired(self, key: str, owner: str, token: int | None) -> None:
        self.holders[key] = owner
        print(f"audit: {owner} holds {key} (token {token})")

    @leasekit.hookimpl
    def leasekit_transferred(self, key: str, owner: str, to_owner: str) -> None:
        self.holders[key] = to_owner
        print(f"audit: {owner} handed {key} to {to_owner}")

    @leasekit.hookimpl
    def leasekit_released(self, key: str, owner: str) -> None:
        if self.holders.get(key) == owner:
            del self.holders[key]
        print(f"audit: {owner} released {key}")


async def main() -> None:
    # The logging plugin: one call. The fields also ride on each record as extras
    # (lease_event, lease_key, lease_owner, lease_latency_s, ...).
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter("log: %(levelname)s %(lease_event)s %(lease_key)s by %(lease_owner)s")
    )
    logging.getLogger("leasekit").addHandler(handler)
    logging.getLogger("leasekit").setLevel(logging.INFO)
    leasekit.plugins.enable_logging()

    audit = Handovers()
    leasekit.plugins.register(audit)

    async with leasekit.connect("memory://") as leases:
        await leases.acquire_lease("thread-1", "worker-a", ttl_ms=5_000)
        await leases.acquire_lease("thread-1", "worker-b", ttl_ms=5_000)  # denied
        async with leasekit.hold(leases, "thread-2", "worker-b", ttl_ms=5_000) as lease:
            await lease.transfer_to("worker-c")
        await leases.release_lease("thread-1", "worker-a")
    print(f"held now, by the audit's count: {audit.holders}")


if __name__ == "__main__":
    asyncio.run(main())
