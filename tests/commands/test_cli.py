"""The `relayproxy` command line as a user runs it: help, version, the console script (the demo: test_demo.py)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

from relayproxy import __version__


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relayproxy.commands.cli", *args],
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

