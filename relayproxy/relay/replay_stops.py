"""Replay stops (``relayproxy.replay-stops``): per replica server id, a relay position a dump never sends past.

``relayproxy pitr`` replays a restored backup through the target's own replication applier, with the relay as its
master. The stop is exact only if the target never receives a byte past it, whatever its applier does, and
whether the command, the target or the relay is killed meanwhile: so the relay itself ends what it sends to that
replica at the stop (the dump sender caps its durable end there, and waits with heartbeats as at the horizon). A
stop is registered over the SQL port (``RELAYPROXY SET REPLAY STOP``) before the target starts replicating and
cleared when the replay is done; it is keyed by the target's ``server_id``, which its dump request carries.

The registry is a small JSON document beside the relay files, under the reserved prefix so recovery never takes it
for a binlog, written atomically (temporary file, fsync, rename, directory fsync) before the statement that set it
is answered: a relay restarted mid-replay still stops the target at the same byte. ``relayproxy serve``, which may
not write its directory, keeps its stops in memory only (``path`` None) and says so in its answer.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .durable import write_file_atomically
from .layout import RESERVED_PREFIX

REPLAY_STOPS_NAME = RESERVED_PREFIX + "replay-stops"
_FORMAT = "relayproxy-replay-stops"
_VERSION = 1
MAX_STOPS = 256  # one per replay in progress; a bound on what SQL clients can make the relay keep
MAX_LABEL = 512


class ReplayStopsError(ValueError):
    """The registry cannot be read or a stop is not valid (the message says why)."""


@dataclass(frozen=True)
class ReplayStop:
    """A replica (by server id) is sent nothing at or past ``position`` of relay file ``file``."""

    server_id: int
    file: str
    position: int
    gtid_state: str = ""  # the relay's GTID state at the stop, as BINLOG_GTID_POS gives it (what the target ends at)
    label: str = ""  # what the operator asked for ("before GTID 0-1-500"), shown by SHOW RELAYPROXY REPLAY STOPS
    created: float = 0.0

    def caps(self, name: str, names: list[str]) -> int | None:
        """How far a dump may read relay file ``name`` under this stop: ``position`` in the stop's file, 4 (nothing)
        in a later file, None (no cap) in an earlier one. ``names``: the relay's files, oldest first."""
        if name == self.file:
            return self.position
        try:
            return 4 if names.index(name) > names.index(self.file) else None
        except ValueError:
            return None  # a file no longer listed (purged meanwhile) is not past the stop's: the dump finds out


class ReplayStops:
    """The stops in force, read by every dump (a dict look-up) and changed by the SQL port. Thread-safe."""

    def __init__(self, path: Path | None = None, stops: dict[int, ReplayStop] | None = None):
        self.path = Path(path) if path is not None else None
        self._stops: dict[int, ReplayStop] = dict(stops or {})
        self._lock = threading.Lock()

    @classmethod
    def load(cls, relay_dir: Path | None) -> "ReplayStops":
        """The registry of a relay directory (empty if it has none); None: in memory only."""
        if relay_dir is None:
            return cls(None)
        path = Path(relay_dir) / REPLAY_STOPS_NAME
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(path)
        return cls(path, decode(raw, path))

    @property
    def persistent(self) -> bool:
        return self.path is not None

    def get(self, server_id: int) -> ReplayStop | None:
        return self._stops.get(server_id)

    def all(self) -> list[ReplayStop]:
        return sorted(self._stops.values(), key=lambda s: s.server_id)

    def __bool__(self) -> bool:
        return bool(self._stops)

    def set(self, stop: ReplayStop) -> ReplayStop | None:
        """Register (or replace) the stop of ``stop.server_id``, durably before it returns; the one it replaced."""
        check(stop)
        with self._lock:
            if stop.server_id not in self._stops and len(self._stops) >= MAX_STOPS:
                raise ReplayStopsError(f"{len(self._stops)} replay stops are registered already (at most {MAX_STOPS}):"
                                       " clear finished ones with RELAYPROXY CLEAR REPLAY STOP")
            new = dict(self._stops)
            old = new.get(stop.server_id)
            new[stop.server_id] = stop
            self._save(new)
            self._stops = new
            return old

    def clear(self, server_id: int) -> ReplayStop | None:
        """Remove the stop of ``server_id`` (durably); the one removed, or None."""
        with self._lock:
            if server_id not in self._stops:
                return None
            new = dict(self._stops)
            old = new.pop(server_id)
            self._save(new)
            self._stops = new
            return old

    def _save(self, stops: dict[int, ReplayStop]) -> None:
        if self.path is not None:
            write_file_atomically(self.path, encode(stops))


def check(stop: ReplayStop) -> None:
    if not isinstance(stop.server_id, int) or not 0 < stop.server_id < 1 << 32:
        raise ReplayStopsError(f"server_id {stop.server_id!r}: expected 1 to 4294967295")
    if not isinstance(stop.file, str) or not stop.file or stop.file.startswith(RESERVED_PREFIX) or "/" in stop.file:
        raise ReplayStopsError(f"file {stop.file!r}: not a relay file name")
    if not isinstance(stop.position, int) or not 4 <= stop.position < 1 << 64:
        raise ReplayStopsError(f"position {stop.position!r}: expected 4 or more")
    if len(stop.label) > MAX_LABEL or len(stop.gtid_state) > 64 << 10:
        raise ReplayStopsError("label or GTID state too long")


def encode(stops: dict[int, ReplayStop]) -> bytes:
    doc = {"format": _FORMAT, "version": _VERSION, "saved": time.time(),
           "stops": [asdict(s) for s in sorted(stops.values(), key=lambda s: s.server_id)]}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def decode(raw: bytes, path: Path | str = REPLAY_STOPS_NAME) -> dict[int, ReplayStop]:
    """The stops of an encoded registry; a registry that cannot be read is an error, never an empty one (a stop
    forgotten would let a replay run past its target)."""
    try:
        doc = json.loads(raw.decode())
        if doc.get("format") != _FORMAT or doc.get("version") != _VERSION:
            raise ValueError(f"not a {_FORMAT} document of version {_VERSION}")
        out: dict[int, ReplayStop] = {}
        for item in doc["stops"]:
            stop = ReplayStop(int(item["server_id"]), str(item["file"]), int(item["position"]),
                              str(item.get("gtid_state", "")), str(item.get("label", "")),
                              float(item.get("created", 0.0)))
            check(stop)
            out[stop.server_id] = stop
        return out
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise ReplayStopsError(f"{path}: cannot read the replay stops ({exc}); fix or remove the file (a pitr "
                               "replay in progress then needs its stop set again)") from None
