"""`relayproxy find` (a transaction by GTID, time or table, from the transaction indexes) and `relayproxy index`
(build or rebuild those indexes from the relay files alone)."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from ..relay import txindex
from ..relay.closed_files import StoredFileError, locate
from ..relay.durable import read_durable_mark, read_index
from .run import DirectoryLocked, hold_relay_dir


FIND_EPILOG = """\
exit status: 0 found, 1 not found (the history the index covers is printed), 2 bad input (a GTID or time that
does not parse, an unknown zone, no relay directory)

A time is 'YYYY-MM-DD HH:MM:SS[.ffffff]' with an optional zone (Z, UTC or +HH:MM); without one it is read in
--time-zone, else in the machine's local zone, and the zone assumed is printed. --time gives the first
transaction in binlog order whose commit time is at or after it (timestamps that go backwards cannot misdirect
it: the search follows the running maximum of commit times). Commit times are MySQL's
immediate_commit_timestamp (microseconds) where the master wrote one, else the whole second of the event that
ends the transaction (marked second resolution)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = FIND_EPILOG
    parser.add_argument("--relay-dir", required=True, metavar="DIR", help="the relay directory (read only)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--gtid", metavar="G", help="the transaction of this GTID (D-S-N or uuid[:tag]:N)")
    what.add_argument("--time", metavar="T", help="the first transaction committed at or after T")
    what.add_argument("--table", metavar="DB.TABLE", help="the transactions touching DB.TABLE between --from and --to")
    parser.add_argument("--from", dest="from_time", metavar="T1", help="with --table: from this time (inclusive)")
    parser.add_argument("--to", dest="to_time", metavar="T2", help="with --table: to this time (inclusive)")
    parser.add_argument("--limit", type=int, default=1000, help="with --table: at most this many (default 1000)")
    parser.add_argument("--time-zone", metavar="ZONE", help="zone of times given without one (default: local)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_index_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--relay-dir", required=True, metavar="DIR", help="the relay directory")
    parser.add_argument("--rebuild", action="store_true", help="rebuild every sidecar from the files alone")
    parser.add_argument("--file", metavar="NAME", help="only this relay file")
    parser.add_argument("--json", action="store_true", help="print JSON")


# ---------------------------------------------------------------------------------------------


def _files(relay_dir: Path) -> list[str]:
    names = read_index(relay_dir)
    if names is None:
        raise ValueError(f"{relay_dir} holds no relay index (relayproxy.index): not a relay directory")
    return [n for n in names if locate(relay_dir / n) is not None]


def _horizon(relay_dir: Path, files: list[str]) -> tuple[str | None, int]:
    """The newest file and how far it is durable: the durable mark's position when it names that file, else its
    size (the scanner stops at the last complete transaction either way)."""
    if not files:
        return None, 4
    last = files[-1]
    from ..relay.closed_files import logical_size

    size = logical_size(relay_dir / last)
    mark, _why = read_durable_mark(relay_dir)
    if mark is not None and mark.file == last:
        return last, min(size, mark.position)
    return last, size


def open_index(relay_dir) -> txindex.TransactionIndex:
    """A read-only TransactionIndex over a relay directory as it is on disk (another process may be writing it)."""
    relay_dir = Path(relay_dir)

    def files():
        return _files(relay_dir)

    def horizon():
        return _horizon(relay_dir, files())

    return txindex.TransactionIndex(relay_dir, files, horizon, writable=False)


def _row(t: txindex.Transaction) -> dict:
    d = asdict(t)
    d["tables"] = list(t.tables)
    d["commit_time_utc"] = txindex.format_time_utc(t.commit_us)
    return d


def _line(t: txindex.Transaction) -> str:
    res = " (second resolution)" if t.second_resolution else ""
    tables = ",".join(t.tables) or "-"
    return (f"{t.file}:{t.start}-{t.end}  gtid {t.gtid or '(anonymous)'}  committed "
            f"{txindex.format_time_utc(t.commit_us)} UTC{res}  tables {tables}")


def _time(text: str, zone, label: str) -> int:
    us = txindex.parse_time(text, zone)
    if not txindex.time_has_zone(text):
        name = zone if zone is not None else (_dt.datetime.now().astimezone().tzname() or "local")
        print(f"relayproxy find: {label} {text!r} has no zone: read in {name}"
              f"{'' if zone is not None else ' (the local zone; --time-zone to choose)'}", file=sys.stderr)
    return us


def run(args: argparse.Namespace) -> int:
    relay_dir = Path(args.relay_dir)
    zone = args.time_zone
    try:
        if zone is not None:
            txindex.zone_of(zone)
        if not relay_dir.is_dir():
            raise ValueError(f"{relay_dir} is not a directory")
        index = open_index(relay_dir)
        _files(relay_dir)
        if args.gtid is not None:
            found = index.by_gtid(args.gtid)
            results = [found] if found else []
        elif args.time is not None:
            found = index.first_at_or_after(_time(args.time, zone, "--time"))
            results = [found] if found else []
        else:
            if args.from_time is None or args.to_time is None:
                raise ValueError("--table needs --from and --to")
            lo = _time(args.from_time, zone, "--from")
            hi = _time(args.to_time, zone, "--to")
            if args.limit < 1:
                raise ValueError("--limit must be at least 1")
            results = index.touching(args.table, lo, hi, args.limit)
    except ValueError as exc:
        print(f"relayproxy find: {exc}", file=sys.stderr)
        return 2
    except (OSError, StoredFileError, txindex.TxIndexError) as exc:
        print(f"relayproxy find: cannot read the relay directory: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([_row(t) for t in results], indent=2))
    else:
        for t in results:
            print(_line(t))
    if results:
        return 0
    first, last = index.first(), index.last()
    if first is None:
        print("relayproxy find: not found: the relay directory holds no transaction", file=sys.stderr)
    else:
        print(f"relayproxy find: not found. The history starts at {first.file}:{first.start} "
              f"({first.gtid or 'anonymous'}, {txindex.format_time_utc(first.commit_us)} UTC) and ends at "
              f"{last.file}:{last.end} ({last.gtid or 'anonymous'}, {txindex.format_time_utc(last.commit_us)} UTC)",
              file=sys.stderr)
    return 1


def _lock(relay_dir: Path) -> int:
    try:
        return hold_relay_dir(relay_dir)
    except DirectoryLocked as exc:
        raise RuntimeError(
            f"relay directory {relay_dir} is in use by a running relay (pid {exc.holder}): it keeps the transaction "
            "indexes itself (rebuilding any that does not match); stop it to rebuild them here, or use "
            "relayproxy find, which only reads") from None


def run_index(args: argparse.Namespace) -> int:
    relay_dir = Path(args.relay_dir)
    try:
        files = _files(relay_dir)
        if args.file is not None and args.file not in files:
            raise ValueError(f"{args.file!r} is not a relay file of {relay_dir}")
    except ValueError as exc:
        print(f"relayproxy index: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"relayproxy index: cannot read {relay_dir}: {exc}", file=sys.stderr)
        return 2
    try:
        fd = _lock(relay_dir)
    except RuntimeError as exc:
        print(f"relayproxy index: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"relayproxy index: cannot lock {relay_dir}: {exc}", file=sys.stderr)
        return 2
    rows = []
    status = 0
    try:
        txindex.clean_leftovers(relay_dir)
        for i, name in enumerate(files):
            if args.file is not None and name != args.file:
                continue
            closed = i < len(files) - 1
            try:
                if args.rebuild:
                    action = "rebuilt"
                    txindex.rebuild(relay_dir, name, closed=closed)
                elif closed:
                    action = "built" if txindex.finish_closed(relay_dir, name) else "ok"
                else:
                    side, why = txindex.load(relay_dir, name)
                    action = "ok"
                    if side is None:
                        txindex.rebuild(relay_dir, name, closed=False)
                        action = "built" if why == "no index" else f"rebuilt ({why})"
                side, why = txindex.load(relay_dir, name)
                stored = txindex.sidecar_path(relay_dir, name).stat().st_size
                from ..relay.closed_files import logical_size

                size = logical_size(relay_dir / name)
                rows.append({"file": name, "action": action, "transactions": side.transactions if side else 0,
                             "bytes": size, "index_bytes": stored,
                             "ratio": round(stored / size, 5) if size else 0.0})
            except (OSError, StoredFileError, txindex.TxIndexError) as exc:
                rows.append({"file": name, "action": f"failed: {exc}"})
                status = 1
    finally:
        os.close(fd)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            if "transactions" in r:
                print(f"{r['file']}: {r['action']}, {r['transactions']} transactions, index {r['index_bytes']} bytes "
                      f"({100 * r['ratio']:.2f} % of {r['bytes']})")
            else:
                print(f"{r['file']}: {r['action']}")
    return status
