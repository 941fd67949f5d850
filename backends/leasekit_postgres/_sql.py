"""Every SQL statement the PostgreSQL backend runs, each in one place with why it is atomic.

One module, over 500 lines: every statement and PL/pgSQL function the backend sends,
each beside why it is atomic, in one place to review together.

The schema (for the default table ``leasekit_leases``)::

    leasekit_leases            key bytea PRIMARY KEY, owner bytea, token bigint,
                               expires_at timestamptz (index leasekit_leases_expires_at),
                               metadata bytea (nullable: the holder's, stored with its grant)
    leasekit_leases_token_seq  the sequence every fencing token's last three digits come from
    leasekit_leases_meta       name text PRIMARY KEY, value bigint: 'schema_version'

Keys and owners are UTF-8 ``bytea``: ``text`` cannot hold NUL, and bytes compare and
sort by code point, with no collation involved. Time is the server's: every statement
reads ``clock_timestamp()`` (the time as it runs, not the transaction's start, which
``now()`` would give) and nothing is ever compared with a client's clock.

Each lease operation is one statement in autocommit mode, so one round trip and one
transaction. A row's ownership check and its change happen in that one statement
under the row lock PostgreSQL takes for ``UPDATE``/``DELETE``/``ON CONFLICT DO
UPDATE``: when two statements race for a row, the second waits for the first to
commit and then re-evaluates its ``WHERE`` against the row as the first left it
(READ COMMITTED's re-check), so no decision is ever made on a stale row.

**Fencing tokens** are ``server clock in microseconds * 1000 + nextval(seq) % 1000``
(:data:`_NEW_FENCE`), and a grant that replaces a row (a takeover by ``ON CONFLICT DO
UPDATE``, a transfer) takes ``GREATEST(previous token + 1, that)`` under the row lock:
strictly increasing per key whatever the clock does. The clock part is what keeps
tokens from going back after a failover: a standby promoted after it missed the last
commits (asynchronous replication) also missed the sequence's latest values, since
``nextval`` is WAL-logged ahead in batches of 32, so a token drawn from the sequence
alone could repeat or fall below one already issued; the promoted server's clock,
read seconds later, is past every token the old primary issued (so long as the two
hosts' clocks agree within the failover's duration). The sequence part tells apart
grants of the same microsecond (different keys: tokens are unique across keys unless
a thousand grants share one microsecond). Within ``bigint`` until the year 2262.

The one token drawn early is the one in ``INSERT ... VALUES``, evaluated before the
statement looks for a conflicting row; it is used only if no row for the key exists
when the insert lands. So rows are never deleted while they may matter: a release
keeps the row as an expired **tombstone** with its token, and the sweep deletes only
rows expired for more than a grace period (``sweep_grace_s``, ten minutes by default,
always longer than the statement timeout). An insert that finds no row therefore
cannot follow a newer grant of its key unless the statement ran for longer than the
grace period, which the statement timeout rules out.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

SCHEMA_VERSION = 4
"""The layout this code reads and writes, recorded in the meta table.

2: tokens carry the server's clock (the table is unchanged). Recording it keeps a
leasekit of version 1, whose tokens come from the sequence alone and would be lower,
from starting on the table; migrating from 1 only records the new version.

3: a nullable ``metadata bytea`` column, added to an existing table by
``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` (no rewrite: existing rows read NULL). A
leasekit of version 2 would leave a holder's metadata in place when another owner takes
the key over, and a loser would route to the previous owner: it may not start on it.

4: counting leases and fair waiting: the tables ``<table>_slot_keys``, ``<table>_slots``
and ``<table>_line`` and the functions ``<table>_slot_take``, ``<table>_slot_move`` and
``<table>_in_turn`` (see ``_SLOT_SCHEMA``), created beside an existing table; the lease
table is unchanged, so a leasekit of version 3 could still run on it, but would not
know the new tables: the version is recorded all the same.
"""

DEFAULT_TABLE = "leasekit_leases"


@dataclass(frozen=True, slots=True)
class TableName:
    """A validated table name, optionally schema-qualified, and the names derived from it."""

    schema: str | None
    name: str

    def _qualified(self, name: str) -> sql.Identifier:
        return sql.Identifier(name) if self.schema is None else sql.Identifier(self.schema, name)

    @property
    def table(self) -> sql.Identifier:
        return self._qualified(self.name)

    @property
    def meta(self) -> sql.Identifier:
        return self._qualified(f"{self.name}_meta")

    @property
    def sequence(self) -> sql.Identifier:
        return self._qualified(f"{self.name}_token_seq")

    @property
    def sequence_regclass(self) -> sql.Literal:
        # nextval() takes the sequence's name as a string: the quoted identifier, as a literal.
        return sql.Literal(self.sequence.as_string())

    @property
    def slot_keys(self) -> sql.Identifier:
        return self._qualified(f"{self.name}_slot_keys")

    @property
    def slots(self) -> sql.Identifier:
        return self._qualified(f"{self.name}_slots")

    @property
    def line(self) -> sql.Identifier:
        return self._qualified(f"{self.name}_line")

    @property
    def slot_take(self) -> sql.Identifier:
        return self._qualified(f"{self.name}_slot_take")

    @property
    def slot_move(self) -> sql.Identifier:
        return self._qualified(f"{self.name}_slot_move")

    @property
    def in_turn(self) -> sql.Identifier:
        return self._qualified(f"{self.name}_in_turn")

    @property
    def expiry_index(self) -> sql.Identifier:
        # CREATE INDEX names the index without a schema: it lives beside its table.
        return sql.Identifier(f"{self.name}_expires_at")

    def __str__(self) -> str:
        return self.name if self.schema is None else f"{self.schema}.{self.name}"


# Ends server process %(pid)s, if it is still there, and waits up to %(wait_ms)s for it to
# exit (true once it has; PostgreSQL 14+). No row: it was already gone. The blocking
# provider runs it before the next call on a key whose last call it abandoned at the
# deadline, whose statement that (frozen) process could otherwise still run.
END_PROCESS = (
    b"SELECT pg_terminate_backend(pid, %(wait_ms)s) FROM pg_stat_activity WHERE pid = %(pid)s"
)

# No parameters -> (synchronous_commit, synchronous_standby_names) as the session sees them.
REPLICATION_SETTINGS = (
    b"SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names')"
)

_EXPIRES_IN = "clock_timestamp() + %(ttl_ms)s * interval '1 millisecond'"

# A new token: the server's clock in microseconds, times 1000, plus the sequence's next
# value modulo 1000 (see the module docstring). extract(epoch ...) is numeric, exact.
_NEW_FENCE = (
    "(floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint * 1000"
    " + mod(nextval({seq_regclass}), 1000))"
)


# The clock part of a token drawn at the statement's start: every token this statement
# draws is at least this (see Statements.acquire_notify).
_STATEMENT_FENCE_FLOOR = "floor(extract(epoch FROM statement_timestamp()) * 1000000)::bigint * 1000"


def channel_for(table: str) -> str:
    """The ``NOTIFY`` channel of a lease table (an identifier, at most 63 bytes)."""
    return f"{table}_released"[:63]


GRANT_PREFIX = "+"
"""How a grant hint's payload starts (then the key in hex, as a release hint's whole
payload): not a hex digit, so a listener that knows only release hints skips it."""

# The acquire statement (see Statements.acquire); {returning} and {notify} add the
# grant hint. Doubled braces are the names Statements.compose fills in.
_ACQUIRE = """
    WITH granted AS (
        INSERT INTO {{table}} AS lease (key, owner, token, expires_at, metadata)
        VALUES (%(key)s, %(owner)s, {{fresh_token}}, {{expires_in}}, %(metadata)s)
        ON CONFLICT (key) DO UPDATE SET
            token = CASE
                WHEN lease.owner = excluded.owner
                    AND lease.expires_at > clock_timestamp() THEN lease.token
                ELSE GREATEST(lease.token + 1, {{fresh_token}})
            END,
            owner = excluded.owner,
            expires_at = {{expires_in}},
            metadata = excluded.metadata
        WHERE lease.owner = excluded.owner OR lease.expires_at <= clock_timestamp()
        RETURNING lease.token{returning}
    ),
    holder AS (
        SELECT owner, metadata FROM {{table}}
        WHERE key = %(key)s
            AND expires_at > clock_timestamp()
            AND NOT EXISTS (SELECT FROM granted)
        FOR SHARE
    )
    SELECT (SELECT token FROM granted), (SELECT owner FROM holder),
        (SELECT metadata FROM holder){notify}
    """


# The grouped acquire (see Statements.acquire_group); {returning} and {notify} as in
# _ACQUIRE, per row.
_ACQUIRE_GROUP = """
    WITH item AS (
        SELECT * FROM unnest(%(keys)b::bytea[], %(owners)b::bytea[], %(ttls_ms)b::int8[],
            %(metadata)b::bytea[]) WITH ORDINALITY AS item (key, owner, ttl_ms, metadata, position)
        WHERE set_config('lock_timeout', %(lock_timeout)s, true) IS NOT NULL
    ),
    granted AS (
        INSERT INTO {{table}} AS lease (key, owner, token, expires_at, metadata)
        SELECT item.key, item.owner, {{fresh_token}},
            clock_timestamp() + item.ttl_ms * interval '1 millisecond', item.metadata
        FROM item ORDER BY item.key
        ON CONFLICT (key) DO UPDATE SET
            token = CASE
                WHEN lease.owner = excluded.owner
                    AND lease.expires_at > clock_timestamp() THEN lease.token
                ELSE GREATEST(lease.token + 1, {{fresh_token}})
            END,
            owner = excluded.owner,
            expires_at = clock_timestamp()
                + (SELECT i.ttl_ms FROM item AS i WHERE i.key = excluded.key)
                * interval '1 millisecond',
            metadata = excluded.metadata
        WHERE lease.owner = excluded.owner OR lease.expires_at <= clock_timestamp()
        RETURNING lease.key, lease.token{returning}
    ),
    holder AS (
        SELECT key, owner, metadata FROM {{table}}
        WHERE key IN (SELECT key FROM item)
            AND expires_at > clock_timestamp()
            AND key NOT IN (SELECT key FROM granted)
        FOR SHARE
    )
    SELECT g.token, h.owner, h.metadata{notify}
    FROM item LEFT JOIN granted AS g ON g.key = item.key LEFT JOIN holder AS h ON h.key = item.key
    ORDER BY item.position
    """


# -- counting leases and fair waiting (schema version 4) --------------------------------
# Three tables beside the lease table, and three functions. Each decision (a slot
# acquire, a slot transfer, a fair acquire) is one call of a PL/pgSQL function: one
# statement, so one round trip and one transaction in autocommit mode, safe on a
# connection that many tasks share. The function first takes the key's lock (the
# slot-keys row, FOR UPDATE; for the line, a transaction-level advisory lock on the
# table and key), then reads, decides and writes. In READ COMMITTED each statement
# inside a PL/pgSQL function takes a fresh snapshot, so every read after the lock sees
# what the previous holder of the lock committed: the count is exact when the slot
# is written, as in SQLite's BEGIN IMMEDIATE version. Slot tokens are drawn like the
# leases' (the clock and the sequence), at least the key's last token + 1.
#
#   {slot_keys}  key, slot_limit, last_token, intent (a waiting exclusive acquirer's
#                claim to go next) and its expiry
#   {slots}      key, owner (primary key), token, expires_at, exclusive
#   {line}       key, owner (primary key), seq, expires_at: the fair waiters' places
#
# Created OR REPLACEd by every migration, under the migration's advisory lock (two
# processes replacing one function at once would fail).
_SLOT_SCHEMA = """
    CREATE TABLE IF NOT EXISTS {slot_keys} (
        key bytea PRIMARY KEY,
        slot_limit integer NOT NULL,
        last_token bigint NOT NULL,
        intent bytea,
        intent_expires_at timestamptz
    );
    CREATE TABLE IF NOT EXISTS {slots} (
        key bytea NOT NULL,
        owner bytea NOT NULL,
        token bigint NOT NULL,
        expires_at timestamptz NOT NULL,
        exclusive boolean NOT NULL,
        PRIMARY KEY (key, owner)
    );
    CREATE TABLE IF NOT EXISTS {line} (
        key bytea NOT NULL,
        owner bytea NOT NULL,
        seq bigint NOT NULL,
        expires_at timestamptz NOT NULL,
        PRIMARY KEY (key, owner)
    );
    CREATE OR REPLACE FUNCTION {slot_take}(
        p_key bytea, p_owner bytea, p_ttl_ms bigint, p_limit integer,
        p_exclusive boolean, p_intent_ms bigint, p_shown integer
    ) RETURNS TABLE (
        o_acquired boolean, o_token bigint, o_held integer, o_limit integer,
        o_holders bytea[], o_exclusive boolean, o_waiting bytea
    ) LANGUAGE plpgsql AS $fn$
    DECLARE
        k record;
        v_held integer;
        v_exclusives integer;
        v_mine bigint;
        v_mine_exclusive boolean;
        v_claim bytea;
        v_others integer;
        v_token bigint;
    BEGIN
        INSERT INTO {slot_keys} AS sk (key, slot_limit, last_token)
            VALUES (p_key, p_limit, 0) ON CONFLICT (key) DO NOTHING;
        SELECT * INTO k FROM {slot_keys} AS sk WHERE sk.key = p_key FOR UPDATE;
        DELETE FROM {slots} AS s WHERE s.key = p_key AND s.expires_at <= clock_timestamp();
        SELECT count(*), count(*) FILTER (WHERE s.exclusive) INTO v_held, v_exclusives
            FROM {slots} AS s WHERE s.key = p_key;
        SELECT s.token, s.exclusive INTO v_mine, v_mine_exclusive
            FROM {slots} AS s WHERE s.key = p_key AND s.owner = p_owner;
        IF v_held > 0 AND k.slot_limit <> p_limit THEN
            -- A mismatch: nothing written (the key row existed), the caller raises.
            RETURN QUERY SELECT false, NULL::bigint, v_held, k.slot_limit,
                NULL::bytea[], false, NULL::bytea;
            RETURN;
        END IF;
        IF v_mine IS NOT NULL AND (v_mine_exclusive OR NOT p_exclusive) THEN
            UPDATE {slots} AS s
                SET expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
                WHERE s.key = p_key AND s.owner = p_owner;
            RETURN QUERY SELECT true, v_mine, v_held, p_limit, NULL::bytea[],
                v_mine_exclusive, NULL::bytea;
            RETURN;
        END IF;
        IF k.intent_expires_at > clock_timestamp() THEN
            v_claim := k.intent;
        END IF;
        v_others := v_held - (CASE WHEN v_mine IS NULL THEN 0 ELSE 1 END);
        IF (p_exclusive AND v_others = 0 AND (v_claim IS NULL OR v_claim = p_owner))
            OR (NOT p_exclusive AND v_exclusives = 0 AND v_claim IS NULL AND v_others < p_limit)
        THEN
            v_token := GREATEST(k.last_token + 1, {fresh_token});
            UPDATE {slot_keys} AS sk SET slot_limit = p_limit, last_token = v_token,
                intent = NULL, intent_expires_at = NULL
                WHERE sk.key = p_key;
            DELETE FROM {slots} AS s WHERE s.key = p_key AND s.owner = p_owner;
            INSERT INTO {slots} (key, owner, token, expires_at, exclusive)
                VALUES (p_key, p_owner, v_token,
                    clock_timestamp() + p_ttl_ms * interval '1 millisecond', p_exclusive);
            RETURN QUERY SELECT true, v_token,
                CASE WHEN p_exclusive THEN 1 ELSE v_held + 1 END, p_limit,
                NULL::bytea[], p_exclusive, NULL::bytea;
            RETURN;
        END IF;
        IF p_exclusive AND (v_claim IS NULL OR v_claim = p_owner) THEN
            UPDATE {slot_keys} AS sk SET intent = p_owner,
                intent_expires_at = clock_timestamp() + p_intent_ms * interval '1 millisecond'
                WHERE sk.key = p_key;
        END IF;
        RETURN QUERY SELECT false, NULL::bigint, v_held, p_limit,
            ARRAY(SELECT s.owner FROM {slots} AS s WHERE s.key = p_key
                ORDER BY s.token LIMIT p_shown),
            v_exclusives > 0,
            CASE WHEN v_claim = p_owner THEN NULL ELSE v_claim END;
    END
    $fn$;
    CREATE OR REPLACE FUNCTION {slot_move}(
        p_key bytea, p_from bytea, p_to bytea, p_ttl_ms bigint
    ) RETURNS boolean LANGUAGE plpgsql AS $fn$
    DECLARE
        k record;
        v_token bigint;
    BEGIN
        SELECT * INTO k FROM {slot_keys} AS sk WHERE sk.key = p_key FOR UPDATE;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        DELETE FROM {slots} AS s WHERE s.key = p_key AND s.expires_at <= clock_timestamp();
        IF NOT EXISTS (SELECT FROM {slots} AS s WHERE s.key = p_key AND s.owner = p_from)
            OR EXISTS (SELECT FROM {slots} AS s WHERE s.key = p_key AND s.owner = p_to)
        THEN
            RETURN false;
        END IF;
        v_token := GREATEST(k.last_token + 1, {fresh_token});
        UPDATE {slot_keys} AS sk SET last_token = v_token WHERE sk.key = p_key;
        UPDATE {slots} AS s SET owner = p_to, token = v_token,
            expires_at = clock_timestamp() + p_ttl_ms * interval '1 millisecond'
            WHERE s.key = p_key AND s.owner = p_from;
        RETURN true;
    END
    $fn$;
    CREATE OR REPLACE FUNCTION {in_turn}(
        p_key bytea, p_owner bytea, p_ttl_ms bigint, p_place_ttl_ms bigint,
        p_metadata bytea, p_channel text
    ) RETURNS TABLE (o_token bigint, o_holder bytea, o_metadata bytea)
    LANGUAGE plpgsql AS $fn$
    DECLARE
        v_holder bytea;
        v_head bytea;
        v_token bigint;
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtextextended({lock_name} || encode(p_key, 'hex'), 0));
        DELETE FROM {line} AS l WHERE l.key = p_key AND l.expires_at <= clock_timestamp();
        SELECT t.owner INTO v_holder FROM {table} AS t
            WHERE t.key = p_key AND t.expires_at > clock_timestamp();
        SELECT l.owner INTO v_head FROM {line} AS l WHERE l.key = p_key ORDER BY l.seq LIMIT 1;
        IF v_holder = p_owner OR (v_holder IS NULL AND (v_head IS NULL OR v_head = p_owner)) THEN
            INSERT INTO {table} AS lease (key, owner, token, expires_at, metadata)
            VALUES (p_key, p_owner, {fresh_token},
                clock_timestamp() + p_ttl_ms * interval '1 millisecond', p_metadata)
            ON CONFLICT (key) DO UPDATE SET
                token = CASE
                    WHEN lease.owner = excluded.owner
                        AND lease.expires_at > clock_timestamp() THEN lease.token
                    ELSE GREATEST(lease.token + 1, {fresh_token})
                END,
                owner = excluded.owner,
                expires_at = excluded.expires_at,
                metadata = excluded.metadata
            WHERE lease.owner = excluded.owner OR lease.expires_at <= clock_timestamp()
            RETURNING lease.token INTO v_token;
            IF v_token IS NOT NULL THEN
                DELETE FROM {line} AS l WHERE l.key = p_key AND l.owner = p_owner;
                IF p_channel IS NOT NULL AND v_holder IS NULL THEN
                    PERFORM pg_notify(p_channel, '+' || encode(p_key, 'hex'));
                END IF;
                RETURN QUERY SELECT v_token, NULL::bytea, NULL::bytea;
                RETURN;
            END IF;
        END IF;
        INSERT INTO {line} AS l (key, owner, seq, expires_at)
            VALUES (p_key, p_owner,
                COALESCE((SELECT max(l2.seq) FROM {line} AS l2 WHERE l2.key = p_key), 0) + 1,
                clock_timestamp() + p_place_ttl_ms * interval '1 millisecond')
            ON CONFLICT (key, owner) DO UPDATE SET expires_at = excluded.expires_at;
        RETURN QUERY SELECT NULL::bigint, t.owner, t.metadata FROM {table} AS t
            WHERE t.key = p_key AND t.expires_at > clock_timestamp();
        IF NOT FOUND THEN
            RETURN QUERY SELECT NULL::bigint, NULL::bytea, NULL::bytea;
        END IF;
    END
    $fn$;
"""


class Statements:
    """The statements for one table, rendered once to the bytes psycopg sends.

    Parameters are always bound (``%(name)s``); only the validated, quoted table
    identifiers are part of the SQL text. Each statement is composed with
    :mod:`psycopg.sql` and rendered here, once per provider: psycopg would otherwise
    render a ``sql.Composed`` again on every execution (10-25 us a call). Rendering
    needs no connection: the names are ASCII identifiers (``_options.table_name``),
    quoted the same in every client encoding.
    """

    def __init__(self, table: TableName) -> None:
        names = {
            "table": table.table,
            "meta": table.meta,
            "seq": table.sequence,
            "seq_regclass": table.sequence_regclass,
            "expiry_index": table.expiry_index,
            "slot_keys": table.slot_keys,
            "slots": table.slots,
            "line": table.line,
            "slot_take": table.slot_take,
            "slot_move": table.slot_move,
            "in_turn": table.in_turn,
            "lock_name": sql.Literal(str(table)),
            "expires_in": sql.SQL(_EXPIRES_IN),
            "channel": sql.Literal(channel_for(str(table))),
        }
        names["fresh_token"] = sql.SQL(_NEW_FENCE).format(seq_regclass=names["seq_regclass"])

        def compose(text: str) -> bytes:
            used = {k: v for k, v in names.items() if f"{{{k}}}" in text}
            return sql.SQL(text).format(**used).as_bytes(None)

        # Idempotent; several processes may run it at once (a concurrent creation fails
        # with a unique violation and is simply run again). No parameters, so psycopg
        # sends it as one simple query: one round trip, and PostgreSQL runs the
        # statements of one simple query as a single transaction, all or nothing.
        # Several commands cannot be one prepared statement: execute it with
        # prepare=False, or a pool with prepare_threshold=0 would try.
        self.migrate = compose(
            f"""
            SELECT pg_advisory_xact_lock(hashtextextended({{lock_name}}, 0));
            CREATE TABLE IF NOT EXISTS {{table}} (
                key bytea PRIMARY KEY,
                owner bytea NOT NULL,
                token bigint NOT NULL,
                expires_at timestamptz NOT NULL,
                metadata bytea
            );
            ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS metadata bytea;
            CREATE INDEX IF NOT EXISTS {{expiry_index}} ON {{table}} (expires_at);
            CREATE SEQUENCE IF NOT EXISTS {{seq}} AS bigint;
            CREATE TABLE IF NOT EXISTS {{meta}} (
                name text PRIMARY KEY,
                value bigint NOT NULL
            );
            {_SLOT_SCHEMA}
            INSERT INTO {{meta}} AS m (name, value) VALUES ('schema_version', {SCHEMA_VERSION})
                ON CONFLICT (name) DO UPDATE SET value = GREATEST(m.value, excluded.value)
            """
        )

        # No parameters. Raises UndefinedTable before the first migration.
        self.schema_version = compose("SELECT value FROM {meta} WHERE name = 'schema_version'")

        # %(key)s, %(owner)s, %(ttl_ms)s, %(metadata)s -> one row (token, holder,
        # holder's metadata).
        #
        # `granted` inserts a free key, takes over an expired row (a new token, drawn
        # under the row lock) or refreshes the caller's own live lease (same token).
        # ON CONFLICT DO UPDATE locks the existing row before testing its WHERE, and
        # keeps the lock when the WHERE fails, so a denied acquire leaves the row
        # locked by this statement: its holder cannot change until we commit.
        #
        # `holder` runs only when nothing was granted, and reads the holder in the same
        # statement. A plain SELECT would see the statement's snapshot, which can be
        # older than the row that denied us (we may have waited for its writer);
        # FOR SHARE makes READ COMMITTED follow the row's update chain to its newest
        # version (the one we hold locked) and re-check the WHERE on it, so the holder
        # returned is the one that denied us. Only a row created after the snapshot
        # (the key had no row when the statement began) is invisible to it: then
        # `holder` is NULL and the caller reads the owner once more (OWNER), which is
        # the uncommon case of two acquirers racing for a brand-new key.
        #
        # The metadata is the caller's in every grant (the holder's re-acquire sets it
        # too); the holder's is returned with the holder, so a denied caller learns
        # where to route in the same round trip.
        self.acquire = compose(_ACQUIRE.format(returning="", notify=""))
        # The same, telling owner watchers in the same statement when the key changed
        # hands, on the table's NOTIFY channel (a literal: a parameter would cost every
        # acquire its adaptation; a fourth column, the pg_notify call's void, NULL when
        # it sent nothing). The payload is
        # GRANT_PREFIX and the key in hex, which a release's waiters ignore and an
        # older leasekit's listener cannot decode, so skips. Changed hands means a
        # token drawn by this statement (a new grant: a free key, an expired one taken
        # over, the holder's own expired lease): a new token is at least the clock part
        # of statement_timestamp() (clock_timestamp() is never earlier), while the
        # holder's refresh keeps a token drawn by an earlier statement, earlier on the
        # clock. A refresh hints only if the clock went back or its token's statement
        # ran on past this one's start (a watcher then reads the owner for nothing);
        # a new grant always hints. Sent at commit, so a woken watcher finds the grant.
        self.acquire_notify = compose(
            _ACQUIRE.format(
                returning=f", lease.key, lease.token >= {_STATEMENT_FENCE_FLOOR} AS fresh",
                notify=(
                    ", (SELECT pg_notify({channel}, "
                    f"'{GRANT_PREFIX}' || encode(key, 'hex')) FROM granted WHERE fresh)"
                ),
            )
        )

        # Operations that arrive together, decided together (issue 28; see _group).
        # Every group statement first sets, for its own transaction only, a
        # %(lock_timeout)s (text, '200ms'): a row another transaction keeps locked
        # longer fails the group (LockNotAvailable, nothing committed) and its members
        # go alone, so one key held up elsewhere delays only its own caller.
        #
        # %(keys)s, %(owners)s, %(ttls_ms)s, %(metadata)s, four arrays of one length,
        # keys distinct and sorted -> one row per item, in item order, each exactly
        # ACQUIRE's (token, holder, holder's metadata[, the hint's void]).
        #
        # Each row is decided as ACQUIRE decides it, in one statement and one
        # transaction for the group: `granted` inserts the items in key order (so the
        # rows are locked in key order, the same in every group, and two groups never
        # wait for each other in a circle), and ON CONFLICT DO UPDATE locks each
        # existing row, re-checks it under the lock and keeps the lock when it denies.
        # The expiry of a taken-over row is computed after its lock is taken, from the
        # item's own TTL (the subquery), as ACQUIRE computes it. `holder` reads, FOR
        # SHARE, the holders of the items not granted (following each row's update
        # chain to the version that denied it, as in ACQUIRE); an item whose denying row
        # is newer than the snapshot has neither token nor holder, and its caller reads
        # the owner once more, exactly as after ACQUIRE. With notifications, each row
        # that changed hands sends its grant hint, as ACQUIRE_NOTIFY's.
        self.acquire_group = compose(_ACQUIRE_GROUP.format(returning="", notify=""))
        self.acquire_group_notify = compose(
            _ACQUIRE_GROUP.format(
                returning=f", lease.token >= {_STATEMENT_FENCE_FLOOR} AS fresh",
                notify=(
                    ", (SELECT pg_notify({channel}, "
                    f"'{GRANT_PREFIX}' || encode(item.key, 'hex')) WHERE g.fresh)"
                ),
            )
        )
        # %(keys)s, %(owners)s (distinct keys, sorted) -> one row (i,) per released
        # item, 1-based: RELEASE for each item, in one statement and one transaction.
        # Rows are locked in the order the plan visits them, as RENEW_MANY's (the
        # items' key order when it drives from them, as on a large table; a small
        # table's hash join goes by the table's order): a deadlock with another
        # statement fails one of them, or the lock timeout ends the wait, and the
        # group's members go alone.
        # The _notify twin also takes %(channel)s and notifies each released key's
        # waiters, as RELEASE_NOTIFY does.
        release_group = """
            WITH item AS (
                SELECT * FROM unnest(%(keys)b::bytea[], %(owners)b::bytea[])
                    WITH ORDINALITY AS item (key, owner, position)
                WHERE set_config('lock_timeout', %(lock_timeout)s, true) IS NOT NULL
            ),
            released AS (
                UPDATE {table} AS lease SET expires_at = clock_timestamp(), metadata = NULL
                FROM item
                WHERE lease.key = item.key AND lease.owner = item.owner
                    AND lease.expires_at > clock_timestamp()
                RETURNING item.position, lease.key
            )
            SELECT position{notify} FROM released
            """
        # %(keys)s, %(owners)s, %(ttls_ms)s -> RENEW_MANY's rows, for a group of renewals.
        self.renew_group = compose(
            """
            WITH item AS (
                SELECT * FROM unnest(%(keys)b::bytea[], %(owners)b::bytea[], %(ttls_ms)b::int4[])
                    WITH ORDINALITY AS item (key, owner, ttl_ms, position)
                WHERE set_config('lock_timeout', %(lock_timeout)s, true) IS NOT NULL
            )
            UPDATE {table} AS lease
            SET expires_at = clock_timestamp() + item.ttl_ms * interval '1 millisecond'
            FROM item
            WHERE lease.key = item.key AND lease.owner = item.owner
                AND lease.expires_at > clock_timestamp()
            RETURNING item.position
            """
        )
        self.release_group = compose(release_group.replace("{notify}", ""))
        self.release_group_notify = compose(
            release_group.replace("{notify}", ", pg_notify(%(channel)s, encode(key, 'hex'))")
        )

        # %(key)s -> (owner, token, metadata, remaining_ms) of the live lease, or no row.
        self.record = compose(
            """
            SELECT owner, token, metadata,
                ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint
            FROM {table} WHERE key = %(key)s AND expires_at > clock_timestamp()
            """
        )

        # %(key)s -> the live holder, or no row.
        self.owner = compose(
            "SELECT owner FROM {table} WHERE key = %(key)s AND expires_at > clock_timestamp()"
        )

        # %(key)s, %(owner)s, %(ttl_ms)s -> rowcount 1 if renewed. Only the live
        # holder's row matches; the token is kept.
        self.renew = compose(
            """
            UPDATE {table} SET expires_at = {expires_in}
            WHERE key = %(key)s AND owner = %(owner)s AND expires_at > clock_timestamp()
            """
        )

        # %(keys)s, %(owners)s, %(ttls_ms)s: three arrays of one length, item i being
        # (keys[i], owners[i], ttls_ms[i]) -> one row (i,) per renewed item, 1-based.
        # The batched renew: one statement, so one round trip and one transaction for
        # the whole batch, and each row decided exactly as RENEW decides it (owner and
        # expiry tested against clock_timestamp() under the row lock the UPDATE takes,
        # with READ COMMITTED's re-check of the join after waiting for a concurrent
        # writer). Keys are distinct within a batch (the toolkit checks), so every row
        # matches at most one item. Rows are locked in the order the plan visits
        # them, which, as for any multi-row UPDATE, may deadlock with another batch
        # over the same keys in another order: PostgreSQL then fails one of them, and
        # the caller retries it like any failed renewal.
        self.renew_many = compose(
            """
            WITH item AS (
                SELECT * FROM unnest(%(keys)b::bytea[], %(owners)b::bytea[], %(ttls_ms)b::int4[])
                    WITH ORDINALITY AS item (key, owner, ttl_ms, position)
            )
            UPDATE {table} AS lease
            SET expires_at = clock_timestamp() + item.ttl_ms * interval '1 millisecond'
            FROM item
            WHERE lease.key = item.key AND lease.owner = item.owner
                AND lease.expires_at > clock_timestamp()
            RETURNING item.position
            """
        )

        # %(key)s, %(owner)s. The holder's row expires at once and stays as a tombstone
        # that keeps its token (see the module docstring); anyone else's call matches
        # nothing.
        self.release = compose(
            """
            UPDATE {table} SET expires_at = clock_timestamp(), metadata = NULL
            WHERE key = %(key)s AND owner = %(owner)s AND expires_at > clock_timestamp()
            """
        )

        # The same two, telling waiters in the same statement: %(channel)s is the
        # table's NOTIFY channel, the payload the key in hex (a payload is text and may
        # not hold NUL). The notification goes out when the statement commits, so a
        # woken waiter always finds the change. rowcount: 1 if released (or moved).
        self.release_notify = compose(
            """
            WITH released AS (
                UPDATE {table} SET expires_at = clock_timestamp(), metadata = NULL
                WHERE key = %(key)s AND owner = %(owner)s AND expires_at > clock_timestamp()
                RETURNING key
            )
            SELECT pg_notify(%(channel)s, encode(key, 'hex')) FROM released
            """
        )
        # %(key)s, %(owner)s, %(token)s [, %(channel)s]: release only the grant that
        # carries this fencing token (the undo of a grant whose caller was cancelled,
        # leasekit.backend.SupportsReleaseGrant); another grant of the key, even to the
        # same owner, keeps a different token and is left alone.
        self.release_grant = compose(
            """
            UPDATE {table} SET expires_at = clock_timestamp(), metadata = NULL
            WHERE key = %(key)s AND owner = %(owner)s AND token = %(token)s
                AND expires_at > clock_timestamp()
            """
        )
        self.release_grant_notify = compose(
            """
            WITH released AS (
                UPDATE {table} SET expires_at = clock_timestamp(), metadata = NULL
                WHERE key = %(key)s AND owner = %(owner)s AND token = %(token)s
                    AND expires_at > clock_timestamp()
                RETURNING key
            )
            SELECT pg_notify(%(channel)s, encode(key, 'hex')) FROM released
            """
        )
        self.transfer_notify = compose(
            """
            WITH moved AS (
                UPDATE {table} SET
                    token = CASE WHEN owner = %(to_owner)s THEN token
                                 ELSE GREATEST(token + 1, {fresh_token}) END,
                    owner = %(to_owner)s,
                    expires_at = {expires_in},
                    metadata = %(metadata)s
                WHERE key = %(key)s AND owner = %(from_owner)s
                    AND expires_at > clock_timestamp()
                RETURNING key
            )
            SELECT pg_notify(%(channel)s, encode(key, 'hex')) FROM moved
            """
        )

        # %(key)s -> milliseconds left on the live lease, or no row.
        self.remaining = compose(
            """
            SELECT ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint
            FROM {table} WHERE key = %(key)s AND expires_at > clock_timestamp()
            """
        )

        # %(key)s, %(from_owner)s, %(to_owner)s, %(ttl_ms)s, %(metadata)s -> rowcount 1 if
        # moved. One UPDATE rewrites owner, token, expiry and metadata together: the key
        # is never free in between. A transfer to oneself is a renew and keeps the token
        # (the metadata is still replaced).
        self.transfer = compose(
            """
            UPDATE {table} SET
                token = CASE WHEN owner = %(to_owner)s THEN token
                             ELSE GREATEST(token + 1, {fresh_token}) END,
                owner = %(to_owner)s,
                expires_at = {expires_in},
                metadata = %(metadata)s
            WHERE key = %(key)s AND owner = %(from_owner)s AND expires_at > clock_timestamp()
            """
        )

        # %(grace_s)s, %(batch)s -> rowcount deleted. Up to `batch` rows that expired
        # more than `grace_s` ago, oldest first. The cutoff uses statement_timestamp(),
        # which is stable within the statement, so the expiry index serves it as a range
        # (clock_timestamp() is volatile and would turn it into a filter over the whole
        # index). FOR UPDATE SKIP LOCKED: a row some statement is working on is left for a
        # later sweep, and concurrent sweeps (one per process) never wait for each other.
        # The rows are then deleted by their physical address (a TID scan, no index
        # probes), which cannot change while we hold their locks; the outer WHERE repeats
        # the expiry test.
        self.sweep = compose(
            """
            DELETE FROM {table}
            WHERE ctid = ANY (ARRAY(
                SELECT ctid FROM {table}
                WHERE expires_at < statement_timestamp() - %(grace_s)s * interval '1 second'
                ORDER BY expires_at
                LIMIT %(batch)s
                FOR UPDATE SKIP LOCKED
            ))
            AND expires_at < statement_timestamp() - %(grace_s)s * interval '1 second'
            """
        )

        # %(limit)s [, %(low)s, %(high)s] -> (key, owner, token, remaining_ms, metadata)
        # of live leases in key order. A key prefix is the byte range [low, high), which the
        # primary key's index serves.
        inspect = """
            SELECT key, owner, token,
                ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint,
                metadata
            FROM {table}
            WHERE expires_at > clock_timestamp() {range}
            ORDER BY key
            LIMIT %(limit)s
            """
        self.inspect_all = compose(inspect.replace("{range}", ""))
        self.inspect_prefix = compose(
            inspect.replace("{range}", "AND key >= %(low)s AND key < %(high)s")
        )

        # No parameters. Rows live and expired: what the sweep keeps bounded.
        self.count_rows = compose("SELECT count(*) FROM {table}")

        # -- counting leases (one function call each, see _SLOT_SCHEMA) --
        # %(key)s, %(owner)s, %(ttl_ms)s, %(limit)s, %(exclusive)s, %(intent_ms)s,
        # %(shown)s -> (acquired, token, held, limit, holders, exclusive, waiting);
        # a limit other than %(limit)s: the stored one, nothing written.
        self.slot_acquire = compose(
            "SELECT * FROM {slot_take}(%(key)s, %(owner)s, %(ttl_ms)s, %(limit)s,"
            " %(exclusive)s, %(intent_ms)s, %(shown)s)"
        )
        # %(key)s, %(from_owner)s, %(to_owner)s, %(ttl_ms)s -> (moved,).
        self.slot_transfer = compose(
            "SELECT {slot_move}(%(key)s, %(from_owner)s, %(to_owner)s, %(ttl_ms)s)"
        )
        # %(key)s, %(owner)s, %(ttl_ms)s -> rowcount 1 if the caller's live slot was renewed.
        self.slot_renew = compose(
            f"""
            UPDATE {{slots}} SET expires_at = {_EXPIRES_IN}
            WHERE key = %(key)s AND owner = %(owner)s AND expires_at > clock_timestamp()
            """
        )
        # %(key)s, %(owner)s -> rowcount 1 if the caller's live slot was freed (its
        # token stays in the slot-keys row).
        self.slot_release = compose(
            """
            DELETE FROM {slots}
            WHERE key = %(key)s AND owner = %(owner)s AND expires_at > clock_timestamp()
            """
        )
        # %(key)s, %(owner)s, %(token)s: the same, only the grant carrying this token
        # (the undo of a slot grant whose caller was cancelled).
        self.slot_release_grant = compose(
            """
            DELETE FROM {slots}
            WHERE key = %(key)s AND owner = %(owner)s AND token = %(token)s
                AND expires_at > clock_timestamp()
            """
        )
        # %(key)s -> (owner, token, remaining_ms) of the live slots, in grant order.
        self.slot_records = compose(
            """
            SELECT owner, token,
                ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint
            FROM {slots} WHERE key = %(key)s AND expires_at > clock_timestamp()
            ORDER BY token
            """
        )

        # -- fair waiting --
        # %(key)s, %(owner)s, %(ttl_ms)s, %(place_ttl_ms)s, %(metadata)s, %(channel)s
        # -> (token, holder, holder's metadata): token when granted.
        self.acquire_in_turn = compose(
            "SELECT * FROM {in_turn}(%(key)s, %(owner)s, %(ttl_ms)s, %(place_ttl_ms)s,"
            " %(metadata)s::bytea, %(channel)s::text)"
        )
