"""Relay files served back from the archive's bucket: reading a file's parts (checked), offloading sealed files to
stubs (``archive_keep_local``), and the bounded local cache offloaded files are read through.

``download_parts`` is the one reader of a file's objects: every part's bytes are checked against its SHA-256
(object metadata and, for a sealed file, the manifest's), framed payloads are decoded with the relay's keyring, and
the whole file is checked against the manifest's SHA-256. ``relayproxy restore`` and the cache both use it.

Offload (``offload_file``): a closed file sealed in the bucket is replaced by the stub ``<name>.remote``
(``closed_files.RemoteStub``: size, SHA-256, the archive's URL, first and last 64 KiB) written atomically before
any local form is removed, so a kill -9 at any step leaves the file readable: both forms (the local one is read
first, and the next pass removes it) or the stub. The file stays listed in ``relayproxy.index``: SHOW BINARY
LOGS, BINLOG_GTID_POS, dumps by file or GTID see it as they see a local file.

The cache (``ArchiveCache``): a read of an offloaded file past its edges fetches the whole file once into
``archive_cache_dir`` (default ``<relay_dir>/relayproxy.cache``), under ``<name>.rpxtmp`` until it is checked
against the stub's SHA-256, then renamed; readers wait on a per-file lock, so a file is fetched once however many
replicas ask. Files are evicted least recently opened first beyond ``archive_cache_size`` (a file being read stays
readable: its reader holds it open). A missing or corrupt object raises ``StoredFileError`` naming its key (never
served); an unreachable bucket raises OSError (EIO) naming the URL. Both end that one reader's dump with an error;
every other reader goes on.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Mapping, Sequence

from ..log import get_logger
from . import closed_files as CF
from .closed_files import REMOTE_EDGE, REMOTE_SUFFIX, TMP_SUFFIX, RemoteStub, StoredFileError
from .durable import fsync_dir
from .objectstore import ObjectNotFound, ObjectStore, ObjectStoreError

log = get_logger(__name__)

FORMAT = "relayproxy-archive"
VERSION = 1
ARCHIVE_KEY = "relayproxy-archive.json"
FILES_PREFIX = "files/"
MANIFEST = "manifest.json"
CACHE_DIR = "relayproxy.cache"
DEFAULT_CACHE_BYTES = 1 << 30
_CHUNK = 1 << 20


class ArchiveReadError(StoredFileError):
    """An object of the archive is missing or does not hold what it should; ``key`` names it."""

    def __init__(self, message: str, key: str | None = None, *, file: str | None = None):
        self.key = key
        super().__init__(message, file=file)


# ---------------------------------------------------------------------------------------------
# Reading a file's objects (the bucket's layout: relay/archive.py's doc)


def part_key(name: str, start: int, end: int) -> str:
    return f"{FILES_PREFIX}{name}/part.{start:020d}-{end:020d}"


def manifest_key(name: str) -> str:
    return f"{FILES_PREFIX}{name}/{MANIFEST}"


def decode_part(stored: Path, name: str, metadata: Mapping[str, str], dest: Path, *, keyring=None) -> str:
    """Write the master's bytes of a downloaded part (``stored``) to ``dest``; returns their SHA-256.
    StoredFileError when a framed payload cannot be read back whole (a wrong key, damage)."""
    digest = hashlib.sha256()
    with open(dest, "wb") as out:
        if metadata.get("encoding", "plain") == "framed":
            f = CF.FramedFile(Path(stored), name=name, keyring=keyring)
            try:
                size = f.size()
                for pos in range(0, size, _CHUNK):
                    chunk = f.read(pos, min(_CHUNK, size - pos))
                    digest.update(chunk)
                    out.write(chunk)
            finally:
                f.close()
        else:
            with open(stored, "rb") as src:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()




def read_archive_marker(bucket: ObjectStore) -> dict:
    """``relayproxy-archive.json``, checked to be a relayproxy archive of this version; ArchiveReadError naming it
    (missing, unreadable, another format)."""
    try:
        marker = json.loads(bucket.get(ARCHIVE_KEY))
    except ObjectNotFound:
        raise ArchiveReadError(f"{bucket.url} holds no relayproxy archive: {ARCHIVE_KEY} is missing",
                               ARCHIVE_KEY) from None
    except ValueError as exc:
        raise ArchiveReadError(f"{ARCHIVE_KEY} is not readable JSON: {exc}", ARCHIVE_KEY) from None
    if not isinstance(marker, dict) or marker.get("format") != FORMAT or marker.get("version") != VERSION:
        raise ArchiveReadError(f"{ARCHIVE_KEY} is not a relayproxy archive of version {VERSION}", ARCHIVE_KEY)
    return marker


def read_manifest(bucket: ObjectStore, name: str) -> tuple[dict, list[tuple[int, int, str, str]]]:
    """(manifest, [(start, end, key, sha256)]) of sealed file ``name``; ArchiveReadError naming the key."""
    key = manifest_key(name)
    try:
        manifest = json.loads(bucket.get(key))
        parts = [(int(p["start"]), int(p["end"]), str(p["key"]), str(p["sha256"])) for p in manifest["parts"]]
        int(manifest["size"])
        str(manifest["sha256"])
    except ObjectNotFound:
        raise ArchiveReadError(f"{key} is missing: {name} is not sealed in {bucket.url}", key, file=name) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ArchiveReadError(f"{key} is not a readable manifest: {exc}", key, file=name) from None
    at = 0
    for start, end, pkey, _sha in parts:
        if start != at or end <= start:
            raise ArchiveReadError(f"{key} names parts that do not chain: {pkey} should start at {at}", key, file=name)
        at = end
    if at != int(manifest["size"]):
        raise ArchiveReadError(f"{key}: its parts end at {at}, its size is {manifest['size']}", key, file=name)
    return manifest, parts


FETCH_PARALLEL = 8  # parts downloaded at once (a file open for an hour at archive_interval = 1 has 3,600 parts)


def fetch_part(bucket: ObjectStore, name: str, part: tuple[int, int, str, str | None], scratch: Path,
                keyring) -> Path:
    """Download and check one part; returns the path of its master's bytes in ``scratch`` (the caller removes it)."""
    start, end, key, want = part
    fd, tmp_name = tempfile.mkstemp(prefix="part.", dir=scratch)
    os.close(fd)
    stored = Path(tmp_name)
    plain = stored.with_name(stored.name + ".plain")
    try:
        info = bucket.head(key)
        if info is None:
            raise ArchiveReadError(f"{key} is missing", key, file=name)
        try:
            bucket.get_file(key, stored)
        except ObjectNotFound:
            raise ArchiveReadError(f"{key} is missing", key, file=name) from None
        try:
            got = decode_part(stored, name, info.metadata, plain, keyring=keyring)
        except StoredFileError as exc:  # damage or a wrong key
            raise ArchiveReadError(f"{key} cannot be read back: {exc}", key, file=name) from None
        size = plain.stat().st_size
        if got != info.metadata.get("sha256") or (want is not None and got != want) or size != end - start:
            raise ArchiveReadError(
                f"{key} is corrupt: its bytes do not match its SHA-256 ({got}, {size} bytes; expected "
                f"{want or info.metadata.get('sha256')}, {end - start} bytes)", key, file=name)
        return plain
    except BaseException:
        _unlink(plain)
        raise
    finally:
        _unlink(stored)


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def download_parts(bucket: ObjectStore, name: str, parts: Sequence[tuple[int, int, str, str | None]], out: BinaryIO,
                   scratch: Path, *, keyring=None) -> "hashlib._Hash":
    """Write the master's bytes of ``parts`` (start, end, key, expected sha256 or None) of file ``name`` to
    ``out`` in order, each checked against its SHA-256; returns the running hash of everything written.
    ArchiveReadError naming the object when one is missing, cannot be decoded or does not match.
    Up to ``FETCH_PARALLEL`` parts are downloaded at once (at most twice that many wait in ``scratch``)."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    whole = hashlib.sha256()
    scratch.mkdir(parents=True, exist_ok=True)
    todo = iter(parts)
    pending: deque = deque()
    with ThreadPoolExecutor(max_workers=FETCH_PARALLEL, thread_name_prefix="archive-fetch") as pool:

        def fill() -> None:
            while len(pending) < 2 * FETCH_PARALLEL:
                part = next(todo, None)
                if part is None:
                    return
                pending.append(pool.submit(fetch_part, bucket, name, part, scratch, keyring))

        try:
            fill()
            while pending:
                plain = pending.popleft().result()
                try:
                    with open(plain, "rb") as src:
                        while chunk := src.read(_CHUNK):
                            whole.update(chunk)
                            out.write(chunk)
                finally:
                    _unlink(plain)
                fill()
        except BaseException:
            for future in pending:
                future.cancel()
            for future in pending:
                if not future.cancelled() and future.exception() is None:
                    _unlink(future.result())
            raise
    return whole


# ---------------------------------------------------------------------------------------------
# Offloading sealed files (the uploader thread calls this)


def parse_keep_local(value) -> tuple[int | None, int | None]:
    """``archive_keep_local``: a size (``50G``: the newest sealed files up to that many stored bytes keep their local
    copies) or a count (``20 files``). Returns (bytes, files); (None, None) when unset (nothing is offloaded)."""
    from .retention import parse_count_or, parse_size

    return parse_count_or(value, parse_size, "archive_keep_local", "a size (50G, 500M)")


def plan_offload(closed: Sequence[tuple[str, int]], keep_bytes: int | None, keep_files: int | None) -> list[str]:
    """Which of the sealed closed files still stored locally (``closed``: (name, stored bytes), oldest first) to
    offload: all but the newest ``keep_files``, or all but the newest that fit in ``keep_bytes``."""
    if keep_files is not None:
        return [name for name, _size in closed[: max(0, len(closed) - keep_files)]]
    if keep_bytes is None:
        return []
    kept = 0
    cut = len(closed)
    for i in range(len(closed) - 1, -1, -1):
        if kept + closed[i][1] > keep_bytes:
            break
        kept += closed[i][1]
        cut = i
    return [name for name, _size in closed[:cut]]


def write_stub(relay_dir: Path, stub: RemoteStub) -> Path:
    """``<name>.remote`` written atomically (temp file, fsync, its mtime, rename, directory fsync); its path."""
    target = Path(relay_dir) / (stub.name + REMOTE_SUFFIX)
    tmp = Path(relay_dir) / (stub.name + REMOTE_SUFFIX + TMP_SUFFIX)
    with open(tmp, "wb") as out:
        out.write(stub.encode())
        out.flush()
        os.fsync(out.fileno())
    os.utime(tmp, (stub.mtime, stub.mtime))  # retention by age keeps counting from the master's write
    os.rename(tmp, target)
    fsync_dir(relay_dir)
    return target


def read_range(bucket: ObjectStore, name: str, parts: Sequence[tuple[int, int, str, str | None]], lo: int, hi: int,
               scratch: Path, *, keyring=None) -> bytes:
    """The master's bytes [lo, hi) of file ``name``, from the parts that hold them, each downloaded whole and
    checked (``fetch_part``): no unchecked byte."""
    out = bytearray()
    scratch.mkdir(parents=True, exist_ok=True)
    for part in parts:
        start, end = part[0], part[1]
        if end <= lo or start >= hi:
            continue
        plain = fetch_part(bucket, name, part, scratch, keyring)
        try:
            with open(plain, "rb") as f:
                f.seek(max(lo, start) - start)
                out += f.read(min(hi, end) - max(lo, start))
        finally:
            _unlink(plain)
    if len(out) != hi - lo:
        raise ArchiveReadError(f"the parts of {name} do not hold its bytes [{lo}, {hi})", None, file=name)
    return bytes(out)


def stub_from_bucket(bucket: ObjectStore, name: str, scratch: Path, *, location: tuple[str, str | None, str | None],
                     keyring=None) -> RemoteStub:
    """The stub of sealed file ``name`` built from the bucket alone (its manifest, and the parts holding its first and
    last ``REMOTE_EDGE`` bytes), for a restore that leaves the file there. Its mtime is the time of the file's first
    event (the master wrote the file from then on; the bucket keeps no file times)."""
    manifest, parts = read_manifest(bucket, name)
    size = int(manifest["size"])
    edge = min(size, REMOTE_EDGE)
    head = read_range(bucket, name, parts, 0, edge, scratch, keyring=keyring)
    tail = read_range(bucket, name, parts, size - edge, size, scratch, keyring=keyring)
    mtime = float(int.from_bytes(head[4:8], "little")) if len(head) >= 8 else time.time()
    url, endpoint, region = location
    return RemoteStub(name, size, str(manifest["sha256"]), url, endpoint, region, mtime, head, tail)


def offload_file(relay_dir: Path, name: str, *, sha256: str, url: str, endpoint: str | None = None,
                 region: str | None = None, keyring=None) -> RemoteStub | None:
    """Replace the local forms of closed file ``name`` with its stub (module doc). None when it is gone or is a stub
    already. The caller has checked that the bucket holds it sealed with this ``sha256``."""
    relay_dir = Path(relay_dir)
    path = relay_dir / name
    stored = CF.locate(path)
    if stored is None or CF.is_remote(stored):
        return None
    mtime = os.stat(stored).st_mtime
    with CF.open_relay_file(path, keyring=keyring) as f:
        size = f.size()
        head = f.read(0, min(size, REMOTE_EDGE))
        tail_len = min(size, REMOTE_EDGE)
        tail = f.read(size - tail_len, tail_len)
    if len(head) != min(size, REMOTE_EDGE) or len(tail) != tail_len:
        raise OSError(errno.EIO, f"{name}: short read of its edges while offloading it")
    stub = RemoteStub(name, size, sha256, url, endpoint, region, mtime, head, tail)
    target = write_stub(relay_dir, stub)
    dirs = set()
    for candidate in CF.candidates(path):
        if candidate == target:
            continue
        try:
            os.unlink(candidate)
            dirs.add(candidate.parent)
        except FileNotFoundError:
            pass
    for d in dirs:
        fsync_dir(d)
    return stub


# ---------------------------------------------------------------------------------------------
# The cache


@dataclass
class CacheStats:
    hits: int = 0  # opens of an offloaded file found in the cache
    fetches: int = 0  # whole files fetched from the bucket
    bytes_fetched: int = 0
    evictions: int = 0
    errors: int = 0
    last_error: str | None = None
    fetch_seconds: float = 0.0


class ArchiveCache:
    """Fetches offloaded files from ``bucket`` into ``cache_dir`` (bounded by ``max_bytes``) and hands out the
    local path of a verified copy (module doc). Thread-safe."""

    def __init__(self, bucket: ObjectStore, cache_dir: Path, max_bytes: int = DEFAULT_CACHE_BYTES, *, keyring=None,
                 owner: bool = True):
        self.bucket = bucket
        self.cache_dir = Path(cache_dir)
        self.max_bytes = int(max_bytes)
        self.keyring = keyring
        self.owner = owner
        self.stats = CacheStats()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._cleaned = False
        self.child_options: dict | None = None  # set by cache_from_config (env_for_children)

    def _lock_for(self, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    def _clean(self) -> None:
        """Remove fetches a crash interrupted (``*.rpxtmp``, scratch parts) once, before the first fetch."""
        if self._cleaned:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        if self.owner:  # a sender process shares the directory: only the relay clears it
            for entry in os.scandir(self.cache_dir):
                if entry.name.endswith(TMP_SUFFIX):
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
        self._cleaned = True

    def fetch(self, stub: RemoteStub) -> Path:
        target = self.cache_dir / stub.name
        with self._lock_for(stub.name):
            try:
                st = os.stat(target)
            except FileNotFoundError:
                st = None
            if st is not None and st.st_size == stub.size:
                os.utime(target)  # recently used
                self.stats.hits += 1
                return target
            try:
                return self._fetch(stub, target)
            except (StoredFileError, OSError) as exc:
                self.stats.errors += 1
                self.stats.last_error = str(exc)
                log.error("offloaded relay file cannot be fetched from the archive: not served", file=stub.name,
                          url=self.bucket.url, error=str(exc))
                raise

    def _fetch(self, stub: RemoteStub, target: Path) -> Path:
        started = time.monotonic()
        self._clean()
        fd, tmp_name = tempfile.mkstemp(prefix=stub.name + ".", suffix=TMP_SUFFIX, dir=self.cache_dir)
        os.close(fd)  # a name of its own: a sender process may fetch the same file at the same time
        tmp = Path(tmp_name)
        scratch = tmp.with_name(tmp.name[: -len(TMP_SUFFIX)] + ".parts" + TMP_SUFFIX)
        try:
            manifest, parts = read_manifest(self.bucket, stub.name)
            if manifest["sha256"] != stub.sha256 or int(manifest["size"]) != stub.size:
                key = manifest_key(stub.name)
                raise ArchiveReadError(f"{key} describes another {stub.name} than the relay offloaded (SHA-256 "
                                       f"{manifest['sha256']}, {manifest['size']} bytes; the stub says {stub.sha256}, "
                                       f"{stub.size} bytes)", key, file=stub.name)
            with open(tmp, "wb") as out:
                whole = download_parts(self.bucket, stub.name, parts, out, scratch, keyring=self.keyring)
                out.flush()
                os.fsync(out.fileno())
            if whole.hexdigest() != stub.sha256:
                raise ArchiveReadError(f"the parts of {stub.name} ({manifest_key(stub.name)}) do not add up to its "
                                       f"SHA-256 {stub.sha256}", manifest_key(stub.name), file=stub.name)
            os.rename(tmp, target)
            fsync_dir(self.cache_dir)
        except ObjectStoreError as exc:
            raise OSError(errno.EIO, f"relay file {stub.name} is only in the archive, and {self.bucket.url} cannot be "
                                     f"read: {exc}") from None
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            if scratch.is_dir():
                for entry in os.scandir(scratch):
                    os.unlink(entry.path)
                os.rmdir(scratch)
        self.stats.fetches += 1
        self.stats.bytes_fetched += stub.size
        self.stats.fetch_seconds += time.monotonic() - started
        log.info("offloaded relay file fetched from the archive", file=stub.name, bytes=stub.size,
                 seconds=round(time.monotonic() - started, 3), parts=len(parts))
        self.evict(keep=stub.name)
        return target

    def entries(self) -> list[tuple[float, int, str]]:
        """(mtime, size, name) of the cached files, least recently used first."""
        out: list[tuple[float, int, str]] = []
        try:
            scan = list(os.scandir(self.cache_dir))
        except FileNotFoundError:
            return out
        for entry in scan:
            if entry.name.endswith(TMP_SUFFIX) or not entry.is_file(follow_symlinks=False):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            out.append((st.st_mtime, st.st_size, entry.name))
        return sorted(out)

    def used_bytes(self) -> int:
        return sum(size for _m, size, _n in self.entries())

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove least recently used files until the cache holds at most ``max_bytes`` (never ``keep``, the file
        just fetched: a file larger than the cache is still served)."""
        entries = self.entries()
        total = sum(size for _m, size, _n in entries)
        removed = []
        for _mtime, size, name in entries:
            if total <= self.max_bytes:
                break
            if name == keep:
                continue
            try:
                os.unlink(self.cache_dir / name)
            except FileNotFoundError:
                pass
            total -= size
            removed.append(name)
            self.stats.evictions += 1
        return removed

    def forget(self, name: str) -> None:
        """The file was purged: its copy goes."""
        try:
            os.unlink(self.cache_dir / name)
        except FileNotFoundError:
            pass

    def describe(self) -> dict:
        entries = self.entries()
        return {"dir": os.fspath(self.cache_dir), "max_bytes": self.max_bytes,
                "bytes": sum(size for _m, size, _n in entries), "files": len(entries), "hits": self.stats.hits,
                "fetches": self.stats.fetches, "bytes_fetched": self.stats.bytes_fetched,
                "evictions": self.stats.evictions, "errors": self.stats.errors, "last_error": self.stats.last_error}


def configure(relay_dir: Path, cache: ArchiveCache | None) -> None:
    """Register ``cache`` as the way ``relay_dir``'s offloaded files are read (``relayproxy run`` with
    archive_url)."""
    CF.configure_remote(relay_dir, cache)


def _default_cache(relay_dir: Path, stub: RemoteStub) -> CF.RemoteSource | None:
    """For a process given no archive configuration (``relayproxy serve``, ``inspect``, a sender process): the
    stub's archive, credentials from the standard AWS chain, the default cache in the relay directory."""
    from .objectstore import open_object_store

    existing = CF.remote_source_of(relay_dir)
    if existing is not None:
        return existing
    try:
        bucket = open_object_store(stub.url, endpoint=stub.endpoint, region=stub.region)
    except (ValueError, ObjectStoreError) as exc:
        raise StoredFileError(f"relay file {stub.name} is only in the archive {stub.url}, which cannot be opened: "
                              f"{exc}", file=stub.name) from None
    cache = ArchiveCache(bucket, Path(relay_dir) / CACHE_DIR, DEFAULT_CACHE_BYTES, keyring=CF.keyring_of(relay_dir))
    CF.configure_remote(relay_dir, cache)
    return cache


CF.set_default_remote(_default_cache)


CHILD_ENV = "RELAYPROXY_ARCHIVE_CACHE"  # the archive options handed to the relay's sender processes
_ARCHIVE_OPTIONS = ("archive_url", "archive_endpoint", "archive_region", "archive_access_key_id",
                    "archive_secret_access_key_file")


def cache_from_config(cfg, bucket: ObjectStore, relay_dir: Path, keyring=None) -> ArchiveCache:
    from .retention import parse_size

    size = getattr(cfg, "archive_cache_size", None)
    cache_dir = getattr(cfg, "archive_cache_dir", None)
    cache = ArchiveCache(bucket, Path(cache_dir) if cache_dir else Path(relay_dir) / CACHE_DIR,
                         parse_size(size) if size else DEFAULT_CACHE_BYTES, keyring=keyring)
    # For the sender processes: the options that open the same bucket (the secret stays in its file: a child reads
    # it there, as the relay did) and the same cache.
    cache.child_options = {key: getattr(cfg, key, None) for key in _ARCHIVE_OPTIONS}
    return cache


def env_for_children(relay_dir) -> dict[str, str]:
    """Environment entries that let a sender process (downstream/workers.py) read offloaded files through the
    relay's bucket and cache (``configure_from_env`` reads them back); none when no archive is configured."""
    cache = CF.remote_source_of(relay_dir)
    if not isinstance(cache, ArchiveCache) or not cache.child_options:  # only relay/remote.py registers a source
        return {}
    return {CHILD_ENV: json.dumps({**cache.child_options, "cache_dir": os.fspath(cache.cache_dir),
                                   "max_bytes": cache.max_bytes})}


CF.add_child_environment(env_for_children)


def configure_from_env(relay_dir) -> None:
    """In a sender process: the relay's archive cache, from ``env_for_children``'s entry (dropped from the
    environment)."""
    from types import SimpleNamespace

    from .objectstore import from_config

    value = os.environ.pop(CHILD_ENV, None)
    if not value:
        return
    options = json.loads(value)
    bucket = from_config(SimpleNamespace(**{key: options.get(key) for key in _ARCHIVE_OPTIONS}))
    configure(relay_dir, ArchiveCache(bucket, Path(options["cache_dir"]), int(options["max_bytes"]),
                                      keyring=CF.keyring_of(relay_dir), owner=False))


Fetcher = Callable[[RemoteStub], Path]
