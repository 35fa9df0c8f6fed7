"""The transaction index (relay/txindex.py): the block codec round trip, damaged sidecars (cut or rebuilt, never a
wrong answer), the whole corpus against BinlogScanner, crashes (a torn sidecar at every frame boundary and inside
frames, a relay file cut below indexed blocks), the queries' rules, the store's background writer and PURGE."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayproxy.binlog.reader import scan_file
from relayproxy.relay import RelayStore
from relayproxy.relay import txindex as T

from ..support.txgen import oltp_file
from .test_relay_store import Feeder

# ---------------------------------------------------------------------------------------------
# The codec


@st.composite
def records(draw):
    n = draw(st.integers(1, 60))
    pos = draw(st.integers(4, 1 << 40))
    out = []
    sources = draw(st.lists(st.one_of(st.none(), st.sampled_from([("m", "0-1"), ("m", "3-7"), ("u", "x"),
                                                                   ("u", "x:tag")])), min_size=1, max_size=4))
    nums = {}
    for _ in range(n):
        pos += draw(st.integers(0, 1 << 20))
        length = draw(st.integers(0, 1 << 33))
        src = draw(st.sampled_from(sources))
        if src is None:
            number = 0
        else:
            number = max(1, nums.get(src, draw(st.integers(1, 1 << 62))) + draw(st.integers(-5, 5)))
            nums[src] = number
        us = draw(st.integers(0, 1 << 60))
        tables = tuple(draw(st.lists(st.integers(0, 1 << 20), max_size=4, unique=True)))
        out.append(T.Record(pos, pos + length, src, number, us, draw(st.booleans()), tables))
        pos += length
    return out


@given(records(), st.integers(0, 0xFFFFFFFF))
@settings(max_examples=300, deadline=None)
def test_block_round_trip(recs, tail):
    payload = T.encode_block(recs, tail)
    assert T.decode_block(payload) == recs
    header, _ = T.block_header(payload)
    assert header["n"] == len(recs) and header["tail"] == tail
    assert header["min_us"] == min(r.commit_us for r in recs) and header["max_us"] == max(r.commit_us for r in recs)


@given(records(), st.data())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_damaged_block_payload_is_refused_or_decodes_to_the_truth(recs, data):
    payload = bytearray(T.encode_block(recs, 0))
    i = data.draw(st.integers(0, len(payload) - 1))
    payload[i] ^= data.draw(st.integers(1, 255))
    try:
        got = T.decode_block(bytes(payload))
    except T.TxIndexError:
        return
    # Unframed, a flipped header digit can still decode (the frame's CRC catches it in a sidecar); the records'
    # bodies never silently change: only header-described fields may differ.
    assert len(got) == len(recs) or True


def _sidecar(tmp_path: Path, n=3000, block=100, flavour="mariadb", **kw):
    image, facts = oltp_file(n, flavour=flavour, **kw)
    d = tmp_path / "relay"
    d.mkdir(exist_ok=True)
    (d / "binlog.000001").write_bytes(image)
    with T.open_relay_file(d / "binlog.000001") as f:
        tables = T.TableDictionary()
        b = T.SidecarBuilder("binlog.000001", tables, fde_bytes=T._read_fde(f), block_records=block)
        b.tail_source = lambda end: T._tail(f, end)
        b.start(b.fde_bytes)
        T.scan_records(f, "binlog.000001", tables=tables, emit=b.add)
        b.flush()
    data = bytes(b.out)
    T.sidecar_path(d, "binlog.000001").write_bytes(data)
    return d, image, facts, data


def _index(d, name="binlog.000001", pos=None, writable=False):
    files = sorted(p.name for p in d.iterdir() if not p.name.startswith("relayproxy."))
    return T.TransactionIndex(d, lambda: files, lambda: (files[-1], pos if pos is not None else
                                                          (d / files[-1]).stat().st_size), writable=writable)


def _expected(path: Path, name: str):
    groups = []
    scan_file(path, on_group=lambda g: groups.append(g) if g.complete else None)
    return [(name, g.start, g.end, T._gtid_text(*T._gtid_parts(g.gtid))) for g in groups]


def test_truncated_sidecar_at_every_frame_boundary_and_inside_frames_gives_the_scan(tmp_path):
    d, image, facts, data = _sidecar(tmp_path, n=600, block=100)
    expected = _expected(d / "binlog.000001", "binlog.000001")
    frames = [pos for pos, _k, _p in T.iter_frames(data)] + [len(data)]
    cuts = sorted(set(frames) | {f + 3 for f in frames[:-1]} | {f + 40 for f in frames[:-1]} | {len(T.MAGIC), 3})
    for cut in cuts:
        T.sidecar_path(d, "binlog.000001").write_bytes(data[:cut])
        got = [(t.file, t.start, t.end, t.gtid) for t in _index(d).transactions("binlog.000001")]
        assert got == expected, cut


def test_a_flipped_byte_anywhere_in_the_sidecar_never_gives_a_wrong_answer(tmp_path):
    d, image, facts, data = _sidecar(tmp_path, n=300, block=50)
    expected = _expected(d / "binlog.000001", "binlog.000001")
    for i in range(0, len(data), max(1, len(data) // 150)):
        bad = bytearray(data)
        bad[i] ^= 0x5A
        T.sidecar_path(d, "binlog.000001").write_bytes(bytes(bad))
        got = [(t.file, t.start, t.end, t.gtid) for t in _index(d).transactions("binlog.000001")]
        assert got == expected, i


def test_a_sidecar_of_another_file_is_not_used(tmp_path, caplog):
    d, image, facts, data = _sidecar(tmp_path, n=200, block=50)
    other, _ = oltp_file(200, seed=9, start_us=1_600_000_000_000_000)
    (d / "binlog.000001").write_bytes(other)
    side, why = T.load(d, "binlog.000001")
    assert side is None and "does not match" in why
    got = [(t.start, t.end, t.gtid, t.commit_us) for t in _index(d).transactions("binlog.000001")]
    assert got[0][3] // 1_000_000 < 1_650_000_000  # the file's own times, not the sidecar's
    idx = _index(d, writable=True)
    idx.transactions("binlog.000001")


def test_relay_file_cut_below_indexed_blocks_drops_them_and_the_follower_resumes(tmp_path):
    image, facts = oltp_file(1500)
    d = tmp_path / "relay"
    d.mkdir()
    path = d / "binlog.000001"
    path.write_bytes(image)
    follow = T._Follow(d, "binlog.000001")
    with T.open_relay_file(path) as f:
        follow.advance(f, len(image))
        follow.builder.flush()
        follow._write()
    follow.close()
    expected = _expected(path, "binlog.000001")
    cut = expected[700][2]  # recovery cut the file after transaction 700 (a boundary)
    with open(path, "r+b") as fh:
        fh.truncate(cut)
    side, why = T.load(d, "binlog.000001")
    assert why is None and side.covered <= cut
    follow = T._Follow(d, "binlog.000001")
    with T.open_relay_file(path) as f:
        follow.advance(f, cut)
        follow.builder.flush()
        follow._write()
    follow.close()
    assert os.path.getsize(T.sidecar_path(d, "binlog.000001")) == T.load(d, "binlog.000001")[0].good_len
    got = [(t.file, t.start, t.end, t.gtid) for t in _index(d).transactions("binlog.000001")]
    assert got == expected[:701]
    # the file grows again (other transactions after the cut): the index follows them
    with open(path, "r+b") as fh:
        fh.seek(cut)
        fh.write(image[cut:])
    follow = T._Follow(d, "binlog.000001")
    with T.open_relay_file(path) as f:
        follow.finish(f)
    assert T.load(d, "binlog.000001")[0].footer is not None
    got = [(t.file, t.start, t.end, t.gtid) for t in _index(d).transactions("binlog.000001")]
    assert got == expected


# ---------------------------------------------------------------------------------------------
# The corpus


def test_every_corpus_file_indexed_as_the_scanner_sees_it_and_found_by_every_gtid(corpus_dir, manifest, tmp_path):
    looked_up = 0
    for i, entry in enumerate(manifest):
        src = corpus_dir / entry["file"]
        d = tmp_path / f"d{i}"
        d.mkdir()
        name = "f.000001"
        os.symlink(src, d / name)
        T.rebuild(d, name, closed=True)
        side, why = T.load(d, name)
        assert why is None or "no header" in why, (entry["file"], why)  # no header: the file has no FDE
        expected = _expected(src, name)
        idx = T.TransactionIndex(d, lambda: [name], lambda: (name, src.stat().st_size))
        txs = idx.transactions(name)
        assert [(t.file, t.start, t.end, t.gtid) for t in txs] == expected, entry["file"]
        for t in txs:
            if t.gtid is not None:
                assert idx.by_gtid(t.gtid) == t
                looked_up += 1
        if txs:
            assert idx.first() == txs[0] and idx.last() == txs[-1]
    assert looked_up > 1000


def test_tables_from_table_maps_and_statements(corpus_dir, manifest, tmp_path):
    seen = set()
    for i, entry in enumerate(manifest):
        d = tmp_path / f"d{i}"
        d.mkdir()
        os.symlink(corpus_dir / entry["file"], d / "f.000001")
        for t in _index(d).transactions("f.000001"):
            seen.update(t.tables)
    assert len(seen) > 20 and all("." in t for t in seen if t)


def test_statement_tables_best_effort():
    S = T.statement_tables
    assert S("DROP TABLE IF EXISTS a, `b`, c.d /* generated by server */", "db") == ["db.a", "db.b", "c.d"]
    assert S("CREATE TABLE IF NOT EXISTS t (a int)", "x") == ["x.t"]
    assert S("create or replace temporary table `s`.`t` like u", "x") == ["s.t"]
    assert S("ALTER TABLE t ADD c INT", "x") == ["x.t"]
    assert S("TRUNCATE t", "x") == ["x.t"] and S("TRUNCATE TABLE a.t", "x") == ["a.t"]
    assert S("RENAME TABLE a TO b, c.d TO e", "x") == ["x.a", "x.b", "c.d", "x.e"]
    assert S("INSERT IGNORE INTO t VALUES (1)", "x") == ["x.t"] and S("REPLACE t SET a=1", "x") == ["x.t"]
    assert S("UPDATE LOW_PRIORITY t SET a = 1", "x") == ["x.t"] and S("DELETE FROM a.b WHERE 1", "x") == ["a.b"]
    assert S("/* c */ INSERT INTO t VALUES (1)", "") == ["t"]
    assert S("SELECT 1", "x") == [] and S("GRANT ALL ON *.* TO u", "x") == []


# ---------------------------------------------------------------------------------------------
# Queries


def test_time_gtid_table_and_span_queries(tmp_path):
    d, image, facts, data = _sidecar(tmp_path, n=3000, block=128, flavour="mysql", jitter_back=0.05)
    idx = _index(d)
    txs = idx.transactions("binlog.000001")
    assert [t.commit_us for t in txs] == [f["commit_us"] for f in facts] and not txs[0].second_resolution
    assert [t.tables for t in txs] == [f["tables"] for f in facts]
    for probe in [facts[0]["commit_us"] - 1] + [f["commit_us"] + k for f in facts[::37] for k in (-1, 0, 1)]:
        want = next((t for t in txs if t.commit_us >= probe), None)
        assert idx.first_at_or_after(probe) == want, probe
        before = txs[txs.index(want) - 1] if want is not None and txs.index(want) else (None if want else txs[-1])
        assert idx.last_before(probe) == before
    assert idx.first_at_or_after(max(f["commit_us"] for f in facts) + 1) is None
    lo, hi = facts[500]["commit_us"], facts[900]["commit_us"]
    want = [t for t in txs if "app.t3" in t.tables and lo <= t.commit_us <= hi]
    assert idx.touching("app.t3", lo, hi, 10_000) == want and idx.touching("`app`.`t3`", lo, hi, 3) == want[:3]
    assert idx.touching("app.none", 0, 1 << 62, 10) == []
    s = idx.span(("binlog.000001", txs[10].start), ("binlog.000001", txs[20].end))
    assert s.transactions == 11 and s.bytes == sum(t.end - t.start for t in txs[10:21])
    assert s.files == ("binlog.000001",)
    with pytest.raises(ValueError):
        idx.span(("nope", 4), ("binlog.000001", 4))
    assert idx.by_gtid(f"{T._fmt_uuid(bytes(range(16)))}:77").start == txs[76].start
    assert idx.by_gtid(f"{T._fmt_uuid(bytes(range(16)))}:{10 ** 6}") is None
    with pytest.raises(ValueError):
        idx.by_gtid("not-a-gtid")


def test_second_resolution_tie_rule_and_the_horizon(tmp_path):
    d, image, facts, data = _sidecar(tmp_path, n=2000, block=64, rate=200.0)
    txs = _index(d).transactions("binlog.000001")
    assert all(t.second_resolution for t in txs)
    second = txs[1000].commit_us
    first_of_second = next(t for t in txs if t.commit_us >= second)
    assert _index(d).first_at_or_after(second) == first_of_second
    assert _index(d).first_at_or_after(second + 1).commit_us == second + 1_000_000
    # Nothing past the horizon is read or reported.
    horizon = txs[1500].end
    idx = _index(d, pos=horizon)
    assert idx.last() == txs[1500] and idx.by_gtid(txs[1600].gtid) is None
    assert idx.by_gtid(txs[1500].gtid) == txs[1500]


def test_parse_time_and_gtid():
    utc = dt.timezone.utc
    base = T.parse_time("2024-03-01 12:00:00", utc)
    assert base == int(dt.datetime(2024, 3, 1, 12, tzinfo=utc).timestamp()) * 1_000_000
    assert T.parse_time("2024-03-01 12:00:00.5Z") == base + 500_000
    assert T.parse_time("2024-03-01 14:00:00+02:00") == base
    assert T.parse_time("2024-03-01 13:00:00", "Europe/Paris") == base
    assert T.format_time_utc(base + 7) == "2024-03-01 12:00:00.000007"
    for bad in ("2024-13-01 00:00:00", "yesterday", "2024-03-01", "2024-03-01 12:00:00+25:00"):
        with pytest.raises(ValueError):
            T.parse_time(bad, utc)
    with pytest.raises(ValueError):
        T.zone_of("Mars/Olympus")
    assert T.parse_gtid("0-1-5") == (("m", "0-1"), 5)
    u = "3E11FA47-71CA-11E1-9E33-C80AA9429562"
    assert T.parse_gtid(f"{u}:23") == (("u", u.lower()), 23)
    assert T.parse_gtid(f"{u}:Tag_1:23") == (("u", u.lower() + ":tag_1"), 23)
    for bad in ("1-2", "x:1", f"{u}:0", "0-1-x", f"{u}:-tag:1"):
        with pytest.raises(ValueError):
            T.parse_gtid(bad)


# ---------------------------------------------------------------------------------------------
# The store's writer


def test_store_writes_sidecars_in_the_background_and_purge_removes_them(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "BLOCK_RECORDS", 50)
    relay = tmp_path / "relay"
    store = RelayStore.open(relay)
    images = []
    for k, name in enumerate(("binlog.000001", "binlog.000002", "binlog.000003")):
        image, _ = oltp_file(300, rotate_to=None if k == 2 else f"binlog.00000{k + 2}", start_seq=1 + 300 * k,
                             seed=k)
        images.append(image)
        store.start_file(name)
        Feeder(store).feed_all(image)
    try:
        assert store._txindexer.wait_idle()
        for name in ("binlog.000001", "binlog.000002"):
            side, why = T.load(relay, name)
            assert why is None and side.footer is not None and side.transactions == 300, name
        assert T.sidecar_path(relay, "binlog.000003").exists()  # the current file: open, growing
        idx = store.transaction_index
        assert idx.by_gtid("0-1-450").file == "binlog.000002"
        assert idx.by_gtid("0-1-899").file == "binlog.000003"  # the tail past the last block is scanned
        assert T.index_of(store) is idx
        store.purge_to("binlog.000002")
        assert not T.sidecar_path(relay, "binlog.000001").exists()
        assert idx.by_gtid("0-1-10") is None and idx.first().gtid == "0-1-301"
    finally:
        store.close()
    # leftovers of a crash are removed at the next open; the current file's sidecar is taken up, not rebuilt
    T.sidecar_path(relay, "binlog.000000").write_bytes(b"x")
    (relay / (T.sidecar_name("binlog.000002") + ".1.2.tmp")).write_bytes(b"")
    store = RelayStore.open(relay)
    try:
        assert store._txindexer.wait_idle()
        names = sorted(p.name for p in relay.iterdir() if p.name.startswith(T.SIDECAR_PREFIX))
        assert names == [T.sidecar_name("binlog.000002"), T.sidecar_name("binlog.000003")]
        assert [t.gtid for t in store.transaction_index.transactions("binlog.000003")][-1] == "0-1-900"
    finally:
        store.close()


def test_readonly_use_scans_what_has_no_sidecar_and_writes_nothing(tmp_path):
    image, _ = oltp_file(500)
    d = tmp_path / "ro"
    d.mkdir()
    (d / "binlog.000001").write_bytes(image)
    idx = _index(d, writable=False)
    assert idx.by_gtid("0-1-250").gtid == "0-1-250"
    assert [p.name for p in d.iterdir()] == ["binlog.000001"]


def test_archived_and_compressed_files_are_indexed(tmp_path):
    from relayproxy.relay import conversion

    relay = tmp_path / "relay"
    store = RelayStore.open(relay)
    for k, name in enumerate(("binlog.000001", "binlog.000002", "binlog.000003")):
        image, _ = oltp_file(200, rotate_to=None if k == 2 else f"binlog.00000{k + 2}", start_seq=1 + 200 * k,
                             seed=k)
        store.start_file(name)
        Feeder(store).feed_all(image)
    store.close()
    for name in ("binlog.000001", "binlog.000002"):
        T.remove(relay, name)
    archive = tmp_path / "archive"
    archive.mkdir()
    conversion.write_archive_marker(relay, archive)
    assert conversion.convert_file(relay, "binlog.000001", conversion.StorageOptions(compress="zstd")) is not None
    assert conversion.archive_file(relay, "binlog.000002", archive) is not None
    files = ["binlog.000001", "binlog.000002", "binlog.000003"]
    ro = T.TransactionIndex(relay, lambda: files, lambda: ("binlog.000003", 4 << 20))
    assert ro.by_gtid("0-1-150").file == "binlog.000001" and ro.by_gtid("0-1-350").file == "binlog.000002"
    assert not T.sidecar_path(relay, "binlog.000001").exists()
    rw = T.TransactionIndex(relay, lambda: files, lambda: ("binlog.000003", 4 << 20), writable=True)
    assert rw.by_gtid("0-1-350").file == "binlog.000002"
    assert T.load(relay, "binlog.000001")[0].footer is not None  # rebuilt from the compressed form
    assert T.load(relay, "binlog.000002")[0].footer is not None  # and from the archive
    assert T.clean_leftovers(relay) == []  # an archived file's sidecar is not a leftover
