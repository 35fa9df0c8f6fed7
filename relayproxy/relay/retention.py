"""Relay file retention: which oldest files to purge (by age, size or count), who holds them, the task that purges.

The planner is sans-I/O: ``plan_purge(files, readers, policy, now)`` takes the relay files (oldest
first, with size and mtime), the files connected readers are reading, and a ``RetentionPolicy``,
and returns a ``PurgePlan``. Purging is always a *prefix* of the file list, never a hole: the
relay's ``gtid_purged`` is the starting set of its oldest file, which is only true when every file
after it is still there. The newest file (the one the upstream session writes, and the horizon's)
is never purged.

A file a connected replica is reading is never purged unless the policy says ``force``; the
planner then stops just before the oldest file in use and reports what it could not purge and who
holds it (``PurgePlan.held``). ``PURGE BINARY LOGS`` over SQL asks the same question through
``readers_of`` / ``readers_in`` and refuses identically. With ``force`` the files go anyway, and
each dump that was reading one ends with ERR 1236 (``downstream/dump.py``) instead of silently
keeping a deleted file open.

``RetentionTask`` is the I/O edge: every ``interval`` seconds it stats the files, plans, and calls
``store.purge_to`` on the event loop's thread (the thread that owns the store, as the SQL PURGE
does), logs each purge and counts it in ``RetentionStats``.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from ..log import get_logger
from . import closed_files

if TYPE_CHECKING:
    from .catalog import FileCatalog
    from .reader import StoreReader

__all__ = [
    "RetentionPolicy",
    "RelayFileState",
    "Reader",
    "PurgePlan",
    "plan_purge",
    "readers_of",
    "readers_in",
    "parse_duration",
    "parse_size",
    "parse_files_text",
    "parse_count_or",
    "file_states",
    "relay_disk_usage",
    "DiskUsage",
    "RetentionStats",
    "RetentionTask",
    "purge_with_policy",
]

log = get_logger(__name__)

# Why a file is purged, in the order the reasons are checked.
REASON_AGE = "age"
REASON_COUNT = "count"
REASON_SIZE = "size"


# ---------------------------------------------------------------------------------------------
# Parsing the limits (config options)

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_NUMBER_UNIT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_duration(value: Any) -> float:
    """Seconds from ``3600``, ``"3600"``, ``"90s"``, ``"30m"``, ``"12h"``, ``"7d"``, ``"2w"``; must be > 0."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 3600, 30m, 12h or 7d, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _NUMBER_UNIT.fullmatch(str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in ("", *_DURATION_UNITS):
            raise ValueError(
                f"expected a duration: a number of seconds or a number with s, m, h, d or w (3600, 30m, 12h, 7d), "
                f"got {value!r}"
            )
        seconds = float(match.group(1)) * _DURATION_UNITS.get(unit, 1)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a duration must be a positive number of seconds, got {value!r}")
    return seconds


def parse_size(value: Any) -> int:
    """Bytes from ``1048576``, ``"500M"``, ``"20G"``, ``"1T"``, ``"64KiB"``, ``"10GB"`` (binary units); > 0."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 500M, 20G or a number of bytes, got {value!r}")
    if isinstance(value, (int, float)):
        size = float(value)
    else:
        match = _NUMBER_UNIT.fullmatch(str(value))
        unit = match.group(2).lower() if match else ""
        if unit.endswith("ib"):
            unit = unit[:-2]
        elif len(unit) == 2 and unit.endswith("b"):
            unit = unit[:-1]
        if match is None or unit not in _SIZE_UNITS:
            raise ValueError(
                f"expected a size: a number of bytes or a number with K, M, G or T (1024-based: 500M, 20G), "
                f"got {value!r}"
            )
        size = float(match.group(1)) * _SIZE_UNITS[unit]
    if not math.isfinite(size) or size < 1:
        raise ValueError(f"a size must be at least 1 byte, got {value!r}")
    return int(size)


def parse_files_text(value: Any) -> int | None:
    """The N of ``"N files"`` (``"20 files"``, ``"1 file"``), or None when ``value`` is not written that way."""
    m = re.fullmatch(r"(\d+)\s*files?", str(value).strip().lower())
    return int(m.group(1)) if m else None


def parse_count_or(value: Any, parse_other: Callable[[Any], Any], option: str, other: str) -> tuple[Any, int | None]:
    """(``parse_other(value)``, None) or (None, N) for ``"N files"``; (None, None) when unset. ValueError naming
    ``option`` and what it takes (``other``, e.g. "an age (7d, 12h)") otherwise."""
    if value is None or value == "":
        return None, None
    files = parse_files_text(value)
    if files is not None:
        return None, files
    try:
        return parse_other(value), None
    except ValueError:
        raise ValueError(f"{option} {value!r} is neither {other} nor a count ('20 files')") from None


def parse_file_count(value: Any) -> int:
    """A number of relay files to keep: an integer >= 1 (the current file always stays)."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"expected a whole number of files (at least 1), got {value!r}")
    try:
        count = int(str(value).strip()) if not isinstance(value, (int, float)) else int(value)
    except ValueError:
        raise ValueError(f"expected a whole number of files (at least 1), got {value!r}") from None
    if count < 1:
        raise ValueError(f"must keep at least 1 file (the current one), got {value!r}")
    return count


# ---------------------------------------------------------------------------------------------
# The planner (sans I/O)


@dataclass(frozen=True)
class RetentionPolicy:
    """Limits on the relay files; ``None`` means no limit of that kind. The newest file always stays.

    ``max_age``: purge files closed (last written: their mtime) more than this many seconds ago.
    ``max_total_bytes``: purge oldest files while all files together are larger than this.
    ``max_files``: keep at most this many files (>= 1).
    ``force``: purge files connected replicas are reading too (their dumps end with ERR 1236).
    """

    max_age: float | None = None
    max_total_bytes: int | None = None
    max_files: int | None = None
    force: bool = False

    def __post_init__(self):
        if self.max_age is not None and not (self.max_age > 0 and math.isfinite(self.max_age)):
            raise ValueError(f"max_age must be a positive number of seconds, got {self.max_age!r}")
        if self.max_total_bytes is not None and self.max_total_bytes < 1:
            raise ValueError(f"max_total_bytes must be at least 1, got {self.max_total_bytes!r}")
        if self.max_files is not None and self.max_files < 1:
            raise ValueError(f"max_files must be at least 1 (the current file always stays), got {self.max_files!r}")

    @property
    def enabled(self) -> bool:
        return self.max_age is not None or self.max_total_bytes is not None or self.max_files is not None

    @classmethod
    def from_config(cls, cfg) -> "RetentionPolicy":
        """The policy of a RelayConfig (``retention_*`` options)."""
        return cls(
            max_age=getattr(cfg, "retention_max_age", None),
            max_total_bytes=getattr(cfg, "retention_max_bytes", None),
            max_files=getattr(cfg, "retention_max_files", None),
            force=bool(getattr(cfg, "retention_force", False)),
        )

    def describe(self) -> str:
        parts = []
        if self.max_age is not None:
            parts.append(f"max_age={self.max_age:g}s")
        if self.max_total_bytes is not None:
            parts.append(f"max_bytes={self.max_total_bytes}")
        if self.max_files is not None:
            parts.append(f"max_files={self.max_files}")
        if self.force:
            parts.append("force")
        return ", ".join(parts) or "no limits"


@dataclass(frozen=True)
class RelayFileState:
    """One relay file as the planner sees it: its size and when it was last written (its mtime)."""

    name: str
    size: int
    mtime: float


@dataclass(frozen=True, order=True)
class Reader:
    """A connected reader (a dump connection) and the relay file it is reading."""

    conn_id: int
    file: str
    server_id: int | None = None

    @property
    def who(self) -> str:
        """``connection 21 (replica server_id 202)``, as the errors and logs name a reader."""
        return f"connection {self.conn_id}" + (f" (replica server_id {self.server_id})" if self.server_id else "")


def readers_of(connections: dict[int, Any] | Iterable[Any]) -> list[Reader]:
    """The readers among downstream connections (``ConnectionState`` with a ``DumpProgress`` naming a file),
    sorted by connection id. The one definition of "a file in use" for SQL PURGE and for retention."""
    conns: Iterable[Any] = connections.values() if isinstance(connections, dict) else connections
    out = []
    for c in conns:
        dump = getattr(c, "dump", None)
        if dump is None or not dump.file:
            continue
        registration = getattr(c, "registration", None)
        out.append(Reader(c.conn_id, dump.file, registration.server_id if registration else None))
    return sorted(out)


def readers_in(readers: Iterable[Reader], files: Iterable[str]) -> list[Reader]:
    """The readers reading one of ``files``, sorted by connection id."""
    doomed = set(files)
    return sorted(r for r in readers if r.file in doomed)


@dataclass(frozen=True)
class PurgePlan:
    """What to purge: ``purge`` (a prefix of the files, oldest first) and why each one goes.

    ``keep_from`` is the first file that stays (the argument of ``store.purge_to``); ``reasons`` maps a
    purged file to the limits that asked for it (``age``, ``count``, ``size``). ``wanted`` is what the
    limits asked for; ``held`` are the files among them a reader holds (name -> readers), which stopped
    the purge (without ``force``); ``deferred`` every wanted file that stays because of them.
    ``evicted`` are the readers of purged files (``force`` only): their dumps end with ERR 1236.
    """

    purge: tuple[str, ...] = ()
    keep_from: str | None = None
    reasons: dict[str, tuple[str, ...]] = field(default_factory=dict)
    bytes_freed: int = 0
    wanted: tuple[str, ...] = ()
    held: dict[str, tuple[Reader, ...]] = field(default_factory=dict)
    deferred: tuple[str, ...] = ()
    evicted: tuple[Reader, ...] = ()

    @property
    def blocked(self) -> bool:
        return bool(self.deferred)

    def reason_summary(self) -> str:
        """``age, count``: every limit that asked for at least one purged file, in check order."""
        seen = []
        for why in self.reasons.values():
            for r in why:
                if r not in seen:
                    seen.append(r)
        order = (REASON_AGE, REASON_COUNT, REASON_SIZE)
        return ", ".join(r for r in order if r in seen)

    def held_summary(self) -> str:
        """``binlog.000003 is read by connection 21 (replica server_id 202)``, one clause per held file."""
        return "; ".join(
            f"{name} is read by " + ", ".join(r.who for r in readers) for name, readers in self.held.items()
        )


def plan_purge(
    files: Sequence[RelayFileState],
    readers: Iterable[Reader],
    policy: RetentionPolicy,
    now: float,
    *,
    protect: Iterable[str] = (),
) -> PurgePlan:
    """Decide which prefix of ``files`` (oldest first) the policy purges.

    The newest file never goes, nor any file from the first one named in ``protect`` onward (the
    horizon's file, the upstream's current file). Limits: ``max_files`` asks for the oldest
    ``len(files) - max_files``; ``max_total_bytes`` for oldest files until the rest fit; ``max_age``
    for the files last written more than ``max_age`` seconds before ``now``, from the oldest up to the
    first younger one that the other limits keep (as ``PURGE BINARY LOGS BEFORE``, it never purges
    past a younger file: no hole). The purge is the longest of these prefixes, cut before the oldest
    file a reader holds unless ``policy.force``. Without readers the plan is a fixed point: planning
    again over what is left purges nothing more.
    """
    names = [f.name for f in files]
    n = len(files)
    limit = max(n - 1, 0)  # the newest file stays
    protected = set(protect)
    for i, name in enumerate(names):
        if name in protected:
            limit = min(limit, i)
            break
    reasons: list[list[str]] = [[] for _ in range(n)]
    wanted = 0
    if policy.max_files is not None and n > policy.max_files:
        k = n - policy.max_files
        for i in range(k):
            reasons[i].append(REASON_COUNT)
        wanted = max(wanted, k)
    if policy.max_total_bytes is not None:
        total = sum(f.size for f in files)
        k = 0
        while k < n and total > policy.max_total_bytes:
            total -= files[k].size
            k += 1
        for i in range(k):
            reasons[i].append(REASON_SIZE)
        wanted = max(wanted, k)
    if policy.max_age is not None:
        # Old files from the start, and on past the files the other limits purge anyway: the result is
        # a fixed point (the next check with the same files purges nothing more).
        cutoff = now - policy.max_age
        k = 0
        while k < n and (k < wanted or files[k].mtime < cutoff):
            if files[k].mtime < cutoff:
                reasons[k].insert(0, REASON_AGE)
            k += 1
        wanted = max(wanted, k)
    wanted = min(wanted, limit)
    wanted_names = names[:wanted]
    by_file: dict[str, list[Reader]] = {}
    for reader in sorted(readers):
        by_file.setdefault(reader.file, []).append(reader)
    held_index = next((i for i, name in enumerate(wanted_names) if name in by_file), None)
    purge = wanted
    held: dict[str, tuple[Reader, ...]] = {}
    evicted: list[Reader] = []
    if held_index is not None:
        if policy.force:
            evicted = sorted(r for name in wanted_names for r in by_file.get(name, ()))
        else:
            purge = held_index
            held = {name: tuple(by_file[name]) for name in wanted_names[held_index:] if name in by_file}
    purged = tuple(names[:purge])
    return PurgePlan(
        purge=purged,
        keep_from=names[purge] if purged else None,
        reasons={names[i]: tuple(reasons[i]) for i in range(purge)},
        bytes_freed=sum(f.size for f in files[:purge]),
        wanted=tuple(wanted_names),
        held=held,
        deferred=tuple(wanted_names[purge:]),
        evicted=tuple(evicted),
    )


# ---------------------------------------------------------------------------------------------
# The I/O edge: file states, disk usage, running a plan on a store


def file_states(store: StoreReader) -> list[RelayFileState]:
    """Size and mtime of every relay file, oldest first. A file missing on disk counts as empty and
    old (it is gone already; purging it only drops it from the index)."""
    out = []
    for name in store.files():
        try:
            st = closed_files.stored_stat(store.path(name))  # stored bytes, relay or archive directory
        except (OSError, KeyError):
            out.append(RelayFileState(name, 0, 0.0))
            continue
        out.append(RelayFileState(name, st.st_size, st.st_mtime))
    return out


@dataclass(frozen=True)
class DiskUsage:
    files: int
    bytes: int


def relay_disk_usage(store: StoreReader) -> DiskUsage:
    """Number of relay files and their total size on disk (the index and state files are not counted).
    Stats every file: call it from a metrics collection, not per event."""
    states = file_states(store)
    return DiskUsage(len(states), sum(s.size for s in states))


@dataclass
class RetentionStats:
    """Counters of the retention task, for /metrics and /status (``as_dict``)."""

    runs: int = 0
    purges: int = 0  # runs that purged at least one file
    files_purged: int = 0
    bytes_purged: int = 0
    blocked_by_readers: int = 0  # runs where a reader held a file the policy wanted to purge
    readers_evicted: int = 0  # dumps ended by a forced purge
    last_run: float | None = None  # time.time() of the last check
    last_purge: float | None = None
    last_blocked: str | None = None  # who held what at the last blocked run
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def purge_with_policy(store: StoreReader, connections, policy: RetentionPolicy, stats: RetentionStats, *,
                      catalog=None, now: float | None = None, hold: Callable[[], str | None] | None = None) -> PurgePlan:
    """One retention check: plan over the store's files and purge the prefix (on the caller's thread:
    the one that owns the store). Updates ``stats``; a store error is recorded and re-raised.

    ``hold()``, when given, names the oldest file that must stay with every later one (the archive's first file
    not sealed in its bucket, ``relay/archive.py``): never purged, even with ``force``."""
    now = time.time() if now is None else now
    stats.runs += 1
    stats.last_run = now
    horizon_file = store.horizon.snapshot().file
    held_by_archive = hold() if hold is not None else None
    protect = [name for name in (held_by_archive, horizon_file, store.current_file) if name]
    plan = plan_purge(file_states(store), readers_of(connections), policy, now, protect=protect)
    if plan.held:
        stats.blocked_by_readers += 1
        summary = plan.held_summary()
        if summary != stats.last_blocked:  # once per change, not at every check
            log.warning("relay files kept: a replica still reads them", wanted=list(plan.wanted),
                        kept=list(plan.deferred), held=summary, policy=policy.describe())
        stats.last_blocked = summary
    else:
        stats.last_blocked = None
    if not plan.purge:
        return plan
    assert plan.keep_from is not None  # plan_purge names the file that stays whenever it purges any
    try:
        purged = store.purge_to(plan.keep_from)
    except Exception as exc:
        stats.last_error = f"purge to {plan.keep_from} failed: {exc}"
        raise
    stats.last_error = None
    if catalog is not None:
        for name in purged:
            catalog.forget(name)
    stats.purges += 1
    stats.files_purged += len(purged)
    stats.bytes_purged += plan.bytes_freed
    stats.readers_evicted += len(plan.evicted)
    stats.last_purge = now
    return plan


ROTATION_POLL = 1.0  # seconds between looks for a rotation (a new current file) between checks


class RetentionTask:
    """Runs the policy every ``interval`` seconds on the event loop (``run()``), until cancelled.

    ``store`` and ``connections`` are callables, so a reopened store and the live connection table
    are always the ones looked at; ``catalog`` likewise returns the FileCatalog to keep in step (or
    None). ``stats`` is what metrics and status read.
    """

    def __init__(self, policy: RetentionPolicy, interval: float, store: Callable[[], StoreReader],
                 connections: Callable[[], Any] = lambda: (), catalog: Callable[[], Any] = lambda: None,
                 hold: Callable[[], str | None] | None = None):
        if not interval > 0:
            raise ValueError(f"retention interval must be positive, got {interval!r}")
        self.policy = policy
        self.interval = interval
        self._store = store
        self._connections = connections
        self._catalog = catalog
        self._hold = hold  # the archive's first file not sealed in the bucket (purge_with_policy)
        self._own_catalog: FileCatalog | None = None  # for the gtid_purged in the log when nobody else keeps one
        self.stats = RetentionStats()

    async def run(self) -> None:
        """Check now, then every ``interval`` seconds, and within ``ROTATION_POLL`` seconds of each rotation:
        a new file is when a limit is crossed, so waiting for the interval would overshoot it by up to an
        interval of binlog. Noticing a rotation costs one comparison of the current file's name."""
        log.info("retention enabled", policy=self.policy.describe(), interval=self.interval)
        loop = asyncio.get_running_loop()
        while True:
            await self.check()
            checked = self._current_file()
            deadline = loop.time() + self.interval
            while (left := deadline - loop.time()) > 0:
                await asyncio.sleep(min(ROTATION_POLL, left))
                if self._current_file() != checked:
                    break

    def _current_file(self) -> str | None:
        return self._store().current_file

    async def check(self) -> PurgePlan | None:
        """One check now; never raises (a failure is logged and kept in ``stats.last_error``)."""
        store = self._store()
        if store.read_only:
            return None  # relayproxy serve: never purges what it serves
        catalog = self._catalog_for(store)
        try:
            plan = purge_with_policy(store, self._connections(), self.policy, self.stats, catalog=catalog,
                                     hold=self._hold)
        except Exception as exc:
            log.error("retention purge failed", error=str(exc), policy=self.policy.describe())
            self.stats.last_error = self.stats.last_error or str(exc)
            return None
        if plan.purge:
            try:
                # The 5.6.22 merge may scan closed files once: off the loop, as the SQL layer does.
                purged_set = _gtid_text(await asyncio.to_thread(catalog.purged))
            except Exception as exc:  # only for the log line
                purged_set = f"(cannot compute: {exc})"
            log.info(
                "relay files purged by retention", files=list(plan.purge), reason=plan.reason_summary(),
                bytes_freed=plan.bytes_freed, keep_from=plan.keep_from, gtid_purged=purged_set,
                evicted=[r.who for r in plan.evicted] or None, policy=self.policy.describe(),
            )
        return plan


    def _catalog_for(self, store: StoreReader) -> FileCatalog:
        catalog = self._catalog()
        if catalog is not None:
            return catalog
        if self._own_catalog is None or self._own_catalog._store is not store:
            from .catalog import FileCatalog

            self._own_catalog = FileCatalog(store)
        return self._own_catalog


def _gtid_text(gtids) -> str | None:
    if gtids is None:
        return None
    fmt = getattr(gtids, "format", None)
    return fmt(",") if fmt is not None else str(gtids)
