"""Every Lua script the Redis backend runs, each in one place with why it is atomic.

Redis runs a script without interleaving any other command, so each script's read,
ownership check and write form one atomic step, decided on the server's clock, in
one round trip (EVALSHA, falling back to EVAL when the server lost its script cache).

Layout, for a lease key ``k`` under the provider's ``prefix`` (see ``_keys``):

- ``<prefix>{<k escaped>}``: the lease. A string ``"<token> <owner>"`` with a ``PX``
  TTL: the key exists exactly while the lease is live, so Redis itself frees it at
  expiry. The token has no spaces, so the first space ends it and the owner (which
  may contain spaces, NUL, anything) is the rest. A lease granted with metadata is
  ``"<token>:<n> <owner><metadata>"``: its last ``n`` bytes are the metadata (any
  bytes, ``n`` may be 0), so owner and metadata need no escaping, and a lease without
  metadata is stored exactly as before it existed. Metadata lives and dies with the
  grant it was written with: in the same value, under the same TTL, in the same SET.
- ``<prefix>{<k escaped>}:fence``: the fencing counter, the last token issued for
  ``k``. It outlives the lease (so release and expiry do not reset it) by
  ``counter_ttl_ms``, or forever when that is ``None``.

Both names carry the same hash tag, so they sit in one Redis Cluster slot and one
script may touch both.

A new token is ``max(last + 1, server time in microseconds)`` (``TIME``). The first
term makes tokens strictly increasing while the counter lives; the second keeps
them increasing after the counter is gone (expired after ``counter_ttl_ms``, or lost
in a restart of a server without persistence), because a later grant reads a later
clock. So fencing holds across restarts and the counter's memory can be bounded,
unless the server's clock steps back by more than the time since the key's last
grant at a moment when its counter is gone. Redis >= 5 replicates scripts by their
effects, so calling ``TIME`` before writing is allowed.

Numbers stay exact: microsecond timestamps are about 2**51, below the 2**53 that a
Lua (double) number holds exactly, and tokens cross into strings with ``%.0f``, never
``tostring`` (which would print ``1.7e+15``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = [
    "ACQUIRE",
    "ACQUIRES",
    "ACQUIRE_SHARDED",
    "ACQUIRE_SILENT",
    "RECORD",
    "RELEASE",
    "RENEW",
    "RENEW_MANY",
    "TRANSFER",
    "Script",
]


@dataclass(frozen=True)
class Script:
    """A script's source and the SHA1 that EVALSHA calls it by."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()
        object.__setattr__(self, "sha", digest)


# Shared by the scripts below (each script is sent whole; Redis has no includes).
_PRELUDE = """
-- A lease value's owner, token and metadata (nil when it has none).
local function parse(value)
  local sep = string.find(value, ' ', 1, true)
  local head = string.sub(value, 1, sep - 1)
  local colon = string.find(head, ':', 1, true)
  if not colon then
    return string.sub(value, sep + 1), head
  end
  local cut = #value - tonumber(string.sub(head, colon + 1))
  return string.sub(value, sep + 1, cut), string.sub(head, 1, colon - 1),
    string.sub(value, cut + 1)
end

-- The value of a lease: parse's inverse.
local function lease_value(token, owner, metadata)
  if metadata == nil then
    return token .. ' ' .. owner
  end
  return token .. ':' .. #metadata .. ' ' .. owner .. metadata
end

local function next_token(counter_key, counter_px)
  local now = redis.call('TIME')
  local clock_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local last = tonumber(redis.call('GET', counter_key) or '0')
  local token = string.format('%.0f', math.max(last + 1, clock_us))
  if counter_px == '0' then
    redis.call('SET', counter_key, token)
  else
    redis.call('SET', counter_key, token, 'PX', counter_px)
  end
  return token
end

-- A hint to waiters, never part of the decision: pcall, so that a PUBLISH the server
-- refuses (a Redis 7 ACL user without channel permissions) cannot fail a release or
-- transfer whose write has already happened. Waiters then poll. The payload says what
-- happened: '' (released or handed on: every waiter looks again) or 'granted' (a free
-- key was taken: only owner watchers care, see ``_notify``).
local function notify(lease_key, publish, payload)
  if publish ~= '' then
    redis.pcall(publish, lease_key .. ':released', payload)
  end
end

local function touch_counter(counter_key, counter_px)
  if counter_px ~= '0' then
    redis.call('PEXPIRE', counter_key, counter_px)
  end
end

-- True when `owner` holds the live lease at `lease_key`.
local function held_by(lease_key, owner)
  local value = redis.call('GET', lease_key)
  return value ~= false and parse(value) == owner
end

-- A fresh TTL for a live lease, its counter kept at least as long.
local function extend(lease_key, counter_key, ttl_ms, counter_px)
  redis.call('PEXPIRE', lease_key, ttl_ms)
  touch_counter(counter_key, counter_px)
end

-- The holder's live lease again, with a fresh TTL and `metadata` (nil: none) in place of
-- `old`: the value is rewritten only when the metadata changed, else a PEXPIRE.
local function refresh(lease_key, counter_key, token, owner, old, metadata, ttl_ms, counter_px)
  if old == metadata then
    extend(lease_key, counter_key, ttl_ms, counter_px)
  else
    redis.call('SET', lease_key, lease_value(token, owner, metadata), 'PX', ttl_ms)
    touch_counter(counter_key, counter_px)
  end
end

-- A new grant of `lease_key` to `owner` with `metadata` (nil: none), with a new token
-- (returned, as a string).
local function grant(lease_key, counter_key, owner, ttl_ms, counter_px, metadata)
  local token = next_token(counter_key, counter_px)
  redis.call('SET', lease_key, lease_value(token, owner, metadata), 'PX', ttl_ms)
  return token
end
"""


# KEYS: lease, counter. ARGV: owner, ttl_ms, counter_px ('0': keep forever), and the
# metadata to store with the grant (absent: none).
# Returns the token, an integer, when granted (a free key gets a new token; the
# caller's own live lease keeps its token, gets a fresh TTL and the metadata given, or
# none), or, when another owner holds it, the holder, a string, or {holder, metadata}
# when the holder stored metadata: both come from the same read that decided, never a
# second GET. A scalar rather than a {granted, detail} pair where it can be: redis-py
# takes about 7 us more client CPU to parse an array reply, the largest cost per
# acquire that leasekit had added to a raw SET NX PX (docs/benchmarks.md); only a
# denied caller meeting metadata pays it. A Lua number becomes an integer reply
# exactly: tokens (microseconds, about 2**51) are below 2**53. Only a grant of a free
# key publishes (a 'granted' hint, for owner watchers): the holder's re-acquire does
# not, the key does not change hands. The publish command is part of the script, not
# an argument as in the others (one script per command: ACQUIRE with PUBLISH,
# ACQUIRE_SHARDED with SPUBLISH, ACQUIRE_SILENT with none): redis-py packs each
# argument in Python, and one more cost every acquire about 4,800 client instructions
# (benchmarks/instructions.py), the price of the whole grant hint otherwise.
def _acquire(name: str, publish: str) -> Script:
    return Script(
        name,
        _PRELUDE
        + f"""
local value = redis.call('GET', KEYS[1])
if value then
  local holder, token, metadata = parse(value)
  if holder ~= ARGV[1] then
    if metadata then
      return {{holder, metadata}}
    end
    return holder
  end
  refresh(KEYS[1], KEYS[2], token, holder, metadata, ARGV[4], ARGV[2], ARGV[3])
  return tonumber(token)
end
local token = grant(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
notify(KEYS[1], '{publish}', 'granted')
return tonumber(token)
""",
    )


ACQUIRE = _acquire("acquire", "PUBLISH")
ACQUIRE_SHARDED = _acquire("acquire_sharded", "SPUBLISH")
ACQUIRE_SILENT = _acquire("acquire_silent", "")
ACQUIRES = {b"PUBLISH": ACQUIRE, b"SPUBLISH": ACQUIRE_SHARDED, b"": ACQUIRE_SILENT}
"""The acquire script that publishes with each publish command (see ``_ops.context``)."""

# KEYS: lease. ARGV: owner, publish ('PUBLISH', 'SPUBLISH' on a cluster, or '' for
# none). Deletes the lease only if ARGV[1] holds it (an expired lease is already gone);
# the counter stays, and waiters hear of it on the lease's channel (``_notify``) in the
# same step. Returns 1 if deleted, else 0.
RELEASE = Script(
    "release",
    _PRELUDE
    + """
if held_by(KEYS[1], ARGV[1]) then
  redis.call('DEL', KEYS[1])
  notify(KEYS[1], ARGV[2], '')
  return 1
end
return 0
""",
)

# KEYS: lease. ARGV: owner, token, publish. RELEASE of only the grant that carries this
# fencing token (the undo of a grant whose caller was cancelled; see
# leasekit.backend.SupportsReleaseGrant): another grant of the key, even to the same
# owner, has a different token and is left alone. Returns 1 if deleted, else 0.
RELEASE_GRANT = Script(
    "release_grant",
    _PRELUDE
    + """
local value = redis.call('GET', KEYS[1])
if value then
  local owner, token = parse(value)
  if owner == ARGV[1] and token == ARGV[2] then
    redis.call('DEL', KEYS[1])
    notify(KEYS[1], ARGV[3], '')
    return 1
  end
end
return 0
""",
)

# KEYS: lease, counter. ARGV: owner, ttl_ms, counter_px. Resets the TTL of ARGV[1]'s
# live lease (and keeps the counter at least as long). Returns 1, or 0 if not held.
RENEW = Script(
    "renew",
    _PRELUDE
    + """
if held_by(KEYS[1], ARGV[1]) then
  extend(KEYS[1], KEYS[2], ARGV[2], ARGV[3])
  return 1
end
return 0
""",
)

# KEYS: lease, counter. ARGV: from_owner, to_owner, ttl_ms, counter_px, publish (as
# RELEASE's: waiters are told to look again, the key now being someone else's), and the
# new owner's metadata (absent: none). Rewrites the live lease of ARGV[1] in place for
# ARGV[2] with a new token, a fresh TTL and that metadata: one SET, so the key is never
# free in between, and the predecessor's metadata never carries over. Transfer to
# oneself is a renew that keeps the token and sets the metadata given. Returns 1, or 0
# if ARGV[1] does not hold a live lease. The hint is a release hint, not a 'granted'
# one: it wakes every waiter, owner watchers included.
TRANSFER = Script(
    "transfer",
    _PRELUDE
    + """
local value = redis.call('GET', KEYS[1])
if not value then
  return 0
end
local holder, token, metadata = parse(value)
if holder ~= ARGV[1] then
  return 0
end
if ARGV[2] == ARGV[1] then
  refresh(KEYS[1], KEYS[2], token, holder, metadata, ARGV[6], ARGV[3], ARGV[4])
  return 1
end
grant(KEYS[1], KEYS[2], ARGV[2], ARGV[3], ARGV[4], ARGV[6])
notify(KEYS[1], ARGV[5], '')
return 1
""",
)

# KEYS: lease 1, lease 2, ... ARGV: counter_ttl_ms ('-1': counters kept forever), then
# owner 1, ttl_ms 1, owner 2, ttl_ms 2, ... One RENEW per lease, in one script: the
# batch is one round trip and, as any script, runs without another command in between.
# Each lease's fencing counter is its name + ':fence' (``_keys.counter_name``), in the
# same hash slot by its hash tag; it is derived here rather than passed, as is its TTL
# (the lease's + counter_ttl_ms, as ``_replies._counter_px`` computes it), so that a
# batch sends three arguments per lease instead of five: packing the command is most
# of the client's work. Returns one string with a '1' for each renewed lease and a '0'
# for each that its owner did not hold live (one bulk reply parses faster than an
# array). On a cluster every key of one call must share a slot: the provider sends one
# call per slot.
RENEW_MANY = Script(
    "renew_many",
    _PRELUDE
    + """
local counter_ttl = tonumber(ARGV[1])
local renewed = {}
for i = 1, #KEYS do
  local lease = KEYS[i]
  if held_by(lease, ARGV[2 * i]) then
    local ttl = ARGV[2 * i + 1]
    redis.call('PEXPIRE', lease, ttl)
    if counter_ttl >= 0 then
      redis.call('PEXPIRE', lease .. ':fence', tonumber(ttl) + counter_ttl)
    end
    renewed[i] = '1'
  else
    renewed[i] = '0'
  end
end
return table.concat(renewed)
""",
)

# KEYS: lease. The whole record of the live lease in one step: {value, PTTL} (the value
# as stored, read by ``_ops.read_lease_value``; the milliseconds left by the server's
# clock), or nil (a nil reply) when the key is free.
RECORD = Script(
    "record",
    """
local value = redis.call('GET', KEYS[1])
if not value then
  return nil
end
return {value, redis.call('PTTL', KEYS[1])}
""",
)
