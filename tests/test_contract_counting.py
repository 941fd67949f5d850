"""A counting lease of one slot is a lease: the whole conformance suite on ``counting()``.

``leasekit.counting(provider, limit=1)`` maps the five contract methods onto the slot
methods (``acquire_slot`` and the rest), so with one slot it must behave exactly as a
single-holder lease, fencing and concurrency included: the suite runs on it over
``memory://``, SQLite, PostgreSQL, MySQL/MariaDB and etcd (several processes too),
through the async provider and through ``leasekit.sync``. The slot semantics proper
(``limit`` > 1) are checked by the suite's ``SlotChecks`` on each backend (Redis
included).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from leasekit_contract import BlockingLeaseProviderContract, LeaseProviderContract

import leasekit
import leasekit.sync
from leasekit import CountingLeaseProvider


def one_slot(url: str) -> CountingLeaseProvider:
    """A provider for ``url`` seen as counting leases of one slot (picklable)."""
    return leasekit.counting(leasekit.connect(url), 1, close=True)


def one_slot_blocking(url: str) -> leasekit.sync.SyncLeaseProvider:
    return leasekit.sync.wrap(one_slot(url), close=True)


@pytest.fixture(params=["memory", "postgres", "mysql", "sqlite", "etcd"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://counting-{uuid.uuid4().hex}"
    if request.param == "postgres":
        server: str = request.getfixturevalue("postgres_url")
        table: str = request.getfixturevalue("postgres_table")
        return f"{server}{'&' if '?' in server else '?'}table={table}"
    if request.param == "mysql":
        server = request.getfixturevalue("mysql_url")
        table = request.getfixturevalue("mysql_table")
        return f"{server}{'&' if '?' in server else '?'}table={table}"
    if request.param == "etcd":
        etcd: str = request.getfixturevalue("etcd_url")
        return f"{etcd}?prefix={request.getfixturevalue('etcd_prefix')}"
    return f"sqlite:///{tmp_path}/counting.db"


class TestOneSlotIsALease(LeaseProviderContract):
    @pytest.fixture
    async def provider(self, url: str) -> AsyncIterator[CountingLeaseProvider]:
        async with one_slot(url) as provider:
            yield provider

    @pytest.fixture
    def provider_factory(self, url: str) -> Callable[[], CountingLeaseProvider]:
        return functools.partial(one_slot, url)


class TestOneSlotIsALeaseBlocking(BlockingLeaseProviderContract):
    @pytest.fixture
    def blocking_factory(self, url: str) -> Callable[[], leasekit.sync.SyncLeaseProvider]:
        return functools.partial(one_slot_blocking, url)
