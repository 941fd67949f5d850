"""A tooz driver on leasekit: ``tooz.coordination.get_coordinator("leasekit+redis://...")``.

tooz finds :class:`LeasekitDriver` through its ``tooz.backends`` entry points, one per
leasekit scheme: ``leasekit+redis://``, ``leasekit+rediss://``, ``leasekit+sqlite:///``,
``leasekit+postgresql://``, ``leasekit+etcd://``, ``leasekit+mysql://`` (and the
aliases ``postgres``, ``etcds``, ``mariadb``). Locks, groups, capabilities and leader
election are leases on the backend, with its server clock and its release
notifications. Needs ``pip install 'leasekit[tooz]'`` and the backend's extra; see the
documentation page "tooz driver".
"""

from __future__ import annotations

from ._driver import LeasekitDriver
from ._lock import LeasekitLock

__all__ = ["LeasekitDriver", "LeasekitLock"]
