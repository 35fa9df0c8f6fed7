"""How long a hostile or merely large statement holds the relay's event loop (invariant 7), before and after the
SQL layer ran in slices.

Each statement of ``SHAPES`` is answered by the relay's own ``downstream.sql.execute`` on a uvloop loop in this
process (start-up objects frozen out of the cyclic collector, as ``relayproxy run`` does) while a probe task on the
same loop notes each turn it gets. ``--before DIR`` also measures a checkout of an earlier commit (``git worktree
add DIR <commit>``; ``--before-commit`` names it), each in its own process. Writes benchmarks/results/sql_stall.md.

    .venv/bin/python benchmarks/sql_stall.py [--runs 3] [--before DIR --before-commit COMMIT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "sql_stall.md"
MIB = 1 << 20

SHAPES = [  # (name, statement)
    ("the defect's SELECT 1+1+...+1, 1,000,008 bytes", "SELECT 1" + "+1" * ((1_000_008 - 8) // 2)),
    ("IN list of 9,998 (at MAX_TERMS)", "SELECT 1 IN (" + ",".join(["2"] * 9998) + ")"),
    ("1,024 select items (at MAX_SELECT_ITEMS)", "SELECT " + ",".join(["1"] * 1024)),
    ("/**/ comments, 1 MiB", "SELECT 1" + "/**/" * ((MIB - 10) // 4)),
    ("string of \\n escapes, 1 MiB", "SELECT '" + "\\n" * ((MIB - 10) // 2) + "'"),
    ("string literal, 1 MiB", "SELECT '" + "x" * (MIB - 10) + "'"),
    ("unterminated quote, 1 MiB", "SELECT '" + "x" * (MIB - 10)),
]


def measure(runs: int) -> list[dict]:
    """In the process whose ``relayproxy`` is the one to measure (PYTHONPATH)."""
    import asyncio
    import gc
    import tempfile
    import time
    import types

    from relayproxy.commands import config
    from relayproxy.commands.run import SessionRelayView
    from relayproxy.downstream.context import ConnectionState, DownstreamContext
    from relayproxy.downstream.sql import execute
    from relayproxy.relay.store import RelayStore
    from relayproxy.upstream.receiver import ReceiverCounters
    from relayproxy.upstream.session import UpstreamStatus

    try:
        from uvloop import run
    except ImportError:
        run = asyncio.run
    relay_dir = Path(tempfile.mkdtemp(prefix="sql-stall-"))
    cfg = config.load(None, environ={"RELAYPROXY_SERVER_ID": "100", "RELAYPROXY_USER": "repl",
                                     "RELAYPROXY_RELAY_DIR": str(relay_dir), "RELAYPROXY_MASTER": "127.0.0.1:3306",
                                     "RELAYPROXY_GTID_MODE": "mysql"})
    store = RelayStore.open(relay_dir)
    status = UpstreamStatus(io_running=True, state="streaming", master_server_id=1)
    receiver = types.SimpleNamespace(master_position=None, master_timestamp=0, counters=ReceiverCounters())
    uuid = "00000000-0000-0000-0000-000000000100"
    try:  # the view over a store and its upstream (issue 34); a relayproxy before it took the session
        from relayproxy.ops.status import UpstreamSources
    except ImportError:
        session = types.SimpleNamespace(store=store, status=status, receiver=receiver)
        view = SessionRelayView(cfg, session, server_uuid=uuid)
    else:
        upstream = UpstreamSources(status=status, receiver=receiver)
        view = SessionRelayView(cfg, lambda: store, lambda: upstream, server_uuid=uuid)
    ctx = DownstreamContext(view, status_document=lambda: {})
    conn = ConnectionState(conn_id=7, user="monitor", host="10.0.0.9")
    ctx.connections[7] = conn
    gc.collect()
    gc.freeze()

    async def once(sql: str) -> dict:
        walls, cpus = [], []
        done = False

        async def probe():
            wall, cpu = time.perf_counter(), time.thread_time()
            while not done:
                await asyncio.sleep(0)
                now_wall, now_cpu = time.perf_counter(), time.thread_time()
                walls.append(now_wall - wall)
                cpus.append(now_cpu - cpu)
                wall, cpu = now_wall, now_cpu

        task = asyncio.create_task(probe())
        await asyncio.sleep(0)
        started = time.perf_counter()
        response = await execute(ctx, conn, sql)
        seconds = time.perf_counter() - started
        done = True
        await task
        return {"seconds": seconds, "stall": max(walls), "cpu": max(cpus), "turns": len(walls),
                "answer": getattr(response, "code", "result")}

    out = []
    for name, sql in SHAPES:
        samples = [run(once(sql)) for _ in range(runs)]
        out.append({"shape": name, "bytes": len(sql.encode()), "samples": samples})
    store.close()
    return out


def table(rows: list[dict]) -> list[str]:
    """Per statement: the median [min-max] of its runs' figures."""
    lines = ["| statement | bytes | answer | seconds to answer | longest stall, ms (wall) | most CPU in one turn, ms "
             "| loop turns meanwhile |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        cells = [row["shape"], f"{row['bytes']:,}", row["samples"][0]["answer"]]
        for key, scale, digits in (("seconds", 1, 3), ("stall", 1000, 1), ("cpu", 1000, 1)):
            values = [x[key] for x in row["samples"]]
            m, lo, hi = (v * scale for v in (statistics.median(values), min(values), max(values)))
            cells.append(f"{m:,.{digits}f} [{lo:,.{digits}f}-{hi:,.{digits}f}]")
        cells.append(f"{statistics.median([x['turns'] for x in row['samples']]):,.0f}")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def run_in(source: Path, runs: int) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure", "--runs", str(runs)],
                          env=env, cwd=source, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a checkout of an earlier commit to measure too")
    parser.add_argument("--before-commit", default="not recorded")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.runs)))
        return 0
    if not __package__:  # not before: --measure imports the relayproxy of PYTHONPATH (benchmarks/__init__.py)
        import _bootstrap  # noqa: F401
    from benchmarks.benchinfo import command_line, machine_info, machine_section

    after = run_in(REPO, args.runs)
    before = run_in(args.before, args.runs) if args.before else None
    machine = machine_info()
    commit = machine["relayproxy commit"]
    lines = ["# SQL statements and the event loop: time to answer and the longest stall", "",
             "Produced by (from the repository root):", "", "```", command_line(__file__, argv), "```", "",
             f"- commit: {commit.split()[0]}; tree: {'dirty' if '+' in commit else 'clean'} ({commit})",
             f"- repeats: {args.runs} runs of each statement; figures are the median with the range [min-max]", "",
             "Each statement is answered by `downstream.sql.execute` on a uvloop event loop while a probe task on "
             "the same loop notes every turn it gets. *Longest stall* is the longest wall-clock gap between two turns "
             "of the probe: how long every replica, the upstream session and /status waited (a busy machine's "
             "preemption is in it); *most CPU in one turn* is the same gap in thread CPU time.", ""]
    if before is not None:
        lines += [f"## Before: commit {args.before_commit} (the whole statement in one turn of the loop)", "",
                  *table(before), ""]
    lines += [f"## After: commit {commit.split()[0]} (the statement in slices, bounded as its limits are crossed)", "",
              *table(after), "", *machine_section(machine)]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
