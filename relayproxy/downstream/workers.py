"""Sender processes: binlog dumps served by worker processes, so that fan-out uses every core.

The relay process keeps everything that decides or writes: the upstream connection, the store, the horizon,
the SQL layer, authentication and every replica's session. When a replica sends COM_BINLOG_DUMP[_GTID] on a
plain (non-TLS) connection and does not ask for semi-sync, the session hands the replica's socket to one of
``sender_processes`` workers (``socket`` SCM_RIGHTS over a SOCK_SEQPACKET pair) with everything the dump needs
(the request, the replica's variables, the next packet sequence id); the worker runs the same dump sender
(dump/sender.py) over a read-only view of the relay directory (``FollowerStore``): the files are read from the
page cache, and nothing past the horizon is ever sent because the worker's horizon only ever holds what the
relay process pushed to it after the fsync (one small message per advance, no polling). TLS sessions cannot be
moved between processes, and semi-sync ACKs must reach the relay's tracker at once: those dumps stay in the
relay process, as do all dumps when ``sender_processes = 0``.

The relay process keeps the session open until the worker says the dump ended, so connection counts, KILL, the
end of a zombie dump of the same replica, SHOW PROCESSLIST, /status and retention (never purge what a replica
reads) see handed-off replicas as they see the others; the worker reports each dump's progress twice a second. A worker that
dies (even by kill -9) takes its replicas' connections with it: they reconnect, as after any master restart,
and the relay process starts a new worker in its place.

Run as ``python -m relayproxy.downstream.workers FD RELAY_DIR`` by ``SenderPool`` only.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import collections
import contextlib
import gc
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..binlog.events import FormatDescription
from ..log import get_logger
from ..relay import closed_files, remote
from ..relay.catalog import FileCatalog
from ..relay.epochs import Epochs, EpochsError, gtid_text, parse_gtid_text, read_epochs
from ..relay.errors import RelayStoreError
from ..relay.horizon import Horizon
from ..relay.hoptimes import HopTimes
from .context import ConnectionState, DownstreamContext, DumpProgress, DumpRequest
from .dump import serve_dump
from .transport import ClientConnectionLost, ClientDumpChannel, ClientProtocol
from .view import MasterFacts, ReplicaSettings

log = get_logger("relayproxy.downstream.workers")

MAX_MESSAGE = 4 << 20  # one record of the control socket (a file list of ~100k names fits)
_PROGRESS_EVERY = 0.5  # seconds between a worker's progress reports
_RESPAWN_DELAY = 1.0  # at most one new worker a second per slot
_FOLLOW_RECHECK = 1.0  # the relay process re-reads files/status this often without an advance (a purge)
_PROGRESS_FIELDS = ("file", "position", "events_sent", "bytes_sent", "caught_up_at", "mode", "last_ack")
_MAX_BUFFERED = 1 << 20  # unread input of a handed-off replica before reading pauses (a dump replica says little)


# ---------------------------------------------------------------------------------------------
# The control socket: one pickled record per message, file descriptors as SCM_RIGHTS
# ---------------------------------------------------------------------------------------------


def control_pair() -> tuple[socket.socket, socket.socket]:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (parent, child):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_MESSAGE)
    return parent, child


class _Control:
    """One end of a control socket on the running loop: ``send`` queues (never blocks the loop), ``on_message``
    gets ``(message, fds)``; ``on_close`` once the other side is gone."""

    def __init__(self, sock: socket.socket, on_message, on_close) -> None:
        self.sock = sock
        sock.setblocking(False)
        self.loop = asyncio.get_running_loop()
        self.on_message = on_message
        self.on_close = on_close
        self.closed = False
        self._out: collections.deque[tuple[bytes, list[int]]] = collections.deque()
        self._writing = False
        self.loop.add_reader(sock.fileno(), self._readable)

    def send(self, message: Any, fds: list[int] | None = None) -> None:
        """Queue one message; ``fds`` are duplicated into the message and closed here once sent."""
        if self.closed:
            for fd in fds or ():
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise ConnectionError("the control socket is closed")
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > MAX_MESSAGE:
            raise ValueError(f"control message of {len(data)} bytes (at most {MAX_MESSAGE})")
        self._out.append((data, list(fds or ())))
        if not self._writing:
            self._flush()

    def _flush(self) -> None:
        while self._out:
            data, fds = self._out[0]
            try:
                if fds:
                    self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                else:
                    self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                if not self._writing:
                    self._writing = True
                    self.loop.add_writer(self.sock.fileno(), self._flush)
                return
            except OSError:
                self._close()
                return
            self._out.popleft()
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self._writing:
            self._writing = False
            self.loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        for _ in range(64):  # then let the loop run others
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close()
                return
            if not data:
                for fd in fds:
                    os.close(fd)
                self._close()
                return
            try:
                message = pickle.loads(data)
            except Exception as exc:  # our own peer: a bug, not an attack
                log.error("unreadable control message", error=str(exc))
                for fd in fds:
                    os.close(fd)
                continue
            self.on_message(message, fds)

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.sock.fileno())
        if self._writing:
            with contextlib.suppress(Exception):
                self.loop.remove_writer(self.sock.fileno())
        for _data, fds in self._out:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._out.clear()
        with contextlib.suppress(OSError):
            self.sock.close()
        self.on_close()

    def close(self) -> None:
        self._close()


# ---------------------------------------------------------------------------------------------
# The relay process's side
# ---------------------------------------------------------------------------------------------


class _Handed:
    """A dump running in a worker, as the relay process's session waits for it."""

    __slots__ = ("conn_id", "progress", "ended", "worker")

    def __init__(self, conn_id: int, progress: DumpProgress, worker: _Worker):
        self.conn_id = conn_id
        self.progress = progress
        self.worker = worker
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()


class _Worker:
    def __init__(self, slot: int, process: subprocess.Popen, control: _Control | None):
        self.slot = slot
        self.process = process
        self.control = control
        self.dumps: dict[int, _Handed] = {}
        self.started = time.time()

    @property
    def alive(self) -> bool:
        return self.control is not None and not self.control.closed


class SenderPool:
    """``size`` worker processes serving handed-off dumps (see the module docstring)."""

    def __init__(self, size: int, ctx: DownstreamContext, *, log_format: str = "json", log_level: str = "info",
                 write_timeout: float = 60.0, net_read_timeout: float = 30.0):
        if size < 1:
            raise ValueError("a sender pool needs at least one process")
        self.size = size
        self.ctx = ctx
        self.log_format = log_format
        self.log_level = log_level
        self.write_timeout = write_timeout
        self.net_read_timeout = net_read_timeout
        self.workers: list[_Worker | None] = [None] * size
        self.handed: dict[int, _Handed] = {}
        self.respawns = 0
        self.handed_total = 0  # dumps handed to a worker since start
        self._closing = False
        self._follow_task: asyncio.Task | None = None
        self._respawn_tasks: set[asyncio.Task] = set()
        self._last: dict[str, Any] = {}

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        for slot in range(self.size):
            self._spawn(slot)
        self._follow_task = asyncio.get_running_loop().create_task(self._follow(), name="sender-pool-follow")
        log.info("sender processes started", processes=self.size,
                 pids=[w.process.pid for w in self.workers if w is not None])

    def _spawn(self, slot: int) -> None:
        parent, child = control_pair()
        relay_dir = self.ctx.store.relay_dir
        cmd = [sys.executable, "-m", "relayproxy.downstream.workers", str(child.fileno()), os.fspath(relay_dir),
               "--slot", str(slot), "--log-format", self.log_format, "--log-level", str(self.log_level),
               "--write-timeout", str(self.write_timeout), "--net-read-timeout", str(self.net_read_timeout)]
        try:
            # The keyring of encrypted closed files (relay/closed_files.py) goes by the environment, never argv.
            # So do the archive's options, for files offloaded to the bucket (relay/remote.py; no secret in them).
            env = {**os.environ, **closed_files.env_for_children(relay_dir), **remote.env_for_children(relay_dir)}
            process = subprocess.Popen(cmd, pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, env=env)
        finally:
            child.close()
        worker = _Worker(slot, process, None)
        worker.control = _Control(parent, lambda message, fds: self._on_message(worker, message, fds),
                                  lambda: self._on_worker_gone(worker))
        self.workers[slot] = worker
        self._last = {}  # the new worker needs everything: the next push sends it all
        self._push(force=True)

    async def close(self) -> None:
        """Stop the workers (their replicas are disconnected and will reconnect elsewhere)."""
        self._closing = True
        if self._follow_task is not None:
            self._follow_task.cancel()
            with contextlib.suppress(BaseException):
                await self._follow_task
        for task in list(self._respawn_tasks):
            task.cancel()
        for worker in self.workers:
            if worker is None:
                continue
            if worker.control is not None:
                worker.control.close()
            with contextlib.suppress(ProcessLookupError):
                worker.process.terminate()
        for worker in self.workers:
            if worker is None:
                continue
            try:
                await asyncio.wait_for(asyncio.to_thread(worker.process.wait), 5.0)
            except asyncio.TimeoutError:
                worker.process.kill()
                await asyncio.to_thread(worker.process.wait)

    def stop_dumps(self) -> None:
        """A graceful stop: every worker ends its dumps at their next transaction boundary; each dump's ``ended``
        message then completes its session in the relay process."""
        for worker in self.workers:
            if worker is not None and worker.alive:
                assert worker.control is not None
                with contextlib.suppress(ConnectionError, ValueError, OSError):
                    worker.control.send({"t": "stop"})

    # -- handing a dump over -------------------------------------------------------------------------
    def pick(self) -> _Worker | None:
        live = [w for w in self.workers if w is not None and w.alive]
        if not live:
            return None
        return min(live, key=lambda w: len(w.dumps))

    async def hand_off(self, worker: _Worker, ticket: dict, fd: int, progress: DumpProgress) -> None:
        """Give the replica's socket (``fd``, closed here) to ``worker`` and wait until its dump ends there;
        a cancellation (KILL, a newer dump of the same replica, shutdown) ends it in the worker too."""
        conn_id = ticket["conn_id"]
        handed = _Handed(conn_id, progress, worker)
        assert worker.control is not None
        try:
            worker.control.send({"t": "dump", "ticket": ticket}, [fd])
        except (ConnectionError, ValueError, OSError):
            return  # the worker died meanwhile: the replica's connection ends and it reconnects
        worker.dumps[conn_id] = handed
        self.handed[conn_id] = handed
        self.handed_total += 1
        try:
            await handed.ended
        except asyncio.CancelledError:
            if worker.alive:
                with contextlib.suppress(ConnectionError, ValueError):
                    worker.control.send({"t": "kill", "conn_id": conn_id})
            raise
        finally:
            worker.dumps.pop(conn_id, None)
            self.handed.pop(conn_id, None)

    # -- messages from the workers ---------------------------------------------------------------
    def _on_message(self, worker: _Worker, message: dict, fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)
        kind = message.get("t")
        if kind == "progress":
            for conn_id, fields in message["dumps"].items():
                handed = worker.dumps.get(conn_id)
                if handed is not None:
                    _apply_progress(handed.progress, fields)
            self._merge_send_stage(worker, message.get("send"))
        elif kind == "ended":
            handed = worker.dumps.get(message["conn_id"])
            if handed is not None:
                _apply_progress(handed.progress, message.get("progress") or {})
                if not handed.ended.done():
                    handed.ended.set_result(message.get("error"))

    def _merge_send_stage(self, worker: _Worker, taken) -> None:
        """The hop's send stage as the worker's dumps measured it since its last report (``Histogram.take``),
        added to the relay's own: one histogram whichever process wrote to the replica."""
        hop = self.ctx.hop
        if taken is None or hop is None:
            return
        try:
            hop.stages["send"].merge(*taken)
        except (TypeError, ValueError) as exc:
            log.warning("a sender process reported a send stage that does not fit; left out", slot=worker.slot,
                        error=str(exc))

    def _on_worker_gone(self, worker: _Worker) -> None:
        for handed in list(worker.dumps.values()):
            if not handed.ended.done():
                handed.ended.set_result("the sender process ended")
        if self._closing:
            return
        code = worker.process.poll()
        log.error("a sender process ended; its replicas reconnect and a new one starts", slot=worker.slot,
                  pid=worker.process.pid, returncode=code, replicas=len(worker.dumps))
        task = asyncio.get_running_loop().create_task(self._respawn(worker), name=f"sender-respawn-{worker.slot}")
        self._respawn_tasks.add(task)
        task.add_done_callback(self._respawn_tasks.discard)

    async def _respawn(self, worker: _Worker) -> None:
        delay = max(0.0, _RESPAWN_DELAY - (time.time() - worker.started))
        if delay:
            await asyncio.sleep(delay)
        await asyncio.to_thread(worker.process.wait)  # reaped: no zombie process left behind
        if self._closing or self.workers[worker.slot] is not worker:
            return
        self.respawns += 1
        self._spawn(worker.slot)

    # -- the relay's state, pushed to every worker ------------------------------------------------
    async def _follow(self) -> None:
        """Push the horizon at every advance (and files, epochs, status when they change)."""
        horizon = None
        seq = -1
        while True:
            store = self.ctx.store
            if store.horizon is not horizon:
                horizon, seq = store.horizon, -1
            snap = await horizon.wait_for_advance(seq, _FOLLOW_RECHECK)
            seq = snap.seq
            self._push()

    def _state(self) -> dict[str, Any]:
        ctx = self.ctx
        store = ctx.store
        snap = store.horizon.snapshot()
        return {
            # With the advance's time.monotonic() (one clock for every process): the worker's send stage.
            "horizon": (snap.file, snap.position, gtid_text(snap.gtids), snap.at),
            "files": tuple(store.files()),
            "current_file": store.current_file,
            "flavour": ctx.flavour,
            "server_version": ctx.server_version,
            "server_id": ctx.server_id,
            "server_uuid": ctx.server_uuid,
            "master_uuid": ctx.relay.master.master_uuid,
            "epochs": store.epochs,  # immutable: a new object when the epochs change (sent as JSON, see _push)
        }

    def _push(self, *, force: bool = False) -> None:
        state = self._state()
        last = self._last
        changed = {k: v for k, v in state.items()
                   if force or k not in last or (last[k] is not v if k == "epochs" else last[k] != v)}
        if not changed:
            return
        self._last = state
        if "epochs" in changed:
            epochs = changed["epochs"]
            changed["epochs"] = epochs.to_json() if isinstance(epochs, Epochs) and not epochs.implicit else None
        message = {"t": "state", **changed}
        for worker in self.workers:
            control = worker.control if worker is not None else None
            if control is not None and not control.closed:  # the worker is alive
                with contextlib.suppress(ConnectionError, ValueError):
                    control.send(message)

    # -- for status ------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        return {
            "processes": self.size,
            "respawns": self.respawns,
            "handed_total": self.handed_total,
            "workers": [
                {"slot": w.slot, "pid": w.process.pid, "alive": w.alive, "dumps": len(w.dumps)}
                for w in self.workers if w is not None
            ],
        }


def _apply_progress(progress: DumpProgress, fields: dict[str, Any]) -> None:
    for name in _PROGRESS_FIELDS:
        if name in fields:
            setattr(progress, name, fields[name])


# ---------------------------------------------------------------------------------------------
# The worker's side
# ---------------------------------------------------------------------------------------------


class FollowerStore:
    """A worker's read-only view of the relay directory: the files, epochs and horizon the relay process pushed.
    Its horizon moves only when a push says so, i.e. after the relay process made the bytes durable. A
    ``StoreReader`` (relay/reader.py): it writes nothing (no sidecar, no PURGE; the relay process does those)."""

    read_only = True
    sidecars_writable = False
    transaction_index = None  # the relay process keeps the index; a sender process finds a stop by its file

    def __init__(self, relay_dir: Path):
        self.relay_dir = Path(relay_dir)
        self.horizon = Horizon()
        self._files: list[str] = []
        self.current_file: str | None = None
        self.flavour: str | None = None
        self.format_description: FormatDescription | None = None
        self.epochs = Epochs()

    @property
    def latest_format_description(self) -> FormatDescription | None:
        return self.format_description

    def files(self) -> list[str]:
        return self._files

    def path(self, name: str) -> Path:
        return self.relay_dir / name

    def file_digest(self, name: str) -> str | None:
        return None  # not pushed: a reader hashes the file itself

    def upstream_position(self) -> tuple[str | None, int] | None:
        return None  # the relay process reports it

    def purge_to(self, name: str) -> list[str]:
        raise RelayStoreError("a sender process does not purge: PURGE BINARY LOGS goes to the relay process")

    def apply(self, state: dict[str, Any]) -> None:
        if "files" in state:
            self._files = list(state["files"])
        if "current_file" in state:
            self.current_file = state["current_file"]
        if "flavour" in state:
            self.flavour = state["flavour"]
        if "epochs" in state:
            text = state["epochs"]
            try:
                self.epochs = Epochs.from_json(text) if text else read_epochs(self.relay_dir)
            except EpochsError as exc:
                log.error("cannot read the relay's epochs in a sender process", error=str(exc))
        if "horizon" in state:
            file, position, text, at = state["horizon"]
            current = self.horizon.snapshot()
            if (file, position) != (current.file, current.position) or text != gtid_text(current.gtids):
                try:
                    self.horizon.advance(file, position, parse_gtid_text(text), copy=False, at=at or None)
                except ValueError:
                    # The relay reopened its store (the horizon went back): start a new horizon; senders
                    # waiting on the old one look again at their next heartbeat or recheck.
                    self.horizon = Horizon(file, position, parse_gtid_text(text))


class FollowerView:
    """A sender process's RelayView: the files, horizon, identity and master as the relay process last pushed them.
    Its settings are the defaults: semi-sync dumps stay in the relay process, and a worker answers no SQL."""

    def __init__(self, store: FollowerStore):
        self.store = store
        self.catalog = FileCatalog(store)  # the store object lives as long as the worker (its horizon is replaced)
        self.settings = ReplicaSettings()
        self.server_id = 0
        self.server_uuid = ""
        self.master = MasterFacts()
        self.flavour = "mysql"
        self.server_version = ""

    @property
    def horizon(self) -> Horizon:
        return self.store.horizon

    def apply(self, state: dict[str, Any]) -> None:
        if "server_id" in state:
            self.server_id = state["server_id"]
        if "server_uuid" in state:
            self.server_uuid = state["server_uuid"]
        if "master_uuid" in state:
            self.master = MasterFacts(master_uuid=state["master_uuid"])
        if "flavour" in state:
            self.flavour = state["flavour"] or "mysql"
        if "server_version" in state:
            self.server_version = state["server_version"] or ""


class Worker:
    def __init__(self, sock: socket.socket, relay_dir: Path, *, slot: int, write_timeout: float,
                 net_read_timeout: float):
        self.store = FollowerStore(relay_dir)
        self.view = FollowerView(self.store)
        # The dumps here time the hop's send stage from the relay process's advance; report() sends it there.
        self.hop = HopTimes()
        self.ctx = DownstreamContext(self.view, status_document=dict, hop=self.hop)
        self.slot = slot
        self.write_timeout = write_timeout
        self.net_read_timeout = net_read_timeout
        self.dumps: dict[int, tuple[ConnectionState, asyncio.Task]] = {}
        self.done = asyncio.get_running_loop().create_future()
        self.control = _Control(sock, self._on_message, self._on_close)

    def _on_close(self) -> None:
        # The relay process is gone (or closed us): our replicas reconnect to whatever serves next.
        if not self.done.done():
            self.done.set_result(None)

    def _on_message(self, message: dict, fds: list[int]) -> None:
        kind = message.get("t")
        if kind == "state":
            self.view.apply(message)
            self.store.apply(message)
        elif kind == "dump":
            ticket = message["ticket"]
            if len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                log.error("a dump arrived without its socket", conn_id=ticket.get("conn_id"))
                return
            conn_id = ticket["conn_id"]
            task = asyncio.get_running_loop().create_task(self._serve(ticket, fds[0]), name=f"dump-{conn_id}")
            self.dumps[conn_id] = (None, task)  # type: ignore[assignment]
        elif kind == "stop":
            self.ctx.stop_dumps()  # the relay is stopping: each dump ends at its next transaction boundary
        elif kind == "kill":
            entry = self.dumps.get(message["conn_id"])
            if entry is not None:
                entry[1].cancel()
        else:
            for fd in fds:
                os.close(fd)

    async def _serve(self, ticket: dict, fd: int) -> None:
        conn_id = ticket["conn_id"]
        loop = asyncio.get_running_loop()
        error: str | None = None
        conn = ConnectionState(conn_id=conn_id, user=ticket["user"], host=ticket["host"],
                               capabilities=ticket["capabilities"], user_vars=ticket["user_vars"],
                               session_vars=ticket["session_vars"])
        conn.dump = DumpProgress(file=ticket["file"] or None, position=ticket["position"], mode=ticket["kind"])
        self.dumps[conn_id] = (conn, self.dumps[conn_id][1])
        protocol = None
        try:
            sock = socket.socket(fileno=fd)
            sock.setblocking(False)
            protocol = ClientProtocol(max_buffered=_MAX_BUFFERED, net_read_timeout=self.net_read_timeout,
                                      logged_in=True)
            await loop.connect_accepted_socket(lambda: protocol, sock)
            request = DumpRequest(ticket["kind"], ticket["server_id"], ticket["flags"], ticket["file"],
                                  ticket["position"], ticket["gtid_set"])
            channel = ClientDumpChannel(protocol, self.write_timeout, ticket["seq"])
            try:
                await serve_dump(self.ctx, conn, request, channel)
            finally:
                channel.flush()
            with contextlib.suppress(ConnectionError):
                await protocol.drain(self.write_timeout)
        except asyncio.CancelledError:
            error = "killed"
        except (ClientConnectionLost, ConnectionError, OSError) as exc:
            error = f"connection: {exc}"
        except Exception as exc:  # a bug: one line, and this replica only
            error = f"internal error: {type(exc).__name__}: {exc}"
            log.error("dump failed in a sender process", conn_id=conn_id, error=error)
        finally:
            if protocol is not None:
                with contextlib.suppress(BaseException):
                    await protocol.close()
            self.dumps.pop(conn_id, None)
            with contextlib.suppress(ConnectionError, ValueError):
                self.control.send({"t": "ended", "conn_id": conn_id, "error": error,
                                   "progress": _progress_fields(conn.dump)})

    async def report(self) -> None:
        while True:
            await asyncio.sleep(_PROGRESS_EVERY)
            dumps = {conn_id: _progress_fields(conn.dump) for conn_id, (conn, _t) in self.dumps.items()
                     if conn is not None and conn.dump is not None}
            send = self.hop.stages["send"].take()
            if dumps or send is not None:
                with contextlib.suppress(ConnectionError, ValueError):
                    self.control.send({"t": "progress", "dumps": dumps, "send": send})

    async def run(self) -> None:
        reporter = asyncio.get_running_loop().create_task(self.report())
        try:
            await self.done
        finally:
            reporter.cancel()
            for _conn, task in list(self.dumps.values()):
                task.cancel()
            if self.dumps:
                await asyncio.gather(*(t for _c, t in self.dumps.values()), return_exceptions=True)


def _progress_fields(progress: DumpProgress | None) -> dict[str, Any]:
    if progress is None:
        return {}
    return {name: getattr(progress, name) for name in _PROGRESS_FIELDS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="relayproxy sender process (started by the relay, not by hand)")
    parser.add_argument("fd", type=int)
    parser.add_argument("relay_dir", type=Path)
    parser.add_argument("--slot", type=int, default=0)
    parser.add_argument("--log-format", default="json")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--write-timeout", type=float, default=60.0)
    parser.add_argument("--net-read-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    from ..log import configure_logging

    configure_logging(fmt=args.log_format, level=args.log_level)
    closed_files.configure_from_env(args.relay_dir)  # encrypted closed files: the relay's keyring
    remote.configure_from_env(args.relay_dir)  # offloaded files: the relay's bucket and cache
    sock = socket.socket(fileno=args.fd)

    async def run() -> None:
        worker = Worker(sock, args.relay_dir, slot=args.slot, write_timeout=args.write_timeout,
                        net_read_timeout=args.net_read_timeout)
        # Start-up is over: out of the cyclic collector's full collections, as in the relay process (settle_gc).
        gc.collect()
        gc.freeze()
        await worker.run()

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
