"""Shared framed chunks: a range of a relay file read, checked, classified and framed once for every dump.

A dump packet is the 4-byte header (length, sequence id) + 0x00 + the event, and the relay's files hold the
exact events a replica needs. Replicas that follow the horizon all ask for the same range when it advances,
and replicas catching up together read the same ranges in the same order. So a range is read once, its
events' CRCs checked once, the transaction boundary parser run over it once (from the state the asking
replica's parser was in), and its packets framed once; what stays per replica is one byte per packet (the
sequence id, ``frame_for``) and a cheap test of whether the range needs anything done to it for that replica
(``Chunk.types``, ``gtids``): a GTID it must skip, an event its capabilities filter, a relay-made filler.

Sans-I/O: ``scan_chunk`` is fed bytes; ``ChunkCache`` only holds futures of chunks and never reads itself.
"""

from __future__ import annotations

import asyncio
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from ...binlog import boundary as B
from ...binlog import constants as C
from ...binlog.checksum import crc32 as _crc32
from ...binlog.gtid import GtidSet
from .files import U32, header_unpack_from

_HEADER_LEN = C.HEADER_LEN
_RESULT_MASK = B.RESULT_MASK
_FLAG_ERROR = B.FLAG_ERROR
_GROUP_START = B.GROUP_START
_pack_u32 = U32.pack
_unpack_u32_from = U32.unpack_from

CACHE_BYTES = 24 << 20  # framed chunks kept for senders that come by later (each about twice its range)
# ... and at most this many: at the horizon a chunk is one advance (a few hundred bytes at 1,000 trx/s), and each
# holds a few objects the cyclic collector walks at every full collection (6,000 chunks were seen held)
CACHE_CHUNKS = 1024
# From this average packet size on, a replica's framing goes out as pieces of the shared bytes plus its own
# sequence bytes (``pieces_for``, a writev) instead of a patched copy (``frame_for``): large events are not copied
# once per replica before the socket copies them again. Small events are cheaper copied than as many iovecs.
PIECES_MIN_PACKET = 2048
_SEQ_BYTE = [bytes((i,)) for i in range(256)]


class Chunk:
    """Events ``[start, end)`` of relay file ``name``, read once.

    ``data`` holds the bytes read (``end - start`` of them are whole events; a cut event after them is not
    part of the chunk), ``length`` how many were read. When ``ok``, every event's CRC matched and the parser
    raised no error, and ``framed`` holds the events as dump packets (0x00 prefix, sequence id 0) with
    ``seq_at`` the offset of each packet's sequence byte; ``data`` is then None: the framing holds every
    whole event of it, so a cache keeps the range once, not twice (a replica that must take the range event
    by event reads it again); ``types`` are the event types met, ``flags`` the union of their header
    flags, ``gtids`` the GTIDs of the groups that open in the chunk (None for a group without one),
    ``gtid_set`` the MySQL ones as a set, and ``parser`` the boundary parser's state at ``end``.
    """

    __slots__ = ("name", "start", "end", "data", "length", "ok", "framed", "seq_at", "types", "flags", "gtids",
                 "gtid_set", "parser", "events", "event_types", "_variants")

    def __init__(self, name: str, start: int, data: bytes):
        self.name = name
        self.start = start
        self.end = start
        self.data: bytes | None = data
        self.length = len(data)
        self.ok = False
        self.framed: bytes = b""
        self.seq_at: array = array("I")
        self.types: frozenset[int] = frozenset()
        self.flags = 0
        self.gtids: list = []
        self.gtid_set: GtidSet | None = None
        self.parser: B.TransactionBoundaryParser | None = None
        self.events = 0
        self.event_types = bytearray()  # each event's type, in order (for variants that leave some out)
        self._variants: dict[frozenset[int], tuple[bytes, array, int]] = {}

    @property
    def size(self) -> int:
        return (len(self.data) if self.data is not None else 0) + len(self.framed)

    def variant(self, omit: frozenset[int]) -> tuple[bytes, array, int]:
        """(framed packets, their sequence-byte offsets, how many) without the events whose type is in ``omit``
        (what a MariaDB master leaves out for a replica that tolerates holes: ANNOTATE_ROWS it did not ask for,
        BINLOG_CHECKPOINT and GTID_LIST it cannot read). Built once per set of types, then shared."""
        if not omit or self.types.isdisjoint(omit):
            return self.framed, self.seq_at, self.events
        cached = self._variants.get(omit)
        if cached is None:
            framed, seq_at, at, kept = [], array("I"), 0, 0
            view = memoryview(self.framed)
            out_len = 0
            for index, type_code in enumerate(self.event_types):
                end = self.seq_at[index + 1] - 3 if index + 1 < self.events else len(self.framed)
                if type_code not in omit:
                    seq_at.append(out_len + 3)
                    framed.append(view[at:end])
                    out_len += end - at
                    kept += 1
                at = end
            cached = (b"".join(framed), seq_at, kept)
            self._variants[omit] = cached
        return cached

    def frame_for(self, seq: int, omit: frozenset[int] = frozenset()) -> tuple[bytearray, int]:
        """The packets (without the event types in ``omit``) numbered from ``seq``: (the bytes to write, the next
        sequence id)."""
        framed, seq_at, _count = self.variant(omit)
        out = bytearray(framed)
        for at in seq_at:
            out[at] = seq
            seq = (seq + 1) & 0xFF
        return out, seq


    def pieces_for(self, seq: int, omit: frozenset[int] = frozenset()) -> tuple[list, int]:
        """``frame_for`` without the copy: the packets as slices of the shared framing with this replica's sequence
        bytes between them (b"".join of the list is ``frame_for``'s bytes), and the next sequence id."""
        framed, seq_at, _count = self.variant(omit)
        view = memoryview(framed)
        pieces: list[memoryview | bytes] = []
        append = pieces.append
        at = 0
        for where in seq_at:
            append(view[at:where])
            append(_SEQ_BYTE[seq])
            seq = (seq + 1) & 0xFF
            at = where + 1
        append(view[at:])
        return pieces, seq

    def as_pieces(self, omit: frozenset[int] = frozenset()) -> bool:
        """Whether ``pieces_for`` is the cheaper way to send this chunk (large packets on average)."""
        framed, _seq_at, count = self.variant(omit)
        return count > 0 and len(framed) >= count * PIECES_MIN_PACKET


def _feeds_no_more(type_code: int, flags: int, buf: Any, pos: int, event_size: int) -> int:
    """A chunk's parser's ``feed``: a plain function (no reference back to the parser), as the chunk keeps the
    parser for its end state only; ``copy()`` gives a parser that feeds."""
    raise RuntimeError("a chunk's parser keeps its end state only: feed a copy() of it")


def scan_chunk(name: str, start: int, data: bytes, parser: B.TransactionBoundaryParser, crc: bool) -> Chunk:
    """Classify and frame the whole events at the front of ``data`` (``data`` starts at an event).

    ``parser`` is a copy the chunk keeps (it ends in the state after the chunk's last event). Anything
    irregular (an impossible size, a CRC mismatch, a parser error, a FORMAT_DESCRIPTION) leaves ``ok``
    False with ``end`` at the last good event: the asking sender then takes the event-by-event path, which
    reports the error exactly as it always has."""
    chunk = Chunk(name, start, data)
    view = memoryview(data)
    n = len(data)
    off = 0
    feed = parser.feed
    parts: list = []
    append = parts.append
    seq_at = chunk.seq_at
    framed_len = 0
    types: set[int] = set()
    add_type = types.add
    flags_any = 0
    gtids = chunk.gtids
    event_types = chunk.event_types
    ok = True
    while off + _HEADER_LEN <= n:
        _ts, type_code, _sid, size, _lp, flags = header_unpack_from(data, off)
        end = off + size
        if size < _HEADER_LEN or size >= 0xFFFFFF or type_code == C.FORMAT_DESCRIPTION_EVENT:
            ok = off > 0 and ok  # the event-by-event path takes it from here
            break
        if end > n:
            break
        if crc and _crc32(view[off : end - 4]) != _unpack_u32_from(data, end - 4)[0]:
            ok = off > 0 and ok
            break
        result = feed(type_code, flags, view, off, size)
        if result & _FLAG_ERROR:
            ok = off > 0 and ok
            break
        if result & _RESULT_MASK == _GROUP_START:
            gtids.append(parser.gtid)
        add_type(type_code)
        event_types.append(type_code)
        flags_any |= flags
        seq_at.append(framed_len + 3)
        append(_pack_u32(size + 1))
        append(b"\x00")
        append(view[off:end])
        framed_len += size + 5
        chunk.events += 1
        off = end
    # The chunk keeps the parser for its end state only (``adopt``). Its own bound ``feed`` is a reference cycle
    # (parser -> bound method -> parser) that only a full collection of the cyclic GC would free, one per chunk.
    parser.feed = _feeds_no_more
    chunk.end = start + off
    if off == 0:
        return chunk  # nothing whole: the first event is larger than what was read, or broken
    chunk.ok = ok
    chunk.framed = b"".join(parts)
    if ok:
        chunk.data = None  # every whole event read is in the framing (``Chunk``)
    chunk.types = frozenset(types)
    chunk.flags = flags_any
    chunk.parser = parser
    if parser.flavour == "mysql" and gtids:
        gset = GtidSet()
        for gtid in gtids:
            if gtid is None:
                continue
            if len(gtid) == 2:
                gset.add(gtid[0], gtid[1])
            else:
                gset.add(gtid[0], gtid[2], gtid[1])
        chunk.gtid_set = gset
    return chunk


class ChunkCache:
    """The chunks of one relay directory, shared by its dumps (one event loop): a chunk asked for while it is
    being read is awaited, not read again; finished chunks stay until ``CACHE_BYTES`` are held."""

    def __init__(self, budget: int = CACHE_BYTES, max_chunks: int = CACHE_CHUNKS):
        self.budget = budget
        self.max_chunks = max_chunks
        self.held = 0
        self._done: OrderedDict[tuple, Chunk] = OrderedDict()
        self._pending: dict[tuple, asyncio.Future] = {}
        self.hits = 0
        self.misses = 0

    async def get(self, key: tuple, make: Callable[[], Awaitable[Chunk]]) -> Chunk | None:
        """The chunk for ``key``, made by ``make()`` unless it is held or being made; None when another
        sender's making of it failed or was cancelled (the caller then reads for itself)."""
        chunk = self._done.get(key)
        if chunk is not None:
            self._done.move_to_end(key)
            self.hits += 1
            return chunk
        pending = self._pending.get(key)
        if pending is not None:
            self.hits += 1
            return await asyncio.shield(pending)
        self.misses += 1
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            chunk = await make()
            future.set_result(chunk)
        finally:
            del self._pending[key]
            if not future.done():
                future.set_result(None)  # failed or cancelled: whoever waits reads for itself
        self._keep(key, chunk)
        return chunk

    def peek(self, key: tuple) -> Chunk | None:
        """The finished chunk for ``key``, if held (no waiting: the shared pass at an advance runs in a callback)."""
        chunk = self._done.get(key)
        if chunk is not None:
            self._done.move_to_end(key)
            self.hits += 1
        return chunk

    def put(self, key: tuple, chunk: Chunk) -> None:
        """Keep a chunk made outside ``get`` (the shared pass reads small ranges inline)."""
        self.misses += 1
        if key not in self._done:
            self._keep(key, chunk)

    def _keep(self, key: tuple, chunk: Chunk) -> None:
        size = chunk.size
        if size > self.budget:
            return
        self._done[key] = chunk
        self.held += size
        while self.held > self.budget or len(self._done) > self.max_chunks:
            _key, old = self._done.popitem(last=False)
            self.held -= old.size

    def forget(self, name: str) -> None:
        """Drop every chunk of ``name`` (a purged or rewritten file)."""
        for key in [k for k in self._done if k[0] == name]:
            self.held -= self._done.pop(key).size


_caches: "weakref.WeakKeyDictionary[Any, ChunkCache]" = weakref.WeakKeyDictionary()


def chunk_cache(store: Any) -> ChunkCache:
    """One ChunkCache per relay store, shared by every dump of it."""
    cache = _caches.get(store)
    if cache is None:
        cache = ChunkCache()
        _caches[store] = cache
    return cache
