"""The recovery checkpoint (relay/checkpoint.py): recovery from a checkpoint equals the full scan, on real streams
cut anywhere; a checkpoint that does not verify is never trusted; kill -9 at every step of writing it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayproxy.binlog import constants as C
from relayproxy.binlog.reader import scan_bytes
from relayproxy.relay import RelayStore
from relayproxy.relay import checkpoint as CP
from relayproxy.relay import durable as DU
from relayproxy.relay import layout as LA
from relayproxy.relay import recovery as R
from relayproxy.relay import sync as SY
from relayproxy.relay.errors import RelayRecoveryError

from .test_relay_store import Feeder, split_events

MARIA = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0"
STREAMS = {
    "mariadb": [f"{MARIA}/mariadb-repl-bin.{n:06d}" for n in (4, 5)],
    "mysql-gtid": ["zalora-binlog-parser/data/gtid-fixtures/mysql-bin.01"],
    "mysql": ["zendesk-maxwell/src/test/resources/sql/replay/binlog.000004"],
    "mysql-no-checksum": ["shyiko-mysql-binlog-connector-java/src/test/resources/mysql-bin.checksum-none"],
}


def as_sent(data: bytes) -> bytes:
    """The file as the master sends it: the FDE's in-use flag cleared (the CRC was computed with it clear)."""
    flags = struct.unpack_from("<H", data, 4 + 17)[0]
    if flags & C.LOG_EVENT_BINLOG_IN_USE_F:
        data = data[:21] + struct.pack("<H", flags & ~C.LOG_EVENT_BINLOG_IN_USE_F) + data[23:]
    return data


def stream_through_store(relay: Path, files: list[tuple[str, bytes]], monkeypatch) -> list[bytes]:
    """Write ``files`` through a store that checkpoints at every sync; returns every checkpoint record written."""
    records: list[bytes] = []
    real = SY.write_file_atomically

    def keep(path, data, **kw):
        if Path(path).name == CP.CHECKPOINT_NAME:
            records.append(bytes(data))
        return real(path, data, **kw)

    monkeypatch.setattr(SY, "write_file_atomically", keep)
    store = RelayStore.open(relay)
    store.checkpoint_bytes = 0
    for name, data in files:
        store.start_file(name)
        Feeder(store).feed_all(data)
    store.close()
    monkeypatch.setattr(SY, "write_file_atomically", real)
    return records


# A set event's decoding error names an offset into the scanner's buffer, which depends on where the reads began
# (already so between two full scans with different chunk sizes): not part of what recovery decides.
_BUFFER_OFFSET = re.compile(r"(PREVIOUS_GTIDS|GTID_LIST): at offset \d+:")


def outcome(relay: Path, *, use_checkpoint: bool):
    """What recovery makes of a directory: the state the store resumes from, and the files after it."""
    try:
        st_ = R.recover(relay, use_checkpoint=use_checkpoint)
    except RelayRecoveryError as exc:
        return ("refused", str(exc).replace(os.fspath(relay), "<dir>"), exc.file, exc.offset), None
    rep = st_.report
    files = {name: (relay / name).read_bytes() for name in st_.files}
    scan = rep.scan
    return (
        st_.files, st_.current_file, st_.end, st_.gtids, None if st_.fde is None else st_.fde.checksum_alg,
        st_.start_set_seen, st_.file_start_gtids, st_.flavour, st_.join_extra_gtids, rep.truncated_bytes,
        rep.truncated_file, rep.horizon, [_BUFFER_OFFSET.sub(r"\1: at offset N:", w) for w in rep.warnings], None if scan is None else (scan.good_end, scan.good_end_type),
        files,
    ), rep


class _Recorded(dict):
    def __repr__(self) -> str:
        return f"<recorded streams {sorted(self)}>"


@pytest.fixture(scope="module")
def recorded(corpus_dir, tmp_path_factory):
    """Per stream: its files (as sent) and the checkpoint records the store wrote while storing them."""
    out = _Recorded()
    mp = pytest.MonkeyPatch()
    try:
        for kind, relpaths in STREAMS.items():
            files = [(Path(p).name, as_sent((corpus_dir / p).read_bytes())) for p in relpaths]
            relay = tmp_path_factory.mktemp(kind) / "relay"
            records = stream_through_store(relay, files, mp)
            assert records, kind
            out[kind] = (files, records)
    finally:
        mp.undo()
    return out


def test_the_store_checkpoints_at_durable_boundaries_only(recorded):
    for kind, (files, records) in recorded.items():
        images = dict(files)
        for raw in records:
            cp = CP.Checkpoint.decode(raw)
            prefix = scan_bytes(images[cp.file][: cp.offset])
            # a group boundary, and the state a scan finds there
            assert prefix.good_end == cp.offset and not prefix.partial_tail, (kind, cp.offset)
            assert CP.decode_gtids(cp.gtids) == prefix.gtids_after
            assert CP.decode_gtids(cp.start_gtids) == prefix.start_gtids
            assert cp.last_type == prefix.good_end_type
        # the last one, written at close, sits at the end of the stream (before a final ROTATE: a closed file)
        newest, data = files[-1]
        last_offset, last_event = split_events(data)[-1]
        end = last_offset if last_event[4] == C.ROTATE_EVENT else len(data)
        last = CP.Checkpoint.decode(records[-1])
        assert (last.file, last.offset) == (newest, end), kind


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_recovery_from_a_checkpoint_equals_the_full_scan(recorded, tmp_path_factory, data):
    kind = data.draw(st.sampled_from(sorted(recorded)))
    files, records = recorded[kind]
    record = records[data.draw(st.integers(0, len(records) - 1))]
    newest, image = files[-1]
    cut = data.draw(st.integers(4, len(image)))
    tail = [b"", bytes(4096), bytes(range(97)) * 3, image[cut : cut + 200][::-1]][data.draw(st.integers(0, 3))]
    mark = data.draw(st.sampled_from([None, "checkpoint", "cut"]))
    base = tmp_path_factory.mktemp("cut")
    dirs = []
    for label in ("with", "without"):
        relay = base / label
        relay.mkdir()
        for name, content in files[:-1]:
            (relay / name).write_bytes(content)
        (relay / newest).write_bytes(image[:cut] + tail)
        DU.write_index(relay, [name for name, _ in files])
        (relay / CP.CHECKPOINT_NAME).write_bytes(record)
        if mark is not None:
            position = CP.Checkpoint.decode(record).offset if mark == "checkpoint" else cut
            (relay / LA.DURABLE_MARK_NAME).write_bytes(DU.encode_durable_mark(newest, position))
        dirs.append(relay)
    with_cp = outcome(dirs[0], use_checkpoint=True)
    full = outcome(dirs[1], use_checkpoint=False)
    assert with_cp[0] == full[0], (kind, cut, len(tail), mark)
    if with_cp[0][0] != "refused":
        cp = CP.Checkpoint.decode(record)
        used = with_cp[1].checkpoint_offset
        if cp.file == newest and cp.offset <= cut:
            assert used == cp.offset, with_cp[1].checkpoint  # a checkpoint inside the intact prefix is used
        else:
            assert used is None, with_cp[1].checkpoint
    shutil.rmtree(base)


def _relay_with_checkpoint(tmp_path, recorded, kind="mysql-gtid"):
    files, records = recorded[kind]
    relay = tmp_path / "relay"
    stream_files = files
    relay.mkdir()
    for name, content in stream_files:
        (relay / name).write_bytes(content)
    DU.write_index(relay, [name for name, _ in stream_files])
    (relay / CP.CHECKPOINT_NAME).write_bytes(records[-1])
    return relay, files


@pytest.mark.parametrize(
    "damage",
    ["torn", "flipped", "other-file", "shorter-file", "bytes-before-changed", "fde-changed", "epoch", "garbage"],
)
def test_a_checkpoint_that_does_not_verify_falls_back_to_the_full_scan(tmp_path, recorded, damage):
    relay, files = _relay_with_checkpoint(tmp_path, recorded)
    newest, image = files[-1]
    path = relay / CP.CHECKPOINT_NAME
    raw = path.read_bytes()
    cp = CP.Checkpoint.decode(raw)
    expected_reason = {
        "torn": "damaged", "flipped": "damaged", "other-file": "is for", "shorter-file": "fewer than",
        "bytes-before-changed": "CRC32 differs", "fde-changed": "FORMAT_DESCRIPTION", "epoch": "epoch",
        "garbage": "damaged",
    }[damage]
    if damage == "torn":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped":
        at = raw.index(b'"offset"') + 12
        path.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :])
    elif damage == "other-file":
        path.write_bytes(CP.Checkpoint(**{**cp.__dict__, "file": "binlog.999999"}).encode())
    elif damage == "shorter-file":
        cut = max(o for o, _ in split_events(image) if o < cp.offset)
        (relay / newest).write_bytes(image[:cut])
    elif damage == "bytes-before-changed":
        # same size, a different transaction before the checkpoint (a file replaced by another master's)
        at = cp.offset - 40
        (relay / newest).write_bytes(image[:at] + bytes([image[at] ^ 0xFF]) + image[at + 1 :])
    elif damage == "fde-changed":
        path.write_bytes(CP.Checkpoint(**{**cp.__dict__, "fde_crc": cp.fde_crc ^ 1}).encode())
    elif damage == "epoch":
        path.write_bytes(CP.Checkpoint(**{**cp.__dict__, "epoch": 7}).encode())
    else:
        path.write_bytes(os.urandom(300))
    with_cp = outcome(relay, use_checkpoint=True)
    if with_cp[0][0] == "refused":
        # a changed byte inside durable data: the full scan refuses, and so does recovery (never trusted)
        assert damage == "bytes-before-changed"
        return
    report = with_cp[1]
    assert report.checkpoint_offset is None
    assert "scanned whole" in report.checkpoint and expected_reason in report.checkpoint, report.checkpoint
    assert expected_reason in str(report)  # the log line names why


@pytest.mark.parametrize("kind", ["mysql-gtid", "mysql-no-checksum"])
def test_clean_close_leaves_a_checkpoint_at_the_horizon_and_restart_scans_nothing(tmp_path, recorded, kind):
    files, _ = recorded[kind]
    relay = tmp_path / "relay"
    store = RelayStore.open(relay)
    for name, data in files:
        store.start_file(name)
        Feeder(store).feed_all(data)
    horizon = store.horizon.snapshot()
    store.close()
    again = RelayStore.open(relay)
    try:
        assert again.recovery.checkpoint_offset == horizon.position
        assert again.recovery.scan.events == 0  # nothing after the checkpoint was read
        assert again.horizon.snapshot().coordinates == horizon.coordinates
        assert again.horizon.snapshot().gtids == horizon.gtids
    finally:
        again.close()


def test_checkpoints_ride_on_syncs_by_bytes_not_on_every_transaction(tmp_path, recorded, monkeypatch):
    files, _ = recorded["mariadb"]
    writes = []
    real = SY.write_file_atomically
    monkeypatch.setattr(SY, "write_file_atomically", lambda p, d, **kw: (writes.append(Path(p).name), real(p, d, **kw)))
    store = RelayStore.open(tmp_path / "relay")
    store.checkpoint_bytes = 64 << 10
    store.checkpoint_seconds = 3600
    name, data = files[0]
    data = data[: split_events(data)[-1][0]]  # up to its final ROTATE: the file stays open
    store.start_file(name)
    Feeder(store).feed_all(data)
    during = writes.count(CP.CHECKPOINT_NAME)
    store.close()
    # 343 KB in 64 KB steps: a handful, not one per transaction (the file holds hundreds)
    assert 1 <= during <= len(data) // (64 << 10) + 1
    assert writes.count(CP.CHECKPOINT_NAME) == during + 1  # and one at close


def test_serve_reads_a_relay_directory_without_writing_the_checkpoint(tmp_path, recorded):
    from relayproxy.relay.readonly import ReadOnlyBinlogDir, ServeOptions

    relay, files = _relay_with_checkpoint(tmp_path, recorded, "mariadb")
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in relay.iterdir()}
    d = ReadOnlyBinlogDir.open(ServeOptions(binlog_dir=relay))
    try:
        assert d.files() == [name for name, _ in files]
    finally:
        d.close()
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in relay.iterdir()}
    assert after == before


# ---------------------------------------------------------------------------------------------
# kill -9 at every step of writing the checkpoint

STEPS = ["unlink-tmp", "created-tmp", "half-written", "written", "fsynced", "renamed", "dir-fsynced"]

_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from relayproxy.relay import RelayStore, durable as DU, sync as SY, checkpoint as CP
    from tests.relay.test_relay_store import Feeder, split_events

    relay, source, step, nth = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    data = source.read_bytes()
    state = {{"writes": 0, "fd": None, "active": False}}

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    real_unlink, real_open, real_write, real_fsync, real_replace = os.unlink, os.open, os.write, os.fsync, os.replace
    real_fsync_dir = DU.fsync_dir
    real_waf = SY.write_file_atomically

    def waf(path, payload, **kw):
        if Path(path).name == CP.CHECKPOINT_NAME:
            state["writes"] += 1
            state["active"] = state["writes"] == nth
        try:
            return real_waf(path, payload, **kw)
        finally:
            if state["active"] and step == "dir-fsynced":
                die()
            state["active"] = False

    def unlink(p, *a, **kw):
        if state["active"] and step == "unlink-tmp" and Path(p).name == CP.CHECKPOINT_TMP_NAME:
            die()
        return real_unlink(p, *a, **kw)

    def open_(p, *a, **kw):
        fd = real_open(p, *a, **kw)
        if state["active"] and Path(p).name == CP.CHECKPOINT_TMP_NAME:
            state["fd"] = fd
            if step == "created-tmp":
                die()
        return fd

    def write(fd, b):
        if state["active"] and fd == state["fd"] and step == "half-written":
            real_write(fd, bytes(b)[: len(b) // 2])
            die()
        return real_write(fd, b)

    def fsync(fd):
        if state["active"] and fd == state["fd"] and step == "written":
            die()
        r = real_fsync(fd)
        if state["active"] and fd == state["fd"] and step == "fsynced":
            die()
        return r

    def replace(a, b):
        r = real_replace(a, b)
        if state["active"] and Path(b).name == CP.CHECKPOINT_NAME and step == "renamed":
            die()
        return r

    os.unlink, os.open, os.write, os.fsync, os.replace = unlink, open_, write, fsync, replace
    SY.write_file_atomically = waf
    store = RelayStore.open(relay)
    store.checkpoint_bytes = 2000
    store.start_file(source.name)
    Feeder(store).feed_all(data)
    store.close()
    print("finished without the kill", state["writes"])
    sys.exit(3)
    """
)


@pytest.mark.parametrize("nth", [1, 3])
@pytest.mark.parametrize("step", STEPS)
def test_kill9_at_every_step_of_writing_the_checkpoint(tmp_path, recorded, step, nth):
    files, _ = recorded["mysql-gtid"]
    name, image = files[0]
    source = tmp_path / name
    source.write_bytes(image)
    relay = tmp_path / "relay"
    repo = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(repo=repo))
    proc = subprocess.run([sys.executable, str(script), str(relay), str(source), step, str(nth)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    copy = tmp_path / "copy"
    shutil.copytree(relay, copy)
    with_cp = outcome(relay, use_checkpoint=True)
    full = outcome(copy, use_checkpoint=False)
    assert with_cp[0] == full[0]
    assert with_cp[0][0] != "refused"
    # nothing the store had written is lost or altered: the file is a prefix of the stream, at a boundary
    kept = with_cp[0][-1][name]
    assert image.startswith(kept) and len(kept) >= 4
    assert not (relay / CP.CHECKPOINT_TMP_NAME).exists()
    report = with_cp[1]
    if step in ("renamed", "dir-fsynced"):
        assert report.checkpoint_offset is not None  # the new checkpoint was in place
    elif nth == 1:
        assert report.checkpoint_offset is None  # no checkpoint had ever been completed
    else:
        assert report.checkpoint_offset is not None  # the previous one stands
