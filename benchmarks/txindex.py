"""The transaction index (relay/txindex.py): its size against the binlog it describes, and its lookups at scale.

Size: OLTP binlog files from ``tests/support/txgen.py`` indexed by ``txindex.build_bytes``. Lookups at
``--transactions``: sidecars synthesised with the block encoder over sparse relay files, then ``TransactionIndex``
asked GTID -> transaction, time -> first transaction at or after it, and one-day table queries, each lookup timed
alone at a random target after one (separately timed) warm-up query.

    python benchmarks/txindex.py                   # writes benchmarks/results/txindex.md
    python benchmarks/txindex.py --transactions 20000 --oltp-transactions 2000 --lookups 50 --no-write --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

from benchmarks.common import RESULTS_DIR, machine_info, percentile, results_document, write_results  # noqa: E402

from relayproxy.binlog import constants as C  # noqa: E402
from relayproxy.relay import txindex as T  # noqa: E402
from tests.support import eventgen as E  # noqa: E402
from tests.support.txgen import oltp_file  # noqa: E402

DAY_US = 86_400 * 1_000_000
SID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
TABLE_QUERIES = (  # label, table, LIMIT
    ("common table, LIMIT 1000", "app.t3", 1000),
    ("rare table (1 in 100,000), the whole day", "app.rare", 1_000_000),
    ("occasional table (1 in 1,000), the whole day", "app.sometimes", 1_000_000),
)


def measure_size(tmp: Path, n: int) -> dict:
    out = {}
    for flavour in ("mariadb", "mysql"):
        d = tmp / f"size-{flavour}"
        d.mkdir()
        image, _facts = oltp_file(n, flavour=flavour, rotate_to="binlog.000002", seed=7)
        (d / "binlog.000001").write_bytes(image)
        start = time.process_time()
        data, _ = T.build_bytes(d, "binlog.000001")
        cpu = time.process_time() - start
        side = T.parse_sidecar(data, "binlog.000001")
        out[flavour] = {"transactions": side.transactions, "binlog_bytes": len(image), "index_bytes": len(data),
                        "ratio_pct": 100.0 * len(data) / len(image), "bytes_per_transaction": len(data) / n,
                        "binlog_bytes_per_transaction": len(image) / n, "build_cpu_s": cpu,
                        "blocks": len(side.blocks)}
    return out


def synthesise(tmp: Path, total: int, files: int, seed: int = 3) -> dict:
    """``files`` sparse relay files with sidecars for ``total`` MySQL-like transactions over ten days."""
    rnd = random.Random(seed)
    d = tmp / "scale"
    d.mkdir()
    fde = E.fde("8.0.36")
    per_file = total // files
    rate = total / (10 * 86_400)  # ten days of history
    us = 1_700_000_000_000_000
    gno = 0
    names = []
    first_us = us
    for k in range(files):
        name = f"binlog.{k + 1:06d}"
        names.append(name)
        path = d / name
        path.write_bytes(C.BINLOG_MAGIC + fde)
        tables = T.TableDictionary()
        common = [tables.id(f"app.t{i}") for i in range(8)]
        sometimes, rare = tables.id("app.sometimes"), tables.id("app.rare")
        builder = T.SidecarBuilder(name, tables, fde_bytes=fde)
        builder.start(fde)
        pos = 4 + len(fde)
        chunks = []
        fd = os.open(path, os.O_RDWR)
        try:
            builder.tail_source = lambda end: os.pread(fd, min(T.TAIL_CHECK, end - 4), max(4, end - T.TAIL_CHECK))
            for _ in range(per_file):
                gno += 1
                size = rnd.randint(300, 520)
                us += int(rnd.expovariate(rate) * 1_000_000) + 1
                r = rnd.random()
                tabs = (rare,) if r < 1e-5 else (sometimes,) if r < 1e-3 else (rnd.choice(common),)
                builder.add(T.Record(pos, pos + size, ("u", SID), gno, us, False, tabs))
                pos += size
                if builder.out and len(builder.out) > 1 << 20:
                    chunks.append(builder.take())
                rnd.random()  # a draw the recorded runs made (for samples nothing read): the same files
            os.ftruncate(fd, pos)  # sparse: the identity checks read only the FDE and a few tail bytes
            builder.footer(pos, os.pread(fd, T.TAIL_CHECK, pos - T.TAIL_CHECK))
            chunks.append(builder.take())
        finally:
            os.close(fd)
        T.sidecar_path(d, name).write_bytes(b"".join(chunks))
    return {"dir": d, "names": names, "first_us": first_us, "last_us": us, "total": gno}


def measure_lookups(tmp: Path, total: int, files: int, lookups: int) -> dict:
    t0 = time.perf_counter()
    facts = synthesise(tmp, total, files)
    synth_s = time.perf_counter() - t0
    d, names = facts["dir"], facts["names"]
    sidecar_bytes = sum(T.sidecar_path(d, n).stat().st_size for n in names)
    index = T.TransactionIndex(d, lambda: names, lambda: (names[-1], os.path.getsize(d / names[-1])))
    t0 = time.perf_counter()
    assert index.first() is not None
    load_ms = (time.perf_counter() - t0) * 1000
    rnd = random.Random(11)
    kinds = {  # kind: (a random target, the lookup, whether what it found is right)
        "gtid": (lambda: f"{SID}:{rnd.randint(1, facts['total'])}", index.by_gtid, lambda f, g: f.gtid == g),
        "time": (lambda: rnd.randint(facts["first_us"], facts["last_us"]), index.first_at_or_after,
                 lambda f, at: f.commit_us >= at),
    }
    figures = {}
    for kind, (target, lookup, right) in kinds.items():
        ms = []
        for _ in range(lookups):
            want = target()
            t0 = time.perf_counter()
            found = lookup(want)
            ms.append((time.perf_counter() - t0) * 1000)
            assert found is not None and right(found, want)
        for q in (50, 99):  # common.percentile's exclusive rank
            figures[f"{kind}_p{q}_ms"] = percentile(ms, q, method="exclusive-rank")
        figures[f"{kind}_max_ms"] = max(ms)
    day_from = facts["first_us"] + 4 * DAY_US
    table = {}
    for label, name, limit in TABLE_QUERIES:
        r = table[label] = {"ms": [], "rows": []}
        for i in range(5):
            lo = day_from + i * DAY_US // 7
            t0 = time.perf_counter()
            rows = index.touching(name, lo, lo + DAY_US, limit)
            r["ms"].append((time.perf_counter() - t0) * 1000)
            r["rows"].append(len(rows))
    return {"transactions": facts["total"], "files": files, "synthesis_s": synth_s, "sidecar_bytes": sidecar_bytes,
            "sidecar_bytes_per_transaction": sidecar_bytes / facts["total"], "first_query_ms": load_ms,
            "lookups": lookups, **figures, "table": table,
            "history_days": (facts["last_us"] - facts["first_us"]) / DAY_US}


def met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(args, argv, size: dict, scale: dict) -> str:
    lines = ["## Size on OLTP binlogs (goal: at most 2 % of the binlog bytes)", "",
             f"Files from the project's event generators (`tests/support/txgen.py`; not a real server's binlogs), "
             f"{args.oltp_transactions:,} transactions each, indexed by `txindex.build_bytes` (blocks of "
             f"{T.BLOCK_RECORDS:,}).", "",
             "| flavour | binlog bytes / transaction | index bytes / transaction | index / binlog | verdict |",
             "|---|---|---|---|---|",
             *(f"| {flavour} | {r['binlog_bytes_per_transaction']:.0f} | {r['bytes_per_transaction']:.2f} | "
               f"{r['ratio_pct']:.2f} % | {met(r['ratio_pct'] <= 2.0)} |" for flavour, r in size.items()),
             "", "MariaDB commit times are whole seconds (the XID's header); MySQL's are the GTID events' "
             "immediate_commit_timestamp in microseconds, which costs most of the difference.", "",
             f"## Lookups at {scale['transactions']:,} transactions", "",
             f"Sidecars synthesised with the block encoder over {scale['files']} sparse relay files "
             f"({scale['history_days']:.1f} days of MySQL-like history, microsecond commit times, "
             f"{scale['sidecar_bytes_per_transaction']:.2f} index bytes a transaction, "
             f"{scale['sidecar_bytes'] / 1e6:.1f} MB of sidecars; built in {scale['synthesis_s']:.0f} s). "
             f"The first query, which reads every file's summary, took {scale['first_query_ms']:.0f} ms; then "
             f"{scale['lookups']:,} lookups of each kind at random targets (a block cache of 64 blocks, so nearly "
             "every lookup decodes its block):", "",
             "| lookup | p50 | p99 | max | goal |", "|---|---|---|---|---|",
             *(f"| {label} | {scale[k + '_p50_ms']:.3f} ms | {scale[k + '_p99_ms']:.3f} ms | "
               f"{scale[k + '_max_ms']:.3f} ms | p99 < 1 ms: {met(scale[k + '_p99_ms'] < 1)} |"
               for label, k in (("GTID -> transaction", "gtid"), ("time -> first transaction at or after", "time"))),
             "", "One-day table queries (5 windows a seventh of a day apart; goal < 100 ms):", "",
             "| query | median ms | max ms | rows (median) | goal |", "|---|---|---|---|---|"]
    for label, r in scale["table"].items():
        med, rows = (sorted(r[k])[len(r[k]) // 2] for k in ("ms", "rows"))
        lines.append(f"| {label} | {med:.1f} | {max(r['ms']):.1f} | {rows:,} | {met(max(r['ms']) < 100)} |")
    lines += ["", "A table query decodes only the blocks whose header lists the table and overlaps the window: a "
              "rare table skips nearly every block, a table in about one transaction of a thousand is in nearly "
              "every block and pays a decode per block of the day.", ""]
    return results_document("Transaction index: size and lookups", __file__, argv, machine_info(), lines,
                            what="sizes are exact; each lookup figure is a percentile over the lookups of "
                            "that single run")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--transactions", type=int, default=10_000_000, help="transactions for the lookup figures")
    ap.add_argument("--files", type=int, default=10, help="relay files they are spread over")
    ap.add_argument("--oltp-transactions", type=int, default=100_000, help="transactions per file for the size")
    ap.add_argument("--lookups", type=int, default=2000, help="lookups of each kind")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")
    ap.add_argument("--no-write", action="store_true", help="do not write benchmarks/results/txindex.md")
    ap.add_argument("--output-dir", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    with tempfile.TemporaryDirectory(prefix="txindex-bench-") as tmp:
        size = measure_size(Path(tmp), args.oltp_transactions)
        scale = measure_lookups(Path(tmp), args.transactions, args.files, args.lookups)
    if args.json:
        print(json.dumps({"size": size, "scale": scale}))
    if not args.no_write:
        write_results(Path(args.output_dir) / "txindex.md", report(args, argv, size, scale))
    return 0


if __name__ == "__main__":
    sys.exit(main())
