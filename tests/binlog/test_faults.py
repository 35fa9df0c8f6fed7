"""Faults on purpose: every corpus file cut at every boundary and inside events, bit flips, random bytes."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayproxy.binlog import boundary as B
from relayproxy.binlog import constants as C
from relayproxy.binlog.reader import BinlogScanner, scan_bytes

from ..support import eventgen as E

# Files above this many events are cut at a deterministic sample of boundaries (the full
# quadratic sweep over the 26,594-event file alone would take an hour).
EVERY_BOUNDARY_MAX_EVENTS = 600
SAMPLE_CUTS = 150


def well_formed(manifest):
    return [e for e in manifest if e.get("events") not in (None, "-") and e["checksum_alg"] in ("CRC32", "NONE", "N/A(pre-5.6)")]


def reference_walk(data: bytes):
    """Full scan: per event (start, end, at_boundary_after) and the complete groups' end offsets."""
    events = []
    groups = []
    result = scan_bytes(
        data,
        on_event=lambda ev: events.append((ev.offset, ev.end, ev.boundary & B.RESULT_MASK in (B.EVENT_OUTSIDE, B.GROUP_END))),
        on_group=lambda g: groups.append(g) if g.complete else None,
    )
    return result, events, [g.end for g in groups]


def expected_at_cut(events, group_ends, cut):
    complete = sum(1 for end in group_ends if end <= cut)
    whole = [ev for ev in events if ev[1] <= cut]
    good_end = 4
    for start, end, at_boundary in whole:
        if at_boundary:
            good_end = end
    mid_event = any(start < cut < end for start, end, _ in events)
    at_boundary = whole[-1][2] if whole else True
    partial = mid_event or not at_boundary
    return complete, good_end, partial, mid_event


def check_cut(data, events, group_ends, cut, name):
    r = scan_bytes(data[:cut])
    complete, good_end, partial, mid_event = expected_at_cut(events, group_ends, cut)
    assert r.groups_complete == complete, (name, cut)
    assert r.good_end == good_end, (name, cut)
    assert r.partial_tail == partial, (name, cut)
    assert r.truncated_event == mid_event, (name, cut)
    if mid_event:
        assert re.match(r"at offset \d+: file ends inside", r.error), r.error


@pytest.mark.slow
def test_every_file_cut_at_every_boundary_and_inside_events(corpus_dir, manifest):
    rng = random.Random(20261121)
    cuts_checked = 0
    for entry in well_formed(manifest):
        data = (corpus_dir / entry["file"]).read_bytes()
        full, events, group_ends = reference_walk(data)
        if not full.ok:
            continue
        boundaries = [end for _, end, _ in events]
        if len(events) > EVERY_BOUNDARY_MAX_EVENTS:
            boundaries = sorted(rng.sample(boundaries, SAMPLE_CUTS))
            inside = [rng.randrange(s + 1, e) for s, e, _ in rng.sample(events, SAMPLE_CUTS)]
        else:
            inside = [rng.randrange(s + 1, e) for s, e, _ in events]
        for cut in [*boundaries, *inside]:
            check_cut(data, events, group_ends, cut, entry["file"])
            cuts_checked += 1
    assert cuts_checked > 8000


def test_chunked_feeding_equals_whole_feeding(corpus_dir, manifest):
    """The scanner is fed bytes in any chunking: the result never depends on it."""
    rng = random.Random(7)
    for entry in well_formed(manifest)[:40]:
        data = (corpus_dir / entry["file"]).read_bytes()
        whole = scan_bytes(data)
        scanner = BinlogScanner()
        pos = 0
        while pos < len(data):
            step = rng.choice([1, 3, 19, 64, 1000, 65536])
            scanner.feed(data[pos : pos + step])
            pos += step
        chunked = scanner.finish()
        for attr in ("events", "groups_complete", "good_end", "partial_tail", "crc_errors", "counts_by_type"):
            assert getattr(chunked, attr) == getattr(whole, attr), (entry["file"], attr)


def test_large_events_stream_with_bounded_memory():
    """Events above max_event_in_memory are CRC-checked as they stream past; only their head is kept."""
    big = E.query("INSERT INTO t VALUES ('" + "x" * 3_000_000 + "')")
    data = E.binlog_file(E.gtid(1), E.query("BEGIN"), big, E.xid(), E.gtid(2), E.query("CREATE TABLE t2 (a INT)"))
    kept = []
    scanner = BinlogScanner(max_event_in_memory=1 << 20, on_event=kept.append)
    for i in range(0, len(data), 100_000):
        scanner.feed(data[i : i + 100_000])
    r = scanner.finish()
    assert r.ok and r.groups_complete == 2 and r.good_end == len(data)
    streamed = [ev for ev in kept if ev.streamed]
    assert len(streamed) == 1 and len(streamed[0].data) <= 64 << 10 and streamed[0].crc_ok is True
    # a flipped byte deep inside the streamed event is still caught
    bad = bytearray(data)
    bad[len(data) // 2] ^= 0x10
    r = BinlogScanner(max_event_in_memory=1 << 20)
    r.feed(bytes(bad))
    res = r.finish()
    assert res.crc_errors == 1 and "CRC32 mismatch" in res.error


def test_single_bit_flips_give_crc_error_at_the_right_offset(corpus_dir, manifest):
    rng = random.Random(99)
    flips = 0
    for entry in manifest:
        if entry["checksum_alg"] != "CRC32" or entry.get("events") in (None, "-"):
            continue
        data = (corpus_dir / entry["file"]).read_bytes()
        full, events, _ = reference_walk(data)
        if not full.ok:
            continue
        for start, end, _ in rng.sample(events, min(len(events), 25)):
            bit = rng.randrange((end - start) * 8)
            bad = bytearray(data)
            bad[start + bit // 8] ^= 1 << (bit % 8)
            r = scan_bytes(bytes(bad))
            assert not r.ok, (entry["file"], start, bit)
            assert r.error.startswith(f"at offset {start}:"), (entry["file"], start, bit, r.error)
            assert r.good_end <= start
            flips += 1
    assert flips > 500


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_random_bytes_give_a_clear_error(data):
    r = scan_bytes(data)
    assert r.error is not None
    assert r.error.startswith("at offset")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600), st.sampled_from(["8.0.36", "10.11.6-MariaDB-log", "5.1.73"]))
def test_random_bytes_after_a_valid_header_never_hang_or_crash(tail, version):
    data = E.binlog_file(server_version=version, checksum=version != "5.1.73") + tail
    r = scan_bytes(data)
    assert r.events >= 1
    assert (r.error is None) == r.ok or r.crc_errors
    assert 4 <= r.good_end <= len(data)


@pytest.mark.parametrize("version", ["8.0.36", "10.11.6-MariaDB-log"])
def test_mutated_real_streams_never_crash(version):
    rng = random.Random(5)
    if "MariaDB" in version:
        events = [E.maria_gtid(i, flags2=C.FL_STANDALONE if i % 2 else 0) for i in range(1, 30)]
        events = [x for i, g in enumerate(events, 1) for x in (g, E.query("BEGIN" if i % 2 == 0 else "CREATE TABLE t (a INT)"), *( [E.xid()] if i % 2 == 0 else []))]
    else:
        events = [x for i in range(1, 30) for x in (E.gtid(i), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid())]
    data = E.binlog_file(*events, server_version=version)
    for _ in range(2000):
        bad = bytearray(data)
        for _ in range(rng.randrange(1, 6)):
            bad[rng.randrange(4, len(bad))] = rng.randrange(256)
        r = scan_bytes(bytes(bad), verify_checksums=rng.random() < 0.5)
        assert r.good_end <= len(bad)
