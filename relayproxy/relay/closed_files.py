"""Closed relay files in every storage form, read as their logical bytes (the master's binlog, byte for byte).

A closed relay file (the store has moved on to the next one) may be stored:

- plain, under its name in the relay directory (as the store wrote it; the newest file always is);
- converted, as ``<name>.rpz`` in the relay directory: a *framed* file (below), compressed with zstd,
  encrypted with AES-256-GCM, or both (compress, then encrypt);
- archived, plain or converted, under the same name in the archive directory (``relayproxy.archive`` in the
  relay directory names it, so every reader finds it without being told; the keyring is registered per relay
directory with ``configure``);
- offloaded to the archive's bucket (``archive_url``, ``archive_keep_local``): only a stub ``<name>.remote`` is
  left in the relay directory, holding the file's size, SHA-256, where its bucket is, and its first and last
  64 KiB (what headers, identity checks and recovery read). Any other read fetches the whole file once into the
  bounded local cache (``relay/remote.py``), checked against the SHA-256, and reads it there.

``open_relay_file(path)`` (``path`` = relay directory / name, as ``store.path(name)`` gives it) finds the file
in whichever form and place it is and returns a ``LogicalFile``: ``read(pos, n)`` returns exactly the
original bytes at those offsets, ``size()`` the logical size, ``close()``; ``stream()`` a seekable binary
file object of the logical bytes for the scanners. ``logical_size``, ``stored_stat``, ``scan`` and
``remove_all`` do the same look-up.

The framed format (version 1), all integers little-endian::

    header   magic "RPXFRAME", version u16, flags u8 (1 zstd, 2 AES-256-GCM), level u8, frame size u32,
             logical size u64, frame count u32, key id u32, key check 8 bytes, nonce base 12 bytes,
             file id 16 bytes, name length u16, name (utf-8), CRC32 of all of the above u32
    frames   frame i holds logical bytes [i * frame size, min((i + 1) * frame size, logical size)),
             zstd-compressed and/or AES-GCM-encrypted (16-byte tag appended), or as they are
    table    per frame: stored offset u64, stored length u32, CRC32 of its stored bytes u32, CRC32 of its
             logical bytes u32 (0 when encrypted: a plaintext CRC would leak)
    trailer  table offset u64, frame count u32, CRC32 of the table u32, header length u32, "RPXFEND1"

Encryption: the nonce of frame i is the file's random nonce base with i added to its last 8 bytes; the
associated data is the whole header (name, file id, sizes, key id) and i, so a frame moved to another place
or another file, a header changed, or frames cut off fail authentication. The key check (HMAC-SHA256 of
the file id under the key, 8 bytes) tells a wrong key from damage. The header, the table and every frame's
stored bytes carry CRC32s (any flipped bit is named as damage before anything is decoded), and without
encryption every frame's logical bytes too. Any mismatch raises ``StoredFileError`` naming the file, the frame and the
offsets; nothing of a bad frame is ever returned.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from ..binlog.checksum import crc32 as _crc32
from ..binlog.reader import BinlogScanner, ScanResult

SUFFIX = ".rpz"
REMOTE_SUFFIX = ".remote"  # the stub of a closed file whose bytes are in the archive's bucket only
REMOTE_MAGIC = b"RPXREMOTE1\n"
REMOTE_EDGE = 64 << 10  # bytes of the file's start and of its end a stub keeps
TMP_SUFFIX = ".rpxtmp"  # a conversion or archive copy not yet verified and renamed into place
ARCHIVE_MARKER = "relayproxy.archive"
MAGIC = b"RPXFRAME"
END_MAGIC = b"RPXFEND1"
VERSION = 1
FLAG_ZSTD = 1
FLAG_AESGCM = 2
DEFAULT_FRAME_SIZE = 1 << 20
MAX_FRAME_SIZE = 64 << 20
_FIXED = struct.Struct("<8sHBBIQII8s12s16sH")
_TABLE_ENTRY = struct.Struct("<QIII")
_TRAILER = struct.Struct("<QIII8s")
_U32 = struct.Struct("<I")
_TAG = 16
KEY_BYTES = 32


class StoredFileError(ValueError):
    """A stored relay file cannot be read back whole: damaged, truncated, a wrong or missing key. The
    message names the file, and the frame and offsets when one frame is at fault."""

    def __init__(self, message: str, *, file: str | None = None, frame: int | None = None,
                 offset: int | None = None):
        self.file = file
        self.frame = frame
        self.offset = offset
        super().__init__(message)


# ---------------------------------------------------------------------------------------------
# Keys


_KEY_LINE = re.compile(r"^\s*(\d+)\s*[:=]\s*([0-9a-fA-F]{64})\s*$")


@dataclass(frozen=True)
class Keyring:
    """AES-256 keys by id. New files are written with ``current`` (the highest id unless chosen); files
    written with older keys stay readable as long as their key stays in the ring. ``repr`` never shows keys."""

    keys: dict
    current: int
    source: str = "keyring"

    def __repr__(self) -> str:
        return f"<Keyring {self.source}: ids {sorted(self.keys)}, current {self.current}>"

    __str__ = __repr__

    @classmethod
    def parse(cls, text: str, source: str, current: int | None = None) -> "Keyring":
        """Lines (or ``,``/``;``/space separated entries) ``<id>:<64 hex digits>``; ``#`` starts a comment.
        A bare 64-hex-digit key is id 1. Errors name the source and the entry number, never the key."""
        keys: dict[int, bytes] = {}
        entries: list[str] = []
        for line in text.splitlines():
            line = line.split("#", 1)[0]
            entries.extend(e for e in re.split(r"[\s,;]+", line) if e)
        for n, entry in enumerate(entries, 1):
            if re.fullmatch(r"[0-9a-fA-F]{64}", entry):
                key_id, hexkey = 1, entry
            else:
                m = _KEY_LINE.match(entry)
                if not m:
                    raise ValueError(f"{source}: entry {n} is not <id>:<64 hex digits> (an AES-256 key)")
                key_id, hexkey = int(m.group(1)), m.group(2)
            if not 1 <= key_id <= 0xFFFFFFFF:
                raise ValueError(f"{source}: entry {n}: key id {key_id} is not in 1..4294967295")
            if key_id in keys:
                raise ValueError(f"{source}: key id {key_id} appears twice")
            keys[key_id] = bytes.fromhex(hexkey)
        if not keys:
            raise ValueError(f"{source}: no key found (expected lines <id>:<64 hex digits>)")
        if current is None:
            current = max(keys)
        elif current not in keys:
            raise ValueError(f"{source}: encryption key id {current} is not in it (ids: {sorted(keys)})")
        return cls(keys, current, source)

    @classmethod
    def from_file(cls, path, current: int | None = None) -> "Keyring":
        path = Path(path)
        try:
            text = path.read_text("ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the encryption key file {path}: {getattr(exc, 'strerror', None) or exc}") from None
        return cls.parse(text, f"key file {path}", current)

    @classmethod
    def from_env(cls, variable: str, current: int | None = None) -> "Keyring":
        text = os.environ.get(variable)
        if not text:
            raise ValueError(f"environment variable {variable} (encryption_key_env) is not set or empty")
        return cls.parse(text, f"environment variable {variable}", current)

    def key(self, key_id: int, file: str) -> bytes:
        key = self.keys.get(key_id)
        if key is None:
            raise StoredFileError(
                f"{file}: encrypted with key id {key_id}, which is not in the {self.source} (ids: "
                f"{sorted(self.keys)}): add the old key back to read it", file=file)
        return key


def key_check(key: bytes, file_id: bytes) -> bytes:
    return hmac.new(key, b"relayproxy key check" + file_id, hashlib.sha256).digest()[:8]


def frame_nonce(base: bytes, index: int) -> bytes:
    counter = (int.from_bytes(base[4:], "little") + index) & 0xFFFFFFFFFFFFFFFF
    return base[:4] + counter.to_bytes(8, "little")


def frame_ad(header: bytes, index: int) -> bytes:
    return header + index.to_bytes(8, "little")


# ---------------------------------------------------------------------------------------------
# Where a relay file is: the registry of directories (keyring, archive) and the look-up


_keyrings: dict[str, Keyring] = {}
_registry_lock = threading.Lock()


def configure(relay_dir, *, keyring: Keyring | None = None) -> None:
    """Tell the readers of ``relay_dir`` the keyring of its encrypted files (None: forget it)."""
    with _registry_lock:
        if keyring is None:
            _keyrings.pop(_dir_key(relay_dir), None)
        else:
            _keyrings[_dir_key(relay_dir)] = keyring


CHILD_KEYS_ENV = "RELAYPROXY_CLOSED_FILE_KEYS"  # the keyring handed to the relay's own sender processes


def env_for_children(relay_dir) -> dict[str, str]:
    """Environment entries that hand ``relay_dir``'s keyring to a child process of the relay (its sender
    processes: downstream/workers.py), read back by ``configure_from_env``. Never on a command line."""
    ring = keyring_of(relay_dir)
    if ring is None:
        return {}
    text = "\n".join(f"{key_id}:{key.hex()}" for key_id, key in sorted(ring.keys.items()))
    return {CHILD_KEYS_ENV: f"{ring.current}|{text}"}


_child_env_hooks: list[Callable[[Path], dict[str, str]]] = []  # relay/remote.py adds the archive's options


def add_child_environment(hook: Callable[[Path], dict[str, str]]) -> None:
    """``hook(relay_dir)`` gives more environment entries for the relay's child processes (``child_environment``)."""
    _child_env_hooks.append(hook)


def child_environment(relay_dir) -> dict[str, str]:
    """Everything a child process of the relay needs to read ``relay_dir``'s closed files as the relay does: the
    keyring (``env_for_children``) and what the modules that read offloaded files added (``add_child_environment``)."""
    env = env_for_children(relay_dir)
    for hook in _child_env_hooks:
        env.update(hook(Path(relay_dir)))
    return env


def configure_from_env(relay_dir) -> None:
    """In a child process: take the keyring ``env_for_children`` passed, and drop it from the environment."""
    value = os.environ.pop(CHILD_KEYS_ENV, None)
    if value:
        current, _, text = value.partition("|")
        configure(relay_dir, keyring=Keyring.parse(text, "the relay's keyring", int(current)))


def _dir_key(directory) -> str:
    return os.path.realpath(os.fspath(directory))


def archive_dir_of(relay_dir: Path) -> Path | None:
    """The archive directory of a relay directory, as ``relayproxy.archive`` in it names it (written by the
    archiver before it moves the first file), or None."""
    try:
        text = (Path(relay_dir) / ARCHIVE_MARKER).read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return Path(text) if text else None


def keyring_of(relay_dir: Path) -> Keyring | None:
    return _keyrings.get(_dir_key(relay_dir))


def candidates(path) -> list[Path]:
    """Where the relay file ``path`` (relay directory / name) may be stored, in the order looked at."""
    path = Path(path)
    out = [path, path.with_name(path.name + SUFFIX)]
    archive = archive_dir_of(path.parent)
    if archive is not None:
        out += [archive / path.name, archive / (path.name + SUFFIX)]
    out.append(path.with_name(path.name + REMOTE_SUFFIX))  # last: a local copy, when there is one, is read first
    return out


def locate(path) -> Path | None:
    """The stored file of relay file ``path`` (plain or converted, relay or archive directory), or None."""
    for candidate in candidates(path):
        if candidate.is_file():
            return candidate
    return None


def is_framed(stored: Path) -> bool:
    return stored.name.endswith(SUFFIX)


def is_remote(stored: Path) -> bool:
    return stored.name.endswith(REMOTE_SUFFIX)


def stored_stat(path) -> os.stat_result:
    """``os.stat`` of the stored file (its size is the bytes on disk); FileNotFoundError when in no place."""
    for candidate in candidates(path):
        try:
            return os.stat(candidate)
        except FileNotFoundError:
            continue
    raise FileNotFoundError(2, "relay file not found in the relay or archive directory", os.fspath(path))


_logical_sizes: dict[tuple, int] = {}


def stat_logical(path) -> tuple[os.stat_result, int]:
    """(``os.stat`` of the stored file, logical size): a stat, plus one header read per converted file
    (cached by its path, size and mtime). FileNotFoundError when in no place."""
    for candidate in candidates(path):
        try:
            st = os.stat(candidate)
        except FileNotFoundError:
            continue
        if not is_framed(candidate) and not is_remote(candidate):
            return st, st.st_size
        key = (os.fspath(candidate), st.st_size, st.st_mtime_ns)
        size = _logical_sizes.get(key)
        if size is None:
            if is_remote(candidate):
                size = read_stub(candidate).size
            else:
                with open(candidate, "rb") as f:
                    size = _parse_fixed(f.read(_FIXED.size), os.fspath(candidate))["logical_size"]
            if len(_logical_sizes) > 4096:
                _logical_sizes.clear()
            _logical_sizes[key] = size
        return st, size
    raise FileNotFoundError(2, "relay file not found in the relay or archive directory", os.fspath(path))


def exists(path) -> bool:
    return locate(path) is not None


def logical_size(path) -> int:
    """The size of the master's binlog the relay file holds (what SHOW BINARY LOGS reports)."""
    stored = locate(path)
    if stored is None:
        raise FileNotFoundError(2, "relay file not found in the relay or archive directory", os.fspath(path))
    if is_remote(stored):
        return stat_logical(path)[1]
    if not is_framed(stored):
        return os.path.getsize(stored)
    with open(stored, "rb") as f:
        head = f.read(_FIXED.size)
    hdr = _parse_fixed(head, os.fspath(stored))
    return hdr["logical_size"]


def remove_all(path) -> list[Path]:
    """Delete every stored form of relay file ``path`` (purge); returns what was removed. The directories
    are not fsynced here (the caller does)."""
    removed: list[Path] = []
    path = Path(path)
    for candidate in candidates(path):
        try:
            os.unlink(candidate)
            removed.append(candidate)
        except FileNotFoundError:
            pass
    source = _remote_sources.get(_dir_key(path.parent))
    if source is not None:
        source.forget(path.name)  # its copy in the local cache goes too (the bucket keeps the history)
    return removed


def logical_name(stored_name: str) -> str:
    for suffix in (SUFFIX, REMOTE_SUFFIX):
        if stored_name.endswith(suffix):
            return stored_name[: -len(suffix)]
    return stored_name


# ---------------------------------------------------------------------------------------------
# The framed format: header, reading


def _parse_fixed(head: bytes, file: str) -> dict:
    if len(head) < _FIXED.size or head[:8] != MAGIC:
        raise StoredFileError(f"{file}: not a relayproxy framed file (bad magic or too short)", file=file)
    (_m, version, flags, level, frame_size, logical, count, key_id, check, nonce, file_id,
     name_len) = _FIXED.unpack_from(head)
    if version != VERSION:
        raise StoredFileError(f"{file}: framed format version {version} is not supported (this relay reads {VERSION})",
                              file=file)
    return {"version": version, "flags": flags, "level": level, "frame_size": frame_size, "logical_size": logical,
            "frame_count": count, "key_id": key_id, "key_check": check, "nonce": nonce, "file_id": file_id,
            "name_len": name_len}


def encode_header(*, name: str, flags: int, level: int, frame_size: int, logical_size: int, key_id: int,
                  check: bytes, nonce: bytes, file_id: bytes) -> bytes:
    raw_name = name.encode("utf-8", "surrogateescape")
    count = frame_count(logical_size, frame_size)
    fixed = _FIXED.pack(MAGIC, VERSION, flags, level, frame_size, logical_size, count, key_id, check, nonce, file_id,
                        len(raw_name))
    body = fixed + raw_name
    return body + _U32.pack(_crc32(body))


def frame_count(logical_size: int, frame_size: int) -> int:
    return (logical_size + frame_size - 1) // frame_size


class LogicalFile:
    """A relay file open for reading its logical bytes. ``read(pos, n)``, ``size()``, ``close()``;
    ``is_plain`` says reads are a plain pread (cheap: no decoding). Thread-safe for reads."""

    is_plain = False

    def read(self, pos: int, n: int) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError

    def size(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def cheap(self, pos: int, n: int) -> bool:
        """Whether ``read(pos, n)`` needs no decoding (plain, or its frames are decoded already)."""
        return True

    def read_some(self, pos: int, n: int) -> bytes:
        """At least one byte at ``pos`` unless at the end, at most ``n`` (a short read where it saves work)."""
        return self.read(pos, n)

    def stream(self) -> io.BufferedReader:
        """A seekable binary file object over the logical bytes (for scanners); closing it closes this file."""
        return io.BufferedReader(_Raw(self), buffer_size=1 << 20)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PlainFile(LogicalFile):
    is_plain = True

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)

    def read(self, pos: int, n: int) -> bytes:
        return os.pread(self.fd, n, pos)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class FramedFile(LogicalFile):
    """A framed (``.rpz``) file: the header, table and trailer are checked at open; a frame at each read
    that needs it (the last two decoded frames are kept, so sequential small reads decode each frame once)."""

    def __init__(self, stored: Path, name: str | None = None, keyring: Keyring | None = None):
        self.path = stored
        self.file = os.fspath(stored)
        self.fd = os.open(stored, os.O_RDONLY)
        self._lock = threading.Lock()
        self._cache: dict[int, bytes] = {}
        try:
            self._open(name, keyring)
        except BaseException:
            os.close(self.fd)
            self.fd = -1
            raise

    def _fail(self, what: str, frame: int | None = None, offset: int | None = None) -> StoredFileError:
        return StoredFileError(f"{self.file}: {what}", file=self.file, frame=frame, offset=offset)

    def _pread(self, n: int, at: int) -> bytes:
        data = os.pread(self.fd, n, at)
        if len(data) != n:
            raise self._fail(f"truncated: {n} bytes expected at stored offset {at}, {len(data)} there", offset=at)
        return data

    def _open(self, name: str | None, keyring: Keyring | None) -> None:
        stored_size = os.fstat(self.fd).st_size
        if stored_size < _FIXED.size + 4 + _TRAILER.size:
            raise self._fail(f"truncated or not a framed file ({stored_size} bytes)")
        fixed = self._pread(_FIXED.size, 0)
        hdr = _parse_fixed(fixed, self.file)
        header_len = _FIXED.size + hdr["name_len"] + 4
        header = self._pread(header_len, 0)
        if _crc32(header[:-4]) != _U32.unpack_from(header, header_len - 4)[0]:
            raise self._fail("the header is damaged (CRC mismatch)", offset=0)
        self.header = header
        self.name = header[_FIXED.size:-4].decode("utf-8", "surrogateescape")
        if name is not None and self.name != name:
            raise self._fail(f"holds relay file {self.name!r}, not {name!r} (files swapped or renamed)")
        self.flags = hdr["flags"]
        if self.flags & ~(FLAG_ZSTD | FLAG_AESGCM):
            raise self._fail(f"unknown flags {self.flags:#x}")
        self.frame_size = hdr["frame_size"]
        if not 1 <= self.frame_size <= MAX_FRAME_SIZE:
            raise self._fail(f"frame size {self.frame_size} is out of range")
        self.logical = hdr["logical_size"]
        self.count = hdr["frame_count"]
        if self.count != frame_count(self.logical, self.frame_size):
            raise self._fail(f"{self.count} frames cannot hold {self.logical} bytes in frames of {self.frame_size}")
        trailer = self._pread(_TRAILER.size, stored_size - _TRAILER.size)
        table_at, count, table_crc, trailer_header_len, end = _TRAILER.unpack(trailer)
        if end != END_MAGIC:
            raise self._fail("truncated: the trailer is missing or damaged (end magic not found)",
                             offset=stored_size - _TRAILER.size)
        if count != self.count or trailer_header_len != header_len:
            raise self._fail(f"the trailer ({count} frames, header {trailer_header_len} bytes) does not match the "
                             f"header ({self.count} frames, {header_len} bytes)", offset=stored_size - _TRAILER.size)
        table_len = self.count * _TABLE_ENTRY.size
        if table_at + table_len + _TRAILER.size != stored_size:
            raise self._fail(f"the table at {table_at} does not end where the trailer begins (truncated?)",
                             offset=table_at)
        table = self._pread(table_len, table_at)
        if _crc32(table) != table_crc:
            raise self._fail("the frame table is damaged (CRC mismatch)", offset=table_at)
        self.table = [_TABLE_ENTRY.unpack_from(table, i * _TABLE_ENTRY.size) for i in range(self.count)]
        expect = header_len
        for i, (at, length, _scrc, _crc) in enumerate(self.table):
            if at != expect:
                raise self._fail(f"frame {i} is listed at stored offset {at}, expected {expect}", frame=i, offset=at)
            expect = at + length
        if expect != table_at:
            raise self._fail(f"the frames end at {expect}, but the table starts at {table_at}", offset=expect)
        self._aead = None
        if self.flags & FLAG_AESGCM:
            if keyring is None:
                raise self._fail(f"encrypted with key id {hdr['key_id']}, and no encryption key is configured "
                                 "(encryption_key_file / encryption_key_env, or --encryption-key-file)")
            key = keyring.key(hdr["key_id"], self.file)
            if not hmac.compare_digest(key_check(key, hdr["file_id"]), hdr["key_check"]):
                raise self._fail(f"key id {hdr['key_id']} of the {keyring.source} is not the key this file was "
                                 "encrypted with (wrong key)")
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            self._aead = AESGCM(key)
            self._nonce = hdr["nonce"]
        self._dctx = None
        if self.flags & FLAG_ZSTD:
            import zstandard

            self._zstd = zstandard
        self.key_id = hdr["key_id"]

    def size(self) -> int:
        return self.logical

    def cheap(self, pos: int, n: int) -> bool:
        if n <= 0 or pos >= self.logical:
            return True
        fs = self.frame_size
        cache = self._cache
        return all(i in cache for i in range(pos // fs, (min(pos + n, self.logical) - 1) // fs + 1))

    def frame(self, i: int) -> bytes:
        """The logical bytes of frame ``i``, checked (raises StoredFileError, never returns bad bytes)."""
        cached = self._cache.get(i)
        if cached is not None:
            return cached
        at, length, stored_crc, crc = self.table[i]
        start = i * self.frame_size
        want = min(self.frame_size, self.logical - start)
        where = f"frame {i} (logical offsets {start}-{start + want}, stored at {at}, {length} bytes)"
        data = self._pread(length, at)
        if _crc32(data) != stored_crc:
            raise self._fail(f"{where} is damaged (CRC mismatch of its stored bytes)", frame=i, offset=start)
        if self._aead is not None:
            from cryptography.exceptions import InvalidTag

            try:
                data = self._aead.decrypt(frame_nonce(self._nonce, i), data, frame_ad(self.header, i))
            except InvalidTag:
                raise self._fail(f"{where} fails authentication: damaged or tampered ciphertext", frame=i,
                                 offset=start) from None
        if self.flags & FLAG_ZSTD:
            try:
                data = self._zstd.ZstdDecompressor().decompress(data, max_output_size=want)
            except self._zstd.ZstdError as exc:
                raise self._fail(f"{where} does not decompress: {exc}", frame=i, offset=start) from None
        if len(data) != want:
            raise self._fail(f"{where} holds {len(data)} bytes, not {want}", frame=i, offset=start)
        if self._aead is None and _crc32(data) != crc:
            raise self._fail(f"{where} is damaged (CRC mismatch)", frame=i, offset=start)
        with self._lock:
            if len(self._cache) >= 2:
                self._cache.pop(next(iter(self._cache)))
            self._cache[i] = data
        return data

    def read(self, pos: int, n: int) -> bytes:
        if pos < 0 or n < 0:
            raise ValueError("negative position or length")
        end = min(pos + n, self.logical)
        if pos >= end:
            return b""
        fs = self.frame_size
        first, last = pos // fs, (end - 1) // fs
        if first == last:
            base = first * fs
            return self.frame(first)[pos - base : end - base]
        parts = []
        for i in range(first, last + 1):
            base = i * fs
            data = self.frame(i)
            parts.append(data[max(pos - base, 0) : min(end - base, len(data))])
        return b"".join(parts)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._cache.clear()


# ---------------------------------------------------------------------------------------------
# Offloaded files: the stub, and the file read through the archive cache


@dataclass(frozen=True)
class RemoteStub:
    """What ``<name>.remote`` holds: the file's size and SHA-256 (of the master's bytes), the archive it is in
    (``url`` without credentials, ``endpoint``, ``region``), its stored mtime, and its first and last bytes."""

    name: str
    size: int
    sha256: str
    url: str
    endpoint: str | None
    region: str | None
    mtime: float
    head: bytes
    tail: bytes

    @property
    def tail_start(self) -> int:
        return self.size - len(self.tail)

    def encode(self) -> bytes:
        import json

        meta = {"format": "relayproxy-remote-file", "version": 1, "name": self.name, "size": self.size,
                "sha256": self.sha256, "url": self.url, "endpoint": self.endpoint, "region": self.region,
                "mtime": self.mtime, "head": len(self.head), "tail": len(self.tail)}
        return REMOTE_MAGIC + json.dumps(meta, sort_keys=True).encode("utf-8") + b"\n" + self.head + self.tail

    @classmethod
    def decode(cls, raw: bytes, source: str) -> "RemoteStub":
        import json

        def bad(why: str) -> StoredFileError:
            return StoredFileError(f"{source} is not a readable relay file stub: {why}", file=source)

        if not raw.startswith(REMOTE_MAGIC):
            raise bad("no stub magic")
        line_end = raw.find(b"\n", len(REMOTE_MAGIC))
        if line_end < 0:
            raise bad("no header line")
        try:
            meta = json.loads(raw[len(REMOTE_MAGIC):line_end])
            head_len, tail_len, size = int(meta["head"]), int(meta["tail"]), int(meta["size"])
            body = raw[line_end + 1:]
            if meta.get("format") != "relayproxy-remote-file" or meta.get("version") != 1:
                raise bad("not a version 1 stub")
            if len(body) != head_len + tail_len or head_len > size or tail_len > size:
                raise bad(f"it holds {len(body)} bytes of edges, its header says {head_len} + {tail_len}")
            sha = str(meta["sha256"])
            if len(sha) != 64 or sha.strip("0123456789abcdef"):
                raise bad("its sha256 is not 64 lowercase hex digits")
            return cls(str(meta["name"]), size, sha, str(meta["url"]), meta.get("endpoint"), meta.get("region"),
                       float(meta.get("mtime") or 0.0), body[:head_len], body[head_len:])
        except (ValueError, KeyError, TypeError) as exc:
            raise bad(str(exc)) from None


def read_stub(stored) -> RemoteStub:
    """The stub at ``stored`` (``<name>.remote``). FileNotFoundError when gone, StoredFileError when damaged."""
    with open(stored, "rb") as f:
        raw = f.read(4 * REMOTE_EDGE + 65536)
    return RemoteStub.decode(raw, os.fspath(stored))


class RemoteSource(Protocol):
    """What fetches a directory's offloaded files into a local cache (relay/remote.py's ``ArchiveCache``)."""

    def fetch(self, stub: RemoteStub) -> Path:
        """The local path of a complete, verified copy of the file ``stub`` stands for."""

    def forget(self, name: str) -> None:
        """The file was purged: its cached copy goes."""


RemoteFactory = Callable[[Path, RemoteStub], "RemoteSource | None"]

# The source that fetches offloaded files into a local cache, per relay directory (relay/remote.py registers
# one; ``_default_remote`` builds one from a stub when none is: a process given no archive configuration).
_remote_sources: dict[str, RemoteSource] = {}
_default_remote: RemoteFactory | None = None


def configure_remote(relay_dir, source: RemoteSource | None) -> None:
    """Tell the readers of ``relay_dir`` how to fetch its offloaded files (``relay/remote.py``; None: forget)."""
    with _registry_lock:
        if source is None:
            _remote_sources.pop(_dir_key(relay_dir), None)
        else:
            _remote_sources[_dir_key(relay_dir)] = source


def set_default_remote(factory: RemoteFactory | None) -> None:
    """``factory(relay_dir, stub)`` builds (and registers) the source of a directory no one configured."""
    global _default_remote
    _default_remote = factory


def remote_source_of(relay_dir) -> RemoteSource | None:
    return _remote_sources.get(_dir_key(relay_dir))


def _fetch_remote(relay_dir: Path, stub: RemoteStub) -> Path:
    """The local path of a complete, verified copy of an offloaded file (fetched into the cache if need be)."""
    source = _remote_sources.get(_dir_key(relay_dir))
    if source is None and _default_remote is not None:
        source = _default_remote(relay_dir, stub)
    if source is None:
        raise StoredFileError(f"relay file {stub.name} is only in the archive {stub.url}, and no archive "
                              f"configuration is loaded to read it", file=stub.name)
    return source.fetch(stub)


class RemoteFile(LogicalFile):
    """An offloaded relay file: its first and last ``REMOTE_EDGE`` bytes come from the stub; any other read
    fetches the whole file once into the archive cache (a blocking download: ``cheap`` says False, so the
    dump reads it in a worker thread) and reads the copy there."""

    def __init__(self, stored: Path, name: str | None = None):
        self.stored = Path(stored)
        self.stub = read_stub(stored)
        if name is not None and self.stub.name != name:
            raise StoredFileError(f"{stored} is the stub of {self.stub.name}, not of {name}", file=name)
        self._local: PlainFile | None = None
        self._lock = threading.Lock()

    def _edge(self, pos: int, n: int, *, partial: bool) -> bytes | None:
        stub = self.stub
        end = min(pos + n, stub.size)
        if end <= pos:
            return b""
        head = len(stub.head)
        if end <= head or (partial and pos < head):
            return stub.head[pos:min(end, head)]
        if pos >= stub.tail_start:
            return stub.tail[pos - stub.tail_start:end - stub.tail_start]
        return None

    def _copy(self) -> "PlainFile":
        with self._lock:
            if self._local is None:
                self._local = PlainFile(_fetch_remote(self.stored.parent, self.stub))
            return self._local

    def read(self, pos: int, n: int) -> bytes:
        local = self._local
        if local is None:
            data = self._edge(pos, n, partial=False)
            if data is not None:
                return data
            local = self._copy()
        return local.read(pos, n)

    def read_some(self, pos: int, n: int) -> bytes:
        if self._local is None:
            data = self._edge(pos, n, partial=True)
            if data is not None:
                return data
        return self.read(pos, n)

    def cheap(self, pos: int, n: int) -> bool:
        return self._local is not None or self._edge(pos, n, partial=False) is not None

    def size(self) -> int:
        return self.stub.size

    @property
    def fetched(self) -> bool:
        return self._local is not None

    def close(self) -> None:
        local, self._local = self._local, None
        if local is not None:
            local.close()


class _Raw(io.RawIOBase):
    def __init__(self, f: LogicalFile):
        self._f = f
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._f.read_some(self._pos, len(b))
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            self._pos = offset
        elif whence == 1:
            self._pos += offset
        else:
            self._pos = self._f.size() + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()


def open_stored(stored: Path, *, name: str | None = None, keyring: Keyring | None = None) -> LogicalFile:
    """Open one stored file (plain or framed by its name) as a LogicalFile."""
    stored = Path(stored)
    if is_framed(stored):
        return FramedFile(stored, name=name, keyring=keyring)
    if is_remote(stored):
        return RemoteFile(stored, name=name)
    return PlainFile(stored)


def open_relay_file(path, *, keyring: Keyring | None = None) -> LogicalFile:
    """Open relay file ``path`` (relay directory / name) wherever and however it is stored.
    FileNotFoundError when it is in no place; StoredFileError when it cannot be read back whole."""
    path = Path(path)
    if keyring is None:
        keyring = keyring_of(path.parent)
    for candidate in candidates(path):
        try:
            return open_stored(candidate, name=path.name, keyring=keyring)
        except FileNotFoundError:
            continue  # converted or archived meanwhile: look at the next place
    raise FileNotFoundError(2, "relay file not found in the relay or archive directory", os.fspath(path))


def open_stream(path, *, keyring: Keyring | None = None) -> io.BufferedReader:
    """``open(path, "rb")`` for a relay file in any form: a seekable stream of its logical bytes."""
    path = Path(path)
    stored = locate(path)
    if stored is not None and not is_framed(stored) and not is_remote(stored):
        try:
            return open(stored, "rb")
        except FileNotFoundError:
            pass
    return open_relay_file(path, keyring=keyring).stream()


def scan(path, *, keyring: Keyring | None = None, chunk_size: int = 1 << 20, **kwargs) -> ScanResult:
    """``reader.scan_file`` over the logical bytes of relay file ``path`` in any form (same arguments)."""
    scanner = BinlogScanner(path=os.fspath(path), **kwargs)
    with open_stream(path, keyring=keyring) as f:
        while True:
            chunk = f.read(chunk_size)
            if not chunk:
                break
            scanner.feed(chunk)
            if scanner._stopped:
                break
    return scanner.finish()


def read_head(path, n: int) -> bytes:
    """The first ``n`` logical bytes of relay file ``path`` (``open(path, 'rb').read(n)``)."""
    with open_relay_file(path) as f:
        return f.read(0, n)


# ---------------------------------------------------------------------------------------------
# Leftovers of a crash (recovery calls this at open)


def clean_leftovers(relay_dir: Path, listed: list[str], warn: Callable[[str], None]) -> None:
    """Remove the temp files of interrupted steps and, where a listed closed file is stored twice, the form
    the interrupted step was replacing (archive over relay directory, framed over plain)."""
    relay_dir = Path(relay_dir)
    archive = archive_dir_of(relay_dir)
    dirs = [relay_dir] + ([archive] if archive is not None else [])
    if archive is not None and not archive.is_dir():
        raise StoredFileError(
            f"the archive directory {archive} (named in {relay_dir / ARCHIVE_MARKER}) is not there: mount it, "
            f"or the archived relay files would look purged")
    for d in dirs:
        changed = False
        for entry in os.scandir(d):
            if entry.name.endswith(TMP_SUFFIX) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                changed = True
                warn(f"removed {entry.path}: a conversion or archive copy interrupted before it was verified")
        if changed:
            _fsync_dir(d)
    for name in listed[:-1]:  # the newest file is never converted or archived
        forms = [p for p in _forms(relay_dir, archive, name) if p.is_file()]
        for extra in forms[1:]:
            os.unlink(extra)
            _fsync_dir(extra.parent)
            warn(f"removed {extra}: {forms[0]} replaces it (a conversion or archive step was interrupted after "
                 f"its rename)")


def _forms(relay_dir: Path, archive: Path | None, name: str) -> list[Path]:
    out = []
    if archive is not None:
        out += [archive / (name + SUFFIX), archive / name]
    return out + [relay_dir / (name + SUFFIX), relay_dir / name]


def present_names(relay_dir: Path, entries: set[str], listed: list[str]) -> set[str]:
    """The relay file names present in some form: ``entries`` (names in the relay directory) with a listed
    file's ``.rpz`` counted as the file, plus the listed files in the archive directory."""
    out = set()
    listed_set = set(listed)
    for entry in entries:
        logical = logical_name(entry)
        out.add(logical if logical != entry and logical in listed_set else entry)
    archive = archive_dir_of(Path(relay_dir))
    if archive is not None:
        for name in listed:
            if (archive / name).is_file() or (archive / (name + SUFFIX)).is_file():
                out.add(name)
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
