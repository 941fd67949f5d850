"""The Redis guards: :func:`fenced_redis_write` and its blocking twin, one Lua script."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import InvalidLeaseArgument, StaleFencingToken
from ._shared import DEFAULT_REDIS_FENCE_PREFIX, resource_bytes, validate_token

if TYPE_CHECKING:
    import redis
    import redis.asyncio

__all__ = ["REDIS_COMMANDS", "fenced_redis_write", "fenced_redis_write_sync"]

REDIS_COMMANDS = frozenset({"SET", "HSET", "DEL", "XADD", "EXPIRE"})
"""The write commands :func:`fenced_redis_write` runs after the check."""


# -- Redis: one Lua script ------------------------------------------------------------------
#
# KEYS[1]     the fence key, holding the highest token seen as a decimal string
# KEYS[2..]   the keys of the commands, in order
# ARGV[1]     the caller's token, a decimal string without leading zeros
# ARGV[2]     the number of commands; then, per command: its name, its number of keys
#             (taken in order from KEYS), its number of other arguments, the arguments
#
# Why it is atomic: Redis runs a script without interleaving any other command, so
# the comparison with the fence, the caller's writes and the fence's update are one
# step. The script checks every command name against the allowed set and the token
# against the fence before its first write, so a refused call writes nothing. Tokens
# are compared as decimal strings (longer is larger, then digit by digit; not with
# Lua's string "<", which follows the server's locale), never as Lua numbers, which are
# doubles and lose exactness above 2**53. The fence key has no TTL.
# If a command fails (a WRONGTYPE, say), the script stops there: Redis has no rollback,
# so earlier commands of the same call stay written, and the fence is not advanced.
_REDIS_FENCED_WRITE = """
local allowed = {SET = true, HSET = true, DEL = true, XADD = true, EXPIRE = true}
local function greater(a, b)
  if #a ~= #b then return #a > #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return false
end
local token = ARGV[1]
local count = tonumber(ARGV[2])
local commands = {}
local a, k = 3, 2
for i = 1, count do
  local name = ARGV[a]
  if not allowed[name] then
    return redis.error_reply('ERR leasekit fence: command not allowed: ' .. tostring(name))
  end
  local nkeys, nargs = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  a = a + 3
  local command = {name}
  for _ = 1, nkeys do command[#command + 1] = KEYS[k]; k = k + 1 end
  for _ = 1, nargs do command[#command + 1] = ARGV[a]; a = a + 1 end
  commands[i] = command
end
local current = redis.call('GET', KEYS[1])
if current and greater(current, token) then
  return {0, current}
end
local replies = {1, token}
for i = 1, count do
  replies[#replies + 1] = redis.call(unpack(commands[i]))
end
redis.call('SET', KEYS[1], token)
return replies
"""


@functools.lru_cache(maxsize=1)
def _redis_script_sha() -> str:
    import hashlib  # noqa: PLC0415

    return hashlib.sha1(_REDIS_FENCED_WRITE.encode(), usedforsecurity=False).hexdigest()


_RedisValue = str | bytes | int | float


@dataclass(frozen=True, slots=True)
class _RedisRequest:
    """What to send: the script's KEYS and ARGV, built and checked before any I/O."""

    resource: str
    token: int
    keys: tuple[_RedisValue, ...]
    args: tuple[_RedisValue, ...]


def _redis_argument(value: object, where: str) -> _RedisValue:
    if isinstance(value, bool) or not isinstance(value, str | bytes | int | float):
        raise InvalidLeaseArgument.for_argument(
            "commands",
            f"{where} must be str, bytes, int or float, got {type(value).__name__}",
            value,
        )
    return value


# Per command: the fewest arguments after the name, and whether they must pair up
# (HSET's field/value pairs); every argument of DEL is a key, the others take one key.
_ARITY = {"SET": 2, "HSET": 3, "DEL": 1, "XADD": 4, "EXPIRE": 2}


def _redis_request(
    resource: object, token: object, commands: object, prefix: object
) -> _RedisRequest:
    raw = resource_bytes(resource)
    token = validate_token(token)
    if not isinstance(prefix, str | bytes):
        raise InvalidLeaseArgument.for_argument("prefix", "must be str or bytes", prefix)
    if isinstance(commands, str | bytes) or not isinstance(commands, Sequence) or not commands:
        raise InvalidLeaseArgument.for_argument(
            "commands", "must be a non-empty list of command tuples such as ('SET', key, value)"
        )
    fence_key = (prefix.encode("utf-8") if isinstance(prefix, str) else prefix) + raw
    keys: list[_RedisValue] = [fence_key]
    args: list[_RedisValue] = [str(token), str(len(commands))]
    for index, command in enumerate(commands):
        where = f"command {index}"
        if isinstance(command, str | bytes) or not isinstance(command, Sequence) or not command:
            raise InvalidLeaseArgument.for_argument(
                "commands", f"{where} must be a tuple such as ('SET', key, value)", command
            )
        name = command[0]
        if not isinstance(name, str) or name.upper() not in REDIS_COMMANDS:
            raise InvalidLeaseArgument.for_argument(
                "commands",
                f"{where}: {name!r} is not one of {', '.join(sorted(REDIS_COMMANDS))}",
                command,
            )
        name = name.upper()
        rest = [_redis_argument(v, f"{where} ({name}) argument") for v in command[1:]]
        if len(rest) < _ARITY[name] or (name == "HSET" and len(rest) % 2 == 0):
            raise InvalidLeaseArgument.for_argument(
                "commands", f"{where}: wrong number of arguments for {name}", command
            )
        if name == "EXPIRE" and len(rest) > 3:
            raise InvalidLeaseArgument.for_argument(
                "commands", f"{where}: wrong number of arguments for EXPIRE", command
            )
        nkeys = len(rest) if name == "DEL" else 1
        for key in rest[:nkeys]:
            if not isinstance(key, str | bytes):
                raise InvalidLeaseArgument.for_argument(
                    "commands", f"{where} ({name}): a key must be str or bytes", command
                )
        keys.extend(rest[:nkeys])
        args.extend((name, str(nkeys), str(len(rest) - nkeys), *rest[nkeys:]))
    return _RedisRequest(resource=str(resource), token=token, keys=tuple(keys), args=tuple(args))


def _redis_replies(request: _RedisRequest, reply: Any) -> list[Any]:
    if int(reply[0]) == 1:
        return list(reply[2:])
    raise StaleFencingToken(resource=request.resource, token=request.token, current=int(reply[1]))


async def fenced_redis_write(
    client: redis.asyncio.Redis | redis.asyncio.RedisCluster,
    resource: str,
    token: int,
    commands: Sequence[Sequence[Any]],
    *,
    prefix: str | bytes = DEFAULT_REDIS_FENCE_PREFIX,
) -> list[Any]:
    """Run ``commands`` atomically if ``token`` is not stale for ``resource``.

    ``commands`` is a list of write commands, each a tuple of its name and arguments:
    ``("SET", key, value, ...)``, ``("HSET", key, field, value, ...)``, ``("DEL", key,
    ...)``, ``("XADD", key, id, field, value, ...)``, ``("EXPIRE", key, seconds)``. One
    Lua script compares ``token`` with the highest token recorded for ``resource`` (in
    the key ``prefix + resource``), runs the commands and records the token, with no
    other command in between; equal tokens pass. Returns the commands' replies.

    Raises :class:`leasekit.StaleFencingToken`, with nothing written, if a higher
    token was recorded; :class:`leasekit.InvalidLeaseArgument`, before any I/O, for a
    command outside that set or malformed input. On Redis Cluster every key, the fence
    key included, must hash to one slot: give them one hash tag (``resource="{inv-7}"``,
    keys ``"{inv-7}:status"``).
    """
    from redis.exceptions import NoScriptError  # noqa: PLC0415

    request = _redis_request(resource, token, commands, prefix)
    numkeys = len(request.keys)
    try:
        reply = await client.execute_command(
            "EVALSHA", _redis_script_sha(), numkeys, *request.keys, *request.args
        )
    except NoScriptError:
        # The server's script cache is empty (a restart, SCRIPT FLUSH): EVAL runs the
        # script and caches it again, so EVALSHA works next time.
        reply = await client.execute_command(
            "EVAL", _REDIS_FENCED_WRITE, numkeys, *request.keys, *request.args
        )
    return _redis_replies(request, reply)


def fenced_redis_write_sync(
    client: redis.Redis | redis.RedisCluster,
    resource: str,
    token: int,
    commands: Sequence[Sequence[Any]],
    *,
    prefix: str | bytes = DEFAULT_REDIS_FENCE_PREFIX,
) -> list[Any]:
    """The blocking :func:`fenced_redis_write`, for a ``redis.Redis`` client."""
    from redis.exceptions import NoScriptError  # noqa: PLC0415

    request = _redis_request(resource, token, commands, prefix)
    numkeys = len(request.keys)
    try:
        reply = client.execute_command(  # type: ignore[no-untyped-call]
            "EVALSHA", _redis_script_sha(), numkeys, *request.keys, *request.args
        )
    except NoScriptError:
        reply = client.execute_command(  # type: ignore[no-untyped-call]
            "EVAL", _REDIS_FENCED_WRITE, numkeys, *request.keys, *request.args
        )
    return _redis_replies(request, reply)
