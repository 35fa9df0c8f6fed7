"""The shared pass's batch write (downstream/sendbatch.py and its C extension _sendbatch.c), on real sockets.

Each (fd, data) gets one sendmsg: the result is what the kernel took (all of it, part of it when the socket is full,
0 when it is full already) or -errno; the bytes a peer receives are exactly that prefix of the data. Malformed
input is refused before anything is written. A batch split over threads returns its results in order.
"""

from __future__ import annotations

import errno
import os
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relayproxy.downstream import sendbatch


def test_the_extension_is_built():
    # make setup installs with a compiler: the batch path must be there (test_dump_followers also runs without it)
    assert sendbatch.available(), "relayproxy.downstream._sendbatch is missing: pip install -e . did not build it"


def _pair(sndbuf: int | None = None):
    a, b = socket.socketpair()
    if sndbuf is not None:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def _drain(sock: socket.socket) -> bytes:
    out = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return bytes(out)
        if not chunk:
            return bytes(out)
        out += chunk


def test_bytes_and_lists_of_pieces_go_out_whole_and_in_order():
    pairs = [_pair() for _ in range(3)]
    try:
        big = bytearray(b"y" * 5000)
        items = [
            (pairs[0][0].fileno(), b"plain bytes"),
            (pairs[1][0].fileno(), [b"head", memoryview(b"--slice--")[2:7], b"\x07", big]),
            (pairs[2][0].fileno(), []),
        ]
        assert sendbatch._send_batch(items) == [11, 4 + 5 + 1 + 5000, 0]
        assert _drain(pairs[0][1]) == b"plain bytes"
        assert _drain(pairs[1][1]) == b"head" + b"slice" + b"\x07" + bytes(big)
        assert _drain(pairs[2][1]) == b""
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_a_full_socket_takes_a_prefix_then_nothing():
    a, b = _pair(sndbuf=4096)
    try:
        data = os.urandom(4 << 20)
        first = sendbatch._send_batch([(a.fileno(), data)])[0]
        assert 0 < first < len(data)
        again = sendbatch._send_batch([(a.fileno(), data[first:])])[0]
        assert again == 0, "a full socket took more (EAGAIN is 0)"
        assert _drain(b) == data[:first]
    finally:
        a.close()
        b.close()


def test_a_closed_peer_is_an_errno_not_a_signal():
    a, b = _pair()
    b.close()
    try:
        result = sendbatch._send_batch([(a.fileno(), b"x" * 100)])[0]
        assert result in (-errno.EPIPE, -errno.ECONNRESET)
    finally:
        a.close()


def test_a_closed_descriptor_is_ebadf_and_the_others_still_go_out():
    a, b = _pair()
    c, d = _pair()
    fd = c.fileno()
    c.close()
    try:
        assert sendbatch._send_batch([(fd, b"lost"), (a.fileno(), b"kept")]) == [-errno.EBADF, 4]
        assert _drain(b) == b"kept"
    finally:
        a.close()
        b.close()
        d.close()


@pytest.mark.parametrize("item, error", [
    ((1,), TypeError),
    ([1, b"x"], TypeError),
    ((-1, b"x"), ValueError),
    (("3", b"x"), TypeError),
    ((1 << 40, b"x"), ValueError),
    ((1, "text, not bytes"), TypeError),
    ((1, [b"ok", 42]), TypeError),
])
def test_malformed_input_is_refused_before_anything_is_written(item, error):
    a, b = _pair()
    try:
        with pytest.raises(error):
            sendbatch._send_batch([(a.fileno(), b"first"), item])
        assert _drain(b) == b"", "the item before the malformed one was written"
        with pytest.raises(TypeError):
            sendbatch._send_batch(((a.fileno(), b"a tuple, not a list"),))
    finally:
        a.close()
        b.close()


def test_more_buffers_than_iov_max_send_a_prefix():
    a, b = _pair()
    try:
        pieces = [bytes([i % 251]) for i in range(3000)]
        taken = sendbatch._send_batch([(a.fileno(), pieces)])[0]
        assert 0 < taken <= 1024
        assert _drain(b) == b"".join(pieces)[:taken]
    finally:
        a.close()
        b.close()


def test_a_batch_split_over_threads_keeps_its_order(monkeypatch):
    monkeypatch.setattr(sendbatch, "SPLIT_MIN", 2)
    pairs = [_pair() for _ in range(11)]
    try:
        items = [(a.fileno(), [b"client %d:" % i, b"x" * i]) for i, (a, _b) in enumerate(pairs)]
        closed = pairs[5][1]
        closed.close()
        results = sendbatch.send(items, threads=3)
        assert len(results) == 11
        for i, ((_a, b), result) in enumerate(zip(pairs, results)):
            want = b"client %d:" % i + b"x" * i
            if i == 5:
                assert result < 0
                continue
            assert result == len(want)
            assert _drain(b) == want
        # and again (the helpers' queues hold nothing left over from the batch before)
        assert sendbatch.send(items[:4], threads=3) == [len(b"client %d:" % i) + i for i in range(4)]
    finally:
        for a, b in pairs:
            a.close()
            if b.fileno() != -1:
                b.close()


def test_a_malformed_part_in_a_helper_raises_and_leaves_no_result_behind(monkeypatch):
    monkeypatch.setattr(sendbatch, "SPLIT_MIN", 1)
    (a, b), (c, d) = _pair(), _pair()
    try:
        with pytest.raises(TypeError):
            sendbatch.send([(a.fileno(), b"one"), (c.fileno(), "two is text")], threads=2)
        assert sendbatch.send([(a.fileno(), b"three"), (c.fileno(), b"four")], threads=2) == [5, 4]
        assert _drain(b) == b"onethree"
        assert _drain(d) == b"four"
    finally:
        for s in (a, b, c, d):
            s.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=3000), max_size=40), min_size=1, max_size=6),
       st.sampled_from([None, 4096]))
def test_what_a_peer_receives_is_the_prefix_the_result_counts(batches, sndbuf):
    pairs = [_pair(sndbuf) for _ in batches]
    try:
        results = sendbatch._send_batch([(a.fileno(), pieces) for (a, _b), pieces in zip(pairs, batches)])
        for (_a, b), pieces, result in zip(pairs, batches, results):
            joined = b"".join(pieces)
            assert 0 <= result <= len(joined)
            assert _drain(b) == joined[:result]
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_a_rest_the_transport_refuses_drops_the_replica_instead_of_leaving_a_hole():
    """``write_rest`` hands what a socket did not take to its transport; if that fails the stream would have a hole,
    so the replica is disconnected (it reconnects from where it is) and the pass hands the dump back to its task."""
    import asyncio

    from relayproxy.downstream.transport import ClientDumpChannel

    class Transport:
        aborted = False

        def write(self, data):
            raise RuntimeError("transport refuses")

        def abort(self):
            self.aborted = True

        def is_closing(self):
            return self.aborted

    class Protocol:
        peer_host, peer_port = "127.0.0.1", 1
        _write_paused = False

        def __init__(self, loop):
            self.transport = Transport()
            self.input_ended = loop.create_future()
            self.closed = loop.create_future()

        @property
        def is_closing(self):
            return self.transport.is_closing()

    async def scenario():
        protocol = Protocol(asyncio.get_running_loop())
        channel = ClientDumpChannel(protocol, 1.0, 1)
        assert channel.write_rest([b"abc", b"def"], True, 2) is False
        assert protocol.transport.aborted

    asyncio.run(scenario())
