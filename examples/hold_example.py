"""leasekit.hold(): hold a key while working, hand it over, stop when the lease is lost.

Run it from a checkout after ``pip install -e .``::

    python examples/hold_example.py

It uses ``memory://``; the same code runs on any backend URL.
"""

# ruff: noqa: T201  (an example program reports what it does by printing)

from __future__ import annotations

import asyncio
import logging
import sys

import leasekit

KEY = "thread-42"

# hold() logs renewal failures and losses as warnings when no event plugin is
# registered; show them here next to the program's own output.
logging.basicConfig(stream=sys.stdout, format="log: %(message)s", level=logging.WARNING)


async def main() -> None:
    async with leasekit.connect("memory://") as leases:
        # Owners are named for readable output; real programs give each holder a
        # unique id with leasekit.new_owner_id("worker"), see docs/hold.md.

        # Worker A holds the key; renewal every 100 ms keeps the 1 s lease alive.
        async with leasekit.hold(leases, KEY, "worker-a", ttl_ms=1000, renew_every_ms=100) as lease:
            print(f"worker-a holds {KEY} (token {lease.token})")

            # Worker B is refused and told whom to route its work to.
            try:
                async with leasekit.hold(leases, KEY, "worker-b", ttl_ms=600):
                    print("not reached")
            except leasekit.LeaseHeld as busy:
                print(f"worker-b: busy, route the work to {busy.holder}")

            await asyncio.sleep(1.5)  # work for longer than the TTL
            print(f"after 1.5 s of work the owner is still {await leases.get_lease_owner(KEY)}")

            # Done: hand the key to B without ever letting it go free.
            await lease.transfer_to("worker-b")
        print(f"after worker-a's block the owner is {await leases.get_lease_owner(KEY)}")

        # B holds it; then its lease is lost (here another worker takes it over, as if
        # B had stalled past its TTL). B's body is cancelled at the next renewal.
        try:
            async with leasekit.hold(
                leases, KEY, "worker-b", ttl_ms=600, renew_every_ms=100
            ) as lease:
                await leases.transfer_lease(KEY, "worker-b", "worker-c", ttl_ms=600)
                await asyncio.sleep(10)  # long work, interrupted
                print("not reached")
        except leasekit.LeaseLost:
            owner = await leases.get_lease_owner(KEY)
            print(f"worker-b stopped: lease lost ({lease.lost_reason}), owner now {owner}")

        # Worker D waits until C lets go: memory:// tells waiters of the release, so D
        # is woken by it instead of polling.
        async def finish_c() -> None:
            await asyncio.sleep(0.2)
            await leases.release_lease(KEY, "worker-c")

        finisher = asyncio.create_task(finish_c())
        result = await leasekit.wait_for(leases, KEY, "worker-d", ttl_ms=600, timeout_s=5)
        print(f"worker-d acquired {KEY} after waiting (token {result.token})")
        await finisher
        await leases.release_lease(KEY, "worker-d")


if __name__ == "__main__":
    asyncio.run(main())
