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
from typing import TYPE_CHECKING, Callable

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
from .write_state import Gtids, WriteState

if TYPE_CHECKING:
    from .horizon import Horizon
    from .sync import SyncPipeline

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
    """The store's switch of epochs and its fillers, an object ``RelayStore`` (relay/store.py) holds: it owns the
    epochs value (``epochs``) and what it reports (``fillers``, ``warnings``, ``join_extra_gtids``).

    It reads and moves the store's write state (``WriteState``, relay/write_state.py), reads the store's file
    list (``index``: the store's own list, changed in place) and the ``horizon``, makes the current file durable
    through the store's sync pipeline (``pipeline``) and appends through the store's ``write_event`` and
    ``boundary_outside``.
    """

    def __init__(self, state: WriteState, pipeline: SyncPipeline, horizon: Horizon, index: list[str],
                 epochs: Epochs, *, write_event: Callable[[int, bytes], str],
                 boundary_outside: Callable[[int], None], warnings: list[str], join_extra_gtids: Gtids | None):
        self._w = state
        self._pipeline = pipeline
        self._horizon = horizon
        self._index = index
        self.epochs = epochs
        self._write_event = write_event
        self._boundary_outside = boundary_outside
        self.warnings = warnings  # things recorded, not refused (see begin_epoch)
        self.join_extra_gtids = join_extra_gtids  # GTIDs a join file's start set names beyond the relay's
        self.fillers = 0  # filler events written

    @property
    def pending(self) -> bool:
        """The current epoch (>= 2) is recorded but its first relay file holds no events yet."""
        cur = self.epochs.current
        if cur.implicit or cur.epoch < 2:
            return False
        w = self._w
        return cur.first_file not in self._index or (cur.first_file == w.file and w.end <= 4)

    def epoch_unused(self) -> bool:
        """The current recorded epoch holds no data yet (its record may still be changed)."""
        cur = self.epochs.current
        if cur.implicit:
            return False
        if cur.epoch == 1:
            return not self._index
        return self.pending

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
        w = self._w
        w.check()
        self._pipeline.settle()
        try:
            master = normalise_master(master)
            check_file_name(upstream_first_file)
        except ValueError as exc:
            raise RelayStateError(f"begin_epoch: {exc}") from None
        if type(relay_server_id) is not int or not 0 <= relay_server_id <= _U32:
            raise RelayStateError(f"begin_epoch: relay_server_id {relay_server_id!r} is not a server id")
        if w.file is not None and w.end != w.boundary:
            raise RelayStateError(
                f"begin_epoch while a group is open in {w.file} ({w.end - w.boundary} bytes after "
                f"offset {w.boundary}): call discard_incomplete() first"
            )
        if w.fd >= 0:
            self._pipeline.sync_now()  # the join set is the durable one, and nothing unsynced precedes the ROTATE
        started = time.time() if now is None else float(now)
        try:
            planned = self._planned(master, upstream_first_file, started, relay_server_id)
        except EpochsError as exc:
            raise RelayStateError(f"begin_epoch: {exc}") from None
        if planned != self.epochs:
            self.record(planned)  # the commit point of the switch
        if self.pending:
            self.complete_pending_switch()
        return self.epochs.current

    def _planned(self, master: dict, upstream_first_file: str, started: float, relay_server_id: int) -> Epochs:
        """The epochs record ``begin_epoch`` leaves (the current one when nothing changes)."""
        cur = self.epochs.current
        if not cur.implicit and cur.same_master(master):
            if self.epoch_unused() and cur.upstream_first_file != upstream_first_file:
                return self._reanchored(upstream_first_file)
            return self.epochs
        join = gtid_text(self._horizon.snapshot().gtids)
        if self.epoch_unused():
            changes: dict[str, object] = {"master": master, "upstream_first_file": upstream_first_file,
                                          "join_gtids": join, "started": started, "relay_server_id": relay_server_id}
            if cur.epoch == 1:
                changes["first_file"] = upstream_first_file
            return self.epochs.replaced_current(**changes)
        w = self._w
        return self.epochs.next_epoch(
            index=self._index, current_empty=w.file is not None and w.end <= 4, master=master,
            upstream_first_file=upstream_first_file, join_gtids=join, started=started,
            relay_server_id=relay_server_id,
        )

    def _reanchored(self, upstream_first_file: str) -> Epochs:
        cur = self.epochs.current
        changes = {"upstream_first_file": upstream_first_file}
        if cur.epoch == 1:
            changes["first_file"] = upstream_first_file
        return self.epochs.replaced_current(**changes)

    def reanchor(self, upstream_first_file: str) -> None:
        """The master began the unused current epoch at ``upstream_first_file``: its record follows."""
        try:
            planned = self._reanchored(upstream_first_file)
        except EpochsError as exc:
            raise RelayStateError(f"cannot start {upstream_first_file!r}: {exc}") from None
        self.record(planned)

    def record(self, planned: Epochs) -> None:
        """Write ``planned`` as the directory's epochs record (durable) and take it as the current value."""
        relay_dir = self._w.relay_dir
        try:
            write_epochs(relay_dir, planned)
        except OSError as exc:
            self._w.fail(exc, relay_dir / EPOCHS_NAME)
            raise
        self.epochs = planned

    def complete_pending_switch(self) -> None:
        """Append (unless the current file already ends with it) the ROTATE to the pending epoch's first
        file, make it durable and move the horizon past it."""
        w = self._w
        cur = self.epochs.current
        first = cur.first_file
        if w.file is None or first is None or first == w.file:
            return  # no earlier file, or the epoch reuses the empty newest file its predecessor's ROTATE names
        if w.end != w.boundary:
            raise RelayStateError(f"cannot end {w.file} with the epoch's ROTATE: a group is open")
        if not self._ends_with_rotate_to(w.file, first):
            self.append_join_rotate(cur)
        self._pipeline.sync_now()

    def _ends_with_rotate_to(self, file: str, name: str) -> bool:
        w = self._w
        if w.last_type != C.ROTATE_EVENT:
            return False
        try:
            w.flush()
        except OSError as exc:
            w.fail(exc)
            raise
        rotate = read_final_rotate(w.relay_dir / file)
        return rotate is not None and rotate[1] == 4 and name in self.epochs.rotate_targets(file, rotate[0])

    def append_join_rotate(self, epoch: Epoch) -> None:
        """Append the ROTATE to ``epoch``'s first file at the current end (``join_rotate``)."""
        w = self._w
        first = epoch.first_file
        if first is None:
            raise RelayStateError(f"epoch {epoch.epoch} names no first relay file: no ROTATE to it")
        if w.fde is None:
            raise RelayStateError(
                f"{w.file} has no FORMAT_DESCRIPTION_EVENT: it cannot end with the ROTATE to {first}"
            )
        end = w.end
        event = join_rotate(first, w.fde, end, checksum=w.checksum_len == C.CHECKSUM_LEN)
        self._write_event(end, event)
        self._boundary_outside(end + len(event))

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
        w = self._w
        w.check()
        self._pipeline.settle()  # a large filler truncates (extends) the file
        if w.fd < 0 or w.file is None:
            raise RelayStateError("write_filler before start_file: there is no current relay file")
        end = w.end
        if offset <= end:
            raise RelayStateError(f"write_filler to {offset}: {w.file} already holds {end} bytes")
        if end != w.boundary:
            raise RelayStateError(
                f"write_filler while a group is open in {w.file} (after offset {w.boundary}): "
                "a filler never sits inside a group"
            )
        if w.fde is None:
            raise RelayStateError(f"write_filler in {w.file} before its FORMAT_DESCRIPTION_EVENT")
        checksum = w.checksum_len == C.CHECKSUM_LEN
        server_id = w.fde.server_id
        try:
            sizes = _enc.filler_sizes(offset - end, checksum, FILLER_MAX_SIZE)
        except ValueError:
            raise RelayGapError(offset, end, w.file) from None
        at = end
        try:
            for size in sizes:
                stop = at + size
                if size < SPARSE_FILLER_BYTES:
                    self._write_event(at, _enc.filler(size, log_pos=stop & _U32, server_id=server_id,
                                                      checksum=checksum))
                else:
                    self._write_sparse_filler(at, size, server_id, checksum)
                at = stop
        except OSError as exc:
            w.fail(exc)
            raise
        w.last_type = C.IGNORABLE_LOG_EVENT
        self.fillers += len(sizes)
        self._boundary_outside(offset)
        return len(sizes)

    def _write_sparse_filler(self, at: int, size: int, server_id: int, checksum: bool) -> None:
        w = self._w
        w.flush()
        fd = w.fd
        stop = at + size
        header = _enc.filler_header(size, log_pos=stop & _U32, server_id=server_id)
        os.ftruncate(fd, at)  # nothing stale in the hole: it reads as zeros
        os.pwrite(fd, header, at)
        if checksum:
            os.pwrite(fd, _enc.filler_crc(header, size).to_bytes(4, "little"), stop - C.CHECKSUM_LEN)
            w.bytes_written += len(header) + C.CHECKSUM_LEN
        else:
            os.ftruncate(fd, stop)
            w.bytes_written += len(header)
        w.written = w.end = stop

    def join_start_set(self, gtids: Gtids, epoch: Epoch, offset: int, size: int, type_code: int) -> None:
        """The first file of an epoch starts with its new master's set, which may be a strict subset of
        the relay's (that file began before the join point; fillers cover the groups the relay had):
        the set at its start is ``join_gtids ∪ its set``. A set naming GTIDs the relay never had (the
        new master had them before this file: errant or other-domain transactions) is recorded, not
        refused: they count as purged (FileCatalog.purged), the relay cannot serve them."""
        w = self._w
        join = parse_gtid_text(epoch.join_gtids)
        try:
            effective = gtid_union(join, gtids)
            extra = gtid_missing(gtids, join) if join is not None else None
        except ValueError as exc:
            raise RelayMismatchError(offset, size, w.file, f"its {C.event_name(type_code)} set: {exc}") from None
        if extra is not None:
            self.join_extra_gtids = extra
            self.warnings.append(
                f"{w.file} (epoch {epoch.epoch}) starts with {C.event_name(type_code)} {gtid_text(gtids)}, "
                f"which names {gtid_text(extra)} that the relay never had: counted as purged"
            )
        w.gtids = effective
        w.file_start_gtids = gtids.copy()
        w.start_set_seen = True
