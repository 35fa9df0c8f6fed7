"""The archive: the planner's rules (never past the horizon, never overlapping, never again), and the uploader
against a real RelayStore fed generated binlog bytes, over the file:// store and moto's S3 server."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.relay import RelayStore
from relayproxy.relay import archive as A
from relayproxy.relay.closed_files import Keyring
from relayproxy.relay.conversion import StorageOptions
from relayproxy.relay.master_info import MasterInfo, MasterInfoFile
from relayproxy.relay.objectstore import FileObjectStore, S3ObjectStore, open_object_store
from relayproxy.relay.retention import RetentionPolicy, RetentionStats, purge_with_policy

from ..support.s3server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, s3_server, s3_server_auth  # noqa: F401
from ..support.txgen import oltp_file
from .test_relay_store import Feeder, split_events

# ---------------------------------------------------------------------------------------------
# The planner


@st.composite
def situations(draw):
    n = draw(st.integers(1, 5))
    names = [f"binlog.{i:06d}" for i in range(1, n + 1)]
    sizes = {name: draw(st.integers(4, 10_000)) for name in names[:-1]}
    position = draw(st.integers(4, 10_000))
    bucket = {}
    for name in names:
        limit = sizes.get(name, position)
        cuts = sorted(set(draw(st.lists(st.integers(1, limit), max_size=4))))
        parts, at = [], 0
        for c in cuts:
            parts.append((at, c))
            at = c
        sealed = name in sizes and at == limit and draw(st.booleans())
        bucket[name] = A.BucketFile(name, tuple(parts), sealed)
    return names, sizes, position, bucket


@settings(max_examples=300, deadline=None)
@given(situations(), st.lists(st.integers(0, 3000), max_size=5))
def test_the_plan_never_passes_the_horizon_overlaps_or_uploads_twice(situation, advances):
    names, sizes, position, bucket = situation
    uploaded: set[tuple[str, int, int]] = set()
    for extra in [0, *advances]:
        position += extra
        steps = A.plan_uploads(names, sizes, (names[-1], position), bucket)
        for step in steps:
            have = bucket.get(step.name, A.BucketFile(step.name))
            if isinstance(step, A.UploadPart):
                limit = sizes.get(step.name, position)
                assert step.start == have.end and step.start < step.end <= limit
                assert not have.sealed
                assert (step.name, step.start, step.end) not in uploaded
                uploaded.add((step.name, step.start, step.end))
                bucket[step.name] = A.BucketFile(step.name, have.parts + ((step.start, step.end),))
            else:
                assert step.name != names[-1] and have.end == sizes[step.name] == step.size
                bucket[step.name] = A.BucketFile(step.name, have.parts, True)
        assert A.plan_uploads(names, sizes, (names[-1], position), bucket) == []
        last = bucket[names[-1]].end
        assert all(bucket[n].sealed for n in names[:-1]) and (last == position or (last == 0 and position <= 4))
        assert A.first_unsealed(names, [n for n, f in bucket.items() if f.sealed]) == names[-1]


def test_the_plan_refuses_a_bucket_that_holds_more_than_the_relay():
    bucket = {"b.1": A.BucketFile("b.1", ((0, 500),))}
    with pytest.raises(A.ArchiveError) as caught:
        A.plan_uploads(["b.1"], {}, ("b.1", 400), bucket)
    assert caught.value.key == A.part_key("b.1", 0, 500)


def test_bucket_listing_refuses_parts_that_do_not_chain():
    keys = [A.part_key("b.1", 0, 10), A.part_key("b.1", 12, 20)]
    with pytest.raises(A.ArchiveError) as caught:
        A.bucket_files(keys)
    assert caught.value.key == A.part_key("b.1", 12, 20)
    found = A.bucket_files([A.part_key("b.1", 0, 10), A.part_key("b.1", 10, 20), A.manifest_key("b.1"), "horizon.json"])
    assert found == {"b.1": A.BucketFile("b.1", ((0, 10), (10, 20)), True)}


# ---------------------------------------------------------------------------------------------
# The uploader on a real store


class Relay:
    """A store fed generated files (MariaDB flavour), event by event, as the upstream session feeds it."""

    def __init__(self, tmp_path: Path, files: int = 3, per_file: int = 300):
        self.dir = tmp_path / "relay"
        self.store = RelayStore.open(self.dir)
        self.images = []
        for i in range(files):
            rotate = f"binlog.{i + 2:06d}" if i < files - 1 else None
            image, _ = oltp_file(per_file, rotate_to=rotate, start_seq=1 + i * per_file, seed=i + 1)
            self.images.append((f"binlog.{i + 1:06d}", image))
        self.events = [(name, off, ev) for name, image in self.images for off, ev in split_events(image)]
        self.fed = 0
        self.feeder = None
        self.current = None

    def feed(self, count: int) -> None:
        for name, off, ev in self.events[self.fed:self.fed + count]:
            if name != self.current:
                self.store.start_file(name)
                self.current = name
                self.feeder = Feeder(self.store)
            self.feeder.feed(off, ev)
        self.fed = min(len(self.events), self.fed + count)
        self.store.sync()

    def uploader(self, bucket, **kw) -> A.ArchiveUploader:
        return A.ArchiveUploader(self.dir, bucket, self.store.files, self.store.horizon.snapshot,
                                 flavour=lambda: self.store.flavour, interval=0.05, **kw)


def bucket_bytes(bucket, name: str, keyring=None, tmp: Path | None = None) -> bytes:
    """The master's bytes of one file as the bucket holds them (parts decoded, checked against their sha256)."""
    out = b""
    for (start, end) in A.bucket_files(o.key for o in bucket.list("files/"))[name].parts:
        key = A.part_key(name, start, end)
        info = bucket.head(key)
        stored, plain = tmp / "stored", tmp / "plain"
        bucket.get_file(key, stored)
        assert A.decode_part(stored, name, info.metadata, plain, keyring=keyring) == info.metadata["sha256"]
        out += plain.read_bytes()
    return out


@pytest.fixture(params=["file", "s3"])
def bucket(request, tmp_path):
    if request.param == "file":
        return FileObjectStore(tmp_path / "bucket")
    server = request.getfixturevalue("s3_server")
    return open_object_store(f"s3://{BUCKET}/relay-1", endpoint=server.endpoint, region=REGION,
                             access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)


def test_parts_follow_the_horizon_and_closed_files_are_sealed(tmp_path, bucket):
    relay = Relay(tmp_path)
    up = relay.uploader(bucket)
    relay.feed(700)  # into the first file
    up.run_once()
    snap = relay.store.horizon.snapshot()
    assert up.archive_horizon == (snap.file, snap.position, snap.text)
    horizon = json.loads(bucket.get(A.HORIZON_KEY))
    assert (horizon["file"], horizon["position"], horizon["gtids"]) == (snap.file, snap.position, snap.text)
    first_parts = A.bucket_files(o.key for o in bucket.list("files/"))
    relay.feed(len(relay.events))  # the rest: the first two files close
    up.run_once()
    listed = A.bucket_files(o.key for o in bucket.list("files/"))
    assert set(listed) == {"binlog.000001", "binlog.000002", "binlog.000003"}
    assert listed["binlog.000001"].parts[: len(first_parts["binlog.000001"].parts)] == \
        first_parts["binlog.000001"].parts  # nothing uploaded again
    assert [listed[n].sealed for n in sorted(listed)] == [True, True, False]
    for name, image in relay.images:
        assert bucket_bytes(bucket, name, tmp=tmp_path) == image[: relay.store.horizon.snapshot().position
                                                               if name == "binlog.000003" else len(image)]
    manifest = json.loads(bucket.get(A.manifest_key("binlog.000001")))
    assert manifest["size"] == len(relay.images[0][1])
    assert manifest["sha256"] == hashlib.sha256(relay.images[0][1]).hexdigest()
    assert [p["key"] for p in manifest["parts"]] == [A.part_key("binlog.000001", s, e)
                                                     for s, e in listed["binlog.000001"].parts]
    assert up.first_unsealed() == "binlog.000003"
    assert up.describe()["lag_bytes"] == 0 and up.describe()["state"] in ("starting", "ok")
    marker = json.loads(bucket.get(A.ARCHIVE_KEY))
    assert (marker["format"], marker["flavour"]) == ("relayproxy-archive", "mariadb")
    # Once the store's indexers are done with the closed files, their sidecars go up beside the parts, once.
    from .test_remote import wait_indexed

    wait_indexed(relay.dir, ["binlog.000001", "binlog.000002"])
    up.run_once()
    for name in ("binlog.000001", "binlog.000002"):
        for leaf in A.SIDECAR_LEAVES:
            assert bucket.head(f"files/{name}/{leaf}") is not None
    # A new uploader (a restart) lists the bucket and uploads nothing again.
    before = {o.key for o in bucket.list()}
    again = relay.uploader(bucket)
    again.run_once()
    assert again.stats.parts_uploaded == 0 and {o.key for o in bucket.list()} == before
    relay.store.close()


def test_a_file_closed_before_anything_was_uploaded_goes_up_as_one_part(tmp_path):
    relay = Relay(tmp_path)
    relay.feed(len(relay.events))
    bucket = FileObjectStore(tmp_path / "bucket")
    up = relay.uploader(bucket)
    up.run_once()
    listed = A.bucket_files(o.key for o in bucket.list("files/"))
    assert listed["binlog.000001"].parts == ((0, len(relay.images[0][1])),)
    assert listed["binlog.000002"].parts == ((0, len(relay.images[1][1])),)
    relay.store.close()


def test_parts_are_stored_as_closed_files_are_compressed_and_encrypted(tmp_path):
    keyring = Keyring.parse("1:" + "ab" * 32, "test")
    storage = StorageOptions(compress="zstd", encrypt=True, keyring=keyring)
    relay = Relay(tmp_path, files=2)
    bucket = FileObjectStore(tmp_path / "bucket")
    up = relay.uploader(bucket, storage=storage)
    relay.feed(500)
    up.run_once()
    relay.feed(len(relay.events))
    up.run_once()
    key = A.part_key("binlog.000001", *A.bucket_files(o.key for o in bucket.list("files/"))["binlog.000001"].parts[0])
    meta = bucket.head(key).metadata
    assert (meta["encoding"], meta["compression"], meta["encryption"]) == ("framed", "zstd", "aes-256-gcm:1")
    assert b"test" not in bucket.get(key)[200:]  # the table names are not readable in the payload
    assert bucket_bytes(bucket, "binlog.000001", keyring=keyring, tmp=tmp_path) == relay.images[0][1]
    relay.store.close()


def test_a_part_that_disagrees_with_the_local_bytes_is_refused_by_name(tmp_path):
    relay = Relay(tmp_path)
    bucket = FileObjectStore(tmp_path / "bucket")
    relay.feed(700)
    relay.uploader(bucket).run_once()
    (start, end), = A.bucket_files(o.key for o in bucket.list("files/"))["binlog.000001"].parts
    key = A.part_key("binlog.000001", start, end)
    bucket.put(key, b"x" * (end - start), {"sha256": hashlib.sha256(b"x" * (end - start)).hexdigest()})
    up = relay.uploader(bucket)
    with pytest.raises(A.ArchiveError) as caught:
        up.run_once()
    assert caught.value.key == key and key in str(caught.value)
    relay.store.close()


def test_master_json_goes_up_without_the_password(tmp_path):
    relay = Relay(tmp_path, files=1)
    relay.feed(100)
    MasterInfoFile(relay.dir).save_choice(MasterInfo(host="db1", port=3306, user="repl", password="s3cr3t-pw",
                                                     source="change_master", changed_at=1.0))
    (relay.dir / "relayproxy.uuid").write_text("6b3f1c2e-0000-4000-8000-000000000001\n")
    bucket = FileObjectStore(tmp_path / "bucket")
    relay.uploader(bucket).run_once()
    master = bucket.get(A.MASTER_KEY)
    assert b"s3cr3t-pw" not in master and b"password" not in master
    assert json.loads(master)["choice"]["host"] == "db1"
    assert bucket.get(A.UUID_KEY).strip() == b"6b3f1c2e-0000-4000-8000-000000000001"
    relay.store.close()


def test_retention_holds_the_files_not_sealed_in_the_bucket(tmp_path):
    relay = Relay(tmp_path)
    relay.feed(len(relay.events))
    bucket = FileObjectStore(tmp_path / "bucket")
    up = relay.uploader(bucket)
    policy = RetentionPolicy(max_files=1)
    plan = purge_with_policy(relay.store, {}, policy, RetentionStats(), hold=up.first_unsealed)
    assert plan.purge == () and relay.store.files()[0] == "binlog.000001"
    up.run_once()
    plan = purge_with_policy(relay.store, {}, policy, RetentionStats(), hold=up.first_unsealed)
    assert plan.purge == ("binlog.000001", "binlog.000002")
    relay.store.close()


@pytest.mark.slow
def test_an_unreachable_bucket_never_stops_ingest_and_the_archive_catches_up(tmp_path, s3_server):  # noqa: F811
    relay = Relay(tmp_path)
    bucket = S3ObjectStore(BUCKET, "r", endpoint=s3_server.endpoint, region=REGION, access_key_id=ACCESS_KEY,
                           secret_access_key=SECRET_KEY, connect_timeout=1, read_timeout=1, max_attempts=2)
    up = relay.uploader(bucket)
    relay.feed(300)
    up.start()
    try:
        assert up.wait_idle(30)
        s3_server.pause()
        try:
            t0 = time.monotonic()
            relay.feed(900)  # ingest goes on while the bucket hangs
            assert time.monotonic() - t0 < 5
            deadline = time.monotonic() + 60
            while up.state == "ok" and time.monotonic() < deadline:
                time.sleep(0.2)
            assert up.state in ("retrying", "failing") and up.last_error
            assert up.describe()["lag_bytes"] > 0
        finally:
            s3_server.resume()
        relay.feed(len(relay.events))
        assert up.wait_idle(90), up.describe()
        assert up.state == "ok" and up.describe()["lag_bytes"] == 0
    finally:
        up.close()
    for name, image in relay.images[:2]:
        assert bucket_bytes(bucket, name, tmp=tmp_path) == image
    assert json.loads(bucket.get(A.ARCHIVE_KEY))["format"] == "relayproxy-archive"
    relay.store.close()


def test_status_and_metrics_show_the_archive_without_credentials(tmp_path):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from relayproxy.ops.metrics import build_registry

    relay = Relay(tmp_path, files=2)
    relay.feed(len(relay.events))
    bucket = S3ObjectStore(BUCKET, "p", endpoint="http://user:pw@127.0.0.1:9", region=REGION,
                           access_key_id="AKIDSECRETID", secret_access_key="the-secret", max_attempts=1,
                           connect_timeout=0.2, read_timeout=0.2)
    up = relay.uploader(bucket)
    with pytest.raises(Exception):
        up.run_once()
    up._failed("cannot list")  # noqa: SLF001 - what the thread does with that error
    doc = up.describe()
    text = json.dumps(doc)
    assert "the-secret" not in text and "AKIDSECRETID" not in text and "pw@" not in text
    assert doc["state"] == "retrying" and doc["lag_bytes"] == sum(len(i) for _, i in relay.images)
    assert doc["first_unsealed"] == "binlog.000001"
    fams = {f.name: f for f in text_string_to_metric_families(
        generate_latest(build_registry(lambda: {"archive": doc})).decode())}
    assert fams["relayproxy_archive_lag_bytes"].samples[0].value == doc["lag_bytes"]
    states = {s.labels["state"]: s.value for s in fams["relayproxy_archive_state"].samples}
    assert states == {"starting": 0, "ok": 0, "retrying": 1, "failing": 0}
    assert "relayproxy_archive_bytes_uploaded" in fams
    from relayproxy.ops.status import format_status

    shown = format_status({"archive": doc})
    assert "Archive:                s3://relay-archive/p (endpoint http://127.0.0.1:9): retrying" in shown
    assert "last error: cannot list" in shown
    relay.store.close()


def test_an_archive_of_another_relay_is_refused(tmp_path):
    relay = Relay(tmp_path, files=1)
    relay.feed(100)
    (relay.dir / "relayproxy.uuid").write_text("6b3f1c2e-0000-4000-8000-000000000001\n")
    bucket = FileObjectStore(tmp_path / "bucket")
    relay.uploader(bucket).run_once()
    (relay.dir / "relayproxy.uuid").write_text("6b3f1c2e-0000-4000-8000-000000000002\n")
    with pytest.raises(A.ArchiveError) as caught:
        relay.uploader(bucket).run_once()
    assert caught.value.key == A.ARCHIVE_KEY
    relay.store.close()


def test_a_left_over_upload_scratch_directory_does_not_stop_the_relay_opening(tmp_path):
    relay = Relay(tmp_path, files=1)
    relay.feed(100)
    relay.store.close()
    (relay.dir / A.SCRATCH_DIR).mkdir()
    (relay.dir / A.SCRATCH_DIR / "binlog.000001.4.plain").write_bytes(b"x" * 10)
    with RelayStore.open(relay.dir) as store:
        assert store.files() == ["binlog.000001"]
        up = A.ArchiveUploader(relay.dir, FileObjectStore(tmp_path / "bucket"), store.files, store.horizon.snapshot,
                               flavour=lambda: store.flavour)
        up.run_once()
        assert not (relay.dir / A.SCRATCH_DIR).exists()


def test_closing_does_not_wait_for_a_hung_bucket(tmp_path, s3_server):  # noqa: F811
    relay = Relay(tmp_path, files=1)
    bucket = S3ObjectStore(BUCKET, "h", endpoint=s3_server.endpoint, region=REGION, access_key_id=ACCESS_KEY,
                           secret_access_key=SECRET_KEY)  # the default timeouts: a hung request lasts long
    up = relay.uploader(bucket)
    relay.feed(100)
    s3_server.pause()
    try:
        up.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        up.close(timeout=1.0)
        assert time.monotonic() - t0 < 3
    finally:
        s3_server.resume()
    relay.store.close()


def test_wrong_credentials_are_retried_named_and_never_shown(tmp_path, s3_server_auth):  # noqa: F811
    relay = Relay(tmp_path, files=2)
    relay.feed(500)
    wrong = S3ObjectStore(BUCKET, "c", endpoint=s3_server_auth.endpoint, region=REGION,
                          access_key_id=s3_server_auth.access_key, secret_access_key="not-the-secret", max_attempts=1)
    up = relay.uploader(wrong)
    up.start()
    try:
        deadline = time.monotonic() + 30
        while up.state == "starting" and time.monotonic() < deadline:
            time.sleep(0.05)
        relay.feed(len(relay.events))  # ingest goes on
        doc = up.describe()
        assert doc["state"] in ("retrying", "failing") and "SignatureDoesNotMatch" in doc["last_error"]
        assert "not-the-secret" not in json.dumps(doc)
        assert up.first_unsealed() == "binlog.000001"  # retention keeps everything
    finally:
        up.close()
    right = S3ObjectStore(BUCKET, "c", endpoint=s3_server_auth.endpoint, region=REGION,
                          access_key_id=s3_server_auth.access_key, secret_access_key=s3_server_auth.secret_key)
    good = relay.uploader(right)
    good.run_once()
    assert good.first_unsealed() == "binlog.000002"
    assert bucket_bytes(right, "binlog.000001", tmp=tmp_path) == relay.images[0][1]
    relay.store.close()


@pytest.mark.slow
def test_a_bucket_that_refuses_and_drops_connections_mid_upload_loses_nothing(tmp_path, s3_server):  # noqa: F811
    from relayproxy.lab.faultproxy import CLIENT_TO_SERVER, ThreadedFaultProxy

    relay = Relay(tmp_path, files=3, per_file=2000)
    with ThreadedFaultProxy("127.0.0.1", s3_server.port) as proxy:
        bucket = S3ObjectStore(BUCKET, "f", endpoint=f"http://127.0.0.1:{proxy.port}", region=REGION,
                               access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY, connect_timeout=1,
                               read_timeout=2, max_attempts=2)
        up = relay.uploader(bucket)
        relay.feed(500)
        up.start()
        try:
            assert up.wait_idle(30), up.describe()
            proxy.refuse(True)  # the bucket down: connection refused
            relay.feed(3000)
            deadline = time.monotonic() + 30
            while up.state == "ok" and time.monotonic() < deadline:
                time.sleep(0.1)
            assert up.state in ("retrying", "failing")
            proxy.refuse(False)
            for i in range(20):  # connections cut while parts are being put, some in the middle of a body
                relay.feed(150)
                proxy.drop_connections(reset=True)
                if i % 2:
                    proxy.cut_after(2000, CLIENT_TO_SERVER, on="next")
                time.sleep(0.05)
            relay.feed(len(relay.events))
            assert up.wait_idle(90), up.describe()
        finally:
            up.close()
    bucket = S3ObjectStore(BUCKET, "f", endpoint=s3_server.endpoint, region=REGION, access_key_id=ACCESS_KEY,
                           secret_access_key=SECRET_KEY)
    for name, image in relay.images:
        want = image if name != relay.images[-1][0] else image[:relay.store.horizon.snapshot().position]
        assert bucket_bytes(bucket, name, tmp=tmp_path) == want, name
    relay.store.close()


def test_a_new_file_holding_only_its_magic_leaves_nothing_to_archive(tmp_path):
    relay = Relay(tmp_path, files=2)
    first = [e for e in relay.events if e[0] == "binlog.000001"]
    relay.feed(len(first))  # the first file whole, ROTATE included
    relay.store.start_file("binlog.000002")  # the master rotated: the new file holds only its magic
    bucket = FileObjectStore(tmp_path / "bucket")
    up = relay.uploader(bucket)
    up.run_once()
    assert relay.store.horizon.snapshot().coordinates == ("binlog.000002", 4)
    assert up.describe()["lag_bytes"] == 0 and up.archive_horizon[:2] == ("binlog.000002", 4)
    assert "binlog.000002" not in A.bucket_files(o.key for o in bucket.list("files/"))
    relay.store.close()


def test_a_manifest_whose_sha256_is_not_the_files_is_refused_by_name(tmp_path):
    from relayproxy.relay import fileindex

    relay = Relay(tmp_path, files=2)
    relay.feed(len(relay.events))
    bucket = FileObjectStore(tmp_path / "bucket")
    relay.uploader(bucket).run_once()
    idx = fileindex.build(relay.dir / "binlog.000001", "binlog.000001")
    fileindex.write(relay.dir, idx)
    assert idx.sha256 == hashlib.sha256(relay.images[0][1]).hexdigest()
    relay.uploader(bucket).run_once()  # agrees: nothing to say
    key = A.manifest_key("binlog.000001")
    manifest = json.loads(bucket.get(key))
    bucket.put(key, json.dumps({**manifest, "sha256": "0" * 64}).encode())
    with pytest.raises(A.ArchiveError) as caught:
        relay.uploader(bucket).run_once()
    assert caught.value.key == key
    relay.store.close()


class AnswerLost(FileObjectStore):
    """A bucket that stores a part and then loses its answer (the connection cut after the server wrote it)."""

    lose = 0

    def put(self, key, data, metadata=None):
        super().put(key, data, metadata)
        if "/part." in key and self.lose:
            self.lose -= 1
            from relayproxy.relay.objectstore import ObjectStoreError

            raise ObjectStoreError(f"cannot put {key!r}: connection reset (the server may have stored it)")


def test_a_put_whose_answer_was_lost_never_leads_to_overlapping_parts(tmp_path):
    relay = Relay(tmp_path)
    bucket = AnswerLost(tmp_path / "bucket")
    up = relay.uploader(bucket)
    relay.feed(400)
    up.run_once()
    relay.feed(300)
    bucket.lose = 1
    with pytest.raises(Exception):
        up.run_once()
    relay.feed(300)  # the horizon moved on meanwhile
    up.run_once()  # the stored part is adopted, then the next one starts where it ends
    relay.feed(len(relay.events))
    up.run_once()
    listed = A.bucket_files(o.key for o in bucket.list("files/"))  # chains: no overlap
    assert [listed[n].sealed for n in sorted(listed)] == [True, True, False]
    for name, image in relay.images[:-1]:
        assert bucket_bytes(bucket, name, tmp=tmp_path) == image
        manifest = json.loads(bucket.get(A.manifest_key(name)))
        assert manifest["sha256"] == hashlib.sha256(image).hexdigest()
    relay.store.close()


class FailsOnce(FileObjectStore):
    """A bucket whose next put fails once (``fail_next``): the uploader's failure path."""

    fail_next = False

    def put(self, key, data, metadata=None):
        if self.fail_next:
            self.fail_next = False
            raise A.ObjectStoreError(f"cannot put {key!r} in {self.url}: connection reset")
        return super().put(key, data, metadata)


def test_a_bucket_that_comes_back_without_its_objects_gets_them_again(tmp_path):
    relay = Relay(tmp_path)
    relay.feed(len(relay.events) // 2)
    bucket = FailsOnce(tmp_path / "bucket")
    up = relay.uploader(bucket)
    up.run_once()
    import shutil

    shutil.rmtree(tmp_path / "bucket")  # the bucket's server restarted empty (moto keeps objects in memory)
    (tmp_path / "bucket").mkdir()
    relay.feed(len(relay.events))
    bucket.fail_next = True
    with pytest.raises(A.ObjectStoreError):
        up.run_once()
    up._failed("connection reset")  # noqa: SLF001 - what the thread does with that error
    up.run_once()
    listed = A.bucket_files(o.key for o in bucket.list("files/"))
    assert [listed[n].sealed for n in sorted(listed)] == [True, True, False]
    for name, image in relay.images[:2]:
        assert bucket_bytes(bucket, name, tmp=tmp_path) == image
    assert json.loads(bucket.get(A.ARCHIVE_KEY))["format"] == "relayproxy-archive"
    relay.store.close()


class Hangs(FileObjectStore):
    """A bucket that accepts a put and does not answer until ``release`` is set (a stopped server)."""

    def __init__(self, root):
        super().__init__(root)
        import threading

        self.release = threading.Event()
        self.hang = False

    def put(self, key, data, metadata=None):
        if self.hang:
            self.release.wait(30)
        return super().put(key, data, metadata)


def test_a_bucket_that_does_not_answer_shows_as_retrying_then_ok(tmp_path, monkeypatch):
    monkeypatch.setattr(A, "STALLED_AFTER", 0.3)
    relay = Relay(tmp_path)
    relay.feed(200)
    bucket = Hangs(tmp_path / "bucket")
    up = relay.uploader(bucket)
    up.start()
    try:
        assert up.wait_idle(20)
        bucket.hang = True
        relay.feed(200)
        deadline = time.monotonic() + 10
        while up.describe()["state"] != "retrying":
            assert time.monotonic() < deadline, up.describe()
            time.sleep(0.05)
        assert "has not answered for" in up.describe()["last_error"]
        bucket.hang = False
        bucket.release.set()
        assert up.wait_idle(20) and up.describe()["state"] == "ok" and up.describe()["last_error"] is None
    finally:
        up.close()
        relay.store.close()


def test_horizon_json_is_rewritten_at_most_every_few_seconds_and_at_each_seal(tmp_path):
    relay = Relay(tmp_path)
    bucket = FileObjectStore(tmp_path / "bucket")
    up = relay.uploader(bucket)
    relay.feed(100)
    up.run_once()
    first = json.loads(bucket.get(A.HORIZON_KEY))
    for _ in range(5):
        relay.feed(50)
        up.run_once()
    assert json.loads(bucket.get(A.HORIZON_KEY)) == first  # parts went up, horizon.json waits (never ahead)
    assert up.stats.parts_uploaded == 6
    relay.feed(len(relay.events))  # the first file closes: its seal writes horizon.json
    up.run_once()
    assert json.loads(bucket.get(A.HORIZON_KEY))["position"] > first["position"]
    relay.store.close()


def test_a_backlog_beyond_its_budget_goes_by_retention_and_is_marked_as_a_gap_restore_never_fills(tmp_path):
    from relayproxy.commands.restore import RestoreError, restore

    relay = Relay(tmp_path)
    relay.feed(len(relay.events))
    names = [n for n, _ in relay.images]
    bucket = FailsOnce(tmp_path / "bucket")
    newest = (relay.dir / names[-1]).stat().st_size
    up = relay.uploader(bucket, backlog_max=newest + 10)  # room for the newest file only
    assert up.first_unsealed() == names[0]
    assert up.hold_from() == names[-1] and up.backlog_bytes() > newest
    policy = RetentionPolicy(max_files=1)
    plan = purge_with_policy(relay.store, {}, policy, RetentionStats(), hold=up.hold_from)
    assert plan.purge == tuple(names[:-1])
    up.run_once()  # the bucket answers: the purged files are gaps, the newest goes up
    assert up.stats.gaps == 2 and up.describe()["gaps"] == 2
    assert sorted(o.key for o in bucket.list(A.GAPS_PREFIX)) == [f"gaps/{n}.json" for n in names[:-1]]
    again = relay.uploader(bucket)  # a restart: the gaps are known, not marked twice
    again.run_once()
    assert again.stats.gaps == 0
    target = tmp_path / "restored"
    target.mkdir()
    with pytest.raises(RestoreError, match=f"gaps/{names[1]}.json"):
        restore(bucket, target)
    for entry in list(target.iterdir()):
        import shutil

        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    summary = restore(bucket, target, from_oldest_complete=True)
    assert summary["files"] == 1 and (target / "relayproxy.index").read_text().split() == names[-1:]
    relay.store.close()


def test_a_file_purged_while_the_relay_was_down_before_its_seal_is_marked_at_the_next_start(tmp_path):
    relay = Relay(tmp_path)
    relay.feed(700)  # into the first file
    bucket = FileObjectStore(tmp_path / "bucket")
    relay.uploader(bucket).run_once()  # a part of the first file, not sealed
    relay.feed(len(relay.events))
    first = relay.images[0][0]
    relay.store.purge_to(relay.images[1][0])  # retention while the uploader was not running (no hold)
    again = relay.uploader(bucket)
    again.run_once()
    assert again.stats.gaps == 1
    gap = json.loads(bucket.get(f"{A.GAPS_PREFIX}{first}.json"))
    assert gap["name"] == first and gap["parts_in_bucket"]
    relay.store.close()
