"""Point-in-time recovery, side by side: the same backlog replayed onto the same restored backup with the pipe DBAs
use (``mariadb-binlog --start-position ... --stop-datetime ... | mariadb``) and with ``relayproxy pitr
--before-time``: time, exactness, and what a kill -9 halfway does to each.

A MariaDB master (ROW) with the relay following it by GTID; a little data, a real ``mariadb-backup`` (``--backup`` +
``--prepare``), then ``pitr_lab.MixedLoad`` from 4 writers (inserts, transfers, updates, deletes, a 64-256 KB blob
every 50th transaction, a marker row in each) until the binlog has ``--gb`` GB after the backup's position. The stop
T is the busiest second 85-95 % into the backlog; what should be applied is every transaction whose commit event
``mariadb-binlog`` shows before T. Each repeat restores the backup into a fresh instance (not timed) and times the
replay alone, the methods taking turns going first: ``TZ=UTC mariadb-binlog --start-position=P --stop-datetime=T
<files> | mariadb`` (P from the backup's binlog info, as MariaDB's docs describe) and ``relayproxy pitr --before-time
T --from-backup DIR --parallel N`` against the relay.

Exactness: the marker rows added against the expected count (``+k``: k transactions past T, ``-k``: k short), and
whether CHECKSUM TABLE of every table equals the reference's (the backup replicated from the master with START SLAVE
UNTIL the last transaction before T). The kill test SIGKILLs each method's process group on a fresh restore when
about half the backlog is applied, runs the same command again and reports the outcome and exactness. Instances use
the sandbox defaults (32 MB buffer pool), innodb_flush_log_at_trx_commit=1, sync_binlog=0; on 2 cores the ratios
are the result, not the times.
"""

from __future__ import annotations

if not __package__:
    import _bootstrap  # noqa: F401

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.benchinfo import fmt_median_range, machine_info, median_range, run_alternating, verdict
from benchmarks.common import REPO_ROOT, RESULTS_DIR, logger, pyplot, results_document, save_figure, write_results
from relayproxy.commands.pitr_plan import read_backup_info
from relayproxy.lab import pitr_lab as L
from relayproxy.lab.backup import restore_backup, take_backup
from relayproxy.lab.harness import RelayProcess, prepare_master
from relayproxy.lab.sandbox import MariaDBSandbox, find_binary

GOAL_RATIO = 0.5
ADMIN, ADMIN_PW = "ops", "opspw"
TARGET_CONFIG = {"innodb_flush_log_at_trx_commit": 1, "sync_binlog": 0}
log = logger("pitr")


class Bench:
    def __init__(self, workdir: Path, args):
        self.workdir, self.args = workdir, args
        self.servers: list[MariaDBSandbox] = []
        self.relay: RelayProcess | None = None
        self.backup_info = None
        self.n = 0

    def close(self) -> None:
        if self.relay is not None:
            self.relay.stop()
        for s in reversed(self.servers):
            with contextlib.suppress(Exception):
                s.stop()

    def setup(self) -> dict:
        began = time.monotonic()
        w = self.workdir
        self.master = MariaDBSandbox(w / "master", server_id=1, binlog_format="ROW",
                                     extra_config={"sync_binlog": 0, "innodb_flush_log_at_trx_commit": 2,
                                                   "innodb_buffer_pool_size": "256M"}).start()
        self.servers.append(self.master)
        prepare_master(self.master)
        self.relay = RelayProcess(w / "relay", self.master.port, gtid_mode="mariadb", listen=True,
                                  users=f"repl:replpw,{ADMIN}:{ADMIN_PW}:admin")
        self.relay.start()
        L.create_schema(self.master)
        with L.MixedLoad(self.master, writers=2, phase="seed", limit=250):
            pass
        self.backup = take_backup(self.master, w / "backup")
        info = self.backup_info = read_backup_info(self.backup)
        log(f"backup at {info.file}:{info.position} GTID {info.gtid}; generating {self.args.gb} GB")
        target = int(self.args.gb * (1 << 30))
        t0 = time.monotonic()
        with L.MixedLoad(self.master, writers=4, phase="backlog", seed=3) as load:
            while self.backlog_bytes() < target:
                if load.errors:
                    raise load.errors[0]
                time.sleep(0.5)
            commits = load.stop()
        gen_seconds = time.monotonic() - t0
        self.relay.wait_caught_up(self.master, timeout=1800)
        self.files = [p for p in self.master.binlog_files() if p.name >= info.file]
        self.committed = L.commit_times(self.files)
        gtids = [c.gtid for c in self.committed]
        after = self.committed[gtids.index(str(info.gtid)) + 1:] if str(info.gtid) in gtids else self.committed
        counts = Counter(c.commit_second for c in after[int(len(after) * 0.85):int(len(after) * 0.95)])
        self.second = max(counts, key=lambda s: (counts[s], -s))  # the busiest second 85-95 % into the backlog
        self.expected_last = L.last_before(self.committed, self.second * 1_000_000)
        self.expected = sum(1 for c in after if c.commit_second < self.second)
        self.when = datetime.fromtimestamp(self.second, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        self.backup_markers = self.markers(self.restore("probe"))
        log(f"backlog: {commits} transactions, {self.backlog_bytes() / (1 << 20):.0f} MB in {gen_seconds:.0f} s; "
            f"stop before {self.when} UTC ({counts[self.second]} commits in that second): {self.expected} "
            f"transactions to apply, the last {self.expected_last}")
        self.reference = L.start_reference(self.backup, self.new_sandbox("reference"), self.master, self.expected_last)
        L.wait_stopped_at(self.reference, self.expected_last, timeout=3600)
        self.reference_fp = L.fingerprint(self.reference)
        self.reference.stop()
        return {"transactions": commits, "bytes": self.backlog_bytes(), "generate_seconds": round(gen_seconds, 1),
                "stop_second_commits": counts[self.second], "expected": self.expected,
                "expected_last": self.expected_last, "stop": self.when,
                "setup_seconds": round(time.monotonic() - began)}

    def backlog_bytes(self) -> int:
        info, total = self.backup_info, 0
        for name, size in self.master.execute("SHOW BINARY LOGS"):
            if info is None or name > info.file:
                total += size
            elif name == info.file:
                total += size - info.position
        return total

    def new_sandbox(self, name: str) -> MariaDBSandbox:
        self.n += 1
        s = MariaDBSandbox(self.workdir / f"{name}-{self.n}", server_id=100 + self.n, binlog_format="ROW",
                           extra_config=TARGET_CONFIG)
        self.servers.append(s)
        return s

    def restore(self, name: str) -> MariaDBSandbox:
        return restore_backup(self.backup, self.new_sandbox(name))

    def drop(self, server: MariaDBSandbox) -> None:
        server.stop()
        self.servers.remove(server)
        shutil.rmtree(server.basedir, ignore_errors=True)

    @staticmethod
    def markers(server: MariaDBSandbox) -> int:
        return server.execute("SELECT COUNT(*) FROM shop.markers")[0][0]

    def start(self, method: str, target: MariaDBSandbox) -> subprocess.Popen:
        """The pipe or ``relayproxy pitr`` onto ``target``, in a process group of its own."""
        if method == "pipe":
            files = " ".join(str(p) for p in self.files)
            pipe = (f"TZ=UTC {find_binary('mariadb-binlog', 'mysqlbinlog')} --start-position="
                    f"{self.backup_info.position} --stop-datetime='{self.when}' {files} "
                    f"| {find_binary('mariadb', 'mysql')} -uroot -h127.0.0.1 -P{target.port}")
            command, cwd = ["bash", "-o", "pipefail", "-c", pipe], None
        else:
            w = self.workdir
            for name, text in (("ops.pw", ADMIN_PW + "\n"), ("repl.pw", "replpw\n"), ("empty.pw", "")):
                (w / name).write_text(text)
            command = [sys.executable, "-m", "relayproxy.commands.cli", "pitr", "--target", f"127.0.0.1:{target.port}",
                       "--target-user", "root", "--target-password-file", str(w / "empty.pw"),
                       "--relay", f"127.0.0.1:{self.relay.listen_port}", "--relay-user", ADMIN,
                       "--relay-password-file", str(w / "ops.pw"), "--repl-user", "repl",
                       "--repl-password-file", str(w / "repl.pw"), "--before-time", self.when + "Z",
                       "--from-backup", str(self.backup), "--parallel", str(self.args.parallel), "--quiet", "--json"]
            cwd = REPO_ROOT
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, cwd=cwd)

    def exactness(self, target: MariaDBSandbox, result: dict) -> dict:
        """``result`` with the replay's exactness added; the target dropped."""
        markers = self.markers(target) - self.backup_markers
        result.update(applied=markers, off_by=markers - self.expected,
                      equal_to_reference=L.fingerprint(target) == self.reference_fp)
        self.drop(target)
        return result

    def run(self, method: str, target: MariaDBSandbox) -> tuple[int, str]:
        """The method run to its end: its exit code and the end of its stderr."""
        proc = self.start(method, target)
        _, err = proc.communicate(timeout=7200)
        return proc.returncode, err.strip()[-300:]

    def timed(self, method: str) -> dict:
        target = self.restore(method)
        t0 = time.perf_counter()
        code, err = self.run(method, target)
        seconds = time.perf_counter() - t0
        result = self.exactness(target, {"method": method, "seconds": round(seconds, 3), "exit": code, "error": err})
        log(f"{method}: {seconds:.1f} s, exit {code}, off by {result['off_by']}, "
            f"equal to the reference: {result['equal_to_reference']}")
        return result

    def killed(self, method: str, after: float) -> dict:
        target = self.restore(method + "-kill")
        proc = self.start(method, target)
        time.sleep(after)
        first_alive = proc.poll() is None
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            first_alive = False  # it finished first (a tiny backlog): the second run then finds the work done
        proc.wait(30)
        mid = self.markers(target) - self.backup_markers
        code, err = self.run(method, target)
        result = self.exactness(target, {"method": method, "killed_after_s": round(after, 1),
                                         "killed_while_running": first_alive, "applied_at_kill": mid,
                                         "rerun_exit": code, "rerun_error": err})
        log(f"{method} killed at {after:.1f} s ({mid} applied), run again: exit {code}, off by "
            f"{result['off_by']}, equal: {result['equal_to_reference']}")
        return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=1.0, help="backlog after the backup, GB of binlog (default 1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=4, help="pitr --parallel (the target's slave_parallel_threads)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--output", type=Path, default=RESULTS_DIR / "pitr.md")
    ap.add_argument("--no-write", action="store_true", help="print the report instead of writing results files")
    args = ap.parse_args(argv)
    machine = machine_info(server=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pitr-bench-"))
    bench = Bench(workdir, args)
    began = time.monotonic()
    try:
        backlog = bench.setup()
        runs = run_alternating(args.repeats, ["pitr", "pipe"], lambda order, i: {m: bench.timed(m) for m in order})
        kills = [bench.killed(m, median_range([r[m]["seconds"] for r in runs])[0] / 2) for m in ("pipe", "pitr")]
    finally:
        bench.close()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    report = {"machine": machine, "argv": sys.argv[1:] if argv is None else argv, "backlog": backlog, "runs": runs,
              "kills": kills, "args": {"gb": args.gb, "repeats": args.repeats, "parallel": args.parallel},
              "run_seconds": round(time.monotonic() - began)}
    text = render(report)
    if args.no_write:
        print(text)
        return 0
    write_results(args.output.with_suffix(".json"), json.dumps(report, indent=1, default=str) + "\n")
    plot(report, args.output.with_suffix(".png"))
    write_results(args.output, text, log)
    return 0


def yes(flag: bool, no: str = "NO") -> str:
    return "yes" if flag else no


def render(report: dict) -> str:
    b, runs, a = report["backlog"], report["runs"], report["args"]
    seconds = {m: [r[m]["seconds"] for r in runs] for m in ("pitr", "pipe")}
    ratios = [p / q for p, q in zip(seconds["pitr"], seconds["pipe"])]
    exact = {m: all(r[m]["off_by"] == 0 and r[m]["equal_to_reference"] for r in runs) for m in ("pitr", "pipe")}
    out = [f"Backlog after the backup: {b['transactions']:,} transactions, {b['bytes'] / (1 << 20):,.0f} MB of binlog "
           f"(ROW, mixed sizes, 4 writers; generated in {b['generate_seconds']} s). Stop: before {b['stop']} UTC, a "
           f"second holding {b['stop_second_commits']} commits; what should be applied: {b['expected']:,} "
           f"transactions, the last {b['expected_last']} (from mariadb-binlog's own output). pitr ran with "
           f"--parallel {a['parallel']} (optimistic). How it is done: the docstring of `benchmarks/pitr.py`.", "",
           "| run | order | pitr, s | pipe, s | pitr / pipe | pitr off by | pipe off by | pitr = reference | "
           "pipe = reference | pipe exit |",
           "|---:|---|---:|---:|---:|---:|---:|---|---|---:|"]
    for i, (r, ratio) in enumerate(zip(runs, ratios), 1):
        p, q = r["pitr"], r["pipe"]
        out.append(f"| {i} | {r['order']} | {p['seconds']:.1f} | {q['seconds']:.1f} | {ratio:.2f} | {p['off_by']:+d} | "
                   f"{q['off_by']:+d} | {yes(p['equal_to_reference'])} | {yes(q['equal_to_reference'])} | "
                   f"{q['exit']} |")
    out += ["",
            f"- pitr: {fmt_median_range(seconds['pitr'], '{:.1f}', ' s')}; pipe: "
            f"{fmt_median_range(seconds['pipe'], '{:.1f}', ' s')}.",
            f"- **pitr / pipe: {fmt_median_range(ratios, '{:.2f}', 'x')}**; goal at most {GOAL_RATIO}x: "
            f"**{verdict(ratios, GOAL_RATIO, higher_is_better=False)}**.",
            f"- exact in every run: pitr **{yes(exact['pitr'])}**, pipe **{yes(exact['pipe'], 'no')}** "
            "(*off by*: transactions applied past the stop (+) or short of it (-), counted by marker rows).", ""]
    if report["kills"]:
        out += ["## kill -9 halfway, then the same command again", "",
                "| method | killed after, s | applied at the kill | run again: exit | then off by | = reference | "
                "what the second run said |", "|---|---:|---:|---:|---:|---|---|"]
        for k in report["kills"]:
            said = (k["rerun_error"] or "").replace("|", "/").replace("\n", " ")[-160:]
            when = k["killed_after_s"] if k.get("killed_while_running", True) else f"{k['killed_after_s']} (had ended)"
            out.append(f"| {k['method']} | {when} | {k['applied_at_kill']:,} | {k['rerun_exit']} | "
                       f"{k['off_by']:+d} | {yes(k['equal_to_reference'])} | {said} |")
        out.append("")
    out.append(f"Whole run: {report['run_seconds']} s.")
    return results_document("PITR: `relayproxy pitr` against the `mariadb-binlog | mariadb` pipe, same backlog, same "
                            "backup", __file__, report["argv"], report["machine"], out, runs=len(runs),
                            what="each run restores the backup twice (not timed) and replays with each method")


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    runs = report["runs"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(1, len(runs) + 1)
    ax.bar([x - 0.2 for x in xs], [r["pipe"]["seconds"] for r in runs], 0.4, label="mariadb-binlog | mariadb")
    ax.bar([x + 0.2 for x in xs], [r["pitr"]["seconds"] for r in runs], 0.4, label="relayproxy pitr")
    ax.set(xlabel="run", ylabel="replay time, s", title=f"PITR of {report['backlog']['bytes'] / (1 << 20):,.0f} MB, "
           "same backup")
    ax.legend()
    save_figure(fig, path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
