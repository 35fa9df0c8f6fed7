"""Seeded fuzzers for the chaos soak and its test: the binlog parser (in-process) and a live relay's MySQL port.

Both are plain functions that return a report (counts, outcomes, failures with the input that caused them), so the
soak (``benchmarks/soak.py``) runs them at 100,000+ inputs and ``tests/benchmarks/test_soak.py`` at a few thousand.

``fuzz_binlog_parser`` mutates real events (the corpus, or the soak master's own binlogs): bit flips, byte
overwrites, inserts, deletions, spliced events from other files, forged ``event_size`` / type codes, random
chunking. Each input goes through the code that meets untrusted bytes: ``BinlogScanner`` (whole files, fed in
random chunks; for some inputs also whole, and the two results must agree), ``TransactionBoundaryParser``
(event sequences; its at-boundary / in-group state must match what each result says) and the typed views
(``view_event`` with every property read, ``describe()``, ``verify_checksum()``). Allowed outcomes are the
documented ones: a scan result with an ``at offset ...`` error, ``BinlogFormatError`` or ``ChecksumError``.
Anything else is a crash; an input that runs past ``time_cap`` seconds is a hang (interrupted by SIGALRM when
the fuzzer runs on the main thread).

``fuzz_downstream`` talks to a running relay's ``--listen`` port over real TCP connections, ``workers`` at a
time, many inputs per connection: after a real login, COM_QUERY with replica statements, mutated statements and
random text, COM_PING, unknown commands, random register / dump requests (with server ids no real replica
uses); before login, garbage, mutated handshake responses, absurd packet lengths, wrong passwords. Each input
must get its whole answer (or a close at a packet boundary) within ``deadline`` seconds, and no ERR may carry
``internal error in relayproxy``. An input the server answers by closing the connection ends that connection;
the next input opens a new one. Generation is driven by ``random.Random`` with the given seed (hypothesis'
per-example buffer and sequential runner do not fit 100,000 inputs over parallel sockets); a seed and a worker
number reproduce any input, and the report keeps the inputs of every failure.
"""

from __future__ import annotations

import collections
import inspect as pyinspect
import random
import selectors
import signal
import socket
import struct
import threading
import time
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from pymysql import _auth as pymysql_auth

from relayproxy.binlog import boundary as B
from relayproxy.binlog import constants as C
from relayproxy.binlog.checksum import ChecksumError
from relayproxy.binlog.events import BinlogFormatError, FormatDescription
from relayproxy.binlog.reader import BinlogScanner, scan_bytes
from relayproxy.binlog.views import EventView, TransactionPayloadView, view_event
from relayproxy.wire import packets as P
from relayproxy.wire.handshake import build_handshake_response, client_capabilities, parse_handshake
from relayproxy.wire.packets import PacketDecoder, ProtocolError, TextResultReader, encode_packet, parse_err

INTERNAL_ERROR = "internal error in relayproxy"
BINLOG_MAGIC = b"\xfebin"


class FuzzHang(Exception):
    """An input ran past its time cap (raised by SIGALRM inside the code under test)."""


# =============================================================================================================
# The binlog parser
# =============================================================================================================


@dataclass
class BinlogSample:
    """One real binlog file cut into its events: the FDE (parsed and raw) and every later event's bytes."""

    name: str
    fde_raw: bytes
    fde: FormatDescription
    events: list[bytes]


def load_binlog_samples(paths: list[Path], max_events_per_file: int = 3000) -> list[BinlogSample]:
    """Real files that scan cleanly from their magic (others are skipped), each cut into events."""
    samples = []
    for path in paths:
        data = Path(path).read_bytes()
        if not data.startswith(BINLOG_MAGIC):
            continue
        events: list[bytes] = []
        result = scan_bytes(data, on_event=lambda ev: events.append(bytes(data[ev.offset:ev.end]))
                            if len(events) <= max_events_per_file else None)
        if result.fde is None or not events or events[0][4] != C.FORMAT_DESCRIPTION_EVENT:
            continue
        try:
            fde = FormatDescription.parse(events[0], 0)
        except (BinlogFormatError, ChecksumError):
            continue
        samples.append(BinlogSample(str(path), events[0], fde, events[1:]))
    return samples


def corpus_binlog_paths(corpus_dir: Path) -> list[Path]:
    """Every file the corpus manifest lists (the scanner decides which ones are usable)."""
    import json

    entries = json.loads((Path(corpus_dir) / "manifest.json").read_text())
    return [Path(corpus_dir) / e["file"] for e in entries if isinstance(e, dict) and "file" in e]


_INTERESTING_U32 = (0, 1, 18, 19, 20, 23, 0x7F, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)


class Mutator:
    """Byte-level and event-level mutations of real binlog bytes, from one seeded Random."""

    def __init__(self, rng: random.Random, samples: list[BinlogSample]) -> None:
        self.rng = rng
        self.samples = samples

    def mutate(self, data: bytearray, rounds: int) -> bytearray:
        rng = self.rng
        for _ in range(rounds):
            if not data:
                data += rng.randbytes(rng.randrange(1, 40))
                continue
            op = rng.randrange(9)
            at = rng.randrange(len(data))
            if op == 0:  # flip one bit
                data[at] ^= 1 << rng.randrange(8)
            elif op == 1:  # overwrite a byte
                data[at] = rng.randrange(256)
            elif op == 2:  # insert bytes
                data[at:at] = rng.randbytes(rng.randrange(1, 16))
            elif op == 3:  # delete a run
                del data[at:at + rng.randrange(1, 32)]
            elif op == 4:  # duplicate a run
                run = data[at:at + rng.randrange(1, 64)]
                data[at:at] = run
            elif op == 5:  # truncate
                del data[at:]
            elif op == 6:  # an interesting 32-bit value somewhere (sizes, positions, lengths)
                if len(data) >= 4:
                    at = min(at, len(data) - 4)
                    struct.pack_into("<I", data, at, rng.choice(_INTERESTING_U32))
            elif op == 7:  # splice in an event of another file
                other = rng.choice(self.samples)
                if other.events:
                    data[at:at] = rng.choice(other.events)
            else:  # set a byte to a boundary value
                data[at] = rng.choice((0, 1, 0x7F, 0x80, 0xFE, 0xFF))
        return data

    def forge_header(self, event: bytearray) -> bytearray:
        """Change a header field of a whole event: event_size, type code, flags or log_pos."""
        rng = self.rng
        if len(event) < C.HEADER_LEN:
            return event
        field_choice = rng.randrange(4)
        if field_choice == 0:
            struct.pack_into("<I", event, 9, rng.choice((*_INTERESTING_U32, len(event) + rng.randrange(-30, 30) & 0xFFFFFFFF)))
        elif field_choice == 1:
            event[4] = rng.randrange(256)
        elif field_choice == 2:
            struct.pack_into("<H", event, 17, rng.randrange(0x10000))
        else:
            struct.pack_into("<I", event, 13, rng.choice(_INTERESTING_U32))
        return event


def fix_crcs(data: bytearray, start: int, checksum_len: int) -> bytearray:
    """Recompute the CRC32 of every whole event from `start` on (walking by event_size), so that a mutated event
    gets past the checksum and into the decoders behind it."""
    if checksum_len != 4:
        return data
    pos = start
    while pos + C.HEADER_LEN <= len(data):
        size = struct.unpack_from("<I", data, pos + 9)[0]
        if size < C.HEADER_LEN + 4 or pos + size > len(data):
            break
        struct.pack_into("<I", data, pos + size - 4, zlib.crc32(memoryview(data)[pos:pos + size - 4]))
        pos += size
    return data


def _view_properties(cls: type) -> list[str]:
    return [name for name, member in pyinspect.getmembers(cls) if isinstance(member, property) and not name.startswith("_")]


_PROPERTIES: dict[type, list[str]] = {}


def touch_view(view: EventView, depth: int = 0) -> None:
    """Read every public property of a view, its summary, its checksum and any inner events (what inspect does)."""
    cls = type(view)
    names = _PROPERTIES.get(cls)
    if names is None:
        names = _PROPERTIES[cls] = _view_properties(cls)
    for name in names:
        getattr(view, name)
    view.describe()
    view.verify_checksum()
    if isinstance(view, TransactionPayloadView) and depth < 2:
        for inner in view.iter_inner_events():
            touch_view(inner, depth + 1)


@dataclass
class ParserFuzzReport:
    inputs: int = 0
    seconds: float = 0.0
    by_target: collections.Counter = field(default_factory=collections.Counter)
    outcomes: collections.Counter = field(default_factory=collections.Counter)
    crashes: list[dict] = field(default_factory=list)
    hangs: list[dict] = field(default_factory=list)
    slowest_input_s: float = 0.0
    samples: int = 0
    sample_events: int = 0

    def as_dict(self) -> dict:
        return {
            "inputs": self.inputs, "seconds": round(self.seconds, 2),
            "inputs_per_s": round(self.inputs / self.seconds) if self.seconds else None,
            "by_target": dict(self.by_target), "outcomes": dict(self.outcomes),
            "crashes": len(self.crashes), "crash_details": self.crashes[:5],
            "hangs": len(self.hangs), "hang_details": self.hangs[:5],
            "slowest_input_ms": round(self.slowest_input_s * 1000, 2),
            "files": self.samples, "events": self.sample_events,
        }


def _check_scan(data: bytes, rng: random.Random, outcomes: collections.Counter) -> None:
    verify = rng.random() < 0.8
    in_memory = rng.choice((1 << 16, 16 << 20))  # small: large events take the streaming path
    scanner = BinlogScanner(verify_checksums=verify, max_event_in_memory=in_memory)
    pos = 0
    while pos < len(data):
        step = rng.choice((1, 7, 19, 100, 4096, 1 << 20))
        scanner.feed(data[pos:pos + step])
        pos += step
    chunked = scanner.finish()
    if not 0 <= chunked.good_end <= max(len(data), 4):
        raise AssertionError(f"good_end {chunked.good_end} outside the input (length {len(data)})")
    if chunked.error is not None and not chunked.error.startswith("at offset"):
        raise AssertionError(f"scan error does not name its offset: {chunked.error!r}")
    outcomes["scan ok" if chunked.ok else "scan error (at offset ...)"] += 1
    if rng.random() < 0.15:  # the result never depends on how the bytes were chunked
        whole = scan_bytes(data, verify_checksums=verify, max_event_in_memory=in_memory)
        for attr in ("events", "groups_complete", "good_end", "partial_tail", "crc_errors", "error"):
            if getattr(whole, attr) != getattr(chunked, attr):
                raise AssertionError(f"chunked and whole scans differ in {attr}: "
                                     f"{getattr(chunked, attr)!r} vs {getattr(whole, attr)!r}")


def _check_view(event: bytes, fde: FormatDescription | None, outcomes: collections.Counter) -> None:
    try:
        touch_view(view_event(event, 0, fde))
    except BinlogFormatError:
        outcomes["view BinlogFormatError"] += 1
    except ChecksumError:
        outcomes["view ChecksumError"] += 1
    else:
        outcomes["view decoded"] += 1


def _check_sequence(events: list[bytes], flavour: str, fde: FormatDescription,
                    outcomes: collections.Counter) -> None:
    parser = B.TransactionBoundaryParser(flavour, fde)
    for event in events:
        if len(event) < C.HEADER_LEN:
            continue  # feed_event needs a header; the scanner never hands it less
        was_inside = parser.in_group
        try:
            result = parser.feed_event(event)
        except (BinlogFormatError, ChecksumError):
            outcomes["boundary: bad FDE refused"] += 1
            continue
        kind = result & B.RESULT_MASK
        if kind in (B.EVENT_OUTSIDE, B.GROUP_END):
            if not parser.is_at_boundary:
                raise AssertionError(f"result {result:#x} says outside a group but the parser is in {parser.state_name}")
        elif not parser.in_group:
            raise AssertionError(f"result {result:#x} says inside a group but the parser is in {parser.state_name}")
        if kind == B.GROUP_CONTINUE and not was_inside:
            raise AssertionError("GROUP_CONTINUE without an open group")
        outcomes["boundary: error flagged" if result & B.FLAG_ERROR else "boundary: event classified"] += 1


def fuzz_binlog_parser(samples: list[BinlogSample], inputs: int, seed: int, *, time_cap: float = 2.0,
                       progress=None, target_override=None) -> ParserFuzzReport:
    """Run `inputs` mutated inputs through the scanner, the boundary parser and the views (see the module doc).

    `target_override(kind, payload)`, when given, replaces the real targets (a test proves that a crash is caught).
    """
    if not samples:
        raise ValueError("fuzz_binlog_parser needs at least one binlog sample")
    rng = random.Random(seed)
    mut = Mutator(rng, samples)
    report = ParserFuzzReport(samples=len(samples), sample_events=sum(len(s.events) for s in samples))
    use_alarm = threading.current_thread() is threading.main_thread()
    old_handler = None
    if use_alarm:
        def on_alarm(signum, frame):
            raise FuzzHang(f"input ran past {time_cap}s")

        old_handler = signal.signal(signal.SIGALRM, on_alarm)
    started = time.monotonic()
    try:
        for i in range(inputs):
            sample = rng.choice(samples)
            kind = rng.choices(("file", "event", "sequence"), (45, 35, 20))[0]
            if kind == "file":
                start = rng.randrange(len(sample.events) + 1)
                window = sample.events[start:start + rng.randrange(1, 40)]
                body = bytearray(b"".join(window))
                if window and rng.random() < 0.3:
                    body[:len(window[0])] = mut.forge_header(bytearray(window[0]))
                body = mut.mutate(body, rng.randrange(0, 6))
                if rng.random() < 0.4:
                    body = fix_crcs(body, 0, sample.fde.checksum_len)
                payload = bytes(BINLOG_MAGIC + sample.fde_raw + body)
                if rng.random() < 0.1:  # the file head itself
                    payload = bytes(mut.mutate(bytearray(payload[:200]), rng.randrange(1, 4)) + payload[200:])
            elif kind == "event":
                source = rng.choice(sample.events) if sample.events and rng.random() < 0.9 else sample.fde_raw
                event = bytearray(source)
                if rng.random() < 0.5:  # mangle the body only, keep the header consistent
                    body = mut.mutate(event[C.HEADER_LEN:], rng.randrange(1, 5))
                    event[C.HEADER_LEN:] = body
                    struct.pack_into("<I", event, 9, len(event))
                else:
                    event = mut.mutate(mut.forge_header(event), rng.randrange(0, 3))
                if rng.random() < 0.5:
                    event = fix_crcs(event, 0, sample.fde.checksum_len)
                payload = bytes(event)
            else:
                start = rng.randrange(len(sample.events) + 1)
                events = [bytearray(e) for e in sample.events[start:start + rng.randrange(1, 30)]]
                for _ in range(rng.randrange(1, 4)):
                    if events:
                        j = rng.randrange(len(events))
                        events[j] = mut.forge_header(events[j]) if rng.random() < 0.5 else mut.mutate(events[j], 1)
                        fix_crcs(events[j], 0, sample.fde.checksum_len)
                if rng.random() < 0.3 and events:
                    rng.shuffle(events)
                payload = [bytes(e) for e in events]
            report.by_target[kind] += 1
            t0 = time.monotonic()
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, time_cap)
            try:
                if target_override is not None:
                    target_override(kind, payload)
                elif kind == "file":
                    _check_scan(payload, rng, report.outcomes)
                elif kind == "event":
                    _check_view(payload, sample.fde, report.outcomes)
                    _check_sequence([payload], sample.fde.flavour, sample.fde, report.outcomes)
                else:
                    _check_sequence(payload, sample.fde.flavour, sample.fde, report.outcomes)
            except FuzzHang as exc:
                report.hangs.append({"input": i, "target": kind, "detail": str(exc), "bytes": _hex(payload)})
            except Exception as exc:  # noqa: BLE001 - every other exception is a finding, kept with its input
                report.crashes.append({
                    "input": i, "target": kind, "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(limit=6)[-1500:], "bytes": _hex(payload),
                })
            finally:
                if use_alarm:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            took = time.monotonic() - t0
            if took > report.slowest_input_s:
                report.slowest_input_s = took
            if not use_alarm and took > time_cap:
                report.hangs.append({"input": i, "target": kind, "detail": f"took {took:.2f}s", "bytes": _hex(payload)})
            report.inputs += 1
            if progress is not None and report.inputs % 20000 == 0:
                progress(f"binlog parser fuzz: {report.inputs}/{inputs} inputs")
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old_handler)
    report.seconds = time.monotonic() - started
    return report


def _hex(payload, limit: int = 2048) -> str:
    data = b"".join(payload) if isinstance(payload, list) else bytes(payload)
    return data[:limit].hex() + ("..." if len(data) > limit else "")


# =============================================================================================================
# The downstream port of a live relay
# =============================================================================================================

# What replicas and tools send (no PURGE, no KILL: fuzzing must not harm the real replicas by design).
STATEMENTS = [
    "SELECT @@server_id", "SHOW BINARY LOGS", "SHOW MASTER STATUS", "SHOW SLAVE HOSTS", "SHOW PROCESSLIST",
    "SELECT @@gtid_binlog_pos", "SELECT @@gtid_current_pos", "SELECT @@gtid_binlog_state",
    "SHOW VARIABLES LIKE 'server_id'", "SHOW GLOBAL VARIABLES LIKE 'gtid%'", "SHOW STATUS", "SHOW WARNINGS",
    "SET @master_binlog_checksum = @@global.binlog_checksum", "SET @master_binlog_checksum = 'NONE'",
    "SET @master_heartbeat_period = 100000000", "SET @slave_connect_state = ''", "SET @slave_connect_state = '0-1-5'",
    "SET @slave_connect_state = 'x'", "SET @slave_gtid_strict_mode = 1", "SET @slave_gtid_ignore_duplicates = 1",
    "SET @mariadb_slave_capability = 4", "SET @rpl_semi_sync_slave = 1", "SET NAMES utf8mb4", "SET NAMES latin1",
    "SELECT UNIX_TIMESTAMP()", "SELECT VERSION()", "SELECT @@version_comment", "SELECT 1", "SELECT 1 + 1, 'a'",
    "SHOW SLAVE STATUS", "SHOW ALL SLAVES STATUS", "SHOW BINLOG EVENTS LIMIT 3", "USE mysql", "DO 1",
    "SELECT * FROM information_schema.processlist", "BEGIN", "COMMIT", "ROLLBACK", "SET autocommit = 1",
    "SHOW SESSION VARIABLES LIKE 'max_allowed_packet'", "SELECT @@global.binlog_checksum", "SET GLOBAL server_id = 5",
    "SELECT BINLOG_GTID_POS('master-bin.000001', 4)", "SHOW BINLOG STATUS", "SHOW BINARY LOG STATUS",
    "SHOW REPLICAS", "SHOW GRANTS", "SELECT @@hostname, @@port",
]
_FORBIDDEN_PREFIXES = ("PURGE", "KILL")
# Command bytes a logged-in client may send that the server answers with one packet and keeps the connection.
_EXCHANGE_COMMANDS = (0x00, 0x02, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0F, 0x10, 0x11,
                      0x13, 0x14, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x1D, 0x1F, 0x20, 0x21, 0x40, 0x7F, 0xFE,
                      0xFF)
DUMP_SERVER_IDS = (1_000_000, 2_000_000_000)  # server ids the fuzzer's dumps use: no real replica has one


def _safe_server_id(rng: random.Random) -> int:
    return rng.randrange(*DUMP_SERVER_IDS)


class LiveTarget:
    """What the fuzzer knows about the relay it attacks: address, account, its files (for plausible requests)."""

    def __init__(self, host: str, port: int, user: str, password: str, files: list[str]) -> None:
        self.host, self.port, self.user, self.password = host, port, user, password
        self.files = files or ["master-bin.000001"]


@dataclass
class DownstreamFuzzReport:
    inputs: int = 0
    seconds: float = 0.0
    connections: int = 0
    logins: int = 0
    kinds: collections.Counter = field(default_factory=collections.Counter)
    replies: collections.Counter = field(default_factory=collections.Counter)
    error_codes: collections.Counter = field(default_factory=collections.Counter)
    error_examples: dict = field(default_factory=dict)  # code -> (first message, the input that got it)
    closed_by_server: int = 0
    closed_after_success: list[str] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    worker_errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "inputs": self.inputs, "seconds": round(self.seconds, 2),
            "inputs_per_s": round(self.inputs / self.seconds) if self.seconds else None,
            "connections": self.connections, "logins": self.logins, "kinds": dict(self.kinds),
            "replies": dict(self.replies), "errors_returned": sum(self.error_codes.values()),
            "error_codes": dict(self.error_codes.most_common()),
            "error_examples": {code: list(example) for code, example in self.error_examples.items()}, "connections_closed_by_server": self.closed_by_server,
            "closed_after_success": len(self.closed_after_success),
            "closed_after_success_examples": self.closed_after_success[:5],
            "failures": len(self.failures), "failure_details": self.failures[:5], "worker_errors": self.worker_errors[:5],
        }


class _Closed(Exception):
    pass


class _Conn:
    """One client connection, packets by hand over a blocking socket."""

    def __init__(self, target: LiveTarget, deadline: float, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connecting, so that the window is small from the start
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(deadline)
        try:
            self.sock.connect((target.host, target.port))
        except OSError:
            self.sock.close()
            raise
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = PacketDecoder(keep_sequences=True)
        self.decoder.expect_sequence(None)
        self.pending: collections.deque[tuple[int, bytes]] = collections.deque()
        self.deadline = deadline

    def close(self, reset: bool = False) -> None:
        if reset:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self.sock.close()

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server already ended it; what it said is still to be read

    def packet(self) -> tuple[int, bytes]:
        while not self.pending:
            try:
                data = self.sock.recv(1 << 20)
            except ConnectionResetError:
                data = b""
            except TimeoutError:
                raise TimeoutError(f"no answer within {self.deadline}s") from None
            if not data:
                if self.decoder.pending_bytes:
                    raise ProtocolError(f"server closed inside a packet ({self.decoder.pending_bytes} bytes of it)")
                raise _Closed()
            self.decoder.feed(data)
            self.pending.extend(self.decoder.packets())
        return self.pending.popleft()

    def to_end(self, quiet: float = 0.03, observe: float = 0.5) -> list[tuple[int, bytes]]:
        """Listen until quiet (or `observe` s), half-close, then read until the server closes (within deadline)."""
        packets = list(self.pending)
        self.pending.clear()
        self.sock.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        began = last = time.monotonic()
        half_closed_at = None
        try:
            while True:
                now = time.monotonic()
                if half_closed_at is None and (now - last > quiet or now - began > observe):
                    try:
                        self.sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    half_closed_at = now
                if half_closed_at is not None and now - half_closed_at > self.deadline:
                    raise TimeoutError(f"the server did not close within {self.deadline}s of the client's half-close")
                if not sel.select(0.01):
                    continue
                try:
                    data = self.sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    data = b""
                if not data:
                    if self.decoder.pending_bytes:
                        raise ProtocolError(f"server closed inside a packet ({self.decoder.pending_bytes} bytes of it)")
                    return packets
                self.decoder.feed(data)
                # A streaming dump can be long: count packets, keep only the last few.
                packets.extend(self.decoder.packets())
                del packets[:-8]
                last = time.monotonic()
        finally:
            sel.close()


def login_payload(greeting, user: str, password: str) -> bytes:
    caps = client_capabilities(greeting, tls=False)
    scramble = pymysql_auth.scramble_native_password(password.encode(), greeting.auth_plugin_data[:20])
    return build_handshake_response(caps, user, scramble, plugin_name="mysql_native_password",
                                    connect_attrs={"program_name": "relayproxy-fuzz"})


def stalled_dump(target: LiveTarget, file: str, server_id: int, deadline: float = 10.0) -> _Conn:
    """A logged-in replica that asks for a dump from `file`:4 and then reads nothing (a tiny receive window):
    the relay's dump for it stays in that file. Close it to let it go."""
    conn = _Conn(target, deadline, rcvbuf=4096)
    try:
        greeting = parse_handshake(conn.packet()[1])
        conn.send(encode_packet(login_payload(greeting, target.user, target.password), 1))
        for statement in (None, b"SET @master_binlog_checksum = @@global.binlog_checksum",
                          b"SET @mariadb_slave_capability = 4"):
            if statement is not None:
                conn.send(encode_packet(b"\x03" + statement, 0))
            reply = conn.packet()[1]
            if reply[:1] != b"\x00":
                raise ProtocolError(f"stalled dump set-up refused: {reply[:200]!r}")
        conn.send(encode_packet(P.com_register_slave(server_id, host="stalled"), 0))
        reply = conn.packet()[1]
        if reply[:1] != b"\x00":
            raise ProtocolError(f"stalled dump registration refused: {reply[:200]!r}")
        conn.send(encode_packet(P.com_binlog_dump(file, 4, server_id), 0))
    except BaseException:
        conn.close()
        raise
    return conn


class _Worker:
    def __init__(self, index: int, seed: int, target: LiveTarget, shared: "_Shared", deadline: float,
                 per_connection: tuple[int, int]) -> None:
        self.rng = random.Random(f"{seed}/{index}")
        self.target = target
        self.shared = shared
        self.deadline = deadline
        self.per_connection = per_connection
        self.report = DownstreamFuzzReport()

    # -- inputs ----------------------------------------------------------------------------------------------
    def random_sql(self) -> bytes:
        rng = self.rng
        choice = rng.random()
        files = self.target.files
        if choice < 0.35:
            text = rng.choice(STATEMENTS)
        elif choice < 0.45:
            f = rng.choice(files + ["nope.000001", "", "../x", "master-bin.999999"])
            text = rng.choice((
                f"SELECT BINLOG_GTID_POS('{f}', {rng.choice((0, 4, 5, 256, 1 << 31, rng.randrange(1 << 32)))})",
                f"SHOW BINLOG EVENTS IN '{f}' FROM {rng.choice((4, 5, 100, rng.randrange(1 << 20)))} LIMIT {rng.randrange(0, 6)}",
                f"SHOW BINLOG EVENTS IN '{f}' LIMIT {rng.randrange(1, 4)}, {rng.randrange(0, 4)}",
            ))
        elif choice < 0.75:  # a statement, mutated
            text = rng.choice(STATEMENTS)
            op = rng.randrange(5)
            if op == 0:
                text = text[:rng.randrange(len(text) + 1)]
            elif op == 1:
                text += "".join(rng.choice("'\"`()@,;=+-*/ \\x0") for _ in range(rng.randrange(1, 8)))
            elif op == 2:
                at = rng.randrange(len(text) + 1)
                text = text[:at] + rng.choice(("'", "\"", "`", "(", ")", "--", "/*", "\\", "\0", "é", "@@", " ", "%")) + text[at:]
            elif op == 3:
                text = "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in text)
            else:
                words = text.split()
                rng.shuffle(words)
                text = " ".join(words)
        elif choice < 0.9:
            alphabet = "SELECTSHOWFROMWHERELIKE@ ,.'\"`()*=0123456789abcdefgxyz_-;\n\t"
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 120)))
        elif choice < 0.98:
            return rng.randbytes(rng.randrange(0, 200))
        else:
            return ("SELECT '" + "x" * rng.randrange(1000, 200_000) + "'").encode()
        if text.lstrip().upper().startswith(_FORBIDDEN_PREFIXES):
            text = "SELECT 1"
        return text.encode("utf-8", "surrogatepass")

    def exchange_input(self) -> tuple[str, bytes]:
        rng = self.rng
        r = rng.random()
        if r < 0.75:
            return "query", b"\x03" + self.random_sql()
        if r < 0.8:
            return "ping", b"\x0e" + (rng.randbytes(rng.randrange(1, 5)) if rng.random() < 0.2 else b"")
        if r < 0.9:
            return "unknown command", bytes((rng.choice(_EXCHANGE_COMMANDS),)) + rng.randbytes(rng.randrange(0, 60))
        host = rng.randbytes(rng.randrange(0, 40))
        payload = (struct.pack("<BI", P.COM_REGISTER_SLAVE, _safe_server_id(rng)) + bytes((len(host),)) + host
                   + b"\x01u\x00" + struct.pack("<HII", rng.randrange(0x10000), 0, rng.randrange(1 << 32)))
        if rng.random() < 0.3:
            payload = payload[:rng.randrange(1, len(payload))]
        return "register slave", payload

    def terminal_input(self) -> tuple[str, bytes]:
        """An input after which the connection ends: framed bytes, sent as they are."""
        rng = self.rng
        r = rng.random()
        if r < 0.3:
            f = rng.choice([self.target.files[-1], "", "x", "../../etc/passwd", "relayproxy.index",
                            self.target.files[0], "master-bin.999999"])
            pos = rng.choice((0, 3, 4, 5, 256, 1 << 31, rng.randrange(1 << 32)))
            flags = rng.choice((0, 1, 2, 3, 0xFFFF))
            return "binlog dump", encode_packet(P.com_binlog_dump(f, pos, _safe_server_id(rng), flags), 0)
        if r < 0.45:
            name = rng.randbytes(rng.randrange(0, 20))
            payload = (struct.pack("<BHII", 0x1E, rng.randrange(0x10000), _safe_server_id(rng), len(name)) + name
                       + struct.pack("<Q", rng.randrange(1 << 64)) + rng.randbytes(rng.randrange(0, 40)))
            return "binlog dump gtid", encode_packet(payload, 0)
        if r < 0.55:
            return "quit", encode_packet(b"\x01", 0)
        if r < 0.7:
            return "raw bytes", rng.randbytes(rng.randrange(1, 300))
        if r < 0.8:
            n = rng.choice((0xFFFFFF, 0x1000000 - 2, rng.randrange(0x10000, 0xFFFFFF)))
            return "absurd length", struct.pack("<I", n)[:3] + bytes((0,)) + rng.randbytes(rng.randrange(0, 50))
        if r < 0.9:
            payload = b"\x03SELECT 1"
            return "wrong sequence id", encode_packet(payload, rng.randrange(1, 256))
        payload = b"\x03" + self.random_sql()
        return "truncated packet", encode_packet(payload, 0)[:rng.randrange(1, 4 + len(payload))]

    # -- sessions --------------------------------------------------------------------------------------------
    def note_packets(self, packets, what: str) -> None:
        for _seq, payload in packets:
            if payload[:1] == b"\xff":
                self.note_err(payload, what)

    def note_err(self, payload: bytes, what: str) -> None:
        err = parse_err(payload)
        self.report.error_codes[err.code] += 1
        self.report.error_examples.setdefault(err.code, (err.message[:160], what[:160]))
        if INTERNAL_ERROR in err.message:
            self.fail(what, f"internal error: {err}")

    def fail(self, what: str, detail: str) -> None:
        self.report.failures.append({"input": what[:600], "detail": detail[:600]})

    def take(self) -> bool:
        return self.shared.take()

    def pre_auth_session(self) -> None:
        rng = self.rng
        conn = _Conn(self.target, self.deadline)
        self.report.connections += 1
        try:
            _seq, greeting_payload = conn.packet()
            greeting = parse_handshake(greeting_payload)
            r = rng.random()
            if r < 0.2:
                kind, data = "pre-auth raw bytes", rng.randbytes(rng.randrange(0, 300))
            elif r < 0.35:
                kind, data = "pre-auth framed garbage", encode_packet(rng.randbytes(rng.randrange(0, 300)), rng.choice((0, 1, 2, 255)))
            elif r < 0.65:
                payload = bytearray(login_payload(greeting, self.target.user, self.target.password))
                for _ in range(rng.randrange(1, 5)):
                    payload[rng.randrange(len(payload))] = rng.randrange(256)
                payload = payload[:rng.randrange(len(payload) + 1)] if rng.random() < 0.5 else payload
                kind, data = "mutated login", encode_packet(bytes(payload), 1)
            elif r < 0.8:
                user = self.target.user if rng.random() < 0.5 else "nobody" + str(rng.randrange(100))
                kind, data = "wrong password", encode_packet(login_payload(greeting, user, "wrong"), 1)
            elif r < 0.9:
                n = rng.randrange(0x20000, 0x1000000)
                kind, data = "pre-auth absurd length", struct.pack("<I", n | rng.randrange(256) << 24)[:4] + rng.randbytes(40)
            else:
                kind, data = "leave at once", b""
            self.report.kinds[kind] += 1
            if kind == "leave at once":
                conn.close(reset=rng.random() < 0.5)
                return
            conn.send(data)
            packets = conn.to_end()
            self.note_packets(packets, f"{kind}: {data[:200].hex()}")
            self.report.replies["pre-auth answered" if packets else "pre-auth closed silently"] += 1
            self.report.closed_by_server += 1
        except (TimeoutError, ProtocolError) as exc:
            self.fail(f"{kind if 'kind' in locals() else 'greeting'}", f"{type(exc).__name__}: {exc}")
        except _Closed:
            self.report.closed_by_server += 1
        finally:
            conn.close()

    def post_auth_session(self, count: int) -> None:
        rng = self.rng
        conn = _Conn(self.target, self.deadline)
        self.report.connections += 1
        try:
            _seq, greeting_payload = conn.packet()
            greeting = parse_handshake(greeting_payload)
            conn.send(encode_packet(login_payload(greeting, self.target.user, self.target.password), 1))
            _seq, reply = conn.packet()
            if reply[:1] != b"\x00":
                self.fail("login", f"a valid login was refused: {reply[:200]!r}")
                return
            self.report.logins += 1
            previous = ("login", "OK", "login")
            for _ in range(count):
                if not self.take():
                    return
                kind, payload = self.exchange_input()
                self.report.kinds[kind] += 1
                what = f"{kind}: {payload[:300]!r}"
                conn.send(encode_packet(payload, 0))
                try:
                    answer = self.read_reply(conn, kind, what)
                except _Closed:
                    # The relay ends a connection after an ERR it deems fatal (a malformed packet, ...): the close
                    # belongs to the previous input, whose answer said so; a close after a success is noted.
                    prev_kind, prev_answer, prev_what = previous
                    self.report.closed_by_server += 1
                    self.report.replies[f"closed by the relay after {prev_kind} -> {prev_answer}"] += 1
                    if not prev_answer.startswith("ERR"):
                        self.report.closed_after_success.append(prev_what[:300])
                    return
                previous = (kind, answer, what)
            if rng.random() < 0.5 and self.take():
                kind, data = self.terminal_input()
                self.report.kinds[kind] += 1
                conn.send(data)
                packets = conn.to_end()
                self.note_packets(packets[-1:], f"{kind}: {data[:300].hex()}")
                self.report.replies[f"{kind}: answered and closed" if packets else f"{kind}: closed"] += 1
                self.report.closed_by_server += 1
        except (TimeoutError, ProtocolError) as exc:
            self.fail(locals().get("what", "login"), f"{type(exc).__name__}: {exc}")
        except _Closed:
            self.report.closed_by_server += 1
        finally:
            conn.close(reset=rng.random() < 0.2)

    def read_reply(self, conn: _Conn, kind: str, what: str) -> str:
        """Read the whole answer to one exchange input; returns what it was ("OK", "ERR 1064", ...)."""
        seq, first = conn.packet()
        if first[:1] == b"\xff":
            self.note_err(first, what)
            self.report.replies[f"{kind}: ERR"] += 1
            return f"ERR {parse_err(first).code}"
        if kind != "query":
            answer = "OK" if first[:1] == b"\x00" else "other packet"
            self.report.replies[f"{kind}: {answer}"] += 1
            return answer
        reader = TextResultReader()
        payload = first
        while True:
            try:
                result = reader.feed(payload)
            except P.MySQLError as exc:  # an ERR in the middle of the rows
                if isinstance(exc, ProtocolError):
                    raise
                self.note_err(payload, what)
                self.report.replies["query: ERR in rows"] += 1
                return f"ERR {exc.code}"
            if result is not None:
                answer = "OK" if not result.columns else "result set"
                self.report.replies[f"query: {answer}"] += 1
                return answer
            seq, payload = conn.packet()

    def run(self) -> None:
        lo, hi = self.per_connection
        try:
            while self.shared.more():
                if self.rng.random() < 0.15:
                    if self.take():
                        self.pre_auth_session()
                else:
                    self.post_auth_session(self.rng.randrange(lo, hi + 1))
        except Exception as exc:  # noqa: BLE001 - reported: a worker must not die silently
            self.report.worker_errors.append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")


class _Shared:
    def __init__(self, total: int) -> None:
        self.total = total
        self.taken = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def take(self) -> bool:
        with self.lock:
            if self.taken >= self.total or self.stop.is_set():
                return False
            self.taken += 1
            return True

    def more(self) -> bool:
        with self.lock:
            return self.taken < self.total and not self.stop.is_set()


def fuzz_downstream(target: LiveTarget, inputs: int, seed: int, *, workers: int = 6, deadline: float = 10.0,
                    per_connection: tuple[int, int] = (5, 80), progress=None, stop_on_failures: int = 50
                    ) -> DownstreamFuzzReport:
    """Send `inputs` inputs to the relay at `target`, `workers` connections at a time; see the module doc."""
    shared = _Shared(inputs)
    workers_ = [_Worker(i, seed, target, shared, deadline, per_connection) for i in range(workers)]
    threads = [threading.Thread(target=w.run, name=f"fuzz-{i}", daemon=True) for i, w in enumerate(workers_)]
    started = time.monotonic()
    for t in threads:
        t.start()
    last_note = 0
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(1.0)
        failures = sum(len(w.report.failures) for w in workers_)
        if failures >= stop_on_failures:
            shared.stop.set()
        if progress is not None and shared.taken - last_note >= 20000:
            last_note = shared.taken
            progress(f"downstream fuzz: {shared.taken}/{inputs} inputs, {failures} failures")
    total = DownstreamFuzzReport(seconds=time.monotonic() - started)
    for w in workers_:
        r = w.report
        total.connections += r.connections
        total.logins += r.logins
        total.kinds.update(r.kinds)
        total.replies.update(r.replies)
        total.error_codes.update(r.error_codes)
        for code, example in r.error_examples.items():
            total.error_examples.setdefault(code, example)
        total.closed_by_server += r.closed_by_server
        total.closed_after_success += r.closed_after_success
        total.failures += r.failures
        total.worker_errors += r.worker_errors
    total.inputs = sum(total.kinds.values())
    return total
