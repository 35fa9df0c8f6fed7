"""What the relay files hold, for readers: durable sizes, each file's starting GTID set, the purged set.

The dump sender picks its first file from the starting GTID sets (MySQL: PREVIOUS_GTIDS, newest to
oldest; MariaDB: GTID_LIST), and both it and the SQL layer need ``gtid_purged``: the GTIDs the relay
cannot serve. A file's starting set is read once (its header never changes) and cached by name. The GTIDs
inside a closed file come from its index (``relay/fileindex.py``: no scan once it exists), so a start costs
O(files), not O(total relay size).

Sizes a reader may use are *durable* sizes: closed files whole, the current file up to the horizon.

Upstream epochs (``relay/epochs.py``): the first file of an epoch >= 2 (a join file) starts with its new
master's PREVIOUS_GTIDS / GTID_LIST, which may lack part of what the relay held at the join; its
starting set here is ``join_gtids ∪ that set`` (``join_gtids`` when the file has no set event), so the
dump sender positions GTID replicas across the join and ``purged()`` counts the GTIDs a join file's set
names that the relay never had.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from ..binlog import constants as C
from ..binlog.events import HEADER, BinlogFormatError, FormatDescription
from ..binlog.gtid import GtidSet, MariaBinlogState
from . import closed_files
from . import fileindex as _fileindex
from .epochs import is_filler

if TYPE_CHECKING:
    from .reader import StoreReader

StartSet = Union[GtidSet, MariaBinlogState, None]  # a file's starting set; None without PREVIOUS_GTIDS / GTID_LIST

# The FDE and the PREVIOUS_GTIDS / GTID_LIST event sit in the first bytes: a few hundred of them in the common
# case, more when the set names many servers or intervals. A start reads every file's head once, so the first read
# is small (a whole 1 MiB per file is a disk read proportional to the file count times 1 MiB on a cold cache);
# the larger read only when the set event does not end inside it.
_FIRST_HEAD_READ = 64 << 10
_HEAD_READ = 1 << 20


class CatalogError(ValueError):
    """A relay file's header cannot be read (the message names the file)."""


@dataclass(frozen=True)
class FileInfo:
    name: str
    size: int  # durable bytes a reader may send
    start_gtids: StartSet
    server_version: str | None


class FileCatalog:
    """Read-side view of a RelayStore's files (cheap: headers are cached, sizes come from the horizon)."""

    def __init__(self, store: StoreReader):
        self._store = store
        self._starts: dict[str, tuple[StartSet, str | None]] = {}
        self._events: dict[str, GtidSet] = {}  # closed files only
        self._sizes: dict[str, int] = {}  # logical sizes of closed files

    def files(self) -> list[FileInfo]:
        store = self._store
        horizon = store.horizon.snapshot()
        names = store.files()
        out: list[FileInfo] = []
        for name in names:
            if horizon.file is not None and name == horizon.file:
                size = horizon.position
            elif horizon.file is not None and names.index(name) > names.index(horizon.file):
                continue  # started but not yet durable past its header
            elif name in self._sizes:
                size = self._sizes[name]
            else:
                try:
                    size = closed_files.logical_size(store.path(name))  # any storage form
                except (OSError, closed_files.StoredFileError):
                    continue  # purged under our feet (a damaged file is refused when read)
                self._sizes[name] = size  # a closed file never changes size
            start, version = self.start_of(name)
            out.append(FileInfo(name, size, start, version))
        return out

    def start_of(self, name: str) -> tuple[StartSet, str | None]:
        """(starting GTID set, server version) of a relay file, read from its header once."""
        cached = self._starts.get(name)
        if cached is not None:
            return cached
        path = self._store.path(name)
        head = _read_head(name, path, _FIRST_HEAD_READ)
        start, version, final = _parse_head(name, head)
        if not final and len(head) >= _FIRST_HEAD_READ:  # the set event goes on past the first read
            head = _read_head(name, path, _HEAD_READ)
            start, version, final = _parse_head(name, head)
        epochs = self._store.epochs
        if epochs.join_epoch(name) is not None:
            try:
                start = epochs.file_start(name, start)
            except ValueError as exc:
                raise CatalogError(f"relay file {name}: its GTID set does not join the relay's: {exc}") from exc
        if final:
            self._starts[name] = (start, version)  # a file whose header is complete never changes
        return start, version

    def forget(self, name: str) -> None:
        self._starts.pop(name, None)
        self._events.pop(name, None)
        self._sizes.pop(name, None)

    def purged(self):
        """GTIDs the relay cannot serve: the starting set of its oldest file (gtid_purged).

        A GTID named in a later file's PREVIOUS_GTIDS but in no file's events is counted too, because
        the oldest file's starting set includes everything before it, and a later file's set that names
        transactions absent from the earlier files (``SET GLOBAL gtid_purged`` after a restore) is
        merged in: purged = start(oldest) ∪ ⋃ (start(f_i+1) − (start(f_i) ∪ events(f_i))).
        """
        infos = self.files()
        if not infos:
            return None
        purged = _copy(infos[0].start_gtids)
        for older, newer in zip(infos, infos[1:]):
            if newer.start_gtids is None or older.start_gtids is None:
                continue
            if isinstance(newer.start_gtids, GtidSet):
                if not isinstance(older.start_gtids, GtidSet):
                    raise CatalogError(f"relay files {older.name} and {newer.name} hold GTID sets of different "
                                       f"flavours")
                covered = older.start_gtids.union(self._events_gtids(older.name))
                missing = newer.start_gtids.subtract(covered)
                if missing:
                    purged = missing if purged is None else purged.union(missing)
        return purged

    def _events_gtids(self, name: str) -> GtidSet:
        """GTIDs of the complete groups inside a (closed) MySQL relay file; scanned once."""
        cached = self._events.get(name)
        if cached is not None:
            return cached
        path = self._store.path(name)
        if name != self._store.current_file:
            # A closed file: its index (relay/fileindex.py), verified, rebuilt and written where the store may.
            writable = self._store.sidecars_writable
            try:
                events = _fileindex.index_for(path.parent, name, writable=writable).events_gtids()
            except (OSError, _fileindex.FileIndexError) as exc:
                raise CatalogError(f"cannot read relay file {name}: {exc}") from exc
            except closed_files.StoredFileError as exc:
                raise CatalogError(f"cannot read relay file {name}: {exc}") from exc
            self._events[name] = events
            return events
        result = closed_files.scan(path)
        after = result.gtids_after if isinstance(result.gtids_after, GtidSet) else GtidSet()
        start = result.start_gtids if isinstance(result.start_gtids, GtidSet) else GtidSet()
        return after.subtract(start)


def _read_head(name: str, path, n: int) -> bytes:
    try:
        return closed_files.read_head(path, n)  # plain, compressed, encrypted or archived
    except OSError as exc:
        raise CatalogError(f"cannot read relay file {name}: {exc.strerror}") from exc
    except closed_files.StoredFileError as exc:
        raise CatalogError(f"cannot read relay file {name}: {exc}") from exc


def _copy(value):
    return None if value is None else value.copy()


def _parse_head(name: str, head: bytes) -> tuple[StartSet, str | None, bool]:
    """(starting set, server version, final): final is False while the header may still be growing."""
    if len(head) < 4 or head[:4] != C.BINLOG_MAGIC:
        raise CatalogError(f"relay file {name} does not start with the binlog magic")
    pos = 4
    fde = None
    while pos + C.HEADER_LEN <= len(head):
        header = HEADER.unpack_from(head, pos)
        type_code, size = header[1], header[3]
        if size < C.HEADER_LEN or pos + size > len(head):
            break
        if type_code == C.FORMAT_DESCRIPTION_EVENT:
            try:
                fde = FormatDescription.parse(head, pos, size)
            except (BinlogFormatError, ValueError) as exc:
                raise CatalogError(f"relay file {name}: {exc}") from exc
        elif type_code == C.PREVIOUS_GTIDS_LOG_EVENT and fde is not None:
            body = pos + C.HEADER_LEN
            return GtidSet.decode(head, body, size - C.HEADER_LEN - fde.checksum_len), fde.server_version, True
        elif type_code == C.MARIA_GTID_LIST_EVENT and fde is not None:
            body = pos + C.HEADER_LEN
            state, _flags = MariaBinlogState.decode_gtid_list_body(head, body, size - C.HEADER_LEN - fde.checksum_len)
            return state, fde.server_version, True
        elif type_code not in (C.ROTATE_EVENT, C.MARIA_BINLOG_CHECKPOINT_EVENT, C.STOP_EVENT) and not is_filler(header):
            return None, fde.server_version if fde else None, True  # a first group: no starting set, ever
        pos += size
    return None, fde.server_version if fde else None, False  # the header is not all there (yet)
