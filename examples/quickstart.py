"""leasekit in one screen: acquire, be denied and told the holder, hand over, release.

Run it from a checkout after ``pip install -e .``::

    python examples/quickstart.py

It uses the in-process ``memory://`` backend, so it needs no server. The same code
runs unchanged on any backend URL that ``leasekit.connect`` accepts.
"""

# ruff: noqa: T201  (an example program reports what it does by printing)

from __future__ import annotations

import asyncio

import leasekit

KEY = "thread-42"
TTL_MS = 30_000


async def main() -> None:
    async with leasekit.connect("memory://") as leases:
        # Worker A finds the thread free and becomes its owner, with a fencing token.
        first = await leases.acquire_lease(KEY, "worker-a", ttl_ms=TTL_MS)
        print(f"worker-a acquire: acquired={first.acquired} owner={first.owner}")

        # Worker B is denied and learns who to route its work to instead.
        second = await leases.acquire_lease(KEY, "worker-b", ttl_ms=TTL_MS)
        print(f"worker-b acquire: acquired={second.acquired} owner={second.owner}")

        # A finishes and hands the thread to B; the key is never free in between.
        handed = await leases.transfer_lease(KEY, "worker-a", "worker-b", ttl_ms=TTL_MS)
        print(f"transfer worker-a -> worker-b: {handed}")
        print(f"owner now: {await leases.get_lease_owner(KEY)}")

        # B re-acquires to learn its own fencing token: idempotent for the holder.
        mine = await leases.acquire_lease(KEY, "worker-b", ttl_ms=TTL_MS)
        assert first.token is not None
        assert mine.token is not None
        print(f"worker-b token is newer than worker-a's: {mine.token > first.token}")

        # A's lease is gone: it can no longer renew, and its release changes nothing.
        print(f"worker-a renew: {await leases.renew_lease(KEY, 'worker-a', ttl_ms=TTL_MS)}")
        await leases.release_lease(KEY, "worker-a")
        print(f"owner after worker-a's release: {await leases.get_lease_owner(KEY)}")

        await leases.release_lease(KEY, "worker-b")
        print(f"owner after worker-b's release: {await leases.get_lease_owner(KEY)}")


if __name__ == "__main__":
    asyncio.run(main())
