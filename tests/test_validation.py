"""The shared argument validator, alone and through every method of memory:// and noop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import leasekit
from leasekit import (
    MAX_NAME_BYTES,
    MAX_TTL_MS,
    NOOP,
    InvalidLeaseArgument,
    LeaseError,
    MemoryLeaseProvider,
    validate_key,
    validate_owner,
    validate_ttl_ms,
)

# (value, a fragment of the rule the message must state)
BAD_NAMES = [
    pytest.param(42, "must be a str", id="int"),
    pytest.param(None, "must be a str", id="None"),
    pytest.param(b"key", "must be a str", id="bytes"),
    pytest.param(["key"], "must be a str", id="list"),
    pytest.param("", "must not be empty", id="empty"),
    pytest.param("a" * 1025, "at most 1024 UTF-8 bytes, got 1025", id="1025-ascii-bytes"),
    pytest.param("€" * 342, "at most 1024 UTF-8 bytes, got 1026", id="1026-bytes-in-342-chars"),
    pytest.param("😀" * 256 + "a", "at most 1024 UTF-8 bytes, got 1025", id="1025-bytes-emoji"),
    pytest.param("\ud800", "lone surrogate at index 0", id="lone-high-surrogate"),
    pytest.param("ok\udfffok", "lone surrogate at index 2", id="lone-low-surrogate"),
]

GOOD_NAMES = [
    pytest.param("k", id="one-char"),
    pytest.param("a" * 1024, id="1024-ascii-bytes"),
    pytest.param("€" * 341 + "a", id="1024-bytes-three-byte-chars"),
    pytest.param("😀" * 256, id="1024-bytes-four-byte-chars"),
    pytest.param("\0", id="only-NUL"),
    pytest.param("resource\0thread", id="embedded-NUL"),
    pytest.param("🔒 lease", id="emoji"),
    pytest.param("e\u0301\u0327", id="combining-marks"),
    pytest.param("ключ-鍵-مفتاح", id="non-latin"),
    pytest.param(" \t\n", id="whitespace-only"),
    pytest.param("\U0010ffff", id="highest-code-point"),
]

BAD_TTLS = [
    pytest.param(True, "must be an int number of milliseconds", id="True"),
    pytest.param(False, "must be an int number of milliseconds", id="False"),
    pytest.param(1000.0, "must be an int number of milliseconds", id="float"),
    pytest.param("1000", "must be an int number of milliseconds", id="str"),
    pytest.param(None, "must be an int number of milliseconds", id="None"),
    pytest.param(0, "between 1 and 2147483647", id="zero"),
    pytest.param(-1, "between 1 and 2147483647", id="negative"),
    pytest.param(2**31, "between 1 and 2147483647", id="2**31"),
]

GOOD_TTLS = [
    pytest.param(1, id="1"),
    pytest.param(30_000, id="30s"),
    pytest.param(2**31 - 1, id="max"),
]


def test_limits_are_the_documented_ones() -> None:
    assert MAX_NAME_BYTES == 1024
    assert MAX_TTL_MS == 2**31 - 1


def test_invalid_argument_is_a_lease_error_and_a_value_error() -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        validate_key("")
    assert isinstance(info.value, LeaseError)
    assert isinstance(info.value, ValueError)
    assert issubclass(InvalidLeaseArgument, leasekit.LeaseError)


@pytest.mark.parametrize("validator", [validate_key, validate_owner])
@pytest.mark.parametrize(("value", "rule"), BAD_NAMES)
def test_bad_names_are_rejected_with_the_rule(
    validator: Callable[[object], str], value: object, rule: str
) -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        validator(value)
    expected_argument = "key" if validator is validate_key else "owner"
    assert info.value.argument == expected_argument
    assert rule in info.value.rule
    assert str(info.value).startswith(f"invalid {expected_argument}: ")
    assert rule in str(info.value)


@pytest.mark.parametrize("validator", [validate_key, validate_owner])
@pytest.mark.parametrize("value", GOOD_NAMES)
def test_good_names_are_returned_unchanged(validator: Callable[[object], str], value: str) -> None:
    assert validator(value) == value
    assert len(value.encode("utf-8")) <= MAX_NAME_BYTES


@pytest.mark.parametrize("argument", ["from_owner", "to_owner"])
def test_validator_names_the_argument_it_is_told(argument: str) -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        validate_owner("", argument)
    assert info.value.argument == argument
    assert str(info.value) == f"invalid {argument}: must not be empty"


def test_the_offending_value_is_kept_on_the_error() -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        validate_ttl_ms(-5)
    assert info.value.value == -5


def test_oversized_message_is_short_even_for_a_huge_value() -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        validate_key(["x" * 10_000])
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(("value", "rule"), BAD_TTLS)
def test_bad_ttls_are_rejected_with_the_rule(value: object, rule: str) -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        validate_ttl_ms(value)
    assert info.value.argument == "ttl_ms"
    assert rule in str(info.value)


@pytest.mark.parametrize("value", GOOD_TTLS)
def test_good_ttls_are_accepted(value: int) -> None:
    assert validate_ttl_ms(value) == value


def test_an_int_subclass_ttl_comes_back_as_a_plain_int() -> None:
    class Millis(int):
        pass

    checked = validate_ttl_ms(Millis(250))
    assert checked == 250
    assert type(checked) is int


# -- through every provider method ------------------------------------------------

HOLDER = "holder"
SUCCESSOR = "successor"
HELD_KEY = "held"
FREE_KEY = "free"

# Each method with valid arguments that, were they applied, would change the store:
# the holder of HELD_KEY re-acquiring, releasing, renewing or transferring it.
METHOD_ARGS: dict[str, dict[str, object]] = {
    "acquire_lease": {"key": HELD_KEY, "owner": HOLDER, "ttl_ms": 5_000},
    "get_lease_owner": {"key": HELD_KEY},
    "release_lease": {"key": HELD_KEY, "owner": HOLDER},
    "renew_lease": {"key": HELD_KEY, "owner": HOLDER, "ttl_ms": 5_000},
    "transfer_lease": {
        "key": HELD_KEY,
        "from_owner": HOLDER,
        "to_owner": SUCCESSOR,
        "ttl_ms": 5_000,
    },
}


def _bad_calls() -> list[Any]:
    cases = []
    for method, args in METHOD_ARGS.items():
        for argument in args:
            bad_values = BAD_TTLS if argument == "ttl_ms" else BAD_NAMES
            for bad in bad_values:
                value, rule = bad.values
                cases.append(
                    pytest.param(method, argument, value, rule, id=f"{method}-{argument}-{bad.id}")
                )
    return cases


BAD_CALLS = _bad_calls()


def _call(provider: object, method: str, argument: str, value: object) -> Awaitable[object]:
    kwargs = dict(METHOD_ARGS[method])
    kwargs[argument] = value
    bound: Callable[..., Awaitable[object]] = getattr(provider, method)
    return bound(**kwargs)


class _FrozenClock:
    """A monotonic clock that only moves when told, so expiries compare exactly."""

    def __init__(self) -> None:
        self.now_ns = 10**12

    def __call__(self) -> int:
        return self.now_ns


def _snapshot(provider: MemoryLeaseProvider) -> dict[str, tuple[str, int, int]]:
    return {
        key: (lease.owner, lease.token, lease.expires_ns)
        for key, lease in provider._store.leases.items()
    }


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "argument", "value", "rule"), BAD_CALLS)
async def test_memory_rejects_bad_input_and_changes_nothing(
    method: str, argument: str, value: object, rule: str
) -> None:
    provider = MemoryLeaseProvider(clock_ns=_FrozenClock())
    held = await provider.acquire_lease(HELD_KEY, HOLDER, 10_000)
    assert held.acquired
    before = _snapshot(provider)
    tokens_before = provider._store.last_token

    with pytest.raises(InvalidLeaseArgument) as info:
        await _call(provider, method, argument, value)

    assert info.value.argument == argument
    assert rule in str(info.value)
    # Nothing written: same owner, token and expiry; no new key; no token spent.
    assert _snapshot(provider) == before
    assert provider._store.last_token == tokens_before
    assert await provider.get_lease_owner(HELD_KEY) == HOLDER
    assert await provider.get_lease_owner(FREE_KEY) is None
    again = await provider.acquire_lease(HELD_KEY, HOLDER, 10_000)
    assert again.token == held.token


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "argument", "value", "rule"), BAD_CALLS)
async def test_noop_rejects_bad_input(method: str, argument: str, value: object, rule: str) -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        await _call(NOOP, method, argument, value)
    assert info.value.argument == argument
    assert rule in str(info.value)


@pytest.mark.anyio
@pytest.mark.parametrize("name", GOOD_NAMES)
async def test_every_method_accepts_every_valid_name(name: str) -> None:
    memory = MemoryLeaseProvider(clock_ns=_FrozenClock())
    assert await memory.acquire_lease(name, name, 1_000) == leasekit.LeaseResult(True, name, 1)
    assert await memory.renew_lease(name, name, 1_000)
    assert await memory.transfer_lease(name, name, SUCCESSOR, 1_000)
    assert await memory.get_lease_owner(name) == SUCCESSOR
    assert await memory.transfer_lease(HELD_KEY, SUCCESSOR, name, 1_000) is False
    await memory.release_lease(name, SUCCESSOR)
    assert await memory.get_lease_owner(name) is None

    assert await NOOP.acquire_lease(name, name, 1_000) == leasekit.LeaseResult(True, name)
    assert await NOOP.renew_lease(name, name, 1_000)
    assert await NOOP.transfer_lease(name, name, name, 1_000)
    await NOOP.release_lease(name, name)
    assert await NOOP.get_lease_owner(name) is None


@pytest.mark.anyio
@pytest.mark.parametrize("ttl_ms", GOOD_TTLS)
async def test_every_ttl_method_accepts_the_bounds(ttl_ms: int) -> None:
    memory = MemoryLeaseProvider(clock_ns=_FrozenClock())
    assert (await memory.acquire_lease("k", "o", ttl_ms)).acquired
    assert await memory.renew_lease("k", "o", ttl_ms)
    assert await memory.transfer_lease("k", "o", "p", ttl_ms)
    assert await memory.get_lease_owner("k") == "p"

    assert (await NOOP.acquire_lease("k", "o", ttl_ms)).acquired
    assert await NOOP.renew_lease("k", "o", ttl_ms)
    assert await NOOP.transfer_lease("k", "o", "p", ttl_ms)
