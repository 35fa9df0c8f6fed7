"""Act 3 of `relayproxy demo`: a semi-sync master killed under load, promoting a lagging candidate as it is beside
`relayproxy promote`, told live.

The topology and steps are one trial of relayproxy.lab.lossless (kind ``master``, one relay, a replica behind it)::

    M  semi-sync master (AFTER_SYNC, long timeout) ──── relayproxy (run --semi-sync) ── T  replica behind the relay
       4 writer threads                             └── P ── C  candidate, a direct async replica; P delays its stream

A COMMIT returns on M only once relayproxy has the transaction durable, so after `kill -9` of M every acknowledged
commit is in the relay, while C, behind its slow link, lacks the last ones. `LosslessStory` adds what the demo
needs around the trial's steps: a live line (its own connections, read by a thread while the steps block), the
narration, and the raw ids behind each figure (acknowledged, on C before promote, on C after), so a reader of the
JSON can recount them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

from .lossless import Trial, TrialSpec, present

WRITES_AFTER = 5  # transactions Trial.check() writes on the promoted candidate


@dataclass(frozen=True)
class LosslessSnapshot:
    """One look at act 3's topology (None where a piece did not answer: M after the kill, say)."""

    elapsed: float
    phase: str
    master_gtid: str | None
    acked: int | None  # M's Rpl_semi_sync_master_yes_tx: commits the relay acknowledged
    relay_gtid: str | None
    candidate_gtid: str | None
    replica_gtid: str | None

    def line(self) -> str:
        def seq(gtid: str | None) -> str:
            return gtid if gtid else "?"

        master = f"{seq(self.master_gtid)} (relay acked {self.acked})" if self.master_gtid else "down"
        behind = ""
        lead = self.master_gtid or self.relay_gtid
        if lead and self.candidate_gtid:
            with contextlib.suppress(ValueError, IndexError):
                lag = int(lead.rsplit("-", 1)[1]) - int(self.candidate_gtid.rsplit("-", 1)[1])
                behind = f" ({lag} behind)" if lag > 0 else ""
        return (f"{self.elapsed:5.1f}s {self.phase:<10} master {master}  relay {seq(self.relay_gtid)}  "
                f"candidate {seq(self.candidate_gtid)}{behind}  via relay {seq(self.replica_gtid)}")


@dataclass
class LosslessResult:
    """What act 3 measured. Ids are the writers' transaction ids (one per COMMIT)."""

    load_seconds: float
    candidate_delay: float
    acknowledged_ids: list[int]  # COMMIT returned before M died
    acknowledged_rows: int
    in_flight: int  # COMMIT sent, no answer when M died: never counted either way
    candidate_ids_before: list[int]  # on C once it applied all it received (what a direct promotion would keep)
    candidate_gtid_before: str
    relay_gtid_before: str
    direct_lost: int  # acknowledged ids missing on C before promote
    direct_lost_rows: int
    promoted_ids: list[int]  # on C after `relayproxy promote`, before the new writes
    lost: int  # acknowledged ids missing on C after promote
    lost_rows: int
    duplicate_rows: int
    partial: int
    errant: list[str]
    promote_command: list[str]
    promote_runs: list[dict[str, Any]]
    promote_report: dict[str, Any]
    kill_to_writable: float  # s, less the time spent counting the direct loss
    snapshot_seconds: float
    relay_follows: str  # the relay's master after promote (host:port)
    relay_gtid_after: str
    replica_caught_up: bool | None
    seconds_to_replica: float  # the new master's writes: written -> on T behind the relay (and checked)
    candidate_port: int
    timeline: list[LosslessSnapshot] = field(default_factory=list)

    def summary_lines(self) -> list[str]:
        report = self.promote_report
        acked = len(self.acknowledged_ids)
        steps = [f"    {s['seconds']:5.2f} s  {s['step']}" for s in report.get("steps", [])]
        rows = [
            ("", "promote the candidate as it is", "relayproxy promote"),
            ("acknowledged commits lost", f"{self.direct_lost} of {acked}", f"{self.lost} of {acked}"),
            ("their rows lost", f"{self.direct_lost_rows} of {self.acknowledged_rows}",
             f"{self.lost_rows} of {self.acknowledged_rows}"),
            ("candidate's GTID position", self.candidate_gtid_before,
             str(report.get("candidate", {}).get("after") or "?")),
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [f"  {a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in rows]
        fetched = report.get("fetched") or "nothing"
        count = int(report.get("fetched_count") or 0)
        unreturned = count - self.direct_lost
        why = (f"the {self.direct_lost} acknowledged commits the candidate lacked and {unreturned} whose COMMIT had "
               "not returned when the master died" if not self.lost and unreturned > 0 else "")
        lines += [
            "",
            f"  {acked} commits returned (acknowledged) in {self.load_seconds:.1f} s of load, {self.in_flight} were "
            "in flight when the master died (never counted)",
            f"  the relay held {self.relay_gtid_before}; the candidate, its link gone, applied all it had received: "
            f"{self.candidate_gtid_before}",
            f"  relayproxy promote fetched {fetched} ({count} transactions{': ' + why if why else ''}) from relay "
            f"{report.get('source_relay')}, exit {self.promote_runs[-1].get('exit_code')} "
            f"({report.get('outcome')}), {report.get('total_seconds', 0):.2f} s:",
            *steps,
            f"  kill -9 to a writable candidate: {self.kill_to_writable:.2f} s (not counting the "
            f"{self.snapshot_seconds:.2f} s this demo spent counting the direct loss)",
            f"  rows applied twice: {self.duplicate_rows}; partial transactions: {self.partial}; "
            f"GTIDs not from the old master: {', '.join(self.errant) or 'none'}",
            f"  relayproxy now follows {self.relay_follows}, Retrieved_Gtid_Set {self.relay_gtid_after}",
            f"  {WRITES_AFTER} transactions written on the new master: the replica behind relayproxy "
            + ("has them, same rows as the new master" if self.replica_caught_up else "does NOT have them")
            + f" ({self.seconds_to_replica:.2f} s)",
        ]
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "load_seconds": self.load_seconds,
            "candidate_delay_seconds": self.candidate_delay,
            "acknowledged": len(self.acknowledged_ids),
            "acknowledged_rows": self.acknowledged_rows,
            "in_flight": self.in_flight,
            "direct_lost": self.direct_lost,
            "direct_lost_rows": self.direct_lost_rows,
            "lost_after_promote": self.lost,
            "lost_rows_after_promote": self.lost_rows,
            "duplicate_rows": self.duplicate_rows,
            "partial": self.partial,
            "errant": self.errant,
            "kill_to_writable_seconds": self.kill_to_writable,
            "snapshot_seconds": self.snapshot_seconds,
            "seconds_to_replica": round(self.seconds_to_replica, 3),
            "candidate_gtid_before": self.candidate_gtid_before,
            "relay_gtid_before": self.relay_gtid_before,
            "promote": {
                "command": self.promote_command,
                "runs": self.promote_runs,
                "outcome": self.promote_report.get("outcome"),
                "exit_code": self.promote_report.get("exit_code"),
                "fetched": self.promote_report.get("fetched"),
                "fetched_count": self.promote_report.get("fetched_count"),
                "total_seconds": self.promote_report.get("total_seconds"),
                "steps": self.promote_report.get("steps"),
            },
            "candidate_port": self.candidate_port,
            "relay_follows": self.relay_follows,
            "relay_gtid_after": self.relay_gtid_after,
            "replica_caught_up": self.replica_caught_up,
            "acknowledged_ids": self.acknowledged_ids,
            "candidate_ids_before_promote": self.candidate_ids_before,
            "candidate_ids_after_promote": self.promoted_ids,
        }


class LosslessStory:
    """Act 3: builds the trial's topology, runs its steps with a live line and narration; `close()` stops all."""

    def __init__(self, workdir: Path, *, load_seconds: float, candidate_delay: float, seed: int = 3,
                 observe: Callable[[LosslessSnapshot], None] | None = None,
                 narrate: Callable[[str], None] | None = None, interval: float = 0.5) -> None:
        self.spec = TrialSpec(seed=seed, kind="master", relays=1, candidate_delay=candidate_delay, replica=True,
                              load_seconds=load_seconds, big_chance=0.0)
        self.trial = Trial(Path(workdir), self.spec)
        self.observe = observe or (lambda snapshot: None)
        self.narrate = narrate or (lambda text: None)
        self.interval = interval
        self.phase = "setup"
        self.started = time.monotonic()
        self.killed: float | None = None
        self.timeline: list[LosslessSnapshot] = []

    def __enter__(self) -> LosslessStory:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.trial.close()

    # -- the live line ---------------------------------------------------------------------------------------------

    def _look(self, conns: dict[str, pymysql.connections.Connection | None]) -> LosslessSnapshot:
        """A snapshot on the watcher's own connections (a sandbox's execute() keeps one connection: not shared)."""
        trial = self.trial
        servers = {"master": trial.master, "candidate": trial.candidate, "replica": trial.replica}

        def query(name: str, sql: str) -> tuple | None:
            server = servers[name]
            if server is None or not server.running:
                return None
            try:
                conn = conns.get(name) or server.connect(connect_timeout=1, read_timeout=2)
                conns[name] = conn
                with conn.cursor() as cur:
                    cur.execute(sql)
                    return cur.fetchone()
            except (pymysql.MySQLError, OSError, RuntimeError):
                with contextlib.suppress(Exception):
                    if conns.get(name) is not None:
                        conns[name].close()
                conns[name] = None
                return None

        # Downstream first, the master last: read in this order, no one shows ahead of the master under load.
        relay = None
        if trial.relays:
            with contextlib.suppress(OSError, ValueError, KeyError):
                relay = str(trial.relays[0].status()["retrieved_gtid_set"] or "")
        replica = query("replica", "SELECT @@GLOBAL.gtid_slave_pos")
        candidate = query("candidate", "SELECT @@GLOBAL.gtid_binlog_pos")  # log_slave_updates; its own once promoted
        master = query("master", "SELECT @@GLOBAL.gtid_binlog_pos, "
                                 "(SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "
                                 "WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_YES_TX')")
        phase = self.phase
        if self.killed is not None and phase == "after kill":
            phase = f"kill+{time.monotonic() - self.killed:.1f}s"
        return LosslessSnapshot(
            elapsed=time.monotonic() - self.started, phase=phase,
            master_gtid=str(master[0]) if master else None,
            acked=int(master[1] or 0) if master else None,
            relay_gtid=relay, candidate_gtid=str(candidate[0]) if candidate else None,
            replica_gtid=str(replica[0]) if replica else None)

    def snapshot(self) -> LosslessSnapshot:
        conns: dict[str, Any] = {}
        try:
            snap = self._look(conns)
        finally:
            for conn in conns.values():
                with contextlib.suppress(Exception):
                    conn and conn.close()
        self.timeline.append(snap)
        self.observe(snap)
        return snap

    @contextlib.contextmanager
    def watching(self, phase: str):
        """Show the live line from a thread while the step inside blocks the caller; one last line at the end."""
        self.phase = phase
        done = threading.Event()

        def watch() -> None:
            conns: dict[str, Any] = {}
            try:
                while not done.is_set():
                    snap = self._look(conns)
                    if done.is_set():
                        break
                    self.timeline.append(snap)
                    self.observe(snap)
                    done.wait(self.interval)
            except BaseException:  # noqa: BLE001 - a Ctrl-C reaches the main thread by itself; the line just stops
                return
            finally:
                for conn in conns.values():
                    with contextlib.suppress(Exception):
                        conn and conn.close()

        thread = threading.Thread(target=watch, daemon=True, name="act3-live")
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(10)
        self.snapshot()

    # -- the act ---------------------------------------------------------------------------------------------------

    def run(self) -> LosslessResult:
        trial, spec = self.trial, self.spec
        self.narrate(
            "act 3: a semi-sync master (AFTER_SYNC, rpl_semi_sync_master_timeout longer than the act) with relayproxy "
            "as its semi-sync replica (run --semi-sync), a replica behind relayproxy, and a candidate replicating "
            f"directly through a link that delays the stream {spec.candidate_delay:.2f} s. 4 writer threads commit; "
            f"every COMMIT that returns is recorded by its id; kill -9 the master after {spec.load_seconds:g} s.")
        self.narrate("live view: the master's GTID position (and how many commits relayproxy acknowledged), "
                     "relayproxy's Retrieved_Gtid_Set, the candidate's and the replica's GTID positions")
        trial.start()
        self.started = time.monotonic()  # the live line counts from the first write
        with self.watching("load"):
            killed = trial.load_and_kill()
            self.killed, self.phase = killed, "after kill"
        self.narrate(f"kill -9 the master after {spec.load_seconds:g} s of writes: {len(trial.acked)} commits had "
                     "returned. The candidate's link is gone; wait until it applied all it received.")
        with self.watching("after kill"):
            began = time.monotonic()
            trial.direct_snapshot()
            snapshot_seconds = time.monotonic() - began
        have_before, _ = present(trial.candidate)
        candidate_before = sorted(t for t, rows in have_before.items() if rows > 0)
        relay_before = str(trial.relays[0].status()["retrieved_gtid_set"])
        result = trial.result
        self.narrate(
            f"a direct promotion of the candidate as it is would lose {result.direct_lost} of {result.acked} "
            f"acknowledged commits ({result.direct_lost_rows} rows). Now the HA tool runs relayproxy promote "
            "(password files, --json):")
        self.narrate(" ".join(self.promote_command_shown()))
        with self.watching("promote"):
            trial.promote(killed, snapshot_seconds)
        have_after, _ = present(trial.candidate)
        promoted = sorted(t for t, rows in have_after.items() if rows > 0)
        lost_rows = sum(trial.acked[t][0] for t in trial.acked if have_after.get(t, 0) == 0)
        began = time.monotonic()
        with self.watching("new master"):
            trial.check()
        seconds_to_replica = time.monotonic() - began
        status = trial.relays[0].status()
        return LosslessResult(
            load_seconds=spec.load_seconds,
            candidate_delay=spec.candidate_delay,
            acknowledged_ids=sorted(trial.acked),
            acknowledged_rows=result.acked_rows,
            in_flight=result.in_flight,
            candidate_ids_before=candidate_before,
            candidate_gtid_before=result.candidate_gtid,
            relay_gtid_before=relay_before,
            direct_lost=result.direct_lost,
            direct_lost_rows=result.direct_lost_rows,
            promoted_ids=promoted,
            lost=result.lost,
            lost_rows=lost_rows,
            duplicate_rows=result.duplicate_rows,
            partial=result.partial,
            errant=list(result.errant),
            promote_command=self.promote_command_shown(),
            promote_runs=result.promote_runs,
            promote_report=result.promote_report,
            kill_to_writable=result.kill_to_writable,
            snapshot_seconds=round(snapshot_seconds, 3),
            relay_follows=f"{status.get('master_host')}:{status.get('master_port')}",
            relay_gtid_after=str(status.get("retrieved_gtid_set")),
            replica_caught_up=result.replica_caught_up,
            seconds_to_replica=seconds_to_replica,
            candidate_port=trial.candidate.port,
            timeline=self.timeline,
        )

    def promote_command_shown(self) -> list[str]:
        """The command the trial runs, as `relayproxy promote ...` (the interpreter and module path left out)."""
        command = self.trial.promote_command()
        at = command.index("promote")
        return ["relayproxy", *command[at:]]
