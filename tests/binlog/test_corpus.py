"""The whole real corpus: every file walked, counted, CRC-checked and cut into groups that independent rules confirm."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from relayproxy.binlog import constants as C
from relayproxy.binlog.events import FormatDescription, split_version
from relayproxy.binlog.reader import ScannedEvent, ScannedGroup, scan_file
from relayproxy.commands import cli

TRUNCATED_FILES = {
    # magic + 10 bytes: not even one event header
    "blackbeam-rust_mysql_common/test-data/binlogs/binlog_truncated_event.000001",
    # a FORMAT_DESCRIPTION then a PREVIOUS_GTIDS event cut short
    "blackbeam-rust_mysql_common/test-data/binlogs/binlog_truncated_prev_gtid_event.000001",
}
# Files whose last group is genuinely unfinished (the server stopped writing mid-transaction).
UNFINISHED_TAIL = {
    "blackbeam-rust_mysql_common/test-data/binlogs/ver_5_1-wl2325_s.001",  # BEGIN ... STOP, no COMMIT
    "osheroff-mysql-binlog-connector-java/src/test/resources/mysql-bin.aurora-padding",  # ends after BEGIN
}


def full_scan(path: Path):
    events: list[ScannedEvent] = []
    groups: list[ScannedGroup] = []
    result = scan_file(path, on_event=events.append, on_group=groups.append)
    return result, events, groups


@pytest.fixture(scope="module")
def scans(corpus_dir, manifest):
    return {e["file"]: full_scan(corpus_dir / e["file"]) for e in manifest}


def test_every_file_walked_to_its_end_with_manifest_counts(scans, manifest, corpus_dir):
    for entry in manifest:
        result, events, _ = scans[entry["file"]]
        name = entry["file"]
        if name in TRUNCATED_FILES:
            continue
        assert result.error is None, (name, result.error)
        assert result.events == entry["events"], name
        names = {C.event_name(t): n for t, n in result.counts_by_type.items()}
        assert names == entry["counts"], name
        assert result.server_version == entry["server_version"], name
        assert events[-1].end == (corpus_dir / name).stat().st_size, f"{name}: not walked to the end"
        assert result.in_use == bool(entry["in_use_flag"]), name


def test_every_crc_verified(scans, manifest):
    for entry in manifest:
        result, events, _ = scans[entry["file"]]
        assert result.crc_errors == 0, (entry["file"], result.error)
        if entry["checksum_alg"] == "CRC32":
            assert result.checksum == "CRC32"
            assert all(ev.crc_ok is True for ev in events), entry["file"]
        elif entry["checksum_alg"] == "NONE":
            assert result.checksum == "NONE"
            assert all(ev.crc_ok is None for ev in events)
        elif entry["file"] not in TRUNCATED_FILES:
            assert result.checksum is None  # pre-5.6 server: no checksum byte at all


def test_truncated_and_in_use_files_reported_as_such(scans):
    for name in TRUNCATED_FILES:
        result, _, _ = scans[name]
        assert result.truncated_event and result.partial_tail and not result.ok
        assert re.match(r"at offset \d+: file ends inside", result.error), result.error
    result, events, _ = scans["blackbeam-rust_mysql_common/test-data/binlogs/binlog_truncated_prev_gtid_event.000001"]
    assert [e.type_code for e in events] == [C.FORMAT_DESCRIPTION_EVENT]
    assert result.good_end == events[0].end  # recovery would keep exactly the FDE
    for name in UNFINISHED_TAIL:
        result, _, groups = scans[name]
        assert result.ok and result.partial_tail and not groups[-1].complete, name


def test_mysql_groups_match_transaction_length(scans, manifest):
    """MySQL 8.0.2+: the GTID event's transaction_length is the byte length of its group."""
    from relayproxy.binlog.views import view_event

    checked = 0
    for entry in manifest:
        result, events, groups = scans[entry["file"]]
        if result.fde is None or result.fde.is_mariadb:
            continue
        by_start = {g.start: g for g in groups}
        fde = None
        for ev in events:
            if ev.type_code == C.FORMAT_DESCRIPTION_EVENT:
                fde = FormatDescription.parse(ev.data, 0)
            elif ev.type_code in (C.GTID_LOG_EVENT, C.ANONYMOUS_GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT):
                length = view_event(ev.data, 0, fde).transaction_length
                if length is None:
                    assert split_version(fde.server_version) < (8, 0, 2), entry["file"]
                    continue
                group = by_start.get(ev.offset)
                assert group is not None, f"{entry['file']}: no group starts at GTID offset {ev.offset}"
                if group.complete:
                    assert group.end - group.start == length, (entry["file"], ev.offset)
                    checked += 1
    assert checked >= 40  # 8.0.2+ files in the corpus hold dozens of GTID groups


def mariadb_group_ends(events: list[ScannedEvent], checksum_len: int) -> list[tuple[int, int]]:
    """An independent reading of MariaDB's rule: (start, end) of every group from the GTID flags alone."""
    spans = []
    i = 0
    while i < len(events):
        ev = events[i]
        if ev.type_code != C.MARIA_GTID_EVENT:
            i += 1
            continue
        standalone = ev.data[19 + 12] & C.FL_STANDALONE
        j = i + 1
        while j < len(events):
            e = events[j]
            body = e.data[: len(e.data) - checksum_len]
            if standalone and e.type_code in (C.QUERY_EVENT, C.MARIA_QUERY_COMPRESSED_EVENT, C.INCIDENT_EVENT):
                break
            if not standalone and (
                e.type_code in (C.XID_EVENT, C.XA_PREPARE_LOG_EVENT)
                or (e.type_code == C.QUERY_EVENT and (body.endswith(b"\0COMMIT") or body.endswith(b"\0ROLLBACK")))
            ):
                break
            j += 1
        if j < len(events):
            spans.append((ev.offset, events[j].end))
        i = j + 1
    return spans


def test_mariadb_groups_match_gtid_flags(scans, manifest):
    checked = 0
    for entry in manifest:
        result, events, groups = scans[entry["file"]]
        if result.fde is None or not result.fde.is_mariadb:
            continue
        expected = mariadb_group_ends(events, result.fde.checksum_len)
        assert [(g.start, g.end) for g in groups if g.complete] == expected, entry["file"]
        assert result.groups_complete == entry["counts"].get("MARIA_GTID", 0)
        checked += len(expected)
    assert checked > 5000


def test_gtid_groups_carry_their_gtid(scans, manifest):
    from relayproxy.binlog.views import view_event

    for entry in manifest:
        result, events, groups = scans[entry["file"]]
        if result.fde is None:
            continue
        gtid_events = {ev.offset: ev for ev in events if ev.type_code in (C.GTID_LOG_EVENT, C.GTID_TAGGED_LOG_EVENT, C.MARIA_GTID_EVENT)}
        for g in groups:
            if g.start in gtid_events:
                v = view_event(gtid_events[g.start].data, 0, result.fde)
                if result.fde.is_mariadb:
                    assert g.gtid == (v.domain_id, v.server_id, v.seq_no)
                elif getattr(v, "tag", ""):
                    assert g.gtid == (v.sid, v.tag, v.gno)
                else:
                    assert g.gtid == (v.sid, v.gno)


def consecutive_pairs(manifest):
    """(file N, file N+1) pairs in the same folder written by the same server, by the numeric extension."""
    version = {e["file"]: e["server_version"] for e in manifest}
    by_name = set(version)
    pairs = []
    for name in sorted(by_name):
        m = re.match(r"(.*\.)(\d+)$", name)
        if not m:
            continue
        successor = f"{m.group(1)}{int(m.group(2)) + 1:0{len(m.group(2))}d}"
        if successor in by_name and version[successor] == version[name]:
            pairs.append((name, successor))
    return pairs


def test_gtid_set_rebuilt_from_file_equals_next_files_start(scans, manifest):
    pairs = consecutive_pairs(manifest)
    assert len(pairs) >= 5
    for first, second in pairs:
        r1, _, _ = scans[first]
        r2, _, _ = scans[second]
        if r2.start_gtids is None:
            assert r1.gtids_after is None, (first, second)
            continue
        assert r1.gtids_after == r2.start_gtids, (first, second, str(r1.gtids_after), str(r2.start_gtids))


def test_inspect_json_over_the_whole_corpus(corpus_dir, manifest, capsys):
    files = [str(corpus_dir / e["file"]) for e in manifest]
    status = cli.main(["--log-format", "json", "inspect", "--json", *files])
    lines = capsys.readouterr().out.splitlines()
    assert status == 1  # the deliberately truncated files make the run fail
    assert len(lines) == len(files)
    for entry, line in zip(manifest, lines):
        obj = json.loads(line)
        for key in ("file", "server_version", "checksum", "events", "counts_by_type", "crc_errors",
                    "groups_complete", "partial_tail", "gtid_set_after", "error"):
            assert key in obj, key
        assert obj["file"].endswith(entry["file"])
        if entry["file"] in TRUNCATED_FILES:
            assert obj["error"] and "offset" in obj["error"]
            continue
        assert obj["error"] is None
        assert obj["events"] == entry["events"]
        assert {C.event_name(int(k)): v for k, v in obj["counts_by_type"].items()} == entry["counts"]
        assert obj["checksum"] == {"CRC32": "CRC32", "NONE": "NONE"}.get(entry["checksum_alg"])


def test_inspect_exit_status_zero_for_well_formed_files(corpus_dir, capsys):
    good = corpus_dir / "shyiko-mysql-binlog-connector-java/src/test/resources/mysql-bin.checksum-crc32"
    assert cli.main(["inspect", str(good)]) == 0
    out = capsys.readouterr().out
    assert "group [" in out and "complete" in out and "CRC errors: 0" in out
    assert cli.main(["inspect", str(corpus_dir / "nonexistent.000001")]) == 1


def test_feed_buffer_batch_path_equals_per_event_feeding(corpus_dir, manifest, scans):
    """The batch fast path finds the same boundaries and GTIDs as feeding event by event."""
    from relayproxy.binlog.boundary import TransactionBoundaryParser

    for entry in manifest:
        result, events, groups = scans[entry["file"]]
        if entry["file"] in TRUNCATED_FILES:
            continue
        data = (corpus_dir / entry["file"]).read_bytes()
        ends = []
        parser = TransactionBoundaryParser()
        stop, last_boundary = parser.feed_buffer(data, 4, len(data), lambda end, gtid: ends.append((end, gtid)))
        assert stop == len(data), entry["file"]
        assert last_boundary == result.good_end or (result.partial_tail and last_boundary < len(data))
        if result.boundary_errors == 0:
            assert ends == [(g.end, g.gtid) for g in groups if g.complete], entry["file"]


def test_event_type_filter_and_group_end_timestamps(corpus_dir, manifest, scans):
    """``on_event_types`` hands over exactly the full scan's events of those types and changes nothing else; every
    group carries the header timestamp of its last event (the txindex's coarse commit time)."""
    from relayproxy.binlog.reader import BinlogScanner

    wanted = frozenset({C.GTID_LOG_EVENT, C.MARIA_GTID_EVENT, C.TABLE_MAP_EVENT, C.QUERY_EVENT})
    for entry in manifest:
        result, events, groups = scans[entry["file"]]
        by_end = {ev.end: ev for ev in events}
        for g in groups:
            if g.complete:
                assert g.end_timestamp == by_end[g.end].timestamp, (entry["file"], g)
        got_events: list[ScannedEvent] = []
        got_groups: list[ScannedGroup] = []
        scanner = BinlogScanner(on_event=got_events.append, on_group=got_groups.append, on_event_types=wanted)
        data = (corpus_dir / entry["file"]).read_bytes()
        for k in range(0, len(data), 4096):  # chunked, as the indexer feeds
            scanner.feed(data[k:k + 4096])
        filtered = scanner.finish()
        assert got_events == [ev for ev in events if ev.type_code in wanted], entry["file"]
        assert got_groups == groups, entry["file"]
        assert (filtered.good_end, filtered.error, filtered.events, filtered.crc_errors) == (
            result.good_end, result.error, result.events, result.crc_errors), entry["file"]
