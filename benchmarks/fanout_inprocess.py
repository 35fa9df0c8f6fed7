"""Fan-out with in-process replicas (``benchmarks/fanout.py`` without ``--real``): N asyncio dump clients in this
process streaming a live OLTP load through relayproxy, against the same N on the master itself (the module
docstring of benchmarks/fanout.py says what is measured and how).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import benchinfo
from benchmarks.common import RESULTS_DIR, percentile, save_figure
from benchmarks.fanout_common import (BINLOG_SEND_ANNOTATE_ROWS_EVENT, LOADS, MASTER_CONFIG, REPL_PASSWORD,
                                      REPL_USER, Relay, Writers, log, master_end, md_row, replica_login)
from relayproxy.binlog import constants as C
from relayproxy.binlog.events import HEADER
from relayproxy.lab.procstat import cpu_seconds, vm_kb
from relayproxy.lab.sandbox import MariaDBSandbox
from relayproxy.wire.packets import parse_err

PHASES = ("relay", "direct")
_header_unpack_from = HEADER.unpack_from
_gtid_unpack_from = struct.Struct("<QIB").unpack_from
_u64_unpack_from = struct.Struct("<Q").unpack_from


class DumpClient:
    """One replica: log in, dump from (file, pos); check every event's position; note each XID's arrival."""

    def __init__(self, index: int, port: int, start: tuple[str, int]) -> None:
        self.index, self.port = index, port
        self.file, self.pos = start
        self.events = self.bytes = 0
        self.arrivals: list[tuple[int, float]] = []  # (GTID seq_no, monotonic arrival) per XID
        self.errors: list[str] = []
        self.conn = None
        self.ready = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def run(self) -> None:
        try:
            self.conn = await replica_login(self.port, 1000 + self.index)
            await self.conn.binlog_dump(self.file, self.pos, 1000 + self.index, flags=BINLOG_SEND_ANNOTATE_ROWS_EVENT)
        except Exception as exc:  # noqa: BLE001 - reported, the others go on
            self.errors.append(f"setup: {exc!r}")
            return
        finally:
            self.ready.set()
        conn, monotonic, arrivals = self.conn, time.monotonic, self.arrivals
        file, pos = self.file, self.pos
        seq = None
        events = nbytes = 0
        try:
            while True:
                batch = await conn.read_packets()
                now = monotonic()
                for p in batch:
                    if p[0] != 0:
                        if p[0] == 0xFF:
                            raise parse_err(p)
                        raise RuntimeError(f"unexpected packet 0x{p[0]:02x} ({len(p)} bytes) at {file}:{pos}")
                    _ts, type_code, _sid, size, log_pos, flags = _header_unpack_from(p, 1)
                    events += 1
                    nbytes += size
                    if size != len(p) - 1:
                        raise RuntimeError(f"event size {size} but payload {len(p) - 1} at {file}:{pos}")
                    if type_code == 4:  # ROTATE: the next event is at this position of that file
                        file = bytes(p[28:size + 1 - 4]).decode()  # 8-byte position, name, CRC32
                        pos = _u64_unpack_from(p, 20)[0]
                        continue
                    if flags & C.LOG_EVENT_ARTIFICIAL_F or log_pos == 0 or type_code in (27, 41):
                        continue  # fake events (and heartbeats) have no place in the file
                    if type_code == 15 and log_pos - size != pos:
                        continue  # the file's FDE, sent again at the start of a dump from inside the file
                    if log_pos - size != pos:
                        raise RuntimeError(f"event at {file}:{log_pos - size} (type {type_code}, {size} bytes) "
                                           f"but the previous one ended at {pos}")
                    pos = log_pos
                    if type_code == 162:  # MARIA_GTID
                        seq = _gtid_unpack_from(p, 20)[0]
                    elif type_code == 16:  # XID: the transaction's end
                        arrivals.append((seq, now))
                self.file, self.pos, self.events, self.bytes = file, pos, events, nbytes
        except Exception as exc:  # noqa: BLE001 - reported
            self.errors.append(f"{file}:{pos}: {exc!r}")
        finally:
            self.file, self.pos, self.events, self.bytes = file, pos, events, nbytes

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        if self.conn is not None:
            self.conn.abort()


async def run_phase(name: str, master: MariaDBSandbox, port: int, n: int, rate: float, seconds: float,
                    relay: Relay | None, drain_timeout: float) -> dict:
    start = master_end(master)
    if relay is not None:
        relay.wait_at(start, poll=0.02)
    writer = Writers(master.port, "oltp", [(rate, seconds)], record="gtid")
    clients = [DumpClient(i, port, start) for i in range(n)]
    pids = {"relay": relay.pid if relay else None, "master": master.pid, "client": os.getpid()}
    cpu0 = {k: cpu_seconds(pid) if pid else None for k, pid in pids.items()}
    t_connect = time.monotonic()
    for c in clients:
        c.start()
    await asyncio.gather(*(c.ready.wait() for c in clients))
    connect_seconds = time.monotonic() - t_connect
    failed_setup = [c.index for c in clients if c.errors]
    if failed_setup:
        log(f"{name}: {len(failed_setup)} clients failed to start: {clients[failed_setup[0]].errors}")
    rss_connected = vm_kb(relay.pid, "VmRSS") if relay else None
    await asyncio.sleep(0.5)
    log(f"{name}: {n} clients dumping from {start[0]}:{start[1]} (connected in {connect_seconds:.2f} s); "
        f"writing {rate:g} trx/s for {seconds:g} s")
    writer.go()
    w = await asyncio.get_running_loop().run_in_executor(None, writer.result)
    end = master_end(master)
    deadline = time.monotonic() + drain_timeout  # until every client has everything up to the master's end
    while time.monotonic() < deadline and not all((c.file, c.pos) == end or c.errors for c in clients):
        await asyncio.sleep(0.01)
    t_done = time.monotonic()
    cpu1 = {k: cpu_seconds(pid) if pid else None for k, pid in pids.items()}
    relay_mem = ({"relay_vmhwm_kb": vm_kb(relay.pid, "VmHWM"), "relay_rss_end_kb": vm_kb(relay.pid, "VmRSS")}
                 if relay else {})
    for c in clients:
        await c.stop()
    not_converged = [{"client": c.index, "at": [c.file, c.pos], "errors": c.errors}
                     for c in clients if (c.file, c.pos) != end or c.errors]

    commit_at = dict(w["commits"])
    lags: list[float] = []
    per_client_p99: list[float] = []
    missing = 0
    for c in clients:
        mine = sorted(t - commit_at[s] for s, t in c.arrivals if s in commit_at)
        missing += len(commit_at) - len(mine)
        if mine:
            per_client_p99.append(percentile(mine, 99))
        lags.extend(mine)
    lags.sort()
    wall = t_done - w["t0"]
    events = sum(c.events for c in clients)
    nbytes = sum(c.bytes for c in clients)
    last_commit = max(t for _, t in w["commits"]) if w["commits"] else w["t_end"]
    used = {k: cpu1[k] - cpu0[k] if cpu0[k] is not None and cpu1[k] else None for k in pids}
    phase = {
        "target": name, "clients": n, "start": list(start), "end": list(end),
        "transactions": len(w["commits"]),
        "writer_rate": round(len(w["commits"]) / (w["t_end"] - w["t0"]), 1),
        "connect_seconds": round(connect_seconds, 3),
        "wall_seconds": round(wall, 3),
        "drain_seconds": round(t_done - last_commit, 3),
        "lag_samples": len(lags),
        "lag_missing": missing,
        "lag_ms": {k: round(percentile(lags, q) * 1000, 2) for k, q in (("p50", 50), ("p90", 90), ("p99", 99))}
        | {"max": round(lags[-1] * 1000, 2) if lags else None,
           "mean": round(statistics.fmean(lags) * 1000, 2) if lags else None},
        "worst_client_p99_ms": round(max(per_client_p99) * 1000, 2) if per_client_p99 else None,
        "events": events,
        "bytes": nbytes,
        "events_per_s": round(events / wall),
        "mb_per_s": round(nbytes / 1e6 / wall, 3),
        "client_cpu_seconds": round(used["client"], 2),
        "client_cpu_pct": round(100 * used["client"] / wall, 1),
        "master_cpu_seconds": round(used["master"], 2) if used["master"] is not None else None,
        "master_cpu_pct": round(100 * used["master"] / wall, 1) if used["master"] is not None else None,
        "not_converged": not_converged,
        "converged": len(clients) - len(not_converged),
        "lag_cdf_ms": [round(percentile(lags, q) * 1000, 3) for q in range(0, 101)] if lags else [],
    }
    if relay is not None:
        phase |= {
            "relay_cpu_seconds": round(cpu1["relay"] - cpu0["relay"], 2),
            "relay_cpu_pct": round(100 * (cpu1["relay"] - cpu0["relay"]) / wall, 1),
            **relay_mem,
            "relay_rss_connected_kb": rss_connected,
        }
    log(f"{name}: {len(w['commits'])} trx at {phase['writer_rate']} trx/s; lag p50 {phase['lag_ms']['p50']} ms "
        f"p99 {phase['lag_ms']['p99']} ms max {phase['lag_ms']['max']} ms; {phase['events_per_s']:,} ev/s "
        f"{phase['mb_per_s']} MB/s; converged {phase['converged']}/{n}; client CPU {phase['client_cpu_pct']} %")
    return phase


def ratios(report: dict) -> dict:
    r, d = report["phases"].get("relay"), report["phases"].get("direct")
    if not r or not d:
        return {}
    out = {f"lag_{k}": (round(r["lag_ms"][k] / d["lag_ms"][k], 3) if d["lag_ms"][k] else None)
           for k in ("p50", "p90", "p99", "max")}
    for key in ("events_per_s", "mb_per_s", "drain_seconds"):
        out[key] = round(r[key] / d[key], 3) if d[key] else None
    return out


INTRO = (
    "{n} in-process dump clients (asyncio `UpstreamConnection`s in one event loop) follow a MariaDB master that "
    "takes {rate:g} transactions/s for {seconds:g} s (alternating autocommit INSERT and INSERT+UPDATE transactions, "
    "~150-byte row events, ANNOTATE_ROWS asked for). Phase `relay`: the clients dump from `relayproxy run --listen` "
    "(default settings: sync-mode transaction, CRC32 verified), which replicates from the master. Phase `direct`: "
    "relay stopped, the same clients dump from the master itself (the ratio base). Each phase starts its clients at "
    "the master's end position and ends when every client has received up to the master's final position. Lag = "
    "arrival of a transaction's XID at a client - the moment the writer's COMMIT returned (writer in its own "
    "process; `time.monotonic()` in both), over every (client, transaction) pair. Throughput is what all clients "
    "together received over the phase (first write to last client converged): with a fixed write rate it is the "
    "load times N, not a saturation figure; the drain time (last commit -> every client has it) shows headroom."
)
ROWS_BEFORE_LAG = (("clients converged", "converged", "{:,}"), ("transactions written", "transactions", "{:,}"),
                   ("writer rate achieved (trx/s)", "writer_rate", "{}"))
ROWS_AFTER_LAG = (  # (label, phase key, format, the ratio shown)
    ("worst client's p99 lag (ms)", "worst_client_p99_ms", "{:.1f}"),
    ("events delivered / s (all clients)", "events_per_s", "{:,}", "events_per_s"),
    ("MB/s delivered (all clients)", "mb_per_s", "{:.2f}", "mb_per_s"),
    ("drain: last commit -> all clients have it (s)", "drain_seconds", "{:.3f}", "drain_seconds"),
    ("clients connect + dump start (s)", "connect_seconds", "{:.2f}"),
    ("relay CPU (s user+sys)", "relay_cpu_seconds", "{:.2f}"),
    ("relay CPU (% of one core)", "relay_cpu_pct", "{:.1f}"),
    ("relay peak RSS VmHWM (MB)", "relay_vmhwm_mb", "{:.1f}"),
    ("relay RSS with clients connected, before load (MB)", "relay_rss_connected_mb", "{:.1f}"),
    ("mariadbd CPU (% of one core)", "master_cpu_pct", "{:.1f}"),
    ("benchmark process (clients) CPU (% of one core)", "client_cpu_pct", "{:.1f}"),
)


def write_markdown(path: Path, report: dict, notes: str | None) -> None:
    ph, rt = report["phases"], report["ratios"]
    out = ["# Fan-out: N replicas of a live OLTP load through relayproxy vs. directly on the master", "",
           "Command:", "", f"    {report['command']}", "",
           INTRO.format(n=report["replicas"], rate=report["rate"], seconds=report["seconds"]), "",
           "**Absolute numbers on a shared 2-core machine are noise** (master, relay, writer and all clients share "
           "two cores, and other benchmarks may run); the relay/direct ratios of one run are the result.", "",
           "| | relay | direct (master) | relay / direct |", "|---|---:|---:|---:|"]

    def rows(spec) -> None:
        for label, key, fmt, *ratio in spec:
            vals = [ph[p].get(key) if p in ph else None for p in PHASES]
            shown = rt.get(ratio[0]) if ratio else None
            out.append(md_row(label, *(fmt.format(v) if v is not None else "-" for v in vals),
                              shown if shown is not None else ""))

    rows(ROWS_BEFORE_LAG)
    for k in ("p50", "p90", "p99", "max"):
        vals = [ph[p]["lag_ms"][k] if p in ph else None for p in PHASES]
        out.append(f"| lag {k} (ms) | {vals[0]:.1f} | {vals[1]:.1f} | {rt.get('lag_' + k, '-')} |"
                   if None not in vals else f"| lag {k} (ms) | {vals[0]} | {vals[1]} | |")
    rows(ROWS_AFTER_LAG)
    out.append("")
    bad = {p: ph[p]["not_converged"] for p in ph if ph[p]["not_converged"]}
    if bad:
        out += ["**Clients that did not reach the master's final position:**", "", "```",
                json.dumps(bad, indent=1)[:4000], "```", ""]
    else:
        out += ["Every client of both phases reached the master's final position with continuous positions.", ""]
    if notes:
        out += [notes.rstrip(), ""]
    out += ["![lag percentiles](fanout.png)", "", *benchinfo.machine_section(report["machine"])]
    path.write_text("\n".join(out))


def write_plot(path: Path, report: dict) -> bool:
    plt = benchinfo.pyplot()
    if plt is None:
        return False
    ph = report["phases"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    keys = ["p50", "p90", "p99", "max"]
    style = {"relay": ("#c44e52", "through relayproxy"), "direct": ("#4c72b0", "direct from mariadbd")}
    width = 0.38
    for j, p in enumerate(PHASES):
        if p not in ph:
            continue
        color, label = style[p]
        vals = [ph[p]["lag_ms"][k] for k in keys]
        bars = ax1.bar([i + (j - 0.5) * width for i in range(len(keys))], vals, width, color=color, label=label)
        for b, v in zip(bars, vals):
            ax1.text(b.get_x() + b.get_width() / 2, v, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
        cdf = ph[p]["lag_cdf_ms"]
        if cdf:
            ax2.plot(cdf, list(range(len(cdf))), color=color, label=label)
    ax1.set_xticks(range(len(keys)), keys)
    ax1.set_yscale("log")
    ax1.set_ylabel("lag, ms (log)")
    ax1.set_title(f"lag percentiles, {report['replicas']} replicas, {report['rate']:g} trx/s", fontsize=9)
    ax1.legend(fontsize=8)
    ax2.set_xscale("log")
    ax2.set_xlabel("lag, ms (log)")
    ax2.set_ylabel("percentile")
    ax2.set_title("lag distribution over all (client, transaction) pairs", fontsize=9)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    save_figure(fig, path, dpi=110)
    return True


async def measure(args, master: MariaDBSandbox, work: Path, phases: list[str]) -> dict:
    report: dict = {"phases": {}}
    for name in phases:
        if name == "direct":
            report["phases"]["direct"] = await run_phase("direct", master, master.port, args.replicas, args.rate,
                                                         args.seconds, None, args.drain_timeout)
            continue
        relay = Relay(work, master).start()
        try:
            report["phases"]["relay"] = await run_phase("relay", master, relay.listen_port, args.replicas,
                                                        args.rate, args.seconds, relay, args.drain_timeout)
        finally:
            relay.stop()
    for p in report["phases"].values():
        for k in ("relay_vmhwm_kb", "relay_rss_connected_kb"):
            if p.get(k):
                p[k.replace("_kb", "_mb")] = round(p[k] / 1024, 1)
    return report


def write_results(out_dir: Path, report: dict, args) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_markdown(out_dir / "fanout.md", report, args.notes.read_text() if args.notes else None)
    write_plot(out_dir / "fanout.png", report)


def main(args, argv: list[str]) -> int:
    """The in-process benchmark for benchmarks/fanout.py's parsed arguments; the exit status."""
    if args.render is not None:
        write_results(args.output_dir or RESULTS_DIR, json.loads(args.render.read_text()), args)
        return 0
    from relayproxy.log import configure_logging

    configure_logging(fmt="json", level="warning")
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    for p in phases:
        if p not in PHASES:
            raise SystemExit(f"unknown phase {p!r}")
    work = Path(tempfile.mkdtemp(prefix="rp-fanout-", dir=args.workdir))
    master = MariaDBSandbox(work / "master", server_id=1, binlog_format="ROW", extra_config=MASTER_CONFIG)
    try:
        log(f"starting the master in {work}")
        master.start()
        master.create_user(REPL_USER, REPL_PASSWORD)
        master.execute("CREATE DATABASE IF NOT EXISTS bench")
        master.execute(LOADS["oltp"])
        body = asyncio.run(measure(args, master, work, phases))
    finally:
        try:
            master.stop()
        except Exception as exc:  # noqa: BLE001
            log(f"could not stop the master: {exc}")
        shutil.rmtree(work, ignore_errors=True)
    report = {"quick": args.quick, "replicas": args.replicas, "seconds": args.seconds, "rate": args.rate, **body}
    report["ratios"] = ratios(report)
    report["all_converged"] = all(not p["not_converged"] for p in report["phases"].values())
    report["machine"] = benchinfo.machine_info(server=True)
    report["command"] = ".venv/bin/python benchmarks/fanout.py" + ("".join(" " + shlex.quote(a) for a in argv))
    if args.save_json is not None:
        args.save_json.write_text(json.dumps(report, indent=1))
    out_dir = args.output_dir if args.output_dir is not None else (None if args.quick else RESULTS_DIR)
    if out_dir is not None:
        write_results(out_dir, report, args)
        log(f"wrote {out_dir / 'fanout.md'}")
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for name, p in report["phases"].items():
            print(f"{name:7s} lag ms {p['lag_ms']}  {p['events_per_s']:,} ev/s {p['mb_per_s']} MB/s  "
                  f"converged {p['converged']}/{p['clients']}")
        print("relay/direct:", report["ratios"])
    if not report["all_converged"]:
        log("FAILED: some clients did not reach the master's final position: "
            + json.dumps({k: p["not_converged"] for k, p in report["phases"].items() if p["not_converged"]})[:2000])
        return 1
    return 0
