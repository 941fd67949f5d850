"""The conformance suite against every backend in :mod:`leasekit_broken`; all must fail.

One test class per broken backend, named ``Test<Backend>``. The file is named so
that pytest never collects it by accident; ``tests/test_third_party.py`` runs it
explicitly and checks that each class fails the suite tests its backend's docstring
names.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from leasekit_broken import VARIANTS
from leasekit_contract import LeaseProviderContract
from leasekit_dictstore import DictLeaseProvider


@pytest.fixture
def store_name() -> str:
    return f"broken-{uuid.uuid4().hex}"


def _contract_class(backend: type[DictLeaseProvider]) -> type[LeaseProviderContract]:
    class Contract(LeaseProviderContract):
        @pytest.fixture
        async def provider(self, store_name: str) -> AsyncIterator[DictLeaseProvider]:
            async with backend(store_name) as provider:
                yield provider

        @pytest.fixture
        def provider_factory(self, store_name: str) -> Callable[[], DictLeaseProvider]:
            return functools.partial(backend, store_name)

    Contract.__name__ = Contract.__qualname__ = f"Test{backend.__name__}"
    return Contract


for _backend in VARIANTS:
    _class = _contract_class(_backend)
    globals()[_class.__name__] = _class
