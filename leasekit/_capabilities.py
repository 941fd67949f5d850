"""What a backend can promise, declared once as data and read by the runtime and the suite."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ._errors import InvalidLeaseArgument

__all__ = ["Capabilities", "capabilities_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """The guarantees a backend makes beyond the bare contract.

    Defaults are the conservative answer (nothing promised, millisecond TTLs): a
    third-party backend opts into each guarantee explicitly, and the conformance
    suite then fails it if the guarantee does not hold.

    - ``atomic_transfer``: ``transfer_lease`` never lets the key go free in between.
    - ``fencing``: successful acquires return a token strictly greater than every
      token issued before for that key, across expiry, release and restarts.
    - ``ttl_resolution_ms``: TTLs are rounded up to a multiple of this (etcd: 1000).
    - ``min_ttl_ms``: the shortest lease the store really grants; shorter requests
      are rounded up to it.
    - ``server_clock``: expiry is decided by the store's clock, not a client's.
    - ``shared_across_processes``: separate processes connecting to the same URL see
      the same leases (``memory://`` does not).
    - ``shared_across_hosts``: processes on different hosts see the same leases.
    - ``persistent``: leases and fencing state survive a restart of the store.
    - ``release_notifications``: waiters are woken when a key may have become free
      (release, transfer, expiry, a lost channel) through the store's own channel,
      via ``watch_release`` (:class:`leasekit.backend.SupportsReleaseNotifications`).
    - ``grant_notifications``: the same channel also tells of grants (a key taken,
      or handed on), to watchers that ask with ``watch_release(key, grants=True)``, so
      :func:`leasekit.watch_owner` sees a new owner of a free key without polling.
    - ``metadata``: ``acquire_lease`` and ``transfer_lease`` take ``metadata=`` (stored
      with the grant, kept by renew, replaced by transfer, cleared by release, returned
      to a denied acquirer in :attr:`LeaseResult.metadata`), and
      ``get_lease_record(key)`` reads owner, token, metadata and time left at once
      (:class:`leasekit.backend.SupportsRecords`).
    - ``slots``: counting leases: ``acquire_slot(key, owner, ttl_ms, limit=N)`` takes
      one of ``N`` slots of a key, each with its own owner, TTL and fencing token
      (:class:`leasekit.backend.SupportsSlots`).
    - ``fair_waiting``: ``acquire_lease_in_turn`` keeps a queue of waiters per key in
      the store, so ``wait_for(..., fair=True)`` and ``hold(wait_s=..., fair=True)``
      are served in arrival order (:class:`leasekit.backend.SupportsFairWaiting`).
    """

    atomic_transfer: bool = False
    fencing: bool = False
    ttl_resolution_ms: int = 1
    min_ttl_ms: int = 1
    server_clock: bool = False
    shared_across_processes: bool = False
    shared_across_hosts: bool = False
    persistent: bool = False
    release_notifications: bool = False
    grant_notifications: bool = False
    metadata: bool = False
    slots: bool = False
    fair_waiting: bool = False

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.type in ("bool", bool):
                if not isinstance(value, bool):
                    raise InvalidLeaseArgument.for_argument(
                        field.name, f"must be a bool, got {value!r}"
                    )
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidLeaseArgument.for_argument(
                    field.name, f"must be an int >= 1, got {value!r}"
                )

    @classmethod
    def flag_names(cls) -> tuple[str, ...]:
        """The names of the boolean capabilities, the ones ``require=`` can ask for."""
        return tuple(f.name for f in fields(cls) if f.type in ("bool", bool))

    def effective_ttl_ms(self, ttl_ms: int) -> int:
        """The TTL the store really grants for a requested ``ttl_ms`` (rounded up)."""
        ttl_ms = max(ttl_ms, self.min_ttl_ms)
        step = self.ttl_resolution_ms
        return -(-ttl_ms // step) * step


_DEFAULT = Capabilities()


def capabilities_of(provider: object) -> Capabilities:
    """Return ``provider.capabilities``, or the conservative defaults if it declares none."""
    declared = getattr(provider, "capabilities", None)
    if declared is None:
        return _DEFAULT
    if not isinstance(declared, Capabilities):
        raise TypeError(
            f"{type(provider).__name__}.capabilities must be a leasekit.Capabilities, "
            f"got {type(declared).__name__}"
        )
    return declared
