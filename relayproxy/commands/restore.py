"""`relayproxy restore --from URL --relay-dir DIR`: rebuild a relay directory from its archive (docs/archive.md).

Every part is downloaded in order and checked against its SHA-256, every sealed file against its manifest's
whole-file SHA-256; a missing or corrupt object ends the restore naming its key, and no relay file is left in
DIR. Then the directory is opened once as `relayproxy run` opens it (recovery) to prove it is usable.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

from . import config

_NUMBERED = re.compile(r"^(.*?)(\d+)$")
SCRATCH = "relayproxy.restore-download"


class RestoreError(Exception):
    """The archive cannot be restored; the message names the object."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="from_url", required=True, metavar="URL",
                        help="the archive: s3://bucket/prefix or file:///path (archive_url of the old relay)")
    parser.add_argument("--keep-local", metavar="SIZE|'N files'",
                        help="download only the newest sealed files up to this size (50G) or count ('20 files'); the "
                             "older ones stay in the bucket as stubs, read back through the cache (archive_keep_local)")
    parser.add_argument("--from-oldest-complete", action="store_true",
                        help="when the oldest files' objects are incomplete (a lifecycle rule expired their parts), "
                             "restore from the first file after them instead of refusing")
    parser.add_argument("--master-password-file", metavar="PATH",
                        help="the replication password of a master chosen by CHANGE MASTER (the archive never holds "
                             "it); without it only the configured master is used")
    config.add_arguments(parser)


def _order(names) -> list[str]:
    def key(name: str):
        m = _NUMBERED.match(name)
        return (m.group(1), int(m.group(2)), name) if m else (name, -1, name)

    return sorted(names, key=key)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config.load(args)
        cfg.require("relay_dir")
    except config.ConfigError as exc:
        print(f"relayproxy restore: {exc}", file=sys.stderr)
        return 2
    relay_dir = Path(cfg.relay_dir)
    if relay_dir.exists() and (not relay_dir.is_dir() or any(relay_dir.iterdir())):
        print(f"relayproxy restore: {relay_dir} is not an empty directory: restore only into a new one",
              file=sys.stderr)
        return 2
    password = None
    if args.master_password_file:
        try:
            text = Path(args.master_password_file).read_text()
        except OSError as exc:
            print(f"relayproxy restore: --master-password-file: {exc.strerror or exc}", file=sys.stderr)
            return 2
        password = text.splitlines()[0] if text else ""
    try:
        from ..relay.conversion import keyring_from_config
        from ..relay.objectstore import display_url, from_config
        from ..relay.remote import parse_keep_local

        bucket = from_config(cfg, url=args.from_url)
        keyring = keyring_from_config(cfg)
        keep_local = parse_keep_local(args.keep_local)
        location = (display_url(args.from_url), display_url(cfg.archive_endpoint) if cfg.archive_endpoint else None,
                    cfg.archive_region)
    except (ValueError, OSError) as exc:
        print(f"relayproxy restore: {exc}", file=sys.stderr)
        return 2
    created = not relay_dir.exists()
    relay_dir.mkdir(parents=True, exist_ok=True)
    try:
        summary = restore(bucket, relay_dir, keyring=keyring, master_password=password, say=print,
                          from_oldest_complete=args.from_oldest_complete, keep_local=keep_local,
                          location=location)
    except Exception as exc:  # noqa: BLE001 - whatever failed, DIR is emptied again and the cause named
        empty_dir(relay_dir, remove=created)
        print(f"relayproxy restore: {exc}", file=sys.stderr)
        return 1
    stubs = f" ({summary['stubs']} of them left in the bucket as stubs)" if summary.get("stubs") else ""
    print(f"restored {summary['files']} files{stubs}, {summary['bytes']} bytes into {relay_dir}; the relay ends at "
          f"{summary['file']}:{summary['position']}, GTID state {summary['gtids'] or '(none)'}")
    print("the archive holds no replication password: relayproxy run takes it from its configuration "
          "(password / password_file)" + (", and the CHANGE MASTER choice from --master-password-file"
                                          if summary["choice_restored"] else ""))
    return 0


def empty_dir(relay_dir: Path, *, remove: bool = False, keep_prefix: str | None = None) -> None:
    """Remove what a failed restore left in ``relay_dir`` (but entries named ``keep_prefix``...), and the
    directory itself with ``remove``."""
    for entry in relay_dir.iterdir():
        if keep_prefix is not None and entry.name.startswith(keep_prefix):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            try:
                entry.unlink()
            except FileNotFoundError:
                pass
    if remove:
        try:
            relay_dir.rmdir()
        except OSError:
            pass


def _listing(keys: list[str]):
    """(BucketFile per file whose parts chain, {name: why} for the others): bucket_files one file at a time."""
    from ..relay.archive import ArchiveError, bucket_files
    from ..relay.remote import FILES_PREFIX

    by_name: dict[str, list[str]] = {}
    for key in keys:
        name = key[len(FILES_PREFIX):].rpartition("/")[0] if key.startswith(FILES_PREFIX) else ""
        if name and "/" not in name:
            by_name.setdefault(name, []).append(key)
    listed, broken = {}, {}
    for name, group in by_name.items():
        try:
            listed.update(bucket_files(group))
        except ArchiveError as exc:
            broken[name] = str(exc)
    return listed, broken


def _problem(bucket, name: str, listed, broken, *, newest: bool) -> str | None:
    """Why file ``name``'s objects cannot be restored (checked before anything is downloaded), or None."""
    from ..relay.remote import ArchiveReadError, manifest_key, part_key, read_manifest

    if name in broken:
        return broken[name]
    have = listed[name]
    if not have.sealed:
        if not newest:
            return f"{manifest_key(name)} is missing: {name} is not the newest file of the archive, so it must be sealed"
    else:
        try:
            _manifest, want = read_manifest(bucket, name)
        except ArchiveReadError as exc:
            return str(exc)
        missing = [key for _s, _e, key, _h in want if (_s, _e) not in set(have.parts)]
        if missing:
            return f"{missing[0]} is missing (named by {manifest_key(name)})"
        if [(a, b) for a, b, _k, _h in want] != list(have.parts):
            return f"{manifest_key(name)} names other parts than the bucket holds for {name}"
    if not have.parts or have.parts[0][0] != 0:
        return (f"{part_key(name, 0, have.parts[0][1]) if have.parts else manifest_key(name)} is missing: {name} has "
                "no part from its start")
    return None


def _restore_sidecars(bucket, relay_dir: Path, name: str) -> None:
    """The file's index sidecars from the bucket, when the uploader put them there (they are checked against the
    file when loaded, and rebuilt when they do not match)."""
    from ..relay import fileindex, txindex
    from ..relay.archive import SIDECAR_LEAVES
    from ..relay.durable import write_file_atomically
    from ..relay.objectstore import ObjectNotFound
    from ..relay.remote import FILES_PREFIX

    paths = {"fileindex": fileindex.sidecar_path(relay_dir, name), "txindex": txindex.sidecar_path(relay_dir, name)}
    for leaf in SIDECAR_LEAVES:
        try:
            data = bucket.get(f"{FILES_PREFIX}{name}/{leaf}")
        except ObjectNotFound:
            continue
        write_file_atomically(paths[leaf], data)


def restore(bucket, relay_dir: Path, *, keyring=None, master_password: str | None = None, say=lambda *_: None,
            from_oldest_complete: bool = False, keep_local: tuple[int | None, int | None] = (None, None),
            location: tuple[str, str | None, str | None] | None = None) -> dict:
    """Rebuild ``relay_dir`` (empty) from ``bucket`` (an ObjectStore); returns a summary. RestoreError (or
    ArchiveError, ObjectStoreError) naming the object at fault; the caller empties the directory then."""
    from ..relay.archive import EPOCHS_KEY, GAPS_PREFIX, HORIZON_KEY, MASTER_KEY, UUID_KEY
    from ..relay.remote import (
        FILES_PREFIX, ArchiveCache, ArchiveReadError, configure, download_parts, manifest_key, part_key, plan_offload,
        read_archive_marker, read_manifest, stub_from_bucket, write_stub,
    )
    from ..relay.closed_files import TMP_SUFFIX
    from ..relay.durable import fsync_dir, write_file_atomically, write_index
    from ..relay.epochs import EPOCHS_NAME
    from ..relay.master_info import FILE_NAME as MASTER_NAME
    from ..relay.objectstore import ObjectNotFound

    try:
        read_archive_marker(bucket)
    except ArchiveReadError as exc:
        raise RestoreError(str(exc)) from None
    listed, broken = _listing([o.key for o in bucket.list(FILES_PREFIX)])
    for key in (o.key for o in bucket.list(GAPS_PREFIX)):  # files the relay purged before the bucket held them
        name = key[len(GAPS_PREFIX):].removesuffix(".json")
        listed.pop(name, None)
        broken[name] = (f"{key}: {name} was purged from the relay before the archive held it whole "
                        "(archive_backlog_max): the history has a gap there")
    names = _order(set(listed) | set(broken))
    if names:
        problems = [(i, _problem(bucket, name, listed, broken, newest=i == len(names) - 1))
                    for i, name in enumerate(names)]
        problems = [(i, why) for i, why in problems if why is not None]
        if problems:
            last, why = problems[-1]
            if not from_oldest_complete or last == len(names) - 1:
                hint = "" if last == len(names) - 1 else (
                    " (a lifecycle rule that expired old parts leaves the oldest files incomplete, a gap leaves the "
                    "files before it: --from-oldest-complete restores from the first file after them)")
                raise RestoreError(why + hint)
            say(f"skipped {last + 1} file(s) {names[0]} to {names[last]} whose objects are incomplete ({why}): the "
                f"restored relay starts at {names[last + 1]}")
            names = names[last + 1:]
    try:
        horizon = json.loads(bucket.get(HORIZON_KEY))
    except ObjectNotFound:
        horizon = {}
    except ValueError as exc:
        raise RestoreError(f"{HORIZON_KEY} is not readable JSON: {exc}") from None
    # horizon.json is written after the parts it names, so it is never ahead of them: what it names must be there.
    hfile, hpos = horizon.get("file"), horizon.get("position")
    if hfile is not None and isinstance(hpos, int):
        have_end = listed[hfile].end if hfile in listed else 0
        if have_end < hpos:
            raise RestoreError(f"{part_key(hfile, have_end, hpos)} is missing: {HORIZON_KEY} says the archive holds "
                               f"{hfile} up to {hpos}, the bucket's parts end at {have_end}")
    if not names:
        raise RestoreError(f"{bucket.url} holds no relay file")
    scratch = relay_dir / SCRATCH
    scratch.mkdir()
    total = 0
    # --keep-local: the older sealed files stay in the bucket, each as a stub (relay/remote.py); the newest ones
    # (and always the newest file) are downloaded.
    sealed = [(name, listed[name].end) for name in names[:-1] if listed[name].sealed]
    stubbed = set(plan_offload(sealed, *keep_local))
    for name in names:
        have = listed[name]
        _restore_sidecars(bucket, relay_dir, name)
        if name in stubbed:
            stub = stub_from_bucket(bucket, name, scratch, location=location or (bucket.url, None, None),
                                    keyring=keyring)
            write_stub(relay_dir, stub)
            total += stub.size
            say(f"{name}: {stub.size} bytes, left in the bucket (a stub: read back through the cache when asked)")
            continue
        manifest = None
        if have.sealed:
            try:
                manifest, want_parts = read_manifest(bucket, name)
            except ArchiveReadError as exc:
                raise RestoreError(str(exc)) from None
            listed_keys = {part_key(name, s, e) for s, e in have.parts}
            for _s, _e, pkey, _sha in want_parts:
                if pkey not in listed_keys:
                    raise RestoreError(f"{pkey} is missing (named by {manifest_key(name)})")
            if [(s, e) for s, e, _k, _h in want_parts] != list(have.parts):
                raise RestoreError(f"{manifest_key(name)} names other parts than the bucket holds for {name}")
        else:
            want_parts = [(s, e, part_key(name, s, e), None) for s, e in have.parts]
        if not want_parts or want_parts[0][0] != 0:
            raise RestoreError(f"{part_key(name, 0, want_parts[0][1]) if want_parts else manifest_key(name)} "
                               f"is missing: {name} has no part from its start")
        target = relay_dir / (name + TMP_SUFFIX)
        with open(target, "wb") as out:
            try:
                whole = download_parts(bucket, name, want_parts, out, scratch, keyring=keyring)
            except ArchiveReadError as exc:
                raise RestoreError(str(exc)) from None
            out.flush()
            os.fsync(out.fileno())
        if manifest is not None:
            if whole.hexdigest() != manifest.get("sha256") or have.end != int(manifest.get("size", -1)):
                raise RestoreError(f"{manifest_key(name)}: the file's SHA-256 or size does not match its parts")
        os.rename(target, relay_dir / name)
        total += have.end
        say(f"{name}: {have.end} bytes, {len(want_parts)} parts" + (", sealed" if have.sealed else
                                                                     ", the newest (ends at the archive horizon)"))
    shutil.rmtree(scratch)
    fsync_dir(relay_dir)
    write_index(relay_dir, names)
    for key, local in ((EPOCHS_KEY, EPOCHS_NAME), (UUID_KEY, "relayproxy.uuid")):
        try:
            write_file_atomically(relay_dir / local, bucket.get(key))
        except ObjectNotFound:
            pass
    choice_restored = False
    try:
        master = json.loads(bucket.get(MASTER_KEY))
    except ObjectNotFound:
        master = None
    except ValueError as exc:
        raise RestoreError(f"{MASTER_KEY} is not readable JSON: {exc}") from None
    if master is not None:
        if master.get("choice") is not None:
            if master_password is None:
                say(f"the CHANGE MASTER choice ({master['choice'].get('host')}:{master['choice'].get('port')}) is "
                    "not restored: its password is not in the archive (--master-password-file restores it)")
                master["choice"] = None
            else:
                master["choice"]["password"] = master_password
                choice_restored = True
        if master.get("choice") is not None or master.get("identity") is not None:
            write_file_atomically(relay_dir / MASTER_NAME, (json.dumps(master, indent=2, sort_keys=True) + "\n")
                                  .encode(), mode=0o600, ignore_umask=True)
    from ..relay.store import RelayStore

    if stubbed:
        configure(relay_dir, ArchiveCache(bucket, relay_dir / "relayproxy.cache", keyring=keyring))
    store = RelayStore.open(relay_dir, create=False)  # recovery, as relayproxy run opens it
    try:
        snap = store.horizon.snapshot()
        summary = {"files": len(names), "bytes": total, "stubs": len(stubbed), "file": snap.file, "position": snap.position,
                   "gtids": snap.text, "archive_horizon": horizon, "choice_restored": choice_restored,
                   "warnings": list(store.warnings)}
    finally:
        store.close()
    if (horizon.get("file"), horizon.get("position")) not in ((None, None), (snap.file, snap.position)):
        say(f"note: the archive's horizon.json says {horizon.get('file')}:{horizon.get('position')}")
    return summary
