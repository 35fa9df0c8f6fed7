"""Per-event parse cost over recorded binlog streams, in Spark: relayproxy's parsers vs python-mysql-replication.

Every event of the binlog files under ``--input`` (Hadoop-filesystem paths, ``LABEL=PATH`` naming the stream) and of
the relay archives given with ``--archive`` (read and checked by relayproxy's own archive reader) is timed on its own
with three parsers, ``boundary``, ``view`` and ``pymysqlreplication``: job 1 cuts each file into self-contained splits
with ``BinlogScanner``, job 2 times every event (best of ``--repeats`` batches, the loop's own cost subtracted)
``--runs`` times with the parsers' order alternated; between the runs the driver runs ``parse_cost.py``'s walks over
the same local files. What is measured, counted and compared is ``benchmarks/parsing.py``'s; docs/spark.md describes
the method, the outputs and cluster use.

    .venv/bin/python benchmarks/workloads.py          # record the default dataset first
    .venv/bin/python benchmarks/spark_parse_cost.py   # recorded streams + corpus, local[*]
    .venv/bin/python benchmarks/spark_parse_cost.py --input corpus=../shared/corpus/binlogs --output /tmp/pc
    .venv/bin/python benchmarks/spark_parse_cost.py --archive relay-1=s3://my-bucket/relays/relay-1 --output /tmp/pc
"""

from __future__ import annotations

import argparse
import csv
import functools
import gc
import io
import json
import operator
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = Path(__file__).resolve().parent
for _p in (str(REPO_ROOT), str(BENCH_DIR)):
    if _p not in sys.path:  # run as a plain script from anywhere
        sys.path.insert(0, _p)

import benchinfo  # noqa: E402
from benchmarks.common import logger, percentile, results_document, save_figure  # noqa: E402  (shipped: ship_code)
from parsing import (CONTESTANTS, DECODED, HEADER_FIELDS, VIEW_FIELDS, add_sums, carries_crc,  # noqa: E402
                     core_measures, corpus_path, decode_events, files_totals, fmt, fmt_x, fmt_runs, load_binlog,
                     outcome_of, ratio, run_in_order, scan_events, walk_figures)  # (parse_cost.py's too)

from relayproxy.binlog import constants as C  # noqa: E402
from relayproxy.binlog.boundary import TransactionBoundaryParser  # noqa: E402
from relayproxy.binlog.events import HEADER, FormatDescription  # noqa: E402
from relayproxy.binlog.reader import BinlogScanner  # noqa: E402
from relayproxy.binlog.views import view_event  # noqa: E402
from relayproxy.lab.reference import LIBRARY_VERSION, ReferenceDecodeError, ReferenceDecoder  # noqa: E402

DEFAULT_DATASET = REPO_ROOT / "benchmarks" / "data" / "streams"
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "data" / "spark_parse_cost"
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results" / "spark_parse_cost"
PARSERS = ("boundary", "view", "pymysqlreplication")
SUMMARY_COLUMNS = ["stream", "server_version", "event_type", "parser", "events", "bytes", "mean_ns", "p50_ns",
                   "p90_ns", "p99_ns", "flavour", "events_per_s", "mb_per_s", "total_ns"]
SCAN_CHUNK = 1 << 20
GC_EVERY = 20_000
CALIBRATION_SAMPLES = 500
# Estimated cost of a split for dealing splits to tasks: per event (three parsers, warm-up, batches)
# and per byte (python-mysql-replication copies and wraps every event).
COST_NS_PER_EVENT = 150_000
COST_NS_PER_BYTE = 1.0

_unpack_from = HEADER.unpack_from
_FDE = C.FORMAT_DESCRIPTION_EVENT
_clock = time.perf_counter_ns
RANK = "exclusive-rank"  # common.percentile's rule for the method's error: the value at index floor(q/100 * n)


log = logger("spark_parse_cost", clock=False)


# ---------------------------------------------------------------------------------------------
# Job 1 (executors): find binlog files and cut them into self-contained splits
@dataclass
class FileInfo:
    path: str
    stream: str
    bytes: int
    binlog: bool
    events: int = 0
    splits: int = 0
    server_version: str | None = None
    error: str | None = None


@dataclass
class Split:
    path: str
    stream: str
    number: int
    start: int  # file offset of data[0]
    events: int
    fde: bytes | None  # the FORMAT_DESCRIPTION in force at start (None: the split begins with it)
    data: bytes = field(repr=False)

    @property
    def key(self) -> str:
        return f"{self.path}#{self.number}"

    @property
    def cost(self) -> float:
        return self.events * COST_NS_PER_EVENT + len(self.data) * COST_NS_PER_BYTE


def stream_of(path: str, roots: list[tuple[str, str | None]]) -> str:
    """The stream a file belongs to: its input's label, or the first folder below its input."""
    for root, label in roots:
        if path == root or path.startswith(root.rstrip("/") + "/"):
            if label:
                return label
            rel = path[len(root.rstrip("/")) + 1 :]
            return rel.split("/", 1)[0] if "/" in rel else root.rstrip("/").rsplit("/", 1)[-1]
    return path.rsplit("/", 2)[-2] if "/" in path else path


def plan_file(path: str, stream: str, data: bytes, split_bytes: int, split_events: int):
    """Scan one file image with the relay's scanner and cut it where its boundary parser is outside any group: yields
    its FileInfo, then its Splits."""
    info = FileInfo(path, stream, len(data), data[:4] == C.BINLOG_MAGIC)
    if not info.binlog:
        yield info
        return
    cuts: list[tuple[int, int, bytes | None, int]] = []
    state = {"start": 4, "start_count": 0, "start_fde": None, "fde": None, "count": 0, "end": 4}

    def on_event(ev) -> None:
        state["count"] += 1
        state["end"] = ev.end
        if ev.type_code == _FDE:
            state["fde"] = ev.data
        if scanner.parser.in_group:
            return
        size = ev.end - state["start"]
        count = state["count"] - state["start_count"]
        if size >= split_bytes or count >= split_events:
            cuts.append((state["start"], ev.end, state["start_fde"], count))
            state.update(start=ev.end, start_count=state["count"], start_fde=state["fde"])

    scanner = BinlogScanner(on_event=on_event, track_gtids=False, path=path)
    view = memoryview(data)
    for offset in range(0, len(data), SCAN_CHUNK):
        scanner.feed(view[offset : offset + SCAN_CHUNK])
    result = scanner.finish()
    if state["count"] > state["start_count"]:
        cuts.append((state["start"], state["end"], state["start_fde"], state["count"] - state["start_count"]))
    info.events = state["count"]
    info.splits = len(cuts)
    info.server_version = result.server_version
    if result.error or result.crc_errors:
        info.error = result.error or f"{result.crc_errors} CRC32 mismatch(es)"
    yield info
    for n, (s, e, fde, count) in enumerate(cuts):
        yield Split(path, stream, n, s, count, fde, bytes(view[s:e]))


def plan_rows(rows, roots, split_bytes: int, split_events: int):
    for row in rows:
        yield from plan_file(row.path, stream_of(row.path, roots), bytes(row.content), split_bytes, split_events)


# ---------------------------------------------------------------------------------------------
# Job 1 from an archive (``--archive``, the bucket layout of relay/archive.py): the driver lists each archive,
# one task per relay file fetches its parts through relayproxy's object store, checks them and cuts the file
@dataclass(frozen=True)
class ArchiveSpec:
    url: str  # s3://bucket[/prefix] or file:///path; an s3a:// URL is read as s3://
    label: str | None

    @classmethod
    def parse(cls, text: str) -> "ArchiveSpec":
        label, rest = split_label(text, "--archive", "URL")
        scheme, sep, tail = rest.partition("://")
        if scheme == "s3a":
            scheme = "s3"
        if not sep or scheme not in ("s3", "file") or not tail.strip("/"):
            raise ValueError(f"--archive {text!r}: expected s3://bucket/prefix, s3a://bucket/prefix or file:///path")
        if scheme == "file" and not tail.startswith("/"):
            raise ValueError(f"--archive {text!r}: a file URL is file:///absolute/path")
        return cls(f"{scheme}://{tail.rstrip('/')}", label)

    @property
    def stream(self) -> str:  # the label, or the last component of the URL (one archive per relay)
        return self.label or self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class ArchivedFile:  # one relay file of an archive as the driver listed it: what one task reads
    url: str
    endpoint: str | None
    region: str | None
    name: str
    stream: str
    sealed: bool
    parts: tuple[tuple[int, int], ...]

    @property
    def path(self) -> str:  # how the reports name it: the archive's URL (never credentials) and its folder in it
        return f"{self.url}/files/{self.name}"

    @property
    def size(self) -> int:
        return self.parts[-1][1] if self.parts else 0


@dataclass
class ArchiveFault:
    message: str  # why an archived file cannot be read back whole and verified (the job stops, naming the object)


def _file_order(name: str):
    stem = name.rstrip("0123456789")
    return (stem, int(name[len(stem):]) if len(stem) < len(name) else -1, name)


def list_archive(spec: ArchiveSpec, *, endpoint: str | None = None, region: str | None = None,
                 include_open: bool = False) -> tuple[list[ArchivedFile], list[str]]:
    """The files of one archive (driver side: one listing of ``files/``), oldest first, and the names of the unsealed
    files left out (all of them read when ``include_open``). SystemExit naming the object when the URL holds no
    relayproxy archive or its parts do not chain."""
    from relayproxy.relay.archive import FILES_PREFIX, ArchiveError, bucket_files
    from relayproxy.relay.objectstore import ObjectStoreError, open_object_store
    from relayproxy.relay.remote import ArchiveReadError, read_archive_marker

    where = f"spark_parse_cost: --archive {spec.url}"
    if spec.url.startswith("file://") and not Path(urllib.parse.unquote(spec.url[len("file://"):])).is_dir():
        raise SystemExit(f"{where}: no such directory")  # (the file store would create it)
    try:
        store = open_object_store(spec.url, endpoint=endpoint, region=region)
        try:
            read_archive_marker(store)  # the check that the URL holds a relayproxy archive
        except ArchiveReadError as exc:
            raise SystemExit(f"{where}: {exc}") from None
        listed = bucket_files(o.key for o in store.list(FILES_PREFIX))
    except (ArchiveError, ObjectStoreError, ValueError) as exc:  # parts that do not chain; the store refused
        raise SystemExit(f"{where}: {exc}") from None
    names = sorted(listed, key=_file_order)
    left_out = [name for name in names if not listed[name].sealed and not include_open]
    return [ArchivedFile(spec.url, endpoint, region, name, spec.stream, listed[name].sealed, listed[name].parts)
            for name in names if name not in left_out], left_out


def read_archived_file(entry: ArchivedFile, store, keyring=None, scratch: Path | None = None) -> bytes:
    """The master's bytes of one archived relay file, read by relayproxy's own reader (``remote.download_parts``):
    every part checked against its SHA-256 and size, a sealed file's whole bytes against its manifest's.
    ``remote.ArchiveReadError`` naming the object key otherwise (missing, corrupt, undecodable)."""
    from relayproxy.relay.remote import ArchiveReadError, download_parts, manifest_key, part_key, read_manifest

    name = entry.name
    listed = [(start, end, part_key(name, start, end), None) for start, end in entry.parts]
    manifest = None
    if entry.sealed:
        manifest, named = read_manifest(store, name)
        key = manifest_key(name)
        have = {k for _s, _e, k, _h in listed}
        missing = next((k for _s, _e, k, _h in named if k not in have), None)
        if missing is not None:
            raise ArchiveReadError(f"{missing} is missing (named by {key})", missing, file=name)
        if [p[:3] for p in named] != [p[:3] for p in listed]:
            raise ArchiveReadError(f"{key} names other parts than the bucket holds for {name}", key, file=name)
        listed = named
    if not listed:
        key = manifest_key(name)
        raise ArchiveReadError(f"{key} names no part: {name} has no bytes in the archive", key, file=name)
    out = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="spark-parse-cost-archive-", dir=scratch) as tmp:
        whole = download_parts(store, name, listed, out, Path(tmp), keyring=keyring)
    if manifest is not None and whole.hexdigest() != manifest["sha256"]:
        key = manifest_key(name)
        raise ArchiveReadError(f"{key}: {name}'s SHA-256 {manifest['sha256']} is not its parts' "
                               f"({whole.hexdigest()})", key, file=name)
    return out.getvalue()


def plan_archived(entries, keyring, split_bytes: int, split_events: int):
    """Job 1's task for archived files (one per task): read, verify and cut each as ``plan_rows`` cuts a local file;
    a file that cannot be verified yields an ``ArchiveFault`` (the driver stops the job naming its key). Errors of
    the store itself (unreachable, credentials refused) fail the task, so Spark retries it."""
    from relayproxy.relay.objectstore import open_object_store
    from relayproxy.relay.remote import ArchiveReadError

    with tempfile.TemporaryDirectory(prefix="spark-parse-cost-archive-") as scratch:
        for entry in entries:
            store = open_object_store(entry.url, endpoint=entry.endpoint, region=entry.region)
            try:
                data = read_archived_file(entry, store, keyring, Path(scratch))
            except ArchiveReadError as exc:
                yield ArchiveFault(str(exc))
                continue
            yield from plan_file(entry.path, entry.stream, data, split_bytes, split_events)


def item_meta(item) -> dict:
    """What the driver collects of job 1's items: files and faults whole, splits without their bytes."""
    if isinstance(item, FileInfo):
        return {"kind": "file", **vars(item)}
    if isinstance(item, ArchiveFault):
        return {"kind": "fault", **vars(item)}
    return {"kind": "split", "key": item.key, "cost": item.cost, "events": item.events, "bytes": len(item.data)}


# ---------------------------------------------------------------------------------------------
# Job 2 (executors): the timing loops. Each returns the ns one batch of k calls took.
def _time_boundary(parser: TransactionBoundaryParser, data: bytes, pos: int, k: int) -> int:
    rollback = parser.rollback
    if data[pos + 4] == _FDE:  # as the relay does: adopt the new format, then feed the event
        t0 = _clock()
        for _ in range(k):
            rollback()
            _ts, type_code, _sid, size, _log_pos, flags = _unpack_from(data, pos)
            parser.set_format(FormatDescription.parse(data, pos, size))
            parser.feed(type_code, flags, data, pos, size)
        return _clock() - t0
    feed = parser.feed
    t0 = _clock()
    for _ in range(k):
        rollback()
        _ts, type_code, _sid, size, _log_pos, flags = _unpack_from(data, pos)
        feed(type_code, flags, data, pos, size)
    return _clock() - t0


def _time_rollback_only(parser: TransactionBoundaryParser, k: int) -> int:
    rollback = parser.rollback
    t0 = _clock()
    for _ in range(k):
        rollback()
    return _clock() - t0


def _time_view(data: bytes, pos: int, fde, fields: tuple[str, ...], k: int) -> tuple[int, bool]:
    ok = True
    t0 = _clock()
    for _ in range(k):
        try:
            ev = view_event(data, pos, fde)
            for name in fields:
                getattr(ev, name)
        except Exception:  # a view that rejects the event (BinlogFormatError, ChecksumError): still timed
            ok = False
    return _clock() - t0, ok


def _time_empty(k: int) -> int:
    t0 = _clock()
    for _ in range(k):
        pass
    return _clock() - t0


def _time_library(decode, data: bytes, pos: int, end: int, checksum: bool, k: int) -> int:
    t0 = _clock()
    for _ in range(k):
        try:
            decode(data[pos:end], checksum=checksum)
        except ReferenceDecodeError:
            pass
    return _clock() - t0


def _best_of_median(values: list[int], r: int) -> int:
    bests = sorted(min(values[i : i + r]) for i in range(0, len(values) - r + 1, r))
    return bests[len(bests) // 2]


def calibrate(ks: list[int], repeats: int, samples: int = CALIBRATION_SAMPLES) -> tuple[dict, dict]:
    """What a batch costs besides the parser, per k: (the references subtracted, by "empty" / "rollback" and k; the
    task's summary of them and of the clock pair). A reference is the median of the best of ``repeats`` batches."""
    parser = TransactionBoundaryParser()
    parser.checkpoint()
    for _ in range(50):  # warm the loops themselves
        _time_empty(ks[-1])
        _time_rollback_only(parser, ks[-1])
    clock_ns = []
    for _ in range(samples * 2):
        t0 = _clock()
        clock_ns.append(_clock() - t0)
    raw = {"empty": {k: [_time_empty(k) for _ in range(samples)] for k in ks},
           "rollback": {k: [_time_rollback_only(parser, k) for _ in range(samples)] for k in ks}}
    refs = {kind: {k: _best_of_median(v, repeats) for k, v in table.items()} for kind, table in raw.items()}

    def describe(values: list[int]) -> dict:
        return {f"p{q}": percentile(values, q, method=RANK) for q in (5, 50, 95)}

    return refs, {"clock": describe(clock_ns), **{kind: {str(k): {**describe(v), "ref": refs[kind][k]}
                                                         for k, v in table.items()} for kind, table in raw.items()}}


def batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes k: the powers of two up to ``max_batch``."""
    return [1 << i for i in range(max_batch.bit_length())]


def choose_k(estimate_ns: int, batch_ns: int, ks: list[int]) -> int:
    """The smallest k whose batch would last ``batch_ns``, else the largest."""
    return next((k for k in ks if k * estimate_ns >= batch_ns), ks[-1])


@dataclass(frozen=True)
class TimingConfig:
    batch_ns: int
    max_batch: int
    repeats: int
    recheck_every: int
    library_first: bool = False  # time python-mysql-replication before relayproxy's parsers (odd runs)


def _best(time_k, k: int, repeats: int, baseline: dict[int, float]) -> float:
    """ns per call: the fastest of ``repeats`` batches of k calls, less what such a batch costs besides the parser."""
    return (min(time_k(k) for _ in range(repeats)) - baseline[k]) / k


def measure_split(split: Split, timing: TimingConfig, refs: dict, ks: list[int], recheck: dict,
                  counter: list[int]):
    """Time every event of one split with each parser; yields one row per event."""
    data = split.data
    parser = TransactionBoundaryParser()
    decoder = ReferenceDecoder()
    decode = decoder.decode
    fde = None
    if split.fde is not None:
        fde = FormatDescription.parse(split.fde, 0)
        parser.set_format(fde)
        decoder.set_format(fde)
    fields_for = VIEW_FIELDS.get
    batch_ns, repeats = timing.batch_ns, timing.repeats
    measured = 0
    for pos, size, type_code, fde in scan_events(data, 0, fde):
        end = pos + size
        checksum = carries_crc(type_code, fde)
        fields = fields_for(type_code, HEADER_FIELDS)
        boundary_k = lambda k: _time_boundary(parser, data, pos, k)  # noqa: E731
        view_k = lambda k: _time_view(data, pos, fde, fields, k)[0]  # noqa: E731
        library_k = lambda k: _time_library(decode, data, pos, end, checksum, k)  # noqa: E731

        # Per parser: a warm-up call (k=1) gives the estimate, then the best of r batches of k calls. The order of
        # relayproxy's parsers and the library alternates between runs (``library_first``).
        def relay_parsers():
            parser.checkpoint()
            kb = choose_k(boundary_k(1), batch_ns, ks)
            b_ns = _best(boundary_k, kb, repeats, refs["rollback"])
            estimate, ok = _time_view(data, pos, fde, fields, 1)
            kv = choose_k(estimate, batch_ns, ks)
            return kb, b_ns, kv, _best(view_k, kv, repeats, refs["empty"]), ok

        def library():
            k = choose_k(library_k(1), batch_ns, ks)
            _n, decoded, not_decoded, _e, _r = decode_events(decoder, data, [(pos, size, type_code)], [checksum])
            return k, _best(library_k, k, repeats, refs["empty"]), outcome_of(decoded, not_decoded)

        if timing.library_first:
            kl, library_ns, outcome = library()
            kb, boundary_ns, kv, view_ns, view_ok = relay_parsers()
        else:
            kb, boundary_ns, kv, view_ns, view_ok = relay_parsers()
            kl, library_ns, outcome = library()

        counter[0] += 1
        measured += 1
        if timing.recheck_every and counter[0] % timing.recheck_every == 0:
            # The same measurement again: how far apart two timings of one event are is the method's error.
            # (the batch's rollback() goes back to the checkpoint taken before this event)
            again = (_best(boundary_k, kb, repeats, refs["rollback"]), _best(view_k, kv, repeats, refs["empty"]),
                     _best(library_k, kl, repeats, refs["empty"]))
            for name, first, second in zip(PARSERS, (boundary_ns, view_ns, library_ns), again):
                mean = (first + second) / 2
                if mean > 0:
                    recheck[name].append(abs(first - second) / mean)
        if counter[0] % GC_EVERY == 0:
            gc.collect()
        yield (
            split.stream, split.path, split.number, split.start + pos, C.event_name(type_code), type_code, size,
            fde.flavour if fde is not None else "mysql", fde.server_version if fde is not None else "unknown",
            round(boundary_ns, 1), round(view_ns, 1), round(library_ns, 1), outcome, view_ok, kb, kv, kl,
        )
    if measured != split.events:  # cannot happen: splits hold only the scanner's complete events
        raise ValueError(f"{split.path} @{split.start}: {measured} events fit the split, the scanner found "
                         f"{split.events}")


def measure_partition(index: int, items, timing: TimingConfig, run: int = 0):
    """Calibrate, then measure every split dealt to this task; rows are tagged ("event", ...) / ("calibration", ...)."""
    ks = batch_sizes(timing.max_batch)
    gc.collect()
    gc.disable()
    try:
        refs, cal = calibrate(ks, timing.repeats)
        recheck = {name: [] for name in PARSERS}
        counter = [0]
        began = time.monotonic()
        for _key, split in items:
            for row in measure_split(split, timing, refs, ks, recheck, counter):
                yield ("event", (run, *row))
        yield ("calibration", (index, json.dumps({"partition": index, "run": run, "events": counter[0],
                                                   "seconds": time.monotonic() - began,
                                                   "recheck": recheck, **cal})))
    finally:
        gc.enable()


# ---------------------------------------------------------------------------------------------
# Driver
EVENT_SCHEMA_FIELDS = [
    ("stream", "string"), ("path", "string"), ("split", "int"), ("offset", "long"), ("event_type", "string"),
    ("type_code", "int"), ("size", "long"), ("flavour", "string"), ("server_version", "string"),
    ("boundary_ns", "double"), ("view_ns", "double"), ("pymysqlreplication_ns", "double"),
    ("pymysqlreplication_outcome", "string"), ("view_ok", "boolean"), ("k_boundary", "int"), ("k_view", "int"),
    ("k_pymysqlreplication", "int"),
]
# ``event_runs``: one row per event and run; ``events`` holds one row per event, each parser's ns the median of its runs
RUN_SCHEMA_FIELDS = [("run", "int"), *EVENT_SCHEMA_FIELDS]
FILES_SCHEMA_FIELDS = [("path", "string"), ("stream", "string"), ("bytes", "long"), ("binlog", "boolean"),
                       ("events", "long"), ("splits", "long"), ("server_version", "string"), ("error", "string")]
FILE_COUNTS_COLUMNS = ["stream", "path", "event_type", "parser", "events", "bytes"]


def split_label(text: str, option: str, what: str) -> tuple[str | None, str]:
    """(label, rest) of a ``LABEL=REST`` option value; (None, text) when it has no label (a path or URL may hold
    ``=`` after a ``/`` or ``:``)."""
    label, sep, rest = text.partition("=")
    if not (sep and label and "/" not in label and ":" not in label):
        return None, text
    if not rest:
        raise ValueError(f"{option} {text!r}: no {what} after {label}=")
    return label, rest


class Progress(threading.Thread):
    """Prints the active stages' task counts to stderr (plain lines, at most every 2 s, only on change)."""

    def __init__(self, sc, began: float):
        super().__init__(daemon=True, name="spark-progress")
        self.tracker = sc.statusTracker()
        self.began = began
        self.phase = "starting"
        self.stopped = threading.Event()

    def say(self, line: str) -> None:
        log(f"{time.monotonic() - self.began:7.1f} s  {line}")

    def run(self) -> None:
        last = ""
        while not self.stopped.wait(2.0):
            try:
                stages = [(i, self.tracker.getStageInfo(i)) for i in sorted(self.tracker.getActiveStageIds())]
            except Exception:  # noqa: BLE001 - the context is stopping
                return
            line = f"{self.phase}: " + ("; ".join(f"stage {i}: {info.numCompletedTasks}/{info.numTasks} tasks done, "
                                                  f"{info.numActiveTasks} running" for i, info in stages if info)
                                        or "driver")
            if line != last:
                last = line
                self.say(line)

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.say(f"-- {phase}")


_LOG4J2 = """# written by benchmarks/spark_parse_cost.py: errors only (the shell's log-level banner too)
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.submit.name = org.apache.spark.deploy.SparkSubmit
logger.submit.level = error
logger.context.name = org.apache.spark.SparkContext
logger.context.level = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def under_spark_submit() -> bool:
    """True when spark-submit launched this script (its JVM is already up and owns the master setting)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def start_spark(args, workdir: Path):
    master = args.master or (None if under_spark_submit() else "local[*]")
    if master and master.startswith("local"):
        # Local workers must run this interpreter (it has relayproxy and python-mysql-replication).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    log4j = workdir / "log4j2.properties"
    log4j.write_text(_LOG4J2)
    builder = (
        SparkSession.builder.appName("relayproxy spark_parse_cost")
        .config("spark.ui.enabled", "true" if args.ui else "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.sources.ignoreCorruptFiles", "false")
        .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
        # Binary rows are whole files: fewer per task keeps the heap small and spreads large files over tasks.
        .config("spark.sql.files.maxPartitionBytes", str(32 << 20))
    )
    if master:
        builder = builder.master(master)
    if not under_spark_submit():  # JVM options only matter when this script starts the JVM
        builder = (builder.config("spark.driver.memory", "4g")
                   .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j}"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    ship_code(spark.sparkContext, workdir)
    return spark


def ship_code(sc, workdir: Path) -> None:
    """Send executors this job's code: relayproxy (zipped from the checkout) and the benchmark modules.

    Executors still need relayproxy's third-party imports (PyMySQL, mysql-replication): docs/spark.md.
    """
    package = REPO_ROOT / "relayproxy"
    if package.is_dir():
        archive = workdir / "relayproxy.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
            for source in sorted(package.rglob("*.py")):
                zf.write(source, source.relative_to(REPO_ROOT))
        sc.addPyFile(str(archive))
    shared = workdir / "benchmarks.zip"  # benchmarks.common (and the benchinfo it imports), as a package
    with zipfile.ZipFile(shared, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in ("__init__.py", "benchinfo.py", "common.py"):
            zf.write(BENCH_DIR / name, f"benchmarks/{name}")
    sc.addPyFile(str(shared))
    for name in ("benchinfo.py", "parsing.py", "spark_parse_cost.py"):
        sc.addPyFile(str(BENCH_DIR / name))


def resolve_inputs(spark, specs: list[tuple[str, str | None]], *, required: bool) -> list[tuple[str, str | None, str]]:
    """(path as given, label, qualified root) of each input ((path, label)) that matches something; a missing one is
    an error when ``required``, otherwise it is reported and left out."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    found = []
    for path, label in specs:
        hpath = jvm.org.apache.hadoop.fs.Path(path)
        fs = hpath.getFileSystem(conf)
        matches = fs.globStatus(hpath)
        if matches is None or len(matches) == 0:
            if required:
                raise SystemExit(f"spark_parse_cost: --input {path!r} matches no file or folder")
            log(f"input {path} does not exist: left out")
            continue
        glob_at = min([i for i, ch in enumerate(path) if ch in "*?[{"] or [len(path)])
        if glob_at < len(path):
            root_text = path[:glob_at].rsplit("/", 1)[0] or "/"
            root = fs.makeQualified(jvm.org.apache.hadoop.fs.Path(root_text)).toString()
        else:
            status = matches[0]
            root_path = status.getPath() if status.isDirectory() else status.getPath().getParent()
            root = fs.makeQualified(root_path).toString()
        found.append((path, label, root))
    return found


def deal_splits(metas: list[dict], partitions: int) -> dict[str, int]:
    """Longest-processing-time-first: each split (by estimated cost) to the least loaded task."""
    loads = [0.0] * partitions
    assignment = {}
    for meta in sorted(metas, key=lambda m: -m["cost"]):
        target = min(range(partitions), key=loads.__getitem__)
        loads[target] += meta["cost"]
        assignment[meta["key"]] = target
    return assignment


def run_job(args, spark, inputs, progress: Progress, archived: list[ArchivedFile] = ()) -> dict:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    sc = spark.sparkContext
    roots = [(root, label) for _path, label, root in inputs]
    split_bytes, split_events = args.split_bytes, args.split_events

    progress.set_phase("job 1: read files, find binlogs, cut splits")
    sc.setJobDescription("read and split binlog files")
    sources = []
    if inputs:
        files_df = (
            spark.read.format("binaryFile").option("recursiveFileLookup", "true").load([p for p, _l, _r in inputs])
        )
        sources.append(files_df.select("path", "content").rdd.mapPartitions(
            lambda rows: plan_rows(rows, roots, split_bytes, split_events)))
    if archived:
        # One task per archived file, the largest first; each fetches its own parts (the driver only listed them).
        keyring = args.keyring
        ordered = sorted(archived, key=lambda f: -f.size)
        sources.append(sc.parallelize(ordered, len(ordered)).mapPartitions(
            lambda entries: plan_archived(entries, keyring, split_bytes, split_events)))
    planned = (sources[0] if len(sources) == 1 else sc.union(sources)) \
        .persist(StorageLevel.DISK_ONLY)  # the split bytes: on local disk, not in the JVM's heap
    metas = planned.map(item_meta).collect()
    faults = [m for m in metas if m["kind"] == "fault"]
    if faults:
        planned.unpersist()
        more = f"; and {len(faults) - 5} more file(s)" if len(faults) > 5 else ""
        raise SystemExit("spark_parse_cost: refusing the archive: " + "; ".join(m["message"] for m in faults[:5])
                         + more)
    files = [m for m in metas if m["kind"] == "file"]
    split_metas = [m for m in metas if m["kind"] == "split"]
    binlogs = [f for f in files if f["binlog"]]
    total_events = sum(m["events"] for m in split_metas)
    if not total_events:
        raise SystemExit("spark_parse_cost: no binlog events found under the inputs")
    partitions = args.partitions or min(len(split_metas), sc.defaultParallelism * 3)
    assignment = deal_splits(split_metas, partitions)
    log(f"{len(files)} files, {len(binlogs)} binlog files, {len(split_metas)} splits, {total_events:,} events, "
        f"{sum(m['bytes'] for m in split_metas) / 1e6:,.1f} MB -> {partitions} measuring tasks, {args.runs} run(s)")

    types = {"string": T.StringType(), "int": T.IntegerType(), "long": T.LongType(), "double": T.DoubleType(),
             "boolean": T.BooleanType()}
    run_schema = T.StructType([T.StructField(name, types[kind], True) for name, kind in RUN_SCHEMA_FIELDS])
    dealt = sc.broadcast(assignment)
    if args.walks and archived:
        log("an archive among the inputs: parse_cost.py's walks (over local files, on the driver) are left out")
    walk_sets = load_walk_sets(binlogs) if args.walks and not archived else None
    calibrations: list[dict] = []
    runs: list[dict] = []
    for run, order in enumerate(benchinfo.alternating_orders(args.runs, CONTESTANTS)):
        timing = TimingConfig(args.batch_ns, args.max_batch, args.repeats, args.recheck_every,
                              library_first=order[0] != CONTESTANTS[0])
        progress.set_phase(f"job 2, run {run + 1} of {args.runs} ({' then '.join(order)}): measure "
                           f"{total_events:,} events x {len(PARSERS)} parsers")
        sc.setJobDescription(f"measure per-event parse cost, run {run + 1}")
        measured = (
            planned.filter(lambda item: isinstance(item, Split))
            .map(lambda split: (dealt.value[split.key], split))
            .partitionBy(partitions, lambda target: target)
            .mapPartitionsWithIndex(lambda index, items, timing=timing, run=run:
                                    measure_partition(index, items, timing, run))
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        run_df = spark.createDataFrame(measured.filter(lambda r: r[0] == "event").map(lambda r: r[1]), run_schema)
        run_df.write.mode("overwrite" if run == 0 else "append").parquet(f"{args.parquet_output}/event_runs")
        calibration_rows = measured.filter(lambda r: r[0] == "calibration").map(lambda r: r[1]).collect()
        calibrations += [json.loads(text) for _index, text in calibration_rows]
        measured.unpersist()
        walks = None
        if walk_sets:
            progress.set_phase(f"run {run + 1}: parse_cost.py's walks on the driver ({' then '.join(order)})")
            walks = run_walks(walk_sets, order, args.walk_repeat, args.walk_min_sample)
        runs.append({"order": " then ".join(order), "walks": walks})
    planned.unpersist()

    # One row per event: each parser's ns is the median of its runs (the tables, percentiles and plots below).
    progress.set_phase("median of the runs per event")
    event_runs = spark.read.parquet(f"{args.parquet_output}/event_runs")
    keys = ("stream", "path", "split", "offset")
    medians = {"boundary_ns", "view_ns", "pymysqlreplication_ns"}
    per_event = event_runs.groupBy(*keys).agg(*(
        (F.expr(f"percentile({name}, 0.5)") if name in medians else F.first(name)).alias(name)
        for name, _kind in EVENT_SCHEMA_FIELDS if name not in keys
    ))
    per_event.select(*(F.col(name).cast(types[kind]) for name, kind in EVENT_SCHEMA_FIELDS)) \
        .write.mode("overwrite").parquet(f"{args.parquet_output}/events")

    # Per run: the sums behind every headline ratio, split by stream and by blob event (>= --blob-bytes).
    run_sums = ns_sums(event_runs, "run", "stream", (F.col("size") >= args.blob_bytes).alias("blob"))

    progress.set_phase("aggregate")
    sc.setJobDescription("aggregate")
    events = spark.read.parquet(f"{args.parquet_output}/events").cache()
    events.createOrReplaceTempView("events")
    percentiles = ("percentile(ns, array(0.5, 0.9, 0.99))" if args.percentiles == "exact"
                   else "percentile_approx(ns, array(0.5, 0.9, 0.99), 10000)")
    # One pass for every level reported: the summary's rows and the roll-ups of the markdown and plots.
    levels = spark.sql(f"""
        WITH long AS (
          SELECT stream, server_version, flavour, event_type, size,
                 stack(3, 'boundary', boundary_ns, 'view', view_ns,
                       'pymysqlreplication', IF(pymysqlreplication_outcome = 'decoded', pymysqlreplication_ns, NULL))
                   AS (parser, ns)
          FROM events)
        SELECT *, p[0] AS p50_ns, p[1] AS p90_ns, p[2] AS p99_ns, 1e9 / mean_ns AS events_per_s,
               bytes / total_ns * 1e3 AS mb_per_s
        FROM (SELECT stream, server_version, event_type, parser, flavour, grouping_id() AS level, count(*) AS events,
                     sum(size) AS bytes, avg(ns) AS mean_ns, {percentiles} AS p, sum(ns) AS total_ns
              FROM long WHERE ns IS NOT NULL
              GROUP BY stream, server_version, event_type, parser, flavour
                GROUPING SETS ((stream, server_version, event_type, parser, flavour), (stream, parser), (parser),
                               (event_type, parser)))""").drop("p").cache()
    summary_df = levels.where("level = 0").select(*SUMMARY_COLUMNS) \
        .orderBy("stream", "server_version", "event_type", "parser")
    summary_df.coalesce(1).write.mode("overwrite").parquet(f"{args.parquet_output}/summary")
    rows = [r.asDict() for r in levels.collect()]
    levels.unpersist()
    # grouping_id(): one bit per GROUP BY column left out of the set, the first column (stream) the highest bit
    by_level = {level: [r for r in rows if r["level"] == level] for level in (0, 0b01101, 0b11101, 0b11001)}
    summary_rows = sorted(by_level[0], key=lambda r: (r["stream"], r["server_version"], r["event_type"], r["parser"]))
    by_stream = sorted(by_level[0b01101], key=lambda r: (r["stream"], r["parser"]))
    overall = sorted(by_level[0b11101], key=lambda r: r["parser"])
    by_type = by_level[0b11001]

    file_counts_df = (
        events.where(F.col("boundary_ns").isNotNull())
        .groupBy("stream", "path", "event_type").agg(F.count("*").alias("events"), F.sum("size").alias("bytes"))
        .withColumn("parser", F.lit("boundary"))
        .select(*FILE_COUNTS_COLUMNS)
    )
    file_counts = [r.asDict() for r in file_counts_df.orderBy("path", "event_type").collect()]
    spark.createDataFrame(file_counts, file_counts_df.schema).coalesce(1).write.mode("overwrite").parquet(
        f"{args.parquet_output}/file_counts")

    decoded = F.col("pymysqlreplication_outcome") == DECODED
    sums = ns_sums(events, "stream", "event_type")
    blob_rows = [r.asDict() for r in events.where(F.col("size") >= args.blob_bytes).groupBy("stream", "event_type").agg(
        F.count("*").alias("events"), F.sum("size").alias("bytes"), F.max("size").alias("max_bytes"),
        F.sum(F.when(decoded, F.col("pymysqlreplication_ns"))).alias("library_dec"),
        F.sum("boundary_ns").alias("boundary_all"),
    ).orderBy("stream", "event_type").collect()]
    ratios = [dict(t, stream=k) for k, t in sorted(add_sums(sums, lambda r: r["stream"]).items())]
    ratios_all = dict(add_sums(sums, lambda r: True)[True], stream="all streams")
    coverage: dict[str, dict[str, int]] = {}
    for r in sums:
        per = coverage.setdefault(r["event_type"], {})
        per[r["pymysqlreplication_outcome"]] = per.get(r["pymysqlreplication_outcome"], 0) + r["events"]
    view_rejected = sum(r["events"] for r in sums if not r["view_ok"])
    sample = [r.asDict() for r in events.sample(fraction=min(1.0, 60_000 / max(total_events, 1)), seed=6)
              .select("boundary_ns", "view_ns", "pymysqlreplication_ns", "pymysqlreplication_outcome").collect()]
    events.unpersist()

    files_schema = T.StructType([T.StructField(name, types[kind]) for name, kind in FILES_SCHEMA_FIELDS])
    spark.createDataFrame([tuple(f[name] for name, _kind in FILES_SCHEMA_FIELDS) for f in files], files_schema) \
        .coalesce(1).write.mode("overwrite").parquet(f"{args.parquet_output}/files")

    return {
        "files": files, "splits": len(split_metas), "partitions": partitions, "events": total_events,
        "bytes": sum(m["bytes"] for m in split_metas), "summary": summary_rows, "by_stream": by_stream,
        "overall": overall, "by_type": by_type, "file_counts": file_counts, "ratios": ratios,
        "ratios_all": ratios_all, "coverage": coverage, "view_rejected": view_rejected,
        "calibrations": calibrations, "sample": sample, "runs": runs, "run_sums": run_sums,
        "blob_rows": blob_rows,
    }


def ns_sums(df, *keys) -> list[dict]:
    """Per ``keys``, library outcome and view verdict: events and the sums of ns ``parsing.add_sums`` adds up."""
    from pyspark.sql import functions as F

    decoded = F.col("pymysqlreplication_outcome") == DECODED
    return [r.asDict() for r in df.groupBy(*keys, "pymysqlreplication_outcome", "view_ok").agg(
        F.count("*").alias("events"),
        F.sum("boundary_ns").alias("boundary_all"), F.sum("view_ns").alias("view_all"),
        F.sum(F.when(decoded, F.col("boundary_ns"))).alias("boundary_dec"),
        F.sum(F.when(decoded, F.col("view_ns"))).alias("view_dec"),
        F.sum(F.when(decoded, F.col("pymysqlreplication_ns"))).alias("library_dec"),
    ).collect()]


# ---------------------------------------------------------------------------------------------
# parse_cost.py's method on the same events (driver side, between the runs' Spark jobs)
def stream_subsets(streams) -> list[tuple[str, object]]:
    """The subsets of streams both methods are compared on: every event, without the blobs stream (when there is
    one), the corpus alone (when there is one)."""
    streams = set(streams)
    out = [("all events", lambda s: True)]
    if "blobs" in streams and len(streams) > 1:
        out.append(("without the blobs stream", lambda s: s != "blobs"))
    if "corpus" in streams and len(streams) > 1:
        out.append(("corpus stream only", lambda s: s == "corpus"))
    return out


def load_walk_sets(binlogs: list[dict]) -> dict[str, list] | None:
    """The binlog files, in the driver's memory as parse_cost.py loads the corpus, per subset (``stream_subsets``);
    None when an input is not on the local filesystem (on a cluster: the walks are left out)."""
    if any(not f["path"].startswith("file:") for f in binlogs):
        log("inputs not on the local filesystem: parse_cost.py's walks are left out")
        return None
    loaded = [(f["stream"], load_binlog(f["path"], Path(f["path"].removeprefix("file:")).read_bytes()))
              for f in sorted(binlogs, key=lambda f: f["path"])]
    return {label: [cf for stream, cf in loaded if keep(stream)]
            for label, keep in stream_subsets({stream for stream, _cf in loaded})}


def run_walks(walk_sets: dict[str, list], order, repeat: int, min_sample: float) -> dict[str, dict]:
    """One run of parse_cost.py's walks (``parsing.core_measures``: the loop over a file image, as the relay's
    receiver meets events) over every subset, relayproxy's walks and the library's in ``order``: ns per event, the
    median of ``repeat`` samples (round robin, warm-up first, GC off while timing)."""
    measures = [m for label, files in walk_sets.items() for m in core_measures(files, f"{label}|")]
    ns = run_in_order(measures, order, repeat, min_sample)
    return {label: {"events": files_totals(files)[0], **walk_figures(ns, f"{label}|")}
            for label, files in walk_sets.items()}


# ---------------------------------------------------------------------------------------------
# Reporting
def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_csv_value(row.get(c)) for c in columns])


def _csv_value(value):
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 100 else f"{value:.3f}"
    return "" if value is None else value


def per_parser(rows: list[dict], key: str) -> dict[str, dict]:
    """The rows by ``key`` and then by parser."""
    out: dict[str, dict] = {}
    for r in rows:
        out.setdefault(r[key], {})[r["parser"]] = r
    return out


def method_error(calibrations: list[dict]) -> dict:
    """The timing method's own error, over every measuring task."""
    def across(*path: str) -> list[float]:
        return [functools.reduce(operator.getitem, path, cal) for cal in calibrations]

    recheck = {name: sorted(v for cal in calibrations for v in cal["recheck"][name]) for name in PARSERS}
    ks = sorted(int(k) for k in calibrations[0]["empty"])
    return {
        "tasks": len(calibrations),
        "clock_p50": statistics.median(across("clock", "p50")),
        "clock_p5": min(across("clock", "p5")),
        "clock_p95": max(across("clock", "p95")),
        "baseline": {
            kind: {k: {"p50": statistics.median(across(kind, str(k), "p50")),
                       "ref": statistics.median(across(kind, str(k), "ref")),
                       "spread": statistics.median([a - b for a, b in zip(across(kind, str(k), "p95"),
                                                                           across(kind, str(k), "p5"))])}
                   for k in ks}
            for kind in ("empty", "rollback")
        },
        "recheck": {name: {"n": len(v), **{f"p{q}": percentile(v, q, method=RANK) if v else None for q in (50, 90)}}
                    for name, v in recheck.items()},
    }


def _mean_p99(row: dict) -> str:
    return f"{fmt(row.get('mean_ns'))} / {fmt(row.get('p99_ns'))}"


def headline_lines(args, report: dict, ra: dict) -> tuple[list[str], dict[str, dict]]:
    """The headline: library / relayproxy per run (median and range) with and without blob events and per subset of
    streams; the blob events themselves; parse_cost.py's walks over the same files beside Spark's figures."""
    run_sums = report["run_sums"]
    streams = {r["stream"] for r in run_sums}
    blob_label = f"without blob events (>= {args.blob_bytes:,} bytes)"
    subsets = [("all events", lambda r: True), (blob_label, lambda r: not r["blob"])]
    subsets += [(label, lambda r, keep=keep: keep(r["stream"])) for label, keep in stream_subsets(streams)[1:]]
    per_subset = {label: add_sums(run_sums, lambda r, keep=keep: r["run"] if keep(r) else None)
                  for label, keep in subsets}
    all_runs = per_subset["all events"]
    lib_total = {run: t["library_dec"] for run, t in all_runs.items()}

    def ratios(label: str, num: str, den: str) -> list[float | None]:
        return [ratio(t[num], t[den]) for _run, t in sorted(per_subset[label].items())]

    blob = add_sums(run_sums, lambda r: r["run"] if r["blob"] else None)
    blob_events = next(iter(blob.values()))["events"] if blob else 0
    blob_share = [(blob[run]["library_dec"] / lib_total[run]) * 100 if run in blob and lib_total[run] else 0.0
                  for run in sorted(all_runs)]
    lines = [
        "## Headline",
        "",
        f"A **blob event** here is any event of at least {args.blob_bytes:,} bytes ({args.blob_bytes / 1024:,.0f} KiB;"
        f" `--blob-bytes`), whatever its type: {blob_events:,} of {ra['events']:,} events "
        f"({blob_events / ra['events'] * 100:.2f} %), which take {fmt_runs(blob_share, '{:.0f}', ' %')} of "
        "python-mysql-replication's time (which ones: the table after the next).",
        "",
        f"python-mysql-replication's CPU time over relayproxy's, over the same events (those the library decodes), "
        f"median and range of {args.runs} run(s) with the order alternated:",
        "",
        "| events | events measured | decoded by the library | library / boundary | library / view |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, _keep in subsets:
        runs = per_subset[label]
        if not runs:
            continue
        first = runs[min(runs)]
        bold = "**" if label in ("all events", blob_label) else ""
        lines.append(f"| {label} | {first['events']:,} | {first['decoded_events']:,} | "
                     f"{bold}{fmt_runs(ratios(label, 'library_dec', 'boundary_dec'))}{bold} | "
                     f"{fmt_runs(ratios(label, 'library_dec', 'view_dec'))} |")
    lines += [
        "",
        "| run | order | " + " | ".join(f"library / boundary, {label}" for label, _k in subsets) + " |",
        "|---:|---|" + "---:|" * len(subsets),
    ]
    for run, info in enumerate(report["runs"]):
        values = [ratio(t["library_dec"], t["boundary_dec"]) if (t := per_subset[label].get(run)) else None
                  for label, _keep in subsets]
        lines.append(f"| {run + 1} | {info['order']} | "
                     + " | ".join("-" if v is None else f"{v:,.1f}x" for v in values) + " |")
    lines += ["", "The blob events (each event's median over the runs):", "",
              "| stream | event type | events | mean bytes | largest | library ms (sum) | share of the library's "
              "time, all events | library / boundary |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    lib_all = ra["library_dec"]
    for r in report["blob_rows"]:
        lines.append(f"| {r['stream']} | {r['event_type']} | {r['events']:,} | {fmt(r['bytes'] / r['events'])} | "
                     f"{fmt(r['max_bytes'])} | {fmt((r['library_dec'] or 0) / 1e6, 1)} | "
                     f"{fmt((r['library_dec'] or 0) / lib_all * 100 if lib_all else None, 1)} % | "
                     + (f"{ratio(r['library_dec'], r['boundary_all']):,.0f}x |" if r["library_dec"]
                        else "not decoded |"))
    if not report["blob_rows"]:
        lines.append("| (none) | | | | | | | |")
    lines.append("")
    return lines, per_subset


def walk_lines(report: dict, per_subset: dict[str, dict]) -> list[str]:
    """Spark's per-event figures beside parse_cost.py's walks over the same files, and why they differ."""
    runs = report["runs"]
    if not runs or runs[0]["walks"] is None:
        return ["parse_cost.py's walks were left out (`--no-walks`, inputs not on the local filesystem, or an "
                "archive among the inputs).", ""]
    labels = list(runs[0]["walks"])
    lines = [
        "### Two methods on the same events",
        "",
        "Spark's figure times every event on its own (k calls of the same event, best of the batches, the loop's "
        "own cost subtracted); `parse_cost.py`'s method (its functions, run on the driver between the runs' Spark "
        "jobs, in the same alternated order) times a walk over whole file images, as the relay's receiver meets "
        "events, and divides by the events. Per run each figure is a ratio of total times over the same events; "
        "median and range of the runs:",
        "",
        "| events | Spark: boundary ns/event | Spark: library ns/event | Spark: library / boundary | walk: loop + "
        "header only ns/event | walk: boundary per-event API (`feed`) ns/event | walk: boundary batch "
        "(`feed_buffer`) ns/event | walk: library ns/event | walk: library / `feed` | walk: library / `feed_buffer` |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label in labels:
        spark_runs = [t for _run, t in sorted(per_subset.get(label, {}).items())]
        walks = [r["walks"][label] for r in runs]
        lines.append(
            f"| {label} ({walks[0]['events']:,}) | "
            f"{fmt_runs([t['boundary_dec'] / t['decoded_events'] for t in spark_runs], '{:,.0f}', '')} | "
            f"{fmt_runs([t['library_dec'] / t['decoded_events'] for t in spark_runs], '{:,.0f}', '')} | "
            f"{fmt_runs([ratio(t['library_dec'], t['boundary_dec']) for t in spark_runs])} | "
            + "".join(f"{fmt_runs([w[key] for w in walks], '{:,.0f}', '')} | "
                      for key in ("floor_ns", "boundary_feed_ns", "boundary_ns", "library_ns"))
            + f"{fmt_runs([w['ratio_feed'] for w in walks])} | {fmt_runs([w['ratio'] for w in walks])} |"
        )
    lines += [
        "",
        "Why the two differ (the Spark column is over the events the library decodes, the walks over every event: "
        "a few hundred of the corpus's events are not decoded, which changes little):",
        "",
        "- **What is subtracted.** relayproxy's boundary parser costs a few hundred ns per event, so a fixed cost "
        "per event moves its side of the ratio much more than the library's. Spark subtracts the timing loop's own "
        "cost (an empty loop, or the `rollback()` loop, measured in every task) and keeps only the header unpack and "
        "`feed`; the walk keeps its loop, its bounds checks and, for the library, the slice that copies each event "
        "(`data[pos:pos + size]`, as `BinLogStreamReader` gets its packet), and the column \"loop + header only\" "
        "shows how much of the walk's per-event cost is the loop alone.",
        "- **Warm or streaming.** Spark runs the same event k times in a row (best of the batches): its bytes, "
        "the parser's branches and the library's objects are hot. The walk meets each event once, in file order, "
        "as the relay does; for the library this also means allocating and freeing its event objects at a real "
        "rate.",
        "- **Per-event API or batch path.** Spark measures the per-event API (`HEADER.unpack_from` + `feed` per "
        "event, what the relay's receiver calls per packet); `parse_cost.py`'s headline is the batch path "
        "(`feed_buffer`, the event loop inside the parser), also shown here.",
        "- **JVM and Python workers.** In Spark the timed loops run in Python worker processes, one per core of "
        "`local[*]`, beside the JVM that feeds them and its garbage collector: on this 2-core machine they compete "
        "for the cores, which inflates both parsers' absolute ns (the best-of-batches discards the batches that "
        "were preempted, not the slower caches). The walks run in the driver while no Spark task runs.",
        "",
    ]
    return lines


def render_markdown(args, argv, report: dict, err: dict, seconds: float, spark_version: str, master: str,
                    inputs) -> str:
    ra = report["ratios_all"]
    overall = {r["parser"]: r for r in report["overall"]}

    def p50(parser: str) -> float | None:
        return overall[parser]["p50_ns"] if parser in overall else None

    info = benchinfo.machine_info(**{"spark": spark_version, "spark master": master,
                                     "python-mysql-replication": LIBRARY_VERSION})
    headline, per_subset = headline_lines(args, report, ra)
    lines = [
        f"Spark {spark_version}, master `{master}`, {report['partitions']} measuring tasks, {seconds:.0f} s wall "
        "time.",
        "",
        f"Inputs: {', '.join(f'`{p}`' + (f' (stream `{l}`)' if l else '') for p, l, _r in inputs)}: "
        f"{sum(1 for f in report['files'] if f['binlog'])} binlog files of {len(report['files'])} files, "
        f"{report['splits']} splits, {report['events']:,} events, {report['bytes'] / 1e6:,.1f} MB.",
        "",
        *headline,
        "These are ratios of total CPU time over the same events, so the costliest events weigh most (python-mysql-"
        "replication's time grows with event size, relayproxy's barely does). For the typical event (each event's "
        "median over the runs), the ratio of medians: library / boundary "
        f"{fmt_x(p50('pymysqlreplication'), p50('boundary'))}, "
        f"library / view {fmt_x(p50('pymysqlreplication'), p50('view'))}.",
        "",
        *walk_lines(report, per_subset),
        "Absolute numbers come from a shared 2-core machine on which other jobs were running; they are noisy from "
        "run to run. The ratios between parsers measured on the same events in the same tasks are the result. "
        "The tables below use, for every event and parser, the median of its runs.",
        "",
        "## Ratios per stream",
        "",
        "| stream | events | decoded by the library | library / boundary | library / view | view / boundary |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {r['stream']} | {r['events']:,} | {r['decoded_events']:,} | {fmt_x(r['library_dec'], r['boundary_dec'])}"
          f" | {fmt_x(r['library_dec'], r['view_dec'])} | {fmt_x(r['view_all'], r['boundary_all'], 2)} |"
          for r in report["ratios"] + [ra]),
        "",
        "The library ratios are over the events the library decodes (sums of ns over the same events, i.e. ratios "
        "of means); view / boundary is over all events.",
        "",
        "## Cost per stream and parser",
        "",
        "MB/s is the events' bytes over the parser's time: the boundary parser reads headers and a few body bytes "
        "(CRC32 verification, which the relay does as well, is not part of any row), so its MB/s grows with event "
        "size.",
        "",
        "| stream | parser | events | mean ns | p50 ns | p90 ns | p99 ns | events/s | MB/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {r['stream']} | {r['parser']} | {r['events']:,} | {fmt(r['mean_ns'])} | {fmt(r['p50_ns'])} | "
          f"{fmt(r['p90_ns'])} | {fmt(r['p99_ns'])} | {fmt(r['events_per_s'])} | {fmt(r['mb_per_s'], 1)} |"
          for r in report["by_stream"] + [dict(o, stream="**all**") for o in report["overall"]]),
        "",
        "## Cost per event type (all streams)",
        "",
        "| event type | events | mean bytes | boundary mean / p99 ns | view mean / p99 ns | library mean / p99 ns | "
        "library / boundary |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    by_type = per_parser(report["by_type"], "event_type")
    for name, per in sorted(by_type.items(), key=lambda kv: -kv[1]["boundary"]["events"]):
        b, lib = per["boundary"], per.get("pymysqlreplication")
        lines.append(f"| {name} | {b['events']:,} | {fmt(b['bytes'] / b['events'])} | {_mean_p99(b)} | "
                     f"{_mean_p99(per.get('view') or {})} | "
                     + (f"{_mean_p99(lib)} ({lib['events']:,} decoded) | {fmt_x(lib['mean_ns'], b['mean_ns'])} |"
                        if lib else "not decoded | - |"))
    lines += [
        "",
        "(The library column's ratio compares its mean over the events it decodes with the boundary mean over all "
        "events of the type; they differ only for types it sometimes drops.) Per (stream, server version, event "
        "type, parser) rows: `summary.csv` in the output folder.",
        "",
        "## python-mysql-replication coverage",
        "",
        f"python-mysql-replication {LIBRARY_VERSION} (`relayproxy.lab.reference.ReferenceDecoder`, row values left "
        "lazy) decoded every event of the other types. Events it has no decoder for (`not_decoded`) or raises on "
        "(`error`) are timed but left out of its rows and ratios:",
        "",
        *(f"- {t}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(o.items()))
          for t, o in sorted(report["coverage"].items()) if set(o) - {"decoded"}),
        "",
        f"relayproxy's views rejected {report['view_rejected']:,} event(s) (timed and counted all the same).",
        "",
        "## Timing method and its measured error",
        "",
        "`time.perf_counter_ns`, GC off while a task measures. Per event and parser: one warm-up call (also the cost "
        f"estimate), then {args.repeats} batches of k calls of that event (k a power of two, batch ~{args.batch_ns:,} "
        f"ns, k <= {args.max_batch}), each between one pair of clock reads; the fastest batch counts (preemption and "
        "interrupts only ever add time). The boundary parser's state is restored with `rollback()` to a "
        "`checkpoint()` before each call. What a batch costs besides the parser (clock pair, loop, rollback) is "
        "measured in every task by timing the same loops with an empty body (500 batches per k); the median of the "
        f"fastest of {args.repeats} such batches is subtracted: `ns = (best batch - baseline[k]) / k`. Percentiles: "
        + ("exact (Spark SQL `percentile`, linear interpolation between closest ranks)." if args.percentiles == "exact"
           else "`percentile_approx`, accuracy 10,000."),
        "",
        f"Measured over {err['tasks']} tasks:",
        "",
        f"- clock pair (`perf_counter_ns` twice): median {err['clock_p50']:.0f} ns (p5 {err['clock_p5']} - p95 "
        f"{err['clock_p95']} ns over all tasks);",
        "- baseline of a batch, ns: subtracted (median of best-of-r) / median / p5-p95 spread:",
        "",
        "| k | empty loop (view, library) | rollback loop (boundary) | boundary's spread per call |",
        "|---:|---:|---:|---:|",
        *(f"| {k} | {e['ref']:.0f} / {e['p50']:.0f} / {e['spread']:.0f} | "
          f"{r['ref']:.0f} / {r['p50']:.0f} / {r['spread']:.0f} | {r['spread'] / k:.1f} |"
          for (k, e), r in zip(err["baseline"]["empty"].items(), err["baseline"]["rollback"].values())),
        "",
        f"- repeatability: every {args.recheck_every}-th event was measured twice (best of {args.repeats} batches "
        "each); relative difference |a-b|/mean of the two results:",
        "",
        "| parser | events rechecked | median | p90 |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {rc['n']:,} | {fmt(rc['p50'] and rc['p50'] * 100, 1)}% | "
          f"{fmt(rc['p90'] and rc['p90'] * 100, 1)}% |" for name, rc in err["recheck"].items()),
        "",
        "A batch runs the same event k times in a row, so caches are warm: these are the costs of the parser's code "
        "on an event that was just received, not of fetching it from memory.",
        "",
        "## Plots",
        "",
        *(line for name, alt in PLOTS for line in (f"![{alt}]({name})", "")),
    ]
    return results_document("Per-event parse cost across recorded streams (Spark)", Path(__file__), argv, info, lines,
                            runs=args.runs, what="in odd runs python-mysql-replication is timed before relayproxy's "
                                                 "parsers on each event")


PARSER_COLOURS = {"boundary": "#2f7ed8", "view": "#76b7e8", "pymysqlreplication": "#d9534f"}
PLOTS = [("by_stream.png", "cost per stream"), ("by_event_type.png", "cost per event type"),
         ("distribution.png", "distribution"), ("ratios.png", "ratios per stream")]


def _bars(plt, path: Path, labels: list[str], series, xlabel: str, title: str, height: float, text=None,
          gap: float = 1.05, fontsize: float | None = None) -> None:
    """Horizontal log-scale bars, one per (label, colour, values) of ``series`` for each of ``labels``, grouped;
    ``text`` formats each non-zero value beside its bar. Saved to path."""
    fig, ax = plt.subplots(figsize=(10, height))
    bar = 0.8 / len(series)
    for i, (name, colour, values) in enumerate(series):
        ys = [n + i * bar for n in range(len(labels))]
        ax.barh(ys, values, height=bar, color=colour, label=name)
        for y, v in zip(ys, values):
            if text and v:
                ax.text(v * gap, y, text(v), va="center", fontsize=7)
    ax.set_yticks([n + (len(series) - 1) * bar / 2 for n in range(len(labels))], labels,
                  **({"fontsize": fontsize} if fontsize else {}))
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    save_figure(fig, path)


def _mean_ns(table: dict[str, dict], names: list[str]):
    """Per parser, (parser, colour, mean ns of each name: ``table[name][parser]``, 0 where it has no row)."""
    return [(parser, PARSER_COLOURS[parser], [table[n][parser]["mean_ns"] if parser in table[n] else 0 for n in names])
            for parser in PARSERS]


def write_plots(out: Path, report: dict) -> list[str]:
    plt = benchinfo.pyplot()
    if plt is None:
        log("matplotlib is not installed: no plots")
        return []
    note = "(shared 2-core machine: compare parsers within a run, not absolute numbers)"

    # 1. mean ns per stream and parser; 2. per event type (the 20 most frequent)
    per_stream = per_parser(report["by_stream"], "stream")
    _bars(plt, out / "by_stream.png", sorted(per_stream), _mean_ns(per_stream, sorted(per_stream)),
          "mean ns per event (log scale; lower is better)", f"Per-event parse cost per stream\n{note}",
          0.55 * len(per_stream) * len(PARSERS) / 2 + 2, text="{:,.0f}".format)
    per_type = per_parser(report["by_type"], "event_type")
    types = sorted(per_type, key=lambda t: -per_type[t]["boundary"]["events"])[:20]
    _bars(plt, out / "by_event_type.png", [f"{t} ({per_type[t]['boundary']['events']:,})" for t in types],
          _mean_ns(per_type, types), "mean ns per event (log scale), all streams; (n) = events",
          f"Per-event parse cost per event type\n{note}", 0.5 * len(types) + 2, fontsize=8)

    # 3. distribution (CDF) of per-event ns from a sample of events
    fig, ax = plt.subplots(figsize=(9, 5))
    for parser in PARSERS:
        column = f"{parser}_ns"
        values = sorted(r[column] for r in report["sample"] if r[column] is not None and r[column] > 0
                        and (parser != "pymysqlreplication" or r["pymysqlreplication_outcome"] == "decoded"))
        if values:
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], color=PARSER_COLOURS[parser],
                    label=f"{parser} ({len(values):,} sampled events)")
    ax.set_xscale("log")
    ax.set_xlabel("ns per event (log scale)")
    ax.set_ylabel("fraction of events")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"Distribution of per-event parse cost (all streams)\n{note}", fontsize=10)
    ax.legend(fontsize=8)
    save_figure(fig, out / "distribution.png")

    # 4. ratios per stream
    rows = report["ratios"] + [report["ratios_all"]]
    _bars(plt, out / "ratios.png", [r["stream"] for r in rows],
          [(label, colour, [ratio(r["library_dec"], r[den]) or 1 for r in rows])
           for label, den, colour in (("library / boundary", "boundary_dec", "#2f7ed8"),
                                      ("library / view", "view_dec", "#76b7e8"))],
          "python-mysql-replication's CPU time / relayproxy's, same events (log scale; higher: relayproxy cheaper)",
          f"Cost ratios per stream, over the events the library decodes\n{note}", 0.5 * len(rows) + 2,
          text="{:.1f}x".format, gap=1.01)
    return [name for name, _alt in PLOTS]


# ---------------------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options (docs/spark.md explains them), checked; ``--input`` / ``--archive`` parsed, the key file read."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    add = ap.add_argument
    add("--input", action="append", metavar="[LABEL=]PATH",
        help="path, folder or glob of binlog files, any Hadoop filesystem (repeatable; default: "
             "benchmarks/data/streams and corpus=$RELAYPROXY_CORPUS or ../shared/corpus/binlogs)")
    add("--archive", action="append", metavar="[LABEL=]URL",
        help="a relay's archive, s3://bucket/prefix (s3a:// too) or file:///path (repeatable): its sealed files")
    add("--archive-endpoint", metavar="URL", help="S3-compatible endpoint of the --archive buckets")
    add("--archive-region", metavar="REGION", help="region of the --archive buckets")
    add("--archive-open", action="store_true", help="also read each archive's unsealed files")
    add("--encryption-key-file", metavar="PATH", help="the relay's key file, for archives of encrypted parts")
    add("--master", help="Spark master (default local[*]; under spark-submit, spark-submit's)")
    add("--parquet-output", help="where the Parquet tables go (default OUTPUT/parquet)")
    add("--output", help=f"output folder (default {DEFAULT_OUTPUT.relative_to(REPO_ROOT)}, and then summary.md and "
                         f"the plots are copied to {RESULTS_DIR.relative_to(REPO_ROOT)})")
    add("--split-bytes", type=int, default=8 << 20, help="cut files into splits of about this many bytes (8 MiB)")
    add("--split-events", type=int, default=20_000, help="... or this many events (default 20000)")
    add("--partitions", type=int, help="measuring tasks (default: 3 x Spark's default parallelism)")
    add("--batch-ns", type=int, default=10_000, help="target duration of one timed batch (default 10000)")
    add("--max-batch", type=int, default=64, help="largest batch k (default 64)")
    add("--repeats", type=int, default=3, help="batches per event and parser; the fastest counts (default 3)")
    add("--recheck-every", type=int, default=50, help="time every N-th event twice (0: never; default 50)")
    add("--percentiles", choices=("exact", "approx"), default="exact", help="Spark SQL percentile or percentile_approx")
    add("--shuffle-partitions", type=int, default=8, help="spark.sql.shuffle.partitions (default 8)")
    add("--runs", type=int, default=benchinfo.MIN_RUNS,
        help=f"runs over every event, the parsers' order alternated (default {benchinfo.MIN_RUNS})")
    add("--blob-bytes", type=int, default=64 << 10, help="the headline without events this large too (65536)")
    add("--no-walks", dest="walks", action="store_false", help="leave out parse_cost.py's walks on the driver")
    add("--walk-repeat", type=int, default=3, help="samples per walk and run (default 3)")
    add("--walk-min-sample", type=float, default=0.25, help="seconds a walk sample lasts at least (default 0.25)")
    add("--ui", action="store_true", help="turn Spark's web UI on (off by default)")
    args = ap.parse_args(argv)
    for name in ("split_bytes", "split_events", "partitions", "batch_ns", "max_batch", "repeats", "runs",
                 "blob_bytes", "walk_repeat"):
        if getattr(args, name) is not None and getattr(args, name) < 1:  # (--partitions: None, Spark's default)
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.recheck_every < 0:
        ap.error("--recheck-every must be 0 or more")
    args.publish = args.output is None
    args.output = args.output or str(DEFAULT_OUTPUT)
    args.parquet_output = (args.parquet_output or str(Path(args.output).resolve() / "parquet")).rstrip("/")
    try:
        args.inputs = [split_label(text, "--input", "path")[::-1] for text in args.input] if args.input else None
        args.archives = [ArchiveSpec.parse(text) for text in args.archive or ()]
    except ValueError as exc:
        ap.error(str(exc))
    args.keyring = None
    if args.encryption_key_file:
        from relayproxy.relay.closed_files import Keyring

        try:
            args.keyring = Keyring.from_file(args.encryption_key_file)
        except ValueError as exc:
            ap.error(f"--encryption-key-file: {exc}")
    return args


def list_archives(args) -> list[ArchivedFile]:
    """Every --archive's files to read (driver side), logged per archive."""
    found = []
    for spec in args.archives:
        files, left_out = list_archive(spec, endpoint=args.archive_endpoint, region=args.archive_region,
                                       include_open=args.archive_open)
        log(f"archive {spec.url} (stream {spec.stream}): {sum(f.sealed for f in files)} sealed"
            + (f", {sum(not f.sealed for f in files)} unsealed" if args.archive_open else "")
            + f" file(s), {sum(f.size for f in files):,} bytes to read"
            + (f"; {len(left_out)} unsealed file(s) left out ({', '.join(left_out)}; --archive-open reads them)"
               if left_out else ""))
        found += files
    if args.archives and not found:
        raise SystemExit("spark_parse_cost: the archives hold no file to read (none sealed; --archive-open reads the "
                         "unsealed ones)")
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    began = time.monotonic()
    out = Path(args.output)
    archived = list_archives(args)  # on the driver: listings only, the files are read by the tasks
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="spark-parse-cost-"))
    spark = start_spark(args, workdir)
    progress = Progress(spark.sparkContext, began)
    progress.start()
    try:
        if args.inputs is None and args.archives:
            inputs = []
        elif args.inputs is None:
            specs = [(str(DEFAULT_DATASET), None), (str(corpus_path()), "corpus")]
            inputs = resolve_inputs(spark, specs, required=False)
            if not any(p == str(DEFAULT_DATASET) for p, _l, _r in inputs):
                log(f"no recorded dataset at {DEFAULT_DATASET}: record it with `.venv/bin/python "
                    f"benchmarks/workloads.py` (about a minute); going on with the corpus alone")
            if not inputs:
                raise SystemExit("spark_parse_cost: neither the recorded dataset nor the corpus exists; give --input")
        else:
            inputs = resolve_inputs(spark, args.inputs, required=True)
        report = run_job(args, spark, inputs, progress, archived)
        progress.set_phase("write reports")
        write_csv(out / "summary.csv", report["summary"], SUMMARY_COLUMNS)
        write_csv(out / "file_counts.csv", report["file_counts"], FILE_COUNTS_COLUMNS)
        write_csv(out / "files.csv", report["files"], [name for name, _kind in FILES_SCHEMA_FIELDS])
        err = method_error(report["calibrations"])
        (out / "method_error.json").write_text(json.dumps(err, indent=1, default=str) + "\n")
        plots = write_plots(out, report)
        seconds = time.monotonic() - began
        shown = inputs + [(f"{spec.url} (archive)", spec.stream, spec.url) for spec in args.archives]
        text = render_markdown(args, argv, report, err, seconds, spark.version, spark.sparkContext.master, shown)
        (out / "summary.md").write_text(text)
        if args.publish:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            for name in ["summary.md", *plots]:
                shutil.copyfile(out / name, RESULTS_DIR / name)
            log(f"published summary.md and {len(plots)} plots to {RESULTS_DIR}")
        ra = report["ratios_all"]
        log(f"done in {seconds:.0f} s: {report['events']:,} events; library/boundary "
            f"{fmt_x(ra['library_dec'], ra['boundary_dec'])}, library/view {fmt_x(ra['library_dec'], ra['view_dec'])}; "
            f"wrote {out}")
    finally:
        progress.stopped.set()
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    # Run through the importable module, so the functions shipped to executors are found there by name
    # (the file is sent to them with addPyFile) instead of being pickled from __main__.
    import spark_parse_cost

    sys.exit(spark_parse_cost.main())
