"""Durable writes of a relay directory's small files: a file replaced atomically (temporary file, fsync, rename,
directory fsync), the index, the epochs record, and the durable mark, a cache of the last durable horizon
position that recovery uses only to tell damage in once-durable data from a crash's debris."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..binlog.checksum import crc32 as _crc32
from .epochs import EPOCHS_NAME, EPOCHS_TMP_NAME, Epochs
from .errors import RelayRecoveryError
from .layout import DURABLE_MARK_NAME, INDEX_NAME, INDEX_TMP_NAME, check_file_name

_MARK_RECORD_LEN = 512
_MARK_PREFIX = "relayproxy-durable v1"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_index(relay_dir: Path) -> list[str] | None:
    """The names in ``relayproxy.index`` (oldest first), or None when there is no index."""
    try:
        raw = (relay_dir / INDEX_NAME).read_bytes()
    except FileNotFoundError:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RelayRecoveryError(f"{relay_dir / INDEX_NAME} is not UTF-8: {exc}") from None
    names: list[str] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        try:
            check_file_name(line)
        except ValueError as exc:
            raise RelayRecoveryError(f"{relay_dir / INDEX_NAME} line {lineno}: {exc}") from None
        if line in seen:
            raise RelayRecoveryError(f"{relay_dir / INDEX_NAME} line {lineno}: {line!r} is listed twice")
        seen.add(line)
        names.append(line)
    return names


def write_file_atomically(path: Path, data: bytes, *, mode: int = 0o644, ignore_umask: bool = False,
                          tmp: Path | None = None) -> None:
    """Replace the small file ``path`` with ``data``: a crash leaves the old content or the new, never a mix.

    ``data`` goes to a temporary file in the same directory (``tmp``, by default ``<name>.tmp``), which is
    fsynced and renamed over ``path``; then the directory is fsynced, so the rename is durable too. The
    temporary file is created afresh (a leftover at that name is removed first) with ``mode`` less the umask,
    or exactly ``mode`` with ``ignore_umask`` (a file holding a secret). An OSError propagates, the temporary
    file removed first unless the rename was done; one a crash leaves behind is its caller's to remove
    (``recover`` at open, ``MasterInfoFile`` at its next save).
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp") if tmp is None else Path(tmp)
    try:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            if ignore_umask:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def write_index(relay_dir: Path, names: list[str]) -> None:
    """Replace the index atomically (its temporary file is ``INDEX_TMP_NAME``)."""
    data = "".join(f"{name}\n" for name in names).encode("utf-8")
    write_file_atomically(relay_dir / INDEX_NAME, data, tmp=relay_dir / INDEX_TMP_NAME)


def write_epochs(relay_dir: Path, epochs: Epochs) -> None:
    """Replace ``relayproxy.epochs`` atomically (its temporary file is ``EPOCHS_TMP_NAME``; the format is
    ``relay/epochs.py``'s, which stays below this module: it imports nothing of the relay)."""
    relay_dir = Path(relay_dir)
    data = epochs.to_json().encode("utf-8")
    write_file_atomically(relay_dir / EPOCHS_NAME, data, tmp=relay_dir / EPOCHS_TMP_NAME)



# ---------------------------------------------------------------------------------------------
# Durable mark: a cache of the last durable horizon position


@dataclass(frozen=True)
class DurableMark:
    """``(file, position)`` of the horizon as last published before the process stopped.

    Written after the fsync that made it durable (never before), so it can lag the files but never
    lead them. Recovery only uses it to classify damage; the files decide everything else.
    """

    file: str
    position: int


def encode_durable_mark(file: str, position: int) -> bytes:
    payload = f"{position} {file}"
    crc = _crc32(payload.encode("utf-8", "surrogateescape"))
    record = f"{_MARK_PREFIX} {crc:08x} {payload}\n".encode("utf-8", "surrogateescape")
    if len(record) > _MARK_RECORD_LEN:
        raise ValueError(f"durable mark for {file!r} does not fit {_MARK_RECORD_LEN} bytes")
    return record.ljust(_MARK_RECORD_LEN, b" ")


def read_durable_mark(relay_dir: Path) -> tuple[DurableMark | None, str | None]:
    """The mark and None, or None and why it cannot be used (missing is not a problem: no reason)."""
    try:
        raw = (relay_dir / DURABLE_MARK_NAME).read_bytes()
    except FileNotFoundError:
        return None, None
    line = raw.split(b"\n", 1)[0]
    if not line.strip():
        return None, None  # created by a store that never had a file
    try:
        prefix_a, prefix_b, crc_text, position_text, name = line.decode("utf-8", "surrogateescape").split(" ", 4)
        if f"{prefix_a} {prefix_b}" != _MARK_PREFIX:
            raise ValueError("unknown format")
        payload = f"{position_text} {name}"
        if int(crc_text, 16) != _crc32(payload.encode("utf-8", "surrogateescape")):
            raise ValueError("checksum mismatch (torn write?)")
        position = int(position_text)
        check_file_name(name)
    except ValueError as exc:
        return None, f"{relay_dir / DURABLE_MARK_NAME} ignored: {exc}"
    return DurableMark(name, position), None


class DurableMarkWriter:
    """Overwrites the fixed-size mark record in place: one pwrite per sync, no fsync of its own
    (a lost update only makes the mark older, which recovery tolerates)."""

    def __init__(self, relay_dir: Path):
        path = relay_dir / DURABLE_MARK_NAME
        existed = path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if not existed:
            fsync_dir(relay_dir)

    def write(self, file: str, position: int) -> None:
        os.pwrite(self._fd, encode_durable_mark(file, position), 0)

    def fileno(self) -> int:
        return self._fd

    def fsync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


