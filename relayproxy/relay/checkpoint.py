"""The recovery checkpoint: where a restart may resume scanning the newest relay file (``relayproxy.checkpoint``).

Recovery (``relay/recovery.py``) must know, for the newest file, where its last complete group ends and the GTID
set there; without help it scans the whole file (about 55 MB/s). The store writes a checkpoint, now and then,
at a durable boundary of the newest file: recovery verifies it against the file and scans only the bytes after
it, so a restart costs O(bytes since the checkpoint), not O(file).

A checkpoint records, at a boundary ``offset`` of ``file`` that an fdatasync had made durable before it was
written:

- the boundary parser's state there. At a boundary the parser is outside any group, so it needs only the file's
  FORMAT_DESCRIPTION (checksum algorithm, post-header sizes, flavour): recorded as the FDE's length and CRC32
  (the FDE itself is read back from the file, offset 4) plus its checksum algorithm and server version;
- the scan's state there: the file's PREVIOUS_GTIDS / GTID_LIST set (``start_gtids``), the file's own GTID set
  at ``offset`` (``gtids``: that set plus every complete group before ``offset``, as ``reader.scan_file`` counts
  it), the type of the event ending at ``offset`` and the ROTATE seen, if any;
- the identity of the bytes before ``offset``: the CRC32 of the last ``tail_len`` bytes (up to 64 KiB) before
  it, and the file's FDE CRC; the file must be at least ``offset`` long;
- the upstream epoch of the file and its master (``relay/epochs.py``).

Written atomically (temporary file, fsync, rename, directory fsync: ``durable.write_file_atomically``), so a
crash leaves the previous checkpoint or the new one. The record carries a CRC32 of its own body. Anything that
does not verify (unreadable, damaged, another file, a file shorter than ``offset``, different bytes before
``offset``, another FDE, another epoch or master) is not used: recovery falls back to the full scan and says why
(``RecoveryReport.checkpoint``). A checkpoint never makes recovery trust what a full scan would refuse after the
checkpoint; what it skips is re-checking the CRCs of the bytes before it, which the full scan did at every start.

This module is pure: encoding, decoding, verification and the resumed scanner. The store writes the file
(``relay/sync.py``, on a sync), recovery reads it; ``relayproxy serve`` never writes it.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from ..binlog import constants as C
from ..binlog.events import HEADER, BinlogFormatError, FormatDescription
from ..binlog.gtid import GtidSet, MariaBinlogState
from ..binlog.reader import BinlogScanner

CHECKPOINT_NAME = "relayproxy.checkpoint"
CHECKPOINT_TMP_NAME = CHECKPOINT_NAME + ".tmp"
TAIL_BYTES = 64 << 10  # the bytes before the offset whose CRC32 the checkpoint keeps
_FORMAT = "relayproxy-checkpoint"
_VERSION = 1
_MAX_RECORD = 16 << 20  # a GTID set of many UUIDs is still far smaller


class CheckpointError(ValueError):
    """A checkpoint record cannot be read (the message says what is wrong)."""


# ---------------------------------------------------------------------------------------------
# GTID sets in a record: exact (the binary encodings round-trip, MariaDB's order of entries included)


def encode_gtids(gtids) -> dict | None:
    if gtids is None:
        return None
    if isinstance(gtids, GtidSet):
        return {"mysql": gtids.encode().hex()}
    if isinstance(gtids, MariaBinlogState):
        return {"mariadb": gtids.encode_gtid_list_body().hex()}
    raise TypeError(f"not a GTID set: {type(gtids).__name__}")


def decode_gtids(value):
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) != 1:
        raise CheckpointError(f"GTID set {value!r} is not {{'mysql' | 'mariadb': hex}}")
    (kind, text), = value.items()
    try:
        raw = bytes.fromhex(text)
        if kind == "mysql":
            return GtidSet.decode(raw, 0, len(raw))
        if kind == "mariadb":
            return MariaBinlogState.decode_gtid_list_body(raw, 0, len(raw))[0]
    except (TypeError, ValueError, BinlogFormatError) as exc:
        raise CheckpointError(f"GTID set {kind}: {exc}") from None
    raise CheckpointError(f"GTID set of unknown kind {kind!r}")


# ---------------------------------------------------------------------------------------------
# The record


def encode_record(fmt: str, version: int, body: dict, *, indent: int | None = None) -> bytes:
    """A small JSON record of the relay (checkpoint, file index): format, version, the body and a CRC32 of the
    body's canonical text, so a torn or damaged record is recognised."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    record = {"format": fmt, "version": version, "crc32": zlib.crc32(text.encode("utf-8")), "body": body}
    if indent is None:
        return (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
    return (json.dumps(record, sort_keys=True, indent=indent) + "\n").encode("utf-8")


def decode_record(raw: bytes, fmt: str, version: int, max_bytes: int, error: type[Exception], what: str) -> dict:
    """The body of an ``encode_record`` record; ``error`` saying why when it is not one (size, JSON, format,
    version, CRC)."""
    if len(raw) > max_bytes:
        raise error(f"{len(raw)} bytes: larger than any {what}")
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise error(f"not a JSON record ({exc}): torn or damaged") from None
    if not isinstance(record, dict) or record.get("format") != fmt:
        raise error(f"not a relayproxy {what} record")
    if record.get("version") != version:
        raise error(f"version {record.get('version')!r}, this relay reads version {version}")
    body = record.get("body")
    if not isinstance(body, dict):
        raise error("no body")
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if zlib.crc32(text.encode("utf-8")) != record.get("crc32"):
        raise error("its CRC32 does not match its body: damaged")
    return body


@dataclass(frozen=True)
class Checkpoint:
    file: str
    offset: int
    fde_len: int
    fde_crc: int
    tail_len: int
    tail_crc: int
    checksum_alg: int
    server_version: str
    start_gtids: dict | None  # encode_gtids form
    gtids: dict | None
    last_type: int | None
    rotate_to: list | None  # [name, position]
    epoch: int | None
    master: list | None  # the epoch's master as recorded in relayproxy.epochs (None for an implicit epoch)

    def encode(self) -> bytes:
        return encode_record(_FORMAT, _VERSION, asdict(self), indent=1)

    @classmethod
    def decode(cls, raw: bytes) -> "Checkpoint":
        body = decode_record(raw, _FORMAT, _VERSION, _MAX_RECORD, CheckpointError, "checkpoint")
        try:
            cp = cls(**body)
        except TypeError as exc:
            raise CheckpointError(f"fields do not match: {exc}") from None
        ints = (cp.offset, cp.fde_len, cp.fde_crc, cp.tail_len, cp.tail_crc, cp.checksum_alg)
        if not isinstance(cp.file, str) or not all(type(v) is int for v in ints):
            raise CheckpointError("fields of the wrong type")
        if cp.offset < 4 + cp.fde_len or cp.fde_len < C.HEADER_LEN or not 0 <= cp.tail_len <= cp.offset - 4:
            raise CheckpointError(f"offset {cp.offset}, FDE of {cp.fde_len} bytes, tail {cp.tail_len}: impossible")
        return cp


def read_checkpoint(relay_dir: Path) -> tuple[Checkpoint | None, str | None]:
    """The checkpoint and None, or None and why there is none usable."""
    path = Path(relay_dir) / CHECKPOINT_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, f"no {CHECKPOINT_NAME}"
    except OSError as exc:
        return None, f"{CHECKPOINT_NAME} unreadable: {exc}"
    try:
        return Checkpoint.decode(raw), None
    except CheckpointError as exc:
        return None, f"{CHECKPOINT_NAME} damaged: {exc}"


def _epoch_identity(epochs, file: str) -> tuple[int | None, list | None]:
    if epochs is None:
        return None, None
    try:
        epoch = epochs.epoch_of(file)
    except ValueError:
        return None, None
    master = None if epoch.master is None else [list(item) for item in epoch.master]
    return epoch.epoch, master


def read_fde_bytes(fd: int) -> bytes | None:
    """The FORMAT_DESCRIPTION event at offset 4 of an open relay file (its header says its size)."""
    head = os.pread(fd, C.HEADER_LEN, 4)
    if len(head) < C.HEADER_LEN or head[4] != C.FORMAT_DESCRIPTION_EVENT:
        return None
    size = HEADER.unpack_from(head, 0)[3]
    if not C.HEADER_LEN < size <= 64 << 10:
        return None
    raw = os.pread(fd, size, 4)
    return raw if len(raw) == size else None


def capture(fd: int, *, file: str, offset: int, fde: FormatDescription, start_gtids, gtids, last_type,
            rotate_to, epochs) -> Checkpoint:
    """A checkpoint at ``offset`` of the file open as ``fd`` (its bytes up to ``offset`` durable)."""
    fde_raw = read_fde_bytes(fd)
    if fde_raw is None:
        raise CheckpointError(f"{file} has no FORMAT_DESCRIPTION_EVENT at offset 4")
    tail_len = min(TAIL_BYTES, offset - 4)
    tail = os.pread(fd, tail_len, offset - tail_len)
    if len(tail) != tail_len:
        raise CheckpointError(f"{file} is shorter than {offset} bytes")
    epoch, master = _epoch_identity(epochs, file)
    return Checkpoint(
        file=file, offset=offset, fde_len=len(fde_raw), fde_crc=zlib.crc32(fde_raw), tail_len=tail_len,
        tail_crc=zlib.crc32(tail), checksum_alg=fde.checksum_alg, server_version=fde.server_version,
        start_gtids=encode_gtids(start_gtids), gtids=encode_gtids(gtids), last_type=last_type,
        rotate_to=None if rotate_to is None else [rotate_to[0], rotate_to[1]], epoch=epoch, master=master,
    )


@dataclass
class ResumePoint:
    """A verified checkpoint, ready to resume the newest file's scan (``scanner()``)."""

    checkpoint: Checkpoint
    fde: FormatDescription
    start_gtids: object
    gtids: object

    @property
    def offset(self) -> int:
        return self.checkpoint.offset

    def scanner(self, **kwargs) -> BinlogScanner:
        cp = self.checkpoint
        return BinlogScanner.resume(
            cp.offset, self.fde, start_gtids=self.start_gtids, gtids_after=self.gtids, last_type=cp.last_type,
            rotate_to=None if cp.rotate_to is None else (cp.rotate_to[0], cp.rotate_to[1]), **kwargs,
        )


def verify(cp: Checkpoint, path: Path, name: str, *, epochs=None) -> tuple[ResumePoint | None, str | None]:
    """The resume point of ``cp`` for the newest file ``name`` at ``path``, or None and why it does not verify."""
    if cp.file != name:
        return None, f"{CHECKPOINT_NAME} is for {cp.file}, the newest file is {name}"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return None, f"{name}: cannot open it to verify {CHECKPOINT_NAME}: {exc.strerror}"
    try:
        size = os.fstat(fd).st_size
        if size < cp.offset:
            return None, f"{name} holds {size} bytes, fewer than the checkpoint's offset {cp.offset}"
        fde_raw = read_fde_bytes(fd)
        if fde_raw is None or len(fde_raw) != cp.fde_len or zlib.crc32(fde_raw) != cp.fde_crc:
            return None, f"{name}: its FORMAT_DESCRIPTION_EVENT is not the one {CHECKPOINT_NAME} recorded"
        tail = os.pread(fd, cp.tail_len, cp.offset - cp.tail_len)
        if len(tail) != cp.tail_len or zlib.crc32(tail) != cp.tail_crc:
            return None, (f"{name}: the {cp.tail_len} bytes before offset {cp.offset} are not the ones "
                          f"{CHECKPOINT_NAME} recorded (CRC32 differs)")
    except OSError as exc:
        return None, f"{name}: cannot read it to verify {CHECKPOINT_NAME}: {exc.strerror}"
    finally:
        os.close(fd)
    try:
        fde = FormatDescription.parse(fde_raw, 0, len(fde_raw))
    except (BinlogFormatError, ValueError) as exc:
        return None, f"{name}: its FORMAT_DESCRIPTION_EVENT does not parse: {exc}"
    if fde.checksum_alg != cp.checksum_alg or fde.server_version != cp.server_version:
        return None, f"{name}: its FORMAT_DESCRIPTION_EVENT does not say what {CHECKPOINT_NAME} recorded"
    epoch, master = _epoch_identity(epochs, name)
    if (epoch, master) != (cp.epoch, cp.master):
        return None, (f"{name} belongs to upstream epoch {epoch} (master {master}), {CHECKPOINT_NAME} says "
                      f"epoch {cp.epoch} (master {cp.master})")
    try:
        start_gtids, gtids = decode_gtids(cp.start_gtids), decode_gtids(cp.gtids)
    except CheckpointError as exc:
        return None, f"{CHECKPOINT_NAME} damaged: {exc}"
    return ResumePoint(cp, fde, start_gtids, gtids), None

