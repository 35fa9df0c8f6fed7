"""Upstream session: connect to the master as a replica, stream its binlog into the store, reconnect forever.

The master connection and its queries live here (asyncio); every byte of the stream goes through
``RelayReceiver`` (sans-I/O). The session resumes from the store's horizon after any disconnect:
by file/position, by MySQL GTID auto-position, or by MariaDB GTID, never from the middle of a group.

The relay is repointed like a replica (STOP SLAVE; CHANGE MASTER TO ...; START SLAVE, through the SQL
layer's ``ReplicationControl``): the master in force is ``self.master`` (a CHANGE MASTER choice, kept in
``relayproxy.master.json``, overrides ``--master``), and the identity of the master the relay's files came
from (server_id, server_uuid) is recorded there too. A master that is another server than the recorded one
is followed only when a CHANGE MASTER chose its address, only by GTID, and only when it has every GTID the
relay holds; otherwise the relay refuses it with a clear ``Last_IO_Error`` and writes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..log import get_logger
from ..relay.master_info import (
    MasterChoiceError,
    MasterIdentity,
    MasterInfo,
    MasterInfoFile,
    apply_change,
    effective_master,
)
from ..relay.master_variables import MasterVariables, MasterVariablesFile, variables_for
from ..relay.errors import RelayStoreError, RelayStoreFailed
from ..relay.hoptimes import HopTimes
from ..relay.store import RelayStore
from ..relay.sync_driver import SyncDriver, horizon_covers
from ..wire.errors import ER_SLAVE_MUST_STOP, ER_WRONG_ARGUMENTS
from ..wire.packets import MySQLError
from ..wire.semisync import encode_semi_sync_ack
from .connection import UpstreamConnection
from .errors import UPSTREAM_ERROR_KINDS, CoordinatesRefused, MasterRefused, ReplicationAdminError, upstream_error_kind
from .new_master import missing_on_master, translate_coordinates
from .peer import check_peer, probe_peer
from .receiver import MasterStreamEnded, RelayReceiver, ResumeByPosition, StreamError
from .repoint import decide_switch
from .setup import (
    config_values,
    fetch_master_variables,
    peer_read_timeout,
    persistent_uuid,
    prepare,
    request_dump,
    setup_read_timeout,
)

log = get_logger("relayproxy.upstream")


@dataclass
class UpstreamStatus:
    """What the session knows of the master and of its own health (read by /status and SHOW ... STATUS)."""

    io_running: bool = False
    last_io_error: str | None = None
    last_io_error_time: float | None = None
    last_io_errno: int | None = None  # for SHOW SLAVE STATUS's Last_IO_Errno when the text carries no master code
    master_server_version: str | None = None
    master_server_id: int | None = None
    master_uuid: str | None = None
    master_flavour: str | None = None
    connects: int = 0
    connect_failures: int = 0  # connections or attempts that ended in an error (not the store's)
    store_failures: int = 0  # rounds that ended because the relay store could not write (full disk, EIO)
    semi_sync: bool = False
    semi_sync_acks: int = 0
    semi_sync_replica_waits: int = 0  # upstream ACKs that waited for downstream semi-sync replicas
    semi_sync_replica_timeouts: int = 0  # ... and gave up waiting (the master was ACKed anyway)
    errors: dict = field(default_factory=dict)  # upstream errors by kind (UPSTREAM_ERROR_KINDS)
    clock_diff: float = 0.0
    connected_since: float | None = None
    state: str = "starting"
    # The master's replication-relevant variables as it last said them (relay/master_variables.py), what they
    # came from and lack (``MasterVariables.describe()``), and why a persisted copy was ignored, if it was.
    master_variables: dict[str, str | None] | None = None
    master_variables_source: dict[str, object] | None = None
    master_variables_error: str | None = None
    last_switch: dict[str, object] | None = None  # the last switch of masters decided (upstream/repoint.py)
    peer_catch_up: dict[str, object] | None = None  # a catch-up from a peer relay in force (upstream/peer.py)


class UpstreamSession:
    """Runs the relay's IO thread: one connection at a time, resuming from the horizon."""

    def __init__(self, cfg, store, *, receiver: RelayReceiver | None = None, hop: HopTimes | None = None):
        self.cfg = cfg
        self.store = store
        self.receiver = receiver or RelayReceiver(store, verify_checksums=cfg.verify_checksums,
                                                  relay_server_id=int(cfg.server_id))
        self.status = UpstreamStatus()
        self._stopping = asyncio.Event()
        self._conn: UpstreamConnection | None = None
        self._resume_by_position = False  # next dump by file/position (see ResumeByPosition)
        # Optional gate before each upstream semi-sync ACK (gate_acks).
        self.ack_gate: Callable[[str, int], Awaitable[bool]] | None = None
        self._replica_uuid = persistent_uuid(Path(cfg.relay_dir))
        # The master in force (a CHANGE MASTER choice overrides --master) and the identity of the master the
        # relay's files came from.
        self.master_info_file = MasterInfoFile(Path(cfg.relay_dir))
        choice, self.identity = self.master_info_file.load()
        self.master, self.master_reason = effective_master(
            config_values(cfg), choice, config_sources=getattr(cfg, "sources", None))
        # The master's replication-relevant variables (relay/master_variables.py): fetched at every connect,
        # persisted, and loaded here so the SQL layer answers truthfully while the master is down.
        self.master_variables_file = MasterVariablesFile(Path(cfg.relay_dir))
        self.master_variables: MasterVariables | None = None
        self._pending_variables: MasterVariables | None = None  # a new master's, until its epoch is recorded
        persisted = self.master_variables_file.load()
        if self.master_variables_file.error is not None:
            self.status.master_variables_error = self.master_variables_file.error
        if persisted is not None:
            if self.identity is None or persisted.same_master(self.identity.server_id, self.identity.server_uuid):
                self._adopt_variables(persisted)
            else:
                log.warning("master variables file ignored: it describes another master than the relay's files",
                            file_server_id=persisted.server_id, recorded_server_id=self.identity.server_id)
        self.io_enabled = True  # False after STOP SLAVE, until START SLAVE
        self._wake = asyncio.Event()  # START SLAVE / stop(): end a reconnect wait at once
        self._idle = asyncio.Event()  # set while no connection is open or being opened
        self._idle.set()
        self._connected_identity: MasterIdentity | None = None
        self._round: asyncio.Future | None = None  # the current connect-and-stream round
        self._switch_to: MasterIdentity | None = None  # the new master, until its epoch is recorded
        self._peer: dict | None = None  # a peer relay the current round catches up from (upstream/peer.py)
        # A store failure (full disk, EIO) stays in last_io_error until the store writes again: a
        # reconnect alone does not clear it (the next write would fail the same way).
        self._store_failing = False
        # The fsync pipeline's loop half (relay/sync_driver.py): one sync in flight, run in the fsync thread.
        self.hop = hop or HopTimes()  # where each transaction's time goes (relay/hoptimes.py)
        self.sync_driver = SyncDriver(self._store_writes_again, self.hop, on_loop=getattr(cfg, "sync_on_loop", "auto"))

    # -- lifecycle -------------------------------------------------------------------------------
    def gate_acks(self, gate: Callable[[str, int], Awaitable[bool]] | None) -> None:
        """Wait on ``await gate(file, pos)`` before each upstream semi-sync ACK (e.g. for N semi-sync replicas of
        the relay to have the transaction; False: it gave up, ACK anyway). ``relayproxy run`` sets it once its
        replica side exists, after the session."""
        self.ack_gate = gate

    async def run(self) -> None:
        delay = self.cfg.reconnect_min_delay
        while not self._stopping.is_set():
            if not self.io_enabled:
                self.status.state = "stopped by STOP SLAVE"
                self._wake.clear()
                await self._wait_woken(None)
                delay = self.cfg.reconnect_min_delay  # START SLAVE connects at once, no backoff left over
                continue
            streamed = False
            self._idle.clear()
            round_task = self._round = asyncio.ensure_future(self._connect_and_stream())
            try:
                try:
                    await asyncio.wait({round_task})
                except asyncio.CancelledError:  # the session itself is cancelled: so is its round
                    round_task.cancel()
                    raise
                # STOP SLAVE cancels a round that is still connecting (see stop_replica).
                streamed = True if round_task.cancelled() else round_task.result()
            except asyncio.CancelledError:
                raise
            except ResumeByPosition as exc:
                log.info("resuming by file/position", reason=str(exc))
                self._resume_by_position = True
                streamed = True  # not a failure: reconnect at once
            except (OSError, ConnectionError, asyncio.TimeoutError, MySQLError, StreamError, RelayStoreError) as exc:
                if self._stopping.is_set():
                    break
                if not self.io_enabled and not isinstance(exc, RelayStoreError):
                    pass  # STOP SLAVE closed the connection: not an error
                else:
                    self._record_error(exc)
            except Exception as exc:  # a bug must not end replication silently: report and retry
                log.exception("upstream session failed unexpectedly")
                self._record_error(exc)
            finally:
                self._finish_connection()
                self._idle.set()
            if self._stopping.is_set() or not self.io_enabled:
                continue
            # MASTER_CONNECT_RETRY, when a CHANGE MASTER set it, caps the backoff as it spaces a replica's retries.
            cap = self.master.connect_retry or self.cfg.reconnect_max_delay
            delay = self.cfg.reconnect_min_delay if streamed else min(max(delay * 2, 0.05), cap)
            self.status.state = f"waiting {delay:.2f}s to reconnect"
            self._wake.clear()
            await self._wait_woken(delay)
        self.status.state = "stopped"
        self.sync_driver.close()  # idle: every round's fsync was waited for by the store

    async def _wait_woken(self, timeout: float | None) -> None:
        """Sleep until stop(), START SLAVE / STOP SLAVE, or the timeout."""
        waits = [asyncio.ensure_future(self._stopping.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    @property
    def replica_uuid(self) -> str:
        """The relay's own UUID (kept in the relay directory): its server_uuid toward replicas too."""
        return self._replica_uuid

    def stop(self) -> None:
        self._stopping.set()
        if self._conn is not None:
            self._conn.abort()

    # -- replication admin (STOP SLAVE, CHANGE MASTER TO, START SLAVE: downstream's ReplicationControl) ----------
    @property
    def master_address(self) -> tuple[str, int]:
        return self.master.host, self.master.port

    async def stop_replica(self, timeout: float = 30.0) -> bool:
        """STOP SLAVE: end the upstream connection at a transaction boundary (the partial transaction is dropped,
        the complete ones are durable); replicas keep being served. False when it was already stopped."""
        if not self.io_enabled:
            return False
        self.io_enabled = False
        self._wake.set()
        if self._conn is not None:
            self._conn.abort()  # streaming: the round ends at its next read, after any fsync in flight
        elif self._round is not None and not self._round.done():
            self._round.cancel()  # still connecting (a host that does not answer): nothing to keep
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        self.status.io_running = False
        self.status.state = "stopped by STOP SLAVE"
        log.info("replication stopped by STOP SLAVE", master=self.master.address,
                 horizon=str(self.store.horizon.snapshot().coordinates))
        return True

    def start_replica(self) -> bool:
        """START SLAVE: connect at once (no backoff left from an earlier master). False when already running."""
        if self.io_enabled:
            return False
        self.io_enabled = True
        self.status.last_io_error = None
        self.status.last_io_error_time = None
        self._wake.set()
        log.info("replication started by START SLAVE", master=self.master.address)
        return True

    def change_master(self, options: dict, *, flavour: str) -> MasterInfo:
        """CHANGE MASTER TO: validate, persist (atomically, fsynced), put in force at the next START SLAVE.

        Refused while replication runs (1198, as the servers do). Raises ReplicationAdminError; nothing is
        written then."""
        if self.io_enabled or not self._idle.is_set():
            raise ReplicationAdminError(ER_SLAVE_MUST_STOP, "HY000", "This operation cannot be performed with a "
                                        "running slave; run STOP SLAVE first")
        try:
            info = apply_change(self.master, options, flavour=flavour)
        except MasterChoiceError as exc:
            raise ReplicationAdminError(exc.code, exc.sqlstate, exc.message) from None
        coordinates = "log_file" in options or "log_pos" in options
        if coordinates and self.store.current_file is not None:
            at = self.store.upstream_position()  # in the master's own coordinates
            recorded = self.identity or self.master
            another = (info.host, info.port) != (recorded.host, recorded.port)
            if (options.get("log_file", at[0]), options.get("log_pos", at[1])) != tuple(at) and not another:
                # A relay's files are one continuous history: it resumes from its horizon, never from a position
                # a client names on the same master (that would leave a gap or repeat transactions in the files
                # replicas read). On another master the coordinates are translated into its GTIDs at connect.
                raise ReplicationAdminError(
                    ER_WRONG_ARGUMENTS, "HY000",
                    f"Incorrect arguments to MASTER_LOG_FILE/MASTER_LOG_POS: the relay continues from its horizon "
                    f"{at[0]}:{at[1]} on {recorded.host}:{recorded.port}; a file and position choose where an empty "
                    "relay starts, or where the relay joins another master (a new MASTER_HOST/MASTER_PORT)")
        elif self.store.current_file is not None and not self.master.unfollowed and info.log_file is not None:
            # Coordinates of an earlier CHANGE MASTER (or --start-file) that a stream has followed are spent: a
            # relay with files never resumes from them, and a later switch must not translate them.
            info = replace(info, log_file=None, log_pos=None)
        old = self.master
        self.master_info_file.save_choice(info)
        self.master = info
        self.master_reason = f"CHANGE MASTER to {info.address}"
        log.info("master changed by CHANGE MASTER", old_master=old.address, new_master=info.address,
                 gtid_mode=info.gtid_mode, user=info.user, log_file=info.log_file, log_pos=info.log_pos)
        return info

    def _switch_permitted(self, identity: MasterIdentity) -> bool:
        """A CHANGE MASTER chose this master's address since the relay last streamed: an address other than the
        recorded master's, or any address while no stream has followed that CHANGE MASTER yet (``unfollowed``,
        durable: the VIP case, the same address with another server behind it)."""
        recorded = self.identity
        return (self.master.source == "change_master" and recorded is not None
                and ((recorded.host, recorded.port) != (self.master.host, self.master.port)
                     or self.master.unfollowed)
                and (identity.host, identity.port) == (self.master.host, self.master.port))

    def _choice_followed(self) -> None:
        """A stream follows the CHANGE MASTER choice now: it no longer stands for 'whatever server answers'."""
        if self.master.unfollowed:
            self.master = replace(self.master, unfollowed=False)
            self.master_info_file.save_choice(self.master)

    def _record_error(self, exc: BaseException) -> None:
        store_cannot_write = False
        if isinstance(exc, MySQLError):
            text = f"error {exc.code} from master: {exc.message}"
        elif isinstance(exc, asyncio.TimeoutError) and self.status.state == "connecting":
            if self._peer is not None:
                waited = peer_read_timeout(self.master.heartbeat_period, self.cfg.connect_timeout)
                text = (f"peer relay {self.master.address} silent for more than {waited:g} s while the relay "
                        "compared its horizon file or waited for the stream to begin (a frozen relay or a lost "
                        "host): treated as gone")
            else:
                waited = setup_read_timeout(self.master.heartbeat_period, self.cfg.connect_timeout)
                text = (f"master {self.master.address} silent for more than {waited:g} s (or the connect timeout) "
                        "while the relay set up replication, before its stream began (a frozen server or a lost "
                        "host): treated as gone")
        elif isinstance(exc, asyncio.TimeoutError):
            text = (f"master {self.master.address} silent for more than two heartbeat periods (or connect timeout): "
                    "treated as gone")
        elif store_cannot_write := (
            isinstance(exc, (RelayStoreError, OSError)) and self.store.failure is not None
        ):
            failure = self.store.failure
            cause = failure if isinstance(exc, RelayStoreFailed) or exc is failure else exc
            text = (f"relay store in {self.store.relay_dir} cannot write: {cause}; not receiving until it can "
                    "(replicas are served up to the durable horizon; retrying)")
            self._store_failing = True
        else:
            text = str(exc) or exc.__class__.__name__
        self.status.last_io_error = text
        self.status.last_io_error_time = time.time()
        # ER_SLAVE_FATAL_ERROR for a master the relay refuses (as a replica stops on equal server UUIDs).
        self.status.last_io_errno = exc.code if isinstance(exc, (MySQLError, CoordinatesRefused)) else 1593 if (
            isinstance(exc, MasterRefused)) else None
        kind = upstream_error_kind(exc)
        self.status.errors[kind] = self.status.errors.get(kind, 0) + 1
        if store_cannot_write:
            self.status.store_failures += 1
            log.warning("relay store cannot write", error=text, kind=kind, relay_dir=str(self.store.relay_dir))
        else:
            self.status.connect_failures += 1
            log.warning("upstream connection ended", error=text, kind=kind, master=self.master.address)

    def _finish_connection(self) -> None:
        connected = self._conn is not None
        self.status.io_running = False
        self.status.connected_since = None
        if self._conn is not None:
            self._conn.abort()
            self._conn = None
        if not connected and self.store.failure is not None:
            return  # no stream this round: _connect_and_stream has just retried the reopen
        try:
            dropped = self.receiver.end_stream()
        except (RelayStoreError, OSError) as exc:
            # A write or fsync failed (full disk, I/O error): the store refuses further use. Reopen it:
            # recovery keeps every durable transaction and cuts the rest, which the master re-sends.
            self._reopen_store(exc)
            return
        if dropped:
            log.info("dropped the partial transaction of the lost connection", bytes=dropped)

    def _reopen_store(self, cause: BaseException) -> bool:
        """Replace a failed store by a recovered one; False (failed store kept) when that fails."""
        old = self.store
        try:
            old.close()
        except (RelayStoreError, OSError) as exc:
            # After a failed fsync close() cuts the unsynced tail; until that worked, reopening could
            # trust bytes that are not on disk. Keep the failed store and retry at the next round.
            self._record_error(exc)
            return False
        try:
            store = RelayStore.open(old.relay_dir, **old.open_options)
        except (RelayStoreError, OSError) as exc:
            # Keep the failed store: status still shows the durable horizon; retry at the next round.
            self._record_error(exc)
            return False
        log.warning("relay store reopened after a failure", cause=str(cause), recovery=str(store.recovery))
        self.store = store
        self.receiver.store = store
        self.receiver.parser.reset()
        # Dump senders wait on the old store's horizon: wake them so they follow the new one at once
        # (else they would notice only at their next heartbeat timeout).
        snap = old.horizon.snapshot()
        if snap.file is not None:
            old.horizon.advance(snap.file, snap.position, snap.gtids)
        return True

    # -- one connection --------------------------------------------------------------------------
    async def _connect_and_stream(self) -> bool:
        cfg = self.cfg
        if self.store.failure is not None and not self._reopen_store(self.store.failure):
            return False  # still cannot write (disk full?): back off without asking the master for anything
        self.status.state = "connecting"
        master = self.master
        host, port = master.host, master.port
        conn = await UpstreamConnection.connect(
            host,
            port,
            master.user,
            master.password,
            ssl_mode=master.ssl_mode,
            ssl_ca=master.ssl_ca,
            ssl_cert=master.ssl_cert,
            ssl_key=master.ssl_key,
            server_public_key=master.public_key_path,
            connect_timeout=cfg.connect_timeout,
            read_timeout=setup_read_timeout(master.heartbeat_period, cfg.connect_timeout),
        )
        self._conn = conn
        self.status.connects += 1
        self.status.master_server_version = conn.server_version
        self.status.master_flavour = "mariadb" if conn.is_mariadb else "mysql"
        checksum, semi_sync = await prepare(conn, self.status, server_id=cfg.server_id,
                                            heartbeat_period=master.heartbeat_period,
                                            replica_uuid=self._replica_uuid, semi_sync=cfg.semi_sync)
        conn.semi_sync = semi_sync
        switching = await self._check_master(conn)
        if self._peer is None:
            await self._fetch_master_variables(conn)  # a peer relay's are its master's: the relay keeps its own copy
        else:
            await conn.query("SET @relayproxy_peer = 1")  # the master's names and bytes, never past its epoch
        by_position, self._resume_by_position = self._resume_by_position, False
        by_position = await request_dump(conn, self.store, self.master, server_id=cfg.server_id,
                                         start_file=cfg.start_file, by_position=by_position, switching=switching)
        conn.read_timeout = None  # from here the stream's own silence limit applies (_stream)
        # A new upstream epoch begins at the stream's first ROTATE (its file is known only then): when
        # switching masters, and for an empty relay (its first epoch, with this master's identity).
        epoch_master = _identity_dict(self._connected_identity) if switching or not self.store.files() else None
        self.receiver.start_stream(announced_checksum=checksum, semi_sync=semi_sync, by_position=by_position,
                                   epoch_master=epoch_master, switching=switching)
        self.status.semi_sync = semi_sync
        self.status.state = "streaming"
        self.status.io_running = True
        self.status.connected_since = time.time()
        if not self._store_failing:
            self.status.last_io_error = None
            self.status.last_io_error_time = None
        horizon = self.store.horizon.snapshot()
        log.info("streaming from master", master=f"{host}:{port}", server_version=conn.server_version,
                 semi_sync=semi_sync, file=horizon.file, position=horizon.position)
        await self._stream(conn)
        return True

    async def _fetch_master_variables(self, conn: UpstreamConnection) -> None:
        """Ask the master for its replication-relevant variables (one statement; one by one when a flavour or
        version lacks some), persist them and answer from them. Only after ``_check_master`` accepted it."""
        identity = self._connected_identity
        ident = dict(server_id=identity.server_id, server_uuid=identity.server_uuid, host=identity.host,
                     port=identity.port, fetched_at=time.time()) if identity is not None else {}
        names = variables_for("mariadb" if conn.is_mariadb else "mysql")
        variables = await fetch_master_variables(conn.query, names, **ident)
        if self._switch_to is not None:
            # Switching masters: the relay's files are the old master's until the new epoch is recorded, and a
            # dump the new master refuses must leave the relay directory as it was (_switch_done adopts them).
            self._pending_variables = variables
            return
        self._save_variables(variables)

    def _save_variables(self, variables: MasterVariables) -> None:
        """Answer from ``variables``; write the file only when what it says changed (not at every reconnect)."""
        previous = self.master_variables
        self._adopt_variables(variables)
        if previous is not None and (previous.values, previous.absent, previous.server_id, previous.server_uuid,
                                     previous.host, previous.port) == (
                variables.values, variables.absent, variables.server_id, variables.server_uuid, variables.host,
                variables.port):
            return
        try:
            self.master_variables_file.save(variables)
        except OSError as exc:  # the answers stay right in memory; a restart while the master is down loses them
            log.warning("cannot persist the master's variables", file=str(self.master_variables_file.path),
                        error=str(exc))
        else:
            self.status.master_variables_error = None

    def _adopt_variables(self, variables: MasterVariables) -> None:
        self.master_variables = variables
        self.status.master_variables = dict(variables.values)
        self.status.master_variables_source = variables.describe()

    async def _check_master(self, conn: UpstreamConnection) -> bool:
        """Is this the master the relay's files came from? Returns True when the relay switches to it now.

        The same server (server_id, and server_uuid where the master has one): go on. Another server: only when
        a CHANGE MASTER chose its address, only by GTID, and only when it has every GTID the relay holds
        (else MasterRefused names what is missing: those transactions are lost on it). Nothing is written
        before these checks pass.
        """
        status = self.status
        identity = MasterIdentity(server_id=int(status.master_server_id), server_uuid=status.master_uuid,
                                  flavour=status.master_flavour, host=self.master.host, port=self.master.port)
        self._connected_identity = identity
        self._switch_to = None
        self._peer = None
        self.status.peer_catch_up = None
        recorded = self.identity
        store = self.store
        if recorded is None or store.current_file is None:
            self._record_identity(identity)
            return False
        same = recorded.server_id == identity.server_id and (
            recorded.server_uuid is None or identity.server_uuid is None or recorded.server_uuid == identity.server_uuid)
        if same:
            if self.master.unfollowed and self.master.gtid_mode == "off" and self.master.log_file is not None:
                at = self.store.upstream_position()  # in the master's own coordinates
                if (self.master.log_file, self.master.log_pos) != tuple(at):
                    raise MasterRefused(
                        f"the master at {self.master.address} is the server the relay's files came from "
                        f"(server_id {identity.server_id}); the relay continues from its horizon "
                        f"{at[0]}:{at[1]} there, not from MASTER_LOG_FILE/MASTER_LOG_POS {self.master.log_file}:"
                        f"{self.master.log_pos} (a gap or a repeat in the files replicas read). Nothing was written; "
                        "repoint with CHANGE MASTER TO without MASTER_LOG_FILE/MASTER_LOG_POS")
            self._choice_followed()  # the choice found the recorded master: it is followed now
            if (recorded.host, recorded.port) != (identity.host, identity.port):
                self._record_identity(identity)  # the same server at another address
            return False
        was = f"server_id {recorded.server_id}" + (f" ({recorded.server_uuid})" if recorded.server_uuid else "")
        now = f"server_id {identity.server_id}" + (f" ({identity.server_uuid})" if identity.server_uuid else "")
        if self.master.gtid_mode == "off":
            # Bounded waits until a peer's stream begins (_connect_and_stream resets it); a server answers 1193 at once.
            conn.read_timeout = peer_read_timeout(self.master.heartbeat_period, self.cfg.connect_timeout)
            peer = await probe_peer(conn)
            if peer is not None:
                self._peer = await check_peer(peer, identity, master=self.master, store=store,
                                              upstream_at=store.upstream_position, server_id=self.cfg.server_id,
                                              connect_timeout=self.cfg.connect_timeout)
                self.status.peer_catch_up = dict(self._peer)
                self._choice_followed()
                log.info("catching up from a peer relay", **self._peer)
                return False
            conn.read_timeout = setup_read_timeout(self.master.heartbeat_period, self.cfg.connect_timeout)
        if not self._switch_permitted(identity):
            raise MasterRefused(
                f"the master at {self.master.address} is {now}, but the relay's files came from {was} at "
                f"{recorded.host}:{recorded.port}; a resume on another server by file/position would relay a "
                "different history. To switch masters, repoint the relay with STOP SLAVE; CHANGE MASTER TO ...; "
                "START SLAVE (by GTID)")
        horizon = store.horizon.snapshot()
        by_coordinates = self.master.gtid_mode == "off" and self.master.log_file is not None
        if (self.master.gtid_mode == "off" and not by_coordinates) or not horizon.gtids:
            raise MasterRefused(
                f"switching from {was} to {now} at {self.master.address} needs GTIDs: the relay continues by its "
                "GTID set on a new master (CHANGE MASTER TO ... MASTER_USE_GTID=slave_pos or MASTER_AUTO_POSITION=1, "
                "or MASTER_LOG_FILE/MASTER_LOG_POS of the new master, which the relay translates into its GTIDs), "
                "never by a file/position on another server")
        coordinates = translated = None
        if by_coordinates:
            coordinates = (self.master.log_file, self.master.log_pos or 4)
            translated = await translate_coordinates(conn, *coordinates, self.master.address)
        missing = await missing_on_master(conn, horizon.gtids)
        decision = decide_switch(master=self.master.address, server_id=identity.server_id, relay=horizon.gtids,
                                 missing=missing, coordinates=coordinates, translated=translated, at=time.time())
        self.status.last_switch = decision.describe()
        log.info("switch decision", old_master=f"{recorded.host}:{recorded.port}", **decision.describe())
        if missing:
            raise MasterRefused(
                f"the new master {self.master.address} ({now}) lacks GTIDs the relay holds: {missing} (those "
                "transactions are lost on it: it was behind the old master). Nothing was written; replicas are "
                "served what is durable. Choose another master, or accept the loss by re-seeding the relay")
        log.info("switching masters", old_master=f"{recorded.host}:{recorded.port}", old_server_id=recorded.server_id,
                 new_master=self.master.address, new_server_id=identity.server_id, joined_at=horizon.text,
                 relay_file=horizon.file, relay_position=horizon.position,
                 coordinates=None if coordinates is None else f"{coordinates[0]}:{coordinates[1]}",
                 coordinates_gtids=decision.translated)
        # The identity is recorded once the new epoch is (relay/epochs.py: its record is the commit point of
        # the switch); a crash before that switches again at the next start.
        self._switch_to = identity
        return True

    def _switch_done(self) -> None:
        """After a batch: once the store has begun the new master's epoch, record that master's identity."""
        identity = self._switch_to
        if identity is None:
            return
        epochs = self.store.epochs
        if epochs.current.same_master(_identity_dict(identity)):
            self._switch_to = None
            self._record_identity(identity)
            pending, self._pending_variables = self._pending_variables, None
            if pending is not None:
                self._save_variables(pending)
            log.info("switched masters", master=self.master.address, server_id=identity.server_id,
                     first_relay_file=epochs.current.first_file, upstream_file=epochs.current.upstream_first_file)

    def _record_identity(self, identity: MasterIdentity) -> None:
        self.master_info_file.save_identity(identity)
        self.identity = identity
        self._choice_followed()

    async def _stream(self, conn: UpstreamConnection) -> None:
        """Read, parse and write batches while the previous batch's fsync runs in the fsync thread.

        It takes what the connection holds, and waits only when nothing is there: until a batch arrives
        or the fsync in flight ends (to publish the horizon and ACK at once, and start the next fsync),
        and otherwise until the batch-mode sync deadline or the silence limit."""
        receiver = self.receiver
        heartbeat = self.master.heartbeat_period
        silence_limit = 2 * heartbeat + 1.0 if heartbeat else None
        last_data = time.monotonic()
        try:
            while not self._stopping.is_set() and self.io_enabled:
                payloads = conn.take_packets()  # what arrived meanwhile (a broken stream raises here)
                if not payloads:
                    flight = self.sync_driver.waiter
                    if flight is None or not flight.done():
                        now = time.monotonic()
                        wait = None if silence_limit is None else max(silence_limit - (now - last_data), 0.0)
                        if flight is None:
                            deadline = self.store.sync_deadline
                            if deadline is not None:
                                until_sync = max(deadline - now, 0.0)
                                wait = until_sync if wait is None else min(wait, until_sync)
                        await conn.wait_for_packets(flight, wait)
                        payloads = conn.take_packets()
                if payloads:
                    last_data = began = time.monotonic()
                    before = receiver.counters.transactions
                    try:
                        receiver.feed(payloads)
                    finally:
                        done = receiver.counters.transactions - before
                        self.hop.batch(conn.batch_arrived or began, began, time.monotonic(), done)
                        # Whatever completed before an error in the batch is still made durable.
                        await self._sync_and_ack(conn)
                        self._switch_done()
                elif silence_limit is not None and time.monotonic() - last_data >= silence_limit:
                    raise asyncio.TimeoutError()
                else:
                    await self._sync_and_ack(conn)
        except asyncio.CancelledError:
            raise  # the fsync in flight is left to the store: discard_incomplete and close wait for it
        except BaseException:
            await self.sync_driver.drain(self.store)  # the complete transactions received before the error are durable
            raise
        else:
            await self.sync_driver.drain(self.store)  # a stop: the complete transactions received are durable
        finally:
            self.sync_driver.forget()

    def _store_writes_again(self) -> None:
        """A sync moved the horizon: a store failure shown in last_io_error is over."""
        if self._store_failing:
            self._store_failing = False
            self.status.last_io_error = None
            self.status.last_io_error_time = None
            log.info("relay store writes again: receiving resumed",
                     horizon=str(self.store.horizon.snapshot().coordinates))

    async def _sync_and_ack(self, conn: UpstreamConnection) -> None:
        """Publish the fsync in flight once it has ended, start the next one when the policy asks for it
        (it runs in the fsync thread while the loop goes on reading, parsing and writing), and ACK what
        is durable. At most one fsync is in flight: a batch that arrives meanwhile waits for the next."""
        store = self.store
        self.sync_driver.step(store)
        pending = self.receiver.ack_pending
        if pending is None:
            return
        if horizon_covers(store, *pending):
            self.receiver.ack_pending = None
            if self.ack_gate is not None:
                self.status.semi_sync_replica_waits += 1
                if not await self.ack_gate(pending[0], pending[1]):
                    self.status.semi_sync_replica_timeouts += 1
                    log.warning("semi-sync replicas of the relay did not acknowledge in time; ACKing the master",
                                file=pending[0], position=pending[1])
            # Semi-sync ACK only once the acknowledged transaction is durable in the relay.
            conn.write_packet(encode_semi_sync_ack(pending[0], pending[1]), 0)
            self.status.semi_sync_acks += 1
            self.hop.acked(store.horizon.snapshot().at, time.monotonic())


def _identity_dict(identity: MasterIdentity) -> dict:
    return {key: getattr(identity, key) for key in ("host", "port", "server_id", "server_uuid")}


__all__ = ["UpstreamSession", "UpstreamStatus", "MasterStreamEnded", "MasterRefused", "CoordinatesRefused",
           "ReplicationAdminError", "UPSTREAM_ERROR_KINDS", "upstream_error_kind"]
