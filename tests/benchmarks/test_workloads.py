"""benchmarks/workloads.py records real streams through the relay: each shape's recording ends at the master's end
position and holds the events the shape is about (events over 16 MB, XA prepares, four GTID domains, statements)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import workloads
from relayproxy.binlog import constants as C
from relayproxy.binlog.reader import scan_file
from relayproxy.binlog.views import view_event

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.server

SHAPES = ["blobs", "xa", "domains", "statement", "ddl"]


def binlog_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.read_bytes()[:4] == C.BINLOG_MAGIC)


def test_record_small_dataset(tmp_path: Path) -> None:
    dataset = tmp_path / "streams"
    manifest = workloads.record(dataset, SHAPES, scale=0.02, workdir=tmp_path / "work")
    assert list(manifest["shapes"]) == SHAPES
    assert "MariaDB" in manifest["server_version"]

    for name in SHAPES:
        shape = manifest["shapes"][name]
        folder = dataset / name
        files = binlog_files(folder)
        # The relay's own files are the recording: its index lists exactly the binlog files, in order.
        assert [p.name for p in files] == (folder / "relayproxy.index").read_text().split()
        assert [f["file"] for f in shape["files"]] == [p.name for p in files]
        # Recorded up to the master's end: the last relay file ends at the master's final position.
        end_file, end_pos = shape["master_end"]
        assert files[-1].name == end_file and files[-1].stat().st_size == end_pos, (name, shape["master_end"])
        assert shape["events"] == sum(scan_file(p).events for p in files) > 0

    counts = {name: manifest["shapes"][name]["counts"] for name in SHAPES}

    blobs = manifest["shapes"]["blobs"]
    assert blobs["largest_event"] > 16 << 20  # more than one 16 MB wire packet
    assert blobs["workload"]["rows_over_16mb"] >= 1
    assert counts["blobs"]["WRITE_ROWS_V1"] >= 2 and counts["blobs"]["UPDATE_ROWS_V1"] == 1

    xa = manifest["shapes"]["xa"]["workload"]
    # Two-phase branches end their first group with XA_PREPARE; one-phase commits are ordinary XID groups.
    assert counts["xa"]["XA_PREPARE"] == xa["commit"] + xa["rollback"]
    assert counts["xa"]["XID"] >= xa["one_phase"]

    domain_ids = set()

    def note_domain(ev) -> None:
        if ev.type_code == C.MARIA_GTID_EVENT:
            domain_ids.add(view_event(ev.data, 0, fde).domain_id)

    for path in binlog_files(dataset / "domains"):
        fde = scan_file(path).fde
        scan_file(path, on_event=note_domain)
    assert domain_ids == set(manifest["shapes"]["domains"]["workload"]["domains"]) == {0, 1, 2, 3}

    statement = counts["statement"]
    assert statement["INTVAR"] > 0 and statement["RAND"] > 0 and statement["USER_VAR"] > 0
    assert not any(t.endswith(("ROWS_V1", "ROWS_V2")) or t == "TABLE_MAP" for t in statement)

    ddl = manifest["shapes"]["ddl"]["workload"]
    # Every statement is a QUERY but the one INSERT per round, which row format logs as a rows event.
    assert counts["ddl"]["QUERY"] == ddl["statements"] - ddl["rounds"]
    assert counts["ddl"]["WRITE_ROWS_V1"] == ddl["rounds"]
