"""TransactionBoundaryParser against the reference transition table and the documented group shapes."""

from __future__ import annotations

import pathlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.binlog import boundary as B
from relayproxy.binlog import constants as C
from relayproxy.binlog.events import FormatDescription

from ..support import eventgen as E

REFERENCE = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "docs" / "protocol-reference.md"
MYSQL_FDE = FormatDescription.parse(E.fde("8.0.36"), 0)
MARIA_FDE = FormatDescription.parse(E.fde("10.11.6-MariaDB-log", n_types=171), 0)

# One or more real events for every boundary type of get_event_boundary_type().
SAMPLES = {
    "GTID": [E.gtid(1), E.gtid(0, anonymous=True)],
    "BEGIN_TRX": [E.query("BEGIN"), E.query("XA START X'31',X'',1")],
    "END_TRX": [E.xid(), E.query("COMMIT"), E.query("ROLLBACK"), E.query("rollback"), E.xa_prepare()],
    "END_XA_TRX": [E.query("XA ROLLBACK X'31',X'',1"), E.query("xa rollback X'32',X'',1")],
    "PRE_STATEMENT": [E.intvar(), E.rand(), E.user_var()],
    "STATEMENT": [
        E.query("INSERT INTO t VALUES (1)"),
        E.query("ROLLBACK TO sp1"),
        E.query("SAVEPOINT sp1"),
        E.query("XA END X'31',X'',1"),
        E.query("XA COMMIT X'31',X'',1"),
        E.query("CREATE TABLE t (a INT)"),
        E.query("begin"),  # strncmp is case-sensitive: lower-case begin is a statement
        E.table_map(),
        E.write_rows(),
    ],
    "TRX_PAYLOAD": [E.payload()],
    "INCIDENT": [E.incident()],
    "IGNORE": [E.rotate(), E.heartbeat(), E.previous_gtids(), E.unknown(ignorable=True)],
    "ERROR": [E.unknown(ignorable=False), E.query(b"")],
}
# Events that put a fresh parser into each state.
ENTER = {
    "NONE": [],
    "GTID": [E.gtid(1)],
    "DDL": [E.intvar()],
    "DML": [E.query("BEGIN")],
    "ERROR": [E.unknown(ignorable=False)],
}


def reference_table() -> dict[tuple[str, str], tuple[str, bool]]:
    """Parse the MySQL transition table out of protocol-reference.md §1.1."""
    text = REFERENCE.read_text()
    section = text.split("**Transition table**", 1)[1].split("Notes on the table", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    columns = header[1:]
    table = {}
    for line in rows[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        state = cells[0]
        for column, cell in zip(columns, cells[1:]):
            is_error = "err" in cell
            m = re.search(r"→\s*([A-Z]+)", cell)
            if m:
                target = m.group(1)
            elif "state→NONE" in cell:
                target = "NONE"
            else:
                target = cell.split(",")[0].strip()  # IGNORE column: the state itself
            table[(state, column)] = (target, is_error)
    return table


def parser_in(state: str) -> B.TransactionBoundaryParser:
    p = B.TransactionBoundaryParser("mysql", MYSQL_FDE)
    for ev in ENTER[state]:
        p.feed_event(ev)
    assert p.state_name == state
    return p


def test_reference_table_is_complete():
    table = reference_table()
    assert len(table) == 5 * 10
    assert table[("NONE", "GTID")] == ("GTID", False)
    assert table[("DML", "END_TRX")] == ("NONE", False)
    assert table[("ERROR", "STATEMENT")] == ("NONE", True)


@pytest.mark.parametrize("state", list(ENTER))
@pytest.mark.parametrize("boundary", list(SAMPLES))
def test_every_transition_matches_reference(state, boundary):
    expected_state, expected_error = reference_table()[(state, boundary)]
    for ev in SAMPLES[boundary]:
        p = parser_in(state)
        was_inside = p.in_group
        result = p.feed_event(ev)
        assert p.state_name == expected_state, (state, boundary, ev)
        assert bool(result & B.FLAG_ERROR) == expected_error, (state, boundary, ev, p.error)
        kind = result & B.RESULT_MASK
        if boundary == "IGNORE":
            assert kind == (B.GROUP_CONTINUE if was_inside else B.EVENT_OUTSIDE)
        elif p.in_group:
            assert kind == (B.GROUP_CONTINUE if was_inside and boundary != "GTID" else B.GROUP_START)
        else:
            assert kind == B.GROUP_END
        if expected_error:
            assert p.error, "an error transition must say why"


def feed_all(p, events):
    return [p.feed_event(ev) for ev in events]


def kinds(results):
    return [B.RESULT_NAMES[r & B.RESULT_MASK] for r in results]


def test_documented_shapes():
    p = B.TransactionBoundaryParser("mysql", MYSQL_FDE)
    # DDL with pre-statement events (Ripple gets this one wrong)
    assert kinds(feed_all(p, [E.gtid(1), E.intvar(), E.user_var(), E.query("CREATE TABLE t (a INT)")])) == [
        "start", "continue", "continue", "end"]
    assert p.gtid == (E.MYSQL_SID, 1)
    # DML with rows query, rows and XID
    assert kinds(feed_all(p, [E.gtid(2), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid()])) == [
        "start", "continue", "continue", "continue", "end"]
    # XA prepare, then XA COMMIT as its own standalone group, then XA ROLLBACK
    assert kinds(feed_all(p, [E.gtid(3), E.query("XA START X'31',X'',1"), E.write_rows(),
                              E.query("XA END X'31',X'',1"), E.xa_prepare()]))[-1] == "end"
    assert kinds(feed_all(p, [E.gtid(4), E.query("XA COMMIT X'31',X'',1")])) == ["start", "end"]
    assert kinds(feed_all(p, [E.gtid(5), E.query("XA ROLLBACK X'32',X'',1")])) == ["start", "end"]
    # one-phase XA commit ends at XA_PREPARE(one_phase=1)
    assert kinds(feed_all(p, [E.gtid(6), E.query("XA START X'33',X'',1"), E.query("XA END X'33',X'',1"),
                              E.xa_prepare(one_phase=True)]))[-1] == "end"
    # compressed transaction: GTID + payload
    assert kinds(feed_all(p, [E.gtid(7), E.payload()])) == ["start", "end"]
    assert p.gtid == (E.MYSQL_SID, 7)
    # ignorable events inside a transaction keep it open
    assert kinds(feed_all(p, [E.gtid(8), E.query("BEGIN"), E.rotate(), E.heartbeat(), E.previous_gtids(),
                              E.unknown(ignorable=True), E.xid()])) == [
        "start", "continue", "continue", "continue", "continue", "continue", "end"]
    # savepoints and ROLLBACK TO stay inside; ROLLBACK ends
    assert kinds(feed_all(p, [E.gtid(9), E.query("BEGIN"), E.query("SAVEPOINT a"), E.query("ROLLBACK TO a"),
                              E.query("ROLLBACK")])) == ["start", "continue", "continue", "continue", "end"]
    assert p.errors == 0


def test_pre_gtid_streams_and_anonymous_groups():
    p = B.TransactionBoundaryParser("mysql", FormatDescription.parse(E.fde("5.1.73-log", checksum=False), 0))
    assert kinds(feed_all(p, [E.query("CREATE TABLE t (a INT)", checksum=False)])) == ["end"]
    assert p.gtid is None
    assert kinds(feed_all(p, [E.query("BEGIN", checksum=False), E.query("INSERT INTO t VALUES (1)", checksum=False),
                              E.xid(checksum=False)])) == ["start", "continue", "end"]
    p = B.TransactionBoundaryParser("mysql", MYSQL_FDE)
    assert kinds(feed_all(p, [E.gtid(0, anonymous=True), E.query("BEGIN"), E.xid()])) == ["start", "continue", "end"]
    assert p.gtid is None


def test_truncated_group_followed_by_gtid_is_abandoned():
    p = B.TransactionBoundaryParser("mysql", MYSQL_FDE)
    feed_all(p, [E.gtid(1), E.query("BEGIN"), E.write_rows()])
    r = p.feed_event(E.gtid(2))
    assert r & B.FLAG_ABANDONED and r & B.FLAG_ERROR and r & B.RESULT_MASK == B.GROUP_START
    assert "truncated" in p.error
    assert p.gtid == (E.MYSQL_SID, 2)
    assert kinds(feed_all(p, [E.query("BEGIN"), E.xid()])) == ["continue", "end"]


def test_incident_discards_open_group():
    p = B.TransactionBoundaryParser("mysql", MYSQL_FDE)
    feed_all(p, [E.gtid(1), E.query("BEGIN"), E.write_rows()])
    r = p.feed_event(E.incident())
    assert r & B.FLAG_ABANDONED and r & B.RESULT_MASK == B.GROUP_END and not r & B.FLAG_ERROR
    assert p.gtid is None and p.is_at_boundary


def test_reset_and_rollback():
    p = B.TransactionBoundaryParser("mysql", MYSQL_FDE)
    feed_all(p, [E.gtid(1), E.query("BEGIN")])
    p.checkpoint()
    p.feed_event(E.xid())
    assert p.is_at_boundary
    p.rollback()
    assert p.state_name == "DML" and p.gtid == (E.MYSQL_SID, 1)
    p.reset()
    assert p.is_at_boundary and p.gtid is None


def test_query_classification_reads_only_the_head():
    """A multi-megabyte query is classified from the first bytes: the parser never needs the whole event."""
    big = E.query("INSERT INTO t VALUES " + "(1)," * 500_000 + "(1)")
    p = B.TransactionBoundaryParser("mysql", MYSQL_FDE)
    size = len(big)
    head = big[:200]
    assert p.feed(C.QUERY_EVENT, 0, head, 0, size) == B.GROUP_END


# ---------------------------------------------------------------------------------------------
# MariaDB flavour


def maria() -> B.TransactionBoundaryParser:
    return B.TransactionBoundaryParser("auto", MARIA_FDE)


def test_mariadb_flavour_selected_from_fde():
    assert maria().flavour == "mariadb"
    p = B.TransactionBoundaryParser("auto", FormatDescription.parse(E.fde("5.5.68-MariaDB", n_types=163), 0))
    assert p.flavour == "mysql"  # no GTID events before 10.0: MySQL rules


def test_a_flavour_given_with_an_fde_is_the_one_used():
    """Until 2026-12-07 ``TransactionBoundaryParser("mariadb", fde)`` parsed by MySQL's rules (only "auto" took the
    flavour from the FDE, and the constructor chose none when one was given): the soak's parser fuzzer and the
    random-sequence property test above ran MySQL's rules under the name "mariadb"."""
    for fde in (MARIA_FDE, MYSQL_FDE):
        p = B.TransactionBoundaryParser("mariadb", fde)
        assert p.flavour == "mariadb" and p.feed == p._feed_mariadb
        assert p.feed_event(E.maria_gtid(1)) & B.RESULT_MASK == B.GROUP_START
        q = B.TransactionBoundaryParser("mysql", fde)
        assert q.flavour == "mysql" and q.feed == q._feed_mysql


def test_mariadb_transactional_group():
    p = maria()
    assert kinds(feed_all(p, [E.maria_gtid(10, flags2=C.FL_TRANSACTIONAL), E.query("BEGIN"), E.table_map(),
                              E.write_rows(), E.xid()])) == ["start", "continue", "continue", "continue", "end"]
    assert p.gtid == (0, 1, 10)
    assert kinds(feed_all(p, [E.maria_gtid(11), E.query("BEGIN"), E.query("INSERT INTO t VALUES (1)"),
                              E.query("COMMIT")])) == ["start", "continue", "continue", "end"]
    assert kinds(feed_all(p, [E.maria_gtid(12), E.query("BEGIN"), E.query("ROLLBACK")]))[-1] == "end"
    # MariaDB's peek_is_commit_rollback is exact and case-sensitive: "commit" does not end the group
    assert kinds(feed_all(p, [E.maria_gtid(13), E.query("BEGIN"), E.query("commit")]))[-1] == "continue"


def test_mariadb_standalone_group_and_xa():
    p = maria()
    assert kinds(feed_all(p, [E.maria_gtid(1, flags2=C.FL_STANDALONE | C.FL_DDL),
                              E.query("CREATE TABLE t (a INT)")])) == ["start", "end"]
    assert kinds(feed_all(p, [E.maria_gtid(2, flags2=C.FL_STANDALONE), E.intvar(), E.user_var(),
                              E.query("INSERT INTO t VALUES (LAST_INSERT_ID())")])) == [
        "start", "continue", "continue", "end"]
    assert kinds(feed_all(p, [E.maria_gtid(3, flags2=C.FL_STANDALONE), E.incident()])) == ["start", "end"]
    assert kinds(feed_all(p, [E.maria_gtid(4, flags2=C.FL_PREPARED_XA), E.query("XA START X'31',X'',1"),
                              E.write_rows(), E.query("XA END X'31',X'',1"), E.xa_prepare()]))[-1] == "end"
    assert kinds(feed_all(p, [E.maria_gtid(5, flags2=C.FL_STANDALONE | C.FL_COMPLETED_XA),
                              E.query("XA COMMIT X'31',X'',1")])) == ["start", "end"]
    assert p.errors == 0


def test_mariadb_errors():
    p = maria()
    r = p.feed_event(E.query("INSERT INTO t VALUES (1)"))
    assert r & B.FLAG_ERROR and "non-GTID" in p.error
    feed_all(p, [E.maria_gtid(7), E.query("BEGIN")])
    r = p.feed_event(E.maria_gtid(8))
    assert r & B.FLAG_ABANDONED and "Unexpected break" in p.error and "0-1-7" in p.error
    # non-group events never open or close anything
    assert p.feed_event(E.rotate()) & B.RESULT_MASK == B.GROUP_CONTINUE


# ---------------------------------------------------------------------------------------------
# Robustness: any event sequence keeps the parser consistent and never raises.

ALL_SAMPLES = [ev for evs in SAMPLES.values() for ev in evs]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(range(len(ALL_SAMPLES))), max_size=40), st.sampled_from(["mysql", "mariadb"]))
def test_random_sequences_never_raise_and_stay_consistent(indices, flavour):
    p = B.TransactionBoundaryParser(flavour, MARIA_FDE if flavour == "mariadb" else MYSQL_FDE)
    for i in indices:
        was_inside = p.in_group
        r = p.feed_event(ALL_SAMPLES[i])
        kind = r & B.RESULT_MASK
        if kind in (B.EVENT_OUTSIDE, B.GROUP_END):
            assert p.is_at_boundary
        else:
            assert p.in_group
        if kind == B.GROUP_CONTINUE:
            assert was_inside
        if r & B.FLAG_ABANDONED:
            assert was_inside


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(range(len(ALL_SAMPLES))), max_size=40), st.integers(0, 40),
       st.sampled_from(["mysql", "mariadb", "auto"]))
def test_a_copy_holds_every_slot_and_classifies_the_rest_alike(indices, cut, flavour):
    """copy() writes each slot out by hand (a dump's hot path): a slot it forgot would show here."""
    p = B.TransactionBoundaryParser(flavour, MARIA_FDE if flavour == "mariadb" else MYSQL_FDE)
    for i in indices[:cut]:
        p.feed_event(ALL_SAMPLES[i])
    q = p.copy()
    for name in B.TransactionBoundaryParser.__slots__:
        if name != "feed":
            assert getattr(q, name) == getattr(p, name), name
    assert q.state_key() == p.state_key()
    for i in indices[cut:]:
        assert q.feed_event(ALL_SAMPLES[i]) == p.feed_event(ALL_SAMPLES[i])
        assert q.state_key() == p.state_key() and q.errors == p.errors


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=19, max_size=80), st.integers(0, 255))
def test_random_bytes_never_raise(body, type_code):
    for flavour, fde in (("mysql", MYSQL_FDE), ("mariadb", MARIA_FDE)):
        p = B.TransactionBoundaryParser(flavour, fde)
        raw = bytearray(body)
        raw[4] = type_code
        p.feed(type_code, 0, raw, 0, len(raw))
        p.feed(type_code, 0, raw, 0, len(raw) + 1000)  # size claims more than present
