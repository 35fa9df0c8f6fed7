"""`relayproxy promote`: the hook an HA manager runs once it has chosen a candidate after the master died. It catches
the candidate up from the most advanced relay by GTID (every commit a semi-sync master had acknowledged is in a
relay), promotes it, and repoints the relays and the given replicas to it.

Steps (each one safe to repeat, so running the command again after an interruption converges):

1. read: every relay's complete-transaction history and master, the candidate's executed history; decide
   (promotion.decide): the most advanced relay, what the candidate lacks, errant GTIDs; refuse on divergence.
2. fence the relays: STOP SLAVE on each relay still following the old master, so nothing more arrives from a
   master that may be half alive (fencing the master itself is the HA tool's job); read their histories again.
3. fence the candidate's own link: STOP SLAVE IO_THREAD, and let its SQL thread apply what it has received.
4. catch up: CHANGE MASTER TO the most advanced relay by GTID, START SLAVE, wait until the candidate holds it.
5. promote: STOP SLAVE, RESET SLAVE ALL (left for the HA tool with --no-reset-replica: MHA resets it itself), read_only
   = 0 (and super_read_only = 0 on MySQL).
6. repoint every relay, then every --replica, to the candidate by GTID, and see the relays streaming from it.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import pymysql

from ..downstream.sql.replication_parser import ChangeMaster, render_change_master
from . import promotion as P

DEFAULT_TIMEOUT = 300.0
CONNECT_TIMEOUT = 5
_UNREACHABLE_CODES = {2003, 2005, 2006, 2013, 1040, 1129}
_LOGIN_CODES = {1044, 1045, 1698, 2059, 2061}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "exit codes: 0 done (also when a repeated run finds the promotion done); 1 internal error; 2 usage;\n"
        "3 refused (relays of different masters or diverged, the candidate no replica, --strict and errant GTIDs,\n"
        "  a server refused a statement); 4 unreachable (a server could not be reached or logged into);\n"
        "5 timed out (the candidate is left replicating from the relay: run again to continue);\n"
        "6 promoted, but a relay or --replica could not be repointed (the message names it).")
    add = parser.add_argument
    add("--candidate", required=True, metavar="HOST:PORT", help="the replica to promote")
    add("--candidate-user", required=True, metavar="USER", help="an account on the candidate with SUPER or "
        "equivalent (STOP/START SLAVE, CHANGE MASTER, SET GLOBAL read_only)")
    add("--candidate-password-file", required=True, metavar="FILE", help="file holding that account's password")
    add("--relay", required=True, action="append", metavar="HOST:PORT", help="a relay's --listen address "
        "(repeat for every relay of the failed master)")
    add("--relay-user", required=True, metavar="USER", help="an admin account on the relays")
    add("--relay-password-file", required=True, metavar="FILE", help="file holding that account's password")
    add("--replica", action="append", default=[], metavar="HOST:PORT",
        help="another replica of the failed master to repoint to the candidate by GTID (same account as the "
             "candidate); replicas behind a relay need nothing: they follow the relay")
    add("--repl-user", metavar="USER", help="replication account for the new links: the candidate's link to the "
        "relay (default: --relay-user) and the relays' and replicas' links to the candidate (default: each keeps "
        "the account it has)")
    add("--repl-password-file", metavar="FILE", help="file holding --repl-user's password")
    add("--candidate-address", metavar="HOST:PORT", help="the address relays and replicas use to reach the "
        "candidate (default: --candidate)")
    add("--dry-run", action="store_true", help="say what the candidate lacks and from which relay; change nothing")
    add("--json", action="store_true", help="print one JSON document on stdout (progress still goes to stderr)")
    add("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help=f"give up after this long in all (default {DEFAULT_TIMEOUT:.0f})")
    add("--strict", action="store_true", help="refuse when the candidate has GTIDs that no relay has")
    add("--candidate-detached", action="store_true",
        help="accept a candidate with no replication configured while it is read-only (an HA tool such as MHA "
             "detached it before calling this hook); a writable one is refused")
    add("--no-reset-replica", action="store_true",
        help="step 5 stops the candidate's replication but leaves it configured (pointing at the relay) for the HA "
             "tool to reset: MHA 0.58's last phase runs STOP SLAVE and RESET SLAVE ALL on the new master itself, and "
             "fails (exit 10) on a server that no longer replicates from anywhere")
    add("--skip-unreachable-relays", action="store_true",
        help="go on without a relay that cannot be reached (by default refused: a commit acknowledged only by "
             "that relay would be lost)")
    add("--quiet", action="store_true", help="no progress lines on stderr")


class Stop(Exception):
    """Ends the run with an exit code and a message naming the server and what was wrong."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def parse_address(text: str, flag: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise Stop(P.EXIT_USAGE, f"{flag} {text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def read_password(path: str | None, flag: str) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().rstrip("\r\n")
    except OSError as exc:
        raise Stop(P.EXIT_USAGE, f"{flag} {path}: cannot read it: {exc.strerror or exc}") from None


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _col(row: dict, *names: str, default: Any = None) -> Any:
    for name in names:
        if name in row:
            return row[name]
    return default


class Server:
    """One server we talk SQL to; errors become Stop with the server named."""

    def __init__(self, role: str, address: tuple[str, int], user: str, password: str, deadline: float):
        self.role, self.address, self.user, self.password = role, address, user, password
        self.name = f"{role} {address[0]}:{address[1]}"
        self.deadline = deadline
        self.conn: pymysql.connections.Connection | None = None
        self.version = ""

    def connect(self) -> Server:
        try:
            self.conn = pymysql.connect(host=self.address[0], port=self.address[1], user=self.user,
                                        password=self.password, connect_timeout=CONNECT_TIMEOUT, read_timeout=60,
                                        write_timeout=60, autocommit=True)
        except pymysql.MySQLError as exc:
            raise self._stop(exc, "connect") from None
        self.version = str(self.value("SELECT @@version"))
        return self

    @property
    def flavour(self) -> str:
        return "mariadb" if "mariadb" in self.version.lower() else "mysql"

    @property
    def version_tuple(self) -> tuple[int, ...]:
        parts = self.version.split("-")[0].split(".")[:3]
        return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in parts)

    def at_least(self, *version: int) -> bool:
        return self.version_tuple >= version

    def _stop(self, exc: Exception, statement: str) -> Stop:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
        text = exc.args[1] if len(exc.args) > 1 else str(exc)
        if statement == "connect" and code in _LOGIN_CODES:
            return Stop(P.EXIT_UNREACHABLE, f"{self.name}: login as {self.user!r} refused: {code} {text}")
        if code in _UNREACHABLE_CODES or isinstance(exc, (pymysql.err.InterfaceError, OSError)) or code == 0:
            return Stop(P.EXIT_UNREACHABLE, f"{self.name} is unreachable ({statement}): {code} {text}")
        return Stop(P.EXIT_REFUSED, f"{self.name} refused {statement!r}: {code} {text}")

    def rows(self, statement: str) -> list[dict]:
        if self.conn is None:
            self.connect()
        # no statement outlives the run's --timeout (a STOP SLAVE can wait on a blocked SQL thread for ever)
        left = self.deadline - time.monotonic()
        self.conn._read_timeout = self.conn._write_timeout = max(1.0, min(60.0, left + 1.0))
        try:
            with self.conn.cursor() as cur:
                cur.execute(statement)
                columns = [d[0] for d in cur.description or ()]
                return [dict(zip(columns, row)) for row in cur.fetchall()]
        except (pymysql.MySQLError, OSError) as exc:
            shown = statement if "PASSWORD" not in statement.upper() else statement.split(",")[0] + ", ..."
            if time.monotonic() >= self.deadline:
                self.close()
                raise Stop(P.EXIT_TIMED_OUT, f"timed out: {self.name} had not answered {shown!r} when the run's "
                                             "--timeout ran out; run the same command again to continue") from None
            stop = self._stop(exc, shown)
            if stop.code == P.EXIT_UNREACHABLE:
                self.close()
            raise stop from None

    def value(self, statement: str) -> Any:
        rows = self.rows(statement)
        return next(iter(rows[0].values())) if rows else None

    def execute(self, statement: str) -> None:
        self.rows(statement)

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001 - a dead connection closes as it can
                pass
            self.conn = None

    # -- replication, in the flavour's words ----------------------------------------------------------------------

    def _new_terms(self) -> bool:
        return self.flavour == "mysql" and self.at_least(8, 0, 22)

    def replica_status(self) -> dict | None:
        rows = self.rows("SHOW REPLICA STATUS" if self._new_terms() else "SHOW SLAVE STATUS")
        return rows[0] if rows else None

    def stop_replica(self, thread: str = "") -> None:
        self.execute(("STOP REPLICA" if self._new_terms() else "STOP SLAVE") + (f" {thread}" if thread else ""))

    def start_replica(self) -> None:
        self.execute("START REPLICA" if self._new_terms() else "START SLAVE")

    def change_master(self, host: str, port: int, user: str | None, password: str | None, *,
                      no_delay: bool = False, at: tuple[str, int] | None = None) -> None:
        """Point this server at host:port by GTID, or with `at` by file/position (a relay levelled from its peer)."""
        options: dict[str, Any] = {"host": host, "port": port}
        if no_delay:  # a delayed replica chosen as candidate catches up now (CHANGE MASTER keeps a delay it had)
            options["delay"] = 0
            if self.flavour == "mysql" and self.at_least(8, 0, 4):
                # caching_sha2_password without TLS needs the source's RSA key, which a MySQL replica asks for only
                # when told to (a relay account of that plugin would otherwise refuse the login: 2061)
                options["get_public_key"] = True
        if user is not None:
            options["user"] = user
        if password is not None:
            options["password"] = password
        if at is not None:
            options.update(log_file=at[0], log_pos=at[1])
        self.execute(render_change_master(ChangeMaster.for_server(self.flavour, self.version_tuple, gtid=at is None,
                                                                  **options)))

    def history(self, *, replica_side: bool) -> P.History:
        """What this server holds: MySQL gtid_executed; MariaDB gtid_binlog_state (merged with gtid_slave_pos for a
        replica, whose binlog may not log what it applies)."""
        if self.flavour == "mysql":
            return P.parse_history("mysql", self.value("SELECT @@GLOBAL.gtid_executed"))
        state = P.parse_history("mariadb", self.value("SELECT @@GLOBAL.gtid_binlog_state"))
        if replica_side:
            slave = P.MariaGtidPosition.parse(str(self.value("SELECT @@GLOBAL.gtid_slave_pos") or ""))
            state = P.merge_mariadb(state, slave)
        return state


@dataclass
class Report:
    """What the run did; printed for a person, or as one JSON document."""

    outcome: str = ""
    exit_code: int = 0
    message: str = ""
    dry_run: bool = False
    flavour: str = ""
    candidate: dict = field(default_factory=dict)
    relays: list[dict] = field(default_factory=list)
    replicas: list[dict] = field(default_factory=list)
    source_relay: str | None = None
    fetched: str = ""
    fetched_count: int = 0
    errant: str = ""
    unrelayed: str = ""
    warnings: list[str] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    total_seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def text(self) -> str:
        lines = [f"relayproxy promote: {self.outcome}" + (f": {self.message}" if self.message else "")]
        c = self.candidate
        if c:
            lines.append(f"  candidate {c.get('address')} (server_id {c.get('server_id')}): "
                         f"before {c.get('before')!r}" + (f", after {c.get('after')!r}" if c.get("after") else ""))
        for r in self.relays:
            state = "unreachable" if not r.get("reachable") else f"{r.get('gtids')!r}"
            lines.append(f"  relay {r['address']}: {state}" + (f" ({r['note']})" if r.get("note") else ""))
        if self.source_relay:
            lines.append(f"  caught up from relay {self.source_relay}: "
                         + (f"{self.fetched} ({self.fetched_count} transactions)" if self.fetched else "nothing lacking"))
        if self.errant:
            lines.append(f"  errant (on the candidate, in no relay, not from the failed master): {self.errant}")
        if self.unrelayed:
            lines.append(f"  the failed master's, on the candidate, in no relay (kept): {self.unrelayed}")
        for r in self.replicas:
            lines.append(f"  replica {r['address']}: {r.get('result')}")
        for w in self.warnings:
            lines.append(f"  warning: {w}")
        for s in self.steps:
            lines.append(f"  {s['seconds']:7.2f} s  {s['step']}" + (f": {s['detail']}" if s.get("detail") else ""))
        lines.append(f"  {self.total_seconds:7.2f} s  in all")
        return "\n".join(lines)


class Promoter:
    """One run of `relayproxy promote`."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.started = time.monotonic()
        self.deadline = self.started + args.timeout
        self.report = Report(dry_run=args.dry_run)
        self.quiet = args.quiet
        cand = parse_address(args.candidate, "--candidate")
        self.candidate_for_replicas = (parse_address(args.candidate_address, "--candidate-address")
                                       if args.candidate_address else cand)
        cpw = read_password(args.candidate_password_file, "--candidate-password-file")
        rpw = read_password(args.relay_password_file, "--relay-password-file")
        if (args.repl_user is None) != (args.repl_password_file is None):
            raise Stop(P.EXIT_USAGE, "--repl-user and --repl-password-file go together")
        self.repl_user = args.repl_user
        self.repl_password = read_password(args.repl_password_file, "--repl-password-file")
        if args.timeout <= 0:
            raise Stop(P.EXIT_USAGE, f"--timeout {args.timeout}: must be more than 0 seconds")
        self.candidate = Server("candidate", cand, args.candidate_user, cpw or "", self.deadline)
        relay_addresses = [parse_address(r, "--relay") for r in args.relay]
        if len(set(relay_addresses)) != len(relay_addresses):
            raise Stop(P.EXIT_USAGE, "--relay: the same relay is named twice")
        if cand in relay_addresses:
            raise Stop(P.EXIT_USAGE, f"--candidate {args.candidate} is also named as a --relay")
        self.relays = [Server("relay", a, args.relay_user, rpw or "", self.deadline) for a in relay_addresses]
        self.replicas = [Server("replica", parse_address(r, "--replica"), args.candidate_user, cpw or "",
                                self.deadline) for r in args.replica]
        self.facts: dict[Server, P.RelayFacts] = {}
        self._step_started = time.monotonic()

    # -- output ---------------------------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"promote: {text}", file=sys.stderr, flush=True)

    def step(self, name: str, detail: str = "") -> None:
        now = time.monotonic()
        self.report.steps.append({"step": name, "seconds": round(now - self._step_started, 3), "detail": detail})
        self._step_started = now
        self.say(f"{name}" + (f": {detail}" if detail else "") + f" ({self.report.steps[-1]['seconds']:.2f} s)")

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    # -- reading the topology -------------------------------------------------------------------------------------

    def _same_address(self, host: str, port: int) -> bool:
        want_host, want_port = self.candidate_for_replicas
        return int(port or 0) == want_port and _resolve(str(host)) == _resolve(want_host)

    def read_relay(self, relay: Server) -> P.RelayFacts:
        if relay.conn is None:
            relay.connect()
        if relay.flavour != self.flavour:
            raise Stop(P.EXIT_REFUSED, f"{relay.name} presents itself as {relay.flavour} ({relay.version}) and the "
                       f"candidate as {self.flavour} ({self.candidate.version}): not one topology")
        status = relay.replica_status() or {}
        host = _col(status, "Master_Host", "Source_Host", default="")
        port = int(_col(status, "Master_Port", "Source_Port", default=0) or 0)
        master_id = int(_col(status, "Master_Server_Id", "Source_Server_Id", default=0) or 0)
        follows = bool(status) and (self._same_address(host, port)
                                    or (bool(master_id) and master_id == self.candidate_server_id))
        # The master its files came from (its current epoch's), which SHOW SLAVE STATUS does not show while the relay
        # is levelled from a peer relay (then Master_Server_Id is the peer's own) or has not reached its master yet.
        master_uuid = str(_col(status, "Master_UUID", "Source_UUID", default="") or "")
        try:
            row = relay.rows("SELECT @@relayproxy_master_server_id AS id, @@relayproxy_master_server_uuid AS uuid")[0]
            epoch_master, epoch_uuid = int(row["id"] or 0), str(row["uuid"] or "")
        except Stop as exc:
            if exc.code != P.EXIT_REFUSED:
                raise
            epoch_master, epoch_uuid = 0, ""  # a relay from before the variables: SHOW SLAVE STATUS is all there is
        if epoch_master:
            master_id, master_uuid = epoch_master, epoch_uuid or master_uuid
            follows = follows or epoch_master == self.candidate_server_id
        facts = P.RelayFacts(f"{relay.address[0]}:{relay.address[1]}", relay.history(replica_side=False),
                             master_id, f"{host}:{port}" if status else "no master", follows, master_uuid)
        return facts

    def read_candidate(self) -> P.CandidateFacts:
        status = self.candidate.replica_status()
        read_only = bool(int(self.candidate.value("SELECT @@GLOBAL.read_only") or 0))
        return P.CandidateFacts(f"{self.candidate.address[0]}:{self.candidate.address[1]}",
                                self.candidate.history(replica_side=True), status is not None,
                                self.candidate_server_id, read_only)

    def read_all(self, relays: list[Server]) -> tuple[P.CandidateFacts, list[P.RelayFacts]]:
        facts = []
        for relay in relays:
            self.facts[relay] = self.read_relay(relay)
            facts.append(self.facts[relay])
        return self.read_candidate(), facts

    def _relay_entry(self, relay: Server) -> dict:
        for entry in self.report.relays:
            if entry["address"] == f"{relay.address[0]}:{relay.address[1]}":
                return entry
        entry = {"address": f"{relay.address[0]}:{relay.address[1]}"}
        self.report.relays.append(entry)
        return entry

    def _record_relays(self, relays: list[Server]) -> None:
        for relay in relays:
            f = self.facts[relay]
            self._relay_entry(relay).update({
                "reachable": True, "gtids": P.position_text(f.history), "master": f.master_address,
                "master_server_id": f.master_server_id, "follows_candidate": f.follows_candidate})

    # -- the run --------------------------------------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        self.candidate.connect()
        self.flavour = self.report.flavour = self.candidate.flavour
        self.candidate_server_id = int(self.candidate.value("SELECT @@server_id") or 0)
        self.check_candidate_can_be_a_master()
        reachable = []
        for relay in self.relays:
            try:
                relay.connect()
                reachable.append(relay)
            except Stop as exc:
                if exc.code != P.EXIT_UNREACHABLE or not args.skip_unreachable_relays:
                    if exc.code == P.EXIT_UNREACHABLE:
                        raise Stop(exc.code, f"{exc}; every relay must answer: a commit acknowledged only by it "
                                             "would be lost (--skip-unreachable-relays to go on without it)") from None
                    raise
                self._relay_entry(relay).update({"reachable": False, "note": str(exc)})
                self.report.warnings.append(f"went on without {relay.name}: {exc}; a commit acknowledged only by "
                                            "it is not on the candidate")
        if not reachable:
            raise Stop(P.EXIT_UNREACHABLE, "no relay could be reached")
        cand, relay_facts = self.read_all(reachable)
        self._record_relays(reachable)
        self._semi_sync_warnings(reachable)
        self.report.candidate = {"address": cand.address, "server_id": self.candidate_server_id,
                                 "version": self.candidate.version, "is_replica": cand.is_replica,
                                 "before": P.position_text(cand.history)}
        for replica in self.replicas:
            try:
                replica.connect()
            except Stop as exc:
                self.report.replicas.append({"address": replica.name.split()[-1], "result": f"unreachable: {exc}"})
        self.step("read the topology", f"{len(reachable)} relay(s), flavour {self.flavour}")
        plan = P.decide(cand, relay_facts, strict=args.strict, detached_ok=args.candidate_detached)
        self._record_plan(plan)
        if args.dry_run:
            self.report.outcome = "dry run"
            self.report.message = self._dry_run_text(plan, cand)
            return P.EXIT_DONE
        if self._already_done(cand, relay_facts):
            self.report.outcome = "already promoted"
            self.step("already promoted", "the candidate is writable and every relay follows it")
        else:
            plan = self.fence_and_decide(reachable)
            self.level_relays(plan, reachable)
            if plan.needs_catch_up:
                self.catch_up(plan)
            self.promote()
        self.repoint_relays(reachable)
        self.repoint_replicas()
        self.report.candidate["after"] = P.position_text(self.candidate.history(replica_side=True))
        left = [r for r in self.report.relays if r.get("reachable") and r.get("result", "").startswith("not")]
        left += [r for r in self.report.replicas if not str(r.get("result", "")).startswith("repointed")]
        if left:
            self.report.outcome = "promoted, some left behind"
            self.report.message = "; ".join(f"{r['address']}: {r['result']}" for r in left)
            return P.EXIT_REPLICAS_LEFT
        self.report.outcome = self.report.outcome or "promoted"
        return P.EXIT_DONE

    def _semi_sync_warnings(self, relays: list[Server]) -> None:
        """What each relay saw of semi-sync (docs/failover.md, "Semi-sync fallback: the hole"), in the report; a
        warning when a relay acknowledged nothing: commits returned without waiting for it."""
        for relay in relays:
            try:
                rows = relay.rows("SHOW GLOBAL STATUS WHERE Variable_name IN ('Rpl_semi_sync_slave_status', "
                                  "'Relayproxy_semi_sync_acks', 'Relayproxy_semi_sync_unrequested_transactions', "
                                  "'Relayproxy_semi_sync_last_unrequested_gtid')")
            except Stop as exc:
                if exc.code != P.EXIT_REFUSED:
                    raise
                continue  # a relay from before these counters
            seen = {str(r.get("Variable_name")): str(r.get("Value") or "") for r in rows}
            if not seen:
                continue
            name = f"{relay.address[0]}:{relay.address[1]}"
            acks = int(seen.get("Relayproxy_semi_sync_acks") or 0)
            unrequested = int(seen.get("Relayproxy_semi_sync_unrequested_transactions") or 0)
            self._relay_entry(relay)["semi_sync"] = {"acks": acks, "unrequested_transactions": unrequested,
                                                     "last_unrequested_gtid": seen.get(
                                                         "Relayproxy_semi_sync_last_unrequested_gtid", "")}
            if not acks:
                self.report.warnings.append(
                    f"relay {name} acknowledged nothing to the master since it started (no semi-sync, or not yet): "
                    "commits returned to clients without waiting for it, and those no relay received are lost")
            # The unrequested count is reported, not warned about: concurrent commits leave ends unflagged in a
            # healthy stream, and a stalled relay is asked for fallback commits (docs/failover.md): no verdict.

    def check_candidate_can_be_a_master(self) -> None:
        """Refused before anything changes: a candidate the relays could not follow by GTID once promoted."""
        c = self.candidate
        if not int(c.value("SELECT @@GLOBAL.log_bin") or 0):
            raise Stop(P.EXIT_REFUSED, f"{c.name} has no binary log (log_bin off): once promoted, the relays and "
                       "replicas could not replicate from it; choose a candidate with log_bin")
        if c.flavour == "mariadb" and not int(c.value("SELECT @@GLOBAL.log_slave_updates") or 0):
            raise Stop(P.EXIT_REFUSED, f"{c.name} has log_slave_updates off: what it catches up from the relay would "
                       "not be in its binary log, so the relays (and GTID replicas) could not join it by GTID once it "
                       "is promoted; set log_slave_updates = ON (a restart) or choose another candidate")

    def _record_plan(self, plan: P.Plan) -> None:
        self.report.source_relay = plan.source.address
        self.report.fetched, self.report.fetched_count = plan.lacking.text, plan.lacking.count
        self.report.errant = plan.errant.text
        self.report.unrelayed = plan.unrelayed.text
        for address, lack in plan.behind.items():
            for entry in self.report.relays:
                if entry["address"] == address:
                    entry["note"] = f"behind {plan.source.address} by {lack.text}"

    def _dry_run_text(self, plan: P.Plan, cand: P.CandidateFacts) -> str:
        lacking = (f"the candidate lacks {plan.lacking.text} ({plan.lacking.count} transactions), to be fetched "
                   f"from relay {plan.source.address}" if plan.lacking
                   else f"the candidate already holds everything relay {plan.source.address} holds")
        fence = [r.address for r in self.facts.values() if not r.follows_candidate]
        return (f"{lacking}; would stop the IO of relay(s) {', '.join(fence) or '(none)'}, promote "
                f"{cand.address} and repoint every relay and --replica to it; nothing was changed")

    def _already_done(self, cand: P.CandidateFacts, relays: list[P.RelayFacts]) -> bool:
        """A repeated run after a complete one: the candidate is no replica, writable, and every relay follows it."""
        if cand.is_replica or not all(r.follows_candidate for r in relays):
            return False
        return int(self.candidate.value("SELECT @@GLOBAL.read_only") or 0) == 0

    def fence_and_decide(self, relays: list[Server]) -> P.Plan:
        stopped = []
        for relay in relays:
            if not self.facts[relay].follows_candidate:
                relay.stop_replica()
                stopped.append(relay.name.split()[-1])
        self.step("stopped the relays' IO", ", ".join(stopped) or "none needed it")
        self._fence_candidate()
        cand, relay_facts = self.read_all(relays)
        self._record_relays(relays)
        plan = P.decide(cand, relay_facts, strict=self.args.strict,
                        detached_ok=self.args.candidate_detached)
        self._record_plan(plan)
        self.step("decided", f"source relay {plan.source.address}; candidate lacks "
                             f"{plan.lacking.text or 'nothing'}" + (f"; errant {plan.errant.text}" if plan.errant else ""))
        if plan.errant:
            self.report.warnings.append(f"the candidate has GTIDs that no relay has and the failed master did not "
                                        f"write: {plan.errant.text} (errant transactions)")
        if plan.unrelayed:
            self.report.warnings.append(f"the candidate has transactions of the failed master that no relay received: "
                                        f"{plan.unrelayed.text} (never acknowledged through a relay; kept)")
        return plan

    def level_relays(self, plan: P.Plan, relays: list[Server]) -> None:
        """Peer catch-up (docs/failover.md): each fenced relay behind the source relay fetches the rest of the
        epoch from it by file/position at its own horizon (the same bytes, so the relays stay byte-identical
        through the switch), is waited for until it holds the source's history, and is stopped again. One that
        cannot be levelled is named in a warning and repointed by GTID as the others: the same transactions, in
        different bytes from there on."""
        source = next(r for r in relays if self.facts.get(r) is plan.source)
        # --repl-user, else the relay keeps its own replication account (CHANGE MASTER keeps what it is not given),
        # which the candidate must accept anyway once the relays are repointed; the source relay too.
        done = []
        for relay in relays:
            facts = self.facts[relay]
            if relay is source or facts.follows_candidate or not plan.behind.get(facts.address):
                continue
            entry = self._relay_entry(relay)
            file, pos = "its horizon", 0
            try:
                status = relay.replica_status() or {}
                file = _col(status, "Master_Log_File", "Source_Log_File")
                pos = int(_col(status, "Read_Master_Log_Pos", "Read_Source_Log_Pos", default=0) or 0)
                relay.change_master(source.address[0], source.address[1], self.repl_user, self.repl_password,
                                    at=(str(file), pos))
                relay.start_replica()
                last_report, error = 0.0, ""
                while True:
                    lack = P.lacks(relay.history(replica_side=False), plan.source.history)
                    if not lack:
                        break
                    status = relay.replica_status() or {}
                    error = str(_col(status, "Last_IO_Error", "Last_Replica_IO_Error", default="") or "")
                    if "peer catch-up refused" in error or "relayproxy peer catch-up" in error:
                        raise Stop(P.EXIT_REFUSED, error)
                    if self.remaining() <= 0:
                        raise Stop(P.EXIT_TIMED_OUT, f"--timeout ran out while it still lacked {lack.text}"
                                   + (f" ({error})" if error else ""))
                    if time.monotonic() - last_report >= 1.0:
                        self.say(f"levelling {relay.name} from relay {plan.source.address}: it lacks {lack.count} "
                                 f"transaction(s) ({lack.text[:200]})" + (f"; {error[:200]}" if error else ""))
                        last_report = time.monotonic()
                    time.sleep(0.05)
                entry["levelled"] = f"from {plan.source.address} at {file}:{pos}, by file/position"
                done.append(relay.name.split()[-1])
            except Stop as exc:
                entry["levelled"] = f"no: {exc}"
                self.report.warnings.append(
                    f"{relay.name} could not be levelled with relay {plan.source.address} ({exc}); it is repointed "
                    "by GTID: it will hold the same transactions, but its files differ from the other relays' from "
                    f"{file}:{pos} on")
            finally:
                try:
                    relay.stop_replica()
                except Stop:
                    pass
        if done:
            self.step("levelled the relays", f"{', '.join(done)} fetched the rest of the epoch from relay "
                                             f"{plan.source.address} by file/position")

    def _fence_candidate(self) -> None:
        """Stop the candidate's link to the old master and let it apply what it has received, unless it already
        replicates from one of the relays (a repeated run)."""
        status = self.candidate.replica_status()
        if status is None:
            return
        host = _col(status, "Master_Host", "Source_Host", default="")
        port = int(_col(status, "Master_Port", "Source_Port", default=0) or 0)
        if any(_resolve(str(host)) == _resolve(r.address[0]) and port == r.address[1] for r in self.relays):
            return
        self.candidate.stop_replica("IO_THREAD")
        if _col(status, "Slave_SQL_Running", "Replica_SQL_Running") != "Yes":
            self.step("stopped the candidate's IO thread", "its SQL thread is not running")
            return
        last, since, limit = None, time.monotonic(), min(30.0, max(1.0, self.remaining() / 4))
        begun = time.monotonic()
        while time.monotonic() - begun < limit:
            row = self.candidate.replica_status() or {}
            now = (_col(row, "Relay_Master_Log_File", "Relay_Source_Log_File"),
                   _col(row, "Exec_Master_Log_Pos", "Exec_Source_Log_Pos"))
            done = (now == (_col(row, "Master_Log_File", "Source_Log_File"),
                            _col(row, "Read_Master_Log_Pos", "Read_Source_Log_Pos")))
            state = str(_col(row, "Slave_SQL_Running_State", "Replica_SQL_Running_State", default="") or "")
            if done or _col(row, "Slave_SQL_Running", "Replica_SQL_Running") != "Yes":
                break
            if "read all relay log" in state:
                # idle at the end of what the stopped IO thread wrote (a partial transaction there never completes);
                # parallel workers may still be applying: the STOP SLAVE before the catch-up waits for them, and a
                # history read now can only be smaller (a catch-up that fetches what they apply is harmless)
                break
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > 1.0:
                break  # nothing applied for a second: what is left is a partial transaction that never completes
            time.sleep(0.05)
        self.step("stopped the candidate's IO thread", "its SQL thread applied what it had received")

    def catch_up(self, plan: P.Plan) -> None:
        source = next(r for r in self.relays if self.facts.get(r) is plan.source)
        user = self.repl_user if self.repl_user is not None else self.args.relay_user
        password = self.repl_password if self.repl_user is not None else source.password
        self.candidate.stop_replica()
        self.candidate.change_master(source.address[0], source.address[1], user, password, no_delay=True)
        self.candidate.start_replica()
        self.step("pointed the candidate at the relay", f"{source.name.split()[-1]} by GTID")
        want = plan.source.history
        last_report = 0.0
        refused_since: float | None = None
        while True:
            have = self.candidate.history(replica_side=True)
            lack = P.lacks(have, want)
            if not lack:
                break
            status = self.candidate.replica_status() or {}
            errors = [str(_col(status, k, default="")) for k in
                      ("Last_IO_Error", "Last_SQL_Error", "Last_Replica_IO_Error") if _col(status, k, default="")]
            io = _col(status, "Slave_IO_Running", "Replica_IO_Running")
            sql = _col(status, "Slave_SQL_Running", "Replica_SQL_Running")
            if sql == "No" or (io == "No" and errors):
                raise Stop(P.EXIT_REFUSED, f"{self.candidate.name} stopped replicating from relay "
                           f"{plan.source.address} while it still lacked {lack.text}: IO {io}, SQL {sql}: "
                           + "; ".join(errors))
            # a login the relay refuses (its IO thread retries it for ever, "Connecting") ends the run, once it lasts
            io_errno = int(_col(status, "Last_IO_Errno", default=0) or 0)
            if io == "Yes" or io_errno not in _LOGIN_CODES:
                refused_since = None
            elif refused_since is None:
                refused_since = time.monotonic()
            elif time.monotonic() - refused_since >= 1.0:
                raise Stop(P.EXIT_UNREACHABLE, f"{self.candidate.name} cannot log into relay {plan.source.address} "
                           f"as {user!r}: {io_errno} {'; '.join(errors)}; it is left pointing at the relay and the "
                           "relays' IO is stopped; fix the account (--repl-user, --repl-password-file) and run the "
                           "same command again")
            if time.monotonic() - last_report >= 1.0:
                try:
                    source.value("SELECT 1")  # a relay lost mid catch-up ends the run now, not at --timeout
                except Stop as exc:
                    if exc.code != P.EXIT_UNREACHABLE:
                        raise
                    raise Stop(exc.code, f"{exc}: lost while the candidate caught up from it (it still lacks "
                               f"{lack.text}); the candidate is left replicating from it and the relays' IO is "
                               "stopped; run the same command again once the relay is back (or without it, "
                               "--skip-unreachable-relays)") from None
                self.say(f"catching up: the candidate lacks {lack.count} transaction(s) ({lack.text[:200]})"
                         + (f"; {'; '.join(errors)[:200]}" if errors else ""))
                last_report = time.monotonic()
            if self.remaining() <= 0:
                raise Stop(P.EXIT_TIMED_OUT, f"timed out after {self.args.timeout:.0f} s catching up: "
                           f"{self.candidate.name} still lacks {lack.text}; it is left replicating from relay "
                           f"{plan.source.address} (the relays' IO is stopped); run the same command again to "
                           "continue" + (f" (its replication reports: {'; '.join(errors)})" if errors else ""))
            time.sleep(0.05)
        self.step("caught up", f"the candidate holds relay {plan.source.address}'s "
                               f"{P.position_text(want)}")

    def promote(self) -> None:
        c = self.candidate
        c.stop_replica()
        if self.args.no_reset_replica:
            # MHA's "Resetting slave info on the new master" (MHA/Server.pm reset_slave_info) begins with STOP SLAVE
            # and waits for SHOW SLAVE STATUS to show both threads stopped: on a server that shows no row it reports
            # "Checking slave status failed", and the failover ends "recovery on slave partially failed" (exit 10)
            done = "replication stopped and left configured for the HA tool to reset (--no-reset-replica)"
        else:
            c.execute("RESET REPLICA ALL" if c._new_terms() else "RESET SLAVE ALL")
            done = "replication reset"
        if c.flavour == "mysql" and c.rows("SHOW GLOBAL VARIABLES LIKE 'super_read_only'"):
            c.execute("SET GLOBAL super_read_only = 0")
        c.execute("SET GLOBAL read_only = 0")
        self.step("promoted the candidate", f"{done}, read_only off")

    def repoint_relays(self, relays: list[Server]) -> None:
        host, port = self.candidate_for_replicas
        for relay in relays:
            entry = self._relay_entry(relay)
            if not self.facts[relay].follows_candidate:
                relay.stop_replica()
                relay.change_master(host, port, self.repl_user, self.repl_password)
            relay.start_replica()  # idempotent: "already running" is a note, not an error
        self.step("repointed the relays", f"to {host}:{port} by GTID")
        for relay in relays:
            entry = self._relay_entry(relay)
            limit = time.monotonic() + max(5.0, min(30.0, self.remaining()))
            while True:
                status = relay.replica_status() or {}
                io = _col(status, "Slave_IO_Running", "Replica_IO_Running")
                master_id = int(_col(status, "Master_Server_Id", "Source_Server_Id", default=0) or 0)
                error = _col(status, "Last_IO_Error", "Last_Replica_IO_Error", default="")
                if io == "Yes" and master_id == self.candidate_server_id:
                    entry["result"] = "follows the candidate"
                    break
                if time.monotonic() > limit:
                    entry["result"] = (f"not streaming from the candidate: IO {io}, master server_id {master_id}"
                                       + (f", {error}" if error else ""))
                    break
                time.sleep(0.05)
            entry["gtids_after"] = P.position_text(relay.history(replica_side=False))
        self.step("the relays stream from the candidate",
                  "; ".join(f"{e['address']}: {e.get('result')}" for e in self.report.relays if e.get("reachable")))

    def repoint_replicas(self) -> None:
        if not self.replicas:
            return
        host, port = self.candidate_for_replicas
        new_master = self.candidate.history(replica_side=True)
        for replica in self.replicas:
            address = f"{replica.address[0]}:{replica.address[1]}"
            if replica.conn is None:
                continue  # reported unreachable when read
            try:
                extra = P.lacks(new_master, replica.history(replica_side=True))
                if extra:
                    result = (f"not repointed: it has {extra.text} that the new master lacks (transactions no relay "
                              "received); re-seed it or remove them")
                else:
                    replica.stop_replica()
                    replica.change_master(host, port, self.repl_user, self.repl_password)
                    replica.start_replica()
                    result = f"repointed to {host}:{port} by GTID"
            except Stop as exc:
                result = f"not repointed: {exc}"
            self.report.replicas.append({"address": address, "result": result})
        self.step("repointed the replicas", "; ".join(f"{r['address']}: {r['result']}" for r in self.report.replicas))

    def close(self) -> None:
        for server in [self.candidate, *self.relays, *self.replicas]:
            server.close()


def run_reported(args: argparse.Namespace, make, report_type, outcomes: dict[int, str], *,
                 refusal: type[Exception] | None = None) -> int:
    """Run one HA command (`promote`, `pitr`): ``make(args).run()`` returns the exit code or raises Stop; the report
    (its ``report``) is printed for a person, or as one JSON document with ``--json``, and the code returned. An
    unexpected exception is said with the exit code for an internal error, never a traceback alone."""
    started = time.monotonic()
    command = None
    report = report_type(dry_run=getattr(args, "dry_run", False))
    try:
        command = make(args)
        report = command.report
        code = command.run()
    except Stop as exc:
        code, report.outcome, report.message = exc.code, outcomes.get(exc.code, "error"), str(exc)
    except Exception as exc:  # noqa: BLE001 - said, with the exit code for an internal error
        if refusal is not None and isinstance(exc, refusal):
            code, report.outcome, report.message = P.EXIT_REFUSED, "refused", str(exc)
        else:
            code, report.outcome, report.message = P.EXIT_ERROR, "error", f"{type(exc).__name__}: {exc}"
    finally:
        if command is not None:
            command.close()
    report.exit_code = code
    report.total_seconds = round(time.monotonic() - started, 3)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        print(report.text(), file=sys.stdout if code == P.EXIT_DONE else sys.stderr)
    return code


OUTCOMES = {P.EXIT_USAGE: "usage", P.EXIT_REFUSED: "refused", P.EXIT_UNREACHABLE: "unreachable",
            P.EXIT_TIMED_OUT: "timed out"}


def run(args: argparse.Namespace) -> int:
    return run_reported(args, Promoter, Report, OUTCOMES, refusal=P.Refusal)
