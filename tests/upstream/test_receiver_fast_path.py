"""RelayReceiver's inline fast path and RelayStore.append_event: same files, state and errors as the per-event path."""

from __future__ import annotations

import dataclasses
import struct
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayproxy.binlog import constants as C
from relayproxy.binlog.events import FormatDescription
from relayproxy.binlog.gtid import GtidSet, MariaBinlogState, MariaGtid
from relayproxy.binlog.reader import scan_bytes
from relayproxy.relay import (
    RelayEventError,
    RelayGapError,
    RelayMismatchError,
    RelayStateError,
    RelayStore,
    RelayStoreFailed,
)
from relayproxy.relay import store as S
from relayproxy.upstream import receiver as R
from relayproxy.upstream.receiver import RelayReceiver

from ..support import eventgen as G
from ..support.fakemaster import BinlogIndex, DumpCursor, clear_in_use, split_events
from .test_receiver import MARIA100_NONE, MARIA_CHAIN, MYSQL57_ROTATE, MYSQL80, payload
from ..relay.test_relay_store import MARIA, OTHER_SID, Feeder, fresh_store, maria_image, mysql_image

# -- the CRC32 residue ---------------------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=2048), wrong=st.integers(min_value=0, max_value=0xFFFFFFFF))
def test_crc32_residue_holds_exactly_for_the_right_trailer(data, wrong):
    """The fast path checks zlib.crc32(event) == residue instead of comparing the trailer: the same test."""
    good = zlib.crc32(data)
    assert zlib.crc32(data + good.to_bytes(4, "little")) == R._CRC32_RESIDUE
    if wrong != good:
        assert zlib.crc32(data + wrong.to_bytes(4, "little")) != R._CRC32_RESIDUE


# -- streams ---------------------------------------------------------------------------------------------------------


def _checksum_len(image: bytes) -> int:
    size = struct.unpack_from("<I", image, 4 + 9)[0]
    return FormatDescription.parse(image, 4, size).checksum_len


def positioned(image: bytes) -> bytes:
    """The file as a MariaDB before 11.4 writes it: log_pos 0 inside groups replaced by the event's end."""
    crc = _checksum_len(image)
    out = bytearray(image)
    for offset, ev in split_events(image):
        if struct.unpack_from("<I", ev, 13)[0] == 0 and ev[4] != C.FORMAT_DESCRIPTION_EVENT:
            end = offset + len(ev)
            struct.pack_into("<I", out, offset + 13, end)
            if crc:
                struct.pack_into("<I", out, end - 4, zlib.crc32(out[offset : end - 4]))
    return bytes(out)


def _name(rel: str) -> str:
    return Path(rel).name


def synthetic_large_events() -> list[tuple[str, bytes]]:
    """Events on both sides of the copy/view threshold and of the store's direct-write size."""
    image = G.binlog_file(
        G.previous_gtids(),
        G.gtid(1), G.query("BEGIN"), G.table_map(), G.query(b"INSERT " + bytes(R._COPY_BELOW + 100)), G.xid(),
        G.gtid(2), G.query(b"CREATE TABLE t " + bytes(S.DIRECT_BYTES + 10)),
        G.gtid(3), G.query("BEGIN"), G.query(b"x" * (R._COPY_BELOW - 50)), G.xid(),
        G.gtid(4, timestamp=1700000100), G.query("BEGIN", timestamp=0), G.xid(timestamp=0),  # 0: lag keeps the last
    )
    return [("binlog.000001", image)]


STREAMS = ["mysql80", "mysql57_rotate", "maria_chain", "maria_chain_positioned", "maria100_none", "large"]


@pytest.fixture(scope="module")
def streams(corpus_dir) -> dict[str, tuple[list[tuple[str, bytes]], str]]:
    """name -> (binlog files as the master holds them, the checksum the master announces)."""

    def files(*rels: str) -> list[tuple[str, bytes]]:
        return [(_name(rel), (corpus_dir / rel).read_bytes()) for rel in rels]

    chain = files(*MARIA_CHAIN)
    out = {
        "mysql80": files(MYSQL80),
        "mysql57_rotate": files(MYSQL57_ROTATE),
        "maria_chain": chain,
        "maria_chain_positioned": [(name, positioned(image)) for name, image in chain],
        "maria100_none": files(MARIA100_NONE),
        "large": synthetic_large_events(),
    }
    return {k: (v, "CRC32" if _checksum_len(v[0][1]) else "NONE") for k, v in out.items()}


def dump_payloads(files: list[tuple[str, bytes]], start: int = 0) -> list[bytes]:
    name = files[start][0]
    return [payload(s.event) for s in DumpCursor(BinlogIndex(files), file=name, pos=4, gtids=None, server_id=1).take()]


def resend_payloads(files: list[tuple[str, bytes]]) -> list[bytes]:
    """What a reconnect by position at the start of the newest file gets: re-sent events, then the rest."""
    return dump_payloads(files, len(files) - 1)


# -- running both paths ----------------------------------------------------------------------------------------------


def _state(store: RelayStore, receiver: RelayReceiver) -> tuple:
    return (
        dataclasses.astuple(receiver.counters),
        receiver.master_position,
        receiver.master_timestamp,
        receiver.master_file,
        receiver._next_offset,
        receiver.parser.in_group,
        store.current_file,
        store.current_end,
        store.boundary_end,
        store.pending_gtids,
    )


def _feed(store, receiver, batches, trace) -> bool:
    """Feed batch by batch, recording the state after each; False once a batch raised."""
    for batch in batches:
        try:
            receiver.feed(batch)
        except Exception as exc:  # any error: both paths must raise the same one, in the same state
            trace.append(("error", type(exc).__name__, str(exc), _state(store, receiver)))
            return False
        trace.append(_state(store, receiver))
    return True


def run_receiver(checksum: str, batches: list[list[bytes]], resend: list[bytes], *, fast: bool):
    """One stream through a fresh relay, then a reconnect that re-sends ``resend`` from the file's start.

    Returns the trace of states and errors, the horizon and the relay files' bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        store = RelayStore.open(Path(tmp) / "relay")
        try:
            receiver = RelayReceiver(store)
            receiver.fast_path = fast
            receiver.start_stream(announced_checksum=checksum, semi_sync=False)
            trace: list = []
            _feed(store, receiver, batches, trace)
            trace.append(("dropped", receiver.end_stream()))
            store.sync()
            trace.append(("horizon", store.horizon.snapshot()))
            receiver.start_stream(announced_checksum=checksum, semi_sync=False)
            _feed(store, receiver, [resend], trace)
            store.sync()
            trace.append(("horizon", store.horizon.snapshot()))
            files = {name: store.path(name).read_bytes() for name in store.files()}
        finally:
            store.close()
    return trace, files


def assert_paths_agree(checksum: str, batches: list[list[bytes]], resend: list[bytes]) -> tuple:
    fast = run_receiver(checksum, batches, resend, fast=True)
    slow = run_receiver(checksum, batches, resend, fast=False)
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]
    return fast


def split(items: list, cuts: list[int]) -> list[list]:
    bounds = sorted({c % (len(items) + 1) for c in cuts})
    out, start = [], 0
    for b in bounds + [len(items)]:
        out.append(items[start:b])
        start = b
    return out


@pytest.mark.parametrize("name", STREAMS)
def test_clean_streams_give_identical_relays_on_both_paths(streams, name, monkeypatch):
    files, checksum = streams[name]
    payloads = dump_payloads(files)
    per_event_calls = {True: 0, False: 0}
    original = RelayReceiver._event

    def counting_event(self, ev, *, need_ack):
        per_event_calls[self.fast_path] += 1
        return original(self, ev, need_ack=need_ack)

    monkeypatch.setattr(RelayReceiver, "_event", counting_event)
    batches = [payloads[i : i + 50] for i in range(0, len(payloads), 50)]
    trace, relay = assert_paths_agree(checksum, batches, resend_payloads(files))
    assert relay == {file_name: clear_in_use(image) for file_name, image in files}
    assert trace[-1][1].position == len(files[-1][1])
    assert trace[-2][0] != "error" and trace[-2][0][3] > 0  # counters.duplicates: the re-send was verified
    # The fast path leaves to _event exactly what it must: FDE, ROTATE, heartbeats, artificial events, log_pos 0
    # (inside MariaDB 11.4+ groups); the per-event run sends everything there.
    sent = payloads + resend_payloads(files)
    assert per_event_calls == {True: sum(map(_needs_per_event_path, sent)), False: len(sent)}
    if name in ("mysql80", "maria_chain_positioned", "large"):
        assert per_event_calls[True] * 4 < len(sent)  # mostly inline


def _needs_per_event_path(payload: bytes) -> bool:
    size, log_pos, flags = struct.unpack_from("<IIH", payload, 1 + 9)
    return R._SLOW_TYPE[payload[1 + 4]] or bool(flags & C.LOG_EVENT_ARTIFICIAL_F) or log_pos < size + 4


@st.composite
def damaged_streams(draw, names=tuple(STREAMS)):
    name = draw(st.sampled_from(names))
    return name, draw(st.data())


def _mutate(payloads: list[bytes], data) -> list[bytes]:
    out = list(payloads)
    kind = data.draw(st.sampled_from(["flip", "flip_header", "cut_payload", "cut_stream", "drop", "repeat", "replay"]))
    i = data.draw(st.integers(0, len(out) - 1))
    p = bytearray(out[i])
    if kind in ("flip", "flip_header"):
        limit = min(len(p), 1 + C.HEADER_LEN) if kind == "flip_header" else len(p)
        at = data.draw(st.integers(0, limit - 1))
        p[at] ^= 1 << data.draw(st.integers(0, 7))
        out[i] = bytes(p)
    elif kind == "cut_payload":
        out[i] = bytes(p[: data.draw(st.integers(0, len(p) - 1))])
    elif kind == "cut_stream":
        out = out[:i]
    elif kind == "drop":
        del out[i]
    elif kind == "repeat":
        out.insert(i, out[i])
    else:  # an earlier event again, later: a re-send that ends before what the relay already holds
        out.insert(data.draw(st.integers(i, len(out))), out[i])
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@pytest.mark.slow
@given(case=damaged_streams())
def test_damaged_streams_fail_identically_on_both_paths(streams, case):
    """Bit flips, cut payloads, cut streams, lost and repeated events: the same error (type and message)
    after the same writes and state, the same relay after a reconnect re-sends the clean stream."""
    name, data = case
    files, checksum = streams[name]
    clean = dump_payloads(files)
    damaged = _mutate(clean, data)
    cuts = data.draw(st.lists(st.integers(0, len(damaged)), max_size=4))
    assert_paths_agree(checksum, split(damaged, cuts), resend_payloads(files))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@pytest.mark.slow
@given(data=st.data())
def test_unverified_checksums_on_both_paths(streams, data):
    """verify_checksums=False: no CRC check on either path, so a flipped body byte is stored as it came."""
    files, checksum = streams["maria_chain_positioned"]
    clean = dump_payloads(files)
    damaged = list(clean)
    i = data.draw(st.integers(0, len(damaged) - 1))
    ev = bytearray(damaged[i])
    if len(ev) > 1 + C.HEADER_LEN + 4:
        ev[data.draw(st.integers(1 + C.HEADER_LEN, len(ev) - 5))] ^= 0x10
    damaged[i] = bytes(ev)
    results = []
    for fast in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            store = RelayStore.open(Path(tmp) / "relay")
            try:
                receiver = RelayReceiver(store, verify_checksums=False)
                receiver.fast_path = fast
                receiver.start_stream(announced_checksum=checksum, semi_sync=False)
                trace: list = []
                _feed(store, receiver, split(damaged, [len(damaged) // 2]), trace)
                store.sync()
                results.append((trace, {n: store.path(n).read_bytes() for n in store.files()}))
            finally:
                store.close()
    assert results[0] == results[1]


def test_crc_mismatch_on_the_fast_path_names_event_file_and_offset(streams, tmp_path):
    files, checksum = streams["maria_chain_positioned"]
    name, image = files[0]
    clean = dump_payloads(files)
    events = split_events(image)
    victim = next(i for i, (_, ev) in enumerate(events) if i > 5 and not R._SLOW_TYPE[ev[4]] and len(ev) > 40)
    offset, ev = events[victim]
    event_name = C.event_name(ev[4])
    at = next(i for i, p in enumerate(clean) if p[1:] == ev)
    bad = bytearray(clean[at])
    bad[1 + C.HEADER_LEN + 2] ^= 0x01
    store = RelayStore.open(tmp_path / "relay")
    receiver = RelayReceiver(store)
    receiver.start_stream(announced_checksum=checksum, semi_sync=False)
    with pytest.raises(R.ChecksumMismatch, match=rf"^CRC32 mismatch in {event_name} event at {name}:{offset}$"):
        receiver.feed(clean[:at] + [bytes(bad)] + clean[at + 1 :])
    assert store.current_end == offset  # everything before it written, nothing after it
    assert receiver.counters.events == at - 1  # every payload before it but the artificial ROTATE
    store.close()


def test_semi_sync_streams_take_the_per_event_path(streams, tmp_path, monkeypatch):
    files, checksum = streams["maria_chain_positioned"]
    payloads = [b"\x00\xef\x00" + p[1:] for p in dump_payloads(files)]
    calls = []
    original = RelayReceiver._event
    monkeypatch.setattr(RelayReceiver, "_event", lambda self, ev, need_ack: (calls.append(1), original(
        self, ev, need_ack=need_ack))[1])
    store = RelayStore.open(tmp_path / "relay")
    receiver = RelayReceiver(store)
    receiver.start_stream(announced_checksum=checksum, semi_sync=True)
    receiver.feed(payloads)
    assert len(calls) == len(payloads)
    store.sync()
    assert store.path(files[0][0]).read_bytes()[4:] == files[0][1][4:]
    store.close()


# -- RelayStore.append_event ---------------------------------------------------------------------------------------


def _header(ev: bytes) -> tuple[int, int]:
    """(log_pos, type_code) as the receiver hands them to append_event."""
    return struct.unpack_from("<I", ev, 13)[0], ev[4]


def test_append_event_writes_what_write_event_writes(tmp_path):
    image = mysql_image(groups=6)
    store = fresh_store(tmp_path)
    outcomes = [store.append_event(offset, ev, *_header(ev)) for offset, ev in split_events(image)]
    assert outcomes == ["appended"] * len(outcomes)
    assert store.format_description is not None  # the FDE at 4 went through write_event's checks
    assert store.pending_gtids is not None  # so did PREVIOUS_GTIDS: it set the file's start set
    store.close()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image


def test_append_event_falls_back_for_the_first_event_and_special_events(tmp_path):
    store = fresh_store(tmp_path)
    xid = G.xid(log_pos=4 + len(G.xid()))
    with pytest.raises(RelayEventError, match="starts with its FORMAT_DESCRIPTION"):
        store.append_event(4, xid, *_header(xid))
    image = maria_image()
    events = split_events(image)
    store.append_event(*events[0], *_header(events[0][1]))
    gtid_list_offset, gtid_list = events[1]
    assert gtid_list[4] == C.MARIA_GTID_LIST_EVENT
    damaged = bytearray(gtid_list)
    damaged[C.HEADER_LEN : C.HEADER_LEN + 4] = b"\xff\xff\xff\x0f"  # an absurd count: only decoding notices
    with pytest.raises(RelayEventError, match="MARIA_GTID_LIST"):
        store.append_event(gtid_list_offset, bytes(damaged), *_header(gtid_list))
    assert store.current_end == gtid_list_offset
    assert store.append_event(gtid_list_offset, gtid_list, *_header(gtid_list)) == "appended"
    assert store.pending_gtids is not None
    store.close()


def test_append_event_falls_back_for_duplicates_mismatches_and_gaps(tmp_path):
    image = mysql_image(groups=4)
    events = split_events(image)
    store = fresh_store(tmp_path)
    feeder = Feeder(store)
    for offset, ev in events[:8]:
        feeder.feed(offset, ev)
    offset, ev = events[5]
    assert store.append_event(offset, ev, *_header(ev)) == "duplicate"
    changed = bytearray(ev)
    changed[25] ^= 0xFF
    with pytest.raises(RelayMismatchError, match="first difference at byte 25"):
        store.append_event(offset, bytes(changed), *_header(ev))
    offset, ev = events[9]
    with pytest.raises(RelayGapError):
        store.append_event(offset, ev, *_header(ev))
    assert store.current_end == events[8][0]
    store.close()
    assert (tmp_path / "relay" / "binlog.000001").read_bytes() == image[: events[8][0]]


def test_append_event_with_a_log_pos_that_is_not_the_end_takes_write_events_checks(tmp_path):
    """A log_pos other than offset + size (a file past 4 GB, where it wraps) goes to write_event, which
    checks the header's log_pos and places the event itself."""
    image = mysql_image()
    events = split_events(image)
    store = fresh_store(tmp_path)
    store.write_event(*events[0])
    offset, ev = events[1]
    wrong = bytearray(ev)
    struct.pack_into("<I", wrong, 13, offset + len(ev) + 1)
    with pytest.raises(RelayEventError, match=rf"log_pos {offset + len(ev) + 1}, expected {offset + len(ev)}"):
        store.append_event(offset, bytes(wrong), *_header(bytes(wrong)))
    assert store.append_event(offset, ev, (offset + len(ev)) & 0xFFFFFFFF | (1 << 32), ev[4]) == "appended"
    store.close()


def test_append_event_on_a_failed_or_closed_store_raises(tmp_path, monkeypatch):
    image = mysql_image()
    events = split_events(image)
    store = fresh_store(tmp_path)
    for offset, ev in events[:3]:
        store.write_event(offset, ev)

    def broken(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(S, "DIRECT_BYTES", 1)  # every event is written straight away
    monkeypatch.setattr(S.os, "pwrite", broken)
    offset, ev = events[3]
    with pytest.raises(OSError, match="No space"):
        store.append_event(offset, ev, *_header(ev))
    with pytest.raises(RelayStoreFailed, match="No space"):
        store.append_event(offset, ev, *_header(ev))
    monkeypatch.undo()
    store.close()
    closed = RelayStore.open(tmp_path / "closed")
    closed.start_file("binlog.000001")
    closed.write_event(*events[0])
    closed.close()
    offset, ev = events[1]
    with pytest.raises(RelayStateError, match="closed"):
        closed.append_event(offset, ev, *_header(ev))


def test_append_event_large_events_skip_the_buffer(tmp_path):
    files = synthetic_large_events()
    name, image = files[0]
    store = fresh_store(tmp_path, name)
    for offset, ev in split_events(image):
        store.append_event(offset, memoryview(ev), *_header(ev))
    store.sync()
    assert store.path(name).read_bytes() == image
    store.close()


def _maria_start(state) -> bytes:
    """A MariaDB file image (no groups) starting with GTID_LIST ``state``."""
    return G.binlog_file(G.event(C.MARIA_GTID_LIST_EVENT, state.encode_gtid_list_body()), server_version=MARIA)


def _mismatch_names_file_and_sets(exc: RelayMismatchError, file: str, *sets) -> None:
    message = str(exc)
    assert exc.file == file and f"{file}:" in message, message
    for gtids in sets:
        assert str(gtids) in message, f"{gtids} not named in: {message}"


@pytest.mark.parametrize("flavour", ["mysql", "mariadb"])
def test_previous_gtids_through_append_event_are_cross_checked(tmp_path, flavour):
    """The store decodes the PREVIOUS_GTIDS / GTID_LIST it appends itself; set_start_gtids accepts the same set
    from the session and refuses any other, naming the file and both sets."""
    if flavour == "mysql":
        start = GtidSet()
        start.add_interval(OTHER_SID, 1, 6)
        image = mysql_image(start=start)
        other = start.copy()
        other.add_interval(OTHER_SID, 6, 8)  # one more GTID than the file's set
    else:
        start = MariaBinlogState([MariaGtid(0, 1, 5), MariaGtid(1, 2, 9)])
        image = maria_image()
        other = MariaBinlogState([MariaGtid(0, 1, 5), MariaGtid(1, 2, 8)])
    store = fresh_store(tmp_path)
    for offset, ev in split_events(image)[:2]:
        store.append_event(offset, ev, *_header(ev))
    store.set_start_gtids(start)  # the store decoded the same set the session would
    with pytest.raises(RelayMismatchError) as refused:
        store.set_start_gtids(other)
    _mismatch_names_file_and_sets(refused.value, "binlog.000001", other, start)
    assert "differs from the file's" in str(refused.value)
    store.set_start_gtids(start)  # the refusal changed nothing
    store.close()


@pytest.mark.parametrize("flavour", ["mysql", "mariadb"])
def test_a_new_files_set_that_does_not_continue_the_relays_is_refused_on_the_fast_path(tmp_path, flavour):
    """After a rotation, a PREVIOUS_GTIDS / GTID_LIST lacking GTIDs the relay holds (another master's history)
    is refused by append_event as by write_event: RelayMismatchError naming the new file and both sets, the
    relay's set unchanged, nothing of the new file's set adopted."""
    if flavour == "mysql":
        first = mysql_image("binlog.000002")
        behind = GtidSet()
        behind.add_interval(OTHER_SID, 1, 3)
        second = mysql_image("binlog.000003", rotate=False, groups=2, start=behind)
    else:
        first = maria_image("binlog.000002")
        behind = MariaBinlogState([MariaGtid(0, 1, 5), MariaGtid(1, 2, 9)])  # the first file's own start set
        second = _maria_start(behind)
    after = scan_bytes(first).gtids_after
    for write in ("append_event", "write_event"):
        store = fresh_store(tmp_path / write)
        Feeder(store).feed_all(first)
        store.start_file("binlog.000002")
        (fde_offset, fde), (set_offset, set_event) = split_events(second)[:2]
        fast = write == "append_event"
        written = store.append_event(fde_offset, fde, *_header(fde)) if fast else store.write_event(fde_offset, fde)
        assert written == "appended"
        with pytest.raises(RelayMismatchError) as refused:
            if fast:
                store.append_event(set_offset, set_event, *_header(set_event))
            else:
                store.write_event(set_offset, set_event)
        _mismatch_names_file_and_sets(refused.value, "binlog.000002", behind, after)
        assert "does not continue the relay's set" in str(refused.value)
        assert store.horizon.snapshot().gtids == after
        assert store.current_end == set_offset  # the refused event was not written
        store.close()


def test_a_resent_event_after_newer_ones_keeps_the_furthest_master_position(streams):
    """A re-sent (duplicate) event ending before events appended in the same batch: master_position stays at
    the furthest end on both paths (the fast path notes the run's appended end before the duplicate's)."""
    files, checksum = streams["mysql80"]
    payloads = dump_payloads(files)
    tried = 0
    for k in range(len(payloads) - 1, 4, -1):
        for j in range(k - 2, 1, -1):
            if _needs_per_event_path(payloads[j]):
                continue
            batch = payloads[:k] + [payloads[j]]
            fast, slow = (run_receiver(checksum, [batch], [], fast=f) for f in (True, False))
            assert fast == slow
            state = fast[0][0]
            if state[0] == "error":
                continue  # the boundary parser refused the re-sent event there: try another
            tried += 1
            end = struct.unpack_from("<I", payloads[k - 1], 1 + 13)[0]
            assert state[0][3] == 1 and state[1] == (files[0][0], end)  # one duplicate; position of event k-1
            if tried == 3:
                return
    pytest.fail(f"only {tried} re-sends the boundary parser accepts in the stream")
