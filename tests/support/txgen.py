"""Synthetic OLTP-like binlog files for the transaction index's tests and benchmark: MariaDB (GTID, BEGIN,
TABLE_MAP, row events, XID) and MySQL 8 (GTID with immediate_commit_timestamp) transactions of a few hundred bytes,
with chosen commit times and tables, built with tests/support/eventgen.py."""

from __future__ import annotations

import random
import struct

from relayproxy.binlog import constants as C

from . import eventgen as E

MARIADB_VERSION = "10.11.6-MariaDB-log"


def table_map(db: str, table: str, table_id: int = 70, **kw) -> bytes:
    body = table_id.to_bytes(6, "little") + b"\x01\x00"
    body += bytes([len(db)]) + db.encode() + b"\0" + bytes([len(table)]) + table.encode() + b"\0"
    body += b"\x03\x03\x0f\x0f\x02\x40\x00\x00"  # 3 columns: INT, VARCHAR(64), VARCHAR
    return E.event(C.TABLE_MAP_EVENT, body, **kw)


def rows(size: int, **kw) -> bytes:
    return E.event(C.WRITE_ROWS_EVENT, bytes(8) + b"\x01\x00\x02\x00\x03\xff" + bytes(max(0, size)), **kw)


def mysql_gtid(gno: int, commit_us: int, sid: bytes = E.MYSQL_SID, **kw) -> bytes:
    body = struct.pack("<B16sqBqq", 1, sid, gno, 2, gno - 1, gno)
    body += (commit_us & ((1 << 56) - 1)).to_bytes(7, "little")  # immediate_commit_timestamp (no original: same)
    body += b"\xfc" + (300).to_bytes(2, "little")  # transaction_length, packed
    body += struct.pack("<I", 80036)  # immediate_server_version
    return E.event(C.GTID_LOG_EVENT, body, **kw)


def oltp_events(n: int, *, flavour: str = "mariadb", start_seq: int = 1, start_us: int = 1_700_000_000_000_000,
                rate: float = 1000.0, tables: int = 8, seed: int = 1, jitter_back: float = 0.0,
                domain: int = 0, server_id: int = 1) -> list[tuple[bytes, dict]]:
    """``n`` transactions as (their events, facts): facts = seq, commit_us (the event time, seconds for
    MariaDB), tables. ``jitter_back``: the share of transactions whose clock steps back a little."""
    rnd = random.Random(seed)
    out = []
    us = start_us
    for i in range(n):
        us += int(rnd.expovariate(rate) * 1_000_000) + 1
        t_us = us - rnd.randint(0, 3_000_000) if jitter_back and rnd.random() < jitter_back else us
        ts = t_us // 1_000_000
        names = [f"t{rnd.randrange(tables)}" for _ in range(rnd.choice((1, 1, 1, 2)))]
        seq = start_seq + i
        kw = {"timestamp": ts, "server_id": server_id}
        if flavour == "mariadb":
            evs = [E.maria_gtid(seq, domain=domain, **kw), E.query("BEGIN", **kw)]
        else:
            evs = [mysql_gtid(seq, t_us, **kw), E.query("BEGIN", **kw)]
        for j, name in enumerate(dict.fromkeys(names)):
            evs += [table_map("app", name, 70 + j, **kw), rows(rnd.randint(60, 260), **kw)]
        evs.append(E.xid(seq, **kw))
        commit = ts * 1_000_000 if flavour == "mariadb" else t_us
        out.append((evs, {"seq": seq, "commit_us": commit,
                                    "tables": tuple(f"app.{t}" for t in dict.fromkeys(names))}))
    return out


def oltp_file(n: int, *, flavour: str = "mariadb", rotate_to: str | None = None, **kw) -> tuple[bytes, list[dict]]:
    """A whole file image of ``n`` transactions and their facts."""
    txs = oltp_events(n, flavour=flavour, **kw)
    before = kw.get("start_seq", 1) - 1  # the file continues a history of start_seq - 1 transactions
    if flavour == "mariadb":
        body = struct.pack("<I", 0) if not before else struct.pack(
            "<IIIQ", 1, kw.get("domain", 0), kw.get("server_id", 1), before)
        head = [E.event(C.MARIA_GTID_LIST_EVENT, body)]
    else:
        from relayproxy.binlog.gtid import GtidSet

        start = GtidSet()
        if before:
            start.add_interval(E.MYSQL_SID, 1, before + 1)
        head = [E.event(C.PREVIOUS_GTIDS_LOG_EVENT, start.encode())]
    tail = [E.rotate(rotate_to)] if rotate_to else []
    version = MARIADB_VERSION if flavour == "mariadb" else "8.0.36"
    image = E.binlog_file(*head, *[e for t, _ in txs for e in t], *tail, server_version=version)
    return image, [f for _, f in txs]
