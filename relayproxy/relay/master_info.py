"""The relay's durable choice of master (what CHANGE MASTER TO set) and the identity of the master it streamed from.

One small JSON file, ``<relay_dir>/relayproxy.master.json``, holds both. It is written atomically (a temporary
file in the same directory, fsynced, renamed over the old one, the directory fsynced), so a crash leaves either
the old file or the new one, never a mix; a leftover temporary file is ignored and removed by the next save.

The file holds the replication password in clear, as MySQL's ``master.info`` / ``mysql.slave_master_info`` and
MariaDB's ``master.info`` do: the relay must be able to reconnect after a restart without an operator. It is
created with mode 0600 (owner read/write only); protect the relay directory accordingly. The password never
appears in a repr, in ``describe()`` or in an error message.

Precedence (``effective_master``): a choice made by CHANGE MASTER wins over ``--master`` and the rest of the
configuration at restart, because an operator's last repoint after a failover must survive a restart of the relay
with its old command line. RESET SLAVE ALL (``MasterInfoFile.clear``) returns the relay to its configuration.

This module does no network I/O and knows nothing of SQL sessions; the CHANGE MASTER statement arrives here as the
canonical option mapping of ``downstream.sql.replication_parser.ChangeMaster.options``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..wire.errors import ER_BAD_SLAVE, ER_BAD_SLAVE_AUTO_POSITION, ER_WRONG_ARGUMENTS
from .durable import write_file_atomically

__all__ = [
    "FILE_NAME",
    "FORMAT_VERSION",
    "MasterChoiceError",
    "MasterIdentity",
    "MasterInfo",
    "MasterInfoError",
    "MasterInfoFile",
    "apply_change",
    "effective_master",
]

FILE_NAME = "relayproxy.master.json"
FORMAT_VERSION = 1
DEFAULT_PORT = 3306  # a CHANGE MASTER that names a host and no port connects to 3306, as the servers do
DEFAULT_HEARTBEAT_PERIOD = 1.0  # the relay's --heartbeat-period default (commands/config.py)
_TMP_PREFIX = "." + FILE_NAME + "."
_TMP_SUFFIX = ".tmp"

GTID_MODES = ("off", "mysql", "mariadb")
SSL_MODES = ("disabled", "preferred", "required", "verify_ca", "verify_identity")
FLAVOURS = ("mysql", "mariadb")


class MasterInfoError(Exception):
    """The master info file cannot be read or written: the message names the file and what is wrong."""


class MasterChoiceError(ValueError):
    """A CHANGE MASTER result (or the configuration) names no usable master; ``code``/``sqlstate``/``message``
    are what an SQL client should see."""

    def __init__(self, code: int, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.sqlstate = sqlstate
        self.message = message


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class MasterInfo:
    """Where the relay replicates from and how: the master's address and account, TLS, timing, how to resume.

    ``ssl_mode`` uses the relay's vocabulary (``--ssl-mode``); ``gtid_mode`` 'off' resumes by file/position,
    'mysql' with auto-position, 'mariadb' with MariaDB GTID. ``log_file``/``log_pos`` are only for a by-position
    start (None: from the master's first file, or from the relay's own GTID state). ``source`` is 'config' or
    'change_master'; ``changed_at`` the time of the CHANGE MASTER (0.0 for the configuration).
    """

    host: str
    port: int
    user: str
    password: str = field(default="", repr=False)
    ssl_mode: str = "preferred"
    ssl_ca: str | None = None
    ssl_capath: str | None = None
    ssl_cert: str | None = None
    ssl_key: str | None = None
    ssl_cipher: str | None = None
    public_key_path: str | None = None
    get_public_key: bool = False
    connect_retry: int | None = None  # seconds; None: the relay's --reconnect-* delays
    heartbeat_period: float = DEFAULT_HEARTBEAT_PERIOD
    gtid_mode: str = "off"
    log_file: str | None = None
    log_pos: int | None = None
    source: str = "config"
    changed_at: float = 0.0
    # A CHANGE MASTER no stream has followed yet: it chose whatever server answers at its address, even another
    # server than the recorded one at the same address (a VIP moved to the promoted replica). Durable, so a
    # crash between CHANGE MASTER and the first stream does not lose the operator's decision.
    unfollowed: bool = False

    @property
    def address(self) -> str:
        return _host_port(self.host, self.port)

    def describe(self) -> dict[str, Any]:
        """A dict fit for /status and logs: every field but the password, which becomes ``password_set``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "password":
                out["password_set"] = bool(self.password)
            elif f.name == "changed_at":
                out["changed_at"] = _iso(self.changed_at) if self.changed_at else None
            else:
                out[f.name] = getattr(self, f.name)
        return out


@dataclass(frozen=True)
class MasterIdentity:
    """What the relay learnt of the master it actually streamed from (its handshake and variables)."""

    server_id: int
    server_uuid: str | None
    flavour: str
    host: str
    port: int


# ---------------------------------------------------------------------------------------------
# Validation of what the file holds: names the field and the expected type, never the value.

_CHOICE_TYPES: dict[str, tuple[type, ...]] = {
    "host": (str,), "port": (int,), "user": (str,), "password": (str,), "ssl_mode": (str,),
    "ssl_ca": (str, type(None)), "ssl_capath": (str, type(None)), "ssl_cert": (str, type(None)),
    "ssl_key": (str, type(None)), "ssl_cipher": (str, type(None)), "public_key_path": (str, type(None)),
    "get_public_key": (bool,), "connect_retry": (int, type(None)), "heartbeat_period": (int, float),
    "gtid_mode": (str,), "log_file": (str, type(None)), "log_pos": (int, type(None)), "source": (str,),
    "changed_at": (int, float), "unfollowed": (bool,),
}
_IDENTITY_TYPES: dict[str, tuple[type, ...]] = {
    "server_id": (int,), "server_uuid": (str, type(None)), "flavour": (str,), "host": (str,), "port": (int,),
}
_ALLOWED_VALUES = {"ssl_mode": SSL_MODES, "gtid_mode": GTID_MODES, "source": ("config", "change_master"),
                   "flavour": FLAVOURS}


def _check_section(path: Path, name: str, data: Any, types: dict[str, tuple[type, ...]]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise MasterInfoError(f"master info file {path}: '{name}' must be an object, found {type(data).__name__}")
    missing = [k for k in types if k not in data]
    unknown = [k for k in data if k not in types]
    if missing or unknown:
        detail = "; ".join(([f"missing {', '.join(missing)}"] if missing else [])
                           + ([f"unknown {', '.join(map(str, unknown))}"] if unknown else []))
        raise MasterInfoError(f"master info file {path}: '{name}' has the wrong fields ({detail})")
    for key, allowed in types.items():
        value = data[key]
        is_bool = isinstance(value, bool)
        if not isinstance(value, allowed) or (is_bool and bool not in allowed):
            expected = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise MasterInfoError(f"master info file {path}: '{name}.{key}' must be {expected}, "
                                  f"found {'null' if value is None else type(value).__name__}")
        if key in _ALLOWED_VALUES and value not in _ALLOWED_VALUES[key]:
            raise MasterInfoError(f"master info file {path}: '{name}.{key}' must be one of "
                                  f"{', '.join(_ALLOWED_VALUES[key])}")
    ranges = {"port": (1, 65535), "heartbeat_period": (0, 4294967), "connect_retry": (0, 0xFFFFFFFF),
              "log_pos": (4, 0xFFFFFFFFFFFFFFFF), "changed_at": (0, 1e12), "server_id": (0, 0xFFFFFFFF)}
    for key, (low, high) in ranges.items():
        value = data.get(key)
        if value is not None and not low <= value <= high:  # NaN fails too
            raise MasterInfoError(f"master info file {path}: '{name}.{key}' must be {low}..{high}")
    return data


class MasterInfoFile:
    """``<relay_dir>/relayproxy.master.json``: the CHANGE MASTER choice and the master's identity, saved atomically.

    One writer (the process that owns the relay directory). ``load`` reads the file; ``save_choice`` and
    ``save_identity`` replace one part and keep the other (read from the file first if it was not loaded).
    """

    def __init__(self, relay_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(relay_dir)
        self.path = self.dir / FILE_NAME
        self._loaded = False
        self._choice: MasterInfo | None = None
        self._identity: MasterIdentity | None = None

    def load(self) -> tuple[MasterInfo | None, MasterIdentity | None]:
        """The saved choice and identity; ``(None, None)`` when there is no file. Raises MasterInfoError."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self._choice, self._identity, self._loaded = None, None, True
            return None, None
        except OSError as exc:
            raise MasterInfoError(f"cannot read master info file {self.path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise MasterInfoError(f"master info file {self.path} is not UTF-8 text: damaged; remove it to fall back "
                                  "to the configured master") from None
        except json.JSONDecodeError as exc:  # its message quotes no content, only the place
            raise MasterInfoError(f"master info file {self.path} is not valid JSON ({exc.msg} at line {exc.lineno} "
                                  f"column {exc.colno}): truncated or damaged; remove it to fall back to the "
                                  "configured master") from None
        if not isinstance(data, dict):
            raise MasterInfoError(f"master info file {self.path} must hold a JSON object")
        version = data.get("version")
        if version != FORMAT_VERSION:
            shown = repr(version) if isinstance(version, (int, float)) or version is None else type(version).__name__
            raise MasterInfoError(f"master info file {self.path} has version {shown}; this relayproxy reads version "
                                  f"{FORMAT_VERSION} (written by another relayproxy release?)")
        unknown = [k for k in data if k not in ("version", "choice", "identity")]
        if unknown:
            raise MasterInfoError(f"master info file {self.path}: unknown fields {', '.join(map(str, unknown))}")
        choice = identity = None
        if data.get("choice") is not None:
            if isinstance(data["choice"], dict):
                data["choice"].setdefault("unfollowed", False)  # files written before the field existed
            values = _check_section(self.path, "choice", data["choice"], _CHOICE_TYPES)
            choice = MasterInfo(**{**values, "heartbeat_period": float(values["heartbeat_period"]),
                                   "changed_at": float(values["changed_at"])})
        if data.get("identity") is not None:
            identity = MasterIdentity(**_check_section(self.path, "identity", data["identity"], _IDENTITY_TYPES))
        self._choice, self._identity, self._loaded = choice, identity, True
        return choice, identity

    def save_choice(self, info: MasterInfo) -> None:
        """Make ``info`` the durable choice of master (the identity already saved is kept)."""
        self._ensure_loaded()
        self._write(info, self._identity)
        self._choice = info

    def save_identity(self, identity: MasterIdentity) -> None:
        """Record the identity of the master streamed from (the choice already saved is kept)."""
        self._ensure_loaded()
        self._write(self._choice, identity)
        self._identity = identity

    def clear(self) -> None:
        """Forget the choice and the identity (RESET SLAVE ALL): the configuration is in force again."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise MasterInfoError(f"cannot remove master info file {self.path}: {exc.strerror or exc}") from None
        else:
            self._fsync_dir()
        self._choice, self._identity, self._loaded = None, None, True

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self.load()

    def _write(self, choice: MasterInfo | None, identity: MasterIdentity | None) -> None:
        document = {
            "version": FORMAT_VERSION,
            "choice": None if choice is None else {f.name: getattr(choice, f.name) for f in fields(choice)},
            "identity": None if identity is None else {f.name: getattr(identity, f.name) for f in fields(identity)},
        }
        payload = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8")
        self._remove_leftovers()
        tmp = self.dir / f"{_TMP_PREFIX}{os.getpid()}.{os.urandom(4).hex()}{_TMP_SUFFIX}"
        try:
            # 0600 whatever the umask: the file holds a password.
            write_file_atomically(self.path, payload, mode=0o600, ignore_umask=True, tmp=tmp)
        except OSError as exc:
            raise MasterInfoError(f"cannot write master info file {self.path}: {exc.strerror or exc}") from None

    def _fsync_dir(self) -> None:
        try:
            fd = os.open(self.dir, os.O_RDONLY)
        except OSError as exc:
            raise MasterInfoError(f"cannot open {self.dir} to sync master info file {self.path}: "
                                  f"{exc.strerror or exc}") from None
        try:
            os.fsync(fd)
        except OSError as exc:
            raise MasterInfoError(f"cannot sync the directory of master info file {self.path}: "
                                  f"{exc.strerror or exc}") from None
        finally:
            os.close(fd)

    def _remove_leftovers(self) -> None:
        """Temporary files a crash left behind (never read: the rename is what publishes a save)."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for name in names:
            if name.startswith(_TMP_PREFIX) and name.endswith(_TMP_SUFFIX):
                try:
                    os.unlink(self.dir / name)
                except OSError:
                    pass


# ---------------------------------------------------------------------------------------------
# CHANGE MASTER semantics

_CHANGE_KEYS = frozenset({
    "host", "port", "user", "password", "ssl", "ssl_ca", "ssl_capath", "ssl_cert", "ssl_key", "ssl_cipher",
    "ssl_verify_server_cert", "connect_retry", "heartbeat_period", "use_gtid", "auto_position", "log_file",
    "log_pos", "public_key_path", "get_public_key",
})
_COPIED = ("host", "port", "user", "password", "ssl_ca", "ssl_capath", "ssl_cert", "ssl_key", "ssl_cipher",
           "public_key_path", "get_public_key", "connect_retry", "heartbeat_period")


def _ssl_mode(current: str, options: Mapping[str, Any], ca_set: bool) -> str:
    """The TLS mode after CHANGE MASTER, by the rule a MySQL replica applies when it connects: MASTER_SSL=1 means
    VERIFY_IDENTITY with MASTER_SSL_VERIFY_SERVER_CERT=1, else VERIFY_CA when a CA is given, else REQUIRED;
    MASTER_SSL=0 means no TLS. Untouched TLS options keep the current mode."""
    if not any(k in options for k in ("ssl", "ssl_verify_server_cert", "ssl_ca", "ssl_capath")):
        return current
    enabled = options.get("ssl", None if current == "preferred" else current != "disabled")
    verify = options.get("ssl_verify_server_cert", current == "verify_identity")
    if enabled is None:
        return current  # TLS never switched on: the CA and verify flags wait for MASTER_SSL=1
    if not enabled:
        return "disabled"
    return "verify_identity" if verify else "verify_ca" if ca_set else "required"


def apply_change(current: MasterInfo | None, cmd_options: Mapping[str, Any], *, flavour: str,
                 now: float | None = None) -> MasterInfo:
    """The master info after CHANGE MASTER TO ``cmd_options`` (canonical keys), with the servers' semantics.

    - Options not given keep their values.
    - Specifying MASTER_HOST or MASTER_PORT without MASTER_LOG_FILE/POS forgets the file and position: "the
      replica assumes that the source server is different from before" (MySQL manual); MariaDB does the same.
    - MASTER_LOG_FILE without MASTER_LOG_POS starts at 4 in that file (MySQL would keep the old position, with a
      warning that it may not be valid; the relay prefers the start of the named file).
    - MASTER_AUTO_POSITION=1 / MASTER_USE_GTID=slave_pos|current_pos set ``gtid_mode`` to 'mysql' / 'mariadb';
      =0 / =no set 'off'. On MariaDB, coordinates without MASTER_USE_GTID imply MASTER_USE_GTID=no (as MariaDB
      does); on MySQL, coordinates while auto-position is on are refused (ER_BAD_SLAVE_AUTO_POSITION).
    Raises MasterChoiceError naming the missing or wrong option (host, port 1..65535 and a user are required).
    """
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be 'mysql' or 'mariadb', got {flavour!r}")
    unknown = sorted(set(cmd_options) - _CHANGE_KEYS)
    if unknown:
        raise ValueError(f"unknown CHANGE MASTER option keys: {', '.join(unknown)}")
    if flavour == "mysql" and "use_gtid" in cmd_options:
        raise MasterChoiceError(ER_WRONG_ARGUMENTS, "HY000", "Incorrect arguments to MASTER_USE_GTID (MariaDB's "
                                "option: a MySQL master resumes with MASTER_AUTO_POSITION)")
    if flavour == "mariadb" and "auto_position" in cmd_options:
        raise MasterChoiceError(ER_WRONG_ARGUMENTS, "HY000", "Incorrect arguments to MASTER_AUTO_POSITION (MySQL's "
                                "option: a MariaDB master resumes with MASTER_USE_GTID)")
    base = current or MasterInfo(host="", port=DEFAULT_PORT, user="")
    values: dict[str, Any] = {k: cmd_options[k] for k in _COPIED if k in cmd_options}

    # File and position.
    coordinates = "log_file" in cmd_options or "log_pos" in cmd_options
    log_file, log_pos = base.log_file, base.log_pos
    if ("host" in cmd_options or "port" in cmd_options) and not coordinates:
        log_file, log_pos = None, None
    if "log_file" in cmd_options:
        log_file, log_pos = cmd_options["log_file"], 4
    if "log_pos" in cmd_options:
        log_pos = max(4, int(cmd_options["log_pos"]))
        if log_file is None:
            raise MasterChoiceError(ER_WRONG_ARGUMENTS, "HY000", "Incorrect arguments to MASTER_LOG_POS (no "
                                    "MASTER_LOG_FILE is known: give MASTER_LOG_FILE with it)")
    values["log_file"], values["log_pos"] = log_file, log_pos

    # How to resume.
    gtid_mode = base.gtid_mode
    if "auto_position" in cmd_options:
        gtid_mode = "mysql" if cmd_options["auto_position"] else "off"
    elif "use_gtid" in cmd_options:
        gtid_mode = "off" if cmd_options["use_gtid"] == "no" else "mariadb"
    elif coordinates and flavour == "mariadb":
        gtid_mode = "off"
    if coordinates and gtid_mode == "mysql":
        raise MasterChoiceError(ER_BAD_SLAVE_AUTO_POSITION, "HY000",
                                "Parameters MASTER_LOG_FILE, MASTER_LOG_POS, RELAY_LOG_FILE and RELAY_LOG_POS cannot "
                                "be set when MASTER_AUTO_POSITION is active.")
    if coordinates and gtid_mode == "mariadb":
        raise MasterChoiceError(ER_WRONG_ARGUMENTS, "HY000", "Incorrect arguments to MASTER_USE_GTID (the relay "
                                "follows the GTID position: MASTER_LOG_FILE/MASTER_LOG_POS need MASTER_USE_GTID=no)")
    values["gtid_mode"] = gtid_mode

    ca_set = bool(cmd_options.get("ssl_ca", base.ssl_ca) or cmd_options.get("ssl_capath", base.ssl_capath))
    values["ssl_mode"] = _ssl_mode(base.ssl_mode, cmd_options, ca_set)
    if "heartbeat_period" in values:
        values["heartbeat_period"] = float(values["heartbeat_period"])
    values["source"] = "change_master"
    values["changed_at"] = time.time() if now is None else now
    values["unfollowed"] = True
    result = replace(base, **values)

    if not result.host.strip():
        raise MasterChoiceError(ER_BAD_SLAVE, "HY000", "The server is not configured as slave; fix in config file "
                                "or with CHANGE MASTER TO (MASTER_HOST is not set)")
    if not 1 <= result.port <= 65535:
        raise MasterChoiceError(ER_WRONG_ARGUMENTS, "HY000",
                                f"Incorrect arguments to MASTER_PORT ({result.port} is not a TCP port: 1..65535)")
    if not result.user:
        raise MasterChoiceError(ER_BAD_SLAVE, "HY000", "The server is not configured as slave; fix in config file "
                                "or with CHANGE MASTER TO (MASTER_USER is not set)")
    return result


# ---------------------------------------------------------------------------------------------
# Precedence


def _config_phrase(source: str | None) -> str:
    if not source:
        return ""
    if source.startswith("flag "):
        return " from the command line"
    return f" from {source}"


def master_from_config(config_values: Mapping[str, Any]) -> MasterInfo | None:
    """The master the configuration names (None without ``master``). ``password`` must be the resolved one
    (``RelayConfig.resolved_password()``); ``start_file`` becomes a by-position start at 4 of that file."""
    master = config_values.get("master")
    if master is None:
        return None
    host, port = master
    start_file = config_values.get("start_file")
    heartbeat = config_values.get("heartbeat_period")
    return MasterInfo(
        host=host,
        port=int(port),
        user=config_values.get("user") or "",
        password=config_values.get("password") or "",
        ssl_mode=config_values.get("ssl_mode") or "preferred",
        ssl_ca=config_values.get("ssl_ca"),
        ssl_cert=config_values.get("ssl_cert"),
        ssl_key=config_values.get("ssl_key"),
        public_key_path=config_values.get("server_public_key"),
        heartbeat_period=DEFAULT_HEARTBEAT_PERIOD if heartbeat is None else float(heartbeat),
        gtid_mode=config_values.get("gtid_mode") or "off",
        log_file=start_file,
        log_pos=4 if start_file else None,
        source="config",
        changed_at=0.0,
    )


def effective_master(config_values: Mapping[str, Any], file_info: MasterInfo | None, *,
                     config_sources: Mapping[str, str] | None = None) -> tuple[MasterInfo, str]:
    """The master in force and why: a CHANGE MASTER choice (``file_info``) overrides the configuration.

    ``config_values`` uses the relay's option names (master as (host, port), user, password, ssl_mode, ssl_ca,
    ssl_cert, ssl_key, heartbeat_period, gtid_mode, optionally start_file and server_public_key);
    ``config_sources`` (``RelayConfig.sources``) lets the reason say where ``master`` came from.
    Raises MasterChoiceError when neither names a master.
    """
    configured = master_from_config(config_values)
    source = (config_sources or {}).get("master")
    if file_info is not None and file_info.source == "change_master":
        when = _iso(file_info.changed_at) if file_info.changed_at else "an unknown time"
        if configured is None:
            return file_info, f"CHANGE MASTER at {when} to {file_info.address} (no --master configured)"
        return file_info, (f"CHANGE MASTER at {when} to {file_info.address} overrides --master "
                           f"{configured.address}{_config_phrase(source)} (RESET SLAVE ALL returns to it)")
    if configured is None:
        raise MasterChoiceError(ER_BAD_SLAVE, "HY000", "The server is not configured as slave; fix in config file "
                                "or with CHANGE MASTER TO (no --master given and no CHANGE MASTER recorded)")
    return configured, f"--master {configured.address}{_config_phrase(source)} (no CHANGE MASTER recorded)"
