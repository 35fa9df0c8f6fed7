"""Builders of synthetic binlog events and files for tests (independent of the encoders under test)."""

from __future__ import annotations

import struct
import zlib

from relayproxy.binlog import constants as C

MYSQL_SID = bytes(range(16))


def event(type_code: int, body: bytes, *, flags: int = 0, server_id: int = 1, log_pos: int = 0,
          timestamp: int = 1700000000, checksum: bool = True) -> bytes:
    size = C.HEADER_LEN + len(body) + (4 if checksum else 0)
    raw = struct.pack("<IBIIIH", timestamp, type_code, server_id, size, log_pos, flags) + body
    return raw + struct.pack("<I", zlib.crc32(raw)) if checksum else raw


def query(text: str | bytes, db: bytes = b"test", **kw) -> bytes:
    q = text.encode() if isinstance(text, str) else text
    status = b"\x00\x00\x00\x00\x00"  # Q_FLAGS2 = 0
    post = struct.pack("<IIBHH", 7, 0, len(db), 0, len(status))
    return event(C.QUERY_EVENT, post + status + db + b"\0" + q, **kw)


def gtid(gno: int, sid: bytes = MYSQL_SID, *, anonymous: bool = False, **kw) -> bytes:
    code = C.ANONYMOUS_GTID_LOG_EVENT if anonymous else C.GTID_LOG_EVENT
    body = struct.pack("<B16sqBqq", 1, bytes(16) if anonymous else sid, 0 if anonymous else gno, 2, 0, 1)
    return event(code, body, **kw)


def xid(n: int = 1, **kw) -> bytes:
    return event(C.XID_EVENT, struct.pack("<Q", n), **kw)


def intvar(**kw) -> bytes:
    return event(C.INTVAR_EVENT, struct.pack("<BQ", 2, 5), **kw)


def rand(**kw) -> bytes:
    return event(C.RAND_EVENT, struct.pack("<QQ", 1, 2), **kw)


def user_var(**kw) -> bytes:
    return event(C.USER_VAR_EVENT, struct.pack("<I", 1) + b"a" + b"\x01", **kw)


def table_map(**kw) -> bytes:
    return event(C.TABLE_MAP_EVENT, bytes(8) + b"\x04test\x00\x01t\x00\x01\x03\x00\x00", **kw)


def write_rows(**kw) -> bytes:
    return event(C.WRITE_ROWS_EVENT, bytes(10) + b"\x01\xff\x00\x01\x00\x00\x00", **kw)


def xa_prepare(one_phase: bool = False, **kw) -> bytes:
    return event(C.XA_PREPARE_LOG_EVENT, struct.pack("<BIII", int(one_phase), 1, 1, 0) + b"x", **kw)


def incident(**kw) -> bytes:
    msg = b"lost events"
    return event(C.INCIDENT_EVENT, struct.pack("<HB", 1, len(msg)) + msg, **kw)


def rotate(name: str = "binlog.000002", pos: int = 4, **kw) -> bytes:
    return event(C.ROTATE_EVENT, struct.pack("<Q", pos) + name.encode(), **kw)


def heartbeat(**kw) -> bytes:
    return event(C.HEARTBEAT_LOG_EVENT, b"binlog.000001", timestamp=0, **kw)


def previous_gtids(**kw) -> bytes:
    return event(C.PREVIOUS_GTIDS_LOG_EVENT, bytes(8), **kw)


def payload(**kw) -> bytes:
    # Header fields only; the boundary parser never decompresses.
    return event(C.TRANSACTION_PAYLOAD_EVENT, b"\x01\x01\x00\x02\x01\x00\x03\x01\x00\x00", **kw)


def unknown(type_code: int = 100, *, ignorable: bool, **kw) -> bytes:
    return event(type_code, b"padding", flags=C.LOG_EVENT_IGNORABLE_F if ignorable else 0, **kw)


def maria_gtid(seq: int, domain: int = 0, flags2: int = 0, server_id: int = 1, **kw) -> bytes:
    body = struct.pack("<QIB", seq, domain, flags2) + bytes(6)
    return event(C.MARIA_GTID_EVENT, body, server_id=server_id, **kw)


def fde(server_version: str = "8.0.36", checksum: bool = True, n_types: int = 41, flags: int = 0) -> bytes:
    """A FORMAT_DESCRIPTION_EVENT as the server of that version writes it (with or without checksum_alg)."""
    from relayproxy.binlog.events import split_version

    aware = split_version(server_version) >= ((5, 3, 0) if "MariaDB" in server_version else (5, 6, 1))
    if not aware:
        n_types = min(n_types, 27)
    post = bytearray(n_types)
    for t, n in {2: 13, 4: 8, 19: 8, 30: 10, 31: 10, 32: 10, 33: 42, 34: 42}.items():
        if t <= n_types:
            post[t - 1] = n
    body = struct.pack("<H", 4) + server_version.encode().ljust(50, b"\0") + struct.pack("<IB", 0, 19)
    body += bytes(post)
    if not aware:
        return event(C.FORMAT_DESCRIPTION_EVENT, body, flags=flags, checksum=False)
    body += bytes([1 if checksum else 0])
    return event(C.FORMAT_DESCRIPTION_EVENT, body, flags=flags, checksum=True)


def binlog_file(*events: bytes, server_version: str = "8.0.36", checksum: bool = True) -> bytes:
    """A file image: magic, FDE, then the events with log_pos set to their end offsets."""
    out = bytearray(C.BINLOG_MAGIC)
    for ev in (fde(server_version, checksum), *events):
        ev = bytearray(ev)
        struct.pack_into("<I", ev, 13, len(out) + len(ev))
        if checksum or (ev[4] == C.FORMAT_DESCRIPTION_EVENT and len(ev) > 19 + 57 + 27):
            struct.pack_into("<I", ev, len(ev) - 4, zlib.crc32(ev[:-4]))
        out += ev
    return bytes(out)
