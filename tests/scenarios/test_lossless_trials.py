"""Randomized lossless-promotion trials (relayproxy/lab/lossless.py): a semi-sync master killed under load, then
`relayproxy promote` through the relay, beside what promoting the lagging direct replica as it is would lose.

Every trial of a lossless kind (master killed; a relay killed and restarted too; promote itself killed and run
again) must lose no acknowledged commit, apply no row twice and leave no errant GTID; the direct promotion must lose
something in some of them, or the trials could not tell the two apart. One fallback trial (semi-sync timed out
before the kill) shows the documented hole: commits returned unacknowledged may be lost, counted, not asserted.

The seed is random per run and printed; RELAYPROXY_LOSSLESS_SEED=<seed> reruns a run, and
`TrialSpec.draw(<trial seed>, <kind>)` one trial (benchmarks/lossless_trials.py runs many more).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest

from relayproxy.lab.failover import relay_sql
from relayproxy.lab.harness import REPO
from relayproxy.lab.lossless import Trial, TrialSpec, run_trial, trial_kinds, trial_seeds

pytestmark = pytest.mark.server

# Four of each lossless kind: the trials' cost is most of this test's (~8 s each); the benchmark runs hundreds.
TRIALS = 12


def test_promote_through_the_relay_loses_no_acknowledged_commit(tmp_path, capsys):
    seed = int(os.environ.get("RELAYPROXY_LOSSLESS_SEED") or random.randrange(1, 2**31))
    with capsys.disabled():
        print(f"\nlossless trials: seed {seed} (RELAYPROXY_LOSSLESS_SEED={seed} reruns them)")
    began = time.monotonic()
    results = []
    for i, (trial_seed, kind) in enumerate(zip(trial_seeds(seed, TRIALS), trial_kinds(TRIALS))):
        result = run_trial(tmp_path / f"trial{i}", TrialSpec.draw(trial_seed, kind))
        results.append(result)
        with capsys.disabled():
            print(f"  {i + 1:2d}. {result.summary()}")
        context = f"run seed {seed}, {result.summary()}; promote runs {result.promote_runs}"
        assert result.no_tx == 0 and not result.fell_back, f"the master fell back to async: {context}"
        assert result.lost == 0, f"acknowledged transactions lost {result.lost_tids[:20]}: {context}"
        assert result.duplicate_rows == 0 and result.partial == 0, context
        assert result.errant == [] and result.relay_dropped == [], context
        assert result.replica_caught_up is not False, f"new writes did not reach the relay's replica: {context}"
        assert result.promote_runs[-1]["exit_code"] == 0, context
    fallback = run_trial(tmp_path / "fallback", TrialSpec.draw(trial_seeds(seed + 1, 1)[0], "fallback"))
    elapsed = time.monotonic() - began
    with capsys.disabled():
        print(f"  fallback: {fallback.summary()}")
        print(f"  {TRIALS + 1} trials in {elapsed:.0f} s")
    # The hole is shown, not asserted away: what returned after the fallback may be gone, what returned before not.
    assert fallback.fell_back, fallback.summary()
    assert fallback.lost == 0 and fallback.duplicate_rows == 0 and fallback.errant == [], fallback.summary()
    # The comparison means something only if promoting the candidate as it was lost commits in some trials.
    assert sum(r.direct_lost > 0 for r in results) >= TRIALS // 4, [r.direct_lost for r in results]
    assert sum(r.acked for r in results) > sum(r.direct_lost for r in results) > 0


def test_a_rerun_converges_after_a_kill_while_levelling_a_relay(tmp_path):
    """Seen in a randomized trial (seed 1509219996, promote-kill): the state promote's level_relays leaves when it is
    killed after its CHANGE MASTER to the source relay, made by hand here; running promote again must finish it."""
    spec = TrialSpec.draw(7, "master")
    spec.relays, spec.replica = 2, False
    trial = Trial(tmp_path / "trial", spec)
    try:
        trial.start()
        trial.load_and_kill()
        source, lagging = trial.relay_ports
        for port in (source, lagging):
            relay_sql(port, "STOP SLAVE")
        status = relay_sql(lagging, "SHOW SLAVE STATUS")[0]
        relay_sql(lagging, f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={source}, MASTER_USER='repl', "
                           f"MASTER_PASSWORD='replpw', MASTER_LOG_FILE='{status['Master_Log_File']}', "
                           f"MASTER_LOG_POS={status['Read_Master_Log_Pos']}, MASTER_USE_GTID=no")
        relay_sql(lagging, "START SLAVE")
        relay_sql(lagging, "STOP SLAVE")
        run = subprocess.run(trial.promote_command(), capture_output=True, text=True, cwd=REPO, timeout=120)
        assert run.returncode == 0, (run.stdout[-1500:], run.stderr[-1500:])
    finally:
        trial.close()


def test_the_benchmark_writes_its_results(tmp_path):
    """benchmarks/lossless_trials.py end to end on two trials (one lossless, one fallback): the shared header, the
    table per kind, the fallback section, every trial listed, the plot. Figures are not asserted beyond the rule."""
    out = tmp_path / "results" / "lossless_trials.md"
    argv = ["--trials", "2", "--fallback-every", "2", "--seed", "3", "--out", str(out), "--workdir", str(tmp_path)]
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "lossless_trials.py"), *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = out.read_text()
    assert text.splitlines()[2] == "Produced by (from the repository root):"
    assert "benchmarks/lossless_trials.py --trials 2 --fallback-every 2 --seed 3" in text
    assert "- commit: " in text and "## Machine" in text and "- mariadbd:" in text
    assert "**Through the relay: 0 acknowledged commits lost of " in text
    assert "| master | 1 |" in text and "| fallback | 1 |" in text
    assert "## The documented hole: semi-sync fell back to async" in text
    assert "## Where promote's time goes" in text
    assert text.count("| master | ") + text.count("| fallback | ") >= 4  # the table per kind, then every trial
    assert out.with_suffix(".png").stat().st_size > 1000
