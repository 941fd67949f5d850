"""The MySQL and MariaDB backend for leasekit: ``mysql://`` and ``mariadb://``.

Every write is one conditional statement on an autocommit connection, decided under the
key's row lock on the server's clock (``SYSDATE(6)``); fencing tokens from a sequence
(MariaDB) or the server's clock (MySQL). Async on asyncmy, blocking
(``leasekit.sync``) on PyMySQL, both running the same operations. Install with
``pip install 'leasekit[mysql]'``; see ``docs/backends/mysql.md``.
"""

from leasekit.backend import LeaseRecord

from ._provider import MySQLClient, MySQLLeaseProvider, MySQLSyncLeaseProvider

__all__ = ["LeaseRecord", "MySQLClient", "MySQLLeaseProvider", "MySQLSyncLeaseProvider"]
