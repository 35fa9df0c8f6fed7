"""How an upstream connection ends badly: the session's refusals (a master it may not stream from, coordinates a
new master cannot serve, a replication admin statement it refuses) and the bounded ``kind`` label of any error that
ended a connection (the upstream error metrics, docs/metrics.md)."""

from __future__ import annotations

import asyncio
import errno

from ..relay.errors import RelayStoreError
from ..wire.packets import MySQLError
from .receiver import ChecksumMismatch, MasterStreamEnded, StreamError

__all__ = ["UPSTREAM_ERROR_KINDS", "CoordinatesRefused", "MasterRefused", "ReplicationAdminError",
           "upstream_error_kind"]


class MasterRefused(StreamError):
    """The master is not one the relay may stream from (another server than its files came from, or one that
    lacks GTIDs the relay holds): nothing is written; the operator decides (CHANGE MASTER)."""


class CoordinatesRefused(MasterRefused):
    """MASTER_LOG_FILE/MASTER_LOG_POS name no transaction boundary of the new master (no such file, beyond its end,
    inside an event or a transaction): shown as a replica shows a position its master cannot serve (1236)."""

    code = 1236


class ReplicationAdminError(Exception):
    """A replication admin statement the session refuses; ``code``/``sqlstate``/``message`` are the SQL answer."""

    def __init__(self, code: int, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.sqlstate = sqlstate
        self.message = message


UPSTREAM_ERROR_KINDS = ("io", "timeout", "master", "protocol", "crc", "store", "disk_full", "internal")
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_STORAGE_ONLY = (errno.EIO, errno.EROFS, errno.EFBIG)


def upstream_error_kind(exc: BaseException) -> str:
    """The bounded ``kind`` label of an error that ended an upstream connection (see docs/metrics.md).

    io: the connection failed or was lost (including the master ending the stream); timeout: connect
    timeout or a silent master; master: an error the master sent (e.g. 1236), or a master the relay refuses
    (another server than its files came from, or one lacking GTIDs the relay holds); protocol: the stream
    broke a rule; crc: an event's CRC32 did not match; store: the relay store failed; disk_full:
    ... because the disk or quota is full; internal: a bug.
    """
    cause: BaseException | None = exc
    while cause is not None:  # a store failure carries the OSError that caused it
        if isinstance(cause, OSError) and cause.errno in _DISK_FULL:
            return "disk_full"
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, MySQLError):
        return "io" if exc.code >= 2000 else "master"  # 2000+: client-side CR_* codes (connection lost ...)
    if isinstance(exc, MasterStreamEnded):
        return "io"
    if isinstance(exc, MasterRefused):
        return "master"
    if isinstance(exc, StreamError):
        return "crc" if isinstance(exc, ChecksumMismatch) else "protocol"
    if isinstance(exc, RelayStoreError):
        return "store"
    if isinstance(exc, OSError):
        return "store" if exc.errno in _STORAGE_ONLY else "io"  # sockets never fail with these
    return "internal"
