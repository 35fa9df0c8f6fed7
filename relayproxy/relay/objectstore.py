"""The object store seam of the archive: put, get (whole or a byte range), head, list by prefix, delete, over
``file:///path`` (a directory) or ``s3://bucket/prefix`` (any S3-compatible endpoint, through boto3).

Keys are relative to the URL's root (``files/binlog.000001/part...``): the S3 backend puts them under the
URL's prefix, the file backend under its directory. Objects are written whole and never appended to (S3 has no
append): the archive (``relay/archive.py``) writes each one once.

The file backend writes atomically (temporary file in the same directory, fsync, rename, directory fsync); an
object's metadata is a sidecar ``<key>.rpxmeta`` written first, so an object is there only once its data is
renamed into place; listings never show sidecars or temporary files.

Why boto3 and not obstore: boto3/botocore is the client every S3-compatible server is tested against (its
``endpoint_url`` reaches MinIO, Ceph, R2 or moto's standalone server alike), botocore brings bounded
connect/read timeouts and its standard retry mode with backoff on 5xx and throttling, credentials come from the
standard AWS chain (environment, shared config and credentials files, instance roles) with no code of ours, and
its API is synchronous, which fits the archive's one background thread (obstore's strength, an async API over
Rust, would need an event loop in that thread for no gain). Credentials are never logged: ``url`` (what status
shows) has none, and errors name the bucket and key only.
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

__all__ = [
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "FileObjectStore",
    "S3ObjectStore",
    "open_object_store",
    "from_config",
    "display_url",
]

META_SUFFIX = ".rpxmeta"
TMP_SUFFIX = ".rpxtmp"
CONNECT_TIMEOUT = 5.0  # seconds, per connection attempt
READ_TIMEOUT = 30.0  # seconds without a byte on an open connection
MAX_ATTEMPTS = 4  # botocore's standard retry mode: 5xx, throttling and connection errors, with backoff


class ObjectStoreError(RuntimeError):
    """The store could not do what was asked (unreachable, refused, credentials wrong); names the key, never a secret."""


class ObjectNotFound(ObjectStoreError):
    """No object under that key."""

    def __init__(self, key: str):
        super().__init__(f"no object {key!r}")
        self.key = key


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the store's root
    size: int
    metadata: dict[str, str] = field(default_factory=dict)  # filled by head(); list() leaves it empty


class ObjectStore(Protocol):
    """What the archive needs of a bucket. ``data`` is bytes or a Path to stream from."""

    url: str  # the URL without credentials, for status and logs

    def put(self, key: str, data: bytes | Path, metadata: dict[str, str] | None = None) -> None: ...

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes: ...

    def get_file(self, key: str, dest: Path) -> None: ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]: ...

    def delete(self, key: str) -> None: ...


def display_url(url: str) -> str:
    """``url`` without any user:password@ part (what status and logs show)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _check_key(key: str) -> str:
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in key.split("/")):
        raise ValueError(f"bad object key {key!r}")
    if key.endswith(META_SUFFIX) or key.endswith(TMP_SUFFIX):
        raise ValueError(f"object key {key!r} ends with a suffix the file store reserves")
    return key


# ---------------------------------------------------------------------------------------------
# file:///path


class FileObjectStore:
    """Objects as files under one directory (``file:///path``): tests, small sites, a mounted volume."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.url = "file://" + os.fspath(self.root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def _write(self, path: Path, data: bytes | Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.{os.urandom(4).hex()}{TMP_SUFFIX}")
        try:
            with open(tmp, "wb") as out:
                if isinstance(data, (bytes, bytearray, memoryview)):
                    out.write(data)
                else:
                    with open(data, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.rename(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put(self, key: str, data: bytes | Path, metadata: dict[str, str] | None = None) -> None:
        import json

        path = self._path(key)
        try:
            self._write(path.with_name(path.name + META_SUFFIX),
                        json.dumps(metadata or {}, sort_keys=True).encode())
            self._write(path, data)
        except OSError as exc:
            raise ObjectStoreError(f"cannot write object {key!r} under {self.root}: {exc.strerror or exc}") from exc

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                if start:
                    f.seek(start)
                return f.read() if end is None else f.read(end - (start or 0))
        except FileNotFoundError:
            raise ObjectNotFound(key) from None
        except OSError as exc:
            raise ObjectStoreError(f"cannot read object {key!r}: {exc.strerror or exc}") from exc

    def get_file(self, key: str, dest: Path) -> None:
        try:
            shutil.copyfile(self._path(key), dest)
        except FileNotFoundError:
            raise ObjectNotFound(key) from None
        except OSError as exc:
            raise ObjectStoreError(f"cannot read object {key!r}: {exc.strerror or exc}") from exc

    def head(self, key: str) -> ObjectInfo | None:
        import json

        path = self._path(key)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return None
        try:
            metadata = json.loads(path.with_name(path.name + META_SUFFIX).read_text())
        except (OSError, ValueError):
            metadata = {}
        return ObjectInfo(key, size, {str(k): str(v) for k, v in metadata.items()})

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        found = []
        for dirpath, _dirs, names in os.walk(self.root):
            for name in names:
                if name.endswith(META_SUFFIX) or name.endswith(TMP_SUFFIX):
                    continue
                path = Path(dirpath) / name
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    try:
                        found.append(ObjectInfo(key, path.stat().st_size))
                    except FileNotFoundError:
                        continue
        return iter(sorted(found, key=lambda o: o.key))

    def delete(self, key: str) -> None:
        path = self._path(key)
        for p in (path, path.with_name(path.name + META_SUFFIX)):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


# ---------------------------------------------------------------------------------------------
# s3://bucket/prefix


class S3ObjectStore:
    """Objects in an S3 bucket under a prefix, through boto3 (any S3-compatible endpoint)."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint: str | None = None, region: str | None = None,
                 access_key_id: str | None = None, secret_access_key: str | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT, read_timeout: float = READ_TIMEOUT,
                 max_attempts: int = MAX_ATTEMPTS):
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        if endpoint:
            self.url += f" (endpoint {display_url(endpoint)})"
        config = Config(connect_timeout=connect_timeout, read_timeout=read_timeout,
                        retries={"max_attempts": max_attempts, "mode": "standard"},
                        s3={"addressing_style": "path"} if endpoint else None)
        kwargs = {}
        if access_key_id or secret_access_key:
            kwargs = {"aws_access_key_id": access_key_id, "aws_secret_access_key": secret_access_key}
        session = boto3.session.Session(region_name=region or None, **kwargs)
        self._client = session.client("s3", endpoint_url=endpoint or None, config=config)
        from botocore.exceptions import BotoCoreError, ClientError

        self._errors = (BotoCoreError, ClientError)

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _error(self, what: str, key: str, exc: BaseException) -> ObjectStoreError:
        response = getattr(exc, "response", None) or {}
        code = (response.get("Error") or {}).get("Code")
        if code in ("NoSuchKey", "404", "NotFound"):
            return ObjectNotFound(key)
        detail = f"{code}: " if code else ""
        # botocore's messages name the operation and the server's answer; never the credentials.
        return ObjectStoreError(f"cannot {what} {key!r} in {self.url}: {detail}{exc}")

    def put(self, key: str, data: bytes | Path, metadata: dict[str, str] | None = None) -> None:
        full = self._key(key)
        try:
            if isinstance(data, (bytes, bytearray, memoryview)):
                self._client.put_object(Bucket=self.bucket, Key=full, Body=bytes(data), Metadata=metadata or {})
            else:
                with open(data, "rb") as f:  # multipart above botocore's threshold, so no size limit
                    self._client.upload_fileobj(f, self.bucket, full, ExtraArgs={"Metadata": metadata or {}})
        except self._errors as exc:
            raise self._error("put", key, exc) from exc
        except Exception as exc:  # boto3's transfer manager wraps errors in its own types
            if type(exc).__module__.startswith(("boto3", "botocore", "s3transfer")):
                raise self._error("put", key, exc) from exc
            raise

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        full = self._key(key)
        kwargs = {}
        if start is not None or end is not None:
            if end is not None and end <= (start or 0):
                return b""
            kwargs["Range"] = f"bytes={start or 0}-" + ("" if end is None else str(end - 1))
        try:
            answer = self._client.get_object(Bucket=self.bucket, Key=full, **kwargs)
            return answer["Body"].read()
        except self._errors as exc:
            raise self._error("get", key, exc) from exc

    def get_file(self, key: str, dest: Path) -> None:
        full = self._key(key)
        try:
            answer = self._client.get_object(Bucket=self.bucket, Key=full)
            with open(dest, "wb") as out:
                for chunk in answer["Body"].iter_chunks(1 << 20):
                    out.write(chunk)
        except self._errors as exc:
            raise self._error("get", key, exc) from exc

    def head(self, key: str) -> ObjectInfo | None:
        full = self._key(key)
        try:
            answer = self._client.head_object(Bucket=self.bucket, Key=full)
        except self._errors as exc:
            error = self._error("head", key, exc)
            if isinstance(error, ObjectNotFound):
                return None
            raise error from exc
        return ObjectInfo(key, int(answer.get("ContentLength", 0)), dict(answer.get("Metadata") or {}))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        root = f"{self.prefix}/" if self.prefix else ""
        found = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root + prefix)
            for page in pages:
                for item in page.get("Contents", ()):
                    found.append(ObjectInfo(item["Key"][len(root):], int(item["Size"])))
        except self._errors as exc:
            raise self._error("list", prefix or "(all)", exc) from exc
        return iter(found)

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except self._errors as exc:
            raise self._error("delete", key, exc) from exc


def open_object_store(url: str, *, endpoint: str | None = None, region: str | None = None,
                      access_key_id: str | None = None, secret_access_key: str | None = None) -> ObjectStore:
    """The store a URL names: ``file:///path`` or ``s3://bucket[/prefix]``. ValueError for anything else."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise ValueError(f"archive URL {display_url(url)!r}: a file URL is file:///absolute/path")
        return FileObjectStore(Path(urllib.parse.unquote(parts.path)))
    if parts.scheme == "s3":
        if not parts.hostname:
            raise ValueError(f"archive URL {display_url(url)!r}: an S3 URL is s3://bucket/prefix")
        return S3ObjectStore(parts.hostname, parts.path, endpoint=endpoint, region=region,
                             access_key_id=access_key_id, secret_access_key=secret_access_key)
    raise ValueError(f"archive URL {display_url(url)!r}: expected file:///path or s3://bucket/prefix")


def from_config(cfg, *, url: str | None = None) -> ObjectStore:
    """The archive store of the relay's options (archive_url, or ``url``; archive_endpoint, archive_region, the
    key pair)."""
    secret = None
    path = getattr(cfg, "archive_secret_access_key_file", None)
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"archive_secret_access_key_file {path!r}: {exc.strerror or exc}") from None
        secret = text.splitlines()[0].strip() if text.strip() else ""
    key_id = getattr(cfg, "archive_access_key_id", None)
    if bool(key_id) != bool(secret):
        raise ValueError("set archive_access_key_id and archive_secret_access_key_file together (or neither: "
                         "the standard AWS credential chain)")
    return open_object_store(url or cfg.archive_url, endpoint=getattr(cfg, "archive_endpoint", None),
                             region=getattr(cfg, "archive_region", None), access_key_id=key_id,
                             secret_access_key=secret)
