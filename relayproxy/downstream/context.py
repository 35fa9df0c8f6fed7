"""What the downstream side shares: the relay's state, per-connection state, and the seams between
the server (wire), the SQL layer and the dump sender.

- ``downstream/server.py`` owns connections: handshake, auth, TLS, the command loop. It awaits
  ``sql.execute(ctx, conn, sql) -> Response`` (a coroutine) for COM_QUERY and ``dump.serve_dump(ctx, conn, request,
  channel)`` for COM_BINLOG_DUMP / COM_BINLOG_DUMP_GTID.
- ``downstream/sql.py`` answers the statements replicas, tools and HA managers send, from ``ctx``.
- ``downstream/dump.py`` streams relay files to a replica, never past the horizon.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from .semisync import SemiSyncTracker

# ---------------------------------------------------------------------------------------------
# Per-connection state.


@dataclass
class ReplicaRegistration:
    """What COM_REGISTER_SLAVE told us (SHOW SLAVE HOSTS / SHOW REPLICAS)."""

    server_id: int
    host: str = ""
    port: int = 0
    user: str = ""
    rank: int = 0
    master_id: int = 0


@dataclass
class DumpProgress:
    """Where a dump connection is, for status, metrics and retention (never purge what a reader reads)."""

    file: str | None = None
    position: int = 0
    started: float = field(default_factory=time.time)
    events_sent: int = 0
    bytes_sent: int = 0
    semi_sync: bool = False
    last_ack: tuple[str, int] | None = None
    mode: str = "file"  # file | mysql-gtid | mariadb-gtid
    caught_up_at: float | None = None  # time.time() the sender last had sent everything durable (replica lag)


@dataclass
class ConnectionState:
    """One client connection. User variables are what replicas SET before dumping."""

    conn_id: int
    user: str = ""
    host: str = ""
    tls: bool = False
    database: str | None = None
    capabilities: int = 0
    user_vars: dict[str, Any] = field(default_factory=dict)  # lower-case names without '@'
    session_vars: dict[str, Any] = field(default_factory=dict)  # SET SESSION / SET NAMES ...
    registration: ReplicaRegistration | None = None
    dump: DumpProgress | None = None
    connected_at: float = field(default_factory=time.time)
    account: Any = None  # the wire.accounts.DownstreamUser it logged in as (privileges.py checks its privileges)


@dataclass(frozen=True)
class DumpRequest:
    """A decoded COM_BINLOG_DUMP (kind "file", or "mariadb-gtid" when @slave_connect_state is set)
    or COM_BINLOG_DUMP_GTID (kind "mysql-gtid", ``gtid_set`` = the encoded set as sent)."""

    kind: str
    server_id: int
    flags: int
    file: str
    position: int
    gtid_set: bytes = b""


class DumpChannel(Protocol):
    """How the dump sender talks to its replica (implemented by the server).

    ``semi_sync`` (set by the sender of a semi-sync dump): a payload that asks for an ACK (0x00 0xEF 0x01) restarts
    the packet numbering. Only then: a plain event payload may start with the same bytes (0x00, then an event
    timestamp whose low bytes are 0x01EF)."""

    semi_sync: bool

    async def send(self, payload: bytes) -> None:
        """Send one packet payload (0x00 + event, or EOF/ERR), split at 16 MB, with the right sequence ids."""

    async def receive(self, timeout: float | None = None) -> bytes | None:
        """The next packet from the replica during the dump (semi-sync ACKs), None on timeout."""

    @property
    def closed(self) -> bool: ...


class ReplicationControl(Protocol):
    """The relay's upstream as the replication admin statements drive it (the upstream session implements it;
    ``commands/run.py`` binds it: this layer does not import the upstream one)."""

    async def stop_replica(self) -> bool:
        """STOP SLAVE: stop at a transaction boundary; False when already stopped."""

    def start_replica(self) -> bool:
        """START SLAVE: connect at once; False when already running."""

    def change_master(self, options: dict, *, flavour: str) -> Any:
        """CHANGE MASTER TO (canonical option keys): validate and persist; raises with code/sqlstate/message."""


# ---------------------------------------------------------------------------------------------
# Relay-wide state for the downstream side.


class DownstreamContext:
    """The relay as the downstream side sees it. ``store`` follows the session (it can be reopened)."""

    def __init__(self, cfg, session, *, server_uuid: str, status_document: Callable[[], dict[str, Any]],
                 replication: ReplicationControl | None = None, started: float | None = None):
        self.cfg = cfg
        self.session = session
        self.replication = replication  # None for `relayproxy serve`: no master to repoint
        # The relay's status document (ops/status.py's relay_status, bound by the command that wires the
        # relay): SHOW SLAVE STATUS reports the upstream IO thread, which this layer does not import.
        self.status_document = status_document
        self.server_uuid = server_uuid
        self.started = started or time.time()
        self.connections: dict[int, ConnectionState] = {}
        self.semi_sync_waiters: list[asyncio.Future] = []
        self._catalog = None
        self._catalog_store = None
        self.semi_sync = SemiSyncTracker()  # ACKs of semi-sync replicas of the relay
        # Bound by the server (downstream/server.py) for KILL and FLUSH HOSTS: end one connection by id (False:
        # unknown), and forget every host's failed-login count (returns how many hosts were blocked).
        self.kill_connection: Callable[[int], bool] | None = None
        self.flush_hosts: Callable[[], int] | None = None

    @property
    def store(self):
        return self.session.store

    @property
    def catalog(self):
        """One FileCatalog shared by the SQL layer and the dump senders; follows a reopened store."""
        from ..relay.catalog import FileCatalog

        store = self.session.store
        if self._catalog is None or self._catalog_store is not store:
            self._catalog = FileCatalog(store)
            self._catalog_store = store
        return self._catalog

    @property
    def horizon(self):
        return self.session.store.horizon

    @property
    def server_id(self) -> int:
        return self.cfg.server_id

    @property
    def flavour(self) -> str:
        """mysql or mariadb: what the relay looks like to replicas (the upstream master's flavour; before the relay
        has a file or has reached its master, the flavour its GTID mode names, else mysql)."""
        found = self.store.flavour or self.session.status.master_flavour
        if found:
            return found
        configured = getattr(self.cfg, "gtid_mode", None)
        return configured if configured in ("mysql", "mariadb") else "mysql"

    @property
    def server_version(self) -> str:
        """The version string replicas see: the master's, marked as a relay."""
        upstream = self.session.status.master_server_version
        if upstream:
            base = upstream.split("-log")[0]
            return f"{base}-relayproxy-log" if "MariaDB" not in base else upstream
        fde = self.store.latest_format_description
        if fde is not None:
            return fde.server_version
        return "8.0.36-relayproxy-log" if self.flavour == "mysql" else "10.11.6-MariaDB-relayproxy-log"

    def replicas(self) -> list[ConnectionState]:
        return [c for c in self.connections.values() if c.registration is not None or c.dump is not None]
