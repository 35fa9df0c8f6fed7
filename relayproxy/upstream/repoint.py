"""Repointing the relay to another master by file/position: the rules that turn a (file, position) of the new master
into its GTID state there, and the switch decision with what it was based on. No I/O: the upstream session asks
the master (SHOW BINARY LOGS, SHOW BINLOG EVENTS, BINLOG_GTID_POS) and feeds the answers here.

An HA tool such as MHA repoints a replica of a promoted MariaDB/MySQL master with the new master's own
coordinates (``SHOW MASTER STATUS``), no GTID option. The relay's files are one continuous history, so it never
resumes at a position a client names on another server: it translates that position into the new master's GTIDs
(what the new master had logged before it), logs and shows the translation, and joins the new master by GTID
from its OWN horizon, the same way as a switch asked with ``MASTER_USE_GTID`` / ``MASTER_AUTO_POSITION``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..binlog.gtid import GtidSet, MariaBinlogState, MariaGtidPosition
from ..wire.sqltext import sql_string  # re-exported: the upstream modules and pitr quote through it

__all__ = [
    "BOUNDARY_EVENT_TYPES",
    "BadCoordinates",
    "SwitchDecision",
    "check_boundary",
    "check_coordinates",
    "decide_switch",
    "mysql_gtids_at",
    "sql_string",
]

# SHOW BINLOG EVENTS Event_type names of events that may sit at a transaction boundary: the file's own header
# events, the first event of a transaction (its GTID event), and the file's end. Any other event at a position
# means the position is inside a transaction (BINLOG_GTID_POS would count that transaction as done).
BOUNDARY_EVENT_TYPES = frozenset({
    "Format_desc", "Gtid_list", "Binlog_checkpoint", "Start_encryption",  # MariaDB headers
    "Previous_gtids",  # MySQL header
    "Gtid", "Anonymous_Gtid", "Gtid_tagged",  # a transaction's first event
    "Rotate", "Stop",  # a file's end
})

_MYSQL_GTID_NEXT = re.compile(r"GTID_NEXT\s*=\s*'([^']+)'", re.IGNORECASE)


class BadCoordinates(ValueError):
    """MASTER_LOG_FILE/MASTER_LOG_POS do not name a transaction boundary of the new master; the message says what
    is wrong with them."""


def check_coordinates(file: str, pos: int, logs: Iterable[tuple[str, int]], address: str) -> int:
    """The size of ``file`` on the new master when ``pos`` can lie in it; raises BadCoordinates naming the problem
    (a file the master does not have, a position beyond its end). Whether ``pos`` starts an event is asked next."""
    sizes = dict(logs)
    if file not in sizes:
        names = list(sizes)
        have = f"{names[0]}..{names[-1]}" if len(names) > 1 else names[0] if names else "none"
        raise BadCoordinates(f"MASTER_LOG_FILE '{file}' is not one of the binary logs of the new master {address} "
                             f"(it has {have})")
    if pos > sizes[file]:
        raise BadCoordinates(f"MASTER_LOG_POS {pos} is beyond the end of {file} on the new master {address} "
                             f"({sizes[file]} bytes)")
    return sizes[file]


def check_boundary(file: str, pos: int, size: int, event_type: str | None, event_error: str | None,
                   address: str) -> None:
    """Raises BadCoordinates unless ``pos`` is at the end of ``file`` or at an event that starts no part of a
    transaction's body (see BOUNDARY_EVENT_TYPES)."""
    if pos >= size or pos == 4:
        return
    if event_error is not None:
        raise BadCoordinates(f"MASTER_LOG_POS {pos} is not the start of an event in {file} on the new master "
                             f"{address} ({event_error})")
    if event_type is None:
        return  # no event there: the end of what the master has written so far
    if event_type not in BOUNDARY_EVENT_TYPES:
        raise BadCoordinates(f"{file}:{pos} is inside a transaction on the new master {address} (the event there "
                             f"is a {event_type}): give the position where a transaction starts or ends, as "
                             "SHOW MASTER STATUS shows it")


def mysql_gtids_at(rows: Iterable[tuple[Any, ...]], pos: int) -> GtidSet:
    """The GTID set a MySQL master had logged at ``pos`` of one file: the file's Previous_gtids plus the GTIDs of
    its transactions that start before ``pos``. ``rows`` are SHOW BINLOG EVENTS rows of that file from its start
    (Log_name, Pos, Event_type, Server_id, End_log_pos, Info), in order; rows at or after ``pos`` are ignored."""
    gtids = GtidSet()
    for row in rows:
        at, event_type, info = int(row[1]), str(row[2]), str(row[5] or "")
        if at >= pos:
            break
        if event_type == "Previous_gtids":
            gtids.update(GtidSet.parse(" ".join(info.split())) if info.strip() else GtidSet())
        elif event_type in ("Gtid", "Gtid_tagged"):
            found = _MYSQL_GTID_NEXT.search(info)
            if found is None:
                raise BadCoordinates(f"cannot read the GTID of the event at {row[0]}:{at} ({info[:80]!r})")
            gtids.update(GtidSet.parse(found.group(1)))
    return gtids


def _maria_gap(have: MariaGtidPosition, want: MariaGtidPosition) -> str:
    """What ``want`` has beyond ``have``, per domain, as MariaDB GTID ranges ('' when nothing)."""
    parts = []
    for gtid in want:
        mine = have.get(gtid.domain_id)
        if mine is None:
            parts.append(f"{gtid.domain_id}-{gtid.server_id}-1..{gtid}" if gtid.seq_no > 1 else str(gtid))
        elif mine.seq_no < gtid.seq_no:
            first = f"{gtid.domain_id}-{gtid.server_id}-{mine.seq_no + 1}"
            parts.append(first if mine.seq_no + 1 == gtid.seq_no else f"{first}..{gtid}")
    return ",".join(parts)


@dataclass(frozen=True)
class SwitchDecision:
    """One switch of masters as decided (for the log and /status ``last_switch``).

    ``coordinates`` the (file, position) CHANGE MASTER gave (None for a switch asked by GTID), ``translated`` the
    new master's GTID state there, ``relay`` the relay's GTID set (its horizon), ``missing`` what the relay holds
    and the new master lacks (the switch is refused when it is not empty), ``behind`` what the new master had at
    the coordinates and the relay lacks (fetched: the relay joins from its own horizon, never from the
    coordinates), ``beyond`` what the relay holds past the coordinates (not fetched again)."""

    master: str
    server_id: int
    coordinates: tuple[str, int] | None
    translated: str | None
    relay: str
    missing: str
    behind: str | None
    beyond: str | None
    at: float

    @property
    def accepted(self) -> bool:
        return not self.missing

    @property
    def decision(self) -> str:
        if self.missing:
            return "refused: the new master lacks GTIDs the relay holds"
        return "joined by GTID from the relay's horizon"

    def describe(self) -> dict[str, Any]:
        return {
            "master": self.master, "server_id": self.server_id,
            "coordinates": ({"file": self.coordinates[0], "position": self.coordinates[1]}
                            if self.coordinates is not None else None),
            "coordinates_gtids": self.translated, "relay_gtids": self.relay, "missing_on_master": self.missing or None,
            "relay_behind_coordinates": self.behind or None, "relay_beyond_coordinates": self.beyond or None,
            "decision": self.decision, "accepted": self.accepted, "at": self.at,
        }


def decide_switch(*, master: str, server_id: int, relay: GtidSet | MariaBinlogState, missing: str,
                  coordinates: tuple[str, int] | None = None,
                  translated: GtidSet | MariaGtidPosition | None = None, at: float = 0.0) -> SwitchDecision:
    """The decision for a switch to ``master``: accepted iff ``missing`` (the relay's GTIDs the master lacks, as
    the session computed them from the master's whole GTID state) is empty; the coordinates' translation is
    compared with the relay's set for the record (what the relay will fetch before the coordinates, and what it
    holds beyond them)."""
    behind = beyond = None
    if translated is not None:
        if isinstance(relay, GtidSet):
            assert isinstance(translated, GtidSet)
            behind, beyond = str(translated.subtract(relay)), str(relay.subtract(translated))
        else:
            assert isinstance(translated, MariaGtidPosition)
            position = relay.current_position()
            behind, beyond = _maria_gap(position, translated), _maria_gap(translated, position)
    relay_text = str(relay.current_position()) if isinstance(relay, MariaBinlogState) else str(relay)
    return SwitchDecision(master=master, server_id=server_id, coordinates=coordinates,
                          translated=None if translated is None else str(translated), relay=relay_text,
                          missing=missing, behind=behind, beyond=beyond, at=at)

