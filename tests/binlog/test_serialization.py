"""Tests for the mysql::serialization primitives (varlen integers, strings)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.binlog.events import BinlogFormatError
from relayproxy.binlog.serialization import (
    INT64_MAX,
    INT64_MIN,
    UINT64_MAX,
    read_string,
    read_varlen_int,
    read_varlen_uint,
    string_size,
    varlen_int_size,
    varlen_uint_size,
    write_string,
    write_varlen_int,
    write_varlen_uint,
)

uint64s = st.integers(min_value=0, max_value=UINT64_MAX)
int64s = st.integers(min_value=INT64_MIN, max_value=INT64_MAX)


def _bytes_from_be_bits(text: str) -> bytes:
    """The readme of libs/mysql/serialization writes examples as big-endian bit strings."""
    return bytes(int(group, 2) for group in reversed(text.split()))


# Examples from libs/mysql/serialization/readme.md.
def test_readme_unsigned_example():
    assert write_varlen_uint(65535) == _bytes_from_be_bits("00000111 11111111 11111011")


@pytest.mark.parametrize(
    "value, bits",
    [
        (65535, "00001111 11111111 11110011"),
        (-65535, "00001111 11111111 11101011"),
        (-65536, "00001111 11111111 11111011"),
    ],
)
def test_readme_signed_examples(value, bits):
    encoded = _bytes_from_be_bits(bits)
    assert write_varlen_int(value) == encoded
    assert read_varlen_int(encoded) == (value, 3)


@pytest.mark.parametrize(
    "value, encoded",
    [
        (0, b"\x00"),
        (1, b"\x02"),
        (127, b"\xfe"),
        (128, b"\x01\x02"),
        ((1 << 14) - 1, b"\xfd\xff"),
        (1 << 14, b"\x03\x00\x02"),
        ((1 << 56) - 1, b"\x7f" + b"\xff" * 7),
        (1 << 56, b"\xff" + (1 << 56).to_bytes(8, "little")),
        (UINT64_MAX, b"\xff" * 9),
    ],
)
def test_unsigned_boundaries(value, encoded):
    assert write_varlen_uint(value) == encoded
    assert read_varlen_uint(encoded) == (value, len(encoded))
    assert varlen_uint_size(value) == len(encoded)


@pytest.mark.parametrize("bits", range(65))
def test_size_matches_mysql_formula(bits):
    # get_size_integer_varlen_unsigned: ((bit_width * 575) >> 12) + 1
    value = (1 << bits) - 1
    assert varlen_uint_size(value) == ((bits * 575) >> 12) + 1
    assert len(write_varlen_uint(value)) == ((bits * 575) >> 12) + 1


@pytest.mark.parametrize(
    "value, size", [(INT64_MIN, 9), (INT64_MAX, 9), (-1, 1), (-64, 1), (63, 1), (64, 2), (-65, 2)]
)
def test_signed_boundaries(value, size):
    encoded = write_varlen_int(value)
    assert len(encoded) == size == varlen_int_size(value)
    assert read_varlen_int(encoded) == (value, size)


@settings(max_examples=300)
@given(uint64s)
def test_unsigned_round_trip(value):
    encoded = write_varlen_uint(value)
    assert len(encoded) == varlen_uint_size(value)
    # The count of trailing 1-bits of the first byte announces the extra bytes.
    first = encoded[0]
    trailing_ones = len(f"{first:08b}") - len(f"{first:08b}".rstrip("1"))
    assert trailing_ones + 1 == len(encoded)
    assert read_varlen_uint(b"junk" + encoded + b"tail", 4) == (value, 4 + len(encoded))


@settings(max_examples=300)
@given(int64s)
def test_signed_round_trip(value):
    encoded = write_varlen_int(value)
    assert read_varlen_int(encoded) == (value, len(encoded))
    # Sign in the lowest bit: the unsigned reading is the zigzag value.
    raw, _ = read_varlen_uint(encoded)
    assert raw & 1 == (value < 0)


@settings(max_examples=100)
@given(st.lists(st.one_of(uint64s.map(lambda v: ("u", v)), int64s.map(lambda v: ("i", v))), max_size=20))
def test_sequences_decode_back(items):
    buf = b"".join(write_varlen_uint(v) if kind == "u" else write_varlen_int(v) for kind, v in items)
    pos = 0
    for kind, value in items:
        decoded, pos = (read_varlen_uint if kind == "u" else read_varlen_int)(memoryview(buf), pos)
        assert decoded == value
    assert pos == len(buf)


def test_non_minimal_encoding_is_accepted_like_mysql():
    # 0 spread over 2 and 9 bytes: MySQL's reader accepts it, so do we.
    assert read_varlen_uint(b"\x01\x00") == (0, 2)
    assert read_varlen_uint(b"\xff" + bytes(8)) == (0, 9)


@settings(max_examples=100)
@given(uint64s)
def test_every_truncation_is_a_format_error(value):
    encoded = write_varlen_uint(value)
    for cut in range(len(encoded)):
        with pytest.raises(BinlogFormatError) as info:
            read_varlen_uint(encoded[:cut])
        assert info.value.offset == 0


def test_error_names_offset():
    with pytest.raises(BinlogFormatError, match="at offset 3"):
        read_varlen_uint(b"\x00\x00\x00\x03\x00", 3)
    with pytest.raises(BinlogFormatError):
        read_varlen_uint(b"", 0)
    with pytest.raises(BinlogFormatError):
        read_varlen_uint(b"\x00", 5)


@pytest.mark.parametrize("bad", [-1, UINT64_MAX + 1])
def test_unsigned_out_of_range(bad):
    with pytest.raises(ValueError):
        write_varlen_uint(bad)


@pytest.mark.parametrize("bad", [INT64_MIN - 1, INT64_MAX + 1])
def test_signed_out_of_range(bad):
    with pytest.raises(ValueError):
        write_varlen_int(bad)


def test_non_integers_rejected():
    with pytest.raises(TypeError):
        write_varlen_uint(1.5)
    with pytest.raises(TypeError):
        write_varlen_int("3")


@settings(max_examples=150)
@given(st.text(max_size=80))
def test_string_round_trip(text):
    encoded = write_string(text)
    assert len(encoded) == string_size(text)
    assert read_string(bytearray(b"x" + encoded), 1) == (text, 1 + len(encoded))


def test_string_bytes_and_empty():
    assert write_string("") == b"\x00"
    assert write_string(b"abc") == b"\x06abc"
    assert read_string(b"\x06abc") == ("abc", 4)


def test_string_limits():
    assert write_string("a" * 32, max_length=32)[0] == 64
    with pytest.raises(ValueError):
        write_string("a" * 33, max_length=32)
    encoded = write_string("a" * 33)
    with pytest.raises(BinlogFormatError, match="limit of 32"):
        read_string(encoded, max_length=32)


def test_string_truncated_and_invalid_utf8():
    with pytest.raises(BinlogFormatError, match="truncated string"):
        read_string(b"\x0aabc")
    with pytest.raises(BinlogFormatError, match="UTF-8") as info:
        read_string(b"\x04a\xff")
    assert info.value.offset == 2
    with pytest.raises(BinlogFormatError):
        read_string(b"")


@settings(max_examples=300)
@given(st.binary(max_size=12), st.integers(min_value=0, max_value=12))
def test_garbage_only_raises_format_errors(data, pos):
    for reader in (read_varlen_uint, read_varlen_int, read_string):
        try:
            reader(data, pos)
        except BinlogFormatError:
            pass
