"""benchmarks/spark_parse_cost.py on a few corpus files with local[2]: output schema, and event counts equal to the
manifest's, with one file forced into many splits (never an assertion on timings)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from relayproxy.binlog.reader import scan_file

from benchmarks import spark_parse_cost

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.spark

# One file per flavour family: MySQL 5.7, MySQL 8.0, MariaDB 10.0, and a MariaDB 11.8 file of 527 events that
# --split-bytes 4096 cuts into many splits.
FILES = {
    "apecloud-mysql-binlog-connector-rust/tests/parse_file_tests/mysql-bin.000080": "5.7.40-log",
    "blackbeam-rust_mysql_common/test-data/binlogs/json.binlog.000001": "8.0.22",
    "pingcap-tiflow/mysql-bin.000001": "10.0.17-MariaDB-1~wheezy-log",
    "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0/mariadb-repl-bin.000005": "11.8.5-MariaDB-ubu2404-log",
}
SPLIT_FILE = "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0/mariadb-repl-bin.000005"
REQUIRED_COLUMNS = ["stream", "server_version", "event_type", "parser", "events", "bytes", "mean_ns", "p50_ns",
                    "p90_ns", "p99_ns"]


def rel(path: str, corpus: Path) -> str:
    """Corpus-relative name of a path as Spark reports it (file:/...)."""
    return str(Path(path.removeprefix("file:")).resolve().relative_to(corpus))


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


@pytest.fixture(scope="module")
def job(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("spark_parse_cost")
    # Short walk samples: the test checks what the walks report, not their timings.
    argv = ["--master", "local[2]", "--output", str(out), "--split-bytes", "4096", "--partitions", "3",
            "--walk-min-sample", "0.01", "--walk-repeat", "1"]
    for name in FILES:
        argv += ["--input", str(corpus_dir / name)]
    argv += ["--input", f"not-binlogs={corpus_dir / 'manifest.json'}"]  # kept out by its first bytes, not its name
    assert spark_parse_cost.main(argv) == 0
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    try:
        schemas = {name: spark.read.parquet(str(out / "parquet" / name)).schema
                   for name in ("events", "event_runs", "summary", "files", "file_counts")}
        split_offsets = [
            (r["path"], r["split"], r["offset"])
            for r in spark.read.parquet(str(out / "parquet" / "events")).select("path", "split", "offset").collect()
        ]
        run_offsets = [(r["run"], r["path"], r["offset"]) for r in
                       spark.read.parquet(str(out / "parquet" / "event_runs")).select("run", "path", "offset").collect()]
    finally:
        spark.stop()
    return {"out": out, "schemas": schemas, "offsets": split_offsets, "run_offsets": run_offsets}


def test_summary_csv_columns_and_rows(job: dict[str, Any]) -> None:
    header, rows = read_csv(job["out"] / "summary.csv")
    assert header[: len(REQUIRED_COLUMNS)] == REQUIRED_COLUMNS
    assert header == spark_parse_cost.SUMMARY_COLUMNS
    assert rows
    assert {r["parser"] for r in rows} == set(spark_parse_cost.PARSERS)
    assert {r["server_version"] for r in rows} == set(FILES.values())
    for r in rows:
        assert int(r["events"]) > 0 and int(r["bytes"]) > 0, r
        for column in ("mean_ns", "p50_ns", "p90_ns", "p99_ns", "events_per_s", "mb_per_s"):
            float(r[column])  # present and numeric; the values themselves are timings, never asserted


def test_parquet_schemas(job: dict[str, Any]) -> None:
    def fields(name: str) -> dict[str, str]:
        return {f.name: f.dataType.simpleString() for f in job["schemas"][name].fields}

    summary = fields("summary")
    assert list(summary)[: len(REQUIRED_COLUMNS)] == REQUIRED_COLUMNS
    assert summary == {
        "stream": "string", "server_version": "string", "event_type": "string", "parser": "string",
        "events": "bigint", "bytes": "bigint", "mean_ns": "double", "p50_ns": "double", "p90_ns": "double",
        "p99_ns": "double", "flavour": "string", "events_per_s": "double", "mb_per_s": "double", "total_ns": "double",
    }
    events = fields("events")
    assert events == {name: {"long": "bigint"}.get(kind, kind) for name, kind in spark_parse_cost.EVENT_SCHEMA_FIELDS}
    assert fields("event_runs") == {"run": "int", **events}
    assert fields("file_counts") == {"stream": "string", "path": "string", "event_type": "string", "parser": "string",
                                     "events": "bigint", "bytes": "bigint"}
    assert set(fields("files")) == {"path", "stream", "bytes", "binlog", "events", "splits", "server_version", "error"}


def test_event_counts_per_file_and_type_equal_the_manifest(job: dict[str, Any], corpus_dir: Path,
                                                           manifest: list[dict[str, Any]]) -> None:
    expected = {entry["file"]: entry["counts"] for entry in manifest if entry["file"] in FILES}
    assert len(expected) == len(FILES)
    header, rows = read_csv(job["out"] / "file_counts.csv")
    counted: dict[str, dict[str, int]] = {}
    for r in rows:
        assert r["parser"] == "boundary"
        counted.setdefault(rel(r["path"], corpus_dir), {})[r["event_type"]] = int(r["events"])
    assert counted == expected

    # The summary's boundary rows add up to the same counts per type.
    _, summary = read_csv(job["out"] / "summary.csv")
    per_type: dict[str, int] = {}
    for r in summary:
        if r["parser"] == "boundary":
            per_type[r["event_type"]] = per_type.get(r["event_type"], 0) + int(r["events"])
    total: dict[str, int] = {}
    for counts in expected.values():
        for name, n in counts.items():
            total[name] = total.get(name, 0) + n
    assert per_type == total


def test_splits_neither_lose_nor_double_count_events(job: dict[str, Any], corpus_dir: Path) -> None:
    _, files = read_csv(job["out"] / "files.csv")
    by_name = {rel(f["path"], corpus_dir): f for f in files}
    assert set(by_name) == set(FILES) | {"manifest.json"}
    assert by_name["manifest.json"]["binlog"] == "False" and by_name["manifest.json"]["events"] == "0"
    assert int(by_name[SPLIT_FILE]["splits"]) >= 10  # 74 KB cut at ~4 KB
    for name in FILES:
        assert int(by_name[name]["splits"]) >= 1

    # Every event of the split file measured exactly once, at the offsets the relay's scanner finds.
    offsets: list[int] = []
    scan_file(corpus_dir / SPLIT_FILE, on_event=lambda ev: offsets.append(ev.offset))
    measured = [(split, offset) for path, split, offset in job["offsets"] if rel(path, corpus_dir) == SPLIT_FILE]
    assert sorted(offset for _split, offset in measured) == offsets
    assert len({split for split, _offset in measured}) == int(by_name[SPLIT_FILE]["splits"])


def test_every_run_measures_every_event_once(job: dict[str, Any]) -> None:
    """Three runs by default (the order alternated): each run has every event once, the same events as the
    per-event table (each event's median over the runs)."""
    events = sorted((path, offset) for path, _split, offset in job["offsets"])
    assert len(set(events)) == len(events)
    runs: dict[int, list] = {}
    for run, path, offset in job["run_offsets"]:
        runs.setdefault(run, []).append((path, offset))
    assert sorted(runs) == [0, 1, 2]
    for run, measured in runs.items():
        assert sorted(measured) == events, run


def test_report_files(job: dict[str, Any]) -> None:
    out = job["out"]
    text = (out / "summary.md").read_text()
    # The shared header: the command, the commit and clean/dirty code, the repeats.
    assert "Produced by (from the repository root):" in text and "--split-bytes 4096" in text
    assert "- commit: " in text and "; tree: " in text
    assert "- repeats: 3 runs, the order of relay and peer alternated between runs" in text
    # The headline: with and without blob events, per run in alternated order, both methods side by side.
    assert "A **blob event** here is any event of at least 65,536 bytes" in text
    assert "| without blob events (>= 65,536 bytes) |" in text
    lines = text.splitlines()
    orders = [line.split("|")[2].strip() for line in lines if line.startswith(("| 1 |", "| 2 |", "| 3 |"))]
    assert orders[:3] == ["relayproxy then pymysqlreplication", "pymysqlreplication then relayproxy",
                          "relayproxy then pymysqlreplication"], orders
    assert "### Two methods on the same events" in text
    walk_row = next(line for line in lines if line.startswith("| all events ("))
    assert walk_row.count("3 runs)") == 9, walk_row  # every figure of both methods: median and range of 3 runs
    assert "## Timing method and its measured error" in text and "## Machine" in text
    for name in ("by_stream.png", "by_event_type.png", "distribution.png", "ratios.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"({name})" in text
