"""The etcd backend for leasekit: ``etcd://host:port[,host:port...]`` and ``etcds://``.

Each lease is a key bound to an etcd lease of its own; acquire, release and transfer
are single etcd transactions, and fencing tokens are etcd revisions. Several
endpoints fail over. ``EtcdLeaseProvider`` is the asyncio provider and
``EtcdSyncLeaseProvider`` the blocking one (``leasekit.sync.connect``). Install with
``pip install 'leasekit[etcd]'``; see ``docs/backends/etcd.md``.
"""

from leasekit.backend import LeaseRecord

from ._provider import EtcdLeaseProvider, EtcdSyncLeaseProvider

__all__ = ["EtcdLeaseProvider", "EtcdSyncLeaseProvider", "LeaseRecord"]
