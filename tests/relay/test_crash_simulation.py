"""An OS crash that loses what was not fsynced, at many points of a real stream (the store in-process, its I/O under
relayproxy/lab/crashfs.py).

The store is fed three consecutive real MariaDB binlogs of the corpus (mariadb-operator, domain 0, files 5 to 7,
with their rotations), as the upstream session feeds it. At a random call among the store's writes, fsyncs, file
creations and renames the simulated OS goes down; the directory is then rewritten as a disk could hold it: only the
synced content ("drop"), everything ("keep"), or per file a random part of the unsynced writes, possibly torn, with a
random part of the unsynced directory operations ("random"). Then:

- the durable mark on that disk never points past what survived of its file, and what is below it is the master's
  bytes (a store that writes its mark before the fsync fails here: the mutation test below runs one);
- reopening recovers a horizon at or past the last one the store published (what replicas may have been sent, what
  a semi-sync ACK confirmed), its GTID set included, and recovery never reports once-durable data gone;
- every relay file is a byte prefix of the master's, all but the newest whole;
- resuming from the recovered horizon ends with files byte-identical to the master's: nothing lost, nothing twice.

Random points come from RELAYPROXY_CRASH_SEED (printed; default fixed) so a failure can be replayed.
"""

from __future__ import annotations

import os
import random
import shutil

import pytest

from relayproxy.lab.crashfs import CrashFS, SimulatedCrash
from relayproxy.relay import durable as DU
from relayproxy.relay import store as S
from relayproxy.relay import sync as SY
from relayproxy.relay.store import RelayStore

from .test_relay_store import Feeder, split_events
from ..scenarios.test_scenario_crash_safety import _feed_from

SEED = int(os.environ.get("RELAYPROXY_CRASH_SEED", "20261121"))
MARIA_CORPUS = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0"
NAMES = [f"mariadb-repl-bin.{n:06d}" for n in (5, 6, 7)]
CRASH_POINTS = 70
MODES = ("drop", "keep", "random")


def _files(corpus_dir) -> list[tuple[str, bytes]]:
    return [(name, (corpus_dir / MARIA_CORPUS / name).read_bytes()) for name in NAMES]


def _feed(store: RelayStore, files, file: str | None = None, position: int = 4) -> None:
    """What the session does, from the horizon ``(file, position)`` on (the master re-sends whole groups)."""
    _feed_from(store, files, file, position)


def _order(files, file: str | None, position: int) -> tuple[int, int]:
    return ([name for name, _ in files].index(file) if file else -1, position)


def _feed_pipelined(store: RelayStore, files) -> None:
    """What the session does with the fsync pipelined (upstream/session.py): a batch ends at each boundary; its
    fsync is begun (begin_sync), the next batch's events are written (each reaches pwrite at once: FLUSH_BYTES is 1
    in the caller), and only then is the ticket published and the next one begun. The fdatasync itself runs, in
    turn, before those writes (so it does not cover them: a store that published them would be caught) or after them
    (as when the fsync thread starts late). One thread, so the crash points are reproducible."""
    ticket = None
    batches = 0
    for name, image in files:
        if store.current_file != name:
            store.start_file(name)  # waits for the ticket in flight and publishes it (relay/store.py)
            ticket = None
        feeder = Feeder(store, sync_each_event=False)
        for offset, event in split_events(image):
            feeder.feed(offset, event)
            if store.boundary_end == offset + len(event):  # a batch ends here
                if ticket is not None:
                    ticket.make_durable()  # a no-op when it already ran (below)
                    store.complete_sync(ticket)
                ticket = store.begin_sync() if store.sync_due() else None
                batches += 1
                if ticket is not None and batches % 2:
                    ticket.make_durable()  # the fsync ends before the next batch is written
    if ticket is not None:
        ticket.make_durable()
        store.complete_sync(ticket)


def _run_until_crash(directory, files, crash_at: int | None, *, pipelined: bool = False):
    """Open a store under CrashFS and feed it; returns (layer, the last horizon it published, or None)."""
    layer = CrashFS(directory, crash_at=crash_at)
    store = None
    with layer:
        try:
            store = RelayStore.open(directory)
            if pipelined:
                _feed_pipelined(store, files)
            else:
                _feed(store, files)
            store.close()
        except SimulatedCrash:
            # The process is dead: so is its background indexer thread (relay/fileindex.py). Stop it while the
            # layer still fails its calls, before the real directory is rewritten as the crash left it.
            indexer = getattr(store, "_indexer", None)
            if indexer is not None:
                indexer.close()
    published = None if store is None else store.horizon.snapshot()
    return layer, published


def _check_after_crash(directory, files, disk: dict[str, bytes], published, what: str) -> tuple:
    images = dict(files)
    # 1. The durable mark that survived never points past what survived of its file.
    mark, problem = DU.read_durable_mark(directory)
    if mark is not None:
        have = disk.get(mark.file)
        assert have is not None, f"{what}: the durable mark {mark} names a file the crash left no trace of"
        assert len(have) >= mark.position, (
            f"{what}: the durable mark {mark.file}:{mark.position} points past what survived the crash "
            f"({len(have)} bytes of {mark.file} on disk)")
        assert have[: mark.position] == images[mark.file][: mark.position], (
            f"{what}: below the durable mark, {mark.file} differs from the master's bytes")
    # 2. Recovery keeps everything published, and never finds once-durable data gone.
    store = RelayStore.open(directory)
    snap = store.horizon.snapshot()
    gone = [w for w in store.recovery.warnings if "durable is gone" in w]
    assert not gone, f"{what}: {gone}"
    if published is not None and published.file is not None:
        assert _order(files, snap.file, snap.position) >= _order(files, published.file, published.position), (
            f"{what}: published {published.coordinates}, recovered only {snap.coordinates}")
        for gtid in published.gtids or ():
            have = None if snap.gtids is None else snap.gtids.get(gtid.domain_id, gtid.server_id)
            assert have is not None and have.seq_no >= gtid.seq_no, (
                f"{what}: published GTID {gtid} is lost after recovery (recovered set {snap.gtids})")
    # 3. Every relay file is a prefix of the master's, all but the newest whole.
    names = DU.read_index(directory) or []
    for i, name in enumerate(names):
        data = (directory / name).read_bytes()
        if i < len(names) - 1:
            assert data == images[name], f"{what}: closed file {name} differs from the master's"
        else:
            assert images[name].startswith(data), f"{what}: {name} is not a prefix of the master's file"
    # 4. Resume from the horizon: byte-identical to the master, once each.
    _feed(store, files, snap.file, snap.position)
    store.close()
    for name, image in files:
        assert (directory / name).read_bytes() == image, f"{what}: {name} differs after resuming"
    assert DU.read_index(directory) == NAMES
    return snap


def _crash_at(tmp_path, files, points, modes, rng) -> list[tuple]:
    """Crash the store at each call of ``points``, recover from each disk of ``modes`` and check the recovery
    (_check_after_crash); returns (point, crashing call, mode, published horizon, recovered horizon) rows."""
    rows = []
    for point in points:
        for i, mode in enumerate(modes):
            d = tmp_path / f"c{point}-{mode}-{i}"
            d.mkdir()
            layer, published = _run_until_crash(d, files, point)
            assert layer.crashed, f"crash point {point} not reached ({layer.calls} calls)"
            disk = layer.materialize(mode, rng)
            what = f"crash at call {point} ({layer.crash_call}), disk {mode!r}"
            snap = _check_after_crash(d, files, disk, published, what)
            rows.append((point, layer.crash_call, mode, published, snap))
            shutil.rmtree(d)
    return rows


@pytest.mark.slow
def test_os_crash_at_random_points_keeps_every_published_transaction(tmp_path, corpus_dir):
    """A clean run first (the layer changes nothing: byte-identical files), then CRASH_POINTS random crash points,
    each recovered from the three disks a crash can leave."""
    files = _files(corpus_dir)
    clean = tmp_path / "clean"
    clean.mkdir()
    layer, _ = _run_until_crash(clean, files, None)
    total = layer.calls
    for name, image in files:
        assert (clean / name).read_bytes() == image
    kinds = {}
    for call in layer.log:
        kinds[call.split()[0]] = kinds.get(call.split()[0], 0) + 1
    print(f"\nrandom points: RELAYPROXY_CRASH_SEED={SEED}; a clean run makes {total} counted calls: {kinds}")
    assert kinds.get("fdatasync", 0) > 100, kinds

    rng = random.Random(f"{SEED}-oscrash")
    points = sorted(rng.sample(range(1, total + 1), CRASH_POINTS))
    rows = _crash_at(tmp_path, files, points, MODES, rng)
    print("call  crashing call                                       disk    published horizon            "
          "recovered horizon")
    for point, call, mode, published, snap in rows:
        pub = "-" if published is None or published.file is None else f"{published.file}:{published.position}"
        rec = "-" if snap.file is None else f"{snap.file}:{snap.position}"
        print(f"{point:5} {call[:50]:50} {mode:7} {pub:28} {rec}")
    gained = sum(1 for *_, p, s in rows if p is not None and p.file is not None
                 and _order(files, s.file, s.position) > _order(files, p.file, p.position))
    print(f"{len(rows)} crashes recovered; {gained} recovered past the published horizon (complete groups that were"
          f" written, and survived, but not yet published); none lost a published transaction")


@pytest.mark.slow
def test_os_crash_with_the_fsync_pipelined_keeps_every_published_transaction(tmp_path, corpus_dir, monkeypatch):
    """As above, with the fsync of each batch overlapping the writes of the next (the session's pipeline): a crash
    at any call, between a batch's begin_sync and its fdatasync included, loses no published transaction."""
    monkeypatch.setattr(S, "FLUSH_BYTES", 1)  # every event is pwritten when it arrives, before the fsync in flight
    files = _files(corpus_dir)
    clean = tmp_path / "clean"
    clean.mkdir()
    layer, _ = _run_until_crash(clean, files, None, pipelined=True)
    total = layer.calls
    for name, image in files:
        assert (clean / name).read_bytes() == image
    assert sum(c.startswith("fdatasync") for c in layer.log) > 100
    rng = random.Random(f"{SEED}-pipelined")
    points = sorted(rng.sample(range(1, total + 1), CRASH_POINTS // 2))
    between = 0  # crashes at an event's write: with FLUSH_BYTES 1 these all follow a begun, not completed fsync
    for point in points:
        for mode in MODES:
            d = tmp_path / f"p{point}-{mode}"
            d.mkdir()
            layer, published = _run_until_crash(d, files, point, pipelined=True)
            assert layer.crashed, f"crash point {point} not reached ({layer.calls} calls)"
            disk = layer.materialize(mode, rng)
            _check_after_crash(d, files, disk, published, f"pipelined, crash at call {point} ({layer.crash_call}), "
                               f"disk {mode!r}")
            between += layer.crash_call.startswith("pwrite")
            shutil.rmtree(d)
    assert between > 0, "no crash point fell on an event's write"


def test_a_store_that_writes_its_durable_mark_before_the_fsync_fails_the_os_crash_test(tmp_path, corpus_dir,
                                                                                        monkeypatch):
    """The mutation the test above exists to catch (README, failure 4): a store that records its durable mark
    before the fdatasync of the data it names. The same feeding, crash points and checks, on such a store: a crash
    at a data fdatasync can leave the new mark on disk without the bytes it names, and the check must say so."""
    make_durable = SY.SyncTicket._make_durable

    def mark_before_fsync(ticket):
        if ticket.moves:
            ticket._marks.write(ticket.file, ticket.position)  # the mutation: the mark before the fdatasync
        make_durable(ticket)

    monkeypatch.setattr(SY.SyncTicket, "_make_durable", mark_before_fsync)
    files = _files(corpus_dir)
    clean = tmp_path / "clean"
    clean.mkdir()
    layer, _ = _run_until_crash(clean, files, None)
    # The crash points: the data fdatasyncs (those of relay files, after the mark was written), as the random points
    # of the test above fall on them; each recovered from several random disks and the two fixed ones.
    fsyncs = [n for n, call in enumerate(layer.log, 1) if call.startswith("fdatasync mariadb-repl-bin.")]
    assert len(fsyncs) > 100, layer.log[:20]
    rng = random.Random(f"{SEED}-mark-before-fsync")
    points = sorted(rng.sample(fsyncs, 12))
    with pytest.raises(AssertionError, match="points past what survived|differs from the master's bytes"):
        _crash_at(tmp_path, files, points, ("drop", "keep") + ("random",) * 6, rng)
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_crashfs_keeps_only_what_was_synced(tmp_path):
    """The model itself: unsynced writes, a creation and a rename without a directory fsync do not survive "drop";
    a torn write keeps a prefix; "keep" is the files as they were."""
    (tmp_path / "old").write_bytes(b"old content")
    layer = CrashFS(tmp_path, crash_at=None)
    with layer:
        fd = os.open(tmp_path / "a", os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(fd, b"synced", 0)
        os.fsync(fd)
        os.pwrite(fd, b"-unsynced", 6)
        dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(dfd)  # "a" is now a durable entry
        fd2 = os.open(tmp_path / "new.tmp", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd2, b"new")
        os.fsync(fd2)
        os.replace(tmp_path / "new.tmp", tmp_path / "old")  # no directory fsync after it
        os.close(fd2)
    assert layer.disk_after_crash("drop") == {"old": b"old content", "a": b"synced"}
    assert layer.disk_after_crash("keep") == {"old": b"new", "a": b"synced-unsynced"}
    rng = random.Random(1)
    seen = {layer.disk_after_crash("random", rng)["a"] for _ in range(200)}
    assert b"synced" in seen and b"synced-unsynced" in seen
    assert all(b"synced-unsynced".startswith(v) and v.startswith(b"synced") for v in seen), seen
    assert len(seen) > 2, "no torn write was ever chosen"
    disk = layer.materialize("drop")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == disk  # and the dead process's fds are closed


def test_crashfs_crash_stops_everything_after_it(tmp_path):
    layer = CrashFS(tmp_path, crash_at=2)
    with layer:
        fd = os.open(tmp_path / "a", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, b"x", 0)
        except SimulatedCrash as exc:
            assert "crash at call 2: pwrite a@0+1" in str(exc)
        else:
            raise AssertionError("no crash at call 2")
        try:
            os.fsync(fd)
        except SimulatedCrash:
            pass
        else:
            raise AssertionError("a call after the crash went through")
    assert layer.crash_call == "pwrite a@0+1" and layer.calls == 2
    assert (tmp_path / "a").read_bytes() == b""
    layer.close_all()
