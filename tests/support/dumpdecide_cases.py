"""Cases for the dump's per-event decisions (tests/downstream/test_dump_decide.py): event sequences from the corpus (and a few
synthetic files for what the corpus lacks: MariaDB domains, capabilities, skip_replication), start states, and the
trace the real ``DumpSender`` event-by-event path (``_handle`` / ``_skip_filler``) produces for them.

``tests/support/data/dump_decisions.json.gz`` holds digests of the traces (of cases made again from a seed) captured from the sender as it was before the decisions were
split out (``python -m tests.dumpdecide_cases capture``): the refactor must reproduce them byte for byte."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import random
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

from relayproxy.binlog import boundary as B
from relayproxy.binlog import constants as C
from relayproxy.binlog.events import HEADER, FormatDescription
from relayproxy.binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from relayproxy.downstream.context import ConnectionState, DumpRequest
from relayproxy.downstream.dump import sender as sender_mod
from relayproxy.downstream.dump.errors import DumpFailure
from relayproxy.downstream.dump.start import MariaStart

from . import eventgen as E

GOLDEN = Path(__file__).resolve().parent / "data" / "dump_decisions.json.gz"
RELAY_FILE = "relay-bin.000007"
MARIA_VERSION = "10.11.6-MariaDB-log"
SID2 = bytes(range(16, 32))


# -- the event sequences ----------------------------------------------------------------------------


def _split(data: bytes) -> tuple[bytes, list[bytes]] | None:
    """(FDE, the complete events after it) of a file image, or None without an FDE first."""
    if len(data) < 4 + C.HEADER_LEN:
        return None
    fde_size = HEADER.unpack_from(data, 4)[3]
    if HEADER.unpack_from(data, 4)[1] != C.FORMAT_DESCRIPTION_EVENT or fde_size < C.HEADER_LEN:
        return None
    events, pos = [], 4 + fde_size
    while pos + C.HEADER_LEN <= len(data):
        size = HEADER.unpack_from(data, pos)[3]
        if size < C.HEADER_LEN or pos + size > len(data):
            break
        events.append(data[pos : pos + size])
        pos += size
    return data[4 : 4 + fde_size], events


def _synthetic_files() -> list[tuple[str, bytes]]:
    """What the corpus has little of: MySQL GTIDs of two servers (tagged-free), anonymous groups, MariaDB domains
    with standalone groups, ANNOTATE_ROWS, BINLOG_CHECKPOINT, GTID_LIST and @@skip_replication events."""
    mysql = []
    for gno in range(1, 13):
        sid = E.MYSQL_SID if gno % 3 else SID2
        if gno % 5 == 0:
            mysql += [E.gtid(gno, sid), E.query("CREATE TABLE t%d (a INT)" % gno)]
        else:
            mysql += [E.gtid(gno, sid), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(gno)]
    mysql += [E.gtid(0, anonymous=True), E.query("BEGIN"), E.xid(99), E.rotate("binlog.000009")]
    maria = [E.event(C.MARIA_GTID_LIST_EVENT, struct.pack("<I", 1) + struct.pack("<IIQ", 0, 1, 3)),
             E.event(C.MARIA_BINLOG_CHECKPOINT_EVENT, struct.pack("<I", 16) + b"mariadb-bin.0001")]
    for seq in range(4, 20):
        domain = seq % 3
        server = 1 if seq % 7 else 2
        flags = C.LOG_EVENT_SKIP_REPLICATION_F if seq % 4 == 0 else 0
        if seq % 5 == 0:
            maria += [E.maria_gtid(seq, domain, C.FL_STANDALONE, server),
                      E.query("CREATE TABLE t%d (a INT)" % seq, flags=flags)]
        else:
            maria += [E.maria_gtid(seq, domain, 0, server),
                      E.event(C.MARIA_ANNOTATE_ROWS_EVENT, b"INSERT INTO t VALUES (%d)" % seq),
                      E.table_map(flags=flags), E.write_rows(flags=flags), E.xid(seq)]
    return [
        ("synthetic/mysql-gtid", E.binlog_file(*mysql)),
        ("synthetic/mariadb-gtid", E.binlog_file(*maria, server_version=MARIA_VERSION)),
    ]


def load_files(corpus_dir: Path, manifest: list[dict]) -> list[tuple[str, bytes, list[bytes]]]:
    """(name, FDE, events) per corpus file that starts with an FDE, then the synthetic files."""
    files = []
    images = [(e["file"], (corpus_dir / e["file"]).read_bytes()) for e in manifest] + _synthetic_files()
    for name, data in images:
        split = _split(data)
        if split is not None and split[1]:
            files.append((name, split[0], split[1]))
    return files


def _flavour(fde: bytes) -> str:
    return "mariadb" if b"MariaDB" in fde[: 2 + 50 + C.HEADER_LEN] else "mysql"


def _crc(fde: bytes) -> bool:
    return FormatDescription.parse(fde, 0, len(fde)).checksum_alg == C.CHECKSUM_CRC32


def _gtids(fde: bytes, events: list[bytes]) -> list:
    """The GTID of every group of the events, as the boundary parser reads it."""
    parser = B.TransactionBoundaryParser("auto")
    parser.set_format(FormatDescription.parse(fde, 0, len(fde)))
    found = []
    for ev in events:
        _ts, type_code, _sid, size, _lp, flags = HEADER.unpack_from(ev, 0)
        try:
            result = parser.feed(type_code, flags, ev, 0, size)
        except Exception:
            return found
        if result & B.RESULT_MASK == B.GROUP_START and parser.gtid is not None:
            found.append(parser.gtid)
    return found


# -- the start states ---------------------------------------------------------------------------------


def make_case(rng: random.Random, files: list) -> dict:
    """A random case: a window of a file's events, with fillers and @@skip_replication flags put in, and a
    start state (dump kind, the replica's GTIDs, capabilities, flags, semi-sync, heartbeat period)."""
    maria = [i for i, f in enumerate(files) if _flavour(f[1]) == "mariadb"]
    index = rng.choice(maria) if maria and rng.random() < 0.4 else rng.randrange(len(files))
    _name, fde, events = files[index]
    start = rng.randrange(len(events))
    count = rng.randint(1, 300)
    window = range(start, min(len(events), start + count))
    flavour = _flavour(fde)
    gtids = _gtids(fde, events)
    case: dict = {
        "file": index, "start": start, "count": count,
        "fillers": sorted(rng.sample(list(window), min(len(window), rng.choice([0, 0, 1, 3])))),
        "skiprep": sorted(rng.sample(list(window), min(len(window), rng.choice([0, 0, 2, 6])))),
        "semi_sync": rng.random() < 0.3,
        "heartbeat": rng.choice([0.0, 0.5, 1e9]),
        "non_crc_announced": False,
        "capability": rng.choice([0, 1, 2, 3, 4, 4, 4]),
        "annotate": rng.random() < 0.5,
        "skip_replication": rng.random() < 0.3,
        "strict": rng.random() < 0.3,
        "mode": "file", "exclude": None, "maria": None, "binlog": None,
    }
    if flavour == "mysql" and rng.random() < 0.6:
        case["mode"] = "mysql-gtid"
        mine = [g for g in gtids if len(g) == 2]
        case["exclude"] = [[g[0].hex(), g[1]] for g in mine if rng.random() < 0.5]
        if rng.random() < 0.2:
            case["exclude"].append([SID2.hex(), rng.randint(1, 20)])
    elif flavour == "mariadb" and rng.random() < 0.7:
        case["mode"] = "mariadb-gtid"
        maria = [g for g in gtids if len(g) == 3]
        domains = sorted({g[0] for g in maria} | {rng.randint(0, 5)})
        state = []
        for domain in domains:
            if rng.random() < 0.25:
                continue
            in_domain = [g for g in maria if g[0] == domain]
            if in_domain and rng.random() < 0.8:
                d, s, q = rng.choice(in_domain)
                q += rng.choice([0, 0, 0, -1, 1])
            else:
                d, s, q = domain, rng.randint(1, 2), rng.randint(0, 30)
            state.append([d, s, max(q, 0), rng.random() < 0.2])
        case["maria"] = state
        case["binlog"] = [list(g) for g in maria if rng.random() < 0.9]
    return case


# -- driving the sender ---------------------------------------------------------------------------------


class _Clock:
    """time.monotonic for the sender: one second per call, so heartbeat decisions are deterministic."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now

    def time(self) -> float:
        return 1.7e9


class _Channel:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False
        self.semi_sync = False

    async def send(self, payload) -> None:
        self.sent.append(bytes(payload))


class _Horizon:
    def __init__(self, gtids) -> None:
        self.gtids = gtids

    def snapshot(self):
        return SimpleNamespace(gtids=self.gtids, file=RELAY_FILE, position=0, seq=0)


def _events_of(case: dict, files: list) -> tuple[bytes, list[bytes]]:
    _name, fde, events = files[case["file"]]
    out = []
    fillers, skiprep = set(case["fillers"]), set(case["skiprep"])
    for i in range(case["start"], min(len(events), case["start"] + case["count"])):
        if i in fillers:
            out.append(E.event(C.IGNORABLE_LOG_EVENT, b"filler", flags=C.LOG_EVENT_IGNORABLE_F, checksum=_crc(fde)))
        ev = events[i]
        if i in skiprep:
            ev = bytearray(ev)
            struct.pack_into("<H", ev, 17, struct.unpack_from("<H", ev, 17)[0] | C.LOG_EVENT_SKIP_REPLICATION_F)
            ev = bytes(ev)
        out.append(ev)
    return fde, out


def make_sender(case: dict, files: list):
    """A DumpSender set up as ``_plan`` and ``_send_format_description`` leave it for the case, on a recording
    channel; returns (sender, channel, events to feed, file position of the first)."""
    fde, events = _events_of(case, files)
    flavour = _flavour(fde)
    binlog = MariaBinlogState(MariaGtid(*g) for g in case["binlog"]) if case["binlog"] is not None else None
    ctx = SimpleNamespace(flavour=flavour, server_id=4242, settings=SimpleNamespace(semi_sync=True),
                          server_version=MARIA_VERSION if flavour == "mariadb" else "8.0.36", store=None,
                          horizon=_Horizon(binlog))
    user_vars = {"master_binlog_checksum": "CRC32", "master_heartbeat_period": int(case["heartbeat"] * 1e9),
                 "mariadb_slave_capability": case["capability"], "slave_gtid_strict_mode": int(case["strict"])}
    if case["semi_sync"]:
        user_vars["rpl_semi_sync_slave"] = 1
    conn = ConnectionState(conn_id=7, user_vars=user_vars,
                           session_vars={"skip_replication": 1} if case["skip_replication"] else {})
    kind = "mariadb-gtid" if case["mode"] == "mariadb-gtid" else ("mysql-gtid" if case["mode"] == "mysql-gtid"
                                                                  else "file")
    request = DumpRequest(kind=kind, server_id=2, flags=0x02 if case["annotate"] else 0, file=RELAY_FILE,
                          position=4)
    channel = _Channel()
    sender = sender_mod.DumpSender(ctx, conn, request, channel)
    if case["exclude"] is not None:
        exclude = GtidSet()
        for sid, gno in case["exclude"]:
            exclude.add(bytes.fromhex(sid), gno)
        sender.decider.exclude = exclude  # what a start plan's exclude sets (DumpSender._adopt)
    if case["maria"] is not None:
        sender.decider.maria_state = {d: MariaStart(MariaGtid(d, s, q), empty) for d, s, q, empty in case["maria"]}
    fd = FormatDescription.parse(fde, 0, len(fde))
    sender.event_alg = fd.checksum_alg
    sender.parser.set_format(fd)
    sender.file = RELAY_FILE
    if hasattr(sender, "decider"):
        sender.decider.file = RELAY_FILE
    pos = 4 + len(fde) + sum(len(e) for e in files[case["file"]][2][: case["start"]])
    sender.pos = pos
    sender.slow_types = sender._slow_types()
    return sender, channel, events, pos


def _owed(sender) -> int:
    decider = getattr(sender, "decider", None)
    return (decider if decider is not None else sender).skip_end


def run_sender(case: dict, files: list) -> list:
    """The trace of the sender's event-by-event path over the case: per event its position, what went out for it
    (digests of the payloads), the error that ended the dump; at the end the heartbeat owed before a wait and
    whether the next range could go as a shared chunk (``_plain``)."""
    clock = _Clock()
    saved = sender_mod.time
    sender_mod.time = clock
    try:
        sender, channel, events, pos = make_sender(case, files)
        trace: list = []

        async def feed() -> None:
            nonlocal pos
            for ev in events:
                _ts, type_code, _sid, size, _lp, flags = HEADER.unpack_from(ev, 0)
                before = len(channel.sent)
                try:
                    if type_code == C.IGNORABLE_LOG_EVENT and flags & C.LOG_EVENT_IGNORABLE_F:
                        sender._skip_filler(pos + size)
                    else:
                        await sender._handle(memoryview(ev), 0, size, pos, type_code, flags, None)
                except DumpFailure as failure:
                    trace.append(["END", failure.code, failure.message, failure.with_position, failure.last_event,
                                  failure.last_byte])
                    return
                pos += size
                trace.append([sender.pos, [_digest(p) for p in channel.sent[before:]]])
            trace.append(["OWED", _owed(sender), sender._plain()])

        asyncio.run(feed())
        return trace
    finally:
        sender_mod.time = saved


def _digest(payload: bytes) -> str:
    return f"{len(payload)}:{payload[:3].hex()}:{hashlib.sha1(payload).hexdigest()[:16]}"


def files_digest(files: list) -> str:
    """What the seeded cases are drawn from: the cases are made again from the seed, so only their traces' digests
    are kept."""
    h = hashlib.sha1()
    for name, fde, events in files:
        h.update(name.encode() + fde + b"".join(events))
    return h.hexdigest()[:20]


def trace_digest(trace: list) -> str:
    return hashlib.sha1(json.dumps(trace).encode()).hexdigest()[:20]


def cases(files: list, n: int, seed: int = 28) -> list[dict]:
    rng = random.Random(seed)
    return [make_case(rng, files) for _ in range(n)]


def capture(n: int = 3000) -> None:
    """Write the golden traces of ``n`` seeded cases (run before changing the sender's decisions)."""
    corpus = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "binlogs"
    files = load_files(corpus, json.loads((corpus / "manifest.json").read_text()))
    out = {"files": files_digest(files), "seed": 28,
           "traces": [trace_digest(run_sender(case, files)) for case in cases(files, n)]}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_bytes(gzip.compress(json.dumps(out, separators=(",", ":")).encode(), mtime=0))
    print(f"{n} cases -> {GOLDEN}")


if __name__ == "__main__":
    if sys.argv[1:] == ["capture"]:
        capture()
