"""Closed relay files stored compressed / encrypted / archived: the framed format, the reader, the conversion
steps, their crash safety (kill -9 at every step), and the relay's readers going through them."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayproxy.binlog import constants as C
from relayproxy.binlog.gtid import GtidSet
from relayproxy.binlog.reader import scan_file
from relayproxy.relay import closed_files as CF
from relayproxy.relay import conversion as CV
from relayproxy.relay.catalog import FileCatalog
from relayproxy.relay.closed_files import Keyring, StoredFileError
from relayproxy.relay.retention import file_states
from relayproxy.relay.store import RelayStore

from ..support import eventgen as E

KEY1 = "1:" + "11" * 32
KEY2 = "2:" + "22" * 32
RING = Keyring.parse(f"{KEY1}\n{KEY2}\n", "test keys")
MODES = {
    "zstd": dict(compress="zstd"),
    "aes": dict(encrypt=True, keyring=RING),
    "zstd+aes": dict(compress="zstd", encrypt=True, keyring=RING),
}


def framed(tmp_path: Path, data: bytes, frame_size: int, mode: str, name: str = "bin.000001") -> Path:
    src = tmp_path / name
    src.write_bytes(data)
    dst = tmp_path / (name + CF.SUFFIX)
    if dst.exists():
        dst.unlink()
    CV.write_framed(src, dst, name, CV.StorageOptions(frame_size=frame_size, **MODES[mode]))
    return dst


def read_all(path: Path, name: str = "bin.000001", keyring=RING) -> bytes:
    with CF.open_stored(path, name=name, keyring=keyring) as f:
        return f.read(0, f.size())


# ---------------------------------------------------------------------------------------------
# The format: random data, frame sizes and read ranges


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=0, max_size=20000), frame_size=st.integers(1, 5000),
       mode=st.sampled_from(sorted(MODES)), reads=st.lists(st.tuples(st.integers(0, 21000), st.integers(0, 9000)),
                                                          max_size=12))
def test_random_reads_equal_the_original(tmp_path_factory, data, frame_size, mode, reads):
    tmp = tmp_path_factory.mktemp("fmt")
    path = framed(tmp, data, frame_size, mode)
    with CF.open_stored(path, name="bin.000001", keyring=RING) as f:
        assert f.size() == len(data)
        assert f.read(0, len(data)) == data
        for pos, n in reads:
            assert f.read(pos, n) == data[pos : pos + n]
    with CF.open_stored(path, name="bin.000001", keyring=RING).stream() as s:
        assert s.read() == data
        if data:
            s.seek(len(data) // 2)
            assert s.read(7) == data[len(data) // 2 : len(data) // 2 + 7]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), mode=st.sampled_from(sorted(MODES)), frame_size=st.integers(64, 3000))
def test_a_flipped_bit_anywhere_is_detected(tmp_path_factory, seed, mode, frame_size):
    rnd = random.Random(seed)
    data = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 6000))) + b"abc" * rnd.randint(0, 2000)
    path = framed(tmp_path_factory.mktemp("flip"), data, frame_size, mode)
    raw = bytearray(path.read_bytes())
    bit = rnd.randrange(len(raw) * 8)
    raw[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(raw)
    with pytest.raises(StoredFileError) as info:
        read_all(path)
    assert str(path) in str(info.value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), mode=st.sampled_from(sorted(MODES)))
def test_truncation_is_detected(tmp_path_factory, seed, mode):
    rnd = random.Random(seed)
    data = rnd.randbytes(rnd.randint(1, 9000))
    path = framed(tmp_path_factory.mktemp("cut"), data, rnd.randint(16, 2000), mode)
    raw = path.read_bytes()
    path.write_bytes(raw[: rnd.randrange(len(raw))])
    with pytest.raises(StoredFileError):
        read_all(path)


def test_a_damaged_frame_is_named_and_the_others_still_read(tmp_path):
    data = os.urandom(10000)
    path = framed(tmp_path, data, 1000, "zstd")
    with CF.open_stored(path, name="bin.000001") as f:
        at, length = f.table[3][:2]
    raw = bytearray(path.read_bytes())
    raw[at + length // 2] ^= 0x40
    path.write_bytes(raw)
    with CF.open_stored(path, name="bin.000001") as f:
        assert f.read(0, 3000) == data[:3000]
        assert f.read(4000, 6000) == data[4000:]
        with pytest.raises(StoredFileError) as info:
            f.read(2990, 20)
    err = info.value
    assert err.frame == 3 and err.offset == 3000
    assert "frame 3 (logical offsets 3000-4000" in str(err) and "damaged" in str(err)


def test_forged_ciphertext_with_fixed_crcs_fails_authentication(tmp_path):
    """An attacker who also rewrites the CRCs: AES-GCM still refuses the frame (and a swapped pair)."""
    data = os.urandom(4000)
    path = framed(tmp_path, data, 1000, "aes")
    with CF.open_stored(path, name="bin.000001", keyring=RING) as f:
        table = list(f.table)
        header_len = len(f.header)
    raw = bytearray(path.read_bytes())

    def rewrite_table(raw, table):
        table_at = table[-1][0] + table[-1][1]
        blob = b"".join(CF._TABLE_ENTRY.pack(*e) for e in table)
        raw[table_at : table_at + len(blob)] = blob
        tr = CF._TRAILER.size
        trailer = list(CF._TRAILER.unpack(bytes(raw[-tr:])))
        trailer[2] = zlib.crc32(blob)
        raw[-tr:] = CF._TRAILER.pack(*trailer)
        assert trailer[3] == header_len

    forged = bytearray(raw)
    at, length, _s, _c = table[1]
    forged[at + 5] ^= 1
    table1 = list(table)
    table1[1] = (at, length, zlib.crc32(bytes(forged[at : at + length])), 0)
    rewrite_table(forged, table1)
    path.write_bytes(forged)
    with pytest.raises(StoredFileError, match="frame 1 .*fails authentication"):
        read_all(path)
    # Frames 1 and 2 swapped (same length: a stream cipher keeps sizes), table fixed up.
    swapped = bytearray(raw)
    (a1, l1, s1, _), (a2, l2, s2, _) = table[1], table[2]
    f1, f2 = bytes(raw[a1 : a1 + l1]), bytes(raw[a2 : a2 + l2])
    swapped[a1 : a1 + l1], swapped[a2 : a2 + l2] = f2, f1
    table2 = list(table)
    table2[1], table2[2] = (a1, l1, s2, 0), (a2, l2, s1, 0)
    rewrite_table(swapped, table2)
    path.write_bytes(swapped)
    with pytest.raises(StoredFileError, match="fails authentication"):
        read_all(path)


def test_frames_moved_to_another_file_fail_authentication(tmp_path):
    """Renaming bin.000001.rpz to bin.000002.rpz is named; the same bytes under another header do not decrypt."""
    path = framed(tmp_path, os.urandom(3000), 1000, "aes")
    with pytest.raises(StoredFileError, match="holds relay file 'bin.000001', not 'bin.000002'"):
        read_all(path, name="bin.000002")


def test_wrong_or_missing_key_is_named(tmp_path):
    path = framed(tmp_path, os.urandom(3000), 1000, "zstd+aes")  # written with key id 2 (the highest)
    wrong = Keyring.parse("2:" + "33" * 32, "key file /etc/other.key")
    with pytest.raises(StoredFileError, match="key id 2 of the key file /etc/other.key is not the key"):
        read_all(path, keyring=wrong)
    only_one = Keyring.parse(KEY1, "key file /etc/old.key")
    with pytest.raises(StoredFileError, match="key id 2, which is not in the key file /etc/old.key"):
        read_all(path, keyring=only_one)
    with pytest.raises(StoredFileError, match="no encryption key is configured"):
        read_all(path, keyring=None)
    # Rotation: the current key is chosen; files written with key 1 stay readable with the ring.
    old = tmp_path / "old"
    old.mkdir()
    src = old / "bin.000001"
    src.write_bytes(b"x" * 5000)
    CV.write_framed(src, old / "bin.000001.rpz", "bin.000001",
                    CV.StorageOptions(encrypt=True, keyring=Keyring.parse(KEY1, "k")))
    assert read_all(old / "bin.000001.rpz", keyring=RING) == b"x" * 5000


def test_keyring_parsing_errors_never_show_keys():
    with pytest.raises(ValueError, match="entry 1 is not <id>:<64 hex digits>") as info:
        Keyring.parse("1:abcd", "key file k")
    assert "abcd" not in str(info.value)
    with pytest.raises(ValueError, match="key id 1 appears twice"):
        Keyring.parse(f"{KEY1}\n{KEY1}", "k")
    with pytest.raises(ValueError, match="encryption key id 7 is not in it"):
        Keyring.parse(KEY1, "k", current=7)
    ring = Keyring.parse("# comment\n" + "ab" * 32, "env X")
    assert ring.current == 1 and "ab" * 32 not in repr(ring) and "abab" not in str(ring)


# ---------------------------------------------------------------------------------------------
# A relay directory: conversion, archive, the readers


def mysql_file(first_gno: int, n: int, next_name: str | None, payload: int = 3000) -> bytes:
    events = [E.event(C.PREVIOUS_GTIDS_LOG_EVENT, _gtids_upto(first_gno - 1).encode())]
    for gno in range(first_gno, first_gno + n):
        events += [E.gtid(gno), E.query("BEGIN"), E.query("INSERT INTO t VALUES ('" + "x" * payload + f"{gno}')"),
                   E.xid(gno)]
    if next_name:
        events.append(E.rotate(next_name))
    return E.binlog_file(*events)


def _gtids_upto(gno: int) -> GtidSet:
    s = GtidSet()
    if gno >= 1:
        s.add_interval(E.MYSQL_SID, 1, gno + 1)
    return s


NAMES = ["bin.000001", "bin.000002", "bin.000003", "bin.000004"]


def make_relay(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    d = tmp_path / "relay"
    d.mkdir()
    files = {}
    for i, name in enumerate(NAMES):
        nxt = NAMES[i + 1] if i + 1 < len(NAMES) else None
        files[name] = mysql_file(i * 40 + 1, 40, nxt)
        (d / name).write_bytes(files[name])
    (d / "relayproxy.index").write_text("".join(f"{n}\n" for n in NAMES))
    return d, files


def options(tmp_path: Path, **kw) -> CV.StorageOptions:
    base = dict(compress="zstd", encrypt=True, keyring=RING, frame_size=16 << 10)
    base.update(kw)
    return CV.StorageOptions(**base)


def test_convert_and_archive_serve_the_same_bytes_everywhere(tmp_path):
    d, files = make_relay(tmp_path)
    archive = tmp_path / "archive"
    opts = options(tmp_path, archive_dir=archive, archive_after_files=1)
    CF.configure(d, keyring=RING)
    try:
        with RelayStore.open(d) as store:
            catalog = FileCatalog(store)
            before = [(i.name, i.size, i.start_gtids) for i in catalog.files()]
            stats = CV.StorageStats()
            assert CV.run_pending(store, opts, stats) == 5  # 3 converted, 2 archived
            assert (stats.converted, stats.archived) == (3, 2)
            assert sorted(p.name for p in archive.iterdir()) == ["bin.000001.rpz", "bin.000002.rpz"]
            assert (d / "bin.000003.rpz").is_file() and not (d / "bin.000003").exists()
            assert (d / "bin.000004").is_file()  # the current file stays plain
            assert (d / CF.ARCHIVE_MARKER).read_text().strip() == str(archive.resolve())
            for name in NAMES:
                with CF.open_relay_file(d / name) as f:
                    assert f.read(0, f.size()) == files[name]
                scan = CF.scan(d / name)
                assert scan.ok and scan.gtids_after == scan_file_bytes(tmp_path, files[name]).gtids_after
            fresh = FileCatalog(store)
            assert [(i.name, i.size, i.start_gtids) for i in fresh.files()] == before  # logical sizes
            assert fresh.purged() == catalog.purged()
            states = {s.name: s.size for s in file_states(store)}
            assert states["bin.000001"] == os.path.getsize(archive / "bin.000001.rpz")  # stored bytes
            assert states["bin.000003"] == os.path.getsize(d / "bin.000003.rpz")
            assert CV.pending(store, opts) == []
        # Reopen: recovery finds every file in its place (the marker names the archive).
        with RelayStore.open(d) as store:
            assert store.files() == NAMES and not store.recovery.warnings
            assert store.purge_to("bin.000003") == ["bin.000001", "bin.000002"]
            assert list(archive.iterdir()) == []
            assert not (d / "bin.000002.rpz").exists()
    finally:
        CF._keyrings.clear()


def scan_file_bytes(tmp_path: Path, data: bytes):
    p = tmp_path / "scan.tmp.bin"
    p.write_bytes(data)
    return scan_file(p)


def test_a_missing_archive_directory_refuses_to_start(tmp_path):
    d, _files = make_relay(tmp_path)
    archive = tmp_path / "archive"
    with RelayStore.open(d) as store:
        CV.run_pending(store, CV.StorageOptions(archive_dir=archive, archive_after_files=0))
    archive.rename(tmp_path / "elsewhere")
    from relayproxy.relay.errors import RelayRecoveryError

    with pytest.raises(RelayRecoveryError, match="archive directory .* is not there: mount it"):
        RelayStore.open(d)
    (tmp_path / "elsewhere").rename(archive)
    with RelayStore.open(d) as store:
        assert store.files() == NAMES


def test_a_file_purged_during_its_conversion_leaves_nothing(tmp_path):
    d, _files = make_relay(tmp_path)
    opts = options(tmp_path)
    with RelayStore.open(d):
        listed = iter([False])
        out = CV.convert_file(d, "bin.000001", opts, still_listed=lambda n: next(listed))
        assert out is None
        assert not any(p.name.startswith("bin.000001") for p in d.iterdir())


# ---------------------------------------------------------------------------------------------
# kill -9 at every step: a subprocess converts (or archives) and SIGKILLs itself at the step


_CHILD = """
import sys
from pathlib import Path
from relayproxy.relay import closed_files as CF, conversion as CV
from relayproxy.relay.closed_files import Keyring
d, archive, action = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
ring = Keyring.parse("1:" + "11" * 32, "k")
CF.configure(d, keyring=ring)
opts = CV.StorageOptions(compress="zstd", encrypt=True, keyring=ring, frame_size=16384)
if action == "convert":
    CV.convert_file(d, "bin.000002", opts)
else:
    CV.write_archive_marker(d, archive)
    CV.archive_file(d, "bin.000002", archive)
print("finished")
"""


@pytest.mark.parametrize("action,step", [("convert", s) for s in CV.CONVERT_STEPS]
                         + [("archive", s) for s in CV.ARCHIVE_STEPS])
def test_kill_9_at_every_step_loses_nothing_and_serves_no_half_file(tmp_path, action, step):
    d, files = make_relay(tmp_path)
    archive = tmp_path / "archive"
    archive.mkdir()
    ring = Keyring.parse(KEY1, "k")
    if action == "archive":  # archive a converted file
        CV.convert_file(d, "bin.000002", CV.StorageOptions(compress="zstd", encrypt=True, keyring=ring,
                                                           frame_size=16384))
    env = dict(os.environ, **{CV.KILL_ENV: f"{action}:{step}"})
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(d), str(archive), action], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr)  # it was killed at the step
    assert "finished" not in proc.stdout
    CF.configure(d, keyring=ring)
    try:
        with RelayStore.open(d) as store:
            assert store.files() == NAMES
            warnings = " ".join(store.recovery.warnings)
            for name in NAMES:
                with CF.open_relay_file(d / name) as f:
                    assert f.read(0, f.size()) == files[name], name
            forms = [p for p in CF._forms(d, CF.archive_dir_of(d), "bin.000002") if p.is_file()]
            assert len(forms) == 1, forms  # exactly one form left
            leftovers = [p for p in [*d.iterdir(), *archive.iterdir()] if p.name.endswith(CF.TMP_SUFFIX)]
            assert leftovers == []
            if step in ("partial", "written", "synced", "verified", "copied"):
                assert "interrupted before it was verified" in warnings
            if step == "renamed":
                assert "replaces it" in warnings
        # And the step can be done again (or was done): the conversion completes.
        with RelayStore.open(d) as store:
            opts = CV.StorageOptions(compress="zstd", encrypt=True, keyring=ring, frame_size=16384,
                                     archive_dir=archive if action == "archive" else None,
                                     archive_after_files=2 if action == "archive" else None)
            CV.run_pending(store, opts)
            with CF.open_relay_file(d / "bin.000002") as f:
                assert not f.is_plain and f.read(0, f.size()) == files["bin.000002"]
    finally:
        CF._keyrings.clear()


# ---------------------------------------------------------------------------------------------
# serve and inspect read a converted, archived relay directory


def test_serve_and_inspect_read_converted_and_archived_files(tmp_path):
    from relayproxy.relay.readonly import ReadOnlyBinlogDir, ServeError, ServeOptions

    d, files = make_relay(tmp_path)
    archive = tmp_path / "archive"
    CF.configure(d, keyring=RING)
    try:
        with RelayStore.open(d) as store:
            horizon = store.horizon.snapshot()
            CV.run_pending(store, options(tmp_path, archive_dir=archive, archive_after_files=1))
        served = ReadOnlyBinlogDir.open(ServeOptions(binlog_dir=d))
        snap = served.horizon.snapshot()
        assert served.files() == NAMES and (snap.file, snap.position, snap.gtids) == (
            horizon.file, horizon.position, horizon.gtids)
        assert [(i.name, i.size) for i in FileCatalog(served).files()] == [(n, len(files[n])) for n in NAMES]
        CF.configure(d, keyring=None)
        with pytest.raises(ServeError, match="no encryption key is configured"):
            ReadOnlyBinlogDir.open(ServeOptions(binlog_dir=d))
    finally:
        CF._keyrings.clear()
    env = dict(os.environ, RELAY_KEYS=f"{KEY1} {KEY2}")
    for target in (archive / "bin.000001.rpz", d / "bin.000003", d / "bin.000003.rpz"):
        proc = subprocess.run([sys.executable, "-m", "relayproxy.commands.cli", "inspect", "--json", str(target),
                               "--encryption-key-env", "RELAY_KEYS"], env=env, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        report = json.loads(proc.stdout)
        name = CF.logical_name(target.name)
        expected = scan_file_bytes(tmp_path, files[name])
        assert (report["bytes"], report["events"]) == (expected.bytes, expected.events)
        assert report["error"] is None and report["crc_errors"] == 0
    proc = subprocess.run([sys.executable, "-m", "relayproxy.commands.cli", "inspect", "--json", str(d / "bin.000003")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "no encryption key is configured" in json.loads(proc.stdout)["error"]


def test_options_from_the_configuration(tmp_path, monkeypatch):
    from relayproxy.commands import config

    keyfile = tmp_path / "keys"
    keyfile.write_text(f"{KEY1}\n{KEY2}\n")
    cfg = config.load(None, {"RELAYPROXY_COMPRESS_CLOSED": "zstd", "RELAYPROXY_COMPRESS_LEVEL": "9",
                             "RELAYPROXY_ENCRYPT_AT_REST": "on", "RELAYPROXY_ENCRYPTION_KEY_FILE": str(keyfile),
                             "RELAYPROXY_ENCRYPTION_KEY_ID": "1", "RELAYPROXY_ARCHIVE_DIR": str(tmp_path / "a"),
                             "RELAYPROXY_ARCHIVE_AFTER": "12 files"})
    opts = CV.StorageOptions.from_config(cfg)
    assert (opts.compress, opts.level, opts.encrypt, opts.keyring.current, opts.archive_after_files) == (
        "zstd", 9, True, 1, 12)
    assert "11" * 32 not in repr(opts) + opts.describe() + repr(cfg.public_dict())
    aged = config.load(None, {"RELAYPROXY_ARCHIVE_DIR": "/x", "RELAYPROXY_ARCHIVE_AFTER": "7d"})
    assert CV.StorageOptions.from_config(aged).archive_after_seconds == 7 * 86400
    with pytest.raises(config.ConfigError, match="compress_level"):
        config.load(None, {"RELAYPROXY_COMPRESS_LEVEL": "30"})
    with pytest.raises(config.ConfigError, match="archive_after"):
        config.load(None, {"RELAYPROXY_ARCHIVE_AFTER": "soon"})
    with pytest.raises(ValueError, match="encrypt_at_rest = on needs a key"):
        CV.StorageOptions.from_config(config.load(None, {"RELAYPROXY_ENCRYPT_AT_REST": "on"}))
    with pytest.raises(ValueError, match="archive_dir is set but archive_after is not"):
        CV.StorageOptions.from_config(config.load(None, {"RELAYPROXY_ARCHIVE_DIR": "/x"}))
    with pytest.raises(ValueError, match="RELAY_NO_SUCH_VAR"):
        CV.StorageOptions.from_config(config.load(None, {"RELAYPROXY_ENCRYPTION_KEY_ENV": "RELAY_NO_SUCH_VAR"}))
    monkeypatch.setenv("RELAY_KEYS_X", KEY2)
    ring = CV.StorageOptions.from_config(config.load(None, {"RELAYPROXY_ENCRYPTION_KEY_ENV": "RELAY_KEYS_X"})).keyring
    assert ring.current == 2


def test_changing_archive_dir_under_archived_files_is_refused(tmp_path):
    d, _files = make_relay(tmp_path)
    with RelayStore.open(d) as store:
        CV.run_pending(store, CV.StorageOptions(archive_dir=tmp_path / "a1", archive_after_files=2))
        with pytest.raises(CV.ConversionError, match="names .*a1, where relay files are archived already"):
            CV.run_pending(store, CV.StorageOptions(archive_dir=tmp_path / "a2", archive_after_files=0))


def test_the_dump_reader_serves_logical_bytes_and_refuses_a_damaged_frame(tmp_path):
    import asyncio
    import errno

    from relayproxy.downstream.dump.files import RelayFile

    d, files = make_relay(tmp_path)
    CF.configure(d, keyring=RING)
    try:
        with RelayStore.open(d) as store:
            CV.run_pending(store, options(tmp_path))

        async def read_all_pieces(name, piece):
            rf = RelayFile(name, d / name)
            try:
                out = bytearray()
                while len(out) < rf.size():
                    out += await rf.read(len(out), piece)
                return bytes(out), rf.is_plain
            finally:
                rf.close()

        for piece in (100, 64 << 10, 1 << 20):
            assert asyncio.run(read_all_pieces("bin.000002", piece)) == (files["bin.000002"], False)
        assert asyncio.run(read_all_pieces("bin.000004", 4096)) == (files["bin.000004"], True)
        stored = d / "bin.000002.rpz"
        raw = bytearray(stored.read_bytes())
        with CF.open_stored(stored, name="bin.000002", keyring=RING) as f:
            at = f.table[2][0]
        raw[at + 3] ^= 1
        stored.write_bytes(raw)
        with pytest.raises(OSError) as info:
            asyncio.run(read_all_pieces("bin.000002", 64 << 10))
        assert info.value.errno == errno.EIO and "frame 2 (logical offsets 32768-49152" in str(info.value)
    finally:
        CF._keyrings.clear()


def test_file_indexes_describe_converted_and_archived_files_and_stay(tmp_path):
    from relayproxy.relay import fileindex

    d, files = make_relay(tmp_path)
    archive = tmp_path / "archive"
    CF.configure(d, keyring=RING)
    try:
        before = {}
        with RelayStore.open(d) as store:
            for name in NAMES[:-1]:
                before[name] = fileindex.index_for(d, name, writable=True)
            CV.run_pending(store, options(tmp_path, archive_dir=archive, archive_after_files=1))
        assert fileindex.clean_leftovers(d) == []  # the indexes of converted and archived files are not stale
        for name in NAMES[:-1]:
            idx, why = fileindex.load(d, name)
            assert why is None and idx.encode() == before[name].encode(), name
            assert fileindex.verify_content(idx, d / name) is None
            rebuilt = fileindex.build(d / name, name)
            assert rebuilt.encode() == idx.encode()
    finally:
        CF._keyrings.clear()


def test_the_storage_task_converts_in_a_worker_thread_and_stops_between_files(tmp_path):
    import asyncio
    import threading

    d, files = make_relay(tmp_path)
    with RelayStore.open(d) as store:
        task = CV.StorageTask(options(tmp_path), 0.05, lambda: store)
        threads = []
        real = CV.convert_file

        def spy(*args, **kwargs):
            threads.append(threading.current_thread())
            return real(*args, **kwargs)

        async def main():
            CV.convert_file = spy
            try:
                runner = asyncio.create_task(task.run())
                while task.stats.converted < 3 and not task.stats.failures:
                    await asyncio.sleep(0.02)
                runner.cancel()
                await asyncio.gather(runner, return_exceptions=True)
            finally:
                CV.convert_file = real

        asyncio.run(main())
        assert threads and all(t is not threading.main_thread() for t in threads)
        assert task.stats.converted == 3 and task.stats.failures == 0 and task._stop.is_set()
        stopped = CV.StorageStats()
        assert CV.run_pending(store, options(tmp_path, archive_dir=tmp_path / "a", archive_after_files=0),
                              stopped, stop=task._stop) == 0  # a set stop begins nothing


def test_show_binlog_events_reads_a_converted_file_like_the_plain_one(tmp_path):
    from relayproxy.downstream.sql.binlog_events import Request, read_binlog_events

    d, files = make_relay(tmp_path)
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    (plain_dir / "bin.000002").write_bytes(files["bin.000002"])
    CF.configure(d, keyring=RING)
    try:
        with RelayStore.open(d) as store:
            CV.run_pending(store, options(tmp_path))
        assert (d / "bin.000002.rpz").exists() and not (d / "bin.000002").exists()
        size = len(files["bin.000002"])
        for request in (Request(None, 4, 0, None), Request(None, 4, 50, 20)):
            mine = read_binlog_events(str(d / "bin.000002"), "bin.000002", size, request, flavour="mysql")
            theirs = read_binlog_events(str(plain_dir / "bin.000002"), "bin.000002", size, request, flavour="mysql")
            assert mine.rows == theirs.rows and len(mine.rows) > 10
    finally:
        CF._keyrings.clear()
