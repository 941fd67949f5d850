"""The suite against whatever URL ``--leasekit-url`` names; collected by the plugin alone.

Through both drivers: ``leasekit.connect(URL)``, and ``leasekit.sync.connect(URL)``
(what blocking callers get) through :class:`BlockingLeaseProviderContract`.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator

import pytest

import leasekit
import leasekit.sync
from leasekit import LeaseProvider

from ._base import URL_KEY, ProviderFactory
from ._blocking import BlockingLeaseProviderContract, BlockingProviderFactory
from ._suite import LeaseProviderContract

__all__ = ["TestLeaseProviderAtURL", "TestLeaseProviderAtURLBlocking"]


def _url(config: pytest.Config) -> str:
    url = config.stash.get(URL_KEY, None)
    if url is None:
        pytest.fail("run this suite with: pytest -p leasekit_contract --leasekit-url URL")
    return url


class TestLeaseProviderAtURL(LeaseProviderContract):
    """The conformance suite against ``leasekit.connect(URL)``."""

    @pytest.fixture
    async def provider(self, request: pytest.FixtureRequest) -> AsyncIterator[LeaseProvider]:
        async with leasekit.connect(_url(request.config)) as provider:
            yield provider

    @pytest.fixture
    def provider_factory(self, request: pytest.FixtureRequest) -> ProviderFactory:
        return functools.partial(leasekit.connect, _url(request.config))


class TestLeaseProviderAtURLBlocking(BlockingLeaseProviderContract):
    """The conformance suite against ``leasekit.sync.connect(URL)``, the blocking driver."""

    @pytest.fixture
    def blocking_factory(self, request: pytest.FixtureRequest) -> BlockingProviderFactory:
        return functools.partial(leasekit.sync.connect, _url(request.config))
