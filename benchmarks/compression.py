"""Closed relay files compressed and encrypted (relay/closed_files.py): ratio, CPU cost, and the dump's read speed.

Two data sets: ``corpus``, the shared corpus's real binlogs (``$RELAYPROXY_CORPUS``, read in place), and ``oltp``, a
local mariadbd master's binlogs after ``benchmarks/workloads.py``'s OLTP shape at scale ``OLTP_SCALE``; every
storage form of ``FORMS`` against the plain files of the same round (the results file says how each figure is
taken). ``--quick``: corpus only, one repeat, nothing written.

    .venv/bin/python benchmarks/compression.py
    .venv/bin/python benchmarks/compression.py --quick --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

from benchmarks.benchinfo import alternating_orders, header_block, machine_info, machine_section  # noqa: E402
from benchmarks.common import RESULTS_DIR, logger, pyplot, save_figure, write_results  # noqa: E402
from benchmarks.relay_bench import corpus_dir  # noqa: E402

from relayproxy.downstream.dump.files import RelayFile  # noqa: E402
from relayproxy.downstream.dump.sender import READ_CHUNK  # noqa: E402
from relayproxy.relay import closed_files as CF  # noqa: E402
from relayproxy.relay import conversion as CV  # noqa: E402

OLTP_SCALE = 8.0  # workloads.py's oltp shape at this scale
RING = CF.Keyring.parse("1:" + os.urandom(32).hex(), "benchmark key")
FORMS = {
    "zstd 1": CV.StorageOptions(compress="zstd", level=1),
    "zstd 3": CV.StorageOptions(compress="zstd", level=3),
    "zstd 9": CV.StorageOptions(compress="zstd", level=9),
    "AES-GCM": CV.StorageOptions(encrypt=True, keyring=RING),
    "zstd 3 + AES-GCM": CV.StorageOptions(compress="zstd", level=3, encrypt=True, keyring=RING),
}
log = logger(None)


def corpus_files(root: Path) -> list[Path]:
    files = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.stat().st_size > 4:
            with open(p, "rb") as f:
                if f.read(4) == b"\xfebin":
                    files.append(p)
    if not files:
        raise SystemExit(f"compression: no binlog files under {root}; set RELAYPROXY_CORPUS")
    return files


@contextlib.contextmanager
def oltp_files(workdir: Path, scale: float):
    from benchmarks import workloads
    from relayproxy.lab.sandbox import MariaDBSandbox

    master = MariaDBSandbox(workdir / "master", extra_config={"max_binlog_size": 16 << 20})
    try:
        master.start()
        master.execute("CREATE DATABASE w")
        began = time.monotonic()
        workloads.oltp(master, scale, random.Random(7))
        master.execute("FLUSH BINARY LOGS")
        log(f"oltp load: {time.monotonic() - began:.1f} s")
        yield master.binlog_files()[:-1]
    finally:
        master.stop()


def convert_all(files: list[Path], out: Path, opts: CV.StorageOptions) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    res = {"logical": 0, "stored": 0, "cpu_write": 0.0, "cpu_verify": 0.0, "produced": []}
    for i, src in enumerate(files):
        name = f"f.{i:06d}"
        dst = out / (name + CF.SUFFIX)
        dst.unlink(missing_ok=True)
        t0 = time.process_time()
        CV.write_framed(src, dst, name, opts)
        t1 = time.process_time()
        CV.logical_crc(dst, name=name, keyring=opts.keyring)
        res["cpu_write"] += t1 - t0
        res["cpu_verify"] += time.process_time() - t1
        res["logical"] += src.stat().st_size
        res["stored"] += dst.stat().st_size
        res["produced"].append((name, dst.with_name(name)))  # the relay-file path: the reader finds name.rpz
    return res


async def dump_read(paths: list[tuple[str, Path]]) -> tuple[int, float]:
    """Read every file start to end in READ_CHUNK pieces through RelayFile (the dump's reader)."""
    total = 0
    began = time.perf_counter()
    for name, path in paths:
        rf = RelayFile(name, path)
        try:
            size = rf.size()
            pos = 0
            while pos < size:
                pos += len(await rf.read(pos, min(READ_CHUNK, size - pos)))
            total += size
        finally:
            rf.close()
    return total, time.perf_counter() - began


def mid_start(paths: list[tuple[str, Path]], rnd: random.Random, n: int = 200) -> float:
    """Microseconds to open a file and read 64 KB at a random offset."""
    sizes = [(name, path, CF.open_relay_file(path).size()) for name, path in paths]
    big = [s for s in sizes if s[2] > 128 << 10] or sizes
    began = time.perf_counter()
    for _ in range(n):
        name, path, size = rnd.choice(big)
        with CF.open_relay_file(path) as f:
            f.read(rnd.randrange(max(size - (64 << 10), 1)), 64 << 10)
    return (time.perf_counter() - began) / n * 1e6


def plain_paths(files: list[Path], out: Path) -> list[tuple[str, Path]]:
    """The plain files as a relay directory would hold them: symlinks named like relay files (no copy)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, src in enumerate(files):
        link = out / f"f.{i:06d}"
        if not link.exists():
            link.symlink_to(src)
        paths.append((link.name, link))
    return paths


def measure(label: str, files: list[Path], workdir: Path, repeat: int) -> dict:
    logical = sum(p.stat().st_size for p in files)
    log(f"{label}: {len(files)} files, {logical / 1e6:.1f} MB")
    samples = {f: {"read": [], "mid": [], "cpu_write": [], "cpu_verify": []} for f in ["plain", *FORMS]}
    plain = plain_paths(files, workdir / "plain")
    converted = {}
    for r, order in enumerate(alternating_orders(repeat, ["plain", *FORMS])):
        for form in (f for f in order if f != "plain"):  # the forms in turns, the order reversed every other round
            d = workdir / form.replace(" ", "_").replace("+", "and")
            CF.configure(d, keyring=RING)
            converted[form] = convert_all(files, d, FORMS[form])
            for key in ("cpu_write", "cpu_verify"):
                samples[form][key].append(converted[form][key])
        for form in order:
            paths = plain if form == "plain" else converted[form]["produced"]
            total, secs = asyncio.run(dump_read(paths))
            samples[form]["read"].append(total / secs / 1e6)
            samples[form]["mid"].append(mid_start(paths, random.Random(r)))
        log(f"{label}: round {r + 1}/{repeat} done")
    plain_s = samples["plain"]
    rows = {"plain": {"ratio": 1.0, "stored_mb": logical / 1e6, "cpu_write_s_per_gb": 0.0, "cpu_verify_s_per_gb": 0.0,
                      "read_mb_s": statistics.median(plain_s["read"]), "read_vs_plain": 1.0,
                      "mid_start_us": statistics.median(plain_s["mid"]), "mid_vs_plain": 1.0}}
    for form in FORMS:
        s, res = samples[form], converted[form]
        row = rows[form] = {"ratio": res["logical"] / res["stored"], "stored_mb": res["stored"] / 1e6,
                            **{f"{key}_s_per_gb": statistics.median(s[key]) / (logical / 1e9)
                               for key in ("cpu_write", "cpu_verify")}}
        for key, figure in (("read", "read_mb_s"), ("mid", "mid_start_us")):
            ratios = [a / b for a, b in zip(s[key], plain_s[key])]  # per round, against the same round's plain
            row[figure] = statistics.median(s[key])
            row[f"{key}_vs_plain"] = statistics.median(ratios)
            row[f"{key}_vs_plain_range"] = [min(ratios), max(ratios)]
    return {"files": len(files), "logical_mb": logical / 1e6, "forms": rows}


def table(result: dict) -> list[str]:
    out = ["| form | ratio (logical/stored) | stored MB | convert CPU s/GB | verify CPU s/GB | dump read MB/s | "
           "read vs plain | mid-file start µs | vs plain |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def versus(r: dict, key: str, fmt: str) -> str:
        span = r.get(f"{key}_vs_plain_range")  # none for the plain files
        tail = f" ({fmt.format(span[0])}-{fmt.format(span[1])})" if span else ""
        return fmt.format(r[f"{key}_vs_plain"]) + "x" + tail

    for form, r in result["forms"].items():
        out.append(f"| {form} | {r['ratio']:.2f} | {r['stored_mb']:.1f} | {r['cpu_write_s_per_gb']:.1f} | "
                   f"{r['cpu_verify_s_per_gb']:.1f} | {r['read_mb_s']:.0f} | {versus(r, 'read', '{:.2f}')} | "
                   f"{r['mid_start_us']:.0f} | {versus(r, 'mid', '{:.1f}')} |")
    return out


def render(results: dict, argv: list[str], machine: dict, repeat: int) -> str:
    lines = ["# Closed relay files: compression and encryption", "",
             *header_block(__file__, argv, machine, runs=repeat,
                                     what="here the contestants are the plain files and each storage form; the "
                                          "tables give medians, the vs-plain columns the range (min-max) of the "
                                          "per-round ratios in brackets"),
             "Frames of 1 MiB (`closed_files.DEFAULT_FRAME_SIZE`). Ratio = logical / stored bytes. CPU is "
             "`time.process_time` per logical GB (convert = compress/encrypt + write + fsync; verify = the read-back "
             "every conversion does before its rename). Dump read = `RelayFile.read` of `READ_CHUNK` pieces over "
             "every file (frames decoded in a worker thread), logical MB/s; mid-file start = open + 64 KB read at a "
             f"random offset. Medians of {repeat} rounds, forms in turns (order reversed every other round); ratios "
             "against the plain files of the same round.", ""]
    for label, res in results.items():
        what = ("the shared corpus of real binlogs (read in place)" if label == "corpus" else
                "a local mariadbd master's binlogs after the OLTP workload (workloads.py oltp, scale "
                f"{OLTP_SCALE})")
        lines += [f"## {label}: {what}", "", f"{res['files']} files, {res['logical_mb']:.1f} MB logical.", "",
                  *table(res), ""]
    lines += ["## Reading these figures", "",
              "The stored sizes (ratios) are exact and repeat from run to run. CPU and read-throughput figures come "
              "from a shared machine (load average below) and moved by up to 2x between runs of this script; compare "
              "forms within one run (the `vs plain` columns), not across runs. The corpus is 96 small files (68 KB on "
              "average) read in a few milliseconds a round, so its throughput and mid-file columns are mostly noise "
              "(see their ranges); the OLTP files (12 MB each) give the stable throughput figures. A replica reads a "
              "relay file once per dump, so a dump of converted files is bounded by the decode rate above (hundreds "
              "of MB/s), and a dump starting mid-file pays one frame decode (about 1-2 ms) once.", "",
              *machine_section(machine)]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, forms, title in ((axes[0], "ratio", list(FORMS), "compression ratio (logical / stored)"),
                                  (axes[1], "read_vs_plain", ["plain", *FORMS], "dump read throughput vs plain")):
        for i, (label, res) in enumerate(results.items()):
            ax.bar([x + i * 0.4 for x in range(len(forms))], [res["forms"][f][key] for f in forms], 0.4, label=label)
        ax.set_xticks(range(len(forms)), forms, rotation=20, fontsize=8)
        ax.set_title(title)
        ax.legend()
    save_figure(fig, path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="corpus only, one repeat, nothing written")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    ap.add_argument("--output-dir", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)
    root = corpus_dir()
    repeat = 1 if args.quick else args.repeat
    results = {}
    with tempfile.TemporaryDirectory(prefix="relayproxy-compression-") as tmp:
        tmp = Path(tmp)
        results["corpus"] = measure("corpus", corpus_files(root), tmp / "corpus", repeat)
        if not args.quick:
            with oltp_files(tmp / "oltp", OLTP_SCALE) as files:
                results["oltp"] = measure("oltp", files, tmp / "oltp-forms", repeat)
    if args.json:
        print(json.dumps(results))
    if args.quick:
        return 0
    out_dir = Path(args.output_dir)
    text = render(results, sys.argv[1:] if argv is None else argv, machine_info(server=True), repeat)
    write_results(out_dir / "compression.md", text, log)
    plot(results, out_dir / "compression.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
