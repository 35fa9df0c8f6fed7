"""A scripted MySQL 8.0 replica: the candidate `relayproxy promote` catches up, promotes, and repoints relays to.

It is a ``FakeMySQLMaster`` (tests/support/fakemaster.py: handshake, auth, result sets, binlog dumps of its own files) with
a replica's side added:

* the statements an HA tool sends, in the words of its version: ``SELECT @@version / @@server_id /
  @@GLOBAL.gtid_executed / @@GLOBAL.read_only``, ``SHOW GLOBAL VARIABLES LIKE 'super_read_only'``,
  ``SHOW REPLICA STATUS`` (8.0.22+, MySQL 8.0's column names) and ``SHOW SLAVE STATUS`` (the old names),
  ``STOP|START REPLICA|SLAVE [IO_THREAD|SQL_THREAD]``, ``CHANGE REPLICATION SOURCE TO SOURCE_...`` (8.0.23+) and
  ``CHANGE MASTER TO MASTER_...``, ``RESET REPLICA|SLAVE ALL``, ``SET GLOBAL read_only / super_read_only`` (with
  MySQL's coupling of the two); a statement it does not know answers 1064, one its version lacks too;
* a replication link that works as a MySQL IO thread does: on START REPLICA an OS thread logs into the source with
  PyMySQL, sends the queries a MySQL 8.0 IO thread sends (server id and UUID checks, heartbeat period, checksum,
  gtid_mode), COM_REGISTER_SLAVE and COM_BINLOG_DUMP_GTID with the GTID set it has executed (SOURCE_AUTO_POSITION=1
  only), verifies every event's CRC32, and cuts the stream into transactions by hand (struct on the event
  headers, not relayproxy's parser); a link that breaks is retried every ``connect_retry`` seconds ("Connecting",
  Last_IO_Errno/Last_IO_Error as MySQL words them), a 1236 from the source stops the IO thread;
* "apply" is synchronous with the receipt: each complete transaction whose GTID it has not executed is added to
  ``gtid_executed``, its statements to ``statements`` (the data check), and its events, log_pos rewritten, to
  its own binlog (log_replica_updates = ON), which the master side serves: a relay repointed here by GTID dumps
  from that binlog. ``commit()`` writes its own transactions once it is writable (1290 while read-only).

The executed set is kept as Python sets of numbers and printed by ``fakemaster._gtid_text``: independent of
relayproxy's ``GtidSet`` (the master side's dump cursor still uses it to serve the files).

Scripted, not simulated: no SQL thread lag, no relay log on disk, no multi-source channels, no tagged GTIDs, no
compressed transaction payloads, no TLS.
"""

from __future__ import annotations

import asyncio
import re
import socket
import struct
import threading
import uuid
import zlib
from dataclasses import dataclass, field

import pymysql

from relayproxy.binlog import constants as C
from relayproxy.wire.packets import encode_packet

from . import eventgen as E
from .fakemaster import FakeMySQLMaster, _gtid_text
from ..downstream.test_downstream_sql import MYSQL80_REPLICA_COLUMNS

ER_PARSE_ERROR = 1064
ER_UNKNOWN_SYSTEM_VARIABLE = 1193
ER_SLAVE_MUST_STOP = 1198  # "This operation cannot be performed with a running replica; run STOP REPLICA first"
ER_BAD_SLAVE = 1200  # "The server is not configured as replica; fix in config file or with CHANGE REPLICATION ..."
ER_OPTION_PREVENTS_STATEMENT = 1290
ER_SLAVE_CHANNEL_IO_THREAD_MUST_STOP = 3021
ER_SERVER_SOURCE_FATAL_ERROR_READING_BINLOG = 13114
ER_NETWORK_READ_EVENT_CHECKSUM_FAILURE = 1743

HEADER = struct.Struct("<IBIIIH")  # timestamp, type, server_id, event_size, log_pos, flags
COM_REGISTER_SLAVE = 0x15
COM_BINLOG_DUMP_GTID = 0x1E

# SHOW REPLICA STATUS as MySQL 8.0.36 names its columns, in its order; SHOW SLAVE STATUS has the old names.
REPLICA_COLUMNS = MYSQL80_REPLICA_COLUMNS
_INT_COLUMNS = {"Source_Port", "Connect_Retry", "Read_Source_Log_Pos", "Relay_Log_Pos", "Last_Errno", "Skip_Counter",
                "Exec_Source_Log_Pos", "Relay_Log_Space", "Until_Log_Pos", "Last_IO_Errno", "Last_SQL_Errno",
                "Source_Server_Id", "SQL_Delay", "Source_Retry_Count", "Auto_Position", "Get_Source_public_key"}


def old_name(column: str) -> str:
    """The pre-8.0.22 name of a SHOW REPLICA STATUS column (SHOW SLAVE STATUS)."""
    special = {"Get_Source_public_key": "Get_master_public_key", "Source_public_key_path": "Master_public_key_path"}
    return special.get(column) or column.replace("Source", "Master").replace("Replica_", "Slave_")


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(re.match(r"\d*", p).group() or 0) for p in version.split("-")[0].split(".")[:3])


# -- GTIDs as Python sets of numbers -----------------------------------------------------------------------------------


Numbers = dict[str, set[int]]  # server_uuid -> {gno}


def gtid_bytes(numbers: Numbers) -> bytes:
    """MySQL's binary GTID set (COM_BINLOG_DUMP_GTID data, PREVIOUS_GTIDS body), untagged: n_sids, then per SID in
    byte order the SID, n_intervals and [start, end) pairs."""
    sids = sorted((s for s, g in numbers.items() if g), key=lambda s: uuid.UUID(s).bytes)
    out = struct.pack("<Q", len(sids))
    for sid in sids:
        runs: list[list[int]] = []
        for n in sorted(numbers[sid]):
            if runs and runs[-1][1] == n:
                runs[-1][1] = n + 1
            else:
                runs.append([n, n + 1])
        out += uuid.UUID(sid).bytes + struct.pack("<Q", len(runs)) + b"".join(struct.pack("<qq", *r) for r in runs)
    return out


def gtid_text(numbers: Numbers) -> str:
    """MySQL's text of a set, ',\\n' between UUIDs as @@gtid_executed prints it."""
    return _gtid_text({(sid, ""): gnos for sid, gnos in numbers.items()}).replace(",", ",\n")


# -- binlog files built by hand ----------------------------------------------------------------------------------------


def parse_numbers(text: str) -> Numbers:
    """``uuid:1-5:7,uuid2:3`` as ``uuid -> {gno}`` (untagged sets only): its own parser, not relayproxy's."""
    out: Numbers = {}
    for element in text.replace("\n", "").split(","):
        element = element.strip()
        if not element:
            continue
        sid, *ranges = element.split(":")
        gnos = out.setdefault(str(uuid.UUID(sid.strip())), set())
        for part in ranges:
            first, _, last = part.partition("-")
            gnos.update(range(int(first), int(last or first) + 1))
    return out


def seal(ev: bytes | bytearray, *, log_pos: int, server_id: int | None = None) -> bytes:
    """An event with its log_pos (and server_id) set and its CRC32 recomputed."""
    ev = bytearray(ev)
    struct.pack_into("<I", ev, 13, log_pos)
    if server_id is not None:
        struct.pack_into("<I", ev, 5, server_id)
    struct.pack_into("<I", ev, len(ev) - 4, zlib.crc32(ev[:-4]))
    return bytes(ev)


def transaction_events(sid: str, gno: int, statement: str) -> list[bytes]:
    """GTID, BEGIN, the statement, XID: one transaction as MySQL 8.0 logs it (statement text as a QUERY event)."""
    return [E.gtid(gno, uuid.UUID(sid).bytes), E.query("BEGIN"), E.query(statement), E.xid(gno)]


def insert_statement(sid: str, gno: int) -> str:
    return f"INSERT INTO t VALUES ('{sid[:8]}', {gno})"


def binlog_image(server_id: int, previous: Numbers, transactions: list[tuple[str, int, int]], *,
                 version: str = "8.0.36") -> bytes:
    """A MySQL 8.0.36 binlog: FDE, PREVIOUS_GTIDS, then (uuid, gno, origin server_id) transactions, each an INSERT
    (``insert_statement``)."""
    out = bytearray(C.BINLOG_MAGIC)
    for ev in (E.fde(version), E.event(C.PREVIOUS_GTIDS_LOG_EVENT, gtid_bytes(previous))):
        out += seal(ev, log_pos=len(out) + len(ev), server_id=server_id)
    for sid, gno, origin in transactions:
        for ev in transaction_events(sid, gno, insert_statement(sid, gno)):
            out += seal(ev, log_pos=len(out) + len(ev), server_id=origin)
    return bytes(out)


def transaction_spans(image: bytes) -> dict[tuple[str, int], tuple[int, int]]:
    """(uuid, gno) -> (start, end) of each transaction in a file built by ``binlog_image``."""
    spans, off, current = {}, 4, None
    while off + 19 <= len(image):
        _ts, type_code, _sid, size, _pos, _flags = HEADER.unpack_from(image, off)
        if type_code == C.GTID_LOG_EVENT:
            sid = str(uuid.UUID(bytes=image[off + 20: off + 36]))
            current = ((sid, struct.unpack_from("<q", image, off + 36)[0]), off)
        elif type_code == C.XID_EVENT and current:
            spans[current[0]] = (current[1], off + size)
            current = None
        off += size
    return spans


# -- the replica's state -----------------------------------------------------------------------------------------------


@dataclass
class Source:
    """What CHANGE REPLICATION SOURCE TO set (mysql.slave_master_info) and what the threads report."""

    host: str = ""
    port: int = 3306
    user: str = ""
    password: str = ""
    auto_position: int = 0
    connect_retry: int = 60
    delay: int = 0
    io: str = "No"  # Replica_IO_Running: No, Connecting, Yes
    sql: str = "No"
    io_state: str = ""
    source_server_id: int = 0
    source_uuid: str = ""
    source_log_file: str = ""
    read_pos: int = 4
    exec_file: str = ""
    exec_pos: int = 0
    io_errno: int = 0
    io_error: str = ""
    retrieved: Numbers = field(default_factory=dict)


class _LinkStopped(Exception):
    pass


class _Fatal(Exception):
    def __init__(self, errno: int, message: str):
        super().__init__(message)
        self.errno, self.message = errno, message


class FakeMySQLReplica(FakeMySQLMaster):
    """A MySQL 8.0 server on 127.0.0.1 that replicates (by GTID) and can be promoted; see the module docstring.

    ``accounts`` are the users it accepts (mysql_native_password), for the HA tool and for replicas of it.
    ``executed`` is what it holds at start, as (uuid, gno, origin server_id) transactions in its own binlog."""

    def __init__(self, *, server_id: int, server_uuid: str, accounts: dict[str, str],
                 executed: list[tuple[str, int, int]] = (), version: str = "8.0.36", read_only: bool = True,
                 connect_retry: float = 0.1, heartbeat: float = 0.25, net_timeout: float = 3.0,
                 binlog_name: str = "mysql-bin.000001", port: int = 0):
        image = binlog_image(server_id, {}, list(executed), version=version)
        super().__init__([(binlog_name, image)], server_id=server_id, server_uuid=server_uuid, version=version,
                         port=port)
        self.accounts = {user: pw.encode() for user, pw in accounts.items()}
        self.executed: Numbers = {}
        self.statements: list[tuple[str, str]] = []  # (gtid, statement) in the order applied or committed
        for sid, gno, _origin in executed:
            self.executed.setdefault(sid, set()).add(gno)
            self.statements.append((f"{sid}:{gno}", insert_statement(sid, gno)))
        self.read_only = read_only
        self.super_read_only = read_only
        self.parallel_workers = 4  # replica_parallel_workers (MySQL 8.0.27's default); applying stays serial here
        self.source: Source | None = None
        self.admin_log: list[str] = []  # every STOP/START/CHANGE/RESET/SET GLOBAL it was sent, in order
        self.connect_retry = connect_retry  # seconds; MySQL's SOURCE_CONNECT_RETRY is whole seconds (default 60)
        self.heartbeat = heartbeat
        self.net_timeout = net_timeout  # replica_net_timeout
        self._generation = 0  # a START REPLICA starts a generation; what an older IO thread reports is dropped
        self._link: _Link | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> FakeMySQLReplica:
        self._loop = asyncio.get_running_loop()
        await super().start()
        return self

    async def stop(self) -> None:
        link = self._link
        self._stop_link()
        if link is not None:
            await asyncio.to_thread(link.thread.join, 10)
        await super().stop()

    # -- what tests read and do ----------------------------------------------------------------------------------------

    @property
    def gtid_executed(self) -> str:
        """@@GLOBAL.gtid_executed on one line."""
        return gtid_text(self.executed).replace("\n", "")

    def served_gtids(self) -> str:
        """What the master side's files hold (computed by fakemaster with GtidSet): must equal gtid_executed."""
        return self.index.executed().format(",")

    def commit(self, count: int, statement: str = "INSERT INTO t VALUES ('new', {gno})", *, sid: str | None = None,
               read_only_off: bool = False) -> list[str]:
        """``count`` transactions of its own, as a client writing to it; refused while read-only. ``sid`` and
        ``read_only_off`` script an errant write: under another UUID (a server_uuid it had before, say), by someone
        who turned read_only off for a moment."""
        if (self.read_only or self.super_read_only) and not read_only_off:
            option = "--super-read-only" if self.super_read_only else "--read-only"
            raise pymysql.err.OperationalError(ER_OPTION_PREVENTS_STATEMENT, f"The MySQL server is running with the "
                                               f"{option} option so it cannot execute this statement")
        done = []
        for _ in range(count):
            uuid_ = sid or self.server_uuid
            mine = self.executed.setdefault(uuid_, set())
            gno = next(n for n in range(1, len(mine) + 2) if n not in mine)  # the lowest unused number
            text = statement.format(gno=gno)
            self._write_transaction([bytes(e) for e in transaction_events(uuid_, gno, text)], origin=self.server_id)
            mine.add(gno)
            self.statements.append((f"{uuid_}:{gno}", text))
            done.append(f"{uuid_}:{gno}")
        return done

    def _write_transaction(self, events: list[bytes], origin: int | None) -> None:
        """Append to the active binlog at its own offsets (log_replica_updates keeps the origin's server_id)."""
        active = self.index.files[-1]
        data = bytearray()
        for ev in events:
            data += seal(ev, log_pos=active.size + len(data) + len(ev), server_id=origin)
        self.append(bytes(data))

    # -- logins: several accounts ---------------------------------------------------------------------------------

    def _parse_response(self, response: bytes, log) -> int:
        # FakeMySQLMaster checks log.user against self.user/self.password right after this call, with no await in
        # between: point them at the account the client names (an unknown name gets an account nobody has).
        caps = super()._parse_response(response, log)
        self.user = log.user if log.user in self.accounts else "\0no such account"
        self.password = self.accounts.get(log.user, b"")
        return caps

    # -- statements ----------------------------------------------------------------------------------------------------

    def _query_reply(self, sql: str, log, caps: int) -> bytes:
        text = " ".join(sql.strip().rstrip(";").split())
        upper = text.upper()
        try:
            answer = self._replica_statement(text, upper, caps)
        except _Fatal as exc:
            return self._error(exc.errno, "HY000", exc.message)
        return answer if answer is not None else super()._query_reply(sql, log, caps)

    def _new_terms(self, since: tuple[int, ...]) -> bool:
        return version_tuple(self.version) >= since

    def _replica_statement(self, text: str, upper: str, caps: int) -> bytes | None:
        ok = b"\x00\x00\x00\x02\x00\x00\x00"
        select = re.fullmatch(r"SELECT @@(GLOBAL\.)?(\w+)", text, re.IGNORECASE)
        if select:
            name = select.group(2).lower()
            values = {"version": self.version, "server_id": self.server_id, "server_uuid": self.server_uuid,
                      "gtid_executed": gtid_text(self.executed), "read_only": int(self.read_only),
                      "super_read_only": int(self.super_read_only), "gtid_mode": "ON",
                      "replica_parallel_workers": self.parallel_workers}
            if name not in values:
                return None  # the master side's answers (relays ask for its variables)
            value = values[name]
            return self._typed_result([text.split(" ", 1)[1]], [[value]], caps, ints={0} if isinstance(value, int)
                                      else set())
        show = re.fullmatch(r"SHOW (?:GLOBAL )?VARIABLES LIKE '(\w+)'", text, re.IGNORECASE)
        if show and show.group(1).lower() in ("read_only", "super_read_only"):
            name = show.group(1).lower()
            value = self.read_only if name == "read_only" else self.super_read_only
            return self._typed_result(["Variable_name", "Value"], [[name, "ON" if value else "OFF"]], caps)
        if upper in ("SHOW REPLICA STATUS", "SHOW SLAVE STATUS"):
            new = upper == "SHOW REPLICA STATUS"
            if new and not self._new_terms((8, 0, 22)):
                raise _Fatal(ER_PARSE_ERROR, f"You have an error in your SQL syntax near '{text[5:]}'")
            return self._replica_status(new, caps)
        words = upper.split()
        admin = words[:1] in (["STOP"], ["START"], ["RESET"], ["CHANGE"])
        if admin or upper.startswith(("SET GLOBAL", "SET @@GLOBAL")):
            self.admin_log.append(text)
        if words[:1] in (["STOP"], ["START"]) and len(words) >= 2 and words[1] in ("REPLICA", "SLAVE"):
            if words[1] == "REPLICA" and not self._new_terms((8, 0, 22)):
                raise _Fatal(ER_PARSE_ERROR, f"You have an error in your SQL syntax near '{text}'")
            threads = {w.strip(",") for w in words[2:]}
            if not threads <= {"IO_THREAD", "SQL_THREAD"} or (words[0] == "START" and threads):
                raise _Fatal(ER_PARSE_ERROR, f"You have an error in your SQL syntax near '{text}'")  # scripted subset
            if words[0] == "STOP":
                self._stop_replica(io="IO_THREAD" in threads or not threads, sql="SQL_THREAD" in threads or not threads)
            else:
                self._start_replica()
            return encode_ok(ok)
        if upper in ("RESET REPLICA ALL", "RESET SLAVE ALL"):
            if upper.startswith("RESET REPLICA") and not self._new_terms((8, 0, 22)):
                raise _Fatal(ER_PARSE_ERROR, f"You have an error in your SQL syntax near '{text}'")
            if self.source is not None and (self.source.io != "No" or self.source.sql != "No"):
                raise _Fatal(ER_SLAVE_MUST_STOP, "This operation cannot be performed with a running replica; run "
                             "STOP REPLICA first")
            self.source = None
            return encode_ok(ok)
        change = re.fullmatch(r"CHANGE (REPLICATION SOURCE|MASTER) TO (.+)", text, re.IGNORECASE)
        if change:
            self._change_source(change.group(1).upper() != "MASTER", change.group(2), text)
            return encode_ok(ok)
        purged = re.fullmatch(r"SET (?:GLOBAL |@@GLOBAL\.)gtid_purged\s*=\s*'(\+?)([^']*)'", text, re.IGNORECASE)
        if purged:  # MySQL 8.0: the whole set on an empty gtid_executed, or '+set' disjoint from it
            plus, value = purged.groups()
            try:
                numbers = parse_numbers(value)
            except ValueError:
                raise _Fatal(1772, f"Malformed GTID set specification '{value}'.") from None
            held = {sid: gnos for sid, gnos in self.executed.items() if gnos}
            if not plus and held:
                raise _Fatal(3546, "@@GLOBAL.GTID_PURGED cannot be changed: the new value must be a superset of the "
                             "old value")
            if any(held.get(sid, set()) & gnos for sid, gnos in numbers.items()):
                raise _Fatal(3546, "@@GLOBAL.GTID_PURGED cannot be changed: the added gtid set must not overlap "
                             "with @@GLOBAL.GTID_EXECUTED")
            for sid, gnos in numbers.items():
                self.executed.setdefault(sid, set()).update(gnos)
            return encode_ok(ok)
        assignment = re.fullmatch(r"SET (?:GLOBAL |@@GLOBAL\.)(\w+)\s*=\s*(\w+)", text, re.IGNORECASE)
        if assignment:
            name, value = assignment.group(1).lower(), assignment.group(2).upper()
            if name == "replica_parallel_workers" and value.isdigit() and int(value) <= 1024:
                self.parallel_workers = int(value)
                return encode_ok(ok)
            if name not in ("read_only", "super_read_only"):
                raise _Fatal(ER_UNKNOWN_SYSTEM_VARIABLE, f"Unknown system variable '{name}'")
            on = {"1": True, "ON": True, "TRUE": True, "0": False, "OFF": False, "FALSE": False}.get(value)
            if on is None:
                raise _Fatal(1231, f"Variable '{name}' can't be set to the value of '{value}'")
            if name == "read_only":
                self.read_only = on
                if not on:
                    self.super_read_only = False  # MySQL: read_only = OFF turns super_read_only off too
            else:
                self.super_read_only = on
                if on:
                    self.read_only = True  # and super_read_only = ON turns read_only on
            return encode_ok(ok)
        if words[:1] in (["STOP"], ["START"], ["RESET"], ["CHANGE"]):
            raise _Fatal(ER_PARSE_ERROR, f"You have an error in your SQL syntax near '{text[:60]}'")
        return None

    def _change_source(self, new_words: bool, options: str, text: str) -> None:
        if new_words and not self._new_terms((8, 0, 23)):
            raise _Fatal(ER_PARSE_ERROR, f"You have an error in your SQL syntax near '{text[:60]}'")
        word = "SOURCE" if new_words else "MASTER"
        pairs = re.findall(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\d+)\s*(?:,|$)", options)
        if ", ".join(f"{k}={v}" for k, v in pairs).replace(" ", "") != options.replace(" ", ""):
            raise _Fatal(ER_PARSE_ERROR, f"You have an error in your SQL syntax near '{options[:60]}'")
        source = self.source or Source()
        if source.io != "No":
            raise _Fatal(ER_SLAVE_CHANNEL_IO_THREAD_MUST_STOP, "This operation cannot be performed with a running "
                         "replica io thread; run STOP REPLICA IO_THREAD FOR CHANNEL '' first.")
        known = {"HOST": "host", "PORT": "port", "USER": "user", "PASSWORD": "password",
                 "AUTO_POSITION": "auto_position", "CONNECT_RETRY": "connect_retry", "DELAY": "delay"}
        changed = {}
        for key, value in pairs:
            if key.upper() == f"GET_{word}_PUBLIC_KEY" and self._new_terms((8, 0, 4)):
                changed["get_public_key"] = int(value)
                continue
            head, _, option = key.upper().partition("_")
            if head != word or option not in known:
                raise _Fatal(ER_PARSE_ERROR, f"You have an error in your SQL syntax near '{key}'")
            if value.startswith("'"):
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            else:
                value = int(value)
            changed[known[option]] = value
        if "delay" in changed and source.sql != "No":
            raise _Fatal(ER_SLAVE_MUST_STOP, "This operation cannot be performed with a running replica sql thread; "
                         "run STOP REPLICA SQL_THREAD first")
        if ("host" in changed or "port" in changed) and (changed.get("host", source.host), changed.get(
                "port", source.port)) != (source.host, source.port):
            source.source_log_file, source.read_pos, source.exec_file, source.exec_pos = "", 4, "", 0
            source.retrieved = {}
        for name, value in changed.items():
            setattr(source, name, value)
        self.source = source

    def _replica_status(self, new: bool, caps: int) -> bytes:
        s = self.source
        if s is None:
            return self._typed_result([c if new else old_name(c) for c in REPLICA_COLUMNS], [], caps)
        values = {c: "" for c in REPLICA_COLUMNS}
        values.update({
            "Replica_IO_State": s.io_state, "Source_Host": s.host, "Source_User": s.user, "Source_Port": s.port,
            "Connect_Retry": s.connect_retry, "Source_Log_File": s.source_log_file, "Read_Source_Log_Pos": s.read_pos,
            "Relay_Log_File": "relay-bin.000002", "Relay_Log_Pos": 4, "Relay_Source_Log_File": s.exec_file,
            "Replica_IO_Running": s.io, "Replica_SQL_Running": s.sql, "Last_Errno": 0, "Skip_Counter": 0,
            "Exec_Source_Log_Pos": s.exec_pos, "Relay_Log_Space": 0, "Until_Condition": "None", "Until_Log_Pos": 0,
            "Source_SSL_Allowed": "No", "Seconds_Behind_Source": 0 if s.sql == "Yes" and s.io == "Yes" else None,
            "Source_SSL_Verify_Server_Cert": "No", "Last_IO_Errno": s.io_errno, "Last_IO_Error": s.io_error,
            "Last_SQL_Errno": 0, "Source_Server_Id": s.source_server_id, "Source_UUID": s.source_uuid,
            "Source_Info_File": "mysql.slave_master_info", "SQL_Delay": s.delay, "SQL_Remaining_Delay": None,
            "Replica_SQL_Running_State": "Replica has read all relay log; waiting for more updates"
            if s.sql == "Yes" else "", "Source_Retry_Count": 86400,
            "Retrieved_Gtid_Set": gtid_text(s.retrieved), "Executed_Gtid_Set": gtid_text(self.executed),
            "Auto_Position": s.auto_position, "Get_Source_public_key": 0,
        })
        names = [c if new else old_name(c) for c in REPLICA_COLUMNS]
        ints = {i for i, c in enumerate(REPLICA_COLUMNS) if c in _INT_COLUMNS}
        return self._typed_result(names, [[values[c] for c in REPLICA_COLUMNS]], caps, ints=ints)

    def _typed_result(self, columns: list[str], rows: list[list], caps: int, ints: set[int] = frozenset()) -> bytes:
        """A text result set whose integer columns say LONGLONG (as MySQL's do), so a client reads ints."""
        raw = bytearray(self._result(columns, rows, caps))
        # Column definitions are packets 2 .. len(columns)+1; each ends with 0x0c, charset (2), length (4), type (1),
        # flags (2), decimals (1) and two zero bytes.
        off = 0
        while off < len(raw):
            size = int.from_bytes(raw[off: off + 3], "little")
            seq = raw[off + 3]
            if 2 <= seq <= len(columns) + 1 and (seq - 2) in ints:
                raw[off + 4 + size - 13 + 7] = 0x08  # MYSQL_TYPE_LONGLONG
            off += 4 + size
        return bytes(raw)

    # -- the replication threads ---------------------------------------------------------------------------------------

    def _start_replica(self) -> None:
        s = self.source
        if s is None or not s.host:
            raise _Fatal(ER_BAD_SLAVE, "The server is not configured as replica; fix in config file or with CHANGE "
                         "REPLICATION SOURCE TO")
        if s.sql == "No":
            s.sql = "Yes"
        if s.io != "No":
            return  # already running: MySQL answers OK with a warning
        if not s.auto_position:
            raise _Fatal(ER_PARSE_ERROR, "this scripted replica replicates by SOURCE_AUTO_POSITION=1 only")
        s.io, s.io_state, s.io_errno, s.io_error = "Connecting", "Connecting to source", 0, ""
        self._generation += 1
        self._link = _Link(self, self._generation, s)
        self._link.thread.start()

    def _stop_replica(self, *, io: bool, sql: bool) -> None:
        s = self.source
        if io:
            self._stop_link()
            if s is not None:
                s.io, s.io_state = "No", ""
        if sql and s is not None:
            s.sql = "No"

    def _stop_link(self) -> None:
        self._generation += 1  # whatever the old IO thread still reports is dropped from now on
        link, self._link = self._link, None
        if link is not None:
            link.stop()

    # called on the loop by the IO thread (through _Link.report / _Link.apply)

    def _report(self, generation: int, **fields) -> None:
        if generation == self._generation and self.source is not None:
            for name, value in fields.items():
                setattr(self.source, name, value)

    def _apply(self, generation: int, sid: str, gno: int, events: list[bytes], statements: list[str],
               read: tuple[str, int]) -> bool:
        if generation != self._generation or self.source is None:
            return False
        s = self.source
        s.retrieved.setdefault(sid, set()).add(gno)
        if s.sql == "Yes" and gno not in self.executed.get(sid, set()):  # an executed GTID is skipped, as on MySQL
            self._write_transaction(events, origin=None)
            self.executed.setdefault(sid, set()).add(gno)
            self.statements.extend((f"{sid}:{gno}", q) for q in statements)
        s.source_log_file, s.read_pos = read
        s.exec_file, s.exec_pos = read
        return True


def encode_ok(ok: bytes) -> bytes:
    return encode_packet(ok, 1)


class _Link:
    """One IO thread (with its SQL thread folded in): an OS thread with a blocking PyMySQL connection."""

    def __init__(self, replica: FakeMySQLReplica, generation: int, source: Source):
        self.replica, self.generation = replica, generation
        self.loop = replica._loop
        self.host, self.port, self.user, self.password = source.host, source.port, source.user, source.password
        self.stopping = threading.Event()
        self.conn: pymysql.connections.Connection | None = None
        self.thread = threading.Thread(target=self._main, name=f"fake-replica-io-{replica.server_id}", daemon=True)
        self.attempts = 0
        self.logged_in = False

    def stop(self) -> None:
        self.stopping.set()
        conn = self.conn
        if conn is not None and conn._sock is not None:
            try:
                conn._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- to the loop ---------------------------------------------------------------------------------------------------

    def report(self, **fields) -> None:
        try:
            self.loop.call_soon_threadsafe(lambda: self.replica._report(self.generation, **fields))
        except RuntimeError:  # the loop is gone: the test is over
            self.stopping.set()

    def apply(self, *args) -> None:
        async def on_loop():
            return self.replica._apply(self.generation, *args)

        try:
            applied = asyncio.run_coroutine_threadsafe(on_loop(), self.loop).result(10)
        except (RuntimeError, TimeoutError, asyncio.CancelledError):
            applied = False
        if not applied:
            raise _LinkStopped()

    # -- the thread ----------------------------------------------------------------------------------------------------

    def _main(self) -> None:
        while not self.stopping.is_set():
            self.attempts += 1
            try:
                self._session()
            except _LinkStopped:
                break
            except _Fatal as exc:
                self.report(io="No", io_state="", io_errno=exc.errno, io_error=exc.message)
                break
            except (pymysql.MySQLError, OSError, struct.error) as exc:
                if self.stopping.is_set():
                    break
                code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 2013
                message = exc.args[1] if len(exc.args) > 1 else str(exc)
                if self.conn is None or not self.logged_in:
                    error = (f"Error connecting to source '{self.user}@{self.host}:{self.port}'. This was attempt "
                             f"{self.attempts}/86400, with a delay of {self.replica.connect_retry} seconds between "
                             f"attempts. Message: {message}")
                else:
                    error = f"Error reading packet from server for channel '': {message} ({code})"
                self.report(io="Connecting", io_state="Reconnecting after a failed source event read"
                            if self.logged_in else "Connecting to source", io_errno=code, io_error=error)
            finally:
                if self.conn is not None:
                    try:
                        self.conn.close()
                    except Exception:  # noqa: BLE001 - a broken socket closes as it can
                        pass
                    self.conn = None
            self.stopping.wait(self.replica.connect_retry)

    def _session(self) -> None:
        replica = self.replica
        self.logged_in = False
        self.conn = pymysql.connect(host=self.host, port=self.port, user=self.user, password=self.password,
                                    connect_timeout=2, read_timeout=replica.net_timeout, autocommit=True)
        if self.stopping.is_set():
            raise _LinkStopped()
        self.logged_in = True
        cur = self.conn.cursor()

        def value(statement: str):
            cur.execute(statement)
            row = cur.fetchone()
            return row[0] if row else None

        value("SELECT UNIX_TIMESTAMP()")
        source_id = int(value("SELECT @@GLOBAL.SERVER_ID"))
        if source_id == replica.server_id:
            raise _Fatal(13117, "Fatal error: The replica I/O thread stops because source and replica have equal "
                         "MySQL server ids; these ids must be different for replication to work")
        period = int(replica.heartbeat * 1e9)
        cur.execute(f"SET @master_heartbeat_period = {period}, @source_heartbeat_period = {period}")
        cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum, "
                    "@source_binlog_checksum = @@global.binlog_checksum")
        checksum = str(value("SELECT @master_binlog_checksum") or "NONE").upper() == "CRC32"
        source_uuid = str(value("SELECT @@GLOBAL.SERVER_UUID"))
        if source_uuid == replica.server_uuid:
            raise _Fatal(13117, "Fatal error: The replica I/O thread stops because source and replica have equal "
                         "MySQL server UUIDs; these UUIDs must be different for replication to work")
        cur.execute(f"SET @slave_uuid = '{replica.server_uuid}', @replica_uuid = '{replica.server_uuid}'")
        if str(value("SELECT @@GLOBAL.GTID_MODE")).upper() != "ON":
            raise _Fatal(13117, "The replication receiver thread cannot start because the source has GTID_MODE = OFF "
                         "and this server has GTID_MODE = ON")
        self.report(source_server_id=source_id, source_uuid=source_uuid)
        register = (struct.pack("<I", replica.server_id) + bytes([9]) + b"127.0.0.1" + bytes([len(self.user)])
                    + self.user.encode() + b"\0" + struct.pack("<HII", replica.port, 0, 0))
        self.conn._execute_command(COM_REGISTER_SLAVE, register)
        self.conn._read_ok_packet()
        # what it has executed, read on the loop (the IO thread asks the server for gtid_executed ∪ retrieved)
        executed = asyncio.run_coroutine_threadsafe(self._executed(), self.loop).result(10)
        data = gtid_bytes(executed)
        dump = struct.pack("<HII", 0, replica.server_id, 0) + struct.pack("<QI", 4, len(data)) + data
        self.conn._execute_command(COM_BINLOG_DUMP_GTID, dump)
        self.report(io="Yes", io_state="Waiting for source to send event", io_errno=0, io_error="")
        self._stream(checksum)

    async def _executed(self) -> Numbers:
        return {sid: set(gnos) for sid, gnos in self.replica.executed.items()}

    def _stream(self, checksum: bool) -> None:
        file, pending = "", None  # pending: (sid, gno, events, statements, began)
        while not self.stopping.is_set():
            try:
                packet = self.conn._read_packet()
            except pymysql.err.OperationalError as exc:
                if exc.args and exc.args[0] == 1236:
                    raise _Fatal(ER_SERVER_SOURCE_FATAL_ERROR_READING_BINLOG, "Got fatal error 1236 from source when "
                                 f"reading data from binary log: '{exc.args[1]}'") from None
                raise
            data = packet.get_all_data()
            if data[:1] == b"\xfe" and len(data) < 9:
                raise OSError("the source ended the dump (EOF packet)")
            ev = bytes(data[1:])
            _ts, type_code, _sid, size, log_pos, flags = HEADER.unpack_from(ev)
            if size != len(ev):
                raise _Fatal(ER_NETWORK_READ_EVENT_CHECKSUM_FAILURE, f"event size {size} but {len(ev)} bytes arrived")
            if checksum and not self._crc_ok(ev, type_code, flags):
                raise _Fatal(ER_NETWORK_READ_EVENT_CHECKSUM_FAILURE, "Replication event checksum verification failed "
                             f"while reading from network (event type {type_code} ending at {log_pos}).")
            body = ev[C.HEADER_LEN: len(ev) - (4 if checksum else 0)]
            if type_code == C.ROTATE_EVENT:
                file = body[8:].decode()
                self.position(file, struct.unpack_from("<Q", body)[0], idle=pending is None)
                continue
            if type_code in (C.HEARTBEAT_LOG_EVENT, C.HEARTBEAT_LOG_EVENT_V2):
                if type_code == C.HEARTBEAT_LOG_EVENT:
                    self.position(body.decode(), log_pos, idle=pending is None)
                continue
            if type_code in (C.FORMAT_DESCRIPTION_EVENT, C.PREVIOUS_GTIDS_LOG_EVENT):
                continue
            if type_code == C.GTID_LOG_EVENT:
                # a transaction cut short before this one is dropped, as MySQL's applier rolls it back
                sid = str(uuid.UUID(bytes=body[1:17]))
                pending = (sid, struct.unpack_from("<q", body, 17)[0], [ev], [], False)
                continue
            if type_code in (C.ANONYMOUS_GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT, C.TRANSACTION_PAYLOAD_EVENT):
                raise _Fatal(13117, f"this scripted replica does not apply event type {type_code}")
            if pending is None:
                if log_pos:
                    self.position(file, log_pos, idle=True)
                continue  # outside any transaction (a STOP event, an INCIDENT...): nothing to apply
            if log_pos:
                self.position(file, log_pos, idle=False)
            sid, gno, events, statements, began = pending
            events.append(ev)
            ends = False
            if type_code == C.XID_EVENT:
                ends = True
            elif type_code == C.QUERY_EVENT:
                query = self._query_text(body)
                if query == "BEGIN":
                    began = True
                elif query == "COMMIT" or not began:
                    ends = True  # COMMIT, or a DDL statement (its own transaction)
                if query not in ("BEGIN", "COMMIT"):
                    statements.append(query)
            pending = (sid, gno, events, statements, began)
            if ends:
                self.apply(sid, gno, events, statements, (file, log_pos))
                pending = None

    def position(self, file: str, pos: int, *, idle: bool) -> None:
        """Read_Source_Log_Pos; with no transaction open the applier is there too (Exec_Source_Log_Pos)."""
        fields = {"source_log_file": file, "read_pos": pos}
        if idle:
            fields.update(exec_file=file, exec_pos=pos)
        self.report(**fields)

    @staticmethod
    def _crc_ok(ev: bytes, type_code: int, flags: int) -> bool:
        signed = bytearray(ev[:-4])
        if type_code == C.FORMAT_DESCRIPTION_EVENT:
            signed[17] &= ~C.LOG_EVENT_BINLOG_IN_USE_F & 0xFF  # MySQL checks an FDE with the in-use flag cleared
        return zlib.crc32(signed) == int.from_bytes(ev[-4:], "little") or zlib.crc32(ev[:-4]) == int.from_bytes(
            ev[-4:], "little")

    @staticmethod
    def _query_text(body: bytes) -> str:
        db_len = body[8]
        status_len = struct.unpack_from("<H", body, 11)[0]
        start = 13 + status_len + db_len + 1
        return body[start:].decode("utf-8", "replace")
