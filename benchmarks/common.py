"""What every benchmark script shares: the log line, one percentile, the results file's skeleton (benchinfo's
``header_block`` and ``machine_section``) and the plot."""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks.benchinfo import REPO_ROOT, command_line, machine_info, pyplot  # noqa: F401  (re-exported)
from benchmarks.benchinfo import header_block, machine_section

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"  # where every results file is written by default


def logger(name: str | None, *, clock: bool = True) -> Callable[[str], None]:
    """A ``log(message)``: "[name HH:MM:SS] message" on stderr ("[name] message" without ``clock``, the bare message
    when ``name`` is None)."""

    def log(message: str) -> None:
        prefix = "" if name is None else f"[{name} {time.strftime('%H:%M:%S')}] " if clock else f"[{name}] "
        print(prefix + message, file=sys.stderr, flush=True)

    return log


# -- percentile --------------------------------------------------------------------------------------------------

PERCENTILE_METHODS = ("rounded-index", "nearest-rank", "exclusive-rank")


def percentile(values: Iterable[float], q: float, *, method: str = "rounded-index") -> float:
    """The ``q``-th percentile (0-100) of ``values``, always one of them (NaN when there are none); the index into
    the n sorted values: ``round(q / 100 * (n - 1))`` for "rounded-index" (halves to even), ``ceil(q / 100 * n) - 1``
    for "nearest-rank", ``floor(q / 100 * n)`` for "exclusive-rank". Each results file keeps the rule it was
    computed with; they differ by at most one rank."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return float("nan")
    if method == "rounded-index":
        index = round(q / 100 * (n - 1))
    elif method == "nearest-rank":
        index = int(max(1, -(-n * q // 100))) - 1
    elif method == "exclusive-rank":
        index = int(q / 100 * n)
    else:
        raise ValueError(f"unknown percentile method {method!r}; one of {', '.join(PERCENTILE_METHODS)}")
    return ordered[min(n - 1, max(0, index))]


# -- the results file --------------------------------------------------------------------------------------------

def results_document(title: str, script: str | Path, argv: list[str], machine: dict[str, str], body: list[str], *,
                     runs: int = 1, what: str = "", command: str | None = None) -> str:
    """A results file's markdown: ``# title``, ``header_block``, ``body`` (markdown lines), ``machine_section``."""
    lines = [f"# {title}", "", *header_block(script, argv, machine, runs=runs, what=what, command=command), *body]
    if lines[-1] != "":
        lines.append("")
    return "\n".join([*lines, *machine_section(machine)])


def md_row(*cells) -> str:
    """One row of a markdown table ("| a | b |")."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def write_results(path: Path, text: str, log: Callable[[str], None] | None = None) -> Path:
    """Write a results file (its folder made if missing) and log where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if log is not None:
        log(f"wrote {path}")
    return path


def add_report_options(parser: argparse.ArgumentParser, *, saved: str = "the whole report") -> None:
    """``--save-json``, ``--notes`` and ``--render`` (see ``relay_bench.report_of``)."""
    parser.add_argument("--save-json", type=Path, default=None, help=f"also write {saved} as JSON here")
    parser.add_argument("--notes", type=Path, default=None, help="markdown appended to the results (written by hand: "
                        "findings and proposals written after looking at the run)")
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="measure nothing: write the markdown and plot again from a report saved by --save-json "
                        "(e.g. with --notes added); the command recorded is the one that measured")


# -- the relay's hop stages (relay/hoptimes.py) -----------------------------------------------------------------

def hop_buckets(http_port: int) -> dict[str, dict]:
    """A relay's relayproxy_hop_seconds from /metrics: per stage its cumulative buckets (le -> count), sum, count."""
    from prometheus_client.parser import text_string_to_metric_families

    from relayproxy.relay.hoptimes import STAGES

    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, dict] = {stage: {"le": {}, "sum": 0.0, "count": 0.0} for stage in STAGES}
    for family in text_string_to_metric_families(text):
        if family.name == "relayproxy_hop_seconds":
            for s in family.samples:
                stage = out[s.labels["stage"]]
                if s.name.endswith("_bucket"):
                    stage["le"][s.labels["le"]] = s.value
                elif s.name.endswith("_sum"):
                    stage["sum"] = s.value
                elif s.name.endswith("_count"):
                    stage["count"] = s.value
    return out


def hop_share(before: dict, after: dict) -> dict[str, dict]:
    """The stages of the transactions between two scrapes: count, mean and the p50 / p99 bucket bounds (ms)."""
    from relayproxy.relay.hoptimes import STAGES

    out = {}
    for stage in STAGES:
        b, a = before[stage], after[stage]
        count = a["count"] - b["count"]
        cumulative = sorted(((float(le), a["le"][le] - b["le"].get(le, 0.0)) for le in a["le"]), key=lambda x: x[0])
        row = {"count": int(count), "mean": 1000 * (a["sum"] - b["sum"]) / count if count else None}
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            row[name] = next((1000 * le for le, n in cumulative if count and n >= q * count), None)
        out[stage] = row
    return out


# -- plots -------------------------------------------------------------------------------------------------------

def save_figure(fig: Any, path: Path, *, dpi: int = 110) -> Path:
    """Lay out ``fig``, write it to ``path`` and close it (pyplot keeps every open figure otherwise)."""
    plt = pyplot()
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    if plt is not None:
        plt.close(fig)
    return path


# -- a periodic sampler --------------------------------------------------------------------------------------

def every(period: float, sample: Callable[[], Any], name: str = "sampler") -> Callable[[], None]:
    """Call ``sample()`` every ``period`` seconds in a daemon thread (an exception of it is a missed sample) until
    the function returned is called (it waits for the thread to end; calling it again does nothing more)."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(period):
            with contextlib.suppress(Exception):
                sample()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()

    def halt() -> None:
        stop.set()
        thread.join(10)

    return halt


# -- the hop stages in a table ---------------------------------------------------------------------------------

def stage_cells(rows: list[dict], keys: Iterable[str] = ("mean", "p50", "p99")) -> list[str]:
    """Table cells of one hop stage over runs (``hop_share`` rows): per key the median over the runs that have it,
    "-" when none does; a count whole, milliseconds to 3 places."""
    cells = []
    for key in keys:
        values = [row[key] for row in rows if row[key] is not None]
        med = statistics.median(values) if values else None
        cells.append("-" if med is None else f"{med:.0f}" if key == "count" else f"{med:.3f}")
    return cells
