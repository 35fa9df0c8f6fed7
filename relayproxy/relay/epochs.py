"""Upstream epochs: which master wrote which relay files, and how their names map (``relayproxy.epochs``).

After a failover the relay is repointed to another master (a promoted replica) whose binlog has other
names (often the same basename with *lower* numbers) and other offsets. The relay never overwrites or
renames its own history: its files stay one monotonic sequence for downstream replicas, and within one
upstream *epoch* a relay file keeps the byte offsets of that epoch's master.

``relayproxy.epochs`` (JSON, replaced atomically) lists the epochs in order::

    {"format": "relayproxy-epochs", "version": 1, "relay_basename": "mysql-bin", "relay_width": 6,
     "epochs": [{"epoch": 1, "first_file": "mysql-bin.000040", "upstream_first_file": "mysql-bin.000040",
                 "master": null, "join_gtids": null, "started": null, "relay_server_id": null},
                {"epoch": 2, "first_file": "mysql-bin.000043", "upstream_first_file": "mysql-bin.000002",
                 "master": {"host": "m2", "port": 3306, "server_id": 2, "server_uuid": "..."},
                 "join_gtids": "<uuid>:1-16", "started": 1700000000.0, "relay_server_id": 99}]}

Name mapping:

- Epoch 1 maps names identically: its relay files are its master's files (byte for byte). A relay
  directory without the file is one implicit epoch 1 (every relay written before epochs existed keeps
  working, unchanged on disk).
- Epoch e >= 2: upstream file F -> ``relay_basename + "." + (e.first_seq + seq(F) - seq(e.upstream_first_file))``,
  zero-padded to ``relay_width`` (wider when the number needs it). ``relay_basename``/``relay_width``
  come from the relay's first file (epoch 1) and are written into the file with the second epoch, so
  they survive the purge of epoch 1's files.

``join_gtids`` is the relay's complete GTID set when the epoch began. The first relay file of an
epoch >= 2 (its *join file*) starts with the new master's PREVIOUS_GTIDS / GTID_LIST, which may lack
part of the relay's set (that master's file began before the join point; the groups the relay already
had are covered by filler events): everywhere the relay needs "the GTID set at the start of a file" it
uses ``join_gtids ∪ the file's own set`` for a join file (``Epochs.join_set``, ``gtid_union``).

Fillers: a GTID dump skips the groups the relay has, so the master's next event can sit beyond the end
of the relay file. The relay fills ``[end, offset)`` with IGNORABLE_LOG_EVENT (28, LOG_EVENT_IGNORABLE_F)
events of its own (``is_filler``): outside any group, walked and CRC-checked like any event, never sent
to replicas.

Retention: ``Epochs.pruned(oldest)`` drops the epochs whose files are all purged (never the current one);
the basename and width stay in the header.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..binlog import constants as C
from ..binlog.gtid import GtidSet, MariaBinlogState, MariaGtid

EPOCHS_NAME = "relayproxy.epochs"
EPOCHS_TMP_NAME = EPOCHS_NAME + ".tmp"
_FORMAT = "relayproxy-epochs"
_VERSION = 1
_NUMBERED = re.compile(r"^(.+)\.(\d+)$")
_MASTER_KEYS = ("host", "port", "server_id", "server_uuid")


class EpochsError(ValueError):
    """The epochs file, or a name that does not fit the epochs (the message says which)."""


# ---------------------------------------------------------------------------------------------
# Fillers


def is_filler(header) -> bool:
    """Whether an event is a relay-made filler: IGNORABLE_LOG_EVENT with LOG_EVENT_IGNORABLE_F.

    ``header`` is the unpacked common header (``EventHeader`` or the 6-tuple of ``HEADER.unpack_from``:
    timestamp, type, server_id, size, log_pos, flags) or the event's bytes. Masters do not write type 28
    to their binlogs; the dump sender skips these events (they cover groups the relay got from an earlier
    master) and repositions the replica past them.
    """
    if isinstance(header, (bytes, bytearray, memoryview)):
        if len(header) < C.HEADER_LEN:
            return False
        return header[4] == C.IGNORABLE_LOG_EVENT and bool(int.from_bytes(header[17:19], "little") & C.LOG_EVENT_IGNORABLE_F)
    return header[1] == C.IGNORABLE_LOG_EVENT and bool(header[5] & C.LOG_EVENT_IGNORABLE_F)


# ---------------------------------------------------------------------------------------------
# GTID sets across a join


def gtid_union(a, b):
    """``a ∪ b`` as a new set (either may be None). MySQL: the set union. MariaDB: per (domain,
    server_id) the higher seq_no, and per domain the entry with the highest seq_no is the most recent
    (strict mode's order; ties keep ``a``'s)."""
    if a is None:
        return None if b is None else b.copy()
    if b is None:
        return a.copy()
    if isinstance(a, GtidSet) and isinstance(b, GtidSet):
        return a.union(b)
    if isinstance(a, MariaBinlogState) and isinstance(b, MariaBinlogState):
        entries: dict[tuple[int, int], MariaGtid] = {}
        for g in (*a.gtids(), *b.gtids()):
            key = (g.domain_id, g.server_id)
            have = entries.get(key)
            if have is None or g.seq_no > have.seq_no:
                entries[key] = g
        out = MariaBinlogState()
        for domain in sorted({d for d, _ in entries}):
            mine = [g for (d, _), g in entries.items() if d == domain]
            latest = a.latest(domain)
            latest = entries[(latest.domain_id, latest.server_id)] if latest is not None else None
            for g in mine:
                if latest is None or g.seq_no > latest.seq_no:
                    latest = g
            assert latest is not None  # ``domain`` comes from ``entries``, so ``mine`` is never empty
            for g in sorted(mine, key=lambda g: g.server_id):
                if g != latest:
                    out.update(g)
            out.update(latest)
        return out
    raise ValueError(f"cannot join GTID sets of different flavours: {type(a).__name__} and {type(b).__name__}")


def gtid_missing(sub, sup):
    """What ``sub`` names that ``sup`` does not cover (None when nothing): MySQL ``sub - sup``;
    MariaDB the entries of ``sub`` whose (domain, server_id) is absent from ``sup`` or behind."""
    if sub is None:
        return None
    if sup is None:
        empty = not len(sub) if isinstance(sub, MariaBinlogState) else not sub
        return None if empty else sub.copy()
    if isinstance(sub, GtidSet) and isinstance(sup, GtidSet):
        missing = sub.subtract(sup)
        return missing if missing else None
    if isinstance(sub, MariaBinlogState) and isinstance(sup, MariaBinlogState):
        extra = [g for g in sub.gtids() if (sup.get(g.domain_id, g.server_id) or MariaGtid(0, 0, -1)).seq_no < g.seq_no]
        return MariaBinlogState(extra) if extra else None
    raise ValueError(f"cannot compare GTID sets of different flavours: {type(sub).__name__} and {type(sup).__name__}")


def gtid_text(gtids) -> str | None:
    """One-line text of a GTID set (MySQL ``uuid:1-5,uuid2:1-3``; MariaDB ``0-1-100``), None without GTIDs."""
    if gtids is None:
        return None
    fmt = getattr(gtids, "format", None)
    return fmt(",") if fmt is not None else str(gtids)


def parse_gtid_text(text: str | None):
    """The set ``gtid_text`` wrote: MySQL text has ':' after each UUID, MariaDB's never; None when empty."""
    if text is None or not text.strip():
        return None
    return GtidSet.parse(text) if ":" in text else MariaBinlogState.parse(text)


# ---------------------------------------------------------------------------------------------
# Names


def split_name(name: str) -> tuple[str, int, int] | None:
    """``("mysql-bin", 42, 6)`` for ``mysql-bin.000042``: basename, sequence number, digit width."""
    m = _NUMBERED.match(name)
    if not m:
        return None
    return m.group(1), int(m.group(2)), len(m.group(2))


def numbered_name(basename: str, seq: int, width: int) -> str:
    return f"{basename}.{seq:0{width}d}"


def _split_or_raise(name: str, what: str) -> tuple[str, int, int]:
    parts = split_name(name)
    if parts is None:
        raise EpochsError(f"{what} {name!r} has no sequence number (basename.NNNNNN)")
    return parts


def _recorded(name: str | None) -> str:
    """A recorded epoch's file name: ``_validate`` refuses a recorded epoch without one (only the implicit
    epoch has None)."""
    if name is None:
        raise EpochsError("a recorded epoch lacks its first_file / upstream_first_file")
    return name


def _upstream_series(e: Epoch) -> tuple[str, int, int]:
    """``(basename, seq, width)`` of the master's file where a recorded epoch >= 2 began."""
    return _split_or_raise(_recorded(e.upstream_first_file), f"epoch {e.epoch}'s upstream file")


def _plain(name: str, what: str) -> None:
    """A name the relay may join to its directory (the store checks relay names the same way)."""
    if (not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith((".", "relayproxy."))
            or any(ord(ch) < 32 or ord(ch) == 127 for ch in name)):
        raise EpochsError(f"{what} {name!r} is not a plain file name")


def normalise_master(master) -> dict:
    """The master identity recorded for an epoch: host, port, server_id, server_uuid (or None)."""
    if not isinstance(master, dict):
        raise EpochsError(f"master must be a dict with {', '.join(_MASTER_KEYS)}, not {type(master).__name__}")
    unknown = set(master) - set(_MASTER_KEYS)
    if unknown:
        raise EpochsError(f"master has unknown keys {sorted(unknown)}; expected {', '.join(_MASTER_KEYS)}")
    host, port, server_id = master.get("host"), master.get("port"), master.get("server_id")
    uuid = master.get("server_uuid")
    if not isinstance(host, str) or not host:
        raise EpochsError(f"master host must be a non-empty string, not {host!r}")
    if type(port) is not int or not 0 < port < 65536:
        raise EpochsError(f"master port must be an int in 1..65535, not {port!r}")
    if type(server_id) is not int or not 0 <= server_id <= 0xFFFFFFFF:
        raise EpochsError(f"master server_id must be an int in 0..4294967295, not {server_id!r}")
    if uuid is not None and not isinstance(uuid, str):
        raise EpochsError(f"master server_uuid must be a string or None, not {uuid!r}")
    return {"host": host, "port": port, "server_id": server_id, "server_uuid": uuid}


# ---------------------------------------------------------------------------------------------
# The epochs


@dataclass(frozen=True)
class Epoch:
    """One upstream epoch. ``implicit``: the epoch 1 of a relay directory without an epochs file."""

    epoch: int
    first_file: str | None  # the relay's first file of this epoch
    upstream_first_file: str | None  # the master's name for it
    master: tuple | None  # ((key, value), ...) of normalise_master; see master_dict
    join_gtids: str | None  # the relay's complete GTID set when the epoch began (text)
    started: float | None  # unix time the epoch was recorded (the record only: no relay file byte depends on it)
    relay_server_id: int | None  # server_id of the relay that switched (the record only, as ``started``)
    implicit: bool = False

    @property
    def master_dict(self) -> dict | None:
        return None if self.master is None else dict(self.master)

    def same_master(self, master: dict) -> bool:
        return self.master is not None and dict(self.master) == normalise_master(master)

    def as_json(self) -> dict:
        return {
            "epoch": self.epoch,
            "first_file": self.first_file,
            "upstream_first_file": self.upstream_first_file,
            "master": self.master_dict,
            "join_gtids": self.join_gtids,
            "started": self.started,
            "relay_server_id": self.relay_server_id,
        }


IMPLICIT_EPOCH = Epoch(1, None, None, None, None, None, None, implicit=True)


class Epochs:
    """The epochs of a relay directory, oldest first (immutable: planning returns a new value)."""

    __slots__ = ("epochs", "relay_basename", "relay_width")

    def __init__(self, epochs=(), relay_basename: str | None = None, relay_width: int | None = None):
        self.epochs: tuple[Epoch, ...] = tuple(epochs)
        self.relay_basename = relay_basename
        self.relay_width = relay_width
        self._validate()

    # -- reading -----------------------------------------------------------------------------
    @property
    def implicit(self) -> bool:
        """No epochs file: one implicit epoch 1 mapping names identically."""
        return not self.epochs

    @property
    def current(self) -> Epoch:
        return self.epochs[-1] if self.epochs else IMPLICIT_EPOCH

    def __eq__(self, other):
        if not isinstance(other, Epochs):
            return NotImplemented
        return (self.epochs, self.relay_basename, self.relay_width) == (
            other.epochs, other.relay_basename, other.relay_width)

    def __repr__(self) -> str:
        return f"Epochs({[e.as_json() for e in self.epochs]!r}, {self.relay_basename!r}, {self.relay_width!r})"

    def _relay_seq(self, relay_name: str) -> int | None:
        parts = split_name(relay_name)
        if parts is None or self.relay_basename is None or parts[0] != self.relay_basename:
            return None
        return parts[1]

    def _first_seq(self, e: Epoch) -> int:
        """The sequence number of a recorded epoch >= 2's first relay file (``_validate`` checked it has one)."""
        return _split_or_raise(_recorded(e.first_file), f"epoch {e.epoch}'s first file")[1]

    def _series(self) -> tuple[str, int]:
        """``(relay_basename, relay_width)``, which ``_validate`` requires once an epoch >= 2 is recorded."""
        if self.relay_basename is None or self.relay_width is None:
            raise EpochsError("relay_basename and relay_width are required once there are two epochs")
        return self.relay_basename, self.relay_width

    def epoch_of(self, relay_name: str) -> Epoch:
        """The epoch a relay file belongs to (EpochsError when no recorded epoch covers it)."""
        if not self.epochs:
            return IMPLICIT_EPOCH
        seq = self._relay_seq(relay_name)
        if seq is not None:
            for e in reversed(self.epochs):
                if e.epoch >= 2 and self._first_seq(e) <= seq:
                    return e
        first = self.epochs[0]
        if first.epoch == 1:
            return first  # identity names, and numbered names before epoch 2
        raise EpochsError(f"{relay_name!r} is before every recorded epoch (the first is epoch {first.epoch})")

    def relay_name(self, upstream_name: str, epoch: Epoch | None = None) -> str:
        """The relay file that holds the master's ``upstream_name`` in ``epoch`` (default: the current)."""
        e = self.current if epoch is None else epoch
        if e.epoch == 1:
            return upstream_name
        base, seq, _width = _split_or_raise(upstream_name, "upstream file")
        up_base, up_seq, up_width = _upstream_series(e)
        if base != up_base or upstream_name != numbered_name(base, seq, up_width):
            raise EpochsError(
                f"upstream file {upstream_name!r} is not in the series of epoch {e.epoch}, which began at "
                f"{e.upstream_first_file!r}"
            )
        if seq < up_seq:
            raise EpochsError(
                f"upstream file {upstream_name!r} is before {e.upstream_first_file!r}, where epoch {e.epoch} "
                "began: the master's names went backwards"
            )
        relay_basename, relay_width = self._series()
        return numbered_name(relay_basename, self._first_seq(e) + seq - up_seq, relay_width)

    def upstream_name(self, relay_name: str) -> tuple[int, str]:
        """``(epoch, the master's file name)`` of a relay file."""
        e = self.epoch_of(relay_name)
        if e.epoch == 1:
            return e.epoch, relay_name
        seq = self._relay_seq(relay_name)
        assert seq is not None  # epoch_of finds an epoch >= 2 only for a numbered relay name
        up_base, up_seq, up_width = _upstream_series(e)
        return e.epoch, numbered_name(up_base, up_seq + seq - self._first_seq(e), up_width)

    def rotate_targets(self, relay_file: str, target: str) -> list[str]:
        """The relay files a ROTATE at the end of ``relay_file`` may name: ``target`` itself (identity
        names, or the ROTATE the relay wrote at a switch, which names a relay file) and ``target`` mapped
        through ``relay_file``'s epoch (a master's own ROTATE names the master's next file)."""
        out = [target]
        try:
            mapped = self.relay_name(target, self.epoch_of(relay_file))
        except EpochsError:
            return out
        if mapped != target:
            out.append(mapped)
        return out

    def join_epoch(self, relay_name: str) -> Epoch | None:
        """The epoch (>= 2) whose join file ``relay_name`` is, or None."""
        for e in self.epochs:
            if e.epoch >= 2 and e.first_file == relay_name:
                return e
        return None

    def join_set(self, relay_name: str):
        """The relay's GTID set at the join when ``relay_name`` is a join file, else None."""
        e = self.join_epoch(relay_name)
        return None if e is None else parse_gtid_text(e.join_gtids)

    def file_start(self, relay_name: str, start_gtids):
        """The GTID set at the start of a relay file: its own set, joined with the join set for a join file."""
        join = self.join_set(relay_name)
        return start_gtids if join is None else gtid_union(join, start_gtids)

    # -- planning (sans-I/O) ------------------------------------------------------------------
    def next_epoch(
        self, *, index: list[str], current_empty: bool, master: dict, upstream_first_file: str,
        join_gtids: str | None, started: float, relay_server_id: int,
    ) -> Epochs:
        """The epochs after recording a new epoch that begins at the relay's next file.

        ``index``: the relay files, oldest first; ``current_empty``: the newest holds only the magic
        (it is then the new epoch's first file, since the previous file's ROTATE already names it).
        """
        master_items = tuple(normalise_master(master).items())
        cur = self.current
        if not index:
            # A relay without files: its first epoch (identity names), replacing an unused record.
            number = cur.epoch if not cur.implicit else 1
            if number != 1:
                raise EpochsError(f"the relay has no files but epoch {number} is recorded")
            parts = split_name(upstream_first_file)
            epoch = Epoch(
                1, upstream_first_file, upstream_first_file, master_items, join_gtids, started, relay_server_id)
            return Epochs((epoch,), *(parts[0], parts[2]) if parts else (None, None))
        epochs = list(self.epochs)
        basename, width = self.relay_basename, self.relay_width
        if basename is None:
            first = _recorded(epochs[0].first_file) if epochs else index[0]
            base, _seq, width = _split_or_raise(first, "the relay's first file")
            basename = base
        if width is None:
            raise EpochsError(f"the epochs record relay_basename {basename!r} without relay_width")
        if not epochs:
            epochs = [Epoch(1, index[0], index[0], None, None, None, None)]
        last_base_seq = split_name(index[-1])
        if last_base_seq is None:
            raise EpochsError(f"the relay's newest file {index[-1]!r} has no sequence number: cannot number the next")
        if current_empty:
            first_file = numbered_name(basename, last_base_seq[1], width)
            if first_file != index[-1]:
                raise EpochsError(
                    f"the relay's newest file {index[-1]!r} holds no events and does not fit the relay's series "
                    f"({basename}.{'N' * width}): it cannot begin the new epoch"
                )
        else:
            first_file = numbered_name(basename, last_base_seq[1] + 1, width)
        _split_or_raise(upstream_first_file, "upstream file")
        epoch = Epoch(
            epochs[-1].epoch + 1, first_file, upstream_first_file, master_items, join_gtids, started, relay_server_id)
        return Epochs((*epochs, epoch), basename, width)

    def replaced_current(self, **changes) -> Epochs:
        """The epochs with the current (explicit) record changed: an epoch that holds no data yet."""
        cur = self.current
        if cur.implicit:
            raise EpochsError("no recorded epoch to change")
        if "master" in changes and changes["master"] is not None:
            changes["master"] = tuple(normalise_master(changes["master"]).items())
        if "upstream_first_file" in changes and cur.epoch >= 2:
            _split_or_raise(changes["upstream_first_file"], "upstream file")
        fields = {**cur.as_json(), "master": cur.master, **changes}
        fields["implicit"] = False
        new = Epoch(**fields)
        basename, width = self.relay_basename, self.relay_width
        if new.epoch == 1 and len(self.epochs) == 1:
            parts = None if new.first_file is None else split_name(new.first_file)
            basename, width = (parts[0], parts[2]) if parts else (None, None)
        return Epochs((*self.epochs[:-1], new), basename, width)

    def pruned(self, oldest_relay_file: str) -> Epochs:
        """Without the epochs whose files are all before ``oldest_relay_file`` (never the current one)."""
        if len(self.epochs) <= 1:
            return self
        try:
            keep_from = self.epoch_of(oldest_relay_file).epoch
        except EpochsError:
            return self
        kept = tuple(e for e in self.epochs if e.epoch >= keep_from or e is self.epochs[-1])
        if len(kept) == len(self.epochs):
            return self
        return Epochs(kept, self.relay_basename, self.relay_width)

    # -- validation and (de)serialisation --------------------------------------------------------
    def _validate(self) -> None:
        if self.relay_basename is not None:
            _plain(self.relay_basename, "relay_basename")
        previous = None
        for e in self.epochs:
            for name in (e.first_file, e.upstream_first_file):
                if isinstance(name, str):
                    _plain(name, f"epoch {e.epoch}'s file name")
            if e.implicit:
                raise EpochsError("an implicit epoch cannot be recorded")
            if previous is not None and e.epoch != previous.epoch + 1:
                raise EpochsError(f"epoch {e.epoch} follows epoch {previous.epoch}: epochs are numbered in order")
            if not isinstance(e.first_file, str) or not isinstance(e.upstream_first_file, str):
                raise EpochsError(f"epoch {e.epoch} lacks its first_file / upstream_first_file")
            if e.epoch >= 2:
                if self.relay_basename is None or not self.relay_width:
                    raise EpochsError("relay_basename and relay_width are required once there are two epochs")
                parts = split_name(e.first_file)
                if parts is None or parts[0] != self.relay_basename:
                    raise EpochsError(f"epoch {e.epoch} begins at {e.first_file!r}, not a {self.relay_basename} file")
                _split_or_raise(e.upstream_first_file, f"epoch {e.epoch}'s upstream file")
                if previous is not None and previous.epoch >= 2 and self._first_seq(previous) >= parts[1]:
                    raise EpochsError(f"epoch {e.epoch} begins at {e.first_file!r}, not after epoch {previous.epoch}")
                if previous is not None and previous.epoch == 1:
                    first = split_name(_recorded(previous.first_file))
                    if first is not None and first[0] == self.relay_basename and first[1] > parts[1]:
                        raise EpochsError(f"epoch {e.epoch} begins at {e.first_file!r}, before epoch 1")
            previous = e

    def to_json(self) -> str:
        doc = {
            "format": _FORMAT,
            "version": _VERSION,
            "relay_basename": self.relay_basename,
            "relay_width": self.relay_width,
            "epochs": [e.as_json() for e in self.epochs],
        }
        return json.dumps(doc, indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Epochs:
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise EpochsError(f"not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            raise EpochsError(f"not a {_FORMAT} document")
        if doc.get("version") != _VERSION:
            raise EpochsError(f"unsupported version {doc.get('version')!r} (this relay reads {_VERSION})")
        raw = doc.get("epochs")
        if not isinstance(raw, list) or not raw:
            raise EpochsError("'epochs' must be a non-empty list")
        epochs = []
        for item in raw:
            if not isinstance(item, dict):
                raise EpochsError(f"epoch entry {item!r} is not an object")
            try:
                number = item["epoch"]
                master = item["master"]
                started = item["started"]
                server_id = item.get("relay_server_id")
                join = item["join_gtids"]
                epoch = Epoch(
                    number, item["first_file"], item["upstream_first_file"],
                    None if master is None else tuple(normalise_master(master).items()),
                    join, None if started is None else float(started), server_id,
                )
            except KeyError as exc:
                raise EpochsError(f"epoch entry lacks {exc}") from None
            if type(number) is not int or number < 1:
                raise EpochsError(f"epoch number {number!r} is not a positive int")
            if join is not None:
                if not isinstance(join, str):
                    raise EpochsError(f"epoch {number}: join_gtids must be text")
                try:
                    parse_gtid_text(join)
                except ValueError as exc:
                    raise EpochsError(f"epoch {number}: join_gtids: {exc}") from None
            if server_id is not None and (type(server_id) is not int or not 0 <= server_id <= 0xFFFFFFFF):
                raise EpochsError(f"epoch {number}: relay_server_id {server_id!r} is not a server id")
            if number >= 2 and (master is None or started is None or server_id is None):
                raise EpochsError(f"epoch {number} lacks its master, started or relay_server_id")
            epochs.append(epoch)
        width = doc.get("relay_width")
        if width is not None and (type(width) is not int or width < 1):
            raise EpochsError(f"relay_width {width!r} is not a positive int")
        return cls(epochs, doc.get("relay_basename"), width)


# ---------------------------------------------------------------------------------------------
# The file (the only I/O here; ``recovery.write_epochs`` replaces it, atomically as the relay's other small files)


def read_epochs(relay_dir: Path) -> Epochs:
    """The epochs of a relay directory (implicit when it has no epochs file); EpochsError when damaged."""
    try:
        text = (Path(relay_dir) / EPOCHS_NAME).read_text("utf-8")
    except FileNotFoundError:
        return Epochs()
    except UnicodeDecodeError as exc:
        raise EpochsError(f"{EPOCHS_NAME} is not UTF-8: {exc}") from None
    try:
        return Epochs.from_json(text)
    except EpochsError as exc:
        raise EpochsError(f"{Path(relay_dir) / EPOCHS_NAME}: {exc}") from None
