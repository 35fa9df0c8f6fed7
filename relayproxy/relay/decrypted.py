"""A MariaDB binlog directory written with ``encrypt_binlog=ON``, read through the server's key file: the key file
itself, and plain copies of the files for ``relayproxy serve``.

``read_key_file`` loads a file_key_management key file (``file_key_management_filename``), decrypting it with the
file key (``file_key_management_filekey``: the secret, or ``FILE:<path>`` of a file holding it) when it is
encrypted. The key bytes are never logged.

``DecryptedMirror`` keeps, in a private directory of its own (mode 0700, never inside the served one), a plain
copy of every binlog file of the encrypted directory, at the same names and byte positions: exactly the bytes a
MariaDB master sends its replicas (each event decrypted, the START_ENCRYPTION_EVENT flagged ignorable, see
``binlog/encryption.py``), so the read-only directory, the dump sender, the catalog and the scanner serve them as
any other files. Other files (index files, a relay's JSON records) are copied as they are. ``sync()`` brings the
copies up to date: only the complete events appended since the last call are decrypted (``--follow``); a file
that shrank or was replaced is copied again from its start. The source directory is only read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..binlog import constants as C
from ..binlog.encryption import BinlogKeyError, DecryptingStream, parse_key_file
from ..log import get_logger

log = get_logger("relayproxy.decrypted")

_CHUNK = 1 << 20


def read_key_file(path: str | os.PathLike, filekey: str | None = None) -> dict[int, bytes]:
    """Key id -> key from a file_key_management key file; ``filekey`` is the secret it is encrypted with, or
    ``FILE:<path>`` naming a file that holds it (its trailing newline ignored)."""
    source = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BinlogKeyError(f"cannot read the binlog key file {source}: {exc.strerror or exc}") from None
    secret = None
    if filekey is not None:
        if filekey.startswith("FILE:"):
            try:
                secret = Path(filekey[5:]).read_bytes().rstrip(b"\r\n")
            except OSError as exc:
                raise BinlogKeyError(f"cannot read the key file's file key {filekey[5:]}: {exc.strerror or exc}") from None
        else:
            secret = filekey.encode("utf-8")
    return parse_key_file(data, source=source, filekey=secret)


class _MirroredFile:
    __slots__ = ("stream", "read", "identity", "fd")

    def __init__(self, stream: DecryptingStream, identity: tuple, fd: int):
        self.stream = stream
        self.read = 0  # source bytes consumed
        self.identity = identity
        self.fd = fd


class DecryptedMirror:
    """Plain copies of an encrypted binlog directory's files, kept in ``target`` (see the module's text)."""

    def __init__(self, source: Path, keys: dict[int, bytes], *, key_source: str, algorithm: str = "aes_cbc",
                 target: Path | None = None):
        self.source = Path(source)
        self.keys = keys
        self.key_source = key_source
        self.algorithm = algorithm
        self._owned = target is None
        if target is None:
            target = Path(tempfile.mkdtemp(prefix="relayproxy-decrypted-"))
        else:
            target = Path(target)
            target.mkdir(mode=0o700, parents=True, exist_ok=True)
            if os.path.realpath(target) == os.path.realpath(self.source):
                raise BinlogKeyError(f"the decrypted copies cannot go into the served directory {self.source}")
        os.chmod(target, 0o700)
        self.target = target
        self.encrypted_files: list[str] = []
        self._files: dict[str, _MirroredFile] = {}

    def sync(self) -> None:
        """Bring every copy up to date with the source directory (new files, appended events, removed files)."""
        seen = set()
        for entry in sorted(os.scandir(self.source), key=lambda e: e.name):
            if not entry.is_file() or entry.name.startswith("."):
                continue
            seen.add(entry.name)
            self._sync_file(entry.name, entry.stat())
        for name in set(self._files) - seen:
            self._forget(name)
        for entry in os.scandir(self.target):
            if entry.name not in seen and entry.is_file():
                os.unlink(entry.path)  # purged from the source

    def _sync_file(self, name: str, st: os.stat_result) -> None:
        src = self.source / name
        identity = (st.st_dev, st.st_ino)
        mirrored = self._files.get(name)
        if mirrored is not None and (mirrored.identity != identity or st.st_size < mirrored.read):
            self._forget(name)  # replaced or cut: start over
            mirrored = None
        if mirrored is None:
            with open(src, "rb") as f:
                head = f.read(4)
            if head != C.BINLOG_MAGIC[: len(head)] or len(head) < 4:
                self._copy_plain(name)  # an index, a JSON record: as it is
                return
            fd = os.open(self.target / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            stream = DecryptingStream(self.keys, algorithm=self.algorithm, key_source=self.key_source, file=str(src))
            mirrored = self._files[name] = _MirroredFile(stream, identity, fd)
        if st.st_size == mirrored.read:
            return
        stream = mirrored.stream
        with open(src, "rb") as f:
            f.seek(mirrored.read)
            while True:
                chunk = f.read(_CHUNK)
                if not chunk:
                    break
                plain = stream.feed(chunk)
                mirrored.read += len(chunk)
                if plain:
                    os.pwrite(mirrored.fd, plain, stream.offset - len(plain))
        if stream.encrypted and name not in self.encrypted_files:
            self.encrypted_files.append(name)

    def _copy_plain(self, name: str) -> None:
        tmp = self.target / f".{name}.tmp"
        shutil.copyfile(self.source / name, tmp)
        os.replace(tmp, self.target / name)

    def _forget(self, name: str) -> None:
        mirrored = self._files.pop(name, None)
        if mirrored is not None:
            os.close(mirrored.fd)

    def close(self) -> None:
        for name in list(self._files):
            self._forget(name)
        if self._owned:
            shutil.rmtree(self.target, ignore_errors=True)

    def __repr__(self) -> str:
        return f"DecryptedMirror({self.source} -> {self.target}, {len(self.encrypted_files)} encrypted files)"
