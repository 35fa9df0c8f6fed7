"""`relayproxy inspect`: walk binlog / relay-log files and report events, groups, CRCs and GTID sets."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TextIO

from ..binlog import constants as C
from ..binlog.encryption import ALGORITHMS, BinlogKeyError, DecryptingStream
from ..binlog.events import BinlogFormatError, FormatDescription
from ..binlog.gtid import boundary_gtid_text
from ..binlog.reader import ScannedEvent, ScannedGroup, ScanResult, scan_file
from ..relay import closed_files, fileindex
from ..relay.conversion import keyring_from_config

KEY_FILE_KEY_ENV = "RELAYPROXY_BINLOG_KEY_FILE_KEY"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="binlog or relay-log files")
    parser.add_argument("--json", action="store_true", help="one JSON object per file per line")
    parser.add_argument("--summary", action="store_true",
                        help="human output without the per-event listing, with each file's SHA-256")
    parser.add_argument("--no-verify", action="store_true", help="do not verify CRC32 checksums")
    parser.add_argument("--encryption-key-file", metavar="PATH",
                        help="keys of encrypted relay files ('<id>:<64 hex digits>' a line; encrypt_at_rest)")
    parser.add_argument("--encryption-key-env", metavar="VAR", help="environment variable holding those keys")
    parser.add_argument("--binlog-key-file", metavar="PATH",
                        help="MariaDB files written with encrypt_binlog=ON: the server's key file "
                             "(file_key_management_filename); the events are shown decrypted")
    parser.add_argument("--binlog-key-file-key", metavar="SECRET",
                        help="the key file's file key when it is encrypted (file_key_management_filekey: the "
                             f"secret, or FILE:<path>) [env {KEY_FILE_KEY_ENV}]")
    parser.add_argument("--binlog-key-algorithm", choices=ALGORITHMS, default="aes_cbc",
                        help="the server's file_key_management_encryption_algorithm (default aes_cbc)")


def run(args: argparse.Namespace) -> int:
    global _keyring
    try:
        _keyring = keyring_from_config(args)  # the relay's own encrypted closed files (encrypt_at_rest)
    except ValueError as exc:
        print(f"relayproxy inspect: {exc}", file=sys.stderr)
        return 2
    keys = None
    key_file = getattr(args, "binlog_key_file", None)
    if key_file:
        from ..relay.decrypted import read_key_file

        filekey = getattr(args, "binlog_key_file_key", None) or os.environ.get(KEY_FILE_KEY_ENV)
        try:
            keys = read_key_file(key_file, filekey)
        except BinlogKeyError as exc:
            print(f"relayproxy inspect: {exc}", file=sys.stderr)
            return 2
    decrypt = None if keys is None else {"keys": keys, "key_source": key_file,
                                         "algorithm": getattr(args, "binlog_key_algorithm", "aes_cbc")}
    all_ok = True
    for path in args.files:
        if args.json:
            result = _scan(path, verify=not args.no_verify, decrypt=decrypt)
            doc = result_to_json(result)
            doc.update(file_digest(path, result, decrypt))
            print(json.dumps(doc), flush=True)
        else:
            result = _print_human(path, verify=not args.no_verify, events=not args.summary, out=sys.stdout,
                                  decrypt=decrypt, digest=args.summary)
        all_ok = all_ok and result.ok
    return 0 if all_ok else 1


_keyring = None  # from --encryption-key-file / --encryption-key-env


def _scan(path: str, verify: bool, decrypt: dict | None = None, **callbacks) -> ScanResult:
    """Scan a binlog or relay file. A relay file compressed, encrypted (``NAME.rpz``) or archived is read as its
    logical bytes (``relay/closed_files.py``), given as ``DIR/NAME`` or ``DIR/NAME.rpz``; a MariaDB file written
    with encrypt_binlog=ON is decrypted with ``decrypt`` (the server's key file)."""
    try:
        target = Path(path)
        if target.name.endswith(closed_files.SUFFIX):
            target = target.with_name(closed_files.logical_name(target.name))
        stored = closed_files.locate(target)
        if stored is not None and stored != target:
            return closed_files.scan(target, keyring=_keyring, verify_checksums=verify, **callbacks)
    except OSError as exc:
        return ScanResult(path=path, error=f"cannot read file: {exc.strerror or exc}")
    except closed_files.StoredFileError as exc:
        return ScanResult(path=path, error=f"cannot read file: {exc}")
    stream = None
    if decrypt is not None:
        stream = DecryptingStream(decrypt["keys"], algorithm=decrypt["algorithm"], key_source=decrypt["key_source"],
                                  file=path)
    try:
        return scan_file(path, verify_checksums=verify, decrypt=stream, **callbacks)
    except OSError as exc:
        return ScanResult(path=path, error=f"cannot read file: {exc.strerror or exc}")
    except BinlogKeyError as exc:
        return ScanResult(path=path, error=str(exc))


format_gtid = boundary_gtid_text  # the name this module has exported


def result_to_json(r: ScanResult) -> dict:
    """The stable JSON shape of one file's report (documented in the README)."""
    gtid_set_after = None
    if r.gtids_after is not None:
        fmt = getattr(r.gtids_after, "format", None)
        gtid_set_after = fmt(separator=",") if callable(fmt) and r.flavour == "mysql" else str(r.gtids_after)
    return {
        "file": r.path,
        "server_version": r.server_version,
        "flavour": r.flavour if r.fde else None,
        "checksum": r.checksum,
        "in_use": r.in_use,
        "events": r.events,
        "bytes": r.bytes,
        "counts_by_type": {str(k): v for k, v in sorted(r.counts_by_type.items())},
        "crc_errors": r.crc_errors,
        "groups_complete": r.groups_complete,
        "groups_abandoned": r.groups_abandoned,
        "partial_tail": r.partial_tail,
        "truncated_event": r.truncated_event,
        "good_end": r.good_end,
        "gtid_set_after": gtid_set_after,
        "boundary_warnings": r.warnings,
        "error": r.error,
    }


def _event_info(ev: ScannedEvent, fde: FormatDescription | None) -> str:
    """Short human description of an event (GTID, start of query, rotate target...)."""
    if fde is None or ev.type_code == C.FORMAT_DESCRIPTION_EVENT:
        if ev.type_code == C.FORMAT_DESCRIPTION_EVENT:
            try:
                f = FormatDescription.parse(ev.data, 0, ev.size if not ev.streamed else len(ev.data))
                return f"server {f.server_version}, checksum {f.checksum_name or 'n/a'}" + (
                    ", in use" if f.in_use else ""
                )
            except (BinlogFormatError, ValueError) as exc:
                return f"undecodable: {exc}"
        return ""
    if ev.streamed:
        return "(large event: head only)"
    try:
        from ..binlog.views import view_event

        return view_event(ev.data, 0, fde).describe()
    except (BinlogFormatError, ValueError) as exc:
        return f"undecodable: {exc}"


def file_digest(path: str, r: ScanResult, decrypt: dict | None = None) -> dict:
    """``{"sha256", "sha256_bytes", "size"}`` of a file's logical bytes (a relay file in any storage form) up to the
    end of its last complete transaction (``good_end``: all of a closed file; for the file a relay is writing, what
    a recovery would keep, so two relays compare what both made durable). ``sha256`` is None when the file cannot
    be read or is an ``encrypt_binlog`` file read through a key file (its plain bytes are not on disk)."""
    out = {"sha256": None, "sha256_bytes": None, "size": None}
    if decrypt is not None or r.fde is None:
        return out
    target = Path(path)
    if target.name.endswith(closed_files.SUFFIX):
        target = target.with_name(closed_files.logical_name(target.name))
    try:
        out["size"] = closed_files.logical_size(target)
        out["sha256"], out["sha256_bytes"] = fileindex.sha256_of(target, max(r.good_end, 4), keyring=_keyring)
    except (OSError, closed_files.StoredFileError, fileindex.FileIndexError):
        pass
    return out


def _print_human(path: str, *, verify: bool, events: bool, out: TextIO, decrypt: dict | None = None,
                 digest: bool = False) -> ScanResult:
    state = {"fde": None}
    print(f"== {path}", file=out)
    if events:
        print(f"{'offset':>10}  {'type':<22} {'size':>8} {'server_id':>10} {'log_pos':>10}  {'crc':<4} info", file=out)

    def on_event(ev: ScannedEvent) -> None:
        if ev.type_code == C.FORMAT_DESCRIPTION_EVENT:
            try:
                state["fde"] = FormatDescription.parse(ev.data, 0, len(ev.data))
            except (BinlogFormatError, ValueError):
                pass
        if not events:
            return
        crc = {None: "-", True: "ok", False: "BAD"}[ev.crc_ok]
        info = _event_info(ev, state["fde"])
        print(
            f"{ev.offset:>10}  {ev.name:<22} {ev.size:>8} {ev.server_id:>10} {ev.log_pos:>10}  {crc:<4} {info}",
            file=out,
        )

    def on_group(g: ScannedGroup) -> None:
        status = "complete" if g.complete else ("abandoned" if g.abandoned else "PARTIAL (unfinished at end of file)")
        gtid = format_gtid(g.gtid) or "no GTID"
        line = f"[{g.start}, {g.end}) {g.events} events, {gtid}, {status}"
        print(f"{'':>10}  -- group {line}" if events else f"  group {line}", file=out)

    r = _scan(path, verify, decrypt, on_event=on_event, on_group=on_group)
    version = r.server_version or "unknown"
    print(
        f"summary: server {version} ({r.flavour}), checksum {r.checksum or 'n/a'}, "
        f"{'in use (not closed cleanly)' if r.in_use else 'closed'}; {r.events} events, {r.bytes} bytes; "
        f"{r.groups_complete} complete groups, {r.groups_abandoned} abandoned; "
        f"partial tail: {'yes' if r.partial_tail else 'no'}; CRC errors: {r.crc_errors}",
        file=out,
    )
    j = result_to_json(r)
    if j["gtid_set_after"] is not None:
        print(f"GTID set after this file: {j['gtid_set_after'] or '(empty)'}", file=out)
    if digest:
        d = file_digest(path, r, decrypt)
        if d["sha256"] is not None:
            whole = "all" if d["sha256_bytes"] == d["size"] else f"the first {d['sha256_bytes']} (the last complete " \
                "transaction's end) of"
            print(f"sha256: {d['sha256']} ({whole} {d['size']} bytes)", file=out)
    for w in r.warnings:
        print(f"warning: {w}", file=out)
    if r.error:
        print(f"error: {r.error}", file=out)
    print(file=out)
    return r


__all__ = ["add_arguments", "run", "result_to_json", "format_gtid"]
