"""`relayproxy serve`: existing binlog files served read-only, as their master, to python-mysql-replication,
mariadb-binlog and plain SQL clients.

The server runs in-process (a thread with its own event loop); clients are the real third-party ones. Corpus
files are served both from copies in tmp_path and in place, read-only (nothing in the corpus may change:
sizes, mtimes and SHA-256 are compared before and after). Expected events and GTIDs come from the files
themselves (``scan_file``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pymysql
import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    FormatDescriptionEvent,
    GtidEvent,
    MariadbBinLogCheckPointEvent,
    MariadbGtidEvent,
    MariadbGtidListEvent,
    PreviousGtidsEvent,
    QueryEvent,
    RotateEvent,
    RowsQueryLogEvent,
    StopEvent,
    XidEvent,
)
from pymysqlreplication.packet import BinLogPacketWrapper
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from relayproxy.binlog import constants as C
from relayproxy.binlog.gtid import GtidSet
from relayproxy.binlog.reader import scan_file
from relayproxy.commands import serve as S

from ..support import eventgen as E

REPO = Path(__file__).resolve().parents[2]
MARIA_DIR = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0"
MARIA_FILES = [f"mariadb-repl-bin.00000{n}" for n in (4, 5, 6, 7)]
PASSWORD = "servepw"
USERS = f"repl:{PASSWORD}:mysql_native_password"
CLIENT_ID = 4242
READ_TIMEOUT = 20.0

# The MySQL GTID files of the corpus (5.7 and 8.0) a replica can auto-position on.
MYSQL_GTID_FILES = [
    "zendesk-maxwell/src/test/resources/sql/replay/binlog.000004",  # 8.0.29, starts at 1-5
    "apecloud-mysql-binlog-connector-rust/tests/parse_file_tests/mysql-bin.000057",  # 8.0.31, compressed payloads
    "apecloud-mysql-binlog-connector-rust/tests/parse_file_tests/mysql-bin.000080",  # 5.7.40
    "blackbeam-rust_mysql_common/test-data/binlogs/mysql-enum-string-set.000001",  # 8.0.28, empty start
    "zalora-binlog-parser/data/gtid-fixtures/mysql-bin.01",  # 5.7.32
    "PrivateRookie-boxercrab/tests/events/16_xid/log.bin",  # 5.7.30
]

# What python-mysql-replication is asked to return (NotImplementedEvent types, e.g. anonymous GTIDs or
# compressed payloads, are dropped by the library and left out of the expected lists too).
ONLY_EVENTS = [
    FormatDescriptionEvent, RotateEvent, StopEvent, PreviousGtidsEvent, GtidEvent, QueryEvent, XidEvent,
    RowsQueryLogEvent, TableMapEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, MariadbGtidEvent,
    MariadbGtidListEvent, MariadbBinLogCheckPointEvent,
]
_EVENT_MAP = BinLogPacketWrapper._BinLogPacketWrapper__event_map
RETURNED_TYPES = frozenset(code for code, cls in _EVENT_MAP.items() if cls in ONLY_EVENTS)


# ---------------------------------------------------------------------------------------------
# The server in a thread


@dataclass
class Served:
    port: int
    store: S.ReadOnlyBinlogDir
    upstream: S.NoUpstream  # what serve says where an upstream would be (the files' master facts)
    http: tuple[str, int] | None
    stop: object
    mirror: object = None  # the DecryptedMirror of an encrypt_binlog=ON directory
    status: object = None  # the /status document, as a callable
    queries: list[tuple[str, str, int | None]] = field(default_factory=list)  # (sql, response kind, error code)

    def sql(self, statement: str):
        conn = pymysql.connect(host="127.0.0.1", port=self.port, user="repl", password=PASSWORD)
        try:
            cur = conn.cursor()
            cur.execute(statement)
            return cur.fetchall()
        finally:
            conn.close()

    def refused(self) -> list[tuple[str, str, int | None]]:
        # SHOW BINARY LOG STATUS is 1064 before MySQL 8.2 (and on MariaDB); python-mysql-replication falls
        # back to SHOW MASTER STATUS on exactly that error, as against a real 8.0 master: not a refusal.
        fallback = ("SHOW BINARY LOG STATUS", "error", 1064)
        return [q for q in self.queries if q[1] != "ok" and q != fallback]


def parse(argv: list[str]) -> tuple:
    parser = argparse.ArgumentParser()
    S.add_arguments(parser)
    return S.load(parser.parse_args(argv), environ={})


@contextlib.contextmanager
def served(binlog_dir: Path, *extra: str, users: str = USERS):
    """Run `relayproxy serve` in-process on a free port; stop it at the end."""
    cfg, options = parse(["--binlog-dir", str(binlog_dir), "--listen", "127.0.0.1:0", "--users", users, *extra])
    started = threading.Event()
    box: dict = {}

    def run() -> None:
        async def main() -> None:
            ready = asyncio.get_running_loop().create_future()
            task = asyncio.create_task(S.serve(cfg, options, ready=ready))
            await asyncio.wait({ready, task}, return_when=asyncio.FIRST_COMPLETED)
            if ready.done():
                box.update(ready.result())
            else:
                box["error"] = task.exception()
            started.set()
            with contextlib.suppress(Exception):
                await task

        asyncio.run(main())

    thread = threading.Thread(target=run, name="relayproxy-serve", daemon=True)
    thread.start()
    assert started.wait(30), "relayproxy serve did not start"
    if "error" in box:
        raise box["error"]
    handle = Served(box["listen"][1], box["store"], box["upstream"], box["http"], box["stop"], box["mirror"],
                    box["status"])
    _record_queries(box["downstream"], handle.queries)
    try:
        yield handle
    finally:
        handle.stop()
        thread.join(15)
        assert not thread.is_alive(), "relayproxy serve did not stop"


def _record_queries(downstream, queries: list) -> None:
    """Keep what every statement got (ok / the ERR code): what the clients send that the relay refuses."""
    execute = downstream.sql

    async def recording(ctx, conn, statement):
        try:
            response = execute(ctx, conn, statement)
            if asyncio.iscoroutine(response):
                response = await response
        except Exception as exc:
            queries.append((statement, "raised", getattr(exc, "code", None)))
            raise
        code = getattr(response, "code", None)
        queries.append((statement, "ok" if code is None else "error", code))
        return response

    downstream.sql = recording


# ---------------------------------------------------------------------------------------------
# python-mysql-replication, bounded in time


def settings(port: int, password: str = PASSWORD) -> dict:
    return {"host": "127.0.0.1", "port": port, "user": "repl", "password": password}


@dataclass(frozen=True)
class Got:
    type_code: int
    log_pos: int
    flags: int
    timestamp: int
    gtid: str | None


def read_stream(port: int, *, timeout: float = READ_TIMEOUT, stop_at_gtid: str | None = None,
                password: str = PASSWORD, **kwargs) -> tuple[list[Got], Exception | None]:
    """Everything a non-blocking BinLogStreamReader returns (in a thread: peers.md saw it spin)."""
    got: list[Got] = []
    failure: list[Exception] = []
    kwargs.setdefault("blocking", False)
    kwargs.setdefault("server_id", CLIENT_ID)  # concurrent readers need their own (the relay ends zombie dumps)

    def work() -> None:
        stream = BinLogStreamReader(
            connection_settings=settings(port, password), ctl_connection_settings=settings(port, password),
            only_events=ONLY_EVENTS, ignore_decode_errors=True, **kwargs,
        )
        try:
            for event in stream:
                p = event.packet
                gtid = getattr(event, "gtid", None) if isinstance(event, (GtidEvent, MariadbGtidEvent)) else None
                got.append(Got(p.event_type, p.log_pos, p.flags, p.timestamp, gtid))
                if stop_at_gtid is not None and gtid == stop_at_gtid:
                    break
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            failure.append(exc)
        finally:
            stream.close()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"python-mysql-replication did not return within {timeout}s (spinning?)"
    return got, (failure[0] if failure else None)


def real(events: list[Got]) -> list[tuple[int, int]]:
    """(type, log_pos) of the events that are the files' own: no heartbeats, no artificial events."""
    return [(e.type_code, e.log_pos) for e in events
            if e.type_code != C.HEARTBEAT_LOG_EVENT and not e.flags & C.LOG_EVENT_ARTIFICIAL_F
            and not (e.type_code == C.ROTATE_EVENT and e.timestamp == 0)]


# ---------------------------------------------------------------------------------------------
# What the files hold


@dataclass
class FileContent:
    name: str
    events: list[tuple[int, int, int]]  # (offset, type, end)
    groups: list[tuple[int, int, object]]  # (start, end, gtid)
    log_pos: dict[int, int]  # offset -> the event's log_pos field
    scan: object

    def expected(self, keep_group) -> list[tuple[int, int]]:
        """(type, log_pos) python-mysql-replication returns of this file when only groups passing
        ``keep_group(gtid)`` are sent; log_pos 0 (MariaDB 11's in-group events) stays 0."""
        out = []
        for offset, type_code, end in self.events:
            group = next((g for g in self.groups if g[0] <= offset < g[1]), None)
            if group is not None and not keep_group(group[2]):
                continue
            if type_code in RETURNED_TYPES:
                out.append((type_code, self.log_pos[offset]))
        return out

    @property
    def gtids(self) -> list:
        return [g[2] for g in self.groups]


def content(path: Path) -> FileContent:
    events, groups, log_pos = [], [], {}

    def on_event(ev) -> None:
        events.append((ev.offset, ev.type_code, ev.end))
        log_pos[ev.offset] = ev.log_pos

    scan = scan_file(path, on_event=on_event,
                     on_group=lambda g: groups.append((g.start, g.end, g.gtid)) if g.complete else None)
    return FileContent(path.name, events, groups, log_pos, scan)


def mysql_gtid_text(gtid) -> str:
    sid, gno = gtid[0], gtid[-1]
    return f"{uuid.UUID(bytes=bytes(sid))}:{gno}"


def maria_gtid_text(gtid) -> str:
    return "-".join(str(x) for x in gtid)


def snapshot(directory: Path) -> dict:
    """Everything that would show a write: names, sizes, mtimes, contents, and the directory's own mtime."""
    out = {"<dir mtime>": directory.stat().st_mtime_ns}
    for entry in sorted(directory.iterdir()):
        st = entry.stat()
        out[entry.name] = (st.st_size, st.st_mtime_ns, hashlib.sha256(entry.read_bytes()).hexdigest())
    return out


def copy_files(corpus_dir: Path, relative: list[str], into: Path, names: list[str] | None = None) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    for i, rel in enumerate(relative):
        shutil.copyfile(corpus_dir / rel, into / (names[i] if names else Path(rel).name))
    return into


# ---------------------------------------------------------------------------------------------
# Synthetic MySQL files (eventgen): the purged-GTID cases


SID_TEXT = str(uuid.UUID(bytes=E.MYSQL_SID))


def previous_gtids(text: str) -> bytes:
    return E.event(C.PREVIOUS_GTIDS_LOG_EVENT, GtidSet.parse(text).encode() if text else bytes(8))


def transaction(gno: int) -> list[bytes]:
    return [E.gtid(gno), E.query("BEGIN"), E.query(f"INSERT INTO t VALUES ({gno})"), E.xid(gno)]


def write_binlog(path: Path, *events: bytes, version: str = "5.7.40-log") -> Path:
    path.write_bytes(E.binlog_file(*events, server_version=version))
    return path


# ---------------------------------------------------------------------------------------------
# MySQL GTID auto-position, corpus files


@pytest.mark.parametrize("relative", MYSQL_GTID_FILES, ids=lambda r: Path(r).parent.name + "/" + Path(r).name)
def test_mysql_auto_position_streams_the_files_gtids(corpus_dir, tmp_path, relative):
    binlog_dir = copy_files(corpus_dir, [relative], tmp_path / "binlogs", names=["binlog.000001"])
    fc = content(binlog_dir / "binlog.000001")
    start = fc.scan.start_gtids
    gtids = fc.gtids
    assert gtids, "the file holds GTID transactions"
    # The replica has the file's start set and its first transaction: it must get exactly the rest.
    have = start.copy()
    first = gtids[0]
    if len(first) == 2:
        have.add(first[0], first[1])
    else:
        have.add(first[0], first[2], first[1])
    with served(binlog_dir) as server:
        got, error = read_stream(server.port, auto_position=have.format(","))
        assert error is None, error
        assert [e.gtid for e in got if e.gtid] == [mysql_gtid_text(g) for g in gtids[1:]]
        assert real(got) == fc.expected(lambda g: g not in gtids[:1])
        # What the library sent, and that the relay answered all of it.
        sent = [q[0] for q in server.queries]
        assert "SHOW GLOBAL VARIABLES LIKE 'BINLOG_CHECKSUM'" in sent
        assert "SET @master_binlog_checksum= @@global.binlog_checksum" in sent
        assert server.refused() == []
        # Everything the relay advertises is the files': horizon, purged set.
        status = server.sql("SHOW MASTER STATUS")[0]
        assert (status[0], int(status[1])) == ("binlog.000001", fc.scan.good_end)
        assert GtidSet.parse(status[4]) == fc.scan.gtids_after
        purged = server.sql("SELECT @@gtid_purged")[0][0]
        assert (GtidSet.parse(purged) if purged else GtidSet()) == start


def test_mysql_auto_position_in_place_leaves_the_corpus_untouched(corpus_dir):
    directory = corpus_dir / Path(MYSQL_GTID_FILES[0]).parent
    before = snapshot(directory)
    fc = content(directory / "binlog.000004")
    with served(directory, "--http", "127.0.0.1:0") as server:
        got, error = read_stream(server.port, auto_position=fc.scan.start_gtids.format(","))
        assert error is None, error
        assert [e.gtid for e in got if e.gtid] == [mysql_gtid_text(g) for g in fc.gtids]
        assert real(got) == fc.expected(lambda g: True)
        assert not server.sql("PURGE BINARY LOGS TO 'binlog.000004'")  # nothing before it: nothing to do
        with urllib.request.urlopen(f"http://{server.http[0]}:{server.http[1]}/status", timeout=5) as response:
            status = json.loads(response.read())
        assert status["state"] == "serving files" and status["io_running"] is False
        assert (status["master_log_file"], status["read_master_log_pos"]) == ("binlog.000004", fc.scan.good_end)
        assert status["binlog_dir"] == str(directory) and status["events_received"] == 0
    assert snapshot(directory) == before


def test_file_and_position_mode(corpus_dir, tmp_path):
    relative = MYSQL_GTID_FILES[4]  # zalora 5.7.32
    binlog_dir = copy_files(corpus_dir, [relative], tmp_path / "b", names=["mysql-bin.000001"])
    fc = content(binlog_dir / "mysql-bin.000001")
    with served(binlog_dir) as server:
        got, error = read_stream(server.port, log_file="mysql-bin.000001", log_pos=4, resume_stream=True)
        assert error is None, error
        assert real(got) == fc.expected(lambda g: True)
        # From a group boundary in the middle: only what follows, and no GTID skipping.
        middle = fc.groups[len(fc.groups) // 2]
        got, error = read_stream(server.port, log_file="mysql-bin.000001", log_pos=middle[0], resume_stream=True)
        assert error is None, error
        tail = [(t, p) for t, p in fc.expected(lambda g: True) if p > middle[0]]
        assert [x for x in real(got) if x[0] != C.FORMAT_DESCRIPTION_EVENT] == tail
        # Without a position the library asks SHOW MASTER STATUS first: the horizon, i.e. nothing to send.
        got, error = read_stream(server.port, resume_stream=True)
        assert error is None and [x for x in real(got) if x[0] != C.FORMAT_DESCRIPTION_EVENT] == []
        assert ("SHOW BINARY LOG STATUS", "ok", None) in server.queries or \
            ("SHOW MASTER STATUS", "ok", None) in server.queries
        assert server.refused() == []


# ---------------------------------------------------------------------------------------------
# Purged GTIDs: error 1236 with MySQL's text, nothing streamed


def _expect_1236(port: int, have: str, missing: str, *, modern: bool):
    got, error = read_stream(port, auto_position=have)
    assert got == [], "nothing may be streamed before the error"
    assert isinstance(error, pymysql.err.OperationalError), error
    code, message = error.args
    assert code == 1236
    who = ("source", "replica") if modern else ("master", "slave")
    assert message == (
        f"Cannot replicate because the {who[0]} purged required binary logs. Replicate the missing transactions "
        f"from elsewhere, or provision a new {who[1]} from backup. Consider increasing the {who[0]}'s binary log "
        f"expiration period. The GTID set sent by the {who[1]} is '{have}', and the missing transactions are "
        f"'{missing}'"
    )


def test_purged_gtids_oldest_file_previous_gtids(corpus_dir, tmp_path):
    # zendesk binlog.000004 (8.0.29) starts at 1-5: its server purged 1-5.
    binlog_dir = copy_files(corpus_dir, [MYSQL_GTID_FILES[0]], tmp_path / "b")
    sid = "83759871-1141-11ed-b12d-0242ac130003"
    with served(binlog_dir) as server:
        _expect_1236(server.port, f"{sid}:1-3", f"{sid}:4-5", modern=True)
        _expect_1236(server.port, f"{SID_TEXT}:1", f"{sid}:1-5", modern=True)
        got, error = read_stream(server.port, auto_position=f"{sid}:1-5")
        assert error is None and [e.gtid for e in got if e.gtid][0] == f"{sid}:6"


def test_purged_gtids_the_5_6_22_case(tmp_path):
    """Oldest file: empty PREVIOUS_GTIDS and no GTID; the next file's PREVIOUS_GTIDS names 1-5, which no
    file holds. The oldest file must not "match" a replica lacking 1-5 (MySQL Bug #19012085)."""
    d = tmp_path / "b"
    d.mkdir()
    write_binlog(d / "binlog.000001", previous_gtids(""), E.rotate("binlog.000002"))
    write_binlog(d / "binlog.000002", previous_gtids(f"{SID_TEXT}:1-5"), *transaction(6), *transaction(7))
    with served(d) as server:
        assert server.sql("SELECT @@gtid_purged")[0][0] == f"{SID_TEXT}:1-5"
        _expect_1236(server.port, f"{SID_TEXT}:1-3", f"{SID_TEXT}:4-5", modern=False)
        other = "11111111-2222-3333-4444-555555555555:1"
        _expect_1236(server.port, other, f"{SID_TEXT}:1-5", modern=False)
        got, error = read_stream(server.port, auto_position=f"{SID_TEXT}:1-6")
        assert error is None, error
        assert [e.gtid for e in got if e.gtid] == [f"{SID_TEXT}:7"]
        # File/position replicas read both files, across the ROTATE.
        got, error = read_stream(server.port, log_file="binlog.000001", log_pos=4, resume_stream=True)
        assert error is None
        assert [e.gtid for e in got if e.gtid] == [f"{SID_TEXT}:6", f"{SID_TEXT}:7"]
        assert server.refused() == []


# ---------------------------------------------------------------------------------------------
# MariaDB GTID and file/position over the MariaDB 11.8 consecutive files


@pytest.mark.parametrize("where", ["copy", "in place"])
def test_mariadb_gtid_through_python_mysql_replication(corpus_dir, tmp_path, where):
    if where == "copy":
        directory = copy_files(corpus_dir, [f"{MARIA_DIR}/{n}" for n in MARIA_FILES], tmp_path / "m")
        extra: tuple[str, ...] = ()
    else:
        directory = corpus_dir / MARIA_DIR
        extra = ("--files", *MARIA_FILES)  # the directory has gaps (000003, 000008): serve a consecutive run
        before = snapshot(directory)
    files = [content(directory / n) for n in MARIA_FILES]
    requested = 262700  # inside mariadb-repl-bin.000006 (262668..262733)
    with served(directory, *extra) as server:
        got, error = read_stream(server.port, is_mariadb=True, auto_position=f"0-10-{requested}")
        assert error is None, error
        expected_gtids = [maria_gtid_text(g) for f in files for g in f.gtids if g[2] > requested]
        assert [e.gtid for e in got if e.gtid] == expected_gtids
        start = next(i for i, f in enumerate(files) if f.scan.start_gtids.gtids()[0].seq_no <= requested
                     and f.scan.gtids_after.gtids()[0].seq_no > requested)
        expected = [x for f in files[start:] for x in f.expected(lambda g: g[2] > requested)]
        assert real(got) == expected
        # File/position from the first file: everything, every file in turn.
        # (is_mariadb=True would drop log_file: the library sends an empty name then, i.e. the first file.)
        got, error = read_stream(server.port, log_file=MARIA_FILES[0], log_pos=4, resume_stream=True)
        assert error is None, error
        assert real(got) == [x for f in files for x in f.expected(lambda g: True)]
        assert [e.gtid for e in got if e.gtid] == [maria_gtid_text(g) for f in files for g in f.gtids]
        sent = {q[0] for q in server.queries}
        assert f"SET @slave_connect_state = '0-10-{requested}'" in sent
        assert server.refused() == []
        # A position the files never reached: MariaDB's error, nothing streamed.
        got, error = read_stream(server.port, is_mariadb=True, auto_position="0-10-999999")
        assert got == [] and isinstance(error, pymysql.err.OperationalError) and error.args[0] == 1236
        assert "0-10-999999" in error.args[1]
    if where == "in place":
        assert snapshot(directory) == before


def _mariadb_binlog(port: int, first: str, out: Path) -> None:
    tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    assert tool, "mariadb-binlog is part of the mariadb-server packages (make setup installs them)"
    out.mkdir()
    subprocess.run(
        [tool, "--read-from-remote-server", "--raw", "--to-last-log", "-h127.0.0.1", f"-P{port}", "-urepl",
         f"-p{PASSWORD}", f"--result-file={out}/", first],
        check=True, timeout=60, capture_output=True,
    )


def _without_in_use(data: bytes) -> bytes:
    buf = bytearray(data)
    if len(buf) > 4 + 19:
        buf[4 + 17] &= ~C.LOG_EVENT_BINLOG_IN_USE_F & 0xFF
    return bytes(buf)


MARIADB_BINLOG_CASES = {
    # (directory, files, --files given, version announced instead of the files' own)
    "mariadb-10.5-in-place": ("blackbeam-rust_mysql_common/test-data/binlogs", ["mariadb-bin.000001"], True, None),
    "mysql-5.7-in-place": ("zalora-binlog-parser/data/gtid-fixtures", ["mysql-bin.01"], False, None),
    # mariadb-binlog 10.11 refuses any server whose version is not 3.x, 4.x, 5.x or 10.x ("Could not find
    # server version: Master reported unrecognized MariaDB version '11.8.5-MariaDB-ubu2404-log'"), a real
    # 11.8 server included: the 11.8 files are served under a 10.11 version string to check several files.
    "mariadb-11.8-files": (MARIA_DIR, MARIA_FILES, True, "10.11.6-MariaDB-log"),
}


@pytest.mark.parametrize("case", sorted(MARIADB_BINLOG_CASES))
def test_mariadb_binlog_downloads_identical_files(corpus_dir, tmp_path, case):
    relative, names, listed, version = MARIADB_BINLOG_CASES[case]
    directory = corpus_dir / relative
    before = snapshot(directory)
    with served(directory, *(("--files", *names) if listed else ())) as server:
        if version is not None:
            server.upstream.master_server_version = version
        _mariadb_binlog(server.port, names[0], tmp_path / "download")
        assert server.refused() == [], server.refused()
    assert sorted(p.name for p in (tmp_path / "download").iterdir()) == names
    for name in names:
        mine, theirs = (tmp_path / "download" / name).read_bytes(), (directory / name).read_bytes()
        assert _without_in_use(mine) == _without_in_use(theirs), name
    assert snapshot(directory) == before


def test_mariadb_binlog_reads_several_mysql_files(tmp_path):
    d = tmp_path / "b"
    d.mkdir()
    write_binlog(d / "binlog.000001", previous_gtids(""), *transaction(1), E.rotate("binlog.000002"))
    write_binlog(d / "binlog.000002", previous_gtids(f"{SID_TEXT}:1"), *transaction(2), *transaction(3))
    with served(d) as server:
        _mariadb_binlog(server.port, "binlog.000001", tmp_path / "download")
    for name in ("binlog.000001", "binlog.000002"):
        assert (tmp_path / "download" / name).read_bytes() == (d / name).read_bytes()


# ---------------------------------------------------------------------------------------------
# What is served: the horizon, partial tails, refusals


def _cut_inside_last_group(path: Path) -> int:
    """Cut the file inside its last group (a crashed or running server's tail); returns the last boundary."""
    fc = content(path)
    start, end, _gtid = fc.groups[-1]
    data = path.read_bytes()
    path.write_bytes(data[: (start + end) // 2])
    return start


def test_newest_file_partial_tail_is_not_served(corpus_dir, tmp_path):
    d = copy_files(corpus_dir, [f"{MARIA_DIR}/{n}" for n in MARIA_FILES[:2]], tmp_path / "m")
    boundary = _cut_inside_last_group(d / MARIA_FILES[1])
    fc = content(d / MARIA_FILES[1])
    store = S.ReadOnlyBinlogDir.open(S.ServeOptions(binlog_dir=d))
    snap = store.horizon.snapshot()
    assert (snap.file, snap.position) == (MARIA_FILES[1], boundary)
    assert str(snap.gtids) == str(fc.scan.gtids_after)
    assert any("unfinished" in w for w in store.warnings)
    with served(d) as server:
        assert server.sql("SHOW BINARY LOGS") == ((MARIA_FILES[0], (d / MARIA_FILES[0]).stat().st_size),
                                                  (MARIA_FILES[1], boundary))
        got, error = read_stream(server.port, log_file=MARIA_FILES[1], log_pos=4, resume_stream=True)
        assert error is None
        assert [e.gtid for e in got if e.gtid] == [maria_gtid_text(g) for g in fc.gtids]
        assert max(e.log_pos for e in got) <= boundary


def test_newest_file_torn_tail_is_left_out_then_served_once_whole(corpus_dir, tmp_path):
    """Damage at the very end of the newest file, with nothing intact after it (a live server's torn
    write), is not served; --follow serves it once the bytes are right."""
    d = copy_files(corpus_dir, [f"{MARIA_DIR}/{MARIA_FILES[0]}"], tmp_path / "m")
    path = d / MARIA_FILES[0]
    good = path.read_bytes()
    fc = content(path)
    last_start = fc.events[-1][0]  # the final ROTATE
    torn = bytearray(good)
    torn[-6] ^= 0xFF
    path.write_bytes(bytes(torn))
    store = S.ReadOnlyBinlogDir.open(S.ServeOptions(binlog_dir=d, follow=True))
    assert store.horizon.snapshot().position == last_start
    assert any("damaged tail" in w for w in store.warnings)
    path.write_bytes(good)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert store.refresh() is True and store.horizon.snapshot().position == len(good)


def test_refusals_name_the_file_and_what_to_do(corpus_dir, tmp_path):
    maria = [f"{MARIA_DIR}/{n}" for n in MARIA_FILES]

    def refused(directory: Path, **options) -> str:
        with pytest.raises(S.ServeError) as exc:
            S.ReadOnlyBinlogDir.open(S.ServeOptions(binlog_dir=directory, **options))
        return str(exc.value)

    # Damage before the end (a flipped byte inside a middle event) refuses, naming file and offset.
    d = copy_files(corpus_dir, maria[:2], tmp_path / "crc")
    fc = content(d / MARIA_FILES[1])
    victim = fc.events[len(fc.events) // 2]
    data = bytearray((d / MARIA_FILES[1]).read_bytes())
    data[victim[0] + 20] ^= 0xFF
    (d / MARIA_FILES[1]).write_bytes(bytes(data))
    message = refused(d)
    assert MARIA_FILES[1] in message and f"offset {victim[0]}" in message and "CRC32" in message
    # An older file that ends inside a transaction.
    d = copy_files(corpus_dir, maria[:2], tmp_path / "cut")
    _cut_inside_last_group(d / MARIA_FILES[0])
    message = refused(d)
    assert MARIA_FILES[0] in message and "not the newest" in message and "--files" in message
    # Files that do not continue each other: refused unless --allow-gaps.
    d = copy_files(corpus_dir, [maria[0], maria[2]], tmp_path / "gap")
    message = refused(d)
    assert "ROTATE to mariadb-repl-bin.000005" in message and "--allow-gaps" in message
    store = S.ReadOnlyBinlogDir.open(S.ServeOptions(binlog_dir=d, allow_gaps=True))
    assert store.files() == [MARIA_FILES[0], MARIA_FILES[2]] and any("gap" in w for w in store.warnings)
    # A replica's relay log: positions are its master's, not the file's.
    relay_log = "blackbeam-rust_mysql_common/test-data/binlogs/bug33029-slave-relay-bin.000001"
    d = copy_files(corpus_dir, [relay_log], tmp_path / "relaylog")
    assert "relay log" in refused(d)
    # MySQL and MariaDB files mixed.
    d = copy_files(corpus_dir, [MYSQL_GTID_FILES[0], maria[0]], tmp_path / "mixed",
                   names=["binlog.000001", "binlog.000002"])
    assert "mix MySQL and MariaDB" in refused(d, allow_gaps=True)
    # Several series, no index: the user chooses.
    d = copy_files(corpus_dir, [MYSQL_GTID_FILES[0], maria[0]], tmp_path / "series", names=["a.000001", "b.000001"])
    assert "several binlog series" in refused(d)
    # The in-place MariaDB directory has holes (000003, 000008 were never kept).
    assert "do not continue each other" in refused(corpus_dir / MARIA_DIR)


def test_file_order_sources(corpus_dir, tmp_path):
    maria = [f"{MARIA_DIR}/{n}" for n in MARIA_FILES]
    d = copy_files(corpus_dir, maria, tmp_path / "m")
    assert S.list_binlog_files(d)[:2] == (MARIA_FILES, "file names by number")
    # A server's index file: ./name or absolute paths, the base names count.
    (d / "mariadb-repl-bin.index").write_text(f"./{MARIA_FILES[1]}\n/var/lib/mysql/{MARIA_FILES[2]}\n")
    names, source, _ = S.list_binlog_files(d)
    assert names == MARIA_FILES[1:3] and "mariadb-repl-bin.index" in source
    store = S.ReadOnlyBinlogDir.open(S.ServeOptions(binlog_dir=d))
    assert store.files() == MARIA_FILES[1:3] and store.current_file == MARIA_FILES[2]
    # A relayproxy relay directory's index wins over a server's index.
    (d / "relayproxy.index").write_text("".join(f"{n}\n" for n in MARIA_FILES[:2]))
    assert S.list_binlog_files(d)[:2] == (MARIA_FILES[:2], "relayproxy.index")
    # --files wins over both; unknown names are refused.
    assert S.list_binlog_files(d, files=tuple(MARIA_FILES[2:]))[0] == MARIA_FILES[2:]
    with pytest.raises(S.ServeError, match="not found"):
        S.list_binlog_files(d, files=("mariadb-repl-bin.000099",))
    # An index naming a file that is gone in the middle is refused; at the head it was purged.
    (d / "relayproxy.index").unlink()
    (d / "mariadb-repl-bin.index").write_text("mariadb-repl-bin.000003\n" + "".join(f"{n}\n" for n in MARIA_FILES))
    names, _source, warnings = S.list_binlog_files(d)
    assert names == MARIA_FILES and "purged" in warnings[0]
    (d / "mariadb-repl-bin.index").write_text(f"{MARIA_FILES[0]}\nmariadb-repl-bin.000099\n{MARIA_FILES[1]}\n")
    with pytest.raises(S.ServeError, match="after files that exist"):
        S.list_binlog_files(d)


def test_relay_directory_is_served_without_recovery(corpus_dir, tmp_path):
    """A relayproxy relay directory: its index gives the order; its partial tail is left alone, not truncated."""
    d = copy_files(corpus_dir, [f"{MARIA_DIR}/{n}" for n in MARIA_FILES[:2]], tmp_path / "relay")
    (d / "relayproxy.index").write_text("".join(f"{n}\n" for n in MARIA_FILES[:2]))
    boundary = _cut_inside_last_group(d / MARIA_FILES[1])
    before = snapshot(d)
    with served(d) as server:
        status = server.sql("SHOW MASTER STATUS")[0]
        assert (status[0], int(status[1])) == (MARIA_FILES[1], boundary)
        with pytest.raises(pymysql.err.OperationalError, match="read-only"):
            server.sql(f"PURGE BINARY LOGS TO '{MARIA_FILES[1]}'")
    assert snapshot(d) == before  # no truncation, no index rewrite, no durable mark, no relayproxy.uuid


def test_a_relay_directory_whose_newest_file_is_only_the_magic(corpus_dir, tmp_path):
    """A relay directory copied between a rotation (or a master switch) and the next event: the newest file holds
    only the magic. serve answers @@binlog_checksum and the version from the files before it, not NULL (on which a
    MariaDB replica stops for good: 1593), as the relay itself does."""
    d = copy_files(corpus_dir, [f"{MARIA_DIR}/{n}" for n in MARIA_FILES[:2]], tmp_path / "relay")
    base, seq = MARIA_FILES[1].rsplit(".", 1)
    newest = f"{base}.{int(seq) + 1:0{len(seq)}d}"
    (d / newest).write_bytes(C.BINLOG_MAGIC)
    (d / "relayproxy.index").write_text("".join(f"{n}\n" for n in [*MARIA_FILES[:2], newest]))
    with served(d) as server:
        checksum, version = server.sql("SELECT @@global.binlog_checksum, @@version")[0]
        assert checksum == "CRC32" and "MariaDB" in version, (checksum, version)


# ---------------------------------------------------------------------------------------------
# --follow


def test_follow_serves_what_the_files_gain(corpus_dir, tmp_path):
    sources = [corpus_dir / MARIA_DIR / n for n in MARIA_FILES[:3]]
    d = tmp_path / "live"
    d.mkdir()
    shutil.copyfile(sources[0], d / MARIA_FILES[0])
    full = sources[1].read_bytes()
    fc = content(sources[1])
    cut = (fc.groups[3][0] + fc.groups[3][1]) // 2  # inside the fourth group
    (d / MARIA_FILES[1]).write_bytes(full[:cut])
    store = S.ReadOnlyBinlogDir.open(S.ServeOptions(binlog_dir=d, follow=True))
    assert store.horizon.snapshot().position == fc.groups[2][1]
    # Bytes arrive in pieces: the horizon moves only to group ends, never backwards.
    boundaries = {g[1] for g in fc.groups} | {e[2] for e in fc.events if not any(g[0] <= e[0] < g[1] for g in fc.groups)}
    seen = []
    with open(d / MARIA_FILES[1], "ab") as f:
        for at in range(cut, len(full), 997):
            f.write(full[at : at + 997])
            f.flush()
            store.refresh()
            seen.append(store.horizon.snapshot().position)
    assert seen == sorted(seen) and set(seen) <= boundaries and seen[-1] == len(full)
    assert str(store.horizon.snapshot().gtids) == str(fc.scan.gtids_after)

    # Through the server: a new file appears and a blocking replica gets its transactions.
    third = content(sources[2])
    with served(d, "--follow", "--follow-interval", "0.05") as server:
        last = maria_gtid_text(third.gtids[-1])
        result: dict = {}
        reader = threading.Thread(target=lambda: result.update(zip(("got", "error"), read_stream(
            server.port, blocking=True, log_file=MARIA_FILES[1], log_pos=4, resume_stream=True,
            stop_at_gtid=last, timeout=30))), daemon=True)
        reader.start()
        time.sleep(0.3)
        shutil.copyfile(sources[2], d / (MARIA_FILES[2] + ".tmp"))
        os.replace(d / (MARIA_FILES[2] + ".tmp"), d / MARIA_FILES[2])  # .tmp: not a NAME.NNN file
        reader.join(35)
        assert not reader.is_alive() and result["error"] is None, result.get("error")
        assert [e.gtid for e in result["got"] if e.gtid] == [maria_gtid_text(g) for g in fc.gtids + third.gtids]
        status = server.sql("SHOW MASTER STATUS")[0]
        assert (status[0], int(status[1])) == (MARIA_FILES[2], sources[2].stat().st_size)


def test_follow_stops_at_what_it_cannot_serve(corpus_dir, tmp_path):
    sources = [corpus_dir / MARIA_DIR / n for n in MARIA_FILES]
    d = tmp_path / "live"
    d.mkdir()
    shutil.copyfile(sources[0], d / MARIA_FILES[0])
    store = S.ReadOnlyBinlogDir.open(S.ServeOptions(binlog_dir=d, follow=True))
    size = sources[0].stat().st_size
    # A file that does not continue the newest one (000005 is missing): not served.
    shutil.copyfile(sources[2], d / MARIA_FILES[2])
    assert store.refresh() is False
    assert store.files() == [MARIA_FILES[0]] and store.horizon.snapshot().position == size
    assert any("ROTATE to mariadb-repl-bin.000005" in e for e in store._reported)
    # The missing file shows up: both are served, in order.
    shutil.copyfile(sources[1], d / MARIA_FILES[1])
    assert store.refresh() is True
    assert store.files() == MARIA_FILES[:3]
    assert store.horizon.snapshot().coordinates == (MARIA_FILES[2], sources[2].stat().st_size)
    # The newest file shrinks below what was served (its server truncated it): following stops, loudly.
    with open(d / MARIA_FILES[2], "r+b") as f:
        f.truncate(1000)
    assert store.refresh() is False and "shrank" in store.follow_error
    assert store.horizon.snapshot().coordinates == (MARIA_FILES[2], sources[2].stat().st_size)


# ---------------------------------------------------------------------------------------------
# The command line


def test_command_line_errors(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = [sys.executable, "-m", "relayproxy.commands.serve", "--log-format", "json"]
    missing = subprocess.run(run + ["--listen", "127.0.0.1:0", "--users", USERS], capture_output=True, text=True,
                             timeout=30, env=env)
    assert missing.returncode == 2 and "binlog_dir" in missing.stderr
    d = tmp_path / "bad"
    d.mkdir()
    data = bytearray(E.binlog_file(*transaction(1), E.rotate("binlog.000002")))
    data[len(data) // 2] ^= 0xFF
    (d / "binlog.000001").write_bytes(bytes(data))
    write_binlog(d / "binlog.000002", previous_gtids(f"{SID_TEXT}:1"), *transaction(2))
    bad = subprocess.run(run + ["--binlog-dir", str(d), "--listen", "127.0.0.1:0", "--users", USERS],
                         capture_output=True, text=True, timeout=30, env=env)
    assert bad.returncode == 1
    assert "relayproxy serve: cannot serve" in bad.stderr and "binlog.000001" in bad.stderr


def test_command_line_serves_until_sigterm(corpus_dir):
    from relayproxy.lab.harness import free_port

    directory = corpus_dir / Path(MYSQL_GTID_FILES[0]).parent
    before = snapshot(directory)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), RELAYPROXY_BINLOG_DIR=str(directory), RELAYPROXY_USERS=USERS)
    proc = subprocess.Popen([sys.executable, "-m", "relayproxy.commands.serve", "--log-format", "json",
                             "--listen", f"127.0.0.1:{port}", "--server-id", "77"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                conn = pymysql.connect(host="127.0.0.1", port=port, user="repl", password=PASSWORD)
                break
            except pymysql.err.OperationalError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "timeout"
                time.sleep(0.1)
        with conn.cursor() as cur:
            cur.execute("SELECT @@server_id, @@version")
            assert cur.fetchone() == (77, "8.0.29-relayproxy-log")
            cur.execute("SHOW MASTER STATUS")
            assert cur.fetchone()[:2] == ("binlog.000004", (directory / "binlog.000004").stat().st_size)
        conn.close()
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert snapshot(directory) == before
