"""The one packed-integer codec (binlog/packed.py) and its two faces: the binlog's net_field_length and the client
protocol's length-encoded integer (wire/packets.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.binlog import encoders
from relayproxy.binlog.events import BinlogFormatError
from relayproxy.binlog.packed import PackedIntError, decode_packed, encode_packed
from relayproxy.binlog.views import read_net_field_length
from relayproxy.wire.packets import ProtocolError, lenenc_int, read_lenenc_int
from relayproxy.wire.sqltext import sql_string


@settings(deadline=None)
@given(st.integers(0, (1 << 64) - 1), st.binary(max_size=4))
def test_round_trip_and_the_sizes_mysql_uses(value, tail):
    data = encode_packed(value)
    assert len(data) == (1 if value < 251 else 3 if value < 1 << 16 else 4 if value < 1 << 24 else 9)
    assert decode_packed(data + tail, 0, len(data) + len(tail)) == (value, len(data))
    assert encoders.net_store_length(value) == lenenc_int(value) == data
    assert read_net_field_length(data, 0, len(data)) == read_lenenc_int(data, 0) == (value, len(data))


@pytest.mark.parametrize("data, end, why", [
    (b"", 0, "truncated: packed integer expected"),
    (b"\xfb", 1, "invalid packed integer prefix 0xfb"),
    (b"\xff", 1, "invalid packed integer prefix 0xff"),
    (b"\xfc\x01", 2, "truncated packed integer: needs 3 bytes, 2 left"),
    (b"\xfe\x01\x02\x03\x04\x05\x06\x07\x08", 8, "truncated packed integer: needs 9 bytes, 8 left"),  # end cuts
])
def test_bad_bytes_say_why(data, end, why):
    with pytest.raises(PackedIntError, match=why):
        decode_packed(data, 0, end)
    with pytest.raises(BinlogFormatError):
        read_net_field_length(data, 0, end)
    if end == len(data):
        with pytest.raises(ProtocolError, match="length-encoded integer"):
            read_lenenc_int(data, 0)


@pytest.mark.parametrize("value", [-1, 1 << 64])
def test_values_outside_64_bits_are_refused(value):
    with pytest.raises(ValueError, match="outside"):
        encode_packed(value)
    with pytest.raises(ValueError, match="length-encoded integer"):
        lenenc_int(value)


@settings(deadline=None)
@given(st.text())
def test_sql_string_is_read_back_by_the_relays_own_parser(text):
    from relayproxy.downstream.sql.parser import tokenize

    tokens = tokenize("SELECT " + sql_string(text))
    assert [t.value for t in tokens if t.kind == "string"] == [text]
