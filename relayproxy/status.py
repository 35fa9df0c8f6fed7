"""The relay's status document: the horizon (all the relay advertises) plus upstream health and counters."""

from __future__ import annotations

import time
from typing import Any


def relay_status(cfg, store, session, downstream=None) -> dict[str, Any]:
    """One consistent snapshot for GET /status, `relayproxy status` and (later) SHOW REPLICA STATUS."""
    horizon = store.horizon.snapshot()
    up = session.status
    receiver = session.receiver
    counters = receiver.counters
    master_position = receiver.master_position
    lag_bytes = None
    if master_position is not None and horizon.file is not None:
        if master_position[0] == horizon.file:
            lag_bytes = max(master_position[1] - horizon.position, 0)
    seconds_behind = None
    if up.io_running and receiver.master_timestamp:
        if lag_bytes == 0:
            seconds_behind = 0
        else:
            seconds_behind = max(int(time.time() - up.clock_diff - receiver.master_timestamp), 0)
    return {
        "master_host": cfg.master[0] if cfg.master else None,
        "master_port": cfg.master[1] if cfg.master else None,
        "master_log_file": horizon.file,
        "read_master_log_pos": horizon.position,
        "retrieved_gtid_set": horizon.text,
        "io_running": up.io_running,
        "last_io_error": up.last_io_error,
        "last_io_error_time": up.last_io_error_time,
        "master_position": (
            {"file": master_position[0], "position": master_position[1]} if master_position is not None else None
        ),
        "lag_bytes": lag_bytes,
        "seconds_behind_master": seconds_behind,
        "state": up.state,
        "gtid_mode": cfg.gtid_mode,
        "master_server_id": up.master_server_id,
        "master_server_version": up.master_server_version,
        "master_uuid": up.master_uuid,
        "master_flavour": up.master_flavour,
        "server_id": cfg.server_id,
        "relay_dir": str(cfg.relay_dir),
        "relay_files": len(store.files()),
        "sync_mode": cfg.sync_mode,
        "semi_sync": up.semi_sync,
        "semi_sync_acks": up.semi_sync_acks,
        "connects": up.connects,
        "connect_failures": up.connect_failures,
        "events_received": counters.events,
        "bytes_received": counters.bytes,
        "transactions_received": counters.transactions,
        "duplicate_events_skipped": counters.duplicates,
        "heartbeats_received": counters.heartbeats,
        "horizon_seq": horizon.seq,
        "semi_sync_replica_waits": up.semi_sync_replica_waits,
        "semi_sync_replica_timeouts": up.semi_sync_replica_timeouts,
        "replicas": _replicas(downstream) if downstream is not None else [],
    }


def _replicas(downstream) -> list[dict[str, Any]]:
    """Connected dump clients: who they are and how far each has been sent / has acknowledged."""
    out = []
    for conn in list(downstream.ctx.connections.values()):
        dump = conn.dump
        if dump is None and conn.registration is None:
            continue
        reg = conn.registration
        out.append({
            "connection_id": conn.conn_id,
            "user": conn.user,
            "host": conn.host,
            "server_id": reg.server_id if reg else None,
            "mode": dump.mode if dump else None,
            "file": dump.file if dump else None,
            "position": dump.position if dump else None,
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
        f"Relay dir:              {status.get('relay_dir')} ({status.get('relay_files')} files, sync {status.get('sync_mode')})",
    ]
    return "\n".join(lines)
