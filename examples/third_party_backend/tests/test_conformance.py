"""Prove DictLeaseProvider implements the leasekit contract: one class, one fixture."""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from leasekit_contract import LeaseProviderContract
from leasekit_dictstore import DictLeaseProvider


@pytest.fixture
def store_name() -> str:
    """A named store of its own for each test; the suite's keys are unique anyway."""
    return f"conformance-{uuid.uuid4().hex}"


class TestDictLeaseProvider(LeaseProviderContract):
    @pytest.fixture
    async def provider(self, store_name: str) -> AsyncIterator[DictLeaseProvider]:
        async with DictLeaseProvider(store_name) as provider:
            yield provider

    # Optional: lets the suite open a second provider on the same store (fencing
    # tokens must continue across "reconnects").
    @pytest.fixture
    def provider_factory(self, store_name: str) -> Callable[[], DictLeaseProvider]:
        return functools.partial(DictLeaseProvider, store_name)
