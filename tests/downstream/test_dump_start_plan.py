"""The dump start's pure decisions (downstream/dump/start.py): each server rule fed facts, no relay, no socket.

The driver that reads those facts (StartReader) runs in tests/downstream/test_downstream_dump.py against real
relay files; here each decision is checked on its own, with the servers' texts, and the purged-set arithmetic
against its definition for any files and replica (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from relayproxy.downstream.dump import errors as DE
from relayproxy.downstream.dump.errors import DumpFailure
from relayproxy.downstream.dump.start import (
    MariaStart,
    StartRequest,
    check_maria_state,
    check_not_ahead,
    check_position,
    check_request,
    choose_maria_file,
    choose_mysql_file,
    durable_names,
    maria_request,
    master_uuids,
    missing_purged,
    purge_gaps,
    replica_gtids,
    start_file,
)
from relayproxy.relay.catalog import FileInfo

A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
B = "4f22ab58-82db-22f2-af44-d91bb0530673"


def info(name: str, start) -> FileInfo:
    return FileInfo(name, 1000, GtidSet(start) if isinstance(start, str) else start, None)


def test_requests_refused_before_anything_is_read():
    with pytest.raises(DumpFailure) as refused:
        check_request(StartRequest(mode="mysql-gtid", kind="mysql-gtid", flavour="mariadb"))
    assert refused.value.message == "Unknown command" and refused.value.sqlstate == "08S01"
    with pytest.raises(DumpFailure, match="unknown dump request kind 'odd'"):
        check_request(StartRequest(mode="odd", kind="odd", flavour="mysql"))
    check_request(StartRequest(mode="file", kind="file", flavour="mariadb"))
    with pytest.raises(DumpFailure, match="Malformed GTID set encoding"):
        replica_gtids(b"\x05")
    assert replica_gtids(GtidSet(f"{A}:1-3").encode()) == GtidSet(f"{A}:1-3")


def test_durable_names_end_at_the_horizon_file():
    names = ["b.000001", "b.000002", "b.000003"]
    assert durable_names(names, "b.000002") == ["b.000001", "b.000002"]
    assert durable_names(names, None) == names  # nothing durable yet: every file (each is empty to a reader)
    assert durable_names(names, "other.000001") == []


def test_file_and_position_checks_carry_each_servers_text():
    assert start_file("", ["b.000001", "b.000002"]) == "b.000001"
    with pytest.raises(DumpFailure) as refused:
        start_file("b.000009", ["b.000001"])
    assert refused.value.message == DE.MSG_NO_FILE
    plan = check_position("mysql", "b.000001", "b.000001", 120, 500)
    assert (plan.file, plan.position, plan.exclude, plan.maria_state) == ("b.000001", 120, None, ())
    with pytest.raises(DumpFailure) as refused:
        check_position("mysql", "b.000001", "b.000001", 3, 500)
    assert refused.value.message == DE.MSG_POS_LT_4
    with pytest.raises(DumpFailure) as refused:
        check_position("mysql", "b.000001", "b.000001", 501, 500)  # past the durable size
    assert refused.value.message == DE.MSG_POS_GT_SIZE
    with pytest.raises(DumpFailure) as refused:
        check_position("mariadb", "b.000001", "b.000001", 501, 500)
    assert refused.value.message.startswith(DE.MSG_MARIA_IMPOSSIBLE_POS)
    assert "the first event 'b.000001' at 501" in refused.value.message
    assert check_position("mariadb", "b.000001", "b.000001", 500, 500).position == 500


def test_a_replica_ahead_of_the_master_is_refused_for_the_masters_uuid_only():
    relay = GtidSet(f"{A}:1-10,{B}:1-3")
    check_not_ahead(GtidSet(f"{A}:1-10,{B}:1-99"), relay, [A], modern=True)  # B is not the master's
    with pytest.raises(DumpFailure) as refused:
        check_not_ahead(GtidSet(f"{A}:1-11"), relay, [A], modern=True)
    assert refused.value.message == DE.MSG_MORE_GTIDS[True]
    assert master_uuids(A.upper() + " ", relay) == [A]
    assert sorted(master_uuids(None, relay)) == sorted([A, B])  # master unknown: every UUID the files hold


def test_the_newest_file_whose_previous_gtids_the_replica_has():
    infos = [info("b.1", f"{A}:1-5"), info("b.2", f"{A}:1-10"), info("b.3", f"{A}:1-20")]
    assert choose_mysql_file(infos, GtidSet(f"{A}:1-12"), modern=False).name == "b.2"
    assert choose_mysql_file(infos, GtidSet(f"{A}:1-30"), modern=False).name == "b.3"
    with pytest.raises(DumpFailure) as refused:
        choose_mysql_file(infos, GtidSet(f"{A}:1-2"), modern=False)
    assert refused.value.message == DE.MSG_PURGED[False] % (f"{A}:1-2", f"{A}:3-5")
    with pytest.raises(DumpFailure) as refused:
        choose_mysql_file([info("b.1", None), info("b.2", f"{A}:1-10")], GtidSet(f"{A}:1-2"), modern=False)
    assert refused.value.message == DE.MSG_OLD_BINLOG


def test_purged_needs_a_scan_only_where_the_replica_lacks_something():
    infos = [info("b.1", f"{A}:1-5"), info("b.2", f"{A}:1-10"), info("b.3", f"{A}:1-20")]
    assert purge_gaps(infos, GtidSet(f"{A}:1-20")) == []  # caught up: no scan
    gaps = purge_gaps(infos, GtidSet(f"{A}:1-12"))
    assert [name for name, _gap in gaps] == ["b.2"]
    held = {"b.2": GtidSet(f"{A}:11-18")}  # 19-20 were in b.2's range but are not there: purged
    assert missing_purged(infos, GtidSet(f"{A}:1-12"), gaps, held) == GtidSet(f"{A}:19-20")
    assert not missing_purged(infos, GtidSet(f"{A}:1-12"), gaps, {"b.2": GtidSet(f"{A}:11-20")})


@settings(max_examples=200, deadline=None)
@given(
    bounds=st.lists(st.integers(0, 40), min_size=1, max_size=5),
    holes=st.lists(st.integers(1, 40), max_size=8),
    replica_top=st.integers(0, 45),
    replica_gap=st.integers(1, 45),
)
def test_missing_purged_is_purged_minus_replica(bounds, holes, replica_top, replica_gap):
    """purged = start(oldest) ∪ ⋃ (start(f_i+1) − start(f_i) − events(f_i)); the lazy form gives purged − replica
    whatever files, holes and replica, scanning only the files it names."""
    tops = sorted(bounds)
    infos = [info(f"b.{i}", GtidSet(f"{A}:1-{t}") if t else GtidSet()) for i, t in enumerate(tops)]
    events = {}
    for i, (lo, hi) in enumerate(zip(tops, tops[1:])):
        held = GtidSet()
        for gno in range(lo + 1, hi + 1):
            if gno not in holes:
                held.add(A, gno)
        events[f"b.{i}"] = held
    replica = GtidSet(f"{A}:1-{replica_top}") if replica_top else GtidSet()
    if replica_gap <= replica_top:
        replica = replica.subtract(GtidSet(f"{A}:{replica_gap}"))
    purged = infos[0].start_gtids.subtract(GtidSet())
    for i, (older, newer) in enumerate(zip(infos, infos[1:])):
        purged.update(newer.start_gtids.subtract(older.start_gtids).subtract(events[f"b.{i}"]))
    gaps = purge_gaps(infos, replica)
    assert {name for name, _gap in gaps} <= set(events)
    assert missing_purged(infos, replica, gaps, {n: events[n] for n, _gap in gaps}) == purged.subtract(replica)


def test_mariadb_position_checks_and_the_start_file():
    with pytest.raises(DumpFailure) as refused:
        maria_request("not a gtid")
    assert refused.value.message == DE.MSG_MARIA_BAD_STATE
    state = maria_request("0-1-5,7-2-3")
    binlog = MariaBinlogState([MariaGtid(0, 1, 9)])
    checked = check_maria_state(state, binlog, ignore_duplicates=False)
    assert checked[7].empty_domain and not checked[0].empty_domain  # domain 7: nothing here (yet)
    assert not state[7].empty_domain  # the request's own state is left as it was
    with pytest.raises(DumpFailure):
        check_maria_state(maria_request("0-1-10"), binlog, ignore_duplicates=False)  # past the binlog
    assert check_maria_state(maria_request("0-1-10"), binlog, ignore_duplicates=True)[0].gtid == MariaGtid(0, 1, 10)

    lists = [info("m.1", MariaBinlogState()), info("m.2", MariaBinlogState([MariaGtid(0, 1, 5)])),
             info("m.3", MariaBinlogState([MariaGtid(0, 1, 8)]))]
    plan = choose_maria_file({0: MariaStart(MariaGtid(0, 1, 5))}, lists)
    assert (plan.file, plan.position, plan.maria_state) == ("m.2", 4, ())  # the GTID_LIST's own last: start here
    plan = choose_maria_file({0: MariaStart(MariaGtid(0, 1, 6))}, lists)
    assert plan.file == "m.2" and plan.maria_state == (MariaStart(MariaGtid(0, 1, 6)),)
    plan = choose_maria_file({0: MariaStart(MariaGtid(0, 1, 6))}, [info("m.0", None)] + lists[1:2])
    assert plan.file == "m.2"
    with pytest.raises(DumpFailure) as refused:
        choose_maria_file({0: MariaStart(MariaGtid(0, 1, 3))}, lists[1:])
    assert refused.value.message == DE.MSG_MARIA_NO_STATE
    assert choose_maria_file({0: MariaStart(MariaGtid(0, 1, 3))}, [info("m.0", None)]).file == "m.0"
