"""Randomized lossless-promotion trials: a semi-sync master killed under load, `relayproxy promote` through the relay
beside promoting the lagging direct replica as it is, in the same trial.

One trial (everything on 127.0.0.1, under one working directory)::

    M  semi-sync master (AFTER_SYNC, log_bin mysql-bin, GTID, ROW) ──┬── relay1 (run --semi-sync) ── T (GTID replica)
       4 writer threads, each its own connection                    ├── relay2 (optional, also semi-sync)
                                                                     └─ P ── C  candidate (GTID slave_pos, log_bin,
                                                                              log_slave_updates, read_only)

P is a `ThreadedFaultProxy` that forwards each chunk (up to 64 KB) of the master's stream after a random 0-500 ms:
C is an ordinary async replica that lags. In the `fallback` kind the relays' links go through fault proxies too (to
pause them). The writers commit transactions of mixed sizes (one row, 2-10 rows in BEGIN..COMMIT, now and then an
INSERT .. SELECT of 1-3 MB); every row carries its transaction's id (`tid`) and its own `uid`, and a transaction
whose COMMIT returned is recorded as acknowledged: with AFTER_SYNC and a timeout longer than the trial, it returned
only once a relay had acknowledged it. At a random moment M is killed with SIGKILL and every proxied link to it is
dropped without flushing (what a dead master's host leaves in flight is gone). Per kind:

- ``master``: only that;
- ``relay-kill``: one relay is also killed with SIGKILL at a random moment around the master's kill and restarted
  from its directory after a random pause, as systemd would (with one relay the master's commits wait for it);
- ``promote-kill``: the first `relayproxy promote` is killed with SIGKILL at a random moment, then run again;
- ``fallback``: the master's `rpl_semi_sync_master_timeout` is short and the relays' links are paused, so the master
  falls back to asynchronous replication and commits return unacknowledged before the kill: the documented hole.
  Commits that returned before the pause are held to the same rule (none lost); those after it are counted apart.

Then, in the same trial: the direct promotion's loss (C, its link gone, has applied all it received: the acknowledged
transactions it lacks are what promoting it as it is would lose), `relayproxy promote` (run again after exit 4, 5 or
6, or after its kill), and the checks on the promoted C: acknowledged transactions missing, rows applied twice,
partial transactions, GTIDs not from M (errant), the kill-to-writable time (from M's kill until C's @@read_only is 0,
less the time the direct snapshot took, which no HA tool spends), and new writes on C reaching the relays and T.

`run_trial(workdir, TrialSpec.draw(seed, kind))` runs one; a seed alone reproduces a trial's choices (not its
timing). Used by tests/scenarios/test_lossless_trials.py and benchmarks/lossless_trials.py.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pymysql

from .failover import ADMIN_PASSWORD, ADMIN_USER, BASENAME, REPL_PASSWORD, REPL_USER, covers, gtid_seqs
from .faultproxy import SERVER_TO_CLIENT, ThreadedFaultProxy
from .harness import REPO, RelayProcess, change_master, free_port, replica_status, run_every_step
from .sandbox import MariaDBSandbox

KINDS = ("master", "relay-kill", "promote-kill", "fallback")
LOSSLESS_KINDS = KINDS[:3]  # kinds where every acknowledged commit must survive
SCHEMA = "app"
MASTER_ID, CANDIDATE_ID, REPLICA_ID = 1, 2, 5
LONG_TIMEOUT_MS = 120_000  # semi-sync wait of the lossless kinds: longer than any trial, so it never falls back
SHORT_TIMEOUT_MS = 300  # the fallback kind's
BIG_ROW = 4000  # bytes of one row of a big transaction
WRITERS = 4
PROMOTE_TIMEOUT = 60.0  # --timeout given to `relayproxy promote`
RETRY_PAUSE = 0.5  # seconds before promote runs again after an exit of 4, 5 or 6 (an HA tool's retry)


class TrialError(AssertionError):
    """The trial's machinery failed (not a finding about promote); the message carries what was seen."""


@dataclass
class TrialSpec:
    """Every random choice of one trial, drawn from its seed."""

    seed: int
    kind: str
    relays: int  # 1 or 2
    candidate_delay: float  # seconds the direct candidate's link holds each chunk
    replica: bool  # a MariaDB replica T behind relay1
    load_seconds: float  # writes before M is killed
    big_chance: float  # chance that a transaction is a 1-3 MB INSERT .. SELECT
    relay_kill_at: float = 0.0  # relay-kill: seconds relative to M's kill (negative: before)
    relay_down: float = 0.0  # relay-kill: seconds before the restart begins
    killed_relay: int = 0  # relay-kill: which relay (index)
    promote_kill_after: float = 0.0  # promote-kill: seconds after the first promote started
    pause_at: float = 0.0  # fallback: seconds into the load when the relays' links pause

    @classmethod
    def draw(cls, seed: int, kind: str | None = None) -> TrialSpec:
        rnd = random.Random(seed)
        kind = kind or rnd.choice(KINDS)
        if kind not in KINDS:
            raise ValueError(f"unknown trial kind {kind!r}; one of {KINDS}")
        spec = cls(seed=seed, kind=kind, relays=rnd.choice((1, 2)), candidate_delay=round(rnd.uniform(0, 0.5), 3),
                   replica=rnd.random() < 0.5, load_seconds=round(rnd.uniform(0.8, 2.5), 3),
                   big_chance=rnd.choice((0.0, 0.003, 0.01)))
        if kind == "relay-kill":
            # from during the load to while promote runs (it starts ~0.3-1 s after M's kill, after the snapshot)
            spec.relay_kill_at = round(rnd.uniform(-spec.load_seconds + 0.2, 1.5), 3)
            spec.relay_down = round(rnd.uniform(0.0, 1.0), 3)
            spec.killed_relay = rnd.randrange(spec.relays)
        elif kind == "promote-kill":
            # `relayproxy promote` spends ~0.3 s starting (Python imports) and is done after ~0.5-0.9 s here
            spec.promote_kill_after = round(rnd.uniform(0.25, 0.65), 3)
        elif kind == "fallback":
            spec.pause_at = round(rnd.uniform(0.3, spec.load_seconds - 0.3), 3) if spec.load_seconds > 0.9 else 0.3
            spec.load_seconds = max(spec.load_seconds, spec.pause_at + SHORT_TIMEOUT_MS / 1000 + 0.4)
        return spec


@dataclass
class TrialResult:
    """What one trial measured. Counts are transactions (each holds one or more rows) unless named rows."""

    spec: TrialSpec
    acked: int = 0  # transactions whose COMMIT returned (fallback: before the pause)
    acked_rows: int = 0
    in_flight: int = 0  # COMMIT sent, no answer before M died: may or may not survive, never counted
    lost: int = 0  # acknowledged transactions missing on the promoted master (must be 0)
    lost_tids: list[int] = field(default_factory=list)
    partial: int = 0  # transactions present with some rows missing (must be 0)
    duplicate_rows: int = 0  # rows applied twice (must be 0)
    errant: list[str] = field(default_factory=list)  # GTIDs on the promoted master not from M (must be none)
    # promote's "unrelayed" (or "errant"): GTIDs the candidate had that no relay had. Here they are M's own
    # transactions (server_id 1) that reached C but no relay (a relay down, an ACK in flight): unacknowledged, kept.
    candidate_extra: str = ""
    relay_dropped: list[str] = field(default_factory=list)  # a relay held GTIDs the promoted master lacks (none)
    direct_lost: int = 0  # acknowledged transactions the candidate lacked as it was: promoting it directly loses them
    direct_lost_rows: int = 0
    unacked_returned: int = 0  # fallback: COMMITs that returned after the pause
    unacked_lost: int = 0  # fallback: of those, missing on the promoted master (the documented hole)
    direct_unacked_lost: int = 0  # fallback: of those, missing on the candidate as it was
    fell_back: bool = False  # the master reported Rpl_semi_sync_master_status OFF, or no_tx grew, before the kill
    no_tx: int = 0  # Rpl_semi_sync_master_no_tx grown during the load (lossless kinds: must stay 0)
    kill_to_writable: float = 0.0  # s, from M's kill to C's read_only = 0, less the snapshot
    snapshot_seconds: float = 0.0  # s, the direct snapshot (waiting for C to apply what it has, then counting)
    promote_runs: list[dict] = field(default_factory=list)  # per run: exit code, outcome, seconds, killed
    promote_report: dict = field(default_factory=dict)  # the last run's JSON document
    replica_caught_up: bool | None = None  # T has the new writes on the promoted master (None: no T)
    relay_killed_at: float | None = None  # relay-kill: s relative to M's kill, as it happened
    candidate_gtid: str = ""  # C's gtid_slave_pos once it applied all it had (the direct promotion's state)
    relay_gtids: list[str] = field(default_factory=list)  # each relay's retrieved_gtid_set before promote
    phases: dict[str, float] = field(default_factory=dict)
    total_seconds: float = 0.0
    error: str | None = None  # the trial could not be run to its end (benchmark: recorded, the run goes on)

    @property
    def candidate_ahead(self) -> bool:
        """C had received more than every relay (the relays' acknowledgements lag C's async stream)."""
        try:
            mine = gtid_seqs(self.candidate_gtid).get(0, 0)
            return bool(self.relay_gtids) and all(mine > gtid_seqs(g).get(0, 0) for g in self.relay_gtids)
        except ValueError:  # a relay's set could not be read
            return False

    @property
    def ok(self) -> bool:
        return (self.error is None
                and not (self.lost or self.partial or self.duplicate_rows or self.errant or self.relay_dropped)
                and self.replica_caught_up is not False)

    def summary(self) -> str:
        s = self.spec
        text = (f"seed {s.seed} {s.kind}: relays {s.relays}, delay {s.candidate_delay:.3f} s, acked {self.acked} "
                f"({self.acked_rows} rows), lost {self.lost}, dup rows {self.duplicate_rows}, partial {self.partial}, "
                f"errant {len(self.errant)}, direct lost {self.direct_lost}, kill->writable "
                f"{self.kill_to_writable:.2f} s, promote runs {[r.get('exit_code') for r in self.promote_runs]}, "
                f"{self.total_seconds:.1f} s")
        if s.kind == "fallback":
            text += (f", fell back {self.fell_back}, returned unacked {self.unacked_returned}, "
                     f"of them lost {self.unacked_lost}")
        return text

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok, "candidate_ahead": self.candidate_ahead}


# -- the workload ----------------------------------------------------------------------------------------------------


class Writers:
    """WRITERS threads committing mixed transactions on M until told to stop or M dies; see the module docstring."""

    def __init__(self, master: MariaDBSandbox, seed: int, big_chance: float) -> None:
        self.master = master
        self.seed = seed
        self.big_chance = big_chance
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.committed: dict[int, tuple[int, float]] = {}  # tid -> (rows, monotonic time its COMMIT returned)
        self.in_flight: dict[int, int] = {}  # tid -> rows: COMMIT sent, no answer
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True, name=f"writer{w}")
                        for w in range(WRITERS)]

    def start(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def join(self, timeout: float = 30.0) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout)

    def _run(self, w: int) -> None:
        rnd = random.Random(self.seed * 31 + w)
        tid = (w + 1) * 10**9  # per-writer ranges: ids never collide
        uid = (w + 1) * 10**12
        try:
            conn = self.master.connect(read_timeout=LONG_TIMEOUT_MS / 1000 + 30, write_timeout=60)
        except pymysql.MySQLError as exc:
            self.errors.append(f"writer {w} could not connect: {exc!r}")
            return
        with conn, conn.cursor() as cur:
            while not self.stop.is_set():
                tid += 1
                pick = rnd.random()
                if pick < self.big_chance:
                    rows = rnd.randint(1 << 20, 3 << 20) // BIG_ROW
                    statements = [(f"INSERT INTO {SCHEMA}.t (tid, uid, v) SELECT {tid}, {uid} + seq, "
                                   f"REPEAT('b', {BIG_ROW}) FROM {SCHEMA}.seq_1_to_{rows}", None)]
                elif pick < 0.7:
                    rows = 1
                    statements = [(f"INSERT INTO {SCHEMA}.t (tid, uid, v) VALUES (%s, %s, %s)",
                                   (tid, uid + 1, "x" * rnd.randint(0, 200)))]
                else:
                    rows = rnd.randint(2, 10)
                    statements = [("BEGIN", None)] + [
                        (f"INSERT INTO {SCHEMA}.t (tid, uid, v) VALUES (%s, %s, %s)",
                         (tid, uid + i, "y" * rnd.randint(0, 400))) for i in range(1, rows + 1)] + [("COMMIT", None)]
                uid += rows
                with self.lock:
                    self.in_flight[tid] = rows
                try:
                    for sql, args in statements:
                        cur.execute(sql, args)
                except pymysql.MySQLError as exc:
                    if not self.stop.is_set():
                        self.errors.append(f"writer {w}: {exc!r}")
                    return  # M is gone (or stopping): this transaction's fate is unknown, it stays in flight
                with self.lock:
                    del self.in_flight[tid]
                    self.committed[tid] = (rows, time.monotonic())


def present(server: MariaDBSandbox) -> tuple[dict[int, int], int]:
    """({tid: rows present}, rows applied twice) on a server."""
    rows = server.execute(f"SELECT tid, COUNT(*), COUNT(DISTINCT uid) FROM {SCHEMA}.t GROUP BY tid")
    return {int(r[0]): int(r[2]) for r in rows}, sum(int(r[1]) - int(r[2]) for r in rows)


def status_var(server: MariaDBSandbox, name: str) -> str | None:
    rows = server.execute("SHOW GLOBAL STATUS LIKE %s", (name,))
    return str(rows[0][1]) if rows else None


# -- one trial -------------------------------------------------------------------------------------------------------


class Trial:
    """The topology of one trial and its steps; `run()` does them all and always stops what it started."""

    def __init__(self, workdir: Path, spec: TrialSpec) -> None:
        self.workdir = Path(workdir).absolute()
        self.spec = spec
        self.result = TrialResult(spec)
        timeout = SHORT_TIMEOUT_MS if spec.kind == "fallback" else LONG_TIMEOUT_MS
        self.master = MariaDBSandbox(
            self.workdir / "m", server_id=MASTER_ID, binlog_format="ROW", log_bin_name=BASENAME,
            extra_config={"rpl_semi_sync_master_enabled": 1, "rpl_semi_sync_master_wait_point": "AFTER_SYNC",
                          "rpl_semi_sync_master_timeout": timeout,
                          # the set-up runs before a relay is there; turned ON once they are (see start())
                          "rpl_semi_sync_master_wait_no_slave": "OFF"})
        self.candidate = MariaDBSandbox(self.workdir / "c", server_id=CANDIDATE_ID, binlog_format="ROW",
                                        log_bin_name=BASENAME, extra_config={"log_slave_updates": 1, "read_only": 1})
        self.replica = (MariaDBSandbox(self.workdir / "t", server_id=REPLICA_ID, log_bin=False)
                        if spec.replica else None)
        self.relays: list[RelayProcess] = []
        self.relay_ports: list[int] = []
        self.relay_links: list[ThreadedFaultProxy] = []
        self.candidate_link: ThreadedFaultProxy | None = None
        self.secrets = self.workdir / "secrets"
        self._relay_restarter: threading.Thread | None = None

    def servers(self) -> list[MariaDBSandbox]:
        return [s for s in (self.master, self.candidate, self.replica) if s is not None]

    # -- set-up --------------------------------------------------------------------------------------------------

    def start(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two at a time: a 2-core machine
            for future in [pool.submit(s.start) for s in self.servers()]:
                future.result()
        m = self.master
        m.create_user(REPL_USER, REPL_PASSWORD)
        m.create_user(ADMIN_USER, ADMIN_PASSWORD, "ALL PRIVILEGES")  # replicated: promote's account on C
        m.execute(f"GRANT ALL PRIVILEGES ON *.* TO {ADMIN_USER}@'%' WITH GRANT OPTION")
        m.execute(f"CREATE DATABASE {SCHEMA}")
        m.execute(f"CREATE TABLE {SCHEMA}.t (pk BIGINT AUTO_INCREMENT PRIMARY KEY, tid BIGINT NOT NULL, "
                  "uid BIGINT NOT NULL, v VARCHAR(4000) NOT NULL, KEY (tid, uid)) ENGINE=InnoDB")
        self.secrets.mkdir(parents=True, exist_ok=True)
        for name, secret in (("admin", ADMIN_PASSWORD), ("repl", REPL_PASSWORD)):
            path = self.secrets / name
            path.write_text(secret + "\n")
            path.chmod(0o600)
        for i in range(self.spec.relays):
            upstream = m.port
            if self.spec.kind == "fallback":
                link = ThreadedFaultProxy(m.host, m.port).start()
                self.relay_links.append(link)
                upstream = link.port
            while True:  # free_port() closes what it bound: two calls can return the same port
                port = free_port()
                relay = RelayProcess(
                    self.workdir / f"relay{i + 1}", upstream, server_id=100 + i, gtid_mode="mariadb",
                    extra=["--listen", f"127.0.0.1:{port}", "--semi-sync", "on",
                           "--users", f"{REPL_USER}:{REPL_PASSWORD},{ADMIN_USER}:{ADMIN_PASSWORD}:admin"])
                taken = {*self.relay_ports, *(r.http_port for r in self.relays)}
                if port != relay.http_port and not {port, relay.http_port} & taken:
                    break
            self.relay_ports.append(port)
            self.relays.append(relay.start())
        # A large read size: each chunk waits the delay once, so the delay acts as latency more than as a
        # throughput cap (64 KB per 0.5 s would leave C minutes behind).
        self.candidate_link = ThreadedFaultProxy(m.host, m.port, read_size=8 << 20).start()
        change_master(self.candidate, self.candidate_link.port, file=None)
        self.candidate.execute("START SLAVE")
        if self.replica is not None:
            change_master(self.replica, self.relay_ports[0], file=None)
            self.replica.execute("START SLAVE")
        for relay in self.relays:
            relay.wait_for(lambda s: s["io_running"] and s["semi_sync"], 30, "semi-sync streaming")
        wait(f"{self.spec.relays} semi-sync client(s) on M", lambda: status_var(m, "Rpl_semi_sync_master_clients")
             == str(self.spec.relays) and status_var(m, "Rpl_semi_sync_master_status") == "ON", 30)
        m.execute("SET GLOBAL rpl_semi_sync_master_wait_no_slave = ON")
        want = str(m.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0])
        for s in [self.candidate, *([self.replica] if self.replica else [])]:
            wait(f"{s.basedir.name} to apply the set-up", lambda s=s: covers(gtid_slave_pos(s), want), 30)
        self.candidate_link.delay(self.spec.candidate_delay, SERVER_TO_CLIENT)

    # -- the run ----------------------------------------------------------------------------------------------------

    def load_and_kill(self) -> float:
        """Write, kill M (and in relay-kill a relay) as the spec says; returns the monotonic time of M's kill."""
        spec, m = self.spec, self.master
        no_tx_before = int(status_var(m, "Rpl_semi_sync_master_no_tx") or 0)
        writers = Writers(m, spec.seed, spec.big_chance).start()
        began = time.monotonic()
        kill_at = began + spec.load_seconds
        pause_time = None
        if spec.kind == "relay-kill":
            self._relay_restarter = threading.Thread(target=self._kill_and_restart_relay, args=(kill_at,), daemon=True)
            self._relay_restarter.start()
        if spec.kind == "fallback":
            sleep_until(began + spec.pause_at)
            for link in self.relay_links:
                link.pause()
            pause_time = time.monotonic()
            self.result.fell_back = bool(wait_quietly(
                lambda: status_var(m, "Rpl_semi_sync_master_status") == "OFF", SHORT_TIMEOUT_MS / 1000 + 3))
        sleep_until(kill_at)
        if spec.kind != "fallback":
            self.result.no_tx = int(status_var(m, "Rpl_semi_sync_master_no_tx") or 0) - no_tx_before
            self.result.fell_back = self.result.no_tx > 0 or status_var(m, "Rpl_semi_sync_master_status") != "ON"
        m.kill()
        killed = time.monotonic()
        for link in [self.candidate_link, *self.relay_links]:
            link.refuse(True)
            link.drop_connections()
        writers.join()
        with writers.lock:
            committed, in_flight = dict(writers.committed), dict(writers.in_flight)
        unexpected = [e for e in writers.errors if "2013" not in e and "2006" not in e and "Lost connection" not in e]
        if unexpected:
            raise TrialError(f"writers failed before the kill: {unexpected[:3]}")
        if pause_time is None:
            self.acked = committed
            self.unacked: dict[int, tuple[int, float]] = {}
        else:
            self.acked = {t: v for t, v in committed.items() if v[1] < pause_time}
            self.unacked = {t: v for t, v in committed.items() if v[1] >= pause_time}
        self.result.acked = len(self.acked)
        self.result.acked_rows = sum(rows for rows, _ in self.acked.values())
        self.result.in_flight = len(in_flight)
        self.result.unacked_returned = len(self.unacked)
        if self.result.acked == 0:
            raise TrialError("no transaction was acknowledged before the kill")
        return killed

    def _kill_and_restart_relay(self, master_kill_at: float) -> None:
        relay = self.relays[self.spec.killed_relay]
        sleep_until(master_kill_at + self.spec.relay_kill_at)
        relay.kill9()
        self.result.relay_killed_at = round(time.monotonic() - master_kill_at, 3)
        time.sleep(self.spec.relay_down)
        relay.start()

    def direct_snapshot(self) -> None:
        """C, its link gone, applies all it received; the acknowledged transactions it lacks are the direct loss."""
        c = self.candidate
        last: tuple | None = None
        stable = 0
        deadline = time.monotonic() + 120
        while stable < 3:
            status = replica_status(c)
            if status.get("Slave_SQL_Running") != "Yes":
                raise TrialError(f"the candidate's SQL thread stopped: {status.get('Last_SQL_Error')}")
            state = (status.get("Slave_SQL_Running_State"), gtid_slave_pos(c), status.get("Gtid_IO_Pos"))
            idle = str(state[0]).startswith("Slave has read all relay log") and status.get("Slave_IO_Running") != "Yes"
            stable = stable + 1 if idle and state == last else 0
            last = state
            if time.monotonic() > deadline:
                raise TrialError(f"the candidate did not settle: {status}")
            time.sleep(0.05)
        self.result.candidate_gtid = gtid_slave_pos(c)
        have, _dups = present(c)
        missing = [t for t in self.acked if have.get(t, 0) == 0]
        self.result.direct_lost = len(missing)
        self.result.direct_lost_rows = sum(self.acked[t][0] for t in missing)
        self.result.direct_unacked_lost = sum(1 for t in self.unacked if have.get(t, 0) == 0)

    def promote(self, killed: float, snapshot: float) -> None:
        """`relayproxy promote` until it reports done (again after 4, 5 or 6, or after the kill of promote-kill)."""
        # relay-kill: a relay may be down or restarting now (promote then exits 4 and runs again)
        for relay in self.relays:
            try:
                self.result.relay_gtids.append(str(relay.status()["retrieved_gtid_set"]))
            except (OSError, KeyError) as exc:
                self.result.relay_gtids.append(f"unknown: {exc!r}")
        writable: list[float] = []
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch_writable, args=(writable, stop), daemon=True)
        watcher.start()
        try:
            for attempt in range(6):
                kill_after = self.spec.promote_kill_after if self.spec.kind == "promote-kill" and attempt == 0 else None
                run = self._promote_once(kill_after)
                self.result.promote_runs.append(run)
                if run.get("killed"):
                    run["state_after_kill"] = self.promote_progress()
                    continue
                if run["exit_code"] == 0:
                    break
                if run["exit_code"] not in (4, 5, 6):  # unreachable, timed out, promoted but a relay left: again
                    raise TrialError(f"relayproxy promote exited with {run['exit_code']}: {run.get('message')}\n"
                                     f"{run.get('stderr', '')[-2000:]}")
                time.sleep(RETRY_PAUSE)
            else:
                raise TrialError(f"relayproxy promote did not finish: {self.result.promote_runs}")
            wait_quietly(lambda: bool(writable), 5)
        finally:
            stop.set()
            watcher.join(5)
        if not writable:
            raise TrialError("promote reported done but the candidate's @@read_only is still 1")
        self.result.kill_to_writable = round(writable[0] - killed - snapshot, 3)

    def promote_progress(self) -> str:
        """Where a killed promote left things: C's master, IO thread and read_only; each relay's master and IO."""
        c = self.candidate
        try:
            st = replica_status(c)
            port = int(st["Master_Port"]) if st else None
            where = ("no replication" if not st else "old master's link" if port == self.candidate_link.port
                     else f"relay{self.relay_ports.index(port) + 1}" if port in self.relay_ports else f"port {port}")
            text = (f"candidate: {where}, IO {st.get('Slave_IO_Running', '-') if st else '-'}, read_only "
                    f"{c.execute('SELECT @@GLOBAL.read_only')[0][0]}")
        except (pymysql.MySQLError, OSError) as exc:
            text = f"candidate: {exc!r}"
        for i, relay in enumerate(self.relays):
            try:
                st = relay.status()
            except OSError:
                text += f"; relay{i + 1} down"
                continue
            target = "candidate" if st.get("master_port") == c.port else "old master"
            text += f"; relay{i + 1} on {target}, IO {'on' if st.get('io_running') else 'off'}"
        return text

    def _watch_writable(self, found: list[float], stop: threading.Event) -> None:
        conn = None
        while not stop.is_set():
            try:
                conn = conn or self.candidate.connect(connect_timeout=2, read_timeout=5)
                with conn.cursor() as cur:
                    cur.execute("SELECT @@GLOBAL.read_only")
                    if int(cur.fetchone()[0]) == 0:
                        found.append(time.monotonic())
                        break
            except pymysql.MySQLError:
                conn = None
            time.sleep(0.01)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def promote_command(self) -> list[str]:
        cmd = [sys.executable, "-m", "relayproxy.commands.cli", "promote",
               "--candidate", f"127.0.0.1:{self.candidate.port}", "--candidate-user", ADMIN_USER,
               "--candidate-password-file", str(self.secrets / "admin")]
        for port in self.relay_ports:
            cmd += ["--relay", f"127.0.0.1:{port}"]
        cmd += ["--relay-user", ADMIN_USER, "--relay-password-file", str(self.secrets / "admin"),
                "--repl-user", REPL_USER, "--repl-password-file", str(self.secrets / "repl"),
                "--json", "--timeout", str(PROMOTE_TIMEOUT)]
        return cmd

    def _promote_once(self, kill_after: float | None) -> dict:
        began = time.monotonic()
        out_path = self.workdir / f"promote{len(self.result.promote_runs) + 1}.out"
        err_path = out_path.with_suffix(".err")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(self.promote_command(), stdout=out, stderr=err, cwd=REPO)
            killed = False
            try:
                if kill_after is not None:
                    try:
                        proc.wait(kill_after)
                    except subprocess.TimeoutExpired:
                        proc.send_signal(signal.SIGKILL)
                        killed = True
                proc.wait(PROMOTE_TIMEOUT + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise TrialError(f"relayproxy promote hung past {PROMOTE_TIMEOUT + 60:.0f} s") from None
        run: dict[str, Any] = {"exit_code": proc.returncode, "seconds": round(time.monotonic() - began, 3),
                               "killed": killed}
        stdout = out_path.read_text(errors="replace")
        if killed:
            run["killed_after"] = kill_after
            return run
        try:
            report = json.loads(stdout)
        except ValueError:
            run["stdout"] = stdout[-2000:]
            run["stderr"] = err_path.read_text(errors="replace")[-4000:]
            if proc.returncode == 0:
                raise TrialError(f"relayproxy promote --json printed no JSON document: {stdout[-500:]!r}") from None
            return run
        run.update({k: report.get(k) for k in ("outcome", "message", "source_relay", "total_seconds")})
        run["fetched"] = report.get("fetched")
        if proc.returncode != 0:
            run["stderr"] = err_path.read_text(errors="replace")[-4000:]
        self.result.promote_report = report
        return run

    # -- checks -----------------------------------------------------------------------------------------------------

    def check(self) -> None:
        c, r = self.candidate, self.result
        have, r.duplicate_rows = present(c)
        r.lost_tids = sorted(t for t in self.acked if have.get(t, 0) == 0)
        r.lost = len(r.lost_tids)
        committed = {**self.acked, **self.unacked}
        r.partial = sum(1 for t, n in have.items() if t in committed and n != committed[t][0])
        r.unacked_lost = sum(1 for t in self.unacked if have.get(t, 0) == 0)
        state = str(c.execute("SELECT @@GLOBAL.gtid_binlog_state")[0][0])
        r.errant = [g for g in filter(None, state.split(",")) if int(g.split("-")[1]) != MASTER_ID]
        r.candidate_extra = str(r.promote_report.get("unrelayed") or r.promote_report.get("errant") or "")
        # Nothing a relay holds is dropped at the switch: the promoted master has every relay's set (a relay still
        # restarting is read once it answers; the relays follow C by now, so their sets can only be within C's).
        mine = str(c.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0])
        for i, relay in enumerate(self.relays):
            held = wait(f"relay{i + 1} to answer", lambda relay=relay: relay.status()["retrieved_gtid_set"] or "-", 30)
            if not covers(mine, held if held != "-" else ""):
                r.relay_dropped.append(f"relay{i + 1} held {held}, the promoted master has {mine}")
        # New writes on the promoted master reach every relay and T behind relay1.
        with c.connect() as conn, conn.cursor() as cur:
            for i in range(5):
                cur.execute(f"INSERT INTO {SCHEMA}.t (tid, uid, v) VALUES (%s, %s, 'after')", (9 * 10**15 + i, i))
        want = str(c.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0])
        for relay in self.relays:
            wait(f"{relay.relay_dir.name} to follow the promoted master",
                 lambda relay=relay: covers(relay.status()["retrieved_gtid_set"], want), 60,
                 lambda relay=relay: relay.log_tail(15))
        if self.replica is not None:
            r.replica_caught_up = bool(wait_quietly(lambda: covers(gtid_slave_pos(self.replica), want), 60))
            if r.replica_caught_up:
                theirs, dups = present(self.replica)
                mine, _ = present(c)
                r.replica_caught_up = theirs == mine and dups == 0

    def run(self) -> TrialResult:
        began = time.monotonic()
        phases = self.result.phases
        try:
            t = time.monotonic()
            self.start()
            phases["setup"] = round(time.monotonic() - t, 3)
            t = time.monotonic()
            killed = self.load_and_kill()
            phases["load"] = round(time.monotonic() - t, 3)
            t = time.monotonic()
            self.direct_snapshot()
            self.result.snapshot_seconds = phases["snapshot"] = round(time.monotonic() - t, 3)
            t = time.monotonic()
            self.promote(killed, self.result.snapshot_seconds)
            phases["promote"] = round(time.monotonic() - t, 3)
            t = time.monotonic()
            self.check()
            phases["check"] = round(time.monotonic() - t, 3)
        finally:
            t = time.monotonic()
            self.close()
            phases["stop"] = round(time.monotonic() - t, 3)
        self.result.total_seconds = round(time.monotonic() - began, 3)
        return self.result

    def close(self) -> None:
        if self._relay_restarter is not None:
            self._relay_restarter.join(30)
        steps = [*(lambda r=r: r.stop() for r in self.relays),
                 *(lambda p=p: p.stop() for p in [self.candidate_link, *self.relay_links] if p is not None),
                 *(lambda s=s: s.stop(timeout=10) for s in self.servers())]
        problems = run_every_step(steps)
        if problems:
            raise TrialError("could not stop everything cleanly: " + "; ".join(problems))

    def describe(self) -> str:
        """The state of everything, for a failed trial."""
        lines = [f"spec {self.spec}"]
        for s in self.servers():
            if not s.running:
                lines.append(f"{s.basedir.name}: down")
                continue
            with contextlib.suppress(Exception):
                st = replica_status(s)
                lines.append(f"{s.basedir.name}: binlog_state {s.execute('SELECT @@GLOBAL.gtid_binlog_state')[0][0]} "
                             f"slave_pos {gtid_slave_pos(s)} io {st.get('Slave_IO_Running')} "
                             f"sql {st.get('Slave_SQL_Running')} {st.get('Last_IO_Error')} {st.get('Last_SQL_Error')}")
        for relay in self.relays:
            with contextlib.suppress(Exception):
                st = relay.status()
                lines.append(f"{relay.relay_dir.name}: {st.get('retrieved_gtid_set')} {st.get('last_io_error')}")
            lines.append(relay.log_tail(10))
        return "\n".join(lines)


def gtid_slave_pos(server: MariaDBSandbox) -> str:
    return str(server.execute("SELECT @@GLOBAL.gtid_slave_pos")[0][0])


def sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def wait_quietly(probe, timeout: float) -> Any:
    """Poll `probe` every 20 ms until it returns something true (returned) or the timeout (None)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(pymysql.MySQLError, OSError, KeyError):
            value = probe()
            if value:
                return value
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def wait(what: str, probe, timeout: float, explain=None) -> Any:
    value = wait_quietly(probe, timeout)
    if not value:
        raise TrialError(f"timed out after {timeout:.0f} s waiting for {what}" + (f"\n{explain()}" if explain else ""))
    return value


def run_trial(workdir: Path, spec: TrialSpec, *, keep: bool = False) -> TrialResult:
    """Run one trial in `workdir` (removed afterwards unless `keep` or the trial failed to run)."""
    trial = Trial(workdir, spec)
    try:
        result = trial.run()
    except BaseException as exc:
        if isinstance(exc, AssertionError) and exc.args:
            with contextlib.suppress(Exception):
                exc.args = (f"{exc.args[0]}\n--- trial ---\n{trial.describe()}", *exc.args[1:])
        raise
    if not keep and result.ok:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def trial_seeds(seed: int, count: int) -> list[int]:
    """The per-trial seeds of a run: one seed names a whole run, each trial's seed reruns that trial alone."""
    rnd = random.Random(seed)
    return [rnd.randrange(1, 2**31) for _ in range(count)]


def trial_kinds(count: int, *, fallback_every: int = 0) -> list[str]:
    """The lossless kinds in turn; with fallback_every = k every k-th trial is a fallback trial."""
    kinds, lossless = [], 0
    for i in range(count):
        if fallback_every and (i + 1) % fallback_every == 0:
            kinds.append("fallback")
        else:
            kinds.append(LOSSLESS_KINDS[lossless % len(LOSSLESS_KINDS)])
            lossless += 1
    return kinds



