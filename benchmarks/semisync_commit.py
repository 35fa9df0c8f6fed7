"""What the semi-sync acker costs every commit on the master: relayproxy against MariaDB replicas, in one run.

A MariaDB master with ``rpl_semi_sync_master_wait_point=AFTER_SYNC``; its one semi-sync replica is, in turn, each of
``ACKERS`` (the others replicate asynchronously meanwhile). ``--writers`` processes commit autocommit INSERTs as fast
as they can for ``--seconds``, each commit timed in the writer. A run whose master fell back to async is invalid.
The results file describes the set-up.

    .venv/bin/python benchmarks/semisync_commit.py [--writers 1,4,16] [--seconds 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

from benchmarks.benchinfo import alternating_orders, fmt_median_range, machine_info, median_range  # noqa: E402
from benchmarks.common import RESULTS_DIR, logger, percentile, pyplot, results_document, save_figure  # noqa: E402
from benchmarks.common import add_report_options, hop_buckets, hop_share, stage_cells, write_results  # noqa: E402
from relayproxy.lab.harness import RelayProcess, change_master, prepare_master, replica_status  # noqa: E402
from relayproxy.lab.lossless import wait_quietly  # noqa: E402
from relayproxy.lab.sandbox import MariaDBSandbox  # noqa: E402
from relayproxy.relay.hoptimes import STAGES  # noqa: E402

RESULTS = RESULTS_DIR / "semisync_commit.md"
ACKERS = {
    "relay": "relayproxy run, defaults (sync_on_loop = auto)",
    "relay_fsync_thread": "relayproxy run, sync_on_loop = false",
    "replica_sync": "MariaDB replica, sync_relay_log=1",
    "replica": "MariaDB replica, defaults",
}
QUANTILES = (("p50", 50), ("p99", 99), ("p99.9", 99.9))
log = logger("semisync")


def writer(port: int, table: str, seconds: float, conn) -> None:
    """Commit autocommit INSERTs into ``table`` until ``seconds`` after "go"; send back each commit's seconds."""
    import pymysql

    db = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True)
    cur = db.cursor()
    conn.send("ready")
    conn.recv()
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        cur.execute(f"INSERT INTO bench.{table} (v) VALUES ('semi-sync commit benchmark row')")
        latencies.append(time.perf_counter() - t)
    db.close()
    conn.send(latencies)
    conn.close()


def status_vars(master) -> dict[str, str]:
    return dict(master.execute("SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_%'"))


class Ackers:
    """The ackers on one master; ``attach(name)`` makes that one the master's only semi-sync replica."""

    def __init__(self, master: MariaDBSandbox, acker_dir: Path):
        self.master, self.acker_dir = master, acker_dir
        self.relay: RelayProcess | None = None
        self.replicas: dict[str, MariaDBSandbox] = {}

    def start_replicas(self) -> None:
        """Both replicas, replicating without semi-sync from the start: caught up beside every acker measured."""
        for k, name in enumerate(a for a in ACKERS if not a.startswith("relay")):
            config = {"rpl_semi_sync_slave_enabled": 0, **({"sync_relay_log": 1} if name == "replica_sync" else {})}
            replica = MariaDBSandbox(self.acker_dir / name, server_id=10 + k, log_bin=False,
                                     extra_config=config).start()
            change_master(replica, self.master.port, file=None)
            replica.execute("START SLAVE")
            self.replicas[name] = replica

    def _semi_sync(self, name: str, on: bool) -> None:
        replica = self.replicas[name]
        replica.execute(f"SET GLOBAL rpl_semi_sync_slave_enabled = {'ON' if on else 'OFF'}")
        replica.execute("STOP SLAVE IO_THREAD")  # the IO thread registers (or not) as semi-sync when it starts
        replica.execute("START SLAVE IO_THREAD")

    def _clients(self, count: str, seconds: float) -> bool:
        return bool(wait_quietly(lambda: status_vars(self.master).get("Rpl_semi_sync_master_clients") == count,
                                 seconds))

    def attach(self, name: str) -> None:
        if name.startswith("relay"):  # one relay directory: each start resumes from its horizon
            extra = ["--sync-on-loop", "false"] if name == "relay_fsync_thread" else []
            self.relay = RelayProcess(self.acker_dir / "relay", self.master.port, log_level="warning",
                                      extra=extra).start()
            self.relay.wait_caught_up(self.master)
        else:
            self._semi_sync(name, True)
        if not self._clients("1", 300):
            raise RuntimeError(f"{name} did not become the master's semi-sync replica within 300 s")
        if not name.startswith("relay"):  # caught up before the writers start: the run measures acks, not a backlog
            gtid = self.master.execute("SELECT @@gtid_binlog_pos")[0][0]
            if not wait_quietly(lambda: replica_status(self.replicas[name]).get("Gtid_IO_Pos") == gtid, 300):
                raise RuntimeError(f"{name} did not catch up with the master within 300 s")

    def detach(self, name: str) -> None:
        if name.startswith("relay"):
            self.relay.stop()
            self.relay = None
        else:
            self._semi_sync(name, False)
        self._clients("0", 30)

    def close(self) -> None:
        if self.relay is not None:
            self.relay.stop()
        for replica in self.replicas.values():
            replica.stop()


def measure(master: MariaDBSandbox, ackers: Ackers, name: str, writers: int, seconds: float) -> dict:
    ctx = mp.get_context("spawn")
    ackers.attach(name)
    try:
        pipes, procs = [], []
        for k in range(writers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=writer, args=(master.port, f"t{k}", seconds, child), daemon=True)
            proc.start()
            child.close()
            pipes.append(parent)
            procs.append(proc)
        for parent in pipes:
            if parent.recv() != "ready":
                raise RuntimeError("a writer did not start")
        before = status_vars(master)
        hop_before = hop_buckets(ackers.relay.http_port) if ackers.relay is not None else None
        for parent in pipes:
            parent.send("go")
        latencies = [s for parent in pipes for s in parent.recv()]
        for proc in procs:
            proc.join(10)
        after = status_vars(master)
        hop = hop_share(hop_before, hop_buckets(ackers.relay.http_port)) if hop_before else None
    finally:
        ackers.detach(name)
    fallback = int(after["Rpl_semi_sync_master_no_tx"]) - int(before["Rpl_semi_sync_master_no_tx"])
    ms = [1000 * s for s in latencies]
    row = {"acker": name, "writers": writers, "commits": len(ms), "tps": len(ms) / seconds,
           "acked": int(after["Rpl_semi_sync_master_yes_tx"]) - int(before["Rpl_semi_sync_master_yes_tx"]),
           "fallback": fallback, "valid": fallback == 0 and after["Rpl_semi_sync_master_status"] == "ON"}
    row.update({label: percentile(ms, q, method="nearest-rank") for label, q in QUANTILES})
    if hop is not None:
        row["hop"] = hop
    log(f"{name} x{writers}: {row['tps']:.0f} commits/s, p50 {row['p50']:.2f} p99 {row['p99']:.2f} "
        f"p99.9 {row['p99.9']:.2f} ms{'' if row['valid'] else ' INVALID (fell back to async)'}")
    return row


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="semisync-", dir=args.servers_dir))
    acker_dir = Path(tempfile.mkdtemp(prefix="semisync-ackers-", dir=args.acker_dir))
    master = MariaDBSandbox(work / "master", server_id=1, binlog_format="ROW", extra_config={
        "rpl_semi_sync_master_enabled": 1, "rpl_semi_sync_master_wait_point": "AFTER_SYNC",
        "rpl_semi_sync_master_timeout": 10000, "rpl_semi_sync_master_wait_no_slave": "OFF",
        "sync_binlog": 1, "innodb_flush_log_at_trx_commit": 1})
    ackers = Ackers(master, acker_dir)
    report = {"writers": args.writers, "seconds": args.seconds, "repeats": args.repeats, "rows": [],
              "servers_dir": args.servers_dir, "acker_dir": args.acker_dir}
    try:
        master.start()
        prepare_master(master)
        master.execute("CREATE DATABASE bench")
        for k in range(max(args.writers)):
            master.execute(f"CREATE TABLE bench.t{k} (id BIGINT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(64))")
        ackers.start_replicas()
        for repeat, order in enumerate(alternating_orders(args.repeats, list(ACKERS)), 1):
            for name in order:
                for writers in args.writers:
                    row = measure(master, ackers, name, writers, args.seconds)
                    row["repeat"] = repeat
                    report["rows"].append(row)
        report["machine"] = machine_info(server=True)
    finally:
        ackers.close()
        master.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(acker_dir, ignore_errors=True)
    return report


def figures(report: dict, acker: str, writers: int, key: str) -> list[float]:
    return [r[key] for r in report["rows"] if r["acker"] == acker and r["writers"] == writers and r["valid"]]


def render(report: dict, argv: list[str]) -> str:
    body = [
        f"Per repeat and acker, for each writer count: {report['seconds']:g} s of autocommit INSERTs, as fast as each "
        "writer can (one connection per process, one table per writer), on a MariaDB master with "
        "`rpl_semi_sync_master_wait_point=AFTER_SYNC`, `sync_binlog=1`, `innodb_flush_log_at_trx_commit=1` "
        f"(datadir on {report['servers_dir']}); the acker's files on {report['acker_dir']}. Commit latency is timed "
        "in the writer around each INSERT. One acker at a time is the master's semi-sync replica; both MariaDB "
        "replicas replicate throughout (asynchronously while not measured), the relay runs only while measured; "
        "the acker is caught up before the writers start. A run in which the master fell back to asynchronous "
        "replication is invalid and left out of the figures.", "",
        "**Master, acker and writers share the machine's cores**: the ratios within one run are the result.", "",
        "## Commit latency at the master (ms) and throughput: median (min - max) over the repeats", "",
        "| acker | writers | commits/s | p50 | p99 | p99.9 | valid runs |", "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for acker, label in ACKERS.items():
        for w in report["writers"]:
            cells = [fmt_range(figures(report, acker, w, key)) for key in ("tps", "p50", "p99", "p99.9")]
            runs = [r for r in report["rows"] if r["acker"] == acker and r["writers"] == w]
            body.append(f"| {label} | {w} | {' | '.join(cells)} | {sum(r['valid'] for r in runs)} of {len(runs)} |")
    body += ["", "## The goal: the relay's p99 at most (b)'s, and within 1.2x of (c)'s", "",
             "| relay | writers | relay p99 / (b) p99 | relay p99 / (c) p99 | verdict |", "|---|---:|---:|---:|---|"]
    for relay in (a for a in ACKERS if a.startswith("relay")):
        for w in report["writers"]:
            to_b, to_c = ratios(report, w, "replica_sync", relay), ratios(report, w, "replica", relay)
            if not to_b or not to_c:
                body.append(f"| {ACKERS[relay]} | {w} | - | - | not measured (no valid pair) |")
                continue
            met = median_range(to_b)[0] <= 1.0 and median_range(to_c)[0] <= 1.2
            body.append(f"| {ACKERS[relay]} | {w} | {fmt_median_range(to_b, '{:.2f}', 'x')} | "
                        f"{fmt_median_range(to_c, '{:.2f}', 'x')} | {'met' if met else 'MISSED'} |")
    body += ["", "Ratios are taken within each repeat (the relay and the replica measured minutes apart on the same "
             "master), then summarised.", "", "## Where the relay's time went (its relayproxy_hop_seconds, per run)",
             "", "Median over the repeats of each stage's mean and the upper bounds of the buckets holding its p50 "
             "and p99 (ms): `durable` is the sum of the five stages before it; `ack` follows it.", "",
             "| relay | writers | stage | transactions | mean | p50 <= | p99 <= |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for relay, w in ((a, w) for a in ACKERS if a.startswith("relay") for w in report["writers"]):
        runs = [r["hop"] for r in report["rows"] if r["acker"] == relay and r["writers"] == w and "hop" in r]
        for stage in STAGES:
            if stage == "send" or not runs:
                continue
            cells = stage_cells([run[stage] for run in runs], ("count", "mean", "p50", "p99"))
            body.append(f"| {ACKERS[relay]} | {w} | {stage} | {' | '.join(cells)} |")
    return results_document("Semi-sync commit latency: relayproxy as the acker against MariaDB replicas", __file__,
                            argv, report["machine"], body, runs=report["repeats"],
                            what="the ackers' order alternated, writer counts in order")


def ratios(report: dict, writers: int, other: str, relay: str = "relay") -> list[float]:
    """The relay's p99 over ``other``'s, repeat by repeat (valid runs only)."""
    p99 = {(r["acker"], r["repeat"]): r["p99"] for r in report["rows"] if r["writers"] == writers and r["valid"]}
    return [p99[relay, k] / p99[other, k] for k in range(1, report["repeats"] + 1)
            if p99.get((relay, k)) is not None and p99.get((other, k))]


def fmt_range(values: list[float]) -> str:
    if not values:
        return "-"
    med, lo, hi = median_range(values)
    digits = 0 if med >= 100 else 2
    return f"{med:.{digits}f} ({lo:.{digits}f} - {hi:.{digits}f})"


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for acker, label in ACKERS.items():
        for ax, key in zip(axes, ("p99", "tps")):
            meds = [median_range(v)[0] if (v := figures(report, acker, w, key)) else float("nan")
                    for w in report["writers"]]
            ax.plot(report["writers"], meds, "o-", label=label)
    axes[0].set_ylabel("commit latency p99 (ms)")
    axes[1].set_ylabel("commits per second")
    for ax in axes:
        ax.set_xlabel("writers")
        ax.set_xscale("log", base=2)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Semi-sync AFTER_SYNC commit cost by acker ({report['machine']['relayproxy commit']})", fontsize=9)
    save_figure(fig, path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--writers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16],
                   help="writer counts, comma-separated (default 1,4,16)")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of writes per acker and writer count")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--servers-dir", default="/dev/shm", help="where the master's datadir goes")
    p.add_argument("--acker-dir", default="/tmp",
                   help="where the relay's and replicas' files go (a real disk: they sync)")
    p.add_argument("--output", type=Path, default=RESULTS)
    add_report_options(p)
    args = p.parse_args(argv)
    if args.render is not None:
        report = json.loads(args.render.read_text())
        argv = report["argv"]
    else:
        report = run(args)
        report["argv"] = argv
    text = render(report, argv)
    if args.notes is not None:
        text += "\n" + args.notes.read_text()
    write_results(args.output, text, log)
    plot(report, args.output.with_suffix(".png"))
    if args.save_json is not None:
        args.save_json.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
