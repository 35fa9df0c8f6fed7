"""The target of `relayproxy pitr` in its flavour's words: where it is (MariaDB gtid_slave_pos, MySQL gtid_executed),
whether it replicates from elsewhere, the replay connection to the relay, and its end.

MariaDB: a named connection, ``relayproxy_pitr`` (multi-source), so the replay is told apart from any replication the
instance had; parallel apply with ``slave_parallel_threads`` and ``slave_parallel_mode = optimistic`` on that
connection. MySQL: the default channel by GTID auto-position, the start added to ``gtid_purged``, parallel apply with
``replica_parallel_workers``; shown against the scripted MySQL 8.0 replica of the tests only (no MySQL server runs
here), so a MySQL target's words are MySQL 8.0's documented ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..binlog.gtid import GtidSet, MariaGtidPosition
from ..downstream.sql.replication_parser import ChangeMaster, render_change_master
from ..upstream.repoint import sql_string
from . import pitr_plan as PP
from . import promotion as P
from .promote import Server, Stop

CONNECTION = "relayproxy_pitr"  # MariaDB's connection name for the replay


@dataclass(frozen=True)
class Status:
    """The replay link's state as the target reports it."""

    io_running: str
    sql_running: str
    io_errno: int
    io_error: str
    sql_errno: int
    sql_error: str


@dataclass(frozen=True)
class StartPlan:
    """Where the replay starts, what must be set on the target first (``setup``: statements), and why."""

    position: Any
    setup: tuple[str, ...]
    resumed: bool
    source: str


def _same_host(host: str, want: str) -> bool:
    return host == want or {host, want} <= {"127.0.0.1", "localhost"}


class MariaTarget:
    flavour = "mariadb"

    def __init__(self, server: Server):
        self.server = server

    @property
    def name(self) -> str:
        return self.server.name

    def parse(self, text: str, what: str) -> MariaGtidPosition:
        return PP.parse_position(text, what)

    def text(self, position: MariaGtidPosition) -> str:
        return str(position)

    def position(self) -> MariaGtidPosition:
        return self.parse(str(self.server.value("SELECT @@GLOBAL.gtid_slave_pos") or ""), f"{self.name} gtid_slave_pos")

    def plan_start(self, now: MariaGtidPosition, given_text: str | None, source: str) -> StartPlan:
        given = self.parse(given_text, source) if given_text is not None else None
        start = PP.decide_start(now, given, source)
        setup = (f"SET GLOBAL gtid_slave_pos = {sql_string(str(start.position))}",) if start.set_slave_pos else ()
        return StartPlan(start.position, setup, start.resumed, start.source)

    def past(self, position: MariaGtidPosition, stop: MariaGtidPosition, known: MariaGtidPosition) -> str:
        return "; ".join(PP.past_stop(position, stop, known))

    def reached(self, position: MariaGtidPosition, stop: MariaGtidPosition) -> bool:
        return PP.reached(position, stop)

    def newest(self, position: MariaGtidPosition, stop: MariaGtidPosition) -> list[str]:
        """The newest GTID applied in each domain still short of the stop (progress)."""
        out = []
        for gtid in PP.remaining_domains(position, stop):
            mine = position.get(gtid.domain_id)
            if mine is not None:
                out.append(str(mine))
        return out

    def _connections(self) -> list[dict]:
        return self.server.rows("SHOW ALL SLAVES STATUS")

    def check(self, relay: tuple[str, int]) -> bool:
        """Refuse a target replicating from elsewhere; True when a previous run's replay connection is there."""
        ours = False
        for conn in self._connections():
            name = str(conn.get("Connection_name", ""))
            running = [t for t in ("Slave_IO_Running", "Slave_SQL_Running") if str(conn.get(t, "No")) == "Yes"]
            host, port = str(conn.get("Master_Host") or ""), int(conn.get("Master_Port") or 0)
            if name.lower() == CONNECTION:
                if port != relay[1] or not _same_host(host, relay[0]):
                    raise Stop(P.EXIT_REFUSED, f"{self.name} has a '{CONNECTION}' connection to {host}:{port}, not to "
                               f"this relay: another replay's? Finish it, or RESET SLAVE '{CONNECTION}' ALL")
                ours = True
            elif running:
                raise Stop(P.EXIT_REFUSED, f"{self.name} is replicating from {host}:{port} (connection '{name}', "
                           f"{' and '.join(running)} Yes): a replay onto it would mix two histories; STOP SLAVE "
                           f"'{name}' (and RESET SLAVE '{name}' ALL) first")
        return ours

    def ours(self) -> bool:
        return any(str(c.get("Connection_name", "")).lower() == CONNECTION for c in self._connections())

    def stop(self) -> None:
        self.server.execute(f"STOP SLAVE '{CONNECTION}'")

    def parallel(self) -> int:
        return int(self.server.value("SELECT @@GLOBAL.slave_parallel_threads") or 0)

    def set_parallel(self, n: int) -> None:
        self.server.execute(f"SET GLOBAL slave_parallel_threads = {int(n)}")

    def any_running(self) -> bool:
        return any(str(c.get("Slave_SQL_Running")) == "Yes" or str(c.get("Slave_IO_Running")) == "Yes"
                   for c in self._connections())

    def start(self, host: str, port: int, user: str, password: str, parallel: int) -> None:
        s = self.server
        s.execute(render_change_master(ChangeMaster.for_server(
            "mariadb", connection=CONNECTION, host=host, port=port, user=user, password=password, connect_retry=1,
            heartbeat_period=1, gtid=True)))
        if parallel:
            s.execute(f"SET GLOBAL {CONNECTION}.slave_parallel_mode = 'optimistic'")
        s.execute(f"START SLAVE '{CONNECTION}'")

    def status(self) -> Status | None:
        conn = next((c for c in self._connections() if str(c.get("Connection_name", "")).lower() == CONNECTION), None)
        if conn is None:
            return None
        return Status(str(conn.get("Slave_IO_Running")), str(conn.get("Slave_SQL_Running")),
                      int(conn.get("Last_IO_Errno") or 0), str(conn.get("Last_IO_Error") or ""),
                      int(conn.get("Last_SQL_Errno") or 0), str(conn.get("Last_SQL_Error") or ""))

    def reset(self) -> None:
        self.server.execute(f"RESET SLAVE '{CONNECTION}' ALL")

    def start_held(self, relay, start: MariaGtidPosition, stop: MariaGtidPosition) -> tuple[str, int]:
        """Every GTID of the start in a domain the relay has is in the relay's history (or is its first file's starting
        state); the start's place in the relay's files (the earliest, for the range)."""
        first, at_first = relay.history_start()
        files = relay.file_names()
        begin: tuple[str, int] | None = None
        for gtid in start:
            if gtid.domain_id not in {g.domain_id for g in stop}:
                continue  # a domain the relay never had: nothing to replay in it
            origin = at_first.get(gtid.domain_id)
            if origin is not None and origin == gtid:
                here = (first, 4)
            else:
                txn = relay.transaction_for_gtid(str(gtid))
                if txn is None:
                    if origin is not None and gtid.seq_no < origin.seq_no:
                        raise Stop(P.EXIT_REFUSED, f"the start {gtid} (domain {gtid.domain_id}) is purged from the "
                                   f"relay: its history starts at {first}, after {at_first}")
                    raise Stop(P.EXIT_REFUSED, f"the start's GTID {gtid} is not in the relay's history (it starts at "
                               f"{first}, after {at_first or 'nothing'}): the backup is not of this master's history, "
                               "or the relay has not received it yet")
                here = (txn.file, txn.end)
            if begin is None or (files.index(here[0]), here[1]) < (files.index(begin[0]), begin[1]):
                begin = here
        return begin or (first, 4)


class MysqlTarget(MariaTarget):
    flavour = "mysql"

    def parse(self, text: str, what: str) -> GtidSet:
        return PP.parse_set(text, what)

    def text(self, position: GtidSet) -> str:
        return position.format(",")

    def position(self) -> GtidSet:
        return self.parse(str(self.server.value("SELECT @@GLOBAL.gtid_executed") or ""), f"{self.name} gtid_executed")

    def plan_start(self, now: GtidSet, given_text: str | None, source: str) -> StartPlan:
        given = self.parse(given_text, source) if given_text is not None else None
        start = PP.mysql_decide_start(now, given, source)
        setup: tuple[str, ...] = ()
        if start.purge:
            value = start.purge.format(",")
            setup = (f"SET GLOBAL gtid_purged = {sql_string(value if not now else '+' + value)}",)
        return StartPlan(start.executed, setup, start.resumed, start.source)

    def past(self, position: GtidSet, stop: GtidSet, known: GtidSet) -> str:
        past = PP.mysql_past_stop(position, stop, known)
        return f"{past.format(',')} (not in the stop's set {stop.format(',')})" if past else ""

    def reached(self, position: GtidSet, stop: GtidSet) -> bool:
        return PP.mysql_reached(position, stop)

    def newest(self, position: GtidSet, stop: GtidSet) -> list[str]:
        last: dict[tuple[str, str], int] = {}
        for sid, tag, _first, end in position.intersect(stop).intervals():
            last[(sid, tag)] = end
        return [f"{sid}:{tag + ':' if tag else ''}{end}" for (sid, tag), end in last.items()]

    def _words(self) -> dict[str, str]:
        new = self.server.at_least(8, 0, 22)
        return {"replica": "REPLICA" if new else "SLAVE", "col": "Source" if new else "Master",
                "thread": "Replica" if new else "Slave"}

    def _connections(self) -> list[dict]:
        return self.server.rows(f"SHOW {self._words()['replica']} STATUS")

    def _ours_row(self, relay: tuple[str, int] | None = None) -> dict | None:
        w = self._words()
        for conn in self._connections():
            host, port = str(conn.get(f"{w['col']}_Host") or ""), int(conn.get(f"{w['col']}_Port") or 0)
            if relay is None or (port == relay[1] and _same_host(host, relay[0])):
                return conn
        return None

    def check(self, relay: tuple[str, int]) -> bool:
        w = self._words()
        for conn in self._connections():
            host, port = str(conn.get(f"{w['col']}_Host") or ""), int(conn.get(f"{w['col']}_Port") or 0)
            running = [t for t in (f"{w['thread']}_IO_Running", f"{w['thread']}_SQL_Running")
                       if str(conn.get(t, "No")) == "Yes"]
            if port == relay[1] and _same_host(host, relay[0]):
                return True
            if running:
                raise Stop(P.EXIT_REFUSED, f"{self.name} is replicating from {host}:{port} ({' and '.join(running)} "
                           f"Yes): a replay onto it would mix two histories; STOP {w['replica']} and RESET "
                           f"{w['replica']} ALL first")
        return False

    def ours(self) -> bool:
        return self._ours_row() is not None

    def stop(self) -> None:
        self.server.execute(f"STOP {self._words()['replica']}")

    def parallel(self) -> int:
        try:
            return int(self.server.value("SELECT @@GLOBAL.replica_parallel_workers") or 0)
        except Stop as exc:
            if exc.code != P.EXIT_REFUSED:
                raise
            return -1  # a server without the variable (the scripted one): left alone

    def set_parallel(self, n: int) -> None:
        if self.parallel() >= 0:
            self.server.execute(f"SET GLOBAL replica_parallel_workers = {int(n)}")

    def any_running(self) -> bool:
        w = self._words()
        return any(str(c.get(f"{w['thread']}_SQL_Running")) == "Yes" or str(c.get(f"{w['thread']}_IO_Running")) ==
                   "Yes" for c in self._connections())

    def start(self, host: str, port: int, user: str, password: str, parallel: int) -> None:
        key = {"get_public_key": True} if self.server.at_least(8, 0, 4) else {}
        self.server.execute(render_change_master(ChangeMaster.for_server(
            "mysql", self.server.version_tuple, host=host, port=port, user=user, password=password, gtid=True,
            connect_retry=1, **key)))
        self.server.execute(f"START {self._words()['replica']}")

    def status(self) -> Status | None:
        conn = self._ours_row()
        if conn is None:
            return None
        t = self._words()["thread"]
        return Status(str(conn.get(f"{t}_IO_Running")), str(conn.get(f"{t}_SQL_Running")),
                      int(conn.get("Last_IO_Errno") or 0), str(conn.get("Last_IO_Error") or ""),
                      int(conn.get("Last_SQL_Errno") or 0), str(conn.get("Last_SQL_Error") or ""))

    def reset(self) -> None:
        self.server.execute(f"RESET {self._words()['replica']} ALL")

    def start_held(self, relay, start: GtidSet, stop: GtidSet) -> tuple[str, int]:
        """The start holds what the relay purged (else the relay cannot serve what the target lacks) and, of the
        relay's servers, nothing the relay has not received; its place in the relay's files."""
        first, at_first = relay.history_start()
        files = relay.file_names()
        lacking = at_first.subtract(start)
        if lacking:
            raise Stop(P.EXIT_REFUSED, f"the relay's history starts at {first}, after {at_first.format(',')}: the start "
                       f"lacks {lacking.format(',')}, which the relay no longer holds (purged)")
        ahead = PP.mysql_past_stop(start, stop)
        if ahead:
            raise Stop(P.EXIT_REFUSED, f"the start holds {ahead.format(',')}, past the stop")
        begin: tuple[str, int] | None = None
        for sid, tag, _first, last in start.intersect(stop).intervals():
            gtid = f"{sid}:{tag + ':' if tag else ''}{last}"
            txn = relay.transaction_for_gtid(gtid)
            here = (txn.file, txn.end) if txn is not None else (first, 4)
            if begin is None or (files.index(here[0]), here[1]) < (files.index(begin[0]), begin[1]):
                begin = here
        return begin or (first, 4)


def target_for(server: Server) -> MariaTarget:
    return MariaTarget(server) if server.flavour == "mariadb" else MysqlTarget(server)
