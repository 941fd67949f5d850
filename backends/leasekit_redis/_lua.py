"""Every Lua script the Redis backend runs, each in one place with why it is atomic.

One module, over 500 lines: every script the backend runs (leases, records, slots, the
line), each beside why it is atomic, in one place to review together.

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
    "ACQUIRE_IN_TURN",
    "ACQUIRE_SHARDED",
    "ACQUIRE_SILENT",
    "RECORD",
    "RELEASE",
    "RENEW",
    "RENEW_MANY",
    "SLOT_ACQUIRE",
    "SLOT_HOLDERS",
    "SLOT_RELEASE",
    "SLOT_RENEW",
    "SLOT_TRANSFER",
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


# -- counting leases (leasekit.backend.SupportsSlots) ------------------------------------
#
# A counting key ``k`` is two Redis keys beside the lease's, under its hash tag (one
# Cluster slot, so one script touches both), apart from the single-holder lease on the
# same key string:
#
# - ``<lease name>:slots``: a sorted set of the owners of slots, each scored by its
#   expiry in milliseconds on the server's clock (``TIME``). Every script first drops the
#   members whose expiry has passed (``ZREMRANGEBYSCORE``), so what is left is live.
# - ``<lease name>:slotinfo``: a hash: ``o<owner>`` -> the slot's token (``"<token>"``,
#   or ``"<token> x"`` when held exclusively; the key is then its only slot), ``limit``,
#   ``last`` (the last token issued for the counting key), and ``claim`` / ``claimexp``
#   (a denied exclusive acquirer's claim to go next, and when it lapses, in ms).
#
# Both keys expire together ``counter_ttl_ms`` after the latest slot's expiry (never,
# when that is None), so ``last`` outlives every slot. A new token is ``max(last + 1,
# server time in microseconds)``, as the lease's (see the top of this module).
_SLOT_PRELUDE = """
local Z, H = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = now_us / 1000

-- A time in ms as a score argument (a Lua number would be sent in %.14g).
local function ms(v)
  return string.format('%.3f', v)
end

-- Drop expired slots; the count of live ones.
local function live()
  local gone = redis.call('ZRANGEBYSCORE', Z, '-inf', ms(now))
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', Z, '-inf', ms(now))
    for i = 1, #gone do
      gone[i] = 'o' .. gone[i]
    end
    redis.call('HDEL', H, unpack(gone))
  end
  return redis.call('ZCARD', Z)
end

-- A slot's token (a string) and whether it is exclusive, or nil.
local function slot_of(owner)
  local value = redis.call('HGET', H, 'o' .. owner)
  if not value then
    return nil, false
  end
  local sep = string.find(value, ' ', 1, true)
  if sep then
    return string.sub(value, 1, sep - 1), true
  end
  return value, false
end

-- Both keys live at least until `until_ms` + counter_ttl ('-1': forever).
local function keep(until_ms, counter_ttl)
  local ttl = tonumber(counter_ttl)
  if ttl < 0 then
    return
  end
  local px = math.ceil(until_ms - now) + ttl
  local left = redis.call('PTTL', H)
  if left == -2 or left < px then
    redis.call('PEXPIRE', H, px)
  end
  left = redis.call('PTTL', Z)
  if left == -2 or left < px then
    redis.call('PEXPIRE', Z, px)
  end
end

local function new_token()
  local last = tonumber(redis.call('HGET', H, 'last') or '0')
  local token = string.format('%.0f', math.max(last + 1, now_us))
  redis.call('HSET', H, 'last', token)
  return token
end

local function put(owner, token, exclusive, expires)
  redis.call('ZADD', Z, ms(expires), owner)
  redis.call('HSET', H, 'o' .. owner, exclusive and (token .. ' x') or token)
end
"""

# KEYS: slots, slotinfo. ARGV: owner, ttl_ms, limit, exclusive ('1' or '0'),
# counter_ttl_ms ('-1': forever), claim_ms (how long a denied exclusive acquirer's claim
# lives). The rules of leasekit.backend.SupportsSlots (as leasekit/_memory_slots.py).
# Returns {1, token, held, exclusive} when granted; {0, held, limit, exclusive,
# waiting ('' for none), holder...} (at most SHOWN holders, in grant order) when denied;
# {2, stored limit} when the key's live slots have another limit (nothing written).
SLOT_ACQUIRE = Script(
    "slot_acquire",
    _SLOT_PRELUDE
    + """
local owner, ttl, limit, exclusive = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1'
local held = live()
local stored = tonumber(redis.call('HGET', H, 'limit') or '0')
if held > 0 and stored ~= limit then
  return {2, stored}
end
if stored ~= limit then
  redis.call('HSET', H, 'limit', limit)
end
local expires = now + ttl
local token, mine_x = slot_of(owner)
if token and (mine_x or not exclusive) then
  redis.call('ZADD', Z, ms(expires), owner)
  keep(expires, ARGV[5])
  return {1, tonumber(token), held, mine_x and 1 or 0}
end
local claimant = redis.call('HGET', H, 'claim')
if claimant and tonumber(redis.call('HGET', H, 'claimexp')) <= now then
  claimant = false
end
local others = held - (token and 1 or 0)
local held_x = false
if held == 1 and not token then
  local sole = redis.call('ZRANGE', Z, 0, 0)[1]
  local _, x = slot_of(sole)
  held_x = x
end
if exclusive and others == 0 and (not claimant or claimant == owner) then
  if claimant then
    redis.call('HDEL', H, 'claim', 'claimexp')
  end
  local granted = new_token()
  put(owner, granted, true, expires)
  keep(expires, ARGV[5])
  return {1, tonumber(granted), 1, 1}
end
if not exclusive and not held_x and not claimant and others < limit then
  local granted = new_token()
  put(owner, granted, false, expires)
  keep(expires, ARGV[5])
  return {1, tonumber(granted), held + 1, 0}
end
if exclusive and (not claimant or claimant == owner) then
  local claim_until = now + tonumber(ARGV[6])
  redis.call('HSET', H, 'claim', owner, 'claimexp', ms(claim_until))
  keep(claim_until, ARGV[5])
end
local reply = {0, held, stored > 0 and stored or limit, held_x and 1 or 0}
if claimant and claimant ~= owner then
  reply[5] = claimant
else
  reply[5] = ''
end
if held > 0 then
  local owners = redis.call('ZRANGE', Z, 0, -1)
  local tokens = {}
  for i = 1, #owners do
    tokens[owners[i]] = tonumber((slot_of(owners[i])))
  end
  table.sort(owners, function(a, b) return tokens[a] < tokens[b] end)
  for i = 1, math.min(#owners, SHOWN) do
    reply[5 + i] = owners[i]
  end
end
return reply
""".replace("SHOWN", "16"),
)

# KEYS: slots, slotinfo. ARGV: owner, ttl_ms, counter_ttl_ms. Resets the TTL of the
# owner's live slot. Returns 1, or 0 when it holds none.
SLOT_RENEW = Script(
    "slot_renew",
    _SLOT_PRELUDE
    + """
live()
if not redis.call('ZSCORE', Z, ARGV[1]) then
  return 0
end
local expires = now + tonumber(ARGV[2])
redis.call('ZADD', Z, ms(expires), ARGV[1])
keep(expires, ARGV[3])
return 1
""",
)

# KEYS: slots, slotinfo. ARGV: owner, and a token ('' for any). Frees the owner's live
# slot (only the one carrying that token, when given: the undo of a grant whose caller
# was cancelled). Returns 1, or 0 when it holds none.
SLOT_RELEASE = Script(
    "slot_release",
    _SLOT_PRELUDE
    + """
live()
local token = slot_of(ARGV[1])
if not token or (ARGV[2] ~= '' and token ~= ARGV[2]) then
  return 0
end
redis.call('ZREM', Z, ARGV[1])
redis.call('HDEL', H, 'o' .. ARGV[1])
return 1
""",
)

# KEYS: slots, slotinfo. ARGV: from_owner, to_owner, ttl_ms, counter_ttl_ms. Hands
# from_owner's live slot to to_owner with a new token (exclusive stays exclusive); to
# oneself, a renew. Returns 1, or 0 (nothing changed) when from_owner holds none or
# to_owner holds another.
SLOT_TRANSFER = Script(
    "slot_transfer",
    _SLOT_PRELUDE
    + """
live()
local token, x = slot_of(ARGV[1])
if not token then
  return 0
end
local expires = now + tonumber(ARGV[3])
if ARGV[2] == ARGV[1] then
  redis.call('ZADD', Z, ms(expires), ARGV[1])
  keep(expires, ARGV[4])
  return 1
end
if redis.call('ZSCORE', Z, ARGV[2]) then
  return 0
end
redis.call('ZREM', Z, ARGV[1])
redis.call('HDEL', H, 'o' .. ARGV[1])
put(ARGV[2], new_token(), x, expires)
keep(expires, ARGV[4])
return 1
""",
)

# KEYS: slots, slotinfo. The live slots: {owner, token, ms left, ...} flat, in no
# particular order (the caller sorts by token). Read-only: expired members are skipped,
# not dropped.
SLOT_HOLDERS = Script(
    "slot_holders",
    _SLOT_PRELUDE
    + """
local found = redis.call('ZRANGEBYSCORE', Z, '(' .. ms(now), '+inf', 'WITHSCORES')
local reply = {}
for i = 1, #found, 2 do
  local token = slot_of(found[i])
  if token then
    reply[#reply + 1] = found[i]
    reply[#reply + 1] = tonumber(token)
    reply[#reply + 1] = math.max(1, math.ceil(tonumber(found[i + 1]) - now))
  end
end
return reply
""",
)


# -- fair waiting (leasekit.backend.SupportsFairWaiting) ---------------------------------
#
# A key's line of waiters is two Redis keys beside its lease, under its hash tag:
# ``<lease name>:line``, a sorted set of the waiting owners scored by arrival (a
# sequence number), and ``<lease name>:places``, a hash: ``o<owner>`` -> when that place
# lapses (ms, server clock), and ``seq``, the last arrival number. A lapsed place is
# dropped when it reaches the head of the line (or its owner comes back, who then goes
# last); both keys live as long as the longest place and go when the line empties.
#
# KEYS: lease, counter, line, places. ARGV: owner, ttl_ms, counter_px, publish,
# place_ttl_ms, and the metadata to store with the grant (absent: none). ACQUIRE in the
# caller's turn: granted when the key is free and no live place is ahead of the
# caller's (or it holds the key: its own lease refreshed, same token); otherwise the
# caller keeps its place (or takes one at the end), which lives place_ttl_ms from now.
# Replies as ACQUIRE's, and an empty array when the key is free but it is not the
# caller's turn.
ACQUIRE_IN_TURN = Script(
    "acquire_in_turn",
    _PRELUDE
    + """
local LZ, LH = KEYS[3], KEYS[4]
local owner = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000

local function leave()
  if redis.call('ZREM', LZ, owner) == 1 then
    redis.call('HDEL', LH, 'o' .. owner)
    if redis.call('ZCARD', LZ) == 0 then
      redis.call('DEL', LZ, LH)
    end
  end
end

-- The owner of the first live place, lapsed ones before it dropped.
local function head()
  while true do
    local first = redis.call('ZRANGE', LZ, 0, 0)[1]
    if not first then
      return nil
    end
    if tonumber(redis.call('HGET', LH, 'o' .. first) or '0') > now then
      return first
    end
    redis.call('ZREM', LZ, first)
    redis.call('HDEL', LH, 'o' .. first)
  end
end

local value = redis.call('GET', KEYS[1])
local holder, token, metadata
if value then
  holder, token, metadata = parse(value)
  if holder == owner then
    leave()
    refresh(KEYS[1], KEYS[2], token, holder, metadata, ARGV[6], ARGV[2], ARGV[3])
    return tonumber(token)
  end
end
local first = head()
if value or (first and first ~= owner) then
  local place_ttl = tonumber(ARGV[5])
  local lapses = redis.call('HGET', LH, 'o' .. owner)
  if not lapses or tonumber(lapses) <= now then
    redis.call('ZADD', LZ, redis.call('HINCRBY', LH, 'seq', 1), owner)
  end
  redis.call('HSET', LH, 'o' .. owner, string.format('%.3f', now + place_ttl))
  for _, name in ipairs({LZ, LH}) do
    if redis.call('PTTL', name) < place_ttl then
      redis.call('PEXPIRE', name, place_ttl)
    end
  end
  if not value then
    return {}
  end
  if metadata then
    return {holder, metadata}
  end
  return holder
end
leave()
token = grant(KEYS[1], KEYS[2], owner, ARGV[2], ARGV[3], ARGV[6])
notify(KEYS[1], ARGV[4], 'granted')
return tonumber(token)
""",
)
