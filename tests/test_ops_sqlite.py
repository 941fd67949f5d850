"""The SQLite backend's operations, without a file: requests checked, replies fed by hand.

Each operation is driven by :func:`leasekit.backend.drive` over a scripted exchange
that records every :class:`~leasekit_sqlite._ops.Query` and answers it from a list
(an exception in the list is raised, as the transport would). The last tests run the
statements on an in-memory ``sqlite3`` connection, used as a plain library.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

import pytest
from leasekit_sqlite import _ops, _sql
from leasekit_sqlite._options import DatabaseUnavailable

from leasekit import InvalidLeaseArgument, LeaseResult
from leasekit.backend import LeaseRecord, drive


class Script:
    """An exchange that answers from ``replies`` in order and records what was asked."""

    def __init__(self, replies: Iterable[Any]) -> None:
        self.replies = list(replies)
        self.queries: list[_ops.Query] = []

    def __call__(self, query: _ops.Query) -> Any:
        self.queries.append(query)
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    @property
    def statements(self) -> list[str]:
        return [q.statement for q in self.queries]


def run(operation: _ops.Op[Any], *replies: Any) -> tuple[Any, Script]:
    script = Script(replies)
    result = drive(operation, script)
    assert script.replies == [], "replies left over: the operation sent fewer queries"
    return result, script


BEGIN, COMMIT, ROLLBACK = _sql.BEGIN, _sql.COMMIT, _sql.ROLLBACK


# -- the contract -------------------------------------------------------------------------


def test_acquire_is_one_upsert_whose_returned_token_is_the_grant() -> None:
    result, script = run(_ops.acquire("k\0é", "a", 1500), [(7,)])
    assert result == LeaseResult(True, "a", 7)
    (query,) = script.queries
    assert (query.statement, query.reads) == (_sql.ACQUIRE, "rows")
    assert query.params == {
        "key": "k\0é".encode(),
        "owner": b"a",
        "ttl_ms": 1500,
        "metadata": None,
    }
    # Metadata goes with the same statement, and the grant echoes it.
    result, script = run(_ops.acquire("k", "a", 1500, b"\0host:1"), [(8,)])
    assert result == LeaseResult(True, "a", 8, b"\0host:1")
    assert [q.params["metadata"] for q in script.queries] == [b"\0host:1"]


def test_a_denied_acquire_reads_the_holder_in_a_statement_of_its_own() -> None:
    result, script = run(_ops.acquire("k", "a", 1000), [], (b"b", b"10.0.0.2:80"))
    assert result == LeaseResult(False, "b", None, b"10.0.0.2:80")
    assert script.statements == [_sql.ACQUIRE, _sql.HOLDER]
    result, script = run(_ops.acquire("k", "a", 1000), [], (b"b", None))
    assert result == LeaseResult(False, "b", None)


@pytest.mark.parametrize("holder", [None, (b"a", None)])
def test_a_denial_the_holder_read_cannot_explain_is_decided_again_in_one_transaction(
    holder: tuple[bytes, None] | None,
) -> None:
    # Freed in between (None), or now held by the caller itself: both statements again,
    # inside BEGIN IMMEDIATE, so the answer is consistent.
    result, script = run(_ops.acquire("k", "a", 1000), [], holder, None, [(3,)], None)
    assert result == LeaseResult(True, "a", 3)
    assert script.statements == [_sql.ACQUIRE, _sql.HOLDER, BEGIN, _sql.ACQUIRE, COMMIT]

    replies = ([], holder, None, [], (b"c", b"m"), None)
    result, script = run(_ops.acquire("k", "a", 1000), *replies)
    assert result == LeaseResult(False, "c", None, b"m")
    assert script.statements == [
        _sql.ACQUIRE,
        _sql.HOLDER,
        BEGIN,
        _sql.ACQUIRE,
        _sql.HOLDER,
        COMMIT,
    ]


def test_a_failure_inside_a_transaction_rolls_it_back_and_propagates() -> None:
    failure = sqlite3.OperationalError("disk I/O error")
    script = Script([[], None, None, failure, None])
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        drive(_ops.acquire("k", "a", 1000), script)
    assert script.statements == [_sql.ACQUIRE, _sql.HOLDER, BEGIN, _sql.ACQUIRE, ROLLBACK]


def test_a_rollback_that_fails_too_leaves_the_first_error() -> None:
    first, second = sqlite3.OperationalError("first"), sqlite3.ProgrammingError("closed")
    script = Script([[], None, None, first, second])
    with pytest.raises(sqlite3.OperationalError, match="first"):
        drive(_ops.acquire("k", "a", 1000), script)


@pytest.mark.parametrize(
    ("operation", "statement", "params"),
    [
        (lambda: _ops.release("k", "a"), _sql.RELEASE, {"key": b"k", "owner": b"a"}),
        (
            lambda: _ops.release_grant("k", "a", 9),
            _sql.RELEASE_GRANT,
            {"key": b"k", "owner": b"a", "token": 9},
        ),
        (
            lambda: _ops.renew("k", "a", 10),
            _sql.RENEW,
            {"key": b"k", "owner": b"a", "ttl_ms": 10},
        ),
        (
            lambda: _ops.transfer("k", "a", "b", 10),
            _sql.TRANSFER,
            {"key": b"k", "from_owner": b"a", "to_owner": b"b", "ttl_ms": 10, "metadata": None},
        ),
        (
            lambda: _ops.transfer("k", "a", "b", 10, "é"),
            _sql.TRANSFER,
            {
                "key": b"k",
                "from_owner": b"a",
                "to_owner": b"b",
                "ttl_ms": 10,
                "metadata": "é".encode(),
            },
        ),
    ],
)
def test_the_conditional_writes_are_one_statement_that_changed_one_row_or_none(
    operation: Any, statement: str, params: dict[str, Any]
) -> None:
    for rowcount, expected in ((1, True), (0, False)):
        result, script = run(operation(), rowcount)
        assert result is expected
        assert script.queries == [_ops.Query(statement, params, "rowcount")]


def test_owner_reads_the_live_holder() -> None:
    assert run(_ops.owner("k"), (b"\0a",))[0] == "\0a"
    assert run(_ops.owner("k"), None)[0] is None


@pytest.mark.parametrize(
    "build",
    [
        lambda: _ops.acquire("", "a", 1000),
        lambda: _ops.acquire("k", "a", 0),
        lambda: _ops.acquire("k", "a", 1.5),
        lambda: _ops.owner(""),
        lambda: _ops.release("k", ""),
        lambda: _ops.renew("k", "a", True),
        lambda: _ops.transfer("k", "a", "", 1000),
        lambda: _ops.remaining(""),
        lambda: _ops.renew_many([("k", "", 1000)]),
        lambda: _ops.inspect("", 10),
        lambda: _ops.inspect(None, 0),
        lambda: _ops.inspect(None, True),
    ],
)
def test_bad_arguments_are_refused_when_the_operation_is_built(build: Any) -> None:
    # Before any query: the factory raises, no generator is ever driven.
    with pytest.raises(InvalidLeaseArgument):
        build()


# -- beyond the contract ------------------------------------------------------------------


def test_remaining_is_at_least_one_millisecond_while_live() -> None:
    assert run(_ops.remaining("k"), (250,))[0] == 250
    assert run(_ops.remaining("k"), (0,))[0] == 1
    assert run(_ops.remaining("k"), None)[0] is None


def test_renew_many_is_one_transaction_with_each_renewals_own_answer() -> None:
    items = [("a", "o", 100), ("b", "o", 200)]
    result, script = run(_ops.renew_many(items), None, 1, 0, None)
    assert result == [True, False]
    assert script.statements == [BEGIN, _sql.RENEW, _sql.RENEW, COMMIT]
    assert script.queries[2].params == {"key": b"b", "owner": b"o", "ttl_ms": 200}
    assert run(_ops.renew_many([]))[0] == []  # nothing sent


def test_inspect_reads_records_in_the_order_given() -> None:
    rows = [(b"a\0", b"x", 3, 900, None), (b"b", b"y", 1, 20, b"m")]
    result, script = run(_ops.inspect("a", limit=5), rows)
    assert result == [LeaseRecord("a\0", "x", 3, 900), LeaseRecord("b", "y", 1, 20, b"m")]
    assert script.queries[0].params == {"prefix": b"a", "limit": 5}
    assert run(_ops.inspect(None, 1), [])[1].queries[0].params == {"prefix": None, "limit": 1}


def test_migrate_creates_the_schema_in_one_transaction_and_reads_its_version() -> None:
    create = [None, *(None for _ in _sql.CREATE_SCHEMA), None]
    upgrade = [None, (_sql.SCHEMA_VERSION,), None]  # BEGIN, the version: current, COMMIT
    replies = [*create, *upgrade, (_sql.SCHEMA_VERSION,)]
    result, script = run(_ops.migrate(), *replies)
    assert result == _sql.SCHEMA_VERSION
    assert script.statements == [
        BEGIN,
        *_sql.CREATE_SCHEMA,
        COMMIT,
        BEGIN,
        _sql.SCHEMA_VERSION_QUERY,
        COMMIT,
        _sql.SCHEMA_VERSION_QUERY,
    ]


def test_an_older_schema_is_upgraded_in_one_transaction_that_reads_the_version_again() -> None:
    writes = [None for _ in (*_sql.CREATE_SCHEMA, *_sql.UPGRADE_TO_2)]
    old = run(_ops.prepare("f.db", create=True), ("wal",), (1,), None, (1,), *writes, None)[1]
    assert old.statements == [
        _sql.JOURNAL_MODE,
        _sql.SCHEMA_VERSION_QUERY,
        BEGIN,
        _sql.SCHEMA_VERSION_QUERY,
        *_sql.CREATE_SCHEMA,  # the tables version 2 added (IF NOT EXISTS)
        *_sql.UPGRADE_TO_2,
        COMMIT,
    ]
    # Another process upgraded in between: nothing to do once the lock is held.
    raced = run(_ops.prepare("f.db", create=True), ("wal",), (1,), None, (2,), None)[1]
    assert raced.statements[2:] == [BEGIN, _sql.SCHEMA_VERSION_QUERY, COMMIT]
    # Without create, nothing is written: the error says how to upgrade.
    script = Script([(1,)])
    with pytest.raises(DatabaseUnavailable, match=r"schema version 1.*leasekit migrate"):
        drive(_ops.prepare("f.db", create=False), script)
    assert script.statements == [_sql.SCHEMA_VERSION_QUERY]


def test_record_reads_owner_token_time_left_and_metadata_in_one_statement() -> None:
    result, script = run(_ops.record("k\0"), (b"a", 4, 0, b"\xff"))
    assert result == LeaseRecord("k\0", "a", 4, 1, b"\xff")  # at least 1 ms while live
    assert script.queries == [_ops.Query(_sql.RECORD, {"key": b"k\0"})]
    assert run(_ops.record("k"), None)[0] is None


def test_prepare_writes_only_what_a_file_lacks() -> None:
    ready = run(_ops.prepare("f.db", create=True), ("wal",), (_sql.SCHEMA_VERSION,))[1]
    assert ready.statements == [_sql.JOURNAL_MODE, _sql.SCHEMA_VERSION_QUERY]

    missing = sqlite3.OperationalError("no such table: leasekit_meta")
    schema = [None, *(None for _ in _sql.CREATE_SCHEMA), None]  # BEGIN ... COMMIT
    new = run(_ops.prepare("f.db", create=True), ("delete",), [], missing, *schema)[1]
    assert new.statements == [
        _sql.JOURNAL_MODE,
        _sql.USE_WAL,
        _sql.SCHEMA_VERSION_QUERY,
        BEGIN,
        *_sql.CREATE_SCHEMA,
        COMMIT,
    ]


def test_prepare_without_create_writes_nothing_and_names_the_file() -> None:
    missing = sqlite3.OperationalError("no such table: leasekit_meta")
    script = Script([missing])
    with pytest.raises(DatabaseUnavailable, match=r"'f\.db' holds no leasekit tables"):
        drive(_ops.prepare("f.db", create=False), script)
    assert script.statements == [_sql.SCHEMA_VERSION_QUERY]
    # Any other error is the store's own.
    with pytest.raises(sqlite3.OperationalError, match="disk"):
        drive(_ops.prepare("f.db", create=False), Script([sqlite3.OperationalError("disk")]))


# -- the sweep ----------------------------------------------------------------------------


def test_every_nth_write_carries_a_sweep_that_skips_a_small_table() -> None:
    sweeper = _ops.Sweeper(every=2, batch=4)
    first = _ops.release("k", "a")
    assert sweeper.after_write(first) is first
    # The second: the write, then one read of the first window, which holds fewer keys
    # than a batch: left alone, nothing written.
    result, script = run(sweeper.after_write(_ops.release("k", "a")), 1, [(1000, b"k", 3)])
    assert result is True
    assert script.statements == [_sql.RELEASE, _sql.SWEEP_WINDOW]
    assert script.queries[1].params == {"after": _sql.SWEEP_START, "batch": 4}


def test_a_sweep_walks_windows_and_moves_its_cursor_only_once_committed() -> None:
    sweeper = _ops.Sweeper(every=1000, batch=2)
    # A full window: its expired rows go, the floor raised over them first.
    deleted, script = run(sweeper.sweep(), None, (1000, b"b", 2), 1, 2, None)
    assert deleted == 2
    assert script.statements == [
        BEGIN,
        _sql.SWEEP_WINDOW,
        _sql.SWEEP_RAISE_FLOOR,
        _sql.SWEEP_DELETE,
        COMMIT,
    ]
    assert script.queries[2].params == {"after": b"", "last": b"b", "cutoff": 1000}
    # The next window starts after b; a failed commit leaves the cursor there.
    failure = sqlite3.OperationalError("disk I/O error")
    with pytest.raises(sqlite3.OperationalError):
        drive(sweeper.sweep(), Script([None, (1001, b"c", 1), 1, 1, failure, None]))
    deleted, script = run(sweeper.sweep(), None, (1002, b"c", 1), 1, 0, None)
    assert script.queries[1].params == {"after": b"b", "batch": 2}
    # That window was short: the pass is over, the next starts from the beginning.
    deleted, script = run(sweeper.sweep(), None, (1003, None, 0), None)
    assert script.queries[1].params == {"after": _sql.SWEEP_START, "batch": 2}
    assert deleted == 0


def test_a_window_of_nothing_but_expired_rows_sweeps_again_on_the_next_write() -> None:
    sweeper = _ops.Sweeper(every=1000, batch=2)
    run(sweeper.sweep(), None, (1000, b"b", 2), 1, 2, None)
    write = _ops.release("k", "a")
    assert sweeper.after_write(write) is not write  # not 1000 writes later
    following = _ops.release("k", "a")
    assert sweeper.after_write(following) is following


# -- the statements themselves, on an in-memory database ---------------------------------


def test_the_operations_keep_tokens_rising_across_release_and_sweep() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)

    def exchange(query: _ops.Query) -> Any:
        cursor = conn.execute(query.statement, query.params)
        if query.reads == "rowcount":
            return cursor.rowcount
        return cursor.fetchone() if query.reads == "one" else cursor.fetchall()

    drive(_ops.prepare(":memory:", create=True), exchange)
    assert drive(_ops.migrate(), exchange) == _sql.SCHEMA_VERSION
    first = drive(_ops.acquire("k", "a", 60_000), exchange)
    assert first.acquired
    assert first.token is not None
    assert drive(_ops.acquire("k", "a", 60_000), exchange) == first  # idempotent
    assert drive(_ops.acquire("k", "b", 60_000), exchange) == LeaseResult(False, "a", None)
    assert drive(_ops.transfer("k", "a", "b", 60_000), exchange)
    assert drive(_ops.owner("k"), exchange) == "b"
    assert drive(_ops.release("k", "b"), exchange)
    assert drive(_ops.owner("k"), exchange) is None
    assert drive(_ops.Sweeper(every=1, batch=10).sweep(), exchange) == 1
    assert drive(_ops.row_count(), exchange) == 0
    again = drive(_ops.acquire("k", "c", 60_000), exchange)
    assert again.token is not None
    assert again.token > first.token + 1  # above the transfer's token, though swept
    conn.close()


@pytest.mark.parametrize("action", ["reacquire", "transfer"])
def test_a_slot_that_runs_out_between_a_transactions_read_and_write_stays_the_callers(
    action: str,
) -> None:
    """SQLite reads its clock afresh for each statement: a holder's slot can be live when
    its acquire or transfer reads the key's state and past its last millisecond when the
    same transaction writes. No other writer can come in between, so the slot is still
    the caller's: the acquire that answers "granted" must have reset its TTL (it left
    the slot expired, so the holder was refused its next transfer before the TTL it was
    told of could run out), and the transfer must hand it on. The clock's step is made
    here by moving the slot's expiry into the past right after the state is read."""
    from leasekit_sqlite import _slots  # noqa: PLC0415

    conn = sqlite3.connect(":memory:", isolation_level=None)
    expire_after_state = False

    def exchange(query: _ops.Query) -> Any:
        cursor = conn.execute(query.statement, query.params)
        if query.reads == "rowcount":
            reply: Any = cursor.rowcount
        else:
            reply = cursor.fetchone() if query.reads == "one" else cursor.fetchall()
        if expire_after_state and query.statement == _sql.SLOT_STATE:
            conn.execute(f"UPDATE leasekit_slots SET expires_at_ms = {_sql.NOW_MS} - 1")
        return reply

    drive(_ops.prepare(":memory:", create=True), exchange)
    granted = drive(_slots.acquire_slot("k", "a", 60_000, 1), exchange)
    assert granted.acquired
    expire_after_state = True
    if action == "reacquire":
        again = drive(_slots.acquire_slot("k", "a", 60_000, 1), exchange)
        assert (again.acquired, again.token) == (True, granted.token)
        expire_after_state = False
        (record,) = drive(_slots.slot_holders("k"), exchange)
        assert (record.owner, record.token) == ("a", granted.token)
        assert record.remaining_ms > 50_000
    else:
        assert drive(_slots.transfer_slot("k", "a", "b", 60_000), exchange)
        expire_after_state = False
        (record,) = drive(_slots.slot_holders("k"), exchange)
        assert record.owner == "b"
        assert record.token is not None
        assert granted.token is not None
        assert record.token > granted.token
    conn.close()
