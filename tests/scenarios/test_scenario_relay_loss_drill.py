"""A relay-loss drill: two relays of one master behind one address; relay A dies, the address moves to relay B, every
client resumes at its own coordinates; then the master dies and the clients, still behind that address, follow the
promoted master (design invariants 2 and 11; docs/failover.md, "Same history, same bytes: A relay-loss drill").

Real MariaDB servers (relayproxy.lab.failover): M1, the candidate R1, relay A (the lab's relay, server_id 100) and
relay B (server_id 101), both `--gtid-mode mariadb` on M1. Clients reach "the relay" through one address, a
`ThreadedFaultProxy` standing in for a VIP or DNS name (`retarget` moves it and drops its connections):

- R2, a MariaDB replica by GTID (slave_pos), and R3, by file/position (MASTER_USE_GTID=no, at its coordinates);
- `mariadb-binlog --read-from-remote-server --raw --stop-never` writing the relay's files into a directory. It does
  not reconnect: it exits when its connection drops. The drill's wrapper restarts it, as an operator's would, from
  the last file it wrote, at the size that file has (`--start-position`), into a scratch directory, and appends what
  the new run wrote from that position on to the file (a raw restart at a position writes the magic number and the
  file's FORMAT_DESCRIPTION first, which the wrapper leaves out);
- a python-mysql-replication `BinLogStreamReader` by file/position (`resume_stream`), re-created at the end of the
  last complete transaction it saw (a CDC consumer's committed offset) whenever it fails; it records the (file,
  start, end) of every event of the files it receives.

Under MixedLoad on M1, relay A is killed (SIGKILL) and the address moved to relay B: R2 and R3 end with every
insert once and the master's CHECKSUM TABLE; the files mariadb-binlog wrote are byte-identical to relay B's; the
events the CDC reader saw are exactly relay B's events over that range, none missing, none twice. Relay A is
restarted and catches up from M1. Then M1 is killed, `relayproxy promote` runs with both relays, R1 takes new
writes, and the same clients, behind the same address (relay B), follow: the same checks again over the whole run,
and relays A and B hold identical files. After the switch of masters mariadb-binlog's copy is relay B's files
without what the relay wrote itself, and the check says exactly that (``explain_difference``): MariaDB 10.11's
mariadb-binlog --raw does not write the relay's epoch ROTATE (timestamp 0, which it takes for a server's fake
ROTATE), the join file's filler is never served (the relay sends a fake ROTATE past it, and mariadb-binlog writes
the events after it at smaller offsets), and the join file's last ROTATE is served naming the relay's next file.
Every master event is in the copy once; any other difference fails.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import MariadbGtidEvent, QueryEvent, XidEvent

from relayproxy.binlog import constants as C
from relayproxy.binlog.reader import scan_file
from relayproxy.lab.failover import (
    REPL_PASSWORD,
    REPL_USER,
    FailoverLab,
    assert_every_insert_once,
    binlog_pos,
    covers,
    first_difference,
    relay_file_bytes,
    run_promote,
    slave_pos,
    wait_until,
)
from relayproxy.lab.faultproxy import ThreadedFaultProxy
from relayproxy.lab.harness import assert_same_data, change_master, replica_status, wait_relay
from relayproxy.relay.epochs import is_filler

pytestmark = pytest.mark.server

TIMEOUT = 60.0
ARTIFICIAL = 0x20  # LOG_EVENT_ARTIFICIAL_F: an event the server made up for this dump (fake ROTATE), not in a file


class BinlogDownload:
    """`mariadb-binlog --raw --stop-never` into `directory`, restarted from where it stopped when it exits."""

    def __init__(self, workdir: Path, port: int, first_file: str) -> None:
        self.tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
        assert self.tool, "mariadb-binlog is part of the mariadb-server packages"
        self.workdir, self.port = workdir, port
        self.directory = workdir / "binlogs"
        self.directory.mkdir(parents=True)
        self.runs: list[tuple[Path, str, int]] = []  # (output directory, first file, start position) of each run
        self.restarts = 0
        self.exits: list[str] = []
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._run, args=(first_file,), daemon=True)

    def start(self) -> BinlogDownload:
        self._thread.start()
        return self

    def _command(self, out: Path, file: str, pos: int) -> list[str]:
        return [self.tool, "--read-from-remote-server", "--raw", "--stop-never", "--stop-never-slave-server-id=4242",
                "-h127.0.0.1", f"-P{self.port}", f"-u{REPL_USER}", f"-p{REPL_PASSWORD}", f"--start-position={pos}",
                f"--result-file={out}/", file]

    def _run(self, first_file: str) -> None:
        file, pos = first_file, 4
        while not self._stop.is_set():
            out = self.directory if pos == 4 else self.workdir / f"resume{self.restarts}"
            out.mkdir(exist_ok=True)
            self.runs.append((out, file, pos))
            log_path = self.workdir / f"mariadb-binlog.{self.restarts}.log"
            with log_path.open("wb") as log:
                self._proc = subprocess.Popen(self._command(out, file, pos), stdout=log, stderr=subprocess.STDOUT)
                self._proc.wait()
            if self._stop.is_set():
                return
            self.exits.append(f"exit {self._proc.returncode}: {log_path.read_text(errors='replace').strip()}")
            self.restarts += 1
            written = self.files()
            if written:
                file, pos = list(written)[-1], len(written[list(written)[-1]])
            time.sleep(0.2)

    def files(self) -> dict[str, bytes]:
        """The files as the wrapper assembles them: each restart's output spliced onto what came before."""
        files: dict[str, bytes] = {}
        for out, file, pos in list(self.runs):
            for path in sorted(out.iterdir()):
                data = path.read_bytes()
                if pos != 4 and path.name == file:
                    # a raw restart at `pos` writes the magic number and the file's FORMAT_DESCRIPTION, then the
                    # events from `pos` on
                    fde_end = 4 + int.from_bytes(data[4 + 9:4 + 13], "little") if len(data) >= 17 else len(data)
                    data = files.get(file, b"")[:pos] + data[fde_end:]
                files[path.name] = data
        return dict(sorted(files.items()))

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(10)
        self._thread.join(15)


@dataclass
class Seen:
    """(file, start, end, type) of one event of a file, as the CDC reader received it."""

    file: str
    start: int
    end: int
    type_code: int


@dataclass
class CdcReader:
    """python-mysql-replication by file/position through `port`; re-created at its last committed transaction."""

    port: int
    file: str
    pos: int = 4
    seen: list[Seen] = field(default_factory=list)
    reconnects: int = 0
    errors: list[str] = field(default_factory=list)
    last_traceback: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> CdcReader:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        settings = {"host": "127.0.0.1", "port": self.port, "user": REPL_USER, "password": REPL_PASSWORD}
        while not self._stop.is_set():
            stream = BinLogStreamReader(connection_settings=dict(settings), ctl_connection_settings=dict(settings),
                                        server_id=4343, resume_stream=True, log_file=self.file, log_pos=self.pos,
                                        blocking=True,
                                        filter_non_implemented_events=False,
                                        ignore_decode_errors=True, slave_heartbeat=1)
            pending: list[Seen] = []  # the events of a transaction not yet complete
            standalone = False
            try:
                while not self._stop.is_set():
                    file = stream.log_file
                    event = stream.fetchone()
                    if event is None:
                        break
                    p = event.packet
                    if p.event_type == C.HEARTBEAT_LOG_EVENT or p.log_pos == 0 or p.flags & ARTIFICIAL:
                        continue
                    if p.event_type == C.ROTATE_EVENT:
                        if stream.log_file == file and p.timestamp == 0:
                            continue  # a fake ROTATE (to the same file) the relay made up for this dump
                    seen = Seen(file, p.log_pos - p.event_size, p.log_pos, p.event_type)
                    if isinstance(event, MariadbGtidEvent):
                        pending, standalone = [seen], bool(event.flags & 1)
                        continue
                    if pending:
                        pending.append(seen)
                        ends = isinstance(event, XidEvent) or (
                            isinstance(event, QueryEvent) and (standalone or event.query == "COMMIT"))
                        if not ends:
                            continue
                        self.seen += pending
                        pending = []
                    else:
                        self.seen.append(seen)
                    # committed offset: after this event, in the file it came from (a ROTATE: the next file)
                    self.file, self.pos = ((stream.log_file, stream.log_pos) if p.event_type == C.ROTATE_EVENT
                                           else (file, p.log_pos))
            except Exception as exc:  # noqa: BLE001 - a dropped or refused connection: re-create and resume
                self.errors.append(f"{exc!r} at {traceback.extract_tb(exc.__traceback__)[-1].name}"[:300])
                self.last_traceback = traceback.format_exc()
            finally:
                stream.close()
            if not self._stop.is_set():
                self.reconnects += 1
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)


def relay_events(relay_dir: Path) -> list[Seen]:
    """Every event in a relay's files, in order, without the fillers (never served)."""
    events: list[Seen] = []
    for name in (relay_dir / "relayproxy.index").read_text().split():
        found = []
        result = scan_file(relay_dir / name, on_event=found.append)
        assert result.ok, (name, result.error)
        events += [Seen(name, e.offset, e.offset + e.size, e.type_code) for e in found if not is_filler(e.data)]
    return events


def explain_difference(mine: bytes, path: Path, next_file: str | None) -> str:
    """How mariadb-binlog's copy of a relay file differs from it, in terms of the events the relay wrote itself."""
    found = []
    assert scan_file(path, on_event=found.append).ok
    data = path.read_bytes()
    removed = [e for e in found if is_filler(e.data) or (e.type_code == C.ROTATE_EVENT and e.timestamp == 0)]
    keep = [e for e in found if e not in removed]
    reduced = data[:4] + b"".join(data[e.offset:e.offset + e.size] for e in keep)
    what = ", ".join(f"{'filler' if is_filler(e.data) else 'epoch ROTATE'} at {e.offset} ({e.size} bytes)"
                     for e in removed)
    if mine == reduced:
        return f"relay B's file without what relay B wrote itself: {what}"
    end = keep[-1]
    if (end.type_code == C.ROTATE_EVENT and next_file and mine[:-end.size + 27] == reduced[:-end.size + 27]
            and mine[-4 - len(next_file):-4] == next_file.encode()):
        return (f"relay B's file without what relay B wrote itself ({what}), its last ROTATE naming relay B's next "
                f"file {next_file} as the relay sends it (the file keeps the master's name)")
    return "not explained"


def check_clients(lab: FailoverLab, master, relay_dir: Path, download: BinlogDownload, cdc: CdcReader) -> str:
    """Every client behind the address holds exactly what relay B (`relay_dir`) holds; returns a summary.
    mariadb-binlog's files equal relay B's, or differ only by the events relay B wrote itself (explain_difference:
    across a switch of masters)."""
    for replica in (lab.r2, lab.r3):
        assert_every_insert_once(lab.load, replica)
        assert_same_data(master, replica)

    # A dump without BINLOG_SEND_ANNOTATE_ROWS_EVENT gets no ANNOTATE_ROWS events, from MariaDB as from the relay.
    want = [e for e in relay_events(relay_dir) if e.type_code != C.MARIA_ANNOTATE_ROWS_EVENT]
    wait_until("the CDC reader to reach relay B's last event", lambda: cdc.seen and cdc.seen[-1] == want[-1],
               TIMEOUT, lambda: f"seen up to {cdc.seen[-1:]}, relay B ends {want[-1]}; at {cdc.file}:{cdc.pos}, "
                                f"{cdc.reconnects} re-creations, errors {cdc.errors[:3]} ... {cdc.errors[-3:]}\n"
                                f"{cdc.last_traceback}")
    seen = list(cdc.seen)
    want = want[want.index(seen[0]):]
    if seen != want:
        keys = [(e.file, e.start) for e in seen]
        repeated = sorted({k for k in keys if keys.count(k) > 1})[:5]
        missing = [e for e in want if e not in seen][:5]
        extra = [e for e in seen if e not in want][:5]
        raise AssertionError(f"the CDC reader's events are not relay B's: repeated {repeated}, missing {missing}, "
                             f"not in relay B {extra} ({len(seen)} seen, {len(want)} in relay B)")

    relay = relay_file_bytes(relay_dir)
    last = list(relay)[-1]
    wait_until("mariadb-binlog to hold relay B's last file", lambda: download.files().get(last) == relay[last],
               TIMEOUT, lambda: f"{download.exits}\n{[(n, len(b)) for n, b in download.files().items()]}\n"
                                f"{[(n, len(b)) for n, b in relay.items()]}")
    mine = download.files()
    assert list(mine) == list(relay)[list(relay).index(list(mine)[0]):], (list(mine), list(relay))
    names = list(relay)
    differ = {n: f"{first_difference(mine[n], relay[n])}; "
                 + explain_difference(mine[n], relay_dir / n, names[names.index(n) + 1] if n != last else None)
              for n in mine if mine[n] != relay[n]}
    unexplained = {n: why for n, why in differ.items() if why.endswith("not explained")}
    assert not unexplained, f"mariadb-binlog's files differ from relay B's: {unexplained}"
    return (f"{len(mine)} files by mariadb-binlog ({download.restarts} restarts), {len(seen)} events by the CDC "
            f"reader ({cdc.reconnects} re-creations)"
            + (f"; {len(differ)} of mariadb-binlog's files are relay B's without what relay B wrote itself: {differ}"
               if differ else ""))


def test_relay_loss_drill_clients_behind_one_address_move_to_the_other_relay_and_follow_a_failover(
        tmp_path, capsys):
    started = time.monotonic()
    with FailoverLab(tmp_path / "lab", candidates=1) as lab, lab.explained():
        lab.start()
        relay_b, port_b = lab.add_relay("relayB", server_id=101)
        relay_a, port_a = lab.relay, lab.relay_port
        vip = ThreadedFaultProxy("127.0.0.1", port_a).start()  # "the relay": a VIP or DNS name
        download = cdc = None
        try:
            lab.wait_caught_up_m1()
            for replica in (lab.r2, lab.r3):
                replica.execute("STOP SLAVE")
            r3 = replica_status(lab.r3)
            change_master(lab.r2, vip.port, file=None)
            change_master(lab.r3, vip.port, file=r3["Relay_Master_Log_File"], pos=int(r3["Exec_Master_Log_Pos"]))
            for replica in (lab.r2, lab.r3):
                replica.execute("START SLAVE")
            download = BinlogDownload(tmp_path, vip.port, lab.first_file).start()
            cdc = CdcReader(vip.port, lab.first_file).start()

            # Relay A dies under load; the address moves to relay B.
            writer = threading.Thread(target=lab.load.run, args=(lab.m1, 160), kwargs={"rotate_every": 50})
            writer.start()
            wait_until("M1 to take writes", lambda: lab.load.transactions >= 60, TIMEOUT)
            relay_a.kill9()
            time.sleep(0.5)  # the clients see relay A gone (their reconnects are refused)
            vip.retarget("127.0.0.1", port_b)
            writer.join(TIMEOUT)
            assert not writer.is_alive()
            wait_relay(relay_b, lab.m1, TIMEOUT)
            for replica in (lab.r2, lab.r3):
                wait_until(f"{replica.basedir.name} to hold M1's GTIDs",
                           lambda r=replica: covers(slave_pos(r), binlog_pos(lab.m1)), TIMEOUT, lab.describe)
            first = check_clients(lab, lab.m1, relay_b.relay_dir, download, cdc)
            with capsys.disabled():
                print(f"\n  relay A killed under load, the address moved to relay B: {first}; "
                      f"{time.monotonic() - started:.1f} s")

            # Relay A back (it catches up from M1); then M1 dies and R1 is promoted with both relays.
            relay_a.start()
            lab.wait_caught_up_m1([lab.r1])
            lab.m1.kill()
            for link in lab.links.values():
                link.proxy.drop_connections()
                link.proxy.refuse(True)
            code, doc, _stderr = run_promote(tmp_path, lab.r1.port, [port_a, port_b], "--timeout", "120")
            assert code == 0, doc
            lab.load.run(lab.r1, 60, rotate_every=40)
            want = binlog_pos(lab.r1)
            for relay in (relay_a, relay_b):
                wait_until(f"{relay.relay_dir.name} to hold R1's GTIDs",
                           lambda r=relay: covers(r.status()["retrieved_gtid_set"], want)
                           and not r.status().get("last_io_error"), TIMEOUT, lab.describe)
            for replica in (lab.r2, lab.r3):
                wait_until(f"{replica.basedir.name} to hold R1's GTIDs",
                           lambda r=replica: covers(slave_pos(r), want), TIMEOUT, lab.describe)
                assert int(replica_status(replica)["Master_Port"]) == vip.port
            assert_every_insert_once(lab.load, lab.r1)
            one, two = relay_file_bytes(relay_a.relay_dir), relay_file_bytes(relay_b.relay_dir)
            assert list(one) == list(two), f"relay files differ in names: {list(one)} and {list(two)}"
            differ = {n: first_difference(one[n], two[n]) for n in one if one[n] != two[n]}
            assert not differ, f"files differ between relay A and relay B: {differ}"
            second = check_clients(lab, lab.r1, relay_b.relay_dir, download, cdc)
        finally:
            for client in (download, cdc):
                if client is not None:
                    client.stop()
            vip.stop()
        with capsys.disabled():
            print(f"\n  after M1's failover: {second}; relays A and B identical ({len(one)} files); "
                  f"{time.monotonic() - started:.1f} s")
