"""pitr's decisions before it acts: the start (resume from what the target applied, never back to the backup's),
what is past the stop, the backup's position file, times and zones."""

from __future__ import annotations

from datetime import timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, strategies as st

from relayproxy.binlog.gtid import MariaGtid, MariaGtidPosition
from relayproxy.commands import pitr_plan as PP

pos = MariaGtidPosition.parse


def test_the_start_is_the_backup_position_on_a_fresh_restore():
    start = PP.decide_start(pos(""), pos("0-1-100,1-2-7"), "backup")
    assert str(start.position) == "0-1-100,1-2-7" and start.set_slave_pos and not start.resumed


def test_a_run_again_continues_from_what_the_target_applied():
    start = PP.decide_start(pos("0-1-150,1-2-7"), pos("0-1-100,1-2-7"), "backup")
    assert str(start.position) == "0-1-150,1-2-7" and not start.set_slave_pos and start.resumed


def test_a_domain_the_target_lacks_is_taken_from_the_backup():
    start = PP.decide_start(pos("0-1-150"), pos("0-1-100,1-2-7"), "backup")
    assert str(start.position) == "0-1-150,1-2-7" and start.set_slave_pos


def test_no_start_at_all_is_refused():
    with pytest.raises(PP.PlanRefusal, match="gtid_slave_pos is empty"):
        PP.decide_start(pos(""), None, "")


def test_past_the_stop_names_the_transactions():
    past = PP.past_stop(pos("0-1-120,1-2-9"), pos("0-1-110,1-2-9"))
    assert past == ["domain 0: 0-1-120 (the stop is at 0-1-110; transactions 0-*-111..120 are past it)"]
    assert PP.past_stop(pos("0-1-110"), pos("0-1-110")) == []


positions = st.dictionaries(st.integers(0, 3), st.tuples(st.integers(1, 3), st.integers(1, 1000)), max_size=4).map(
    lambda d: MariaGtidPosition([MariaGtid(dom, sid, seq) for dom, (sid, seq) in d.items()]))


@given(positions, positions)
def test_the_start_never_goes_back_per_domain(target, given_start):
    start = PP.decide_start(target, given_start, "x") if len(target) or len(given_start) else None
    if start is None:
        return
    for g in list(target) + list(given_start):
        assert start.position.get(g.domain_id).seq_no >= g.seq_no
    assert start.set_slave_pos == (start.position != target)


@given(positions, positions)
def test_reached_and_past_agree(current, stop):
    if PP.reached(current, stop):
        assert PP.past_stop(current, stop) == [] and PP.remaining_domains(current, stop) == []


def test_backup_info_files(tmp_path):
    (tmp_path / "mariadb_backup_binlog_info").write_text("master-bin.000004\t3310\t0-1-2041\n")
    info = PP.read_backup_info(tmp_path)
    assert (info.file, info.position, str(info.gtid)) == ("master-bin.000004", 3310, "0-1-2041")
    (tmp_path / "mariadb_backup_binlog_info").write_text("master-bin.000004\t3310\n")
    with pytest.raises(PP.PlanRefusal, match="no GTID position"):
        PP.read_backup_info(tmp_path)
    (tmp_path / "mariadb_backup_binlog_info").write_text("garbage")
    with pytest.raises(PP.PlanRefusal, match="expected"):
        PP.read_backup_info(tmp_path)
    with pytest.raises(PP.PlanRefusal, match="not a directory"):
        PP.read_backup_info(tmp_path / "nothing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(PP.PlanRefusal, match="no mariadb_backup_binlog_info or xtrabackup_binlog_info"):
        PP.read_backup_info(empty)


def test_times_with_and_without_zones():
    utc = PP.parse_moment("2026-12-02 14:02:17Z", None, "")
    assert utc.micros == 1796220137 * 1_000_000 and not utc.assumed_zone and not utc.fractional
    berlin = PP.parse_moment("2026-12-02 15:02:17.5", ZoneInfo("Europe/Berlin"), "Europe/Berlin")
    assert berlin.micros == utc.micros + 500_000 and berlin.assumed_zone and berlin.fractional
    assert PP.parse_moment("2026-12-02T14:02:17+00:00", None, "").micros == utc.micros
    assert utc.utc_text() == "2026-12-02 14:02:17.000000"
    with pytest.raises(PP.PlanRefusal, match="no time zone"):
        PP.parse_moment("2026-12-02 14:02:17", None, "")
    with pytest.raises(PP.PlanRefusal, match="expected 'YYYY-MM-DD"):
        PP.parse_moment("yesterday", timezone.utc, "UTC")


def test_a_time_without_a_zone_is_read_with_the_local_zones_rules_at_that_date(monkeypatch):
    """The default zone is the machine's local time at the date asked for, not the offset in force now: in Berlin a
    July noon is 10:00 UTC (summer time) and a December noon 11:00 UTC, whatever the season the command runs in."""
    import time as _time

    monkeypatch.setenv("TZ", "Europe/Berlin")
    _time.tzset()
    try:
        summer = PP.parse_moment("2026-07-15 12:00:00", PP.LOCAL_ZONE, "local")
        winter = PP.parse_moment("2026-12-15 12:00:00", PP.LOCAL_ZONE, "local")
        assert summer.assumed_zone and summer.utc_text() == "2026-07-15 10:00:00.000000"
        assert winter.utc_text() == "2026-12-15 11:00:00.000000"
        assert PP.parse_moment("2026-07-15 12:00:00Z", PP.LOCAL_ZONE, "local").utc_text() == \
            "2026-07-15 12:00:00.000000"  # an offset given wins
    finally:
        monkeypatch.delenv("TZ")
        _time.tzset()


def test_a_domain_the_stop_has_not_reached_yet_is_past_it_for_a_target_that_has_it():
    past = PP.past_stop(pos("0-1-50"), pos(""), pos("0-1-900"))
    assert past == ["domain 0: 0-1-50 (the stop is before the relay's first transaction of domain 0)"]
    assert PP.past_stop(pos("5-1-50"), pos(""), pos("0-1-900")) == []  # a domain the relay never had
