"""The batch path (``feed_buffer``) against feeding the same events one at a time through ``feed``.

``feed_buffer`` runs its own loops (one per flavour) with the parser's state in locals and the common events
inline; the claim is that it is only faster: the same returned (pos, last_boundary), the same ``on_group_end``
calls (with the parser seen in the same state by each call), the same parser state, errors and exceptions
afterwards. Shown on every corpus file whole, and on byte strings built from corpus events (random slices of
files, glued together across files and flavours, random cut points, random splits into several calls, a
random byte overwritten).
"""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayproxy.binlog import boundary as B
from relayproxy.binlog import constants as C
from relayproxy.binlog.checksum import ChecksumError
from relayproxy.binlog.events import BinlogFormatError, FormatDescription

from ..support import eventgen as E

_HEADER = struct.Struct("<4xBxxxxIxxxxH")  # type, size, flags
_STATE_SLOTS = [name for name in B.TransactionBoundaryParser.__slots__ if name != "feed"]


def feed_one_by_one(parser: B.TransactionBoundaryParser, buf, pos: int, end: int, on_group_end=None):
    """What ``feed_buffer`` promises, spelled out with the per-event API (the upstream receiver's way)."""
    last_boundary = -1
    while pos + C.HEADER_LEN <= end:
        type_code, size, flags = _HEADER.unpack_from(buf, pos)
        nxt = pos + size
        if size < C.HEADER_LEN or nxt > end:
            break
        if type_code == C.FORMAT_DESCRIPTION_EVENT:
            parser.set_format(FormatDescription.parse(buf, pos, size))
        result = parser.feed(type_code, flags, buf, pos, size) & B.RESULT_MASK
        if result == B.GROUP_END:
            last_boundary = nxt
            if on_group_end is not None:
                on_group_end(nxt, parser.gtid)
        elif result == B.EVENT_OUTSIDE:
            last_boundary = nxt
        pos = nxt
    return pos, last_boundary


def parser_state(parser: B.TransactionBoundaryParser) -> dict:
    """Every slot of the parser (``feed`` as the function it is bound to), plus the derived views."""
    state = {name: getattr(parser, name) for name in _STATE_SLOTS}
    state["feed"] = parser.feed.__func__
    state["gtid"] = parser.gtid
    state["in_group"] = parser.in_group
    state["state_key"] = parser.state_key()
    return state


def recorder(parser: B.TransactionBoundaryParser, calls: list):
    """An on_group_end that records its arguments and what the parser looked like when it was called."""

    def on_group_end(end: int, gtid) -> None:
        calls.append((end, gtid, parser.state, parser.error, parser.errors, parser.state_key()))

    return on_group_end


def run_both(make_parser, buf, start: int, cuts: list[int]):
    """Feed ``buf[start:cuts[-1]]`` in len(cuts) calls (each up to the next cut) through both paths."""
    outcomes = []
    for path in ("batch", "one_by_one"):
        parser = make_parser()
        calls: list = []
        on_end = recorder(parser, calls)
        returns = []
        pos = start
        for cut in cuts:
            try:
                if path == "batch":
                    returned = parser.feed_buffer(buf, pos, cut, on_end)
                else:
                    returned = feed_one_by_one(parser, buf, pos, cut, on_end)
            except (BinlogFormatError, ChecksumError, struct.error, IndexError) as exc:
                returns.append((type(exc).__name__, str(exc)))
                break
            returns.append(returned)
            pos = returned[0]
        outcomes.append((returns, calls, parser_state(parser)))
    return outcomes


# ---------------------------------------------------------------------------------------------
# Every corpus file, whole, under each flavour setting.


@pytest.fixture(scope="module")
def corpus_files(corpus_dir, manifest):
    return [(entry["file"], (corpus_dir / entry["file"]).read_bytes()) for entry in manifest]


@pytest.mark.parametrize("flavour", ["auto", "mysql", "mariadb"])
def test_every_corpus_file_batch_equals_per_event(corpus_files, flavour):
    ends_total = 0
    for name, data in corpus_files:
        batch, one_by_one = run_both(lambda: B.TransactionBoundaryParser(flavour), data, 4, [len(data)])
        assert batch[0] == one_by_one[0], name  # (pos, last_boundary), or the same exception
        assert batch[1] == one_by_one[1], name  # every group end: offset, GTID, the parser as the callback saw it
        assert batch[2] == one_by_one[2], name  # the whole parser afterwards
        ends_total += len(batch[1])
    assert ends_total > 5_000  # the corpus's groups (6,001 under the auto rules) were really compared


def test_corpus_files_in_one_buffer_switch_flavours(corpus_events):
    """All files' events in one buffer (auto flavour): every FDE of the other flavour hands over to the other loop."""
    buf = b"".join(b"".join(events) for events in corpus_events)
    batch, one_by_one = run_both(B.TransactionBoundaryParser, buf, 0, [len(buf)])
    assert batch == one_by_one
    assert len(batch[1]) > 5_000


# ---------------------------------------------------------------------------------------------
# Byte strings built from corpus events.


@pytest.fixture(scope="module")
def corpus_events(corpus_dir, manifest):
    """Per corpus file, its complete events as bytes (a cut last event left out)."""
    files = []
    for entry in manifest:
        data = (corpus_dir / entry["file"]).read_bytes()
        events, pos = [], 4
        while pos + C.HEADER_LEN <= len(data):
            size = _HEADER.unpack_from(data, pos)[1]
            if size < C.HEADER_LEN or pos + size > len(data):
                break
            events.append(data[pos : pos + size])
            pos += size
        if events:
            files.append(events)
    assert len(files) > 90, json.dumps([e["file"] for e in manifest])[:200]
    return files


# Events the corpus barely has, for the MySQL paths that only errors reach (incident, unknown types, payload...).
EXTRA_EVENTS = [
    E.incident(), E.unknown(ignorable=False), E.unknown(ignorable=True), E.payload(), E.xa_prepare(),
    E.query("XA START X'31',X'',1"), E.query("XA ROLLBACK X'31',X'',1"), E.query("ROLLBACK"), E.query(b""),
    E.query("ROLLBACK TO sp1"), E.query("begin"), E.gtid(0), E.gtid(0, anonymous=True), E.gtid(5),
    E.query("B"), E.query("BEGI"), E.query("BEGIN WORK"), E.query("C"), E.query("COMMI"), E.query("COMMIT WORK"),
    E.intvar(), E.rand(), E.user_var(),
    E.maria_gtid(7), E.maria_gtid(8, flags2=C.FL_STANDALONE), E.maria_gtid(9, domain=2), E.query("COMMIT"),
    E.fde("10.11.6-MariaDB-log", n_types=171), E.fde("8.0.36"), E.fde("5.7.44", checksum=False),
]

slices = st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(1, 60)),  # file, first event, count
    min_size=1,
    max_size=6,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    slices=slices,
    extras=st.lists(st.tuples(st.integers(0, 400), st.sampled_from(range(len(EXTRA_EVENTS)))), max_size=4),
    flavour=st.sampled_from(["auto", "mysql", "mariadb"]),
    kind=st.sampled_from(["bytes", "bytearray", "memoryview"]),
    prefix=st.binary(max_size=25),
    cut_from_end=st.integers(0, 40),
    split_points=st.lists(st.floats(0, 1), max_size=5),
    flip=st.one_of(st.none(), st.tuples(st.floats(0, 1), st.integers(0, 255))),
)
def test_batch_equals_per_event_on_buffers_built_from_corpus_events(
    corpus_events, slices, extras, flavour, kind, prefix, cut_from_end, split_points, flip
):
    events = []
    for file_index, first, count in slices:
        file_events = corpus_events[file_index % len(corpus_events)]
        start = first % len(file_events)
        events += file_events[start : start + count]
    for at, which in extras:
        events.insert(at % (len(events) + 1), EXTRA_EVENTS[which])
    raw = bytearray(prefix + b"".join(events))
    if flip is not None and len(raw) > len(prefix):
        where, value = flip
        raw[len(prefix) + int(where * (len(raw) - len(prefix) - 1))] = value
    end = max(len(prefix), len(raw) - cut_from_end)  # cut anywhere in the last events
    cuts = sorted({len(prefix) + int(f * (end - len(prefix))) for f in split_points} | {end})
    buf = {"bytes": bytes(raw), "bytearray": raw, "memoryview": memoryview(bytes(raw))}[kind]
    batch, one_by_one = run_both(lambda: B.TransactionBoundaryParser(flavour), buf, len(prefix), cuts)
    assert batch[0] == one_by_one[0]
    assert batch[1] == one_by_one[1]
    assert batch[2] == one_by_one[2]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    file_index=st.integers(0, 10_000),
    split_points=st.lists(st.floats(0, 1), min_size=1, max_size=8),
)
def test_a_file_split_into_several_calls_gives_the_whole_file_result(corpus_events, file_index, split_points):
    """Calls that stop at a cut event and resume from the returned position see every group once."""
    events = corpus_events[file_index % len(corpus_events)]
    buf = b"".join(events)
    whole = B.TransactionBoundaryParser()
    whole_ends: list = []
    whole_pos, _ = whole.feed_buffer(buf, 0, len(buf), lambda end, gtid: whole_ends.append((end, gtid)))
    parts = B.TransactionBoundaryParser()
    part_ends: list = []
    pos = 0
    for cut in sorted({int(f * len(buf)) for f in split_points} | {len(buf)}):
        pos, _ = parts.feed_buffer(buf, pos, cut, lambda end, gtid: part_ends.append((end, gtid)))
        assert pos <= cut
    assert pos == whole_pos == len(buf)
    assert part_ends == whole_ends
    assert parser_state(parts) == parser_state(whole)


def test_batch_over_synthetic_mysql_groups_matches_per_event():
    """The MySQL loop's every kind of action (state-only step, QUERY peek, slow step, feed) on known shapes."""
    fde = E.fde("8.0.36")
    body = [E.gtid(1), E.query("BEGIN"), E.table_map(), E.write_rows(), E.xid(),
            E.gtid(2), E.query("CREATE TABLE t (a INT)"),
            E.query("BEGIN"), E.intvar(), E.query("INSERT INTO t VALUES (1)"), E.query("COMMIT"),
            E.gtid(3), E.query("XA START X'31',X'',1"), E.write_rows(), E.query("XA END X'31',X'',1"), E.xa_prepare(),
            E.gtid(4), E.query("XA ROLLBACK X'31',X'',1"),
            E.gtid(5), E.query("BEGIN"), E.write_rows(), E.incident(),
            E.gtid(6), E.query("BEGIN"), E.gtid(7), E.query("BEGIN"), E.unknown(ignorable=True), E.query("ROLLBACK"),
            E.unknown(ignorable=False), E.rotate(), E.payload(), E.gtid(8), E.payload(),
            E.gtid(9), E.query("BEGI"), E.write_rows(), E.query("COMMI"), E.gtid(10), E.query("B"), E.query("C"),
            E.gtid(11), E.query("BEGIN WORK"), E.query("COMMIT WORK"), E.query("CALL p()")]
    buf = fde + b"".join(body)
    batch, one_by_one = run_both(B.TransactionBoundaryParser, buf, 0, [len(buf)])
    assert batch == one_by_one
    assert [end for end, *_ in batch[1]] and batch[2]["errors"] > 0  # groups completed and errors counted


def test_batch_over_synthetic_mariadb_groups_matches_per_event():
    """The MariaDB loop's inline cases (GTID, QUERY not ending the group, XID) and what goes to feed()."""
    fde = E.fde("10.11.6-MariaDB-log", n_types=171)
    body = [E.maria_gtid(1), E.query("INSERT INTO t VALUES (1)"), E.table_map(), E.write_rows(), E.xid(),
            E.maria_gtid(2), E.query("INSERT INTO t VALUES (2)"), E.query("COMMIT"),
            E.maria_gtid(3, flags2=C.FL_STANDALONE), E.query("CREATE TABLE t (a INT)"),
            E.maria_gtid(4), E.query("UPDATE t SET a = 2"), E.query("ROLLBACK"),
            E.maria_gtid(5), E.xa_prepare(), E.rotate(),
            E.maria_gtid(6), E.query("INSERT INTO t VALUES (3)"), E.maria_gtid(7), E.xid(),
            E.write_rows(), E.unknown(ignorable=True), E.unknown(ignorable=False), E.maria_gtid(8),
            E.fde("8.0.36"), E.gtid(9), E.query("BEGIN"), E.xid(), fde, E.maria_gtid(10), E.xid()]
    buf = fde + b"".join(body)
    for flavour in ("auto", "mariadb"):
        batch, one_by_one = run_both(lambda: B.TransactionBoundaryParser(flavour), buf, 0, [len(buf)])
        assert batch == one_by_one
        assert len(batch[1]) >= 6 and batch[2]["errors"] > 0
