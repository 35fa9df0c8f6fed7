"""SHOW RELAYPROXY TRANSACTION[S] on the SQL port (downstream/sql/transactions.py), against `relayproxy serve`
(read-only: the files scanned, no sidecar written): the four statements, their columns, empty answers, and the
errors for a bad GTID, time, table or position."""

from __future__ import annotations

import pymysql
import pytest

from relayproxy.relay import txindex as T

from ..commands.test_serve import served
from ..support.txgen import oltp_file

COLUMNS = ["File", "Start_pos", "End_pos", "Gtid", "Commit_time", "Commit_us", "Second_resolution", "Tables"]


def query(port: int, sql: str):
    conn = pymysql.connect(host="127.0.0.1", port=port, user="repl", password="servepw")
    try:
        cur = conn.cursor()
        cur.execute(sql)
        return [d[0] for d in cur.description], [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


def error(port: int, sql: str) -> tuple:
    conn = pymysql.connect(host="127.0.0.1", port=port, user="repl", password="servepw")
    try:
        with pytest.raises(pymysql.MySQLError) as info:
            conn.cursor().execute(sql)
        return info.value.args
    finally:
        conn.close()


def test_show_relayproxy_transactions_on_serve(tmp_path):
    d = tmp_path / "binlogs"
    d.mkdir()
    first, facts1 = oltp_file(400, flavour="mysql", rotate_to="binlog.000002", rate=100.0)
    second, facts2 = oltp_file(300, flavour="mysql", start_seq=401, start_us=facts1[-1]["commit_us"], rate=100.0,
                               seed=2)
    (d / "binlog.000001").write_bytes(first)
    (d / "binlog.000002").write_bytes(second)
    index = T.TransactionIndex(d, lambda: ["binlog.000001", "binlog.000002"],
                               lambda: ("binlog.000002", len(second)))
    txs = index.transactions("binlog.000001") + index.transactions("binlog.000002")
    uuid = T._fmt_uuid(bytes(range(16)))
    with served(d) as relay:
        cols, rows = query(relay.port, f"SHOW RELAYPROXY TRANSACTION FOR GTID '{uuid}:450'")
        t = txs[449]
        assert cols == COLUMNS
        assert rows == [("binlog.000002", t.start, t.end, f"{uuid}:450", T.format_time_utc(t.commit_us), t.commit_us,
                         0, ",".join(t.tables))]
        assert query(relay.port, f"SHOW RELAYPROXY TRANSACTION FOR GTID '{uuid}:9999'") == (COLUMNS, [])
        at = T.format_time_utc(txs[200].commit_us)
        cols, rows = query(relay.port, f"show relayproxy transaction at time '{at}'")
        assert rows[0][3] == txs[200].gtid
        cols, rows = query(relay.port, f"SHOW RELAYPROXY TRANSACTION AT TIME '{at}+01:00'")  # an hour earlier
        assert rows[0][3] == txs[0].gtid
        assert query(relay.port, "SHOW RELAYPROXY TRANSACTION AT TIME '2999-01-01 00:00:00'") == (COLUMNS, [])
        lo, hi = T.format_time_utc(txs[100].commit_us), T.format_time_utc(txs[600].commit_us)
        want = [t for t in txs if "app.t2" in t.tables and txs[100].commit_us <= t.commit_us <= txs[600].commit_us]
        cols, rows = query(relay.port, f"SHOW RELAYPROXY TRANSACTIONS FOR TABLE 'app.t2' FROM '{lo}' TO '{hi}'")
        assert [r[3] for r in rows] == [t.gtid for t in want] and len(rows) > 10
        cols, rows = query(relay.port, f"SHOW RELAYPROXY TRANSACTIONS FOR TABLE 'app.t2' FROM '{lo}' TO '{hi}' "
                                       "LIMIT 3")
        assert [r[3] for r in rows] == [t.gtid for t in want[:3]]
        cols, rows = query(relay.port, f"SHOW RELAYPROXY TRANSACTIONS BETWEEN 'binlog.000001' {txs[10].start} "
                                       f"AND 'binlog.000002' {txs[409].end}")
        assert cols == ["Transactions", "Bytes", "First_file", "Last_file", "Files"]
        assert rows == [(400, sum(t.end - t.start for t in txs[10:410]), "binlog.000001", "binlog.000002",
                         "binlog.000001,binlog.000002")]
        for sql, what in ((("SHOW RELAYPROXY TRANSACTION FOR GTID 'nope'"), "bad GTID"),
                          ("SHOW RELAYPROXY TRANSACTION AT TIME 'yesterday'", "bad time"),
                          ("SHOW RELAYPROXY TRANSACTIONS FOR TABLE 't2' FROM '2024-01-01 00:00:00' TO "
                           "'2024-01-02 00:00:00'", "db.table"),
                          ("SHOW RELAYPROXY TRANSACTIONS BETWEEN 'nope.000001' 4 AND 'binlog.000002' 4",
                           "not a relay file")):
            code, message = error(relay.port, sql)
            assert code == 1210 and what in message, (sql, message)
        assert error(relay.port, "SHOW RELAYPROXY TRANSACTION NEAR 'x'")[0] == 1064
    assert sorted(p.name for p in d.iterdir()) == ["binlog.000001", "binlog.000002"]  # serve wrote nothing
