"""The semantics table as an executable reference model, and a stateful test against it.

Leases in the model never expire (the stateful test uses long TTLs), so every answer
of the backend is fully determined by the operations before it, except the values
of fresh fencing tokens, of which the model only knows they must exceed every token
seen before for that key.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio.from_thread
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from leasekit import LeaseProvider, LeaseResult

from ._base import KeySpace

__all__ = ["LeaseModel", "check_against_model"]

T = TypeVar("T")

OWNERS = ("alice", "bob", "c\N{LATIN SMALL LETTER E WITH ACUTE}\0line")
KEY_COUNT = 3

STATEFUL_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    database=None,
    derandomize=True,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass(slots=True)
class _ModelLease:
    owner: str
    token: int | None  # None: issued by a transfer, value not yet seen


@dataclass(slots=True)
class LeaseModel:
    """What the table says each operation returns, given everything before it."""

    fencing: bool
    leases: dict[str, _ModelLease] = field(default_factory=dict)
    highest_token: dict[str, int] = field(default_factory=dict)

    def holder(self, key: str) -> str | None:
        lease = self.leases.get(key)
        return None if lease is None else lease.owner

    def acquire(self, key: str, owner: str, result: LeaseResult) -> None:
        lease = self.leases.get(key)
        if lease is not None and lease.owner != owner:
            assert result == LeaseResult(False, lease.owner, None), (
                f"acquire_lease({key!r}, {owner!r}) while {lease.owner!r} holds it must "
                f"return LeaseResult(False, {lease.owner!r}, None), got {result!r}"
            )
            return
        assert result.acquired is True, (
            f"acquire_lease({key!r}, {owner!r}) of a key that is free or already "
            f"{owner!r}'s must succeed, got {result!r}"
        )
        assert result.owner == owner, f"a granted acquire must name {owner!r}, got {result!r}"
        if not self.fencing:
            self.leases[key] = _ModelLease(owner, None)
            return
        token = result.token
        assert type(token) is int, f"fencing=True, but a granted acquire got token {token!r}"
        if lease is not None and lease.token is not None:
            assert token == lease.token, (
                f"re-acquire by the holder {owner!r} must keep token {lease.token}, got {token}"
            )
        else:
            highest = self.highest_token.get(key)
            assert highest is None or token > highest, (
                f"a new lease on {key!r} must carry a token greater than every earlier "
                f"one ({highest}), got {token}"
            )
        self.leases[key] = _ModelLease(owner, token)
        self.highest_token[key] = max(token, self.highest_token.get(key, token))

    def get_owner(self, key: str, answer: str | None) -> None:
        assert answer == self.holder(key), (
            f"get_lease_owner({key!r}) must return {self.holder(key)!r}, got {answer!r}"
        )

    def release(self, key: str, owner: str) -> None:
        if self.holder(key) == owner:
            del self.leases[key]

    def renew(self, key: str, owner: str, answer: bool) -> None:
        expected = self.holder(key) == owner
        assert answer is expected, (
            f"renew_lease({key!r}, {owner!r}) with holder {self.holder(key)!r} must "
            f"return {expected}, got {answer!r}"
        )

    def transfer(self, key: str, from_owner: str, to_owner: str, answer: bool) -> None:
        expected = self.holder(key) == from_owner
        assert answer is expected, (
            f"transfer_lease({key!r}, {from_owner!r}, {to_owner!r}) with holder "
            f"{self.holder(key)!r} must return {expected}, got {answer!r}"
        )
        if expected and from_owner != to_owner:
            self.leases[key] = _ModelLease(to_owner, None)


def check_against_model(provider: LeaseProvider, fencing: bool, ttl_ms: int) -> None:
    """Run random operation sequences on ``provider`` and compare each answer to the model.

    Blocking: call it in a worker thread started with ``anyio.to_thread.run_sync``;
    each operation runs on the test's event loop through ``anyio.from_thread.run``.
    Every example works on keys of its own.
    """

    def call(function: Callable[..., Coroutine[Any, Any, T]], *args: object) -> T:
        return anyio.from_thread.run(function, *args)

    key_indexes = st.integers(min_value=0, max_value=KEY_COUNT - 1)
    owners = st.sampled_from(OWNERS)

    class LeaseMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            space = KeySpace()
            self.keys = [space(f"k{i}") for i in range(KEY_COUNT)]
            self.model = LeaseModel(fencing)

        @rule(k=key_indexes, owner=owners)
        def acquire(self, k: int, owner: str) -> None:
            key = self.keys[k]
            self.model.acquire(key, owner, call(provider.acquire_lease, key, owner, ttl_ms))

        @rule(k=key_indexes)
        def get_owner(self, k: int) -> None:
            key = self.keys[k]
            self.model.get_owner(key, call(provider.get_lease_owner, key))

        @rule(k=key_indexes, owner=owners)
        def release(self, k: int, owner: str) -> None:
            key = self.keys[k]
            call(provider.release_lease, key, owner)
            self.model.release(key, owner)
            # release returns nothing: look at its effect at once, so a failure
            # points at the release rather than at some later step.
            self.model.get_owner(key, call(provider.get_lease_owner, key))

        @rule(k=key_indexes, owner=owners)
        def renew(self, k: int, owner: str) -> None:
            key = self.keys[k]
            self.model.renew(key, owner, call(provider.renew_lease, key, owner, ttl_ms))

        @rule(k=key_indexes, from_owner=owners, to_owner=owners)
        def transfer(self, k: int, from_owner: str, to_owner: str) -> None:
            key = self.keys[k]
            answer = call(provider.transfer_lease, key, from_owner, to_owner, ttl_ms)
            self.model.transfer(key, from_owner, to_owner, answer)

        def teardown(self) -> None:
            for key in self.keys:
                self.model.get_owner(key, call(provider.get_lease_owner, key))

    run_state_machine_as_test(LeaseMachine, settings=STATEFUL_SETTINGS)
