"""`relayproxy promote` killed with SIGKILL after each of its steps, in each flavour of its plan, and then run again:
each time the second run converges (exit 0), with 0 acknowledged commits lost, 0 rows applied twice, 0 partial
transactions and 0 errant GTIDs on the promoted candidate, every relay following it and the replica behind the first
relay receiving its writes.

The kill is deterministic: the run is `relayproxy promote` in a Python whose `Promoter.step` (the call that ends each
step and reports it) sends the process SIGKILL once it has reported step N; what a step does is done, nothing after
it. The topology is lab/lossless.py's trial (a semi-sync master killed under four writers, the relay as its acker, a
candidate whose link delays the stream); the flavours:

- ``catch-up``: one relay; the candidate lags and fetches what it lacks from the relay;
- ``levelling``: two relays, the second stopped halfway through the load and restarted after the master's kill, so
  promote levels it from the first before the candidate catches up;
- ``no-reset-replica``: as catch-up, with ``--no-reset-replica`` (MHA's hook): the candidate's replication is left
  stopped instead of reset.

Not covered here: a candidate that lacks nothing (no catch-up step), which the trials cannot make deterministic, and
kills at random moments inside a step (tests/scenarios/test_lossless_trials.py's promote-kill kind).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from relayproxy.lab.harness import REPO, replica_status
from relayproxy.lab.lossless import Trial, TrialSpec

pytestmark = pytest.mark.server

# the steps a run that is not interrupted reports, in order (a killed run's rerun may report fewer: what is done)
STEPS = {
    "catch-up": ["read the topology", "stopped the relays' IO", "stopped the candidate's IO thread", "decided",
                 "pointed the candidate at the relay", "caught up", "promoted the candidate", "repointed the relays",
                 "the relays stream from the candidate"],
}
STEPS["no-reset-replica"] = STEPS["catch-up"]
STEPS["levelling"] = [*STEPS["catch-up"][:4], "levelled the relays", *STEPS["catch-up"][4:]]
EXTRA = {"catch-up": [], "levelling": [], "no-reset-replica": ["--no-reset-replica"]}

KILL_AFTER_STEP = r"""
import os, signal, sys
from relayproxy.commands import promote
after, seen, step = int(sys.argv[1]), [], promote.Promoter.step
def killing_step(self, name, detail=""):
    step(self, name, detail)
    seen.append(name)
    if len(seen) == after:
        sys.stderr.write(f"killed after step {after}: {name}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
promote.Promoter.step = killing_step
from relayproxy.commands.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _trial(workdir: Path, flavour: str) -> Trial:
    spec = TrialSpec(seed=7, kind="master", relays=2 if flavour == "levelling" else 1, candidate_delay=0.3,
                     replica=True, load_seconds=2.0, big_chance=0.0)
    trial = Trial(workdir, spec)
    trial.start()
    stopper = None
    if flavour == "levelling":  # the second relay misses the second half of the load
        stopper = threading.Timer(spec.load_seconds / 2, trial.relays[1].stop)
        stopper.start()
    trial.load_and_kill()
    if stopper is not None:
        stopper.join()
        trial.relays[1].start()
    trial.direct_snapshot()
    assert trial.result.direct_lost > 0, "the candidate did not lag"
    return trial


def _promote(trial: Trial, extra: list[str], kill_after: int | None = None) -> tuple[int, dict | None, str]:
    command = trial.promote_command() + extra
    assert command[1:4] == ["-m", "relayproxy.commands.cli", "promote"]
    if kill_after is not None:
        command = [sys.executable, "-c", KILL_AFTER_STEP, str(kill_after), *command[3:]]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=180)
    print(f"$ promote {'killed after step %d' % kill_after if kill_after else 'again'}: exit {done.returncode}\n"
          f"{done.stderr}", flush=True)
    try:
        document = json.loads(done.stdout)
    except ValueError:
        document = None
    return done.returncode, document, done.stderr


def cases(*flavours: str):
    """The parametrization of one flavour's kills (one test file a flavour, so pytest-xdist's workers share them)."""
    return pytest.mark.parametrize(
        "flavour,after", [(f, n) for f in flavours for n in range(1, len(STEPS[f]) + 1)],
        ids=[f"{f}-after-{n}-{s.replace(' ', '_')}" for f in flavours for n, s in enumerate(STEPS[f], 1)])


@cases("catch-up")
def test_a_second_run_converges_after_a_kill_after_each_step(tmp_path: Path, flavour: str, after: int):
    check_converges(tmp_path, flavour, after)


def check_converges(tmp_path: Path, flavour: str, after: int) -> None:
    trial = _trial(tmp_path / "trial", flavour)
    try:
        code, _, stderr = _promote(trial, EXTRA[flavour], kill_after=after)
        assert code == -signal.SIGKILL, f"the run was not killed after step {after} (exit {code})"
        reported = [line[len("promote: "):] for line in stderr.splitlines() if line.startswith("promote: ")]
        names = [line.rsplit(" (", 1)[0].split(": ", 1)[0] for line in reported
                 if not line.startswith(("catching up", "levelling"))]
        assert names == STEPS[flavour][:after], f"the killed run's steps: {names}"
        began = time.monotonic()
        code, document, _ = _promote(trial, EXTRA[flavour])
        assert code == 0 and document and document["exit_code"] == 0, document
        print(f"{flavour}, killed after step {after} ({STEPS[flavour][after - 1]}): the second run "
              f"{document['outcome']} in {time.monotonic() - began:.2f} s", flush=True)
        trial.result.promote_report = document
        assert int(trial.candidate.execute("SELECT @@GLOBAL.read_only")[0][0]) == 0
        status = replica_status(trial.candidate)
        if flavour == "no-reset-replica":
            assert status and status["Slave_IO_Running"] == "No" and status["Slave_SQL_Running"] == "No", status
        else:
            assert status == {}, status
        trial.check()
        r = trial.result
        assert (r.lost, r.duplicate_rows, r.partial, r.errant, r.relay_dropped) == (0, 0, 0, [], []), r.summary()
        assert r.replica_caught_up is True
    finally:
        trial.close()
