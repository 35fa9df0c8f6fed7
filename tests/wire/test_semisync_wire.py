"""The semi-sync bytes of wire/semisync.py: the ACK a replica sends is what MySQL and MariaDB masters read
(protocol-reference §3.9: 0xEF, the end position as a little-endian u64, the file name without a NUL)."""

from __future__ import annotations

import struct

from relayproxy.wire.semisync import (
    SEMI_SYNC_HEADER,
    SEMI_SYNC_INDICATOR,
    SEMI_SYNC_NEED_ACK,
    encode_semi_sync_ack,
    parse_semi_sync_ack,
)


def test_the_ack_is_the_indicator_the_position_and_the_file_name():
    ack = encode_semi_sync_ack("mysql-bin.000042", 0x0102030405)
    assert ack == b"\xef" + b"\x05\x04\x03\x02\x01\x00\x00\x00" + b"mysql-bin.000042"
    assert ack == bytes([0xEF]) + struct.pack("<Q", 0x0102030405) + b"mysql-bin.000042"
    assert len(ack) == 9 + len("mysql-bin.000042")  # no NUL after the name
    assert ack[0] == SEMI_SYNC_INDICATOR == 0xEF


def test_a_position_past_4_gib_keeps_all_eight_bytes():
    assert encode_semi_sync_ack("b.1", (5 << 32) + 7)[1:9] == struct.pack("<Q", (5 << 32) + 7)


def test_an_ack_reads_back_and_other_packets_are_not_acks():
    assert parse_semi_sync_ack(encode_semi_sync_ack("binlog.000004", 1234)) == ("binlog.000004", 1234)
    assert parse_semi_sync_ack(memoryview(encode_semi_sync_ack("binlog.000004", 4))) == ("binlog.000004", 4)
    assert parse_semi_sync_ack(b"\xef" + struct.pack("<Q", 4)) is None  # no file name
    assert parse_semi_sync_ack(b"\x00" + struct.pack("<Q", 4) + b"binlog.000004") is None
    assert parse_semi_sync_ack(b"") is None


def test_the_event_header_asks_for_an_ack_with_its_flag_byte():
    assert SEMI_SYNC_HEADER == (b"\x00\xef\x00", b"\x00\xef\x01")
    assert SEMI_SYNC_HEADER[True][2] & SEMI_SYNC_NEED_ACK and not SEMI_SYNC_HEADER[False][2] & SEMI_SYNC_NEED_ACK
