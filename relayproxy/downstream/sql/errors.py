"""Errors the SQL layer answers with: MySQL codes and SQLSTATEs, because a replica or a driver decides what to do
from them (a MySQL replica accepts ER_UNKNOWN_SYSTEM_VARIABLE for GTID_MODE and semi-sync, nothing else)."""

from __future__ import annotations

from ...wire.errors import (  # the SQL layer's codes: re-exported, its modules import them from here
    ER_BAD_DB_ERROR,
    ER_BAD_FIELD_ERROR,
    ER_EMPTY_QUERY,
    ER_ERROR_WHEN_EXECUTING_COMMAND,
    ER_GLOBAL_VARIABLE,
    ER_INCORRECT_GLOBAL_LOCAL_VAR,
    ER_KILL_DENIED_ERROR,
    ER_LOG_IN_USE,
    ER_LOG_PURGE_UNKNOWN_ERR,
    ER_MALFORMED_GTID_SET_SPECIFICATION,
    ER_NONEXISTING_GRANT,
    ER_NOT_SUPPORTED_YET,
    ER_NO_SUCH_THREAD,
    ER_NO_TABLES_USED,
    ER_PARSE_ERROR,
    ER_REPLICA_CHANNEL_DOES_NOT_EXIST,
    ER_SPECIFIC_ACCESS_DENIED_ERROR,
    ER_SP_DOES_NOT_EXIST,
    ER_UNKNOWN_ERROR,
    ER_UNKNOWN_SYSTEM_VARIABLE,
    ER_UNKNOWN_TARGET_BINLOG,
    ER_WRONG_ARGUMENTS,
    ER_WRONG_PARAMCOUNT_TO_NATIVE_FCT,
    ER_WRONG_TYPE_FOR_VAR,
    ER_WRONG_VALUE_FOR_VAR,
    WARN_NO_MASTER_INFO,
)
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


def _unsupported(what: str) -> SqlError:
    return SqlError(
        ER_NOT_SUPPORTED_YET,
        "42000",
        f"relayproxy does not support {what}: a binlog relay answers replication, monitoring and "
        "connection-setup statements only",
    )


def _unknown_variable(name: str) -> SqlError:
    return SqlError(ER_UNKNOWN_SYSTEM_VARIABLE, "HY000", f"Unknown system variable '{name}'")
