"""The relay's history in object storage (``archive_url``): what to upload next (sans-I/O planning) and the
``relay-archive`` thread that uploads it as the horizon advances.

Bucket layout, under the URL's prefix (``relay/objectstore.py``; readable without relayproxy)::

    relayproxy-archive.json               {"format": "relayproxy-archive", "version": 1, "flavour", "relay_uuid",
                                           "created"}
    files/<name>/part.<start:020d>-<end:020d>
                                          the master's bytes [start, end) of relay file <name>; immutable, each
                                          ending at a transaction boundary the store had made durable (never
                                          past the horizon); the first starts at 0 (the magic); a file closed
                                          before any of it was uploaded goes up as one part [0, size).
                                          Object metadata: sha256 (of the master's bytes), size, encoding
                                          (plain | framed), compression (none | zstd), encryption
                                          (none | aes-256-gcm:<key id>). A framed payload is
                                          relay/closed_files.py's framed format over the part's bytes.
    files/<name>/manifest.json            written once the file is closed and all its parts are up, last (a file
                                          with a manifest is sealed): {"format": "relayproxy-archive-file",
                                          "version": 1, "name", "size", "sha256" (of the whole file's bytes),
                                          "parts": [{"key", "start", "end", "sha256"}, ...]}
    state/epochs.json                     relayproxy.epochs as the relay has it
    state/master.json                     relayproxy.master.json WITHOUT the password
    state/uuid                            relayproxy.uuid (the relay's replica UUID)
    horizon.json                          the archive horizon: {"format": "relayproxy-archive-horizon",
                                          "version": 1, "file", "position", "gtids" (the store's horizon text at
                                          that position; null when the part ended a closed file and the state
                                          there was not observed), "updated"}, rewritten at most every
                                          HORIZON_EVERY seconds, at each seal and at each file's first part:
                                          never ahead of the parts

The thread (``ArchiveUploader``) reads only ``files()`` and ``horizon()`` (immutable values) and the files
themselves: ingest and replicas never wait for it. On start it lists the bucket (resume: nothing is uploaded
twice) and checks the parts of every file it has locally and has not sealed against the local bytes; a part or
manifest that disagrees is an error naming the object, never overwritten. A failed step is retried with backoff;
its state (ok, retrying, failing) changes with one log line each. Retention holds every file not sealed in the
bucket (``first_unsealed``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from ..log import get_logger
from . import closed_files as CF
from .horizon import HorizonSnapshot
from .objectstore import ObjectNotFound, ObjectStore, ObjectStoreError
from .remote import (
    ARCHIVE_KEY, FILES_PREFIX, FORMAT, MANIFEST, VERSION, ArchiveCache, ArchiveReadError, decode_part, manifest_key,
    offload_file, part_key, plan_offload, read_manifest,
)

log = get_logger(__name__)

HORIZON_KEY = "horizon.json"
EPOCHS_KEY = "state/epochs.json"
MASTER_KEY = "state/master.json"
UUID_KEY = "state/uuid"
SIDECAR_LEAVES = ("fileindex", "txindex")  # files/<name>/<leaf>: the file's index sidecars, once complete
GAPS_PREFIX = "gaps/"  # gaps/<name>.json: a file retention purged before the bucket held it whole (backlog_max)
SCRATCH_DIR = "relayproxy.archive-upload"  # temporary part payloads, in the relay directory (never in /tmp)
IN_MEMORY_PART = 8 << 20  # a plain part up to this size is uploaded from memory
FAILING_AFTER = 30.0  # seconds of consecutive failures before the state is "failing"
STALLED_AFTER = 10.0  # seconds a pass may wait on the bucket before the state says "retrying" (a hung bucket)
HORIZON_EVERY = 10.0  # seconds between rewrites of horizon.json (at most; also at each seal and first part)
MAX_BACKOFF = 10.0
_CHUNK = 1 << 20
_PART = re.compile(r"^part\.(\d{20})-(\d{20})$")

STATE_OK, STATE_RETRYING, STATE_FAILING, STATE_STARTING = "ok", "retrying", "failing", "starting"


class ArchiveError(ValueError):
    """The bucket disagrees with the relay (a part or manifest whose bytes differ, parts that do not chain, an
    archive of another relay) or cannot be read back whole; the message names the object key."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key




# ---------------------------------------------------------------------------------------------
# What the bucket holds (sans-I/O)


@dataclass(frozen=True)
class BucketFile:
    """One relay file's objects in the bucket: its parts (start, end) in order and whether it is sealed."""

    name: str
    parts: tuple[tuple[int, int], ...] = ()
    sealed: bool = False

    @property
    def end(self) -> int:
        """Where the next part starts (0 before any)."""
        return self.parts[-1][1] if self.parts else 0


def bucket_files(keys: Iterable[str]) -> dict[str, BucketFile]:
    """The files a listing of the bucket holds. ArchiveError (naming the key) when a file's parts do not chain
    from 0 without gaps or overlaps."""
    parts: dict[str, list[tuple[int, int]]] = {}
    sealed: set[str] = set()
    for key in keys:
        if not key.startswith(FILES_PREFIX):
            continue
        name, _, leaf = key[len(FILES_PREFIX):].rpartition("/")
        if not name or "/" in name:
            continue
        if leaf == MANIFEST:
            sealed.add(name)
            parts.setdefault(name, [])
            continue
        m = _PART.match(leaf)
        if m:
            parts.setdefault(name, []).append((int(m.group(1)), int(m.group(2))))
    out = {}
    for name, ranges in parts.items():
        ranges.sort()
        at = 0
        for start, end in ranges:
            if start != at or end <= start:
                raise ArchiveError(f"the bucket's parts of {name} do not chain: {part_key(name, start, end)} "
                                   f"should start at {at}", part_key(name, start, end))
            at = end
        out[name] = BucketFile(name, tuple(ranges), name in sealed)
    return out


@dataclass(frozen=True)
class UploadPart:
    name: str
    start: int
    end: int


@dataclass(frozen=True)
class Seal:
    name: str
    size: int


def plan_uploads(files: Sequence[str], sizes: Mapping[str, int], horizon: tuple[str | None, int],
                 bucket: Mapping[str, BucketFile]) -> list[UploadPart | Seal]:
    """What to upload next, oldest first: for each closed file (every file before the horizon's) not sealed, the
    part from what the bucket has to its size (``sizes``: logical sizes of the closed files) and its seal; for
    the horizon's file, the part up to the horizon. Nothing past the horizon, nothing the bucket has. Files after
    the horizon's are left alone. ArchiveError when the bucket holds more of a file than the relay has."""
    file, position = horizon
    steps: list[UploadPart | Seal] = []
    if file is None or file not in files:
        return steps
    for name in files[: files.index(file) + 1]:
        have = bucket.get(name, BucketFile(name))
        if have.sealed:
            continue
        limit = position if name == file else sizes[name]
        if name == file and have.end == 0 and limit <= 4:
            continue  # the open file holds only its magic so far: its first part waits for its first events
        if have.end > limit:
            start, end = have.parts[-1]
            raise ArchiveError(f"{part_key(name, start, end)} in the bucket ends past what the relay holds of {name} "
                               f"({limit} bytes): the bucket holds another history", part_key(name, start, end))
        if have.end < limit:
            steps.append(UploadPart(name, have.end, limit))
        if name != file:
            steps.append(Seal(name, limit))
    return steps


def first_unsealed(files: Sequence[str], sealed: Iterable[str]) -> str | None:
    """The oldest local file the bucket has not sealed (retention keeps it and every later one)."""
    done = set(sealed)
    return next((name for name in files if name not in done), None)


def strip_password(document: bytes) -> bytes:
    """relayproxy.master.json without any ``password`` field (the bucket never holds the replication password)."""
    data = json.loads(document.decode("utf-8"))

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "password"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return (json.dumps(strip(data), indent=2, sort_keys=True) + "\n").encode("utf-8")


# ---------------------------------------------------------------------------------------------
# Part payloads: plain, or the closed files' framed form (relay/conversion.py writes it)


def part_metadata(sha256: str, size: int, storage) -> dict[str, str]:
    compress = getattr(storage, "compress", "off") if storage is not None else "off"
    encrypt = bool(getattr(storage, "encrypt", False)) if storage is not None else False
    framed = compress != "off" or encrypt
    return {
        "sha256": sha256,
        "size": str(size),
        "encoding": "framed" if framed else "plain",
        "compression": "zstd" if compress == "zstd" else "none",
        "encryption": f"aes-256-gcm:{storage.keyring.current}" if encrypt else "none",
    }


# ---------------------------------------------------------------------------------------------
# The uploader (I/O)


@dataclass
class ArchiveStats:
    bytes_uploaded: int = 0  # stored bytes of every object put
    objects_uploaded: int = 0
    parts_uploaded: int = 0
    files_sealed: int = 0
    files_offloaded: int = 0  # sealed files whose local copy was replaced by a stub (archive_keep_local)
    gaps: int = 0  # files purged locally before the bucket held them whole (archive_backlog_max), marked in gaps/
    errors: int = 0


class ArchiveUploader:
    """Follows the horizon in a background thread (``relay-archive``) and uploads what ``plan_uploads`` says.

    ``files()`` is the relay files oldest first, ``horizon()`` the horizon snapshot (file, position, text), both
    immutable values read when the thread wakes (at most every ``interval`` seconds); ``flavour()`` the store's.
    ``storage`` (conversion.StorageOptions or None) says whether parts are framed as closed files are stored.
    """

    def __init__(self, relay_dir: Path, bucket: ObjectStore, files: Callable[[], list[str]],
                 horizon: Callable[[], HorizonSnapshot], *, flavour: Callable[[], str | None] = lambda: None,
                 storage=None, interval: float = 1.0, keyring=None,
                 keep_local: tuple[int | None, int | None] = (None, None),
                 location: tuple[str, str | None, str | None] | None = None, backlog_max: int | None = None):
        self.relay_dir = Path(relay_dir)
        self.bucket = bucket
        self._files = files
        self._horizon = horizon
        self._flavour = flavour
        self.storage = storage if storage is not None and getattr(storage, "converts", False) else None
        self.keyring = keyring if keyring is not None else getattr(storage, "keyring", None)
        self.interval = interval
        # archive_keep_local (bytes, files): sealed files beyond it are offloaded (relay/remote.py); location is the
        # (url, endpoint, region) a stub names, never with credentials
        self.keep_local = keep_local
        self.location = location or (bucket.url, None, None)
        self._sealed_sha: dict[str, str] = {}
        # archive_backlog_max: bytes of local files not sealed in the bucket that retention keeps for it; beyond
        # them the oldest go by retention's own limits, and each one is marked in the bucket as a gap
        self.backlog_max = backlog_max
        self._last_files: list[str] = list(files())
        self._gaps: set[str] = set()
        self._sidecars_up: set[str] = set()  # files whose index sidecars are in the bucket
        self._indexed_names: set[str] = set()  # closed files whose indexes are complete (offload may go on)
        self.cache: ArchiveCache | None = None  # what offloaded files are read through (relay/remote.py), for /status
        self.stats = ArchiveStats()
        self.state = STATE_STARTING
        self.state_since = time.time()
        self.last_error: str | None = None
        self._failing_since: float | None = None
        self._listed: dict[str, BucketFile] | None = None  # None until the first listing
        self._relist = False  # list the bucket again at the next pass (after a failure)
        self._horizon_doc: dict | None = None  # horizon.json not yet written (_put_horizon)
        self._horizon_put_at: float | None = None
        self._pass_started: float | None = None  # monotonic start of the pass under way (a hung bucket shows)
        self._part_sha: dict[tuple[str, int, int], str] = {}
        self._running: dict[str, tuple[int, "hashlib._Hash"]] = {}  # name -> (end hashed, hash) of the open file
        self._sizes: dict[str, int] = {}
        self._state_sent: dict[str, bytes] = {}
        self._marker_done = False
        self._inflight: UploadPart | None = None  # a part whose put has not been answered (see _settle_inflight)
        self.archive_horizon: tuple[str | None, int, str | None] = (None, 0, None)
        self._caught_up_at: float | None = None  # time the archive last held everything the store had
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self._pass_done = threading.Condition()
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="relay-archive", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread. A request in flight to a hung bucket may take up to its timeouts and retries: the
        relay's shutdown waits ``timeout`` seconds for it at most (the daemon thread ends with the process; an
        object is put whole or not at all, and the next start resumes from the bucket's listing)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("archive upload still in flight at shutdown: left to the process's exit",
                            url=self.bucket.url)
            self._thread = None

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until a whole pass after this call has ended in state ok with nothing left to upload (tests)."""
        deadline = time.monotonic() + timeout
        with self._pass_done:
            target = self.passes + 2
            while time.monotonic() < deadline:
                self._wake.set()
                if self._pass_done.wait_for(lambda: self.passes >= target, min(1.0, deadline - time.monotonic())):
                    snap = self._horizon()
                    if self.state == STATE_OK and self.archive_horizon[:2] == (snap.file, snap.position):
                        return True
                    target = self.passes + 1
        return False

    def _run(self) -> None:
        delay = self.interval
        failures = 0
        while not self._stop.is_set():
            self._pass_started = time.monotonic()
            try:
                self.run_once()
            except _Stopped:
                break
            except ArchiveError as exc:
                failures += 1
                self._failed(str(exc), permanent=True)
            except (ObjectStoreError, OSError, CF.StoredFileError, ValueError) as exc:
                failures += 1
                self._failed(str(exc))
            except Exception as exc:  # noqa: BLE001 - a defect must not end archiving for good
                failures += 1
                self._failed(repr(exc))
            else:
                failures = 0
                self._succeeded()
            self._pass_started = None
            delay = self.interval if failures == 0 else min(MAX_BACKOFF, self.interval * (2 ** min(failures, 8)))
            with self._pass_done:
                self.passes += 1
                self._pass_done.notify_all()
            if self._wake.wait(delay):
                self._wake.clear()
        with self._pass_done:
            self._pass_done.notify_all()

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_since = time.time()
            if state == STATE_OK:
                log.info("archive uploads are going", url=self.bucket.url)
            elif state == STATE_RETRYING:
                log.warning("archive upload failed: retrying with backoff (ingest goes on)", url=self.bucket.url,
                            error=self.last_error)
            else:
                log.error("archive uploads are failing (ingest goes on; retention keeps what is not archived)",
                          url=self.bucket.url, error=self.last_error)

    def _failed(self, error: str, *, permanent: bool = False) -> None:
        # After a failure the bucket is listed again before the next step: a bucket that came back without some
        # objects (restored, recreated, its server restarted empty) gets them again from the local files.
        self._relist = True
        self.stats.errors += 1
        self.last_error = error
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if permanent or now - self._failing_since >= FAILING_AFTER:
            self._set_state(STATE_FAILING)
        elif self.state != STATE_FAILING:
            self._set_state(STATE_RETRYING)

    def _succeeded(self) -> None:
        self._failing_since = None
        self.last_error = None
        self._set_state(STATE_OK)

    # -- one pass ----------------------------------------------------------------------------
    def run_once(self) -> None:
        if self._listed is None or self._relist:
            self._resume()
            self._relist = False
            self._marker_done = False  # checked again: a bucket that lost it gets it again
        snap = self._horizon()
        files = self._files()
        self._mark_gaps(files)
        seen_at = time.time()
        sizes = {name: self._sizes[name] if name in self._sizes else CF.logical_size(self.relay_dir / name)
                 for name in files if name != snap.file}
        self._sizes = sizes  # replaced, never changed in place: lag() reads it from other threads
        if not self._marker_done and snap.file is not None:
            self._write_marker()
        if self._inflight is not None:
            self._settle_inflight(self._inflight, snap)
        steps = plan_uploads(files, self._sizes, (snap.file, snap.position), self._listing())
        for step in steps:
            if self._stop.is_set():
                raise _Stopped()
            if isinstance(step, UploadPart):
                self._upload_part(step, snap)
            else:
                self._seal(step)
        self._upload_state()
        self._sidecars(files, snap)
        self._offload(files, snap)
        have = self._listing().get(snap.file) if snap.file is not None else None
        if snap.file is not None and self.archive_horizon[:2] != (snap.file, snap.position) and (
                (have is not None and have.end == snap.position) or (have is None and snap.position <= 4)):
            # all of it is in the bucket, or the new file holds only its magic: nothing is left to archive
            self.archive_horizon = (snap.file, snap.position, snap.text)
        if self.archive_horizon[:2] == (snap.file, snap.position) or not steps:
            self._caught_up_at = seen_at

    def _listing(self) -> dict[str, BucketFile]:
        """The bucket's files as last listed (replaced, never changed in place: other threads read it)."""
        listed = self._listed
        assert listed is not None  # run_once lists the bucket (_resume) before any step that reads the listing
        return listed

    def _resume(self) -> None:
        """List the bucket; check what it holds of the local files that are not sealed against their bytes."""
        keys = [o.key for o in self.bucket.list(FILES_PREFIX)]
        listed = bucket_files(keys)
        have_leaves: dict[str, set[str]] = {}
        for key in keys:
            name, _, leaf = key[len(FILES_PREFIX):].rpartition("/")
            if leaf in SIDECAR_LEAVES:
                have_leaves.setdefault(name, set()).add(leaf)
        self._sidecars_up = {name for name, leaves in have_leaves.items() if leaves == set(SIDECAR_LEAVES)}
        local = set(self._files())
        for name, have in listed.items():
            if name not in local or have.sealed:
                continue
            for start, end in have.parts:
                self._verify_part(name, start, end)
        for name, have in listed.items():
            if name in local and have.sealed:
                self._verify_manifest(name)
        self._listed = listed
        try:
            doc = json.loads(self.bucket.get(HORIZON_KEY))
            self.archive_horizon = (doc.get("file"), int(doc.get("position") or 0), doc.get("gtids"))
        except ObjectNotFound:
            pass
        except ValueError:
            pass  # a damaged horizon.json is rewritten after the next part
        for key in (EPOCHS_KEY, MASTER_KEY, UUID_KEY):
            try:
                self._state_sent[key] = self.bucket.get(key)
            except ObjectNotFound:
                pass
        self._gaps = {o.key[len(GAPS_PREFIX):].removesuffix(".json") for o in self.bucket.list(GAPS_PREFIX)}
        for name, have in listed.items():  # purged while this relay was down, before the bucket sealed it
            if name not in local and not have.sealed and name not in self._gaps and local:
                self._put_gap(name, have)
        scratch = self.relay_dir / SCRATCH_DIR
        shutil.rmtree(scratch, ignore_errors=True)
        log.info("archive resumed from the bucket", url=self.bucket.url, files=len(listed),
                 sealed=sum(1 for f in listed.values() if f.sealed))

    def _local_sha(self, name: str, start: int, end: int) -> str:
        digest = hashlib.sha256()
        with CF.open_relay_file(self.relay_dir / name, keyring=self.keyring) as f:
            for pos in range(start, end, _CHUNK):
                digest.update(f.read(pos, min(_CHUNK, end - pos)))
        return digest.hexdigest()

    def _verify_part(self, name: str, start: int, end: int) -> None:
        key = part_key(name, start, end)
        info = self.bucket.head(key)
        if info is None:
            raise ArchiveError(f"{key} was listed but is gone", key)
        want = info.metadata.get("sha256")
        try:
            local = self._local_sha(name, start, end)
        except FileNotFoundError:
            return
        if want != local:
            raise ArchiveError(f"{key} in the bucket does not hold the relay's bytes of {name} [{start}, {end}) "
                               f"(its sha256 {want}, the relay's {local}): refusing to archive over it", key)
        self._part_sha[(name, start, end)] = local

    def _verify_manifest(self, name: str) -> None:
        key = manifest_key(name)
        manifest = self._manifest(name)
        size = int(manifest["size"])
        try:
            local = CF.logical_size(self.relay_dir / name)
        except FileNotFoundError:
            return
        if size != local:
            raise ArchiveError(f"{key} says {name} holds {size} bytes, the relay's has {local}: refusing to "
                               "archive over it", key)
        digest = self._indexed_sha(name)  # from the file's index when it has a verified one: no file read
        if digest is not None and digest != manifest.get("sha256"):
            raise ArchiveError(f"{key} gives {name} the SHA-256 {manifest.get('sha256')}, the relay's file has "
                               f"{digest}: refusing to archive over it", key)

    def _manifest(self, name: str) -> dict:
        """The manifest of a file the bucket has sealed, checked (remote.read_manifest); ArchiveError naming it."""
        try:
            return read_manifest(self.bucket, name)[0]
        except ArchiveReadError as exc:
            raise ArchiveError(str(exc), exc.key) from None

    def _indexed_sha(self, name: str) -> str | None:
        from .fileindex import load

        idx, _why = load(self.relay_dir, name)
        return idx.sha256 if idx is not None and idx.sha256 else None

    def _write_marker(self) -> None:
        flavour = self._flavour()
        if flavour is None:
            return
        raw_uuid = self._read_local(self.relay_dir / "relayproxy.uuid")
        relay_uuid = raw_uuid.decode().strip() if raw_uuid else None
        try:
            doc = json.loads(self.bucket.get(ARCHIVE_KEY))
        except ObjectNotFound:
            doc = None
        except ValueError as exc:
            raise ArchiveError(f"{ARCHIVE_KEY} is not readable JSON: {exc}", ARCHIVE_KEY) from None
        if doc is None:
            doc = {"format": FORMAT, "version": VERSION, "flavour": flavour, "relay_uuid": relay_uuid,
                   "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            self._put(ARCHIVE_KEY, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
        elif doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ArchiveError(f"{ARCHIVE_KEY} is not a relayproxy archive of version {VERSION}", ARCHIVE_KEY)
        elif relay_uuid and doc.get("relay_uuid") not in (None, relay_uuid):
            raise ArchiveError(f"{ARCHIVE_KEY} belongs to relay {doc.get('relay_uuid')}, this relay is {relay_uuid}: "
                               "one archive per relay (restore this relay from it, or give it its own prefix)",
                               ARCHIVE_KEY)
        elif doc.get("flavour") not in (None, flavour):
            raise ArchiveError(f"{ARCHIVE_KEY} is a {doc.get('flavour')} archive; this relay's files are {flavour}",
                               ARCHIVE_KEY)
        self._marker_done = True

    def _put(self, key: str, data: bytes | Path, metadata: dict[str, str] | None = None) -> None:
        self.bucket.put(key, data, metadata)
        self.stats.objects_uploaded += 1
        self.stats.bytes_uploaded += len(data) if isinstance(data, (bytes, bytearray)) else os.path.getsize(data)

    def _settle_inflight(self, step: UploadPart, snap: HorizonSnapshot) -> None:
        """A put of this part failed as far as this side knows, yet the bucket may have stored it (the answer
        lost, the request retried, or still landing). Put exactly that range again, never a longer one from the
        same start: the key and its bytes are the same, so a late landing of the earlier put is harmless, and two
        parts never overlap."""
        have = self._listing().get(step.name, BucketFile(step.name))
        if have.sealed or have.end != step.start or step.name not in self._files():
            self._inflight = None
            return
        info = self.bucket.head(part_key(step.name, step.start, step.end))
        if info is not None and info.metadata.get("sha256") == self._local_sha(step.name, step.start, step.end):
            self._running.pop(step.name, None)  # the whole-file hash is taken again at the seal
            self._record_part(step.name, step.start, step.end, info.metadata["sha256"], snap)
        else:
            self._upload_part(step, snap)
        self._inflight = None

    def _record_part(self, name: str, start: int, end: int, sha: str, snap: HorizonSnapshot) -> None:
        self._part_sha[(name, start, end)] = sha
        listed = self._listing()
        have = listed.get(name, BucketFile(name))
        # replaced, never changed in place: first_unsealed reads it from other threads
        self._listed = {**listed, name: BucketFile(name, have.parts + ((start, end),), have.sealed)}
        self.stats.parts_uploaded += 1
        gtids = snap.text if (name, end) == (snap.file, snap.position) else None
        self.archive_horizon = (name, end, gtids)
        self._horizon_doc = {"format": FORMAT + "-horizon", "version": VERSION, "file": name, "position": end,
                             "gtids": gtids, "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        # A file's first part is named at once: horizon.json then always names the newest file, so a restore can
        # tell that file's parts gone from a file that never was.
        self._put_horizon(force=start == 0)

    def _put_horizon(self, *, force: bool = False) -> None:
        """horizon.json, at most every HORIZON_EVERY seconds (it was half of all PUTs when written after every
        part); never ahead of the parts, so a restore that finds it behind them loses nothing."""
        doc = self._horizon_doc
        now = time.monotonic()
        if doc is None or (not force and self._horizon_put_at is not None
                           and now - self._horizon_put_at < HORIZON_EVERY):
            return
        self._put(HORIZON_KEY, (json.dumps(doc, sort_keys=True) + "\n").encode())
        self._horizon_doc = None
        self._horizon_put_at = now

    def _upload_part(self, step: UploadPart, snap: HorizonSnapshot) -> None:
        name, start, end = step.name, step.start, step.end
        key = part_key(name, start, end)
        scratch = self.relay_dir / SCRATCH_DIR
        digest = hashlib.sha256()
        running = self._running.get(name)
        if start == 0:
            running = (0, hashlib.sha256())
        # the whole-file hash goes on in a copy, kept only once the part is in the bucket (a failed put is redone)
        whole = running[1].copy() if running is not None and running[0] == start else None
        payload: bytes | Path
        plain_tmp = framed_tmp = None
        try:
            with CF.open_relay_file(self.relay_dir / name, keyring=self.keyring) as f:
                if self.storage is None and end - start <= IN_MEMORY_PART:
                    data = f.read(start, end - start)
                    if len(data) != end - start:
                        raise OSError(f"{name} holds {start + len(data)} bytes, not the {end} the relay made durable")
                    digest.update(data)
                    if whole is not None:
                        whole.update(data)
                    payload = data
                else:
                    scratch.mkdir(exist_ok=True)
                    plain_tmp = scratch / f"{name}.{start}.plain"
                    with open(plain_tmp, "wb") as out:
                        for pos in range(start, end, _CHUNK):
                            chunk = f.read(pos, min(_CHUNK, end - pos))
                            digest.update(chunk)
                            if whole is not None:
                                whole.update(chunk)
                            out.write(chunk)
                    payload = plain_tmp
                    if self.storage is not None:
                        from .conversion import write_framed

                        framed_tmp = scratch / f"{name}.{start}.framed"
                        write_framed(plain_tmp, framed_tmp, name, self.storage, action="archive-part")
                        payload = framed_tmp
            sha = digest.hexdigest()
            self._inflight = step  # until the bucket has answered: _settle_inflight
            self._put(key, payload, part_metadata(sha, end - start, self.storage))
            self._inflight = None
        finally:
            for tmp in (plain_tmp, framed_tmp):
                if tmp is not None:
                    try:
                        os.unlink(tmp)
                    except FileNotFoundError:
                        pass
        if whole is not None:
            self._running[name] = (end, whole)
        else:
            self._running.pop(name, None)
        self._record_part(name, start, end, sha, snap)

    def _seal(self, step: Seal) -> None:
        name, size = step.name, step.size
        have = self._listing()[name]
        running = self._running.pop(name, None)
        whole = running[1].hexdigest() if running is not None and running[0] == size else \
            self._indexed_sha(name) or self._local_sha(name, 0, size)
        parts = []
        for start, end in have.parts:
            sha = self._part_sha.get((name, start, end))
            if sha is None:
                self._verify_part(name, start, end)
                sha = self._part_sha[(name, start, end)]
            parts.append({"key": part_key(name, start, end), "start": start, "end": end, "sha256": sha})
        manifest = {"format": FORMAT + "-file", "version": VERSION, "name": name, "size": size, "sha256": whole,
                    "parts": parts}
        self._put(manifest_key(name), (json.dumps(manifest, indent=2) + "\n").encode())
        self._put_horizon(force=True)
        self._listed = {**self._listing(), name: BucketFile(name, have.parts, True)}
        self._sealed_sha[name] = whole
        self.stats.files_sealed += 1
        for start, end in have.parts:
            self._part_sha.pop((name, start, end), None)

    def _mark_gaps(self, files: list[str]) -> None:
        """Files gone from the relay (purged) since the last pass that the bucket had not sealed: each is a gap in the
        archive's history, marked so that a restore never builds a relay with a hole in it."""
        now = set(files)
        for name in self._last_files:
            have = self._listing().get(name)
            if name not in now and (have is None or not have.sealed) and name not in self._gaps:
                self._put_gap(name, have)
        self._last_files = list(files)

    def _put_gap(self, name: str, have: BucketFile | None) -> None:
        doc = {"format": FORMAT + "-gap", "version": VERSION, "name": name,
               "reason": "purged from the relay before the bucket held it whole (archive_backlog_max)",
               "parts_in_bucket": [list(p) for p in (have.parts if have is not None else ())],
               "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self._put(f"{GAPS_PREFIX}{name}.json", (json.dumps(doc, indent=2) + "\n").encode())
        self._gaps.add(name)
        self.stats.gaps += 1
        log.error("relay file purged before the archive held it: a gap in the archive (a restore starts after it)",
                  file=name, url=self.bucket.url)

    def _offload(self, files: list[str], snap: HorizonSnapshot) -> None:
        """Replace the local copies of the oldest sealed files beyond ``keep_local`` by stubs (relay/remote.py)."""
        keep_bytes, keep_files = self.keep_local
        if keep_bytes is None and keep_files is None:
            return
        local = []
        for name in files:
            have = self._listing().get(name)
            if name == snap.file or have is None or not have.sealed:
                break  # only the sealed files before the first one that is not
            stored = CF.locate(self.relay_dir / name)
            if stored is not None and not CF.is_remote(stored):
                if not self._indexed(name):
                    break  # its indexes are still being built from the local copy: offloading now means a fetch
                local.append((name, os.stat(stored).st_size))
        for name in plan_offload(local, keep_bytes, keep_files):
            if self._stop.is_set():
                raise _Stopped()
            sha = self._sealed_sha.get(name) or self._checked_manifest_sha(name)
            url, endpoint, region = self.location
            if offload_file(self.relay_dir, name, sha256=sha, url=url, endpoint=endpoint, region=region,
                            keyring=self.keyring) is not None:
                self.stats.files_offloaded += 1
                log.info("relay file offloaded: its bytes are read back from the archive, a stub stays", file=name,
                         sha256=sha)

    def _sidecars(self, files: list[str], snap: HorizonSnapshot) -> None:
        """Put the index sidecars of every sealed local file whose indexes are complete (once each)."""
        for name in files:
            have = self._listing().get(name)
            if name == snap.file or have is None or not have.sealed:
                break
            if name in self._sidecars_up:
                continue
            stored = CF.locate(self.relay_dir / name)
            if stored is None or CF.is_remote(stored) or not self._indexed(name):
                continue
            if self._stop.is_set():
                raise _Stopped()
            self._upload_sidecars(name)

    def _upload_sidecars(self, name: str) -> None:
        """The file's complete index sidecars, once, beside its parts: a restore that leaves the file in the bucket
        (``--keep-local``) gets them, so the relay's indexers need not fetch the file to build them again."""
        if name in self._sidecars_up:
            return
        from . import fileindex, txindex

        for leaf, path in (("fileindex", fileindex.sidecar_path(self.relay_dir, name)),
                           ("txindex", txindex.sidecar_path(self.relay_dir, name))):
            self._put(f"{FILES_PREFIX}{name}/{leaf}", path.read_bytes())
        self._sidecars_up.add(name)

    def _indexed(self, name: str) -> bool:
        """Whether the store's indexers are done with closed file ``name`` (its file and transaction indexes are
        written)."""
        from . import fileindex, txindex

        if name in self._indexed_names:
            return True
        if not fileindex.sidecar_path(self.relay_dir, name).is_file():
            return False
        side, _why = txindex.load(self.relay_dir, name)
        if side is None or side.footer is None:  # none yet, or still growing (its footer is written at the close)
            return False
        self._indexed_names.add(name)
        return True

    def _checked_manifest_sha(self, name: str) -> str:
        """The manifest's SHA-256 of a file sealed before this process started, checked against the local bytes
        (its index when it has a verified one, else read) before its local copy may go."""
        key = manifest_key(name)
        want = str(self._manifest(name)["sha256"])
        local = self._indexed_sha(name) or self._local_sha(name, 0, CF.logical_size(self.relay_dir / name))
        if local != want:
            raise ArchiveError(f"{key} gives {name} the SHA-256 {want}, the relay's file has {local}: its local copy "
                               "is kept", key)
        self._sealed_sha[name] = want
        return want

    @staticmethod
    def _read_local(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def _upload_state(self) -> None:
        from .epochs import EPOCHS_NAME
        from .master_info import FILE_NAME as MASTER_NAME

        for key, local_name, transform in ((EPOCHS_KEY, EPOCHS_NAME, None), (MASTER_KEY, MASTER_NAME, strip_password),
                                           (UUID_KEY, "relayproxy.uuid", None)):
            data = self._read_local(self.relay_dir / local_name)
            if data is None:
                continue
            if transform is not None:
                try:
                    data = transform(data)
                except ValueError:
                    continue  # being rewritten (the store writes it atomically; a damaged one is not uploaded)
            if self._state_sent.get(key) != data:
                self._put(key, data)
                self._state_sent[key] = data

    # -- what status and retention read ------------------------------------------------------
    def first_unsealed(self) -> str | None:
        """The oldest local relay file not sealed in the bucket (all of them until the bucket was listed)."""
        files = self._files()
        listed = self._listed
        if listed is None:
            return files[0] if files else None
        return first_unsealed(files, [name for name, f in listed.items() if f.sealed])

    def hold_from(self) -> str | None:
        """The oldest file retention and PURGE BINARY LOGS must keep for the archive: the first one not sealed, or,
        with ``backlog_max``, the oldest of the newest unsealed files whose stored bytes fit in it (the newest file
        always)."""
        first = self.first_unsealed()
        if first is None or self.backlog_max is None:
            return first
        files = self._files()
        tail = files[files.index(first):] if first in files else []
        sizes = []
        for name in tail:
            try:
                sizes.append(CF.stored_stat(self.relay_dir / name).st_size)
            except FileNotFoundError:
                sizes.append(0)
        total, i = sum(sizes), 0
        while total > self.backlog_max and i < len(tail) - 1:
            total -= sizes[i]
            i += 1
        return tail[i] if tail else first

    def backlog_bytes(self) -> int:
        """Stored bytes of the local files from the first one not sealed in the bucket."""
        first = self.first_unsealed()
        files = self._files()
        if first is None or first not in files:
            return 0
        total = 0
        for name in files[files.index(first):]:
            try:
                total += CF.stored_stat(self.relay_dir / name).st_size
            except FileNotFoundError:
                pass
        return total

    def lag(self) -> tuple[int, float]:
        """(bytes, seconds) the archive is behind the store's horizon."""
        snap = self._horizon()
        afile, apos, _ = self.archive_horizon
        if (afile, apos) == (snap.file, snap.position) or snap.file is None:
            return 0, 0.0
        files = self._files()
        sizes = dict(self._sizes)
        for name in files:
            if name != snap.file and name not in sizes:  # not seen by a pass yet (the bucket unreachable at start)
                try:
                    sizes[name] = CF.logical_size(self.relay_dir / name)
                except FileNotFoundError:
                    sizes[name] = 0
        if afile in files and snap.file in files:
            i, j = files.index(afile), files.index(snap.file)
            if i == j:
                lag_bytes = max(0, snap.position - apos)
            else:
                lag_bytes = max(0, sizes.get(afile, apos) - apos) + sum(sizes.get(n, 0) for n in files[i + 1:j]) \
                    + snap.position
        else:  # nothing of the local files archived yet
            lag_bytes = sum(sizes.get(n, 0) for n in files if n != snap.file) + snap.position
        seconds = 0.0 if self._caught_up_at is None else max(0.0, time.time() - self._caught_up_at)
        return lag_bytes, round(seconds, 3)

    def check_stalled(self) -> None:
        """A pass waiting on the bucket for more than STALLED_AFTER seconds (a bucket that accepts connections and
        does not answer: its request ends only at the client's timeouts) shows as retrying, then failing, with the
        reason; the thread itself is still waiting. Called whenever the state is read."""
        started = self._pass_started
        if started is None or self.state == STATE_FAILING:
            return
        waited = time.monotonic() - started
        if waited < STALLED_AFTER:
            return
        with self._lock:
            self.last_error = f"the bucket has not answered for {waited:.0f} s ({self.bucket.url})"
            if self._failing_since is None:
                self._failing_since = started
            self._set_state(STATE_FAILING if time.monotonic() - self._failing_since >= FAILING_AFTER
                            else STATE_RETRYING)

    def describe(self) -> dict:
        """The ``archive`` section of /status: the URL (no credentials), state, horizon, lag and counters."""
        self.check_stalled()
        lag_bytes, lag_seconds = self.lag()
        afile, apos, gtids = self.archive_horizon
        return {
            "url": self.bucket.url,
            "state": self.state,
            "state_since": self.state_since,
            "last_error": self.last_error,
            "horizon": {"file": afile, "position": apos, "gtids": gtids},
            "lag_bytes": lag_bytes,
            "lag_seconds": lag_seconds,
            "first_unsealed": self.first_unsealed(),
            "bytes_uploaded": self.stats.bytes_uploaded,
            "objects_uploaded": self.stats.objects_uploaded,
            "parts_uploaded": self.stats.parts_uploaded,
            "files_sealed": self.stats.files_sealed,
            "files_offloaded": self.stats.files_offloaded,
            "backlog_bytes": self.backlog_bytes(),
            "backlog_max": self.backlog_max,
            "gaps": self.stats.gaps,
            "keep_local": _describe_keep(self.keep_local),
            "cache": self.cache.describe() if self.cache is not None else None,
            "errors": self.stats.errors,
        }


def _describe_keep(keep: tuple[int | None, int | None]) -> str | None:
    keep_bytes, keep_files = keep
    if keep_files is not None:
        return f"{keep_files} files"
    return None if keep_bytes is None else f"{keep_bytes} bytes"


class _Stopped(Exception):
    pass
