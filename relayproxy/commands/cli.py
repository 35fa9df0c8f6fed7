"""The `relayproxy` command line: one subcommand per job, each implemented in its own module."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help). Each module exposes add_arguments(parser) and run(args) -> int.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("relayproxy.commands.inspect", "walk binlog or relay-log files: events, transaction groups, CRCs"),
    "run": ("relayproxy.commands.run", "replicate from a master into durable relay files (the relay)"),
    "serve": ("relayproxy.commands.serve", "serve existing binlog files read-only to replicas and tools, as their master"),
    "status": ("relayproxy.commands.status", "show a running relay's horizon and upstream health"),
    "promote": (
        "relayproxy.commands.promote",
        "after the master died: catch a candidate up from the relays, promote it, repoint relays and replicas",
    ),
    "find": ("relayproxy.commands.find", "find a transaction in the relay files by GTID, commit time or table"),
    "index": ("relayproxy.commands.index", "build or rebuild the relay files' transaction indexes (relay stopped)"),
    "pitr": (
        "relayproxy.commands.pitr",
        "point-in-time recovery: replay a restored backup from the relay to an exact GTID or time, resumable",
    ),
    "restore": ("relayproxy.commands.restore", "rebuild a relay directory from its archive (archive_url's bucket)"),
    "demo": (
        "relayproxy.commands.demo",
        "local master, relay and replicas: a live workload, then a master crash mid-transaction, side by side",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="relayproxy",
        description="MySQL/MariaDB binlog relay that advertises and serves only complete, durable transactions.",
    )
    parser.add_argument("--version", action="version", version=f"relayproxy {__version__}")
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="log output format (auto: console on a terminal, JSON otherwise)",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(sp)
        sp.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ..log import configure_logging
    from ..relay import remote  # noqa: F401 - registers how offloaded relay files are read back (any command)

    configure_logging(fmt=args.log_format, level=args.log_level)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
