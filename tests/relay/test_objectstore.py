"""The archive's object store seam against its two backends: a directory (file://) and moto's S3 server over HTTP."""

from __future__ import annotations

import pytest

from relayproxy.relay.objectstore import (
    FileObjectStore,
    ObjectNotFound,
    ObjectStoreError,
    S3ObjectStore,
    display_url,
    open_object_store,
)
from tests.support.s3server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, s3_server, s3_server_auth  # noqa: F401


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    if request.param == "file":
        return open_object_store(f"file://{tmp_path / 'bucket'}")
    server = request.getfixturevalue("s3_server")
    return open_object_store(f"s3://{BUCKET}/some/prefix", endpoint=server.endpoint, region=REGION,
                             access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)


def test_put_get_head_list_delete(store, tmp_path):
    store.put("files/a/part.1", b"0123456789", {"sha256": "abc", "encoding": "plain"})
    src = tmp_path / "src"
    src.write_bytes(b"x" * 100_000)
    store.put("files/b/part.2", src)
    store.put("horizon.json", b"{}")
    assert store.get("files/a/part.1") == b"0123456789"
    assert store.get("files/a/part.1", 2, 5) == b"234"
    assert store.get("files/a/part.1", 7) == b"789"
    info = store.head("files/a/part.1")
    assert (info.size, info.metadata) == (10, {"sha256": "abc", "encoding": "plain"})
    assert store.head("files/missing") is None
    assert [(o.key, o.size) for o in store.list("files/")] == [("files/a/part.1", 10), ("files/b/part.2", 100_000)]
    assert sorted(o.key for o in store.list()) == ["files/a/part.1", "files/b/part.2", "horizon.json"]
    dest = tmp_path / "dest"
    store.get_file("files/b/part.2", dest)
    assert dest.read_bytes() == src.read_bytes()
    store.delete("files/a/part.1")
    assert store.head("files/a/part.1") is None
    with pytest.raises(ObjectNotFound) as caught:
        store.get("files/a/part.1")
    assert caught.value.key == "files/a/part.1"


def test_file_store_writes_leave_no_temporary_files(tmp_path):
    store = FileObjectStore(tmp_path / "b")
    store.put("k/v", b"1")
    store.put("k/v", b"22")
    assert sorted(p.name for p in (tmp_path / "b" / "k").iterdir()) == ["v", "v.rpxmeta"]
    assert [o.key for o in store.list()] == ["k/v"]
    with pytest.raises(ValueError):
        store.put("../escape", b"")


def test_unreachable_endpoint_fails_within_the_bounds_naming_the_key():
    store = S3ObjectStore("b", "p", endpoint="http://127.0.0.1:9", region=REGION, access_key_id="k",
                          secret_access_key="s", connect_timeout=0.5, read_timeout=0.5, max_attempts=2)
    with pytest.raises(ObjectStoreError) as caught:
        store.put("files/x", b"1")
    assert "'files/x'" in str(caught.value)


def test_a_missing_bucket_is_an_error(s3_server):  # noqa: F811
    store = open_object_store("s3://no-such-bucket/p", endpoint=s3_server.endpoint, region=REGION,
                              access_key_id="k", secret_access_key="s")
    with pytest.raises(ObjectStoreError) as caught:
        store.put("a", b"1")
    assert "NoSuchBucket" in str(caught.value)


def test_wrong_credentials_are_an_error_that_does_not_show_them(s3_server_auth):  # noqa: F811
    store = open_object_store(f"s3://{BUCKET}/p", endpoint=s3_server_auth.endpoint, region=REGION,
                              access_key_id=s3_server_auth.access_key, secret_access_key="wrong-secret-value")
    with pytest.raises(ObjectStoreError) as caught:
        store.put("a", b"1")
    assert "SignatureDoesNotMatch" in str(caught.value) and "wrong-secret-value" not in str(caught.value)
    good = open_object_store(f"s3://{BUCKET}/p", endpoint=s3_server_auth.endpoint, region=REGION,
                             access_key_id=s3_server_auth.access_key, secret_access_key=s3_server_auth.secret_key)
    good.put("a", b"1")
    assert good.get("a") == b"1"


def test_urls():
    assert display_url("s3://key:secret@bucket/p") == "s3://bucket/p"
    assert display_url("file:///x") == "file:///x"
    for bad in ("http://x/y", "file://host/x", "s3:///p"):
        with pytest.raises(ValueError):
            open_object_store(bad)
