"""The Redis operations without a server: the requests they yield, how they read replies.

Each operation is driven by the toolkit's blocking driver over a hand-written exchange
that records every request and answers with the replies given, as Redis would.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import pytest
from servers import missing_extra

import leasekit
from leasekit.backend import LeaseRecord, Operation, drive

try:
    import redis  # noqa: F401 (the backend's driver: without it, say how to install it)
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("redis", "the Redis operation tests")

from leasekit_redis import _lua, _ops, _options, _slots

_T = TypeVar("_T")

CTX = _ops.context("p:", 1000, b"PUBLISH")
FOREVER = _ops.context("p:", None, b"")


def run(operation: Operation[Any, _T], replies: Iterable[Any]) -> tuple[_T, list[Any]]:
    """Drive ``operation`` over canned ``replies``: its result and the requests it sent."""
    sent: list[Any] = []
    answers = iter(replies)

    def exchange(request: Any) -> Any:
        sent.append(request)
        answer = next(answers)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    result = drive(operation, exchange)
    assert next(answers, None) is None, "a reply was left unread"
    return result, sent


def test_acquire_sends_the_acquire_script_and_reads_token_or_holder() -> None:
    granted, sent = run(_ops.acquire(CTX, "k{1}", "me", 500), [17])
    assert granted == leasekit.LeaseResult(True, "me", 17)
    [call] = sent
    assert isinstance(call, _ops.ScriptCall)
    assert call.script is _lua.ACQUIRE
    assert call.evalsha() == (
        "EVALSHA",
        _lua.ACQUIRE.sha,
        2,
        b"p:{k%7B1%7D}",
        b"p:{k%7B1%7D}:fence",
        b"me",
        500,
        1500,  # the counter outlives the lease by counter_ttl_ms
    )
    assert call.eval()[:2] == ("EVAL", _lua.ACQUIRE.source)
    assert run(_ops.acquire(CTX, "k", "me", 500), [b"other\0"])[0] == leasekit.LeaseResult(
        False, "other\0"
    )
    # A caller's client with decode_responses=True answers text.
    assert run(_ops.acquire(CTX, "k", "me", 500), ["other"])[0] == leasekit.LeaseResult(
        False, "other"
    )


def test_a_counter_kept_forever_is_sent_as_zero() -> None:
    _, [call] = run(_ops.acquire(FOREVER, "k", "me", 500), [1])
    assert call.args == (b"me", 500, 0)
    _, [call] = run(_ops.renew(FOREVER, "k", "me", 500), [1])
    assert call.args == (b"me", 500, 0)


@pytest.mark.parametrize("reply", [b"\xff", None, 1.5, [1]])
def test_an_acquire_reply_no_script_gives_is_a_backend_error_naming_the_prefix(
    reply: object,
) -> None:
    with pytest.raises(leasekit.LeaseBackendError, match="'p:'") as info:
        run(_ops.acquire(CTX, "k", "me", 500), [reply])
    assert info.value.key == "k"
    assert info.value.backend == "redis"


def test_metadata_is_the_acquires_last_argument_and_comes_back_with_the_holder() -> None:
    granted, [call] = run(_ops.acquire(CTX, "k", "me", 500, metadata="h:1"), [17])
    assert granted == leasekit.LeaseResult(True, "me", 17, b"h:1")
    assert call.args == (b"me", 500, 1500, b"h:1")
    # Without metadata, none is sent (not even an empty one: b"" is metadata too).
    assert run(_ops.acquire(CTX, "k", "me", 500, metadata=b""), [1])[1][0].args[-1] == b""
    # A holder with metadata: [holder, metadata]; without: the holder alone.
    denied, _ = run(_ops.acquire(CTX, "k", "me", 500), [[b"other", b"\xff\x00"]])
    assert denied == leasekit.LeaseResult(False, "other", None, b"\xff\x00")
    denied, _ = run(_ops.acquire(CTX, "k", "me", 500), [["other", "10.0.0.7:80"]])
    assert denied == leasekit.LeaseResult(False, "other", None, b"10.0.0.7:80")
    for garbled in ([b"other"], [b"\xff", b"m"], [b"other", 5], [1, 2, 3]):
        with pytest.raises(leasekit.LeaseBackendError, match="'p:'"):
            run(_ops.acquire(CTX, "k", "me", 500), [garbled])


def test_the_acquire_script_carries_its_publish_command() -> None:
    # A grant of a free key is a hint to owner watchers; the command is the script's
    # own (one script per command), not an argument every acquire would pack.
    sharded = _ops.context("p:", 1000, b"SPUBLISH")
    for ctx, script, command in (
        (CTX, _lua.ACQUIRE, "'PUBLISH'"),
        (sharded, _lua.ACQUIRE_SHARDED, "'SPUBLISH'"),
        (FOREVER, _lua.ACQUIRE_SILENT, "''"),
    ):
        _, [call] = run(_ops.acquire(ctx, "k", "me", 500), [1])
        assert call.script is script
        assert f"notify(KEYS[1], {command}, 'granted')" in script.source
    assert len({_lua.ACQUIRE.sha, _lua.ACQUIRE_SHARDED.sha, _lua.ACQUIRE_SILENT.sha}) == 3


def test_transfer_sends_the_new_owners_metadata_only_when_given() -> None:
    _, [call] = run(_ops.transfer(CTX, "k", "a", "b", 9, metadata=b"b:2"), [1])
    assert call.args == (b"a", b"b", 9, 1009, b"PUBLISH", b"b:2")
    _, [call] = run(_ops.transfer(CTX, "k", "a", "b", 9), [1])
    assert call.args == (b"a", b"b", 9, 1009, b"PUBLISH")


def test_record_is_one_script_reading_value_and_pttl() -> None:
    found, [call] = run(_ops.record(CTX, "k"), [[b"12:3 a bxyz", 900]])
    assert found == LeaseRecord("k", "a b", 12, 900, b"xyz")
    assert (call.script, call.keys, call.args) == (_lua.RECORD, (b"p:{k}",), ())
    assert run(_ops.record(CTX, "k"), [[b"12 a", 0]])[0] == LeaseRecord("k", "a", 12, 1)
    assert run(_ops.record(CTX, "k"), [None])[0] is None
    for garbled in ([b"12 a", -1], [b"nope", 5], b"12 a", [b"12 a"], [5, 5]):
        with pytest.raises(leasekit.LeaseBackendError, match="unexpected data"):
            run(_ops.record(CTX, "k"), [garbled])


def test_lease_values_with_and_without_metadata() -> None:
    read = _ops.read_lease_value
    assert read(b"12 a b") == ("a b", 12, None)  # as stored before metadata existed
    assert read(b"12:0 a b") == ("a b", 12, b"")
    assert read(b"12:4 a b\x00:9 ") == ("a b", 12, b"\x00:9 ")
    assert read(b"12:2 o:2 x") == ("o:2", 12, b" x")  # the owner may hold anything
    assert read("7:1 \u00fcx") == ("\u00fc", 7, b"x")  # text from a decoding client
    for garbled in (b"12:2 ab", b"12:x a", b"12: a", b"x:1 ab", b"12:9 a", b"12:1"):
        with pytest.raises(_ops.GarbledReply):
            read(garbled)


def test_owner_is_one_get_of_the_lease() -> None:
    holder, sent = run(_ops.owner(CTX, "k"), [b"12 a b"])
    assert (holder, sent) == ("a b", [("GET", b"p:{k}")])
    assert run(_ops.owner(CTX, "k"), [b"12:1 a bc"])[0] == "a b"
    assert run(_ops.owner(CTX, "k"), [None])[0] is None
    assert run(_ops.owner(CTX, "k"), ["3 x"])[0] == "x"
    for garbled in (b"nope", b"12 ", b"x y", b"1 \xff", [1], 1.5):
        with pytest.raises(leasekit.LeaseBackendError, match="unexpected data"):
            run(_ops.owner(CTX, "k"), [garbled])


def test_release_and_release_grant_publish_as_told() -> None:
    result, [call] = run(_ops.release(CTX, "k", "a"), [1])
    assert result is True  # the script's 1: it deleted the lease
    assert (call.script, call.keys, call.args) == (_lua.RELEASE, (b"p:{k}",), (b"a", b"PUBLISH"))
    result, [call] = run(_ops.release(FOREVER, "k", "a"), [0])
    assert result is False
    assert call.args == (b"a", b"")  # no channel: nothing published
    _, [call] = run(_ops.release_grant(CTX, "k", "a", 42), [1])
    assert (call.script, call.keys, call.args) == (
        _lua.RELEASE_GRANT,
        (b"p:{k}",),
        (b"a", b"42", b"PUBLISH"),
    )


def test_renew_and_transfer_answer_whether_they_took_effect() -> None:
    renewed, [call] = run(_ops.renew(CTX, "k", "me", 500), [1])
    assert renewed is True
    assert (call.script, call.keys, call.args) == (
        _lua.RENEW,
        (b"p:{k}", b"p:{k}:fence"),
        (b"me", 500, 1500),
    )
    assert run(_ops.renew(CTX, "k", "me", 500), [0])[0] is False
    moved, [call] = run(_ops.transfer(CTX, "k", "a", "b", 9), [1])
    assert moved is True
    assert call.script is _lua.TRANSFER
    assert call.args == (b"a", b"b", 9, 1009, b"PUBLISH")
    assert run(_ops.transfer(CTX, "k", "a", "b", 9), [0])[0] is False


def test_renew_many_sends_one_script_and_reads_one_flag_per_item() -> None:
    items = [("a", "o1", 100), ("b", "o2", 200)]
    flags, [call] = run(_ops.renew_many(CTX, items), [b"10"])
    assert flags == [True, False]
    assert call.script is _lua.RENEW_MANY
    assert call.keys == (b"p:{a}", b"p:{b}")
    assert call.args == (1000, b"o1", 100, b"o2", 200)
    assert run(_ops.renew_many(FOREVER, items), ["01"])[0] == [False, True]
    _, [call] = run(_ops.renew_many(FOREVER, items), [b"00"])
    assert call.args[0] == -1  # counters kept forever
    for garbled in (b"1", b"102", 3, None):
        with pytest.raises(leasekit.LeaseBackendError) as info:
            run(_ops.renew_many(CTX, items), [garbled])
        assert info.value.key == "a"


def test_remaining_reads_pttl() -> None:
    left, sent = run(_ops.remaining(CTX, "k"), [1500])
    assert (left, sent) == (1500, [("PTTL", b"p:{k}")])
    assert run(_ops.remaining(CTX, "k"), [-2])[0] is None  # free
    assert run(_ops.remaining(CTX, "k"), [0])[0] == 1
    assert run(_ops.remaining(CTX, "k"), [-1])[0] == 1000  # no TTL: look again soon


def test_inspect_batch_reads_live_leases_and_skips_anything_else() -> None:
    names = [("a", b"p:{a}"), ("m", b"p:{m}"), ("b", b"p:{b}"), ("c", b"p:{c}"), ("d", b"p:{d}")]
    replies = [
        [
            b"7 owner-a",
            900,
            b"8:2 owner-bmd",
            800,
            b"not a lease",
            900,
            None,  # released since the scan
            -2,
            ValueError("WRONGTYPE"),  # another program's hash: an error in its place
            -1,
        ]
    ]
    records, [request] = run(_ops.inspect_batch(names), replies)
    assert records == [
        LeaseRecord("a", "owner-a", 7, 900),
        LeaseRecord("m", "owner-b", 8, 800, b"md"),
    ]
    assert isinstance(request, _ops.Pipelined)
    assert request.commands[:2] == (("GET", b"p:{a}"), ("PTTL", b"p:{a}"))
    assert len(request.commands) == 10


def test_bad_arguments_are_refused_before_any_request() -> None:
    bad: list[tuple[Any, ...]] = [
        (_ops.acquire, CTX, "", "me", 500),
        (_ops.acquire, CTX, "k", "me", 0),
        (_ops.acquire, CTX, "k", "me", True),
        (_ops.owner, CTX, "x" * 1025),
        (_ops.release, CTX, "k", ""),
        (_ops.release_grant, CTX, "k", "", 1),
        (_ops.renew, CTX, "k", "me", 1.5),
        (_ops.transfer, CTX, "k", "a", "", 500),
        (_ops.remaining, CTX, ""),
        (_ops.record, CTX, ""),
    ]
    for factory, *args in bad:
        # The factory itself raises: the operation never exists, nothing is sent.
        with pytest.raises(leasekit.InvalidLeaseArgument):
            factory(*args)
    with pytest.raises(leasekit.InvalidLeaseArgument, match="to_owner"):
        _ops.transfer(CTX, "k", "a", "", 500)
    for metadata in (b"x" * 4097, 5, "\ud800"):
        with pytest.raises(leasekit.InvalidLeaseArgument, match="metadata"):
            _ops.acquire(CTX, "k", "me", 500, metadata=metadata)
        with pytest.raises(leasekit.InvalidLeaseArgument, match="metadata"):
            _ops.transfer(CTX, "k", "a", "b", 500, metadata=metadata)


def test_a_transport_error_propagates_through_the_operation() -> None:
    with pytest.raises(ConnectionError):
        run(_ops.acquire(CTX, "k", "me", 500), [ConnectionError("gone")])


def test_both_providers_constructor_checks_are_one_function() -> None:
    assert _options.check("p:", 1, 5)[:3] == ("p:", 1.0, 5)
    with pytest.raises(leasekit.InvalidLeaseArgument, match="prefix"):
        _options.check("a{b", 1, 5)
    with pytest.raises(leasekit.InvalidLeaseArgument, match="timeout_s"):
        _options.check("p:", 0, 5)
    with pytest.raises(leasekit.InvalidLeaseArgument, match="counter_ttl_ms"):
        _options.check("p:", 1, 0)
    with pytest.raises(leasekit.InvalidLeaseArgument, match=r"client.*builtins\.str"):
        _options.check_client("not a client", (int,), "an int")


ACKED = _ops.context("p:", 1000, b"PUBLISH", 1, 200)


def test_with_min_replicas_writes_carry_a_wait_and_a_shortfall_is_an_unknown_outcome() -> None:
    result, sent = run(_ops.acquire(ACKED, "k", "me", 500), [(7, 1)])
    assert result.token == 7
    assert isinstance(sent[0], _ops.Acknowledged)
    assert sent[0].wait == ("WAIT", 1, 200)
    with pytest.raises(leasekit.LeaseBackendTimeout, match="acknowledged by 0 replica"):
        run(_ops.acquire(ACKED, "k", "me", 500), [(7, 0)])
    # Denied, refused: nothing was written, so the count does not matter.
    denied, _ = run(_ops.acquire(ACKED, "k", "me", 500), [(b"other", 0)])
    assert (denied.acquired, denied.owner) == (False, "other")
    assert run(_ops.renew(ACKED, "k", "me", 500), [(0, 0)])[0] is False
    with pytest.raises(leasekit.LeaseBackendTimeout, match="min_replicas=1"):
        run(_ops.renew(ACKED, "k", "me", 500), [(1, 0)])
    with pytest.raises(leasekit.LeaseBackendTimeout):
        run(_ops.transfer(ACKED, "k", "me", "you", 500), [(1, 0)])
    items = [("a", "me", 500), ("b", "me", 500)]
    assert run(_ops.renew_many(ACKED, items), [(b"00", 0)])[0] == [False, False]
    with pytest.raises(leasekit.LeaseBackendTimeout):
        run(_ops.renew_many(ACKED, items), [(b"01", 0)])
    # A WAIT that failed (an error reply in its place) is a shortfall too.
    with pytest.raises(leasekit.LeaseBackendTimeout, match="an error"):
        run(_ops.acquire(ACKED, "k", "me", 500), [(7, ValueError("WAIT refused"))])
    # Releases are sent alone, without WAIT.
    _, sent = run(_ops.release(ACKED, "k", "me"), [1])
    assert isinstance(sent[0], _ops.ScriptCall)


def test_acquire_slot_reads_grants_denials_and_a_limit_mismatch() -> None:
    granted, [call] = run(_slots.acquire_slot(CTX, "k", "me", 500, limit=3), [[1, 9, 2, 0]])
    assert granted == leasekit.SlotResult(True, "me", 9, 2, 3)
    assert (call.script, call.keys) == (_lua.SLOT_ACQUIRE, (b"p:{k}:slots", b"p:{k}:slotinfo"))
    assert call.args == (b"me", 500, 3, b"0", 1000, 500)
    denied, [call] = run(
        _slots.acquire_slot(CTX, "k", "me", 9000, limit=1, exclusive=True),
        [[0, 1, 1, 1, b"w", b"a"]],
    )
    assert denied == leasekit.SlotResult(False, None, None, 1, 1, ("a",), True, "w")
    assert call.args[3:] == (b"1", 1000, leasekit.EXCLUSIVE_INTENT_MS)
    unclaimed, _ = run(_slots.acquire_slot(FOREVER, "k", "me", 5, limit=2), [[0, 2, 2, 0, b""]])
    assert unclaimed.waiting is None
    with pytest.raises(leasekit.SlotLimitMismatch):
        run(_slots.acquire_slot(CTX, "k", "me", 5, limit=2), [[2, 4]])
    with pytest.raises(leasekit.LeaseBackendError):
        run(_slots.acquire_slot(CTX, "k", "me", 5, limit=2), [[7]])


def test_slot_holders_come_back_in_grant_order() -> None:
    holders, _ = run(_slots.slot_holders(CTX, "k"), [[b"b", 20, 5, b"a", 10, 0]])
    assert holders == [LeaseRecord("k", "a", 10, 1), LeaseRecord("k", "b", 20, 5)]
    with pytest.raises(leasekit.LeaseBackendError):
        run(_slots.slot_holders(CTX, "k"), [[b"a", 10]])


def test_acquire_in_turn_tells_a_free_key_not_yet_ones_turn() -> None:
    result, [call] = run(_ops.acquire_in_turn(CTX, "k", "me", 500, place_ttl_ms=3000), [[]])
    assert result == leasekit.LeaseResult(False, None, None)
    assert call.script is _lua.ACQUIRE_IN_TURN
    assert call.keys == (b"p:{k}", b"p:{k}:fence", b"p:{k}:line", b"p:{k}:places")
    assert call.args == (b"me", 500, 1500, b"PUBLISH", 3000)
    held, _ = run(_ops.acquire_in_turn(CTX, "k", "me", 500, place_ttl_ms=3000), [b"other"])
    assert held == leasekit.LeaseResult(False, "other", None)
    mine, _ = run(_ops.acquire_in_turn(CTX, "k", "me", 5, place_ttl_ms=9, metadata=b"m"), [7])
    assert mine == leasekit.LeaseResult(True, "me", 7, b"m")


def test_slot_and_in_turn_grants_wait_for_replicas() -> None:
    acked = _ops.context("p:", 1000, b"PUBLISH", 1, 100)
    granted, [request] = run(_slots.acquire_slot(acked, "k", "me", 5, limit=2), [([1, 9, 1, 0], 1)])
    assert granted.acquired
    assert isinstance(request, _ops.Acknowledged)
    assert request.wait == ("WAIT", 1, 100)
    with pytest.raises(leasekit.LeaseBackendTimeout):
        run(_slots.acquire_slot(acked, "k", "me", 5, limit=2), [([1, 9, 1, 0], 0)])
    denied, _ = run(_slots.acquire_slot(acked, "k", "me", 5, limit=2), [([0, 2, 2, 0, b""], 0)])
    assert not denied.acquired  # nothing written, nothing to acknowledge
    with pytest.raises(leasekit.LeaseBackendTimeout):
        run(_ops.acquire_in_turn(acked, "k", "me", 5, place_ttl_ms=9), [(7, 0)])
    assert not run(_ops.acquire_in_turn(acked, "k", "me", 5, place_ttl_ms=9), [([], 0)])[0].acquired
    with pytest.raises(leasekit.LeaseBackendTimeout):
        run(_slots.transfer_slot(acked, "k", "a", "b", 5), [(1, 0)])
