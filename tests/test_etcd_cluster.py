"""The etcd backend on a three-member cluster: failover (the conformance suite on three
members is in ``test_contract_etcd.py``): a leader killed while a lease is held, a
member frozen with SIGSTOP, the quorum lost and restored.

What must hold through every fault: nobody but the holder ever holds the key, every
answer is right or a :class:`leasekit.LeaseBackendError` (never a wrong answer), errors
come within the operation's timeout, service resumes within a bounded time once a
quorum is back, and fencing tokens keep increasing. Bounds are generous (timeout plus
ten seconds); nothing here asserts on speed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest
from servers import EtcdCluster, missing_extra

import leasekit

try:
    import aetcd  # noqa: F401 (the backend's dependency: skip cleanly without it)
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("etcd", "the etcd tests")

from leasekit_etcd import EtcdLeaseProvider

pytestmark = pytest.mark.anyio

_T = TypeVar("_T")

TIMEOUT_S = 2.0
HELD_MS = 60_000  # long enough to outlive every fault below
PATIENCE_S = TIMEOUT_S + 10


# -- helpers -------------------------------------------------------------------------------


@pytest.fixture
async def holder_and_rival(
    private_etcd_cluster: EtcdCluster, etcd_prefix: str
) -> AsyncIterator[tuple[EtcdLeaseProvider, EtcdLeaseProvider]]:
    """Two providers on the private cluster, as two processes would have."""
    url = private_etcd_cluster.url
    async with (
        EtcdLeaseProvider.from_url(url, prefix=etcd_prefix, timeout_s=TIMEOUT_S) as holder,
        EtcdLeaseProvider.from_url(url, prefix=etcd_prefix, timeout_s=TIMEOUT_S) as rival,
    ):
        yield holder, rival


async def answered(call: Callable[[], Awaitable[_T]], within_s: float = PATIENCE_S) -> _T:
    """The first answer of ``call``, retried while it raises LeaseBackendError.

    Each failure must come within the timeout; the answer within ``within_s``.
    """
    deadline = time.monotonic() + within_s
    while True:
        started = time.monotonic()
        try:
            return await call()
        except leasekit.LeaseBackendError:
            assert time.monotonic() - started < TIMEOUT_S + 10
            assert time.monotonic() < deadline, f"no answer within {within_s:g} s"
            await anyio_sleep(0.1)


async def anyio_sleep(seconds: float) -> None:
    import anyio  # noqa: PLC0415

    await anyio.sleep(seconds)


async def check_exclusive(
    holder: EtcdLeaseProvider, rival: EtcdLeaseProvider, key: str, *, until: float
) -> int:
    """Until ``until`` (monotonic), the rival never acquires and the holder keeps it;
    errors are allowed, wrong answers are not. Returns how many calls were answered."""
    answers = 0
    while time.monotonic() < until:
        for call, check in [
            (lambda: rival.acquire_lease(key, "rival", HELD_MS), _denied_to_rival),
            (lambda: rival.get_lease_owner(key), _is_holder),
            (lambda: holder.get_lease_owner(key), _is_holder),
        ]:
            started = time.monotonic()
            try:
                result = await call()
            except leasekit.LeaseBackendError:
                assert time.monotonic() - started < TIMEOUT_S + 10
                continue
            check(result)
            answers += 1
        await anyio_sleep(0.05)
    return answers


def _denied_to_rival(result: object) -> None:
    assert result == leasekit.LeaseResult(False, "holder", None), result


def _is_holder(result: object) -> None:
    assert result == "holder", result


# -- failover ------------------------------------------------------------------------------


async def test_a_lease_is_held_through_a_leader_kill(
    private_etcd_cluster: EtcdCluster,
    holder_and_rival: tuple[EtcdLeaseProvider, EtcdLeaseProvider],
) -> None:
    holder, rival = holder_and_rival
    granted = await holder.acquire_lease("k", "holder", HELD_MS)
    assert granted.token is not None
    leader = private_etcd_cluster.wait_healthy()
    leader.kill()
    killed_at = time.monotonic()
    # The two left elect a new leader; meanwhile nobody else gets the key.
    answers = await check_exclusive(holder, rival, "k", until=killed_at + 3)
    assert await answered(lambda: holder.renew_lease("k", "holder", HELD_MS))
    assert time.monotonic() - killed_at < PATIENCE_S
    assert answers > 0
    assert await answered(lambda: holder.acquire_lease("k", "holder", HELD_MS)) == granted
    assert await answered(lambda: rival.get_lease_owner("k")) == "holder"
    # Writes work on the new leader; tokens keep increasing.
    assert await answered(lambda: holder.transfer_lease("k", "holder", "next", HELD_MS))
    moved = await answered(lambda: rival.acquire_lease("k", "next", HELD_MS))
    assert moved.token is not None
    assert moved.token > granted.token
    # The killed member comes back and catches up.
    leader.start()
    private_etcd_cluster.wait_healthy()
    await answered(lambda: rival.release_lease("k", "next"))
    assert await answered(lambda: holder.get_lease_owner("k")) is None


async def test_a_frozen_member_is_skipped(
    private_etcd_cluster: EtcdCluster,
    holder_and_rival: tuple[EtcdLeaseProvider, EtcdLeaseProvider],
) -> None:
    holder, rival = holder_and_rival
    granted = await holder.acquire_lease("k", "holder", HELD_MS)
    assert granted.token is not None
    # Both providers talk to the first endpoint so far: freeze exactly that member.
    frozen = private_etcd_cluster.members[0]
    frozen.pause()
    try:
        paused_at = time.monotonic()
        await check_exclusive(holder, rival, "k", until=paused_at + 2)
        # Once a call has timed out on it, the frozen member is no longer first choice.
        assert await answered(lambda: holder.renew_lease("k", "holder", HELD_MS))
        assert await answered(lambda: rival.get_lease_owner("k")) == "holder"
        assert time.monotonic() - paused_at < PATIENCE_S + TIMEOUT_S
        # And from now on every call is answered, by the other two.
        for _ in range(5):
            assert await rival.acquire_lease("k", "rival", HELD_MS) == leasekit.LeaseResult(
                False, "holder", None
            )
            assert await holder.renew_lease("k", "holder", HELD_MS)
        assert await holder.transfer_lease("k", "holder", "next", HELD_MS)
        moved = await rival.acquire_lease("k", "next", HELD_MS)
        assert moved.token is not None
        assert moved.token > granted.token
    finally:
        frozen.resume()
    private_etcd_cluster.wait_healthy()
    await answered(lambda: rival.release_lease("k", "next"))


@pytest.mark.slow  # waits out timeouts and a restart
async def test_lost_quorum_is_typed_errors_and_a_restored_one_resumes(
    private_etcd_cluster: EtcdCluster,
    holder_and_rival: tuple[EtcdLeaseProvider, EtcdLeaseProvider],
) -> None:
    holder, rival = holder_and_rival
    granted = await holder.acquire_lease("k", "holder", HELD_MS)
    assert granted.token is not None
    leader = private_etcd_cluster.wait_healthy()
    # The survivor must be running: wait_healthy() looks only at live members, and a
    # member that died unseen would leave no one to answer "no leader" below.
    live = private_etcd_cluster.live_members()
    down = [m for m in private_etcd_cluster.members if m not in live]
    assert not down, "\n".join(f"{m.member_name}: {m.log_tail(20)}" for m in down)
    follower = next(m for m in private_etcd_cluster.members if m is not leader)
    survivor = next(m for m in private_etcd_cluster.members if m not in (leader, follower))
    leader.kill()
    follower.kill()
    # One member of three: no quorum. Every call fails, typed, within the timeout;
    # none may answer, since any answer would not be linearizable.
    for call in (
        lambda: rival.acquire_lease("k", "rival", HELD_MS),
        lambda: rival.get_lease_owner("k"),
        lambda: holder.renew_lease("k", "holder", HELD_MS),
        lambda: holder.acquire_lease("k", "holder", HELD_MS),
        lambda: holder.transfer_lease("k", "holder", "next", HELD_MS),
        lambda: holder.release_lease("k", "holder"),
        lambda: rival.acquire_lease("free", "rival", HELD_MS),
    ):
        started = time.monotonic()
        with pytest.raises(leasekit.LeaseBackendError) as info:
            await call()
        assert time.monotonic() - started < TIMEOUT_S + 10
        assert info.value.backend == "etcd"
        # One member still answers ("no leader"): the cluster is not unreachable, it
        # cannot decide; a timeout, or a write cut off by the kill (outcome unknown).
        assert not isinstance(info.value, leasekit.LeaseBackendUnreachable), (
            info.value,
            f"survivor {survivor!r}",  # running, or ended by something else?
            survivor.log_tail(10),
        )
    # Quorum back: the cluster heals and service resumes.
    leader.start()
    follower.start()
    restored_at = time.monotonic()
    private_etcd_cluster.wait_healthy()
    owner = await answered(lambda: rival.get_lease_owner("k"))
    assert time.monotonic() - restored_at < PATIENCE_S + 30
    # The writes refused above changed nothing, or (a transfer or release whose
    # outcome was unknown) exactly what they were asked to.
    assert owner in ("holder", "next", None)
    current = owner or "rival"
    if owner is None:
        assert (await answered(lambda: rival.acquire_lease("k", "rival", HELD_MS))).acquired
    after = await answered(lambda: rival.acquire_lease("k", current, HELD_MS))
    assert after.acquired
    assert after.token is not None
    assert after.token >= granted.token
    assert await answered(lambda: holder.transfer_lease("k", current, "last", HELD_MS))
    last = await answered(lambda: holder.acquire_lease("k", "last", HELD_MS))
    assert last.token is not None
    assert last.token > after.token
