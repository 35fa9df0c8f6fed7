"""A directory of binlog files opened read-only, as the downstream side sees a relay store: which files in which
order (``--files``, an index, ``relayproxy.index`` or the numbered series), their continuity, the horizon at the
newest file's last complete group, and ``--follow`` for a directory that grows. ``relayproxy serve`` uses it.

What a tail, the continuity of two files and the horizon (file, position, GTID set) mean is decided in one
place, recovery's plan (``recovery.plan_recovery``): the relay applies it at open (cuts a partial tail, rewrites
its index), this directory only reads it, and refuses where the relay would have to cut damage. A relay
directory's upstream epochs (``relayproxy.epochs``) are read, so its join files mean here what they mean to the
relay. What is this module's own: finding the files of a server's directory (``--files``, ``--index``, a
server's ``*.index``, the numbered series), checking that events sit at their ``log_pos``, ``--follow``.
Nothing in the directory is ever written.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..binlog import constants as C
from ..binlog.events import HEADER, FormatDescription
from ..binlog.reader import BinlogScanner, ScanResult
from ..log import get_logger
from . import closed_files
from .epochs import Epochs, EpochsError, read_epochs
from .horizon import Horizon
from .durable import read_index
from .errors import RelayRecoveryError, RelayStoreError
from .layout import INDEX_NAME, RESERVED_PREFIX, next_file_name
from .recovery import (
    DAMAGED,
    PARTIAL,
    TailPlan,
    classify_scan,
    end_gtids,
    file_end_set,
    link,
    plan_recovery,
)

if TYPE_CHECKING:
    from .reader import StoreReader
    from .txindex import TransactionIndex

log = get_logger("relayproxy.serve")  # logs as the command it serves

_NUMBERED = re.compile(r"^(?P<base>.+)\.(?P<number>\d+)$")
_READ_CHUNK = 1 << 20
_PLACEMENT_CHECK_BYTES = 1 << 16  # events at the head of a file checked for sitting at their log_pos

class ServeError(Exception):
    """The directory cannot be served as it is; the message names the file (and offset) and what to do."""


class ReadOnlyStoreError(RelayStoreError):
    """A write to the served directory was asked for (PURGE BINARY LOGS): refused, nothing changed."""


# ---------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class ServeOptions:
    """What to serve and how (everything else comes from the relay's configuration)."""

    binlog_dir: Path
    index: Path | None = None
    files: tuple[str, ...] | None = None
    follow: bool = False
    follow_interval: float = 1.0
    allow_gaps: bool = False


def _plain_name(name: str, where: str) -> str:
    if not name or "/" in name or "\\" in name or name in (".", "..") or any(ord(ch) < 32 for ch in name):
        raise ServeError(f"{where}: {name!r} is not a plain file name in --binlog-dir")
    return name


def read_server_index(path: Path) -> list[str]:
    """The base names a MySQL/MariaDB ``*.index`` file lists (``./binlog.000001``, absolute paths ...)."""
    try:
        text = path.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise ServeError(f"cannot read the index file {path}: {exc.strerror}") from None
    names: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        entry = line.strip()
        if not entry:
            continue
        name = _plain_name(os.path.basename(entry), f"{path} line {lineno}")
        if name in names:
            raise ServeError(f"{path} line {lineno}: {name} is listed twice")
        names.append(name)
    return names


def _numbered_files(binlog_dir: Path) -> list[str]:
    series: dict[str, list[tuple[int, str]]] = {}
    for entry in os.scandir(binlog_dir):
        if not entry.is_file() or entry.name.startswith((".", RESERVED_PREFIX)):
            continue
        m = _NUMBERED.match(entry.name)
        if m:
            series.setdefault(m.group("base"), []).append((int(m.group("number")), entry.name))
    if not series:
        raise ServeError(
            f"no binlog files (NAME.NNNNNN) in {binlog_dir}, and no relayproxy.index or *.index file: "
            f"name the files with --files"
        )
    if len(series) > 1:
        listing = ", ".join(f"{base}.* ({len(items)} files)" for base, items in sorted(series.items()))
        raise ServeError(
            f"{binlog_dir} holds several binlog series ({listing}): choose with --files or --index"
        )
    ((_base, items),) = series.items()
    return [name for _number, name in sorted(items)]


def list_binlog_files(binlog_dir: Path, *, index: Path | None = None,
                      files: tuple[str, ...] | None = None) -> tuple[list[str], str, list[str]]:
    """``(names oldest first, where the order came from, warnings)``; every name exists in ``binlog_dir``."""
    warnings: list[str] = []
    if files:
        names = [_plain_name(n, "--files") for n in files]
        if len(set(names)) != len(names):
            raise ServeError("--files names a file twice")
        missing = [n for n in names if not closed_files.exists(binlog_dir / n)]
        if missing:
            raise ServeError(f"--files: not found in {binlog_dir}: {', '.join(missing)}")
        return names, "--files", warnings
    if index is None and (binlog_dir / INDEX_NAME).is_file():
        try:
            names = read_index(binlog_dir) or []
        except RelayRecoveryError as exc:
            raise ServeError(str(exc)) from None
        source = INDEX_NAME
    else:
        if index is None:
            candidates = sorted(
                p for p in binlog_dir.glob("*.index")
                if p.is_file() and not p.name.startswith(RESERVED_PREFIX)
            )
            if len(candidates) > 1:
                raise ServeError(
                    f"{binlog_dir} holds several index files ({', '.join(p.name for p in candidates)}): "
                    f"choose one with --index"
                )
            index = candidates[0] if candidates else None
        if index is None:
            return _numbered_files(binlog_dir), "file names by number", warnings
        names = read_server_index(index)
        source = f"index file {index}"
    present = [closed_files.exists(binlog_dir / n) for n in names]  # any storage form (closed_files.py)
    if names and not any(present):
        raise ServeError(f"none of the files {source} lists is in {binlog_dir}")
    first = present.index(True) if any(present) else 0
    for name in names[:first]:
        warnings.append(f"{name} is listed in {source} but missing (purged?): not served")
    names, present = names[first:], present[first:]
    missing = [n for n, ok in zip(names, present) if not ok]
    if missing:
        raise ServeError(
            f"{source} lists files missing from {binlog_dir} after files that exist: {', '.join(missing)}; "
            f"serving around them would leave a hole in the binlog (choose files with --files)"
        )
    return names, source, warnings


# ---------------------------------------------------------------------------------------------
# Checks on one file


def _misplaced_event(path: Path) -> str | None:
    """Why the events at the head of the file do not sit at their ``log_pos`` (a relay log), or None.

    A binlog's every event ends at the offset its ``log_pos`` names; the dump sender sends the files'
    bytes as they are, so a replica takes its position from those fields. A replica's relay log
    carries its master's positions instead and cannot be served as a binlog.
    """
    try:
        with closed_files.open_stream(path) as f:
            head = f.read(_PLACEMENT_CHECK_BYTES)
    except (OSError, closed_files.StoredFileError):
        return None  # the scan reports unreadable files
    pos = 4
    while pos + C.HEADER_LEN <= len(head):
        _ts, type_code, _sid, size, log_pos, flags = HEADER.unpack_from(head, pos)
        if size < C.HEADER_LEN or pos + size > len(head):
            break
        if type_code == C.MARIA_START_ENCRYPTION_EVENT and not flags & C.LOG_EVENT_IGNORABLE_F:
            return (f"it is encrypted from offset {pos + size} on (MariaDB encrypt_binlog=ON): give the server's key "
                    "file (--binlog-key-file)")
        # 0: MariaDB 11 leaves end_log_pos of the events inside a group out (binlog_legacy_event_pos=OFF).
        if log_pos and log_pos != (pos + size) & 0xFFFFFFFF:
            return (
                f"its {C.event_name(type_code)} event at offset {pos} has log_pos {log_pos}, not its end offset "
                f"{pos + size}: the events do not sit at their binlog positions (a replica's relay log?), so a "
                f"replica of this server would record wrong positions"
            )
        pos += size
    return None


def _fde_server_id(path: Path) -> int | None:
    try:
        with closed_files.open_stream(path) as f:
            head = f.read(4 + C.HEADER_LEN)
    except (OSError, closed_files.StoredFileError):
        return None
    if len(head) < 4 + C.HEADER_LEN or head[:4] != C.BINLOG_MAGIC:
        return None
    _ts, type_code, server_id, _size, _lp, _flags = HEADER.unpack_from(head, 4)
    return server_id if type_code == C.FORMAT_DESCRIPTION_EVENT else None


class _Tail:
    """Incremental scan of the newest file: the scanner is fed only the bytes appended since the last look,
    so ``--follow`` costs what the file grew by. Never finished (``finish()`` would call a pending
    event or group an error): ``good_end`` is the last boundary, and pending bytes wait for more."""

    def __init__(self, name: str, path: Path, carried, epochs: Epochs):
        self.name = name
        self.path = path
        self.carried = carried  # the previous file's set after it (a file cut before its PREVIOUS_GTIDS)
        self.epochs = epochs
        self._restart()

    def _restart(self) -> None:
        self.scanner = BinlogScanner(path=os.fspath(self.path))
        self.fed = 0
        self.size = 0
        self._stat: tuple[int, int] | None = None  # (size, mtime) at the last look

    @property
    def result(self) -> ScanResult:
        return self.scanner.result

    def read_more(self) -> None:
        """Feed the bytes appended since the last call. A file that shrank is scanned again from the start,
        and so is a damaged one that changed since (a live server's torn tail may be complete by now)."""
        with open(self.path, "rb") as f:
            st = os.fstat(f.fileno())
            size = st.st_size
            if size < self.fed or (self.damage is not None and (size, st.st_mtime_ns) != self._stat):
                self._restart()
            self._stat = (size, st.st_mtime_ns)
            f.seek(self.fed)
            while self.fed < size:
                chunk = f.read(min(_READ_CHUNK, size - self.fed))
                if not chunk:
                    break
                self.fed += len(chunk)
                self.scanner.feed(chunk)
                if self.scanner._stopped:
                    break
        self.size = size

    @property
    def damage(self) -> str | None:
        r = self.result
        if r.error is not None:
            return r.error
        if r.crc_errors:
            return f"{r.crc_errors} CRC32 mismatch(es)"
        return None

    @property
    def good_end(self) -> int:
        return self.result.good_end

    @property
    def whole(self) -> bool:
        """Every byte read so far is complete events ending at a group boundary."""
        return self.damage is None and self.result.fde is not None and self.good_end == self.size == self.fed

    def gtids(self):
        """The GTID set at ``good_end`` (a copy): recovery's rule (``end_gtids``), as the relay rebuilds it."""
        r = self.result
        gtids, _extra = end_gtids(self.name, start_set=r.start_gtids, gtids=r.gtids_after, fde=r.fde,
                                  epochs=self.epochs, previous=None if self.carried is None else (lambda: self.carried))
        return None if gtids is None else gtids.copy()


def _continuity_problem(older: str, older_scan: ScanResult, newer: str, newer_start, epochs: Epochs) -> str | None:
    """Why ``newer`` does not continue ``older`` (None when it does)."""
    try:
        after = file_end_set(older, older_scan, epochs)
        newer_start = epochs.file_start(newer, newer_start)
    except ValueError as exc:
        return f"{newer}'s GTID set does not join {older}'s: {exc}"
    if after is not None and newer_start is not None and type(after) is type(newer_start) and after == newer_start:
        return None
    rotate = older_scan.rotate_to
    if rotate is not None:
        if link(epochs, older, rotate[0], newer).follows:
            return None
        return f"{older} ends with a ROTATE to {rotate[0]}, but the next file served is {newer}"
    expected = next_file_name(older)
    if expected == newer:
        return None
    detail = f"its GTID set at the end is {after}, {newer} starts at {newer_start}" if after is not None else ""
    return (f"{older} does not end with a ROTATE and {newer} is not the next file by number ({expected})"
            + (f"; {detail}" if detail else ""))


# ---------------------------------------------------------------------------------------------
# The read-only store


@dataclass
class _Publish:
    """What one look at the directory found, applied on the event loop's thread (see ``apply``)."""

    names: list[str]
    fde: FormatDescription | None
    horizon: tuple[str, int, Any] | None  # (file, position, gtids) when the horizon moves
    errors: list[str] = field(default_factory=list)


class ReadOnlyBinlogDir:
    """A directory of binlog files seen as the downstream side sees a RelayStore, opened read-only.

    A ``StoreReader`` (relay/reader.py): the read interface of ``RelayStore`` (``files()``, ``path()``,
    ``current_file``, ``horizon``, ``epochs``, ``flavour``, ``format_description``), nothing of its write path;
    ``purge_to`` is refused, no index sidecar is written.
    """

    read_only = True
    sidecars_writable = False  # nothing in the directory is written (module doc)
    transaction_index: TransactionIndex | None = None  # readers keep one per store (txindex.index_of)

    def __init__(self, options: ServeOptions, names: list[str], order_source: str, tail: _Tail,
                 flavour: str, warnings: list[str], server_id: int | None, plan: TailPlan | None = None,
                 gtids=None):
        self.options = options
        self.binlog_dir = options.binlog_dir
        self.order_source = order_source
        self.warnings = warnings
        self.server_id = server_id  # the FORMAT_DESCRIPTION's: the server that wrote the files
        self._names = list(names)
        self._tail = tail
        self._flavour = flavour
        self._fde = tail.result.fde
        self.epochs = tail.epochs  # a relay directory's upstream epochs (implicit for a server's directory)
        if plan is None:
            self.horizon = Horizon(tail.name, tail.good_end, tail.gtids())
        else:  # recovery's plan: the horizon the relay would rebuild from these files
            self.horizon = Horizon(plan.name, plan.end, None if gtids is None else gtids.copy())
        self.follow_error: str | None = None
        self._reported: set[str] = set()  # problems --follow logged already (logged again only once they clear)
        self._closed = False

    # -- opening ---------------------------------------------------------------------------------
    @classmethod
    def open(cls, options: ServeOptions) -> "ReadOnlyBinlogDir":
        """Scan the files (never writing anything) and place the horizon; ServeError says why not."""
        binlog_dir = options.binlog_dir
        if not binlog_dir.is_dir():
            raise ServeError(f"--binlog-dir {binlog_dir} is not a directory")
        names, source, warnings = list_binlog_files(binlog_dir, index=options.index, files=options.files)
        if not names:
            raise ServeError(f"{source} lists no binlog files: nothing to serve")
        for name in names:
            reason = _misplaced_event(binlog_dir / name)
            if reason:
                raise ServeError(f"cannot serve {binlog_dir / name}: {reason}")

        try:
            epochs = read_epochs(binlog_dir)  # a relay directory's; implicit elsewhere
        except EpochsError as exc:
            raise ServeError(f"cannot read the upstream epochs of {binlog_dir}: {exc}") from None

        # A file without its FORMAT_DESCRIPTION yet may end the list (a server just rotated): it is
        # served once it has one (--follow), never before.
        scans: list[ScanResult] = []
        tail: _Tail | None = None
        for i, name in enumerate(names):
            path = binlog_dir / name
            log.info("scanning", file=name)
            if i < len(names) - 1:
                try:
                    scans.append(closed_files.scan(path))  # plain, compressed, encrypted or archived
                except OSError as exc:
                    raise ServeError(f"cannot read {path}: {exc.strerror}") from None
                except closed_files.StoredFileError as exc:
                    raise ServeError(f"cannot read {path}: {exc}") from None
                continue
            tail = _Tail(name, path, cls._carried(names, scans, epochs), epochs)
            try:
                tail.read_more()
            except OSError as exc:
                raise ServeError(f"cannot read {path}: {exc.strerror}") from None
        assert tail is not None  # names is not empty: its last file is the tail
        while tail.result.fde is None and tail.damage is None and len(names) > 1:
            warnings.append(f"{tail.name} holds no event yet: not served" + (" until it does" if options.follow else ""))
            names.pop()
            scans.pop()  # the file before it becomes the newest: read again as the tail
            tail = _Tail(names[-1], binlog_dir / names[-1], cls._carried(names, scans, epochs), epochs)
            try:
                tail.read_more()
            except OSError as exc:
                raise ServeError(f"cannot read {tail.path}: {exc.strerror}") from None
        if tail.result.fde is None:
            raise ServeError(
                f"{tail.path} has no FORMAT_DESCRIPTION_EVENT"
                + (f" ({tail.damage})" if tail.damage else "") + ": nothing to serve"
            )

        # What the relay would decide for these files, without doing any of it.
        try:
            plan = plan_recovery(binlog_dir, names, epochs=epochs, newest_scan=tail.result, newest_size=tail.size,
                                 closed_scans=scans)
        except (RelayRecoveryError, OSError) as exc:
            raise ServeError(f"cannot serve {binlog_dir}: {exc}") from None
        for name, scan in zip(names, scans):
            cls._check_closed_file(binlog_dir / name, scan, newest=names[-1])
        cls._check_newest(tail, plan.tail, warnings)
        if plan.join_problem is not None:
            raise ServeError(f"cannot serve {binlog_dir}: {plan.join_problem}")

        flavours = {scan.flavour for scan in scans} | {tail.result.flavour}
        if len(flavours) > 1:
            kinds = ", ".join(f"{n} ({s.flavour})" for n, s in zip(names, [*scans, tail.result]))
            raise ServeError(f"the files mix MySQL and MariaDB binlogs: {kinds}")
        starts = [s.start_gtids for s in scans[1:]] + [tail.result.start_gtids]
        for (older, scan), newer, newer_start in zip(zip(names, scans), names[1:], starts):
            problem = _continuity_problem(older, scan, newer, newer_start, epochs)
            if problem is None:
                continue
            if not options.allow_gaps:
                raise ServeError(
                    f"the files do not continue each other: {problem}. A file/position replica would skip what "
                    f"lies between without an error. Serve consecutive files (--files), or pass --allow-gaps"
                )
            warnings.append(f"gap served (--allow-gaps): {problem}")

        store = cls(options, names, source, tail, flavours.pop(), warnings, _fde_server_id(binlog_dir / names[-1]),
                    plan.tail, plan.horizon_gtids)
        for warning in warnings:
            log.warning(warning)
        snap = store.horizon.snapshot()
        log.info("serving binlog files read-only", binlog_dir=str(binlog_dir), order=source, files=len(names),
                 first=names[0], horizon=f"{snap.file}:{snap.position}", gtids=snap.text, flavour=store.flavour)
        return store

    @staticmethod
    def _carried(names: list[str], scans: list[ScanResult], epochs: Epochs):
        """The set after the file before the newest (recovery's ``file_end_set``), or None."""
        if not scans:
            return None
        try:
            return file_end_set(names[len(scans) - 1], scans[-1], epochs)
        except ValueError as exc:
            raise ServeError(f"{names[len(scans) - 1]}: its GTID set does not join the relay's: {exc}") from None

    @staticmethod
    def _check_closed_file(path: Path, scan: ScanResult, *, newest: str) -> None:
        """Refuse where the relay would have to cut a closed file (recovery's ``classify_scan``)."""
        size = closed_files.logical_size(path)
        kind = classify_scan(scan, size)
        if kind == DAMAGED:
            where = f" ({scan.error})" if scan.error else f" ({scan.crc_errors} CRC32 mismatches)"
            raise ServeError(f"cannot serve {path}: damaged before its end{where}; nothing was changed")
        if kind == PARTIAL:
            raise ServeError(
                f"cannot serve {path}: it ends inside an unfinished transaction (complete up to offset "
                f"{scan.good_end} of {size}), but it is not the newest file ({newest} is). Only the "
                f"newest file's unfinished tail can be left out; serve the files before it with --files"
            )

    @staticmethod
    def _check_newest(tail: _Tail, plan: TailPlan, warnings: list[str]) -> None:
        """The newest file as recovery's plan sees it: refused where the relay would refuse to start; a
        damaged tail (crash debris) or an unfinished one, which the relay would cut, is left out instead."""
        damage = tail.damage
        if plan.refusal is not None:
            reason = plan.refusal_reason or plan.refusal
            raise ServeError(
                f"cannot serve {tail.path}: damaged before its end ({damage or plan.detail}), and {reason}; "
                f"nothing was changed"
            )
        if plan.kind == DAMAGED:
            warnings.append(
                f"{tail.name}: damaged tail ({damage}): served up to offset {plan.end}, the rest is left out"
            )
        elif plan.kind == PARTIAL:
            warnings.append(
                f"{tail.name}: ends inside an unfinished transaction or event: served up to offset {plan.end} "
                f"of {tail.size}"
            )

    # -- the RelayStore read interface -----------------------------------------------------------
    def files(self) -> list[str]:
        return list(self._names)

    def path(self, name: str) -> Path:
        if name not in self._names:
            raise KeyError(f"{name!r} is not a served binlog file")
        return self.binlog_dir / name

    @property
    def relay_dir(self) -> Path:
        return self.binlog_dir

    @property
    def current_file(self) -> str | None:
        return self._names[-1] if self._names else None

    @property
    def flavour(self) -> str:
        return self._flavour

    @property
    def format_description(self) -> FormatDescription | None:
        return self._fde

    latest_format_description = format_description  # --follow keeps the last one seen when a new file has none

    def file_digest(self, name: str) -> str | None:
        return None  # no file index is kept of a served directory: a reader hashes the file itself

    def upstream_position(self) -> tuple[str | None, int] | None:
        return None  # no upstream: the files are served as they are

    def purge_to(self, name: str) -> list[str]:
        raise ReadOnlyStoreError(
            f"relayproxy serve is read-only: it never deletes the binlog files it serves (nothing before {name} "
            f"was purged); purge them on the server that wrote them"
        )

    def close(self) -> None:
        self._closed = True

    # -- --follow --------------------------------------------------------------------------------
    def poll(self) -> _Publish | None:
        """Look at the directory again (file I/O: run it off the event loop); ``apply`` publishes the result.

        Reads what the newest file gained, then moves on to files that appeared after it once it is whole.
        Never raises for what it finds: problems come back in ``errors`` and the horizon stays put.
        """
        if self._closed or self.follow_error is not None:
            return None
        errors: list[str] = []
        names = list(self._names)
        tail = self._tail
        try:
            tail.read_more()
        except OSError as exc:
            errors.append(f"cannot read {tail.path}: {exc.strerror}")
            return _Publish(names, self._fde, None, errors)
        snap = self.horizon.snapshot()
        if tail.size < snap.position:
            self.follow_error = (
                f"{tail.name} shrank to {tail.size} bytes, below what was served ({snap.position}): its server "
                f"truncated it. Stopped following; restart relayproxy serve"
            )
            return _Publish(names, self._fde, None, [self.follow_error])
        if self.options.files is None:
            try:
                order, _source, _warnings = list_binlog_files(self.binlog_dir, index=self.options.index)
            except (ServeError, OSError) as exc:
                order = names
                errors.append(f"cannot list the binlog files again: {exc}")
            if tail.name in order:
                at = order.index(tail.name)
                head, newer = order[: at + 1], order[at + 1 :]
                if set(head) <= set(names):
                    names = head  # files purged at the head by their server drop out
                else:
                    errors.append(f"files appeared before {tail.name} in the list: ignored")
                while newer and self._tail_whole_for_rotation(tail, newer[0], errors):
                    path = self.binlog_dir / newer[0]
                    nxt = _Tail(newer[0], path, tail.gtids(), self.epochs)
                    try:
                        nxt.read_more()
                    except OSError as exc:
                        errors.append(f"cannot read {path}: {exc.strerror}")
                        break
                    if nxt.result.fde is None:
                        if nxt.damage is not None:
                            errors.append(f"{newer[0]}: {nxt.damage}: not served")
                        break  # just created: served once its FORMAT_DESCRIPTION is there
                    if nxt.result.flavour != self._flavour:
                        errors.append(f"{newer[0]} is a {nxt.result.flavour} binlog, the others are {self._flavour}")
                        break
                    problem = _continuity_problem(tail.name, tail.result, newer[0], nxt.result.start_gtids,
                                                  self.epochs)
                    if problem is not None and not self.options.allow_gaps:
                        errors.append(f"not moving on to {newer[0]}: {problem} (--allow-gaps serves it anyway)")
                        break
                    names.append(newer[0])
                    tail = nxt
                    newer = newer[1:]
            elif tail.name in names:
                errors.append(f"{tail.name} is no longer listed: keeping the files served so far")
        if tail.damage is not None:
            errors.append(f"{tail.name}: {tail.damage}: served up to offset {tail.good_end} only")
        position = max(tail.good_end, 4)
        moved = tail is not self._tail or position > snap.position
        self._tail = tail
        horizon = (tail.name, position, tail.gtids()) if moved else None
        return _Publish(names, tail.result.fde or self._fde, horizon, errors)

    @staticmethod
    def _tail_whole_for_rotation(tail: _Tail, newer: str, errors: list[str]) -> bool:
        if tail.whole and not tail.scanner.parser.in_group:
            return True
        errors.append(
            f"{newer} appeared, but {tail.name} is not whole (served up to {tail.good_end} of {tail.size} bytes"
            + (f", {tail.damage}" if tail.damage else "") + "): not moving on yet"
        )
        return False

    def apply(self, publish: _Publish | None) -> bool:
        """Publish a ``poll`` result: the file list first, then the horizon (readers never see a horizon
        in a file they cannot list). Runs on the event loop's thread. Returns whether the horizon moved."""
        if publish is None:
            return False
        for error in publish.errors:
            if error not in self._reported:
                log.warning("follow: " + error)
        self._reported = set(publish.errors)
        self._names = publish.names
        self._fde = publish.fde
        if publish.horizon is None:
            return False
        file, position, gtids = publish.horizon
        self.horizon.advance(file, position, gtids, copy=False)
        return True

    def refresh(self) -> bool:
        """``apply(poll())`` in one call (tests, single-threaded use)."""
        return self.apply(self.poll())

    def __repr__(self) -> str:
        snap = self.horizon.snapshot()
        return f"<ReadOnlyBinlogDir {self.binlog_dir} {len(self._names)} files horizon={snap.file}:{snap.position}>"


if TYPE_CHECKING:
    _IS_A_STORE_READER: type[StoreReader] = ReadOnlyBinlogDir  # mypy checks that no member readers ask for is missing
