"""Where a dump starts (the preamble): file/position checks, MySQL GTID auto-position (replica-ahead and
purged checks, the newest file whose PREVIOUS_GTIDS the replica has), MariaDB GTID (check_slave_start_position,
gtid_find_binlog_file), each refusal with the server's text."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

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



class DumpStart:
    """Where a dump starts: file/position checks, MySQL GTID auto-position, MariaDB GTID (the servers' own refusals).

    The first half of a dump sender (``sender.DumpSender`` streams from what ``_plan`` returns); it reads the
    request, the context and the per-connection settings the sender's constructor sets.
    """

    # -- where to start ----------------------------------------------------------------------------
    async def _plan(self) -> tuple[str, int]:
        if self.mode == "mysql-gtid":
            if self.flavour != "mysql":
                # MariaDB has no COM_BINLOG_DUMP_GTID: its dispatcher answers "Unknown command".
                raise DumpFailure("Unknown command", ER_UNKNOWN_COM_ERROR, sqlstate="08S01")
            try:
                replica = GtidSet.decode(self.request.gtid_set)
            except (BinlogFormatError, ValueError, TypeError):
                raise DumpFailure("Malformed GTID set encoding.", ER_MALFORMED_GTID_SET_ENCODING) from None
            self.exclude = replica
            if self.request.file:
                # Binlog_sender::check_start_file: a named file wins over the GTID search (and its
                # checks); the replica's GTIDs are still skipped.
                return self._check_file_position(self.request.file, self.request.position)
            return await self._plan_mysql_gtid(replica)
        if self.mode == "mariadb-gtid":
            return await self._plan_mariadb_gtid()
        if self.mode != "file":
            raise DumpFailure(f"unknown dump request kind {self.request.kind!r}", ER_UNKNOWN_ERROR)
        if getattr(self, "peer", False) and self.request.file:
            # A peer relay asks in the master's names of the current epoch (sender.py, _peer_start).
            return self._check_file_position(self._peer_start(self.request.file), self.request.position)
        return self._check_file_position(self.request.file, self.request.position)

    def _durable_names(self) -> list[str]:
        """Relay files a reader may open: up to and including the horizon's file."""
        names = self.ctx.store.files()
        horizon_file = self.ctx.horizon.snapshot().file
        if horizon_file in names:
            return names[: names.index(horizon_file) + 1]
        return names if horizon_file is None else []

    def _durable_size(self, name: str) -> int:
        snap = self.ctx.horizon.snapshot()
        if snap.file == name:
            return snap.position
        try:
            return closed_files.logical_size(self.ctx.store.path(name))
        except (OSError, KeyError, closed_files.StoredFileError):
            return 0

    def _check_file_position(self, file: str, pos: int) -> tuple[str, int]:
        """check_start_file() (MySQL) / init_binlog_sender + check_start_offset() (MariaDB)."""
        names = self._durable_names()
        name = file or (names[0] if names else "")
        if name not in names:
            raise DumpFailure(MSG_NO_FILE)
        if self.flavour == "mariadb":
            if pos < 4 or pos > self._durable_size(name):
                raise DumpFailure(
                    f"{MSG_MARIA_IMPOSSIBLE_POS}; the first event '{file}' at {pos}, the last event read from "
                    f"'{file}' at 4, the last byte read from '{file}' at 4."
                )
            return name, pos
        if pos < 4:
            raise DumpFailure(MSG_POS_LT_4)
        if pos > self._durable_size(name):
            # The size a reader may use is the durable one: bytes past the horizon do not exist yet.
            raise DumpFailure(MSG_POS_GT_SIZE)
        return name, pos

    def _start_sets(self) -> list[FileInfo]:
        """Durable files with their starting GTID sets, oldest first. The horizon's file is left out
        while its PREVIOUS_GTIDS / GTID_LIST is not durable yet (right after a rotation): it is
        reached by following the rotation, and must not pass for a file without GTIDs."""
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

    async def _plan_mysql_gtid(self, replica: GtidSet) -> tuple[str, int]:
        """Binlog_sender::check_start_file() for COM_BINLOG_DUMP_GTID, in the server's order."""
        infos = await asyncio.to_thread(self._start_sets)  # reads file headers: off the loop
        if not infos:
            raise DumpFailure(MSG_NO_FILE)
        if all(info.start_gtids is None for info in infos):
            raise DumpFailure(MSG_GTID_MODE_OFF)  # no PREVIOUS_GTIDS anywhere: a pre-GTID master
        # 1. The replica must not have more of the master's own GTIDs than the master (ER 1885).
        relay_set = self.ctx.horizon.snapshot().gtids
        if not isinstance(relay_set, GtidSet):
            relay_set = GtidSet()
        for uuid in self._master_uuids(relay_set):
            if not _restrict(replica, uuid).is_subset(relay_set):
                raise DumpFailure(MSG_MORE_GTIDS[self.modern_terms])
        # 2. gtid_purged must be in the replica's set (the 5.6.22 fix, Bug #19012085), checked
        # before looking for a start file: an oldest file with an empty PREVIOUS_GTIDS would
        # otherwise "match" any replica.
        missing = await self._missing_purged(infos, replica)
        if missing:
            raise DumpFailure(MSG_PURGED[self.modern_terms] % (replica.format(), missing.format()))
        # 3. find_first_log_not_in_gtid_set(): newest to oldest, the first file whose
        # PREVIOUS_GTIDS the replica has.
        chosen = None
        for info in reversed(infos):
            if not isinstance(info.start_gtids, GtidSet):
                raise DumpFailure(MSG_OLD_BINLOG)
            if info.start_gtids.is_subset(replica):
                chosen = info
                break
        if chosen is None:
            missing = infos[0].start_gtids.subtract(replica)
            raise DumpFailure(MSG_PURGED[self.modern_terms] % (replica.format(), missing.format()))
        # Skipping at least the file's first transaction: clear "created" so the replica keeps its
        # temporary tables (m_gtid_clear_fd_created_flag).
        first = await asyncio.to_thread(_first_gtid, self.ctx.store.path(chosen.name), chosen.size)
        self.clear_created = first is not None and first in replica
        # From the file's start, as MySQL's Binlog_sender does (the groups the replica has are skipped, with a
        # heartbeat). The file index's sparse map could start later, but what a MySQL replica makes of an
        # auto-position stream that starts mid-file is not tested against a real one: not done.
        return chosen.name, 4

    def _master_uuids(self, relay_set: GtidSet) -> list[str]:
        """Whose GTIDs the replica may not have more of than the relay (the MySQL master checks its own
        server UUID). The relay stands for its upstream master, so that is the upstream master's UUID;
        before the relay has talked to it (status unknown), every UUID the relay files hold."""
        uuid = self.ctx.relay.master.master_uuid
        if uuid:
            return [str(uuid).strip().lower()]
        return relay_set.sids()

    async def _missing_purged(self, infos: list[FileInfo], replica: GtidSet) -> GtidSet:
        """``catalog.purged() - replica``, computed lazily.

        purged = start(oldest) ∪ ⋃ (start(f_i+1) − start(f_i) − events(f_i)) (see FileCatalog.purged).
        Subtracting the replica's set first, a pair of files needs its older file scanned only when
        the newer file names GTIDs the replica lacks: a caught-up replica costs no scan at all, a
        lagging one scans only the files it is about to be sent.
        """
        oldest = infos[0].start_gtids
        missing = oldest.subtract(replica) if isinstance(oldest, GtidSet) else GtidSet()
        for older, newer in zip(infos, infos[1:]):
            if not isinstance(older.start_gtids, GtidSet) or not isinstance(newer.start_gtids, GtidSet):
                continue
            gap = newer.start_gtids.subtract(older.start_gtids)
            gap.difference_update(replica)
            if not gap:
                continue
            path = os.fspath(self.ctx.store.path(older.name))
            try:
                held = await asyncio.to_thread(scan_file_gtids, path)
            except OSError as exc:
                raise DumpFailure(f"{MSG_IO}: {older.name}: {exc.strerror}") from None
            except closed_files.StoredFileError as exc:
                raise DumpFailure(f"{MSG_IO}: {exc}") from None
            gap.difference_update(held)
            missing.update(gap)
        return missing

    async def _plan_mariadb_gtid(self) -> tuple[str, int]:
        """init_binlog_sender() with @slave_connect_state: check_slave_start_position(), then
        gtid_find_binlog_file(); the dump starts at position 4 of the file found."""
        text = user_var(self.conn.user_vars, "slave_connect_state")
        try:
            position = MariaGtidPosition.parse(_text(text))
        except (ValueError, TypeError):
            raise DumpFailure(MSG_MARIA_BAD_STATE, ER_UNKNOWN_ERROR) from None
        state = {g.domain_id: MariaStart(g) for g in position}
        binlog = self.ctx.horizon.snapshot().gtids
        if not isinstance(binlog, MariaBinlogState):
            binlog = MariaBinlogState()
        for entry in state.values():
            gtid = entry.gtid
            mine = binlog.get(gtid.domain_id, gtid.server_id)
            if mine is not None and mine.seq_no >= gtid.seq_no:
                continue
            latest = binlog.latest(gtid.domain_id)
            if latest is None:
                # Nothing in this domain: probably another master's domain. Checked again if the
                # domain ever shows up in the stream.
                entry.empty_domain = True
                continue
            if self.maria_ignore_duplicates and latest.seq_no < gtid.seq_no:
                continue  # it may have come through another path of a multi-source topology
            raise self._maria_not_in_binlog(gtid, binlog)
        infos = await asyncio.to_thread(self._start_sets)
        for info in reversed(infos):
            glev = info.start_gtids
            if glev is None:
                self.maria_state = state  # a file from before GTIDs: start there, skip as usual
                return info.name, 4
            if not isinstance(glev, MariaBinlogState):
                continue
            entries = glev.gtids()
            if _contains_all_slave_gtid(state, entries):
                # Requesting the last GTID of a domain before this file means "start at this file"
                # for that domain: nothing to skip there.
                for entry_gtid in entries:
                    start = state.get(entry_gtid.domain_id)
                    if start is not None and start.gtid == entry_gtid:
                        del state[entry_gtid.domain_id]
                self.maria_state = state
                return info.name, 4
        raise DumpFailure(MSG_MARIA_NO_STATE)

    _maria_not_in_binlog = staticmethod(maria_not_in_binlog)
