"""Errors the SQL layer answers with: MySQL codes and SQLSTATEs, because a replica or a driver decides what to do
from them (a MySQL replica accepts ER_UNKNOWN_SYSTEM_VARIABLE for GTID_MODE and semi-sync, nothing else)."""

from __future__ import annotations

from ...wire.errors import ER_NOT_SUPPORTED_YET, ER_UNKNOWN_SYSTEM_VARIABLE
from ...wire.results import ErrorResponse

# ---------------------------------------------------------------------------------------------
# Errors: MySQL codes and SQLSTATEs, because a replica or a driver decides what to do from them
# (a MySQL replica accepts ER_UNKNOWN_SYSTEM_VARIABLE for GTID_MODE and semi-sync, nothing else).


class SqlError(Exception):
    """A statement failed; becomes the ERR packet the client sees."""

    def __init__(self, code: int, sqlstate: str, message: str):
        super().__init__(message)
        self.code = code
        self.sqlstate = sqlstate
        self.message = message

    def response(self) -> ErrorResponse:
        return ErrorResponse(self.code, self.sqlstate, self.message)


def unsupported(what: str) -> SqlError:
    return SqlError(
        ER_NOT_SUPPORTED_YET,
        "42000",
        f"relayproxy does not support {what}: a binlog relay answers replication, monitoring and "
        "connection-setup statements only",
    )


def unknown_variable(name: str) -> SqlError:
    return SqlError(ER_UNKNOWN_SYSTEM_VARIABLE, "HY000", f"Unknown system variable '{name}'")
