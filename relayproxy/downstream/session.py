"""One client's session, from the greeting to the close: the handshake, TLS and authentication
(wire/server_auth.py), the login's admission (admission.py), then the command loop, which hands COM_QUERY to the SQL
layer and the dump commands to the dump sender through a DumpChannel (downstream/context.py seams), or the dump's
socket to a sender process. Also the replication commands' parsing (sans-I/O).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import ssl
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, Protocol

from ..log import PeerLogLimiter, get_logger, report_failure
from ..wire.accounts import DownstreamUser
from ..wire.errors import (
    ER_ACCESS_DENIED_ERROR,
    ER_CLIENT_INTERACTION_TIMEOUT,
    ER_CON_COUNT_ERROR,
    ER_HOST_IS_BLOCKED,
    ER_MALFORMED_PACKET,
    ER_NET_PACKETS_OUT_OF_ORDER,
    ER_NET_PACKET_TOO_LARGE,
    ER_NO_DB_ERROR,
    ER_UNKNOWN_COM_ERROR,
    ER_UNKNOWN_ERROR,
)
from ..wire.errors import CR_NET_PACKET_TOO_LARGE
from ..wire.packets import (
    CLIENT_SSL,
    COM_BINLOG_DUMP,
    COM_BINLOG_DUMP_GTID,
    COM_INIT_DB,
    COM_PING,
    COM_QUERY,
    COM_QUIT,
    COM_REGISTER_SLAVE,
    SERVER_STATUS_AUTOCOMMIT,
    MySQLError,
    ProtocolError,
    encode_packet,
    packet_count,
)
from ..wire.results import (
    CloseConnection,
    ErrorResponse,
    Response,
    encode_error,
    encode_ok,
    encode_response,
)
from ..wire.errors import ER_HANDSHAKE_ERROR
from ..wire.server_auth import (
    AuthAccepted,
    AuthRejected,
    HandshakeError,
    RsaKeyPair,
    SendAuthPackets,
    ServerAuthentication,
    Sha2Cache,
    SslRequest,
    build_greeting,
    default_auth_plugin,
    generate_scramble,
    greeting_charset,
    greeting_version,
    parse_handshake_response,
    server_capabilities,
)
from . import privileges
from .admission import ConnectErrors, ConnectionBudget, LoginThrottle, bounded_name
from .context import (
    ConnectionState,
    DownstreamContext,
    DumpChannel,
    DumpProgress,
    DumpRequest,
    ReplicaRegistration,
    SenderProcesses,
)
from .transport import ClientConnectionLost, ClientDumpChannel, ClientProtocol

# The listener's name: the replica side's connection lines have always been logged under it (docs/metrics.md).
log = get_logger("relayproxy.downstream.server")

# The SQL layer may answer directly or through a coroutine (relayproxy.downstream.sql.execute is a plain function).
SqlExecutor = Callable[[DownstreamContext, ConnectionState, str], Response | Awaitable[Response]]
DumpServer = Callable[[DownstreamContext, ConnectionState, DumpRequest, DumpChannel], Awaitable[None]]

DEFAULT_HANDSHAKE_TIMEOUT = 10.0  # MySQL's connect_timeout
DEFAULT_IDLE_TIMEOUT = 28800.0  # MySQL's wait_timeout
_HALF_CLOSE_GRACE = 1.0  # seconds a dump may still answer after the replica half-closed
_INTERNAL_ERROR = "Unknown error: internal error in relayproxy (reference {ref}), see its log"

_COMMAND_NAMES = {
    0x00: "COM_SLEEP", 0x04: "COM_FIELD_LIST", 0x05: "COM_CREATE_DB", 0x06: "COM_DROP_DB", 0x07: "COM_REFRESH",
    0x08: "COM_SHUTDOWN", 0x09: "COM_STATISTICS", 0x0A: "COM_PROCESS_INFO", 0x0B: "COM_CONNECT",
    0x0C: "COM_PROCESS_KILL", 0x0D: "COM_DEBUG", 0x0F: "COM_TIME", 0x10: "COM_DELAYED_INSERT",
    0x11: "COM_CHANGE_USER", 0x13: "COM_TABLE_DUMP", 0x14: "COM_CONNECT_OUT", 0x16: "COM_STMT_PREPARE",
    0x17: "COM_STMT_EXECUTE", 0x18: "COM_STMT_SEND_LONG_DATA", 0x19: "COM_STMT_CLOSE", 0x1A: "COM_STMT_RESET",
    0x1B: "COM_SET_OPTION", 0x1C: "COM_STMT_FETCH", 0x1D: "COM_DAEMON", 0x1F: "COM_RESET_CONNECTION",
    0x20: "COM_CLONE", 0x21: "COM_SUBSCRIBE_GROUP_REPLICATION_STREAM",
}

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_DUMP_HEAD = struct.Struct("<IHI")  # COM_BINLOG_DUMP: position, flags, server_id
_DUMP_GTID_HEAD = struct.Struct("<HII")  # COM_BINLOG_DUMP_GTID: flags, server_id, name length


class _Close(Exception):
    """End this connection quietly: the reason was already answered and logged."""


class Listener(Protocol):
    """What a session uses of its listener (server.py's DownstreamServer): the settings it serves by, the admission
    state it reports to, and the dumps of other sessions (the end of a zombie dump)."""

    ctx: DownstreamContext
    tls_context: ssl.SSLContext | None
    sql: SqlExecutor
    dump: DumpServer
    rsa_key: RsaKeyPair
    sha2_cache: Sha2Cache
    handshake_timeout: float
    idle_timeout: float
    write_timeout: float
    max_packet: int
    log_limiter: PeerLogLimiter
    connect_errors: ConnectErrors
    login_throttle: LoginThrottle
    budget: ConnectionBudget
    senders: SenderProcesses | None

    @property
    def closing(self) -> bool: ...

    def users_for(self, name: str, client_host: str) -> DownstreamUser | None: ...

    def release(self, session: Session) -> None: ...

    def handshake_failed(self, session: Session) -> None: ...

    def end_older_dumps(self, session: Session) -> None: ...


class Session:
    """One client, from the greeting to the close: handshake, authentication, then its commands in order."""

    def __init__(self, server: Listener, protocol: ClientProtocol, conn_id: int) -> None:
        self.server = server
        self.protocol = protocol
        self.ctx = server.ctx
        self.state = ConnectionState(conn_id=conn_id, host=protocol.peer_host)
        self.capabilities = 0
        self._seq = 0  # the sequence id of our next packet
        self.task: asyncio.Task[None] | None = None
        self.host = protocol.peer_host
        self.started = time.monotonic()
        self.refusal: str | None = None  # set by the server: refuse with 1040 before the greeting
        self.blocked = False  # set by the server: the host is blocked (1129 before the greeting)
        self.greeted = False  # the greeting went out: leaving before the credentials are checked is a handshake error
        self.credentials_checked = False  # the login reached a verdict on the credentials (right or wrong)
        self.logged_in = False
        self.counted = False  # holds a slot in the server's counts
        self.evicted = False
        self.dumping: tuple[str, object] | None = None  # ("uuid", uuid) or ("server_id", id) while a dump runs
        self.dump_ended: asyncio.Future | None = None  # resolved when the connection's dump is over
        self.log = log.bind(conn_id=conn_id, client=f"{protocol.peer_host}:{protocol.peer_port}")

    @property
    def conn_id(self) -> int:
        return self.state.conn_id

    def evict(self) -> None:
        """Drop this not-yet-authenticated connection to make room (1040 when it can still be told)."""
        self.evicted = True
        self.server.release(self)
        if self.protocol.tls is None:
            with contextlib.suppress(Exception):
                self._write([encode_error(ER_CON_COUNT_ERROR, "08004", "Too many connections")])
        if self.task is not None:
            self.task.cancel()

    # -- packet I/O ----------------------------------------------------------------------------------------------

    def _write(self, payloads: Sequence[bytes]) -> None:
        for payload in payloads:
            self.protocol.write(encode_packet(payload, self._seq))
            self._seq = (self._seq + packet_count(len(payload))) & 0xFF

    async def _send(self, payloads: Sequence[bytes]) -> None:
        self._write(payloads)
        await self.protocol.drain(self.server.write_timeout)

    async def _read(self, timeout: float | None, *, new_command: bool = False) -> bytes:
        """The client's next payload; its sequence id must follow ours (0 at a new command)."""
        seq, payload = await self.protocol.read(timeout)
        if len(payload) > self.protocol.decoder.max_payload:
            # The decoder refuses a packet over the limit while it is still arriving; one that arrived whole in
            # a single read is refused here (the decoder's fast path is the upstream hot loop: no check there).
            raise MySQLError(CR_NET_PACKET_TOO_LARGE, "08S01", "Got a packet bigger than 'max_allowed_packet' bytes")
        first = 0 if new_command else self._seq
        expected = (first + packet_count(len(payload)) - 1) & 0xFF
        if seq != expected:
            message = f"Got packets out of order: sequence id {seq}, expected {expected}"
            raise MySQLError(ER_NET_PACKETS_OUT_OF_ORDER, "08S01", message)
        self._seq = (seq + 1) & 0xFF
        return payload

    def _note(self, level: str, event: str, **fields: Any) -> None:
        """One log line caused by this client, within its host's budget (PeerLogLimiter)."""
        suppressed = self.server.log_limiter.admit(self.protocol.peer_host)
        if suppressed is None:
            return
        if suppressed:
            fields["suppressed_before"] = suppressed
        getattr(self.log, level)(event, **fields)

    def _internal_error(self, exc: BaseException, what: str) -> bytes:
        """A bug, not the client's doing: one log line with a reference id (no traceback: a client that can
        trigger it could fill the disk; the traceback is at debug level), and the ERR the client gets, naming
        the same reference."""
        ref = report_failure(self.log, self.server.log_limiter, self.protocol.peer_host, what, exc)
        return encode_error(ER_UNKNOWN_ERROR, "HY000", _INTERNAL_ERROR.format(ref=ref))

    async def _fail(self, code: int, sqlstate: str, message: str) -> NoReturn:
        """Answer with an ERR packet (best effort) and end the connection."""
        with contextlib.suppress(ConnectionError, MySQLError, RuntimeError):
            await self._send([encode_error(code, sqlstate, message)])
        raise _Close

    # -- lifecycle -----------------------------------------------------------------------------------------------

    async def run(self) -> None:
        server = self.server
        self.ctx.connections[self.conn_id] = self.state
        try:
            if self.blocked:
                self._note("info", "connection refused: host blocked after failed logins",
                           max_connect_errors=server.connect_errors.limit)
                tool = "mariadb-admin" if self.ctx.flavour == "mariadb" else "mysqladmin"
                await self._fail(ER_HOST_IS_BLOCKED, "HY000", f"Host '{self.host[:64]}' is blocked because of many "
                                 f"connection errors; unblock with '{tool} flush-hosts'")
            if self.refusal is not None:
                self._note("warning", "connection refused: too many connections", reason=self.refusal)
                await self._fail(ER_CON_COUNT_ERROR, "08004", "Too many connections")
            await self._handshake()
            await self._command_loop()
        except _Close:
            pass
        except asyncio.CancelledError:
            # the server is closing, kill(), or a newer connection took this one's unauthenticated slot
            if self.evicted:
                self._note("info", "connection dropped: not logged in while the unauthenticated budget was full")
        except ClientConnectionLost as exc:
            self.log.debug("client gone", reason=str(exc))
        except MySQLError as exc:
            self._note("info", "closing connection after a protocol error", error=str(exc)[:200])
            with contextlib.suppress(_Close):
                await self._protocol_error(exc)
        except Exception as exc:
            error = self._internal_error(exc, "internal error serving client; closing its connection")
            with contextlib.suppress(ConnectionError, MySQLError, RuntimeError, asyncio.CancelledError):
                await self._send([error])
        finally:
            if self.greeted and not self.credentials_checked and not self.evicted and not server.closing:
                server.handshake_failed(self)  # what the servers count toward max_connect_errors
            self.ctx.connections.pop(self.conn_id, None)
            server.release(self)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self.protocol.close()
            self.log.debug("connection closed", user=self.state.user or None)

    async def _protocol_error(self, exc: MySQLError) -> NoReturn:
        if exc.code == CR_NET_PACKET_TOO_LARGE:
            if self.logged_in:
                self._seq = 1  # the reply to a command's first packet (sequence 0), as the servers number it
            await self._fail(ER_NET_PACKET_TOO_LARGE, "08S01", "Got a packet bigger than 'max_allowed_packet' bytes")
        if exc.code < 2000:  # a server error code: send it as it is
            await self._fail(exc.code, exc.sqlstate if len(exc.sqlstate) == 5 else "HY000", exc.message)
        await self._fail(ER_MALFORMED_PACKET, "HY000", f"Malformed communication packet: {exc.message}")

    # -- connection phase ----------------------------------------------------------------------------------------

    async def _handshake(self) -> None:
        server = self.server
        timeout = server.handshake_timeout
        try:
            async with asyncio.timeout(timeout):
                step, response = await self._authenticate()
        except TimeoutError:
            self._note("info", "handshake timed out", seconds=timeout)
            if self.protocol.tls is not None and not self.protocol.tls.handshake_complete:
                raise _Close from None  # no way to send an ERR mid-TLS-handshake
            await self._fail(ER_HANDSHAKE_ERROR, "08S01", f"Bad handshake: no complete handshake within {timeout:g}s")
        # The throttle's delay is not part of the handshake: it is the relay's doing, not the client's.
        await self._answer_login(step, response)

    async def _hold(self, seconds: float) -> None:
        """Wait before answering a throttled login: the task sleeps (nothing runs for it), the socket is not read (a
        client cannot make the relay buffer for it meanwhile), and it keeps its unauthenticated slot, so a newcomer
        may still take that slot (evict) when the budget is full."""
        throttle = self.server.login_throttle
        throttle.delayed_logins += 1
        throttle.delaying += 1
        self.protocol.hold_reading()
        try:
            await asyncio.sleep(seconds)
        finally:
            throttle.delaying -= 1
            self.protocol.release_reading()

    async def _answer_login(self, step: AuthAccepted | AuthRejected, response: Any) -> None:
        """The verdict on the credentials: counted by the login throttle (per user name and host), delayed when that
        pair has failed too often, then answered: 1045 and closed, or the login goes on."""
        server = self.server
        throttle = server.login_throttle
        user, host = response.user, self.host
        secure = self.protocol.tls is not None
        credentials = isinstance(step, AuthAccepted) or step.error.code == ER_ACCESS_DENIED_ERROR
        delay = 0.0
        if credentials:
            self.credentials_checked = True  # right or wrong: not a handshake error (max_connect_errors)
            delay = throttle.delay(user, host)
            if isinstance(step, AuthRejected):
                throttle.failed(user, host)  # before the delay: attempts made meanwhile see it
            if delay > 0:
                await self._hold(delay)
        if isinstance(step, AuthRejected):
            self._note("warning", "login refused", user=bounded_name(response.user), reason=step.reason, tls=secure,
                       consecutive_failures=throttle.failures(user, host) or None,
                       delayed=round(delay, 3) if delay else None)
            error = step.error
            await self._fail(error.code, error.sqlstate, error.message)
        assert isinstance(step, AuthAccepted)
        self.logged_in = True  # the credentials were good: not a failed login, whatever follows
        throttle.succeeded(user, host)
        server.connect_errors.succeeded(self.host)
        refusal = server.budget.logged_in(self, step.user)
        if refusal is not None:
            self._note("warning", "login refused: too many connections", user=bounded_name(step.user.name),
                       reason=refusal)
            await self._fail(ER_CON_COUNT_ERROR, "08004", "Too many connections")
        state = self.state
        state.user = step.user.name
        state.account = step.user
        state.tls = secure
        state.database = response.database
        state.capabilities = self.capabilities
        self.protocol.decoder.max_payload = server.max_packet
        await self._send([*step.packets, encode_ok()])
        # Debug, not info: HA managers and monitoring log in every few seconds.
        self.log.debug(
            "client logged in",
            user=step.user.name,
            plugin=step.plugin,
            tls=secure,
            tls_version=self.protocol.tls.version if self.protocol.tls else None,
            program=bounded_name(
                response.connect_attrs.get("program_name") or response.connect_attrs.get("_client_name")
            ),
        )

    async def _authenticate(self) -> tuple[AuthAccepted | AuthRejected, Any]:
        """Greeting, TLS, handshake response and the authentication exchange, up to the verdict (not sent yet)."""
        server = self.server
        ctx = self.ctx
        flavour = ctx.flavour
        version = greeting_version(ctx.server_version, flavour)
        tls_offered = server.tls_context is not None
        caps = server_capabilities(tls=tls_offered)
        scramble = generate_scramble()
        self.greeted = True
        await self._send(
            [
                build_greeting(
                    server_version=version,
                    connection_id=self.conn_id,
                    scramble=scramble,
                    capabilities=caps,
                    auth_plugin=default_auth_plugin(flavour),
                    charset=greeting_charset(version, flavour),
                )
            ]
        )
        try:
            response = parse_handshake_response(await self._read(None), caps)
            if isinstance(response, SslRequest):
                if not tls_offered:
                    raise HandshakeError("the client asked for TLS, but this server has no TLS certificate configured")
                await self._start_tls()
                response = parse_handshake_response(await self._read(None), caps)
                if isinstance(response, SslRequest):
                    raise HandshakeError("a second SSLRequest after TLS was established")
        except HandshakeError as exc:
            self._note("info", "bad handshake", error=exc.message[:200])
            await self._fail(exc.code, exc.sqlstate, exc.message)
        secure = self.protocol.tls is not None
        self.capabilities = response.capabilities & caps & ~(0 if secure else CLIENT_SSL)
        auth = ServerAuthentication(
            server.users_for,
            scramble=scramble,
            client_host=self.protocol.peer_host,
            secure=secure,
            rsa_key=server.rsa_key,
            sha2_cache=server.sha2_cache,
            default_plugin=default_auth_plugin(self.server.ctx.flavour),
        )
        step = auth.start(response)
        while isinstance(step, SendAuthPackets):
            await self._send(step.packets)
            step = auth.receive(await self._read(None))
        return step, response

    async def _start_tls(self) -> None:
        handshake = self.protocol.tls_handshake
        assert handshake is not None
        try:
            await handshake
        except ssl.SSLError as exc:
            self._note("info", "TLS handshake failed", error=getattr(exc, "reason", None) or str(exc)[:200])
            raise _Close from None

    # -- command phase -------------------------------------------------------------------------------------------

    async def _command_loop(self) -> None:
        server = self.server
        while True:
            try:
                payload = await self._read(server.idle_timeout, new_command=True)
            except TimeoutError:
                self._note("info", "idle timeout", seconds=server.idle_timeout)
                self._seq = 0  # not a reply: a new exchange, as MySQL 8.0.24+ sends it
                await self._fail(
                    ER_CLIENT_INTERACTION_TIMEOUT,
                    "HY000",
                    "The client was disconnected by the server because of inactivity.",
                )
            if not payload:
                await self._fail(ER_MALFORMED_PACKET, "HY000", "Malformed communication packet: empty command")
            command = payload[0]
            if command == COM_QUERY:
                await self._query(payload)
            elif command == COM_PING:
                await self._send([encode_ok()])
            elif command == COM_QUIT:
                raise _Close
            elif command == COM_INIT_DB:
                await self._init_db(payload)
            elif command == COM_REGISTER_SLAVE:
                if await self._refused(privileges.REGISTER, "COM_REGISTER_SLAVE"):
                    continue
                await self._register_slave(payload)
            elif command == COM_BINLOG_DUMP:
                if await self._refused(privileges.DUMP, "COM_BINLOG_DUMP"):
                    continue
                await self._dump(parse_binlog_dump(payload, self.state))
                raise _Close  # as MySQL: the connection ends with the dump
            elif command == COM_BINLOG_DUMP_GTID:
                if await self._refused(privileges.DUMP, "COM_BINLOG_DUMP_GTID"):
                    continue
                await self._dump(parse_binlog_dump_gtid(payload))
                raise _Close
            else:
                name = _COMMAND_NAMES.get(command, "command")
                message = f"Unknown command: {name} (0x{command:02x}) is not supported by relayproxy"
                await self._send([encode_error(ER_UNKNOWN_COM_ERROR, "08S01", message)])

    async def _refused(self, action: privileges.Action, command: str) -> bool:
        """Answer ERR 1227 (the connection stays, as on the servers) when the account lacks the privilege."""
        denied = privileges.denial(self.ctx, self.state, action)
        if denied is None:
            return False
        self._note("info", "command refused: missing privilege", command=command, user=bounded_name(self.state.user),
                   privilege=action.privilege)
        await self._send([encode_error(*denied)])
        return True

    async def _query(self, payload: bytes) -> None:
        sql_text = payload[1:].decode("utf-8", "surrogateescape")
        try:
            response = self.server.sql(self.ctx, self.state, sql_text)
            if inspect.isawaitable(response):
                response = await response
        except MySQLError as exc:
            response = ErrorResponse(exc.code, exc.sqlstate, exc.message)
        if isinstance(response, CloseConnection):
            self._note("warning", "closed the connection without an answer", reason=response.reason,
                       statement=sql_text[:200])
            raise _Close
        await self._send(encode_response(response, capabilities=self.capabilities, status=SERVER_STATUS_AUTOCOMMIT))

    async def _init_db(self, payload: bytes) -> None:
        name = payload[1:].decode("utf-8", "replace").rstrip("\0")
        if not name:
            await self._send([encode_error(ER_NO_DB_ERROR, "3D000", "No database selected")])
            return
        self.state.database = name
        await self._send([encode_ok()])

    async def _register_slave(self, payload: bytes) -> None:
        try:
            registration = parse_register_slave(payload, master_server_id=self.ctx.server_id)
        except ProtocolError as exc:
            await self._fail(ER_MALFORMED_PACKET, "HY000", f"Malformed communication packet: {exc.message}")
        self.state.registration = registration
        self.log.info(
            "replica registered", server_id=registration.server_id, report_host=registration.host,
            report_port=registration.port,
        )
        await self._send([encode_ok()])

    async def _dump(self, request: DumpRequest) -> None:
        """Run the dump sender until it returns, fails, or the replica goes away (then it is cancelled, so that a
        sender waiting for new transactions does not outlive its reader)."""
        state = self.state
        if state.dump is None:
            state.dump = DumpProgress(file=request.file or None, position=request.position, mode=request.kind)
        progress = state.dump
        self.log.info(
            "binlog dump requested", kind=request.kind, file=request.file, position=request.position,
            server_id=request.server_id, flags=request.flags,
        )
        self.dumping = _replica_identity(state, request)
        self.dump_ended = asyncio.get_running_loop().create_future()  # what a graceful stop waits for
        try:
            await self._run_dump(request, progress)
        finally:
            if not self.dump_ended.done():
                self.dump_ended.set_result(None)

    async def _run_dump(self, request: DumpRequest, progress: DumpProgress) -> None:
        state = self.state
        self.server.end_older_dumps(self)
        pool = self.server.senders
        if pool is not None:
            try:
                handed = await self._hand_off(pool, request, progress)
            except BaseException:
                self.dumping = None
                raise
            if handed:
                self.dumping = None
                return
        channel = ClientDumpChannel(self.protocol, self.server.write_timeout, self._seq)
        task = asyncio.ensure_future(self.server.dump(self.ctx, state, request, channel))
        try:
            closed, ended = self.protocol.closed, self.protocol.input_ended
            await asyncio.wait({task, closed, ended}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and ended.done() and not closed.done():
                # The replica half-closed: it reads no more events. A reply the sender is about to give (an
                # ERR for a bad request) still goes out; a sender waiting for new transactions is stopped.
                await asyncio.wait({task, closed}, timeout=_HALF_CLOSE_GRACE)
        finally:
            self.dumping = None
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            channel.flush()  # whatever the sender framed last (EOF, ERR) goes out before the session moves on
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None or isinstance(exc, ClientConnectionLost):
            with contextlib.suppress(ConnectionError):
                await self.protocol.drain(self.server.write_timeout)
            return
        if isinstance(exc, MySQLError):
            self._note("info", "binlog dump ended with an error", error=str(exc)[:300])
            message = encode_error(exc.code, exc.sqlstate if len(exc.sqlstate) == 5 else "HY000", exc.message)
        else:
            message = self._internal_error(exc, "binlog dump sender failed")
        with contextlib.suppress(ConnectionError):
            await channel.send_final(message)


    async def _hand_off(self, pool: SenderProcesses, request: DumpRequest, progress: DumpProgress) -> bool:
        """Serve the dump from a sender process (workers.py) when it can be moved there: a plain connection (a
        TLS session cannot change process), no semi-sync (its ACKs belong to this process's tracker), nothing
        read from the replica past the dump command; ``progress`` (the connection's) is the sender's to fill.
        False: serve it here."""
        from .dump.start import truthy, user_var

        protocol, state = self.protocol, self.state
        transport = protocol.transport
        semi_sync = truthy(user_var(state.user_vars, "rpl_semi_sync_replica", "rpl_semi_sync_slave"))
        if protocol.tls is not None or (semi_sync and self.ctx.settings.semi_sync):
            return False
        if self.ctx.replay_stops.get(request.server_id) is not None:
            return False  # a replay stop (pitr) is this process's to enforce: the workers do not read the registry
        if transport is None or transport.is_closing():
            return False
        worker = pool.pick()
        if worker is None:
            return False
        # Everything this process wrote must be on the wire first: the worker numbers packets on from here.
        await protocol.drain(self.server.write_timeout)
        deadline = time.monotonic() + self.server.write_timeout
        while transport.get_write_buffer_size() and time.monotonic() < deadline and not transport.is_closing():
            await asyncio.sleep(0.001)
        if transport.is_closing() or transport.get_write_buffer_size():
            return False
        transport.pause_reading()
        sock = transport.get_extra_info("socket")
        if protocol.holds_input or protocol.error is not None or sock is None:
            transport.resume_reading()  # the replica already sent more: this process reads it
            return False
        fd = os.dup(sock.fileno())
        ticket = {
            "conn_id": self.conn_id, "user": state.user, "host": state.host, "capabilities": state.capabilities,
            "user_vars": dict(state.user_vars), "session_vars": dict(state.session_vars), "seq": self._seq,
            "kind": request.kind, "server_id": request.server_id, "flags": request.flags, "file": request.file,
            "position": request.position, "gtid_set": request.gtid_set,
        }
        self.log.info("binlog dump handed to a sender process", slot=worker.slot, pid=worker.process.pid)
        handing = asyncio.ensure_future(pool.hand_off(worker, ticket, fd, progress))
        protocol.abort()  # this process's descriptor only: the worker holds the connection now
        await handing
        return True


# -- command parsing (sans-I/O) -----------------------------------------------------------------------------------


def _replica_identity(state: ConnectionState, request: DumpRequest) -> tuple[str, object] | None:
    """Who is dumping, for ending a zombie dump as the servers do: the replica's UUID when it set @slave_uuid /
    @replica_uuid (MySQL's kill_zombie_dump_threads), else its server_id (MariaDB's; MySQL's without a UUID);
    None for server_id 0 without a UUID (mysqlbinlog / mariadb-binlog: several may run at once)."""
    uuid = state.user_vars.get("replica_uuid") or state.user_vars.get("slave_uuid")
    if isinstance(uuid, (bytes, bytearray)):
        uuid = bytes(uuid).decode("utf-8", "replace")
    if uuid:
        return ("uuid", str(uuid).strip().lower())
    if request.server_id:
        return ("server_id", request.server_id)
    return None


def parse_register_slave(payload: bytes, *, master_server_id: int = 0) -> ReplicaRegistration:
    """COM_REGISTER_SLAVE (protocol-reference §3.6). The reported password is read past and dropped: the relay has
    no use for it and must not keep it. A master_id of 0 means this server, as in MySQL."""
    pos = 1
    try:
        server_id = _U32.unpack_from(payload, pos)[0]
        pos += 4
        fields = []
        for what in ("report_host", "report_user", "report_password"):
            if pos >= len(payload):
                raise ProtocolError(f"COM_REGISTER_SLAVE ends before {what}")
            length = payload[pos]
            value = payload[pos + 1 : pos + 1 + length]
            if len(value) != length:
                raise ProtocolError(f"COM_REGISTER_SLAVE {what} runs past the packet end")
            fields.append(value)
            pos += 1 + length
        port = _U16.unpack_from(payload, pos)[0]
        rank, master_id = struct.unpack_from("<II", payload, pos + 2)
    except struct.error:
        raise ProtocolError(
            f"COM_REGISTER_SLAVE is {len(payload)} bytes, too short for server_id, host, user, password, port, rank "
            "and master_id"
        ) from None
    host, user = (raw.decode("utf-8", "replace") for raw in fields[:2])
    return ReplicaRegistration(
        server_id=server_id, host=host, port=port, user=user, rank=rank, master_id=master_id or master_server_id
    )


def parse_binlog_dump(payload: bytes, state: ConnectionState | None = None) -> DumpRequest:
    """COM_BINLOG_DUMP (§3.7): kind "mariadb-gtid" when the connection has set @slave_connect_state (a MariaDB
    replica in GTID mode, which sends position 4 and no file name), "file" otherwise."""
    if len(payload) < 1 + _DUMP_HEAD.size:
        raise ProtocolError(f"COM_BINLOG_DUMP is {len(payload)} bytes, at least 11 expected")
    position, flags, server_id = _DUMP_HEAD.unpack_from(payload, 1)
    file = _file_name(payload[1 + _DUMP_HEAD.size :], "COM_BINLOG_DUMP")
    gtid_mode = state is not None and state.user_vars.get("slave_connect_state") is not None
    return DumpRequest("mariadb-gtid" if gtid_mode else "file", server_id, flags, file, position)


def parse_binlog_dump_gtid(payload: bytes) -> DumpRequest:
    """COM_BINLOG_DUMP_GTID (§3.8): kind "mysql-gtid", `gtid_set` the encoded set as sent (possibly empty)."""
    head = 1 + _DUMP_GTID_HEAD.size
    if len(payload) < head:
        raise ProtocolError(f"COM_BINLOG_DUMP_GTID is {len(payload)} bytes, at least {head} expected")
    flags, server_id, name_size = _DUMP_GTID_HEAD.unpack_from(payload, 1)
    pos = head
    if name_size > len(payload) - pos - 8:
        raise ProtocolError(
            f"COM_BINLOG_DUMP_GTID announces a {name_size}-byte file name, which with the position does not fit "
            f"its {len(payload)} bytes"
        )
    file = _file_name(payload[pos : pos + name_size], "COM_BINLOG_DUMP_GTID")
    pos += name_size
    position = _U64.unpack_from(payload, pos)[0]
    pos += 8
    gtid_set = b""
    if pos < len(payload):
        if len(payload) - pos < 4:
            raise ProtocolError("COM_BINLOG_DUMP_GTID ends inside the GTID set's data size")
        data_size = _U32.unpack_from(payload, pos)[0]
        pos += 4
        if data_size != len(payload) - pos:
            raise ProtocolError(
                f"COM_BINLOG_DUMP_GTID announces a {data_size}-byte GTID set, the packet has {len(payload) - pos} "
                "bytes left"
            )
        gtid_set = bytes(payload[pos:])
    return DumpRequest("mysql-gtid", server_id, flags, file, position, gtid_set)


def _file_name(raw: bytes, what: str) -> str:
    # Some clients send the name NUL-terminated or NUL-padded; MySQL reads it as a C string.
    raw = raw.split(b"\0", 1)[0]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what}: the binlog file name is not valid UTF-8") from None


__all__ = [
    "DumpServer",
    "Listener",
    "Session",
    "SqlExecutor",
    "parse_binlog_dump",
    "parse_binlog_dump_gtid",
    "parse_register_slave",
]
