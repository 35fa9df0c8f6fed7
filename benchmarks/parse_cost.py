"""Per-event parse cost: relayproxy's boundary hot path against python-mysql-replication's full decode.

Times ``benchmarks/parsing.py``'s walks over the corpus's file images in memory, per event: the header walk alone
(the floor), the boundary parser's batch path (``feed_buffer``) and per-event API (``feed``), the same plus CRC32,
relayproxy's typed views, and python-mysql-replication's decode (row values lazy, and materialised as a CDC
consumer does). 3 runs of 9 round-robin samples of at least 0.25 s each, GC off, the median counting. A full run
also profiles the boundary walk and writes ``parse_cost.md`` and ``.png`` to ``--output-dir``
(benchmarks/results/); ``--quick`` (1 run, 3 samples of 0.02 s, no rows-materialised, per-flavour or profile rows)
writes nothing. The corpus: $RELAYPROXY_CORPUS, else ../shared/corpus/binlogs beside the checkout.

    .venv/bin/python benchmarks/parse_cost.py            # full run, writes benchmarks/results/
    .venv/bin/python benchmarks/parse_cost.py --quick --json   # fast, prints JSON, writes nothing

The targets: boundary parsing <= 500 ns/event; the batch path >= 60x cheaper than python-mysql-replication.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a plain script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

import benchinfo  # noqa: E402  (benchmarks/benchinfo.py: this script's folder is on sys.path)
from benchmarks.common import RESULTS_DIR, save_figure  # noqa: E402
from parsing import (CONTESTANTS, CorpusFile, LibraryStats, core_measures, corpus_path, files_totals,  # noqa: E402
                     fmt_runs, load_corpus, make_walk_library, make_walk_views, measure, run_in_order, timed,
                     walk_boundary, walk_boundary_batch, walk_boundary_crc, walk_figures)

from relayproxy.binlog import constants as C  # noqa: E402
from relayproxy.binlog.boundary import TransactionBoundaryParser  # noqa: E402
from relayproxy.binlog.events import FormatDescription  # noqa: E402
from relayproxy.lab.reference import LIBRARY_VERSION  # noqa: E402

TARGET_NS = 500
TARGET_RATIO = 60  # the batch path >= 60x cheaper than python-mysql-replication (was 40x)
_FDE = C.FORMAT_DESCRIPTION_EVENT


# ---------------------------------------------------------------------------------------------
# Profile of the boundary hot path
def profile_boundary(files: list[CorpusFile], top: int = 12, walk: Callable = walk_boundary) -> str:
    """cProfile of a boundary walk (per-event feed by default): where its time goes, by function (tottime)."""
    profiler = cProfile.Profile()
    walk(files)  # warm
    profiler.enable()
    for _ in range(3):
        walk(files)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    # Keep the table, drop pstats' preamble about the file; shorten paths to the repo.
    keep = [ln.replace(str(REPO_ROOT) + "/", "") for ln in out.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(keep) if "ncalls" in ln), 0)
    summary = next((ln.strip() for ln in keep if "function calls" in ln), "")
    return summary + "\n\n" + "\n".join(keep[start:])


def py_spy_boundary(corpus: Path, seconds: float = 6.0, top: int = 14) -> str:
    """A markdown fragment (or why there is none): py-spy's samples (no per-call overhead added) of a child process
    that only walks the corpus with the boundary parser for ``seconds``, by innermost function and source line."""
    beside = Path(sys.executable).with_name("py-spy")  # installed into the same venv
    exe = str(beside) if beside.is_file() else shutil.which("py-spy")
    if exe is None:
        return "py-spy is not installed (`.venv/bin/pip install py-spy`), so there is no sampled profile."
    by_function: Counter[str] = Counter()
    by_line: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "boundary.txt"
        cmd = [exe, "record", "--rate", "400", "--format", "raw", "--output", str(raw), "--",
               sys.executable, str(Path(__file__).resolve()), "--spin-boundary", str(seconds)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120,
                                  env={**os.environ, "RELAYPROXY_CORPUS": str(corpus)})
        except (OSError, subprocess.SubprocessError) as exc:
            return f"py-spy could not run: {exc}"
        if proc.returncode != 0 or not raw.is_file():
            return f"py-spy failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-300:]}"
        for line in raw.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            if "walk_boundary" not in stack:  # loading the corpus, interpreter start-up
                continue
            func, _, where = stack.split(";")[-1].partition(" (")  # the leaf: "func (path:line)"
            path, _, lineno = where.rstrip(")").rpartition(":")
            by_function[f"{func} ({Path(path).name})"] += int(count_text)
            by_line[f"{path}:{lineno}"] += int(count_text)
    total = sum(by_function.values())
    if not total:
        return "py-spy recorded no samples of the boundary walk."
    out = [f"py-spy, {total} samples of the boundary walk (innermost frame = where the time is spent):", "",
           "| function | share |", "|---|---:|"]
    out += [f"| `{name}` | {count / total:.1%} |"
            for name, count in sorted(by_function.items(), key=lambda kv: -kv[1])[:8]]
    out += ["", "Hottest source lines:", "", "| share | line | source |", "|---:|---|---|"]
    for key, count in sorted(by_line.items(), key=lambda kv: -kv[1])[:top]:
        path, _, lineno = key.rpartition(":")
        source = _source_line(path, int(lineno)) if lineno.isdigit() else ""
        out.append(f"| {count / total:.1%} | `{path.replace(str(REPO_ROOT) + '/', '')}:{lineno}` | `{source}` |")
    return "\n".join(out)


def _source_line(path: str, lineno: int) -> str:
    for candidate in (Path(path), REPO_ROOT / path, REPO_ROOT / "benchmarks" / path):
        try:
            lines = candidate.read_text().splitlines()
        except OSError:
            continue
        if 0 < lineno <= len(lines):
            return lines[lineno - 1].strip().replace("|", "\\|")
    return ""


def spin_boundary(files: list[CorpusFile], seconds: float) -> None:
    """Walk the corpus with the boundary parser for a while (the py-spy child's whole job)."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        walk_boundary(files)


# ---------------------------------------------------------------------------------------------
# Reporting
def render_markdown(measures, results, info, argv, corpus, files, lib_stats, rejected: list[str], profile_text,
                    batch_profile_text, spy_text, repeat, runs=1) -> str:
    by_key = {m.key: m for m in measures}
    boundary = by_key["boundary"]
    per_run = results["runs"]
    col = {key: [r[key] for r in per_run] for key in ("ratio", "ratio_feed", "boundary_ns", "boundary_feed_ns")}

    lines = [
        "# Parse cost per event: relayproxy boundary parsing vs python-mysql-replication",
        "",
        *benchinfo.header_block(__file__, argv, info, runs=runs,
                                what=f"{repeat} samples per measurement and run"),
        f"Corpus: `{corpus}` -- {len(files)} files, {boundary.events} complete events, "
        f"{boundary.nbytes / 1e6:.2f} MB, loaded into memory once. The table: median of all {repeat * runs} samples "
        "per row over the runs (round robin, warm-up first, GC off while timing, `time.perf_counter_ns`); min-max "
        "in brackets.",
        "",
        "| measurement | ns/event | [min - max] | events/s | MB/s | x boundary |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for m in measures:
        ns, (lo, hi) = m.ns_per_event, m.spread
        lines.append(f"| {m.label} | {ns:,.0f} | [{lo:,.0f} - {hi:,.0f}] | {1e9 / ns:,.0f} | "
                     f"{m.nbytes / (ns * m.events) * 1e3:,.1f} | {ns / boundary.ns_per_event:.2f} |")
    lines += [
        "",
        f"**Ratio pymysqlreplication / boundary (batch `feed_buffer`): {fmt_runs(col['ratio'])}** (target >= "
        f"{TARGET_RATIO}x: {results['ratio_verdict']}). Boundary parsing, batch path: "
        f"{fmt_runs(col['boundary_ns'], '{:.0f}', ' ns/event')} (target <= {TARGET_NS} ns: "
        f"{results['boundary_ns_verdict']}).",
        "",
        "| run | order | ratio (batch) | ratio (per-event feed) | boundary batch ns/event | library ns/event |",
        "|---:|---|---:|---:|---:|---:|",
        *(f"| {i + 1} | {r['order']} | {r['ratio']:.1f}x | {r['ratio_feed']:.1f}x | {r['boundary_ns']:.0f} | "
          f"{r['library_ns']:,.0f} |" for i, r in enumerate(per_run)),
        "",
        "Per-event API (`feed` called once per event from Python, as the upstream receiver does for each packet): "
        f"{fmt_runs(col['boundary_feed_ns'], '{:.0f}', ' ns/event')}, {fmt_runs(col['ratio_feed'])} cheaper than "
        "pymysqlreplication. The batch path runs the event loop inside the parser and saves the per-event call and "
        "the 6-field header tuple.",
        "",
        "Absolute numbers come from a shared 2-core machine and are noise from run to run; the ratio "
        "between rows of the same run is what counts.",
        "",
        "Notes on the rows:",
        "",
        "- *header walk* is the floor: the loop and one `HEADER.unpack_from` per event, nothing else.",
        "- *boundary* adds `TransactionBoundaryParser.feed` per event (and `set_format` per FDE); "
        "*boundary + CRC32* adds `zlib.crc32` over a memoryview of every checksummed event.",
        "- *pymysqlreplication* is `ReferenceDecoder.decode` (python-mysql-replication "
        f"{LIBRARY_VERSION}): the event object `BinLogStreamReader` returns, row values still lazy. "
        f"Of {boundary.events} events it decoded {lib_stats.decoded}, had no decoder for "
        f"{lib_stats.not_decoded} and raised on {lib_stats.errors} (counted, timed, not retried). "
        f"With rows materialised it raised on {lib_stats.row_errors} rows events.",
        "- *views* builds `view_event(...)` for every event and reads the fields its consumer would "
        f"(QUERY db/text, GTID ids, XID, ROTATE target...); it rejected {len(rejected)} event(s)"
        + (": " + "; ".join(rejected) if rejected else "") + ".",
        f"- Events are {boundary.nbytes / boundary.events:.0f} bytes on average here; per-event cost, "
        "not bytes, decides throughput. Rows restricted to one flavour show the MySQL and MariaDB rules "
        "separately; the MySQL files are small (many FDEs per event), so fixed per-file costs weigh more there.",
        "",
        "Machine:",
        "",
        *(f"- {k}: {v}" for k, v in info.items()),
        "", "## Profile of the boundary hot path", "",
        *_profile_analysis(by_key, files),
        "", spy_text, "",
        "cProfile (3 walks of the corpus, sorted by own time; cProfile's per-call overhead inflates "
        "small functions, so read it for shares, not for absolute time):", "", "```", profile_text, "```", "",
        "cProfile of the batch path (`feed_buffer`, the headline row; 3 walks): its loops run inside "
        "`_batch_mysql` / `_batch_mariadb`, so their own time is the per-event loop; the calls below them are "
        "what leaves the inline cases (FORMAT_DESCRIPTION parsing, rare transitions, the group-end callback):",
        "", "```", batch_profile_text, "```", "",
    ]
    return "\n".join(lines)


def _profile_analysis(by_key, files: list[CorpusFile]) -> list[str]:
    """What dominates, from the ablation rows of this very run."""
    walk = by_key["header_walk"].ns_per_event
    boundary = by_key["boundary"].ns_per_event
    crc = by_key["boundary_crc"].ns_per_event
    per_file = _per_file_cost_ns(files)
    parts = [("loop + `HEADER.unpack_from` (header walk)", walk),
             ("per file: parser creation, `FormatDescription.parse` + `set_format` per FDE", per_file),
             ("`feed` per event (call, type dispatch, state transition, QUERY/GTID peeks)", boundary - walk - per_file)]
    return [
        "Cost split by ablation (medians of this run; the per-file row is timed separately):",
        "",
        "| part | ns/event | share of boundary |",
        "|---|---:|---:|",
        *(f"| {part} | {ns:,.0f} | {ns / boundary:.0%} |" for part, ns in parts),
        f"| CRC32 verification on top (not part of boundary) | {crc - boundary:,.0f} | - |",
    ]


def _per_file_cost_ns(files: list[CorpusFile], rounds: int = 20) -> float:
    """Fixed costs the boundary walk pays per file and per FDE, spread over the corpus's events."""
    fdes = [(cf.data, pos, size) for cf in files for pos, size, t in cf.events if t == _FDE]

    def per_file(files: list[CorpusFile]) -> None:
        for _cf in files:
            TransactionBoundaryParser()
        parser = TransactionBoundaryParser()
        for data, pos, size in fdes:
            parser.set_format(FormatDescription.parse(data, pos, size))

    return timed(per_file, files, rounds)[0] / rounds / files_totals(files)[0]


def write_chart(measures, results, path: Path) -> bool:
    plt = benchinfo.pyplot()
    if plt is None:
        return False
    labels = [m.label for m in measures]
    values = [m.ns_per_event for m in measures]
    colours = [
        "#9aa5b1" if m.key == "header_walk" else "#2f7ed8" if m.key.startswith(("boundary", "views")) else "#d9534f"
        for m in measures
    ]
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(measures) + 1.6))
    bars = ax.barh(labels, values, color=colours)
    ax.set_xscale("log")
    ax.set_xlim(min(values) / 1.5, max(values) * 3)
    ax.invert_yaxis()
    ax.set_xlabel("ns per event (log scale, median; lower is better)")
    ax.axvline(TARGET_NS, color="black", linestyle="--", linewidth=1)
    ax.annotate(f"target {TARGET_NS} ns", (TARGET_NS, -0.6), xytext=(3, 0), textcoords="offset points",
                fontsize=8, va="center")
    for bar, value in zip(bars, values):
        ax.text(value * 1.04, bar.get_y() + bar.get_height() / 2, f"{value:,.0f}", va="center", fontsize=8)
    ax.set_title(
        f"Per-event parse cost over the binlog corpus: python-mysql-replication / boundary = {results['ratio']:.1f}x\n"
        "(shared 2-core machine: compare the bars of one run, not absolute numbers)",
        fontsize=10,
    )
    save_figure(fig, path, dpi=120)
    return True


# ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="fast run (few short samples, no profile); writes nothing")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object on stdout")
    ap.add_argument("--output-dir", default=str(RESULTS_DIR), help="where parse_cost.md / .png go")
    ap.add_argument("--spin-boundary", type=float, metavar="SECONDS", help=argparse.SUPPRESS)  # py-spy's child
    args = ap.parse_args(argv)
    repeat, min_sample, runs = (3, 0.02, 1) if args.quick else (9, 0.25, benchinfo.MIN_RUNS)
    write = not args.quick

    corpus = corpus_path()
    files = load_corpus(corpus)
    if args.spin_boundary is not None:
        spin_boundary(files, args.spin_boundary)
        return 0
    events, nbytes = files_totals(files)
    if not events:
        raise SystemExit(f"parse_cost: no events in the corpus at {corpus}")

    lib_stats = LibraryStats()
    rows_stats = LibraryStats()
    rejected: list[str] = []  # "file @offset: why" of the events relayproxy's views reject
    core = core_measures(files, stats=lib_stats)
    measures = [*core[:3], measure("boundary_crc", "boundary + CRC32", walk_boundary_crc, files),
                measure("views", "views (view_event + fields)", make_walk_views(rejected), files), core[3]]
    if not args.quick:
        measures.append(measure("pymysqlreplication_rows", "pymysqlreplication + rows",
                                make_walk_library(True, rows_stats), files, peer=True))
    # Flavour split of the two headline rows: the MySQL and MariaDB rules are different code.
    for flavour in ("mysql", "mariadb"):
        subset = [cf for cf in files if cf.flavour == flavour]
        if args.quick or not files_totals(subset)[0]:
            continue
        measures.append(measure(f"boundary_{flavour}", f"boundary, {flavour} files only", walk_boundary, subset))
        measures.append(measure(f"pymysqlreplication_{flavour}", f"pymysqlreplication, {flavour} files only",
                                make_walk_library(False, LibraryStats()), subset, peer=True))

    def one_run(order, _index):
        """One run of every measurement in ``order`` (the relay's rows first, or the library's first)."""
        figures = walk_figures(run_in_order(measures, order, repeat, min_sample))
        del figures["floor_ns"]  # (the header walk has its own row)
        return figures

    per_run = benchinfo.run_alternating(runs, CONTESTANTS, one_run)
    ns = {m.key: m.ns_per_event for m in measures}
    ratios = [r["ratio"] for r in per_run]
    results = {
        # Headline: the parser's batch fast path (feed_buffer). The per-event API, which the
        # upstream receiver calls once per packet, is reported beside it.
        "boundary_ns_per_event": ns["boundary_batch"], "pymysqlreplication_ns_per_event": ns["pymysqlreplication"],
        "ratio": ns["pymysqlreplication"] / ns["boundary_batch"], "boundary_feed_ns_per_event": ns["boundary"],
        "ratio_feed": ns["pymysqlreplication"] / ns["boundary"], "boundary_crc_ns_per_event": ns["boundary_crc"],
        "header_walk_ns_per_event": ns["header_walk"], "views_ns_per_event": ns["views"],
        "pymysqlreplication_rows_ns_per_event": ns.get("pymysqlreplication_rows"),
        "runs": per_run, "ratio_median": benchinfo.median_range(ratios)[0],
        "ratio_verdict": benchinfo.verdict(ratios, TARGET_RATIO),
        "boundary_ns_verdict": benchinfo.verdict([r["boundary_ns"] for r in per_run], TARGET_NS,
                                                 higher_is_better=False),
        "events": events, "bytes": nbytes, "files": len(files), "repeat": repeat, "quick": args.quick,
        "library_errors": lib_stats.errors, "library_not_decoded": lib_stats.not_decoded,
        **{f"{key}_ns_per_event": value for key, value in ns.items()
           if key.startswith(("boundary_m", "pymysqlreplication_m"))},
    }

    if write:
        out_dir = Path(args.output_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        lib_stats.row_errors = rows_stats.row_errors
        spy_text = py_spy_boundary(corpus)
        info = benchinfo.machine_info(**{"python-mysql-replication": LIBRARY_VERSION})
        text = render_markdown(measures, results, info, argv, corpus, files, lib_stats, rejected,
                               profile_boundary(files), profile_boundary(files, walk=walk_boundary_batch), spy_text,
                               repeat, runs)
        chart = out_dir / "parse_cost.png"
        if write_chart(measures, results, chart):
            text += f"\nChart: `{chart.name}`\n"
        else:
            text += "\nNo chart: matplotlib is not installed (`.venv/bin/pip install matplotlib`).\n"
        (out_dir / "parse_cost.md").write_text(text)

    if args.json:
        print(json.dumps(results))
    else:
        for m in measures:
            print(f"{m.label:42s} {m.ns_per_event:12,.0f} ns/event {1e9 / m.ns_per_event:14,.0f} events/s")
        print(f"ratio pymysqlreplication / boundary: "
              f"{fmt_runs(ratios)}: {results['ratio_verdict']}")
        if write:
            print(f"wrote {Path(args.output_dir) / 'parse_cost.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
