"""Deliberately broken lease backends: the conformance suite must fail every one of them.

Each class is :class:`leasekit_dictstore.DictLeaseProvider` with one mistake a real
backend author makes, written the way it tends to be written (a missing condition in
a script, a per-row counter, a read then a write). The docstring of each says what
it breaks and which suite tests catch it; ``tests/test_third_party.py`` runs the
suite against each (through ``contract_against_broken.py``) and checks exactly that.
Three of them (a denied acquire or a refused transfer that touches the holder's TTL,
and NUL stripped from keys) slipped past the first version of the suite; the checks
that catch them were added because of them.

Never use these for anything else.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

from leasekit_dictstore import DictLeaseProvider, _deadline, _DictStore, _Lease

from leasekit import (
    MAX_TTL_MS,
    Capabilities,
    LeaseResult,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)

__all__ = [
    "VARIANTS",
    "AcloseCancelsInFlight",
    "CheckThenSetAcquire",
    "CloseIsNoop",
    "ClosedRaisesDriverError",
    "DeniedAcquireExtendsHolder",
    "DeniedAcquireLeaksToken",
    "DeniedAcquireReportsCaller",
    "DeniedAcquireReportsNone",
    "ExpiredReacquireKeepsToken",
    "IgnoresTtl",
    "NoValidation",
    "NonAtomicTransfer",
    "OwnerAsBytes",
    "OwnerVisibleAfterExpiry",
    "PerKeyTokenCounter",
    "ReacquireIssuesNewToken",
    "ReacquireKeepsOldExpiry",
    "RefusedTransferResetsHolderTtl",
    "ReleaseWithoutOwnerCheck",
    "RenewAfterExpiry",
    "RenewNeverShortens",
    "RenewReturnsInt",
    "StripsNulFromKeys",
    "TokenCounterPerProvider",
    "TransferAfterExpiry",
    "TransferKeepsToken",
    "TransferSkipsToOwnerValidation",
    "TtlRoundedDown",
]


_T = TypeVar("_T")


class ReleaseWithoutOwnerCheck(DictLeaseProvider):
    """Release deletes the key whoever asks: a plain ``DEL`` instead of check-and-delete.

    Breaks "release by anyone else never disturbs the holder". Caught by
    ``test_release_by_non_owner_leaves_holder_in_place`` (and the reference-model
    test).
    """

    async def release_lease(self, key: str, owner: str) -> None:
        validate_key(key)
        validate_owner(owner)
        store = self._open_store()
        with store.lock:
            store.leases.pop(key, None)


class ReacquireIssuesNewToken(DictLeaseProvider):
    """Re-acquiring one's own lease grants a new lease, with a new fencing token.

    Breaks "same-owner re-acquire keeps the token". Caught by
    ``test_reacquire_by_holder_succeeds_and_keeps_token`` and
    ``test_fencing_token_is_kept_by_reacquire_renew_and_self_transfer``.
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        store = self._open_store()
        with store.lock:
            now = time.monotonic()
            lease = store.live(key, now)
            if lease is not None and lease.owner != owner:
                return LeaseResult(False, lease.owner, None)
            lease = store.grant(key, owner, ttl_ms, now)
            return LeaseResult(True, owner, lease.token)


class RenewAfterExpiry(DictLeaseProvider):
    """Renew checks the owner but not the expiry (``UPDATE ... WHERE owner = $1``).

    An expired lease comes back to life for its old owner. Breaks "renew after expiry
    returns False, nothing changes". Caught by
    ``test_renew_after_expiry_returns_false_and_does_not_revive``.
    """

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        store = self._open_store()
        with store.lock:
            lease = store.leases.get(key)
            if lease is None or lease.owner != owner:
                return False
            lease.expires_at = _deadline(time.monotonic(), ttl_ms)
            return True


class NonAtomicTransfer(DictLeaseProvider):
    """Transfer is release-then-acquire, yet the class still declares ``atomic_transfer``.

    Between the two steps (a network round trip in a real backend, an
    ``asyncio.sleep(0)`` here) the key is free and a racing acquirer takes it. Breaks
    the declared capability. Caught by ``test_transfer_never_lets_racing_acquirers_in``
    and ``test_transfer_under_racing_acquirers_hands_over_or_fails_cleanly``.
    """

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        if to_owner == from_owner:
            return await self.renew_lease(key, from_owner, ttl_ms)
        if await self.get_lease_owner(key) != from_owner:
            return False
        await self.release_lease(key, from_owner)
        await asyncio.sleep(0)
        return (await self.acquire_lease(key, to_owner, ttl_ms)).acquired


class DeniedAcquireReportsCaller(DictLeaseProvider):
    """A denied acquire names the caller instead of the holder.

    Breaks "acquire of a key held by another returns the holder": callers route
    follow-up work to themselves. Caught by
    ``test_acquire_held_key_is_denied_and_names_holder`` (and every test that checks
    a denial).
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        result = await super().acquire_lease(key, owner, ttl_ms)
        return result if result.acquired else LeaseResult(False, owner, None)


class DeniedAcquireReportsNone(DictLeaseProvider):
    """A denied acquire reports no holder (``owner=None``) although one is live.

    The contract allows ``None`` only when the holder expired in between. Caught by
    ``test_acquire_held_key_is_denied_and_names_holder`` (and every test that checks
    a denial).
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        result = await super().acquire_lease(key, owner, ttl_ms)
        return result if result.acquired else LeaseResult(False, None, None)


class DeniedAcquireLeaksToken(DictLeaseProvider):
    """A denied acquire returns the holder's fencing token.

    A loser holding the winner's token can write past the fence. Breaks "denied:
    ``LeaseResult(False, holder, None)``". Caught by
    ``test_acquire_held_key_is_denied_and_names_holder`` (and every test that checks
    a denial).
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        result = await super().acquire_lease(key, owner, ttl_ms)
        if result.acquired:
            return result
        lease = self._open_store().leases[key]
        return LeaseResult(False, result.owner, lease.token)


class PerKeyTokenCounter(DictLeaseProvider):
    """Fencing tokens count per key, in the lease record, so release resets them.

    The Redis ``HINCRBY`` on the lease hash or the SQL ``token = leases.token + 1``
    mistake: once the record is deleted (release), the next acquire starts at 1
    again. Breaks "tokens strictly increase per key, even after release". Caught by
    ``test_fencing_tokens_increase_across_release_and_reacquire`` and
    ``test_fencing_tokens_continue_after_reconnecting``.
    """

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        if name is None:
            self._store = _PerKeyTokenStore()
        else:
            self._store = _per_key_stores.setdefault(name, _PerKeyTokenStore())


class _PerKeyTokenStore(_DictStore):
    def grant(self, key: str, owner: str, ttl_ms: int, now: float) -> _Lease:
        previous = self.leases.get(key)
        token = 1 if previous is None else previous.token + 1
        lease = _Lease(owner, token, _deadline(now, ttl_ms))
        self.leases[key] = lease
        return lease


_per_key_stores: dict[str, _PerKeyTokenStore] = {}


class NoValidation(DictLeaseProvider):
    """No argument is validated: empty keys, ``ttl_ms=True``, ``ttl_ms=0`` go to the store.

    Breaks "invalid arguments raise InvalidLeaseArgument before any I/O". Caught by
    ``test_invalid_argument_is_refused_and_nothing_changes`` (every case).
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        store = self._open_store()
        now = time.monotonic()
        lease = store.live(key, now)
        if lease is None:
            lease = store.grant(key, owner, ttl_ms, now)
        elif lease.owner == owner:
            lease.expires_at = _deadline(now, ttl_ms)
        else:
            return LeaseResult(False, lease.owner, None)
        return LeaseResult(True, owner, lease.token)

    async def get_lease_owner(self, key: str) -> str | None:
        lease = self._open_store().live(key, time.monotonic())
        return None if lease is None else lease.owner

    async def release_lease(self, key: str, owner: str) -> None:
        store = self._open_store()
        lease = store.live(key, time.monotonic())
        if lease is not None and lease.owner == owner:
            del store.leases[key]

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        store = self._open_store()
        now = time.monotonic()
        lease = store.live(key, now)
        if lease is None or lease.owner != owner:
            return False
        lease.expires_at = _deadline(now, ttl_ms)
        return True

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        store = self._open_store()
        now = time.monotonic()
        lease = store.live(key, now)
        if lease is None or lease.owner != from_owner:
            return False
        if to_owner == from_owner:
            lease.expires_at = _deadline(now, ttl_ms)
        else:
            store.grant(key, to_owner, ttl_ms, now)
        return True


class TransferSkipsToOwnerValidation(DictLeaseProvider):
    """Transfer validates everything but ``to_owner``, so it hands the key to ``""``.

    Breaks "every argument of every method is validated; nothing is written on bad
    input". Caught by ``test_invalid_argument_is_refused_and_nothing_changes`` (the
    ``transfer_lease-to_owner-*`` cases).
    """

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_ttl_ms(ttl_ms)
        store = self._open_store()
        with store.lock:
            now = time.monotonic()
            lease = store.live(key, now)
            if lease is None or lease.owner != from_owner:
                return False
            if to_owner == from_owner:
                lease.expires_at = _deadline(now, ttl_ms)
            else:
                store.grant(key, to_owner, ttl_ms, now)
            return True


class IgnoresTtl(DictLeaseProvider):
    """Every lease lasts the maximum TTL whatever ``ttl_ms`` says (a forgotten ``PX``).

    A crashed holder's key is never freed. Breaks expiry. Caught by
    ``test_lease_is_free_once_its_ttl_has_passed`` (and every other test that waits
    for an expiry).
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_ttl_ms(ttl_ms)
        return await super().acquire_lease(key, owner, MAX_TTL_MS)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_ttl_ms(ttl_ms)
        return await super().renew_lease(key, owner, MAX_TTL_MS)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_ttl_ms(ttl_ms)
        return await super().transfer_lease(key, from_owner, to_owner, MAX_TTL_MS)


class OwnerVisibleAfterExpiry(DictLeaseProvider):
    """``get_lease_owner`` reads the record without comparing its expiry.

    Breaks "get_lease_owner returns None when expired". Caught by
    ``test_lease_is_free_once_its_ttl_has_passed`` (and every other test that waits
    for an expiry).
    """

    async def get_lease_owner(self, key: str) -> str | None:
        validate_key(key)
        store = self._open_store()
        with store.lock:
            lease = store.leases.get(key)
            return None if lease is None else lease.owner


class ReacquireKeepsOldExpiry(DictLeaseProvider):
    """Re-acquiring one's own lease answers True but leaves the old expiry in place.

    The ``SET NX`` fails, the code sees the caller already holds the key and returns
    without ``PEXPIRE``. Breaks "idempotent: TTL reset to ttl_ms". Caught by
    ``test_reacquire_by_holder_resets_ttl_to_the_new_value``.
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        store = self._open_store()
        with store.lock:
            lease = store.live(key, time.monotonic())
            if lease is not None and lease.owner == owner:
                return LeaseResult(True, owner, lease.token)
        return await super().acquire_lease(key, owner, ttl_ms)


class TransferKeepsToken(DictLeaseProvider):
    """Transfer rewrites the owner in place, so the new holder inherits the old token.

    The old holder's in-flight writes then carry the same token as the new holder's.
    Breaks "fencing: every successful transfer gets a strictly greater token". Caught
    by ``test_fencing_tokens_increase_across_transfers`` and
    ``test_transfer_by_holder_hands_lease_to_new_owner``.
    """

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        store = self._open_store()
        with store.lock:
            now = time.monotonic()
            lease = store.live(key, now)
            if lease is None or lease.owner != from_owner:
                return False
            lease.owner = to_owner
            lease.expires_at = _deadline(now, ttl_ms)
            return True


class RenewNeverShortens(DictLeaseProvider):
    """Renew keeps the later of the old and the new expiry (``GREATEST(...)`` in SQL).

    Breaks "renew: TTL reset to ttl_ms": a holder renewing with a shorter TTL keeps
    the longer lease. Caught by ``test_renew_by_holder_resets_ttl_to_the_new_value``
    (it renews with a shorter TTL and waits for the expiry).
    """

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        store = self._open_store()
        with store.lock:
            now = time.monotonic()
            lease = store.live(key, now)
            if lease is None or lease.owner != owner:
                return False
            lease.expires_at = max(lease.expires_at, _deadline(now, ttl_ms))
            return True


class TransferAfterExpiry(DictLeaseProvider):
    """Transfer checks the owner but not the expiry, so an expired holder can hand on.

    Breaks "transfer after expiry returns False, nothing changes". Caught by
    ``test_transfer_after_expiry_returns_false_and_does_not_revive``.
    """

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_key(key)
        validate_owner(from_owner, "from_owner")
        validate_owner(to_owner, "to_owner")
        validate_ttl_ms(ttl_ms)
        store = self._open_store()
        with store.lock:
            now = time.monotonic()
            lease = store.leases.get(key)
            if lease is None or lease.owner != from_owner:
                return False
            if to_owner == from_owner:
                lease.expires_at = _deadline(now, ttl_ms)
            else:
                store.grant(key, to_owner, ttl_ms, now)
            return True


class CheckThenSetAcquire(DictLeaseProvider):
    """Acquire reads the holder, then writes unconditionally: two round trips, no ``NX``.

    Tasks racing for a free key all see it free and all "win". Breaks "exactly one
    winner". Caught by ``test_racing_tasks_get_exactly_one_winner_per_round``.
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        holder = await self.get_lease_owner(key)
        if holder == owner:
            return await super().acquire_lease(key, owner, ttl_ms)
        if holder is not None:
            return LeaseResult(False, holder, None)
        await asyncio.sleep(0)
        store = self._open_store()
        with store.lock:
            lease = store.grant(key, owner, ttl_ms, time.monotonic())
            return LeaseResult(True, owner, lease.token)


class CloseIsNoop(DictLeaseProvider):
    """``aclose()`` does nothing, so a closed provider keeps serving.

    Breaks "operations after close raise LeaseProviderClosed". Caught by
    ``test_operations_after_aclose_raise_lease_error`` and
    ``test_leaving_async_with_closes_the_provider``.
    """

    async def aclose(self) -> None:
        pass


class ClosedRaisesDriverError(DictLeaseProvider):
    """After close, operations fail with the "driver's" error instead of a LeaseError.

    ``aclose()`` closes the "connection" itself instead of calling the toolkit's, so the
    provider never refuses a call and the next one reaches a closed client. Breaks
    "operations after close raise a LeaseError, not a driver error". Caught by
    ``test_operations_after_aclose_raise_lease_error`` and
    ``test_leaving_async_with_closes_the_provider``.
    """

    _disconnected = False

    async def aclose(self) -> None:
        self._disconnected = True

    def _open_store(self) -> _DictStore:
        if self._disconnected:
            raise RuntimeError("connection is closed")
        return self._store


class AcloseCancelsInFlight(DictLeaseProvider):
    """``aclose()`` cancels the operations in flight instead of letting them finish.

    Each operation waits for a simulated round trip; closing cancels the tasks that
    wait, so their callers get a bare ``CancelledError`` nobody asked for (what the
    etcd backend once did). Breaks "in-flight operations finish or raise a
    LeaseError". Caught by ``test_aclose_with_operations_in_flight_settles_every_caller``.
    """

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self._waiting: set[asyncio.Task[object]] = set()

    async def _run(self, operation: Callable[..., _T], *args: Any) -> _T:
        task = asyncio.current_task()
        assert task is not None
        self._waiting.add(task)
        try:
            await asyncio.sleep(0.05)  # the round trip to the store
        finally:
            self._waiting.discard(task)
        return await super()._run(operation, *args)

    async def aclose(self) -> None:
        for task in self._waiting:
            task.cancel()
        await super().aclose()


class TokenCounterPerProvider(DictLeaseProvider):
    """Fencing tokens come from a counter in the provider object, not in the store.

    Every test on one connection passes; a restarted process (a new provider on the
    same store) issues tokens from 1 again. Breaks "tokens increase even after
    restarts". Caught by ``test_fencing_tokens_continue_after_reconnecting`` (only
    when the test class provides ``provider_factory``).
    """

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self._store = _ClientCountedStore(self._store)


class _ClientCountedStore(_DictStore):
    """A shared store's leases, with a token counter of this view's own."""

    def __init__(self, shared: _DictStore) -> None:
        super().__init__()
        self.leases = shared.leases
        self.lock = shared.lock


class ExpiredReacquireKeepsToken(DictLeaseProvider):
    """Acquire treats "the record names me" as idempotent even when the lease expired.

    The SQL ``ON CONFLICT ... SET token = CASE WHEN owner = $owner THEN token ...``
    that forgets the expiry: a holder whose lease lapsed (and whose stale writes may
    still be in flight) gets the same token back. Breaks "once expired, acquiring
    again starts a new lease with a greater token". Caught by
    ``test_acquire_after_expiry_by_former_holder_starts_a_new_lease`` and
    ``test_fencing_tokens_increase_across_expiry``.
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_key(key)
        validate_owner(owner)
        validate_ttl_ms(ttl_ms)
        store = self._open_store()
        with store.lock:
            lease = store.leases.get(key)
            if lease is not None and lease.owner == owner:
                lease.expires_at = _deadline(time.monotonic(), ttl_ms)
                return LeaseResult(True, owner, lease.token)
        return await super().acquire_lease(key, owner, ttl_ms)


class DeniedAcquireExtendsHolder(DictLeaseProvider):
    """A denied acquire resets the holder's TTL to the loser's ``ttl_ms``.

    The ``PEXPIRE`` meant for the idempotent re-acquire runs without checking who
    holds the key, so every contender keeps a crashed holder's lease alive (or cuts
    a long one short). Breaks "denied: nothing changes for the holder". Caught by
    ``test_denied_acquire_leaves_holders_ttl_alone``: a short-TTL holder, denied to a
    contender asking for a long TTL, then waited out.
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        result = await super().acquire_lease(key, owner, ttl_ms)
        if not result.acquired:
            store = self._open_store()
            store.leases[key].expires_at = _deadline(time.monotonic(), ttl_ms)
        return result


class RefusedTransferResetsHolderTtl(DictLeaseProvider):
    """A transfer by a non-holder returns False but resets the holder's TTL.

    One ``UPDATE`` that sets ``expires_at`` for the key unconditionally and the owner
    only ``WHEN owner = $from``. Breaks "transfer by a non-holder: False, nothing
    changes". Caught by ``test_refused_transfer_leaves_holders_ttl_alone``: a short-TTL
    holder waited out after the refused transfer.
    """

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        moved = await super().transfer_lease(key, from_owner, to_owner, ttl_ms)
        if not moved:
            store = self._open_store()
            lease = store.live(key, time.monotonic())
            if lease is not None:
                lease.expires_at = _deadline(time.monotonic(), ttl_ms)
        return moved


class TtlRoundedDown(DictLeaseProvider):
    """Declares whole-second TTLs (like etcd) but converts milliseconds by truncating.

    ``ttl_ms=1001`` becomes one second, shorter than asked. Breaks "a backend with
    coarser resolution rounds up". Caught by ``test_ttl_is_rounded_up_never_down``.
    """

    capabilities = Capabilities(atomic_transfer=True, fencing=True, ttl_resolution_ms=1000)

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        validate_ttl_ms(ttl_ms)
        return await super().acquire_lease(key, owner, _whole_seconds_down(ttl_ms))

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        validate_ttl_ms(ttl_ms)
        return await super().renew_lease(key, owner, _whole_seconds_down(ttl_ms))

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        validate_ttl_ms(ttl_ms)
        return await super().transfer_lease(key, from_owner, to_owner, _whole_seconds_down(ttl_ms))


def _whole_seconds_down(ttl_ms: int) -> int:
    return max(1, ttl_ms // 1000) * 1000


class StripsNulFromKeys(DictLeaseProvider):
    """Keys lose their NUL characters on the way in (a PostgreSQL ``text`` workaround).

    ``resource + "\\0" + thread`` keys then collide with others, and a key of NULs
    alone becomes a placeholder. Breaks "any code point, NUL included, round-trips
    exactly". Caught by ``test_keys_differing_only_by_nul_are_distinct``, which
    compares keys such as ``"a\\0b"`` and ``"ab"``.
    """

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseResult:
        return await super().acquire_lease(_without_nul(key), owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        return await super().get_lease_owner(_without_nul(key))

    async def release_lease(self, key: str, owner: str) -> None:
        await super().release_lease(_without_nul(key), owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await super().renew_lease(_without_nul(key), owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return await super().transfer_lease(_without_nul(key), from_owner, to_owner, ttl_ms)


def _without_nul(key: str) -> str:
    validate_key(key)  # validate what the caller passed, then "sanitize" it
    return key.replace("\0", "") or "\ufffd"


class OwnerAsBytes(DictLeaseProvider):
    """``get_lease_owner`` returns ``bytes`` (a Redis client without ``decode_responses``).

    Breaks "get_lease_owner returns the holder, a str, exactly". Caught by every test
    that reads the owner, first ``test_acquire_free_key_grants_lease_to_caller``.
    """

    async def get_lease_owner(self, key: str) -> str | None:
        owner = await super().get_lease_owner(key)
        return None if owner is None else owner.encode()  # type: ignore[return-value]


class RenewReturnsInt(DictLeaseProvider):
    """``renew_lease`` returns ``1``/``0`` (what a Lua script's ``PEXPIRE`` gives back).

    Truthy, but not the ``bool`` the contract promises. Caught by every test that
    renews, first ``test_renew_by_holder_returns_true_and_keeps_token``.
    """

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return int(await super().renew_lease(key, owner, ttl_ms))  # type: ignore[return-value]


VARIANTS: tuple[type[DictLeaseProvider], ...] = (
    ReleaseWithoutOwnerCheck,
    ReacquireIssuesNewToken,
    RenewAfterExpiry,
    NonAtomicTransfer,
    DeniedAcquireReportsCaller,
    DeniedAcquireReportsNone,
    DeniedAcquireLeaksToken,
    PerKeyTokenCounter,
    NoValidation,
    TransferSkipsToOwnerValidation,
    IgnoresTtl,
    OwnerVisibleAfterExpiry,
    ReacquireKeepsOldExpiry,
    TransferKeepsToken,
    RenewNeverShortens,
    TransferAfterExpiry,
    CheckThenSetAcquire,
    CloseIsNoop,
    ClosedRaisesDriverError,
    AcloseCancelsInFlight,
    TokenCounterPerProvider,
    ExpiredReacquireKeepsToken,
    DeniedAcquireExtendsHolder,
    RefusedTransferResetsHolderTtl,
    TtlRoundedDown,
    StripsNulFromKeys,
    OwnerAsBytes,
    RenewReturnsInt,
)
"""Every broken backend, in the order of the catalogue above."""
