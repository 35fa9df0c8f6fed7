"""`relayproxy find` and `relayproxy index` on a relay directory: answers, exit codes, the zone assumed, JSON, and
`index` refused while a relay holds the directory."""

from __future__ import annotations

import json
import subprocess
import sys

from relayproxy.commands import cli
from relayproxy.relay import RelayStore
from relayproxy.relay import txindex as T

from ..relay.test_relay_store import Feeder
from ..support.txgen import oltp_file


def _relay(tmp_path, n=(300, 200)):
    relay = tmp_path / "relay"
    store = RelayStore.open(relay)
    seq = 1
    for k, count in enumerate(n):
        image, _ = oltp_file(count, rotate_to=None if k == len(n) - 1 else f"binlog.00000{k + 2}", start_seq=seq,
                             seed=k, start_us=1_700_000_000_000_000 + k * 10_000_000_000)
        store.start_file(f"binlog.00000{k + 1}")
        Feeder(store).feed_all(image)
        seq += count
    store.close()
    return relay


def test_find_by_gtid_time_and_table(tmp_path, capsys):
    relay = _relay(tmp_path)
    assert cli.main(["find", "--relay-dir", str(relay), "--gtid", "0-1-350", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0]["file"] == "binlog.000002" and out[0]["gtid"] == "0-1-350" and out[0]["second_resolution"]
    assert cli.main(["find", "--relay-dir", str(relay), "--gtid", "0-1-9999"]) == 1
    err = capsys.readouterr().err
    assert "not found" in err and "history starts at binlog.000001" in err and "0-1-500" in err
    assert cli.main(["find", "--relay-dir", str(relay), "--gtid", "zz"]) == 2
    assert "bad GTID" in capsys.readouterr().err
    t = T.format_time_utc(out[0]["commit_us"])
    assert cli.main(["find", "--relay-dir", str(relay), "--time", t, "--time-zone", "UTC"]) == 0
    captured = capsys.readouterr()
    assert "read in UTC" in captured.err and "binlog.000002" in captured.out
    assert cli.main(["find", "--relay-dir", str(relay), "--time", t + "Z"]) == 0
    assert "has no zone" not in capsys.readouterr().err
    assert cli.main(["find", "--relay-dir", str(relay), "--time", "2023-01-01 00:00:00"]) == 0
    assert "local zone" in capsys.readouterr().err
    assert cli.main(["find", "--relay-dir", str(relay), "--time", "soon"]) == 2
    assert cli.main(["find", "--relay-dir", str(relay), "--time", t, "--time-zone", "Nowhere/None"]) == 2
    assert cli.main(["find", "--relay-dir", str(relay), "--table", "app.t1", "--from", "2000-01-01 00:00:00Z",
                     "--to", "2100-01-01 00:00:00Z", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) > 20 and all("app.t1" in r["tables"] for r in rows)
    assert cli.main(["find", "--relay-dir", str(relay), "--table", "app.t1"]) == 2
    assert cli.main(["find", "--relay-dir", str(tmp_path / "none"), "--gtid", "0-1-1"]) == 2


def test_index_rebuilds_and_is_refused_while_a_relay_holds_the_directory(tmp_path, capsys):
    relay = _relay(tmp_path)
    for name in ("binlog.000001", "binlog.000002"):
        T.remove(relay, name)
    assert cli.main(["index", "--relay-dir", str(relay), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["file"], r["action"], r["transactions"]) for r in rows] == [
        ("binlog.000001", "built", 300), ("binlog.000002", "built", 200)]
    assert all(r["ratio"] < 0.05 for r in rows)
    assert T.load(relay, "binlog.000001")[0].footer is not None
    assert T.load(relay, "binlog.000002")[0].footer is None  # the newest file stays open
    assert cli.main(["index", "--relay-dir", str(relay), "--rebuild", "--file", "binlog.000001"]) == 0
    assert "binlog.000001: rebuilt, 300 transactions" in capsys.readouterr().out
    assert cli.main(["index", "--relay-dir", str(relay), "--file", "nope"]) == 2
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'4242\\n'); print('ok', flush=True); time.sleep(60)"),
        str(relay / "relayproxy.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        assert cli.main(["index", "--relay-dir", str(relay)]) == 1
        assert "in use by a running relay (pid 4242)" in capsys.readouterr().err
        assert cli.main(["find", "--relay-dir", str(relay), "--gtid", "0-1-1"]) == 0  # find only reads
    finally:
        holder.kill()
        holder.wait()


def test_find_help_documents_the_exit_codes(capsys):
    try:
        cli.main(["find", "--help"])
    except SystemExit:
        pass
    out = capsys.readouterr().out
    assert "0 found, 1 not found" in out and "2 bad input" in out
