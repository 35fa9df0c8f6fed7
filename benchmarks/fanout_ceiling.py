"""Egress ceiling of fan-out: how many MB/s the relay can send, with 0, 1 or 2 sender processes, against the master.

A MariaDB master holds a backlog (multi-row INSERTs of 8 KB BLOBs: per-byte work dominates, as in a large fan-out
of a busy master). For each target -- `direct` (the master's own dump threads), `relay` with `sender_processes = 0`,
1 and 2 -- K dump clients log in and register, then all ask for their dumps at the first file at once and read the
whole backlog as fast as they can; the result is the aggregate MB/s they received (bytes / time from the moment
they asked to the last byte) and, over that window, the CPU of the server (the relay's processes, or the master's
`mariadbd`), of the clients' processes and of the whole machine. The clients are deliberately cheap so that the
server side saturates first: 2 processes; each logs in and starts its dumps with asyncio, then a thread per socket
reads with recv(MSG_TRUNC), with which Linux drops TCP data without copying it to the client. They still share the machine's cores with the servers, which the cores columns show.
Targets run in an order that is rotated between repeats; the figures are medians with the range.

    .venv/bin/python benchmarks/fanout_ceiling.py [--backlog-mb 60] [--repeats 3] [--output-dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

from benchmarks import benchinfo  # noqa: E402
from benchmarks.common import RESULTS_DIR, md_row, write_results  # noqa: E402
from benchmarks.fanout_common import (MASTER_CONFIG, REPL_PASSWORD, REPL_USER, IdleClients, Relay,  # noqa: E402
                                      master_end)
from relayproxy.lab.procstat import machine_busy, tree_cpu  # noqa: E402
from relayproxy.lab.sandbox import MariaDBSandbox  # noqa: E402

TARGETS = ("direct", "relay-0", "relay-1", "relay-2")
CLIENTS = 16  # dump clients, in 2 processes, that drop what they receive in the kernel (recv MSG_TRUNC)


def make_backlog(master: MariaDBSandbox, mb: int) -> None:
    conn = master.connect()
    try:
        cur = conn.cursor()
        cur.execute("CREATE DATABASE IF NOT EXISTS bench")
        cur.execute("CREATE TABLE bench.blobs (id INT AUTO_INCREMENT PRIMARY KEY, b BLOB) ENGINE=InnoDB")
        row = b"x" * 8000
        rows = mb * 1_000_000 // 8000
        for start in range(0, rows, 100):
            cur.executemany("INSERT INTO bench.blobs (b) VALUES (%s)", [(row,)] * min(100, rows - start))
            conn.commit()
    finally:
        conn.close()


def drain(port: int, clients: int, server_pid: int | None, settle: float = 1.5, timeout: float = 300.0) -> dict:
    """`clients` discarding dump clients (2 processes) log in and register, then all dump the backlog at once:
    bytes received, seconds from then to the last byte, clients that failed, CPU up to the last byte."""
    halves = [IdleClients(port, ("master-bin.000001", 4), n, first_id=first_id, discard=True, hold=True)
              for n, first_id in ((clients // 2, 20000), (clients - clients // 2, 30000))]

    def sample() -> tuple:
        return tree_cpu(server_pid), [tree_cpu(h.proc.pid) for h in halves], machine_busy()

    server0, clients0, machine0 = sample()
    began = time.monotonic()
    for h in halves:
        h.go()
    for h in halves:
        h.wait_started()
    last, last_change, total = -1, time.monotonic(), 0
    at_last = sample()
    while time.monotonic() - began < timeout:
        total = sum(h.received() for h in halves)
        now = time.monotonic()
        if total != last:
            last, last_change = total, now
            at_last = sample()
        elif now - last_change >= settle:
            break
        time.sleep(0.02)
    server1, clients1, machine1 = at_last
    errors = sum(len(h.ready.get("errors") or []) + int(h.stop().get("error_count") or 0) for h in halves)
    return {"bytes": total, "seconds": last_change - began, "errors": errors,
            "server_cpu_s": (server1 - server0) if server0 is not None and server1 is not None else None,
            "clients_cpu_s": sum(b - a for a, b in zip(clients0, clients1) if a is not None and b is not None),
            "machine_busy_s": machine1[0] - machine0[0], "machine_s": machine1[1] - machine0[1]}


def run_target(target: str, master: MariaDBSandbox, work: Path, index: int) -> dict:
    relay = None
    try:
        if target == "direct":
            port, pid = master.port, master.pid
        else:
            where = work / f"{target}-{index}"
            where.mkdir(parents=True, exist_ok=True)
            relay = Relay(where, master, options=[("sender_processes", target.split("-")[1])]).start()
            relay.wait_at(master_end(master), timeout=300, poll=0.02)
            port, pid = relay.listen_port, relay.pid
            time.sleep(0.5)
        d = drain(port, CLIENTS, pid)
        got, cpu = d["bytes"], d["server_cpu_s"]
        return {"target": target, **d, "mb_per_s": got / 1e6 / d["seconds"],
                "server_cpu_s_per_mb": (cpu / (got / 1e6)) if cpu else None}
    finally:
        if relay is not None:
            relay.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backlog-mb", type=int, default=60, help="MB of 8 KB rows the master holds")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rp-ceiling-"))
    master = MariaDBSandbox(work / "master", server_id=1, binlog_format="ROW", extra_config=MASTER_CONFIG)
    master.start()
    runs: list[dict] = []
    try:
        master.create_user(REPL_USER, REPL_PASSWORD)
        make_backlog(master, args.backlog_mb)
        print(f"backlog: {master_end(master)}", flush=True)
        for r in range(args.repeats):
            for target in TARGETS[r % len(TARGETS):] + TARGETS[: r % len(TARGETS)]:
                result = run_target(target, master, work, r)
                result["repeat"] = r
                runs.append(result)
                print(f"repeat {r} {target}: {result['mb_per_s']:.1f} MB/s ({result['bytes'] / 1e6:.0f} MB in "
                      f"{result['seconds']:.2f} s), server CPU {result['server_cpu_s']}, clients CPU "
                      f"{result['clients_cpu_s']:.2f}, machine busy {result['machine_busy_s']:.2f}, client errors "
                      f"{result['errors']}", flush=True)
    finally:
        master.stop()
    write_markdown(args, argv if argv is not None else sys.argv[1:], runs)
    return 0


def write_markdown(args, argv, runs) -> None:
    machine = benchinfo.machine_info(server=True)
    lines = ["# Fan-out egress ceiling: relay with 0, 1, 2 sender processes vs the master's dump threads", ""]
    lines += benchinfo.header_block(Path(__file__), argv, machine, runs=args.repeats,
                                    what="the targets' order rotated between repeats")
    lines += ["", __doc__.split("\n\n")[1].replace("\n", " "), "",
              f"{CLIENTS} clients (discard reads), backlog {args.backlog_mb} MB of rows (MariaDB's "
              "ROW binlog of multi-row INSERTs of 8 KB BLOBs, 100 rows a statement: 8 KB row events, and each "
              "statement's text, about 1 MB, as an ANNOTATE_ROWS event that these clients do not ask for); "
              "**the clients, the master and the relay share the machine's 2 cores**. Server CPU is the relay's "
              "processes' or, for `direct`, the master's whole `mariadbd`; cores are CPU seconds over the drain's "
              "seconds (the machine's: all processes and the kernel, out of 2).", "",
              "| target | aggregate MB/s received | server CPU s per MB | cores: server | cores: clients | "
              "cores: machine busy | vs direct (per repeat) | vs relay-0 (per repeat) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    by = {t: [r for r in runs if r["target"] == t] for t in TARGETS}

    def spread(values: list[float], fmt: str, unit: str = "") -> str:
        return benchinfo.fmt_median_range(values, fmt, unit) if values else "-"

    def versus(rows: list[dict], base: str) -> str:  # MB/s over the base target's of the same repeat
        return spread([r["mb_per_s"] / b["mb_per_s"] for r in rows for b in by.get(base, [])
                       if b["repeat"] == r["repeat"]], "{:.2f}", "x")

    for t, rows in by.items():
        cores = [spread([r[key] / r["seconds"] for r in rows if r.get(key) is not None], "{:.2f}")
                 for key in ("server_cpu_s", "clients_cpu_s", "machine_busy_s")]
        lines.append(md_row(t, spread([r["mb_per_s"] for r in rows], "{:.1f}"),
                            spread([r["server_cpu_s_per_mb"] for r in rows if r["server_cpu_s_per_mb"]], "{:.4f}"),
                            *cores, versus(rows, "direct"), versus(rows, "relay-0")))
    lines += ["", "Runs (every client of a run receives the whole backlog; MB is what all of them received):", "",
              "| repeat | target | MB | seconds | MB/s | server CPU s | clients CPU s | machine busy CPU s | "
              "client errors |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        cpu = f"{r['server_cpu_s']:.2f}" if r["server_cpu_s"] is not None else "-"
        lines.append(md_row(r["repeat"], r["target"], f"{r['bytes'] / 1e6:.0f}", f"{r['seconds']:.2f}",
                            f"{r['mb_per_s']:.1f}", cpu, f"{r['clients_cpu_s']:.2f}", f"{r['machine_busy_s']:.2f}",
                            r["errors"]))
    write_results(args.output_dir / "fanout_ceiling.md", "\n".join(lines) + "\n")
    print({t: statistics.median([r["mb_per_s"] for r in by[t]]) for t in TARGETS if by[t]})


if __name__ == "__main__":
    sys.exit(main())
