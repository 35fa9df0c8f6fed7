"""`relayproxy pitr`: point-in-time recovery from the relay. A restored backup (the target) replays the relay's history
with its own (parallel) replication applier, from the backup's position to an exact stop, and the relay itself ends
what it sends the target at the stop, so the target never receives a byte past it, whatever its applier does.

Steps (each safe to repeat: killed at any moment, the same command run again continues from what the target has
applied, which its gtid_slave_pos records in the same transaction as the data, and ends at the same state):

1. read: the relay's history and the stop in it (the transaction index: ``SHOW RELAYPROXY TRANSACTION``), the
   target's position and replication; decide the start (pitr_plan.decide_start); refuse a target already past the
   stop, a start or stop the relay does not hold, a target replicating from elsewhere. ``--dry-run`` ends here.
2. fence: ``RELAYPROXY SET REPLAY STOP`` on the relay for the target's server_id (durable on the relay before the
   target connects), ``STOP SLAVE 'relayproxy_pitr'`` if a previous run left it running.
3. replay: gtid_slave_pos set to the start when the target is behind it, slave_parallel_threads, ``CHANGE MASTER
   'relayproxy_pitr' TO`` the relay by GTID, ``START SLAVE``; wait, printing progress, until the target's
   gtid_slave_pos is the stop's state in every domain.
4. finish: ``STOP SLAVE``, check the position again, ``RESET SLAVE 'relayproxy_pitr' ALL``, restore
   slave_parallel_threads, clear the relay's stop.

MariaDB targets, with a named connection; MySQL targets by GTID auto-position on the default channel, shown against
the scripted MySQL 8.0 replica only (pitr_target.py; no MySQL server runs here).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from ..relay.txindex import Transaction, format_time_utc, zone_of
from ..upstream.repoint import sql_string
from . import pitr_plan as PP
from . import promotion as P
from .pitr_target import MariaTarget, target_for
from .promote import Server, Stop, parse_address, read_password, run_reported
EXIT_DONE, EXIT_ERROR, EXIT_USAGE = P.EXIT_DONE, P.EXIT_ERROR, P.EXIT_USAGE
EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_TIMED_OUT = P.EXIT_REFUSED, P.EXIT_UNREACHABLE, P.EXIT_TIMED_OUT
EXIT_APPLY_FAILED = 6
OUTCOMES = {EXIT_DONE: "done", EXIT_ERROR: "error", EXIT_USAGE: "usage", EXIT_REFUSED: "refused",
            EXIT_UNREACHABLE: "unreachable", EXIT_TIMED_OUT: "timed out", EXIT_APPLY_FAILED: "apply failed"}
POLL = 0.2
PROGRESS_EVERY = 2.0
_PARALLEL_NOTE = "parallel threads were "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "exit codes: 0 done (also when a repeated run finds the target at the stop; and --dry-run);\n"
        "1 internal error; 2 usage; 3 refused (before the fence nothing changed: the target past the stop,\n"
        "  replicating from elsewhere, a start or stop the relay does not hold, a relay that keeps stops in memory\n"
        "  only; after it, the target cannot log into or replicate from the relay, or a server refused a statement:\n"
        "  the stop and the stopped relayproxy_pitr connection stay, fix it and run again); 4 unreachable (a server could not\n"
        "  be reached or logged into); 5 timed out (the target is left stopped at a transaction boundary: run the same\n"
        "  command again to continue); 6 the target's applier stopped with an error (named; fix it, run again).\n"
        "The target: MariaDB (a connection named relayproxy_pitr) or MySQL (the default channel, by auto-position).\n"
        "Times: 'YYYY-MM-DD HH:MM:SS[.ffffff]' with an offset (+02:00, Z) or read in --time-zone (default: this\n"
        "machine's local time at that date, daylight saving included). MariaDB records commit times in whole seconds: a transaction\n"
        "recorded at second S counts as committed at S.000000, and the first transaction in binlog order recorded\n"
        "at or after T is the first one --before-time T leaves out (docs/pitr.md).")
    add = parser.add_argument
    add("--target", required=True, metavar="HOST:PORT", help="the restored instance to replay onto")
    add("--target-user", required=True, metavar="USER", help="an account on the target with SUPER (CHANGE MASTER, "
        "START/STOP SLAVE, SET GLOBAL)")
    add("--target-password-file", required=True, metavar="FILE", help="file holding that account's password")
    add("--relay", required=True, metavar="HOST:PORT", help="the relay's --listen address")
    add("--relay-user", required=True, metavar="USER", help="an account on the relay with admin and replication_slave "
        "(the target replicates with it too, unless --repl-user)")
    add("--relay-password-file", required=True, metavar="FILE", help="file holding that account's password")
    stop = parser.add_mutually_exclusive_group(required=True)
    stop.add_argument("--until-gtid", metavar="GTID", help="apply up to and including this transaction")
    stop.add_argument("--before-gtid", metavar="GTID", help="apply everything before this transaction, none of it")
    stop.add_argument("--until-time", metavar="T", help="apply every transaction committed at or before T")
    stop.add_argument("--before-time", metavar="T", help="apply every transaction committed before T, none at or after")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-gtid", metavar="SET", help="the target's position at the backup (default: the "
                       "target's gtid_slave_pos)")
    start.add_argument("--from-backup", metavar="DIR", help="the prepared backup the target was restored from: its "
                       "mariadb_backup_binlog_info (or xtrabackup_binlog_info) gives the start")
    add("--parallel", type=int, default=4, metavar="N", help="the target's slave_parallel_threads for the replay "
        "(optimistic mode; MySQL: replica_parallel_workers; 0 or 1: serial; default 4)")
    add("--repl-user", metavar="USER", help="the account the target logs into the relay with (default --relay-user)")
    add("--repl-password-file", metavar="FILE", help="file holding --repl-user's password")
    add("--relay-address", metavar="HOST:PORT", help="the relay's address as the target reaches it (default --relay)")
    add("--time-zone", metavar="ZONE", help="zone of times given without one (an IANA name such as Europe/Berlin)")
    add("--dry-run", action="store_true", help="name the range, its size and the files it spans; change nothing")
    add("--json", action="store_true", help="print one JSON document on stdout (progress still goes to stderr)")
    add("--timeout", type=float, default=0.0, metavar="SECONDS", help="give up after this long in all (default 0: "
        "no limit)")
    add("--quiet", action="store_true", help="no progress lines on stderr")
    add("--accept-volatile-stop", action="store_true", help="replay through a relay that keeps its replay stops in "
        "memory only (relayproxy serve; refused otherwise): its restart during the replay lifts the fence")


def transaction_of(row: dict) -> Transaction:
    """A row of SHOW RELAYPROXY TRANSACTION: one transaction of the relay's transaction index."""
    tables = tuple(t for t in str(row.get("Tables") or "").split(",") if t)
    return Transaction(str(row["File"]), int(row["Start_pos"]), int(row["End_pos"]), row["Gtid"] or None,
                       int(row["Commit_us"]), str(row["Second_resolution"]) in ("1", "Yes"), tables)


def transaction_dict(txn: Transaction | None) -> dict | None:
    """What the report shows of a transaction: its fields and its commit time in UTC."""
    if txn is None:
        return None
    return {**asdict(txn), "tables": ",".join(txn.tables), "commit_time": format_time_utc(txn.commit_us)}


@dataclass(frozen=True)
class StopPoint:
    """Where the relay ends the target's stream: a boundary, and the GTID state there (what the target ends at)."""

    file: str
    position: int
    state: Any  # MariaGtidPosition or GtidSet, the target's flavour
    label: str
    first_left_out: Transaction | None  # the first transaction not applied (None: the stop is the relay's horizon)
    last_applied: Transaction | None


@dataclass
class Report:
    outcome: str = ""
    exit_code: int = 0
    message: str = ""
    dry_run: bool = False
    target: dict = field(default_factory=dict)
    relay: str = ""
    stop: dict = field(default_factory=dict)
    start: dict = field(default_factory=dict)
    range: dict = field(default_factory=dict)
    applied: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    total_seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def text(self) -> str:
        lines = [f"relayproxy pitr: {self.outcome}" + (f": {self.message}" if self.message else "")]
        t, s, r = self.target, self.stop, self.range
        if t:
            lines.append(f"  target {t.get('address')} (server_id {t.get('server_id')}): gtid_slave_pos before "
                         f"{t.get('before')!r}" + (f", after {t.get('after')!r}" if "after" in t else ""))
        if self.start:
            lines.append(f"  start {self.start.get('position')!r} ({self.start.get('source')})")
        if s:
            lines.append(f"  stop {s.get('label')}: relay {s.get('file')}:{s.get('position')}, GTID state there "
                         f"{s.get('state')!r}")
            if s.get("first_left_out"):
                x = s["first_left_out"]
                lines.append(f"  first transaction left out: {x.get('gtid')} at {x.get('file')}:{x.get('start')}, "
                             f"committed {x.get('commit_time')} UTC")
            if s.get("last_applied"):
                x = s["last_applied"]
                lines.append(f"  last transaction applied: {x.get('gtid')} ending at {x.get('file')}:{x.get('end')}, "
                             f"committed {x.get('commit_time')} UTC")
        if r:
            lines.append(f"  range: {r.get('transactions')} transactions, {r.get('bytes')} bytes, from "
                         f"{r.get('from')} to {r.get('to')}, files {r.get('files')}")
        if self.applied:
            a = self.applied
            lines.append(f"  applied: {a.get('transactions')} transactions, {a.get('bytes')} bytes in "
                         f"{a.get('seconds')} s")
        for w in self.warnings:
            lines.append(f"  warning: {w}")
        for step in self.steps:
            lines.append(f"  {step['seconds']:8.2f} s  {step['step']}" + (f": {step['detail']}" if step.get("detail")
                                                                           else ""))
        lines.append(f"  {self.total_seconds:8.2f} s  in all")
        return "\n".join(lines)


class Replay:
    """One run of `relayproxy pitr`."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.quiet = args.quiet
        self.report = Report(dry_run=args.dry_run)
        self.started = self._step_started = time.monotonic()
        if args.timeout < 0:
            raise Stop(EXIT_USAGE, f"--timeout {args.timeout}: must be 0 (no limit) or more")
        if args.parallel < 0 or args.parallel > 256:
            raise Stop(EXIT_USAGE, f"--parallel {args.parallel}: expected 0 to 256")
        self.deadline = self.started + args.timeout if args.timeout else float("inf")
        if (args.repl_user is None) != (args.repl_password_file is None):
            raise Stop(EXIT_USAGE, "--repl-user and --repl-password-file go together")
        target_address = parse_address(args.target, "--target")
        relay_address = parse_address(args.relay, "--relay")
        self.relay_for_target = parse_address(args.relay_address, "--relay-address") if args.relay_address \
            else relay_address
        tpw = read_password(args.target_password_file, "--target-password-file")
        rpw = read_password(args.relay_password_file, "--relay-password-file")
        self.repl_user = args.repl_user or args.relay_user
        self.repl_password = read_password(args.repl_password_file, "--repl-password-file") if args.repl_user else rpw
        self.zone, self.zone_name = _zone(args.time_zone)
        self.server = Server("target", target_address, args.target_user, tpw, self.deadline)
        self.relay = Server("relay", relay_address, args.relay_user, rpw, self.deadline)
        self.target: MariaTarget = MariaTarget(self.server)  # its flavour once connected (target_for)
        self.report.relay = f"{relay_address[0]}:{relay_address[1]}"
        self.parallel_original: int | None = None  # the target's parallel apply threads before the replay

    # -- output --------------------------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"pitr: {text}", file=sys.stderr, flush=True)

    def step(self, name: str, detail: str = "") -> None:
        now = time.monotonic()
        self.report.steps.append({"step": name, "seconds": round(now - self._step_started, 3), "detail": detail})
        self._step_started = now
        self.say(f"{name}" + (f": {detail}" if detail else "") + f" ({self.report.steps[-1]['seconds']:.2f} s)")

    # -- the relay's index ----------------------------------------------------------------------------------------
    def transaction_for_gtid(self, gtid: str) -> Transaction | None:
        rows = self.relay.rows(f"SHOW RELAYPROXY TRANSACTION FOR GTID {sql_string(gtid)}")
        return transaction_of(rows[0]) if rows else None

    def transaction_at(self, micros: int) -> Transaction | None:
        text = format_time_utc(micros)
        rows = self.relay.rows(f"SHOW RELAYPROXY TRANSACTION AT TIME {sql_string(text)}")
        return transaction_of(rows[0]) if rows else None

    def gtid_state_at(self, file: str, position: int):
        value = self.relay.value(f"SELECT BINLOG_GTID_POS({sql_string(file)}, {int(position)})")
        if value is None:
            raise Stop(EXIT_REFUSED, f"{self.relay.name} answered NULL for BINLOG_GTID_POS('{file}', {position}): not a "
                                     "transaction boundary it holds durably")
        try:
            return self.target.parse(str(value), f"{self.relay.name} BINLOG_GTID_POS")
        except PP.PlanRefusal as exc:
            raise Stop(EXIT_REFUSED, str(exc)) from None

    def relay_files(self) -> list[tuple[str, int]]:
        return [(str(r["Log_name"]), int(r["File_size"])) for r in self.relay.rows("SHOW BINARY LOGS")]

    def file_names(self) -> list[str]:
        return [name for name, _ in self.relay_files()]

    def history_start(self):
        files = self.relay_files()
        if not files:
            raise Stop(EXIT_REFUSED, f"{self.relay.name} holds no binlog file yet")
        return files[0][0], self.gtid_state_at(files[0][0], 4)

    def history_end(self) -> tuple[str, int]:
        row = self.relay.rows("SHOW MASTER STATUS")
        if not row:
            raise Stop(EXIT_REFUSED, f"{self.relay.name} has no horizon yet (SHOW MASTER STATUS is empty)")
        return str(row[0]["File"]), int(row[0]["Position"])

    def span(self, start: tuple[str, int], end: tuple[str, int]) -> dict:
        rows = self.relay.rows(f"SHOW RELAYPROXY TRANSACTIONS BETWEEN {sql_string(start[0])} {int(start[1])} AND "
                               f"{sql_string(end[0])} {int(end[1])}")
        row = rows[0] if rows else {}
        return {"transactions": int(row.get("Transactions") or 0), "bytes": int(row.get("Bytes") or 0),
                "from": f"{start[0]}:{start[1]}", "to": f"{end[0]}:{end[1]}", "files": str(row.get("Files") or "")}

    # -- deciding -------------------------------------------------------------------------------------------------
    def resolve_stop(self) -> StopPoint:
        a = self.args
        if a.until_gtid or a.before_gtid:
            gtid = (a.until_gtid or a.before_gtid).strip()
            flag = "--until-gtid" if a.until_gtid else "--before-gtid"
            try:
                one = self.target.parse(gtid, flag)
            except PP.PlanRefusal as exc:
                raise Stop(EXIT_USAGE, str(exc)) from None
            if (self.target.flavour == "mariadb" and len(one) != 1) or (
                    self.target.flavour == "mysql" and one.count() != 1):
                raise Stop(EXIT_USAGE, f"{flag} {gtid!r}: expected one GTID")
            txn = self.transaction_for_gtid(gtid)
            if txn is None:
                raise Stop(EXIT_REFUSED, self._not_held(f"GTID {gtid}", one))
            if a.until_gtid:
                state = self.gtid_state_at(txn.file, txn.end)
                return StopPoint(txn.file, txn.end, state, f"until GTID {gtid} (applied)", None, txn)
            state = self.gtid_state_at(txn.file, txn.start)
            return StopPoint(txn.file, txn.start, state, f"before GTID {gtid} (not applied)", txn, None)
        text = a.until_time or a.before_time
        flag = "--until-time" if a.until_time else "--before-time"
        try:
            moment = PP.parse_moment(text, self.zone, self.zone_name)
        except PP.PlanRefusal as exc:
            raise Stop(EXIT_USAGE, f"{flag}: {exc}") from None
        if moment.assumed_zone:
            self.report.warnings.append(f"{flag} {text!r} has no time zone: read in {self.zone_name} "
                                        f"({moment.utc_text()} UTC)")
        # until T: everything committed at or before T, so the first left out is the first at or after T + 1 µs.
        first_out = self.transaction_at(moment.micros + (1 if a.until_time else 0))
        label = f"{'until' if a.until_time else 'before'} {moment.utc_text()} UTC"
        if first_out is None:
            end_file, end_pos = self.history_end()
            raise Stop(EXIT_REFUSED, f"the relay holds no transaction committed at or after {moment.utc_text()} UTC "
                       f"yet (its history ends at {end_file}:{end_pos}): the stop is not received yet, so the relay "
                       "cannot know that nothing committed before it is still to come; wait, or give --until-gtid")
        if first_out.second_resolution and moment.fractional:
            self.report.warnings.append(
                f"the relay's history records commit times in whole seconds: transactions recorded at "
                f"{moment.utc_text()[:19]} UTC count as committed at .000000, so they are applied; give "
                "--before-gtid for an exact point inside that second")
        state = self.gtid_state_at(first_out.file, first_out.start)
        return StopPoint(first_out.file, first_out.start, state, label, first_out, None)

    def _not_held(self, what: str, gtid) -> str:
        first, start_state = self.history_start()
        end_file, end_pos = self.history_end()
        if self.target.flavour == "mariadb":
            (one,) = list(gtid)
            at = start_state.get(one.domain_id)
            purged = at is not None and one.seq_no <= at.seq_no
        else:
            purged = gtid.is_subset(start_state)
        if purged:
            return (f"{what} is not in the relay's history: purged (the relay's history starts at {first}, after "
                    f"{self.target.text(start_state)})")
        return (f"{what} is not in the relay's history, which starts at {first} (after "
                f"{self.target.text(start_state) or 'nothing'}) and ends at {end_file}:{end_pos}: not received yet, or "
                "not from this master")

    def run(self) -> int:
        a, r = self.args, self.report
        self.relay.connect()
        self.server.connect()
        if self.relay.flavour != self.server.flavour:
            raise Stop(EXIT_REFUSED, f"{self.relay.name} presents itself as {self.relay.version} and "
                       f"{self.server.name} as {self.server.version}: a replay needs one flavour on both")
        self.target = target = target_for(self.server)
        server_id = int(self.server.value("SELECT @@GLOBAL.server_id") or 0)
        before = target.position()
        r.target = {"address": f"{self.server.address[0]}:{self.server.address[1]}", "server_id": server_id,
                    "flavour": target.flavour, "before": target.text(before)}
        if server_id == 0:
            raise Stop(EXIT_REFUSED, f"{target.name} has server_id 0: a replica needs its own server_id")
        ours = target.check(self.relay_for_target)
        stop = self.resolve_stop()
        r.stop = {"label": stop.label, "file": stop.file, "position": stop.position, "state": target.text(stop.state),
                  "first_left_out": transaction_dict(stop.first_left_out),
                  "last_applied": transaction_dict(stop.last_applied)}
        given, source = None, ""
        if a.from_backup:
            try:
                info = PP.read_backup_info(a.from_backup)
            except PP.PlanRefusal as exc:
                raise Stop(EXIT_REFUSED, str(exc)) from None
            given, source = info.gtid_text, f"{info.path}: {info.file}:{info.position}, GTID {info.gtid_text}"
        elif a.from_gtid is not None:
            given, source = a.from_gtid, "--from-gtid"
        try:
            start = target.plan_start(before, given, source)
        except PP.PlanRefusal as exc:
            raise Stop(EXIT_USAGE if source == "--from-gtid" and "malformed" in str(exc).lower() else EXIT_REFUSED,
                       str(exc)) from None
        r.start = {"position": target.text(start.position), "source": start.source, "resumed": start.resumed}
        past = target.past(start.position, stop.state, self.gtid_state_at(*self.history_end()))
        if past:
            raise Stop(EXIT_REFUSED, f"{target.name} already has transactions past the stop ({stop.label}): {past}. "
                       "Nothing was changed; restore the backup again")
        begin = target.start_held(self, start.position, stop.state)
        r.range = self.span(begin, (stop.file, stop.position))
        self.step("planned", f"{r.range['transactions']} transactions, {r.range['bytes']} bytes, "
                             f"{r.range['from']} .. {r.range['to']}")
        if a.dry_run:
            r.outcome, r.message = "dry run", "nothing changed"
            return EXIT_DONE
        if target.reached(start.position, stop.state) and not start.setup:
            self.finish(stop, server_id, ours)
            r.target["after"] = target.text(target.position())
            r.outcome, r.message = "done", "the target is at the stop" + (" (finished a previous run)" if ours else "")
            return EXIT_DONE
        self.replay(stop, start, server_id, ours)
        return EXIT_DONE

    # -- acting ---------------------------------------------------------------------------------------------------
    def replay(self, stop: StopPoint, start, server_id: int, ours: bool) -> None:
        a, r, t = self.args, self.report, self.target
        before = self._stop_row(server_id)
        self.relay.execute(f"RELAYPROXY SET REPLAY STOP FOR SERVER_ID {server_id} AT {sql_string(stop.file)} "
                           f"{int(stop.position)} LABEL {sql_string(self._label(stop, ours))}")
        row = self._stop_row(server_id)
        if row is not None and str(row.get("Persistent")) == "No" and not a.accept_volatile_stop:
            if before is None:  # ours only now: leave the relay as it was
                self.relay.execute(f"RELAYPROXY CLEAR REPLAY STOP FOR SERVER_ID {server_id}")
            raise Stop(EXIT_REFUSED, f"relay {r.relay} keeps replay stops in memory only (relayproxy serve): a restart "
                       "of it during the replay would lift the fence and send the target past the stop. Replay from "
                       "`relayproxy run` on the relay directory, or pass --accept-volatile-stop if the relay will not "
                       "be restarted meanwhile")
        self.step("fenced", f"the relay sends server_id {server_id} nothing past {stop.file}:{stop.position}")
        if ours:
            t.stop()
        for statement in start.setup:
            self.server.execute(statement)
        parallel = a.parallel if a.parallel > 1 else 0
        if t.parallel() not in (parallel, -1):
            t.set_parallel(parallel)
        host, port = self.relay_for_target
        t.start(host, port, self.repl_user, self.repl_password or "", parallel)
        self.step("replaying", f"from {t.text(start.position)} ({start.source}) with {parallel} parallel threads")
        applied = self.wait(stop)
        self.finish(stop, server_id, True)
        after = t.position()
        r.target["after"] = t.text(after)
        if not t.reached(after, stop.state):
            raise Stop(EXIT_ERROR, f"{t.name} is at {t.text(after)} after the replay, not at the stop's "
                                   f"{t.text(stop.state)}")
        r.applied = applied
        r.outcome, r.message = "done", f"the target is at {stop.label}"

    def _label(self, stop: StopPoint, ours: bool) -> str:
        """What the relay shows for the stop; it also keeps the target's parallel threads from before the first run,
        so a run after an interruption can restore them."""
        previous = self._recorded_parallel() if ours else None
        self.parallel_original = previous if previous is not None else self.target.parallel()
        return f"pitr {stop.label} ({_PARALLEL_NOTE}{self.parallel_original})"

    def _stop_row(self, server_id: int) -> dict | None:
        """The relay's SHOW RELAYPROXY REPLAY STOPS row for ``server_id``, or None."""
        for row in self.relay.rows("SHOW RELAYPROXY REPLAY STOPS"):
            if int(row.get("Server_id") or 0) == server_id:
                return row
        return None

    def _recorded_parallel(self, server_id: int | None = None) -> int | None:
        for row in self.relay.rows("SHOW RELAYPROXY REPLAY STOPS"):
            label = str(row.get("Label") or "")
            if _PARALLEL_NOTE in label and (server_id is None or int(row.get("Server_id") or 0) == server_id):
                try:
                    return int(label.split(_PARALLEL_NOTE, 1)[1].split(")")[0])
                except ValueError:
                    return None
        return None

    def wait(self, stop: StopPoint) -> dict:
        t = self.target
        began = last_print = time.monotonic()
        total = self.report.range.get("transactions", 0)
        total_bytes = self.report.range.get("bytes", 0)
        begin = self.report.range.get("from", "").rsplit(":", 1)
        while True:
            pos = t.position()
            if t.reached(pos, stop.state):
                break
            status = t.status()
            if status is None or status.sql_errno or status.sql_running != "Yes":
                if not t.reached(t.position(), stop.state):
                    why = f"{status.sql_errno} {status.sql_error}" if status is not None and status.sql_errno else \
                        "its replay connection is gone" if status is None else "its SQL thread is not running"
                    raise Stop(EXIT_APPLY_FAILED, f"{t.name}'s applier stopped at {t.text(pos)}: {why}; fix it and run "
                               "the same command again to continue")
                break
            if status.io_errno in (1236, 1045, 1227, 1593):
                t.stop()
                raise Stop(EXIT_REFUSED, f"{t.name} cannot replicate from relay {self.report.relay}: {status.io_errno} "
                           f"{status.io_error}")
            now = time.monotonic()
            if now >= self.deadline:
                t.stop()
                raise Stop(EXIT_TIMED_OUT, f"--timeout ran out at {t.text(pos)} (the stop is {t.text(stop.state)}): "
                           "the target is stopped at a transaction boundary; run the same command again to continue")
            if now - last_print >= PROGRESS_EVERY:
                last_print = now
                self.say(self._progress(pos, stop, begin, total, total_bytes, now - began))
            time.sleep(POLL)
        seconds = round(time.monotonic() - began, 3)
        self.step("replayed", f"{total} transactions, {total_bytes} bytes in {seconds:.2f} s")
        return {"transactions": total, "bytes": total_bytes, "seconds": seconds}

    def _progress(self, pos, stop: StopPoint, begin: list[str], total: int, total_bytes: int, elapsed: float) -> str:
        """Transactions and bytes applied so far: up to the newest applied transaction of the domains (servers) still
        short of the stop, which is a lower bound when they apply out of step; the rate and the time left at it."""
        files = self.file_names()
        done_at = None
        for gtid in self.target.newest(pos, stop.state):
            txn = self.transaction_for_gtid(gtid)
            if txn is not None and txn.file in files:
                here = (files.index(txn.file), txn.end, txn.file)
                done_at = here if done_at is None or here < done_at else done_at
        shown = self.target.text(pos)
        if done_at is None or len(begin) != 2:
            return f"applied up to {shown} (the stop is {self.target.text(stop.state)})"
        span = self.span((begin[0], int(begin[1])), (done_at[2], done_at[1]))
        rate = span["transactions"] / elapsed if elapsed > 0 else 0.0
        left = (total - span["transactions"]) / rate if rate > 0 else float("inf")
        return (f"applied {span['transactions']} of {total} transactions, {span['bytes']} of {total_bytes} bytes, "
                f"{rate:.0f} trx/s, ETA {left:.0f} s (at {shown})")

    def finish(self, stop: StopPoint, server_id: int, connected: bool) -> None:
        t = self.target
        if connected and t.ours():
            t.stop()
            after = t.position()
            if not t.reached(after, stop.state):
                raise Stop(EXIT_ERROR, f"{t.name} stopped at {t.text(after)}, not at the stop's {t.text(stop.state)}")
            t.reset()
        original = self.parallel_original
        if original is None:
            original = self._recorded_parallel(server_id)
        if original is not None and original >= 0 and t.parallel() not in (original, -1) and not t.any_running():
            t.set_parallel(original)
        self.relay.execute(f"RELAYPROXY CLEAR REPLAY STOP FOR SERVER_ID {server_id}")
        self.step("finished", "the replay connection reset, the relay's stop cleared")

    def close(self) -> None:
        self.server.close()
        self.relay.close()


def _zone(name: str | None):
    if name:
        try:
            return zone_of(name), name
        except ValueError:
            raise Stop(EXIT_USAGE, f"--time-zone {name!r}: not a time zone this machine knows") from None
    # The local zone's rules at the time asked for (a disaster on the other side of a DST change from now is read
    # with its own offset), as `relayproxy find` reads a time without a zone.
    return PP.LOCAL_ZONE, f"this machine's local time zone ({datetime.now().astimezone().strftime('%Z')} now)"


def run(args: argparse.Namespace) -> int:
    return run_reported(args, Replay, Report, OUTCOMES)
