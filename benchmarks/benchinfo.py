"""What every benchmark records beside its numbers: the machine, the code version, the exact command."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str, root: Path = REPO_ROOT, check: bool = False) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                          check=check).stdout


# What a result depends on; results files and *_notes.md are what a run writes, not what it measures.
CODE_PATHSPECS = ("relayproxy", "benchmarks", "setup.cfg", "pyproject.toml")
SHOWN_DIRTY = 8  # at most this many dirty code files named in the results header


def is_code(path: str) -> bool:
    parts = path.split("/")
    if parts[0] == "relayproxy":
        return "__pycache__" not in parts and not path.endswith("_notes.md")
    if parts[0] == "benchmarks":
        return len(parts) == 2 and path.endswith(".py")  # benchmarks/*.py, not results/, notes or data
    return path in ("setup.cfg", "pyproject.toml")


def dirty_code_files(root: Path = REPO_ROOT) -> list[str]:
    """Code files (``is_code``) with uncommitted changes, staged or not, untracked ones included, sorted (a rename
    is both paths). Not a repository: an error, never "clean"."""
    out = _git("status", "--porcelain", "-z", "--no-renames", "--untracked-files=all", "--", *CODE_PATHSPECS,
               root=root, check=True)
    return sorted({entry[3:] for entry in out.split("\0") if len(entry) > 3 and is_code(entry[3:])})


def commit_info(root: Path = REPO_ROOT, dirty: list[str] | None = None) -> str:
    """The short commit, plus the code files with uncommitted changes (``dirty_code_files``) when there are any."""
    commit = _git("rev-parse", "--short", "HEAD", root=root).strip() or "no commit yet"
    dirty = dirty_code_files(root) if dirty is None else dirty
    if dirty:
        more = f" and {len(dirty) - SHOWN_DIRTY} more" if len(dirty) > SHOWN_DIRTY else ""
        commit += f" + uncommitted changes to code: {', '.join(dirty[:SHOWN_DIRTY])}{more}"
    return commit


def machine_info(*, server: bool = False, **extra: str) -> dict[str, str]:
    """CPU, cores, kernel, Python, date, ``commit_info`` and the tree, the local mariadbd version when ``server``,
    any ``extra`` entries and the load average."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        cpuinfo = []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "unknown")
    try:
        dirty = dirty_code_files()
        commit = commit_info(dirty=dirty)
        tree = (f"dirty (uncommitted changes to code: {', '.join(dirty[:SHOWN_DIRTY])})" if dirty
                else "clean (no uncommitted code changes)")
    except (OSError, subprocess.SubprocessError):
        commit, tree = "unknown", "not recorded (git failed)"
    info = {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "relayproxy commit": commit,
        "tree": tree,
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
    with contextlib.suppress(OSError):
        info["load average (1, 5, 15 min) at the end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return info


def command_line(script: str | os.PathLike, argv: list[str]) -> str:
    """The command that produced a result, relative to the repository root where possible."""
    paths = (Path(sys.executable), Path(script).resolve())
    return shlex.join([str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else str(p) for p in paths] + argv)


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is not installed (then no plots)."""
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


# -- repeats, order alternation, median and range ---------------------------------------------------------------

MIN_RUNS = 3  # every headline figure is the median of at least this many runs


def alternating_orders(runs: int, names: list[str] | tuple[str, ...]) -> list[list[str]]:
    """The contestants' order in each run: as given in even runs, reversed in odd ones (no one always runs first)."""
    names = list(names)
    return [names if i % 2 == 0 else names[::-1] for i in range(runs)]


def run_alternating(runs: int, names, run_one) -> list[dict]:
    """``run_one(order, run_index)``'s dicts for ``alternating_orders``, each with ``"order"`` ("a then b") added."""
    orders = alternating_orders(runs, names)
    return [{**run_one(order, i), "order": " then ".join(order)} for i, order in enumerate(orders)]


def median_range(values) -> tuple[float, float, float]:
    """(median, min, max) of the values."""
    values = sorted(float(v) for v in values)
    if not values:
        raise ValueError("no values")
    n = len(values)
    mid = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    return mid, values[0], values[-1]


def fmt_median_range(values, fmt: str = "{:.1f}", unit: str = "") -> str:
    """"40.5x (range 38.1x - 41.2x, 3 runs)": the median and the range of the runs."""
    med, lo, hi = median_range(values)
    f = lambda v: fmt.format(v) + unit  # noqa: E731
    return f"{f(med)} (range {f(lo)} - {f(hi)}, {len(list(values))} runs)"


def verdict(values, target: float, *, higher_is_better: bool = True) -> str:
    """Whether the median meets ``target``: "met" or "MISSED", plus "within noise" when the range straddles it."""
    med, lo, hi = median_range(values)
    met = med >= target if higher_is_better else med <= target
    straddles = lo < target <= hi if higher_is_better else lo <= target < hi
    word = "met" if met else "MISSED"
    return f"{word}, within noise (the runs range from {lo:.4g} to {hi:.4g} around the target)" if straddles else word


def header_block(script, argv: list[str], machine: dict[str, str], *, runs: int, what: str = "",
                 command: str | None = None) -> list[str]:
    """The block every results file starts with (markdown lines): the command (``command``, else built from
    ``script`` and ``argv``), the commit and tree, the machine in one line, the repeats."""
    commit = machine.get("relayproxy commit", "unknown")
    if runs == 1:  # said as it is: one run has no median, no range and no alternation
        repeats = f"- repeats: a single run{'; ' + what if what else ''}: no median or range, the figures are that run's"
    else:
        repeats = (f"- repeats: {runs} runs, the order of relay and peer alternated between runs"
                   f"{'; ' + what if what else ''}; figures are the median with the range (min - max) of the runs")
    clean = "clean (no uncommitted code changes)" if "uncommitted" not in commit else "DIRTY: " + commit.split(" + ", 1)[1]
    return [
        "Produced by (from the repository root):",
        "",
        "```",
        command or command_line(script, argv),
        "```",
        "",
        f"- commit: {commit.split(' + ', 1)[0]}; tree: {clean}",
        f"- machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, kernel {machine.get('kernel', '?')}, "
        f"Python {machine.get('python', '?')}; {machine.get('date', '')}",
        repeats,
        "",
    ]
