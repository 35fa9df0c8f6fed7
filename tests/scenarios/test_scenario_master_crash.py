"""Scenario: the master dies (kill -9) while a large transaction is half sent. A MariaDB replica of the
master directly is left with Read_Master_Log_Pos != Exec_Master_Log_Pos, so an HA controller's rule never lets it
switch; the replica through relayproxy is at Read == Exec at the last complete transaction. Both in one run
(relayproxy.lab.story), with the side-by-side figures reported."""

from __future__ import annotations

import json

import pytest

from relayproxy.lab.story import StoryResult, run_crash_story

pytestmark = pytest.mark.server

BIG_BYTES = 8 * 1024 * 1024
DIRECT_CAP = 8.0  # seconds the direct replica is watched after the kill
RELAY_CAP = 30.0  # a correctness bound for the replica through the relay, not a speed target


def mariadb_gtid_seqs(text: str) -> dict[tuple[int, int], int]:
    """'0-1-905,1-2-7' -> {(0, 1): 905, (1, 2): 7}: MariaDB's GTID position, one domain-server-seq per domain."""
    seqs: dict[tuple[int, int], int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        domain, server, seq = (int(x) for x in part.split("-"))
        seqs[(domain, server)] = seq
    return seqs


def report(result: StoryResult, tmp_path, record_property, capsys) -> None:
    """Side-by-side figures where a passing run shows them too: the terminal (past capture), the test report's
    properties (junit XML), and figures.txt / figures.json in the test's temporary folder."""
    lines = ["master crash mid-transaction: time to 'HA may switch'", *result.summary_lines()]
    (tmp_path / "figures.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "figures.json").write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    record_property("figures", json.dumps(result.as_dict()))
    with capsys.disabled():
        print("\n" + "\n".join(lines) + f"\n  (also in {tmp_path / 'figures.txt'})")


def test_master_crash_mid_transaction_ha_can_switch(tmp_path, record_property, capsys):
    result = run_crash_story(
        tmp_path / "story", workload_seconds=3, big_bytes=BIG_BYTES, direct_cap=DIRECT_CAP, relay_cap=RELAY_CAP
    )
    report(result, tmp_path, record_property, capsys)
    file, last_complete = result.last_complete
    direct, through = result.direct, result.through_relay
    assert result.workload_transactions > 0
    # The cut landed inside the big transaction, on both links at the same master position.
    assert result.big_transaction_end[0] == file
    assert last_complete < result.cut_master_pos < result.big_transaction_end[1]
    assert result.big_transaction_bytes >= BIG_BYTES

    # The direct replica received half the transaction: Read past Exec when the master died, and still at the end.
    assert direct.at_kill.read == (file, result.cut_master_pos)
    assert direct.at_kill.executed == (file, last_complete)
    assert direct.final.read == (file, result.cut_master_pos)
    assert direct.final.executed == (file, last_complete)
    assert not direct.final.read_equals_exec
    assert direct.stuck, f"the direct replica satisfied the HA rule: {direct.final}"
    after_kill = [s for s in result.timeline if s.master is None and s.direct is not None]
    assert after_kill, "no look at the direct replica after the kill"
    assert not any(s.direct.read_equals_exec for s in after_kill), "the direct replica was briefly at Read == Exec"

    # When the master died the relay had received the first half too, and advertised only what came before it.
    assert result.relay_at_kill["master_position"] == {"file": file, "position": result.cut_master_pos}
    at_kill = result.relay_at_kill
    assert (at_kill["master_log_file"], at_kill["read_master_log_pos"]) == (file, last_complete)
    # Afterwards it still advertises the end of the last complete transaction, and not the cut one's GTID.
    assert result.relay_position == (file, last_complete)
    assert result.relay_status["retrieved_gtid_set"] == result.gtid_before
    (big_key, big_seq), = mariadb_gtid_seqs(result.big_transaction_gtid).items()
    assert mariadb_gtid_seqs(result.relay_status["retrieved_gtid_set"]).get(big_key, 0) < big_seq

    # The replica through the relay is at rest there: Read == Exec == the last complete transaction.
    assert not through.stuck, f"the replica through the relay never satisfied the HA rule: {through.final}"
    assert through.final.read == through.final.executed == (file, last_complete)
    assert through.final.io_running == "Yes" and through.final.sql_running == "Yes"
    # Its data is the master's as of before the big transaction (demo.big still empty, every other table equal).
    assert result.checksums_through_relay == result.checksums_before
    assert set(result.checksums_before) >= {"demo.accounts", "demo.ledger", "demo.big"}
