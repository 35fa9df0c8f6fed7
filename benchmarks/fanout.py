"""Fan-out: N replicas streaming a live OLTP load through relayproxy, against the same N on the master itself.

One MariaDB master (``relayproxy.lab.sandbox``, row format, CRC32) takes a paced load for ``--seconds`` from a writer
*process* (its commit timestamps do not wait for the clients' GIL): at ``--rate`` trx/s it alternates an autocommit
INSERT with ``START TRANSACTION; INSERT; UPDATE; COMMIT`` (~150-byte events, as in ``relay_catchup.py``) and records
``time.monotonic()`` right after each COMMIT, by GTID sequence number (``@@last_gtid``). The load runs twice: phase
``relay``, ``--replicas`` clients dump from ``relayproxy run --listen --config relay.toml`` (default settings:
sync-mode transaction, CRC verified) replicating from the master; phase ``direct``, the relay stopped, the same
clients dump from the master (MariaDB's own dump threads: the ratio base).

Every client is an in-process asyncio ``UpstreamConnection`` in one event loop, logged in as a MariaDB replica
(``@master_binlog_checksum``, ``@mariadb_slave_capability=4``, COM_REGISTER_SLAVE with its own server id,
COM_BINLOG_DUMP asking for ANNOTATE_ROWS) from the master's end position. It checks every event's position
(``log_pos - event_size`` is where the last one ended, across ROTATEs) and notes when each XID arrived: lag = arrival -
commit time. Every client must reach the master's final position (otherwise the script exits 1). Reported per
phase: lag p50/p90/p99/max over every (client, transaction) pair and the worst client's p99; delivered events/s and
MB/s summed over the clients, from the first write to the last client's convergence; the drain time (last commit ->
last client converged); CPU (/proc/<pid>/stat) of the relay, of mariadbd and of this process (near 100 % of a core,
the clients, not the server, bound the numbers); the relay's VmHWM. Absolute numbers on a shared 2-core machine are
noise; the ratios relay / direct of one run are the result.

    .venv/bin/python benchmarks/fanout.py                  # 100 clients, 2 x 40 s, writes benchmarks/results/
    .venv/bin/python benchmarks/fanout.py --quick --json   # 5 clients, 2 x 5 s, prints JSON, writes nothing

``--real``: real external clients (``fanout_real.md``, ``fanout_real_baseline.md`` with ``--baseline``):
``--binlog-clients`` (50) ``mariadb-binlog --read-from-remote-server --raw --stop-never`` processes and
``--real-replicas`` (3) MariaDB replicas (``CHANGE MASTER TO`` file/position) follow the relay (``--relay-option
KEY=VALUE``: options of ``relayproxy run``) or the master from its end, ``--repeats`` (3) times in alternating order,
for the loads ``oltp`` (300 trx/s) and ``bulk`` (one 8 KB BLOB row a transaction, 25 trx/s). Per phase an idle window
(``--idle-seconds``, clients connected, no load) gives a CPU baseline, then the load runs until everyone has the
master's last byte. Measured: CPU (baseline subtracted) of the relay's process tree, of mariadbd and of the master's
``Binlog Dump`` threads alone (ids from ``performance_schema.threads.THREAD_OS_ID``, on-CPU time from
/proc/<pid>/task/<tid>/schedstat); bytes delivered (output files + replicas' relay logs); CPU per MB and the relay /
dump threads ratio per repeat (median and range); lag of ``--sample-clients`` mariadb-binlog clients (a tail parser
finds each XID) and of every replica (``SELECT MAX(id)`` every 10 ms); relay RSS and VmHWM. ``--ceiling`` (default
on): a rate ladder on both targets, the highest rate whose lag stays bounded and the MB/s delivered there.
``--sweep``: 1, 10, 50, 100, 300, 1000 clients (beyond 100: asyncio dump clients in a helper process).

    .venv/bin/python benchmarks/fanout.py --real                       # ~12 min, writes fanout_real.md/.png
    .venv/bin/python benchmarks/fanout.py --real --sweep --loads oltp --repeats 1 --no-ceiling
    .venv/bin/python benchmarks/fanout.py --real --quick --json        # 5 clients + 1 replica, writes nothing
    .venv/bin/python benchmarks/fanout.py --real --relay-option sender_processes=2

This file is the command line; the in-process benchmark is ``fanout_inprocess.py``, the ``--real`` one
``fanout_real.py``, what they share ``fanout_common.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

from benchmarks import fanout_inprocess  # noqa: E402
from benchmarks.common import RESULTS_DIR, add_report_options  # noqa: E402
from benchmarks.fanout_inprocess import PHASES  # noqa: E402
from benchmarks.fanout_real import add_real_arguments, real_main  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="5 clients, 5 s per phase, writes nothing")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")
    p.add_argument("--replicas", type=int, default=None, help="dump clients (default 100; --quick 5)")
    p.add_argument("--seconds", type=float, default=None, help="write load per phase (default 40; --quick 5)")
    p.add_argument("--rate", type=float, default=None, help="transactions/s the writer aims at (default 200; "
                   "--quick 100)")
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset of: relay, direct")
    p.add_argument("--drain-timeout", type=float, default=120.0, help="seconds the clients may take to converge")
    p.add_argument("--output-dir", type=Path, default=None, help=f"where results go (default {RESULTS_DIR}); "
                   "--quick writes nothing unless this is given")
    add_report_options(p, saved="the report")
    p.add_argument("--workdir", type=Path, default=None, help="parent of the temporary directory")
    add_real_arguments(p)
    args = p.parse_args(argv)
    if args.real:
        return args  # finish_real_args sets the real mode's defaults
    for name, quick, full in (("replicas", 5, 100), ("seconds", 5.0, 40.0), ("rate", 100.0, 200.0)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from relayproxy.log import configure_logging

    if args.real:
        configure_logging(fmt="json", level="warning")
        return real_main(args, argv, __file__)
    return fanout_inprocess.main(args, argv)


if __name__ == "__main__":
    sys.exit(main())
