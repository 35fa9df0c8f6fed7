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


def _git(*args: str, root: Path = REPO_ROOT) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10).stdout.strip()


# What a result depends on: the package, the benchmark scripts, the build/test configuration. Results files
# (benchmarks/results/**) and findings notes (*_notes.md) are what a run writes, not what it measures.
CODE_PATHSPECS = ("relayproxy", "benchmarks", "setup.cfg", "pyproject.toml")
SHOWN_DIRTY = 8  # at most this many dirty code files named in the results header


def is_code(path: str) -> bool:
    """Whether a repository-relative path is code a benchmark result depends on."""
    parts = path.split("/")
    if parts[0] == "relayproxy":
        return "__pycache__" not in parts and not path.endswith("_notes.md")
    if parts[0] == "benchmarks":
        return len(parts) == 2 and path.endswith(".py")  # benchmarks/*.py, not results/, notes or data
    return path in ("setup.cfg", "pyproject.toml")


def dirty_code_files(root: Path = REPO_ROOT) -> list[str]:
    """Code files (``is_code``) with uncommitted changes, staged or not, untracked ones included, sorted."""
    out = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "-z", "--untracked-files=all", "--", *CODE_PATHSPECS],
        capture_output=True, text=True, timeout=10, check=True,  # not a repository: an error, never "clean"
    ).stdout
    entries = out.split("\0")
    paths: set[str] = set()
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        status, path = entry[:2], entry[3:]
        paths.add(path)
        if "R" in status or "C" in status:  # a rename or copy: the next entry is the source path
            if i < len(entries) and entries[i]:
                paths.add(entries[i])
            i += 1
    return sorted(p for p in paths if is_code(p))


def commit_info(root: Path = REPO_ROOT) -> str:
    """The short commit, plus the code files with uncommitted changes when there are any (results files and
    notes never make a tree dirty)."""
    commit = _git("rev-parse", "--short", "HEAD", root=root) or "no commit yet"
    dirty = dirty_code_files(root)
    if dirty:
        shown = ", ".join(dirty[:SHOWN_DIRTY])
        more = f" and {len(dirty) - SHOWN_DIRTY} more" if len(dirty) > SHOWN_DIRTY else ""
        commit += f" + uncommitted changes to code: {shown}{more}"
    return commit


def machine_info(*, server: bool = False, **extra: str) -> dict[str, str]:
    """CPU, cores, kernel, Python, relayproxy commit (``commit_info``: marked, with the file names, when code has
    uncommitted changes; results files never mark it), the local mariadbd version when ``server``, the load
    average, and any ``extra`` entries."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = commit_info()
        dirty = dirty_code_files()
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


# -- repeats, order alternation, median and range ---------------------------------------------------------------

MIN_RUNS = 3  # every headline figure is the median of at least this many runs


def alternating_orders(runs: int, names: list[str] | tuple[str, ...]) -> list[list[str]]:
    """The order of the contestants in each run: as given in even runs, reversed in odd ones, so that neither the
    relay nor its peer always runs first (warm caches, a neighbour's load, thermal state)."""
    names = list(names)
    return [names if i % 2 == 0 else names[::-1] for i in range(runs)]


def run_alternating(runs: int, names, run_one) -> list[dict]:
    """Call ``run_one(order, run_index)`` ``runs`` times with ``alternating_orders``; returns what each call returned
    (a dict of figures), each with ``"order"`` (the names joined by " then ") added."""
    out = []
    for i, order in enumerate(alternating_orders(runs, names)):
        result = dict(run_one(order, i))
        result["order"] = " then ".join(order)
        out.append(result)
    return out


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
    """Whether the median meets ``target``: "met", "MISSED", or either with "within noise" when the runs' range
    straddles the target (the run-to-run spread is larger than the margin, so another run could say the
    opposite)."""
    med, lo, hi = median_range(values)
    met = med >= target if higher_is_better else med <= target
    straddles = lo < target <= hi if higher_is_better else lo <= target < hi
    word = "met" if met else "MISSED"
    return f"{word}, within noise (the runs range from {lo:.4g} to {hi:.4g} around the target)" if straddles else word


def header_block(script, argv: list[str], machine: dict[str, str], *, runs: int, what: str = "",
                 command: str | None = None) -> list[str]:
    """The block every results file starts with (markdown lines): the exact command, the commit and whether the
    code was clean, the machine in one line, and how many runs with the order alternated. ``command`` replaces the
    command line built from ``script`` and ``argv`` (a report rendered again from saved figures names the command
    that measured them)."""
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
