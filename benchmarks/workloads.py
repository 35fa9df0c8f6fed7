"""Recorded binlog streams of named workload shapes: a real mariadbd master, relayed by relayproxy into a dataset.

Per shape (``SHAPES``): ``RESET MASTER`` on one local master (row format, CRC32), then ``relayproxy run`` into
``<dataset>/<shape>/`` (its log in ``<dataset>/<shape>.log``) while the workload runs, stopped once its horizon is
the master's end: the relay's files, byte for byte the master's, are the recording. ``manifest.json`` says per shape
what was driven, the files, events by type and bytes. ``--scale`` multiplies every count (1.0: about 200,000 events).

    .venv/bin/python benchmarks/workloads.py                          # every shape, default dataset
    .venv/bin/python benchmarks/workloads.py --shapes oltp,xa --scale 0.05 --output /tmp/streams
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a file: the repository root on sys.path (benchmarks/__init__.py)
    import _bootstrap  # noqa: F401

from pymysql.constants import CLIENT  # noqa: E402

from benchmarks.common import REPO_ROOT, logger  # noqa: E402
from relayproxy.binlog import constants as C  # noqa: E402
from relayproxy.binlog.reader import scan_file  # noqa: E402
from relayproxy.lab.harness import RelayProcess, prepare_master  # noqa: E402
from relayproxy.lab.sandbox import MariaDBSandbox  # noqa: E402

DEFAULT_DATASET = REPO_ROOT / "benchmarks" / "data" / "streams"
MAX_BINLOG_SIZE = 32 << 20  # several files per stream, and files larger than the Spark job's default split
BLOB_OVER_16MB = (17 << 20, 24 << 20)
CATCH_UP_TIMEOUT = 300.0
log = logger("workloads")


def scaled(count: int, scale: float, minimum: int = 1) -> int:
    return max(minimum, int(round(count * scale)))


# -- the workloads: each one drives the master and returns what it did (recorded in the manifest) -----------------

def _connect(master: MariaDBSandbox, *session: str):
    """A connection for multi-statement round trips, with ``session`` statements run first."""
    conn = master.connect(client_flag=CLIENT.MULTI_STATEMENTS, max_allowed_packet=256 << 20)
    with conn.cursor() as cur:
        for statement in session:
            cur.execute(statement)
    return conn


def _batched(conn, statements: list[str], per_round_trip: int = 50) -> None:
    """Run statements in multi-statement round trips; each statement still commits on its own."""
    with conn.cursor() as cur:
        for i in range(0, len(statements), per_round_trip):
            cur.execute(";\n".join(statements[i : i + per_round_trip]))
            while cur.nextset():
                pass


def _drive(master: MariaDBSandbox, statements: list[str], per_round_trip: int = 50, *session: str) -> None:
    with _connect(master, *session) as conn:
        _batched(conn, statements, per_round_trip)


def _pad(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=rng.randint(low, high)))


def oltp(master: MariaDBSandbox, scale: float, rng: random.Random) -> dict:
    transactions = scaled(15_000, scale)
    master.execute("CREATE TABLE w.oltp (id INT AUTO_INCREMENT PRIMARY KEY, k INT NOT NULL, c VARCHAR(120) NOT NULL)")
    statements: list[str] = []
    for i in range(transactions):
        roll = rng.random()
        if roll < 0.6 or i < 10:
            statements.append(f"INSERT INTO w.oltp (k, c) VALUES ({i}, '{_pad(rng, 40, 110)}')")
        elif roll < 0.9:
            target = rng.randint(1, i)  # drawn before the row's text
            statements.append(f"START TRANSACTION; INSERT INTO w.oltp (k, c) VALUES ({i}, '{_pad(rng, 40, 110)}'); "
                              f"UPDATE w.oltp SET k = k + 1 WHERE id = {target}; COMMIT")
        else:
            statements.append(f"DELETE FROM w.oltp WHERE id = {rng.randint(1, i)}")
    _drive(master, statements)
    return {"transactions": transactions}


def bulk(master: MariaDBSandbox, scale: float, rng: random.Random) -> dict:
    statements, rows = scaled(150, scale), 1000
    master.execute("CREATE TABLE w.bulk (id INT PRIMARY KEY, k INT NOT NULL, c VARCHAR(200) NOT NULL)")
    _drive(master, ["INSERT INTO w.bulk (id, k, c) VALUES "
                    + ",".join(f"({s * rows + r}, {r}, '{_pad(rng, 60, 140)}')" for r in range(rows))
                    for s in range(statements)], 1)
    return {"statements": statements, "rows_per_statement": rows}


def blobs(master: MariaDBSandbox, scale: float, rng: random.Random) -> dict:
    huge, medium = scaled(3, scale), scaled(40, scale)
    master.execute("CREATE TABLE w.blobs (id INT PRIMARY KEY, note VARCHAR(40), b LONGBLOB NOT NULL)")
    total = medium + huge
    huge_at = set(range(0, total, max(1, total // huge))[:huge])  # spread through the stream
    sizes = []
    with _connect(master) as conn, conn.cursor() as cur:
        for i in range(total):
            size = rng.randint(*BLOB_OVER_16MB) if i in huge_at else rng.randint(64 << 10, 1 << 20)
            cur.execute("INSERT INTO w.blobs (id, note, b) VALUES (%s, %s, %s)",
                        (i, f"blob {size}", rng.randbytes(size)))
            sizes.append(size)
        big_id = next(i for i, s in enumerate(sizes) if s >= 16 << 20)
        cur.execute("UPDATE w.blobs SET b = CONCAT(b, 'x') WHERE id = %s", (big_id,))  # before + after image
    return {"rows": len(sizes), "rows_over_16mb": sum(s >= 16 << 20 for s in sizes), "largest_blob": max(sizes)}


def ddl(master: MariaDBSandbox, scale: float, rng: random.Random) -> dict:
    rounds = scaled(250, scale)
    statements: list[str] = []
    for i in range(rounds):
        t = f"w.ddl_{i}"
        statements += [
            f"CREATE TABLE {t} (id INT PRIMARY KEY, a INT, b VARCHAR(40)) ENGINE=InnoDB",
            f"ALTER TABLE {t} ADD COLUMN c DATETIME NULL, ALGORITHM=INPLACE",
            f"CREATE INDEX ix_a ON {t} (a)",
            f"INSERT INTO {t} (id, a, b) VALUES (1, {i}, 'row'), (2, {i + 1}, 'row')",
            f"CREATE OR REPLACE VIEW w.v_{i} AS SELECT id, a FROM {t} WHERE a > {rng.randint(0, 9)}",
            f"RENAME TABLE {t} TO {t}_renamed",
            f"DROP VIEW w.v_{i}",
            f"TRUNCATE TABLE {t}_renamed",
            f"DROP TABLE {t}_renamed",
        ]
        if i % 25 == 0:
            statements += [f"CREATE DATABASE w_db_{i}", f"DROP DATABASE w_db_{i}"]
    _drive(master, statements, 20)
    return {"statements": len(statements), "rounds": rounds}


def xa(master: MariaDBSandbox, scale: float, rng: random.Random) -> dict:
    transactions = scaled(2_500, scale)
    master.execute("CREATE TABLE w.xa (id INT PRIMARY KEY, k INT NOT NULL, c VARCHAR(100) NOT NULL)")
    statements: list[str] = []
    outcomes = {"commit": 0, "rollback": 0, "one_phase": 0}
    for i in range(transactions):
        xid = f"'xa-{i}', 'branch', 7"
        body = [f"XA START {xid}", f"INSERT INTO w.xa VALUES ({i}, {i}, '{_pad(rng, 20, 90)}')"]
        if i > 0:
            body.append(f"UPDATE w.xa SET k = k + 1 WHERE id = {rng.randrange(i)}")
        body.append(f"XA END {xid}")
        roll = rng.random()
        outcome = "commit" if roll < 0.7 else "rollback" if roll < 0.85 else "one_phase"
        outcomes[outcome] += 1
        body += {"commit": [f"XA PREPARE {xid}", f"XA COMMIT {xid}"],
                 "rollback": [f"XA PREPARE {xid}", f"XA ROLLBACK {xid}"],
                 "one_phase": [f"XA COMMIT {xid} ONE PHASE"]}[outcome]
        statements.append("; ".join(body))
    _drive(master, statements, 20)
    return {"transactions": transactions, **outcomes}


def domains(master: MariaDBSandbox, scale: float, rng: random.Random) -> dict:
    transactions = scaled(10_000, scale)
    domain_ids = (0, 1, 2, 3)
    master.execute("CREATE TABLE w.domains (id INT AUTO_INCREMENT PRIMARY KEY, d INT NOT NULL, c VARCHAR(100))")
    conns = {d: _connect(master, f"SET SESSION gtid_domain_id = {d}") for d in domain_ids}
    pending: dict[int, list[str]] = {d: [] for d in domain_ids}
    for i in range(transactions):
        d = rng.choice(domain_ids)
        if rng.random() < 0.7:
            pending[d].append(f"INSERT INTO w.domains (d, c) VALUES ({d}, '{_pad(rng, 30, 90)}')")
        else:
            pending[d].append(f"START TRANSACTION; INSERT INTO w.domains (d, c) VALUES ({d}, '{_pad(rng, 30, 90)}'); "
                              f"UPDATE w.domains SET c = 'u' WHERE id = {rng.randint(1, i + 1)}; COMMIT")
        if len(pending[d]) >= 20:  # connections take turns, so the domains interleave in the binlog
            _batched(conns[d], pending[d])
            pending[d] = []
    for d, statements in pending.items():
        _batched(conns[d], statements)
        conns[d].close()
    return {"transactions": transactions, "domains": list(domain_ids)}


def statement(master: MariaDBSandbox, scale: float, rng: random.Random) -> dict:
    rounds = scaled(6_000, scale)
    master.execute("CREATE TABLE w.sbr (id INT AUTO_INCREMENT PRIMARY KEY, k INT NOT NULL, r DOUBLE, c VARCHAR(100)) "
                   "ENGINE=InnoDB")
    statements: list[str] = []
    for i in range(rounds):
        kind = i % 4
        if kind == 0:  # auto-increment: INTVAR before the QUERY
            statements.append(f"INSERT INTO w.sbr (k, c) VALUES ({i}, '{_pad(rng, 20, 90)}')")
        elif kind == 1:  # RAND() in a statement: a RAND event carries the seeds
            statements.append(f"INSERT INTO w.sbr (k, r) VALUES ({i}, RAND())")
        elif kind == 2:  # a user variable read by the statement: USER_VAR
            statements.append(f"SET @v = {i}; UPDATE w.sbr SET k = @v WHERE id = {rng.randint(1, i)}")
        else:  # a multi-statement transaction: BEGIN ... XID
            statements.append(f"START TRANSACTION; INSERT INTO w.sbr (k, c) VALUES ({i}, 'trx'); "
                              f"UPDATE w.sbr SET c = CONCAT(c, '.') WHERE id = {rng.randint(1, i)}; COMMIT")
    _drive(master, statements, 50, "SET SESSION binlog_format = 'STATEMENT'")
    return {"statements": rounds, "binlog_format": "STATEMENT"}


SHAPES = {  # name: (description, the workload)
    "oltp": ("OLTP small transactions (row format)", oltp),
    "bulk": ("bulk multi-row INSERTs of 1,000 rows (row format)", bulk),
    "blobs": ("LONGBLOB rows, rows events over 16 MB (row format)", blobs),
    "ddl": ("DDL-heavy: tables, indexes, views, databases", ddl),
    "xa": ("XA: two-phase commit, rollback after prepare, one-phase commit", xa),
    "domains": ("four GTID domains interleaved", domains),
    "statement": ("statement-based: INTVAR, RAND, USER_VAR, multi-statement transactions", statement),
}


# -- recording ---------------------------------------------------------------------------------------------------

def describe_recording(folder: Path) -> dict:
    """Files and events by type of one recording, found by the binlog magic (not by name)."""
    files = []
    counts: dict[str, int] = {}
    largest = 0
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        with open(path, "rb") as f:
            if f.read(4) != C.BINLOG_MAGIC:
                continue
        sizes: list[int] = []
        result = scan_file(path, on_event=lambda ev: sizes.append(ev.size))
        if not result.ok:
            raise RuntimeError(f"recorded file {path} does not scan cleanly: {result.error}")
        for type_code, n in result.counts_by_type.items():
            counts[C.event_name(type_code)] = counts.get(C.event_name(type_code), 0) + n
        largest = max([largest, *sizes])
        files.append({"file": path.name, "bytes": path.stat().st_size, "events": result.events,
                      "server_version": result.server_version})
    return {"files": files, "events": sum(f["events"] for f in files), "bytes": sum(f["bytes"] for f in files),
            "largest_event": largest, "counts": dict(sorted(counts.items(), key=lambda kv: -kv[1]))}


def record_shape(master: MariaDBSandbox, name: str, dataset: Path, scale: float, seed: int, server_id: int) -> dict:
    description, drive = SHAPES[name]
    target = dataset / name
    if target.exists():
        shutil.rmtree(target)
    (dataset / f"{name}.log").unlink(missing_ok=True)
    for sql in ("DROP DATABASE IF EXISTS w", "CREATE DATABASE w", "RESET MASTER"):
        master.execute(sql)
    relay = RelayProcess(target, master.port, server_id=server_id, gtid_mode="off")
    began = time.monotonic()
    relay.start()
    try:
        info = drive(master, scale, random.Random(seed))
        status = relay.wait_caught_up(master, CATCH_UP_TIMEOUT)
        end = (status["master_log_file"], status["read_master_log_pos"])
    finally:
        relay.stop()
    seconds = time.monotonic() - began
    described = describe_recording(target)
    if not described["files"]:
        raise RuntimeError(f"{name}: the relay wrote no binlog file into {target}")
    log(f"{name}: {described['events']:,} events, {described['bytes'] / 1e6:,.1f} MB in "
        f"{len(described['files'])} file(s), master end {end[0]}:{end[1]}, {seconds:.1f} s")
    return {"description": description, "workload": info, "master_end": list(end),
            "seconds": round(seconds, 1), **described}


def record(dataset: Path, shapes: list[str], scale: float, seed: int = 6, workdir: Path | None = None) -> dict:
    """Record every shape of ``shapes`` into ``dataset`` and write its manifest.json."""
    dataset.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="rp-workloads-")) if workdir is None else workdir
    master = MariaDBSandbox(base / "master", binlog_format="ROW", extra_config={
        "max_binlog_size": MAX_BINLOG_SIZE, "sync_binlog": 0, "innodb_flush_log_at_trx_commit": 2,
        "binlog_row_event_max_size": 8192})
    manifest_path = dataset / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"shapes": {}}
    try:
        master.start()
        prepare_master(master)
        version = master.execute("SELECT VERSION()")[0][0]
        log(f"master mariadbd {version} on port {master.port}; dataset {dataset}")
        for name in shapes:
            index = list(SHAPES).index(name)  # the same seed for a shape whichever subset is recorded
            manifest["shapes"][name] = record_shape(master, name, dataset, scale, seed + index, 100 + index)
            manifest["shapes"][name]["scale"] = scale
            manifest["server_version"] = version
            manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")  # after each shape: a crash keeps the rest
    finally:
        master.stop()
        if workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--output", type=Path, default=DEFAULT_DATASET,
                    help=f"dataset folder (default {DEFAULT_DATASET.relative_to(REPO_ROOT)})")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated subset of: {', '.join(SHAPES)}")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every workload's size (default 1.0)")
    ap.add_argument("--seed", type=int, default=6, help="random seed of the workloads (default 6)")
    args = ap.parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown or not shapes:
        ap.error(f"--shapes: unknown shape(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(SHAPES)}")
    if not 0 < args.scale <= 100:
        ap.error(f"--scale must be in (0, 100], got {args.scale}")
    began = time.monotonic()
    manifest = record(args.output, shapes, args.scale, args.seed)
    total = sum(manifest["shapes"][s]["events"] for s in shapes)
    log(f"recorded {len(shapes)} shape(s), {total:,} events, in {time.monotonic() - began:.0f} s into {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
