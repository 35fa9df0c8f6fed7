"""What `relayproxy pitr` decides before it changes anything (sans I/O, as promotion.decide): where the replay starts
on the target, whether the target may be replayed to the stop at all, and when it is done.

MariaDB GTID positions are compared per domain by sequence number (as the servers do with gtid_strict_mode);
``server_id`` only names a GTID's origin, except where a GTID must be found in the relay's history, where the
whole GTID must match. MySQL's are GTID sets (``gtid_executed``): the ``mysql_*`` functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import tzinfo
from pathlib import Path

from ..binlog.gtid import GtidSet, MariaGtid, MariaGtidPosition
from ..relay.txindex import format_time_utc, parse_time, time_has_zone

BACKUP_INFO_FILES = ("mariadb_backup_binlog_info", "xtrabackup_binlog_info")


class PlanRefusal(Exception):
    """The replay must not run as asked (the message says what is wrong and what to do)."""


@dataclass(frozen=True)
class BackupInfo:
    """What a backup says of its binlog position: ``mariadb_backup_binlog_info`` (or xtrabackup's)."""

    path: str
    file: str
    position: int
    gtid_text: str

    @property
    def gtid(self) -> MariaGtidPosition:
        return parse_position(self.gtid_text, self.path)

    def gtid_set(self) -> GtidSet:
        return parse_set(self.gtid_text, self.path)


def read_backup_info(directory: str | Path) -> BackupInfo:
    """The binlog position a backup directory records; PlanRefusal naming the file when it has none usable."""
    directory = Path(directory)
    if not directory.is_dir():
        raise PlanRefusal(f"--from-backup {directory}: not a directory")
    for name in BACKUP_INFO_FILES:
        path = directory / name
        try:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise PlanRefusal(f"{path}: cannot read it: {exc.strerror or exc}") from None
        fields = text.split("\t") if "\t" in text else text.split()
        if len(fields) < 2 or not fields[1].isdigit():
            raise PlanRefusal(f"{path}: expected 'file<TAB>position<TAB>gtid', found {text[:200]!r}")
        gtid_text = "".join(fields[2:]).replace("\n", "").replace(" ", "") if len(fields) > 2 else ""
        if not gtid_text:
            raise PlanRefusal(f"{path}: the backup records no GTID position (only {fields[0]}:{fields[1]}); "
                              "give the start with --from-gtid")
        return BackupInfo(str(path), fields[0], int(fields[1]), gtid_text)
    raise PlanRefusal(f"--from-backup {directory}: no {' or '.join(BACKUP_INFO_FILES)} in it (is it a prepared "
                      "mariadb-backup / xtrabackup directory?)")


def parse_position(text: str, what: str) -> MariaGtidPosition:
    try:
        return MariaGtidPosition.parse((text or "").replace("\n", "").replace(" ", ""))
    except ValueError as exc:
        raise PlanRefusal(f"{what}: {exc}") from None


def parse_set(text: str, what: str) -> GtidSet:
    try:
        return GtidSet.parse((text or "").replace("\n", ""))
    except ValueError as exc:
        raise PlanRefusal(f"{what}: {exc}") from None


@dataclass(frozen=True)
class Start:
    """Where the replay starts: the target's GTID position once set (``set_slave_pos``: pitr must SET GLOBAL
    gtid_slave_pos to it first) and why."""

    position: MariaGtidPosition
    set_slave_pos: bool
    resumed: bool
    source: str


def decide_start(target_slave_pos: MariaGtidPosition, given: MariaGtidPosition | None, source: str) -> Start:
    """The start of the replay. With a position from the backup or --from-gtid: per domain the further of it and the
    target's own gtid_slave_pos, so a run again after an interruption continues from what the target applied (its
    gtid_slave_pos is transactional: it moved with every transaction applied) and never goes back to the backup's.
    Without one: the target's gtid_slave_pos, which must not be empty."""
    if given is None:
        if not len(target_slave_pos):
            raise PlanRefusal("no start: the target's gtid_slave_pos is empty; give --from-backup DIR (the prepared "
                              "backup it was restored from) or --from-gtid SET")
        return Start(target_slave_pos.copy(), False, False, "the target's gtid_slave_pos")
    merged = target_slave_pos.copy()
    for gtid in given:
        mine = merged.get(gtid.domain_id)
        if mine is None or mine.seq_no < gtid.seq_no:
            merged.update(gtid)
    resumed = any(target_slave_pos.contains(g) and target_slave_pos.get(g.domain_id).seq_no > g.seq_no
                  for g in given)
    return Start(merged, merged != target_slave_pos, resumed,
                 source + (" (the target has applied past it: continuing from its gtid_slave_pos)" if resumed else ""))


def past_stop(position: MariaGtidPosition, stop: MariaGtidPosition, known: MariaGtidPosition | None = None) -> list[str]:
    """What ``position`` has past ``stop``, per domain: text naming the GTIDs (empty: nothing). ``known``: the relay's
    whole history (its state at the horizon); a domain it has that the stop lacks starts after the stop."""
    out = []
    for gtid in position:
        at = stop.get(gtid.domain_id)
        if at is None and known is not None and known.get(gtid.domain_id) is not None:
            out.append(f"domain {gtid.domain_id}: {gtid} (the stop is before the relay's first transaction of domain "
                       f"{gtid.domain_id})")
        elif at is not None and gtid.seq_no > at.seq_no:
            out.append(f"domain {gtid.domain_id}: {gtid} (the stop is at {at}; transactions "
                       f"{gtid.domain_id}-*-{at.seq_no + 1}..{gtid.seq_no} are past it)")
    return out


def reached(position: MariaGtidPosition, stop: MariaGtidPosition) -> bool:
    """The replay is done: the target is at the stop in every domain the stop has."""
    return all(position.get(g.domain_id) is not None and position.get(g.domain_id).seq_no == g.seq_no for g in stop)


def remaining_domains(position: MariaGtidPosition, stop: MariaGtidPosition) -> list[MariaGtid]:
    return [g for g in stop if position.get(g.domain_id) is None or position.get(g.domain_id).seq_no < g.seq_no]


# -- MySQL: GTID sets -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MysqlStart:
    """Where a MySQL target's replay starts: its gtid_executed once ``purge`` (a GTID set text, or None) is added to
    its gtid_purged (``SET GLOBAL gtid_purged = '+...'``; the whole set on an empty target)."""

    executed: GtidSet
    purge: GtidSet | None
    resumed: bool
    source: str


def mysql_decide_start(executed: GtidSet, given: GtidSet | None, source: str) -> MysqlStart:
    """As ``decide_start`` for GTID sets: a target holding the backup's set (or more: a run after an interruption)
    starts from what it holds; one holding less gets the rest added to gtid_purged; one whose set and the backup's
    diverge is refused (it holds transactions the backup does not, and lacks some it has)."""
    if given is None:
        if not executed:
            raise PlanRefusal("no start: the target's gtid_executed is empty; give --from-backup DIR (the prepared "
                              "backup it was restored from) or --from-gtid SET")
        return MysqlStart(executed.copy(), None, False, "the target's gtid_executed")
    if given.is_subset(executed):
        resumed = not executed.is_subset(given)
        return MysqlStart(executed.copy(), None, resumed, source + (
            " (the target holds more: continuing from its gtid_executed)" if resumed else ""))
    if executed.is_subset(given):
        return MysqlStart(given.copy(), given.subtract(executed), False, source)
    raise PlanRefusal(f"the target's gtid_executed ({executed.format(',')}) and the start {given.format(',')} "
                      f"diverge: the target holds {executed.subtract(given).format(',')} that the start lacks; "
                      "restore the backup again")


def mysql_past_stop(executed: GtidSet, stop: GtidSet, known: GtidSet | None = None) -> GtidSet:
    """What ``executed`` holds of the stop's servers (UUIDs; with ``known``, the relay's whole history, of every
    server it has) that the stop does not: past the stop."""
    uuids = set(stop.sids()) | set(known.sids() if known is not None else ())
    past = executed.subtract(stop)
    out = GtidSet()
    for sid, tag, first, last in past.intervals():
        if sid in uuids:
            out.add_interval(sid, first, last + 1, tag)
    return out


def mysql_reached(executed: GtidSet, stop: GtidSet) -> bool:
    return stop.is_subset(executed) and not mysql_past_stop(executed, stop)


# -- times ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Moment:
    """A time the operator named, in microseconds since the epoch, and the zone it was read in."""

    micros: int
    zone: str
    assumed_zone: bool
    fractional: bool

    def utc_text(self, micros: int | None = None) -> str:
        return format_time_utc(self.micros if micros is None else micros)


LOCAL_ZONE = "local"  # parse_moment's default_zone: the machine's local time, with its daylight-saving rules


def parse_moment(text: str, default_zone: tzinfo | str | None, zone_name: str) -> Moment:
    """'YYYY-MM-DD HH:MM:SS[.ffffff]' with an offset (+02:00) or Z, or without one in ``default_zone`` (said): the
    transaction index's time syntax (txindex.parse_time), refused here without a zone when there is no default.
    ``LOCAL_ZONE``: the machine's local time at that date (its DST rules, as `relayproxy find` reads it), not the
    offset in force now."""
    assumed = not time_has_zone(text)
    if assumed and default_zone is None:
        raise PlanRefusal(f"time {text!r} has no time zone: add an offset (+02:00, Z) or give --time-zone")
    try:
        micros = parse_time(text, default_zone if assumed and default_zone != LOCAL_ZONE else None)
    except ValueError as exc:
        raise PlanRefusal(str(exc)) from None
    return Moment(micros, zone_name if assumed else "as given", assumed, micros % 1_000_000 != 0)
