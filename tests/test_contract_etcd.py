"""The conformance suite against etcd: a single member and a three-member cluster.

The single member through both drivers: the async provider, and what
``leasekit.sync.connect`` opens (the backend's native blocking provider where it has
one, otherwise the facade running the async provider on its loop thread). Keys live
under a prefix of the test's own. Slow: etcd's TTLs are whole seconds with a 2 s
minimum, so every check that waits out a lease waits seconds.

The servers are this run's own (``tests/servers.py``) or ``$LEASEKIT_TEST_ETCD_URL``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from servers import EtcdCluster, missing_extra

import leasekit
import leasekit.sync

try:
    import aetcd  # noqa: F401 (the backend's dependency: skip cleanly without it)
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("etcd", "the etcd tests")

from leasekit_contract import BlockingLeaseProviderContract, LeaseProviderContract
from leasekit_etcd import EtcdLeaseProvider

pytestmark = pytest.mark.anyio


class TestEtcdContract(LeaseProviderContract):
    """The whole suite against the session's etcd (or $LEASEKIT_TEST_ETCD_URL).

    Slow as a whole: etcd's TTLs are whole seconds with a 2 s minimum, so each check
    that waits out a lease waits seconds, and the class takes minutes.
    """

    pytestmark = pytest.mark.slow

    @pytest.fixture
    async def provider(self, etcd_url: str, etcd_prefix: str) -> AsyncIterator[Any]:
        async with EtcdLeaseProvider.from_url(etcd_url, prefix=etcd_prefix) as provider:
            yield provider

    @pytest.fixture
    def provider_factory(self, etcd_url: str, etcd_prefix: str) -> Any:
        return functools.partial(leasekit.connect, etcd_url, prefix=etcd_prefix)

    @pytest.fixture
    def break_notifications(self) -> Any:
        async def cut(provider: EtcdLeaseProvider) -> None:
            await provider.break_notifications()

        return cut


class TestEtcdContractBlocking(BlockingLeaseProviderContract):
    """The whole suite through ``leasekit.sync.connect`` on the session's etcd."""

    pytestmark = pytest.mark.slow

    @pytest.fixture
    def blocking_factory(self, etcd_url: str, etcd_prefix: str) -> Any:
        return functools.partial(leasekit.sync.connect, etcd_url, prefix=etcd_prefix)


@pytest.mark.slow  # whole-second TTLs on three members: minutes for the class
class TestEtcdClusterContract(LeaseProviderContract):
    """The suite's table rows, fencing, races and model on three members.

    The tests that only wait out TTLs run on the single member (``TestEtcdContract``):
    expiry is the same etcd lease mechanism on one member or three, and waiting out
    whole-second TTLs again would double the time of this class.
    """

    test_reacquire_by_holder_resets_ttl_to_the_new_value = None
    test_denied_acquire_leaves_holders_ttl_alone = None
    test_release_by_non_owner_leaves_holders_ttl_alone = None
    test_renew_by_holder_resets_ttl_to_the_new_value = None
    test_renew_by_non_owner_returns_false_and_changes_nothing = None
    test_transfer_by_holder_sets_fresh_ttl_for_new_owner = None
    test_refused_transfer_leaves_holders_ttl_alone = None
    test_transfer_to_same_owner_behaves_like_renew = None
    test_lease_is_free_once_its_ttl_has_passed = None
    test_ttl_is_rounded_up_never_down = None
    test_acquire_after_expiry_by_new_owner_succeeds = None
    test_acquire_after_expiry_by_former_holder_starts_a_new_lease = None
    test_renew_after_expiry_returns_false_and_does_not_revive = None
    test_transfer_after_expiry_returns_false_and_does_not_revive = None
    test_fencing_tokens_increase_across_expiry = None
    test_churning_tasks_never_overlap_as_holders = None
    test_churning_processes_never_overlap_as_holders = None

    @pytest.fixture
    async def provider(self, etcd_cluster: EtcdCluster, etcd_prefix: str) -> AsyncIterator[Any]:
        async with EtcdLeaseProvider.from_url(etcd_cluster.url, prefix=etcd_prefix) as provider:
            yield provider

    @pytest.fixture
    def provider_factory(self, etcd_cluster: EtcdCluster, etcd_prefix: str) -> Any:
        return functools.partial(leasekit.connect, etcd_cluster.url, prefix=etcd_prefix)
