"""`relayproxy promote`'s decisions on MySQL GTID sets (relayproxy/commands/promotion.py), without servers: the sets
come as MySQL prints @@gtid_executed (newlines after commas, intervals with holes, several UUIDs) and every
expected text is a literal, in MySQL's own notation."""

from __future__ import annotations

import pytest

from relayproxy.commands import promotion as P

A = "aaaaaaaa-1111-4111-8111-000000000001"  # the old master
B = "bbbbbbbb-2222-4222-8222-000000000002"  # a master before it (history both sides share)
C = "cccccccc-3333-4333-8333-000000000003"  # written on the candidate only
D = "dddddddd-4444-4444-8444-000000000004"


def mysql(text: str):
    return P.parse_history("mysql", text)


def relay(address: str, text: str, master: int = 1, follows: bool = False) -> P.RelayFacts:
    return P.RelayFacts(address, mysql(text), master, "db1:3306", follows)


def candidate(text: str, is_replica: bool = True, read_only: bool = True) -> P.CandidateFacts:
    return P.CandidateFacts("cand:3306", mysql(text), is_replica, 2, read_only)


def test_gtid_executed_as_mysql_prints_it():
    history = mysql(f"{B}:1-100,\n{A}:1-57:60-61\n")
    assert P.position_text(history) == f"{A}:1-57:60-61,{B}:1-100"
    assert P.position_text(mysql(None)) == P.position_text(mysql("")) == ""
    assert P.position_text(mysql(f"{A}:1-3:4-9,{A}:10")) == f"{A}:1-10"  # adjacent intervals join


def test_lacks_is_the_set_difference_with_holes_and_an_exact_count():
    assert P.lacks(mysql(f"{A}:1-10:12-20"), mysql(f"{A}:1-25")) == P.Lack(f"{A}:11:21-25", 6)
    assert P.lacks(mysql(f"{A}:1-2"), mysql(f"{B}:1-3,{A}:1-5")) == P.Lack(f"{A}:3-5,{B}:1-3", 6)
    assert P.lacks(mysql(f"{A}:1-999990"), mysql(f"{A}:1-1000000")) == P.Lack(f"{A}:999991-1000000", 10)
    assert not P.lacks(mysql(f"{A}:1-100,{C}:1"), mysql(f"{A}:5-50"))
    assert P.holds(mysql(f"{A}:1-100"), mysql("")) and not P.holds(mysql(""), mysql(f"{A}:1"))


def test_the_relay_with_the_superset_is_the_source_whatever_the_order():
    relays = [relay("r1:1", f"{B}:1-100,\n{A}:1-40"), relay("r2:1", f"{B}:1-100,\n{A}:1-57"),
              relay("r3:1", f"{B}:1-100,\n{A}:1-39:41")]
    for order in (relays, relays[::-1], relays[1:] + relays[:1]):
        plan = P.decide(candidate(f"{B}:1-100,{A}:1-30"), order)
        assert plan.source.address == "r2:1"
        assert plan.lacking == P.Lack(f"{A}:31-57", 27) and plan.needs_catch_up
        assert plan.behind == {"r1:1": P.Lack(f"{A}:41-57", 17), "r3:1": P.Lack(f"{A}:40:42-57", 17)}
        assert not plan.errant


def test_deciding_leaves_the_histories_as_they_were():
    relays = [relay("r1:1", f"{A}:1-40"), relay("r2:1", f"{A}:1-57")]
    cand = candidate(f"{A}:1-30,{C}:1")
    P.decide(cand, relays)
    assert [P.position_text(r.history) for r in relays] == [f"{A}:1-40", f"{A}:1-57"]
    assert P.position_text(cand.history) == f"{A}:1-30,{C}:1"


def test_errant_is_what_the_candidate_has_beyond_every_relay():
    # C: a write on the candidate; A:58-60: the old master's commits that reached the candidate and no relay
    plan = P.decide(candidate(f"{A}:1-60,\n{C}:1-2"), [relay("r1:1", f"{A}:1-57"), relay("r2:1", f"{A}:1-50")])
    assert plan.errant == P.Lack(f"{A}:58-60,{C}:1-2", 5)
    assert not plan.lacking and not plan.needs_catch_up


def test_strict_refuses_errant_gtids_naming_them():
    with pytest.raises(P.Refusal) as exc:
        P.decide(candidate(f"{A}:1-30,{C}:1-2:7"), [relay("r1:1", f"{A}:1-57")], strict=True)
    assert str(exc.value) == (f"--strict: the candidate cand:3306 has GTIDs that no relay has (errant transactions): "
                              f"{C}:1-2:7")


def test_relays_that_diverge_are_refused_naming_both_differences():
    with pytest.raises(P.Refusal) as exc:
        P.decide(candidate(f"{A}:1-3"), [relay("r1:1", f"{A}:1-5"), relay("r2:1", f"{A}:1-3,{D}:1")])
    assert str(exc.value) == (f"the relays diverge: r2:1 has {D}:1 that r1:1 lacks, and r1:1 has {A}:4-5 that r2:1 "
                              "lacks; no relay holds every transaction of the others")
    # a hole is divergence too: r2 has A:58 but not A:41-57
    with pytest.raises(P.Refusal, match=f"r2:1 has {A}:58 that r1:1 lacks, and r1:1 has {A}:41-57 that r2:1"):
        P.decide(candidate(f"{A}:1-3"), [relay("r1:1", f"{A}:1-57"), relay("r2:1", f"{A}:1-40:58")])


def test_equal_relays_the_first_listed_is_the_source_unless_it_already_follows_the_candidate():
    same = f"{A}:1-57"
    assert P.decide(candidate(f"{A}:1"), [relay("r1:1", same), relay("r2:1", same)]).source.address == "r1:1"
    plan = P.decide(candidate(f"{A}:1"), [relay("r1:1", same, master=2, follows=True), relay("r2:1", same)])
    assert plan.source.address == "r2:1" and plan.behind == {}


def test_a_candidate_with_no_replication_is_refused_unless_detached_and_read_only():
    relays = [relay("r1:1", f"{A}:1-57")]
    with pytest.raises(P.Refusal, match=f"is not a replica .*, is writable .* lacks {A}:31-57 that the relay r1:1"):
        P.decide(candidate(f"{A}:1-30", is_replica=False, read_only=False), relays, detached_ok=True)
    with pytest.raises(P.Refusal, match="--candidate-detached"):
        P.decide(candidate(f"{A}:1-30", is_replica=False), relays)
    plan = P.decide(candidate(f"{A}:1-30", is_replica=False), relays, detached_ok=True)
    assert plan.lacking == P.Lack(f"{A}:31-57", 27)
    # holding everything already (a repeated run after the promotion, with the new master's own writes): no refusal
    assert not P.decide(candidate(f"{A}:1-57,{B}:1-3", is_replica=False, read_only=False), relays).needs_catch_up


def test_empty_histories():
    plan = P.decide(candidate(""), [relay("r1:1", "")])
    assert not plan.lacking and not plan.errant and plan.lacking.count == 0
    plan = P.decide(candidate(""), [relay("r1:1", f"{A}:1")])
    assert plan.lacking == P.Lack(f"{A}:1", 1)
