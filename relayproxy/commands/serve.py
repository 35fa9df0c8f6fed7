"""`relayproxy serve`: serve an existing directory of binlog files, read-only, to replicas and tools as their master.

The "fake master" users of other relays ask for (Ripple#15, go-mysql#657): point it at a MySQL or MariaDB
binlog directory (a server's, a backup's, a ``mysqlbinlog --raw`` download) or at a relayproxy relay
directory, and replicas, ``mariadb-binlog --read-from-remote-server`` and CDC tools (python-mysql-replication,
go-mysql, Debezium, Maxwell) replicate from it by file/position, MySQL GTID auto-position or MariaDB GTID,
with the same downstream server, SQL layer and dump sender as ``relayproxy run --listen``.

**Read-only.** Nothing in the directory is ever created, written, truncated, renamed, fsynced or deleted:
no recovery runs (``RelayStore.open`` would truncate a partial tail and rewrite the index and durable
mark), ``PURGE BINARY LOGS`` is refused, and the server UUID is derived from the directory's path rather
than stored in it. The directory may be mounted read-only.

**Which files, in which order.** ``--files NAME...`` as given; else ``--index FILE``; else
``relayproxy.index`` (a relay directory); else the one MySQL/MariaDB ``*.index`` file in the directory
(entries like ``./binlog.000001`` or absolute paths: the base names are looked up in the directory; files
missing at the head were purged and are skipped, missing ones after that refuse); else every ``NAME.NNN``
file of the one series in the directory, by number. Consecutive files must continue each
other (the older one's ROTATE names the newer one, or the server's numbering does after a STOP or a
crash, or the newer one's PREVIOUS_GTIDS / GTID_LIST is the older one's GTID set at its end): a file/position
replica would otherwise skip a missing file's transactions without a word. ``--allow-gaps`` serves such a
list anyway (MySQL auto-position replicas still get error 1236 for GTIDs no file holds).

**The horizon.** Every file is scanned with the relay's one scanner and boundary parser
(``reader.scan_file``: CRC32, event structure, transaction groups). Every file but the newest must be whole
and end at a group boundary; the newest is served up to its last complete group (a partial tail, e.g. a
crashed or still-running server's, is simply not served). Damage before a file's end (a CRC mismatch or an
impossible event followed by intact data) refuses to start, naming file and offset; so do events that do
not sit at their ``log_pos`` (a replica's relay log, whose positions are its master's), mixed MySQL/MariaDB
files and files that do not continue each other. The horizon is ``(newest file, its last group boundary,
GTID set there)`` exactly as a relay's.

**--follow** re-reads the newest file (only the bytes appended since the last look, through the same
boundary parser) and the file list every ``--follow-interval`` seconds, so a server's live binlog
directory is served as it grows: complete transactions only, new files once the previous one is whole.

Usage::

    relayproxy serve --binlog-dir /var/lib/mysql --listen 127.0.0.1:3307 --users 'repl:env:REPL_PW' \\
        [--index FILE | --files NAME...] [--server-id N] [--http HOST:PORT] [--tls-cert PEM --tls-key PEM] \\
        [--follow [--follow-interval S]] [--allow-gaps]

``--server-id`` defaults to the server id of the newest file's FORMAT_DESCRIPTION (the files' own
master's), the version replicas see is the files' (``8.0.29-relayproxy-log``; MariaDB's as is), and
``/status`` says ``state: serving files``, ``io_running: false``. The master's variables (``@@binlog_format``,
``@@binlog_row_metadata`` ...) are those a relay directory kept (``relayproxy.master-variables.json``), else NULL:
the files alone do not prove them; ``@@binlog_checksum`` is the newest file's.

In-process: ``cfg, options = load(args)`` then ``await serve(cfg, options, ready=future)``; the future's
result holds the bound addresses, the store and a thread-safe ``stop()``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..binlog.encryption import BinlogKeyError
from ..log import get_logger
from ..relay.decrypted import DecryptedMirror, read_key_file
from ..relay.master_variables import MasterVariablesFile
from ..relay.readonly import (  # noqa: F401  (re-exported: the command's read-only store)
    ReadOnlyBinlogDir,
    ReadOnlyStoreError,
    ServeError,
    ServeOptions,
    list_binlog_files,
)
from ..ops.status import NoUpstream, StatusSources
from . import config

log = get_logger("relayproxy.serve")

__all__ = [
    "ServeError",
    "ServeOptions",
    "ReadOnlyBinlogDir",
    "ReadOnlyStoreError",
    "no_upstream",
    "list_binlog_files",
    "add_arguments",
    "load",
    "run",
    "serve",
]

BINLOG_DIR_ENV = config.ENV_PREFIX + "BINLOG_DIR"
STATE = "serving files"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser)
    if "binlog_dir" not in config.OPTION_BY_NAME:
        # Until the option joins config.OPTIONS (then it also works in TOML): flag, else environment.
        parser.add_argument(
            "--binlog-dir", dest="binlog_dir", default=None, metavar="DIR",
            help=f"directory of the binlog files to serve, read-only [env {BINLOG_DIR_ENV}]",
        )
    parser.add_argument(
        "--index", metavar="FILE",
        help="MySQL/MariaDB binlog index file giving the order (default: relayproxy.index, else the one *.index "
             "in --binlog-dir, else file names by number)",
    )
    parser.add_argument("--files", nargs="+", metavar="NAME", help="serve exactly these files of --binlog-dir, oldest first")
    parser.add_argument("--follow", action="store_true",
                        help="keep re-reading the newest file and the file list: serve files that grow")
    parser.add_argument("--follow-interval", type=float, default=1.0, metavar="SECONDS",
                        help="how often --follow looks (default 1.0)")
    parser.add_argument("--allow-gaps", action="store_true",
                        help="serve files that do not continue each other (a file/position replica skips the gap)")


def load(args: argparse.Namespace, environ: dict[str, str] | None = None) -> tuple[config.RelayConfig, ServeOptions]:
    """The relay configuration (listen, users, TLS, http, server_id ...) and what to serve."""
    environ = os.environ if environ is None else environ
    cfg = config.load(args, environ)
    cfg.require("listen", "users")
    retention = [name for name in ("retention_max_age", "retention_max_bytes", "retention_max_files", "retention_force")
                 if cfg.values.get(name) and cfg.sources.get(name) != "default"]
    if retention:
        raise config.ConfigError(
            f"relayproxy serve is read-only and never purges the files it serves: {', '.join(retention)} "
            f"({cfg.sources[retention[0]]}) only apply to relayproxy run"
        )
    if "binlog_dir" in config.OPTION_BY_NAME:
        cfg.require("binlog_dir")
        binlog_dir = cfg.binlog_dir
    else:
        binlog_dir = getattr(args, "binlog_dir", None) or environ.get(BINLOG_DIR_ENV)
        if not binlog_dir:
            raise config.ConfigError(f"missing required option: binlog_dir (--binlog-dir or {BINLOG_DIR_ENV})")
    interval = getattr(args, "follow_interval", 1.0)
    if interval is None or interval <= 0:
        raise config.ConfigError(f"--follow-interval must be a positive number of seconds, got {interval!r}")
    files = getattr(args, "files", None)
    if files is not None and getattr(args, "index", None):
        raise config.ConfigError("--files and --index both give the file order: use one")
    options = ServeOptions(
        binlog_dir=Path(binlog_dir),
        index=Path(args.index) if getattr(args, "index", None) else None,
        files=tuple(files) if files else None,
        follow=bool(getattr(args, "follow", False)),
        follow_interval=float(interval),
        allow_gaps=bool(getattr(args, "allow_gaps", False)),
    )
    return cfg, options


# ---------------------------------------------------------------------------------------------
# Which files, in which order


# ---------------------------------------------------------------------------------------------
# No upstream


def no_upstream(store: ReadOnlyBinlogDir) -> NoUpstream:
    """What ``serve`` says where ``run`` has an upstream session: serving files, the files' flavour and version.

    The master's variables (@@binlog_format, @@binlog_row_metadata ...): a relay directory keeps what its master
    said (relayproxy.master-variables.json, read only here). A server's own binlog directory has no such file, and
    the files do not prove them: a file of row events alone may come from a MIXED master, and TABLE_MAP metadata
    shows what one event carries, not the server's setting. So they are NULL; binlog_checksum and the version come
    from the newest file's FORMAT_DESCRIPTION (sql/variables.py)."""
    fde = store.format_description
    upstream = NoUpstream(state=STATE, master_flavour=store.flavour,
                          master_server_version=fde.server_version if fde is not None else None)
    known = MasterVariablesFile(Path(store.binlog_dir))
    variables = known.load()
    upstream.master_variables_error = known.error
    if variables is not None:
        upstream.master_variables = dict(variables.values)
        upstream.master_variables_source = variables.describe()
    return upstream


def server_uuid_for(binlog_dir: Path) -> str:
    """A stable server UUID for a served directory, derived from its path (nothing is stored in it)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "relayproxy-serve:" + os.path.realpath(binlog_dir)))


# ---------------------------------------------------------------------------------------------
# Running


def run(args: argparse.Namespace) -> int:
    from .run import RelayStartupError

    try:
        cfg, options = load(args)
    except config.ConfigError as exc:
        print(f"relayproxy serve: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run if hasattr(uvloop, "run") else asyncio.run
    try:
        return runner(serve(cfg, options))
    except (ServeError, RelayStartupError) as exc:
        print(f"relayproxy serve: {exc}", file=sys.stderr)
        return 1


async def serve(cfg, options: ServeOptions, *, ready: "asyncio.Future | None" = None) -> int:
    """Serve ``options.binlog_dir`` on ``cfg.listen`` until SIGTERM/SIGINT, ``stop()`` or cancellation."""
    from ..ops.http import DEFAULT_HTTP_MAX_CONNECTIONS, HttpApi
    from ..ops.status import relay_status
    from ..relay import closed_files
    from ..relay.conversion import keyring_from_config
    from .run import RelayStartupError, SessionRelayView, downstream_server, settle_gc

    try:  # closed files of a relay directory may be encrypted (encryption_key_file / encryption_key_env)
        closed_files.configure(options.binlog_dir, keyring=keyring_from_config(cfg))
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    mirror = None
    if cfg.values.get("binlog_key_file"):
        mirror = await asyncio.to_thread(_open_mirror, cfg, options)
        served = replace(options, binlog_dir=mirror.target)
    else:
        served = options
    try:
        store = await asyncio.to_thread(ReadOnlyBinlogDir.open, served)
    except BaseException:
        if mirror is not None:
            mirror.close()
        raise
    if cfg.values.get("server_id") is None:
        # As their master: the server id the files were written with (a replica refuses its own id).
        cfg.values["server_id"] = store.server_id or 1
        cfg.sources["server_id"] = f"FORMAT_DESCRIPTION_EVENT of {store.current_file}"
    upstream = no_upstream(store)
    view = SessionRelayView(cfg, lambda: store, lambda: upstream, server_uuid=server_uuid_for(options.binlog_dir))
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stopping.set)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (tests, embedding): stop() ends it

    def status() -> dict[str, Any]:
        doc = relay_status(cfg, StatusSources(store=store, upstream=upstream, downstream=downstream))
        doc.update(
            relay_dir=str(options.binlog_dir),
            mode="serve",
            binlog_dir=str(options.binlog_dir),
            file_order=store.order_source,
            follow=options.follow,
            follow_error=store.follow_error,
        )
        return doc

    http = downstream = follower = None
    try:
        address = None
        if cfg.http:
            http = HttpApi(status, max_connections=getattr(cfg, "http_max_connections", None)
                           or DEFAULT_HTTP_MAX_CONNECTIONS)
            try:
                address = await http.start(*cfg.http)
            except OSError as exc:
                raise RelayStartupError(f"cannot listen on --http {cfg.http[0]}:{cfg.http[1]}: {exc.strerror}") from exc
        downstream = downstream_server(cfg, view, status_document=lambda: relay_status(
            cfg, StatusSources(store=store, upstream=upstream)), replication=None)
        try:
            listen_address = await downstream.start(*cfg.listen)
        except OSError as exc:
            raise RelayStartupError(f"cannot listen on --listen {cfg.listen[0]}:{cfg.listen[1]}: {exc.strerror}") from exc
        if options.follow:
            follower = asyncio.create_task(_follow(store, options.follow_interval, mirror), name="serve-follow")
        if ready is not None and not ready.done():
            ready.set_result({
                "http": address, "listen": listen_address, "store": store, "upstream": upstream, "mirror": mirror,
                "status": status, "downstream": downstream, "stop": lambda: loop.call_soon_threadsafe(stopping.set),
            })
        elif ready is None:
            settle_gc()
        await stopping.wait()
    finally:
        if follower is not None:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        if downstream is not None:
            await downstream.close()
        if http is not None:
            await http.close()
        store.close()
        if mirror is not None:
            mirror.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
    return 0


def _open_mirror(cfg, options: ServeOptions) -> DecryptedMirror:
    """Plain copies of an encrypt_binlog=ON directory (relay/decrypted.py); ServeError names a missing or wrong key."""
    key_file = cfg.values["binlog_key_file"]
    try:
        keys = read_key_file(key_file, cfg.values.get("binlog_key_file_key"))
        mirror = DecryptedMirror(options.binlog_dir, keys, key_source=key_file,
                                 algorithm=cfg.values.get("binlog_key_algorithm") or "aes_cbc",
                                 target=cfg.values.get("decrypted_dir"))
    except BinlogKeyError as exc:
        raise ServeError(f"cannot serve {options.binlog_dir}: {exc}") from None
    try:
        mirror.sync()
    except (BinlogKeyError, OSError) as exc:
        mirror.close()
        raise ServeError(f"cannot serve {options.binlog_dir}: {exc}") from None
    log.info("serving decrypted copies of encrypted binlogs", binlog_dir=str(options.binlog_dir),
             decrypted_dir=str(mirror.target), encrypted_files=len(mirror.encrypted_files), key_file=key_file)
    return mirror


async def _follow(store: ReadOnlyBinlogDir, interval: float, mirror: DecryptedMirror | None = None) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            if mirror is not None:
                await asyncio.to_thread(mirror.sync)
            publish = await asyncio.to_thread(store.poll)
        except Exception:  # a bug must not stop serving what is already there
            log.exception("following the binlog directory failed")
            continue
        store.apply(publish)


def main(argv: list[str] | None = None) -> int:
    """``python -m relayproxy.commands.serve ...`` (before the subcommand is registered in cli.py)."""
    from ..log import configure_logging

    parser = argparse.ArgumentParser(prog="relayproxy serve", description=__doc__.splitlines()[0])
    parser.add_argument("--log-format", choices=("auto", "json", "console"), default="auto")
    parser.add_argument("--log-level", default="info")
    add_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging(fmt=args.log_format, level=args.log_level)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
