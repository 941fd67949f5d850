"""``LeaseProviderContract``: every section of the suite in one mixin class."""

from __future__ import annotations

import anyio.to_thread

from leasekit import LeaseProvider

from ._base import ContractBase, Timing
from ._batch import BatchedRenewalChecks
from ._cancellation import CancellationChecks
from ._concurrency import ConcurrencyChecks
from ._expiry import ExpiryChecks
from ._fair import FairWaitingChecks
from ._fencing import FencingChecks
from ._input import InputChecks
from ._lifecycle import LifecycleChecks
from ._model import check_against_model
from ._notifications import NotificationChecks
from ._routing import RoutingChecks
from ._semantics import SemanticsChecks
from ._slots import SharedExclusiveChecks, SlotChecks

__all__ = ["LeaseProviderContract"]


class ModelChecks(ContractBase):
    """Random operation sequences against the reference model of the semantics table."""

    async def test_random_operation_sequences_match_the_reference_model(
        self, provider: LeaseProvider
    ) -> None:
        """A hypothesis state machine over three keys and three owners with long TTLs.

        Deterministic (``derandomize=True``, no example database). On failure the
        exception carries hypothesis's minimal failing sequence of operations.
        """
        t = Timing.of(provider)
        await anyio.to_thread.run_sync(check_against_model, provider, t.caps.fencing, t.long_ttl_ms)


# pytest collects the base-most class's tests first: listed in reverse reading order,
# the semantics table runs first and the slow concurrency checks near the end.
class LeaseProviderContract(
    FairWaitingChecks,
    SharedExclusiveChecks,
    SlotChecks,
    CancellationChecks,
    RoutingChecks,
    BatchedRenewalChecks,
    LifecycleChecks,
    NotificationChecks,
    ModelChecks,
    ConcurrencyChecks,
    FencingChecks,
    InputChecks,
    ExpiryChecks,
    SemanticsChecks,
):
    """The conformance suite for a lease backend: inherit it and override ``provider``.

    ::

        import functools, pytest, leasekit
        from leasekit_contract import LeaseProviderContract

        class TestMyBackend(LeaseProviderContract):
            @pytest.fixture
            async def provider(self):          # required: a fresh, open provider
                async with MyLeaseProvider(...) as p:
                    yield p

            @pytest.fixture
            def provider_factory(self):        # optional: new providers on the same store
                return functools.partial(leasekit.connect, "myscheme://...")

    Tests run on anyio's pytest plugin (installed with ``leasekit[test]``), on asyncio;
    override the ``anyio_backend`` fixture to run them on trio. The suite reads
    ``provider.capabilities`` (a :class:`leasekit.Capabilities`): sleeps scale with
    ``ttl_resolution_ms``/``min_ttl_ms``, fencing checks run when ``fencing=True``,
    the gapless-transfer check when ``atomic_transfer=True``, and the multi-process
    checks when ``shared_across_processes=True``. A declared capability that does not
    hold fails the test; it is never skipped. Every test uses keys under its own random
    prefix, so the suite can run against a shared live store.

    Sections: :class:`SemanticsChecks` (one test per row of the semantics table),
    :class:`ExpiryChecks`, :class:`InputChecks` (bad input, unusual names),
    :class:`FencingChecks`, :class:`ConcurrencyChecks` (races, transfer under fire,
    mutual exclusion under churn), :class:`ModelChecks` (stateful property test),
    :class:`NotificationChecks` (wake-ups on release, ``watch_owner``),
    :class:`LifecycleChecks` (closing), :class:`RoutingChecks` (metadata, records and
    grant hints, for backends that declare them), :class:`SlotChecks` and
    :class:`SharedExclusiveChecks` (counting leases and exclusive holders, for
    backends that declare ``slots``), :class:`FairWaitingChecks` (arrival order, for
    backends that declare ``fair_waiting``), :class:`BatchedRenewalChecks`
    (``renew_leases``, for backends that offer it; skipped otherwise) and
    :class:`CancellationChecks` (cancels at random points strand no key).
    """
