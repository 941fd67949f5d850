"""Arguments: invalid ones are refused before anything is written; unusual valid ones round-trip.

Keys and owners are non-empty ``str`` of at most 1024 UTF-8 bytes, any code point
UTF-8 can encode, NUL included; ``ttl_ms`` is an ``int`` in 1..2**31-1. The store
must neither truncate (at NUL, at a length), normalize (Unicode, case, whitespace)
nor pattern-match (``*``, ``%``, ``_``) what it is given.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

from leasekit import MAX_NAME_BYTES, InvalidLeaseArgument, LeaseProvider

from ._base import ContractBase, KeySpace, Timing, check_denied, check_granted
from ._semantics import owner_of, release, renew

__all__ = ["InputChecks"]


class BadArgument(NamedTuple):
    method: str
    argument: str
    label: str
    value: object


BAD_NAMES: list[tuple[str, object]] = [
    ("empty", ""),
    ("None", None),
    ("int", 7),
    ("bytes", b"name"),
    ("1025-ascii-bytes", "n" * (MAX_NAME_BYTES + 1)),
    # 342 code points but 1026 bytes: the limit counts UTF-8 bytes, not characters.
    ("1026-utf8-bytes", "\N{EURO SIGN}" * 342),
    ("lone-surrogate", "n\ud800"),
]

BAD_TTLS: list[tuple[str, object]] = [
    ("zero", 0),
    ("negative", -1),
    ("2**31", 2**31),
    ("bool", True),
    ("float", 100.0),
    ("str", "100"),
    ("None", None),
]

SIGNATURES: dict[str, tuple[str, ...]] = {
    "acquire_lease": ("key", "owner", "ttl_ms"),
    "get_lease_owner": ("key",),
    "release_lease": ("key", "owner"),
    "renew_lease": ("key", "owner", "ttl_ms"),
    "transfer_lease": ("key", "from_owner", "to_owner", "ttl_ms"),
}


def _bad_arguments() -> list[BadArgument]:
    cases: list[BadArgument] = []
    for method, arguments in SIGNATURES.items():
        for argument in arguments:
            values = BAD_TTLS if argument == "ttl_ms" else BAD_NAMES
            cases.extend(BadArgument(method, argument, label, value) for label, value in values)
    return cases


BAD_ARGUMENTS = _bad_arguments()


def _exactly(prefix: str, filler: str, size: int = MAX_NAME_BYTES) -> str:
    """``prefix`` padded with ``filler`` (then ASCII) to exactly ``size`` UTF-8 bytes."""
    room = size - len(prefix.encode())
    count = room // len(filler.encode())
    text = prefix + filler * count
    return text + "x" * (size - len(text.encode()))


# Each case builds a key under the test's own prefix, so 1024-byte keys include it.
UNUSUAL_NAMES: dict[str, Callable[[str], tuple[str, str]]] = {
    "nul-inside": lambda p: (p + "resource\0thread-42", "worker\0one"),
    "nul-alone": lambda p: (p + "\0", "\0"),
    "nul-at-both-ends": lambda p: ("\0" + p + "\0\0", "\0owner\0"),
    "emoji": lambda p: (
        p + "\N{LOCK}\N{SPOOL OF THREAD}",
        "\N{CONSTRUCTION WORKER}\u200d\u2640\ufe0f",
    ),
    "combining-marks": lambda p: (p + "e\u0301\u0327 a\u030a", "n\u0303o\u0308\u20dd"),
    "highest-code-point": lambda p: (p + "\U0010ffff\U000e0001", "\U0010ffff"),
    "bom-and-bidi-controls": lambda p: (
        p + "\ufeff\u202eabc\u202c",
        "\u200f\u05e9\u05dc\u05d5\u05dd",
    ),
    "wildcards-quotes-braces": lambda p: (
        p + "*?[a-z]%_\\'\"{tag}/..",
        "o'; DROP TABLE leases; --%*",
    ),
    "whitespace-and-controls": lambda p: (p + " \t\n\r\x7f\x1b ", " padded owner \n"),
    "1024-bytes-ascii": lambda p: (_exactly(p, "k"), "o" * MAX_NAME_BYTES),
    "1024-bytes-3-byte-chars": lambda p: (
        _exactly(p, "\N{EURO SIGN}"),
        _exactly("", "\N{EURO SIGN}"),
    ),
    "1024-bytes-4-byte-chars": lambda p: (
        _exactly(p, "\N{MUSICAL SYMBOL G CLEF}"),
        "\N{MUSICAL SYMBOL G CLEF}" * (MAX_NAME_BYTES // 4),
    ),
}


class InputChecks(ContractBase):
    """Bad input is refused cleanly; unusual names round-trip exactly."""

    @pytest.mark.parametrize(
        "bad", BAD_ARGUMENTS, ids=[f"{c.method}-{c.argument}-{c.label}" for c in BAD_ARGUMENTS]
    )
    async def test_invalid_argument_is_refused_and_nothing_changes(
        self, provider: LeaseProvider, bad: BadArgument
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        held, free = keys("held"), keys("free")
        check_granted(
            await provider.acquire_lease(held, "holder", t.long_ttl_ms), "holder", t.caps, "acquire"
        )
        # Valid values for the other arguments, chosen so a backend that skipped
        # validation would visibly change the store: acquire targets a free key,
        # the others act on the held key as its holder.
        valid: dict[str, object] = {
            "key": free if bad.method == "acquire_lease" else held,
            "owner": "newcomer" if bad.method == "acquire_lease" else "holder",
            "from_owner": "holder",
            "to_owner": "newcomer",
            "ttl_ms": t.long_ttl_ms,
        }
        valid[bad.argument] = bad.value
        method: Callable[..., Any] = getattr(provider, bad.method)
        call = f"{bad.method}({bad.argument}={bad.value!r:.40})"
        try:
            outcome = await method(*(valid[name] for name in SIGNATURES[bad.method]))
        except InvalidLeaseArgument as exc:
            refused = exc
        except Exception as exc:  # noqa: BLE001  (the failure names what was raised)
            pytest.fail(
                f"{call} must raise leasekit.InvalidLeaseArgument, "
                f"raised {type(exc).__module__}.{type(exc).__qualname__}: {exc}"
            )
        else:
            pytest.fail(f"{call} must raise leasekit.InvalidLeaseArgument, returned {outcome!r}")
        assert refused.argument == bad.argument, (
            f"{call} raised InvalidLeaseArgument naming {refused.argument!r}, "
            f"not {bad.argument!r}: {refused}"
        )
        assert await owner_of(provider, held) == "holder", (
            f"after the refused {call}, the held key must still belong to its holder"
        )
        assert await owner_of(provider, free) is None, (
            f"after the refused {call}, the free key must still be free"
        )

    @pytest.mark.parametrize("case", sorted(UNUSUAL_NAMES))
    async def test_unusual_key_and_owner_round_trip_exactly(
        self, provider: LeaseProvider, case: str
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key, owner = UNUSUAL_NAMES[case](keys.prefix)
        limit = MAX_NAME_BYTES
        if case.startswith("1024-bytes"):
            assert len(key.encode()) == len(owner.encode()) == limit
        assert len(key.encode()) <= limit
        assert len(owner.encode()) <= limit
        granted = await provider.acquire_lease(key, owner, t.long_ttl_ms)
        check_granted(granted, owner, t.caps, f"acquire of a {case} key by a {case} owner")
        assert await owner_of(provider, key) == owner, (
            f"get_lease_owner must return the {case} owner exactly"
        )
        check_denied(
            await provider.acquire_lease(key, "someone-else", t.long_ttl_ms),
            owner,
            f"acquire of a {case} key held by a {case} owner",
        )
        assert await renew(provider, key, owner, t.long_ttl_ms) is True
        await release(provider, key, owner)
        assert await owner_of(provider, key) is None, (
            f"release by the {case} owner must free the {case} key"
        )

    async def test_keys_differing_only_by_nul_are_distinct(self, provider: LeaseProvider) -> None:
        """NUL is part of the key: not a terminator, not stripped, not collapsed."""
        t, keys = Timing.of(provider), KeySpace()
        spellings = ["thread\0a", "thread\0b", "threada", "thread\0\0a", "thread\0a\0"]
        for index, spelling in enumerate(spellings):
            owner = f"owner-{index}"
            result = await provider.acquire_lease(keys(spelling), owner, t.long_ttl_ms)
            check_granted(
                result, owner, t.caps, f"acquire of key {spelling!r}, distinct from {spellings}"
            )
        for index, spelling in enumerate(spellings):
            assert await owner_of(provider, keys(spelling)) == f"owner-{index}"

    async def test_owners_differing_only_by_nul_are_distinct(self, provider: LeaseProvider) -> None:
        t, keys = Timing.of(provider), KeySpace()
        key = keys("held")
        holder = "run\0a"
        check_granted(
            await provider.acquire_lease(key, holder, t.long_ttl_ms), holder, t.caps, "acquire"
        )
        for other in ["run\0b", "runa", "run\0\0a", "run\0a\0", "run"]:
            check_denied(
                await provider.acquire_lease(key, other, t.long_ttl_ms),
                holder,
                f"acquire by {other!r} of a key held by {holder!r}",
            )
            await release(provider, key, other)
            assert await renew(provider, key, other, t.long_ttl_ms) is False
        assert await owner_of(provider, key) == holder

    async def test_keys_and_owners_are_not_unicode_normalized(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        composed = "caf\N{LATIN SMALL LETTER E WITH ACUTE}"
        decomposed = unicodedata.normalize("NFD", composed)
        assert composed != decomposed
        check_granted(
            await provider.acquire_lease(keys(composed), composed, t.long_ttl_ms),
            composed,
            t.caps,
            "acquire",
        )
        result = await provider.acquire_lease(keys(decomposed), decomposed, t.long_ttl_ms)
        check_granted(result, decomposed, t.caps, "acquire of the NFD spelling of a held NFC key")
        check_denied(
            await provider.acquire_lease(keys(composed), decomposed, t.long_ttl_ms),
            composed,
            "acquire by the NFD spelling of the NFC holder",
        )
        assert await owner_of(provider, keys(decomposed)) == decomposed

    async def test_keys_and_owners_are_case_and_whitespace_sensitive(
        self, provider: LeaseProvider
    ) -> None:
        t, keys = Timing.of(provider), KeySpace()
        spellings = ["worker", "Worker", "WORKER", "worker ", " worker", "worker\t"]
        for spelling in spellings:
            result = await provider.acquire_lease(keys(spelling), spelling, t.long_ttl_ms)
            check_granted(result, spelling, t.caps, f"acquire of key spelled {spelling!r}")
        for spelling in spellings:
            assert await owner_of(provider, keys(spelling)) == spelling
        shared = keys("shared")
        check_granted(
            await provider.acquire_lease(shared, "worker", t.long_ttl_ms),
            "worker",
            t.caps,
            "acquire",
        )
        for spelling in spellings[1:]:
            check_denied(
                await provider.acquire_lease(shared, spelling, t.long_ttl_ms),
                "worker",
                f"acquire by {spelling!r} of a key held by 'worker'",
            )
