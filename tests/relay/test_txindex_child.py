"""The transaction indexer in a child process (relay/txindex_child.py): the same index as the thread builds, a
child that dies is replaced, and none outlives the relay process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from relayproxy.relay import RelayStore
from relayproxy.relay import txindex as T
from relayproxy.relay.txindex_child import TxIndexProcess

from ..support.txgen import oltp_file
from .test_relay_store import Feeder

NAMES = ("binlog.000001", "binlog.000002", "binlog.000003")


def _fill(store: RelayStore) -> None:
    for k, name in enumerate(NAMES):
        image, _ = oltp_file(1200, rotate_to=None if k == 2 else NAMES[k + 1], start_seq=1 + 1200 * k, seed=k)
        store.start_file(name)
        Feeder(store).feed_all(image)


def _index(idx: T.TransactionIndex) -> dict[str, list]:
    return {name: [(t.start, t.end, t.gtid, t.commit_us) for t in idx.transactions(name)] for name in NAMES}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_child_builds_the_index_the_thread_builds(tmp_path):
    results = {}
    for mode in (False, True):
        relay = tmp_path / f"relay-{mode}"
        store = RelayStore.open(relay, txindex_in_child=mode)
        try:
            assert isinstance(store._txindexer, TxIndexProcess) is mode
            _fill(store)
            assert store._txindexer.wait_idle()
            for name in NAMES[:2]:  # closed: finished sidecars, each transaction once
                side, why = T.load(relay, name)
                assert why is None and side.footer is not None and side.transactions == 1200, (mode, name)
            assert store.transaction_index.by_gtid("0-1-3600").file == "binlog.000003"
            health = store.txindex_health()
            assert health["mode"] == ("child" if mode else "thread") and health["errors"] == 0, health
            assert health["files_finished"] == 2 and health["passes"] >= 2 and health["last_error"] is None
            assert not mode or (health["child_starts"] == 1 and health["child_pid"] == store._txindexer._proc.pid)
            results[mode] = _index(store.transaction_index)
        finally:
            store.close()
    assert results[True] == results[False]
    assert [len(v) for v in results[True].values()] == [1200, 1200, 1200]


def test_a_child_that_dies_is_replaced_and_close_stops_it(tmp_path):
    relay = tmp_path / "relay"
    store = RelayStore.open(relay, txindex_in_child=True)
    indexer = store._txindexer
    try:
        assert indexer.wait_idle()
        first = indexer._proc.pid
        os.kill(first, signal.SIGKILL)
        _fill(store)
        assert indexer.wait_idle(), indexer.errors
        assert indexer.starts == 2 and indexer._proc.pid != first
        assert any("exited with status -9" in e for e in indexer.errors)
        assert store.txindex_health()["child_starts"] == 2 and store.txindex_health()["errors"] >= 1
        side, why = T.load(relay, "binlog.000002")
        assert why is None and side.footer is not None and side.transactions == 1200
        second = indexer._proc.pid
    finally:
        store.close()
    assert not _alive(second)
    assert not _alive(first)


def test_the_child_does_not_outlive_the_relay_process(tmp_path):
    relay = tmp_path / "relay"
    script = textwrap.dedent(f"""
        import sys, time
        from relayproxy.relay import RelayStore
        store = RelayStore.open({str(relay)!r}, txindex_in_child=True)
        assert store._txindexer.wait_idle()
        print(store._txindexer._proc.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()  # kill -9: no close(), no stdin closed on purpose
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        parent.kill()
