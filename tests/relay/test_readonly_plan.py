"""One place decides what a file list, a horizon and gtid_purged mean (relay/recovery.py's plan_recovery).

The same directory opened by the relay (``RelayStore.open``: recovery's plan, applied) and by
``relayproxy serve`` (``ReadOnlyBinlogDir.open``: the same plan, only read) yields the same files, horizon
and purged set; and the read-only open writes nothing, not even what the relay would repair.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from relayproxy.relay import RelayStore
from relayproxy.relay.catalog import FileCatalog
from relayproxy.relay.durable import write_index
from relayproxy.relay.epochs import EPOCHS_TMP_NAME, read_epochs
from relayproxy.relay.layout import INDEX_TMP_NAME
from relayproxy.relay.readonly import ReadOnlyBinlogDir, ServeOptions
from relayproxy.relay.recovery import PARTIAL, plan_recovery

from .test_relay_epochs import failover_run, mysql_parts
from ..commands.test_serve import MARIA_DIR, MARIA_FILES, MYSQL_GTID_FILES, _cut_inside_last_group, copy_files


def _view(store) -> tuple:
    snap = store.horizon.snapshot()
    purged = FileCatalog(store).purged()
    return store.files(), snap.coordinates, snap.text, None if purged is None else str(purged)


def _both(directory: Path, tmp_path: Path) -> tuple[tuple, tuple]:
    """(what serve sees, what the relay sees) of the same directory (the relay opens a copy: it may cut)."""
    served = _view(ReadOnlyBinlogDir.open(ServeOptions(binlog_dir=directory)))
    copy = tmp_path / f"{directory.name}-relay"
    shutil.copytree(directory, copy)
    store = RelayStore.open(copy, create=False)
    try:
        return served, _view(store)
    finally:
        store.close()


def _state(directory: Path) -> dict:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_mode) for p in sorted(directory.iterdir())}


def _relay_dir_of(corpus_dir: Path, relative: list[str], into: Path) -> Path:
    d = copy_files(corpus_dir, relative, into)
    write_index(d, [Path(r).name for r in relative])
    return d


def test_mariadb_files_mean_the_same_to_the_relay_and_to_serve(corpus_dir, tmp_path):
    d = _relay_dir_of(corpus_dir, [f"{MARIA_DIR}/{n}" for n in MARIA_FILES], tmp_path / "maria")
    served, relay = _both(d, tmp_path)
    assert served == relay
    assert served[0] == MARIA_FILES


def test_a_partial_tail_means_the_same_and_serve_does_not_cut_it(corpus_dir, tmp_path):
    d = _relay_dir_of(corpus_dir, [f"{MARIA_DIR}/{n}" for n in MARIA_FILES[:2]], tmp_path / "cut")
    boundary = _cut_inside_last_group(d / MARIA_FILES[1])
    size = (d / MARIA_FILES[1]).stat().st_size
    assert boundary < size
    plan = plan_recovery(d, MARIA_FILES[:2], epochs=read_epochs(d))
    assert plan.tail.kind == PARTIAL and plan.horizon[:2] == (MARIA_FILES[1], boundary)
    served, relay = _both(d, tmp_path)
    assert served == relay
    assert served[1] == (MARIA_FILES[1], boundary)
    assert (d / MARIA_FILES[1]).stat().st_size == size  # the relay's copy was cut, the served one not
    assert (tmp_path / "cut-relay" / MARIA_FILES[1]).stat().st_size == boundary


def test_mysql_gtid_file_means_the_same_to_the_relay_and_to_serve(corpus_dir, tmp_path):
    d = _relay_dir_of(corpus_dir, MYSQL_GTID_FILES[:1], tmp_path / "mysql")
    served, relay = _both(d, tmp_path)
    assert served == relay and served[2] is not None


def test_two_upstream_epochs_mean_the_same_to_the_relay_and_to_serve(corpus_dir, tmp_path):
    p = mysql_parts(corpus_dir)
    store, _receiver = failover_run(tmp_path / "epochs", p)
    store.close()
    d = tmp_path / "epochs"
    assert (d / "relayproxy.epochs").exists()
    served_store = ReadOnlyBinlogDir.open(ServeOptions(binlog_dir=d))
    assert served_store.epochs == read_epochs(d) and not served_store.epochs.implicit
    served, relay = _both(d, tmp_path)
    assert served == relay
    # and with the join file cut inside a group, as a crash leaves it
    cut = tmp_path / "epochs-cut"
    shutil.copytree(d, cut)
    newest = relay[0][-1]
    with open(cut / newest, "r+b") as f:
        f.truncate((cut / newest).stat().st_size - 7)
    served, relay = _both(cut, tmp_path)
    assert served == relay


def test_the_read_only_open_writes_nothing_the_relay_would_repair(corpus_dir, tmp_path):
    d = _relay_dir_of(corpus_dir, [f"{MARIA_DIR}/{n}" for n in MARIA_FILES[:2]], tmp_path / "ro")
    _cut_inside_last_group(d / MARIA_FILES[1])  # the relay would cut it
    (d / MARIA_FILES[2]).write_bytes(b"\xfeb")  # created, never listed, half a magic: the relay would adopt it
    (d / INDEX_TMP_NAME).write_bytes(b"junk\n")  # the relay would remove these
    (d / EPOCHS_TMP_NAME).write_bytes(b"{")
    d.chmod(0o755)
    before = _state(d)
    store = ReadOnlyBinlogDir.open(ServeOptions(binlog_dir=d, follow=True))
    store.refresh()
    FileCatalog(store).purged()
    store.close()
    assert _state(d) == before
    # the relay, given the same directory, does change it
    relay = tmp_path / "ro-relay"
    shutil.copytree(d, relay)
    RelayStore.open(relay, create=False).close()
    assert _state(relay) != before
