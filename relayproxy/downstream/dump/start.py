"""Where a dump starts (the preamble): file/position checks, MySQL GTID auto-position (replica-ahead and
purged checks, the newest file whose PREVIOUS_GTIDS the replica has), MariaDB GTID (check_slave_start_position,
gtid_find_binlog_file), each refusal with the server's text."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...binlog import boundary as B
from ...binlog import constants as C
from ...binlog.events import BinlogFormatError
from ...binlog.gtid import GtidSet, MariaBinlogState, MariaGtid, MariaGtidPosition
from ...relay import closed_files
from ...relay.catalog import CatalogError, FileInfo
from ...wire.packets import MySQLError
from ...wire.errors import (
    ER_MALFORMED_GTID_SET_ENCODING,
    ER_UNKNOWN_COM_ERROR,
    ER_UNKNOWN_ERROR,
    ER_WRONG_VALUE_FOR_VAR,
)
from .errors import (
    DumpFailure,
    MSG_GTID_MODE_OFF,
    MSG_IO,
    MSG_MARIA_BAD_STATE,
    MSG_MARIA_IMPOSSIBLE_POS,
    MSG_MARIA_NO_STATE,
    MSG_MORE_GTIDS,
    MSG_NO_FILE,
    MSG_OLD_BINLOG,
    MSG_POS_GT_SIZE,
    MSG_POS_LT_4,
    MSG_PURGED,
    maria_not_in_binlog,
)
from .files import GTID_TYPES, header_unpack_from, scan_file_gtids

if TYPE_CHECKING:
    from ..context import DownstreamContext


@dataclass(slots=True)
class MariaStart:
    """One domain of a MariaDB replica's requested position, with MariaDB's entry flags."""

    gtid: MariaGtid
    empty_domain: bool = False  # START_ON_EMPTY_DOMAIN: the relay has nothing in this domain (yet)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _contains_all_slave_gtid(state: dict[int, MariaStart], entries: list[MariaGtid]) -> bool:
    """MariaDB's contains_all_slave_gtid(): is every requested GTID in this file or a later one?

    ``entries`` is the file's GTID_LIST in order (each domain's most recent GTID last). A domain
    of the list the replica did not ask for means it needs that domain from its very start, in an
    earlier file; asking for a GTID the list has passed means an earlier file too, unless it is
    the domain's last GTID before this file (then this file is where the domain continues)."""
    for i, listed in enumerate(entries):
        start = state.get(listed.domain_id)
        if start is None:
            return False
        gtid = start.gtid
        if gtid.server_id == listed.server_id and gtid.seq_no <= listed.seq_no:
            if gtid.seq_no < listed.seq_no:
                return False
            if i + 1 < len(entries) and entries[i + 1].domain_id == listed.domain_id:
                return False
    return True


def _restrict(gtids: GtidSet, uuid: str) -> GtidSet:
    """The part of ``gtids`` with server UUID ``uuid`` (every tag)."""
    part = GtidSet()
    for sid, tag, start, end in gtids.intervals():
        if sid == uuid:
            part.add_interval(sid, start, end + 1, tag)
    return part


def _walk_head(path, size: int, limit: int = 1 << 20):
    """(type, offset, event size, head bytes) of the events in the first bytes of a relay file (at
    most ``size``, its durable length): the FDE and what follows it, for the start-file decisions."""
    with closed_files.open_stream(path) as f:  # any storage form
        head = f.read(min(size, limit))
    pos = 4
    while pos + C.HEADER_LEN <= len(head):
        _ts, type_code, _sid, event_size, _lp, _flags = header_unpack_from(head, pos)
        if event_size < C.HEADER_LEN:
            return
        yield type_code, pos, event_size, head
        pos += event_size


def _has_event_after_fde(path, size: int) -> bool:
    """Whether a complete event follows the FDE within the durable ``size`` bytes of a file."""
    try:
        for type_code, pos, event_size, _head in _walk_head(path, size):
            if type_code != C.FORMAT_DESCRIPTION_EVENT and pos + event_size <= size:
                return True
    except (OSError, closed_files.StoredFileError):
        return False
    return False


def _first_gtid(path, size: int):
    """The first GTID (boundary-parser form) in a MySQL relay file, None when the first group has
    none; read from the file's head (find_first_log_not_in_gtid_set reports it the same way)."""
    parser = B.TransactionBoundaryParser("mysql")
    try:
        for type_code, pos, event_size, head in _walk_head(path, size):
            if pos + event_size > min(size, len(head)):
                return None
            result = parser.feed_event(head, pos) & B.RESULT_MASK
            if type_code in GTID_TYPES:
                return parser.gtid
            if result != B.EVENT_OUTSIDE:
                return None
    except (OSError, BinlogFormatError, ValueError):
        return None
    return None


def user_var(user_vars: dict, *names: str):
    """The value of the first of `names` (e.g. MySQL's new name, then the old one) the replica set; None if none."""
    for name in names:
        if name in user_vars and user_vars[name] is not None:
            return user_vars[name]
    return None


def connect_state(user_vars: dict) -> str:
    """MariaDB's @slave_connect_state as text ("" when unset)."""
    return _text(user_var(user_vars, "slave_connect_state"))


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def int_variable(value, name: str = "") -> int:
    """A replica's user variable as an integer (0 when unset or not a number); a value no integer can hold
    (1e400, inf) is the replica's mistake: a clear error, not an internal one."""
    if value is None:
        return 0
    try:
        if isinstance(value, (int, float)):
            return int(value)
        return int(float(_text(value).strip()))
    except ValueError:
        return 0
    except OverflowError:
        shown = _text(value)[:40]
        raise MySQLError(
            ER_WRONG_VALUE_FOR_VAR, "42000", f"Variable '{name or 'value'}' can't be set to the value of '{shown}'"
        ) from None


def truthy(value) -> bool:
    """A replica's user variable as a switch: 1, ON, TRUE, YES (any case) or a true number."""
    if isinstance(value, str) or isinstance(value, (bytes, bytearray)):
        return _text(value).strip().upper() in ("1", "ON", "TRUE", "YES")
    return bool(value)


def checksum_alg(value) -> int:
    """@master_binlog_checksum as the server maps it (find_type over NONE/CRC32): unset or unknown is
    UNDEF, i.e. a replica that does not handle checksums."""
    if value is None:
        return C.CHECKSUM_UNDEF
    text = _text(value).strip().upper()
    if text == "CRC32":
        return C.CHECKSUM_CRC32
    if text == "NONE":
        return C.CHECKSUM_OFF
    return C.CHECKSUM_UNDEF



# ---------------------------------------------------------------------------------------------
# The plan: what the request asks, the pure decisions, the one driver that reads what they need
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartRequest:
    """What decides where a dump starts, read once from the request and the connection (sender.py)."""

    mode: str  # file, mysql-gtid, mariadb-gtid (a MariaDB GTID request to a MySQL-flavoured relay is file)
    kind: str  # the request's own kind, for the refusal of an unknown one
    flavour: str  # mysql or mariadb: whose rules and texts
    file: str = ""
    position: int = 4
    gtid_set: bytes | None = None  # COM_BINLOG_DUMP_GTID's encoded set
    connect_state: str = ""  # MariaDB's @slave_connect_state
    peer: bool = False  # @relayproxy_peer by file/position: the file is named in the master's names
    maria_ignore_duplicates: bool = False  # @slave_gtid_ignore_duplicates
    modern_terms: bool = False  # 8.0.26+ texts (source/replica)


@dataclass(frozen=True)
class StartPlan:
    """Where a dump starts and what it skips there: the sender streams from ``file`` at ``position``."""

    file: str
    position: int
    exclude: GtidSet | None = None  # MySQL GTID protocol: the replica's set (its groups are skipped)
    maria_state: tuple[MariaStart, ...] = ()  # MariaDB GTID: per domain, the GTID to reach before sending
    clear_created: bool = False  # m_gtid_clear_fd_created_flag: the replica keeps its temporary tables


def check_request(req: StartRequest) -> None:
    """Refusals that need nothing but the request."""
    if req.mode == "mysql-gtid" and req.flavour != "mysql":
        # MariaDB has no COM_BINLOG_DUMP_GTID: its dispatcher answers "Unknown command".
        raise DumpFailure("Unknown command", ER_UNKNOWN_COM_ERROR, sqlstate="08S01")
    if req.mode not in ("file", "mysql-gtid", "mariadb-gtid"):
        raise DumpFailure(f"unknown dump request kind {req.kind!r}", ER_UNKNOWN_ERROR)


def replica_gtids(encoded: bytes | None) -> GtidSet:
    """COM_BINLOG_DUMP_GTID's set, decoded (ER_MALFORMED_GTID_SET_ENCODING when it is not one)."""
    try:
        return GtidSet.decode(encoded)
    except (BinlogFormatError, ValueError, TypeError):
        raise DumpFailure("Malformed GTID set encoding.", ER_MALFORMED_GTID_SET_ENCODING) from None


def durable_names(names: list[str], horizon_file: str | None) -> list[str]:
    """Of the store's files, those a reader may open: up to and including the horizon's file."""
    if horizon_file in names:
        return names[: names.index(horizon_file) + 1]
    return names if horizon_file is None else []


def start_file(file: str, names: list[str]) -> str:
    """The file a file/position dump names (the oldest durable one when it names none); MSG_NO_FILE if absent."""
    name = file or (names[0] if names else "")
    if name not in names:
        raise DumpFailure(MSG_NO_FILE)
    return name


def check_position(flavour: str, file: str, name: str, pos: int, size: int) -> StartPlan:
    """check_start_file() (MySQL) / check_start_offset() (MariaDB): ``pos`` against the file's durable ``size``
    (bytes past the horizon do not exist yet), each with the server's own text."""
    if flavour == "mariadb":
        if pos < 4 or pos > size:
            raise DumpFailure(
                f"{MSG_MARIA_IMPOSSIBLE_POS}; the first event '{file}' at {pos}, the last event read from "
                f"'{file}' at 4, the last byte read from '{file}' at 4."
            )
        return StartPlan(name, pos)
    if pos < 4:
        raise DumpFailure(MSG_POS_LT_4)
    if pos > size:
        raise DumpFailure(MSG_POS_GT_SIZE)
    return StartPlan(name, pos)


def check_not_ahead(replica: GtidSet, relay_set: GtidSet, master_uuids: list[str], modern: bool) -> None:
    """The replica must not have more of the master's own GTIDs than the relay holds (ER 1885)."""
    for uuid in master_uuids:
        if not _restrict(replica, uuid).is_subset(relay_set):
            raise DumpFailure(MSG_MORE_GTIDS[modern])


def purge_gaps(infos: list[FileInfo], replica: GtidSet) -> list[tuple[str, GtidSet]]:
    """Per pair of files, the GTIDs the newer one's start names beyond the older one's that the replica lacks:
    the older file (named) must be scanned to tell whether it holds them, else they were purged. A caught-up
    replica gets none, a lagging one only the files it is about to be sent."""
    gaps = []
    for older, newer in zip(infos, infos[1:]):
        if not isinstance(older.start_gtids, GtidSet) or not isinstance(newer.start_gtids, GtidSet):
            continue
        gap = newer.start_gtids.subtract(older.start_gtids)
        gap.difference_update(replica)
        if gap:
            gaps.append((older.name, gap))
    return gaps


def missing_purged(infos: list[FileInfo], replica: GtidSet, gaps: list[tuple[str, GtidSet]],
                   held: Mapping[str, GtidSet]) -> GtidSet:
    """``catalog.purged() - replica``: purged = start(oldest) ∪ ⋃ (start(f_i+1) − start(f_i) − events(f_i))
    (FileCatalog.purged), from ``purge_gaps`` and ``held``, the events of the files it named."""
    oldest = infos[0].start_gtids
    missing = oldest.subtract(replica) if isinstance(oldest, GtidSet) else GtidSet()
    for name, gap in gaps:
        missing.update(gap.subtract(held[name]))
    return missing


def choose_mysql_file(infos: list[FileInfo], replica: GtidSet, modern: bool) -> FileInfo:
    """find_first_log_not_in_gtid_set(): newest to oldest, the first file whose PREVIOUS_GTIDS the replica has."""
    for info in reversed(infos):
        if not isinstance(info.start_gtids, GtidSet):
            raise DumpFailure(MSG_OLD_BINLOG)
        if info.start_gtids.is_subset(replica):
            return info
    oldest = infos[0].start_gtids
    missing = oldest.subtract(replica) if isinstance(oldest, GtidSet) else GtidSet()
    raise DumpFailure(MSG_PURGED[modern] % (replica.format(), missing.format()))


def maria_request(text: str) -> dict[int, MariaStart]:
    """@slave_connect_state, per domain (MSG_MARIA_BAD_STATE when it does not parse)."""
    try:
        position = MariaGtidPosition.parse(text)
    except (ValueError, TypeError):
        raise DumpFailure(MSG_MARIA_BAD_STATE, ER_UNKNOWN_ERROR) from None
    return {g.domain_id: MariaStart(g) for g in position}


def check_maria_state(state: dict[int, MariaStart], binlog: MariaBinlogState,
                      ignore_duplicates: bool) -> dict[int, MariaStart]:
    """check_slave_start_position(): each requested GTID must be in the binlog, or its domain empty here (checked
    again if the domain ever shows up); the state returned marks those domains."""
    checked = {}
    for domain, entry in state.items():
        gtid = entry.gtid
        checked[domain] = entry
        mine = binlog.get(gtid.domain_id, gtid.server_id)
        if mine is not None and mine.seq_no >= gtid.seq_no:
            continue
        latest = binlog.latest(gtid.domain_id)
        if latest is None:
            # Nothing in this domain: probably another master's domain.
            checked[domain] = MariaStart(gtid, empty_domain=True)
            continue
        if ignore_duplicates and latest.seq_no < gtid.seq_no:
            continue  # it may have come through another path of a multi-source topology
        raise maria_not_in_binlog(gtid, binlog)
    return checked


def choose_maria_file(state: dict[int, MariaStart], infos: list[FileInfo]) -> StartPlan:
    """gtid_find_binlog_file(): newest to oldest, the first file whose GTID_LIST the request is at or past; the
    dump starts at its position 4 (MSG_MARIA_NO_STATE when no file is)."""
    for info in reversed(infos):
        glev = info.start_gtids
        if glev is None:
            # A file from before GTIDs: start there, skip as usual.
            return StartPlan(info.name, 4, maria_state=tuple(state.values()))
        if not isinstance(glev, MariaBinlogState):
            continue
        entries = glev.gtids()
        if _contains_all_slave_gtid(state, entries):
            # Requesting the last GTID of a domain before this file means "start at this file" for that domain:
            # nothing to skip there.
            rest = dict(state)
            for entry_gtid in entries:
                start = rest.get(entry_gtid.domain_id)
                if start is not None and start.gtid == entry_gtid:
                    del rest[entry_gtid.domain_id]
            return StartPlan(info.name, 4, maria_state=tuple(rest.values()))
    raise DumpFailure(MSG_MARIA_NO_STATE)


def master_uuids(master_uuid: str | None, relay_set: GtidSet) -> list[str]:
    """Whose GTIDs the replica may not have more of than the relay (the MySQL master checks its own server UUID).
    The relay stands for its upstream master, so that is the upstream master's UUID; before the relay has talked
    to it (unknown), every UUID the relay files hold."""
    if master_uuid:
        return [str(master_uuid).strip().lower()]
    return relay_set.sids()


class StartReader:
    """What the decisions need read from the relay (files, sizes, headers, scans), and the driver over them.
    Everything it decides is decided by the pure functions above; it only reads, off the loop where it reads
    files."""

    def __init__(self, ctx: DownstreamContext):
        self.ctx = ctx

    async def plan(self, req: StartRequest) -> StartPlan:
        check_request(req)
        if req.mode == "mysql-gtid":
            replica = replica_gtids(req.gtid_set)
            if req.file:
                # Binlog_sender::check_start_file: a named file wins over the GTID search (and its checks); the
                # replica's GTIDs are still skipped.
                plan = self.file_position(req, req.file)
                return StartPlan(plan.file, plan.position, exclude=replica)
            return await self.mysql_gtid(req, replica)
        if req.mode == "mariadb-gtid":
            return await self.mariadb_gtid(req)
        if req.peer and req.file:
            # A peer relay asks in the master's names of the current epoch (sender.py, _peer_name).
            try:
                file = self.ctx.store.epochs.relay_name(req.file)
            except ValueError as exc:
                raise DumpFailure(f"relayproxy peer catch-up: {exc}") from None
            return self.file_position(req, file)
        return self.file_position(req, req.file)

    def durable_names(self) -> list[str]:
        return durable_names(self.ctx.store.files(), self.ctx.horizon.snapshot().file)

    def durable_size(self, name: str) -> int:
        snap = self.ctx.horizon.snapshot()
        if snap.file == name:
            return snap.position
        try:
            return closed_files.logical_size(self.ctx.store.path(name))
        except (OSError, KeyError, closed_files.StoredFileError):
            return 0

    def file_position(self, req: StartRequest, file: str) -> StartPlan:
        name = start_file(file, self.durable_names())
        return check_position(req.flavour, file, name, req.position, self.durable_size(name))

    def start_sets(self) -> list[FileInfo]:
        """Durable files with their starting GTID sets, oldest first. The horizon's file is left out while its
        PREVIOUS_GTIDS / GTID_LIST is not durable yet (right after a rotation): it is reached by following the
        rotation, and must not pass for a file without GTIDs."""
        catalog = self.ctx.catalog  # the shared one (thread-safe to get: this runs in a worker thread)
        try:
            infos = catalog.files()
        except CatalogError as exc:
            raise DumpFailure(f"{MSG_IO}: {exc}") from None
        if infos and infos[-1].start_gtids is None and infos[-1].name == self.ctx.horizon.snapshot().file:
            newest = infos[-1]
            if not _has_event_after_fde(self.ctx.store.path(newest.name), newest.size):
                catalog.forget(newest.name)  # its header is still being written: read it again next time
                infos = infos[:-1]
        return infos

    async def mysql_gtid(self, req: StartRequest, replica: GtidSet) -> StartPlan:
        """Binlog_sender::check_start_file() for COM_BINLOG_DUMP_GTID, in the server's order."""
        infos = await asyncio.to_thread(self.start_sets)  # reads file headers: off the loop
        if not infos:
            raise DumpFailure(MSG_NO_FILE)
        if all(info.start_gtids is None for info in infos):
            raise DumpFailure(MSG_GTID_MODE_OFF)  # no PREVIOUS_GTIDS anywhere: a pre-GTID master
        relay_set = self.ctx.horizon.snapshot().gtids
        if not isinstance(relay_set, GtidSet):
            relay_set = GtidSet()
        check_not_ahead(replica, relay_set, master_uuids(self.ctx.relay.master.master_uuid, relay_set),
                        req.modern_terms)
        # gtid_purged must be in the replica's set (the 5.6.22 fix, Bug #19012085), checked before looking for a
        # start file: an oldest file with an empty PREVIOUS_GTIDS would otherwise "match" any replica.
        gaps = purge_gaps(infos, replica)
        held = {name: await self.scan_gtids(name) for name, _gap in gaps}
        missing = missing_purged(infos, replica, gaps, held)
        if missing:
            raise DumpFailure(MSG_PURGED[req.modern_terms] % (replica.format(), missing.format()))
        chosen = choose_mysql_file(infos, replica, req.modern_terms)
        # Skipping at least the file's first transaction: clear "created" so the replica keeps its temporary
        # tables. From the file's start, as MySQL's Binlog_sender does (the groups the replica has are skipped,
        # with a heartbeat). The file index's sparse map could start later, but what a MySQL replica makes of an
        # auto-position stream that starts mid-file is not tested against a real one: not done.
        first = await asyncio.to_thread(_first_gtid, self.ctx.store.path(chosen.name), chosen.size)
        return StartPlan(chosen.name, 4, exclude=replica, clear_created=first is not None and first in replica)

    async def scan_gtids(self, name: str) -> GtidSet:
        """The GTIDs one file holds (its events), read off the loop."""
        try:
            return await asyncio.to_thread(scan_file_gtids, os.fspath(self.ctx.store.path(name)))
        except OSError as exc:
            raise DumpFailure(f"{MSG_IO}: {name}: {exc.strerror}") from None
        except closed_files.StoredFileError as exc:
            raise DumpFailure(f"{MSG_IO}: {exc}") from None

    async def mariadb_gtid(self, req: StartRequest) -> StartPlan:
        """init_binlog_sender() with @slave_connect_state: check_slave_start_position(), then
        gtid_find_binlog_file(); the dump starts at position 4 of the file found."""
        binlog = self.ctx.horizon.snapshot().gtids
        if not isinstance(binlog, MariaBinlogState):
            binlog = MariaBinlogState()
        state = check_maria_state(maria_request(req.connect_state), binlog, req.maria_ignore_duplicates)
        return choose_maria_file(state, await asyncio.to_thread(self.start_sets))
