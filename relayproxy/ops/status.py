"""The relay's status document: the horizon (all the relay advertises), upstream health, disk and replicas."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..downstream.dump.followers import describe as describe_followers
from ..relay import closed_files
from ..binlog.gtid import boundary_gtid_text as gtid_text

if TYPE_CHECKING:
    from ..downstream.server import DownstreamServer
    from ..downstream.workers import SenderPool
    from ..relay.archive import ArchiveUploader
    from ..relay.conversion import StorageTask
    from ..relay.hoptimes import HopTimes
    from ..relay.master_info import MasterIdentity, MasterInfo
    from ..relay.reader import StoreReader
    from ..relay.retention import RetentionTask
    from ..relay.sync_driver import SyncDriver
    from ..upstream.receiver import RelayReceiver
    from ..upstream.session import UpstreamStatus
    from .metrics import FsyncStats


@dataclass(frozen=True)
class UpstreamSources:
    """The upstream session as status reads it (``relayproxy run``): its health and its receiver, the master in
    force and why (relay/master_info.py; None where the caller has none), the master the newest files came from."""

    status: UpstreamStatus
    receiver: RelayReceiver
    master: MasterInfo | None = None
    master_reason: str | None = None
    identity: MasterIdentity | None = None


@dataclass
class NoUpstream:
    """What a relay without an upstream says in its place (``relayproxy serve``): nothing is received, ``state``
    says what it does instead, and the master facts are the files' own (their flavour, the newest
    FORMAT_DESCRIPTION's version) and the variables a relay directory kept (relay/master_variables.py)."""

    state: str
    master_flavour: str | None = None
    master_server_version: str | None = None
    master_variables: dict[str, str | None] | None = None
    master_variables_source: dict[str, Any] | None = None
    master_variables_error: str | None = None


@dataclass(frozen=True)
class StatusSources:
    """Everything ``relay_status`` reads, built by the command that wires the relay (``run``, ``serve``) at the
    time of asking (the session can reopen its store and change masters). A part the relay does not run is None:
    no listener (``downstream``), no sender processes, no FsyncStats, HopTimes or SyncDriver, no closed-file storage, archive or
    retention task."""

    store: StoreReader  # relay/reader.py: the relay's own files (run) or a served directory (serve)
    upstream: UpstreamSources | NoUpstream
    downstream: DownstreamServer | None = None
    senders: SenderPool | None = None
    fsync: FsyncStats | None = None
    hop: HopTimes | None = None  # the hop's stage histograms (relay/hoptimes.py)
    sync: SyncDriver | None = None  # where the fdatasyncs run (relay/sync_driver.py)
    syncs_by_store: int = 0  # with ``sync``: the fdatasyncs the RelayStore ran itself (RelayStore.fsyncs_inline)
    storage: StorageTask | None = None  # closed files converted / archived (relay/conversion.py)
    archive: ArchiveUploader | None = None  # with archive_url (relay/archive.py; no credentials in it)
    retention: RetentionTask | None = None  # with a retention_* limit (relay/retention.py)
    txindex: dict[str, Any] | None = None  # the transaction indexer's health (RelayStore.txindex_health)


def relay_status(cfg, sources: StatusSources) -> dict[str, Any]:
    """One consistent snapshot for GET /status, /metrics, `relayproxy status` and SHOW REPLICA STATUS.

    Cheap enough for every scrape: counters already kept, plus one stat() per relay file and one
    statvfs() of the relay directory; no relay file is read (a closed file's SHA-256 comes from its index,
    read once and cached).
    """
    store = sources.store
    horizon = store.horizon.snapshot()
    names = store.files()
    disk = _disk_usage(store, names)
    upstream_at = store.upstream_position()
    up = sources.upstream
    link = _upstream_link(up, horizon) if isinstance(up, UpstreamSources) else _no_upstream_link(up)
    master = up.master if isinstance(up, UpstreamSources) else None
    identity = up.identity if isinstance(up, UpstreamSources) else None
    doc = {
        "version": __version__,
        "master_host": master.host if master is not None else cfg.master[0] if cfg.master else None,
        "master_port": master.port if master is not None else cfg.master[1] if cfg.master else None,
        # Which master is in force and why (a CHANGE MASTER choice overrides --master); never the password.
        "master": master.describe() if master is not None else None,
        "master_source": up.master_reason if isinstance(up, UpstreamSources) else None,
        # The master the relay's newest files came from (recorded when it first streamed from it).
        "master_identity": ({"server_id": identity.server_id, "server_uuid": identity.server_uuid,
                             "host": identity.host, "port": identity.port} if identity is not None else None),
        # The horizon in the current master's own coordinates (after a switch, relay names differ from its).
        # Which master each of the relay's files came from (relay/epochs.py; docs/failover.md).
        "epochs": _epochs(store),
        "upstream_log_file": upstream_at[0] if upstream_at else horizon.file,
        "upstream_log_pos": upstream_at[1] if upstream_at else horizon.position,
        "master_log_file": horizon.file,
        "read_master_log_pos": horizon.position,
        "retrieved_gtid_set": horizon.text,
        "horizon_file_index": file_index(horizon.file),
        **link,
        "gtid_mode": master.gtid_mode if master is not None else cfg.gtid_mode,
        "flavour": link["master_flavour"] or store.flavour,
        "server_id": cfg.server_id,
        "relay_dir": str(cfg.relay_dir),
        "relay_files": len(names),
        # Per file: its durable size and SHA-256 (closed files, from their index; the current file grows: null, and
        # `relayproxy inspect --summary` hashes it on demand). Two relays of one master compare these (operations.md).
        "relay_file_digests": _file_digests(store, names, disk["sizes"], horizon),
        "relay_disk_bytes": disk["bytes"],
        "relay_fs_free_bytes": disk["fs_free"],
        "relay_fs_size_bytes": disk["fs_size"],
        "relay_oldest_file": disk["oldest"],
        "relay_oldest_file_age_seconds": disk["oldest_age"],
        "sync_mode": cfg.sync_mode,
        "horizon_seq": horizon.seq,
        **(_semi_sync_tally(up.receiver) if isinstance(up, UpstreamSources) else {}),
        "replicas": [],
    }
    _add_parts(doc, sources, horizon, names, disk["sizes"])
    return doc


def _upstream_link(up: UpstreamSources, horizon) -> dict[str, Any]:
    """The upstream session's health and what it received (the IO thread's side of SHOW REPLICA STATUS)."""
    status, receiver = up.status, up.receiver
    counters = receiver.counters
    master_position = receiver.master_position
    lag_bytes = None
    if master_position is not None and horizon.file is not None:
        if master_position[0] == horizon.file:
            lag_bytes = max(master_position[1] - horizon.position, 0)
    seconds_behind = None
    if status.io_running and receiver.master_timestamp:
        if lag_bytes == 0:
            seconds_behind = 0
        else:
            seconds_behind = max(int(time.time() - status.clock_diff - receiver.master_timestamp), 0)
    return {
        "io_running": status.io_running,
        "last_io_error": status.last_io_error,
        "last_io_error_time": status.last_io_error_time,
        "last_io_errno": status.last_io_errno,
        # The master's replication-relevant variables as it last said them (relay/master_variables.py), what the
        # SQL layer answers @@binlog_format & co. with; and why a persisted copy was ignored, if it was.
        "master_variables": status.master_variables,
        "master_variables_error": status.master_variables_error,
        # The last switch of masters the session decided (upstream/repoint.py): the coordinates CHANGE MASTER gave,
        # their GTID translation on the new master, the relay's GTID set, what was missing, the decision.
        "last_switch": status.last_switch,
        # A catch-up from a peer relay in force (upstream/session.py, _check_peer): the peer, its server_id, the
        # epoch, the master, where it began and the bytes verified (docs/failover.md); null otherwise.
        "peer_catch_up": status.peer_catch_up,
        "master_position": (
            {"file": master_position[0], "position": master_position[1]} if master_position is not None else None
        ),
        "master_file_index": file_index(master_position[0]) if master_position is not None else None,
        "lag_bytes": lag_bytes,
        "seconds_behind_master": seconds_behind,
        "state": status.state,
        "master_server_id": status.master_server_id,
        "master_server_version": status.master_server_version,
        "master_uuid": status.master_uuid,
        "master_flavour": status.master_flavour,
        "semi_sync": status.semi_sync,
        "semi_sync_acks": status.semi_sync_acks,
        "connects": status.connects,
        "reconnects": max(status.connects - 1, 0),
        "connect_failures": status.connect_failures,
        "store_failures": status.store_failures,
        "errors_by_kind": {**dict.fromkeys(_error_kinds(), 0), **status.errors},
        "events_received": counters.events,
        "bytes_received": counters.bytes,
        "transactions_received": counters.transactions,
        "duplicate_events_skipped": counters.duplicates,
        "heartbeats_received": counters.heartbeats,
        "semi_sync_replica_waits": status.semi_sync_replica_waits,
        "semi_sync_replica_timeouts": status.semi_sync_replica_timeouts,
    }


def _no_upstream_link(up: NoUpstream) -> dict[str, Any]:
    """The same keys for a relay without an upstream: not running, nothing received, no error, no master position;
    the master facts the files give."""
    return {
        "io_running": False,
        "last_io_error": None,
        "last_io_error_time": None,
        "last_io_errno": None,
        "master_variables": up.master_variables,
        "master_variables_error": up.master_variables_error,
        "last_switch": None,
        "peer_catch_up": None,
        "master_position": None,
        "master_file_index": None,
        "lag_bytes": None,
        "seconds_behind_master": None,
        "state": up.state,
        "master_server_id": None,
        "master_server_version": up.master_server_version,
        "master_uuid": None,
        "master_flavour": up.master_flavour,
        "semi_sync": False,
        "semi_sync_acks": 0,
        "connects": 0,
        "reconnects": 0,
        "connect_failures": 0,
        "store_failures": 0,
        "errors_by_kind": dict.fromkeys(_error_kinds(), 0),
        "events_received": 0,
        "bytes_received": 0,
        "transactions_received": 0,
        "duplicate_events_skipped": 0,
        "heartbeats_received": 0,
        "semi_sync_replica_waits": 0,
        "semi_sync_replica_timeouts": 0,
    }


def _add_parts(doc: dict[str, Any], sources: StatusSources, horizon, names: list[str], sizes: dict[str, int]) -> None:
    """What the parts the relay runs beside its store and upstream add: the listener's replicas and logins, the
    sender processes, the fsync figures, closed-file storage, the archive and retention."""
    downstream = sources.downstream
    if downstream is not None:
        doc["replicas"] = _replicas(downstream, horizon, names, sizes)
        doc["horizon_followers"] = describe_followers(sources.store.horizon)
        # pitr targets' fences (relay/replay_stops.py): a dump never sends its replica past its stop.
        doc["replay_stops"] = _replay_stops(downstream.ctx, names)
        doc["logins"] = downstream.describe_logins()  # --listen's host blocking and password throttle
    if sources.senders is not None:
        doc["sender_processes"] = sources.senders.describe()
    if sources.fsync is not None:
        doc.update(sources.fsync.summary())
    if sources.hop is not None:
        doc["hop"] = sources.hop.summary()
    if sources.sync is not None:
        # The store's own syncs (before a new file, an epoch switch, a stop) run on the loop's thread too.
        doc["sync_driver"] = {**sources.sync.describe(), "syncs_by_store": sources.syncs_by_store}
    if sources.storage is not None:  # key ids only, never keys
        doc["storage"] = {"form": sources.storage.opts.describe(), **sources.storage.stats.as_dict()}
    if sources.archive is not None:
        doc["archive"] = sources.archive.describe()
    if sources.retention is not None:
        doc["retention"] = sources.retention.stats.as_dict()
    if sources.txindex is not None:
        doc["txindex"] = sources.txindex


def _replay_stops(ctx, names: list[str]) -> list[dict[str, Any]]:
    """The replay stops in force, by server id, each with the dumps of its replica connected now and whether each
    has been sent everything up to the stop (``at_stop``: the target has all it will get; pitr waits for its
    applier to finish). ``persistent`` False: kept in memory only (``relayproxy serve``)."""
    stops = ctx.replay_stops
    out = []
    for stop in stops.all():
        dumps = []
        for conn in list(ctx.connections.values()):
            reg, dump = conn.registration, conn.dump
            if dump is None or reg is None or reg.server_id != stop.server_id or dump.file is None:
                continue
            dumps.append({"connection_id": conn.conn_id, "file": dump.file, "position": dump.position,
                          "at_stop": _at_or_past(names, (dump.file, dump.position), (stop.file, stop.position))})
        out.append({"server_id": stop.server_id, "file": stop.file, "position": stop.position,
                    "gtid_state": stop.gtid_state, "label": stop.label, "created": stop.created,
                    "persistent": stops.persistent, "dumps": dumps})
    return out


def _at_or_past(names: list[str], at: tuple[str, int], stop: tuple[str, int]) -> bool | None:
    """Whether relay position ``at`` is at or past ``stop`` (None when either file is no longer listed)."""
    try:
        return (names.index(at[0]), at[1]) >= (names.index(stop[0]), stop[1])
    except ValueError:
        return None


def _file_digests(store: StoreReader, names: list[str], sizes: dict[str, int], horizon) -> list[dict[str, Any]]:
    """[{file, size, sha256}] oldest first: a closed file's SHA-256 from the store's cache of its index (no file is
    read once it is cached; null while its index is being built), the current file's size is the horizon's."""
    digest = store.file_digest  # None for a file without a kept index (a served directory's)
    out = []
    for name in names:
        current = name == horizon.file
        if name not in sizes and not current:
            continue  # purged meanwhile
        out.append({"file": name, "size": horizon.position if current else sizes[name],
                    "sha256": None if current else digest(name)})
        if current:
            break  # files after the horizon's hold nothing durable yet
    return out


def _semi_sync_tally(receiver: RelayReceiver) -> dict[str, Any]:
    """What semi-sync streams' transaction ends said about the master's waiting (docs/failover.md, "Semi-sync
    fallback: the hole"): since the relay started; ``master_waiting`` is None until this stream's first end."""
    tally = receiver.semi_sync
    asked = tally.last_ack_request_time
    return {
        "semi_sync_master_waiting": tally.master_waiting,
        "semi_sync_ack_requests": tally.ack_requests,
        "semi_sync_last_ack_request_time": asked,
        "semi_sync_ack_request_age_seconds": round(max(time.time() - asked, 0.0), 3) if asked is not None else None,
        "semi_sync_unrequested_transactions": tally.unrequested_transactions,
        "semi_sync_last_unrequested_gtid": gtid_text(tally.last_unrequested_gtid),
        "semi_sync_last_unrequested_time": tally.last_unrequested_time,
    }


def _epochs(store: StoreReader) -> list[dict[str, Any]]:
    """The relay's upstream epochs, oldest first (an epoch whose files were all purged is gone)."""
    out = []
    for e in store.epochs.epochs:
        out.append({
            "epoch": e.epoch,
            "first_file": e.first_file,
            "upstream_first_file": e.upstream_first_file,
            "master": dict(e.master) if e.master else None,
            "join_gtids": e.join_gtids,
        })
    return out


def file_index(name: str | None) -> int | None:
    """The sequence number of a binlog file name (``mysql-bin.000042`` -> 42), None when it has none."""
    if not name:
        return None
    _base, _dot, suffix = name.rpartition(".")
    return int(suffix) if _dot and suffix.isdigit() else None


def _error_kinds() -> tuple[str, ...]:
    from ..upstream.session import UPSTREAM_ERROR_KINDS

    return UPSTREAM_ERROR_KINDS


def _disk_usage(store: StoreReader, names: list[str]) -> dict[str, Any]:
    """Sizes of the relay files (stat only), the oldest file's age and the file system's free space."""
    sizes: dict[str, int] = {}  # logical sizes (the master's offsets: replica lag in bytes)
    stored = 0  # bytes on disk (compressed, encrypted, archived: relay_disk_bytes)
    oldest = oldest_age = None
    now = time.time()
    for name in names:
        try:
            st, logical = closed_files.stat_logical(store.path(name))
        except (OSError, KeyError, closed_files.StoredFileError):
            continue  # purged between files() and here
        sizes[name] = logical
        stored += st.st_size
        if oldest is None:
            oldest, oldest_age = name, max(now - st.st_mtime, 0.0)
    fs_free = fs_size = None
    try:
        vfs = os.statvfs(store.relay_dir)
    except OSError:
        pass
    else:
        fs_free, fs_size = vfs.f_bavail * vfs.f_frsize, vfs.f_blocks * vfs.f_frsize
    return {
        "sizes": sizes,
        "bytes": stored,
        "fs_free": fs_free,
        "fs_size": fs_size,
        "oldest": oldest,
        "oldest_age": None if oldest_age is None else round(oldest_age, 3),
    }


def bytes_behind(names: list[str], sizes: dict[str, int], at: tuple[str, int], horizon: tuple[str | None, int]) -> int | None:
    """Event bytes from ``at`` up to the horizon, across files (a file's 4-byte magic is not counted).

    Same file: the difference. An older file: what is left of it, then every following file up to
    the horizon. None when a file is unknown (purged, not yet in the index) or ``at`` is past it.
    """
    file, position = at
    h_file, h_position = horizon
    if file is None or h_file is None:
        return None
    if file == h_file:
        return max(h_position - position, 0)
    try:
        first, last = names.index(file), names.index(h_file)
    except ValueError:
        return None
    if first > last:
        return None
    total = 0
    for name in names[first:last]:
        size = sizes.get(name)
        if size is None:
            return None
        total += max(size - (position if name == file else 4), 0)
    return total + max(h_position - 4, 0)


def _replicas(downstream: DownstreamServer, horizon, names: list[str], sizes: dict[str, int]) -> list[dict[str, Any]]:
    """Connected dump clients: who they are, how far each has been sent / has acknowledged, how far behind.

    ``lag_seconds`` is 0 while the replica has every durable byte (``lag_bytes`` 0), else the time
    since it last had: since its sender last waited at the horizon, or since the dump started when
    it has not caught up on this connection yet.
    """
    out = []
    now = time.time()
    for conn in list(downstream.ctx.connections.values()):
        dump = conn.dump
        if dump is None and conn.registration is None:
            continue
        reg = conn.registration
        lag_bytes = lag_seconds = None
        if dump is not None and dump.file is not None:
            lag_bytes = bytes_behind(names, sizes, (dump.file, dump.position), (horizon.file, horizon.position))
            if lag_bytes == 0:
                lag_seconds = 0.0
            elif lag_bytes is not None:
                since = dump.caught_up_at or dump.started
                lag_seconds = round(max(now - since, 0.0), 3)
        out.append({
            "connection_id": conn.conn_id,
            "user": conn.user,
            "host": conn.host,
            "server_id": reg.server_id if reg else None,
            "mode": dump.mode if dump else None,
            "file": dump.file if dump else None,
            "position": dump.position if dump else None,
            "lag_bytes": lag_bytes,
            "lag_seconds": lag_seconds,
            "events_sent": dump.events_sent if dump else 0,
            "bytes_sent": dump.bytes_sent if dump else 0,
            "semi_sync": dump.semi_sync if dump else False,
            "last_ack": list(dump.last_ack) if dump and dump.last_ack else None,
        })
    return out


def format_status(status: dict[str, Any]) -> str:
    """A person's view of the status document (for `relayproxy status`)."""
    mp = status.get("master_position") or {}
    lines = [
        f"Master:                 {status.get('master_host')}:{status.get('master_port')}"
        f"  (server_id {status.get('master_server_id')}, {status.get('master_server_version') or 'version unknown'})",
        f"IO running:             {'Yes' if status.get('io_running') else 'No'}  ({status.get('state')})",
        f"Master_Log_File:        {status.get('master_log_file')}",
        f"Read_Master_Log_Pos:    {status.get('read_master_log_pos')}   (end of the last complete, durable transaction)",
        f"Retrieved_Gtid_Set:     {status.get('retrieved_gtid_set') or ''}",
        f"Master position:        {mp.get('file')}:{mp.get('position')}" if mp else "Master position:        unknown",
        f"Lag:                    {status.get('lag_bytes')} bytes, {status.get('seconds_behind_master')} s",
        f"Last_IO_Error:          {status.get('last_io_error') or ''}",
        f"Received:               {status.get('transactions_received')} transactions, "
        f"{status.get('events_received')} events, {status.get('bytes_received')} bytes",
        f"Semi-sync:              {'on' if status.get('semi_sync') else 'off'} ({status.get('semi_sync_acks')} acks)",
        *_semi_sync_lines(status),
        f"Reconnects:             {status.get('reconnects')}; errors: "
        + (", ".join(f"{kind} {n}" for kind, n in (status.get("errors_by_kind") or {}).items() if n) or "none"),
        f"Relay dir:              {status.get('relay_dir')} ({status.get('relay_files')} files, sync {status.get('sync_mode')})",
        f"Disk:                   {_size(status.get('relay_disk_bytes'))} in relay files, "
        f"{_size(status.get('relay_fs_free_bytes'))} free, oldest file {status.get('relay_oldest_file')} "
        f"({_age(status.get('relay_oldest_file_age_seconds'))} old)",
    ]
    if status.get("fsyncs") is not None:
        last = status.get("fsync_last_seconds")
        total = status.get("fsync_seconds_sum") or 0.0
        mean = total / status["fsyncs"] if status["fsyncs"] else None
        lines.append(
            f"Fsync:                  {status['fsyncs']} syncs, {_size(status.get('fsync_bytes'))}; last {_ms(last)}, "
            f"mean {_ms(mean)}, max {_ms(status.get('fsync_max_seconds'))}"
        )
    sync = status.get("sync_driver")
    if sync:
        lines.append(
            f"Fsync runs:             {sync.get('syncs_on_loop')} on the loop, {sync.get('syncs_off_loop')} in the "
            f"fsync thread, {sync.get('syncs_by_store')} by the store; sync_on_loop {sync.get('setting')}, next "
            + ("on the loop" if sync.get("on_loop_now") else "in the fsync thread")
            + (f"; slow-sync pauses: {sync['on_loop_pauses']}" if sync.get("on_loop_pauses") else "")
        )
    hop = status.get("hop")
    if hop and hop.get("durable", {}).get("count"):  # the stages' means since the start (docs/metrics.md)
        lines.append("Hop (mean per trx):     " + ", ".join(
            f"{stage} {_ms(figures.get('mean_seconds'))}" for stage, figures in hop.items() if figures.get("count")))
    archive = status.get("archive")
    if archive:
        horizon = archive.get("horizon") or {}
        lines.append(
            f"Archive:                {archive.get('url')}: {archive.get('state')}, at {horizon.get('file')}:"
            f"{horizon.get('position')}, behind {_size(archive.get('lag_bytes'))} / {archive.get('lag_seconds')} s"
            + (f"; last error: {archive['last_error']}" if archive.get("last_error") else "")
        )
        cache = archive.get("cache")
        if cache and (archive.get("keep_local") or cache.get("fetches")):
            lines.append(
                f"Archive cache:          {archive.get('files_offloaded')} files offloaded (keep local "
                f"{archive.get('keep_local') or 'all'}); cache {_size(cache.get('bytes'))} of "
                f"{_size(cache.get('max_bytes'))}, {cache.get('fetches')} fetches, {cache.get('hits')} hits"
                + (f"; last error: {cache['last_error']}" if cache.get("last_error") else "")
            )
    txindex = status.get("txindex")
    if txindex:  # relayproxy run's transaction indexer (relay/txindex.py, relay/txindex_child.py)
        where = (f"child pid {txindex.get('child_pid')}, {txindex.get('child_starts')} started"
                 if txindex.get("mode") == "child" else "thread")
        lines.append(
            f"Transaction index:      {where}; {txindex.get('passes')} passes, {txindex.get('files_finished')} files "
            f"finished, {txindex.get('errors')} errors"
            + (f"; last error: {txindex['last_error']}" if txindex.get("last_error") else "")
        )
    replicas = [r for r in status.get("replicas") or [] if r.get("file") is not None]
    lines.append(f"Replicas:               {len(replicas)}")
    for r in replicas:
        lines.append(
            f"  server_id {r.get('server_id')} (conn {r.get('connection_id')}, {r.get('user')}@{r.get('host')}): "
            f"{r.get('file')}:{r.get('position')}, behind {r.get('lag_bytes')} bytes / {r.get('lag_seconds')} s"
            + (f", acked {r['last_ack'][0]}:{r['last_ack'][1]}" if r.get("last_ack") else "")
        )
    for stop in status.get("replay_stops") or []:
        reached = any(d["at_stop"] for d in stop["dumps"])
        lines.append(
            f"Replay stop:            server_id {stop['server_id']} at {stop['file']}:{stop['position']}"
            + (f" ({stop['label']})" if stop.get("label") else "")
            + (", reached" if reached else f", {len(stop['dumps'])} dump(s) short of it")
            + ("" if stop.get("persistent") else ", in memory only")
        )
    return "\n".join(lines)


def _semi_sync_lines(status: dict[str, Any]) -> list[str]:
    """The semi-sync tally, once the relay has seen a semi-sync transaction end."""
    asked, unrequested = status.get("semi_sync_ack_requests"), status.get("semi_sync_unrequested_transactions")
    if not asked and not unrequested:
        return []
    waiting = status.get("semi_sync_master_waiting")
    age = status.get("semi_sync_ack_request_age_seconds")
    lines = [
        "Semi-sync master:       "
        + {True: "waiting for ACKs (the latest transaction end asked for one)",
           False: "NOT asking for ACKs (the latest transaction end did not)", None: "unknown on this stream"}[waiting]
        + ("; never asked" if age is None else f"; last asked {age:.1f} s ago" if age < 60 else f"; last asked {_age(age)} ago")
    ]
    if unrequested:
        when = status.get("semi_sync_last_unrequested_time")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if when else "?"
        lines.append(
            f"Not asked to ACK:       {unrequested} transactions, latest {status.get('semi_sync_last_unrequested_gtid')}"
            f" at {stamp}"
        )
    return lines


def _size(n) -> str:
    if n is None:
        return "?"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f} ms"


def _age(seconds) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"
