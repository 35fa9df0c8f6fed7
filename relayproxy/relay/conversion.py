"""Converting and archiving closed relay files, crash-safe at every step (``relay/closed_files.py`` reads them).

Conversion (``compress_closed = zstd`` and/or ``encrypt_at_rest = on``) of closed file ``F``:

1. write the framed form to ``F.rpz.rpxtmp`` (frames of ``frame_size`` logical bytes), fsync it;
2. verify: read it back through the reader (every frame decoded and checked) and compare the CRC32 and
   size of its logical bytes with those of ``F``;
3. give it ``F``'s mtime (retention by age keeps counting from the master's write), rename it to ``F.rpz``,
   fsync the directory;
4. remove ``F``, fsync the directory.

Archive (``archive_dir``, ``archive_after``) of a closed file stored as ``S`` (``F`` or ``F.rpz``):

1. copy ``S`` to ``<archive>/S.rpxtmp``, fsync it; read the copy back and compare its CRC32 with ``S``'s;
2. set its mtime, rename it to ``<archive>/S``, fsync the archive directory;
3. remove ``S`` from the relay directory, fsync the relay directory.

A kill -9 anywhere leaves ``F`` (plain), or ``F.rpz`` (verified), or both; a ``*.rpxtmp`` is never read.
``clean_leftovers`` (``closed_files.clean_leftovers``, called by recovery at open) removes temp files and, where two forms of one file are
left, the one the interrupted step was replacing: the later form was complete before it appeared.

A file purged while being converted: the product is removed once the step sees the file gone from the
index (it looks after its rename), so nothing outlives a purge.

``RELAYPROXY_TEST_KILL_AT=<action>:<step>`` (tests only) sends SIGKILL to this process at that step.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..binlog.checksum import crc32 as _crc32
from ..log import get_logger
from . import closed_files as CF
from .closed_files import DEFAULT_FRAME_SIZE, FLAG_AESGCM, FLAG_ZSTD, SUFFIX, TMP_SUFFIX, Keyring, StoredFileError
from .durable import fsync_dir, write_file_atomically

if TYPE_CHECKING:
    from .reader import StoreReader

log = get_logger("relayproxy.relay.conversion")

_COPY_CHUNK = 4 << 20
KILL_ENV = "RELAYPROXY_TEST_KILL_AT"
CONVERT_STEPS = ("begin", "partial", "written", "synced", "verified", "renamed", "removed")
ARCHIVE_STEPS = ("begin", "partial", "copied", "verified", "renamed", "removed")


def _step(action: str, step: str) -> None:
    """A kill point for the crash tests (no-op unless RELAYPROXY_TEST_KILL_AT names it)."""
    if os.environ.get(KILL_ENV) == f"{action}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


class ConversionError(RuntimeError):
    """A conversion or archive copy did not verify: nothing was replaced (the message says what differed)."""


# ---------------------------------------------------------------------------------------------
# Options


def parse_archive_after(value: Any) -> tuple[float | None, int | None]:
    """``archive_after``: an age (``7d``, ``12h``, ``90m``, ``3600s``, seconds as a number) or a count of
    closed files to keep in the relay directory (``20 files``). Returns (seconds, files)."""
    from .retention import parse_count_or, parse_duration

    return parse_count_or(value, parse_duration, "archive_after", "an age (7d, 12h, 3600s)")


def keyring_from_config(cfg) -> Keyring | None:
    """The keyring named by ``encryption_key_file`` / ``encryption_key_env`` (None when neither is set)."""
    path = getattr(cfg, "encryption_key_file", None)
    env = getattr(cfg, "encryption_key_env", None)
    current = getattr(cfg, "encryption_key_id", None)
    if path and env:
        raise ValueError("set encryption_key_file or encryption_key_env, not both")
    if path:
        return Keyring.from_file(path, current)
    if env:
        return Keyring.from_env(env, current)
    return None


@dataclass(frozen=True)
class StorageOptions:
    """How closed relay files are stored (``commands/config.py`` builds it from the options)."""

    compress: str = "off"  # "off" | "zstd"
    level: int = 3
    encrypt: bool = False
    keyring: Keyring | None = field(default=None, repr=False)
    archive_dir: Path | None = None
    archive_after_seconds: float | None = None
    archive_after_files: int | None = None
    frame_size: int = DEFAULT_FRAME_SIZE

    def __post_init__(self):
        if self.compress not in ("off", "zstd"):
            raise ValueError(f"compress_closed must be off or zstd, not {self.compress!r}")
        if not 1 <= self.level <= 22:
            raise ValueError(f"compress_level must be 1..22, not {self.level}")
        if self.encrypt and self.keyring is None:
            raise ValueError("encrypt_at_rest = on needs a key: encryption_key_file or encryption_key_env")
        if not 1 <= self.frame_size <= CF.MAX_FRAME_SIZE:
            raise ValueError(f"frame size {self.frame_size} is out of range")
        if self.archive_dir is not None and self.archive_after_seconds is None and self.archive_after_files is None:
            raise ValueError("archive_dir is set but archive_after is not (an age like 7d, or '20 files')")

    @classmethod
    def from_config(cls, cfg) -> "StorageOptions":
        """From the relay options (``commands/config.py``); ValueError names the option at fault."""
        keyring = keyring_from_config(cfg)
        seconds, files = parse_archive_after(getattr(cfg, "archive_after", None))
        archive = getattr(cfg, "archive_dir", None)
        return cls(
            compress=getattr(cfg, "compress_closed", None) or "off",
            level=getattr(cfg, "compress_level", None) or 3,
            encrypt=bool(getattr(cfg, "encrypt_at_rest", False)),
            keyring=keyring,
            archive_dir=Path(archive) if archive else None,
            archive_after_seconds=seconds,
            archive_after_files=files,
        )

    @property
    def converts(self) -> bool:
        return self.compress != "off" or self.encrypt

    @property
    def archives(self) -> bool:
        return self.archive_dir is not None

    @property
    def enabled(self) -> bool:
        return self.converts or self.archives

    def describe(self) -> str:
        parts = []
        if self.compress != "off":
            parts.append(f"zstd level {self.level}")
        if self.encrypt and self.keyring is not None:  # __post_init__ refuses encrypt without a keyring
            parts.append(f"AES-256-GCM key id {self.keyring.current}")
        if self.archives:
            after = (f"{self.archive_after_files} files" if self.archive_after_files is not None
                     else f"{self.archive_after_seconds:g}s")
            parts.append(f"archive to {self.archive_dir} after {after}")
        return ", ".join(parts) or "plain"


# ---------------------------------------------------------------------------------------------
# Writing the framed form


def write_framed(src: Path, dst: Path, name: str, opts: StorageOptions, *, action: str = "convert") -> tuple[int, int]:
    """Write the framed form of plain file ``src`` (relay file ``name``) to ``dst`` and fsync it.
    Returns (logical size, CRC32 of the logical bytes)."""
    flags = (FLAG_ZSTD if opts.compress == "zstd" else 0) | (FLAG_AESGCM if opts.encrypt else 0)
    file_id = os.urandom(16)
    nonce = os.urandom(12)
    key_id, check, aead = 0, b"\0" * 8, None
    if opts.encrypt:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        keyring = opts.keyring
        assert keyring is not None  # StorageOptions refuses encrypt without a keyring
        key_id = keyring.current
        key = keyring.keys[key_id]
        check = CF.key_check(key, file_id)
        aead = AESGCM(key)
    compressor = None
    if opts.compress == "zstd":
        import zstandard

        compressor = zstandard.ZstdCompressor(level=opts.level)
    crc = 0
    with open(src, "rb") as fin:
        size = os.fstat(fin.fileno()).st_size
        header = CF.encode_header(name=name, flags=flags, level=opts.level if compressor else 0,
                                  frame_size=opts.frame_size, logical_size=size, key_id=key_id, check=check,
                                  nonce=nonce, file_id=file_id)
        count = CF.frame_count(size, opts.frame_size)
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640 if opts.encrypt else 0o644)
        try:
            out = os.fdopen(fd, "wb", buffering=1 << 20)
        except BaseException:
            os.close(fd)
            raise
        with out:
            out.write(header)
            at = len(header)
            table = bytearray()
            for i in range(count):
                data = fin.read(opts.frame_size)
                want = min(opts.frame_size, size - i * opts.frame_size)
                if len(data) != want:
                    raise ConversionError(f"{src} changed while being converted (frame {i}: {len(data)} of {want} bytes)")
                crc = _crc32(data, crc)
                frame_crc = 0 if aead is not None else _crc32(data)
                stored = compressor.compress(data) if compressor is not None else data
                if aead is not None:
                    stored = aead.encrypt(CF.frame_nonce(nonce, i), stored, CF.frame_ad(header, i))
                out.write(stored)
                table += CF._TABLE_ENTRY.pack(at, len(stored), _crc32(stored), frame_crc)
                at += len(stored)
                if i == count // 2:
                    _step(action, "partial")
            if fin.read(1):
                raise ConversionError(f"{src} grew while being converted: it is not a closed file")
            out.write(table)
            out.write(CF._TRAILER.pack(at, count, _crc32(table), len(header), CF.END_MAGIC))
            out.flush()
            _step(action, "written")
            os.fsync(out.fileno())
    return size, crc


def logical_crc(path: Path, *, name: str | None = None, keyring: Keyring | None = None) -> tuple[int, int]:
    """(size, CRC32) of the logical bytes of one framed file (any name: a temp file too), every frame checked."""
    f = CF.FramedFile(Path(path), name=name, keyring=keyring)
    try:
        size = f.size()
        crc = 0
        step = getattr(f, "frame_size", _COPY_CHUNK)
        for pos in range(0, size, step):
            crc = _crc32(f.read(pos, step), crc)
        return size, crc
    finally:
        f.close()


def _file_crc(path: Path) -> tuple[int, int]:
    crc = 0
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_COPY_CHUNK):
            crc = _crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def _unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------------------------------------
# The steps


def convert_file(relay_dir: Path, name: str, opts: StorageOptions, *,
                 still_listed: Callable[[str], bool] = lambda name: True) -> Path | None:
    """Convert closed plain file ``relay_dir/name`` to ``name.rpz`` (module doc). Returns the new path, or
    None when there was nothing to do (already converted or archived, or purged)."""
    relay_dir = Path(relay_dir)
    src = relay_dir / name
    final = relay_dir / (name + SUFFIX)
    tmp = relay_dir / (name + SUFFIX + TMP_SUFFIX)
    if not src.is_file() or final.exists():
        return None
    _step("convert", "begin")
    _unlink_quiet(tmp)
    try:
        size, crc = write_framed(src, tmp, name, opts)
        _step("convert", "synced")
        back_size, back_crc = logical_crc(tmp, name=name, keyring=opts.keyring)
        if (back_size, back_crc) != (size, crc):
            raise ConversionError(f"{tmp} reads back as {back_size} bytes CRC {back_crc:08x}, the original is "
                                  f"{size} bytes CRC {crc:08x}: not used")
        # The original may have been purged or replaced while we read it: compare again.
        st = os.stat(src)
        if st.st_size != size:
            raise ConversionError(f"{src} changed size while being converted: not a closed file")
        _step("convert", "verified")
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.rename(tmp, final)
    except FileNotFoundError:
        _unlink_quiet(tmp)
        return None  # purged under us
    except BaseException:
        _unlink_quiet(tmp)
        raise
    fsync_dir(relay_dir)
    _step("convert", "renamed")
    if not still_listed(name):
        _unlink_quiet(final)  # purged meanwhile: the purge may have missed the new form
        _unlink_quiet(src)
        fsync_dir(relay_dir)
        return None
    _unlink_quiet(src)
    fsync_dir(relay_dir)
    _step("convert", "removed")
    return final


def archive_file(relay_dir: Path, name: str, archive_dir: Path, *,
                 still_listed: Callable[[str], bool] = lambda name: True) -> Path | None:
    """Move closed file ``name`` (plain or converted) from the relay directory to ``archive_dir`` (module doc)."""
    relay_dir, archive_dir = Path(relay_dir), Path(archive_dir)
    src = next((p for p in (relay_dir / (name + SUFFIX), relay_dir / name) if p.is_file()), None)
    if src is None:
        return None
    final = archive_dir / src.name
    tmp = archive_dir / (src.name + TMP_SUFFIX)
    _step("archive", "begin")
    _unlink_quiet(tmp)
    try:
        st = os.stat(src)
        crc = 0
        with open(src, "rb") as fin, open(tmp, "xb") as out:
            copied = 0
            while chunk := fin.read(_COPY_CHUNK):
                crc = _crc32(chunk, crc)
                out.write(chunk)
                copied += len(chunk)
                if copied >= st.st_size // 2:
                    _step("archive", "partial")
            out.flush()
            os.fsync(out.fileno())
        _step("archive", "copied")
        if _file_crc(tmp) != (st.st_size, crc) or copied != st.st_size:
            raise ConversionError(f"the archive copy {tmp} does not read back as {src} ({st.st_size} bytes): not used")
        if src.name.endswith(SUFFIX):  # a framed file: also check it opens and names the right file
            CF.FramedFile(tmp, name=name, keyring=CF.keyring_of(relay_dir)).close()
        _step("archive", "verified")
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.rename(tmp, final)
    except FileNotFoundError:
        _unlink_quiet(tmp)
        return None
    except StoredFileError as exc:
        _unlink_quiet(tmp)
        raise ConversionError(f"the archive copy of {src} does not read back: {exc}") from None
    except BaseException:
        _unlink_quiet(tmp)
        raise
    fsync_dir(archive_dir)
    _step("archive", "renamed")
    _unlink_quiet(src)
    fsync_dir(relay_dir)
    if not still_listed(name):
        _unlink_quiet(final)
        fsync_dir(archive_dir)
        return None
    _step("archive", "removed")
    return final


def write_archive_marker(relay_dir: Path, archive_dir: Path) -> None:
    """Name the archive directory in ``relayproxy.archive`` (so serve, inspect and recovery find it)."""
    marker = Path(relay_dir) / CF.ARCHIVE_MARKER
    text = os.fspath(Path(archive_dir).resolve()) + "\n"
    try:
        if marker.read_text("utf-8") == text:
            return
    except (OSError, UnicodeDecodeError):
        pass
    write_file_atomically(marker, text.encode("utf-8"))


# ---------------------------------------------------------------------------------------------
# What to do, and the background task


def closed_names(store: StoreReader) -> list[str]:
    """The files the store has moved past: neither the current file nor the horizon's, nor any after them."""
    names = store.files()
    horizon = store.horizon.snapshot().file
    stop = len(names)
    for keep in (store.current_file, horizon):
        if keep in names:
            stop = min(stop, names.index(keep))
    return names[:stop]


def pending(store: StoreReader, opts: StorageOptions, now: float | None = None) -> list[tuple[str, str]]:
    """``(action, name)`` still to do, oldest first: ``convert`` plain closed files, ``archive`` closed files
    past ``archive_after``."""
    now = time.time() if now is None else now
    relay_dir = Path(store.relay_dir)
    closed = closed_names(store)
    work = []
    archive_upto = 0
    if opts.archives:
        if opts.archive_after_files is not None:
            archive_upto = max(len(closed) - opts.archive_after_files, 0)
        elif opts.archive_after_seconds is not None:  # __post_init__: an archive_dir comes with one of the two
            for i, name in enumerate(closed):
                try:
                    mtime = CF.stored_stat(relay_dir / name).st_mtime
                except FileNotFoundError:
                    continue
                if now - mtime >= opts.archive_after_seconds:
                    archive_upto = i + 1
    for i, name in enumerate(closed):
        in_relay = (relay_dir / name).is_file() or (relay_dir / (name + SUFFIX)).is_file()
        if not in_relay:
            continue
        if opts.converts and (relay_dir / name).is_file():
            work.append(("convert", name))
        if i < archive_upto:
            work.append(("archive", name))
    return work


@dataclass
class StorageStats:
    """Counters of the storage task (status document / metrics)."""

    converted: int = 0
    archived: int = 0
    bytes_before: int = 0  # plain bytes of the files converted
    bytes_after: int = 0  # their stored bytes
    failures: int = 0
    last_error: str | None = None
    last_run: float | None = None

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def run_pending(store: StoreReader, opts: StorageOptions, stats: StorageStats | None = None, *,
                limit: int | None = None, stop: threading.Event | None = None) -> int:
    """Do the pending steps (in the calling thread: a worker thread); returns how many were done. ``stop`` set:
    no further step begins (the one under way finishes: every step is crash-safe anyway)."""
    stats = stats if stats is not None else StorageStats()
    relay_dir = Path(store.relay_dir)
    archive_dir = opts.archive_dir
    if archive_dir is not None:  # opts.archives
        named = CF.archive_dir_of(relay_dir)
        if named is not None and named.resolve() != Path(archive_dir).resolve():
            raise ConversionError(
                f"archive_dir is {archive_dir}, but {relay_dir / CF.ARCHIVE_MARKER} names {named}, where "
                f"relay files are archived already: move them to the new directory and rewrite that file, "
                f"or set archive_dir back")
        archive_dir.mkdir(parents=True, exist_ok=True)
        write_archive_marker(relay_dir, archive_dir)
    done = 0
    for action, name in pending(store, opts):
        if (limit is not None and done >= limit) or (stop is not None and stop.is_set()):
            break

        def listed(n: str) -> bool:
            return n in store.files()

        if not listed(name):
            continue
        try:
            if action == "convert":
                before = os.path.getsize(relay_dir / name)
                out = convert_file(relay_dir, name, opts, still_listed=listed)
                if out is not None:
                    stats.converted += 1
                    stats.bytes_before += before
                    stats.bytes_after += os.path.getsize(out)
                    log.info("relay file converted", file=name, stored=out.name, plain_bytes=before,
                             stored_bytes=os.path.getsize(out), form=opts.describe())
            else:
                assert archive_dir is not None  # pending() asks to archive only with an archive_dir
                out = archive_file(relay_dir, name, archive_dir, still_listed=listed)
                if out is not None:
                    stats.archived += 1
                    log.info("relay file archived", file=name, to=os.fspath(out))
        except (OSError, ConversionError, StoredFileError) as exc:
            stats.failures += 1
            stats.last_error = f"{action} {name}: {exc}"
            log.error("relay file conversion failed: the file stays as it was", action=action, file=name,
                      error=str(exc))
            break  # try again at the next run
        if out is not None:
            done += 1
    stats.last_run = time.time()
    return done


class StorageTask:
    """Runs ``run_pending`` every ``interval`` seconds in a worker thread (never on the event loop)."""

    def __init__(self, opts: StorageOptions, interval: float, store: Callable[[], StoreReader | None]):
        self.opts = opts
        self.interval = interval
        self._store = store
        self.stats = StorageStats()
        self._stop = threading.Event()

    async def run(self) -> None:
        log.info("closed relay file storage enabled", form=self.opts.describe(), interval=self.interval)
        try:
            while True:
                await self.check()
                await asyncio.sleep(self.interval)
        finally:
            self._stop.set()  # cancelled (the relay stops): the worker thread begins no further step

    async def check(self) -> int:
        store = self._store()
        if store is None or store.read_only:
            return 0
        try:
            return await asyncio.to_thread(run_pending, store, self.opts, self.stats, stop=self._stop)
        except Exception as exc:  # never kill the task; the error is in stats and the log
            self.stats.failures += 1
            self.stats.last_error = str(exc)
            log.error("closed relay file storage check failed", error=str(exc))
            return 0
