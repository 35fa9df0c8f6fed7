"""`relayproxy demo` as a user runs it (stdout not a terminal): the crash story's summary, the failover, the semi-sync
master killed under load (act 3), JSON logs, bad flags, and no process or file left behind, whether it ends normally
or by Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relayproxy.commands.demo import _Stop, _Terminated, processes_mentioning

SHORT_RUN = ["--workload-seconds", "2", "--stuck-seconds", "4", "--big-mb", "8", "--failover-writes", "5",
             "--lossless-seconds", "2"]


def _ctrl_c_enabled() -> None:
    """A terminal's Ctrl-C reaches a foreground program; a test run started in the background (nohup, `&` in a
    script) inherits SIGINT ignored, which Python and the demo rightly keep ignoring. Give the demo a terminal's
    default so the test exercises what a person pressing Ctrl-C gets, wherever the suite runs."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def demo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "relayproxy.commands.cli", "demo", *args]


def demo_env(tmp_path: Path) -> dict[str, str]:
    """The demo's temporary folder goes under the test's own, so what it leaves is easy to see."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp)}


def workdir_of(stdout: str) -> Path:
    found = re.search(r"^files in (\S+)$", stdout, re.MULTILINE)
    assert found, f"the demo did not say where its files are:\n{stdout}"
    return Path(found.group(1))


def table_row(summary: str, label: str) -> list[str]:
    """The cells of one row of the side-by-side table (columns are separated by two or more spaces)."""
    for line in summary.splitlines():
        if line.strip().startswith(label):
            return re.split(r"\s{2,}", line.strip()[len(label) :].strip())
    raise AssertionError(f"no row {label!r} in the summary:\n{summary}")


def assert_nothing_left(workdir: Path, tmp_path: Path) -> None:
    assert not workdir.exists(), f"the demo left {workdir} behind"
    assert list((tmp_path / "tmp").iterdir()) == [], "the demo left files in its temporary folder"
    assert processes_mentioning(workdir) == [], "a server or the relay of the demo is still running"


@pytest.mark.server
def test_demo_shows_the_direct_replica_stuck_and_the_relay_replica_at_rest(tmp_path):
    figures = tmp_path / "figures.json"
    result = subprocess.run(
        demo_command(*SHORT_RUN, "--json", str(figures), "--verbose"),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180, env=demo_env(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    workdir = workdir_of(result.stdout)
    assert_nothing_left(workdir, tmp_path)

    # Not a terminal: plain status lines, never refreshed in place.
    assert "\r" not in result.stdout and "\x1b[" not in result.stdout
    status_line = r"^\s*\d+\.\d+s workload +master \d+:\d+  relay \d+:\d+ 0-1-\d+  direct \d+:\d+/\d+  via relay"
    assert re.search(status_line, result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"kill\+\d+\.\ds +master down", result.stdout), "no status line after the kill"

    summary = result.stdout.split("demo summary:", 1)[1]
    assert table_row(summary, "Read == Exec") == ["no", "yes"]
    assert table_row(summary, "stuck mid-transaction") == ["yes", "no"]
    direct_verdict, relay_verdict = table_row(summary, "HA may switch")
    assert direct_verdict == "never within 4 s"
    assert re.fullmatch(r"\d+\.\d\d s after the kill", relay_verdict)
    assert f"removed {workdir}; no process left behind" in result.stdout

    data = json.loads(figures.read_text())
    last_complete = data["last_complete"]
    assert data["relay"]["read"] == last_complete
    assert data["through_relay"]["read"] == data["through_relay"]["exec"] == last_complete
    assert data["direct"]["exec"] == last_complete
    assert data["direct"]["read"] == [last_complete[0], data["big_transaction"]["cut_after_master_pos"]]
    assert data["direct"]["seconds_to_ha_may_switch"] is None

    # Act 2: the direct replica promoted, relayproxy repointed with SQL, the replica behind it carries on.
    act2 = result.stdout.split("act 2, after the failover:", 1)[1]
    assert "STOP SLAVE;" in act2 and "MASTER_USE_GTID=slave_pos" in act2 and "START SLAVE;" in act2
    assert "MASTER_PASSWORD='***'" in act2 and "replpw" not in act2
    assert "CHECKSUM TABLE, new master vs replica through relayproxy: equal" in act2
    failover = data["failover"]
    assert failover["checksums_equal"] and failover["writes"] == 5
    assert 0 < failover["seconds_to_first"] <= failover["seconds_to_all"]
    files = failover["relay_files"]
    assert files == sorted(files) and len(files) >= 2  # the new master's files continue the relay's sequence

    # Act 3: a semi-sync master killed under load. The figures are recounted here from the ids the demo recorded:
    # acknowledged (COMMIT returned), on the candidate before `relayproxy promote` and after it.
    act3 = result.stdout.split("act 3, a semi-sync master killed under load:", 1)[1]
    assert re.search(r"kill\+\d+\.\ds +master down  relay 0-1-\d+  candidate 0-1-\d+", result.stdout), result.stdout
    lossless = data["lossless"]
    acked = set(lossless["acknowledged_ids"])
    before = set(lossless["candidate_ids_before_promote"])
    after = set(lossless["candidate_ids_after_promote"])
    assert len(acked) == lossless["acknowledged"] > 0
    assert lossless["direct_lost"] == len(acked - before) > 0, "the lagging candidate should lack acknowledged commits"
    assert lossless["lost_after_promote"] == len(acked - after) == 0
    assert before <= after  # promote only added
    assert table_row(act3, "acknowledged commits lost") == [f"{len(acked - before)} of {len(acked)}",
                                                            f"0 of {len(acked)}"]
    assert lossless["duplicate_rows"] == lossless["partial"] == 0 and lossless["errant"] == []
    promote = lossless["promote"]
    assert promote["exit_code"] == 0 and promote["outcome"] == "promoted", promote
    assert promote["fetched_count"] >= lossless["direct_lost"]
    assert "--candidate-password-file" in promote["command"] and "--relay-password-file" in promote["command"]
    assert "adminpw" not in result.stdout and "replpw" not in result.stdout
    assert lossless["kill_to_writable_seconds"] > 0
    assert lossless["relay_follows"] == f"127.0.0.1:{lossless['candidate_port']}"
    assert lossless["replica_caught_up"] is True
    assert re.search(r"kill -9 to a writable candidate: \d+\.\d\d s", act3)
    assert "the replica behind relayproxy has them, same rows as the new master" in act3

    # stderr is not a terminal either, so every log line is JSON with the stable keys.
    records = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert any(r["event"] == "sandbox started" for r in records)
    for record in records:
        assert {"timestamp", "level", "event", "logger"} <= record.keys(), record


@pytest.mark.server
def test_ctrl_c_during_the_workload_stops_everything(tmp_path):
    log = tmp_path / "demo.out"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            demo_command("--workload-seconds", "60"), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, text=True, env=demo_env(tmp_path), preexec_fn=_ctrl_c_enabled,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while "mixed workload" not in log.read_text() and proc.poll() is None:
                assert time.monotonic() < deadline, f"the workload never started:\n{log.read_text()}"
                time.sleep(0.2)
            workdir = workdir_of(log.read_text())
            assert processes_mentioning(workdir), "the demo's servers should be running during the workload"
            proc.send_signal(signal.SIGINT)
            code = proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    output = log.read_text()
    assert code == 130, output
    assert "interrupted; stopping everything" in output
    assert_nothing_left(workdir, tmp_path)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped exception, on purpose
@pytest.mark.parametrize("signum, kind", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, _Terminated)])
def test_a_signal_raised_inside_a_finalizer_is_raised_again(signum, kind):
    """Python ignores what a __del__ raises (PyMySQL's results have one): a Ctrl-C landing there was lost and the
    demo went on for its whole workload (seen in this test file's Ctrl-C test). The handler records the signal, and
    the demo's next progress line raises it again."""
    stop = _Stop()
    stop.check()  # nothing received: nothing raised

    class Finalized:
        def __del__(self):
            stop.handler(signum, None)

    Finalized()  # the exception is printed as ignored and dropped, as Python does
    with pytest.raises(kind):
        stop.check()


@pytest.mark.parametrize(
    "flags, complaint",
    [
        (["--stuck-seconds", "0"], "--stuck-seconds must be > 0"),
        (["--workload-seconds", "-1"], "--workload-seconds must be >= 0"),
        (["--big-mb", "0"], "--big-mb must be between 1 and 1024"),
        (["--failover-writes", "0"], "--failover-writes must be between 1 and 100000"),
        (["--lossless-seconds", "0"], "--lossless-seconds must be between 0.5 and 600"),
        (["--lossless-delay-ms", "-1"], "--lossless-delay-ms must be between 0 and 5000"),
    ],
)
def test_bad_flags_are_refused_before_anything_starts(tmp_path, flags, complaint):
    result = subprocess.run(
        demo_command(*flags), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        env=demo_env(tmp_path),
    )  # fmt: skip
    assert result.returncode == 2
    assert complaint in result.stderr
    assert list((tmp_path / "tmp").iterdir()) == []


def test_demo_help_names_its_flags():
    result = subprocess.run(demo_command("--help"), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for flag in ("--keep", "--workload-seconds", "--stuck-seconds", "--big-mb", "--no-live", "--json",
                 "--no-failover", "--failover-writes", "--no-lossless", "--lossless-seconds", "--lossless-delay-ms"):
        assert flag in result.stdout


def test_the_plain_live_view_prints_the_first_line_of_each_phase_however_soon():
    """Without a terminal the view prints a line a second, and the first line of a new phase at once: the wait after
    act 3's kill can be shorter than a second (a CI run once printed no `kill+` line for it)."""
    import io
    from types import SimpleNamespace

    from relayproxy.commands.demo import LiveView

    out = io.StringIO()
    view = LiveView(out, live=False, every=3600.0)
    for phase in ("load", "load", "kill+0.1s", "kill+0.2s", "promote"):
        view.show(SimpleNamespace(phase=phase, line=lambda phase=phase: f"line {phase}"))
    assert out.getvalue().splitlines() == ["line load", "line kill+0.1s", "line promote"]
