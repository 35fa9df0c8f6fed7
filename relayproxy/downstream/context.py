"""What the downstream side shares: the relay's state, per-connection state, and the seams between
the server (wire), the SQL layer and the dump sender.

- ``downstream/session.py`` owns a connection: handshake, auth, TLS, the command loop. It awaits
  ``sql.execute(ctx, conn, sql) -> Response`` (a coroutine) for COM_QUERY and ``dump.serve_dump(ctx, conn, request,
  channel)`` for COM_BINLOG_DUMP / COM_BINLOG_DUMP_GTID.
- ``downstream/sql/`` answers the statements replicas, tools and HA managers send, from ``ctx`` (``dispatch.py``
  parses and routes; ``show.py``, ``variables.py``, ``env.py`` ... answer).
- ``downstream/dump/`` streams relay files to a replica, never past the horizon (``sender.py`` per dump,
  ``followers.py`` the shared pass at the horizon, ``chunks.py`` the shared reads).
- ``downstream/view.py``'s ``RelayView`` is all they see of the relay (``ctx.relay``): never the upstream session
  or the configuration.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..relay.replay_stops import ReplayStops
from .semisync import SemiSyncTracker
from .view import RelayView, ReplicaSettings

if TYPE_CHECKING:
    from ..relay.catalog import FileCatalog
    from ..relay.hoptimes import HopTimes
    from ..relay.horizon import Horizon
    from ..relay.reader import StoreReader

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


class SenderProcesses(Protocol):
    """The sender processes as the server hands dumps to them (``downstream/workers.py``'s SenderPool implements
    it; the server does not import the workers, which run the server's connection classes)."""

    def pick(self) -> Any:
        """A live worker for one more dump (the server logs its ``slot`` and ``process.pid``), None when none is."""

    async def hand_off(self, worker: Any, ticket: dict[str, Any], fd: int, progress: DumpProgress) -> None:
        """Give the replica's socket ``fd`` (closed here) to ``worker`` and wait until its dump ends there."""

    def stop_dumps(self) -> None:
        """A graceful stop: each worker's dumps end at their next transaction boundary (``DownstreamContext``'s)."""


# ---------------------------------------------------------------------------------------------
# Relay-wide state for the downstream side.


class StoppableDump(Protocol):
    """What ``DownstreamContext.stop_dumps`` needs of a running dump (dump/sender.py's DumpSender)."""

    def wake(self) -> None: ...


class DownstreamContext:
    """The downstream side's shared state: the relay as it reads it (``relay``, a RelayView), the connections, the
    semi-sync tracker and the seams the wiring command binds. ``store``, ``horizon``, ``catalog`` and the identity
    are the view's, read at the time of asking (the store can be reopened)."""

    def __init__(self, relay: RelayView, *, status_document: Callable[[], dict[str, Any]],
                 replication: ReplicationControl | None = None, started: float | None = None,
                 replay_stops: ReplayStops | None = None, hop: HopTimes | None = None):
        self.relay = relay
        # Per replica server id, a relay position its dump never sends past (relay/replay_stops.py: pitr's targets).
        self.replay_stops = replay_stops if replay_stops is not None else ReplayStops(None)
        self.replication = replication  # None for `relayproxy serve`: no master to repoint
        # The relay's status document (ops/status.py's relay_status, bound by the command that wires the
        # relay): SHOW SLAVE STATUS reports the upstream IO thread, which this layer does not import.
        self.status_document = status_document
        self.started = started or time.time()
        self.connections: dict[int, ConnectionState] = {}
        self.semi_sync_waiters: list[asyncio.Future] = []
        self.semi_sync = SemiSyncTracker()  # ACKs of semi-sync replicas of the relay
        # Bound by the server (downstream/server.py) for KILL and FLUSH HOSTS: end one connection by id (False:
        # unknown), and forget every host's failed-login count (returns how many hosts were blocked).
        self.kill_connection: Callable[[int], bool] | None = None
        self.flush_hosts: Callable[[], int] | None = None
        # The hop's stage histograms (relay/hoptimes.py) from ``relayproxy run``: the dumps of this process report
        # their send stage there (None: not measured, e.g. in a sender process or under ``serve``).
        self.hop = hop
        # The dumps running in this process, and whether they are asked to end (``stop_dumps``: a graceful stop).
        self.dumps: set[StoppableDump] = set()
        self.dumps_stopping = False

    def stop_dumps(self) -> None:
        """A graceful stop: every dump ends at the next transaction boundary it reaches (at once when it waits at
        the horizon), so no replica is left holding part of a transaction the relay chose to cut. A MariaDB
        replica by file/position cannot even resume inside a statement by itself after a reconnect
        (tests/scenarios/test_scenario_file_position_mid_statement.py)."""
        self.dumps_stopping = True
        for dump in list(self.dumps):
            dump.wake()

    @property
    def store(self) -> StoreReader:
        return self.relay.store

    @property
    def catalog(self) -> FileCatalog:
        return self.relay.catalog

    @property
    def horizon(self) -> Horizon:
        return self.relay.horizon

    @property
    def server_id(self) -> int:
        return self.relay.server_id

    @property
    def server_uuid(self) -> str:
        return self.relay.server_uuid

    @property
    def flavour(self) -> str:
        return self.relay.flavour

    @property
    def server_version(self) -> str:
        return self.relay.server_version

    @property
    def settings(self) -> ReplicaSettings:
        return self.relay.settings

    def replicas(self) -> list[ConnectionState]:
        return [c for c in self.connections.values() if c.registration is not None or c.dump is not None]
