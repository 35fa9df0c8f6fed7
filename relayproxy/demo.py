"""`relayproxy demo`: start a throwaway MariaDB master, write transactions of every shape, inspect its binlogs."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import pymysql

from .log import get_logger
from .sandbox import MariaDBSandbox, SandboxError

log = get_logger(__name__)

# (what the transaction shows, statements run on one connection with autocommit on). Each shape ends a
# transaction group differently in the binlog, which is what the boundary parser has to get right.
TRANSACTIONS: list[tuple[str, list[str]]] = [
    (
        "DDL: CREATE DATABASE and two CREATE TABLEs (each its own group, no BEGIN)",
        [
            "CREATE DATABASE demo",
            "CREATE TABLE demo.accounts (id INT AUTO_INCREMENT PRIMARY KEY, owner VARCHAR(40) NOT NULL,"
            " balance DECIMAL(12,2) NOT NULL) ENGINE=InnoDB",
            "CREATE TABLE demo.ledger (id INT AUTO_INCREMENT PRIMARY KEY, account_id INT NOT NULL,"
            " amount DECIMAL(12,2) NOT NULL, note VARCHAR(80) NOT NULL) ENGINE=InnoDB",
        ],
    ),
    (
        "autocommit INSERT in row format (TABLE_MAP, WRITE_ROWS, ends with XID)",
        [
            "SET SESSION binlog_format = 'ROW'",
            "INSERT INTO demo.accounts (owner, balance) VALUES ('alice', 100.00), ('bob', 50.00)",
        ],
    ),
    (
        "BEGIN .. COMMIT with three statements in row format (one group, ends with XID)",
        [
            "BEGIN",
            "UPDATE demo.accounts SET balance = balance - 25 WHERE owner = 'alice'",
            "UPDATE demo.accounts SET balance = balance + 25 WHERE owner = 'bob'",
            "INSERT INTO demo.ledger (account_id, amount, note) VALUES (1, -25, 'to bob'), (2, 25, 'from alice')",
            "COMMIT",
        ],
    ),
    (
        "XA transaction: XA PREPARE (ends with XA_PREPARE) then XA COMMIT (its own group)",
        [
            "XA START 'demo-xa'",
            "INSERT INTO demo.ledger (account_id, amount, note) VALUES (2, 0, 'xa audit')",
            "XA END 'demo-xa'",
            "XA PREPARE 'demo-xa'",
            "XA COMMIT 'demo-xa'",
        ],
    ),
    (
        "statement format: user variable, INSERT .. SELECT with RAND() (INTVAR, RAND, USER_VAR before the QUERYs)",
        [
            "SET SESSION binlog_format = 'STATEMENT'",
            "SET @bonus = 7.5",
            "BEGIN",
            "INSERT INTO demo.ledger (account_id, amount, note)"
            " SELECT id, ROUND(RAND() * @bonus, 2), CONCAT('bonus for ', owner) FROM demo.accounts ORDER BY id",
            "UPDATE demo.accounts SET balance = balance + @bonus",
            "COMMIT",
        ],
    ),
    ("FLUSH BINARY LOGS: rotate to a second binlog file", ["FLUSH BINARY LOGS"]),
    (
        "autocommit UPDATE in the second file, MIXED format (logged as a statement, ends with XID)",
        [
            "SET SESSION binlog_format = DEFAULT",
            "UPDATE demo.accounts SET balance = balance + 1 WHERE owner = 'alice'",
        ],
    ),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory (datadir, my.cnf, binlogs, error log) instead of removing it",
    )
    parser.add_argument("--port", type=int, default=None, help="TCP port for the master (default: a free one)")


def run(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="relayproxy-demo-"))
    master = MariaDBSandbox(workdir / "master", port=args.port)
    try:
        try:
            master.start()
        except SandboxError as exc:
            log.error("demo could not start MariaDB", error=str(exc))
            return 1
        version = master.execute("SELECT VERSION()")[0][0]
        print(f"MariaDB {version} master on {master.host}:{master.port}, files in {workdir}")
        print()
        try:
            _write_transactions(master)
        except pymysql.MySQLError as exc:
            log.error("demo transaction failed", error=str(exc), tail_of_error_log=master.error_log_tail(10))
            return 1
        files = master.binlog_files()
        gtid_state = master.execute("SELECT @@gtid_binlog_state")[0][0]

        print()
        print(f"$ relayproxy inspect {' '.join(str(f) for f in files)}")
        sys.stdout.flush()
        from . import cli

        code = cli.main(
            [
                "--log-format",
                getattr(args, "log_format", "auto"),
                "--log-level",
                str(getattr(args, "log_level", "info")),
                "inspect",
                *(str(f) for f in files),
            ]
        )
        sys.stdout.flush()

        print("demo summary:")
        print(f"  binlog files: {', '.join(f'{f.name} ({f.stat().st_size} bytes)' for f in files)}")
        print(f"  server's @@gtid_binlog_state: {gtid_state}  (compare with inspect's GTID set after the last file)")
        print(f"  relayproxy inspect exit code: {code}")
        return code
    finally:
        master.stop()
        if args.keep:
            print(f"kept {workdir}; start the master again with: {' '.join(master.server_command())}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _write_transactions(master: MariaDBSandbox) -> None:
    conn = master.connect()
    try:
        with conn.cursor() as cursor:
            for number, (what, statements) in enumerate(TRANSACTIONS, start=1):
                for sql in statements:
                    cursor.execute(sql)
                print(f"  {number}. {what}")
    finally:
        conn.close()
