"""The relay as a real process: `relayproxy run` (or `serve`) spawned, waited for, asked, stopped or killed.

One class for the tests (through ``harness.py``), the demo's story and every benchmark: they differ only in the
options they pass (a ``--listen`` port, replica accounts, py-spy in front, another checkout's source, the test
timings), never in how the process is run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable

from .procstat import children

REPO = Path(__file__).resolve().parents[2]  # the checkout holding relayproxy/ (cwd of the relay processes)


# Under pytest-xdist each worker process takes its ports from a range of its own, below the kernel's ephemeral
# range (32768-60999 by default), so two workers never pick the same free port at the same moment, and no outgoing
# connection's ephemeral port takes one between the pick and the bind. Outside xdist: the kernel's choice.
WORKER_PORT_BASE = 12000
WORKER_PORT_SPAN = 2500
_next_port: list[int] = []


def _worker_index() -> int | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else None


def free_port() -> int:
    """A TCP port of 127.0.0.1 free at the moment of asking (closed again: the caller binds it). Outside an xdist
    worker, two calls can return the same port; inside one, calls walk the worker's own range and do not repeat a
    port within ``WORKER_PORT_SPAN`` calls."""
    index = _worker_index()
    if index is None or index * WORKER_PORT_SPAN + WORKER_PORT_SPAN + WORKER_PORT_BASE > 32768:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    low = WORKER_PORT_BASE + index * WORKER_PORT_SPAN
    if not _next_port:
        _next_port.append(os.getpid() % WORKER_PORT_SPAN)
    for _ in range(WORKER_PORT_SPAN):
        port = low + _next_port[0] % WORKER_PORT_SPAN
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (a server of this worker, or anyone's)
            return port
    raise OSError(f"no free port in {low}-{low + WORKER_PORT_SPAN - 1} (xdist worker {index})")


def master_status(master) -> tuple[str, int]:
    """The master's (file, position) now (SHOW MASTER STATUS), from anything with ``execute``."""
    row = master.execute("SHOW MASTER STATUS")[0]
    return row[0], int(row[1])


def py_spy_record(output: Path, rate: int) -> list[str]:
    """The command line that puts ``py-spy record`` in front of a relay (``wrapper=``): raw stacks of every
    thread, idle ones included, written to ``output`` when the relay ends."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return [exe, "record", "--rate", str(rate), "--format", "raw", "--threads", "--idle", "--output", str(output),
            "--"]


class RelayProcessError(AssertionError):
    """The relay process exited, or did not answer, or did not reach what it was waited for (an AssertionError, so
    that a test shows it as a failure; benchmarks and the demo pass their own ``error`` class)."""


class RelayProcess:
    """One `relayproxy run` process (or `serve` with ``command="serve"``), restartable on the same relay directory.

    Its log (stdout and stderr) is appended to ``log_path`` (default ``<relay_dir>.log`` beside the relay
    directory). ``http``: serve /status and /metrics on a free port (``http_port``); ``listen``: serve replicas on
    ``listen_port`` (True: a free port; an int: that port). ``users`` goes to ``RELAYPROXY_USERS``, ``config`` to
    ``--config``, ``extra`` to the end of the command line. The test timings (``--heartbeat-period 0.5
    --reconnect-max-delay 0.5``, ``--gtid-mode off``) are the defaults; None leaves a flag out (the relay's own
    default). ``cwd`` and ``pythonpath`` run another checkout's relay; ``wrapper`` is a command put in front (py-spy,
    see ``py_spy_record``), in which case ``pid`` is the relay's own process, the wrapper's child.
    """

    def __init__(self, relay_dir: Path, master_port: int | None = None, *, command: str = "run",
                 user: str = "repl", password: str = "replpw", server_id: int = 100, gtid_mode: str | None = "off",
                 heartbeat_period: float | None = 0.5, reconnect_max_delay: float | None = 0.5,
                 http: bool = True, listen: bool | int = False, users: str | None = None,
                 config: Path | None = None, log_level: str | None = None, extra: list[str] | None = None,
                 env: dict[str, str | None] | None = None, clean_env: bool = False, cwd: Path = REPO,
                 pythonpath: Path | None = None, log_path: Path | None = None, wrapper: list[str] | None = None,
                 new_session: bool = False, error: type[Exception] = RelayProcessError,
                 status_timeout: float = 5.0, poll: float = 0.05):
        self.relay_dir = Path(relay_dir)
        self.http_port = free_port() if http else None
        self.listen_port = (free_port() if listen is True else int(listen)) if listen else None
        args = [sys.executable, "-m", "relayproxy.commands.cli", "--log-format", "json"]
        if log_level is not None:
            args += ["--log-level", log_level]
        args.append(command)
        if command == "serve":
            args += ["--binlog-dir", str(self.relay_dir)]
        else:
            args += ["--master", f"127.0.0.1:{master_port}", "--user", user, "--server-id", str(server_id),
                     "--relay-dir", str(self.relay_dir)]
        if self.http_port is not None:
            args += ["--http", f"127.0.0.1:{self.http_port}"]
        if self.listen_port is not None:
            args += ["--listen", f"127.0.0.1:{self.listen_port}"]
        if command != "serve":
            for flag, value in (("--gtid-mode", gtid_mode), ("--heartbeat-period", heartbeat_period),
                                ("--reconnect-max-delay", reconnect_max_delay)):
                if value is not None:
                    args += [flag, str(value)]
        if config is not None:
            args += ["--config", str(config)]
        self.args = [*(wrapper or []), *args, *(extra or [])]
        # clean_env: the caller's RELAYPROXY_* settings (a --config file, say) belong to their own relays.
        base = {k: v for k, v in os.environ.items() if not (clean_env and k.startswith("RELAYPROXY_"))}
        base["RELAYPROXY_PASSWORD"] = password
        if users is not None:
            base["RELAYPROXY_USERS"] = users
        if pythonpath is not None:
            base["PYTHONPATH"] = str(pythonpath) + os.pathsep + os.environ.get("PYTHONPATH", "")
        for key, value in (env or {}).items():
            if value is None:
                base.pop(key, None)
            else:
                base[key] = value
        self.env = base
        self.cwd = Path(cwd)
        self.wrapped = bool(wrapper)
        self.new_session = new_session
        self.error = error
        self.status_timeout = status_timeout
        self.poll = poll
        self.log_path = Path(log_path) if log_path is not None else self.relay_dir.parent / f"{self.relay_dir.name}.log"
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None  # the relay's own process (the wrapper's child when there is a wrapper)
        self.t_spawn = self.t_up = 0.0  # perf_counter() just before the spawn and when it was first ready
        self._log = None

    # -- life --------------------------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0, *, ready: str | None = "status") -> "RelayProcess":
        """Spawn the relay and wait until it is ready: ``"status"`` answers /status, ``"listen"`` accepts on its
        --listen port, None: return at once."""
        self.relay_dir.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.t_spawn = time.perf_counter()
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env, cwd=self.cwd, start_new_session=self.new_session)
        self.pid = self.proc.pid
        if ready is not None:
            check = self.status if ready == "status" else self._accepts
            deadline = time.monotonic() + timeout
            while True:
                if self.proc.poll() is not None:
                    raise self.error(f"relay exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    check()
                    break
                except (OSError, ValueError):
                    if time.monotonic() > deadline:
                        raise self.error(f"relay did not {'serve /status' if ready == 'status' else 'listen'} "
                                         f"within {timeout:g} s:\n{self.log_tail()}") from None
                    time.sleep(self.poll if ready == "status" else 0.005)
        self.t_up = time.perf_counter()
        if self.wrapped:
            self.pid = self._wrapped_pid()
        return self

    def _accepts(self) -> None:
        with socket.create_connection(("127.0.0.1", self.listen_port), timeout=1):
            pass

    def _wrapped_pid(self) -> int:
        for _ in range(200):
            kids = children(self.proc.pid)
            if kids:
                return kids[0]
            time.sleep(0.01)
        raise self.error("could not find the relay process under its wrapper")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (to the relay itself under a wrapper, which then writes its output), then SIGKILL after
        ``timeout`` seconds (to the whole session with ``new_session``); the exit status (None: not running)."""
        proc, code = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.kill(self.pid if self.pid is not None else proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    if self.new_session:
                        os.killpg(proc.pid, signal.SIGKILL)
                    else:
                        proc.kill()
                    proc.wait(10)
            code = proc.returncode
        self.proc = None
        if self._log is not None:
            self._log.close()
        return code

    def kill9(self, timeout: float = 30.0) -> None:
        """SIGKILL, as a crash: nothing of the relay runs its shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout)
        self.stop()  # forgets the process and closes its log

    # -- asking it ---------------------------------------------------------------------------------------------

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/status", timeout=self.status_timeout) as r:
            return json.load(r)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=self.status_timeout) as r:
            return r.read().decode()

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float = 60.0, what: str = "condition", *,
                 poll: float | None = None) -> dict:
        """Poll /status until ``predicate(status)``; the status that passed. An exception of the predicate goes
        through; the relay exiting or the timeout raise ``error``."""
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise self.error(f"relay exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status = self.status()
            except (OSError, ValueError):
                status = None
            if status is not None and predicate(status):
                return status
            time.sleep(self.poll if poll is None else poll)
        raise self.error(f"timed out waiting for {what}; last status {status}\n{self.log_tail()}")

    def wait_at(self, end: tuple[str, int], timeout: float = 60.0, *, poll: float | None = None) -> dict:
        """Until the horizon is at master (file, position) ``end``."""
        end = (end[0], end[1])
        return self.wait_for(lambda s: (s.get("master_log_file"), s.get("read_master_log_pos")) == end, timeout,
                             f"the horizon at {end}", poll=poll)

    def wait_caught_up(self, master, timeout: float = 60.0) -> dict:
        """Until the horizon equals the master's position, read again at each poll: MariaDB writes a
        BINLOG_CHECKPOINT a moment after a rotation, so a position read once can be one that never lasts."""

        def caught_up(s: dict) -> bool:
            return (s["master_log_file"], s["read_master_log_pos"]) == master_status(master)

        return self.wait_for(caught_up, timeout, "horizon at the master's position")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"
