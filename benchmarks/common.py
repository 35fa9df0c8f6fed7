"""What every benchmark script shares: the log line, one percentile, the results file's skeleton and the plot.

The skeleton is benchinfo's: the command that produced the file, its ``- commit:``/``- tree:`` line and the machine
in one line at the top (``header_block``), the "## Machine" section at the end (``machine_section``).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from benchmarks.benchinfo import REPO_ROOT, command_line, header_block, machine_info, machine_section, pyplot

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"  # where every results file is written by default

__all__ = ["PERCENTILE_METHODS", "REPO_ROOT", "RESULTS_DIR", "command_line", "header_block", "logger", "machine_info", "machine_section",
           "percentile", "pyplot", "hop_buckets", "hop_share", "md_row", "results_document", "save_figure", "write_results", "add_report_options"]


def logger(name: str | None, *, clock: bool = True) -> Callable[[str], None]:
    """A ``log(message)`` for a benchmark: "[name HH:MM:SS] message" on stderr, flushed ("[name] message" without
    ``clock``; the bare message when ``name`` is None)."""

    def log(message: str) -> None:
        if name is None:
            prefix = ""
        elif clock:
            prefix = f"[{name} {time.strftime('%H:%M:%S')}] "
        else:
            prefix = f"[{name}] "
        print(prefix + message, file=sys.stderr, flush=True)

    return log


# -- percentile --------------------------------------------------------------------------------------------------

PERCENTILE_METHODS = ("rounded-index", "nearest-rank", "exclusive-rank")


def percentile(values: Iterable[float], q: float, *, method: str = "rounded-index") -> float:
    """The ``q``-th percentile (``q`` from 0 to 100) of ``values``, always one of the values (no interpolation);
    NaN when there are none. ``method`` says which value, for the n values sorted, counted from 0:

    - ``"rounded-index"`` (the default; the fan-out, hop-latency and archive-lag figures): the value at index
      ``round(q / 100 * (n - 1))`` (Python's round: halves go to the even index);
    - ``"nearest-rank"`` (the lossless trials): the value at index ``ceil(q / 100 * n) - 1`` (at least 0), the
      smallest value with at least q % of the values at or below it;
    - ``"exclusive-rank"`` (the txindex lookups): the value at index ``floor(q / 100 * n)`` (at most n - 1), the
      smallest value with more than q % of the values at or below it.

    The three are kept because each results file's figures were computed with its own; they agree on large
    samples and differ by at most one rank."""
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
    """A results file's markdown: ``# title``, the header (command, commit and tree, machine, repeats), ``body``
    (markdown lines), then the "## Machine" section."""
    lines = [f"# {title}", "", *header_block(script, argv, machine, runs=runs, what=what, command=command), *body]
    if lines[-1] != "":
        lines.append("")
    return "\n".join([*lines, *machine_section(machine)])


def md_row(*cells) -> str:
    """One row of a markdown table ("| a | b |"; an empty cell is "|  |")."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def write_results(path: Path, text: str, log: Callable[[str], None] | None = None) -> Path:
    """Write a results file (its folder made if missing) and log where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if log is not None:
        log(f"wrote {path}")
    return path


def add_report_options(parser: argparse.ArgumentParser, *, saved: str = "the whole report") -> None:
    """``--save-json`` (``saved`` written as JSON too), ``--notes`` (hand-written markdown appended to the results)
    and ``--render`` (measure nothing: the results written again from a saved report)."""
    parser.add_argument("--save-json", type=Path, default=None, help=f"also write {saved} as JSON here")
    parser.add_argument("--notes", type=Path, default=None, help="markdown appended to the results (written by hand: "
                        "findings and proposals written after looking at the run)")
    parser.add_argument("--render", type=Path, default=None, metavar="JSON",
                        help="measure nothing: write the markdown and plot again from a report saved by --save-json "
                        "(e.g. with --notes added); the command recorded is the one that measured")


# -- the relay's hop stages (relay/hoptimes.py) -----------------------------------------------------------------

def hop_buckets(http_port: int) -> dict[str, dict]:
    """A relay's relayproxy_hop_seconds now (its /metrics on ``http_port``): per stage its cumulative buckets
    (le -> count), sum and count."""
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



# -- the hop stages in a table (E) -------------------------------------------------------------------------------

def stage_cells(rows: list[dict], keys: Iterable[str] = ("mean", "p50", "p99")) -> list[str]:
    """Table cells of one hop stage over runs (``hop_share`` rows): per key the median over the runs that have it,
    "-" when none does; a count whole, milliseconds to 3 places."""
    import statistics

    cells = []
    for key in keys:
        values = [row[key] for row in rows if row[key] is not None]
        med = statistics.median(values) if values else None
        cells.append("-" if med is None else f"{med:.0f}" if key == "count" else f"{med:.3f}")
    return cells
