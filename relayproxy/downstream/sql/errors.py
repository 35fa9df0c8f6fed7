"""Errors the SQL layer answers with: MySQL codes and SQLSTATEs, because a replica or a driver decides what to do
from them (a MySQL replica accepts ER_UNKNOWN_SYSTEM_VARIABLE for GTID_MODE and semi-sync, nothing else)."""

from __future__ import annotations

from ...wire.results import ErrorResponse

# ---------------------------------------------------------------------------------------------
# Errors: MySQL codes and SQLSTATEs, because a replica or a driver decides what to do from them
# (a MySQL replica accepts ER_UNKNOWN_SYSTEM_VARIABLE for GTID_MODE and semi-sync, nothing else).

ER_UNKNOWN_ERROR = 1105
ER_EMPTY_QUERY = 1065
ER_PARSE_ERROR = 1064
ER_NOT_SUPPORTED_YET = 1235
ER_UNKNOWN_SYSTEM_VARIABLE = 1193
ER_INCORRECT_GLOBAL_LOCAL_VAR = 1238
ER_GLOBAL_VARIABLE = 1229
ER_WRONG_VALUE_FOR_VAR = 1231
ER_WRONG_TYPE_FOR_VAR = 1232
ER_BAD_FIELD_ERROR = 1054
ER_NO_TABLES_USED = 1096
ER_SP_DOES_NOT_EXIST = 1305
ER_BAD_DB_ERROR = 1049
ER_UNKNOWN_TARGET_BINLOG = 1373
ER_LOG_IN_USE = 1378
ER_LOG_PURGE_UNKNOWN_ERR = 1379
ER_SPECIFIC_ACCESS_DENIED_ERROR = 1227
ER_NO_SUCH_THREAD = 1094
ER_ERROR_WHEN_EXECUTING_COMMAND = 1220
ER_NONEXISTING_GRANT = 1141
ER_KILL_DENIED_ERROR = 1095
ER_WRONG_ARGUMENTS = 1210
ER_WRONG_PARAMCOUNT_TO_NATIVE_FCT = 1582
ER_MALFORMED_GTID_SET_SPECIFICATION = 1772
ER_REPLICA_CHANNEL_DOES_NOT_EXIST = 3074
WARN_NO_MASTER_INFO = 1617


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
