"""The relay store's switch of upstream epochs (``relay/epochs.py``): ``begin_epoch``, the ROTATE that joins an
epoch's last file to the next epoch's first, the join file's start set, and the fillers over a stretch a GTID dump
skipped.

After a failover the session calls ``store.begin_epoch(master, upstream_first_file, relay_server_id=...)`` before
it streams from the new master. The relay's files stay one monotonic sequence: ``start_file`` takes the master's
file name and creates the relay name it maps to in the current epoch (epoch 1, and every relay without
``relayproxy.epochs``, maps names identically), ``current_upstream_file`` / ``upstream_position()`` give the
master's coordinates. The switch is crash safe: the epochs record is its commit point; the ROTATE the relay then
appends to its last file (to the new epoch's first file) is re-appended, byte-identical, by ``begin_epoch`` or
``start_file`` when a crash cut it. ``write_filler`` covers the stretch a GTID dump skipped with IGNORABLE events
of the relay's own (never inside a group); the first file of an epoch may start with a GTID set that lacks part of
the relay's (``join_gtids ∪ its set`` is the set at its start).

Same history, same bytes (design invariant 11): what the relay writes itself (the epoch ROTATE, ``join_rotate``;
fillers; the join file's FORMAT_DESCRIPTION, ``join_fde``) depends only on the files and the stream, never on the
relay's server_id, its clock or when it connected, so two relays that followed the same masters hold
byte-identical files.
"""

from __future__ import annotations

import os
import time

from ..binlog import constants as C
from ..binlog import encoders as _enc
from ..binlog.events import FormatDescription
from .durable import write_epochs
from .epochs import (
    EPOCHS_NAME,
    Epoch,
    Epochs,
    EpochsError,
    gtid_missing,
    gtid_text,
    gtid_union,
    normalise_master,
    parse_gtid_text,
)
from .errors import RelayGapError, RelayMismatchError, RelayStateError
from .layout import check_file_name
from .recovery import read_final_rotate

__all__ = ["EpochSwitch", "join_rotate", "join_fde", "FILLER_MAX_SIZE", "SPARSE_FILLER_BYTES"]

SPARSE_FILLER_BYTES = 1 << 20  # a filler at least this large is written sparse (header + CRC, a hole between)
FILLER_MAX_SIZE = _enc.FILLER_MAX_SIZE  # a larger gap is covered by several fillers
_U32 = 0xFFFFFFFF


def join_rotate(first_file: str, fde: FormatDescription, end: int, *, checksum: bool) -> bytes:
    """The ROTATE a relay appends at ``end`` of its last file of an epoch, naming the next epoch's first file.

    Every field is a function of the history the relays share (design invariant 11): the name, the offset, and
    the file's own FORMAT_DESCRIPTION. server_id is that FDE's (the master that wrote the file), so the file ends
    as if its master had rotated it: never the relay's own id, which a replica of the relay could share, and
    which would make the replica's IO thread treat the ROTATE as its own event (skipped from its relay log
    unless ``replicate_same_server_id``); a replica with the old master's id would be that master itself, which
    skips the old master's events anyway. timestamp 0, as the servers stamp the events they make up (fake
    ROTATE, heartbeats): a replica's SQL thread does not take a 0 timestamp into Seconds_Behind_Master, and no
    clock or crash timing can change it, so the ROTATE re-appended after a crash is byte-identical.
    """
    size = C.HEADER_LEN + 8 + len(first_file.encode("utf-8", "surrogateescape")) + (C.CHECKSUM_LEN if checksum else 0)
    return _enc.rotate(first_file, 4, server_id=fde.server_id, checksum=checksum, timestamp=0,
                       log_pos=(end + size) & _U32)


def join_fde(event) -> bytes:
    """The FORMAT_DESCRIPTION a relay stores at the head of an epoch's join file: the new master's, with
    create_timestamp 0 and the in-use flag clear (CRC recomputed).

    How the master sends that FDE depends on how the relay asked, not on the history: MariaDB's GTID dump
    zeroes ``created`` only while the requested position is not reached at the file's start, a dump by
    position from offset 4 sends it as written (non-zero in the first binlog after the server started). The
    relay stores the one form, so relays that agree on the history hold the same bytes (design invariant 11).
    ``created = 0`` is also what a replica of the relay should see there: it tells a replica that the master
    restarted and its temporary tables are gone, which a switch of masters is not a reason to do.
    """
    return _enc.fde_copy(event, clear_in_use=True, created=0)


class EpochSwitch:
    """The store's switch of epochs and its fillers, mixed into ``RelayStore`` (relay/store.py), whose state it
    reads and moves: the epochs (``_epochs``), the index and the current file (``_index``, ``_file``, ``_fd``,
    ``_end``, ``_boundary``, ``_written``, ``_buf``), the file's FORMAT_DESCRIPTION and GTID state (``_fde``,
    ``_checksum_len``, ``_last_type``, ``_gtids``, ``_file_start_gtids``, ``_start_set_seen``) and what it
    reports (``fillers``, ``warnings``, ``join_extra_gtids``); it calls the store's ``_check``, ``_settle``,
    ``_sync``, ``_flush``, ``_fail``, ``write_event`` and ``boundary_outside``.
    """

    @property
    def epoch_switch_pending(self) -> bool:
        """The current epoch (>= 2) is recorded but its first relay file holds no events yet."""
        cur = self._epochs.current
        if cur.implicit or cur.epoch < 2:
            return False
        return cur.first_file not in self._index or (cur.first_file == self._file and self._end <= 4)

    def _epoch_unused(self) -> bool:
        """The current recorded epoch holds no data yet (its record may still be changed)."""
        cur = self._epochs.current
        if cur.implicit:
            return False
        if cur.epoch == 1:
            return not self._index
        return self.epoch_switch_pending

    def begin_epoch(self, master: dict, upstream_first_file: str, *, relay_server_id: int,
                    now: float | None = None) -> Epoch:
        """Begin a new upstream epoch: the session streams next from ``master`` (host, port, server_id,
        server_uuid), starting with its binlog file ``upstream_first_file``.

        Steps: the current file is made durable; the new epoch is recorded in ``relayproxy.epochs``
        (first relay file = the relay's next sequence number, join set = the durable GTID set): that
        record is the commit point; then a ROTATE to ``(first file, 4)`` made by the relay
        (``join_rotate``: timestamp 0, the server_id of the file's FORMAT_DESCRIPTION, CRC32 when the
        file has checksums) is appended to the current file, made durable, and the horizon moves past
        it, so file/position replicas of the relay follow it into the new file. The receiver's next
        ``start_file(F)`` creates that file. ``relay_server_id`` and ``now`` go into the record only
        (who switched, and when): no byte of a relay file depends on them.

        Idempotent: called again for the same master it completes a switch a crash cut (the ROTATE is
        re-appended byte for byte from the record) and returns the current epoch. While the current
        epoch holds no data its record is replaced (another master, or another first file) instead
        of adding an epoch. A relay without files records epoch 1 (identity names), no ROTATE. A
        newest file holding only the magic becomes the new epoch's first file (the ROTATE before it
        already names it). Requires no open group (call ``discard_incomplete`` first).
        """
        self._check()
        self._settle()
        try:
            master = normalise_master(master)
            check_file_name(upstream_first_file)
        except ValueError as exc:
            raise RelayStateError(f"begin_epoch: {exc}") from None
        if type(relay_server_id) is not int or not 0 <= relay_server_id <= _U32:
            raise RelayStateError(f"begin_epoch: relay_server_id {relay_server_id!r} is not a server id")
        if self._file is not None and self._end != self._boundary:
            raise RelayStateError(
                f"begin_epoch while a group is open in {self._file} ({self._end - self._boundary} bytes after "
                f"offset {self._boundary}): call discard_incomplete() first"
            )
        if self._fd >= 0:
            self._sync()  # the join set is the durable one, and nothing unsynced precedes the ROTATE
        started = time.time() if now is None else float(now)
        cur = self._epochs.current
        try:
            if not cur.implicit and cur.same_master(master):
                planned = self._epochs
                if self._epoch_unused() and cur.upstream_first_file != upstream_first_file:
                    planned = self._reanchored(upstream_first_file)
            elif self._epoch_unused():
                join = gtid_text(self.horizon.snapshot().gtids)
                changes = {"master": master, "upstream_first_file": upstream_first_file, "join_gtids": join,
                           "started": started, "relay_server_id": relay_server_id}
                if cur.epoch == 1:
                    changes["first_file"] = upstream_first_file
                planned = self._epochs.replaced_current(**changes)
            else:
                planned = self._epochs.next_epoch(
                    index=self._index, current_empty=self._file is not None and self._end <= 4, master=master,
                    upstream_first_file=upstream_first_file, join_gtids=gtid_text(self.horizon.snapshot().gtids),
                    started=started, relay_server_id=relay_server_id,
                )
        except EpochsError as exc:
            raise RelayStateError(f"begin_epoch: {exc}") from None
        if planned != self._epochs:
            self._record_epochs(planned)  # the commit point of the switch
        if self.epoch_switch_pending:
            self._complete_epoch_switch()
        return self._epochs.current

    def _reanchored(self, upstream_first_file: str) -> Epochs:
        cur = self._epochs.current
        changes = {"upstream_first_file": upstream_first_file}
        if cur.epoch == 1:
            changes["first_file"] = upstream_first_file
        return self._epochs.replaced_current(**changes)

    def _reanchor_epoch(self, upstream_first_file: str) -> None:
        try:
            planned = self._reanchored(upstream_first_file)
        except EpochsError as exc:
            raise RelayStateError(f"cannot start {upstream_first_file!r}: {exc}") from None
        self._record_epochs(planned)

    def _record_epochs(self, planned: Epochs) -> None:
        try:
            write_epochs(self.relay_dir, planned)
        except OSError as exc:
            self._fail(exc, self.relay_dir / EPOCHS_NAME)
            raise
        self._epochs = planned

    def _complete_epoch_switch(self) -> None:
        """Append (unless the current file already ends with it) the ROTATE to the pending epoch's first
        file, make it durable and move the horizon past it."""
        cur = self._epochs.current
        if self._file is None or cur.first_file == self._file:
            return  # no earlier file, or the epoch reuses the empty newest file its predecessor's ROTATE names
        if self._end != self._boundary:
            raise RelayStateError(f"cannot end {self._file} with the epoch's ROTATE: a group is open")
        if not self._ends_with_rotate_to(cur.first_file):
            self._append_join_rotate(cur)
        self._sync()

    def _ends_with_rotate_to(self, name: str) -> bool:
        if self._last_type != C.ROTATE_EVENT:
            return False
        try:
            self._flush()
        except OSError as exc:
            self._fail(exc)
            raise
        rotate = read_final_rotate(self.relay_dir / self._file)
        return rotate is not None and rotate[1] == 4 and name in self._epochs.rotate_targets(self._file, rotate[0])

    def _append_join_rotate(self, epoch: Epoch) -> None:
        if self._fde is None:
            raise RelayStateError(
                f"{self._file} has no FORMAT_DESCRIPTION_EVENT: it cannot end with the ROTATE to {epoch.first_file}"
            )
        end = self._end
        event = join_rotate(epoch.first_file, self._fde, end, checksum=self._checksum_len == C.CHECKSUM_LEN)
        self.write_event(end, event)
        self.boundary_outside(end + len(event))

    def write_filler(self, offset: int, *, relay_server_id: int | None = None) -> int:
        """Cover ``[current_end, offset)`` with the relay's filler events (a GTID dump skipped groups the
        relay has); returns how many (one, unless the gap exceeds ``FILLER_MAX_SIZE``).

        Only at a boundary (no open group). Each filler is IGNORABLE_LOG_EVENT with
        LOG_EVENT_IGNORABLE_F, timestamp 0, the server_id of the file's FORMAT_DESCRIPTION (the master
        that wrote the file), log_pos its end, a zero body and a CRC32 when the file has checksums; large
        ones are written sparse. Nothing in them depends on the relay (``relay_server_id`` is accepted and
        ignored): relays that skipped the same stretch write the same bytes. They end outside any group:
        the horizon may move past them. Raises RelayGapError when the gap is smaller than an event.
        """
        self._check()
        self._settle()  # a large filler truncates (extends) the file
        if self._fd < 0:
            raise RelayStateError("write_filler before start_file: there is no current relay file")
        end = self._end
        if offset <= end:
            raise RelayStateError(f"write_filler to {offset}: {self._file} already holds {end} bytes")
        if end != self._boundary:
            raise RelayStateError(
                f"write_filler while a group is open in {self._file} (after offset {self._boundary}): "
                "a filler never sits inside a group"
            )
        if self._fde is None:
            raise RelayStateError(f"write_filler in {self._file} before its FORMAT_DESCRIPTION_EVENT")
        checksum = self._checksum_len == C.CHECKSUM_LEN
        server_id = self._fde.server_id
        try:
            sizes = _enc.filler_sizes(offset - end, checksum, FILLER_MAX_SIZE)
        except ValueError:
            raise RelayGapError(offset, end, self._file) from None
        at = end
        try:
            for size in sizes:
                stop = at + size
                if size < SPARSE_FILLER_BYTES:
                    self.write_event(at, _enc.filler(size, log_pos=stop & _U32, server_id=server_id,
                                                     checksum=checksum))
                else:
                    self._write_sparse_filler(at, size, server_id, checksum)
                at = stop
        except OSError as exc:
            self._fail(exc)
            raise
        self._last_type = C.IGNORABLE_LOG_EVENT
        self.fillers += len(sizes)
        self.boundary_outside(offset)
        return len(sizes)

    def _write_sparse_filler(self, at: int, size: int, server_id: int, checksum: bool) -> None:
        self._flush()
        fd = self._fd
        stop = at + size
        header = _enc.filler_header(size, log_pos=stop & _U32, server_id=server_id)
        os.ftruncate(fd, at)  # nothing stale in the hole: it reads as zeros
        os.pwrite(fd, header, at)
        if checksum:
            os.pwrite(fd, _enc.filler_crc(header, size).to_bytes(4, "little"), stop - C.CHECKSUM_LEN)
            self.bytes_written += len(header) + C.CHECKSUM_LEN
        else:
            os.ftruncate(fd, stop)
            self.bytes_written += len(header)
        self._written = self._end = stop

    def _join_start_set(self, gtids, epoch: Epoch, offset: int, size: int, type_code: int) -> None:
        """The first file of an epoch starts with its new master's set, which may be a strict subset of
        the relay's (that file began before the join point; fillers cover the groups the relay had):
        the set at its start is ``join_gtids ∪ its set``. A set naming GTIDs the relay never had (the
        new master had them before this file: errant or other-domain transactions) is recorded, not
        refused: they count as purged (FileCatalog.purged), the relay cannot serve them."""
        join = parse_gtid_text(epoch.join_gtids)
        try:
            effective = gtid_union(join, gtids)
            extra = gtid_missing(gtids, join) if join is not None else None
        except ValueError as exc:
            raise RelayMismatchError(offset, size, self._file, f"its {C.event_name(type_code)} set: {exc}") from None
        if extra is not None:
            self.join_extra_gtids = extra
            self.warnings.append(
                f"{self._file} (epoch {epoch.epoch}) starts with {C.event_name(type_code)} {gtid_text(gtids)}, "
                f"which names {gtid_text(extra)} that the relay never had: counted as purged"
            )
        self._gtids = effective
        self._file_start_gtids = gtids.copy()
        self._start_set_seen = True
