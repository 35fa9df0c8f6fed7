"""Relay configuration: one option table feeds the TOML file, the command-line flags and RELAYPROXY_* variables.

Precedence: command-line flag > environment variable ``RELAYPROXY_<OPTION>`` > ``--config`` TOML file >
default. Every option exists in all three forms with the same name (``--server-id``,
``RELAYPROXY_SERVER_ID``, ``server_id = ...`` or ``server-id = ...`` in TOML).
"""

from __future__ import annotations

import argparse
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ENV_PREFIX = "RELAYPROXY_"


class ConfigError(ValueError):
    """A configuration value is missing or invalid; the message names the option and its source."""


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = str(value).rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]")
    port_num = int(port)
    if not 0 <= port_num <= 65535:
        raise ValueError(f"port {port_num} out of range")
    return host, port_num


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean, got {value!r}")


def _bool_or_auto(value: Any) -> bool | str:
    if str(value).strip().lower() == "auto":
        return "auto"
    try:
        return _bool(value)
    except ValueError:
        raise ValueError(f"expected a boolean or auto, got {value!r}") from None


def _choice(*choices: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return text

    return convert


def _positive_float(value: Any) -> float:
    number = float(value)
    if number < 0:
        raise ValueError(f"expected a non-negative number, got {value!r}")
    return number


def _positive_int(value: Any) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(f"expected a positive integer, got {value!r}")
    return number


def _non_negative_int(value: Any) -> int:
    number = int(value)
    if number < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return number


def _users(value: Any):
    from ..downstream.users import parse_users

    return parse_users(value)


def _duration(value: Any) -> float:
    from ..relay.retention import parse_duration

    return parse_duration(value)


def _duration_or_zero(value: Any) -> float:
    """A duration, or 0 (off)."""
    if not isinstance(value, bool) and str(value).strip() in ("0", "0.0", "0s"):
        return 0.0
    return _duration(value)


def _size(value: Any) -> int:
    from ..relay.retention import parse_size

    return parse_size(value)


def _file_count(value: Any) -> int:
    from ..relay.retention import parse_file_count

    return parse_file_count(value)


def _int_range(low: int, high: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        number = int(value)
        if not low <= number <= high:
            raise ValueError(f"must be {low}..{high}")
        return number

    return convert


def _archive_after(value: Any):
    from ..relay.conversion import parse_archive_after

    parse_archive_after(value)  # validates
    return str(value).strip()


def _keep_local(value: Any):
    from ..relay.remote import parse_keep_local

    parse_keep_local(value)  # validates
    return str(value).strip()


def _server_id(value: Any) -> int:
    number = int(value)
    if not 1 <= number <= 0xFFFFFFFF:
        raise ValueError(f"server id must be 1..4294967295, got {value!r}")
    return number


@dataclass(frozen=True)
class Option:
    name: str  # python name; flag --name-with-dashes, env RELAYPROXY_NAME
    convert: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str | None = None
    secret: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option("master", _host_port, None, "the master to replicate from", "HOST:PORT"),
    Option("user", str, None, "replication user on the master"),
    Option("password", str, None, "its password (prefer --password-file or the environment)", secret=True),
    Option("password_file", str, None, "file holding the password (first line)", "PATH"),
    Option("server_id", _server_id, None, "server id the relay registers with (unique in the topology)"),
    Option("relay_dir", str, None, "directory of the relay files (the files are the state)", "DIR"),
    Option("binlog_dir", str, None, "relayproxy serve: directory of the binlog files to serve, read-only", "DIR"),
    Option("binlog_key_file", str, None,
           "relayproxy serve: the MariaDB server's key file (file_key_management_filename) for encrypt_binlog=ON "
           "files", "PATH"),
    Option("binlog_key_file_key", str, None,
           "its file key when it is encrypted (file_key_management_filekey: the secret, or FILE:<path>)",
           "SECRET", secret=True),
    Option("binlog_key_algorithm", _choice("aes_cbc", "aes_ctr"), "aes_cbc",
           "the server's file_key_management_encryption_algorithm"),
    Option("decrypted_dir", str, None,
           "relayproxy serve: where the plain copies of encrypted binlogs go (default: a private temporary "
           "directory, removed at exit)", "DIR"),
    Option("http", _host_port, None, "serve GET /status and /metrics on this address", "HOST:PORT"),
    Option("listen", _host_port, None, "serve replicas and tools on this address, as their master", "HOST:PORT"),
    Option("users", _users, None,
           "accounts for --listen: TOML [[users]] tables (name, password | password_env | password_file, plugin, "
           "tls, admin, privileges), or NAME:PASSWORDSPEC[:tls][:plugin][:admin][:privileges=A+B],... with "
           "PASSWORDSPEC env:VAR, file:PATH or the password; privileges: replication_slave, replication_client, "
           "binlog_admin, admin (default: replication_slave + replication_client; admin = true: all)",
           "SPECS", secret=True),
    Option("tls_cert", str, None, "certificate (PEM) offered to replicas on --listen", "PATH"),
    Option("tls_key", str, None, "its private key (PEM; default: in the certificate file)", "PATH"),
    Option("gtid_mode", _choice("off", "mysql", "mariadb"), "off",
           "how to resume after a reconnect: file/position, MySQL GTID auto-position or MariaDB GTID"),
    Option("start_file", str, None, "bootstrap at position 4 of this master file (default: its oldest file)", "NAME"),
    Option("ssl_mode", _choice("disabled", "preferred", "required", "verify_ca", "verify_identity"), "preferred",
           "TLS to the master"),
    Option("ssl_ca", str, None, "CA certificate file to verify the master with", "PATH"),
    Option("ssl_cert", str, None, "client certificate for TLS to the master", "PATH"),
    Option("ssl_key", str, None, "client key for TLS to the master", "PATH"),
    Option("server_public_key", str, None, "master's RSA public key (caching_sha2_password without TLS)", "PATH"),
    Option("heartbeat_period", _positive_float, 1.0,
           "heartbeat period asked of the master, seconds; silent for two periods = master gone"),
    Option("connect_timeout", _positive_float, 10.0, "seconds to connect and authenticate"),
    Option("reconnect_min_delay", _positive_float, 0.1, "first reconnect delay, seconds (doubles up to the max)"),
    Option("reconnect_max_delay", _positive_float, 10.0, "longest reconnect delay, seconds"),
    Option("sync_mode", _choice("transaction", "batch"), "transaction",
           "transaction: fsync every batch of complete transactions before advancing; batch: defer fsyncs"),
    Option("sync_max_transactions", int, 100, "batch mode: fsync after this many transactions"),
    Option("sync_max_delay", _positive_float, 0.01, "batch mode: fsync at most this many seconds after a commit"),
    Option("sync_on_loop", _bool_or_auto, "auto",
           "run each fdatasync on the event loop (lower semi-sync commit latency; the loop waits for the disk); "
           "auto: while the recent fdatasyncs average under 2 ms"),
    Option("txindex_in_child", _bool, True,
           "build the transaction index in a child process (its parsing then never delays the event loop)"),
    Option("semi_sync", _bool, True, "register as a semi-sync replica when the master has semi-sync enabled"),
    Option("verify_checksums", _bool, True, "verify the CRC32 of every event received"),
    Option("semi_sync_replicas", int, 0,
           "semi-sync: ACK the master only after this many semi-sync replicas of the relay have the transaction"),
    Option("semi_sync_timeout", _positive_float, 10.0,
           "semi-sync: seconds to wait for those replicas before ACKing the master anyway (counted as a timeout)"),
    Option("retention_max_age", _duration, None,
           "purge relay files last written longer ago than this: seconds, or a number with s, m, h, d, w (7d)",
           "DURATION"),
    Option("retention_max_bytes", _size, None,
           "purge the oldest relay files while all of them take more than this: bytes, or with K, M, G, T (20G)",
           "SIZE"),
    Option("retention_max_files", _file_count, None, "purge the oldest relay files beyond this many", "N"),
    Option("retention_interval", _duration, 60.0, "seconds between retention checks (a duration, as for max age)",
           "DURATION"),
    Option("retention_force", _bool, False,
           "retention purges files connected replicas still read too (their dumps end with error 1236)"),
    Option("compress_closed", _choice("off", "zstd"), "off",
           "compress closed relay files with zstd (seekable frames; replicas get the same bytes)", "off|zstd"),
    Option("compress_level", _int_range(1, 22), 3, "zstd level for compress_closed (1 fast .. 22 small)", "N"),
    Option("encrypt_at_rest", _bool, False,
           "encrypt closed relay files with AES-256-GCM (needs encryption_key_file or encryption_key_env)"),
    Option("encryption_key_file", str, None,
           "file of AES-256 keys, one '<id>:<64 hex digits>' a line (old keys stay to read old files)", "PATH"),
    Option("encryption_key_env", str, None,
           "name of an environment variable holding the keys, as in encryption_key_file", "VAR"),
    Option("encryption_key_id", _positive_int, None,
           "key id new files are encrypted with (default: the highest id)", "N"),
    Option("archive_dir", str, None,
           "move closed relay files here (a mounted volume) after archive_after; still served from there", "DIR"),
    Option("archive_after", _archive_after, None,
           "archive closed files older than this (7d, 12h) or beyond this many in relay_dir ('20 files')", "AGE|N files"),
    Option("storage_interval", _duration, 10.0,
           "seconds between looks for closed files to compress, encrypt or archive", "DURATION"),
    Option("archive_url", str, None,
           "upload the relay's history to object storage as it becomes durable: s3://bucket/prefix or "
           "file:///path (relayproxy restore rebuilds a relay from it)", "URL"),
    Option("archive_endpoint", str, None,
           "archive_url s3://: the S3-compatible endpoint (default: AWS's for the region)", "URL"),
    Option("archive_region", str, None, "archive_url s3://: the bucket's region (default: the AWS chain's)", "NAME"),
    Option("archive_access_key_id", str, None,
           "archive_url s3://: access key id (default: the standard AWS credential chain)", "ID", secret=True),
    Option("archive_secret_access_key_file", str, None,
           "archive_url s3://: file holding the secret access key (first line), with archive_access_key_id", "PATH"),
    Option("archive_interval", _positive_float, 1.0,
           "archive_url: at most this many seconds between uploads of the newest durable transactions"),
    Option("archive_keep_local", _keep_local, None,
           "archive_url: keep local copies of only the newest sealed files, up to this size (50G) or count "
           "('20 files'); older ones are read back from the bucket through the cache (default: keep all)",
           "SIZE|N files"),
    Option("archive_backlog_max", _size, None,
           "archive_url: the most bytes of relay files not yet sealed in the bucket that retention keeps for it; "
           "beyond, the oldest go by the retention limits and are marked as gaps in the bucket (default: keep all)",
           "SIZE"),
    Option("archive_cache_dir", str, None,
           "archive_url: where files read back from the bucket are cached (default: relay_dir/relayproxy.cache)",
           "DIR"),
    Option("archive_cache_size", _size, 1 << 30,
           "archive_url: the cache's bound in bytes, or with K, M, G (at least the largest relay file is kept)",
           "SIZE"),
    Option("max_statement_bytes", _size, 1 << 20,
           "SQL port: @@max_allowed_packet: largest command packet (a statement and its command byte), largest "
           "string value, and all user variables of one connection: bytes, or with K, M, G (1M)", "SIZE"),
    Option("show_binlog_events_max_rows", _positive_int, 10000,
           "SQL port: rows one SHOW BINLOG EVENTS returns at most (page with FROM / LIMIT offset); the file is read "
           "in a worker thread", "N"),
    Option("max_connections", _positive_int, 1000,
           "--listen: clients logged in at once, plus one more for an admin account (then 1040 Too many connections)",
           "N"),
    Option("max_connections_per_host", _non_negative_int, 0,
           "--listen: connections from one client address (1040 before the greeting); 0: no cap", "N"),
    Option("max_unauthenticated_connections", _positive_int, 100,
           "--listen: connections not logged in yet (at most max_connections); when full, a newcomer replaces the "
           "oldest that has waited over a second", "N"),
    Option("max_connect_errors", _positive_int, 100,
           "--listen: consecutive handshake errors (a connection closed, bad or timed out before its credentials were "
           "checked; not a wrong password, never from 127.0.0.1 or ::1, as the servers) after which a client host "
           "is refused with 1129 until FLUSH HOSTS or host_block_time; a good login resets the count", "N"),
    Option("host_block_time", _duration_or_zero, 0.0,
           "--listen: how long a host blocked by max_connect_errors stays blocked (a duration); 0: until an admin "
           "runs FLUSH HOSTS, as the servers", "DURATION"),
    Option("login_failures_threshold", _non_negative_int, 3,
           "--listen: consecutive wrong logins of one account from one host before each further attempt's answer "
           "is delayed (MySQL's connection_control); a good login resets it; 0: no delays", "N"),
    Option("login_min_delay", _duration, 1.0,
           "--listen: the first throttled attempt's delay; each further one adds as much, up to login_max_delay",
           "DURATION"),
    Option("login_max_delay", _duration, 30.0,
           "--listen: the longest delay of a throttled login (keep it below the replicas' slave_net_timeout)",
           "DURATION"),
    Option("handshake_timeout", _positive_float, 10.0,
           "--listen: seconds from accept to a completed login (MySQL's connect_timeout)"),
    Option("net_read_timeout", _positive_float, 30.0,
           "--listen: seconds without a byte while a client's packet is incomplete, then it is dropped (1159)"),
    Option("net_write_timeout", _positive_float, 60.0,
           "--listen: seconds a client may not read what the relay writes, then it is dropped"),
    Option("dump_stop_grace", _duration_or_zero, 5.0,
           "--listen: on a graceful stop (SIGTERM), seconds each running dump may take to finish the transaction it "
           "is sending before it is cut (a MariaDB file/position replica cut inside a statement stops until START "
           "SLAVE); 0: cut at once", "DURATION"),
    Option("sender_processes", _non_negative_int, 0,
           "--listen: worker processes that serve binlog dumps (plain, non-semi-sync connections), so fan-out "
           "uses every core; 0: every dump is served by the relay process", "N"),
    Option("send_threads", _positive_int, 1,
           "--listen: threads that write a horizon advance to the replicas waiting for it (one batch call per "
           "thread, without the GIL; used from 32 such replicas on), so a large fan-out's sends use more cores", "N"),
    Option("http_max_connections", _positive_int, 64,
           "--http: concurrent connections; when all are taken, a newcomer replaces the oldest one without a "
           "complete request (503 only when every one is answering a request)", "N"),
)
OPTION_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass
class RelayConfig:
    """Validated relay settings; ``sources`` says where each value came from (for error messages)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def require(self, *names: str) -> None:
        missing = [OPTION_BY_NAME[n] for n in names if self.values.get(n) is None]
        if missing:
            raise ConfigError(
                "missing required option(s): "
                + ", ".join(f"{o.name} ({o.flag}, {o.env} or {o.name} in --config)" for o in missing)
            )

    def resolved_password(self) -> str:
        if self.values.get("password") is not None:
            return self.values["password"]
        path = self.values.get("password_file")
        if path:
            try:
                return Path(path).read_text().splitlines()[0] if Path(path).stat().st_size else ""
            except OSError as exc:
                raise ConfigError(f"password_file {path!r} ({self.sources.get('password_file')}): {exc.strerror}") from exc
        return ""

    def public_dict(self) -> dict[str, Any]:
        """Every value, secrets masked: safe to log or show."""
        return {
            name: ("***" if OPTION_BY_NAME[name].secret and value is not None else value)
            for name, value in self.values.items()
        }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register --config and one flag per option (defaults stay None so precedence can be applied)."""
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file")
    for o in OPTIONS:
        env_hint = f" [env {o.env}]"
        default_hint = f" (default {o.default})" if o.default is not None else ""
        parser.add_argument(o.flag, dest=o.name, default=None, metavar=o.metavar, help=o.help + default_hint + env_hint)


def load(args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> RelayConfig:
    """Merge defaults, the TOML file, the environment and the flags; convert and validate every value."""
    environ = os.environ if environ is None else environ
    raw: dict[str, tuple[Any, str]] = {o.name: (o.default, "default") for o in OPTIONS}
    config_path = getattr(args, "config", None) if args is not None else None
    config_path = config_path or environ.get(ENV_PREFIX + "CONFIG")
    if config_path:
        try:
            with open(config_path, "rb") as f:
                table = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_path!r}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_path!r} is not valid TOML: {exc}") from exc
        table = table.get("relayproxy", table)
        for key, value in table.items():
            name = key.replace("-", "_")
            if name not in OPTION_BY_NAME:
                raise ConfigError(f"config file {config_path!r}: unknown option {key!r}")
            raw[name] = (value, f"config file {config_path}")
    for o in OPTIONS:
        if o.env in environ:
            raw[o.name] = (environ[o.env], f"environment {o.env}")
    if args is not None:
        for o in OPTIONS:
            value = getattr(args, o.name, None)
            if value is not None:
                raw[o.name] = (value, f"flag {o.flag}")
    cfg = RelayConfig()
    for name, (value, source) in raw.items():
        o = OPTION_BY_NAME[name]
        if value is not None:
            try:
                value = o.convert(value)
            except (TypeError, ValueError) as exc:
                shown = "***" if o.secret else repr(value)
                raise ConfigError(f"invalid {name} {shown} from {source}: {exc}") from None
        cfg.values[name] = value
        cfg.sources[name] = source
    return cfg


__all__ = ["ConfigError", "OPTIONS", "RelayConfig", "add_arguments", "load"]
