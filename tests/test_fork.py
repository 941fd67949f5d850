"""fork(): a provider built and used in the parent, then used by forked children.

Prefork servers (gunicorn ``--preload``, Celery's prefork pool, ``multiprocessing``)
build clients in the parent and fork. Every backend, async and blocking, with and
without a ``hold()`` running in the parent at the fork: the children finish (a child
that hangs is killed and reported), each key has exactly one winner (from what the
children were told and from the store), the parent's lease stays the parent's, and the
parent's provider still works after the fork.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import signal
import tempfile
import time
import traceback
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from faults import PATIENCE_S
from test_sync import backend_url

import leasekit
import leasekit.sync
from leasekit import LeaseProviderClosed

CHILDREN = 4
KEYS = 6
ROUNDS = 8
LONG_TTL_MS = 60_000

BACKENDS = ["sqlite", "redis", "postgres", "mysql", "etcd"]


def grpc_refuses(url: str) -> bool:
    """gRPC cannot run in a child forked after it started: etcd refuses, with the reason."""
    return url.startswith("etcd")


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, request, tmp_path)


def fork_child(work: Callable[[], Any]) -> tuple[int, int]:
    """Fork; the child runs ``work()`` and writes its JSON result (or traceback) to a pipe.

    A child still running shortly before :func:`collect` gives up on it writes every
    thread's stack (faulthandler) to a file the parent reads, so a hang says where.
    """
    read_fd, write_fd = os.pipe()
    stacks = tempfile.TemporaryFile()  # noqa: SIM115 (closed by collect)
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork() in a process with threads: that is the point.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover (the child's coverage is not collected)
        os.close(read_fd)
        faulthandler.dump_traceback_later(HANG_S - 2, file=stacks)
        code = 0
        try:
            payload = json.dumps({"ok": work()})
        except BaseException:  # reported to the parent, which fails the test
            payload = json.dumps({"error": traceback.format_exc()})
            code = 1
        with os.fdopen(write_fd, "w") as out:
            out.write(payload)
        os._exit(code)
    os.close(write_fd)
    _stacks[pid] = stacks
    return pid, read_fd


HANG_S = 3 * PATIENCE_S
_stacks: dict[int, Any] = {}


def _stacks_of(pid: int) -> str:
    stacks = _stacks.pop(pid, None)
    if stacks is None:
        return ""
    with stacks:
        stacks.seek(0)
        return stacks.read().decode(errors="replace")


def collect(children: list[tuple[int, int]]) -> list[Any]:
    """Each child's result; a child still running after the patience is killed: a hang."""
    deadline = time.monotonic() + HANG_S
    results: list[Any] = []
    hung: list[int] = []
    for pid, read_fd in children:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                hung.append(pid)
                status = -1
                break
            time.sleep(0.02)
        with os.fdopen(read_fd) as stream:
            text = stream.read()
        stacks = _stacks_of(pid)
        if pid in hung:
            results.append({"error": f"child {pid} hung; its threads:\n{stacks}"})
            continue
        results.append(json.loads(text) if text else {"error": f"child {pid} exited {status}"})
    errors = [result["error"] for result in results if "error" in result]
    assert not errors, "\n".join(errors)
    return [result["ok"] for result in results]


def winners_by_key(results: list[dict[str, list[Any]]]) -> dict[str, set[str]]:
    """Which owners were told they acquired each key (with a long TTL and no release)."""
    winners: dict[str, set[str]] = {}
    for result in results:
        for key, owner, _token in result["won"]:
            winners.setdefault(key, set()).add(owner)
    return winners


def url_of(leases: leasekit.sync.SyncLeaseProvider) -> str:
    return str(leases.backend)


def blocking_child(
    leases: leasekit.sync.SyncLeaseProvider, keys: list[str], parent_key: str, parent_owner: str
) -> dict[str, Any]:
    owner = leasekit.new_owner_id("child")
    won: list[Any] = []
    if grpc_refuses(url_of(leases)):
        with pytest.raises(LeaseProviderClosed, match="after the fork"):
            leases.acquire_lease(keys[0], owner, LONG_TTL_MS)
        return {"won": won}
    for _ in range(ROUNDS):
        for key in keys:
            result = leases.acquire_lease(key, owner, LONG_TTL_MS)
            if result.acquired:
                won.append((key, owner, result.token))
            assert leases.get_lease_owner(key) == result.owner
    # The parent's lease is not the child's: denied, and never released by the child.
    denied = leases.acquire_lease(parent_key, owner, LONG_TTL_MS)
    assert (denied.acquired, denied.owner) == (False, parent_owner)
    leases.release_lease(parent_key, owner)
    # hold() runs on a loop thread, which the child starts for itself.
    with leasekit.sync.hold(leases, f"{parent_key}-{owner}", owner, LONG_TTL_MS) as lease:
        assert not lease.lost.is_set()
    return {"won": won}


@pytest.mark.parametrize("hold_in_parent", [False, True], ids=["plain", "hold-in-parent"])
def test_forked_children_share_a_blocking_provider_opened_in_the_parent(
    url: str, hold_in_parent: bool
) -> None:
    keys = [f"fork-{uuid.uuid4().hex[:8]}-{index}" for index in range(KEYS)]
    parent_key = f"fork-parent-{uuid.uuid4().hex[:8]}"
    parent_owner = leasekit.new_owner_id("parent")
    with leasekit.sync.connect(url) as leases:
        warm = leases.acquire_lease(parent_key, parent_owner, LONG_TTL_MS)
        assert warm.acquired
        held = None
        if hold_in_parent:
            leases.release_lease(parent_key, parent_owner)
            held = leasekit.sync.hold(leases, parent_key, parent_owner, LONG_TTL_MS)
            held.__enter__()
        children = [
            fork_child(lambda: blocking_child(leases, keys, parent_key, parent_owner))
            for _ in range(CHILDREN)
        ]
        # The parent goes on working while the children run.
        for key in keys:
            leases.get_lease_owner(key)
        results = collect(children)
        winners = winners_by_key(results)
        assert sorted(winners) == ([] if grpc_refuses(url) else sorted(keys))
        for key, owners in winners.items():
            assert len(owners) == 1, f"{key} had {len(owners)} winners: {owners}"
            assert leases.get_lease_owner(key) == next(iter(owners))
        assert leases.get_lease_owner(parent_key) == parent_owner
        if held is not None:
            assert not held.lost.is_set()
            held.__exit__(None, None, None)
            assert leases.get_lease_owner(parent_key) is None


async def _async_child(
    provider: Any, keys: list[str], parent_key: str, parent_owner: str
) -> dict[str, Any]:
    owner = leasekit.new_owner_id("child")
    won: list[Any] = []
    if provider.backend == "etcd":
        with pytest.raises(LeaseProviderClosed, match="after the fork"):
            await provider.acquire_lease(keys[0], owner, LONG_TTL_MS)
        await provider.aclose()  # never touches the parent's channel
        return {"won": won}
    for _ in range(ROUNDS):
        results = await asyncio.gather(
            *(provider.acquire_lease(key, owner, LONG_TTL_MS) for key in keys)
        )
        for key, result in zip(keys, results, strict=True):
            if result.acquired:
                won.append((key, owner, result.token))
            assert await provider.get_lease_owner(key) == result.owner
    denied = await provider.acquire_lease(parent_key, owner, LONG_TTL_MS)
    assert (denied.acquired, denied.owner) == (False, parent_owner)
    async with leasekit.hold(provider, f"{parent_key}-{owner}", owner, LONG_TTL_MS) as lease:
        assert not lease.lost.is_set()
    await provider.aclose()  # closes the child's own connections, never the parent's
    return {"won": won}


def test_forked_children_share_an_async_provider_used_in_the_parent(url: str) -> None:
    keys = [f"fork-{uuid.uuid4().hex[:8]}-{index}" for index in range(KEYS)]
    parent_key = f"fork-parent-{uuid.uuid4().hex[:8]}"
    parent_owner = leasekit.new_owner_id("parent")
    provider = leasekit.connect(url)

    async def parent_first() -> None:
        await provider.__aenter__()
        assert (await provider.acquire_lease(parent_key, parent_owner, LONG_TTL_MS)).acquired

    asyncio.run(parent_first())
    children = [
        fork_child(lambda: asyncio.run(_async_child(provider, keys, parent_key, parent_owner)))
        for _ in range(CHILDREN)
    ]
    results = collect(children)
    winners = winners_by_key(results)
    assert sorted(winners) == ([] if grpc_refuses(url) else sorted(keys))
    for key, owners in winners.items():
        assert len(owners) == 1, f"{key} had {len(owners)} winners: {owners}"

    async def parent_after() -> None:
        # A new event loop in the parent (the first one is closed): the provider
        # builds new connections for it, and the children's aclose() closed none of ours.
        try:
            for key, owners in winners.items():
                assert await provider.get_lease_owner(key) == next(iter(owners))
            assert await provider.get_lease_owner(parent_key) == parent_owner
            await provider.release_lease(parent_key, parent_owner)
            assert await provider.get_lease_owner(parent_key) is None
        finally:
            await provider.aclose()

    asyncio.run(parent_after())


def test_a_provider_on_a_callers_own_client_refuses_to_work_in_a_forked_child(
    tmp_path: Path,
) -> None:
    from leasekit.backend import BackendProvider  # noqa: PLC0415

    provider = leasekit.connect(f"sqlite:///{tmp_path / 'own.db'}")
    assert isinstance(provider, BackendProvider)
    provider._rebuild = None  # as if built on a client the caller passed in

    async def use() -> str:
        try:
            await provider.get_lease_owner("k")
        except LeaseProviderClosed as exc:
            return str(exc)
        return "worked"

    asyncio.run(use())
    (message,) = collect([fork_child(lambda: asyncio.run(use()))])
    assert "another process" in message
    assert "after the fork" in message
    asyncio.run(provider.aclose())


def test_an_async_provider_works_on_a_new_event_loop_once_its_own_is_closed(url: str) -> None:
    """After ``asyncio.run()`` returns, the next one's calls work (they raised a bare
    ``RuntimeError: Event loop is closed`` on Redis, MySQL and etcd)."""
    provider = leasekit.connect(url)
    key, owner = f"loops-{uuid.uuid4().hex[:8]}", leasekit.new_owner_id("loops")

    async def first() -> None:
        await provider.__aenter__()
        assert (await provider.acquire_lease(key, owner, LONG_TTL_MS)).acquired

    async def second() -> None:
        try:
            assert await provider.get_lease_owner(key) == owner
            assert await provider.renew_lease(key, owner, LONG_TTL_MS)
            await provider.release_lease(key, owner)
            assert await provider.get_lease_owner(key) is None
        finally:
            await provider.aclose()

    asyncio.run(first())
    asyncio.run(second())
