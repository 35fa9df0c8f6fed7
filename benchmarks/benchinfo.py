"""What every benchmark records beside its numbers: the machine, the code version, the exact command."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10).stdout.strip()


def machine_info(*, server: bool = False, **extra: str) -> dict[str, str]:
    """CPU, cores, kernel, Python, relayproxy commit (marked when relayproxy/ or benchmarks/ have uncommitted
    changes), the local mariadbd version when ``server``, the load average, and any ``extra`` entries."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = _git("rev-parse", "--short", "HEAD") or "no commit yet"
        if _git("status", "--porcelain", "--", "relayproxy", "benchmarks"):
            commit += " + uncommitted changes in relayproxy/ or benchmarks/"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    info = {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "relayproxy commit": commit,
    }
    if server:
        from relayproxy.lab.sandbox import find_binary

        try:
            info["mariadbd"] = subprocess.run(
                [find_binary("mariadbd", "mysqld"), "--version"], capture_output=True, text=True, timeout=10
            ).stdout.strip() or "unknown"
        except Exception:  # noqa: BLE001 - informational only
            info["mariadbd"] = "unknown"
    info.update(extra)
    try:
        info["load average (1, 5, 15 min) at the end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        pass
    return info


def command_line(script: str | os.PathLike, argv: list[str]) -> str:
    """The command that produced a result, relative to the repository root where possible."""

    def rel(path: Path) -> str:
        try:
            return str(path.relative_to(REPO_ROOT))
        except ValueError:
            return str(path)

    return shlex.join([rel(Path(sys.executable)), rel(Path(script).resolve()), *argv])


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend, or None when matplotlib is not installed (the
    benchmarks then write their tables without plots)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def machine_section(machine: dict[str, str]) -> list[str]:
    """The "## Machine" section every results file ends with (markdown lines)."""
    return ["## Machine", "", *(f"- {k}: {v}" for k, v in machine.items()), ""]
