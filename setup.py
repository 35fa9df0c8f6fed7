"""The metadata is in setup.cfg; this file only adds the optional C extensions: the shared pass's batch writes
(relayproxy/downstream/_sendbatch.c) and the fsync thread (relayproxy/relay/_fsync.c). Without a compiler the build
goes on without them and the pure-Python paths (downstream/sendbatch.py, the fsync thread pool of
upstream/session.py) serve instead."""

import os

from setuptools import Extension, setup

# RELAYPROXY_PURE_PYTHON=1: no extension, a py3-none-any wheel (e.g. for Spark executors, docs/spark.md).
PURE = os.environ.get("RELAYPROXY_PURE_PYTHON", "") not in ("", "0")

setup(ext_modules=[] if PURE else [
    Extension("relayproxy.downstream._sendbatch", ["relayproxy/downstream/_sendbatch.c"], optional=True),
    Extension("relayproxy.relay._fsync", ["relayproxy/relay/_fsync.c"], optional=True),
])
