"""Per-file indexes of closed relay files (``relayproxy.fileindex.<file>``): what a reader needs without a scan.

The catalog needs, for every closed file, the GTIDs of its groups (``gtid_purged``), and a GTID dump needs where
in a file a replica's set is passed. Both used to scan the files (at every start, O(total relay size)). When a
file closes (the store starts the next one) a background thread scans it once and writes its index; the catalog
and the dump start read that instead (O(files)).

An index holds: the file's size, the CRC32 of its FORMAT_DESCRIPTION and of its last 64 KiB (its identity,
checked at every use: three small reads), the CRC32 of the whole file (computed by the scan that builds the
index, for a deep check, ``verify_content``; not read at every use, which would cost what the index saves), its
SHA-256 (the same pass: what operators compare between two relays of one master, ``/status`` and ``relayproxy
inspect --summary``, docs/operations.md), the event and group counts, the first and last event offsets, the GTID set at its start (PREVIOUS_GTIDS / GTID_LIST)
and end, the final ROTATE, and a sparse map: every ``SPARSE_BYTES`` a group boundary with the file's GTID set
there (and how many anonymous groups precede it), so a GTID dump can start near its point, not at offset 4.

The index describes the file's logical content as the relay wrote it (written when the file closes, before any
later transformation of the file). It lives beside the file under the relay's reserved prefix, so recovery and
``relayproxy serve`` never take it for a binlog; it is written atomically (temporary file, fsync, rename,
directory fsync); the store removes it with its file (PURGE, retention). An index that is missing, damaged, or
does not match its file (size, FDE, last bytes) is not used: it is rebuilt where the relay may write (a log
line says why) and bypassed (the file scanned) where it may not (``relayproxy serve``). A reader that does not
know indexes ignores them.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..binlog import constants as C
from ..binlog.checksum import crc32 as _crc32
from ..binlog.gtid import GtidSet
from ..binlog.reader import BinlogScanner, ScannedGroup
from ..log import get_logger
from .closed_files import StoredFileError, archive_dir_of, locate, logical_name, open_relay_file, open_stream
from .checkpoint import TAIL_BYTES, decode_gtids, decode_record, encode_gtids, encode_record, read_fde_bytes
from .durable import write_file_atomically
from .layout import RESERVED_PREFIX

log = get_logger(__name__)

SIDECAR_PREFIX = RESERVED_PREFIX + "fileindex."
SPARSE_BYTES = 8 << 20  # a sparse map entry at the first group boundary past every 8 MiB
_FORMAT = "relayproxy-fileindex"
_VERSION = 2  # 2: sha256 (an index of version 1 is rebuilt, as any index that does not verify)
_CHUNK = 1 << 20
_MAX_RECORD = 64 << 20


class FileIndexError(ValueError):
    """An index cannot be read or does not describe its file (the message says why)."""


def sidecar_name(name: str) -> str:
    return SIDECAR_PREFIX + name


def sidecar_path(relay_dir: Path, name: str) -> Path:
    return Path(relay_dir) / sidecar_name(name)


@dataclass
class FileIndex:
    name: str
    size: int
    fde_len: int
    fde_crc: int
    tail_len: int
    tail_crc: int
    file_crc: int
    sha256: str  # hex SHA-256 of the file's logical bytes (all ``size`` of them)
    events: int
    groups: int
    anonymous_groups: int
    first_event: int
    last_event: int
    server_version: str | None
    checksum_alg: int | None
    start_gtids: dict | None  # checkpoint.encode_gtids form
    end_gtids: dict | None
    rotate_to: list | None
    error: str | None  # what the building scan found wrong (a closed file should be whole)
    sparse: list = field(default_factory=list)  # [[position, gtids (encoded), anonymous groups before]]

    # -- reading -------------------------------------------------------------------------------
    def start_set(self):
        return decode_gtids(self.start_gtids)

    def end_set(self):
        return decode_gtids(self.end_gtids)

    def events_gtids(self) -> GtidSet:
        """GTIDs of the complete groups in the file (MySQL): end set minus start set."""
        after, start = self.end_set(), self.start_set()
        after = after if isinstance(after, GtidSet) else GtidSet()
        start = start if isinstance(start, GtidSet) else GtidSet()
        return after.subtract(start)

    # -- encoding ------------------------------------------------------------------------------
    def encode(self) -> bytes:
        return encode_record(_FORMAT, _VERSION, asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> "FileIndex":
        body = decode_record(raw, _FORMAT, _VERSION, _MAX_RECORD, FileIndexError, "file index")
        try:
            idx = cls(**body)
        except TypeError as exc:
            raise FileIndexError(f"fields do not match: {exc}") from None
        ints = (idx.size, idx.fde_len, idx.fde_crc, idx.tail_len, idx.tail_crc, idx.file_crc, idx.events)
        if not isinstance(idx.name, str) or not all(type(v) is int for v in ints) or not isinstance(idx.sparse, list):
            raise FileIndexError("fields of the wrong type")
        if not isinstance(idx.sha256, str) or len(idx.sha256) != 64 or idx.sha256.strip("0123456789abcdef"):
            raise FileIndexError("sha256 is not 64 lowercase hex digits")
        return idx


# ---------------------------------------------------------------------------------------------
# Identity


def _identity(path: Path) -> tuple[int, int, int, int, int]:
    """(size, FDE length, FDE CRC32, tail length, tail CRC32) of a file as it is now: its logical bytes, in
    whatever form it is stored (relay/closed_files.py: compressed, encrypted, archived)."""
    f = open_relay_file(path)
    try:
        size = f.size()
        fde = _read_fde(f) if size >= 4 + C.HEADER_LEN else None
        tail_len = max(0, min(TAIL_BYTES, size - 4))
        tail = f.read(size - tail_len, tail_len)
    finally:
        f.close()
    return size, len(fde or b""), _crc32(fde or b""), tail_len, _crc32(tail)


def _read_fde(f) -> bytes | None:
    """``checkpoint.read_fde_bytes`` over a closed_files.LogicalFile."""
    if f.is_plain:
        return read_fde_bytes(f.fd)
    head = f.read(4, C.HEADER_LEN)
    if len(head) < C.HEADER_LEN or head[4] != C.FORMAT_DESCRIPTION_EVENT:
        return None
    size = int.from_bytes(head[9:13], "little")
    if not C.HEADER_LEN < size <= 64 << 10:
        return None
    raw = f.read(4, size)
    return raw if len(raw) == size else None


def check_identity(idx: FileIndex, path: Path) -> str | None:
    """Why ``idx`` does not describe the file at ``path`` now, or None."""
    size, fde_len, fde_crc, tail_len, tail_crc = _identity(path)
    if size != idx.size:
        return f"the file holds {size} bytes, the index describes {idx.size}"
    if (fde_len, fde_crc) != (idx.fde_len, idx.fde_crc):
        return "the file's FORMAT_DESCRIPTION_EVENT is not the one indexed"
    if (tail_len, tail_crc) != (idx.tail_len, idx.tail_crc):
        return f"the file's last {tail_len} bytes are not the ones indexed (CRC32 differs)"
    return None


def verify_content(idx: FileIndex, path: Path) -> str | None:
    """The deep check: why the whole file's CRC32 or SHA-256 differs from the index's, or None (reads the whole
    file)."""
    problem = check_identity(idx, path)
    if problem is not None:
        return problem
    crc = 0
    digest = hashlib.sha256()
    with open_stream(path) as f:
        while chunk := f.read(_CHUNK):
            crc = _crc32(chunk, crc)
            digest.update(chunk)
    if crc != idx.file_crc:
        return "the file's CRC32 differs from the index's: its content changed"
    if digest.hexdigest() != idx.sha256:
        return "the file's SHA-256 differs from the index's: its content changed"
    return None


def sha256_of(path: Path, length: int | None = None, *, keyring=None) -> tuple[str, int]:
    """(hex SHA-256, bytes hashed) of a relay file's logical bytes (any storage form), its first ``length`` bytes
    when given (the durable length of a file still growing), else all of it. Reads what it hashes."""
    digest = hashlib.sha256()
    done = 0
    with open_stream(path, keyring=keyring) as f:
        while length is None or done < length:
            chunk = f.read(_CHUNK if length is None else min(_CHUNK, length - done))
            if not chunk:
                break
            digest.update(chunk)
            done += len(chunk)
    if length is not None and done < length:
        raise FileIndexError(f"{path} holds {done} bytes, fewer than the {length} to hash")
    return digest.hexdigest(), done


# ---------------------------------------------------------------------------------------------
# Building, reading, writing


class _Stopped(Exception):
    pass


def build(path: Path, name: str, *, sparse_bytes: int = SPARSE_BYTES, stop: threading.Event | None = None) -> FileIndex:
    """Scan the closed file at ``path`` once and describe it (OSError when it cannot be read)."""
    sparse: list = []
    counts = {"anonymous": 0, "last_event": 4, "next_sparse": sparse_bytes}
    scanner: BinlogScanner

    def on_group(group: ScannedGroup) -> None:
        if not group.complete:
            return
        if group.gtid is None:
            counts["anonymous"] += 1
        if group.end >= counts["next_sparse"]:
            sparse.append([group.end, encode_gtids(scanner.result.gtids_after), counts["anonymous"]])
            counts["next_sparse"] = group.end + sparse_bytes

    def on_event(event) -> None:
        counts["last_event"] = event.offset

    scanner = BinlogScanner(on_group=on_group, on_event=on_event, path=os.fspath(path), max_event_in_memory=1 << 20)
    crc = 0
    digest = hashlib.sha256()
    with open_stream(path) as f:  # any storage form (relay/closed_files.py)
        size_at_open = f.seek(0, os.SEEK_END)
        f.seek(0)
        while chunk := f.read(_CHUNK):
            if stop is not None and stop.is_set():
                raise _Stopped()
            crc = _crc32(chunk, crc)
            digest.update(chunk)
            scanner.feed(chunk)
    r = scanner.finish()
    size, fde_len, fde_crc, tail_len, tail_crc = _identity(path)
    if size != size_at_open or size != r.bytes + 4 and r.ok:
        raise FileIndexError(f"{name} changed while it was indexed ({size_at_open} -> {size} bytes)")
    error = r.error or (f"{r.crc_errors} CRC errors" if r.crc_errors else None) or (
        "it ends inside a group" if r.partial_tail else None)
    return FileIndex(
        name=name, size=size, fde_len=fde_len, fde_crc=fde_crc, tail_len=tail_len, tail_crc=tail_crc, file_crc=crc,
        sha256=digest.hexdigest(),
        events=r.events, groups=r.groups_complete, anonymous_groups=counts["anonymous"], first_event=4,
        last_event=counts["last_event"], server_version=r.server_version,
        checksum_alg=r.fde.checksum_alg if r.fde else None, start_gtids=encode_gtids(r.start_gtids),
        end_gtids=encode_gtids(r.gtids_after), rotate_to=None if r.rotate_to is None else list(r.rotate_to),
        error=error, sparse=sparse,
    )


def load(relay_dir: Path, name: str) -> tuple[FileIndex | None, str | None]:
    """The index of ``name``, verified against the file, and None; or None and why not (missing included)."""
    side = sidecar_path(relay_dir, name)
    try:
        raw = side.read_bytes()
    except FileNotFoundError:
        return None, "no index"
    except OSError as exc:
        return None, f"index unreadable: {exc.strerror}"
    try:
        idx = FileIndex.decode(raw)
    except FileIndexError as exc:
        return None, f"index damaged: {exc}"
    if idx.name != name:
        return None, f"index is {idx.name}'s"
    try:
        problem = check_identity(idx, Path(relay_dir) / name)
    except OSError as exc:
        return None, f"cannot read the file to check its index: {exc.strerror}"
    except StoredFileError as exc:
        return None, f"cannot read the file to check its index: {exc}"
    if problem is not None:
        return None, f"index does not match: {problem}"
    return idx, None


def write(relay_dir: Path, idx: FileIndex) -> None:
    side = sidecar_path(relay_dir, idx.name)
    if len(side.name.encode("utf-8", "surrogateescape")) > 255:
        raise FileIndexError(f"{idx.name}: the index's name would be longer than a file name may be")
    tmp = side.with_name(f"{side.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    write_file_atomically(side, idx.encode(), tmp=tmp)


def remove(relay_dir: Path, name: str) -> None:
    """Remove the index of ``name`` (with its file: PURGE, retention); no error when there is none."""
    try:
        os.unlink(sidecar_path(relay_dir, name))
    except FileNotFoundError:
        pass


def index_for(relay_dir: Path, name: str, *, writable: bool) -> FileIndex:
    """The verified index of the closed file ``name``; rebuilt (and written when ``writable``) when missing or
    not matching, with a log line saying why. OSError when the file cannot be read."""
    relay_dir = Path(relay_dir)
    idx, why = load(relay_dir, name)
    if idx is not None:
        return idx
    idx = build(relay_dir / name, name)
    if writable:
        if why != "no index":
            log.warning("relay file index rebuilt", file=name, reason=why)
        try:
            write(relay_dir, idx)
        except (OSError, FileIndexError) as exc:
            log.warning("relay file index not written: the file will be scanned again next time", file=name,
                        error=str(exc))
    elif why != "no index":
        log.info("relay file index not used: the file was scanned", file=name, reason=why)
    return idx


def clean_leftovers(relay_dir: Path) -> list[str]:
    """Remove temporary index files a crash left, and indexes whose relay file is gone; returns their names."""
    relay_dir = Path(relay_dir)
    removed: list[str] = []
    try:
        entries = list(os.scandir(relay_dir))
    except OSError:
        return removed
    # A relay file may be stored converted (<name>.rpz) or archived (relay/closed_files.py): its index stays.
    names = {logical_name(e.name) for e in entries}
    archive = archive_dir_of(relay_dir)
    if archive is not None:
        try:
            names |= {logical_name(e.name) for e in os.scandir(archive)}
        except OSError:
            return removed  # the archive is not there: nothing can be told stale (recovery refuses to start)
    for entry in entries:
        if not entry.name.startswith(SIDECAR_PREFIX):
            continue
        stale = entry.name.endswith(".tmp") or entry.name[len(SIDECAR_PREFIX):] not in names
        if stale:
            try:
                os.unlink(entry.path)
                removed.append(entry.name)
            except OSError:
                pass
    if removed:
        log.info("removed leftover relay file indexes", files=removed)
    return removed


class Indexer:
    """Builds the index of each file the store closes, one at a time, in a background thread."""

    def __init__(self, relay_dir: Path):
        self.relay_dir = Path(relay_dir)
        self._queue: list[str] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.built: list[str] = []
        self._digests: dict[str, str] = {}  # name -> SHA-256 of closed files (their logical bytes never change)
        self._asked: set[str] = set()  # files without a usable index, queued once by digest()
        clean_leftovers(self.relay_dir)

    def digest(self, name: str) -> str | None:
        """The SHA-256 of the closed file ``name`` from its verified index, cached; None while it has no usable
        index (one is then built in the background: an index written before SHA-256s, or lost, is rebuilt).
        Only for closed files: the caller never asks for the file being written."""
        found = self._digests.get(name)
        if found is not None:
            return found
        idx, _why = load(self.relay_dir, name)
        if idx is not None:
            self._digests[name] = idx.sha256
            return idx.sha256
        if name not in self._asked and locate(self.relay_dir / name) is not None:
            self._asked.add(name)
            self.closed(name)
        return None

    def forget(self, name: str) -> None:
        """``name`` is gone (purged): drop its cached digest."""
        self._digests.pop(name, None)
        self._asked.discard(name)

    def closed(self, name: str) -> None:
        """``name`` is closed (the store started the next file): index it."""
        with self._lock:
            if self._stop.is_set():
                return
            self._queue.append(name)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="relay-fileindex", daemon=True)
                self._thread.start()
            self._wake.notify()

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Wait until every closed file queued so far is indexed (tests, benchmarks)."""
        with self._lock:
            return self._wake.wait_for(lambda: not self._queue and not self._busy, timeout)

    _busy = False

    def _run(self) -> None:
        while True:
            with self._lock:
                self._wake.wait_for(lambda: self._queue or self._stop.is_set())
                if self._stop.is_set():
                    return
                name = self._queue.pop(0)
                self._busy = True
            try:
                path = self.relay_dir / name
                if locate(path) is not None and load(self.relay_dir, name)[0] is None:
                    idx = build(path, name, stop=self._stop)
                    write(self.relay_dir, idx)
                    self._digests[name] = idx.sha256
                    self.built.append(name)
            except _Stopped:
                return
            except (OSError, FileIndexError) as exc:
                log.warning("relay file index not written: the file will be scanned when needed", file=name,
                            error=str(exc))
            except Exception as exc:  # noqa: BLE001 - a defect met on one file must not end indexing for good
                log.error("relay file index failed: the file will be scanned when needed", file=name,
                          error=repr(exc))
            except BaseException:
                # The process is going down (or, under crashfs, the simulated machine did): this thread ends
                # without a word; a later closed() starts another.
                with self._lock:
                    self._thread = None
                return
            finally:
                with self._lock:
                    self._busy = False
                    self._wake.notify_all()

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
