"""The pure steps of recovery (relay/recovery.py): what it does with the index against the files present
(``plan_index``), which unlisted file it may adopt (``plan_adoption``), whether it trusts the durable mark
(``plan_mark``) and what it reports (``scan_note``, ``link_warnings``, ``join_warnings``). No I/O: names in, plans
out; ``recover`` applies them (tests/relay/test_relay_store.py covers that end to end)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from relayproxy.binlog.gtid import GtidSet
from relayproxy.relay.durable import DurableMark
from relayproxy.relay.epochs import Epochs
from relayproxy.relay.layout import DURABLE_MARK_NAME, INDEX_NAME
from relayproxy.relay.recovery import (
    AdoptionPlan,
    IndexPlan,
    Link,
    MarkPlan,
    RecoveryPlan,
    TailPlan,
    join_warnings,
    link_warnings,
    plan_adoption,
    plan_index,
    plan_mark,
    scan_note,
)

U = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
OTHER = "4f22fb58-82db-22f2-af44-d91bb0530673"
FILES = ["binlog.000001", "binlog.000002", "binlog.000003", "binlog.000004"]


def switched_epochs() -> Epochs:
    """Epoch 1 over binlog.000001-3, epoch 2 from binlog.000004 (the new master's mysql-bin.000007)."""
    return Epochs().next_epoch(
        index=FILES[:3], current_empty=False, master={"host": "m2", "port": 3306, "server_id": 2},
        upstream_first_file="mysql-bin.000007", join_gtids=f"{U}:1-10", started=1.0, relay_server_id=9,
    )


# -- the index --------------------------------------------------------------------------------------


def test_an_index_that_matches_the_files_is_kept_as_it_is():
    plan = plan_index(FILES, set(FILES))
    assert plan == IndexPlan(tuple(FILES))
    assert plan.refusal is None and not plan.rewrite and plan.warnings == []


def test_listed_files_missing_at_the_ends_are_dropped_with_a_warning_each():
    plan = plan_index(FILES, {"binlog.000002", "binlog.000003"})
    assert plan.names == ("binlog.000002", "binlog.000003")
    assert plan.dropped_head == ("binlog.000001",) and plan.dropped_tail == ("binlog.000004",)
    assert plan.refusal is None and plan.rewrite
    assert plan.warnings == [
        f"binlog.000001 is listed in {INDEX_NAME} but missing (an interrupted purge?): dropped from the index",
        f"binlog.000004 is listed in {INDEX_NAME} but missing (created, never written): dropped from the index",
    ]


def test_listed_files_missing_between_files_that_exist_refuse():
    plan = plan_index(FILES, {"binlog.000001", "binlog.000004"})
    assert plan.missing_middle == ("binlog.000002", "binlog.000003")
    assert plan.refusal == (
        f"relay files listed in {INDEX_NAME} are missing between files that exist: binlog.000002, binlog.000003; "
        "the relay would have a hole in the master's binlog"
    )


def test_an_index_whose_files_are_all_gone_keeps_none():
    plan = plan_index(FILES[:2], set())
    assert plan.names == () and plan.dropped_tail == tuple(FILES[:2]) and plan.dropped_head == ()
    assert plan.refusal is None and plan.rewrite


def test_files_present_but_not_listed_are_named_for_the_adoption_step():
    plan = plan_index(FILES[:2], {*FILES[:3], "notes.txt"})
    assert plan.names == tuple(FILES[:2]) and plan.unlisted == {"binlog.000003", "notes.txt"}
    assert not plan.rewrite  # adopting one is what rewrites the index then
    assert plan_index([], {"binlog.000001"}).unlisted == {"binlog.000001"}


def test_the_index_plan_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan_index(FILES, set(FILES)).names = ()  # type: ignore[misc]


# -- adoption ------------------------------------------------------------------------------------


def test_the_next_number_is_adopted_when_the_newest_file_has_no_final_rotate():
    plan = plan_adoption(FILES[:2], {"binlog.000003", "binlog.000009"}, epochs=Epochs(), final_rotate=None)
    assert plan == AdoptionPlan("binlog.000003", ("binlog.000009",))


def test_the_target_of_the_final_rotate_is_adopted_not_the_next_number():
    plan = plan_adoption(FILES[:2], {"binlog.000003", "binlog.000007"}, epochs=Epochs(), final_rotate="binlog.000007")
    assert plan == AdoptionPlan("binlog.000007", ("binlog.000003",))


def test_a_master_rotate_is_mapped_through_the_newest_files_epoch():
    # binlog.000004 is epoch 2's first file; its master's ROTATE names mysql-bin.000008, relay binlog.000005.
    epochs = switched_epochs()
    plan = plan_adoption(FILES, {"binlog.000005"}, epochs=epochs, final_rotate="mysql-bin.000008")
    assert plan == AdoptionPlan("binlog.000005", ())


def test_no_unlisted_file_fits_and_every_one_is_left_alone_sorted():
    plan = plan_adoption(FILES[:2], {"zz.000001", "binlog.000009"}, epochs=Epochs(), final_rotate=None)
    assert plan == AdoptionPlan(None, ("binlog.000009", "zz.000001"))


def test_with_no_listed_file_only_a_lone_unlisted_file_is_adopted():
    assert plan_adoption([], {"binlog.000042"}, epochs=Epochs(), final_rotate=None) == AdoptionPlan(
        "binlog.000042", ())
    assert plan_adoption([], {"a.000001", "b.000001"}, epochs=Epochs(), final_rotate=None) == AdoptionPlan(
        None, ("a.000001", "b.000001"))


# -- the durable mark ------------------------------------------------------------------------------


def test_a_mark_naming_a_relay_file_is_trusted():
    mark = DurableMark("binlog.000002", 1234)
    assert plan_mark(mark, FILES) == MarkPlan(mark)
    assert plan_mark(None, FILES) == MarkPlan(None)
    assert plan_mark(None, []) == MarkPlan(None)


def test_a_mark_naming_another_file_is_ignored_with_a_warning():
    assert plan_mark(DurableMark("binlog.000099", 4), FILES) == MarkPlan(
        None, f"{DURABLE_MARK_NAME} names binlog.000099, which is not a relay file here: ignored")
    assert plan_mark(DurableMark("binlog.000001", 4), []) == MarkPlan(
        None, f"{DURABLE_MARK_NAME} names binlog.000001 but the relay has no files")


# -- what the report says ------------------------------------------------------------------------


class _At:
    """A stand-in for a verified checkpoint: scan_note reads only its offset."""

    offset = 4096


def test_the_scan_note_says_where_the_scan_began():
    assert scan_note("binlog.000004", _At(), None) == "binlog.000004 scanned from the checkpoint at offset 4096"  # type: ignore[arg-type]
    assert scan_note("binlog.000004", None, "no checkpoint") == "binlog.000004 scanned whole: no checkpoint"


def test_link_warnings_name_files_without_a_rotate_to_the_next():
    links = [
        Link("binlog.000001", "binlog.000002", "binlog.000002", True),
        Link("binlog.000002", "binlog.000003", None, False),
        Link("binlog.000003", "binlog.000004", "binlog.000009", False),
    ]
    assert link_warnings(links) == [
        "binlog.000002 does not end with a ROTATE (the master restarted or the file was cut): next is binlog.000003",
        "binlog.000003 ends with a ROTATE to binlog.000009, but the next relay file is binlog.000004",
    ]
    assert link_warnings([]) == []


def _plan(newest: str, *, start_set=None, join_extra=None) -> RecoveryPlan:
    tail = TailPlan(newest, Path("/nowhere") / newest, 100, 100, start_set=start_set)
    return RecoveryPlan([newest], [], tail, join_extra=join_extra)


def test_a_join_file_naming_gtids_the_relay_never_had_is_warned_about():
    start = GtidSet.parse(f"{U}:1-10,{OTHER}:1-3")
    extra = GtidSet.parse(f"{OTHER}:1-3")
    assert join_warnings(_plan("binlog.000004", start_set=start, join_extra=extra), switched_epochs()) == [
        f"binlog.000004 (epoch 2) starts with the GTID set {start.format(',')}, which names {OTHER}:1-3 that the "
        "relay never had: counted as purged"
    ]


def test_no_join_warning_without_extra_gtids_or_outside_a_join_file():
    assert join_warnings(_plan("binlog.000004"), switched_epochs()) == []
    assert join_warnings(_plan("binlog.000003", join_extra=GtidSet.parse(f"{OTHER}:1")), switched_epochs()) == []
