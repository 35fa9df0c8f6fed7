"""Binlog dump sender: streams relay files to a replica as its MySQL/MariaDB master would, never past the horizon.

``serve_dump(ctx, conn, request, channel)`` answers one COM_BINLOG_DUMP / COM_BINLOG_DUMP_GTID. It
reproduces the master's side of the protocol from the servers' own sources (MySQL
``sql/rpl_binlog_sender.cc`` ``Binlog_sender``; MariaDB ``sql/sql_repl.cc`` ``mysql_binlog_send``):

* **start**: file/position checks, MySQL GTID auto-position (replica-ahead check, purged check,
  newest file whose PREVIOUS_GTIDS is a subset of the replica's set) or MariaDB GTID
  (``check_slave_start_position``, ``gtid_find_binlog_file``), each refusal with the server's error
  text as ERR 1236;
* **preamble**: artificial ROTATE, then the file's FORMAT_DESCRIPTION with the in-use flag cleared
  (``log_pos``/``created`` zeroed as the server does), at the start and after every file switch;
* **events**: the bytes of the relay files, CRC-checked as they are read, in 0x00-prefixed packets
  (plus the 0xEF semi-sync header when negotiated), never beyond ``horizon.position`` of the file the
  horizon is in: a replica only ever sees complete, durable transactions (design invariant 1);
* **GTID skipping** with MySQL's heartbeat after skipped groups, or MariaDB's per-domain skipping
  followed by a fake GTID_LIST; MariaDB capability rewriting for old replicas;
* **waiting** on the horizon (no polling), a heartbeat on every idle period, EOF for NON_BLOCK.

Errors while a relay file is open get the servers' position suffix ("; the first event '...' at
..., the last event read from '...' at ..., the last byte read from '...' at ...."). File names in
it are basenames (MariaDB prints basenames; MySQL prints its own binlog path, which for a relay
would only leak the relay directory).

Semi-sync toward replicas: every packet carries the 0xEF header, the last event of every
transaction asks for an ACK, and ACKs are recorded in the relay-wide ``SemiSyncTracker`` (see
``semi_sync_tracker``) so the upstream session can wait for N replicas before it ACKs the master.

Where things live: ``start`` (the preamble: where a dump starts), ``sender`` (the streaming loop),
``errors`` (the servers' texts), ``rewrite`` (MariaDB compatibility events), ``files`` (reading relay files),
and ``downstream/semisync.py`` (ACKs from the relay's replicas, relay-wide).
"""

from ..semisync import SemiSyncTracker, semi_sync_tracker
from .errors import eof_payload
from .rewrite import begin_event, dummy_event
from .sender import READ_CHUNK, ChunkChannel, ParkingChannel, StreamingChannel, serve_dump

__all__ = [
    "serve_dump",
    "SemiSyncTracker",
    "semi_sync_tracker",
    "ChunkChannel",
    "ParkingChannel",
    "StreamingChannel",
    "READ_CHUNK",
    "eof_payload",
    "begin_event",
    "dummy_event",
]
