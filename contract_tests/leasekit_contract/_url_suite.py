"""The suite against whatever URL ``--leasekit-url`` names; collected by the plugin alone."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator

import pytest

import leasekit
from leasekit import LeaseProvider

from ._base import URL_KEY, ProviderFactory
from ._suite import LeaseProviderContract

__all__ = ["TestLeaseProviderAtURL"]


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
