"""A relay directory's recovery at open: ``plan_recovery`` decides (reads only), ``recover`` applies the plan.

The files are the state (design invariant 3). A relay directory (``relay/layout.py``) holds the relay
files under the master's names, ``relayproxy.index`` listing them oldest first, and ``relayproxy.durable``
(``relay/durable.py``): a one-line cache of the last durable horizon position, used only to tell damage
inside once-durable data (refuse to start) from the debris of a crash after the last fsync (cut it off).

Recovery at open:

1. Read the index. Files listed but missing at the tail (created, never written) or at the head
   (an interrupted purge) are dropped from it with a warning; a file missing in the middle refuses.
   A file present but unlisted is adopted when it is the next file (the target of the last file's
   ROTATE, else the next number) and holds only the magic (or part of it) and complete events: the
   crash came between creating it and rewriting the index. Any other unlisted file is reported and
   left alone.
2. Scan the newest file with the same scanner and boundary parser as everything else
   (``reader.scan_file``). A cut event or unfinished group at the end is cut off: the file is
   truncated to ``good_end``. A CRC error or impossible structure is only cut off when it lies
   after the durable mark (or, with no mark for this file, when no intact event follows it);
   inside once-durable data it refuses to start, naming file and offset.
3. fsync the newest file and the directory, then rebuild the horizon from the files:
   ``(newest file, good_end, PREVIOUS_GTIDS / GTID_LIST + every complete group's GTID)``.
4. Older files are closed: each should end with a ROTATE to the next file (a warning otherwise).

Upstream epochs (``relay/epochs.py``): ``relayproxy.epochs`` is read (a directory without it is one
implicit epoch); a damaged one refuses to start, its leftover temp file is removed. The
first file of an epoch >= 2 (a *join file*) starts with the new master's GTID set, which may lack part
of the relay's: the set at its start is ``join_gtids ∪ its own set``, so the horizon's set is rebuilt as
``join_gtids ∪ PREVIOUS_GTIDS / GTID_LIST ∪ every complete group`` there (``join_gtids`` alone when the
file was cut before its set event), and a newest file cut before its set event continues the previous
file's set, join included. A switch cut by a crash (the epoch recorded, the ROTATE to its first file not
yet appended or torn) is left for ``begin_epoch`` / ``start_file`` to complete; an unlisted first file
of the epoch is adopted like any next file (it is the target of the ROTATE, or the next number).
Fillers (IGNORABLE events of the relay's own over a stretch a GTID dump skipped) are events outside any
group, scanned and CRC-checked like the rest.

Nothing complete and intact is ever discarded.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from ..binlog import constants as C
from ..binlog.checksum import crc32 as _crc32
from ..binlog.events import HEADER, BinlogFormatError, FormatDescription, split_version
from ..binlog.gtid import GtidSet, MariaBinlogState
from ..binlog.reader import BinlogScanner, ScanResult, scan_file
from .closed_files import (
    TMP_SUFFIX,
    StoredFileError,
    clean_leftovers,
    open_stream,
    present_names,
)
from .closed_files import scan as scan_stored
from .checkpoint import CHECKPOINT_TMP_NAME, ResumePoint, read_checkpoint, verify
from .epochs import (
    EPOCHS_TMP_NAME,
    Epochs,
    EpochsError,
    gtid_missing,
    gtid_text,
    gtid_union,
    read_epochs,
)
from .durable import DurableMark, fsync_dir, fsync_path, read_durable_mark, read_index, write_index
from .errors import RelayRecoveryError
from .horizon import HorizonSnapshot
from .write_state import Gtids
from .layout import (
    DURABLE_MARK_NAME,
    INDEX_NAME,
    INDEX_TMP_NAME,
    MAX_NAME_BYTES,
    RESERVED_PREFIX,
    UNADOPTED_DIR,
    check_file_name,
    next_file_name,
)

_ERROR_OFFSET = re.compile(r"^at offset (\d+):")


# ---------------------------------------------------------------------------------------------
# Small readers of closed files


def read_first_fde(path: Path) -> FormatDescription | None:
    """The FORMAT_DESCRIPTION at offset 4 of a file, or None when it is absent or damaged."""
    try:
        with open_stream(path) as f:  # any storage form (closed_files.py)
            head = f.read(4 + C.HEADER_LEN)
            if len(head) < 4 + C.HEADER_LEN or head[:4] != C.BINLOG_MAGIC:
                return None
            size = HEADER.unpack_from(head, 4)[3]
            if not C.HEADER_LEN < size <= 64 << 10:
                return None
            event = head[4:] + f.read(size - C.HEADER_LEN)
        return FormatDescription.parse(event, 0, size)
    except (OSError, BinlogFormatError, ValueError):  # StoredFileError is a ValueError
        return None


def read_final_rotate(path: Path) -> tuple[str, int] | None:
    """``(next file, position)`` of the real ROTATE that ends a closed file, or None.

    Found from the end without scanning the file: the ROTATE's log_pos is the file size and its
    size covers the last bytes; when it carries a CRC, the CRC must match.
    """
    try:
        with open_stream(path) as f:  # any storage form (closed_files.py)
            size = f.seek(0, os.SEEK_END)
            take = min(size - 4, C.HEADER_LEN + 8 + MAX_NAME_BYTES + C.CHECKSUM_LEN)
            if take < C.HEADER_LEN + 8:
                return None
            f.seek(size - take)
            tail = f.read(take)
    except OSError:
        return None
    except StoredFileError as exc:
        raise RelayRecoveryError(f"cannot read the end of closed relay file {Path(path).name}: {exc}",
                                 file=Path(path).name) from None
    for event_size in range(C.HEADER_LEN + 8 + 1, take + 1):
        start = take - event_size
        _ts, type_code, _sid, declared, log_pos, flags = HEADER.unpack_from(tail, start)
        if type_code != C.ROTATE_EVENT or declared != event_size or log_pos != size & 0xFFFFFFFF:
            continue
        if flags & C.LOG_EVENT_ARTIFICIAL_F:
            continue
        for crc_len in (C.CHECKSUM_LEN, 0):
            body_end = take - crc_len
            if body_end - start < C.HEADER_LEN + 8 + 1:
                continue
            if crc_len and _crc32(tail[start:body_end]) != int.from_bytes(tail[body_end:], "little"):
                continue
            name_raw = tail[start + C.HEADER_LEN + 8 : body_end]
            try:
                name = name_raw.decode("utf-8")
                check_file_name(name)
            except (UnicodeDecodeError, ValueError):
                continue
            position = struct.unpack_from("<Q", tail, start + C.HEADER_LEN)[0]
            return name, position
    return None


# ---------------------------------------------------------------------------------------------
# Recovery


@dataclass
class RecoveryReport:
    """What recovery found and did (for logs, status and tests)."""

    relay_dir: str
    files: list[str] = field(default_factory=list)
    truncated_bytes: int = 0
    truncated_file: str | None = None
    horizon: HorizonSnapshot | None = None
    warnings: list[str] = field(default_factory=list)
    started_empty: bool = False
    adopted: list[str] = field(default_factory=list)
    durable_mark: DurableMark | None = None
    scan: ScanResult | None = field(default=None, repr=False)  # the newest file's scan (before truncation)
    checkpoint: str | None = None  # where the newest file's scan began and why (relay/checkpoint.py)
    checkpoint_offset: int | None = None  # the verified checkpoint's offset the scan resumed from

    def __str__(self) -> str:
        h = self.horizon
        parts = [f"{len(self.files)} files"]
        if h is not None and h.file is not None:
            parts.append(f"horizon {h.file}:{h.position}" + (f" gtids {h.text}" if h.text is not None else ""))
        if self.started_empty:
            parts.append("started empty")
        if self.truncated_bytes:
            parts.append(f"cut {self.truncated_bytes} bytes off {self.truncated_file}")
        if self.adopted:
            parts.append(f"adopted {', '.join(self.adopted)}")
        if self.checkpoint:
            parts.append(self.checkpoint)
        parts.extend(self.warnings)
        return "; ".join(parts)


@dataclass
class RecoveredState:
    """Everything the store needs to resume writing the newest file."""

    report: RecoveryReport
    files: list[str]
    current_file: str | None
    end: int  # == the newest file's size after recovery
    gtids: Gtids | None
    fde: FormatDescription | None  # the newest file's FORMAT_DESCRIPTION
    start_set_seen: bool  # the newest file's PREVIOUS_GTIDS / GTID_LIST has been written
    file_start_gtids: Gtids | None  # the set that event carries (None before it)
    flavour: str | None
    epochs: Epochs = field(default_factory=Epochs)
    join_extra_gtids: Gtids | None = None  # GTIDs the newest (join) file's start set names beyond the join set
    join_warnings: list[str] = field(default_factory=list)


def _writes_gtid_set_event(fde: FormatDescription | None) -> bool:
    """Whether that server starts every file with PREVIOUS_GTIDS (MySQL 5.6+) or GTID_LIST (MariaDB 10+)."""
    if fde is None:
        return True  # unknown yet: the file holds no FDE
    version = split_version(fde.server_version)
    return version >= ((10, 0, 0) if fde.is_mariadb else (5, 6, 0))


def _merge_gtids(base, later):
    """``base`` followed by the GTIDs of a later stretch (MariaDB: the later entries win)."""
    if later is None:
        return base
    if base is None:
        return later.copy()
    merged = base.copy()
    if isinstance(merged, GtidSet) and isinstance(later, GtidSet):
        merged.update(later)
    elif isinstance(merged, MariaBinlogState) and isinstance(later, MariaBinlogState):
        for gtid in later.gtids():
            merged.update(gtid)
    else:
        raise RelayRecoveryError(
            f"GTID sets of different flavours in consecutive relay files: {type(base).__name__} then "
            f"{type(later).__name__}"
        )
    return merged


def _error_offset(scan: ScanResult) -> int | None:
    m = _ERROR_OFFSET.match(scan.error or "")
    return int(m.group(1)) if m else None


def _damage_followed_by_data(path: Path, bad: int, resume: ResumePoint | None = None) -> str | None:
    """Why the damage at ``bad`` is not crash debris, or None when nothing intact follows it.

    Debris of a crash is what was written after the last fsync: a cut event, a torn write, zeros
    where the filesystem extended the file before the data landed, stale blocks. None of that is
    followed by an intact event at its master offset. Damage in the middle of a file is: the scan
    continues past a CRC mismatch, and where the parse stops at an impossible header, the header's
    size or log_pos field says where the next event should start, which is checked too.
    """
    found: list[int] = []
    last_end = [bad]

    def on_event(event) -> None:
        last_end[0] = max(last_end[0], event.offset + event.size)
        if not found and event.offset > bad and event.crc_ok is not False and event.log_pos == event.end & 0xFFFFFFFF:
            found.append(event.offset)

    scanner = _scanner(path, resume, on_event=on_event)
    with open(path, "rb") as f:
        if resume is not None:
            f.seek(resume.offset)  # events before the checkpoint all end before ``bad``
        while not found and not scanner._stopped:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            scanner.feed(chunk)
        if found:
            return f"an intact event follows at offset {found[0]}"
        if not scanner._stopped:
            return None
        # The parse stopped at the event right after the last one parsed.
        stop = last_end[0]
        size = os.fstat(f.fileno()).st_size
        f.seek(stop)
        header = f.read(C.HEADER_LEN)
        if len(header) < C.HEADER_LEN:
            return None
        claimed, log_pos = HEADER.unpack_from(header)[3:5]
        for extent in {claimed, (log_pos - stop) & 0xFFFFFFFF}:
            nxt = stop + extent
            if extent < C.HEADER_LEN or nxt + C.HEADER_LEN > size:
                continue
            f.seek(nxt)
            following = f.read(C.HEADER_LEN)
            next_size, next_log_pos = HEADER.unpack_from(following)[3:5]
            if next_size >= C.HEADER_LEN and nxt + next_size <= size and next_log_pos == (nxt + next_size) & 0xFFFFFFFF:
                f.seek(nxt)
                event = f.read(next_size)
                crc_ok = _crc32(event[:-4]) == int.from_bytes(event[-4:], "little")
                if crc_ok or scanner.result.checksum != "CRC32":
                    return f"an intact event follows at offset {nxt}"
    return None


# ---------------------------------------------------------------------------------------------
# The plan: what recovery decides about a list of files (reads only, never writes)
#
# ``recover()`` applies it to a relay directory (completes a magic, cuts a partial tail, rewrites the
# index, fsyncs, the durable mark); the read-only directory of ``relayproxy serve`` (``readonly.py``)
# uses it as it is and refuses where the relay would write. One place decides what a file's tail, the
# continuity of two files and the horizon (file, position, GTID set) mean.

WHOLE, PARTIAL, DAMAGED = "whole", "partial", "damaged"


def classify_scan(scan: ScanResult, size: int) -> str:
    """``DAMAGED`` (a CRC mismatch, an impossible structure, no FORMAT_DESCRIPTION), ``PARTIAL`` (complete
    up to ``scan.good_end`` and a cut event or an unfinished group after it) or ``WHOLE``. ``scan`` may be a
    finished scan (``scan_file``) or an incremental one that has read ``size`` bytes (``--follow``)."""
    if scan.crc_errors > 0 or (scan.error is not None and not scan.truncated_event):
        return DAMAGED
    if scan.partial_tail or scan.truncated_event or scan.good_end < size:
        return PARTIAL
    return WHOLE


@dataclass
class TailPlan:
    """What recovery decides about the newest file: where its horizon is and what lies after it."""

    name: str
    path: Path
    size: int
    end: int  # the end of the last complete group (4 for a file of only the magic): the horizon's position
    scan: ScanResult | None = field(default=None, repr=False)  # None for a file of (part of) the magic
    kind: str = WHOLE  # WHOLE, PARTIAL (cut after ``end``) or DAMAGED (crash debris after ``end``)
    complete_magic: bool = False  # listed, but only part of the magic reached the disk: the relay writes it
    damage_offset: int | None = None  # where the damage is (DAMAGED), else where the kept part ends
    detail: str | None = None  # what is wrong after ``end``
    refusal: str | None = None  # why nothing may be cut: the relay refuses to start, serve to serve
    refusal_reason: str | None = None  # the part of ``refusal`` that says why ("an intact event follows ...")
    fde: FormatDescription | None = None
    start_set: Gtids | None = None  # the file's PREVIOUS_GTIDS / GTID_LIST (None before it)
    gtids: Gtids | None = None  # the set at ``end`` from this file alone (``end_gtids`` adds a join or carried set)

    @property
    def cut(self) -> int:
        return self.size - self.end


def plan_tail(path: Path, name: str, *, scan: ScanResult | None = None, size: int | None = None,
              mark: DurableMark | None = None, resume: ResumePoint | None = None) -> TailPlan:
    """Decide what to keep of the newest file ``path`` (reads it, never writes it).

    ``scan`` (with the ``size`` it has read) is taken as is when given, else the file is scanned. A cut event
    or an unfinished group after the last complete group is left out; damage is left out only when nothing
    intact follows it and it lies after the durable ``mark`` (the debris of a crash); else ``refusal``.
    ``resume``: a verified checkpoint (relay/checkpoint.py) of this file; the scan reads only the bytes after it.
    """
    path = Path(path)
    if size is None:
        size = path.stat().st_size
    if size <= 4 and scan is None:
        head = path.read_bytes()[:4]
        if head == C.BINLOG_MAGIC:
            return TailPlan(name, path, size, 4)
        if not C.BINLOG_MAGIC.startswith(head):
            return TailPlan(name, path, size, 4, kind=DAMAGED, damage_offset=0,
                            refusal=f"{path}: not a binlog file (starts with {head.hex() or 'nothing'})")
        return TailPlan(name, path, size, 4, complete_magic=True)  # the magic never reached the disk
    if resume is not None and resume.offset > size:
        resume = None
    if scan is None:
        scan = _scan_prefix(path, None, resume)
    good_end = scan.good_end
    kind = classify_scan(scan, size)
    plan = TailPlan(name, path, size, good_end, scan=scan, kind=kind)
    damaged = kind == DAMAGED
    bad = _error_offset(scan) if damaged else None
    if bad is None:
        bad = good_end
    plan.detail = detail = scan.error or ("CRC error" if scan.crc_errors else "an unfinished group")
    plan.damage_offset = bad
    if damaged and bad < 4:
        plan.refusal = f"{path}: {detail}"
        return plan
    mark_position = mark.position if mark is not None and mark.file == name else None
    if mark_position is not None and good_end < mark_position <= size:
        # What the relay had made durable and published does not read back whole: never cut it.
        plan.refusal = (
            f"relay file damaged inside durable data: {path} at offset {bad} ({detail}); the relay had "
            f"published up to offset {mark_position} of this file. Refusing to start: restore the file "
            f"from the master (it is byte-identical to the master's binlog)"
        )
        plan.refusal_reason = f"the relay had published up to offset {mark_position} of this file"
        return plan
    if damaged and mark_position is None:
        reason = _damage_followed_by_data(path, bad, resume)
        if reason is not None:
            plan.refusal_reason = reason
            plan.refusal = (
                f"relay file damaged before its end: {path} at offset {bad} ({detail}), and {reason}. "
                f"This is not the debris of a crash; refusing to start rather than throw data away: "
                f"restore the file from the master (it is byte-identical to the master's binlog)"
            )
            return plan
    # The damaged scan may have counted groups past the damage: take the GTIDs of the part kept.
    kept = _scan_prefix(path, good_end, resume) if damaged else scan
    plan.fde = kept.fde
    plan.start_set = cast("Gtids | None", kept.start_gtids)  # the scanner's sets are untyped (binlog/reader.py)
    plan.gtids = cast("Gtids | None", kept.gtids_after)
    return plan


def _scanner(path: Path, resume: ResumePoint | None, **kwargs) -> BinlogScanner:
    if resume is None:
        return BinlogScanner(path=os.fspath(path), **kwargs)
    return resume.scanner(path=os.fspath(path), **kwargs)


def _scan_prefix(path: Path, end: int | None, resume: ResumePoint | None = None) -> ScanResult:
    """The scan of the first ``end`` bytes of a file (all of it: None), as ``scan_file`` reads it once cut
    there; from ``resume``'s offset on when a verified checkpoint is given (it must lie at or before ``end``)."""
    if resume is not None and end is not None and resume.offset > end:
        resume = None
    scanner = _scanner(path, resume)
    with open(path, "rb") as f:
        if resume is not None:
            f.seek(resume.offset)
        left = float("inf") if end is None else end - (resume.offset if resume is not None else 0)
        while left > 0 and not scanner._stopped:
            chunk = f.read(int(min(1 << 20, left)))
            if not chunk:
                break
            left -= len(chunk)
            scanner.feed(chunk)
    return scanner.finish()


def file_end_set(name: str, scan: ScanResult, epochs: Epochs):
    """The GTID set after a (closed) file's complete groups: its own, joined with the join set of a join file."""
    after = scan.gtids_after
    join = epochs.join_set(name) if epochs.join_epoch(name) is not None else None
    return after if join is None else gtid_union(join, after)


def end_gtids(name: str, *, start_set, gtids, fde, epochs: Epochs, previous=None):
    """``(the GTID set at the horizon in file name, GTIDs its start set names beyond the join set)``.

    ``start_set`` / ``gtids`` / ``fde``: the file's set event, its set at the end of its complete groups, its
    FORMAT_DESCRIPTION. A join file starts at ``join_gtids ∪ its own set``; a file cut before its set event
    continues the previous file's set (``previous()``: that set, ``file_end_set``; None: no previous file).
    ValueError when a join does not add up.
    """
    if start_set is None and gtids is not None and not gtids:
        gtids = None  # only a cut GTID group was seen: no set yet (as the live store would have it)
    if epochs.join_epoch(name) is not None:
        join = epochs.join_set(name)
        joined = gtid_union(join, gtids)
        extra = gtid_missing(start_set, join) if start_set is not None and join is not None else None
        return joined, extra
    if start_set is None and previous is not None and _writes_gtid_set_event(fde):
        return _merge_gtids(previous(), gtids), None
    return gtids, None


@dataclass(frozen=True)
class Link:
    """How ``newer`` follows ``older`` in a file list: ``rotate`` is the target of ``older``'s final ROTATE."""

    older: str
    newer: str
    rotate: str | None
    follows: bool  # the ROTATE names ``newer`` (through ``older``'s upstream epoch: relay/epochs.py)


def link(epochs: Epochs, older: str, rotate: str | None, newer: str) -> Link:
    return Link(older, newer, rotate, rotate is not None and newer in epochs.rotate_targets(older, rotate))


@dataclass
class RecoveryPlan:
    """What recovery decides for a list of files: the links between them, the newest file's tail, the horizon."""

    files: list[str]
    links: list[Link]
    tail: TailPlan
    horizon_gtids: Gtids | None = None
    join_extra: Gtids | None = None
    join_problem: str | None = None  # a join set that does not add up: refused
    previous_warning: str | None = None  # the previous file could not be read whole for the carried set
    flavour: str | None = None

    @property
    def horizon(self) -> tuple[str, int, Gtids | None]:
        return self.tail.name, self.tail.end, self.horizon_gtids


def plan_recovery(directory: Path, names: list[str], *, epochs: Epochs, mark: DurableMark | None = None,
                  newest_scan: ScanResult | None = None, newest_size: int | None = None,
                  closed_scans: list[ScanResult] | None = None, resume: ResumePoint | None = None) -> RecoveryPlan:
    """The recovery plan of ``names`` (oldest first, at least one) in ``directory``; reads only.

    The relay scans only the newest file (closed files: their final ROTATE, read from the end); a reader
    that scanned the closed files passes ``closed_scans`` (and may pass the newest file's scan so far).
    ``resume``: a verified checkpoint of the newest file (``checkpoint.verify``): its scan begins there.
    """
    directory = Path(directory)
    if closed_scans is not None:
        rotates = [scan.rotate_to for scan in closed_scans[: len(names) - 1]]
    else:
        rotates = [read_final_rotate(directory / older) for older in names[:-1]]
    links = [link(epochs, older, rotate and rotate[0], newer)
             for older, newer, rotate in zip(names, names[1:], rotates)]
    newest = names[-1]
    tail = plan_tail(directory / newest, newest, scan=newest_scan, size=newest_size, mark=mark, resume=resume)
    plan = RecoveryPlan(list(names), links, tail)
    if tail.refusal is not None:
        return plan

    def previous():
        if closed_scans is not None:
            scan = closed_scans[-1]
        else:
            try:
                scan = scan_stored(directory / names[-2])  # may be compressed, encrypted, archived
            except StoredFileError as exc:
                raise RelayRecoveryError(str(exc), file=names[-2]) from None
            if scan.error or scan.crc_errors:
                plan.previous_warning = f"{names[-2]}: {scan.error or 'CRC errors'} (while reading its GTID set)"
        try:
            return file_end_set(names[-2], scan, epochs)
        except ValueError as exc:
            raise RelayRecoveryError(f"{names[-2]}: its GTID set does not join the relay's: {exc}") from None

    try:
        plan.horizon_gtids, plan.join_extra = end_gtids(
            newest, start_set=tail.start_set, gtids=tail.gtids, fde=tail.fde, epochs=epochs,
            previous=previous if len(names) > 1 else None,
        )
    except ValueError as exc:
        plan.join_problem = f"{newest}: its GTID set does not join the relay's: {exc}"
    for candidate in (tail.fde, read_first_fde(directory / names[0])):
        if candidate is not None:
            plan.flavour = candidate.flavour
            break
    return plan


def _write_magic(path: Path) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, C.BINLOG_MAGIC, 0)
        os.fsync(fd)
    except OSError as exc:
        if exc.errno is not None and exc.filename is None:
            exc.filename = os.fspath(path)  # "No space left on device" says where
        raise
    finally:
        os.close(fd)


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def recover(relay_dir: str | os.PathLike, *, create: bool = True, use_checkpoint: bool = True) -> RecoveredState:
    """Bring a relay directory to a consistent state and say where its durable horizon is.

    The newest file is scanned from a verified ``relayproxy.checkpoint`` (relay/checkpoint.py) when there is
    one, else whole; ``use_checkpoint=False`` forces the whole scan (tests, benchmarks). The result is the same.
    Each step decides first (``plan_index``, ``plan_adoption``, ``plan_mark``, ``plan_recovery``: reads only)
    and acts after.
    """
    relay_dir = Path(relay_dir)
    report = RecoveryReport(relay_dir=os.fspath(relay_dir))
    _open_dir(relay_dir, create=create)
    _remove_interrupted_writes(relay_dir, report)
    try:
        epochs = read_epochs(relay_dir)
    except EpochsError as exc:
        raise RelayRecoveryError(f"cannot read the relay's upstream epochs: {exc}") from None
    names = _reconcile_index(relay_dir, epochs, report)
    report.files = list(names)
    report.durable_mark, mark_problem = read_durable_mark(relay_dir)
    marks = plan_mark(report.durable_mark, names)
    report.warnings.extend(w for w in (mark_problem, marks.warning) if w)
    if not names:
        report.started_empty = True
        report.horizon = HorizonSnapshot(None, 0, None, 0)
        return RecoveredState(report, [], None, 0, None, None, False, None, None, epochs)
    resume = _resume_point(relay_dir, names[-1], epochs, report, use_checkpoint=use_checkpoint)
    plan = plan_recovery(relay_dir, names, epochs=epochs, mark=marks.trusted, resume=resume)
    return _apply_plan(relay_dir, plan, epochs, marks.trusted, report)


# -- the steps of ``recover``: pure plans, and the I/O that applies them


@dataclass(frozen=True)
class IndexPlan:
    """What recovery does with ``relayproxy.index`` given the files present (``plan_index``): the files it keeps,
    the listed files it drops (missing at the head or the tail of the list), those missing in the middle (it
    refuses), and the files present but unlisted (adopted or reported: ``plan_adoption``)."""

    names: tuple[str, ...]
    dropped_head: tuple[str, ...] = ()  # an interrupted purge
    dropped_tail: tuple[str, ...] = ()  # created, never written
    missing_middle: tuple[str, ...] = ()  # a hole in the master's binlog: refused
    unlisted: frozenset[str] = frozenset()

    @property
    def refusal(self) -> str | None:
        """Why recovery may not start (files missing between files that exist), or None."""
        if not self.missing_middle:
            return None
        return (f"relay files listed in {INDEX_NAME} are missing between files that exist: "
                f"{', '.join(self.missing_middle)}; the relay would have a hole in the master's binlog")

    @property
    def rewrite(self) -> bool:
        """The index must be rewritten (it lists files that are gone)."""
        return bool(self.dropped_head or self.dropped_tail)

    @property
    def warnings(self) -> list[str]:
        return [
            *(f"{name} is listed in {INDEX_NAME} but missing (an interrupted purge?): dropped from the index"
              for name in self.dropped_head),
            *(f"{name} is listed in {INDEX_NAME} but missing (created, never written): dropped from the index"
              for name in self.dropped_tail),
        ]


def plan_index(listed: Sequence[str], present: AbstractSet[str]) -> IndexPlan:
    """The index plan of the files ``listed`` (oldest first) against the names ``present``: listed files that
    are gone are tolerable only at the ends of the list."""
    exists = [name in present for name in listed]
    if all(exists):
        return IndexPlan(tuple(listed), unlisted=frozenset(present - set(listed)))
    if any(exists):
        first = exists.index(True)
        last = len(exists) - 1 - exists[::-1].index(True)
    else:
        first, last = 0, -1
    kept = tuple(listed[first : last + 1])
    middle = tuple(name for name, ok in zip(kept, exists[first : last + 1]) if not ok)
    return IndexPlan(kept, tuple(listed[:first]), tuple(listed[last + 1 :]), middle, frozenset(present - set(kept)))


@dataclass(frozen=True)
class AdoptionPlan:
    """Which unlisted file recovery tries to adopt (``candidate``, if it holds only whole events) and which it
    leaves alone (reported, never served)."""

    candidate: str | None
    left_alone: tuple[str, ...]


def plan_adoption(names: Sequence[str], unlisted: AbstractSet[str], *, epochs: Epochs,
                  final_rotate: str | None) -> AdoptionPlan:
    """Only the next file may be adopted: the target of the newest listed file's final ROTATE (``final_rotate``,
    through its upstream epoch), else the next number; with no listed file, the one unlisted file if it is alone.
    The crash came between creating it and rewriting the index."""
    if names:
        newest = names[-1]
        candidates = epochs.rotate_targets(newest, final_rotate) if final_rotate is not None \
            else [next_file_name(newest)]
        candidate = next((name for name in candidates if name in unlisted), None)
    else:
        candidate = next(iter(unlisted)) if len(unlisted) == 1 else None
    return AdoptionPlan(candidate, tuple(sorted(unlisted - {candidate} if candidate is not None else unlisted)))


@dataclass(frozen=True)
class MarkPlan:
    """The durable mark recovery trusts (None when it names no relay file here) and what it says about it."""

    trusted: DurableMark | None
    warning: str | None = None


def plan_mark(mark: DurableMark | None, names: Sequence[str]) -> MarkPlan:
    """Trust ``mark`` only when it names one of ``names``."""
    if mark is None or mark.file in names:
        return MarkPlan(mark)
    if not names:
        return MarkPlan(None, f"{DURABLE_MARK_NAME} names {mark.file} but the relay has no files")
    return MarkPlan(None, f"{DURABLE_MARK_NAME} names {mark.file}, which is not a relay file here: ignored")


def scan_note(newest: str, resume: ResumePoint | None, why: str | None) -> str:
    """What the report says of where the newest file's scan began (``why``: why not at a checkpoint)."""
    if resume is not None:
        return f"{newest} scanned from the checkpoint at offset {resume.offset}"
    return f"{newest} scanned whole: {why}"


def link_warnings(links: Sequence[Link]) -> list[str]:
    """The warnings about closed files that do not end with a ROTATE to the next file."""
    out = []
    for step in links:
        if step.rotate is None:
            out.append(f"{step.older} does not end with a ROTATE (the master restarted or the file was cut): "
                       f"next is {step.newer}")
        elif not step.follows:
            out.append(f"{step.older} ends with a ROTATE to {step.rotate}, but the next relay file is {step.newer}")
    return out


def join_warnings(plan: RecoveryPlan, epochs: Epochs) -> list[str]:
    """The warning about a join file whose start set names GTIDs the relay never had (counted as purged)."""
    newest = plan.tail.name
    epoch = epochs.join_epoch(newest)
    if plan.join_extra is None or epoch is None:
        return []
    return [f"{newest} (epoch {epoch.epoch}) starts with the GTID set {gtid_text(plan.tail.start_set)}, "
            f"which names {gtid_text(plan.join_extra)} that the relay never had: counted as purged"]


def _open_dir(relay_dir: Path, *, create: bool) -> None:
    if not relay_dir.exists():
        if not create:
            raise RelayRecoveryError(f"relay directory {relay_dir} does not exist")
        relay_dir.mkdir(parents=True)
        fsync_dir(relay_dir.parent)
    if not relay_dir.is_dir():
        raise RelayRecoveryError(f"{relay_dir} is not a directory")


def _remove_interrupted_writes(relay_dir: Path, report: RecoveryReport) -> None:
    """Remove the temp files of small-file rewrites that never reached their rename: the old file stands."""
    for name, what in ((INDEX_TMP_NAME, "index update"), (EPOCHS_TMP_NAME, "epochs update")):
        if (relay_dir / name).exists():
            (relay_dir / name).unlink()
            report.warnings.append(f"removed {name} left by an interrupted {what}")
    if (relay_dir / CHECKPOINT_TMP_NAME).exists():
        (relay_dir / CHECKPOINT_TMP_NAME).unlink()
        report.checkpoint = f"removed {CHECKPOINT_TMP_NAME} left by an interrupted checkpoint write"


def _present_files(relay_dir: Path, listed: list[str], warn: Callable[[str], None]) -> set[str]:
    """The relay files present (in any storage form), after the leftovers of an interrupted conversion or archive
    step are cleaned (closed_files.py)."""
    present = {
        entry.name
        for entry in os.scandir(relay_dir)
        if entry.is_file(follow_symlinks=False)
        and not entry.name.startswith(RESERVED_PREFIX)
        and not entry.name.startswith(".")
        and not entry.name.endswith(TMP_SUFFIX)
    }
    try:
        clean_leftovers(relay_dir, listed, warn)
    except StoredFileError as exc:
        raise RelayRecoveryError(str(exc)) from None
    return present_names(relay_dir, {n for n in present if (relay_dir / n).exists()}, listed)


def _reconcile_index(relay_dir: Path, epochs: Epochs, report: RecoveryReport) -> list[str]:
    """Apply ``plan_index`` and ``plan_adoption``: warn, adopt, rewrite the index; returns the relay's files."""
    warn = report.warnings.append
    listed = read_index(relay_dir) or []
    index = plan_index(listed, _present_files(relay_dir, listed, warn))
    if index.refusal is not None:
        raise RelayRecoveryError(index.refusal, file=index.missing_middle[0])
    report.warnings.extend(index.warnings)
    names, rewrite = list(index.names), index.rewrite
    if index.unlisted:
        rotate = read_final_rotate(relay_dir / names[-1]) if names else None
        adoption = plan_adoption(names, index.unlisted, epochs=epochs, final_rotate=None if rotate is None else rotate[0])
        if adoption.candidate is not None and _adopt_unlisted(relay_dir / adoption.candidate, warn):
            names.append(adoption.candidate)
            report.adopted.append(adoption.candidate)
            rewrite = True
        for name in adoption.left_alone:
            warn(f"{name} is in the relay directory but not in {INDEX_NAME}: left alone, not served")
    if rewrite:
        write_index(relay_dir, names)
    return names


def _resume_point(relay_dir: Path, newest: str, epochs: Epochs, report: RecoveryReport, *,
                  use_checkpoint: bool) -> ResumePoint | None:
    """The verified checkpoint of the newest file the scan may resume from, or None (the report says which)."""
    resume = None
    if use_checkpoint:
        checkpoint, why = read_checkpoint(relay_dir)
        if checkpoint is not None:
            resume, why = verify(checkpoint, relay_dir / newest, newest, epochs=epochs)
    else:
        why = "checkpoint not used (full scan asked for)"
    note = scan_note(newest, resume, why)
    report.checkpoint = note if report.checkpoint is None else f"{report.checkpoint}; {note}"
    report.checkpoint_offset = None if resume is None else resume.offset
    return resume


def _apply_plan(relay_dir: Path, plan: RecoveryPlan, epochs: Epochs, mark: DurableMark | None,
                report: RecoveryReport) -> RecoveredState:
    """Do what ``plan_recovery`` decided (cut the newest file's tail or refuse, fsync) and say what the store
    resumes from."""
    report.warnings.extend(link_warnings(plan.links))
    tail = plan.tail
    _apply_tail(tail, mark, report, report.warnings.append)
    report.scan = tail.scan
    if plan.join_problem is not None:
        raise RelayRecoveryError(plan.join_problem, file=tail.name)
    if plan.previous_warning is not None:
        report.warnings.append(plan.previous_warning)
    joins = join_warnings(plan, epochs)
    report.warnings.extend(joins)
    fsync_path(tail.path)
    fsync_dir(relay_dir)
    gtids = plan.horizon_gtids
    report.horizon = HorizonSnapshot(tail.name, tail.end, None if gtids is None else gtids.copy(), 0)
    start_set = tail.start_set
    return RecoveredState(
        report, list(plan.files), tail.name, tail.end, gtids, tail.fde, start_set is not None,
        None if start_set is None else start_set.copy(), plan.flavour, epochs, plan.join_extra, joins,
    )


def _adopt_unlisted(path: Path, warn) -> bool:
    size = path.stat().st_size
    if size <= 4:
        head = path.read_bytes()
        if C.BINLOG_MAGIC.startswith(head):
            # Created by a start_file that never reached the index write: only (part of) the magic.
            if head != C.BINLOG_MAGIC:
                _write_magic(path)
            warn(f"adopted {path.name}: created but not yet listed when the relay stopped (no events yet)")
            return True
        warn(f"{path.name} is not listed and is not a binlog file: left alone")
        return False
    scan = scan_file(path)
    if scan.ok and not scan.partial_tail:
        warn(f"adopted {path.name}: created but not yet listed when the relay stopped ({size} bytes, whole)")
        return True
    problem = scan.error or ("it ends inside a group" if scan.partial_tail else "CRC errors")
    # The relay lists a file before it appends any event to it, so nothing in an unlisted file was durable or
    # served: keep it for the operator, out of the way of the file the relay will write under this name (left
    # in place, it would stop the relay with "already exists" when the stream reaches that name).
    aside = _set_aside(path)
    warn(f"{path.name} is not listed and was not adopted: {problem}; moved to {aside} (never served; "
         "the relay fetches this file again from its master)")
    return False


def _set_aside(path: Path) -> Path:
    """Move ``path`` into the relay directory's UNADOPTED_DIR under a name that never collides; durable."""
    folder = path.parent / UNADOPTED_DIR
    folder.mkdir(exist_ok=True)
    n = 1
    while (target := folder / f"{path.name}.{n}").exists():
        n += 1
    os.rename(path, target)
    fsync_dir(folder)
    fsync_dir(path.parent)
    return target


def _apply_tail(tail: TailPlan, mark: DurableMark | None, report: RecoveryReport, warn) -> None:
    """Do what the plan decided for the newest file: refuse, complete its magic, or cut its partial tail."""
    name, path = tail.name, tail.path
    if tail.refusal is not None:
        raise RelayRecoveryError(tail.refusal, file=name, offset=tail.damage_offset)
    if tail.scan is None:
        if tail.complete_magic:
            _write_magic(path)  # listed, but the magic never reached the disk: it holds nothing
            warn(f"{name}: completed its binlog magic ({tail.size} of 4 bytes were on disk)")
        _check_mark(mark, name, 4, warn)
        return
    if tail.kind == DAMAGED:
        warn(
            f"{name}: damage after the last durable point at offset {tail.damage_offset} ({tail.detail}): "
            f"the debris of a crash, cut off at offset {tail.end}"
        )
    if tail.cut > 0:
        _truncate(path, tail.end)
        report.truncated_bytes = tail.cut
        report.truncated_file = name
        if tail.kind != DAMAGED:
            reason = "a cut event" if tail.scan.truncated_event else "an unfinished group"
            warn(f"{name}: cut {tail.cut} bytes of {reason} after offset {tail.end}")
    _check_mark(mark, name, tail.end, warn)
    if tail.scan.warnings:
        report.warnings.extend(f"{name}: {w}" for w in tail.scan.warnings)


def _check_mark(mark: DurableMark | None, name: str, end: int, warn) -> None:
    if mark is not None and mark.file == name and mark.position > end:
        warn(
            f"{name} ends at {end}, before the durable mark {mark.position}: data the relay had made "
            f"durable is gone (filesystem lost an fsync'd write, or the file was replaced); it will be "
            f"fetched from the master again"
        )
