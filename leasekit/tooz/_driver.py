"""The tooz coordination driver: groups, members, leaders and locks as leasekit leases.

Every tooz object is one lease (see :mod:`leasekit.tooz._keys`): a group is a lease of
the longest TTL that its members' heartbeats renew; a member is a lease that expires
``timeout`` seconds after the last heartbeat, its capabilities stored in its owner; a
group's leader is a lease that ``run_watchers`` tries to take and the heartbeat renews;
a lock is a lease per name. Listing groups and members is the backend's ``inspect`` by
key prefix. The blocking API (:func:`leasekit.sync.connect`) does the I/O; group calls
run on tooz's executor and return its ``CoordinatorResult``, as tooz's own drivers do.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from concurrent import futures
from typing import Any, TypeVar

import tooz
from tooz import coordination
from tooz import utils as tooz_utils

from .. import sync as leasekit_sync
from .._contract import MAX_TTL_MS
from ..backend import LeaseRecord, keep_forever, on_fork_in_child
from . import _keys
from ._errors import translated
from ._lock import LeasekitLock
from ._options import ToozSettings, parse_settings

__all__ = ["LeasekitDriver"]

LOG = logging.getLogger(__name__)

_T = TypeVar("_T")

_LIST_LIMIT = 100_000
"""The most groups, or members of one group, that one listing returns."""
_GROUP_TTL_MS = MAX_TTL_MS
"""A group's lease: the longest a lease may be, renewed by its members' heartbeats."""
_LOCAL_CHARACTERISTICS = (
    coordination.Characteristics.DISTRIBUTED_ACROSS_THREADS,
    coordination.Characteristics.DISTRIBUTED_ACROSS_PROCESSES,
)


class LeasekitDriver(
    coordination.CoordinationDriverCachedRunWatchers,
    coordination.CoordinationDriverWithExecutor,
):
    """tooz's ``CoordinationDriver`` on any leasekit backend: ``leasekit+<scheme>://...``.

    ``tooz.coordination.get_coordinator("leasekit+redis://127.0.0.1:6379", b"me")``
    connects on ``start()`` (``ToozConnectionError`` if the store cannot be reached).
    Options in the URL's query: ``timeout`` (seconds a member or leader lives without a
    heartbeat, default 30), ``lock_timeout`` (the same for locks, default 30),
    ``namespace`` (the first segment of every key, default ``tooz``), tooz's
    ``executor``; every other option is the leasekit backend's. See docs/tooz.md.
    """

    CHARACTERISTICS: tuple[coordination.Characteristics, ...] = _LOCAL_CHARACTERISTICS

    def __init__(self, member_id: bytes, parsed_url: Any, options: dict[str, Any]) -> None:
        self.settings: ToozSettings = parse_settings(parsed_url, options)
        self._member_key = _keys.encode_id(member_id, "member_id")
        self._keys = _keys.Keys(self.settings.namespace)
        self._facade: leasekit_sync.SyncLeaseProvider | None = self._connect()
        if self._facade.capabilities.shared_across_hosts:
            self.CHARACTERISTICS = (
                *_LOCAL_CHARACTERISTICS,
                coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS,
            )
        super().__init__(_keys.to_bytes(member_id), parsed_url, options)
        if "executor" not in self._options:
            # tooz's default (futurist's pool) takes a second to stop; the standard
            # library's one worker runs the calls in the same order and stops at once.
            self._executor = tooz_utils.ProxyExecutor(
                type(self).__name__,
                lambda: futures.ThreadPoolExecutor(1, thread_name_prefix="leasekit-tooz"),
            )
        self._session = uuid.uuid4().hex
        self._member_owners: dict[bytes, str] = {}
        self._leading: set[bytes] = set()
        self._acquired_locks: set[LeasekitLock] = set()
        on_fork_in_child(self)

    def _after_fork_in_child(self) -> None:
        """In a forked child: the parent's memberships, leaderships and locks stay its own.

        The child gets a session of its own (so nothing it does renews, releases or
        leaves what the parent holds: its stop() leaves no group of the parent's) and
        a fresh executor (the parent's worker thread does not exist here); the facade
        rebuilds its own connections. No I/O, no waiting.
        """
        self._session = uuid.uuid4().hex
        self._member_owners = {}
        self._leading = set()
        self._acquired_locks = set()
        self._joined_groups = set()
        executor = self._executor
        if executor.started and executor.executor is not None:
            keep_forever(executor.executor)
            executor.executor = executor.default_executor_factory()

    def _connect(self) -> leasekit_sync.SyncLeaseProvider:
        return leasekit_sync.connect(
            self.settings.url,
            thread_name=f"leasekit-tooz {self.settings.scheme}",
            **self.settings.connect_options,
        )

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def facade(self) -> leasekit_sync.SyncLeaseProvider:
        """The blocking leasekit provider the driver runs on (while started)."""
        facade = self._facade
        if facade is None or facade.closed:
            raise tooz.ToozError("the leasekit tooz driver has not been started")
        return facade

    def _start(self) -> None:
        super()._start()
        self._session = uuid.uuid4().hex
        if self._facade is None or self._facade.closed:
            self._facade = self._connect()
        try:
            with translated():
                self._facade.open()
                # One round trip: a store that is down says so now, not at first use.
                self._facade.get_lease_owner(self._keys.group("-"))
        except BaseException:
            self._facade.close()
            raise

    def _stop(self) -> None:
        for lock in list(self._acquired_locks):
            _logging_failure(lock.release, "could not release lock %r on stop", lock)
        for group_id in list(self._leading):
            _logging_failure(
                functools.partial(self.stand_down_group_leader, group_id),
                "could not stand down in group %r on stop",
                group_id,
            )
        super()._stop()
        facade, self._facade = self._facade, None
        if facade is not None:
            facade.close()

    def _submit(self, fn: Callable[..., _T], *args: Any) -> coordination.CoordinatorResult[_T]:
        if not self._started:
            raise tooz.ToozError("the leasekit tooz driver has not been started")

        def run() -> _T:
            with translated():
                return fn(*args)

        return coordination.CoordinatorResult(self._executor.submit(run))

    # -- lease helpers (also used by LeasekitLock) -----------------------------------------

    def lock_owner(self, member: str, instance: str) -> str:
        return _keys.lock_owner(self._session, member, instance)

    def lock_acquired(self, lock: LeasekitLock) -> None:
        self._acquired_locks.add(lock)

    def lock_released(self, lock: LeasekitLock) -> None:
        self._acquired_locks.discard(lock)

    def release_if_held(self, key: str, owner: str) -> bool:
        """Release ``key`` if ``owner`` holds it; whether it did.

        The backend's atomic ``release_if_held`` where it has one (every built-in
        backend). Otherwise, as the contract's release says nothing back, the holder is
        first confirmed by a renew to the shortest TTL (atomic: true only for the live
        holder), then released; should the release fail, the lease is gone within that
        TTL anyway.
        """
        facade = self.facade
        if facade.reports_releases:
            return facade.release_if_held(key, owner)
        if not facade.renew_lease(key, owner, facade.capabilities.min_ttl_ms):
            return False
        facade.release_lease(key, owner)
        return True

    def break_lease(self, key: str) -> bool:
        """Release ``key`` whoever holds it; whether a holder was released."""
        for _ in range(8):  # a new holder may arrive in between: take it on again
            holder = self.facade.get_lease_owner(key)
            if holder is None:
                return False
            if self.release_if_held(key, holder):
                return True
        return False

    def _group_exists(self, group: str) -> bool:
        return self.facade.get_lease_owner(self._keys.group(group)) is not None

    def _list(self, prefix: str) -> list[LeaseRecord]:
        """The live leases under ``prefix``; ``ToozError`` rather than a partial list."""
        facade = self.facade
        # The backend's blocking provider lists natively; otherwise its async one does.
        native_inspect = getattr(facade._native, "inspect", None)
        if callable(native_inspect):
            records: list[LeaseRecord] = native_inspect(prefix, limit=_LIST_LIMIT + 1)
        else:
            inspect = getattr(facade.provider, "inspect", None)
            if not callable(inspect):
                raise tooz.NotImplemented(
                    f"the leasekit backend {facade.backend!r} cannot list leases (no inspect)"
                )
            records = facade.run(inspect, prefix, limit=_LIST_LIMIT + 1)
        if len(records) > _LIST_LIMIT:
            raise tooz.ToozError(f"more than {_LIST_LIMIT} leases under {prefix!r} to list")
        return records

    # -- groups ----------------------------------------------------------------------------

    def create_group(self, group_id: bytes) -> coordination.CoordinatorResult[None]:
        group = _keys.encode_id(group_id, "group_id")
        key = self._keys.group(group)

        def create() -> None:
            if not self.facade.acquire_lease(
                key, f"group {uuid.uuid4().hex}", _GROUP_TTL_MS
            ).acquired:
                raise coordination.GroupAlreadyExist(group_id)

        return self._submit(create)

    def get_groups(self) -> coordination.CoordinatorResult[list[bytes]]:
        prefix = self._keys.groups_prefix()

        def groups() -> list[bytes]:
            return [_keys.Keys.last_segment(r.key, prefix) for r in self._list(prefix)]

        return self._submit(groups)

    def delete_group(self, group_id: bytes) -> coordination.CoordinatorResult[None]:
        group = _keys.encode_id(group_id, "group_id")

        def delete() -> None:
            if self._list(self._keys.members_prefix(group)):
                raise coordination.GroupNotEmpty(group_id)
            if not self.break_lease(self._keys.group(group)):
                raise coordination.GroupNotCreated(group_id)
            self.break_lease(self._keys.leader(group))  # a group created anew starts leaderless

        return self._submit(delete)

    def _destroy_group(self, group_id: bytes) -> None:
        """Remove a group and its members outright (tooz's tests call it on some drivers)."""
        group = _keys.encode_id(group_id, "group_id")
        with translated():
            for record in self._list(self._keys.members_prefix(group)):
                self.break_lease(record.key)
            self.break_lease(self._keys.group(group))

    # -- membership ------------------------------------------------------------------------

    def join_group(
        self, group_id: bytes, capabilities: coordination.Capabilities | None = None
    ) -> coordination.CoordinatorResult[None]:
        group = _keys.encode_id(group_id, "group_id")
        key = self._keys.member(group, self._member_key)
        owner = _keys.encode_member_owner(self._session, capabilities)
        gid = _keys.to_bytes(group_id)

        def join() -> None:
            facade = self.facade
            if not self._group_exists(group):
                raise coordination.GroupNotCreated(group_id)
            if facade.get_lease_owner(key) is not None:
                raise coordination.MemberAlreadyExist(group_id, self._member_id)
            if not facade.acquire_lease(key, owner, self.settings.member_ttl_ms).acquired:
                raise coordination.MemberAlreadyExist(group_id, self._member_id)
            self._joined_groups.add(gid)
            self._member_owners[gid] = owner

        return self._submit(join)

    def leave_group(self, group_id: bytes) -> coordination.CoordinatorResult[None]:
        group = _keys.encode_id(group_id, "group_id")
        key = self._keys.member(group, self._member_key)
        gid = _keys.to_bytes(group_id)

        def leave() -> None:
            own = self._member_owners.pop(gid, None)
            self._joined_groups.discard(gid)
            # A session that joined leaves its own membership only, never one that
            # another session of the member id took after this one lapsed; a session
            # that did not join may leave for the member id, booting out the one that
            # did (as tooz's drivers allow).
            left = self.release_if_held(key, own) if own is not None else self.break_lease(key)
            if not left:
                if not self._group_exists(group):
                    raise coordination.GroupNotCreated(group_id)
                raise coordination.MemberNotJoined(group_id, self._member_id)

        return self._submit(leave)

    def get_members(self, group_id: bytes) -> coordination.CoordinatorResult[set[bytes]]:
        group = _keys.encode_id(group_id, "group_id")

        def members() -> set[bytes]:
            return set(self._members(group_id, group))

        return self._submit(members)

    def _members(self, group_id: bytes, group: str) -> dict[bytes, Any]:
        prefix = self._keys.members_prefix(group)
        records = self._list(prefix)
        if not records and not self._group_exists(group):
            raise coordination.GroupNotCreated(group_id)
        return {
            _keys.Keys.last_segment(r.key, prefix): _keys.decode_member_owner(r.owner).capabilities
            for r in records
        }

    def get_members_with_capabilities(
        self, group_id: bytes
    ) -> coordination.CoordinatorResult[dict[bytes, coordination.Capabilities | None]]:
        group = _keys.encode_id(group_id, "group_id")
        return self._submit(self._members, group_id, group)

    def get_member_capabilities(
        self, group_id: bytes, member_id: bytes
    ) -> coordination.CoordinatorResult[coordination.Capabilities | None]:
        group = _keys.encode_id(group_id, "group_id")
        member = _keys.encode_id(member_id, "member_id")
        return self._submit(self._capabilities, group_id, member_id, group, member)

    def _capabilities(
        self, group_id: bytes, member_id: bytes, group: str, member: str
    ) -> coordination.Capabilities | None:
        owner = self.facade.get_lease_owner(self._keys.member(group, member))
        if owner is None:
            if not self._group_exists(group):
                raise coordination.GroupNotCreated(group_id)
            raise coordination.MemberNotJoined(group_id, member_id)
        caps: coordination.Capabilities | None = _keys.decode_member_owner(owner).capabilities
        return caps

    def get_member_info(
        self, group_id: bytes, member_id: bytes
    ) -> coordination.CoordinatorResult[dict[str, Any]]:
        """The member's capabilities, as ``{"capabilities": ...}`` (no statistics are kept)."""
        group = _keys.encode_id(group_id, "group_id")
        member = _keys.encode_id(member_id, "member_id")

        def info() -> dict[str, Any]:
            return {"capabilities": self._capabilities(group_id, member_id, group, member)}

        return self._submit(info)

    def update_capabilities(
        self, group_id: bytes, capabilities: coordination.Capabilities
    ) -> coordination.CoordinatorResult[None]:
        group = _keys.encode_id(group_id, "group_id")
        key = self._keys.member(group, self._member_key)
        new_owner = _keys.encode_member_owner(self._session, capabilities)
        gid = _keys.to_bytes(group_id)

        def update() -> None:
            old_owner = self._member_owners.get(gid)
            moved = old_owner is not None and self.facade.transfer_lease(
                key, old_owner, new_owner, self.settings.member_ttl_ms
            )
            if not moved:
                if not self._group_exists(group):
                    raise coordination.GroupNotCreated(group_id)
                raise coordination.MemberNotJoined(group_id, self._member_id)
            self._member_owners[gid] = new_owner

        return self._submit(update)

    # -- leaders ---------------------------------------------------------------------------

    def get_leader(self, group_id: bytes) -> coordination.CoordinatorResult[bytes]:
        group = _keys.encode_id(group_id, "group_id")

        def leader() -> Any:
            owner = self.facade.get_lease_owner(self._keys.leader(group))
            if owner is None:
                if not self._group_exists(group):
                    raise coordination.GroupNotCreated(group_id)
                return None
            return _keys.leader_member(owner)

        return self._submit(leader)

    def _leader_owner(self) -> str:
        return _keys.leader_owner(self._session, self._member_key)

    def run_elect_coordinator(self) -> None:
        """Try to become leader of every group watched with ``watch_elected_as_leader``."""
        with translated():
            for group_id, hooks in list(self._hooks_elected_leader.items()):
                gid = _keys.to_bytes(group_id)
                key = self._keys.leader(_keys.encode_id(group_id, "group_id"))
                ttl_ms = self.settings.member_ttl_ms
                if gid in self._leading and self.facade.renew_lease(
                    key, self._leader_owner(), ttl_ms
                ):
                    continue
                self._leading.discard(gid)
                if self.facade.acquire_lease(key, self._leader_owner(), ttl_ms).acquired:
                    self._leading.add(gid)
                    hooks.run(coordination.LeaderElected(group_id, self._member_id))

    def run_watchers(self, timeout: float | None = None) -> list[Any]:
        result = super().run_watchers(timeout=timeout)
        self.run_elect_coordinator()
        return result

    def stand_down_group_leader(self, group_id: bytes) -> bool:
        gid = _keys.to_bytes(group_id)
        if gid not in self._leading:
            return False
        self._leading.discard(gid)
        key = self._keys.leader(_keys.encode_id(group_id, "group_id"))
        with translated():
            return self.release_if_held(key, self._leader_owner())

    # -- locks and liveness ----------------------------------------------------------------

    def get_lock(self, name: bytes) -> LeasekitLock:
        key = self._keys.lock(_keys.encode_id(name, "name"))
        return LeasekitLock(name, self, key, self._member_key)

    def heartbeat(self) -> float:
        """Renew memberships (and their groups), leaderships and held locks.

        Returns the seconds until the next heartbeat is due: the shorter of ``timeout``
        and ``lock_timeout`` (tooz's heart waits half of it).
        """
        facade = self.facade
        with translated():
            for gid, owner in list(self._member_owners.items()):
                group = _keys.encode_id(gid, "group_id")
                key = self._keys.member(group, self._member_key)
                if not facade.renew_lease(key, owner, self.settings.member_ttl_ms):
                    LOG.warning("membership of group %r expired before its heartbeat", gid)
                    self._member_owners.pop(gid, None)
                    continue
                group_key = self._keys.group(group)
                holder = facade.get_lease_owner(group_key)
                if holder is not None:
                    facade.renew_lease(group_key, holder, _GROUP_TTL_MS)
            for gid in list(self._leading):
                key = self._keys.leader(_keys.encode_id(gid, "group_id"))
                ttl_ms = self.settings.member_ttl_ms
                if not facade.renew_lease(key, self._leader_owner(), ttl_ms):
                    self._leading.discard(gid)
            for lock in list(self._acquired_locks):
                _logging_failure(lock.heartbeat, "could not renew lock %r", lock)
        return min(self.settings.member_ttl_ms, self.settings.lock_ttl_ms) / 1000.0


def _logging_failure(action: Callable[[], object], message: str, subject: object) -> None:
    """Run ``action``; a tooz error is logged, as tooz's drivers do on stop and heartbeat."""
    try:
        action()
    except tooz.ToozError:
        LOG.warning(message, subject, exc_info=True)
