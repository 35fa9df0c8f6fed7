"""What one statement sees: the downstream context, the connection, and one snapshot of the horizon, so every
value in one answer agrees."""

from __future__ import annotations

import functools
import time
from typing import Any

from ...binlog.events import split_version
from ...binlog.gtid import GtidSet, MariaBinlogState
from ...relay.catalog import FileCatalog
from .. import privileges
from ..context import ConnectionState
from ..view import MasterFacts
from .errors import SqlError
from .limits import MAX_STEPS, Budget, max_statement_bytes

# ---------------------------------------------------------------------------------------------
# Per-statement view of the relay: one horizon snapshot, so every value in one answer agrees.


class Env:
    """What one statement sees: the context, the connection, and one snapshot of the horizon."""

    def __init__(self, ctx, conn: ConnectionState, prefetched: dict[tuple[str, int], Any] | None = None):
        self.ctx = ctx
        self.conn = conn
        self.now = time.time()
        # BINLOG_GTID_POS scans done off the event loop before the statement ran: (path, pos) -> result.
        self.prefetched = prefetched or {}

    def require(self, action: privileges.Action) -> None:
        """Raise the servers' ERR 1227 unless the connection's account has the privilege `action` needs."""
        denied = privileges.denial(self.ctx, self.conn, action, self.flavour)
        if denied is not None:
            raise SqlError(*denied)

    @functools.cached_property
    def budget(self) -> Budget:
        """The statement's evaluation steps (limits.MAX_STEPS)."""
        return Budget(MAX_STEPS, self.flavour)

    @functools.cached_property
    def max_value_bytes(self) -> int:
        """The largest string a statement may build, and all of a connection's user variables together."""
        return max_statement_bytes(self.ctx)

    @functools.cached_property
    def snapshot(self):
        return self.ctx.horizon.snapshot()

    @functools.cached_property
    def flavour(self) -> str:
        return self.ctx.flavour

    @property
    def mysql(self) -> bool:
        return self.flavour != "mariadb"

    @functools.cached_property
    def version(self) -> str:
        """The version string clients see in @@version (MariaDB's "5.5.5-" handshake prefix removed)."""
        version = self.ctx.server_version
        return version[6:] if version.startswith("5.5.5-") else version

    @functools.cached_property
    def version_tuple(self) -> tuple[int, int, int]:
        return split_version(self.version)

    def at_least(self, *version: int) -> bool:
        return self.version_tuple >= version

    @functools.cached_property
    def catalog(self) -> FileCatalog:
        """The relay's shared FileCatalog (``ctx.catalog``: one per store, kept between statements, so closed
        files are scanned and headers read once)."""
        return self.ctx.catalog

    @functools.cached_property
    def master(self) -> MasterFacts:
        """What the relay knows of its master, read once for the statement."""
        return self.ctx.relay.master

    def master_var(self, name: str) -> Any:
        """A variable of the upstream master, when the relay knows it (``RelayView.master.variables``).

        Some answers (binlog_format, binlog_row_image, gtid_mode ...) describe the stream, whose truth
        is on the master; the upstream session fetches them at every connect and persists them
        (relay/master_variables.py). None when the relay does not know.
        """
        return self.master.variables.get(name)

    def master_lacks(self, name: str) -> bool:
        """The master said it has no such variable (ER_UNKNOWN_SYSTEM_VARIABLE when the session asked)."""
        return name in self.master.absent

    @property
    def mysql_gtids(self) -> GtidSet | None:
        gtids = self.snapshot.gtids
        return gtids if isinstance(gtids, GtidSet) else None

    @property
    def maria_state(self) -> MariaBinlogState:
        gtids = self.snapshot.gtids
        return gtids if isinstance(gtids, MariaBinlogState) else MariaBinlogState()
