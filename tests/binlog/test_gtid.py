"""Tests for GTID arithmetic: MySQL GtidSet (text, binary, algebra) and MariaDB positions/states."""

import io
import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymysqlreplication.gtid import GtidSet as ReferenceGtidSet

from relayproxy.binlog.constants import GTID_LIST_FLAG_IGN_GTIDS, GTID_LIST_FLAG_UNTIL_REACHED
from relayproxy.binlog.events import BinlogFormatError
from relayproxy.binlog.gtid import (
    GNO_END,
    GNO_MAX,
    GtidSet,
    MariaBinlogState,
    MariaGtid,
    MariaGtidPosition,
)

DOC_UUID = "3E11FA47-71CA-11E1-9E33-C80AA9429562"
DOC_UUID_LOWER = DOC_UUID.lower()
UUIDS = [
    bytes.fromhex("00000000000000000000000000000001"),
    bytes.fromhex("3e11fa4771ca11e19e33c80aa9429562"),
    bytes.fromhex("ffeeddccbbaa99887766554433221100"),
]
TAGS = ["", "alpha", "b_2"]
SMALL_GNO = 40


# -- strategies and a reference model -------------------------------------------------

def _spans(tags):
    return st.lists(
        st.tuples(
            st.sampled_from(UUIDS),
            st.sampled_from(tags),
            st.integers(min_value=1, max_value=SMALL_GNO),
            st.integers(min_value=1, max_value=6),
        ),
        max_size=8,
    )


def _build(spans):
    gtid_set, model = GtidSet(), set()
    for sid, tag, start, length in spans:
        end = min(start + length, SMALL_GNO + 1)
        gtid_set.add_interval(sid, start, end, tag)
        model.update((sid, tag, gno) for gno in range(start, end))
    return gtid_set, model


def _model_of(gtid_set):
    return {
        (bytes.fromhex(sid.replace("-", "")), tag, gno)
        for sid, tag, start, end in gtid_set.intervals()
        for gno in range(start, end + 1)
    }


def _assert_canonical(gtid_set):
    for ivs in gtid_set._intervals.values():
        assert ivs, "no empty interval lists"
        for (start, end), (next_start, _) in zip(ivs, ivs[1:]):
            assert start < end < next_start, "sorted, merged, never touching"
        assert all(1 <= s < e <= GNO_END for s, e in ivs)


tagged_sets = _spans(TAGS).map(_build)
untagged_sets = _spans([""]).map(_build)


# -- algebra against the model -------------------------------------------------------

@settings(max_examples=150)
@given(tagged_sets, tagged_sets)
def test_algebra_matches_python_sets(a, b):
    (set_a, model_a), (set_b, model_b) = a, b
    assert _model_of(set_a) == model_a
    for result, expected in [
        (set_a | set_b, model_a | model_b),
        (set_a & set_b, model_a & model_b),
        (set_a - set_b, model_a - model_b),
        (set_a.union(set_b), model_a | model_b),
        (set_a.intersect(set_b), model_a & model_b),
        (set_a.subtract(set_b), model_a - model_b),
    ]:
        _assert_canonical(result)
        assert _model_of(result) == expected
        assert result.count() == len(expected)
    assert set_a.is_subset(set_b) == (model_a <= model_b)
    assert (set_a <= set_b) == (model_a <= model_b)
    assert (set_a < set_b) == (model_a < model_b)
    assert set_a.issuperset(set_b) == (model_a >= model_b)
    assert set_a.isdisjoint(set_b) == model_a.isdisjoint(model_b)
    assert (set_a == set_b) == (model_a == model_b)
    assert bool(set_a) == bool(model_a)
    # The operands are untouched.
    assert _model_of(set_a) == model_a and _model_of(set_b) == model_b


@settings(max_examples=100)
@given(tagged_sets, tagged_sets)
def test_in_place_operations(a, b):
    (set_a, model_a), (set_b, model_b) = a, b
    cases = [("__ior__", model_a | model_b), ("__iand__", model_a & model_b), ("__isub__", model_a - model_b)]
    for op, expected in cases:
        target = set_a.copy()
        assert getattr(target, op)(set_b) is target
        _assert_canonical(target)
        assert _model_of(target) == expected
    assert _model_of(set_a) == model_a


@settings(max_examples=100)
@given(tagged_sets, st.sampled_from(UUIDS), st.sampled_from(TAGS), st.integers(1, SMALL_GNO + 2))
def test_membership(a, sid, tag, gno):
    gtid_set, model = a
    expected = (sid, tag, gno) in model
    assert gtid_set.contains_gtid(sid, gno, tag) == expected
    assert ((sid, tag, gno) in gtid_set) == expected
    if not tag:
        assert ((sid, gno) in gtid_set) == expected
    assert gtid_set.contains_gtid(uuid.UUID(bytes=sid), gno, tag.upper()) == expected


@settings(max_examples=50)
@given(tagged_sets)
def test_operations_with_itself(a):
    gtid_set, model = a
    for op, expected in [("__ior__", model), ("__iand__", model), ("__isub__", set())]:
        target = gtid_set.copy()
        getattr(target, op)(target)
        assert _model_of(target) == expected
    assert gtid_set - gtid_set == GtidSet() and gtid_set | gtid_set == gtid_set


@settings(max_examples=100)
@given(st.lists(st.tuples(st.sampled_from(UUIDS), st.sampled_from(TAGS), st.integers(1, SMALL_GNO)), max_size=60))
def test_add_one_by_one_in_any_order(gtids):
    gtid_set = GtidSet()
    for sid, tag, gno in gtids:
        gtid_set.add(sid, gno, tag)
    _assert_canonical(gtid_set)
    assert _model_of(gtid_set) == set(gtids)


def test_add_fast_path_extends_last_interval():
    gtid_set = GtidSet()
    sid = UUIDS[1]
    for gno in range(1, 1001):
        gtid_set.add(sid, gno)
    assert gtid_set._intervals == {(sid, ""): [(1, 1001)]}
    gtid_set.add(sid, 1002)
    assert str(gtid_set) == f"{DOC_UUID_LOWER}:1-1000:1002"
    gtid_set.add(sid, 1001)  # fills the gap: merges into one interval
    assert str(gtid_set) == f"{DOC_UUID_LOWER}:1-1002"
    gtid_set.add(sid, 5)  # already present: no change
    assert gtid_set.count() == 1002
    assert gtid_set.last_gno(sid) == 1002
    assert gtid_set.last_gno(UUIDS[0]) == 0


def test_add_accepts_uuid_forms_and_validates():
    gtid_set = GtidSet()
    gtid_set.add(DOC_UUID, 1)
    gtid_set.add(DOC_UUID.replace("-", ""), 2)
    gtid_set.add(uuid.UUID(DOC_UUID), 3)
    gtid_set.add(bytearray(UUIDS[1]), 4, "Tag_X")
    assert str(gtid_set) == f"{DOC_UUID_LOWER}:1-3:tag_x:4"
    for bad_gno in (0, -1, GNO_MAX + 1):
        with pytest.raises(ValueError):
            gtid_set.add(DOC_UUID, bad_gno)
    with pytest.raises(ValueError):
        gtid_set.add(UUIDS[1], GNO_END)  # would extend [.., GNO_END) past the maximum
    gtid_set.add(UUIDS[1], GNO_MAX)
    with pytest.raises(ValueError):
        gtid_set.add(UUIDS[1], GNO_END)  # fast path must refuse too
    with pytest.raises(TypeError):
        gtid_set.add(DOC_UUID, 1.0)
    with pytest.raises(ValueError):
        gtid_set.add(b"short", 1)
    with pytest.raises(ValueError):
        gtid_set.add("not-a-uuid", 1)
    with pytest.raises(ValueError):
        gtid_set.add(DOC_UUID, 1, "9starts_with_digit")
    with pytest.raises(ValueError):
        gtid_set.add(DOC_UUID, 1, "x" * 33)
    with pytest.raises(ValueError):
        gtid_set.add_interval(DOC_UUID, 5, 5)
    with pytest.raises(ValueError):
        gtid_set.add_interval(DOC_UUID, 1, GNO_END + 1)


# -- text ----------------------------------------------------------------------------

@settings(max_examples=150)
@given(tagged_sets, st.sampled_from([",\n", ",", ", "]))
def test_text_round_trip(a, separator):
    gtid_set, _ = a
    text = gtid_set.format(separator)
    assert GtidSet.parse(text) == gtid_set
    assert GtidSet.parse(text.upper()) == gtid_set


@settings(max_examples=100)
@given(tagged_sets, st.randoms(use_true_random=False))
def test_messy_text_parses_to_the_same_set(a, rnd):
    gtid_set, _ = a
    # Every interval as its own element, shuffled, split and overlapping, with whitespace.
    elements = []
    for sid, tag, start, end in gtid_set.intervals():
        sid = sid.upper() if rnd.random() < 0.5 else sid
        tag_part = f" :\t{tag.upper()} " if tag else ""
        middle = rnd.randint(start, end)
        elements.append(f"{sid}{tag_part}: {start} - {middle}\n:{middle}-{end}")
    rnd.shuffle(elements)
    text = " ,\n".join(elements) + ",,"
    assert GtidSet.parse(text) == gtid_set


def test_canonical_output():
    text = (
        "ffeeddcc-bbaa-9988-7766-554433221100:7, 3E11FA47-71CA-11E1-9E33-C80AA9429562:Zeta:5:"
        "ALPHA:2-3, 3E11FA47-71CA-11E1-9E33-C80AA9429562:11:1-3:47-49:4-10, "
        "00000000-0000-0000-0000-000000000001:9"
    )
    gtid_set = GtidSet.parse(text)
    assert str(gtid_set) == (
        "00000000-0000-0000-0000-000000000001:9,\n"
        "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-11:47-49:alpha:2-3:zeta:5,\n"
        "ffeeddcc-bbaa-9988-7766-554433221100:7"
    )
    assert repr(gtid_set).startswith("GtidSet('00000000-0000-0000-0000-000000000001:9,3e11")
    assert gtid_set.sids() == [str(uuid.UUID(bytes=s)) for s in UUIDS]
    assert gtid_set.tsids()[1:4] == [(DOC_UUID_LOWER, ""), (DOC_UUID_LOWER, "alpha"), (DOC_UUID_LOWER, "zeta")]
    assert list(gtid_set.intervals())[1:3] == [(DOC_UUID_LOWER, "", 1, 11), (DOC_UUID_LOWER, "", 47, 49)]


def test_mysql_documentation_examples():
    # GTID Format and Storage: a set from one server.
    assert str(GtidSet.parse(f"{DOC_UUID}:1-3:11:47-49")) == f"{DOC_UUID_LOWER}:1-3:11:47-49"
    # Tagged form (8.3+): tags are case-insensitive and printed in lower case.
    assert str(GtidSet.parse(f"{DOC_UUID}:Domain_1:1-3:11:47-49:Domain_2:8-52")) == (
        f"{DOC_UUID_LOWER}:domain_1:1-3:11:47-49:domain_2:8-52"
    )
    # GTID_SUBSET() examples.
    big = GtidSet.parse(f"{DOC_UUID}:21-57")
    assert GtidSet.parse(f"{DOC_UUID}:23").is_subset(big)
    assert GtidSet.parse(f"{DOC_UUID}:23-25").is_subset(big)
    assert not GtidSet.parse(f"{DOC_UUID}:20-25").is_subset(big)
    # GTID_SUBTRACT() examples.
    assert str(big.subtract(f"{DOC_UUID}:21")) == f"{DOC_UUID_LOWER}:22-57"
    assert str(big.subtract(f"{DOC_UUID}:20-25")) == f"{DOC_UUID_LOWER}:26-57"
    assert str(big.subtract(f"{DOC_UUID}:23-24")) == f"{DOC_UUID_LOWER}:21-22:25-57"


def test_empty_and_degenerate_text():
    for text in ["", "  \n", ",", " , ,\n"]:
        gtid_set = GtidSet.parse(text)
        assert not gtid_set and str(gtid_set) == "" and gtid_set.count() == 0
    # A UUID (or UUID:tag) without intervals is valid and adds nothing, as in MySQL.
    assert not GtidSet.parse(f"{DOC_UUID}")
    assert not GtidSet.parse(f"{DOC_UUID}:tag")
    assert str(GtidSet.parse(f"{DOC_UUID}:{GNO_MAX}")) == f"{DOC_UUID_LOWER}:{GNO_MAX}"
    assert GtidSet.parse(f"{DOC_UUID}:1-{GNO_MAX}").count() == GNO_MAX


@pytest.mark.parametrize(
    "text, token",
    [
        (f"{DOC_UUID}:5-3", "5-3"),
        (f"{DOC_UUID}:0", "0"),
        (f"{DOC_UUID}:0-5", "0-5"),
        (f"{DOC_UUID}:{GNO_MAX + 1}", str(GNO_MAX + 1)),
        (f"{DOC_UUID}:1-{GNO_MAX + 1}", f"1-{GNO_MAX + 1}"),
        (f"{DOC_UUID}:010", "010"),
        (f"{DOC_UUID}:-5", "-5"),
        (f"{DOC_UUID}:+5", "+5"),
        (f"{DOC_UUID}:1-", "1-"),
        (f"{DOC_UUID}:1-2-3", "1-2-3"),
        (f"{DOC_UUID}:x5y!", "x5y!"),
        (f"{DOC_UUID}:{'t' * 33}:1", "t" * 33),
        (f"{DOC_UUID}::1", "empty"),
        (f"{DOC_UUID}:", "empty"),
        ("3E11FA47-71CA-11E1-9E33-C80AA942956:1", "3E11FA47-71CA-11E1-9E33-C80AA942956"),
        ("3E11FA4771CA11E19E33C80AA9429562:1", "3E11FA4771CA11E19E33C80AA9429562"),
        ("G E11FA47-71CA-11E1-9E33-C80AA9429562:1", "G E11FA47"),
        (f"{DOC_UUID}:1 2", "1 2"),
        (f"+{DOC_UUID}:1", "+3E11"),
        (f"{DOC_UUID}:١", "١"),  # a non-ASCII digit
    ],
)
def test_parse_errors_name_the_bad_token(text, token):
    with pytest.raises(ValueError) as info:
        GtidSet.parse(text)
    assert token in str(info.value)


def test_long_text_is_abbreviated_in_errors():
    text = ",".join(f"{DOC_UUID}:{n}" for n in range(1, 50)) + ",bad"
    with pytest.raises(ValueError) as info:
        GtidSet.parse(text)
    assert "..." in str(info.value) and "'bad'" in str(info.value)


# -- binary --------------------------------------------------------------------------

@settings(max_examples=150)
@given(tagged_sets)
def test_binary_round_trip_both_formats(a):
    gtid_set, _ = a
    has_tags = any(tag for _, tag in gtid_set.tsids())
    encoded = gtid_set.encode()
    assert len(encoded) == gtid_set.encoded_length()
    assert (encoded[7] == 1) == has_tags  # format byte (top byte of the first word)
    assert GtidSet.decode(encoded) == gtid_set
    forced = gtid_set.encode(tagged=True)
    assert len(forced) == gtid_set.encoded_length(tagged=True)
    assert GtidSet.decode(forced) == gtid_set
    skipped = gtid_set.encode(skip_tagged=True)
    assert skipped[7] == 0
    untagged_only = GtidSet()
    for sid, tag, start, end in gtid_set.intervals():
        if not tag:
            untagged_only.add_interval(sid, start, end + 1)
    assert GtidSet.decode(skipped) == untagged_only
    if has_tags:
        with pytest.raises(ValueError):
            gtid_set.encode(tagged=False)
    else:
        assert gtid_set.encode(tagged=False) == encoded


def test_binary_layout():
    assert GtidSet().encode() == bytes(8)
    assert GtidSet.decode(bytes(8)) == GtidSet()
    assert GtidSet().encode(tagged=True) == bytes([1, 0, 0, 0, 0, 0, 0, 1])
    gtid_set = GtidSet.parse(f"{DOC_UUID}:1-5:7,{DOC_UUID}:Ab:3")
    assert gtid_set.encode(skip_tagged=True) == (
        struct.pack("<Q", 1) + UUIDS[1] + struct.pack("<Q", 2) + struct.pack("<qqqq", 1, 6, 7, 8)
    )
    assert gtid_set.encode() == (
        struct.pack("<Q", (1 << 56) | (2 << 8) | 1)
        + UUIDS[1] + b"\x00" + struct.pack("<Q", 2) + struct.pack("<qqqq", 1, 6, 7, 8)
        + UUIDS[1] + b"\x04ab" + struct.pack("<Q", 1) + struct.pack("<qq", 3, 4)
    )


def test_decode_with_offset_and_length():
    gtid_set = GtidSet.parse(f"{DOC_UUID}:1-5:tag:9")
    encoded = gtid_set.encode()
    buf = b"head" + encoded + b"tail"
    assert GtidSet.decode(buf, 4, len(encoded)) == gtid_set
    assert GtidSet.decode(memoryview(buf), 4, len(encoded)) == gtid_set
    with pytest.raises(BinlogFormatError, match="unexpected bytes"):
        GtidSet.decode(buf, 4)


def test_decode_merges_repeated_and_unsorted_entries():
    # MySQL accepts any entry order and repeated UUIDs; the result is merged.
    entry = lambda sid, ivs: sid + struct.pack("<Q", len(ivs)) + b"".join(struct.pack("<qq", *iv) for iv in ivs)
    encoded = struct.pack("<Q", 3) + entry(UUIDS[2], [(1, 2)])
    encoded += entry(UUIDS[1], [(5, 9)]) + entry(UUIDS[1], [(1, 5)])
    assert str(GtidSet.decode(encoded)) == f"{DOC_UUID_LOWER}:1-8,\nffeeddcc-bbaa-9988-7766-554433221100:1"


def _untagged_encoding(*intervals, n_sids=1, n_intervals=None):
    count = len(intervals) if n_intervals is None else n_intervals
    return (
        struct.pack("<Q", n_sids) + UUIDS[0] + struct.pack("<Q", count)
        + b"".join(struct.pack("<qq", s, e) for s, e in intervals)
    )


@pytest.mark.parametrize(
    "encoded, message",
    [
        (b"", "at least 8 bytes"),
        (bytes(7), "at least 8 bytes"),
        (struct.pack("<Q", 2 << 56), "unknown GTID set encoding format 2"),
        (struct.pack("<Q", (1 << 56) | (0 << 8) | 0), "low byte"),
        (struct.pack("<Q", 1), "declares 1 UUID entries"),
        (struct.pack("<Q", 1 << 40) + bytes(24), "declares"),
        (_untagged_encoding(n_intervals=3), "declares 3 intervals"),
        (_untagged_encoding((0, 5)), "invalid GTID interval"),
        (_untagged_encoding((5, 5)), "invalid GTID interval"),
        (_untagged_encoding((5, 3)), "invalid GTID interval"),
        (_untagged_encoding((1, 5), (5, 9)), "invalid GTID interval"),  # touching: not merged
        (_untagged_encoding((4, 9), (1, 2)), "invalid GTID interval"),  # unsorted
        (_untagged_encoding((-5, 2)), "invalid GTID interval"),
        (_untagged_encoding((1, 2)) + b"\x00", "unexpected bytes"),
        (struct.pack("<Q", (1 << 56) | (1 << 8) | 1) + UUIDS[0] + b"\x40" + bytes(8), "truncated GTID tag"),
        (struct.pack("<Q", (1 << 56) | (1 << 8) | 1) + UUIDS[0] + b"\x42" + b"a" * 33 + bytes(8), "limit of 32"),
        (struct.pack("<Q", (1 << 56) | (1 << 8) | 1) + UUIDS[0] + b"\x041a" + bytes(8), "invalid GTID tag"),
        (struct.pack("<Q", (1 << 56) | (1 << 8) | 1) + UUIDS[0] + b"\x14abcdefghij" + bytes(4), "truncated interval count"),
    ],
)
def test_decode_rejects_malformed_input(encoded, message):
    with pytest.raises(BinlogFormatError, match=message):
        GtidSet.decode(encoded)


def test_decode_never_reads_past_length():
    # The tag would be complete if the decoder looked at the bytes after ``length``.
    encoded = struct.pack("<Q", (1 << 56) | (1 << 8) | 1) + UUIDS[0] + b"\x14abcdefghij" + struct.pack("<Q", 0)
    assert not GtidSet.decode(encoded)
    with pytest.raises(BinlogFormatError, match="truncated GTID tag"):
        GtidSet.decode(encoded, 0, 8 + 16 + 9)


def test_decode_error_offset_points_at_the_bad_interval():
    encoded = b"pre" + _untagged_encoding((1, 3), (2, 9))
    with pytest.raises(BinlogFormatError) as info:
        GtidSet.decode(encoded, 3)
    assert info.value.offset == 3 + 8 + 16 + 8 + 16


@settings(max_examples=200)
@given(st.binary(max_size=80))
def test_decode_garbage_only_raises_format_errors(data):
    try:
        GtidSet.decode(data)
    except BinlogFormatError:
        pass


@settings(max_examples=150)
@given(tagged_sets, st.data())
def test_decode_of_any_truncation_fails_cleanly(a, data):
    encoded = a[0].encode()
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(BinlogFormatError):
        GtidSet.decode(encoded[:cut])


# -- interop with python-mysql-replication --------------------------------------------

@settings(max_examples=150)
@given(untagged_sets)
def test_pymysqlreplication_encoding_matches(a):
    gtid_set, _ = a
    reference = ReferenceGtidSet(gtid_set.format(",") or None)
    assert reference.encoded() == gtid_set.encode()
    assert GtidSet.decode(reference.encoded()) == gtid_set
    assert ReferenceGtidSet.decode(io.BytesIO(gtid_set.encode())).encoded() == gtid_set.encode()


def test_pymysqlreplication_unsorted_input_decodes():
    # The reference keeps its input order; MySQL (and we) sort, and decode either order.
    text = f"ffeeddcc-bbaa-9988-7766-554433221100:1-3:9,{DOC_UUID}:5"
    reference = ReferenceGtidSet(text)
    ours = GtidSet.decode(reference.encoded())
    assert ours == GtidSet.parse(text)
    assert ours.encode() == ReferenceGtidSet(ours.format(",")).encoded()


# -- MariaDB --------------------------------------------------------------------------

def test_maria_gtid_parse_and_format():
    assert MariaGtid.parse(" 0-1-100 ") == MariaGtid(0, 1, 100)
    biggest = MariaGtid(4294967295, 4294967295, 18446744073709551615)
    assert str(biggest) == "4294967295-4294967295-18446744073709551615"
    assert MariaGtid.parse("4294967295-4294967295-18446744073709551615").seq_no == (1 << 64) - 1
    bad_texts = ["", "0-1", "0-1-2-3", "a-1-2", "0--1-2", "-1-1-1", " 0 -1-1"]
    bad_texts += ["4294967296-1-1", "0-4294967296-1", "0-1-18446744073709551616"]
    for bad in bad_texts:
        with pytest.raises(ValueError):
            MariaGtid.parse(bad)


def test_maria_position_basics():
    position = MariaGtidPosition.parse("1-2-50, 0-1-100")
    assert str(position) == "0-1-100,1-2-50"
    assert repr(position) == "MariaGtidPosition('0-1-100,1-2-50')"
    assert position.domains() == [0, 1] and len(position) == 2
    assert list(position) == [MariaGtid(0, 1, 100), MariaGtid(1, 2, 50)]
    assert position.get(0) == MariaGtid(0, 1, 100) and position.get(7) is None
    assert str(MariaGtidPosition.parse("")) == "" and not MariaGtidPosition.parse(" ")
    position.update(MariaGtid(0, 3, 101))
    assert str(position) == "0-3-101,1-2-50"
    clone = position.copy()
    clone.discard(1)
    assert str(clone) == "0-3-101" and len(position) == 2
    assert position == MariaGtidPosition.parse("1-2-50,0-3-101") and position != clone


@pytest.mark.parametrize("text", ["0-1-1,0-2-2", "0-1-1,", ",0-1-1", "0-1-1,,1-1-1", "0-1-1;1-1-1"])
def test_maria_position_rejects(text):
    with pytest.raises(ValueError) as info:
        MariaGtidPosition.parse(text)
    assert text in str(info.value)


def test_maria_position_comparison_is_per_domain_seq_only():
    position = MariaGtidPosition.parse("0-1-100,1-2-50")
    assert position.contains(MariaGtid(0, 9, 100))  # another server_id, same seq: reached
    assert MariaGtid(0, 1, 99) in position
    assert not position.contains(MariaGtid(0, 1, 101))
    assert not position.contains(MariaGtid(2, 1, 1))  # unknown domain
    assert position.covers(MariaGtidPosition.parse("0-5-90,1-2-50"))
    assert not position.covers(MariaGtidPosition.parse("0-1-90,2-1-1"))
    assert position.is_behind(MariaGtidPosition.parse("1-2-51"))
    assert not position.is_behind(MariaGtidPosition.parse(""))


@settings(max_examples=100)
@given(st.dictionaries(st.integers(0, 5), st.tuples(st.integers(0, 3), st.integers(0, 1000)), max_size=6))
def test_maria_position_round_trip(entries):
    position = MariaGtidPosition(MariaGtid(d, s, q) for d, (s, q) in entries.items())
    assert MariaGtidPosition.parse(str(position)) == position
    assert [g.domain_id for g in position] == sorted(entries)


def test_maria_binlog_state_tracks_latest_per_domain():
    state = MariaBinlogState()
    for gtid in ["0-1-1", "0-1-2", "0-2-3", "1-1-7", "0-1-4", "0-3-5", "0-2-6"]:
        state.update(MariaGtid.parse(gtid))
    assert len(state) == 4
    assert state.get(0, 1) == MariaGtid(0, 1, 4)
    assert state.latest(0) == MariaGtid(0, 2, 6)
    # Within a domain: other servers by server_id, the most recent last.
    assert str(state) == "0-1-4,0-3-5,0-2-6,1-1-7"
    assert str(state.current_position()) == "0-2-6,1-1-7"
    assert MariaBinlogState.parse(str(state)) == state
    assert state.domains() == [0, 1]
    clone = state.copy()
    clone.update(MariaGtid(1, 1, 8))
    assert state.latest(1) == MariaGtid(1, 1, 7)


def test_maria_binlog_state_latest_is_order_not_seq():
    # As MariaDB's rpl_binlog_state: the last update wins, even with a lower seq_no.
    state = MariaBinlogState.parse("0-1-10,0-2-5")
    assert state.latest(0) == MariaGtid(0, 2, 5)
    assert str(state.current_position()) == "0-2-5"
    assert MariaBinlogState.parse("0-2-5,0-1-10") != state


def test_gtid_list_body_layout():
    state = MariaBinlogState.parse("0-1-4,0-2-6,1-1-7")
    body = state.encode_gtid_list_body(GTID_LIST_FLAG_IGN_GTIDS)
    assert body == (
        struct.pack("<I", 3 | GTID_LIST_FLAG_IGN_GTIDS)
        + struct.pack("<IIQ", 0, 1, 4) + struct.pack("<IIQ", 0, 2, 6) + struct.pack("<IIQ", 1, 1, 7)
    )
    decoded, flags = MariaBinlogState.decode_gtid_list_body(b"hdr" + body + b"crc!", 3, len(body))
    assert decoded == state and flags == GTID_LIST_FLAG_IGN_GTIDS
    # The documented example: "Gtid list [0-10124-3584]".
    example = bytes.fromhex("01000000 00000000 8c270000 000e000000000000".replace(" ", ""))
    assert str(MariaBinlogState.decode_gtid_list_body(example)[0]) == "0-10124-3584"


def test_gtid_list_empty_is_padded():
    body = MariaBinlogState().encode_gtid_list_body(GTID_LIST_FLAG_UNTIL_REACHED)
    assert body == struct.pack("<I", GTID_LIST_FLAG_UNTIL_REACHED) + b"\x00\x00"
    state, flags = MariaBinlogState.decode_gtid_list_body(body)
    assert len(state) == 0 and flags == GTID_LIST_FLAG_UNTIL_REACHED
    assert len(MariaBinlogState.decode_gtid_list_body(bytes(4))[0]) == 0


def test_gtid_list_errors():
    with pytest.raises(BinlogFormatError, match="at least 4"):
        MariaBinlogState.decode_gtid_list_body(b"\x01\x00")
    with pytest.raises(BinlogFormatError, match="declares 2 GTIDs"):
        MariaBinlogState.decode_gtid_list_body(struct.pack("<I", 2) + bytes(20))
    with pytest.raises(BinlogFormatError, match="does not fit"):
        MariaBinlogState.decode_gtid_list_body(bytes(8), 4, 10)
    with pytest.raises(ValueError):
        MariaBinlogState().encode_gtid_list_body(1)
    with pytest.raises(ValueError):
        MariaBinlogState([MariaGtid(1 << 32, 0, 0)])


@settings(max_examples=100)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, (1 << 64) - 1)), max_size=20))
def test_binlog_state_round_trips(updates):
    state = MariaBinlogState(MariaGtid(*u) for u in updates)
    assert MariaBinlogState.parse(str(state)) == state
    decoded, flags = MariaBinlogState.decode_gtid_list_body(state.encode_gtid_list_body())
    assert decoded == state and flags == 0
    expected_latest = {}
    for domain, server, seq in updates:
        expected_latest[domain] = MariaGtid(domain, server, seq)
    assert dict((g.domain_id, g) for g in state.current_position()) == expected_latest
