"""moto's standalone S3 server over real HTTP on 127.0.0.1, for the archive tests (started and stopped by the test;
one that cannot start fails the test, never skips). The server itself is relayproxy/lab/s3server.py's."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from relayproxy.lab.s3server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, MotoServer

__all__ = ["ACCESS_KEY", "BUCKET", "REGION", "SECRET_KEY", "MotoServer", "s3_server", "s3_server_auth"]


@pytest.fixture
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """A running moto server with the bucket ``relay-archive``; the AWS_* variables point boto3 at its keys."""
    yield from _serve(MotoServer(tmp_path_factory.mktemp("moto")))


@pytest.fixture
def s3_server_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """As ``s3_server``, with signatures checked: only ``access_key`` / ``secret_key`` (an IAM user's) get in."""
    yield from _serve(MotoServer(tmp_path_factory.mktemp("moto"), auth=True))


def _serve(server: MotoServer) -> Iterator[MotoServer]:
    try:
        server.start()
    except Exception as exc:  # noqa: BLE001 - whatever kept it from starting: the test fails, naming it
        server.stop()
        pytest.fail(f"cannot start moto's S3 server: {exc}", pytrace=False)
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        server.create_bucket()
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
