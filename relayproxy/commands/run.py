"""`relayproxy run`: replicate from a master into durable relay files and report status over HTTP."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import signal
import sys
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from ..downstream.view import MasterFacts, ReplicaSettings
from ..log import get_logger
from ..ops.status import NoUpstream, StatusSources, UpstreamSources
from . import config

if TYPE_CHECKING:
    from ..downstream.context import ReplicationControl
    from ..downstream.semisync import SemiSyncTracker
    from ..downstream.server import DownstreamServer
    from ..downstream.workers import SenderPool
    from ..ops.metrics import FsyncStats
    from ..relay.archive import ArchiveUploader
    from ..relay.hoptimes import HopTimes
    from ..relay.conversion import StorageTask
    from ..relay.reader import StoreReader
    from ..relay.retention import RetentionTask
    from ..upstream.session import UpstreamSession, UpstreamStatus

log = get_logger("relayproxy.run")  # the logger name operators match on (docs/metrics.md)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config.load(args)
        cfg.require("master", "user", "server_id", "relay_dir")
        cfg.resolved_password()
    except config.ConfigError as exc:
        print(f"relayproxy run: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:  # uvloop is a dependency; this keeps a broken install usable
        runner = asyncio.run
    else:
        runner = uvloop.run if hasattr(uvloop, "run") else asyncio.run
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        return runner(serve(cfg))
    except RelayStartupError as exc:
        print(f"relayproxy run: {exc}", file=sys.stderr)
        return 1


# How long the event loop may wait for the GIL while a background thread (the transaction indexer parsing what
# became durable, the archive, the retention) holds it: CPython's default is 5 ms, and a transaction's path through
# the relay takes the GIL several times (the loop, the fsync thread, the loop again). With the indexer's bursts every
# 0.5 s, the default added about 10 ms to the hop's p99 at 1,000 trx/s (benchmarks/hop_latency.py, measured
# 9.9-11.5 ms at 5 ms against 2.8-5.4 ms at 0.5 ms on one 2-core machine); a shorter interval costs only switches
# between threads that are both runnable.
SWITCH_INTERVAL = 0.0005


def settle_gc() -> None:
    """Start-up is over (a relay process, not one run inside a test's process): what exists now (modules, classes,
    functions, the options, the store's catalog) lives as long as the process. ``gc.freeze()`` takes it out of the
    cyclic collector's scans, so that a full collection (which stops the event loop: 45-91 ms were measured at
    1,000 trx/s, each one a lag spike for every replica) walks only what the relay made since."""
    import gc

    gc.collect()
    gc.freeze()


class RelayStartupError(Exception):
    """The relay cannot start (unreadable relay directory, corrupt durable data, port in use)."""


LOCK_NAME = "relayproxy.lock"  # the relay's own files start with "relayproxy.": recovery never takes it for a binlog


class DirectoryLocked(RuntimeError):
    """Another process holds the relay directory's lock (``holder``: the pid it wrote, or "unknown")."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def hold_relay_dir(relay_dir) -> int:
    """Take the relay directory's exclusive lock for the life of the process (its fd); DirectoryLocked when another
    process holds it, OSError when the lock file cannot be opened. The lock is an flock on ``relayproxy.lock``; the
    kernel drops it when the process dies, however it dies, so a crash never leaves a stale lock behind."""
    from pathlib import Path

    path = Path(relay_dir) / LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DirectoryLocked(holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def lock_relay_dir(relay_dir) -> int:
    """Hold an exclusive lock on the relay directory for the life of the process (``hold_relay_dir``).

    Two relays writing the same files would interleave two streams and corrupt both: the second one is
    refused at start, naming the holder.
    """
    try:
        return hold_relay_dir(relay_dir)
    except DirectoryLocked as exc:
        raise RelayStartupError(
            f"relay directory {relay_dir} is in use by another relayproxy (pid {exc.holder}); "
            "one relay per directory"
        ) from None
    except OSError as exc:
        raise RelayStartupError(f"cannot open relay directory {relay_dir}: {exc}") from exc


async def serve(cfg, *, ready: "asyncio.Future | None" = None) -> int:
    """Run the relay until SIGTERM/SIGINT (or until the returned task is cancelled)."""
    from ..ops.http import DEFAULT_HTTP_MAX_CONNECTIONS, HttpApi
    from ..ops.metrics import FsyncStats
    from ..ops.status import relay_status
    from ..relay.hoptimes import HopTimes
    from ..relay.store import RelayStore
    from ..relay.sync import SyncPolicy
    from ..upstream.session import UpstreamSession

    policy = SyncPolicy(mode=cfg.sync_mode, max_transactions=cfg.sync_max_transactions, max_delay=cfg.sync_max_delay)
    fsync = FsyncStats()  # survives store reopens: the session passes on_fsync to the new store
    hop = HopTimes()  # where each transaction's time goes from its arrival to a replica (/metrics)
    storage = _storage_options(cfg)
    dir_lock = lock_relay_dir(cfg.relay_dir)
    try:
        _restore_if_empty(cfg)
    except RelayStartupError:
        os.close(dir_lock)
        raise
    try:
        store = RelayStore.open(cfg.relay_dir, sync=policy, on_fsync=fsync.observe,
                               txindex_in_child=cfg.txindex_in_child)
    except Exception as exc:  # the store's errors name file and offset; nothing is served from a bad store
        os.close(dir_lock)
        raise RelayStartupError(f"cannot open relay directory {cfg.relay_dir}: {exc}") from exc
    log.info("relay recovered from its files", report=str(store.recovery))
    try:
        session = UpstreamSession(cfg, store, hop=hop)
    except Exception as exc:  # a damaged relayproxy.master.json, or no master at all: named, nothing started
        store.close()
        os.close(dir_lock)
        raise RelayStartupError(f"cannot choose the master: {exc}") from exc
    log.info("master in force", master=session.master.address, reason=session.master_reason)
    parts = RelayParts(session, fsync)
    retention_task = storage_task = None
    try:
        parts.archive = _start_archive(cfg, session, storage)  # the relay-archive thread, with archive_url
    except RelayStartupError:
        store.close()
        os.close(dir_lock)
        raise
    http = None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, session.stop)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        listen_address = None
        if cfg.listen:
            parts.downstream = downstream = downstream_server(
                cfg, SessionRelayView.of_session(cfg, session),
                status_document=lambda: relay_status(cfg, parts.sources(listener=False)), replication=session,
                hop=hop)
            if cfg.semi_sync_replicas > 0:
                session.gate_acks(semi_sync_gate(downstream.ctx.semi_sync, cfg))
            if getattr(cfg, "sender_processes", 0):
                from ..downstream.workers import SenderPool
                from ..log import logging_settings

                settings = logging_settings()
                parts.senders = SenderPool(cfg.sender_processes, downstream.ctx, log_format=settings["format"],
                                           log_level=settings["level"], write_timeout=downstream.write_timeout,
                                           net_read_timeout=downstream.net_read_timeout)
                downstream.senders = parts.senders
                await parts.senders.start()
            try:
                listen_address = await downstream.start(*cfg.listen)
            except OSError as exc:
                raise RelayStartupError(f"cannot listen on --listen {cfg.listen[0]}:{cfg.listen[1]}: {exc.strerror}") from exc
        if cfg.http:
            http = HttpApi(lambda: relay_status(cfg, parts.sources()), fsync=fsync, hop=hop,
                           max_connections=getattr(cfg, "http_max_connections", None) or DEFAULT_HTTP_MAX_CONNECTIONS)
            try:
                address = await http.start(*cfg.http)
            except OSError as exc:
                raise RelayStartupError(f"cannot listen on --http {cfg.http[0]}:{cfg.http[1]}: {exc.strerror}") from exc
        else:
            address = None
        parts.retention = _retention(cfg, parts)
        if parts.retention is not None:
            retention_task = loop.create_task(parts.retention.run(), name="relay-retention")
        if storage.enabled:
            from ..relay.conversion import StorageTask

            parts.storage = StorageTask(storage, cfg.storage_interval, lambda: session.store)
            storage_task = loop.create_task(parts.storage.run(), name="relay-storage")
        if ready is not None and not ready.done():
            ready.set_result({"http": address, "listen": listen_address, "store": store, "session": session,
                              "downstream": parts.downstream, "retention": parts.retention, "parts": parts})
        elif ready is None:
            settle_gc()
        await session.run()
    finally:
        session.stop()
        if parts.archive is not None:
            parts.archive.close()
        for task in (retention_task, storage_task):
            if task is not None:
                task.cancel()
                await asyncio.wait({task})
        if parts.downstream is not None:
            await parts.downstream.close()
            if parts.senders is not None:
                await parts.senders.close()
        if http is not None:
            await http.close()
        session.store.close()
        os.close(dir_lock)
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError):
                pass
    return 0


class RelayParts:
    """What ``relayproxy run`` runs beside its upstream session, held here and never attached to the session: the
    listener and its sender processes, the closed-file storage task, the archive uploader and the retention task
    (each None when not configured). ``sources()`` is what the status document reads of them all."""

    def __init__(self, session: UpstreamSession, fsync: FsyncStats):
        self.session = session
        self.fsync = fsync
        self.downstream: DownstreamServer | None = None
        self.senders: SenderPool | None = None
        self.storage: StorageTask | None = None
        self.archive: ArchiveUploader | None = None
        self.retention: RetentionTask | None = None

    def sources(self, *, listener: bool = True) -> StatusSources:
        """The status document's sources now (the session can reopen its store and change masters). Without
        ``listener`` (SHOW REPLICA STATUS), the replicas, sender processes and fsync figures are left out."""
        return StatusSources(
            store=self.session.store, upstream=upstream_sources(self.session),
            downstream=self.downstream if listener else None, senders=self.senders if listener else None,
            fsync=self.fsync if listener else None, hop=self.session.hop if listener else None,
            sync=self.session.sync_driver if listener else None, syncs_by_store=self.session.store.fsyncs_inline,
            storage=self.storage, archive=self.archive,
            retention=self.retention, txindex=self.session.store.txindex_health() if listener else None)


def upstream_sources(session: UpstreamSession) -> UpstreamSources:
    """The upstream session as status reads it."""
    return UpstreamSources(status=session.status, receiver=session.receiver, master=session.master,
                           master_reason=session.master_reason, identity=session.identity)


def semi_sync_gate(tracker: SemiSyncTracker, cfg) -> Callable[[str, int], Awaitable[bool]]:
    """The gate before each upstream semi-sync ACK: wait for ``semi_sync_replicas`` of the relay's semi-sync
    replicas to have the transaction (False: gave up after ``semi_sync_timeout``, the master is ACKed anyway)."""
    wanted, timeout = cfg.semi_sync_replicas, cfg.semi_sync_timeout

    async def gate(file: str, position: int) -> bool:
        return await tracker.wait_for(file, position, wanted, timeout)

    return gate


def _storage_options(cfg):
    """How closed relay files are stored; registers the keyring so every reader (recovery first) can read
    encrypted files. The keys are never logged: only their ids."""
    from ..relay import closed_files
    from ..relay.conversion import StorageOptions

    try:
        storage = StorageOptions.from_config(cfg)
    except ValueError as exc:
        raise RelayStartupError(f"closed relay file storage: {exc}") from None
    closed_files.configure(cfg.relay_dir, keyring=storage.keyring)
    if storage.enabled:
        log.info("closed relay files", form=storage.describe())
    return storage


def _restore_if_empty(cfg) -> None:
    """With archive_url and a relay directory holding nothing of a relay (a new host), rebuild it from the bucket
    first, as `relayproxy restore` does (docs/archive.md), when the bucket holds a history; a bucket without one is
    a new archive. Any failure stops the start, naming the object, with the directory emptied again."""
    if not getattr(cfg, "archive_url", None):
        return
    from pathlib import Path

    from ..relay.remote import ARCHIVE_KEY
    from ..relay.conversion import keyring_from_config
    from ..relay.objectstore import ObjectNotFound, ObjectStoreError, display_url, from_config
    from ..relay.remote import parse_keep_local
    from .restore import empty_dir, restore

    relay_dir = Path(cfg.relay_dir)
    if any(entry.name != LOCK_NAME for entry in os.scandir(relay_dir)):
        return  # a relay's directory already (or someone's files): recovery decides
    try:
        bucket = from_config(cfg)
        bucket.get(ARCHIVE_KEY)
    except ObjectNotFound:
        return  # a new archive
    except (ValueError, ObjectStoreError) as exc:
        raise RelayStartupError(f"archive_url: the relay directory is empty and the bucket cannot be read to "
                                f"restore it: {exc}") from None
    log.info("relay directory is empty: restoring it from the archive", url=bucket.url)
    try:
        summary = restore(bucket, relay_dir, keyring=keyring_from_config(cfg),
                          say=lambda line: log.info("restore", step=line),
                          keep_local=parse_keep_local(cfg.archive_keep_local),
                          location=(display_url(cfg.archive_url),
                                    display_url(cfg.archive_endpoint) if cfg.archive_endpoint else None,
                                    cfg.archive_region))
    except Exception as exc:  # noqa: BLE001 - named, and the directory emptied again
        empty_dir(relay_dir, keep_prefix=LOCK_NAME)
        raise RelayStartupError(f"cannot restore the empty relay directory from {bucket.url}: {exc}") from None
    log.info("relay directory restored from the archive", files=summary["files"], bytes=summary["bytes"],
             file=summary["file"], position=summary["position"], gtids=summary["gtids"])


def _start_archive(cfg, session, storage):
    """With archive_url: the thread that uploads the relay's history to the bucket (relay/archive.py). It only
    reads the files and the horizon; credentials are never logged (the URL shown has none)."""
    if not getattr(cfg, "archive_url", None):
        return None
    from ..relay.archive import ArchiveUploader
    from ..relay.objectstore import from_config

    try:
        bucket = from_config(cfg)
    except ValueError as exc:
        raise RelayStartupError(f"archive_url: {exc}") from None
    from ..relay import closed_files, remote
    from ..relay.objectstore import display_url

    relay_dir = session.store.relay_dir
    try:
        keep_local = remote.parse_keep_local(cfg.archive_keep_local)
    except ValueError as exc:
        raise RelayStartupError(str(exc)) from None
    cache = remote.cache_from_config(cfg, bucket, relay_dir, keyring=closed_files.keyring_of(relay_dir))
    remote.configure(relay_dir, cache)  # offloaded files are read back through it (relay/remote.py)
    endpoint = display_url(cfg.archive_endpoint) if cfg.archive_endpoint else None
    uploader = ArchiveUploader(
        relay_dir, bucket, lambda: session.store.files(), lambda: session.store.horizon.snapshot(),
        flavour=lambda: session.store.flavour, storage=storage, interval=cfg.archive_interval or 1.0,
        keep_local=keep_local, location=(display_url(cfg.archive_url), endpoint, cfg.archive_region),
        backlog_max=cfg.archive_backlog_max)
    uploader.cache = cache
    log.info("archive enabled", url=bucket.url, interval=uploader.interval,
             parts="framed: " + storage.describe() if uploader.storage is not None else "plain")
    uploader.start()
    return uploader


def _retention(cfg, parts: RelayParts) -> RetentionTask | None:
    """The task that purges old relay files by the retention_* limits (run on the loop that owns the store), None
    when no limit is set. It never purges what a replica reads, a catalog holds or the archive has not uploaded."""
    from ..relay.retention import RetentionPolicy, RetentionTask

    policy = RetentionPolicy.from_config(cfg)
    if not policy.enabled:
        return None
    session, archive = parts.session, parts.archive
    ctx = parts.downstream.ctx if parts.downstream is not None else None
    return RetentionTask(
        policy, cfg.retention_interval, lambda: session.store,
        connections=lambda: ctx.connections if ctx is not None else {},
        catalog=lambda: ctx.catalog if ctx is not None else None,
        hold=archive.hold_from if archive is not None else None,
    )


class SessionRelayView:
    """The relay as its replicas see it (downstream/view.py's RelayView), over a store and what stands upstream of
    it: the upstream session (``run``: ``of_session``) or serve's NoUpstream. Every member is read when asked: the
    session can reopen its store, and the master (its flavour, version, UUID, variables) is known only once the
    session has talked to it."""

    def __init__(self, cfg, store: Callable[[], StoreReader],
                 upstream: Callable[[], UpstreamSources | NoUpstream], *, server_uuid: str):
        self.cfg = cfg
        self._store = store
        self._upstream = upstream
        self.server_uuid = server_uuid
        self._catalog: tuple[Any, Any] | None = None  # (store, its FileCatalog)
        self._catalog_lock = threading.Lock()  # the dump start gets the catalog in a worker thread

    @classmethod
    def of_session(cls, cfg, session: UpstreamSession) -> SessionRelayView:
        """The view of ``relayproxy run``: the session's store and status; @@server_uuid is the relay's own."""
        return cls(cfg, lambda: session.store, lambda: upstream_sources(session), server_uuid=session.replica_uuid)

    @property
    def store(self):
        return self._store()

    @property
    def horizon(self):
        return self._store().horizon

    @property
    def catalog(self):
        """One FileCatalog shared by the SQL layer and the dump senders; a reopened store gets a new one."""
        store = self._store()
        kept = self._catalog
        if kept is None or kept[0] is not store:
            from ..relay.catalog import FileCatalog

            with self._catalog_lock:
                kept = self._catalog
                if kept is None or kept[0] is not store:
                    kept = self._catalog = (store, FileCatalog(store))
        return kept[1]

    @property
    def server_id(self) -> int:
        return self.cfg.server_id

    def _said(self) -> UpstreamStatus | NoUpstream:
        """Where the master's flavour, version and variables are kept: the session's status, or NoUpstream."""
        upstream = self._upstream()
        return upstream.status if isinstance(upstream, UpstreamSources) else upstream

    @property
    def flavour(self) -> str:
        """mysql or mariadb: what the relay looks like to replicas (the upstream master's flavour; before the relay
        has a file or has reached its master, the flavour its GTID mode names, else mysql)."""
        found = self._store().flavour or self._said().master_flavour
        if found:
            return found
        configured = getattr(self.cfg, "gtid_mode", None)
        return configured if configured in ("mysql", "mariadb") else "mysql"

    @property
    def server_version(self) -> str:
        """The version string replicas see: the master's, marked as a relay."""
        upstream = self._said().master_server_version
        if upstream:
            base = upstream.split("-log")[0]
            return f"{base}-relayproxy-log" if "MariaDB" not in base else upstream
        fde = self._store().latest_format_description
        if fde is not None:
            return fde.server_version
        return "8.0.36-relayproxy-log" if self.flavour == "mysql" else "10.11.6-MariaDB-relayproxy-log"

    @property
    def master(self) -> MasterFacts:
        """What the relay knows of its master: the session's status and the variables it fetched and persisted
        (relay/master_variables.py); without an upstream, only the variables a relay directory kept."""
        upstream = self._upstream()
        said = upstream.status if isinstance(upstream, UpstreamSources) else upstream
        absent = (said.master_variables_source or {}).get("absent")  # a list of names (MasterVariables.describe)
        facts = MasterFacts(variables=said.master_variables or {},
                            absent=frozenset(absent) if isinstance(absent, (list, tuple)) else frozenset())
        if isinstance(upstream, NoUpstream):
            return facts
        status = upstream.status
        return replace(facts, master_uuid=status.master_uuid, master_server_id=status.master_server_id,
                       io_running=status.io_running, heartbeats=upstream.receiver.counters.heartbeats)

    @property
    def settings(self) -> ReplicaSettings:
        return ReplicaSettings.from_config(self.cfg)


def downstream_server(cfg, view: SessionRelayView, *, status_document: Callable[[], dict[str, Any]],
                      replication: ReplicationControl | None, hop: HopTimes | None = None) -> DownstreamServer:
    """The listener for replicas and tools (--listen), with its users and optional TLS, over ``view``; SHOW REPLICA
    STATUS answers from ``status_document``; ``replication`` (None: no upstream) takes the admin statements;
    ``hop`` hears the dumps' send stage (relay/hoptimes.py)."""
    from ..downstream import sendbatch
    from ..downstream.context import DownstreamContext
    from ..downstream.server import DownstreamServer
    from ..downstream.transport import server_tls_context

    if not cfg.users:
        raise RelayStartupError("--listen needs at least one account: users / RELAYPROXY_USERS / [[users]]")
    tls = None
    if cfg.tls_cert:
        try:
            tls = server_tls_context(cfg.tls_cert, cfg.tls_key)
        except (OSError, ValueError) as exc:
            raise RelayStartupError(f"cannot load the TLS certificate for --listen: {exc}") from exc
    elif any(user.tls == "required" for user in cfg.users):
        raise RelayStartupError("a user requires TLS but no tls_cert is configured for --listen")
    from ..relay.replay_stops import ReplayStops, ReplayStopsError

    sendbatch.configure(getattr(cfg, "send_threads", 1))
    store = view.store
    try:  # pitr's stops survive a restart; a read-only directory (serve) keeps them in memory only
        stops = ReplayStops.load(None if store.read_only else store.relay_dir)
    except ReplayStopsError as exc:
        raise RelayStartupError(str(exc)) from None
    ctx = DownstreamContext(view, status_document=status_document, replication=replication, replay_stops=stops,
                            hop=hop)
    limits = {
        "max_connections": getattr(cfg, "max_connections", None),
        "max_connections_per_host": getattr(cfg, "max_connections_per_host", None),
        "max_unauthenticated": getattr(cfg, "max_unauthenticated_connections", None),
        "handshake_timeout": getattr(cfg, "handshake_timeout", None),
        "write_timeout": getattr(cfg, "net_write_timeout", None),
        "net_read_timeout": getattr(cfg, "net_read_timeout", None),
        "dump_stop_grace": getattr(cfg, "dump_stop_grace", None),
        "max_connect_errors": getattr(cfg, "max_connect_errors", None),
        "host_block_time": getattr(cfg, "host_block_time", None),
        "login_failures_threshold": getattr(cfg, "login_failures_threshold", None),
        "login_min_delay": getattr(cfg, "login_min_delay", None),
        "login_max_delay": getattr(cfg, "login_max_delay", None),
    }
    if (limits["login_min_delay"] or 0) > (limits["login_max_delay"] or float("inf")):
        raise RelayStartupError(f"login_min_delay ({limits['login_min_delay']:g}s) is longer than login_max_delay "
                                f"({limits['login_max_delay']:g}s)")
    return DownstreamServer(ctx, cfg.users, tls_context=tls, **{k: v for k, v in limits.items() if v is not None})
