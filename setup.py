"""The metadata is in setup.cfg; this file only adds the optional C extension of the shared pass
(relayproxy/downstream/_sendbatch.c). Without a compiler the build goes on without it and the pure-Python path
(downstream/sendbatch.py) serves instead."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("relayproxy.downstream._sendbatch", ["relayproxy/downstream/_sendbatch.c"],
                             optional=True)])
