"""The public toolkit every leasekit backend is built from, ours and third parties'.

A backend's own code is its atomic mechanism: statements or scripts, reply parsing,
capabilities. Everything else is here, once:

- :class:`BackendProvider`: ``async with``, an idempotent ``aclose()`` that settles
  operations in flight and drains background work within ``timeout_s``, refusal after
  closing (:class:`~leasekit.LeaseProviderClosed`), a ``repr`` without secrets, and
  :meth:`BackendProvider._call`, the one bounded, error-mapped way to await a driver.
- :class:`Deadlines`: one timer per provider bounding every operation by ``timeout_s``.
- :class:`ErrorMap` and :func:`map_errors`: driver exceptions to
  :class:`~leasekit.LeaseBackendError`, :class:`~leasekit.LeaseBackendTimeout` and
  :class:`~leasekit.LeaseBackendUnreachable`, at the boundary.
- :func:`parse_url`, :class:`OptionSet` / :class:`Option` / :func:`timeout_option`,
  :func:`coerce_bool` and :func:`redact_url`: URLs with endpoint lists (IPv6
  included), options coerced one way, unknown ones refused, passwords never shown.
- :class:`LeaseRecord` and the protocols :class:`SupportsInspect`,
  :class:`SupportsMigrate`, :class:`SupportsSweep`, :class:`SupportsFlush`, checked
  structurally with :func:`supports`.
- :class:`ReleaseHub` / :class:`ReleaseWatch` and the protocols
  :class:`SupportsReleaseNotifications` and :class:`SupportsRemaining`: waking waiters
  when a key may have become free, instead of polling; :func:`stop_task` ends a
  listener's reader task, bounded.
- :class:`SyncBackendProvider`, the protocols :class:`SyncProvider` and
  :class:`SupportsSyncProvider`, :func:`sync_factory` and :class:`SyncDeadlines`: a
  native blocking provider for :mod:`leasekit.sync`, sharing the backend's statements,
  options and errors.
- :func:`on_fork_in_child`, :func:`keep_forever` and :class:`Rebuild`: what a provider
  forgets in a forked child, and how it builds itself anew there (the base classes
  do it for a backend whose ``from_url`` built the provider).
- :class:`FifoGate`: at most ``size`` holders, waiters served first come, first
  served; in front of a driver pool that lets a newcomer take a freed connection
  before a waiter (asyncmy's), so that waiters are not starved.
- :meth:`BackendProvider.undo_grant` and the protocols :class:`SupportsUndoGrant` and
  :class:`SupportsReleaseGrant`: a cancelled or timed-out acquire or transfer that
  may have landed is released in the background, that grant and no later one.
- :data:`Operation`, :func:`drive` and :func:`drive_async`: an operation written once
  as a sans-I/O generator (requests out, replies in), run by an asyncio or a blocking
  driver.
- :class:`SupportsRenewMany` and :func:`check_renew_items`: renewing many leases in
  one round trip, which :func:`leasekit.hold` uses to coalesce renewals that fall due
  together (at most :data:`RENEW_BATCH_LIMIT` items per call).

- :class:`SupportsSlots`: counting leases (``Capabilities(slots=True)``), checked by
  the conformance suite's ``SlotChecks``.
- :class:`Group`, :func:`grouped` and :class:`GroupTransport`: calls of one kind that
  arrive while one is in flight wait and go out together, as one statement of the
  backend's, each caller keeping its own answer, error, deadline and arrival order per
  key (:func:`join_group`, :func:`send_waiting`, :func:`resume`, :func:`resume_with`
  for a backend that runs a free call itself).
- :func:`metadata_for`: checks an acquire's or transfer's ``metadata=`` before any
  I/O (size, type, and the ``Capabilities.metadata`` the provider declares).

See the guide "Writing a backend" in the documentation.
"""

from __future__ import annotations

from .._contract import metadata_for
from .._slots import check_exclusive, check_slot_acquire
from ._batch import RENEW_BATCH_LIMIT, RenewItem, SupportsRenewMany, check_renew_items
from ._deadlines import Deadlines, Overdue
from ._errors import ErrorMap, map_errors
from ._fair import FAIR_PLACE_TTL_MS, SupportsFairWaiting
from ._fork import ForkAware, Rebuild, keep_forever, on_fork_in_child
from ._gate import FifoGate
from ._group import (
    GROUP_IN_FLIGHT,
    MAX_GROUP,
    Group,
    GroupTransport,
    grouped,
    join_group,
    resume,
    resume_with,
    send_waiting,
)
from ._notify import (
    ReleaseHub,
    ReleaseWatch,
    SupportsReleaseNotifications,
    SupportsRemaining,
    stop_task,
)
from ._operation import Operation, drive, drive_async
from ._provider import BackendProvider, Grant, SlotGrant
from ._records import (
    LeaseRecord,
    SupportsFlush,
    SupportsInspect,
    SupportsMigrate,
    SupportsRecords,
    SupportsReleaseReport,
    SupportsSweep,
    supports,
)
from ._slots import SupportsSlots
from ._sync import (
    SupportsSyncProvider,
    SyncBackendProvider,
    SyncDeadlines,
    SyncProvider,
    sync_factory,
)
from ._undo import SupportsReleaseGrant, SupportsUndoGrant
from ._urls import (
    Endpoint,
    Option,
    OptionSet,
    ParsedOptions,
    ParsedURL,
    coerce_bool,
    parse_url,
    redact_url,
    timeout_option,
)

__all__ = [
    "FAIR_PLACE_TTL_MS",
    "GROUP_IN_FLIGHT",
    "MAX_GROUP",
    "RENEW_BATCH_LIMIT",
    "BackendProvider",
    "Deadlines",
    "Endpoint",
    "ErrorMap",
    "FifoGate",
    "ForkAware",
    "Grant",
    "Group",
    "GroupTransport",
    "LeaseRecord",
    "Operation",
    "Option",
    "OptionSet",
    "Overdue",
    "ParsedOptions",
    "ParsedURL",
    "Rebuild",
    "ReleaseHub",
    "ReleaseWatch",
    "RenewItem",
    "SlotGrant",
    "SupportsFairWaiting",
    "SupportsFlush",
    "SupportsInspect",
    "SupportsMigrate",
    "SupportsRecords",
    "SupportsReleaseGrant",
    "SupportsReleaseNotifications",
    "SupportsReleaseReport",
    "SupportsRemaining",
    "SupportsRenewMany",
    "SupportsSlots",
    "SupportsSweep",
    "SupportsSyncProvider",
    "SupportsUndoGrant",
    "SyncBackendProvider",
    "SyncDeadlines",
    "SyncProvider",
    "check_exclusive",
    "check_renew_items",
    "check_slot_acquire",
    "coerce_bool",
    "drive",
    "drive_async",
    "grouped",
    "join_group",
    "keep_forever",
    "map_errors",
    "metadata_for",
    "on_fork_in_child",
    "parse_url",
    "redact_url",
    "resume",
    "resume_with",
    "send_waiting",
    "stop_task",
    "supports",
    "sync_factory",
    "timeout_option",
]
