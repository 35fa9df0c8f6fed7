"""The SQL the relay answers: what replica IO threads, HA managers, drivers and command-line clients send.

A binlog relay is not a database. It answers the statements its clients need in order to replicate
from it, watch it and manage its files (protocol-reference §3.5, §3.11, §4.4), from its own state:

- ``SELECT`` of literals, ``@@system`` and ``@user`` variables and a few functions (``IFNULL``,
  ``COALESCE``, ``UNIX_TIMESTAMP``, ``NOW``, ``VERSION``, ``BINLOG_GTID_POS``, ``GTID_SUBTRACT`` ...),
  with MySQL's column names (the expression text as typed, or the alias);
- ``SET @user = ...``, ``SET [SESSION] var = ...``, ``SET NAMES``, ``SET CHARACTER SET``;
- ``SHOW [GLOBAL|SESSION] VARIABLES / STATUS [LIKE | WHERE]``, ``SHOW MASTER STATUS`` /
  ``SHOW BINARY LOG STATUS``, ``SHOW BINARY LOGS``, ``SHOW SLAVE|REPLICA STATUS``,
  ``SHOW ALL SLAVES STATUS`` (MariaDB), ``SHOW SLAVE HOSTS`` / ``SHOW REPLICAS``, ``SHOW PROCESSLIST``,
  ``SHOW WARNINGS``, ``SHOW DATABASES``;
- ``PURGE BINARY LOGS TO 'file' | BEFORE <datetime>`` (refused while a replica still reads a file);
- ``BEGIN`` / ``COMMIT`` / ``ROLLBACK`` / ``DO`` (trivially true: the relay holds no transactions).

Everything the relay advertises comes from the durable horizon (design.md): positions, GTID sets and
file sizes never include a transaction that is not complete and fsynced. Every other statement gets
a clear ERR naming it (1235, or 1064 for malformed syntax), never an OK that did nothing.

Where things live: ``parser`` (tokenizer and expression parser), ``expressions`` / ``values`` /
``functions`` (evaluation), ``variables`` (``SYSTEM_VARIABLES``, ``STATUS_VARIABLES``: add an entry there to
answer a new one), ``select`` (SELECT, SET, DO, transactions), ``show`` (the status statements),
``admin`` (statements that change the relay), ``dispatch`` (add a statement's first word there), ``limits``
(the bounds every statement runs under: statement size, tokens, nesting, terms, select items, evaluation steps,
value sizes).
``execute`` is the coroutine the server awaits: it runs the statement in slices on the loop's thread
(``slicing``: the loop turns every few hundred units of work, whatever the statement); ``execute_sync`` is the
same in one piece, without the event loop.
Neither does network I/O. Disk work: ``PURGE`` unlinks files (on the caller's thread, the one that owns
the store); ``BINLOG_GTID_POS`` reads one relay file up to the position and the first ``gtid_purged``
scans closed files, both moved to a worker thread by ``execute``.
"""

from .dispatch import execute, execute_sync
from .errors import SqlError
from .parser import tokenize
from .variables import STATUS_VARIABLES, SYSTEM_VARIABLES, SysVar

__all__ = ["execute", "execute_sync", "SqlError", "SysVar", "SYSTEM_VARIABLES", "STATUS_VARIABLES", "tokenize"]
