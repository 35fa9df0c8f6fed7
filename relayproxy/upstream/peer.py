"""Peer catch-up: the upstream may be another relay of the same master (it answers ``@@relayproxy_epoch``), which
the relay follows within its current epoch only when the peer's bytes of the horizon file are its own. The probe,
the checks, and the byte comparison over a second, non-blocking dump (docs/failover.md)."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Callable

from ..binlog.constants import FORMAT_DESCRIPTION_EVENT, HEARTBEAT_LOG_EVENT, LOG_EVENT_ARTIFICIAL_F, event_name
from ..binlog.encoders import fde_copy
from ..wire.errors import ER_UNKNOWN_SYSTEM_VARIABLE
from ..wire.packets import BINLOG_DUMP_NON_BLOCK, BINLOG_SEND_ANNOTATE_ROWS_EVENT, MySQLError, parse_err
from .connection import UpstreamConnection
from .errors import MasterRefused
from .setup import MARIA_SLAVE_CAPABILITY_MINE, peer_read_timeout

if TYPE_CHECKING:
    from ..relay.master_info import MasterIdentity, MasterInfo
    from ..relay.store import RelayStore

__all__ = ["check_peer", "compare_with_peer", "probe_peer"]


async def probe_peer(conn: UpstreamConnection) -> dict | None:
    """The upstream's current epoch when it is a relay (it answers ``@@relayproxy_epoch``, a server 1193), else None."""
    names = ("epoch", "server_id", "server_uuid", "first_file", "upstream_first_file")
    columns = ("relayproxy_epoch", "relayproxy_master_server_id", "relayproxy_master_server_uuid",
               "relayproxy_epoch_first_file", "relayproxy_epoch_upstream_first_file")
    try:
        rows = (await conn.query("SELECT " + ", ".join(f"@@GLOBAL.{c}" for c in columns))).rows
    except MySQLError as exc:
        if exc.code == ER_UNKNOWN_SYSTEM_VARIABLE:
            return None
        raise
    return dict(zip(names, rows[0])) if rows else None


async def check_peer(peer: dict, identity: MasterIdentity, *, master: MasterInfo, store: RelayStore,
                     upstream_at: Callable[[], tuple[str | None, int]], server_id: int,
                     connect_timeout: float) -> dict:
    """Peer catch-up within an epoch: the upstream is another relay (it answers ``@@relayproxy_epoch``) and a
    CHANGE MASTER by file/position chose it. Accepted only when its current epoch is the relay's current epoch
    (the same master's server_id/uuid, the same epoch number and first files), the coordinates are the relay's
    own horizon, and the peer's bytes of the horizon file up to the horizon are the relay's (compared over a
    second, non-blocking dump); the relay then continues by file/position in the same epoch, appending exactly
    the bytes the peer holds (the master's events at the master's names and offsets: no new epoch, no
    ROTATE, no filler). Anything else is refused (MasterRefused) naming the peer, its master, its epoch and
    the first difference; nothing is written. Returns what the catch-up is (for /status ``peer_catch_up``).
    ``upstream_at`` is the horizon in the master's own coordinates."""
    address = master.address
    epochs = store.epochs
    mine = epochs.current if epochs.epochs else None
    own = (mine.master_dict or {}) if mine is not None and not mine.implicit else {}
    theirs = (f"the relay {address} (server_id {identity.server_id}) holds epoch {peer['epoch']} of the master "
              f"server_id {peer['server_id']}" + (f" ({peer['server_uuid']})" if peer["server_uuid"] else ""))
    ours = (f"this relay's current epoch {mine.epoch} is of the master server_id {own.get('server_id')}"
            if own else "this relay has no recorded epoch")

    def refuse(why: str) -> MasterRefused:
        return MasterRefused(f"peer catch-up refused: {theirs}; {ours}: {why}. Nothing was written; replicas "
                             "are served what is durable")

    if not own or peer["epoch"] is None:
        raise refuse("no epoch to compare")
    if int(peer["server_id"] or -1) != int(own.get("server_id") or -2) or (
            peer["server_uuid"] and own.get("server_uuid") and peer["server_uuid"] != own.get("server_uuid")):
        if int(peer["epoch"]) > mine.epoch:  # the peer followed a failover this relay has not
            raise refuse(f"a relay of another master now: it switched masters after this relay's epoch (its "
                         f"epoch {peer['epoch']}, this relay's {mine.epoch}); repoint this relay by GTID to the "
                         "master the peer follows, not to the peer")
        raise refuse("a relay of another master")
    if (int(peer["epoch"]), peer["first_file"], peer["upstream_first_file"]) != (
            mine.epoch, mine.first_file, mine.upstream_first_file):
        raise refuse(f"another epoch (it began at {peer['first_file']} <- {peer['upstream_first_file']}, this "
                     f"relay's epoch {mine.epoch} at {mine.first_file} <- {mine.upstream_first_file})")
    at = upstream_at()
    if master.unfollowed and master.log_file is not None and (
            master.log_file, master.log_pos or 4) != tuple(at):
        raise refuse(f"MASTER_LOG_FILE/MASTER_LOG_POS {master.log_file}:{master.log_pos} are not this "
                     f"relay's horizon {at[0]}:{at[1]} (a peer catch-up continues from the horizon only)")
    horizon = store.horizon.snapshot()
    difference = await compare_with_peer(master, store, horizon.file, at[0], horizon.position, server_id=server_id,
                                         connect_timeout=connect_timeout)
    if difference is not None:
        raise refuse(difference)
    return {"peer": address, "peer_server_id": identity.server_id, "epoch": mine.epoch,
            "master_server_id": own.get("server_id"), "from": f"{at[0]}:{at[1]}", "verified_bytes": horizon.position}

async def compare_with_peer(master: MasterInfo, store: RelayStore, relay_file: str, upstream_file: str, length: int,
                            *, server_id: int, connect_timeout: float) -> str | None:
    """The first difference between the peer's bytes of ``upstream_file`` and this relay's ``relay_file`` up
    to ``length`` (its horizon), read over a second connection with a non-blocking dump (the peer sends what
    it holds and ends); None when they are the same."""
    conn = await UpstreamConnection.connect(
        master.host, master.port, master.user, master.password, ssl_mode=master.ssl_mode, ssl_ca=master.ssl_ca,
        ssl_cert=master.ssl_cert, ssl_key=master.ssl_key, server_public_key=master.public_key_path,
        connect_timeout=connect_timeout, read_timeout=peer_read_timeout(master.heartbeat_period, connect_timeout))
    try:
        await conn.query("SET @master_binlog_checksum = @@global.binlog_checksum, @relayproxy_peer = 1, "
                         f"@mariadb_slave_capability = {MARIA_SLAVE_CAPABILITY_MINE}")
        flags = BINLOG_DUMP_NON_BLOCK | (BINLOG_SEND_ANNOTATE_ROWS_EVENT if conn.is_mariadb else 0)
        await conn.binlog_dump(upstream_file, 4, server_id, flags)
        at = 4
        with open(store.path(relay_file), "rb") as own:
            while at < length:
                for payload in await conn.read_packets():
                    if not payload or payload[0] == 0xFE and len(payload) < 9:
                        return (f"the peer holds {upstream_file} up to {at} only, this relay up to {length}: "
                                "it is behind this relay")
                    if payload[0] == 0xFF:
                        error = parse_err(bytes(payload))
                        return f"the peer refused the comparison dump (error {error.code}: {error.message})"
                    event = memoryview(payload)[1:]
                    if len(event) < 19:
                        return f"the peer sent a {len(event)}-byte event"
                    type_code, flags_ = event[4], struct.unpack_from("<H", event, 17)[0]
                    if flags_ & LOG_EVENT_ARTIFICIAL_F or type_code == HEARTBEAT_LOG_EVENT:
                        continue
                    own.seek(at)
                    expected = own.read(len(event))
                    if type_code == FORMAT_DESCRIPTION_EVENT and at == 4:
                        expected = fde_copy(expected, clear_in_use=True)
                    if at + len(event) > length:
                        return (f"the peer's event at {upstream_file}:{at} ends at {at + len(event)}, past this "
                                f"relay's horizon {length}: not the same transaction boundaries")
                    if bytes(event) != expected:
                        first = next((i for i, (x, y) in enumerate(zip(bytes(event), expected)) if x != y),
                                     min(len(event), len(expected)))
                        return (f"their bytes differ at {upstream_file}:{at + first} (in the event at {at}; "
                                f"{event_name(type_code)})")
                    at += len(event)
                    if at >= length:
                        break
        return None
    finally:
        conn.abort()
