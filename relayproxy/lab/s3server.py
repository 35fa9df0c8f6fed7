"""moto's standalone S3 server (``python -m moto.server``) over real HTTP on 127.0.0.1, for the archive tests
(tests/support/s3server.py's fixtures) and benchmarks/archive_lag.py: start, pause, stop, a client, what it logged."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from relayproxy.lab.relayprocess import free_port

BUCKET = "relay-archive"
ACCESS_KEY = "testing-key-id"
SECRET_KEY = "testing-secret-key"
REGION = "us-east-1"


class MotoServer:
    """One moto server process; ``stop()`` and ``start()`` again on the same port (its objects are kept in memory by
    the process, so a stop loses them: tests that stop it use ``pause()``/``resume()``, SIGSTOP/SIGCONT)."""

    def __init__(self, log_dir: Path, *, auth: bool = False):
        self.auth = auth  # moto checks signatures (after its first few requests, which create the keys)
        self.access_key, self.secret_key = ACCESS_KEY, SECRET_KEY
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_dir) / "moto.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> None:
        log = open(self.log_path, "ab")
        env = dict(os.environ)
        if self.auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"  # creating the IAM user, its policy and its key
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"moto server did not listen on {self.port} within {timeout}s: {self.log_tail()}")
        if self.auth:
            self._make_keys()

    def _make_keys(self) -> None:
        import json

        import boto3

        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id="bootstrap",
                           aws_secret_access_key="bootstrap")
        iam.create_user(UserName="relay")
        iam.put_user_policy(UserName="relay", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="relay")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]

    def pause(self) -> None:
        """The bucket unreachable: connections hang (the process is stopped, its socket still open)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key)

    def create_bucket(self, name: str = BUCKET) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS chain's variables for a relay process that talks to this server."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_DEFAULT_REGION": REGION}

    def log_size(self) -> int:
        """Bytes in moto's log so far (a mark for ``requests``)."""
        return self.log_path.stat().st_size

    def requests(self, since: int, prefix: str, bucket: str = BUCKET) -> dict[str, int]:
        """Requests moto logged after byte ``since`` of its log for keys under ``prefix``, by method."""
        with open(self.log_path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        out: dict[str, int] = {}
        for method, path in re.findall(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (/\S*) HTTP/', text):
            if path.startswith(f"/{bucket}/{prefix}/") or (path.startswith(f"/{bucket}") and f"prefix={prefix}" in
                                                          path.replace("%2F", "/")):
                out[method] = out.get(method, 0) + 1
        return out

    def bucket_objects(self, prefix: str, bucket: str = BUCKET) -> list[tuple[str, int]]:
        """(key, size) of the objects under ``prefix/``."""
        out = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
            out += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
        return out
