"""Every SQL statement the SQLite backend runs, each in one place with why it is atomic.

Keys and owners are stored as UTF-8 ``BLOB``s so NUL and every other code point
round-trip byte for byte. Times are integer milliseconds of the host's wall clock,
read by SQLite itself (``julianday('now')``, which is fixed for the duration of one
statement), so every process on the host judges expiry by the same clock at the
moment the statement runs, never by a timestamp taken earlier in Python.

Fencing tokens live in the rows. Released leases stay as expired rows ("tombstones")
that keep their token, so the next acquire of that key continues from it. The sweep
deletes expired rows in bounded batches and first raises ``token_floor`` in the meta
table above every token it deletes; a key inserted afresh starts at
``token_floor + 1``. Together: every token for a key is strictly greater than all
tokens issued for it before, across release, expiry, sweeps and restarts.

Each operation is decided by one statement (an UPSERT or UPDATE with the ownership
condition in its ``WHERE``). Run alone in autocommit, a write statement is its own
transaction and takes SQLite's single write lock before it reads, as ``BEGIN
IMMEDIATE`` does; where several statements belong together (a denied acquire and the
holder it reads, the sweep, a batch of renewals) they run inside ``BEGIN IMMEDIATE``.
Either way the deciding statement sees and changes the row with no other writer in
between, in this process or any other.

This module is the statements' text only; ``_ops`` sends them and reads their replies.
"""

from __future__ import annotations

SCHEMA_VERSION = 2
"""1: the first tables; 2: ``leasekit_leases.metadata`` (lease metadata, routing) and the
counting leases' two tables."""

NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"

# Idempotent: every process may run it on first use. No index on expires_at_ms: every
# acquire and release changes that column, so such an index costs each write a second
# B-tree page to change and to write to the WAL (about a tenth of a cycle's time and
# CPU in docs/benchmarks.md); the sweep walks the primary key instead (below). Files
# made before keep their index ``leasekit_leases_expiry``, which nothing reads any
# more; see docs/backends/sqlite.md for dropping it.
CREATE_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS leasekit_leases (
        key BLOB PRIMARY KEY NOT NULL,
        owner BLOB NOT NULL,
        token INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        metadata BLOB
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE IF NOT EXISTS leasekit_meta (
        name TEXT PRIMARY KEY NOT NULL,
        value INTEGER NOT NULL
    )
    """,
    # Counting leases: one row per live (or expired, until the key's next acquire)
    # slot, and one per key ever used: its limit and the last token it issued, kept
    # so tokens go on increasing after every slot is freed.
    """
    CREATE TABLE IF NOT EXISTS leasekit_slots (
        key BLOB NOT NULL,
        owner BLOB NOT NULL,
        token INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        exclusive INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (key, owner)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE IF NOT EXISTS leasekit_slot_keys (
        key BLOB PRIMARY KEY NOT NULL,
        slot_limit INTEGER NOT NULL,
        last_token INTEGER NOT NULL,
        intent BLOB,
        intent_expires_at_ms INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID
    """,
    # Fair waiting: each key's line of waiters, in arrival order (seq), each place
    # lapsing at expires_at_ms unless its waiter comes back before.
    """
    CREATE TABLE IF NOT EXISTS leasekit_line (
        key BLOB NOT NULL,
        owner BLOB NOT NULL,
        seq INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        PRIMARY KEY (key, owner)
    ) WITHOUT ROWID
    """,
    "INSERT OR IGNORE INTO leasekit_meta (name, value) VALUES ('token_floor', 0)",
    "INSERT OR IGNORE INTO leasekit_meta (name, value) "
    f"VALUES ('schema_version', {SCHEMA_VERSION})",
)

SCHEMA_VERSION_QUERY = "SELECT value FROM leasekit_meta WHERE name = 'schema_version'"

# Version 1 to 2, in one IMMEDIATE transaction after reading the version again in it
# (another process may have upgraded first). Adding a nullable column changes only the
# schema: SQLite rewrites no row, so this is instant however large the table. The
# counting leases' tables come from CREATE_SCHEMA, run first (IF NOT EXISTS).
UPGRADE_TO_2 = (
    "ALTER TABLE leasekit_leases ADD COLUMN metadata BLOB",
    "UPDATE leasekit_meta SET value = 2 WHERE name = 'schema_version'",
)

# WAL lets readers and a writer work at once; it is the file's setting, kept by it.
JOURNAL_MODE = "PRAGMA journal_mode"
USE_WAL = "PRAGMA journal_mode = WAL"

# Several statements that belong together: the write lock from the start, so no other
# writer comes in between (see above).
BEGIN = "BEGIN IMMEDIATE"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"

# :key, :owner, :ttl_ms, :metadata. Inserts a free key, or takes over an expired row
# (new token) or refreshes the caller's own live lease (same token); the grant's
# metadata (NULL for none) is stored with it either way. A live row of another owner
# fails the WHERE, so nothing is returned and nothing is written.
ACQUIRE = f"""
    INSERT INTO leasekit_leases (key, owner, token, expires_at_ms, metadata)
    VALUES (
        :key,
        :owner,
        (SELECT value FROM leasekit_meta WHERE name = 'token_floor') + 1,
        {NOW_MS} + :ttl_ms,
        :metadata
    )
    ON CONFLICT (key) DO UPDATE SET
        token = CASE
            WHEN owner = excluded.owner AND expires_at_ms > {NOW_MS} THEN token
            ELSE token + 1
        END,
        owner = excluded.owner,
        expires_at_ms = excluded.expires_at_ms,
        metadata = excluded.metadata
    WHERE owner = excluded.owner OR expires_at_ms <= {NOW_MS}
    RETURNING token
"""

# :key. The live holder, if any.
OWNER = f"SELECT owner FROM leasekit_leases WHERE key = :key AND expires_at_ms > {NOW_MS}"

# :key. The live holder and its metadata: what a denied acquire returns.
HOLDER = f"""
    SELECT owner, metadata FROM leasekit_leases WHERE key = :key AND expires_at_ms > {NOW_MS}
"""

# :key. The live lease's record: owner, token, remaining milliseconds, metadata.
RECORD = f"""
    SELECT owner, token, expires_at_ms - {NOW_MS}, metadata FROM leasekit_leases
    WHERE key = :key AND expires_at_ms > {NOW_MS}
"""

# :key, :owner, :ttl_ms. Only the live holder's row matches.
RENEW = f"""
    UPDATE leasekit_leases SET expires_at_ms = {NOW_MS} + :ttl_ms
    WHERE key = :key AND owner = :owner AND expires_at_ms > {NOW_MS}
"""

# :key, :owner. Expire the holder's row at once; the row keeps its token (tombstone),
# not the released grant's metadata.
RELEASE = f"""
    UPDATE leasekit_leases SET expires_at_ms = 0, metadata = NULL
    WHERE key = :key AND owner = :owner AND expires_at_ms > {NOW_MS}
"""

# :key, :owner, :token. RELEASE of only the grant that carries this fencing token (the
# undo of a grant whose caller was cancelled, leasekit.backend.SupportsReleaseGrant);
# another grant of the key, even to the same owner, keeps a different token.
RELEASE_GRANT = f"""
    UPDATE leasekit_leases SET expires_at_ms = 0, metadata = NULL
    WHERE key = :key AND owner = :owner AND token = :token AND expires_at_ms > {NOW_MS}
"""

# :key, :from_owner, :to_owner, :ttl_ms, :metadata. One UPDATE moves ownership: the
# key is never free in between. Transfer to oneself keeps the token (a renewal); the
# metadata is the new grant's either way (NULL for none).
TRANSFER = f"""
    UPDATE leasekit_leases SET
        token = CASE WHEN owner = :to_owner THEN token ELSE token + 1 END,
        owner = :to_owner,
        expires_at_ms = {NOW_MS} + :ttl_ms,
        metadata = :metadata
    WHERE key = :key AND owner = :from_owner AND expires_at_ms > {NOW_MS}
"""

# The sweep, in one IMMEDIATE transaction: it walks the keys in primary-key order, one
# window of at most :batch keys after the cursor :after per sweep (the sweeper in _ops
# keeps the cursor, from the empty BLOB, which sorts first, back to it after the last
# window), and deletes the rows of the window that expired by the cutoff, raising the
# floor over exactly their tokens first. Each sweep reads at most :batch rows of the
# key index, however large the table, and no index on the expiry is needed; a full
# pass reaches every expired row. SWEEP_WINDOW fixes the cutoff (one clock reading
# for both statements) and the window: the last key in it (NULL when it is empty)
# and how many keys it holds (fewer than :batch: the pass is over).
SWEEP_WINDOW = f"""
    SELECT {NOW_MS}, MAX(key), COUNT(*) FROM (
        SELECT key FROM leasekit_leases WHERE key > :after ORDER BY key LIMIT :batch
    )
"""
# The rows one sweep deletes: the window's expired ones. One condition for both
# statements, so the floor is raised over exactly the rows then deleted.
_SWEPT = "key > :after AND key <= :last AND expires_at_ms <= :cutoff"
SWEEP_RAISE_FLOOR = f"""
    UPDATE leasekit_meta
    SET value = MAX(value, COALESCE((SELECT MAX(token) FROM leasekit_leases WHERE {_SWEPT}), 0))
    WHERE name = 'token_floor'
"""
SWEEP_DELETE = f"DELETE FROM leasekit_leases WHERE {_SWEPT}"
SWEEP_START = b""  # the cursor of a pass's first window: every key sorts after it

# :prefix (a BLOB, or NULL for all), :limit. Live leases for `leasekit inspect`.
INSPECT = f"""
    SELECT key, owner, token, expires_at_ms - {NOW_MS}, metadata FROM leasekit_leases
    WHERE expires_at_ms > {NOW_MS}
        AND (:prefix IS NULL OR substr(key, 1, length(:prefix)) = :prefix)
    ORDER BY key
    LIMIT :limit
"""

COUNT_ROWS = "SELECT COUNT(*) FROM leasekit_leases"

# :key. The live lease's remaining milliseconds, so waiters sleep exactly until expiry.
REMAINING = f"""
    SELECT expires_at_ms - {NOW_MS} FROM leasekit_leases
    WHERE key = :key AND expires_at_ms > {NOW_MS}
"""

# -- counting leases ----------------------------------------------------------------------
# Each acquire and transfer runs in one BEGIN IMMEDIATE transaction (the file's write
# lock held throughout): drop the key's expired slots, read its limit, count and the
# caller's own slot, then write. No other writer comes in between, so the count is
# exact when the slot is inserted.

# :key. Expired slots of the key go first: what is left is live.
SLOT_DROP_EXPIRED = f"DELETE FROM leasekit_slots WHERE key = :key AND expires_at_ms <= {NOW_MS}"

# :key, :owner. The key's limit and last token (NULL, NULL for a key never used), how
# many slots are live, the caller's token and mode if it holds one, whether the key is
# held exclusively, and the owner of a live claim to go next (an exclusive waiter's).
SLOT_STATE = f"""
    SELECT
        (SELECT slot_limit FROM leasekit_slot_keys WHERE key = :key),
        (SELECT last_token FROM leasekit_slot_keys WHERE key = :key),
        (SELECT COUNT(*) FROM leasekit_slots WHERE key = :key),
        (SELECT token FROM leasekit_slots WHERE key = :key AND owner = :owner),
        (SELECT exclusive FROM leasekit_slots WHERE key = :key AND owner = :owner),
        (SELECT COUNT(*) FROM leasekit_slots WHERE key = :key AND exclusive),
        (SELECT intent FROM leasekit_slot_keys
            WHERE key = :key AND intent_expires_at_ms > {NOW_MS})
"""

# :key, :limit, :token. The key's limit (live slots agree with it, checked above) and
# the token just issued. A grant is made only with no live claim but the grantee's, so
# the claim, if any, is spent or stale: cleared.
SLOT_KEY_SET = """
    INSERT INTO leasekit_slot_keys (key, slot_limit, last_token) VALUES (:key, :limit, :token)
    ON CONFLICT (key) DO UPDATE SET
        slot_limit = excluded.slot_limit,
        last_token = excluded.last_token,
        intent = NULL
"""

# :key, :owner, :token, :ttl_ms, :exclusive.
SLOT_INSERT = f"""
    INSERT INTO leasekit_slots (key, owner, token, expires_at_ms, exclusive)
    VALUES (:key, :owner, :token, {NOW_MS} + :ttl_ms, :exclusive)
"""

# :key, :owner. The caller's shared slot, which its exclusive grant replaces.
SLOT_DROP_MINE = "DELETE FROM leasekit_slots WHERE key = :key AND owner = :owner"

# :key, :owner, :intent_ms. A denied exclusive acquirer's claim to go next.
SLOT_CLAIM = f"""
    UPDATE leasekit_slot_keys SET intent = :owner, intent_expires_at_ms = {NOW_MS} + :intent_ms
    WHERE key = :key
"""

# :key, :owner, :ttl_ms. Only the caller's live slot matches.
SLOT_RENEW = f"""
    UPDATE leasekit_slots SET expires_at_ms = {NOW_MS} + :ttl_ms
    WHERE key = :key AND owner = :owner AND expires_at_ms > {NOW_MS}
"""

# :key, :owner. The slot's row goes; its token stays in leasekit_slot_keys.
SLOT_RELEASE = f"""
    DELETE FROM leasekit_slots WHERE key = :key AND owner = :owner AND expires_at_ms > {NOW_MS}
"""

# :key, :owner, :token. SLOT_RELEASE of only the grant carrying this token: the undo
# of a slot grant whose caller was cancelled.
SLOT_RELEASE_GRANT = f"""
    DELETE FROM leasekit_slots
    WHERE key = :key AND owner = :owner AND token = :token AND expires_at_ms > {NOW_MS}
"""

# :key, :holders. The first live holders, in grant order, for a denial.
SLOT_HOLDERS = f"""
    SELECT owner FROM leasekit_slots WHERE key = :key AND expires_at_ms > {NOW_MS}
    ORDER BY token LIMIT :holders
"""

# :key, :from_owner, :to_owner, :token, :ttl_ms. The caller's slot, handed on. Run in
# the transaction that found the slot live: no expiry test here, as SQLite reads the
# clock afresh for each statement, and a slot that ran out between the two reads was
# still the caller's (no other writer came in between; see SLOT_REFRESH).
SLOT_TRANSFER = f"""
    UPDATE leasekit_slots SET owner = :to_owner, token = :token, expires_at_ms = {NOW_MS} + :ttl_ms
    WHERE key = :key AND owner = :from_owner
"""

# :key, :owner, :ttl_ms. An acquire by a holder, in the transaction that found its slot
# live: the TTL reset with no expiry test. With SLOT_RENEW's test, a slot whose last
# millisecond passed between that read and this write stayed expired while the acquire
# answered "granted, same token" (a churning process was then refused its transfer
# before the TTL it had been given could run out).
SLOT_REFRESH = f"""
    UPDATE leasekit_slots SET expires_at_ms = {NOW_MS} + :ttl_ms WHERE key = :key AND owner = :owner
"""

# :key, :token. The last token, after a transfer issued one.
SLOT_ADVANCE = "UPDATE leasekit_slot_keys SET last_token = :token WHERE key = :key"

# :key. The live slots with the time each has left, in grant order.
SLOT_RECORDS = f"""
    SELECT owner, token, expires_at_ms - {NOW_MS} FROM leasekit_slots
    WHERE key = :key AND expires_at_ms > {NOW_MS}
    ORDER BY token
"""

# -- fair waiting ---------------------------------------------------------------------------
# acquire_lease_in_turn runs in one BEGIN IMMEDIATE transaction: lapsed places dropped,
# the holder and the head of the line read, then either ACQUIRE (the caller's turn, or
# its own lease) and the caller's place removed, or the caller's place kept or added.

# :key. Places whose waiter did not come back in time.
LINE_DROP_LAPSED = f"DELETE FROM leasekit_line WHERE key = :key AND expires_at_ms <= {NOW_MS}"

# :key. The live holder, and the first live place in the line.
LINE_STATE = f"""
    SELECT
        (SELECT owner FROM leasekit_leases WHERE key = :key AND expires_at_ms > {NOW_MS}),
        (SELECT owner FROM leasekit_line WHERE key = :key ORDER BY seq LIMIT 1)
"""

# :key, :owner, :place_ttl_ms. A new place goes last; a kept one keeps its seq.
LINE_JOIN = f"""
    INSERT INTO leasekit_line (key, owner, seq, expires_at_ms)
    VALUES (
        :key,
        :owner,
        COALESCE((SELECT MAX(seq) FROM leasekit_line WHERE key = :key), 0) + 1,
        {NOW_MS} + :place_ttl_ms
    )
    ON CONFLICT (key, owner) DO UPDATE SET expires_at_ms = excluded.expires_at_ms
"""

# :key, :owner. The caller was served: out of the line.
LINE_LEAVE = "DELETE FROM leasekit_line WHERE key = :key AND owner = :owner"
