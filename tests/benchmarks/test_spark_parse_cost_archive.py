"""benchmarks/spark_parse_cost.py reading relay archives (``--archive``): corpus files uploaded by the real
ArchiveUploader to a file:// archive (parts framed: zstd + AES-256-GCM) and to an s3:// archive on moto's server over
real HTTP (plain parts), read in one local[2] run beside the same files given as local ``--input``: the same events
per file and type; a corrupted part stops the job naming its key. The reading and listing functions are also tested
on their own (no Spark)."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from relayproxy.binlog.reader import BinlogScanner
from relayproxy.relay import archive as A
from relayproxy.relay.closed_files import Keyring
from relayproxy.relay.conversion import StorageOptions
from relayproxy.relay.objectstore import FileObjectStore, open_object_store
from relayproxy.relay.remote import ArchiveReadError

from benchmarks import spark_parse_cost as S

from ..support.s3server import BUCKET, REGION, MotoServer

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmarks" / "spark_parse_cost.py"
KEY_TEXT = "1:" + "ab" * 32

# The file:// archive (framed parts) holds two MySQL files, the s3:// one (plain parts) two MariaDB files; the last
# file of each stays unsealed (read with --archive-open). The 527-event MariaDB file is cut into many splits.
MYSQL = ["apecloud-mysql-binlog-connector-rust/tests/parse_file_tests/mysql-bin.000080",
         "blackbeam-rust_mysql_common/test-data/binlogs/json.binlog.000001"]
MARIADB = ["pingcap-tiflow/mysql-bin.000001",
           "mariadb-operator-mariadb-poc/mariadb-binlog/binlogs/domain_id_0/mariadb-repl-bin.000005"]


@dataclass(frozen=True)
class Snap:
    """What the uploader reads of the store's horizon."""

    file: str | None
    position: int
    text: str | None = None


def boundary_near_middle(image: bytes) -> int:
    """An event end near the middle of a file where no transaction is open (where the relay may end a part)."""
    ends: list[int] = []

    def on_event(ev) -> None:
        if not scanner.parser.in_group:
            ends.append(ev.end)

    scanner = BinlogScanner(on_event=on_event, track_gtids=False)
    scanner.feed(image)
    scanner.finish()
    inside = [e for e in ends if 4 < e < len(image)]
    assert inside, "no boundary inside the file"
    return min(inside, key=lambda e: abs(e - len(image) // 2))


def build_archive(bucket, corpus: Path, files: list[str], relay_dir: Path, storage=None) -> dict[str, str]:
    """Upload corpus files as one relay's history with the real uploader, in order: each file in two parts (the
    horizon stops at a boundary near its middle, then at its end), every file but the last sealed. Returns
    archive name -> corpus file."""
    relay_dir.mkdir(parents=True)
    names: list[str] = []
    state = {"snap": Snap(None, 0)}
    up = A.ArchiveUploader(relay_dir, bucket, lambda: list(names), lambda: state["snap"], flavour=lambda: "mysql",
                           storage=storage, interval=0.05)
    out = {}
    for rel in files:
        name = Path(rel).name
        image = (corpus / rel).read_bytes()
        shutil.copyfile(corpus / rel, relay_dir / name)  # the relay's copy, in the test's temporary folder
        names.append(name)
        out[name] = rel
        for position in (boundary_near_middle(image), len(image)):
            state["snap"] = Snap(name, position)
            up.run_once()
    listed = A.bucket_files(o.key for o in bucket.list(A.FILES_PREFIX))
    assert [listed[n].sealed for n in names] == [True] * (len(names) - 1) + [False]
    assert all(len(listed[n].parts) == 2 for n in names)
    return out


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_script(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The job as a user runs it: its own process, so its Spark JVM and Python workers get this environment (the AWS
    chain's variables) whatever JVM this test process already runs."""
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})}, cwd=REPO_ROOT)


QUICK = ["--master", "local[2]", "--runs", "1", "--repeats", "1", "--recheck-every", "0", "--max-batch", "4",
         "--partitions", "2", "--shuffle-partitions", "2"]


# ---------------------------------------------------------------------------------------------
# One Spark run: local files, a file:// archive (framed) and an s3:// archive (plain), the same files


@pytest.fixture(scope="module")
def archives_job(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("spark_archive")
    server = MotoServer(tmp)
    server.start()
    try:
        server.create_bucket()
        key_file = tmp / "keys"
        key_file.write_text(KEY_TEXT + "\n")
        storage = StorageOptions(compress="zstd", encrypt=True, keyring=Keyring.parse(KEY_TEXT, "test"))
        file_root = tmp / "archive-mysql"
        mysql = build_archive(FileObjectStore(file_root), corpus_dir, MYSQL, tmp / "relay-mysql", storage=storage)
        s3 = open_object_store(f"s3://{BUCKET}/relays/mariadb-1", endpoint=server.endpoint, region=REGION,
                               access_key_id=server.access_key, secret_access_key=server.secret_key)
        mariadb = build_archive(s3, corpus_dir, MARIADB, tmp / "relay-mariadb")
        out = tmp / "out"
        argv = [*QUICK, "--output", str(out), "--split-bytes", "4096",
                "--archive", f"mysql=file://{file_root}", "--encryption-key-file", str(key_file),
                "--archive", f"s3a://{BUCKET}/relays/mariadb-1", "--archive-endpoint", server.endpoint,
                "--archive-region", REGION, "--archive-open"]
        for rel in MYSQL + MARIADB:
            argv += ["--input", f"local={corpus_dir / rel}"]
        done = run_script(argv, server.env)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-4000:]
    paths = {**{f"file://{file_root}/files/{n}": rel for n, rel in mysql.items()},
             **{f"s3://{BUCKET}/relays/mariadb-1/files/{n}": rel for n, rel in mariadb.items()}}
    return {"out": out, "stderr": done.stderr, "archived": paths, "file_root": file_root}


def local_rel(path: str, corpus: Path) -> str | None:
    if not path.startswith("file:") or "/files/" in path:
        return None
    return str(Path(path.removeprefix("file:")).resolve().relative_to(corpus))


@pytest.mark.spark
def test_archived_files_give_the_events_the_local_files_give(archives_job: dict[str, Any], corpus_dir: Path,
                                                             manifest: list[dict[str, Any]]) -> None:
    archived = archives_job["archived"]
    counts: dict[str, dict[str, int]] = {}
    for r in read_csv(archives_job["out"] / "file_counts.csv"):
        counts.setdefault(r["path"], {})[r["event_type"]] = int(r["events"])
    local = {local_rel(p, corpus_dir): c for p, c in counts.items() if local_rel(p, corpus_dir)}
    expected = {e["file"]: e["counts"] for e in manifest if e["file"] in MYSQL + MARIADB}
    assert local == expected
    assert {p: c for p, c in counts.items() if p in archived} == {p: local[rel] for p, rel in archived.items()}
    assert set(counts) == set(archived) | {p for p in counts if local_rel(p, corpus_dir)}

    files = {f["path"]: f for f in read_csv(archives_job["out"] / "files.csv")}
    by_rel = {local_rel(p, corpus_dir): f for p, f in files.items() if local_rel(p, corpus_dir)}
    for path, rel in archived.items():
        got, want = files[path], by_rel[rel]
        assert got["stream"] == ("mysql" if path.startswith("file:") else "mariadb-1")
        for column in ("bytes", "binlog", "events", "splits", "server_version", "error"):
            assert got[column] == want[column], (path, column)
        assert int(got["bytes"]) == (corpus_dir / rel).stat().st_size
    assert int(files[f"s3://{BUCKET}/relays/mariadb-1/files/mariadb-repl-bin.000005"]["splits"]) >= 10

    summary = read_csv(archives_job["out"] / "summary.csv")
    assert {r["stream"] for r in summary} == {"local", "mysql", "mariadb-1"}
    text = (archives_job["out"] / "summary.md").read_text()
    assert f"`file://{archives_job['file_root']} (archive)` (stream `mysql`)" in text and f"`s3://{BUCKET}/relays/mariadb-1 (archive)` (stream `mariadb-1`)" in text
    assert "walks were left out" in text
    assert "archive s3://relay-archive/relays/mariadb-1 (stream mariadb-1): 1 sealed, 1 unsealed file(s)" \
        in archives_job["stderr"]


# ---------------------------------------------------------------------------------------------
# A corrupted part: the job stops naming its key


@pytest.mark.spark
def test_a_corrupted_part_stops_the_job_naming_its_key(corpus_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "archive"
    bucket = FileObjectStore(root)
    build_archive(bucket, corpus_dir, MYSQL, tmp_path / "relay")
    name = Path(MYSQL[0]).name
    start, end = A.bucket_files(o.key for o in bucket.list(A.FILES_PREFIX))[name].parts[1]
    key = A.part_key(name, start, end)
    damaged = bytearray((root / key).read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF  # one bit flipped at rest; the object's metadata still gives the sha256
    (root / key).write_bytes(bytes(damaged))
    done = run_script([*QUICK, "--output", str(tmp_path / "out"), "--archive", f"file://{root}"])
    assert done.returncode != 0
    assert f"spark_parse_cost: refusing the archive: {key} is corrupt: its bytes do not match its SHA-256" \
        in done.stderr, done.stderr[-4000:]
    assert not (tmp_path / "out" / "summary.md").exists()


# ---------------------------------------------------------------------------------------------
# The driver's listing and the task's reading, without Spark


def entry_of(bucket, url: str, name: str) -> S.ArchivedFile:
    have = A.bucket_files(o.key for o in bucket.list(A.FILES_PREFIX))[name]
    return S.ArchivedFile(url, None, None, name, "s", have.sealed, have.parts)


def test_archive_urls_and_labels() -> None:
    assert S.ArchiveSpec.parse("s3a://b/relays/r1/") == S.ArchiveSpec("s3://b/relays/r1", None)
    assert S.ArchiveSpec.parse("fleet=s3://b/p").stream == "fleet"
    assert S.ArchiveSpec.parse("s3://b/relays/r1").stream == "r1"
    assert S.ArchiveSpec.parse("file:///mnt/a/relay-2").url == "file:///mnt/a/relay-2"
    for bad in ("hdfs:///x", "/mnt/a", "file://relative/x", "s3://", "x="):
        with pytest.raises(ValueError):
            S.ArchiveSpec.parse(bad)


def test_the_listing_leaves_out_unsealed_files_unless_asked(corpus_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "archive"
    build_archive(FileObjectStore(root), corpus_dir, MYSQL, tmp_path / "relay")
    spec = S.ArchiveSpec(f"file://{root}", None)
    files, left_out = S.list_archive(spec)
    assert [(f.name, f.sealed) for f in files] == [("mysql-bin.000080", True)]
    assert left_out == ["json.binlog.000001"]
    files, left_out = S.list_archive(spec, include_open=True)
    assert [(f.name, f.sealed) for f in files] == [("json.binlog.000001", False), ("mysql-bin.000080", True)]
    assert files[0].size == (corpus_dir / MYSQL[1]).stat().st_size and left_out == []
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match=f"holds no relayproxy archive: {A.ARCHIVE_KEY} is missing"):
        S.list_archive(S.ArchiveSpec(f"file://{tmp_path / 'empty'}", None))
    with pytest.raises(SystemExit, match="no such directory"):
        S.list_archive(S.ArchiveSpec(f"file://{tmp_path / 'nowhere'}", None))
    assert not (tmp_path / "nowhere").exists()


def test_framed_parts_are_decoded_with_the_key_and_refused_without_it(corpus_dir: Path, tmp_path: Path) -> None:
    keyring = Keyring.parse(KEY_TEXT, "test")
    root = tmp_path / "archive"
    bucket = FileObjectStore(root)
    build_archive(bucket, corpus_dir, MYSQL, tmp_path / "relay",
                  storage=StorageOptions(compress="zstd", encrypt=True, keyring=keyring))
    for rel in MYSQL:
        entry = entry_of(bucket, f"file://{root}", Path(rel).name)
        assert S.read_archived_file(entry, bucket, keyring, tmp_path) == (corpus_dir / rel).read_bytes()
    entry = entry_of(bucket, f"file://{root}", Path(MYSQL[0]).name)
    with pytest.raises(ArchiveReadError) as caught:
        S.read_archived_file(entry, bucket, None, tmp_path)
    assert caught.value.key == A.part_key(entry.name, *entry.parts[0])
    assert str(caught.value).startswith(f"{caught.value.key} cannot be read back") and \
        "--encryption-key-file" in str(caught.value)


def test_a_missing_part_and_a_wrong_manifest_are_refused_by_name(corpus_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "archive"
    bucket = FileObjectStore(root)
    build_archive(bucket, corpus_dir, MYSQL, tmp_path / "relay")
    name = Path(MYSQL[0]).name
    entry = entry_of(bucket, f"file://{root}", name)
    image = (corpus_dir / MYSQL[0]).read_bytes()
    assert S.read_archived_file(entry, bucket) == image

    mkey = A.manifest_key(name)
    manifest = json.loads(bucket.get(mkey))
    bucket.put(mkey, json.dumps({**manifest, "sha256": hashlib.sha256(b"other").hexdigest()}).encode())
    with pytest.raises(ArchiveReadError, match=f"^{mkey}: {name}'s SHA-256 ") as caught:
        S.read_archived_file(entry, bucket)
    assert caught.value.key == mkey

    bucket.put(mkey, json.dumps(manifest).encode())
    gone = A.part_key(name, *entry.parts[0])
    bucket.delete(gone)
    with pytest.raises(ArchiveReadError, match=f"^{gone} is missing") as caught:
        S.read_archived_file(entry, bucket)
    assert caught.value.key == gone
