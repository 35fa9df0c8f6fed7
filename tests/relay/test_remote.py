"""Offloaded relay files (archive_keep_local): stubs that answer headers, identity checks and recovery without the
bucket; whole reads fetched once into the bounded cache and checked; damage and outages refused by name."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.relay import RelayStore
from relayproxy.relay import closed_files as CF
from relayproxy.relay import fileindex, remote
from relayproxy.relay.catalog import FileCatalog
from relayproxy.relay.objectstore import FileObjectStore, ObjectStoreError
from relayproxy.relay.recovery import read_final_rotate, read_first_fde
from relayproxy.relay.retention import RetentionPolicy, RetentionStats, purge_with_policy

from ..support.s3server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, s3_server  # noqa: F401
from .test_archive import Relay

F1, F2, F3 = "binlog.000001", "binlog.000002", "binlog.000003"


def offloaded(tmp_path: Path, *, keep="1 files", cache_bytes=1 << 30, bucket=None):
    """A relay of three files (about 500 KB each), all archived, the oldest offloaded (``keep``), its cache
    registered."""
    relay = Relay(tmp_path, per_file=1200)
    relay.feed(len(relay.events))
    bucket = bucket if bucket is not None else FileObjectStore(tmp_path / "bucket")
    cache = remote.ArchiveCache(bucket, tmp_path / "cache", cache_bytes)
    remote.configure(relay.dir, cache)
    up = relay.uploader(bucket, keep_local=remote.parse_keep_local(keep),
                        location=("file://" + os.fspath(tmp_path / "bucket"), None, None))
    up.cache = cache
    wait_indexed(relay.dir, [F1, F2])
    up.run_once()
    return relay, bucket, cache, up


def wait_indexed(relay_dir: Path, names, timeout: float = 30.0) -> None:
    """Until the store's indexers are done with these closed files (offload waits for that)."""
    import time

    from relayproxy.relay import txindex

    deadline = time.monotonic() + timeout
    while True:
        sides = [txindex.load(relay_dir, n)[0] for n in names]
        if all(side is not None and side.footer is not None for side in sides) and all(
                fileindex.sidecar_path(relay_dir, n).is_file() for n in names):
            return
        assert time.monotonic() < deadline, "the indexers did not finish the closed files"
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def _forget_sources():
    yield
    CF._remote_sources.clear()


def test_parse_keep_local_and_the_offload_plan():
    assert remote.parse_keep_local(None) == (None, None)
    assert remote.parse_keep_local("20 files") == (None, 20)
    assert remote.parse_keep_local("1G") == (1 << 30, None)
    with pytest.raises(ValueError, match="archive_keep_local"):
        remote.parse_keep_local("soon")
    closed = [("a", 10), ("b", 10), ("c", 10)]
    assert remote.plan_offload(closed, None, None) == []
    assert remote.plan_offload(closed, None, 1) == ["a", "b"]
    assert remote.plan_offload(closed, None, 5) == []
    assert remote.plan_offload(closed, 25, None) == ["a"]
    assert remote.plan_offload(closed, 5, None) == ["a", "b", "c"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 100), max_size=8), st.integers(0, 400), st.integers(0, 9))
def test_the_offload_plan_is_always_the_oldest_prefix(sizes, keep_bytes, keep_files):
    closed = [(f"f{i}", s) for i, s in enumerate(sizes)]
    for plan, kept_ok in ((remote.plan_offload(closed, keep_bytes, None),
                           lambda kept: sum(s for _n, s in kept) <= keep_bytes),
                          (remote.plan_offload(closed, None, keep_files), lambda kept: len(kept) <= keep_files)):
        assert plan == [n for n, _s in closed[: len(plan)]]
        assert kept_ok(closed[len(plan):])


def test_a_sealed_file_is_offloaded_and_its_headers_are_read_without_the_bucket(tmp_path):
    relay, bucket, cache, up = offloaded(tmp_path)
    image = dict(relay.images)
    assert sorted(os.listdir(relay.dir / "cache") if (relay.dir / "cache").exists() else []) == []
    assert not (relay.dir / F1).exists() and (relay.dir / (F1 + CF.REMOTE_SUFFIX)).is_file()
    assert (relay.dir / F2).is_file() and (relay.dir / F3).is_file()
    assert up.stats.files_offloaded == 1 and up.describe()["files_offloaded"] == 1
    assert relay.store.files() == [F1, F2, F3]  # still listed
    path = relay.dir / F1
    assert CF.logical_size(path) == len(image[F1])
    assert CF.stat_logical(path)[1] == len(image[F1])
    assert CF.stored_stat(path).st_size < len(image[F1])
    # What SHOW BINARY LOGS, the start-file decisions, identity checks and recovery read: the stub's edges.
    catalog = FileCatalog(relay.store)
    assert [f.name for f in catalog.files()] == [F1, F2, F3]
    assert catalog.start_of(F1)[0] is not None
    assert read_first_fde(path) is not None
    assert read_final_rotate(path) == (F2, 4)
    idx, why = fileindex.load(relay.dir, F1)
    assert idx is not None, why
    assert cache.stats.fetches == 0 and cache.describe()["files"] == 0
    relay.store.close()
    # Recovery opens the directory without the bucket, and keeps the file listed.
    CF._remote_sources.clear()
    store = RelayStore.open(relay.dir, create=False)
    assert store.files() == [F1, F2, F3]
    store.close()


def test_a_whole_read_fetches_once_checks_and_serves_the_masters_bytes(tmp_path):
    relay, bucket, cache, _up = offloaded(tmp_path)
    image = dict(relay.images)[F1]
    with CF.open_relay_file(relay.dir / F1) as f:
        assert f.cheap(1000, 100) and not f.cheap(len(image) // 2, 100)  # the head is in the stub
        assert f.read(0, len(image)) == image
        assert f.cheap(len(image) // 2, 100)
    assert cache.stats.fetches == 1 and cache.stats.bytes_fetched == len(image)
    with CF.open_stream(relay.dir / F1) as f:
        assert f.read() == image
    assert cache.stats.fetches == 1 and cache.stats.hits == 1
    assert CF.scan(relay.dir / F1).events > 0
    assert (tmp_path / "cache" / F1).read_bytes() == image
    relay.store.close()


@pytest.fixture(scope="module")
def one_offloaded(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("remote")
    relay, _bucket, cache, _up = offloaded(tmp_path)
    yield relay, cache, dict(relay.images)[F1]
    relay.store.close()


@settings(max_examples=150, deadline=None)
@given(ranges=st.lists(st.tuples(st.integers(0, 600_000), st.integers(0, 70_000)), min_size=1, max_size=6))
def test_remote_reads_equal_the_file_at_any_offset(one_offloaded, ranges):
    relay, cache, image = one_offloaded
    remote.configure(relay.dir, cache)
    with CF.open_relay_file(relay.dir / F1) as f:
        for pos, n in ranges:
            some = f.read_some(pos, n)
            assert image[pos:pos + n].startswith(some) and (some or pos >= len(image) or n == 0)
            assert f.read(pos, n) == image[pos:pos + n]


def test_the_cache_is_bounded_and_an_evicted_file_being_read_stays_readable(tmp_path):
    relay, bucket, cache, up = offloaded(tmp_path, keep="0 files", cache_bytes=1)
    images = dict(relay.images)
    assert not (relay.dir / F2).exists()  # both closed files offloaded
    reader = CF.open_relay_file(relay.dir / F1)
    assert reader.read(0, len(images[F1])) == images[F1]
    with CF.open_relay_file(relay.dir / F2) as f:
        assert f.read(0, len(images[F2])) == images[F2]
    assert sorted(os.listdir(tmp_path / "cache")) == [F2]  # F1 evicted: the cache holds one file at a time
    assert cache.stats.evictions == 1
    assert reader.read(0, len(images[F1])) == images[F1]  # its reader holds it open
    reader.close()
    relay.store.close()


def test_a_corrupt_or_missing_object_is_refused_by_name_and_nothing_is_cached(tmp_path):
    relay, bucket, cache, _up = offloaded(tmp_path)
    key = next(o.key for o in bucket.list("files/" + F1 + "/part."))
    stored = tmp_path / "bucket" / key
    raw = bytearray(stored.read_bytes())
    raw[500] ^= 0xFF
    stored.write_bytes(bytes(raw))
    with CF.open_relay_file(relay.dir / F1) as f:
        with pytest.raises(CF.StoredFileError, match=key.replace(".", r"\.")) as caught:
            f.read(0, f.size())
    assert caught.value.key == key
    assert not (tmp_path / "cache" / F1).exists() and cache.stats.errors == 1
    assert "corrupt" in cache.describe()["last_error"]
    stored.unlink()
    with CF.open_relay_file(relay.dir / F1) as f:
        with pytest.raises(CF.StoredFileError, match="is missing"):
            f.read(0, f.size())
    relay.store.close()


class Unreachable(FileObjectStore):
    def get(self, key, start=None, end=None):
        raise ObjectStoreError(f"cannot get {key!r} in {self.url}: connection refused")


def test_an_unreachable_bucket_is_an_io_error_naming_it(tmp_path):
    relay, bucket, cache, _up = offloaded(tmp_path)
    cache.bucket = Unreachable(tmp_path / "bucket")
    with CF.open_relay_file(relay.dir / F1) as f:
        with pytest.raises(OSError) as caught:
            f.read(0, f.size())
    assert caught.value.errno == errno.EIO and "connection refused" in str(caught.value)
    assert "cannot be read" in str(caught.value)
    relay.store.close()


def test_a_kill_between_the_stub_and_the_removal_leaves_both_and_the_next_pass_ends_it(tmp_path):
    relay, bucket, cache, up = offloaded(tmp_path, keep=None)
    assert up.stats.files_offloaded == 0
    image = dict(relay.images)[F1]
    stub = remote.offload_file(relay.dir, F1, sha256=__import__("hashlib").sha256(image).hexdigest(),
                               url="file://x")
    (relay.dir / F1).write_bytes(image)  # as if killed before the local copy was removed
    (relay.dir / (F2 + CF.REMOTE_SUFFIX + CF.TMP_SUFFIX)).write_bytes(b"half a stub")
    assert stub is not None and CF.locate(relay.dir / F1) == relay.dir / F1  # the local copy is read first
    relay.store.close()
    store = RelayStore.open(relay.dir, create=False)  # recovery: the half stub goes, both forms of F1 are fine
    assert store.files() == [F1, F2, F3]
    assert not (relay.dir / (F2 + CF.REMOTE_SUFFIX + CF.TMP_SUFFIX)).exists()
    up2 = remote_uploader(relay, store, bucket, tmp_path)
    up2.run_once()
    assert not (relay.dir / F1).exists() and CF.is_remote(CF.locate(relay.dir / F1))
    with CF.open_relay_file(relay.dir / F1) as f:
        assert f.read(0, len(image)) == image
    store.close()


def remote_uploader(relay, store, bucket, tmp_path):
    from relayproxy.relay.archive import ArchiveUploader

    return ArchiveUploader(relay.dir, bucket, store.files, store.horizon.snapshot, flavour=lambda: store.flavour,
                           interval=0.05, keep_local=(None, 1),
                           location=("file://" + os.fspath(tmp_path / "bucket"), None, None))


def test_a_purge_removes_the_stub_and_the_cached_copy(tmp_path):
    relay, bucket, cache, up = offloaded(tmp_path)
    with CF.open_relay_file(relay.dir / F1) as f:
        f.read(0, f.size())
    assert (tmp_path / "cache" / F1).exists()
    plan = purge_with_policy(relay.store, {}, RetentionPolicy(max_files=2), RetentionStats(), hold=up.first_unsealed)
    assert plan.purge == (F1,)
    assert not (relay.dir / (F1 + CF.REMOTE_SUFFIX)).exists() and not (tmp_path / "cache" / F1).exists()
    assert any(o.key.startswith("files/" + F1) for o in bucket.list())  # the bucket keeps the history
    relay.store.close()


def test_a_process_with_no_archive_configured_reads_through_the_stubs_archive(tmp_path):
    relay, bucket, cache, _up = offloaded(tmp_path)
    image = dict(relay.images)[F1]
    CF._remote_sources.clear()  # as `relayproxy serve` or `inspect` on the directory: nothing configured
    with CF.open_relay_file(relay.dir / F1) as f:
        assert f.read(0, len(image)) == image
    assert (relay.dir / remote.CACHE_DIR / F1).read_bytes() == image
    relay.store.close()


def test_offloading_over_s3_and_reading_back(tmp_path, s3_server):  # noqa: F811
    from relayproxy.relay.objectstore import open_object_store

    bucket = open_object_store(f"s3://{BUCKET}/relay-r", endpoint=s3_server.endpoint, region=REGION,
                               access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)
    relay, bucket, cache, up = offloaded(tmp_path, bucket=bucket)
    image = dict(relay.images)[F1]
    assert CF.is_remote(CF.locate(relay.dir / F1))
    with CF.open_relay_file(relay.dir / F1) as f:
        assert f.read(0, len(image)) == image
    assert up.describe()["cache"]["fetches"] == 1
    relay.store.close()


def test_status_and_metrics_show_offloads_and_the_cache(tmp_path):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from relayproxy.ops.metrics import build_registry
    from relayproxy.ops.status import format_status

    relay, bucket, cache, up = offloaded(tmp_path)
    with CF.open_relay_file(relay.dir / F1) as f:
        f.read(0, f.size())
    doc = up.describe()
    assert doc["files_offloaded"] == 1 and doc["keep_local"] == "1 files"
    assert doc["cache"]["fetches"] == 1 and doc["cache"]["files"] == 1 and doc["cache"]["bytes"] > 0
    fams = {f.name: f for f in text_string_to_metric_families(
        generate_latest(build_registry(lambda: {"archive": doc})).decode())}
    assert fams["relayproxy_archive_files_offloaded"].samples[0].value == 1
    assert fams["relayproxy_archive_cache_fetches"].samples[0].value == 1
    assert fams["relayproxy_archive_cache_bytes"].samples[0].value == doc["cache"]["bytes"]
    shown = format_status({"archive": doc})
    assert "Archive cache:          1 files offloaded (keep local 1 files)" in shown and "1 fetches" in shown
    relay.store.close()


def test_a_file_of_many_parts_is_fetched_in_parallel_in_order_and_a_bad_part_is_named(tmp_path):
    relay = Relay(tmp_path, per_file=1200)
    bucket = FileObjectStore(tmp_path / "bucket")
    up = relay.uploader(bucket, keep_local=(None, 0), location=("file://" + os.fspath(tmp_path / "bucket"), None, None))
    cache = remote.ArchiveCache(bucket, tmp_path / "cache")
    remote.configure(relay.dir, cache)
    step = max(1, len(relay.events) // 60)
    while relay.fed < len(relay.events):
        relay.feed(step)
        up.run_once()
    wait_indexed(relay.dir, [F1, F2])
    up.run_once()
    parts = sorted(o.key for o in bucket.list("files/" + F1 + "/part."))
    assert len(parts) > 2 * remote.FETCH_PARALLEL and CF.is_remote(CF.locate(relay.dir / F1))
    image = dict(relay.images)[F1]
    with CF.open_relay_file(relay.dir / F1) as f:
        assert f.read(0, len(image)) == image
    cache.forget(F1)
    victim = parts[len(parts) // 2]
    stored = tmp_path / "bucket" / victim
    stored.write_bytes(stored.read_bytes()[:-1] + b"\x00")
    with CF.open_relay_file(relay.dir / F1) as f:
        with pytest.raises(CF.StoredFileError) as caught:
            f.read(0, len(image))
    assert caught.value.key == victim
    assert sorted(os.listdir(tmp_path / "cache")) == []  # no copy, no part left behind
    relay.store.close()


def test_a_sender_process_gets_the_relays_bucket_and_cache_without_the_secret(tmp_path, monkeypatch):
    from types import SimpleNamespace

    secret = tmp_path / "secret"
    secret.write_text("the-secret-key\n")
    cfg = SimpleNamespace(archive_url="file://" + os.fspath(tmp_path / "bucket"), archive_endpoint=None,
                          archive_region=None, archive_access_key_id="AKIDEXAMPLE", archive_secret_access_key_file=os.fspath(secret),
                          archive_cache_size="2M", archive_cache_dir=None)
    relay, bucket, _cache, _up = offloaded(tmp_path)
    cache = remote.cache_from_config(cfg, bucket, relay.dir)
    remote.configure(relay.dir, cache)
    env = remote.env_for_children(relay.dir)
    assert list(env) == [remote.CHILD_ENV] and "the-secret-key" not in env[remote.CHILD_ENV]
    CF._remote_sources.clear()
    monkeypatch.setenv(remote.CHILD_ENV, env[remote.CHILD_ENV])
    remote.configure_from_env(relay.dir)  # as the sender process does
    assert remote.CHILD_ENV not in os.environ
    child = CF.remote_source_of(relay.dir)
    assert child.cache_dir == relay.dir / remote.CACHE_DIR and child.max_bytes == 2 << 20 and not child.owner
    image = dict(relay.images)[F1]
    with CF.open_relay_file(relay.dir / F1) as f:
        assert f.read(0, len(image)) == image
    relay.store.close()
