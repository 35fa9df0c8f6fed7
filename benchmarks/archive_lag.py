"""How far the archive (docs/archive.md) trails the relay's horizon under a steady OLTP load, what it uploads
against the binlog, and what the PUT requests cost; a relay that does not archive is the peer (ingest lag, CPU).

Each of ``CONFIGS`` run ``SETTINGS["repeats"]`` times in alternated order, moto behind a byte-counting
ThreadedFaultProxy; then, for each of ``STALL_SECONDS`` (either side of the relay's S3 read timeout of 30 s), one
more run with moto SIGSTOPped that long in the middle of the load. The results file describes every column.

    .venv/bin/python benchmarks/archive_lag.py
"""

from __future__ import annotations

import argparse
import itertools
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

from benchmarks import benchinfo  # noqa: E402
from benchmarks.common import RESULTS_DIR, logger, percentile, save_figure, write_results  # noqa: E402
from benchmarks.fanout_common import LOADS, Writers  # noqa: E402
from relayproxy.lab.faultproxy import ThreadedFaultProxy  # noqa: E402
from relayproxy.lab.harness import RelayProcess, master_status, prepare_master  # noqa: E402
from relayproxy.lab.procstat import cpu_seconds  # noqa: E402
from relayproxy.lab.s3server import BUCKET, MotoServer  # noqa: E402
from relayproxy.lab.sandbox import MariaDBSandbox  # noqa: E402

RESULTS = RESULTS_DIR / "archive_lag.md"
GOAL_LAG_S = 2.0
GOAL_BYTES_RATIO = 1.1
# AWS S3 Standard list prices (us-east-1) as the benchmark's author knew them: the operator checks the current ones.
PRICE_PUT_PER_1000 = 0.005
PRICE_GET_PER_1000 = 0.0004
PRICE_GB_MONTH = 0.023
# name: archive_interval (None: not set, the default of 1 s in docs/archive.md), or False: no archive
CONFIGS = {"default interval": None, "interval 0.25 s": 0.25, "no archive": False}
# The run: OLTP at ``rate`` trx/s for ``seconds`` a run from ``writers`` processes, /status sampled every ``sample``
# s, the master's files of ``max_binlog_size``, its datadir in ``servers_dir`` (the relays' in /tmp).
SETTINGS = {"rate": 1000.0, "seconds": 60.0, "repeats": 3, "writers": 2, "sample": 0.1, "max_binlog_size": "8M",
            "servers_dir": "/dev/shm"}
STALL_SECONDS = (5.0, 35.0)  # one more run for each, the bucket stopped that long


log = logger("archive_lag")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


class Sampler(threading.Thread):
    """Every ``period``: the relay's /status (store horizon, archive section) and the master's SHOW MASTER STATUS."""

    def __init__(self, relay: RelayProcess, master: MariaDBSandbox, period: float):
        super().__init__(daemon=True)
        self.relay, self.master, self.period = relay, master, period
        self.samples: list[dict] = []
        self.failed = 0
        self._halt = threading.Event()

    def run(self) -> None:
        import pymysql

        db = pymysql.connect(host="127.0.0.1", port=self.master.port, user="root", autocommit=True)
        cur = db.cursor()
        nxt = time.monotonic()
        while True:
            try:
                cur.execute("SHOW MASTER STATUS")
                master_file, master_pos = cur.fetchone()[:2]
                t = time.monotonic()
                s = self.relay.status()
            except Exception:  # noqa: BLE001 - a missed sample is counted, not fatal
                self.failed += 1
            else:
                a = s.get("archive") or {}
                h = a.get("horizon") or {}
                self.samples.append({
                    "t": t, "master": (master_file, int(master_pos)),
                    "store": (s.get("master_log_file"), s.get("read_master_log_pos")),
                    "archive": (h.get("file"), h.get("position")) if a else None,
                    "lag_s": a.get("lag_seconds"), "lag_b": a.get("lag_bytes"), "objects": a.get("objects_uploaded"),
                })
            nxt = max(nxt + self.period, time.monotonic())
            if self._halt.wait(nxt - time.monotonic()):
                break
        db.close()

    def stop(self) -> list[dict]:
        self._halt.set()
        self.join(10)
        return self.samples


def byte_offsets(sizes: dict[str, int]):
    """``g((file, position))``: that position counted in bytes from the start of the first binlog file (0 for None)."""
    off, total = {}, 0
    for name in sorted(sizes):
        off[name] = total
        total += sizes[name]
    return lambda fp: 0 if fp is None or fp[0] is None else off.get(fp[0], 0) + int(fp[1] or 0)


def analyse(samples: list[dict], sizes: dict[str, int], t0: float, t1: float, t_drained: float | None,
            archive: bool) -> dict:
    """Figures from the samples: lags during the load [t0, t1], the model of the naive uploader."""
    g = byte_offsets(sizes)
    load = [s for s in samples if t0 <= s["t"] <= t1]
    ingest = [max(0, g(s["master"]) - g(s["store"])) for s in load]
    out: dict = {"ingest_lag_p99": percentile(ingest, 99),
                 "ingest_lag_max": max(ingest, default=0),
                 "series": [(round(s["t"] - t0, 3), s["lag_s"], s["lag_b"]) for s in samples if s["t"] >= t0 - 1]}
    if not archive:
        return out
    lag_s = [float(s["lag_s"]) for s in load if s["lag_s"] is not None]
    lag_b = [int(s["lag_b"]) for s in load if s["lag_b"] is not None]
    out.update(lag_p50=percentile(lag_s, 50), lag_p99=percentile(lag_s, 99), lag_max=max(lag_s, default=0.0),
               lagb_p99=percentile(lag_b, 99), lagb_max=max(lag_b, default=0))
    # The age of the oldest durable byte not in the bucket, from the samples alone: at sample i the bucket holds
    # up to A_i; the newest earlier sample j whose store horizon S_j <= A_i says every byte past A_i became durable
    # after t_j: the age is below t_i - t_j (0 when S_i <= A_i).
    ages, j = [], 0
    for i, s in enumerate(samples):
        a = g(s["archive"])
        if g(s["store"]) <= a:
            age = 0.0
        else:
            while j + 1 <= i and g(samples[j + 1]["store"]) <= a:
                j += 1
            age = s["t"] - samples[j]["t"] if g(samples[j]["store"]) <= a else s["t"] - samples[0]["t"]
        if t0 <= s["t"] <= t1:
            ages.append(age)
    out["age_max"] = max(ages, default=0.0)
    in_load = [s for s in load if s["objects"] is not None]
    minutes = (in_load[-1]["t"] - in_load[0]["t"]) / 60 if len(in_load) > 1 else 0.0  # 0: too few samples
    out["puts_per_min_load"] = (in_load[-1]["objects"] - in_load[0]["objects"]) / minutes if minutes else float("nan")
    # Modelled: every second, the whole open file put again; a file put once more, whole, when it is closed.
    naive_bytes = naive_puts = 0
    end = t_drained if t_drained is not None else samples[-1]["t"]
    tick, k, closed = t0 + 1.0, 0, set()
    while tick <= end:
        while k + 1 < len(samples) and samples[k + 1]["t"] <= tick:
            k += 1
        f, p = samples[k]["store"]
        for name in sorted(sizes):
            if name < f and name not in closed:
                closed.add(name)
                naive_bytes += sizes[name]
                naive_puts += 1
        naive_bytes += int(p)
        naive_puts += 1
        tick += 1.0
    out["naive_bytes"], out["naive_puts"] = naive_bytes, naive_puts
    return out


def one_run(ctx: dict, name: str, index: int, stall: float = 0.0) -> dict:
    master, moto = ctx["master"], ctx["moto"]
    interval = CONFIGS[name]
    archive = interval is not False
    slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
    prefix = f"runs/{index:02d}-{slug}"
    master.execute("TRUNCATE TABLE bench.oltp")
    master.execute("RESET MASTER")
    relay_dir = ctx["relay_parent"] / f"relay-{index:02d}-{slug}"
    fwd = ThreadedFaultProxy("127.0.0.1", moto.port).start() if archive else None  # counts the bytes to moto
    extra = []
    if archive:
        extra = ["--archive-url", f"s3://{BUCKET}/{prefix}", "--archive-endpoint", f"http://127.0.0.1:{fwd.port}"]
        if interval is not None:
            extra += ["--archive-interval", str(interval)]
    relay = RelayProcess(relay_dir, master.port, extra=extra, error=RuntimeError, env=moto.env).start()
    log_mark = moto.log_size()
    try:
        relay.wait_caught_up(master)
        if archive:
            relay.wait_for(lambda s: s["archive"]["state"] == "ok" and s["archive"]["lag_bytes"] == 0, 60,
                           "the archive caught up before the load")
        writers = Writers(master.port, "oltp", [(SETTINGS["rate"], SETTINGS["seconds"])], writers=SETTINGS["writers"])
        sampler = Sampler(relay, master, SETTINGS["sample"])
        sampler.start()
        time.sleep(1.0)
        cpu0 = cpu_seconds(relay.pid)
        writers.go()
        stalled = None
        if stall:
            time.sleep(SETTINGS["seconds"] / 2 - stall / 2)
            stalled = [time.monotonic()]
            moto.pause()
            time.sleep(stall)
            moto.resume()
            stalled.append(time.monotonic())
        w = writers.result()
        cpu1 = cpu_seconds(relay.pid)
        relay.wait_caught_up(master, 60)
        t_drained = None
        if archive:
            end = master_status(master)
            relay.wait_for(lambda s: s["archive"]["state"] == "ok"
                           and (s["archive"]["horizon"]["file"], s["archive"]["horizon"]["position"]) == end,
                           120, "the archive at the master's end after the load", poll=0.02)
            t_drained = time.monotonic()
        time.sleep(1.0)
        samples = sampler.stop()
        final = relay.status()
    finally:
        relay.stop()
        if fwd is not None:
            wire = fwd.stats()
            fwd.stop()
    sizes = {row[0]: int(row[1]) for row in master.execute("SHOW BINARY LOGS")}
    binlog = sum(sizes.values())
    run = {"config": name, "interval": interval, "trx": w["trx"], "seconds": w["t_end"] - w["t0"],
           "rate": w["trx"] / (w["t_end"] - w["t0"]), "binlog_bytes": binlog,
           "relay_cpu_ms_per_trx": 1000 * (cpu1 - cpu0) / max(1, w["trx"]), "failed_samples": sampler.failed}
    run.update(analyse(samples, sizes, w["t0"], w["t_end"], t_drained, archive))
    if stalled:
        run["stall"] = [stalled[0] - w["t0"], stalled[1] - w["t0"]]
        after = [s for s in samples if s["t"] >= stalled[1] and s["archive"] is not None]
        g = byte_offsets(sizes)
        run["stall_caught_up_after"] = next((s["t"] - stalled[1] for s in after if g(s["archive"]) >= g(s["store"])
                                             or (s["lag_s"] is not None and s["lag_s"] < 1.5)), None)
        run["ingest_lag_max_stall"] = max((max(0, g(s["master"]) - g(s["store"])) for s in samples
                                           if stalled[0] <= s["t"] <= stalled[1]), default=0)
    if archive:
        a = final["archive"]
        objects = moto.bucket_objects(prefix)
        reqs = moto.requests(log_mark, prefix)
        run.update(
            put_bytes=a["bytes_uploaded"], put_objects=a["objects_uploaded"], parts=a["parts_uploaded"],
            sealed=a["files_sealed"], errors=a["errors"],
            bucket_bytes=sum(size for _, size in objects), bucket_objects=len(objects),
            bucket_parts=sum(1 for key, _ in objects if "/part." in key),
            wire_up=wire.client_to_server, connections=wire.accepted,
            moto_requests=reqs, moto_puts=reqs.get("PUT", 0),
        )
        for ratio, key in (("put", "put_bytes"), ("bucket", "bucket_bytes"), ("wire", "wire_up"),
                           ("naive", "naive_bytes")):
            run[f"{ratio}_ratio"] = run[key] / binlog
        run["puts_per_gb"] = run["moto_puts"] / (binlog / 1e9)
    shutil.rmtree(relay_dir, ignore_errors=True)
    return run


# -- the report ------------------------------------------------------------------------------------------------------

def mr(values, fmt="{:.2f}") -> str:
    """The median with the range, "1.27 (1.20-1.63)"; the value alone for one run, "-" for none."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    med, lo, hi = benchinfo.median_range(values)
    return f"{fmt.format(med)} ({fmt.format(lo)}-{fmt.format(hi)})"


def med(values) -> float:
    return benchinfo.median_range([v for v in values if v is not None])[0]


# The archive's columns of the per-run and summary tables: (run key, format, divisor, also in the summary).
ARCHIVE_COLUMNS = (
    ("lag_p50", "{:.3f}", 1, False), ("lag_p99", "{:.3f}", 1, True), ("lag_max", "{:.3f}", 1, True),
    ("age_max", "{:.2f}", 1, True), ("lagb_p99", "{:.0f}", 1e3, False), ("lagb_max", "{:.0f}", 1e3, True),
    ("put_ratio", "{:.4f}", 1, True), ("bucket_ratio", "{:.4f}", 1, True), ("wire_ratio", "{:.4f}", 1, True),
    ("puts_per_min_load", "{:.0f}", 1, True), ("puts_per_gb", "{:,.0f}", 1, True), ("errors", "{}", 1, False),
)


def column(rs: list[dict], key: str, divisor: float = 1) -> list:
    return [r[key] / divisor if divisor != 1 else r[key] for r in rs]


def render(report: dict, argv: list[str]) -> str:
    args = report["args"]
    runs = report["runs"]
    by = {name: [r for r in runs if r["config"] == name] for name in CONFIGS}
    measured = [(name, by[name]) for name in CONFIGS if CONFIGS[name] is not False and by[name]]
    lines = ["# Archive lag: the bucket behind the horizon at 1,000 trx/s, bytes and requests", ""]
    lines += benchinfo.header_block(__file__, argv, report["machine"], runs=args["repeats"],
                                    what="the three configurations of a repeat run one after another")
    lines += [
        f"Per run: {args['seconds']:g} s of OLTP transactions at {args['rate']:g} trx/s ({args['writers']} writer "
        "processes, one connection each: an autocommit INSERT of a 200-byte row and a START TRANSACTION; INSERT; "
        "UPDATE; COMMIT, in turn) on a MariaDB master (ROW, `max_binlog_size` "
        f"{args['max_binlog_size']}, datadir on {args['servers_dir']}; `RESET MASTER` before each run, so each run "
        "archives the binlog its own load wrote); a fresh `relayproxy run` (defaults: per-transaction durability; "
        f"relay directory on {report['relay_fs']}) with `archive_url = s3://{BUCKET}/runs/<run>` on moto's "
        "standalone S3 server (`python -m moto.server`, in memory) over HTTP on 127.0.0.1, through a byte-counting "
        f"TCP forwarder. The relay's /status and the master's position sampled every {args['sample']:g} s. After the "
        "load the relay drains and the archive reaches the master's end.", "",
        "**The machine has 2 cores shared with other work: the master, the relay, moto, the writers and the sampler "
        "run on them.** A real bucket is farther away than moto on loopback (tens of ms a PUT instead of a few): "
        "the lag here is the uploader's own cadence plus a near-zero request time.", "",
        f"- load (`uptime`) at the start: {report['uptime_start']}",
        f"- load (`uptime`) at the end: {report['uptime_end']}", "",
        "Columns: **lag s** = the relay's `archive.lag_seconds` (seconds since the bucket last held everything the "
        "relay had made durable), over the samples during the load; **age max** = the same from the samples alone "
        "(the age of the oldest durable byte not yet in the bucket, an upper bound to one sampling interval); "
        "**lag KB** = `archive.lag_bytes`; **put/binlog** = bytes the relay put (`bytes_uploaded`, every "
        "object, horizon.json after each part included) / the master's binlog bytes; **bucket/binlog** = bytes in "
        "the bucket at the end (list_objects_v2) / binlog; **wire/binlog** = bytes sent to the bucket over TCP "
        "(HTTP headers, signatures, retries) / binlog; **PUT/min** = objects put per minute of load (relay's "
        "count); **PUT/GB** = PUT requests moto logged per GB of binlog; **CPU** = relay CPU per transaction "
        "(all threads); **ingest KB** = master position - relay horizon, p99 / max over the samples.", "",
        "## Per run", "",
        "| run | configuration | order | trx/s | binlog MB | lag s p50 | lag s p99 | lag s max | age max s | "
        "lag KB p99 | lag KB max | put/binlog | bucket/binlog | wire/binlog | PUT/min | PUT/GB | errors | "
        "CPU ms/trx | ingest KB p99 | ingest KB max |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        a = " | ".join(fmt.format(column([r], key, d)[0]) if r["interval"] is not False else "-"
                       for key, fmt, d, _ in ARCHIVE_COLUMNS)
        lines.append(f"| {r['repeat']} | {r['config']} | {r['position']} | {r['rate']:.0f} | "
                     f"{r['binlog_bytes'] / 1e6:.1f} | {a} | {r['relay_cpu_ms_per_trx']:.3f} | "
                     f"{r['ingest_lag_p99'] / 1e3:.1f} | {r['ingest_lag_max'] / 1e3:.1f} |")
    lines += [
        "", f"## Summary: median (min-max) over the {args['repeats']} repeats", "",
        "| configuration | lag s p99 | lag s max | age max s | lag KB max | put/binlog | bucket/binlog | "
        "wire/binlog | PUT/min | PUT/GB | CPU ms/trx | ingest KB max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rs in by.items():
        if rs:
            a = " | ".join(mr(column(rs, key, d), fmt) if CONFIGS[name] is not False else "-"
                           for key, fmt, d, summary in ARCHIVE_COLUMNS if summary)
            lines.append(f"| {name} | {a} | {mr(column(rs, 'relay_cpu_ms_per_trx'), '{:.3f}')} | "
                         f"{mr(column(rs, 'ingest_lag_max', 1e3), '{:.1f}')} |")
    lines += ["", "## Goals, in every repeat", ""]
    for name, rs in measured:
        lag_ok = sum(r["lag_max"] <= GOAL_LAG_S and r["age_max"] <= GOAL_LAG_S for r in rs)
        bytes_ok = sum(r["wire_ratio"] <= GOAL_BYTES_RATIO and r["put_ratio"] <= GOAL_BYTES_RATIO for r in rs)
        lines.append(f"- {name}: archive at most {GOAL_LAG_S:g} s behind the horizon (lag s max and age max): "
                     f"{'met' if lag_ok == len(rs) else 'MISSED'} in {lag_ok} of {len(rs)} repeats; bytes uploaded "
                     f"at most {GOAL_BYTES_RATIO}x the binlog (put/binlog and wire/binlog): "
                     f"{'met' if bytes_ok == len(rs) else 'MISSED'} in {bytes_ok} of {len(rs)} repeats.")
    peer = by.get("no archive") or []
    for name, rs in measured if peer else ():
        cpu = med(column(rs, "relay_cpu_ms_per_trx")) / med(column(peer, "relay_cpu_ms_per_trx"))
        ingest, peer_ingest = (mr(column(x, "ingest_lag_max", 1e3), "{:.1f}") for x in (rs, peer))
        lines.append(f"- {name} against no archive (the peer, same run): relay CPU per transaction "
                     f"{cpu:.2f}x the peer's (medians); ingest lag max {ingest} KB against {peer_ingest} KB.")
    lines += ["", "## Modelled, not run: putting the whole open file again every second", "",
              "From each archive run's sampled horizon: every second one PUT of the whole open file as it is then, "
              "and one more of each file when it is closed. The bytes that costs against the binlog (and against "
              "what the relay put); it grows with the file size (here files of at most "
              f"{args['max_binlog_size']}; with 1 GB files the open file is on average far larger):", "",
              "| configuration | naive put/binlog | naive PUTs | relay put/binlog | naive / relay bytes |",
              "|---|---:|---:|---:|---:|"]
    for name, rs in measured:
        lines.append(f"| {name} | {mr(column(rs, 'naive_ratio'), '{:.1f}')} | "
                     f"{mr(column(rs, 'naive_puts'), '{:.0f}')} | {mr(column(rs, 'put_ratio'), '{:.4f}')} | "
                     f"{mr([r['naive_bytes'] / r['put_bytes'] for r in rs], '{:.1f}')}x |")
    rates = [r["binlog_bytes"] / r["seconds"] for r in runs if r["interval"] is not False]
    if rates:
        rate = med(rates)
        lines += ["", f"Arithmetic, not run: a file of F bytes filled at r bytes/s is put again F/r times, on average "
                  f"F/2 each: about F/(2r) times its size. At this load's {rate / 1e6:.2f} MB/s of binlog "
                  f"(median) that is {8e6 / (2 * rate):.1f}x for 8 MB files and {1e9 / (2 * rate):,.0f}x for "
                  f"1 GB files (MariaDB's default max_binlog_size), against the relay's parts, each byte put once."]
    lines += ["", "## Requests and cost at the measured counts", "",
              f"AWS S3 Standard list prices (us-east-1) as known to this benchmark, not fetched: PUT "
              f"${PRICE_PUT_PER_1000} per 1,000 requests, GET ${PRICE_GET_PER_1000} per 1,000, storage "
              f"${PRICE_GB_MONTH} per GB-month; check the current ones for your region and class. Per GB of binlog "
              f"at {args['rate']:g} trx/s of this load (the PUT count per GB falls as the rate rises: the uploader "
              "puts per interval, not per byte); per month of this load without a break (30 days).", "",
              "| configuration | binlog GB/month | PUT/GB | PUT $/GB | storage $/GB-month | PUTs/month | "
              "PUT $/month | storage added $/month (each month's binlog, kept) | restore GET $/GB |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, rs in measured:
        gb_month = med([r["binlog_bytes"] / r["seconds"] for r in rs]) / 1e9 * 86400 * 30
        per_gb = med(column(rs, "puts_per_gb"))
        puts_month = med(column(rs, "puts_per_min_load")) * 60 * 24 * 30
        bucket_ratio = med(column(rs, "bucket_ratio"))
        parts_per_gb = med([r["bucket_parts"] / (r["binlog_bytes"] / 1e9) for r in rs])
        lines.append(f"| {name} | {gb_month:,.0f} | {per_gb:,.0f} | {per_gb * PRICE_PUT_PER_1000 / 1000:.3f} | "
                     f"{bucket_ratio * PRICE_GB_MONTH:.4f} | {puts_month:,.0f} | "
                     f"{puts_month * PRICE_PUT_PER_1000 / 1000:,.2f} | {gb_month * bucket_ratio * PRICE_GB_MONTH:,.2f}"
                     f" | {parts_per_gb * PRICE_GET_PER_1000 / 1000:.4f} |")
    lines += ["", "restore GET $/GB: one GET per part object (what `relayproxy restore` reads), from the parts per GB "
              "this run left in the bucket; list requests and the manifests are a few per file on top.", ""]
    stalls = report.get("stalls") or []
    if stalls:
        lines += ["## The bucket stopped under load (one run each, default interval)", "",
                  "moto SIGSTOPped in the middle of the load (connections hang: the relay's S3 read timeout, 30 s, "
                  "and botocore's retries apply). Caught up = the first sample after the resume whose `lag_seconds` "
                  "is below 1.5 s (the default interval's ordinary sawtooth again). Ingest KB = master position - "
                  "relay horizon.", "",
                  "| bucket stop | stopped (s into the load) | lag s max | lag KB max | ingest KB max in the stop | "
                  "ingest KB max, whole load | caught up after the resume (s) | relay errors | put/binlog | "
                  "wire/binlog | moto PUTs | relay objects put |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for st in stalls:
            caught = st["stall_caught_up_after"]
            lines.append(
                f"| {st['stall_seconds']:g} s | {st['stall'][0]:.1f}-{st['stall'][1]:.1f} | {st['lag_max']:.3f} | "
                f"{st['lagb_max'] / 1e3:.0f} | {st['ingest_lag_max_stall'] / 1e3:.1f} | "
                f"{st['ingest_lag_max'] / 1e3:.1f} | {'-' if caught is None else f'{caught:.2f}'} | {st['errors']} | "
                f"{st['put_ratio']:.4f} | {st['wire_ratio']:.4f} | {st['moto_puts']} | {st['put_objects']} |")
        lines.append("")
    lines += ["## Requests moto logged per run (by method, keys under the run's prefix)", "",
              "| run | configuration | requests | relay objects put | parts | files sealed | bucket objects | "
              "TCP connections |", "|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in runs + stalls:
        if r["interval"] is False:
            continue
        reqs = ", ".join(f"{k} {v}" for k, v in sorted(r["moto_requests"].items()))
        lines.append(f"| {r['repeat']} | {r['config']} | {reqs} | {r['put_objects']} | {r['parts']} | "
                     f"{r['sealed']} | {r['bucket_objects']} | {r['connections']} |")
    missed = sum(r["failed_samples"] for r in runs + stalls)
    lines += ["", f"Samples of /status or the master missed (a timeout or an error): {missed}.", "",
              *benchinfo.machine_section(report["machine"])]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    plt = benchinfo.pyplot()
    if plt is None:
        return
    runs = [r for r in report["runs"] if r["interval"] is not False]
    stalls = report.get("stalls") or []
    panels = 3 if stalls else 2
    fig, axes = plt.subplots(panels, 1, figsize=(8, 2.6 * panels), sharex=False)
    colours = {"default interval": "tab:blue", "interval 0.25 s": "tab:orange"}
    seen = set()
    for r in runs:
        points = [(x, s, b / 1e3) for x, s, b in r["series"] if s is not None]
        label = r["config"] if r["config"] not in seen else None
        seen.add(r["config"])
        for ax, column in ((axes[0], 1), (axes[1], 2)):
            ax.plot([p[0] for p in points], [p[column] for p in points], lw=0.6, color=colours.get(r["config"]),
                    label=label, alpha=0.8)
    axes[0].axhline(GOAL_LAG_S, ls=":", color="red", label="goal 2 s")
    axes[0].set_ylabel("archive lag (s)")
    axes[1].set_ylabel("archive lag (KB)")
    axes[0].set_title(f"Archive lag at {report['args']['rate']:g} trx/s, moto on loopback, {len(runs)} runs "
                      f"({report['machine']['relayproxy commit'].split(' + ')[0]})", fontsize=9)
    axes[0].legend(fontsize=7, loc="upper right")
    for k, st in enumerate(stalls):
        points = [(x, s) for x, s, _ in st["series"] if s is not None]
        colour = ("tab:green", "tab:purple", "tab:brown")[k % 3]
        axes[2].plot([x for x, _ in points], [s for _, s in points], lw=0.8, color=colour,
                     label=f"bucket stopped {st['stall_seconds']:g} s")
        axes[2].axvspan(*st["stall"], color=colour, alpha=0.15)
    if stalls:
        axes[2].axhline(GOAL_LAG_S, ls=":", color="red")
        axes[2].set_ylabel("archive lag (s)")
        axes[2].legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel("seconds into the load")
    save_figure(fig, path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    names = list(CONFIGS)
    report: dict = {"args": dict(SETTINGS), "uptime_start": uptime(), "runs": []}
    work = Path(tempfile.mkdtemp(prefix="archlag-", dir=SETTINGS["servers_dir"]))
    relay_parent = Path(tempfile.mkdtemp(prefix="archlag-relay-"))
    fs = subprocess.run(["df", "--output=fstype", str(relay_parent)], capture_output=True, text=True).stdout.split()
    report["relay_fs"] = f"{relay_parent.parent} ({fs[-1] if fs else '?'})"
    master = MariaDBSandbox(work / "master", server_id=1, binlog_format="ROW",
                            extra_config={"sync_binlog": 0, "innodb_flush_log_at_trx_commit": 2,
                                          "innodb_buffer_pool_size": "128M",
                                          "max_binlog_size": SETTINGS["max_binlog_size"]})
    moto = MotoServer(work)
    index = itertools.count(1)  # of the runs: their relay directories and bucket prefixes
    try:
        moto.start()
        moto.create_bucket()
        master.start()
        prepare_master(master)
        master.execute("CREATE DATABASE bench")
        master.execute(LOADS["oltp"])
        ctx = {"master": master, "moto": moto, "relay_parent": relay_parent}
        for k, order in enumerate(benchinfo.alternating_orders(SETTINGS["repeats"], names), 1):
            for position, name in enumerate(order, 1):
                log(f"repeat {k}: {name}")
                r = one_run(ctx, name, next(index))
                r["repeat"], r["position"] = k, f"{position} of {len(names)}"
                report["runs"].append(r)
                cpu = f"CPU {r['relay_cpu_ms_per_trx']:.3f} ms/trx"
                if r["interval"] is not False:
                    log(f"  {r['rate']:.0f} trx/s, {r['binlog_bytes'] / 1e6:.1f} MB: lag max {r['lag_max']:.3f} s "
                        f"(age {r['age_max']:.2f} s), put/binlog {r['put_ratio']:.4f}, wire {r['wire_ratio']:.4f}, "
                        f"{r['puts_per_min_load']:.0f} PUT/min, {cpu}")
                else:
                    log(f"  {r['rate']:.0f} trx/s, {cpu}, ingest max {r['ingest_lag_max'] / 1e3:.1f} KB")
        report["stalls"] = []
        for stall in STALL_SECONDS:
            log(f"stall run: the bucket stopped for {stall:g} s")
            r = one_run(ctx, "default interval", next(index), stall)
            r["repeat"], r["position"] = "stall", "-"
            r["config"], r["stall_seconds"] = f"default interval, bucket stopped {stall:g} s", stall
            report["stalls"].append(r)
            log(f"  lag max {r['lag_max']:.3f} s, caught up {r['stall_caught_up_after']} s after the resume, "
                f"wire/binlog {r['wire_ratio']:.4f}, moto {r['moto_requests']}")
        report["uptime_end"] = uptime()
        report["machine"] = benchinfo.machine_info(server=True)
    finally:
        master.stop()
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(relay_parent, ignore_errors=True)
    write_results(RESULTS, render(report, argv) + "\n", log)
    plot(report, RESULTS.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
