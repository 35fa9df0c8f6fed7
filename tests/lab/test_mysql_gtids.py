"""The scripted MySQL master's own GTID arithmetic (tests/support/mysql_gtids.py) against relayproxy's GtidSet on
random sets: the two are written apart, and must agree on every answer the master's refusals and sends rest on
(subset, membership, difference, union), on MySQL's text and on the binary form both ways."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.binlog.gtid import GtidSet

from ..support.fakemaster import as_gtids, missing_gtids
from ..support.mysql_gtids import Gtids

UUIDS = ["3e11fa47-71ca-11e1-9e33-c80aa9429562", "0a1b2c3d-0000-4000-8000-00000000000f",
         "ffffffff-ffff-4fff-bfff-ffffffffffff"]
TAGS = ["", "a", "tag_b"]

runs = st.lists(st.tuples(st.sampled_from(UUIDS), st.sampled_from(TAGS), st.integers(1, 40), st.integers(0, 6)),
                max_size=8)
untagged_runs = st.lists(st.tuples(st.sampled_from(UUIDS), st.just(""), st.integers(1, 40), st.integers(0, 6)),
                         max_size=8)


def both(raw) -> tuple[Gtids, GtidSet]:
    """The same random set, built separately in each implementation."""
    mine: dict = {}
    theirs = GtidSet()
    for uuid, tag, first, extra in raw:
        mine.setdefault((uuid, tag), []).append((first, first + extra))
        theirs.add_interval(uuid, first, first + extra + 1, tag)
    return Gtids(mine), theirs


@settings(max_examples=150, deadline=None)
@given(runs, runs, st.sampled_from(UUIDS), st.sampled_from(TAGS), st.integers(1, 50))
def test_the_two_arithmetics_agree(a, b, uuid, tag, gno):
    mine_a, theirs_a = both(a)
    mine_b, theirs_b = both(b)
    assert mine_a.issubset(mine_b) == theirs_a.is_subset(theirs_b)
    assert mine_a.contains(uuid, gno, tag) == theirs_a.contains_gtid(uuid, gno, tag)
    assert mine_a.difference(mine_b).text() == theirs_a.subtract(theirs_b).format(",\n")
    assert mine_a.union(mine_b).text() == theirs_a.union(theirs_b).format(",\n")
    assert bool(mine_a.difference(mine_b)) == bool(theirs_a.subtract(theirs_b).count())
    assert mine_a.text(",") == theirs_a.format(",")
    assert missing_gtids(mine_b, mine_a) == theirs_b.subtract(theirs_a).format(",")


@settings(max_examples=100, deadline=None)
@given(runs)
def test_text_and_binary_forms_both_ways(a):
    mine, theirs = both(a)
    assert mine.encode() == theirs.encode()
    assert Gtids.decode(theirs.encode()) == mine
    assert GtidSet.decode(mine.encode()) == theirs
    assert Gtids.parse(theirs.format(",\n")) == mine
    assert GtidSet.parse(mine.text()) == theirs
    assert as_gtids(theirs) == mine == as_gtids(mine.text(","))


@given(untagged_runs)
def test_an_untagged_set_is_written_in_the_untagged_format(a):
    mine, theirs = both(a)
    assert mine.encode()[7] == 0 and mine.encode() == theirs.encode(tagged=False)


def test_literal_answers():
    u = UUIDS[0]
    have = Gtids.parse(f"{u}:1-10:15,\n{UUIDS[1]}:tag_b:3-4")
    assert have.text(",") == f"{UUIDS[1]}:tag_b:3-4,{u}:1-10:15"
    assert have.contains(u, 15) and not have.contains(u, 11) and have.contains(UUIDS[1], 4, "tag_b")
    assert Gtids.parse(f"{u}:1-5").issubset(have) and not Gtids.parse(f"{u}:1-11").issubset(have)
    assert missing_gtids(Gtids.parse(f"{u}:1-20"), have) == f"{u}:11-14:16-20"
    assert Gtids.parse(f"{u}:1-3:4-6:8") == Gtids.parse(f"{u.upper()}:8:1-6")
