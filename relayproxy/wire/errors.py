"""The MySQL error codes the relay uses, in one table: the servers' (ER_*, WARN_*) and the client library's (CR_*).

Numbers are the servers' own (MySQL include/mysqld_error.h, from share/messages_to_clients.txt; MariaDB
sql/share/errmsg-utf8.txt), client codes include/errmsg.h; the comments give the SQLSTATE and text for reference,
the code that answers with one spells its own. Every layer that speaks to a MySQL peer imports its codes from here
(this module imports nothing, so it sits below all of them).
"""

# -- server error codes -------------------------------------------------------------------------------------------

ER_CON_COUNT_ERROR = 1040  # 08004 "Too many connections"
ER_HANDSHAKE_ERROR = 1043  # 08S01 "Bad handshake"
ER_ACCESS_DENIED_ERROR = 1045  # 28000 "Access denied for user '%s'@'%s' (using password: %s)"
ER_NO_DB_ERROR = 1046  # 3D000 "No database selected"
ER_UNKNOWN_COM_ERROR = 1047  # 08S01 "Unknown command"
ER_BAD_DB_ERROR = 1049  # 42000 "Unknown database '%s'"
ER_BAD_FIELD_ERROR = 1054  # 42S22 "Unknown column '%s' in '%s'"
ER_PARSE_ERROR = 1064  # 42000 "You have an error in your SQL syntax; ... near '%s' at line %d"
ER_EMPTY_QUERY = 1065  # 42000 "Query was empty"
ER_NO_SUCH_THREAD = 1094  # HY000 "Unknown thread id: %lu"
ER_KILL_DENIED_ERROR = 1095  # HY000 "You are not owner of thread %lu"
ER_NO_TABLES_USED = 1096  # HY000 "No tables used"
ER_UNKNOWN_ERROR = 1105  # HY000 "Unknown error": the relay's own failures and limits (statement size, option count)
ER_TOO_MANY_FIELDS = 1117  # HY000 "Too many columns"
ER_HOST_IS_BLOCKED = 1129  # HY000 "Host '%s' is blocked because of many connection errors"
ER_NONEXISTING_GRANT = 1141  # 42000 "There is no such grant defined for user '%s' on host '%s'"
ER_NET_PACKET_TOO_LARGE = 1153  # 08S01 "Got a packet bigger than 'max_allowed_packet' bytes"
ER_NET_PACKETS_OUT_OF_ORDER = 1156  # 08S01 "Got packets out of order"
ER_NET_READ_INTERRUPTED = 1159  # 08S01 "Got timeout reading communication packets"
ER_UNKNOWN_SYSTEM_VARIABLE = 1193  # HY000 "Unknown system variable '%s'"
ER_SLAVE_MUST_STOP = 1198  # HY000 "This operation cannot be performed with a running slave; run STOP SLAVE first"
ER_BAD_SLAVE = 1200  # HY000 "The server is not configured as slave; fix in config file or with CHANGE MASTER TO"
ER_WRONG_ARGUMENTS = 1210  # HY000 "Incorrect arguments to %s" (CHANGE MASTER TO MASTER_HOST='' answers it)
ER_ERROR_WHEN_EXECUTING_COMMAND = 1220  # HY000 "Error when executing command %s: %s"
ER_DUP_ARGUMENT = 1225  # HY000 "Option '%s' used twice in statement" (MariaDB, for MASTER_USE_GTID)
ER_SPECIFIC_ACCESS_DENIED_ERROR = 1227  # 42000 "Access denied; you need (at least one of) the %s privilege(s)"
ER_GLOBAL_VARIABLE = 1229  # HY000 "Variable '%s' is a GLOBAL variable and should be set with SET GLOBAL"
ER_WRONG_VALUE_FOR_VAR = 1231  # 42000 "Variable '%s' can't be set to the value of '%s'" (also a replica's
# @master_heartbeat_period and friends that no integer holds)
ER_WRONG_TYPE_FOR_VAR = 1232  # 42000 "Incorrect argument type to variable '%s'"
ER_NOT_SUPPORTED_YET = 1235  # 42000 "This version of MySQL doesn't yet support '%s'"
ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236  # HY000: the replica's IO thread stops for good on this one
ER_INCORRECT_GLOBAL_LOCAL_VAR = 1238  # HY000 "Variable '%s' is a %s variable"
ER_NOT_SUPPORTED_AUTH_MODE = 1251  # 08004 "Client does not support authentication protocol requested by server"
ER_WARN_ALLOW_MAX_PACKET_SIZE = 1301  # HY000 (a warning) "Result of %s() was larger than max_allowed_packet"
ER_SP_DOES_NOT_EXIST = 1305  # 42000 "%s %s does not exist"
ER_ILLEGAL_VALUE_FOR_TYPE = 1367  # 22007 "Illegal %s '%s' value found during parsing"
ER_UNKNOWN_TARGET_BINLOG = 1373  # HY000 "Target log not found in binlog index"
ER_LOG_IN_USE = 1378  # HY000 "A purgeable log is in use, will not purge"
ER_LOG_PURGE_UNKNOWN_ERR = 1379  # HY000 "Unknown error during log purge"
ER_WRONG_PARAMCOUNT_TO_NATIVE_FCT = 1582  # 42000 "Incorrect parameter count in the call to native function '%s'"
WARN_NO_MASTER_INFO = 1617  # HY000, MariaDB's text: "There is no master connection '%.*s'"
ER_SLAVE_HEARTBEAT_VALUE_OUT_OF_RANGE = 1624  # HY000, both (renamed ER_REPLICA_... in MySQL 8).
# Not 1703: 1703/1704 (..._OUT_OF_RANGE_MIN/_MAX) are the warnings for a period under 1 ms (reset to 0) or over
# slave_net_timeout; only 1624 is an error.
ER_DATA_OUT_OF_RANGE = 1690  # 22003 "%s value is out of range in '%s'"
ER_MALFORMED_GTID_SET_SPECIFICATION = 1772  # HY000 "Malformed GTID set specification '%s'"
ER_MALFORMED_GTID_SET_ENCODING = 1773  # HY000 "Malformed GTID set encoding"
ER_BAD_SLAVE_AUTO_POSITION = 1776  # HY000, MySQL: MASTER_AUTO_POSITION=1 with MASTER_LOG_FILE/POS
ER_MALFORMED_PACKET = 1835  # HY000 "Malformed communication packet"
ER_STATEMENT_TIMEOUT = 1969  # 70100, MariaDB: max_statement_time exceeded
ER_QUERY_TIMEOUT = 3024  # HY000, MySQL: max_execution_time exceeded
ER_REPLICA_CHANNEL_DOES_NOT_EXIST = 3074  # HY000, MySQL: "Replication channel '%s' does not exist."
ER_CLIENT_INTERACTION_TIMEOUT = 4031  # HY000, MySQL 8.0.24+: the server closed an idle connection

# -- client-side error codes (include/errmsg.h), for errors the client itself detects ----------------------------

CR_UNKNOWN_ERROR = 2000
CR_CONN_HOST_ERROR = 2003
CR_SERVER_GONE_ERROR = 2006
CR_SERVER_HANDSHAKE_ERR = 2012
CR_SERVER_LOST = 2013
CR_COMMANDS_OUT_OF_SYNC = 2014
CR_NET_PACKET_TOO_LARGE = 2020
CR_SSL_CONNECTION_ERROR = 2026
CR_MALFORMED_PACKET = 2027
CR_AUTH_PLUGIN_CANNOT_LOAD = 2059
CR_AUTH_PLUGIN_ERR = 2061
