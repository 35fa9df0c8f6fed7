"""SHOW BINLOG EVENTS on the relay: the relay's answer for a file equals a real MariaDB master's for the
same file (Pos, Event_type, Server_id, End_log_pos and Info), its errors are the servers', it stops at the
durable horizon and at the row cap; a MySQL-written corpus file served by `relayproxy serve` lists MySQL's type
names."""

from __future__ import annotations

from pathlib import Path

import pymysql
import pytest

from relayproxy.binlog.reader import scan_file
from relayproxy.lab.harness import RelayProcess, free_port, prepare_master

from ..commands.test_serve import copy_files, served

MYSQL_FILE = "blackbeam-rust_mysql_common/test-data/binlogs/binlog-invisible-columns.000001"


def rows(port: int, sql: str, user: str = "repl", password: str = "replpw") -> list[tuple]:
    conn = pymysql.connect(host="127.0.0.1", port=port, user=user, password=password)
    try:
        cur = conn.cursor()
        cur.execute(sql)
        return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def error(port: int, sql: str) -> tuple:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="repl", password="replpw")
    try:
        with pytest.raises(pymysql.MySQLError) as info:
            conn.cursor().execute(sql)
        return info.value.args
    finally:
        conn.close()


@pytest.mark.server
def test_relay_answer_equals_the_mariadb_masters(mariadb, tmp_path: Path) -> None:
    master = mariadb("master", binlog_format="ROW")
    prepare_master(master)
    master.execute("CREATE DATABASE app")
    master.execute("CREATE TABLE app.t (id INT PRIMARY KEY, v VARCHAR(50))")
    master.execute("INSERT INTO app.t VALUES (1, 'a'), (2, 'b')")
    conn = master.connect()
    with conn.cursor() as cur:  # a statement with a default database: Info has "use `app`; "
        cur.execute("USE app")
        cur.execute("CREATE TABLE u (id INT)")
        cur.execute("BEGIN")
        cur.execute("INSERT INTO t VALUES (3, 'c')")
        cur.execute("UPDATE t SET v = 'z' WHERE id < 3")
        cur.execute("DELETE FROM t WHERE id = 1")
        cur.execute("COMMIT")
    conn.close()
    master.execute("FLUSH BINARY LOGS")
    master.execute("INSERT INTO app.t VALUES (4, 'd')")
    listen = free_port()
    config = tmp_path / "relay.toml"
    config.write_text('[[users]]\nname = "repl"\npassword = "replpw"\nplugin = "mysql_native_password"\n'
                      'privileges = ["replication_client"]\n')
    relay = RelayProcess(tmp_path / "relay", master.port, gtid_mode="mariadb",
                         extra=["--listen", f"127.0.0.1:{listen}", "--config", str(config)]).start()
    try:
        relay.wait_caught_up(master)
        first, second = (p.name for p in master.binlog_files()[:2])
        for sql in (f"SHOW BINLOG EVENTS IN '{first}'", "SHOW BINLOG EVENTS", f"SHOW BINLOG EVENTS IN '{second}'",
                    f"SHOW BINLOG EVENTS IN '{first}' LIMIT 3", f"SHOW BINLOG EVENTS IN '{first}' LIMIT 2, 4",
                    f"SHOW BINLOG EVENTS IN '{first}' FROM 256 LIMIT 3",
                    f"SHOW BINLOG EVENTS IN '{first}' LIMIT 4 OFFSET 1", f"SHOW BINLOG EVENTS IN '{first}' FROM 0",
                    f"SHOW BINLOG EVENTS IN '{first}' LIMIT 0", f"SHOW BINLOG EVENTS IN '{first}' LIMIT 2, 0"):
            theirs = rows(master.port, sql, "root", "")
            mine = rows(listen, sql)
            assert mine == theirs, sql
        types = {r[2] for r in rows(listen, f"SHOW BINLOG EVENTS IN '{first}'")}
        assert {"Format_desc", "Gtid_list", "Binlog_checkpoint", "Gtid", "Query", "Annotate_rows", "Table_map",
                "Write_rows_v1", "Update_rows_v1", "Delete_rows_v1", "Xid", "Rotate"} <= types
        size = (master.binlog_dir / first).stat().st_size
        for sql in ("SHOW BINLOG EVENTS IN 'nope.000001'", f"SHOW BINLOG EVENTS IN '{first}' FROM 5",
                    f"SHOW BINLOG EVENTS IN '{first}' FROM {size + 1}"):
            assert error(listen, sql) == error_as_root(master.port, sql), sql
        # The current file only up to the horizon: what the relay lists ends where SHOW MASTER STATUS says.
        horizon = rows(listen, "SHOW MASTER STATUS")[0]
        listed = rows(listen, f"SHOW BINLOG EVENTS IN '{horizon[0]}'")
        assert listed[-1][4] == int(horizon[1])
    finally:
        relay.stop()


def error_as_root(port: int, sql: str) -> tuple:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="root", password="")
    try:
        with pytest.raises(pymysql.MySQLError) as info:
            conn.cursor().execute(sql)
        return info.value.args
    finally:
        conn.close()


def test_mysql_corpus_file_served_lists_mysql_type_names(corpus_dir: Path, tmp_path: Path) -> None:
    directory = copy_files(corpus_dir, [MYSQL_FILE], tmp_path / "binlogs")
    name = Path(MYSQL_FILE).name
    scanned: list = []
    scan_file(directory / name, track_gtids=False, on_event=scanned.append)
    with served(directory, "--show-binlog-events-max-rows", "4") as relay:
        def show(sql: str) -> list[tuple]:
            conn = pymysql.connect(host="127.0.0.1", port=relay.port, user="repl", password="servepw")
            try:
                cur = conn.cursor()
                cur.execute(sql)
                assert [d[0] for d in cur.description] == ["Log_name", "Pos", "Event_type", "Server_id",
                                                           "End_log_pos", "Info"]
                return [tuple(r) for r in cur.fetchall()]
            finally:
                conn.close()

        listed: list[tuple] = []
        position = 4
        while True:  # paged by the row cap (4), as a client pages with FROM
            page = show(f"SHOW BINLOG EVENTS IN '{name}' FROM {position}")
            assert len(page) <= 4
            listed += page
            if len(page) < 4:
                break
            position = page[-1][4]
        assert show(f"SHOW BINLOG EVENTS IN '{name}' LIMIT 100") == listed[:4]  # LIMIT above the cap: the cap
    assert [(r[0], r[1], r[3], r[4]) for r in listed] == [(name, e.offset, e.server_id, e.end) for e in scanned]
    assert len(listed) == 22  # the manifest's count for this file
    by_type = [r[2] for r in listed]
    assert by_type[:3] == ["Format_desc", "Previous_gtids", "Gtid"]
    assert {"Query", "Table_map", "Write_rows", "Update_rows", "Xid", "Stop"} <= set(by_type)
    info = {r[2]: r[5] for r in listed}
    assert info["Format_desc"] == "Server ver: 8.0.26, Binlog ver: 4"
    assert info["Gtid"].startswith("SET @@SESSION.GTID_NEXT= '") and info["Gtid"].endswith("'")
    assert info["Xid"].startswith("COMMIT /* xid=") and info["Table_map"].startswith("table_id: ")
    assert [r for r in listed if r[2] == "Write_rows"][0][5].endswith("flags: STMT_END_F")
