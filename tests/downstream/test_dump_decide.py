"""The dump's per-event decisions (relayproxy/downstream/dump/decide.py), sans-I/O: every decision for MySQL and
MariaDB replicas, GTID and file/position dumps, fed events one at a time; then the sender's event-by-event path
against the traces captured before the decisions were split out of it, and a property: over corpus event
sequences and start states, the decisions alone say everything the sender sends."""

from __future__ import annotations

import gzip
import json
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayproxy.binlog import boundary as B
from relayproxy.binlog import constants as C
from relayproxy.binlog import encoders
from relayproxy.binlog.events import HEADER, FormatDescription
from relayproxy.binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from relayproxy.downstream.dump import decide as D
from relayproxy.downstream.dump.errors import MSG_MARIA_HOLE
from relayproxy.downstream.dump.start import MariaStart

from ..support import dumpdecide_cases as cases_mod
from ..support import eventgen as E

MYSQL_FDE = E.fde("8.0.36")
MARIA_FDE = E.fde("10.11.6-MariaDB-log", n_types=171)


def decider(fde: bytes = MYSQL_FDE, **kw) -> D.EventDecider:
    parser = B.TransactionBoundaryParser("auto")
    parser.set_format(FormatDescription.parse(fde, 0, len(fde)))
    kw.setdefault("flavour", "mariadb" if fde is MARIA_FDE else "mysql")
    d = D.EventDecider(parser, **kw)
    d.file = "relay-bin.000003"
    return d


class Feed:
    """Events fed at consecutive positions from 400, as the sender feeds them."""

    def __init__(self, d: D.EventDecider, pos: int = 400):
        self.d = d
        self.pos = pos

    def __call__(self, ev: bytes, idle: float = 0.0) -> D.Decision:
        _ts, type_code, _sid, size, _lp, flags = HEADER.unpack_from(ev, 0)
        decision = self.d.decide(memoryview(ev), 0, size, self.pos, type_code, flags, True, idle)
        self.pos += size
        return decision

    def filler(self) -> int:
        self.pos += 40
        self.d.filler(self.pos)
        return self.pos


def trx(gno: int, sid: bytes = E.MYSQL_SID) -> list[bytes]:
    return [E.gtid(gno, sid), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(gno)]


def maria_trx(seq: int, domain: int = 0, server: int = 1) -> list[bytes]:
    return [E.maria_gtid(seq, domain, 0, server), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(seq)]


def actions(decisions) -> list[str]:
    return [D.ACTION_NAMES[d.action] for d in decisions]


# -- file/position and MySQL GTID ----------------------------------------------------------------------------


def test_file_position_dump_sends_every_event_as_it_is():
    feed = Feed(decider())
    decisions = [feed(ev) for ev in trx(1) + trx(2)]
    assert all(d is D._SEND for d in decisions)  # the shared constant: no allocation on the common path
    assert feed.d.plain()


def test_semi_sync_asks_an_ack_for_the_last_event_of_each_group_only():
    feed = Feed(decider(semi_sync=True))
    assert [d.ack for d in map(feed, trx(1) + [E.query("CREATE TABLE t (a INT)")])] == \
        [False, False, False, False, True, True]
    assert not feed.d.plain()  # ACK requests go event by event


def test_mysql_gtid_skips_the_groups_the_replica_has_and_owes_a_heartbeat_at_their_end():
    d = decider(heartbeat_period=30.0)
    d.exclude = GtidSet()
    d.exclude.add(E.MYSQL_SID, 1)
    feed = Feed(d)
    skipped = [feed(ev) for ev in trx(1)]
    assert actions(skipped) == ["SKIP"] * 5
    end_of_group = feed.pos
    assert d.skip_end == end_of_group and not d.plain()
    first = feed(E.gtid(2))
    assert first.action == D.SEND and first.heartbeat == end_of_group  # told before the next event sent
    assert d.skip_end == 0 and d.take_heartbeat() == 0


def test_a_heartbeat_is_owed_before_waiting_when_the_skipped_group_ends_the_range():
    d = decider()
    d.exclude = GtidSet()
    d.exclude.add(E.MYSQL_SID, 1)
    feed = Feed(d)
    for ev in trx(1):
        feed(ev)
    assert d.take_heartbeat() == feed.pos
    assert d.take_heartbeat() == 0 and d.plain()


def test_skipping_a_long_stretch_sends_a_heartbeat_every_period():
    d = decider(heartbeat_period=1.0)
    d.exclude = GtidSet()
    d.exclude.add_interval(E.MYSQL_SID, 1, 10)
    feed = Feed(d)
    quiet = feed(E.gtid(1), idle=0.5)
    assert quiet.action == D.SKIP and quiet.heartbeat == 0 and d.skip_end == feed.pos
    due = feed(E.query("BEGIN"), idle=1.0)
    assert due.action == D.SKIP and due.heartbeat == feed.pos and d.skip_end == 0


def test_a_group_the_replica_has_that_spans_two_ranges_stays_skipped_across_them():
    """The chunk path stops at a range that holds the group's start; the rest of the group arrives in the next
    range: the decider still skips it, and the chunk path stays off until the group ends (``plain``)."""
    d = decider()
    d.exclude = GtidSet()
    d.exclude.add(E.MYSQL_SID, 7)
    feed = Feed(d)
    group = trx(7)
    assert actions(feed(ev) for ev in group[:2]) == ["SKIP", "SKIP"]  # end of the first range
    assert d.skipping and not d.plain()
    assert actions(feed(ev) for ev in group[2:]) == ["SKIP"] * 3  # the next range
    assert not d.skipping
    assert actions(feed(ev) for ev in trx(8)) == ["SEND"] * 5


def test_an_anonymous_group_ends_an_auto_position_dump():
    d = decider()
    d.exclude = GtidSet()
    decision = Feed(d)(E.gtid(0, anonymous=True))
    assert decision.action == D.END
    assert "anonymous" in decision.failure.message.lower() and "relay-bin.000003" in decision.failure.message
    assert Feed(decider())(E.gtid(0, anonymous=True)).action == D.SEND  # file/position: sent


# -- fillers ----------------------------------------------------------------------------------------------


def test_a_filler_repositions_a_file_position_replica_before_the_next_event():
    feed = Feed(decider())
    past = feed.filler()
    assert not feed.d.plain()
    decision = feed(E.gtid(3))
    assert decision.action == D.SEND and decision.reposition == past and decision.heartbeat == 0
    assert feed.d.reposition == 0


def test_a_filler_is_told_to_an_auto_position_replica_by_a_heartbeat():
    d = decider()
    d.exclude = GtidSet()
    feed = Feed(d)
    past = feed.filler()
    decision = feed(E.gtid(3))
    assert decision.heartbeat == past and decision.reposition == 0


def test_a_filler_is_a_hole_a_mariadb_replica_tolerates():
    feed = Feed(decider(MARIA_FDE, capability=4))
    feed.filler()
    assert feed.d.plain()
    assert feed(E.maria_gtid(5)).reposition == 0
    old = Feed(decider(MARIA_FDE, capability=1))
    past = old.filler()
    assert old(E.maria_gtid(5)).reposition == past


# -- MariaDB GTID -----------------------------------------------------------------------------------------


def maria_decider(state: dict, binlog=None, **kw) -> D.EventDecider:
    d = decider(MARIA_FDE, capability=4, binlog_gtids=(lambda: binlog), **kw)
    d.maria_state = {dom: MariaStart(MariaGtid(*gtid), empty) for dom, (gtid, empty) in state.items()}
    return d


def test_a_domain_start_met_mid_file_ends_skipping_with_a_fake_gtid_list():
    d = maria_decider({0: ((0, 1, 6), False)})
    feed = Feed(d)
    before = [feed(ev) for ev in maria_trx(5) + maria_trx(6)]
    assert actions(before) == ["SKIP"] * 10
    assert before[-1].gtid_list and not any(x.gtid_list for x in before[:-1])  # after the start's group
    assert d.maria_state == {} and MariaGtid(0, 1, 6) in list(d.maria_seen)
    assert actions(feed(ev) for ev in maria_trx(7)) == ["SEND"] * 5
    assert d.plain()


def test_other_domains_go_on_while_one_looks_for_its_start():
    d = maria_decider({0: ((0, 1, 9), False)})
    feed = Feed(d)
    assert actions(feed(ev) for ev in maria_trx(4, domain=1)) == ["SEND"] * 5
    assert actions(feed(ev) for ev in maria_trx(8, domain=0)) == ["SKIP"] * 5
    assert d.maria_state  # still looking


def test_strict_mode_refuses_a_hole_at_the_start():
    d = maria_decider({0: ((0, 1, 6), False)}, maria_strict=True)
    decision = Feed(d)(E.maria_gtid(8))
    assert decision.action == D.END and decision.failure.message == MSG_MARIA_HOLE % (MariaGtid(0, 1, 6),)


def test_an_empty_domain_checks_the_binlog_state_when_its_first_group_arrives():
    missing = maria_decider({2: ((2, 1, 5), True)}, binlog=MariaBinlogState([MariaGtid(2, 1, 3)]))
    decision = Feed(missing)(E.maria_gtid(4, domain=2))
    assert decision.action == D.END and "not in the master's binlog" in decision.failure.message
    present = maria_decider({2: ((2, 1, 5), True)}, binlog=MariaBinlogState([MariaGtid(2, 1, 9)]))
    assert Feed(present)(E.maria_gtid(4, domain=2)).action == D.SKIP


def annotate(text: bytes = b"INSERT INTO t VALUES (1)") -> bytes:
    return E.event(C.MARIA_ANNOTATE_ROWS_EVENT, text)


@pytest.mark.parametrize("capability, flag, expected", [
    (4, False, "OMIT"), (2, False, "OMIT"), (1, False, "SEND"), (0, False, "REPLACE"), (4, True, "SEND"),
    (0, True, "SEND"),
], ids=["cap4", "cap2", "cap1", "cap0", "cap4-flag", "cap0-flag"])
def test_annotate_rows_without_the_flag(capability, flag, expected):
    feed = Feed(decider(MARIA_FDE, capability=capability, send_annotate=flag))
    feed(E.maria_gtid(3))
    decision = feed(annotate())
    assert D.ACTION_NAMES[decision.action] == expected
    if expected == "REPLACE":
        assert len(decision.event) == len(annotate()) and decision.event[4] == C.QUERY_EVENT  # same size dummy


def test_an_annotate_too_short_for_a_dummy_ends_the_dump():
    feed = Feed(decider(MARIA_FDE, capability=0))
    feed(E.maria_gtid(3))
    assert feed(annotate(b"")).action == D.END


def test_a_gtid_event_for_a_replica_that_cannot_take_it():
    trx_gtid = E.maria_gtid(3)
    standalone = E.maria_gtid(4, flags2=C.FL_STANDALONE)
    old = Feed(decider(MARIA_FDE, capability=0))
    begin = old(trx_gtid)
    assert begin.action == D.REPLACE and begin.event.endswith(b"BEGIN" + begin.event[-4:])
    assert len(begin.event) == len(trx_gtid)
    for ev in [E.query("BEGIN"), E.xid(3)]:
        old(ev)
    dummy = old(standalone)
    assert dummy.action == D.REPLACE and len(dummy.event) == len(standalone)
    holes = Feed(decider(MARIA_FDE, capability=2))
    assert holes(trx_gtid).action == D.REPLACE
    holes(E.xid(3))
    assert holes(standalone).action == D.OMIT


CHECKPOINT = E.event(C.MARIA_BINLOG_CHECKPOINT_EVENT, struct.pack("<I", 4) + b"b.01")
GTID_LIST = E.event(C.MARIA_GTID_LIST_EVENT, struct.pack("<I", 1) + struct.pack("<IIQ", 0, 1, 3))


@pytest.mark.parametrize("event, capability, expected", [
    (CHECKPOINT, 2, "OMIT"), (CHECKPOINT, 0, "REPLACE"), (CHECKPOINT, 3, "SEND"),
    (GTID_LIST, 3, "OMIT"), (GTID_LIST, 1, "REPLACE"), (GTID_LIST, 4, "SEND"),
    (E.event(C.MARIA_GTID_LIST_EVENT, struct.pack("<I", 0)), 1, "END"),  # too short for a same-size dummy
], ids=["checkpoint-2", "checkpoint-0", "checkpoint-3", "list-3", "list-1", "list-4", "short-list-1"])
def test_events_of_types_an_old_replica_cannot_take(event, capability, expected):
    decision = Feed(decider(MARIA_FDE, capability=capability))(event)
    assert D.ACTION_NAMES[decision.action] == expected
    if expected == "REPLACE":
        assert len(decision.event) == len(event)


def test_skip_replication_leaves_marked_events_out():
    marked = E.query("CREATE TABLE t (a INT)", flags=C.LOG_EVENT_SKIP_REPLICATION_F)
    feed = Feed(decider(MARIA_FDE, capability=4, skip_replication=True))
    feed(E.maria_gtid(3, flags2=C.FL_STANDALONE))
    assert feed(marked).action == D.OMIT
    other = Feed(decider(MARIA_FDE, capability=4))
    other(E.maria_gtid(3, flags2=C.FL_STANDALONE))
    assert other(marked).action == D.SEND


def test_the_decider_touches_no_io():
    source = open(D.__file__, encoding="utf-8").read()
    for word in ("import asyncio", "import socket", "open(", "import os", "import time"):
        assert word not in source


# -- against the sender as it was, and the sender against the decisions alone ------------------------------


@pytest.fixture(scope="module")
def files(corpus_dir, manifest):
    return cases_mod.load_files(corpus_dir, manifest)


def test_the_sender_reproduces_the_traces_captured_before_the_split(files):
    golden = json.loads(gzip.decompress(cases_mod.GOLDEN.read_bytes()))
    assert golden["files"] == cases_mod.files_digest(files), "the corpus changed: capture the traces again"
    made = cases_mod.cases(files, len(golden["traces"]), golden["seed"])
    differ = [i for i, (case, digest) in enumerate(zip(made, golden["traces"]))
              if cases_mod.trace_digest(cases_mod.run_sender(case, files)) != digest]
    assert differ == [], f"{len(differ)} of {len(made)} cases send other bytes than before, e.g. {made[differ[0]]}"
    assert len(made) >= 3000


def run_decisions(case: dict, files: list) -> list:
    """The trace ``run_sender`` records, made from the decider alone: what each decision sends, framed as the
    sender frames it (prefix, heartbeat, fake ROTATE, fake GTID_LIST)."""
    sender, _channel, events, pos = cases_mod.make_sender(case, files)  # only for its settings and decider
    d = sender.decider
    crc = sender.event_alg == C.CHECKSUM_CRC32
    name, server_id = cases_mod.RELAY_FILE, sender.server_id

    def framed(event: bytes, ack: bool = False) -> str:
        prefix = (b"\x00\xef\x01" if ack else b"\x00\xef\x00") if sender.semi_sync else b"\x00"
        return cases_mod._digest(prefix + bytes(event))

    def heartbeat(at: int) -> str:
        if sender.flavour == "mariadb":
            return framed(encoders.heartbeat_v1(name, at, server_id, crc, mariadb=True))
        if sender.heartbeat_v2:
            return framed(encoders.heartbeat_v2(name, at, server_id, crc))
        return framed(encoders.heartbeat_v1(name, at & 0xFFFFFFFF, server_id, crc))

    trace: list = []
    for ev in events:
        _ts, type_code, _sid, size, _lp, flags = HEADER.unpack_from(ev, 0)
        if type_code == C.IGNORABLE_LOG_EVENT and flags & C.LOG_EVENT_IGNORABLE_F:
            d.filler(pos + size)
            pos += size
            trace.append([pos, []])
            continue
        decision = d.decide(memoryview(ev), 0, size, pos, type_code, flags, crc,
                            1.0 if sender.heartbeat_period == 0.5 else 0.0)
        if decision.action == D.END:
            f = decision.failure
            trace.append(["END", f.code, f.message, f.with_position, f.last_event, f.last_byte])
            return trace
        sent = []
        if decision.heartbeat:
            sent.append(heartbeat(decision.heartbeat))
        if decision.action != D.SKIP:
            if decision.reposition:
                sent.append(framed(encoders.artificial_rotate(name, decision.reposition, server_id, crc)))
            if decision.action == D.SEND:
                sent.append(framed(ev, decision.ack))
            elif decision.action == D.REPLACE:
                sent.append(framed(decision.event, decision.ack))
        pos += size
        if decision.gtid_list:
            sent.append(framed(encoders.gtid_list(d.maria_seen, server_id, pos & 0xFFFFFFFF, crc,
                                                  header_flags=C.LOG_EVENT_ARTIFICIAL_F)))
        trace.append([pos, sent])
    trace.append(["OWED", d.skip_end, sender._plain()])
    return trace


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_for_any_corpus_sequence_and_start_state_the_decisions_are_what_the_sender_sends(files, seed):
    case = cases_mod.make_case(random.Random(seed), files)
    assert run_decisions(case, files) == cases_mod.run_sender(case, files)
