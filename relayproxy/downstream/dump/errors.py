"""How a dump ends: the servers' error codes and texts (ERR 1236 and friends, word for word from MySQL's
``rpl_binlog_sender.cc`` and MariaDB's ``sql_repl.cc``), the failure types, and the NON_BLOCK EOF."""

from __future__ import annotations

from ...wire.errors import ER_MASTER_FATAL_ERROR_READING_BINLOG
from ...wire.packets import CLIENT_DEPRECATE_EOF, EOF_HEADER
from ...wire.results import encode_eof, encode_ok

# -- error codes and texts (all reach the replica as ERR packets) ----------------------------------

MSG_NO_FILE = "Could not find first log file name in binary log index file"
MSG_POS_LT_4 = "Client requested master to start replication from position < 4"
MSG_POS_GT_SIZE = "Client requested master to start replication from position > file size"
MSG_MARIA_IMPOSSIBLE_POS = "Client requested master to start replication from impossible position"
MSG_CHECKSUM = "Slave can not handle replication events with the checksum that master is configured to log"
MSG_CRC = "event read from binlog did not pass crc check"
MSG_TRUNCATED = "binlog truncated in the middle of event; consider out of disk space on master"
MSG_BOGUS = "bogus data in log event"
MSG_IO = "I/O error reading log event"
MSG_BAD_MAGIC = "Binlog has bad magic number;  It's not a binary log file that can be used by this version of MySQL"
MSG_NO_FDE_MYSQL = "Could not find format_description_event in binlog file"
MSG_NO_FDE_MARIADB = "Failed to find format descriptor event in start of binlog"
MSG_NEXT_LOG = "could not find next log"
MSG_OPEN = "Could not open log file"
# A forced retention purge (or anything else) removed the file this dump reads: the dump stops at
# once (not at the end of the file) so the file's disk space is really freed.
MSG_FILE_PURGED = "Could not open log file: %s was purged from the relay while this replica was reading it"
MSG_GTID_MODE_OFF = (
    "The replication sender thread cannot start in AUTO_POSITION mode: this server has GTID_MODE = OFF instead of ON."
)
MSG_OLD_BINLOG = (
    "Found old binary log without GTIDs while looking for the oldest binary log that contains any GTID "
    "that is not in the given gtid set"
)
MSG_ANONYMOUS = "Cannot replicate anonymous transaction when AUTO_POSITION = 1, at file %s, position %d."
# ER_SLAVE_HAS_MORE_GTIDS_THAN_MASTER (1885); 8.0.26 renamed it ER_REPLICA_HAS_MORE_GTIDS_THAN_SOURCE
# and rewrote the text with source/replica, which is what a replica of an 8.0.26+ master shows.
MSG_MORE_GTIDS = {
    False: (
        "Slave has more GTIDs than the master has, using the master's SERVER_UUID. This may indicate that the end "
        "of the binary log was truncated or that the last binary log file was lost, e.g., after a power or disk "
        "failure when sync_binlog != 1. The master may or may not have rolled back transactions that were already "
        "replicated to the slave. Suggest to replicate any transactions that master has rolled back from slave to "
        "master, and/or commit empty transactions on master to account for transactions that have been committed "
        "on master but are not included in GTID_EXECUTED."
    ),
    True: (
        "Replica has more GTIDs than the source has, using the source's SERVER_UUID. This may indicate that the end "
        "of the binary log was truncated or that the last binary log file was lost, e.g., after a power or disk "
        "failure when sync_binlog != 1. The source may or may not have rolled back transactions that were already "
        "replicated to the replica. Suggest to replicate any transactions that source has rolled back from replica "
        "to source, and/or commit empty transactions on source to account for transactions that have been committed "
        "on source but are not included in GTID_EXECUTED."
    ),
}
# ER_MASTER_HAS_PURGED_REQUIRED_GTIDS (1789) as report_missing_purged_gtids formats it.
MSG_PURGED = {
    False: (
        "Cannot replicate because the master purged required binary logs. Replicate the missing transactions from "
        "elsewhere, or provision a new slave from backup. Consider increasing the master's binary log expiration "
        "period. The GTID set sent by the slave is '%s', and the missing transactions are '%s'"
    ),
    True: (
        "Cannot replicate because the source purged required binary logs. Replicate the missing transactions from "
        "elsewhere, or provision a new replica from backup. Consider increasing the source's binary log expiration "
        "period. The GTID set sent by the replica is '%s', and the missing transactions are '%s'"
    ),
}
# MariaDB sql_repl.cc, mysql_binlog_send() and gtid_find_binlog_file().
MSG_MARIA_NOT_IN_BINLOG = "Error: connecting slave requested to start from GTID %s, which is not in the master's binlog"
MSG_MARIA_NOT_IN_BINLOG2 = (
    "Error: connecting slave requested to start from GTID %s, which is not in the master's binlog. Since the "
    "master's binlog contains GTIDs with higher sequence numbers, it probably means that the slave has diverged "
    "due to executing extra erroneous transactions"
)
MSG_MARIA_HOLE = (
    "The binlog on the master is missing the GTID %s requested by the slave (even though both a prior and a "
    "subsequent sequence number does exist), and GTID strict mode is enabled"
)
MSG_MARIA_NO_STATE = (
    "Could not find GTID state requested by slave in any binlog files. Probably the slave state is too old and "
    "required binlog files have been purged."
)
MSG_MARIA_BAD_STATE = "Out of memory or malformed slave request when obtaining start position from GTID state"
MSG_MARIA_ANNOTATE_DUMMY = "Failed to replace row annotate event with dummy: too small event."
MSG_MARIA_GTID_COMPAT = "Failed to replace GTID event with backwards-compatible event: currupt event."  # sic
MSG_MARIA_LIST_DUMMY = "Failed to replace binlog checkpoint or gtid list event with dummy: too small event."

# ---------------------------------------------------------------------------------------------
# Failures
# ---------------------------------------------------------------------------------------------


class DumpFailure(Exception):
    """Ends the dump with an ERR packet. ``with_position`` adds the servers' "; the first event ..." suffix,
    which both servers append to 1236 errors raised while a binlog file is open."""

    def __init__(self, message: str, code: int = ER_MASTER_FATAL_ERROR_READING_BINLOG, *, sqlstate: str = "HY000",
                 with_position: bool = False, last_event: int | None = None, last_byte: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.sqlstate = sqlstate
        self.with_position = with_position
        self.last_event = last_event
        self.last_byte = last_byte


class ReplicaGone(Exception):
    """The replica closed the connection: the dump ends without a word."""


class DumpFinished(Exception):
    """NON_BLOCK dump reached the end of the relay: EOF was sent."""


def read_failure(message: str, event_at: int, byte_at: int) -> DumpFailure:
    return DumpFailure(message, with_position=True, last_event=event_at, last_byte=byte_at)


def eof_payload(capabilities: int) -> bytes:
    """What ``my_eof`` sends at the end of a NON_BLOCK dump: an EOF packet, or the 0xFE-headed OK of
    CLIENT_DEPRECATE_EOF clients. Both are shorter than 9 bytes, which is how a replica recognises the end."""
    if capabilities & CLIENT_DEPRECATE_EOF:
        return encode_ok(header=EOF_HEADER)
    return encode_eof()


def maria_not_in_binlog(gtid, binlog) -> DumpFailure:
    """give_error_start_pos_missing_in_binlog(): the "diverged" variant when the binlog (a ``MariaBinlogState``)
    is past the requested GTID."""
    latest = binlog.latest(gtid.domain_id)
    if latest is not None and latest.seq_no >= gtid.seq_no:
        return DumpFailure(MSG_MARIA_NOT_IN_BINLOG2 % (gtid,))
    return DumpFailure(MSG_MARIA_NOT_IN_BINLOG % (gtid,))
