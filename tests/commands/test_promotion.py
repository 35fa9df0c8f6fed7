"""The decisions of `relayproxy promote` (relayproxy/commands/promotion.py), without servers: which relay is the most
advanced, what the candidate lacks, errant GTIDs, and the refusals. Expected texts are literals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.binlog.gtid import MariaBinlogState, MariaGtidPosition
from relayproxy.commands import promotion as P


def maria(text: str) -> MariaBinlogState:
    return P.parse_history("mariadb", text)


def relay(address: str, text: str, master: int = 1, follows: bool = False, flavour: str = "mariadb") -> P.RelayFacts:
    return P.RelayFacts(address, P.parse_history(flavour, text), master, "db1:3306", follows)


def candidate(text: str, is_replica: bool = True, flavour: str = "mariadb") -> P.CandidateFacts:
    return P.CandidateFacts("cand:3306", P.parse_history(flavour, text), is_replica, 2)


def test_lacks_mariadb_names_ranges_per_domain_and_server():
    lack = P.lacks(maria("0-1-40,1-1-7"), maria("0-1-57,1-1-7,2-5-3"))
    assert lack.text == "0-1-41..0-1-57, 2-5-1..2-5-3"
    assert lack.count == 20
    lack = P.lacks(maria("0-2-40"), maria("0-2-40,0-1-57"))  # the domain has another server's numbers
    assert lack == P.Lack("0-1-57 and earlier GTIDs of server 1 in domain 0", 1)
    assert not P.lacks(maria("0-1-57,1-1-9"), maria("0-1-57,1-1-7"))
    assert P.lacks(maria("0-1-56"), maria("0-1-57")).text == "0-1-57"


def test_the_most_advanced_relay_is_the_source_and_the_others_are_behind():
    plan = P.decide(candidate("0-1-30"), [relay("r1:1", "0-1-50"), relay("r2:1", "0-1-57"), relay("r3:1", "0-1-10")])
    assert plan.source.address == "r2:1"
    assert plan.lacking.text == "0-1-31..0-1-57" and plan.lacking.count == 27
    assert plan.behind == {"r1:1": P.Lack("0-1-51..0-1-57", 7), "r3:1": P.Lack("0-1-11..0-1-57", 47)}
    assert not plan.errant and plan.needs_catch_up


def test_a_candidate_already_holding_everything_needs_no_catch_up():
    plan = P.decide(candidate("0-1-60"), [relay("r1:1", "0-1-57")])
    assert not plan.needs_catch_up
    # what it has beyond every relay is the failed master's own (server 1): received by it, by no relay (never
    # acknowledged through a relay); kept and said, not errant
    assert plan.unrelayed == P.Lack("0-1-58..0-1-60", 3) and not plan.errant
    # with the master unknown (no relay has reached it) it cannot be told apart: errant, to be safe
    unknown = P.decide(candidate("0-1-60"), [relay("r1:1", "0-1-57", master=0)])
    assert unknown.errant == P.Lack("0-1-58..0-1-60", 3) and not unknown.unrelayed


def test_errant_gtids_are_reported_and_refused_when_strict():
    cand = candidate("0-1-30,9-2-4")
    plan = P.decide(cand, [relay("r1:1", "0-1-57")])
    assert plan.errant.text == "9-2-1..9-2-4"
    with pytest.raises(P.Refusal, match=r"--strict: the candidate cand:3306 has GTIDs that no relay has .*9-2-1..9-2-4"):
        P.decide(cand, [relay("r1:1", "0-1-57")], strict=True)


def test_relays_that_diverge_are_refused_naming_both_sides():
    with pytest.raises(P.Refusal) as exc:
        P.decide(candidate("0-1-30"), [relay("r1:1", "0-1-50"), relay("r2:1", "0-1-40,0-7-51")])
    assert str(exc.value) == (
        "the relays diverge: r2:1 has 0-7-51 and earlier GTIDs of server 7 in domain 0 that r1:1 lacks, and r1:1 has "
        "0-1-41..0-1-50 that r2:1 lacks; no relay holds every transaction of the others")


def test_relays_of_different_masters_are_refused():
    with pytest.raises(P.Refusal, match=r"different masters: r1:1 relays server_id 1 .*; r2:1 relays server_id 4"):
        P.decide(candidate(""), [relay("r1:1", "0-1-5", master=1), relay("r2:1", "0-1-5", master=4)])
    # a relay that does not know its master (0) or already follows the candidate does not count
    P.decide(candidate("0-1-5"), [relay("r1:1", "0-1-5", master=1), relay("r2:1", "0-1-5", master=0),
                                  relay("r3:1", "0-1-5", master=2, follows=True)])


def test_a_candidate_that_is_no_replica_and_lacks_the_relays_is_refused():
    with pytest.raises(P.Refusal, match="the candidate cand:3306 is not a replica .* lacks 0-1-1..0-1-5"):
        P.decide(candidate("0-1-0", is_replica=False), [relay("r1:1", "0-1-5")])
    # no replica, but it holds everything: a run repeated after the promotion
    assert not P.decide(candidate("0-1-5,0-2-9", is_replica=False), [relay("r1:1", "0-1-5")]).needs_catch_up


def test_no_relay_is_refused():
    with pytest.raises(P.Refusal, match="no relay answered"):
        P.decide(candidate("0-1-5"), [])


def test_on_a_tie_a_relay_still_on_the_old_master_is_the_source():
    plan = P.decide(candidate("0-1-5"), [relay("r1:1", "0-1-9", follows=True), relay("r2:1", "0-1-9")])
    assert plan.source.address == "r2:1"


def test_mysql_sets():
    a, b = "aaaaaaaa-1111-4111-8111-000000000001", "bbbbbbbb-2222-4222-8222-000000000002"
    plan = P.decide(candidate(f"{a}:1-30,\n{b}:1-2", flavour="mysql"),
                    [relay("r1:1", f"{a}:1-57", flavour="mysql"), relay("r2:1", f"{a}:1-40", flavour="mysql")])
    assert plan.source.address == "r1:1"
    assert plan.lacking == P.Lack(f"{a}:31-57", 27)
    assert plan.errant == P.Lack(f"{b}:1-2", 2)


def test_merge_mariadb_keeps_the_later_sequence_per_server():
    merged = P.merge_mariadb(maria("0-1-40,0-2-3"), MariaGtidPosition.parse("0-1-38,1-1-4"))
    assert str(merged) == "0-1-40,0-2-3,1-1-4"


# -- properties: one MariaDB history, servers at prefixes of it -------------------------------------------------------

histories = st.lists(st.tuples(st.integers(0, 2), st.sampled_from([1, 1, 1, 4])), min_size=1, max_size=40)


def prefix_state(history: list[tuple[int, int]], n: int) -> MariaBinlogState:
    """The binlog state after the first n GTIDs of a history whose sequence numbers grow per domain."""
    state = MariaBinlogState()
    seq: dict[int, int] = {}
    for domain, server in history[:n]:
        seq[domain] = seq.get(domain, 0) + 1
        state.update((domain, server, seq[domain]))
    return state


@settings(max_examples=300, deadline=None)
@given(histories, st.lists(st.integers(0, 40), min_size=1, max_size=3), st.integers(0, 40))
def test_relays_at_prefixes_never_diverge_and_the_longest_is_the_source(history, relay_cuts, cand_cut):
    relay_cuts = [min(c, len(history)) for c in relay_cuts]
    cand_cut = min(cand_cut, len(history))
    relays = [P.RelayFacts(f"r{i}:1", prefix_state(history, c), 1) for i, c in enumerate(relay_cuts)]
    cand = P.CandidateFacts("c:1", prefix_state(history, cand_cut), True)
    plan = P.decide(cand, relays)
    longest = max(relay_cuts)
    assert P.holds(plan.source.history, prefix_state(history, longest))
    assert P.holds(prefix_state(history, longest), plan.source.history)
    # ahead of every relay: said, as the master's own (server 1) or errant (server 4 wrote them)
    assert (bool(plan.unrelayed) or bool(plan.errant)) == (cand_cut > longest)
    assert not plan.errant or any(s == 4 for _, s in history[longest:cand_cut])
    # the candidate lacks something exactly when it is behind the longest relay; after catching up it lacks nothing
    assert bool(plan.lacking) == (cand_cut < longest)
    caught_up = P.merge_mariadb(cand.history, plan.source.history)
    assert not P.lacks(caught_up, plan.source.history)
    if len({s for _, s in history}) == 1:  # one server writing: the count is exact
        assert plan.lacking.count == max(0, longest - cand_cut)


@settings(max_examples=200, deadline=None)
@given(histories, st.integers(0, 40), st.integers(1, 3))
def test_a_foreign_transaction_on_the_candidate_is_errant(history, cut, domain):
    cut = min(cut, len(history))
    state = prefix_state(history, cut)
    state.update((domain + 10, 99, 1))  # a domain no relay has
    plan = P.decide(P.CandidateFacts("c:1", state, True), [P.RelayFacts("r:1", prefix_state(history, len(history)))])
    assert plan.errant.text == f"{domain + 10}-99-1"
