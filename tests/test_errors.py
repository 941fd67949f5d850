"""Every exception class behaves like Python's own: message first, picklable, copyable."""

from __future__ import annotations

import concurrent.futures
import copy
import pickle

import pytest

import leasekit
from leasekit import (
    BackendLacksCapability,
    BackendUnavailable,
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseError,
    LeaseHeld,
    LeaseLost,
    LeaseProviderClosed,
    LockError,
    LockNotOwnedError,
    SlotLimitMismatch,
    StaleFencingToken,
)

EXAMPLES: list[tuple[LeaseError, dict[str, object]]] = [
    (LeaseError("plain"), {}),
    (InvalidLeaseArgument("ttl must be positive"), {"argument": None, "value": None}),
    (
        InvalidLeaseArgument.for_argument("ttl_ms", "must be positive", -1),
        {"argument": "ttl_ms", "rule": "must be positive", "value": -1},
    ),
    (BackendUnavailable("no such scheme", scheme="nope"), {"scheme": "nope"}),
    (
        BackendLacksCapability(backend="memory", missing=("fencing", "persistent")),
        {"backend": "memory", "missing": ("fencing", "persistent")},
    ),
    (LeaseBackendError("boom", backend="redis", key="k\0x"), {"backend": "redis", "key": "k\0x"}),
    (LeaseBackendTimeout("no answer", backend="etcd", key="k"), {"backend": "etcd", "key": "k"}),
    (LeaseBackendUnreachable("refused", backend="postgresql"), {"backend": "postgresql"}),
    (LeaseProviderClosed(backend="sqlite"), {"backend": "sqlite"}),
    (LockError("cannot release an unlocked lock", lock_name="jobs"), {"lock_name": "jobs"}),
    (
        LockNotOwnedError("cannot release a lock that's no longer owned", lock_name="jobs"),
        {"lock_name": "jobs"},
    ),
    (LeaseHeld(key="thread-1", holder="worker-b"), {"key": "thread-1", "holder": "worker-b"}),
    (
        LeaseLost(key="thread-1", owner="worker-a", reason="refused"),
        {"key": "thread-1", "owner": "worker-a", "reason": "refused"},
    ),
    (
        StaleFencingToken(resource="invoices", token=3, current=7),
        {"resource": "invoices", "token": 3, "current": 7},
    ),
    (
        SlotLimitMismatch(key="pool", limit=5, stored_limit=3),
        {"key": "pool", "limit": 5, "stored_limit": 3},
    ),
]
IDS = [type(error).__name__ for error, _ in EXAMPLES]


def _same(original: LeaseError, clone: BaseException, attributes: dict[str, object]) -> None:
    assert type(clone) is type(original)
    assert str(clone) == str(original)
    assert clone.args == original.args
    for name, value in attributes.items():
        assert getattr(clone, name) == value, name


def test_every_public_error_class_is_covered() -> None:
    public = {
        name
        for name in leasekit.__all__
        if isinstance(getattr(leasekit, name), type)
        and issubclass(getattr(leasekit, name), LeaseError)
    }
    assert public == {type(error).__name__ for error, _ in EXAMPLES}


@pytest.mark.parametrize(("error", "attributes"), EXAMPLES, ids=IDS)
def test_pickle_round_trip_keeps_type_message_and_attributes(
    error: LeaseError, attributes: dict[str, object]
) -> None:
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        _same(error, pickle.loads(pickle.dumps(error, protocol)), attributes)


@pytest.mark.parametrize(("error", "attributes"), EXAMPLES, ids=IDS)
def test_copy_and_deepcopy_keep_type_message_and_attributes(
    error: LeaseError, attributes: dict[str, object]
) -> None:
    _same(error, copy.copy(error), attributes)
    _same(error, copy.deepcopy(error), attributes)


def test_provider_closed_message_is_not_doubled_by_a_round_trip() -> None:
    error = LeaseProviderClosed(backend="redis")
    assert str(pickle.loads(pickle.dumps(error))) == "redis: the lease provider is closed"


def test_backend_error_message_names_the_backend_once() -> None:
    error = LeaseBackendError("no answer", backend="redis")
    assert str(error) == "redis: no answer"
    assert str(LeaseBackendError(str(error), backend="redis")) == "redis: no answer"


def test_invalid_argument_is_a_value_error_built_like_one() -> None:
    with pytest.raises(ValueError, match="ttl must be positive"):
        raise InvalidLeaseArgument("ttl must be positive")
    error = InvalidLeaseArgument.for_argument("key", "must not be empty", "")
    assert str(error) == "invalid key: must not be empty"


def test_subclasses_of_the_backend_error_are_backend_errors() -> None:
    assert issubclass(LeaseBackendTimeout, LeaseBackendError)
    assert issubclass(LeaseBackendUnreachable, LeaseBackendError)


def _raise(index: int) -> None:
    raise EXAMPLES[index][0]


def test_errors_raised_in_a_process_pool_reach_the_parent_intact() -> None:
    with concurrent.futures.ProcessPoolExecutor(max_workers=1) as pool:
        for index, (error, attributes) in enumerate(EXAMPLES):
            future = pool.submit(_raise, index)
            with pytest.raises(type(error)) as info:
                future.result(timeout=60)
            _same(error, info.value, attributes)
        # The pool survived every one of them.
        assert pool.submit(int, "7").result(timeout=60) == 7
