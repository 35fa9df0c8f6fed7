"""Throwaway local mariadbd instances for the demo and the tests, each with its own datadir, port and binlogs."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pymysql

from ..log import get_logger
from .relayprocess import free_port

log = get_logger(__name__)

# Where Debian and most packages put the server binaries when they are not on PATH (mariadbd lives in /usr/sbin).
SEARCH_DIRS = ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin", "/usr/local/mysql/bin")

# sun_path holds 108 bytes on Linux; stay well below it.
_SOCKET_PATH_MAX = 100

# Startup output that means "someone else took the port between our pick and the server's bind".
_PORT_IN_USE = re.compile(r"Address already in use|Do you already have another (?:mysqld|mariadbd) server running")

_GRANTS = re.compile(r"[A-Za-z][A-Za-z _,]*")

_running: set[MariaDBSandbox] = set()
_ports_in_use: set[int] = set()


class SandboxError(RuntimeError):
    """A sandbox server could not be set up, started or stopped; the message says why, with its error log's tail."""


def find_binary(*names: str) -> str:
    """Absolute path of the first of `names` found on PATH or in SEARCH_DIRS."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
        for directory in SEARCH_DIRS:
            candidate = os.path.join(directory, name)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    raise SandboxError(
        f"{names[0]} not found on PATH or in {', '.join(SEARCH_DIRS)}: install mariadb-server (`make setup` does)"
    )


def _pick_free_port() -> int:
    for _ in range(50):
        port = free_port()
        if port not in _ports_in_use:  # another sandbox's, picked but not yet bound by its mariadbd
            return port
    raise SandboxError("could not find a free TCP port on 127.0.0.1")


def _tail(path: Path, lines: int = 40, offset: int = 0) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return f"({path} does not exist)"
    text = data.decode("utf-8", "replace").rstrip("\n")
    if not text:
        return f"({path} is empty)"
    return "\n".join(text.splitlines()[-lines:])


def _option_line(key: str, value: Any, prefix: str = "") -> str:
    """`key=value` as my.cnf (or, with prefix "--", the command line) spells it; True is a bare flag."""
    name = prefix + key.replace("_", "-")
    return name if value is True else f"{name}={value}"


# A directory for datadirs as `mariadb-install-db` writes them, one per (binaries, InnoDB options, user): a new
# sandbox copies one. Unset: every new datadir runs `mariadb-install-db` (the demo leaves nothing behind).
TEMPLATE_ENV = "RELAYPROXY_SANDBOX_TEMPLATES"
# Set (to the reason) while a test without the `server` marker runs (tests/conftest.py): start() refuses, also in
# the processes such a test starts (the demo, a benchmark), so a server never hides behind a missing marker.
FORBID_ENV = "RELAYPROXY_SANDBOX_FORBIDDEN"


def _datadir_template(install_db: str, options: list[str], run_as: list[str]) -> Path | None:
    """The datadir `mariadb-install-db` wrote for `options` with these binaries, made on first use in the directory
    $RELAYPROXY_SANDBOX_TEMPLATES names; None when it is unset. Keyed by the binaries' paths, sizes and times, so
    an upgraded server gets a new one; built beside its final place and renamed there, so a concurrent user sees it
    whole or not at all."""
    root = os.environ.get(TEMPLATE_ENV)
    if not root:
        return None
    key_parts = [install_db, *options, *run_as, str(os.geteuid())]
    for binary in (install_db, find_binary("mariadbd", "mysqld")):
        st = os.stat(binary)
        key_parts += [binary, str(st.st_size), str(st.st_mtime_ns)]
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:20]
    template = Path(root) / key
    if (template / "mysql").is_dir():
        return template
    template.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=template.parent))
    try:
        (building / "tmp").mkdir()
        _run_install_db(install_db, options, run_as, building / "data", building / "tmp")
        try:
            os.rename(building / "data", template)
        except OSError:
            if not (template / "mysql").is_dir():  # not another process's template: a real failure
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return template


def _run_install_db(install_db: str, options: list[str], run_as: list[str], datadir: Path, tmpdir: Path) -> None:
    cmd = [
        install_db,
        "--no-defaults",
        "--auth-root-authentication-method=normal",
        f"--datadir={datadir}",
        "--skip-test-db",
        "--skip-name-resolve",
        *run_as,
        f"--tmpdir={tmpdir}",
        *options,
    ]
    began = time.monotonic()
    # Own session, so that on a timeout or an interrupt the script's bootstrap mariadbd dies with it.
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=300)
    except BaseException as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        shutil.rmtree(datadir, ignore_errors=True)
        if isinstance(exc, subprocess.TimeoutExpired):
            raise SandboxError(f"{install_db} did not finish within {exc.timeout:.0f}s") from None
        raise
    if proc.returncode != 0:
        shutil.rmtree(datadir, ignore_errors=True)
        tail = "\n".join(output.decode("utf-8", "replace").splitlines()[-40:])
        raise SandboxError(f"{' '.join(cmd)} failed with exit code {proc.returncode}:\n{tail}")
    log.debug("sandbox datadir initialised", datadir=str(datadir), seconds=round(time.monotonic() - began, 3))


class MariaDBSandbox:
    """One local mariadbd under `basedir`: `start()` initialises the datadir on first use, `stop()`/`kill()` end it.

    Everything lives in `basedir` (datadir, my.cnf, error log, binlogs) except the Unix socket when `basedir` is
    too long for one; then the socket goes to a short private directory under /tmp, made by `start()` (until then
    `socket_path` is None) and removed by `stop()`.
    A stopped or killed sandbox can be started again on the same datadir (crash recovery runs as usual).

    `extra_config` adds or overrides [mariadbd] options: a value of True writes a bare flag, False or None removes
    the option (also one of the defaults), anything else is written as `option=value`.
    """

    host = "127.0.0.1"
    user = "root"

    def __init__(
        self,
        basedir: str | os.PathLike[str],
        port: int | None = None,
        server_id: int = 1,
        log_bin: bool = True,
        binlog_format: str = "MIXED",
        gtid_strict_mode: bool = True,
        extra_config: Mapping[str, Any] | None = None,
        *,
        log_bin_name: str = "master-bin",
        binlog_checksum: str = "CRC32",
        gtid_domain_id: int = 0,
        startup_timeout: float = 60.0,
        shutdown_timeout: float = 30.0,
    ) -> None:
        self.basedir = Path(basedir).absolute()
        self._auto_port = port is None
        self.port = port if port is not None else 0
        self.server_id = server_id
        self.log_bin = log_bin
        self.log_bin_name = log_bin_name
        self.binlog_format = binlog_format
        self.binlog_checksum = binlog_checksum
        self.gtid_strict_mode = gtid_strict_mode
        self.gtid_domain_id = gtid_domain_id
        self.extra_config = dict(extra_config or {})
        self.startup_timeout = startup_timeout
        self.shutdown_timeout = shutdown_timeout

        self.datadir = self.basedir / "data"
        self.binlog_dir = self.basedir / "binlog"
        self.config_path = self.basedir / "my.cnf"
        self.tmpdir = self.basedir / "tmp"
        self.error_log = self.basedir / "error.log"
        self.pid_file = self.basedir / "mariadbd.pid"
        self._stdout_log = self.basedir / "mariadbd.out"
        self._short_dir: Path | None = None
        self.socket_path: Path | None = self._socket_path(create=False)

        self._process: subprocess.Popen[bytes] | None = None
        self._admin: pymysql.connections.Connection | None = None

    # -- configuration -------------------------------------------------------------------------------------

    def _socket_path(self, create: bool = True) -> Path | None:
        path = self.basedir / "mariadbd.sock"
        if len(os.fsencode(path)) < _SOCKET_PATH_MAX:
            return path
        if self._short_dir is None:
            if not create:
                return None
            self._short_dir = Path(tempfile.mkdtemp(prefix="rp-", dir="/tmp" if os.path.isdir("/tmp") else None))
        return self._short_dir / "mariadbd.sock"

    def config(self) -> dict[str, Any]:
        """The [mariadbd] options this sandbox runs with, defaults merged with extra_config."""
        options: dict[str, Any] = {
            "datadir": self.datadir,
            "port": self.port,
            "socket": self.socket_path,
            "pid_file": self.pid_file,
            "log_error": self.error_log,
            "bind_address": self.host,
            "skip_name_resolve": True,
            "server_id": self.server_id,
            "gtid_domain_id": self.gtid_domain_id,
            "gtid_strict_mode": "ON" if self.gtid_strict_mode else "OFF",
            "binlog_format": self.binlog_format,
            "binlog_checksum": self.binlog_checksum,
            "relay_log": self.datadir / "relay-bin",
            "skip_slave_start": True,
            "max_allowed_packet": "1G",
            "character_set_server": "utf8mb4",
            "collation_server": "utf8mb4_general_ci",
            "innodb_buffer_pool_size": "32M",
            "innodb_log_file_size": "16M",
            # Its own tmpdir: every mariadbd deletes #sql* files in its tmpdir at start-up, so servers
            # sharing /tmp destroy each other's bootstrap tables when started in parallel.
            "tmpdir": self.tmpdir,
        }
        if self.log_bin:
            options["log_bin"] = self.binlog_dir / self.log_bin_name
            options["log_bin_index"] = self.binlog_dir / f"{self.log_bin_name}.index"
        for key, value in self.extra_config.items():
            name = key.replace("-", "_")
            if value is None or value is False:
                options.pop(name, None)
            else:
                options[name] = value
        return options

    def _write_config(self) -> None:
        lines = ["# written by relayproxy.lab.sandbox; rewritten on every start", "[mariadbd]"]
        lines += [_option_line(key, value) for key, value in self.config().items()]
        lines += [
            "",
            "# `mariadb --defaults-file=<this file>` connects to this sandbox as root",
            "[client]",
            "user=root",
            f"host={self.host}",
            f"port={self.port}",
            f"socket={self.socket_path}",
            "",
        ]
        self.config_path.write_text("\n".join(lines))

    # -- lifecycle -----------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> MariaDBSandbox:
        """Initialise the datadir if needed, start mariadbd and return once it accepts connections."""
        if self.running:
            raise SandboxError(f"sandbox in {self.basedir} is already running (pid {self.pid})")
        forbidden = os.environ.get(FORBID_ENV)
        if forbidden:
            raise SandboxError(f"not starting mariadbd in {self.basedir}: {forbidden} ({FORBID_ENV} is set)")
        began = time.monotonic()
        command = self.server_command()
        self.basedir.mkdir(parents=True, exist_ok=True)
        self.binlog_dir.mkdir(exist_ok=True)
        self.tmpdir.mkdir(exist_ok=True)
        self.socket_path = self._socket_path()
        if not (self.datadir / "mysql").is_dir():
            self._install_db()

        attempts = 5 if self._auto_port else 1
        for attempt in range(1, attempts + 1):
            if self._auto_port and (self.port == 0 or attempt > 1):
                self.port = _pick_free_port()
            _ports_in_use.add(self.port)
            try:
                self._spawn(command)
                break
            except _PortTaken:
                _ports_in_use.discard(self.port)
                if attempt == attempts:
                    raise SandboxError(f"mariadbd could not bind a free port after {attempts} attempts") from None
                log.info("sandbox port taken, retrying", port=self.port, basedir=str(self.basedir))
        _running.add(self)
        log.info(
            "sandbox started",
            basedir=str(self.basedir),
            port=self.port,
            pid=self.pid,
            seconds=round(time.monotonic() - began, 3),
        )
        return self

    def server_command(self) -> list[str]:
        """The command line that runs this sandbox's server (what start() launches; handy with --keep)."""
        return [find_binary("mariadbd", "mysqld"), f"--defaults-file={self.config_path}", *self._run_as()]

    def _run_as(self) -> list[str]:
        # mariadbd refuses to run as root unless told to; as another user it simply runs as that user.
        return ["--user=root"] if os.geteuid() == 0 else []

    def _install_db(self) -> None:
        """A fresh datadir: with $RELAYPROXY_SANDBOX_TEMPLATES, a copy of the one `mariadb-install-db` wrote there for
        these InnoDB options and binaries (made once, as mysql-test-run bootstraps once and copies; the tests set
        it), else `mariadb-install-db` itself."""
        install_db = find_binary("mariadb-install-db", "mysql_install_db")
        # InnoDB options shape the files the bootstrap creates (page size, log size): same as every start.
        options = [_option_line(k, v, "--") for k, v in self.config().items() if k.startswith("innodb")]
        template = _datadir_template(install_db, options, self._run_as())
        if template is None:
            _run_install_db(install_db, options, self._run_as(), self.datadir, self.tmpdir)
            return
        began = time.monotonic()
        try:
            shutil.copytree(template, self.datadir, symlinks=True, dirs_exist_ok=True)
        except BaseException:
            shutil.rmtree(self.datadir, ignore_errors=True)
            raise
        log.debug("sandbox datadir copied", datadir=str(self.datadir), template=str(template),
                  seconds=round(time.monotonic() - began, 3))

    def _spawn(self, command: list[str]) -> None:
        self._write_config()
        log_offset = self.error_log.stat().st_size if self.error_log.exists() else 0
        with open(self._stdout_log, "ab") as out:
            # Own session: a Ctrl-C meant for the caller must not reach the server; stop() ends it in order.
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_until_ready(log_offset)
        except BaseException:
            self._end_process(signal.SIGKILL, timeout=10)
            raise

    def _wait_until_ready(self, log_offset: int) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout
        last_error: Exception | None = None
        while True:
            code = self._process.poll()
            if code is not None:
                tail = _tail(self.error_log, offset=log_offset)
                if self._auto_port and _PORT_IN_USE.search(tail):
                    raise _PortTaken()
                raise SandboxError(
                    f"mariadbd exited with code {code} during startup ({self.config_path}); "
                    f"tail of {self.error_log}:\n{tail}"
                )
            if not self.socket_path.exists():
                # Nothing to probe yet (a failed PyMySQL connect leaks its socket object).
                last_error = SandboxError(f"{self.socket_path} does not exist yet")
                if time.monotonic() > deadline:
                    raise SandboxError(
                        f"mariadbd did not create its socket within {self.startup_timeout:.0f}s; "
                        f"tail of {self.error_log}:\n{_tail(self.error_log, offset=log_offset)}"
                    )
                time.sleep(0.05)
                continue
            try:
                # The socket is ours alone, so a connection there cannot be some other server on our port.
                probe = pymysql.connect(unix_socket=str(self.socket_path), user=self.user, connect_timeout=2)
            except pymysql.err.OperationalError as exc:
                last_error = exc
            else:
                probe.close()
                return
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"mariadbd did not accept connections within {self.startup_timeout:.0f}s "
                    f"(last error: {last_error}); tail of {self.error_log}:\n{_tail(self.error_log, offset=log_offset)}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float | None = None) -> None:
        """Clean shutdown (SIGTERM); SIGKILL if it takes longer than `timeout` (default shutdown_timeout)."""
        if self._process is None:
            return
        self._close_admin()
        if not self._end_process(signal.SIGTERM, self.shutdown_timeout if timeout is None else timeout):
            log.warning("sandbox did not shut down in time, killed it", basedir=str(self.basedir), pid=self.pid)
            self._end_process(signal.SIGKILL, timeout=30)
        self._forget_process()
        log.info("sandbox stopped", basedir=str(self.basedir))

    def kill(self) -> None:
        """SIGKILL the server, as a crash would: no shutdown, binlog left as the kernel has it."""
        if self._process is None:
            return
        self._close_admin()
        self._end_process(signal.SIGKILL, timeout=30)
        self._forget_process()
        log.info("sandbox killed", basedir=str(self.basedir))

    def _end_process(self, sig: signal.Signals, timeout: float) -> bool:
        proc = self._process
        assert proc is not None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _forget_process(self) -> None:
        self._process = None
        _running.discard(self)
        _ports_in_use.discard(self.port)
        if self._short_dir is not None:
            shutil.rmtree(self._short_dir, ignore_errors=True)
            self._short_dir = None

    def __enter__(self) -> MariaDBSandbox:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<MariaDBSandbox {self.basedir} port={self.port} {state}>"

    # -- SQL -----------------------------------------------------------------------------------------------

    def connect(self, **kwargs: Any) -> pymysql.connections.Connection:
        """A new PyMySQL connection over TCP, as root with autocommit unless `kwargs` say otherwise."""
        if not self.running:
            raise SandboxError(f"sandbox in {self.basedir} is not running")
        params: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": "",
            "autocommit": True,
            "charset": "utf8mb4",
            "connect_timeout": 10,
        }
        params.update(kwargs)
        return pymysql.connect(**params)

    def execute(self, sql: str, args: Any = None) -> tuple[tuple[Any, ...], ...]:
        """Run one statement as root on a kept connection (autocommit) and return its rows (empty if none)."""
        if self._admin is not None:
            try:
                self._admin.ping()
            except pymysql.err.Error:
                self._close_admin()  # e.g. the server was restarted behind our back; start afresh
        if self._admin is None:
            self._admin = self.connect()
        with self._admin.cursor() as cursor:
            cursor.execute(sql, args)
            return tuple(cursor.fetchall())

    def _close_admin(self) -> None:
        if self._admin is not None:
            # The server may already be gone; the connection is dropped either way.
            with contextlib.suppress(Exception):
                self._admin.close()
            self._admin = None

    def binlog_files(self) -> list[Path]:
        """Full paths of the server's binlog files, oldest first.

        While the server runs, as SHOW BINARY LOGS lists them; once it is stopped or killed, from its index file.
        """
        if self.running:
            return [self.binlog_dir / row[0] for row in self.execute("SHOW BINARY LOGS")]
        index = self.binlog_dir / f"{self.log_bin_name}.index"
        if not index.exists():
            return []
        return [self.binlog_dir / Path(line).name for line in index.read_text().splitlines() if line.strip()]

    def create_user(self, name: str, password: str, grants: str = "REPLICATION SLAVE, REPLICATION CLIENT") -> None:
        """Create (or update) `name`@'%' with `password` and give it `grants` ON *.*."""
        if not _GRANTS.fullmatch(grants):
            raise ValueError(f"grants must be a list of privilege names, got {grants!r}")
        self.execute("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (name, password))
        self.execute("ALTER USER %s@'%%' IDENTIFIED BY %s", (name, password))
        self.execute(f"GRANT {grants} ON *.* TO %s@'%%'", (name,))

    def error_log_tail(self, lines: int = 40) -> str:
        return _tail(self.error_log, lines)


class _PortTaken(Exception):
    """The auto-picked port was taken before mariadbd could bind it; start() picks another."""


@atexit.register
def _stop_leftovers() -> None:
    # A sandbox must not outlive the process that started it, even when the caller forgot stop().
    for sandbox in list(_running):
        with contextlib.suppress(Exception):
            sandbox.stop(timeout=10)
