"""The MySQL operations (``leasekit_mysql._ops``) and options, without a server.

Each operation is driven with replies written by hand: the statements it sends, what
it makes of the replies, which driver errors it retries, and that bad input is
refused before the first statement. Also the error table and URL parsing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from servers import missing_extra

from leasekit import (
    InvalidLeaseArgument,
    LeaseBackendError,
    LeaseBackendTimeout,
    LeaseBackendUnreachable,
    LeaseResult,
)
from leasekit.backend import LeaseRecord, Operation, drive

try:
    import pymysql
    from asyncmy import errors as asyncmy_errors
except ImportError:  # pragma: no cover (depends on the environment)
    missing_extra("mysql", "the MySQL tests")

from leasekit_mysql import _ops, _options, _sql

_T = TypeVar("_T")

SETTINGS = _options.settings({"table": "db.leases"})
STATEMENTS = _sql.Statements(SETTINGS.table, _sql.TOKENS_SEQUENCE)


def statements() -> _sql.Statements:
    return STATEMENTS


def unused() -> _sql.Statements:
    raise AssertionError("an operation with bad input must not start")


def run(op: Operation[_ops.Request, _T], replies: list[Any]) -> tuple[_T, list[_ops.Statement]]:
    """Drive ``op`` with ``replies`` in order (an exception is raised by the exchange)."""
    sent: list[_ops.Statement] = []

    def exchange(request: _ops.Request) -> Any:
        sent.append(_ops.Statement(*request))
        reply = replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    result = drive(op, exchange)
    assert not replies, "every reply was read"
    return result, sent


def lost() -> Exception:
    return pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")


def timed_out() -> Exception:
    """What PyMySQL raises when its read timeout (the operation's deadline) passes."""
    error = lost()
    error.__context__ = TimeoutError("timed out")
    return error


def deadlock() -> Exception:
    return asyncmy_errors.OperationalError(1213, "Deadlock found when trying to get lock")


# -- the contract --------------------------------------------------------------------------


def test_acquire_is_one_statement_that_reads_the_token() -> None:
    result, sent = run(_ops.acquire(statements, "k\0é", "a", 1500), [7])
    assert result == LeaseResult(True, "a", 7)
    [statement] = sent
    assert statement.sql == STATEMENTS.acquire_bare  # no metadata: NULL, not a parameter
    assert statement.reads == "lastrowid"
    assert statement.params == {"key": "k\0é".encode(), "owner": b"a", "ttl_us": 1_500_000}
    assert "%(metadata)s" not in STATEMENTS.acquire_bare
    assert STATEMENTS.acquire_bare == STATEMENTS.acquire.replace("%(metadata)s", "NULL")


def test_acquire_stores_metadata_as_bytes_and_returns_it() -> None:
    result, [statement] = run(_ops.acquire(statements, "k", "a", 1500, "é:1"), [7])
    assert result == LeaseResult(True, "a", 7, "é:1".encode())
    assert statement.sql == STATEMENTS.acquire
    assert statement.params is not None
    assert statement.params["metadata"] == "é:1".encode()


def test_a_denied_acquire_reads_the_holder_and_its_metadata() -> None:
    result, sent = run(_ops.acquire(statements, "k", "a", 1), [0, (b"b", b"\0\xff")])
    assert result == LeaseResult(False, "b", None, b"\0\xff")
    assert [s.reads for s in sent] == ["lastrowid", "row"]
    assert sent[1].sql == STATEMENTS.holder
    result, _ = run(_ops.acquire(statements, "k", "a", 1), [0, (b"b", None)])
    assert result == LeaseResult(False, "b", None, None)


def test_record_reads_owner_token_metadata_and_time_left() -> None:
    record, [statement] = run(_ops.record(statements, "k\0"), [(b"a", 3, b"m", 0)])
    assert record == LeaseRecord("k\0", "a", 3, 1, b"m")
    assert statement.sql == STATEMENTS.record
    assert run(_ops.record(statements, "k"), [None])[0] is None


def test_a_denied_acquire_whose_holder_left_tries_again_three_times() -> None:
    replies: list[Any] = [0, None, 0, (b"a", None), 0, None]  # gone; handed to us; gone
    result, sent = run(_ops.acquire(statements, "k", "a", 1), replies)
    assert result == LeaseResult(False, None, None)
    assert len(sent) == 6
    result, _ = run(_ops.acquire(statements, "k", "a", 1), [0, None, 9])
    assert result == LeaseResult(True, "a", 9)


def test_owner_renew_release_and_transfer_read_their_replies() -> None:
    assert run(_ops.owner(statements, "k"), [None])[0] is None
    assert run(_ops.owner(statements, "k"), [(bytearray(b"\xc3\xa9"),)])[0] == "é"
    assert run(_ops.renew(statements, "k", "a", 5), [1])[0] is True
    assert run(_ops.renew(statements, "k", "a", 5), [0])[0] is False
    assert run(_ops.release(statements, "k", "a"), [1])[0] == 1
    assert run(_ops.release_grant(statements, "k", "a", 3), [0])[0] == 0
    moved, [statement] = run(_ops.transfer(statements, "k", "a", "b", 5), [1])
    assert moved is True
    assert statement.sql == STATEMENTS.transfer
    assert statement.params == {
        "key": b"k",
        "from_owner": b"a",
        "to_owner": b"b",
        "ttl_us": 5000,
        "metadata": None,
    }
    _, [statement] = run(_ops.transfer(statements, "k", "a", "b", 5, b"b:1"), [1])
    assert statement.params is not None
    assert statement.params["metadata"] == b"b:1"


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (lambda: _ops.acquire(unused, "", "a", 1), "key"),
        (lambda: _ops.acquire(unused, "k", "a", 0), "ttl_ms"),
        (lambda: _ops.acquire(unused, "k", "a", 1.5), "ttl_ms"),
        (lambda: _ops.acquire(unused, "k", "a", True), "ttl_ms"),
        (lambda: _ops.owner(unused, "x" * 1025), "key"),
        (lambda: _ops.release(unused, "k", ""), "owner"),
        (lambda: _ops.release_grant(unused, "k", "", 1), "owner"),
        (lambda: _ops.renew(unused, "k", "a", 2**31), "ttl_ms"),
        (lambda: _ops.transfer(unused, "k", "", "b", 1), "from_owner"),
        (lambda: _ops.transfer(unused, "k", "a", "\ud800", 1), "to_owner"),
        (lambda: _ops.acquire(unused, "k", "a", 1, b"x" * 4097), "metadata"),
        (lambda: _ops.transfer(unused, "k", "a", "b", 1, 5), "metadata"),  # type: ignore[arg-type]
        (lambda: _ops.record(unused, ""), "key"),
        (lambda: _ops.inspect(unused, "", 10), "prefix"),
        (lambda: _ops.inspect(unused, None, 0), "limit"),
    ],
)
def test_bad_input_is_refused_when_the_operation_is_built(
    build: Callable[[], object], argument: str
) -> None:
    with pytest.raises(InvalidLeaseArgument) as caught:
        build()
    assert caught.value.argument == argument


# -- retries -------------------------------------------------------------------------------


def test_a_deadlock_victim_runs_again_up_to_three_times() -> None:
    assert run(_ops.renew(statements, "k", "a", 5), [deadlock(), deadlock(), 1])[0] is True
    with pytest.raises(asyncmy_errors.OperationalError):
        run(_ops.renew(statements, "k", "a", 5), [deadlock(), deadlock(), deadlock()])


def test_a_lost_connection_is_retried_once_except_for_a_transfer() -> None:
    assert run(_ops.renew(statements, "k", "a", 5), [lost(), 1])[0] is True
    with pytest.raises(pymysql.err.OperationalError):
        run(_ops.renew(statements, "k", "a", 5), [lost(), lost()])
    with pytest.raises(pymysql.err.OperationalError):
        run(_ops.transfer(statements, "k", "a", "b", 5), [lost()])
    # A transfer that lost a deadlock never ran: run again.
    assert run(_ops.transfer(statements, "k", "a", "b", 5), [deadlock(), 1])[0] is True


def test_a_timed_out_read_is_not_retried() -> None:
    with pytest.raises(pymysql.err.OperationalError):
        run(_ops.owner(statements, "k"), [timed_out()])


def test_other_errors_pass_through_unretried() -> None:
    duplicate = pymysql.err.IntegrityError(1062, "Duplicate entry")
    with pytest.raises(pymysql.err.IntegrityError):
        run(_ops.release(statements, "k", "a"), [duplicate])


# -- the schema ----------------------------------------------------------------------------


def no_table() -> Exception:
    return pymysql.err.ProgrammingError(1146, "Table 'db.leases_meta' doesn't exist")


def slots_present(schema: _ops.Schema) -> list[Any]:
    """The replies to the two looks at the slot tables and procedures: all there."""
    ddl = schema.ddl
    tables = [(ddl.slot_names[name],) for name in ddl.create_slot_tables]
    routines = [(ddl.routine_names[name],) for name in ddl.create_routines]
    return [tables, routines]


def slots_created(schema: _ops.Schema, tokens: int = _sql.TOKENS_SEQUENCE) -> list[str]:
    """What creating every slot table and procedure sends (schema version 3): the
    procedures draw tokens from the table's source."""
    ddl = _sql.Statements(schema.table, tokens)
    return [
        ddl.existing_slot_tables,
        *ddl.create_slot_tables.values(),
        ddl.existing_routines,
        *ddl.create_routines.values(),
    ]


def test_first_use_creates_what_is_missing_then_reads_the_meta() -> None:
    schema = _ops.Schema(SETTINGS)
    meta = [("schema_version", _sql.SCHEMA_VERSION), ("tokens", _sql.TOKENS_SEQUENCE)]
    # Another process created one procedure between our look and our CREATE: fine.
    exists = pymysql.err.OperationalError(1304, "PROCEDURE leases_slot_move already exists")
    replies: list[Any] = [no_table(), [("leases",)], ("10.11.6-MariaDB",), (1,), 0, 0]
    replies += [[], 0, 0, 0, 0, [], 0, exists, 0, 1, meta]
    ready, sent = run(_ops.ready(schema), replies)
    assert schema.sql is ready
    assert ready.acquire == STATEMENTS.acquire  # the sequence's statements
    ddl = schema.ddl
    assert [s.sql for s in sent] == [
        ddl.meta,
        ddl.existing,
        "SELECT VERSION()",
        ddl.has_metadata,  # the table was there already, with its metadata column
        ddl.create_sequence,
        ddl.create_meta,
        *slots_created(schema),
        ddl.record_meta,
        ddl.meta,
    ]
    assert sent[-2].params == {"tokens": _sql.TOKENS_SEQUENCE}


def test_mysql_gets_clock_tokens_and_an_existing_table_keeps_its_source() -> None:
    schema = _ops.Schema(SETTINGS)
    meta = [("schema_version", _sql.SCHEMA_VERSION), ("tokens", _sql.TOKENS_CLOCK)]
    replies: list[Any] = [no_table(), [], ("8.0.36",), 0, 0, *slots_present(schema), 1, meta]
    ready, sent = run(_ops.ready(schema), replies)
    assert ddl_names(sent, schema) == ["create_table", "create_meta"]
    assert ready.acquire != STATEMENTS.acquire
    wants_sequence = _ops.Schema(_options.settings({"table": "db.leases", "tokens": "sequence"}))
    with pytest.raises(LeaseBackendError, match="keeps the token source"):
        run(_ops.ready(wants_sequence), [meta])
    assert wants_sequence.sql is None


def ddl_names(sent: list[_ops.Statement], schema: _ops.Schema) -> list[str]:
    ddl = schema.ddl
    names = {ddl.create_table: "create_table", ddl.create_sequence: "create_sequence"}
    names[ddl.create_meta] = "create_meta"
    return [names[s.sql] for s in sent if s.sql in names]


def test_a_missing_table_without_create_schema_names_migrate() -> None:
    schema = _ops.Schema(_options.settings({"table": "db.leases", "create_schema": False}))
    with pytest.raises(LeaseBackendError, match="leasekit migrate"):
        run(_ops.ready(schema), [no_table()])


def test_a_newer_schema_version_is_refused() -> None:
    schema = _ops.Schema(SETTINGS)
    newer = _sql.SCHEMA_VERSION + 1
    with pytest.raises(LeaseBackendError, match=f"schema version {newer}"):
        run(_ops.ready(schema), [[("schema_version", newer), ("tokens", 1)]])


def test_migrate_creates_then_reads() -> None:
    schema = _ops.Schema(_options.settings({"table": "db.leases", "tokens": "clock"}))
    present = [("leases",), ("leases_meta",)]
    meta = [("schema_version", _sql.SCHEMA_VERSION), ("tokens", _sql.TOKENS_CLOCK)]
    replies = [present, (1,), *slots_present(schema), 1, meta]
    version, sent = run(_ops.migrate(schema), replies)
    assert version == _sql.SCHEMA_VERSION
    ddl = schema.ddl
    assert [s.sql for s in sent] == [
        ddl.existing,
        ddl.has_metadata,
        ddl.existing_slot_tables,
        ddl.existing_routines,
        ddl.record_meta,
        ddl.meta,
    ]
    assert schema.sql is not None


def test_a_version_1_table_gains_the_metadata_column_then_records_version_2() -> None:
    schema = _ops.Schema(SETTINGS)
    old = [("schema_version", 1), ("tokens", _sql.TOKENS_CLOCK)]
    new = [("schema_version", _sql.SCHEMA_VERSION), ("tokens", _sql.TOKENS_CLOCK)]
    present = [("leases",), ("leases_meta",)]
    replies: list[Any] = [old, present, None, 0, *slots_present(schema), 1, new]
    ready, sent = run(_ops.ready(schema), replies)
    ddl = schema.ddl
    assert [s.sql for s in sent] == [
        ddl.meta,
        ddl.existing,  # the recorded token source is kept: no VERSION(), no sequence
        ddl.has_metadata,
        ddl.add_metadata,
        ddl.existing_slot_tables,
        ddl.existing_routines,
        ddl.record_meta,
        ddl.meta,
    ]
    assert schema.sql is ready
    # Another process added the column between our look and our ALTER: fine.
    schema = _ops.Schema(SETTINGS)
    duplicate = pymysql.err.OperationalError(1060, "Duplicate column name 'metadata'")
    replies = [old, present, None, duplicate, *slots_present(schema), 1, new]
    assert run(_ops.ready(schema), replies)[0] is schema.sql


def test_a_version_2_table_gains_the_slot_tables_and_procedures_then_records_version_3() -> None:
    schema = _ops.Schema(SETTINGS)
    old = [("schema_version", 2), ("tokens", _sql.TOKENS_CLOCK)]
    new = [("schema_version", _sql.SCHEMA_VERSION), ("tokens", _sql.TOKENS_CLOCK)]
    present = [("leases",), ("leases_meta",)]
    replies: list[Any] = [old, present, (1,), [], 0, 0, 0, 0, [], 0, 0, 0, 1, new]
    ready, sent = run(_ops.ready(schema), replies)
    ddl = schema.ddl
    assert [s.sql for s in sent] == [
        ddl.meta,
        ddl.existing,
        ddl.has_metadata,  # version 2 has its metadata column: no ALTER
        *slots_created(schema, _sql.TOKENS_CLOCK),
        ddl.record_meta,
        ddl.meta,
    ]
    assert sent[-2].params == {"tokens": _sql.TOKENS_CLOCK}
    assert schema.sql is ready


def test_a_version_1_table_without_create_schema_names_migrate() -> None:
    schema = _ops.Schema(_options.settings({"table": "db.leases", "create_schema": False}))
    with pytest.raises(LeaseBackendError, match="leasekit migrate"):
        run(_ops.ready(schema), [[("schema_version", 1), ("tokens", 1)]])
    assert schema.sql is None


# -- beyond the contract -------------------------------------------------------------------


def test_inspect_reads_a_key_range_and_rounds_remaining_up() -> None:
    rows = [(b"p/1", b"a", 4, 0, None), (b"p/2", b"b", 5, 1200, b"m")]
    records, [statement] = run(_ops.inspect(statements, "p/", 10), [rows])
    assert records == [LeaseRecord("p/1", "a", 4, 1), LeaseRecord("p/2", "b", 5, 1200, b"m")]
    assert statement.sql == STATEMENTS.inspect_prefix
    assert statement.params == {"limit": 10, "low": b"p/", "high": b"p0"}
    _, [everything] = run(_ops.inspect(statements, None, 10), [[]])
    assert everything.sql == STATEMENTS.inspect_all


def test_sweep_deletes_the_keys_it_selected() -> None:
    assert run(_ops.sweep(statements, 600.0, 100), [[]])[0] == 0
    deleted, sent = run(_ops.sweep(statements, 1.5, 100), [[(b"a",), (b"b",)], 2])
    assert deleted == 2
    assert sent[1].sql == STATEMENTS.sweep_delete(2)
    assert sent[1].params == {"grace_us": 1_500_000, "batch": 100, "k0": b"a", "k1": b"b"}


# -- options and errors --------------------------------------------------------------------


def test_url_settings_parse_the_server_and_options_without_io() -> None:
    url = "mariadb://app:s3cret@db.example:3307/leases?timeout_s=2&pool_max_size=4&table=t"
    settings = _options.url_settings(url, {"sweep_every": 0})
    assert settings.connect is not None
    assert settings.connect["host"] == "db.example"
    assert settings.connect["port"] == 3307
    assert settings.connect["database"] == "leases"
    assert settings.connect["init_command"] == "SET SESSION innodb_lock_wait_timeout = 2"
    assert (settings.pool_min_size, settings.pool_max_size) == (1, 4)
    assert settings.options()["sweep_every"] == 0
    assert _options.settings(settings.options()).table == settings.table
    assert "s3cret" not in settings.where()
    with pytest.raises(InvalidLeaseArgument, match="pool_max_size"):
        _options.url_settings("mysql://h/db?pool_min_size=5&pool_max_size=4", {})
    with pytest.raises(InvalidLeaseArgument, match="sweep_grace_s"):
        _options.settings({"timeout_s": 5, "sweep_grace_s": 5})
    with pytest.raises(InvalidLeaseArgument, match="one host"):
        _options.url_settings("mysql://a,b/db", {})


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (pymysql.err.OperationalError(1205, "Lock wait timeout"), LeaseBackendTimeout),
        (asyncmy_errors.OperationalError(3024, "max_statement_time"), LeaseBackendTimeout),
        (pymysql.err.OperationalError(1045, "Access denied"), LeaseBackendUnreachable),
        (asyncmy_errors.OperationalError(2003, "Can't connect"), LeaseBackendUnreachable),
        (timed_out(), LeaseBackendTimeout),
        (lost(), LeaseBackendError),
        (pymysql.err.IntegrityError(1062, "Duplicate"), LeaseBackendError),
        (TimeoutError("no connection came free"), LeaseBackendTimeout),
    ],
)
def test_errors_of_both_drivers_map_by_number(error: Exception, kind: type) -> None:
    translated = _options.ERRORS.translate(error, key="k")
    assert type(translated) is kind
    assert (translated.backend, translated.key) == ("mysql", "k")
