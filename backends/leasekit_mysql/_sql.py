"""Every SQL statement the MySQL/MariaDB backend runs, each in one place with why it is atomic.

One module, over 500 lines: every statement and stored procedure the backend sends, each
beside why it is atomic, in one place to review together.

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

SCHEMA_VERSION = 3
"""The layout this code reads and writes, recorded in the meta table.

2: a nullable ``metadata VARBINARY(4096)`` column, added to a version 1 table by
``ALTER TABLE ... ADD COLUMN`` when the provider first reads the schema (MySQL has no
``ADD COLUMN IF NOT EXISTS``: :attr:`Statements.has_metadata` asks first). A leasekit
of version 1 would leave a holder's metadata in place when another owner takes the key
over, and losers would route to the previous owner: it refuses a version 2 table.

3: counting leases and fair waiting: the tables ``<table>_slot_keys``, ``<table>_slots``,
``<table>_line`` and ``<table>_line_keys`` and the procedures ``<table>_slot_take``,
``<table>_slot_move`` and ``<table>_in_turn``, created beside an existing table when the
provider first reads the schema (each only if missing).
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

        self._slots(table, fresh_row)

    def _slots(self, table: TableName, fresh: str) -> None:
        """Counting leases and fair waiting (schema version 3): tables and procedures.

        Each acquire, slot transfer and fair acquire is one ``CALL`` of a stored
        procedure: one round trip, and inside it one transaction that first locks the
        key's row (``INSERT ... ON DUPLICATE KEY UPDATE``, which takes the row's
        exclusive lock whether it inserts or not), then reads, decides and writes, and
        commits. The transaction runs at READ COMMITTED, whatever the session's level:
        each read after the lock is a fresh snapshot, which sees what the lock's
        previous holder committed, and InnoDB takes no gap locks, which under
        REPEATABLE READ deadlocked a procedure's range delete against a single-row
        renew or release of the same key. A failure inside rolls back (the handler)
        and reaches the client.

        Every decision waits for the key's lock, denials too (issue 26). A statement's
        snapshot on MariaDB is not a point in time: built while others commit, it may
        show a later commit without an earlier one, so a read outside the lock may
        count a take's new slot beside the one the release before it freed (a denial
        counting 4 holders of 3). Under the lock no grant commits while the snapshot
        is built: the count is never above the truth. Nor may any statement come
        between ``SET TRANSACTION`` and ``START TRANSACTION``: it would use up the
        level, and the transaction would run at the session's (REPEATABLE READ).
        """
        t, keys, slots = table.quoted(), table.quoted("_slot_keys"), table.quoted("_slots")
        line, line_keys = table.quoted("_line"), table.quoted("_line_keys")
        take, move = table.quoted("_slot_take"), table.quoted("_slot_move")
        in_turn = table.quoted("_in_turn")
        self.slot_names = {
            "database": table.database,
            "slot_keys": f"{table.name}_slot_keys",
            "slots": f"{table.name}_slots",
            "line": f"{table.name}_line",
            "line_keys": f"{table.name}_line_keys",
        }
        self.routine_names = {
            "database": table.database,
            "take": f"{table.name}_slot_take",
            "move": f"{table.name}_slot_move",
            "in_turn": f"{table.name}_in_turn",
        }
        # %(database)s, %(slot_keys)s... -> (table_name,) of the slot tables present.
        self.existing_slot_tables = (
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = COALESCE(%(database)s, DATABASE())"
            " AND table_name IN (%(slot_keys)s, %(slots)s, %(line)s, %(line_keys)s)"
        )
        # %(database)s, %(take)s... -> (routine_name,) of the procedures present.
        self.existing_routines = (
            "SELECT routine_name FROM information_schema.routines"
            " WHERE routine_schema = COALESCE(%(database)s, DATABASE())"
            " AND routine_name IN (%(take)s, %(move)s, %(in_turn)s)"
        )
        self.create_slot_tables = {
            "slot_keys": f"""
                CREATE TABLE IF NOT EXISTS {keys} (
                    lease_key VARBINARY(1024) NOT NULL PRIMARY KEY,
                    slot_limit INT NOT NULL,
                    last_token BIGINT NOT NULL,
                    intent VARBINARY(1024) NULL,
                    intent_expires_at DATETIME(6) NULL
                ) ENGINE=InnoDB
                """,
            "slots": f"""
                CREATE TABLE IF NOT EXISTS {slots} (
                    lease_key VARBINARY(1024) NOT NULL,
                    owner VARBINARY(1024) NOT NULL,
                    token BIGINT NOT NULL,
                    expires_at DATETIME(6) NOT NULL,
                    is_exclusive BOOLEAN NOT NULL,
                    PRIMARY KEY (lease_key, owner)
                ) ENGINE=InnoDB
                """,
            "line": f"""
                CREATE TABLE IF NOT EXISTS {line} (
                    lease_key VARBINARY(1024) NOT NULL,
                    owner VARBINARY(1024) NOT NULL,
                    seq BIGINT NOT NULL,
                    expires_at DATETIME(6) NOT NULL,
                    PRIMARY KEY (lease_key, owner)
                ) ENGINE=InnoDB
                """,
            "line_keys": f"""
                CREATE TABLE IF NOT EXISTS {line_keys} (
                    lease_key VARBINARY(1024) NOT NULL PRIMARY KEY
                ) ENGINE=InnoDB
                """,
        }
        expires = f"{NOW_UTC} + INTERVAL p_ttl_us MICROSECOND"
        rollback = "DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;"
        # (key, owner, ttl_us, limit, exclusive, intent_us, shown) -> one row (acquired,
        # token, held, limit, holders (owners, hex, comma-separated), exclusive,
        # waiting); a limit other than the one asked for: the stored one, nothing written.
        take_body = f"""
            CREATE PROCEDURE {take}(
                IN p_key VARBINARY(1024), IN p_owner VARBINARY(1024), IN p_ttl_us BIGINT,
                IN p_limit INT, IN p_exclusive BOOLEAN, IN p_intent_us BIGINT, IN p_shown INT)
            MODIFIES SQL DATA
            BEGIN
                DECLARE v_limit INT;
                DECLARE v_last BIGINT;
                DECLARE v_claim VARBINARY(1024);
                DECLARE v_held INT;
                DECLARE v_exclusives INT;
                DECLARE v_mine BIGINT;
                DECLARE v_mine_exclusive BOOLEAN;
                DECLARE v_others INT;
                DECLARE v_token BIGINT DEFAULT NULL;
                DECLARE v_acquired BOOLEAN DEFAULT FALSE;
                DECLARE v_exclusive BOOLEAN DEFAULT FALSE;
                DECLARE v_holders LONGTEXT DEFAULT NULL;
                DECLARE v_waiting VARBINARY(1024) DEFAULT NULL;
                {rollback}
                SET TRANSACTION ISOLATION LEVEL READ COMMITTED;  -- no gap locks
                START TRANSACTION;
                INSERT INTO {keys} (lease_key, slot_limit, last_token) VALUES (p_key, p_limit, 0)
                    ON DUPLICATE KEY UPDATE lease_key = lease_key;
                DELETE FROM {slots} WHERE lease_key = p_key AND expires_at <= {NOW_UTC};
                -- One read of the key's state (one row, whatever exists: no warning).
                SELECT
                    (SELECT slot_limit FROM {keys} WHERE lease_key = p_key),
                    (SELECT last_token FROM {keys} WHERE lease_key = p_key),
                    (SELECT intent FROM {keys}
                        WHERE lease_key = p_key AND intent_expires_at > {NOW_UTC}),
                    (SELECT COUNT(*) FROM {slots} WHERE lease_key = p_key),
                    (SELECT COUNT(*) FROM {slots} WHERE lease_key = p_key AND is_exclusive),
                    (SELECT token FROM {slots} WHERE lease_key = p_key AND owner = p_owner),
                    (SELECT is_exclusive FROM {slots}
                        WHERE lease_key = p_key AND owner = p_owner)
                INTO v_limit, v_last, v_claim, v_held, v_exclusives, v_mine, v_mine_exclusive;
                SET v_others = v_held - IF(v_mine IS NULL, 0, 1);
                IF v_held > 0 AND v_limit <> p_limit THEN
                    SET p_limit = v_limit;
                ELSEIF v_mine IS NOT NULL AND (v_mine_exclusive OR NOT p_exclusive) THEN
                    UPDATE {slots} SET expires_at = {expires}
                        WHERE lease_key = p_key AND owner = p_owner;
                    SET v_acquired = TRUE, v_token = v_mine, v_exclusive = v_mine_exclusive;
                ELSEIF (p_exclusive AND v_others = 0 AND (v_claim IS NULL OR v_claim = p_owner))
                    OR (NOT p_exclusive AND v_exclusives = 0 AND v_claim IS NULL
                        AND v_others < p_limit) THEN
                    SET v_token = GREATEST(v_last + 1, {fresh});
                    UPDATE {keys} SET slot_limit = p_limit, last_token = v_token,
                        intent = NULL, intent_expires_at = NULL
                        WHERE lease_key = p_key;
                    DELETE FROM {slots} WHERE lease_key = p_key AND owner = p_owner;
                    INSERT INTO {slots} (lease_key, owner, token, expires_at, is_exclusive)
                        VALUES (p_key, p_owner, v_token, {expires}, p_exclusive);
                    SET v_acquired = TRUE, v_exclusive = p_exclusive,
                        v_held = IF(p_exclusive, 1, v_held + 1);
                ELSE
                    IF p_exclusive AND (v_claim IS NULL OR v_claim = p_owner) THEN
                        UPDATE {keys} SET intent = p_owner,
                            intent_expires_at = {NOW_UTC} + INTERVAL p_intent_us MICROSECOND
                            WHERE lease_key = p_key;
                    END IF;
                    -- 16 owners of up to 1024 bytes, hex: never cut short.
                    SET SESSION group_concat_max_len = GREATEST(@@group_concat_max_len, 65536);
                    SET v_holders = (SELECT GROUP_CONCAT(HEX(owner) ORDER BY token SEPARATOR ',')
                        FROM (SELECT owner, token FROM {slots} WHERE lease_key = p_key
                            ORDER BY token LIMIT p_shown) AS shown);
                    SET v_exclusive = v_exclusives > 0;
                    SET v_waiting = IF(v_claim = p_owner, NULL, v_claim);
                END IF;
                COMMIT;
                SELECT v_acquired, v_token, v_held, p_limit, v_holders, v_exclusive, v_waiting;
            END
            """
        # (key, from, to, ttl_us) -> one row (moved,).
        move_body = f"""
            CREATE PROCEDURE {move}(
                IN p_key VARBINARY(1024), IN p_from VARBINARY(1024), IN p_to VARBINARY(1024),
                IN p_ttl_us BIGINT)
            MODIFIES SQL DATA
            BEGIN
                DECLARE v_last BIGINT;
                DECLARE v_moved BOOLEAN DEFAULT FALSE;
                {rollback}
                SET TRANSACTION ISOLATION LEVEL READ COMMITTED;  -- no gap locks
                START TRANSACTION;
                INSERT INTO {keys} (lease_key, slot_limit, last_token) VALUES (p_key, 0, 0)
                    ON DUPLICATE KEY UPDATE lease_key = lease_key;
                DELETE FROM {slots} WHERE lease_key = p_key AND expires_at <= {NOW_UTC};
                SET v_last = (SELECT last_token FROM {keys} WHERE lease_key = p_key);
                IF EXISTS (SELECT 1 FROM {slots} WHERE lease_key = p_key AND owner = p_from)
                    AND NOT EXISTS (SELECT 1 FROM {slots} WHERE lease_key = p_key AND owner = p_to)
                THEN
                    SET v_last = GREATEST(v_last + 1, {fresh});
                    UPDATE {keys} SET last_token = v_last WHERE lease_key = p_key;
                    UPDATE {slots} SET owner = p_to, token = v_last, expires_at = {expires}
                        WHERE lease_key = p_key AND owner = p_from;
                    SET v_moved = TRUE;
                END IF;
                COMMIT;
                SELECT v_moved;
            END
            """
        acquire = (
            self.acquire.replace("%(key)s", "p_key")
            .replace("%(owner)s", "p_owner")
            .replace("%(ttl_us)s", "p_ttl_us")
            .replace("%(metadata)s", "p_metadata")
        )
        # (key, owner, ttl_us, place_us, metadata) -> one row (token or NULL, holder,
        # holder's metadata).
        in_turn_body = f"""
            CREATE PROCEDURE {in_turn}(
                IN p_key VARBINARY(1024), IN p_owner VARBINARY(1024), IN p_ttl_us BIGINT,
                IN p_place_us BIGINT, IN p_metadata VARBINARY(4096))
            MODIFIES SQL DATA
            BEGIN
                DECLARE v_holder VARBINARY(1024);
                DECLARE v_head VARBINARY(1024);
                DECLARE v_token BIGINT DEFAULT 0;
                DECLARE v_seq BIGINT;
                DECLARE v_metadata VARBINARY(4096) DEFAULT NULL;
                {rollback}
                SET TRANSACTION ISOLATION LEVEL READ COMMITTED;  -- no gap locks
                START TRANSACTION;
                INSERT INTO {line_keys} (lease_key) VALUES (p_key)
                    ON DUPLICATE KEY UPDATE lease_key = lease_key;
                DELETE FROM {line} WHERE lease_key = p_key AND expires_at <= {NOW_UTC};
                SET v_holder = (SELECT owner FROM {t}
                    WHERE lease_key = p_key AND expires_at > {NOW_UTC});
                SET v_head = (SELECT owner FROM {line} WHERE lease_key = p_key
                    ORDER BY seq LIMIT 1);
                IF v_holder = p_owner OR (v_holder IS NULL AND (v_head IS NULL OR v_head = p_owner))
                THEN
                    {acquire};
                    SET v_token = LAST_INSERT_ID();
                END IF;
                IF v_token > 0 THEN
                    DELETE FROM {line} WHERE lease_key = p_key AND owner = p_owner;
                    SET v_holder = NULL;
                ELSE
                    SET v_token = NULL;
                    SET v_seq = COALESCE((SELECT MAX(seq) FROM {line} WHERE lease_key = p_key), 0);
                    INSERT INTO {line} (lease_key, owner, seq, expires_at)
                        VALUES (p_key, p_owner, v_seq + 1,
                            {NOW_UTC} + INTERVAL p_place_us MICROSECOND)
                        ON DUPLICATE KEY UPDATE
                            expires_at = {NOW_UTC} + INTERVAL p_place_us MICROSECOND;
                    SELECT
                        (SELECT owner FROM {t} WHERE lease_key = p_key AND expires_at > {NOW_UTC}),
                        (SELECT metadata FROM {t}
                            WHERE lease_key = p_key AND expires_at > {NOW_UTC})
                    INTO v_holder, v_metadata;
                END IF;
                COMMIT;
                SELECT v_token, v_holder, v_metadata;
            END
            """
        self.create_routines = {"take": take_body, "move": move_body, "in_turn": in_turn_body}

        self.slot_acquire = (
            f"CALL {take}(%(key)s, %(owner)s, %(ttl_us)s, %(limit)s, %(exclusive)s,"
            " %(intent_us)s, %(shown)s)"
        )
        self.slot_transfer = f"CALL {move}(%(key)s, %(from_owner)s, %(to_owner)s, %(ttl_us)s)"
        self.acquire_in_turn = (
            f"CALL {in_turn}(%(key)s, %(owner)s, %(ttl_us)s, %(place_us)s, %(metadata)s)"
        )
        # %(key)s, %(owner)s, %(ttl_us)s -> rowcount 1 if the caller's live slot was renewed.
        self.slot_renew = f"""
            UPDATE {slots} SET expires_at = {_EXPIRES_IN}
            WHERE lease_key = %(key)s AND owner = %(owner)s AND expires_at > {NOW_UTC}
            """
        # %(key)s, %(owner)s -> rowcount 1 if the caller's live slot was freed.
        self.slot_release = f"""
            DELETE FROM {slots}
            WHERE lease_key = %(key)s AND owner = %(owner)s AND expires_at > {NOW_UTC}
            """
        # %(key)s, %(owner)s, %(token)s: the same, only the grant carrying this token.
        self.slot_release_grant = f"""
            DELETE FROM {slots}
            WHERE lease_key = %(key)s AND owner = %(owner)s AND token = %(token)s
                AND expires_at > {NOW_UTC}
            """
        # %(key)s -> (owner, token, remaining_ms) of the live slots, in grant order.
        # A locking read: the newest version of each row, each locked until the last
        # is read, so the list is one instant. A plain read is not on MariaDB (a
        # statement's read view may show a later commit without an earlier one): it
        # listed 4 holders of a limit of 3 in 2 of 10 runs of
        # tests/test_mysql_slots_audit.py's racing check ("holders").
        self.slot_records = f"""
            SELECT owner, token, CEIL(TIMESTAMPDIFF(MICROSECOND, {NOW_UTC}, expires_at) / 1000)
            FROM {slots} WHERE lease_key = %(key)s AND expires_at > {NOW_UTC}
            ORDER BY token LOCK IN SHARE MODE
            """

    def sweep_delete(self, count: int) -> str:
        """``DELETE`` of ``count`` keys (``%(k0)s`` ...) that are still sweepable."""
        keys = ", ".join(f"%(k{i})s" for i in range(count))
        return (
            f"DELETE FROM {self.table.quoted()} WHERE lease_key IN ({keys}) AND {self._sweepable}"
        )
