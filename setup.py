"""The metadata is in setup.cfg; this file only adds the optional C extension of the shared pass
(relayproxy/downstream/_sendbatch.c). Without a compiler the build goes on without it and the pure-Python path
(downstream/sendbatch.py) serves instead."""

import os

from setuptools import Extension, setup

# RELAYPROXY_PURE_PYTHON=1: no extension, a py3-none-any wheel (e.g. for Spark executors, docs/spark.md).
PURE = os.environ.get("RELAYPROXY_PURE_PYTHON", "") not in ("", "0")

setup(ext_modules=[] if PURE else [
    Extension("relayproxy.downstream._sendbatch", ["relayproxy/downstream/_sendbatch.c"], optional=True),
])
