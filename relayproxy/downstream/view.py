"""RelayView: the relay as the replica side reads it (files, horizon, identity, what it knows of its master, the
settings it answers by), the one seam between the dump sender / SQL layer and whatever runs the relay.

Two implementations: ``commands/run.py``'s ``SessionRelayView`` (over the upstream session for ``relayproxy run``,
over ``NoUpstream`` for ``relayproxy serve``), and ``downstream/workers.py``'s ``FollowerView`` in a sender process
(what the relay process pushed to it). This layer imports neither the upstream session nor the configuration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..relay.catalog import FileCatalog
    from ..relay.horizon import Horizon
    from ..relay.reader import StoreReader


@dataclass(frozen=True)
class MasterFacts:
    """What the relay knows of its upstream master now (all unknown before it has talked to one)."""

    master_uuid: str | None = None
    master_server_id: int | None = None
    io_running: bool = False
    heartbeats: int = 0  # heartbeats received from the master since start
    # The master's variables as the upstream session fetched (and persisted) them, and the names the master said
    # it lacks (ER_UNKNOWN_SYSTEM_VARIABLE): relay/master_variables.py.
    variables: Mapping[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ReplicaSettings:
    """The configuration the replica side answers by (``commands/config.py`` names; None: not configured)."""

    users: Sequence[Any] = ()  # wire.accounts.DownstreamUser, for privileges and SHOW GRANTS
    semi_sync: bool = False
    gtid_mode: str | None = None
    listen: tuple[str, int] | None = None
    relay_dir: str | None = None
    max_statement_bytes: int | None = None
    show_binlog_events_max_rows: int | None = None
    # The configured master, for SHOW SLAVE STATUS when the status document does not name one in force.
    master: Any = None
    user: str | None = None
    ssl_mode: str | None = None
    ssl_ca: str | None = None
    ssl_cert: str | None = None
    ssl_key: str | None = None
    reconnect_max_delay: float | None = None
    heartbeat_period: float | None = None

    @classmethod
    def from_config(cls, cfg: Any) -> ReplicaSettings:
        """From a configuration object with these attributes (missing ones are not configured)."""
        values: dict[str, Any] = {name: getattr(cfg, name, None) for name in cls.__dataclass_fields__}
        values["users"] = values["users"] or ()
        values["semi_sync"] = bool(values["semi_sync"])
        return cls(**values)


class RelayView(Protocol):
    """The relay as the replica side reads it. Every member is read at the time of asking: the store can be
    reopened, the master can change; callers that need one consistent answer keep what they read."""

    @property
    def store(self) -> StoreReader:
        """The relay's files as readers see them (relay/reader.py; PURGE goes through it too)."""

    @property
    def horizon(self) -> Horizon:
        """The durable horizon: nothing past it is sent or reported."""

    @property
    def catalog(self) -> FileCatalog:
        """One FileCatalog of the current store, shared by the SQL layer and the dump senders (thread-safe to get:
        the dump start reads it in a worker thread)."""

    @property
    def flavour(self) -> str:
        """mysql or mariadb: what the relay looks like to replicas."""

    @property
    def server_version(self) -> str:
        """The version string replicas see."""

    @property
    def server_id(self) -> int:
        """The relay's own server id (the events it writes itself carry it)."""

    @property
    def server_uuid(self) -> str:
        """The relay's own @@server_uuid."""

    @property
    def master(self) -> MasterFacts:
        """What the relay knows of its master now."""

    @property
    def settings(self) -> ReplicaSettings:
        """The configuration the replica side answers by."""
