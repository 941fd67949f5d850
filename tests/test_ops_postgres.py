"""The PostgreSQL backend's operations without a server: requests checked, replies fed by hand.

Each operation of ``leasekit_postgres._ops`` is a generator that yields a ``Query`` and
is sent its reply; here the replies are written out, so what a statement's result
means (a denied acquire, a raced brand-new key, a missing meta table) is tested
apart from any connection, and so is the eager validation of every factory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from servers import missing_extra

from leasekit import InvalidLeaseArgument, LeaseBackendError, LeaseResult
from leasekit.backend import LeaseRecord, drive

try:
    import psycopg.errors
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("postgres", "the PostgreSQL operation tests")

from leasekit_postgres import _ops, _sql
from leasekit_postgres._options import provider_settings

SQL = _sql.Statements(_sql.TableName(None, "leases"))


def replay(
    operation: _ops.Operation[Any], replies: Sequence[object]
) -> tuple[list[_ops.Query], Any]:
    """Run ``operation`` on ``replies`` (an exception is raised in its place); the queries sent."""
    sent: list[_ops.Query] = []
    answers = iter(replies)

    def exchange(query: _ops.Query) -> object:
        sent.append(query)
        answer = next(answers)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    result = drive(operation, exchange, throws=psycopg.Error)
    assert next(answers, None) is None, "a reply was left unread"
    return sent, result


# -- acquire ---------------------------------------------------------------------------------


def test_acquire_granted_returns_the_token_after_one_statement() -> None:
    sent, result = replay(_ops.acquire(SQL, "k\0x", "alice", 1000), [(7, None, None)])
    assert result == LeaseResult(True, "alice", 7)
    assert [q.statement for q in sent] == [SQL.acquire]
    assert sent[0].params == {
        "key": b"k\0x",
        "owner": b"alice",
        "ttl_ms": 1000,
        "metadata": None,
    }
    assert sent[0].reads == "row"


def test_acquire_stores_metadata_as_bytes_and_returns_it() -> None:
    sent, result = replay(_ops.acquire(SQL, "k", "alice", 1000, "é:1"), [(7, None, None)])
    assert result == LeaseResult(True, "alice", 7, "é:1".encode())
    assert sent[0].params["metadata"] == "é:1".encode()


def test_acquire_on_a_channel_sends_the_statement_that_hints_grants() -> None:
    reply = (7, None, None, None)  # the fourth column: pg_notify's void, or NULL
    sent, result = replay(_ops.acquire(SQL, "k", "alice", 1000, None, notify=True), [reply])
    assert result == LeaseResult(True, "alice", 7)
    assert [q.statement for q in sent] == [SQL.acquire_notify]
    assert "channel" not in (sent[0].params or {})
    assert b"pg_notify('leases_released', '+' || encode(key, 'hex'))" in SQL.acquire_notify
    assert b"pg_notify" not in SQL.acquire


def test_acquire_denied_names_the_holder_and_its_metadata() -> None:
    _, result = replay(_ops.acquire(SQL, "k", "bob", 1000), [(None, "é".encode(), b"\0\xff")])
    assert result == LeaseResult(False, "é", None, b"\0\xff")
    _, result = replay(_ops.acquire(SQL, "k", "bob", 1000), [(None, b"carol", None)])
    assert result == LeaseResult(False, "carol", None, None)


def test_acquire_refuses_bad_metadata_before_any_io() -> None:
    with pytest.raises(InvalidLeaseArgument) as refused:
        _ops.acquire(SQL, "k", "bob", 1000, b"x" * 4097)
    assert refused.value.argument == "metadata"
    with pytest.raises(InvalidLeaseArgument):
        _ops.transfer(SQL, "k", "a", "b", 1000, metadata=5)  # type: ignore[arg-type]


def test_acquire_denied_by_a_newer_row_asks_who_holds_it() -> None:
    replies = [(None, None, None), (b"carol", 3, b"c:1", 900)]
    sent, result = replay(_ops.acquire(SQL, "k", "bob", 1000), replies)
    assert [q.statement for q in sent] == [SQL.acquire, SQL.record]
    assert result == LeaseResult(False, "carol", None, b"c:1")


def test_acquire_denied_by_a_row_that_expired_since_reports_no_holder() -> None:
    _, result = replay(_ops.acquire(SQL, "k", "bob", 1000), [(None, None, None), None])
    assert result == LeaseResult(False, None, None)


def test_acquire_handed_the_key_between_two_reads_acquires_again() -> None:
    replies = [(None, None, None), (b"bob", 9, None, 900), (9, None, None)]
    sent, result = replay(_ops.acquire(SQL, "k", "bob", 1000), replies)
    assert [q.statement for q in sent] == [SQL.acquire, SQL.record, SQL.acquire]
    assert result == LeaseResult(True, "bob", 9)


def test_acquire_without_a_row_is_a_backend_error() -> None:
    with pytest.raises(LeaseBackendError, match="no row"):
        replay(_ops.acquire(SQL, "k", "bob", 1000), [None])


# -- the other contract operations ------------------------------------------------------------


def test_owner_decodes_the_holder_or_none() -> None:
    assert replay(_ops.owner(SQL, "k"), [(b"alice",)])[1] == "alice"
    sent, holder = replay(_ops.owner(SQL, "k"), [None])
    assert holder is None
    assert (sent[0].statement, sent[0].params) == (SQL.owner, {"key": b"k"})


def test_release_notifies_on_the_channel_only_when_given_one() -> None:
    sent, released = replay(_ops.release(SQL, "k", "alice"), [1])
    assert (sent[0].statement, sent[0].reads) == (SQL.release, "rowcount")
    assert released is True  # rowcount 1: the statement freed alice's lease
    assert "channel" not in (sent[0].params or {})
    sent, released = replay(_ops.release(SQL, "k", "alice", "leases_released"), [0])
    assert released is False
    assert sent[0].statement == SQL.release_notify
    assert sent[0].params == {"key": b"k", "owner": b"alice", "channel": "leases_released"}


def test_release_grant_is_conditioned_on_the_token() -> None:
    sent, _ = replay(_ops.release_grant(SQL, "k", "alice", 42), [1])
    assert sent[0].statement == SQL.release_grant
    assert sent[0].params == {"key": b"k", "owner": b"alice", "token": 42}
    sent, _ = replay(_ops.release_grant(SQL, "k", "alice", 42, "c"), [1])
    assert sent[0].statement == SQL.release_grant_notify
    assert sent[0].params is not None
    assert sent[0].params["channel"] == "c"


def test_renew_and_transfer_read_the_row_count() -> None:
    assert replay(_ops.renew(SQL, "k", "alice", 5), [1])[1] is True
    assert replay(_ops.renew(SQL, "k", "alice", 5), [0])[1] is False
    sent, moved = replay(_ops.transfer(SQL, "k", "alice", "bob", 5, channel="c"), [1])
    assert moved is True
    assert sent[0].statement == SQL.transfer_notify
    assert sent[0].params == {
        "key": b"k",
        "from_owner": b"alice",
        "to_owner": b"bob",
        "ttl_ms": 5,
        "metadata": None,
        "channel": "c",
    }
    assert replay(_ops.transfer(SQL, "k", "alice", "bob", 5), [0])[1] is False
    sent, _ = replay(_ops.transfer(SQL, "k", "alice", "bob", 5, metadata="b"), [1])
    assert sent[0].params["metadata"] == b"b"


def test_a_transfer_to_oneself_is_a_renewal_and_notifies_nobody() -> None:
    sent, moved = replay(_ops.transfer(SQL, "k", "alice", "alice", 5, channel="c"), [1])
    assert moved is True
    assert sent[0].statement == SQL.transfer


def test_record_reads_owner_token_metadata_and_time_left() -> None:
    sent, record = replay(_ops.record(SQL, "k\0"), [(b"alice", 3, b"\0m", 0)])
    assert record == LeaseRecord("k\0", "alice", 3, 1, b"\0m")
    assert sent[0].statement == SQL.record
    assert replay(_ops.record(SQL, "k"), [None])[1] is None


# -- beyond the contract ---------------------------------------------------------------------


def test_renew_many_maps_returned_positions_to_items() -> None:
    items = [("a", "x", 10), ("b", "y", 20), ("c", "z", 30)]
    sent, renewed = replay(_ops.renew_many(SQL, items), [[(1,), (3,)]])
    assert renewed == [True, False, True]
    assert sent[0].params == {
        "keys": [b"a", b"b", b"c"],
        "owners": [b"x", b"y", b"z"],
        "ttls_ms": [10, 20, 30],
    }


def test_renew_many_of_nothing_sends_nothing() -> None:
    assert replay(_ops.renew_many(SQL, []), []) == ([], [])


def test_inspect_reads_records_and_turns_a_prefix_into_a_key_range() -> None:
    rows = [(b"job/1", b"alice", 3, 0, None), (b"job/2", b"bob", 4, 1500, b"b:2")]
    sent, records = replay(_ops.inspect(SQL, "job/", 10), [rows])
    assert records == [
        LeaseRecord("job/1", "alice", 3, 1),
        LeaseRecord("job/2", "bob", 4, 1500, b"b:2"),
    ]
    assert sent[0].statement == SQL.inspect_prefix
    assert sent[0].params == {"limit": 10, "low": b"job/", "high": b"job0"}
    sent, _ = replay(_ops.inspect(SQL), [[]])
    assert (sent[0].statement, sent[0].params) == (SQL.inspect_all, {"limit": 1000})


def test_remaining_sweep_row_count_and_end_process() -> None:
    assert replay(_ops.remaining(SQL, "k"), [(0,)])[1] == 1  # never 0 while live
    assert replay(_ops.remaining(SQL, "k"), [None])[1] is None
    sent, deleted = replay(_ops.sweep(SQL, 600.0, 50), [50])
    assert deleted == 50
    assert sent[0].params == {"grace_s": 600.0, "batch": 50}
    assert replay(_ops.row_count(SQL), [(12,)])[1] == 12
    assert replay(_ops.end_process(99, 400), [[(True,)]])[1] is True
    assert replay(_ops.end_process(99, 400), [[(False,)]])[1] is False
    assert replay(_ops.end_process(99, 400), [[]])[1] is True  # already gone


# -- the schema ------------------------------------------------------------------------------


def test_ensure_schema_creates_a_missing_table() -> None:
    missing = psycopg.errors.UndefinedTable("no meta table")
    sent, _ = replay(_ops.ensure_schema(SQL, "leases", create=True), [missing, -1])
    assert [q.statement for q in sent] == [SQL.schema_version, SQL.migrate]
    assert sent[1].prepare is False  # several commands: never prepared


def test_ensure_schema_accepts_the_current_version_with_one_read() -> None:
    sent, _ = replay(_ops.ensure_schema(SQL, "leases", create=False), [(_sql.SCHEMA_VERSION,)])
    assert len(sent) == 1


def test_ensure_schema_refuses_a_newer_schema_and_a_missing_one_it_may_not_create() -> None:
    newer = [(_sql.SCHEMA_VERSION + 1,)]
    with pytest.raises(LeaseBackendError, match="newer"):
        replay(_ops.ensure_schema(SQL, "leases", create=True), newer)
    with pytest.raises(LeaseBackendError, match="leasekit migrate"):
        replay(_ops.ensure_schema(SQL, "leases", create=False), [None])


def test_create_schema_runs_again_after_a_concurrent_creation_then_gives_up() -> None:
    raced = psycopg.errors.UniqueViolation("created at the same moment")
    sent, version = replay(_ops.migrate(SQL), [raced, -1, (_sql.SCHEMA_VERSION,)])
    assert [q.statement for q in sent] == [SQL.migrate, SQL.migrate, SQL.schema_version]
    assert version == _sql.SCHEMA_VERSION
    with pytest.raises(psycopg.errors.UniqueViolation):
        replay(_ops.create_schema(SQL), [raced, raced, raced])


# -- validation, before any I/O --------------------------------------------------------------

BAD_CALLS: list[tuple[str, Callable[[], object]]] = [
    ("key", lambda: _ops.acquire(SQL, "", "a", 1)),
    ("owner", lambda: _ops.acquire(SQL, "k", 7, 1)),  # type: ignore[arg-type]
    ("ttl_ms", lambda: _ops.acquire(SQL, "k", "a", 1.5)),  # type: ignore[arg-type]
    ("key", lambda: _ops.owner(SQL, "x" * 2000)),
    ("owner", lambda: _ops.release(SQL, "k", "")),
    ("owner", lambda: _ops.release_grant(SQL, "k", "", 1)),
    ("ttl_ms", lambda: _ops.renew(SQL, "k", "a", 0)),
    ("to_owner", lambda: _ops.transfer(SQL, "k", "a", "", 1)),
    ("from_owner", lambda: _ops.transfer(SQL, "k", "", "b", 1)),
    ("items", lambda: _ops.renew_many(SQL, "abc")),  # type: ignore[arg-type]
    ("prefix", lambda: _ops.inspect(SQL, "")),
    ("limit", lambda: _ops.inspect(SQL, None, 0)),
    ("key", lambda: _ops.remaining(SQL, "")),
]


@pytest.mark.parametrize(("argument", "call"), BAD_CALLS, ids=[a for a, _ in BAD_CALLS])
def test_every_factory_validates_before_returning_an_operation(
    argument: str, call: Callable[[], object]
) -> None:
    with pytest.raises(InvalidLeaseArgument) as raised:
        call()
    assert raised.value.argument == argument


# -- what both providers share ---------------------------------------------------------------


def test_sweep_schedule_counts_writes_and_sweeps_again_after_a_full_batch() -> None:
    schedule = _ops.SweepSchedule(every=3, batch=10)
    assert [schedule.wrote() for _ in range(3)] == [False, False, True]
    schedule.started()
    assert not schedule.wrote()
    schedule.swept(10)  # a full batch: a backlog
    assert schedule.wrote()
    never = _ops.SweepSchedule(every=0, batch=10)
    assert not any(never.wrote() for _ in range(5))


def test_provider_settings_check_the_grace_and_derive_the_channel() -> None:
    settings = provider_settings({"table": "app.jobs"})
    assert settings.channel == "app.jobs_released"
    assert settings.capabilities.release_notifications
    quiet = provider_settings({"notifications": False})
    assert quiet.channel is None
    assert not quiet.capabilities.release_notifications
    with pytest.raises(InvalidLeaseArgument, match="sweep_grace_s"):
        provider_settings({"timeout_s": 10, "sweep_grace_s": 5})
    with pytest.raises(InvalidLeaseArgument, match="table"):
        provider_settings({"table": "no-dashes"})


# -- the one retry after a lost connection --------------------------------------------------


def test_attempts_runs_an_idempotent_operation_once_more_after_a_lost_connection() -> None:
    args = (SQL, "k")
    policy = _ops.attempts(_ops.owner(*args), _ops.owner, args)
    first = next(policy)
    assert not isinstance(first, _ops.Retry)
    first.close()
    retry = policy.throw(_ops.ConnectionLost("server closed the connection unexpectedly"))
    assert isinstance(retry, _ops.Retry)  # the transport tests the pool's idle ones first
    sent, holder = replay(retry.operation, [(b"a",)])
    assert [q.statement for q in sent] == [SQL.owner]
    with pytest.raises(StopIteration) as done:
        policy.send(holder)
    assert done.value.value == "a"


def test_attempts_gives_up_after_a_second_loss_and_never_retries_a_transfer() -> None:
    args = (SQL, "k")
    policy = _ops.attempts(_ops.owner(*args), _ops.owner, args)
    next(policy).close()
    retry = policy.throw(_ops.ConnectionLost("lost"))
    assert isinstance(retry, _ops.Retry)
    retry.operation.close()
    with pytest.raises(_ops.ConnectionLost, match="again"):
        policy.throw(_ops.ConnectionLost("again"))
    transfer = _ops.attempts(_ops.transfer(SQL, "k", "a", "b", 1000), None, ())
    next(transfer).close()
    with pytest.raises(_ops.ConnectionLost):
        transfer.throw(_ops.ConnectionLost("lost"))
    # A statement that failed on the server is no lost connection: never retried.
    policy = _ops.attempts(_ops.owner(*args), _ops.owner, args)
    next(policy).close()
    with pytest.raises(psycopg.errors.QueryCanceled):
        policy.throw(psycopg.errors.QueryCanceled("statement timeout"))
