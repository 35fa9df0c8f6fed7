"""Logs: JSON lines with stable leading keys for machines, a human console format, and the CLI flag that picks one."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from relayproxy.log import configure_logging, get_logger

from relayproxy.lab.harness import REPO, free_port

LEADING = ["timestamp", "level", "logger", "event"]


@pytest.fixture(autouse=True)
def _restore_logging():
    yield
    configure_logging("auto", "info")


def test_json_lines_start_with_the_stable_keys_then_the_events_own(capsys):
    configure_logging("json", "info")
    get_logger("relayproxy.upstream").warning(
        "upstream connection ended", error="Lost connection", kind="io", master="db1:3306")
    logging.getLogger("some.library").warning("plain stdlib %s", "record")  # foreign records get the same keys
    get_logger("relayproxy.upstream").debug("not shown at info")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    ours, foreign = (json.loads(line) for line in lines)
    assert list(ours)[:4] == LEADING and list(foreign)[:4] == LEADING
    assert ours["level"] == "warning" and ours["logger"] == "relayproxy.upstream"
    assert ours["event"] == "upstream connection ended"
    assert {k: ours[k] for k in ("error", "kind", "master")} == {"error": "Lost connection", "kind": "io", "master": "db1:3306"}
    assert ours["timestamp"].endswith("Z") and "T" in ours["timestamp"]  # ISO 8601, UTC
    assert foreign["event"] == "plain stdlib record" and foreign["logger"] == "some.library"


def test_json_exceptions_are_one_line_with_the_traceback_under_exception(capsys):
    configure_logging("json", "info")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger("relayproxy.http").exception("http request failed")
    [line] = capsys.readouterr().err.splitlines()
    doc = json.loads(line)
    assert list(doc)[:4] == LEADING and doc["level"] == "error"
    assert "RuntimeError: boom" in doc["exception"]


def test_console_format_is_for_people(capsys):
    configure_logging("console", "info")
    get_logger("relayproxy.upstream").info("streaming from master", file="master-bin.000002", position=600)
    [line] = capsys.readouterr().err.splitlines()
    with pytest.raises(ValueError):
        json.loads(line)
    assert "streaming from master" in line and "file=master-bin.000002" in line and "position=600" in line
    assert "info" in line and "\x1b[" not in line  # no colour codes when stderr is not a terminal


def test_auto_is_json_when_stderr_is_not_a_terminal(capsys):
    configure_logging("auto", "info")
    get_logger("relayproxy.run").info("relay recovered from its files", report="nothing to do")
    [line] = capsys.readouterr().err.splitlines()
    assert list(json.loads(line))[:4] == LEADING


def test_bad_format_or_level_names_the_choices():
    with pytest.raises(ValueError, match="unknown log format 'xml': use one of auto, json, console"):
        configure_logging("xml")
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        configure_logging("json", "loud")


def run_relay_until_it_logs(tmp_path, log_format: str, wanted: str) -> str:
    """`relayproxy --log-format X run` against a closed port: it logs its failed connection attempts."""
    err = tmp_path / f"{log_format}.log"
    args = [sys.executable, "-m", "relayproxy.commands.cli", "--log-format", log_format, "run",
            "--master", f"127.0.0.1:{free_port()}", "--user", "repl", "--server-id", "7",
            "--relay-dir", str(tmp_path / f"relay-{log_format}"), "--reconnect-max-delay", "0.2"]
    with open(err, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "RELAYPROXY_PASSWORD": "x"})
        try:
            deadline = time.monotonic() + 30
            while wanted not in err.read_text(errors="replace"):
                assert proc.poll() is None, err.read_text(errors="replace")
                assert time.monotonic() < deadline, f"no {wanted!r} in:\n{err.read_text(errors='replace')}"
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
    return err.read_text(errors="replace")


def test_cli_log_format_flag_reaches_the_relay(tmp_path):
    text = run_relay_until_it_logs(tmp_path, "json", "upstream connection ended")
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    ended = [d for d in lines if d["event"] == "upstream connection ended"]
    assert ended and all(list(d)[:4] == LEADING for d in lines)
    assert ended[0]["kind"] == "io" and ended[0]["master"].startswith("127.0.0.1:") and ended[0]["error"]

    text = run_relay_until_it_logs(tmp_path, "console", "upstream connection ended")
    line = next(line for line in text.splitlines() if "upstream connection ended" in line)
    assert not line.lstrip().startswith("{") and "kind=io" in line and "error=" in line
