"""Structural detection, the noop fallback, and capabilities as data.

The rules are in docs/contract.md and docs/capabilities.md.
"""

from __future__ import annotations

import types
import warnings
from typing import Any

import pytest

import leasekit
from leasekit import (
    NOOP,
    Capabilities,
    InvalidLeaseArgument,
    LeasekitWarning,
    LeaseResult,
    MemoryLeaseProvider,
    NoopLeaseProvider,
    capabilities_of,
    is_lease_provider,
    lease_provider_for,
)

METHODS = ("acquire_lease", "get_lease_owner", "release_lease", "renew_lease", "transfer_lease")


class PlainProvider:
    """A complete provider written without importing or inheriting anything from leasekit."""

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> Any:
        return ("acquired", key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        return None

    async def release_lease(self, key: str, owner: str) -> None:
        return None

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return False

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return False


async def _method(self: object, *args: object) -> None:
    return None


def _class_with(methods: dict[str, object]) -> type:
    """A brand-new class per call, so the once-per-class warning starts fresh."""
    return type("PartialProvider", (), dict(methods))


def _missing_named_in(message: str) -> set[str]:
    listed = message.split("missing or not callable: ", 1)[1].split(")", 1)[0]
    return set(listed.split(", "))


# -- full providers ----------------------------------------------------------------


def test_plain_class_not_inheriting_the_protocol_is_a_provider() -> None:
    assert leasekit.LeaseProvider not in PlainProvider.__mro__
    provider = PlainProvider()
    assert is_lease_provider(provider)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert lease_provider_for(provider) is provider
    assert caught == []


@pytest.mark.anyio
async def test_detected_provider_is_used_as_is() -> None:
    provider = lease_provider_for(PlainProvider())
    assert await provider.acquire_lease("k", "o", 5) == ("acquired", "k", "o", 5)  # type: ignore[comparison-overlap]


def test_provider_made_of_instance_attributes_is_detected() -> None:
    # Structural, not nominal: callables set on an instance qualify as well.
    provider = types.SimpleNamespace(**dict.fromkeys(METHODS, _method))
    assert is_lease_provider(provider)
    assert lease_provider_for(provider) is provider


@pytest.mark.parametrize("provider", [MemoryLeaseProvider(), NOOP], ids=["memory", "noop"])
def test_built_in_providers_are_detected(provider: object) -> None:
    assert is_lease_provider(provider)
    assert lease_provider_for(provider) is provider


# -- not providers: silent fallback ------------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [None, object(), "memory://", 42, {"acquire_lease": _method}, PlainProvider.acquire_lease],
    ids=["None", "object", "str", "int", "dict-with-method-names", "function"],
)
def test_non_providers_fall_back_to_noop_silently(obj: object) -> None:
    assert not is_lease_provider(obj)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert lease_provider_for(obj) is NOOP
    assert caught == []


# -- partial providers: one warning naming what is missing -------------------------


@pytest.mark.parametrize(
    "missing",
    [
        ("transfer_lease",),
        ("acquire_lease", "renew_lease"),
        ("get_lease_owner", "release_lease", "renew_lease", "transfer_lease"),
    ],
    ids=["one-missing", "two-missing", "four-missing"],
)
def test_partial_provider_warns_naming_exactly_the_missing_methods(
    missing: tuple[str, ...],
) -> None:
    cls = _class_with({name: _method for name in METHODS if name not in missing})
    obj = cls()
    assert not is_lease_provider(obj)
    with pytest.warns(LeasekitWarning) as record:
        assert lease_provider_for(obj) is NOOP
    assert len(record) == 1
    message = str(record[0].message)
    assert _missing_named_in(message) == set(missing)
    assert "PartialProvider" in message
    assert "noop" in message
    assert record[0].filename == __file__  # points at the caller, not at leasekit


def test_partial_provider_warns_once_per_class() -> None:
    cls = _class_with({"acquire_lease": _method})
    with pytest.warns(LeasekitWarning):
        lease_provider_for(cls())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert lease_provider_for(cls()) is NOOP
        assert lease_provider_for(cls()) is NOOP
    assert caught == []
    # A different class with the same gap gets its own warning.
    other = _class_with({"acquire_lease": _method})
    with pytest.warns(LeasekitWarning, match="missing or not callable"):
        lease_provider_for(other())


@pytest.mark.parametrize(
    "bad_value", [3, None, "acquire", 0.5], ids=["int", "None", "str", "float"]
)
def test_non_callable_method_attribute_counts_as_missing(bad_value: object) -> None:
    methods: dict[str, object] = dict.fromkeys(METHODS, _method)
    methods["renew_lease"] = bad_value
    obj = _class_with(methods)()
    assert not is_lease_provider(obj)
    with pytest.warns(LeasekitWarning) as record:
        assert lease_provider_for(obj) is NOOP
    assert _missing_named_in(str(record[0].message)) == {"renew_lease"}


def test_non_callable_instance_attribute_shadows_a_method() -> None:
    obj = PlainProvider()
    obj.acquire_lease = 3  # type: ignore[method-assign,assignment]
    assert not is_lease_provider(obj)
    with pytest.warns(LeasekitWarning) as record:
        assert lease_provider_for(obj) is NOOP
    assert _missing_named_in(str(record[0].message)) == {"acquire_lease"}


# -- the noop provider -------------------------------------------------------------


@pytest.mark.anyio
async def test_noop_always_wins_and_never_has_an_owner() -> None:
    assert await NOOP.acquire_lease("k", "a", 1_000) == LeaseResult(True, "a", None)
    # A second owner wins too: noop coordinates nothing, by design.
    assert await NOOP.acquire_lease("k", "b", 1_000) == LeaseResult(True, "b", None)
    assert await NOOP.get_lease_owner("k") is None
    await NOOP.release_lease("k", "someone-else")
    assert await NOOP.renew_lease("k", "never-acquired", 1_000) is True
    assert await NOOP.transfer_lease("k", "x", "y", 1_000) is True
    assert await NOOP.get_lease_owner("k") is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda p: p.acquire_lease("", "o", 1), "key"),
        (lambda p: p.acquire_lease("k", "o", 1.5), "ttl_ms"),
        (lambda p: p.get_lease_owner(None), "key"),
        (lambda p: p.release_lease("k", "\ud800"), "owner"),
        (lambda p: p.renew_lease("k", "o", 0), "ttl_ms"),
        (lambda p: p.transfer_lease("k", "o", "x" * 1025, 1), "to_owner"),
        (lambda p: p.transfer_lease("k", 7, "n", 1), "from_owner"),
    ],
)
async def test_noop_validates_its_input(call: Any, argument: str) -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        await call(NOOP)
    assert info.value.argument == argument


@pytest.mark.anyio
async def test_noop_lifecycle_leaves_the_shared_instance_usable() -> None:
    async with leasekit.connect("noop://") as provider:
        assert provider is NOOP
    await NOOP.aclose()
    assert (await NOOP.acquire_lease("k", "o", 1)).acquired


def test_noop_from_url() -> None:
    assert NoopLeaseProvider.from_url("noop://") is NOOP
    with pytest.raises(InvalidLeaseArgument) as info:
        NoopLeaseProvider.from_url("noop://", pool_size=3)
    assert info.value.argument == "options"


# -- capabilities ------------------------------------------------------------------


def test_capabilities_of_an_undeclared_provider_are_the_conservative_defaults() -> None:
    caps = capabilities_of(PlainProvider())
    assert caps == Capabilities()
    assert caps.fencing is False
    assert caps.atomic_transfer is False
    assert caps.ttl_resolution_ms == 1


def test_capabilities_must_be_the_dataclass() -> None:
    class Liar(PlainProvider):
        capabilities = ("fencing",)

    with pytest.raises(TypeError, match=r"Liar\.capabilities must be a leasekit\.Capabilities"):
        capabilities_of(Liar())


@pytest.mark.parametrize(
    ("field", "value"),
    [("fencing", 1), ("atomic_transfer", "yes"), ("ttl_resolution_ms", 0), ("min_ttl_ms", True)],
)
def test_capabilities_reject_wrong_types(field: str, value: object) -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        Capabilities(**{field: value})  # type: ignore[arg-type]
    assert info.value.argument == field


def test_capabilities_are_frozen_and_list_their_flags() -> None:
    caps = Capabilities(fencing=True)
    with pytest.raises(AttributeError):
        caps.fencing = False  # type: ignore[misc]
    flags = Capabilities.flag_names()
    assert "fencing" in flags
    assert "atomic_transfer" in flags
    assert "ttl_resolution_ms" not in flags


@pytest.mark.parametrize(
    ("resolution", "minimum", "requested", "granted"),
    [
        (1, 1, 1, 1),
        (1000, 1, 1, 1000),
        (1000, 1, 1001, 2000),
        (1000, 1, 3000, 3000),
        (1, 50, 10, 50),
    ],
)
def test_effective_ttl_rounds_up(
    resolution: int, minimum: int, requested: int, granted: int
) -> None:
    caps = Capabilities(ttl_resolution_ms=resolution, min_ttl_ms=minimum)
    assert caps.effective_ttl_ms(requested) == granted
