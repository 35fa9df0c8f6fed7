"""The `relayproxy` command line as a user runs it: help, version, the demo end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from relayproxy import __version__


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relayproxy.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_the_subcommands():
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    assert "inspect" in result.stdout
    assert "demo" in result.stdout


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"relayproxy {__version__}"


def test_demo_help():
    result = run_cli("demo", "--help")
    assert result.returncode == 0, result.stderr
    assert "--keep" in result.stdout


def test_console_script_is_installed():
    script = Path(sysconfig.get_path("scripts")) / "relayproxy"
    assert script.is_file(), f"{script} missing: install the package (make setup)"
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert __version__ in result.stdout


@pytest.mark.server
def test_demo_runs_end_to_end():
    result = run_cli("demo", timeout=300)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"

    summary = result.stdout.split("demo summary:", 1)[1]
    assert "master-bin.000001" in summary
    assert "master-bin.000002" in summary
    # stderr is not a terminal here, so every log line is JSON with the stable keys.
    records = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert records, "the demo logged nothing"
    for record in records:
        assert {"timestamp", "level", "event", "logger"} <= record.keys(), record
    assert any(r["event"] == "sandbox started" for r in records)
