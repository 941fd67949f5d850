"""Every SQL statement the MySQL/MariaDB backend runs, each in one place with why it is atomic.

The schema (for the default table ``leasekit_leases``)::

    leasekit_leases            lease_key VARBINARY(1024) PRIMARY KEY, owner VARBINARY(1024),
                               token BIGINT, expires_at DATETIME(6) in UTC,
                               metadata VARBINARY(4096) NULL (the holder's, with its grant)
                               (index leasekit_leases_expires_at)
    leasekit_leases_token_seq  MariaDB only: the SEQUENCE fencing tokens are drawn from
    leasekit_leases_meta       name PRIMARY KEY, value BIGINT: 'schema_version', 'tokens'

Keys and owners are UTF-8 in ``VARBINARY``: bytes compare as bytes, so no collation
folds case, accents or trailing spaces ('a', 'A' and 'a ' are three keys) and NUL is
an ordinary byte. InnoDB is required (row locks, crash-safe counters).

**Time is the server's.** Every decision reads ``SYSDATE(6)``, the time at which the
function runs, after the statement has locked the row it decides on. ``NOW(6)`` (and
``UTC_TIMESTAMP(6)``, ``CURRENT_TIMESTAMP(6)``) is the time the *statement began*: one
that waited a second for a row lock would grant a lease a second shorter than asked and
judge expiry by a stale clock. ``SYSDATE(6)`` is in the session's time zone, so
:data:`NOW_UTC` subtracts the session's UTC offset at the statement's start (the
difference of ``NOW(6)`` and ``UTC_TIMESTAMP(6)``, taken at the same instant): every
session, whatever its ``time_zone``, reads and writes UTC. (A server started with
``--sysdate-is-now`` turns ``SYSDATE`` into ``NOW``: still safe, but a lease granted
after a lock wait is shorter by the wait.)

**One statement per write, decided under the row lock.** ``INSERT ... ON DUPLICATE KEY
UPDATE``, ``UPDATE`` and ``DELETE`` lock the row (InnoDB's locking read sees the newest
committed version, not a snapshot) before their conditions and assignments are
evaluated, and each runs as its own transaction in autocommit mode.
``ON DUPLICATE KEY UPDATE`` has no ``WHERE``: every assignment is conditional, and they
run left to right, each seeing the columns the earlier ones changed. So the acquire
decides once, in its first assignment (``token``), and records the decision with
``LAST_INSERT_ID(expr)``: the fresh or kept token when granted, 0 when denied. The later
assignments read ``LAST_INSERT_ID()`` instead of looking at the clock again (two reads
of ``SYSDATE`` straddling the expiry would otherwise disagree), and the value reaches
the client in the OK packet (the driver's ``lastrowid``), so no second statement is
needed to learn the token. A denied acquire reads the holder and its metadata with
:attr:`holder`: two round trips, only when denied (MySQL has no ``RETURNING``).

**Fencing tokens** are strictly increasing per key; two sources, recorded in the meta
table when the table is created and never switched:

- ``sequence`` (MariaDB, the default there): one ``SEQUENCE`` per table, as on
  PostgreSQL. A token drawn under the row lock (a takeover, a transfer) is greater than
  every token issued before for any key; sequence values survive restarts (the server
  persists the end of its in-memory cache before handing values out). The one early
  draw is the insert's ``VALUES`` (evaluated before the duplicate check), used only when
  the key has no row: rows are therefore never deleted while they may matter. A release
  leaves an expired **tombstone** with its token, and the sweep deletes only rows
  expired for longer than a grace period, longer than the statement timeout.
- ``clock`` (MySQL, which has no sequences): a takeover or transfer writes
  ``GREATEST(token + 1, µs since the epoch)`` under the row lock, a new row the
  microseconds. Strictly increasing while the row exists, whatever the clock does; a
  row is swept only once both its expiry and its token are more than the grace period
  in the past, so a later insert's microseconds exceed it unless the server's clock
  steps back by more than the grace period.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 2
"""The layout this code reads and writes, recorded in the meta table.

2: a nullable ``metadata VARBINARY(4096)`` column, added to a version 1 table by
``ALTER TABLE ... ADD COLUMN`` when the provider first reads the schema (MySQL has no
``ADD COLUMN IF NOT EXISTS``: :attr:`Statements.has_metadata` asks first). A leasekit
of version 1 would leave a holder's metadata in place when another owner takes the key
over, and losers would route to the previous owner: it refuses a version 2 table.
"""

DEFAULT_TABLE = "leasekit_leases"

TOKENS_SEQUENCE = 1
TOKENS_CLOCK = 2
TOKEN_SOURCES = {"sequence": TOKENS_SEQUENCE, "clock": TOKENS_CLOCK}
"""The ``tokens`` option's names and the values the meta table records for them."""

NOW_UTC = "(SYSDATE(6) - INTERVAL TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), NOW(6)) MICROSECOND)"
"""The server's UTC time as the expression runs (see the module docstring)."""

_MICROS = f"TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {NOW_UTC})"
_EXPIRES_IN = f"{NOW_UTC} + INTERVAL %(ttl_us)s MICROSECOND"
# Sweeps and listings may use the statement's start: an earlier cutoff only keeps rows
# longer, and a constant lets the expiry index serve the range.
_CUTOFF = "UTC_TIMESTAMP(6) - INTERVAL %(grace_us)s MICROSECOND"


# -- a session dropped mid-statement ----------------------------------------------------

# %(id)s: the server's id of a session whose connection the client dropped while a
# statement of it was in flight (cancelled, timed out, lost). Closing the socket does not
# stop that statement: one waiting for a lock, or merely queued on a loaded server, still
# runs and commits later. KILL CONNECTION aborts it if it has not committed yet (a lock
# wait ends at once) and ends the session; a statement not yet read from the socket
# never runs. Error 1094 (no such thread): it has ended already.
KILL_SESSION = "KILL CONNECTION %(id)s"

# %(id)s -> a row while the session is still on the server. KILL returns before the
# session has finished: once it is out of the process list, whatever its statement did
# is done, and nothing of it can land any more. (Never the asking session itself: after
# a restart the server hands out ids from 1 again.)
SESSION_ALIVE = (
    "SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %(id)s AND ID <> CONNECTION_ID()"
)


@dataclass(frozen=True, slots=True)
class TableName:
    """A validated table name, optionally qualified by its database."""

    database: str | None
    name: str

    def quoted(self, suffix: str = "") -> str:
        name = f"`{self.name}{suffix}`"
        return name if self.database is None else f"`{self.database}`.{name}"

    def __str__(self) -> str:
        return self.name if self.database is None else f"{self.database}.{self.name}"


class Statements:
    """The statements for one table and token source, rendered once.

    Parameters are always bound by the driver (``%(name)s``); only the validated,
    back-quoted table names are part of the SQL text.
    """

    def __init__(self, table: TableName, tokens: int) -> None:
        t, meta, seq = table.quoted(), table.quoted("_meta"), table.quoted("_token_seq")
        self.table = table
        if tokens == TOKENS_SEQUENCE:
            fresh, fresh_row, sweepable = f"NEXTVAL({seq})", f"NEXTVAL({seq})", ""
        else:
            fresh, fresh_row = f"GREATEST(token + 1, {_MICROS})", _MICROS
            sweepable = "AND token < TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))"
            sweepable += " - %(grace_us)s"
        # A token drawn under the row lock, and a new row's (``_group`` renders them too).
        self.fresh, self.fresh_row = fresh, fresh_row

        # -- the schema: each statement runs only if its object is missing ---------------

        # %(database)s (None: the connection's) -> (table_name,) of the objects present.
        self.existing = (
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = COALESCE(%(database)s, DATABASE())"
            " AND table_name IN (%(table)s, %(meta)s, %(seq)s)"
        )
        self.names = {
            "database": table.database,
            "table": table.name,
            "meta": f"{table.name}_meta",
            "seq": f"{table.name}_token_seq",
        }
        self.create_table = f"""
            CREATE TABLE IF NOT EXISTS {t} (
                lease_key VARBINARY(1024) NOT NULL,
                owner VARBINARY(1024) NOT NULL,
                token BIGINT NOT NULL,
                expires_at DATETIME(6) NOT NULL,
                metadata VARBINARY(4096) NULL,
                PRIMARY KEY (lease_key),
                KEY `{table.name}_expires_at` (expires_at)
            ) ENGINE=InnoDB
            """
        # %(database)s, %(table)s -> a row if the table has its metadata column (a table
        # of schema version 1 has not), then the column added (an instant change on
        # InnoDB: a nullable column at the end, no default).
        self.has_metadata = (
            "SELECT 1 FROM information_schema.columns"
            " WHERE table_schema = COALESCE(%(database)s, DATABASE())"
            " AND table_name = %(table)s AND column_name = 'metadata'"
        )
        self.add_metadata = f"ALTER TABLE {t} ADD COLUMN metadata VARBINARY(4096) NULL"
        self.create_sequence = f"CREATE SEQUENCE IF NOT EXISTS {seq} ENGINE=InnoDB"
        self.create_meta = f"""
            CREATE TABLE IF NOT EXISTS {meta} (
                name VARCHAR(64) CHARACTER SET ascii NOT NULL PRIMARY KEY,
                value BIGINT NOT NULL
            ) ENGINE=InnoDB
            """
        # %(tokens)s. The schema version only ever rises; the token source, once
        # recorded, is kept (switching would break monotonicity).
        self.record_meta = f"""
            INSERT INTO {meta} (name, value)
            VALUES ('schema_version', {SCHEMA_VERSION}), ('tokens', %(tokens)s)
            ON DUPLICATE KEY UPDATE value = IF(name = 'schema_version',
                                               GREATEST(value, {SCHEMA_VERSION}), value)
            """
        # No parameters -> (name, value) rows. Error 1146 before the first migration.
        self.meta = f"SELECT name, value FROM {meta}"

        # -- the contract ------------------------------------------------------------------

        # %(key)s, %(owner)s, %(ttl_us)s, %(metadata)s -> lastrowid: the token if
        # granted, else 0.
        #
        # A new key is inserted with a token from VALUES. On an existing row (locked by
        # now), `token` decides: expired -> a fresh token; the caller's own live lease ->
        # kept; someone else's live lease -> unchanged and LAST_INSERT_ID(0). `owner`,
        # `expires_at` and `metadata` then follow that one decision (see the module
        # docstring): every grant, the holder's re-acquire included, stores the
        # caller's metadata.
        acquire = f"""
            INSERT INTO {t} (lease_key, owner, token, expires_at, metadata)
            VALUES (%(key)s, %(owner)s, LAST_INSERT_ID({fresh_row}), {_EXPIRES_IN},
                    {{metadata}})
            ON DUPLICATE KEY UPDATE
                token = IF(expires_at <= {NOW_UTC}, LAST_INSERT_ID({fresh}),
                           IF(owner = %(owner)s, LAST_INSERT_ID(token),
                              token + LAST_INSERT_ID(0))),
                owner = IF(LAST_INSERT_ID() = 0, owner, %(owner)s),
                expires_at = IF(LAST_INSERT_ID() = 0, expires_at, {_EXPIRES_IN}),
                metadata = IF(LAST_INSERT_ID() = 0, metadata, {{metadata}})
            """
        self.acquire = acquire.replace("{metadata}", "%(metadata)s")
        # The same storing no metadata (NULL), as most acquires do: one parameter fewer
        # for the driver to escape and send on every call.
        self.acquire_bare = acquire.replace("{metadata}", "NULL")

        # %(key)s -> the live holder, or no row. A plain read: autocommit gives every
        # statement a fresh snapshot.
        self.owner = f"SELECT owner FROM {t} WHERE lease_key = %(key)s AND expires_at > {NOW_UTC}"

        # %(key)s -> (owner, metadata) of the live lease, or no row: what a denied
        # acquire reads next.
        self.holder = (
            f"SELECT owner, metadata FROM {t} WHERE lease_key = %(key)s AND expires_at > {NOW_UTC}"
        )

        # %(key)s -> (owner, token, metadata, remaining_ms) of the live lease, or no row.
        # Time left by the server's clock as the statement runs, rounded up.
        self.record = f"""
            SELECT owner, token, metadata,
                CEIL(TIMESTAMPDIFF(MICROSECOND, {NOW_UTC}, expires_at) / 1000)
            FROM {t} WHERE lease_key = %(key)s AND expires_at > {NOW_UTC}
            """

        # %(key)s, %(owner)s, %(ttl_us)s -> rowcount 1 if renewed (the expiry always
        # moves, so the row counts as changed with or without CLIENT_FOUND_ROWS).
        self.renew = f"""
            UPDATE {t} SET expires_at = {_EXPIRES_IN}
            WHERE lease_key = %(key)s AND owner = %(owner)s AND expires_at > {NOW_UTC}
            """

        # %(key)s, %(owner)s. The holder's row expires at once and stays as a tombstone
        # that keeps its token (not its metadata); anyone else's call matches nothing.
        self.release = f"""
            UPDATE {t} SET expires_at = {NOW_UTC}, metadata = NULL
            WHERE lease_key = %(key)s AND owner = %(owner)s AND expires_at > {NOW_UTC}
            """

        # %(key)s, %(owner)s, %(token)s -> rowcount 1 if released: only the grant that
        # carries this fencing token (the undo of a grant whose caller was cancelled,
        # leasekit.backend.SupportsReleaseGrant); another grant of the key, even to the
        # same owner, keeps a different token and is left alone.
        self.release_grant = f"""
            UPDATE {t} SET expires_at = {NOW_UTC}, metadata = NULL
            WHERE lease_key = %(key)s AND owner = %(owner)s AND token = %(token)s
                AND expires_at > {NOW_UTC}
            """

        # %(key)s, %(from_owner)s, %(to_owner)s, %(ttl_us)s, %(metadata)s -> rowcount 1
        # if moved. One UPDATE rewrites token, owner, expiry and metadata together (left
        # to right: `token` sees the old owner), so the key is never free in between. To
        # oneself: a renew that replaces the metadata.
        self.transfer = f"""
            UPDATE {t} SET
                token = IF(owner = %(to_owner)s, token, {fresh}),
                owner = %(to_owner)s,
                expires_at = {_EXPIRES_IN},
                metadata = %(metadata)s
            WHERE lease_key = %(key)s AND owner = %(from_owner)s AND expires_at > {NOW_UTC}
            """

        # -- beyond the contract -------------------------------------------------------

        # %(grace_us)s, %(batch)s -> the keys of up to `batch` rows long expired, oldest
        # first. A plain (snapshot) read takes no locks; `sweep_delete` then deletes
        # them by primary key, re-testing the condition under each row's lock. A single
        # DELETE ... ORDER BY ... LIMIT would take next-key locks on the expiry index
        # (REPEATABLE READ) and hold back inserts whose expiry falls in the locked gap.
        self._sweepable = f"expires_at < {_CUTOFF} {sweepable}"
        self.sweep_select = f"""
            SELECT lease_key FROM {t} WHERE {self._sweepable}
            ORDER BY expires_at LIMIT %(batch)s
            """

        # %(limit)s [, %(low)s, %(high)s] -> (key, owner, token, remaining_ms, metadata)
        # of live leases in key order. A key prefix is the byte range [low, high) of the
        # primary key.
        inspect = f"""
            SELECT lease_key, owner, token,
                CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1000),
                metadata
            FROM {t}
            WHERE expires_at > UTC_TIMESTAMP(6) {{range}}
            ORDER BY lease_key
            LIMIT %(limit)s
            """
        self.inspect_all = inspect.replace("{range}", "")
        self.inspect_prefix = inspect.replace(
            "{range}", "AND lease_key >= %(low)s AND lease_key < %(high)s"
        )

        # No parameters. Rows live and expired: what the sweep keeps bounded.
        self.count_rows = f"SELECT COUNT(*) FROM {t}"

    def sweep_delete(self, count: int) -> str:
        """``DELETE`` of ``count`` keys (``%(k0)s`` ...) that are still sweepable."""
        keys = ", ".join(f"%(k{i})s" for i in range(count))
        return (
            f"DELETE FROM {self.table.quoted()} WHERE lease_key IN ({keys}) AND {self._sweepable}"
        )
