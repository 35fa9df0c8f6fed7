"""The relay's MySQL listener: accepts replicas and tools on --listen, admits each connection (admission.py: caps,
blocked hosts, the login throttle) and runs one session per connection (session.py: handshake, TLS, authentication,
the command loop) over its transport (transport.py); ends connections for KILL, a replica's newer dump and the
close.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from collections.abc import Sequence
from typing import Any

from ..log import PeerLogLimiter, get_logger
from ..wire.accounts import DownstreamUser, find_user
from ..wire.server_auth import RsaKeyPair, Sha2Cache
from .admission import (
    DEFAULT_HOST_BLOCK_TIME,
    DEFAULT_LOGIN_FAILURES_THRESHOLD,
    DEFAULT_LOGIN_MAX_DELAY,
    DEFAULT_LOGIN_MIN_DELAY,
    DEFAULT_MAX_CONNECT_ERRORS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_HOST,
    DEFAULT_MAX_UNAUTHENTICATED,
    DEFAULT_UNAUTHENTICATED_GRACE,
    ConnectErrors,
    ConnectionBudget,
    LoginThrottle,
)
from .context import DownstreamContext, SenderProcesses
from .session import DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DumpServer, Session, SqlExecutor
from .sql.limits import max_statement_bytes
from .transport import (
    CLOSE_TIMEOUT,
    DEFAULT_MAX_BUFFERED,
    DEFAULT_NET_READ_TIMEOUT,
    DEFAULT_WRITE_TIMEOUT,
    ClientProtocol,
)

log = get_logger(__name__)

# Log lines a peer host can cause per window (client errors, refusals, internal errors); the rest are counted
# and the count is reported on its next line once the window has passed.
DEFAULT_LOG_LINES_PER_HOST = 10
# Seconds a graceful stop gives each running dump to reach a transaction boundary before it is cut (the default of
# the dump_stop_grace option).
DUMP_STOP_GRACE = 5.0


class DownstreamServer:
    """The relay's listener for replicas, mariadb-binlog, CDC tools and HA managers.

    `users`: the accounts (DownstreamUser); `tls_context`: a server SSLContext (server_tls_context()) to offer
    TLS, None for plaintext only; `sql(ctx, conn_state, sql_text)` answers COM_QUERY with a Response, directly or
    as a coroutine (default relayproxy.downstream.sql.execute); a MySQLError it raises is sent as ERR, anything
    else ends the connection with 1105; `dump(ctx, conn_state, request, channel)` serves a binlog dump (default
    relayproxy.downstream.dump.serve_dump); `rsa_key` decrypts caching_sha2_password full authentication
    without TLS (a 2048-bit key is generated when None).

    Limits: `handshake_timeout` for greeting-to-OK, `idle_timeout` between commands (not during a dump),
    `write_timeout` for a client that stops reading (net_write_timeout), `net_read_timeout` for a client that
    stops in the middle of a packet (1159, then closed), `max_packet` for a client's command (default: the
    configuration's max_statement_bytes, which @@max_allowed_packet reports), `max_buffered` unread
    client bytes before reading pauses, `log_lines_per_host` per minute (PeerLogLimiter).

    Connections: `max_connections` logged-in clients plus one more for an admin account (MySQL's extra
    connection for SUPER / CONNECTION_ADMIN), checked after authentication as MySQL does: 1040 "Too many
    connections". Clients that have not logged in yet have their own budget, `max_unauthenticated` (at most
    `max_connections`), and `handshake_timeout`: when it is full, a newcomer takes the slot of the oldest one that
    has held it for `unauthenticated_grace` seconds (dropped with 1040), else it gets 1040 before the greeting;
    so idle sockets cannot lock logins out. `max_connections_per_host` (0: no cap) counts every connection of
    one client address, refused with 1040 before the greeting (the user is not known yet: not 1203, which
    is MySQL's per-account max_user_connections).

    Connection errors: `max_connect_errors` consecutive connections from one host that end before their
    credentials were checked (handshake errors, what the servers count; never from 127.0.0.1 or ::1) block that host
    (1129 before the greeting, as the servers) until FLUSH HOSTS (``ctx.flush_hosts``, admin) or, when
    `host_block_time` > 0, for that many seconds; a successful login resets the count (ConnectErrors).

    Wrong passwords: after `login_failures_threshold` consecutive wrong logins of one user name from one host, the
    answer to each further attempt of that pair waits 1, 2, 3... x `login_min_delay`, at most `login_max_delay`
    (MySQL's connection_control; LoginThrottle); a successful login resets it.
    """

    def __init__(
        self,
        ctx: DownstreamContext,
        users: Sequence[DownstreamUser],
        *,
        tls_context: ssl.SSLContext | None = None,
        sql: SqlExecutor | None = None,
        dump: DumpServer | None = None,
        rsa_key: RsaKeyPair | None = None,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        net_read_timeout: float = DEFAULT_NET_READ_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_connections_per_host: int = DEFAULT_MAX_CONNECTIONS_PER_HOST,
        max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
        unauthenticated_grace: float = DEFAULT_UNAUTHENTICATED_GRACE,
        max_packet: int | None = None,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
        log_lines_per_host: int = DEFAULT_LOG_LINES_PER_HOST,
        max_connect_errors: int = DEFAULT_MAX_CONNECT_ERRORS,
        host_block_time: float = DEFAULT_HOST_BLOCK_TIME,
        login_failures_threshold: int = DEFAULT_LOGIN_FAILURES_THRESHOLD,
        login_min_delay: float = DEFAULT_LOGIN_MIN_DELAY,
        login_max_delay: float = DEFAULT_LOGIN_MAX_DELAY,
        dump_stop_grace: float = DUMP_STOP_GRACE,
    ) -> None:
        # Imported here rather than at the top: they bring in the store and the binlog code, which a server
        # built with stand-ins (tests, tools) does not need.
        if sql is None:
            from .sql import execute

            sql = execute
        if dump is None:
            from .dump import serve_dump

            dump = serve_dump
        self.ctx = ctx
        self.tls_context = tls_context
        self.sql: SqlExecutor = sql
        self.dump: DumpServer = dump
        self.rsa_key = rsa_key or RsaKeyPair.generate()
        self.sha2_cache = Sha2Cache()
        self.handshake_timeout = handshake_timeout
        self.idle_timeout = idle_timeout
        self.write_timeout = write_timeout
        self.net_read_timeout = net_read_timeout
        self.dump_stop_grace = dump_stop_grace  # seconds a graceful stop lets each dump finish its transaction
        self.budget = ConnectionBudget(max_connections, max_connections_per_host, max_unauthenticated,
                                       unauthenticated_grace)
        # A client's command packet at most (1153 and closed beyond, as the servers): @@max_allowed_packet, which
        # is max_statement_bytes unless a caller (a test) sets it.
        self.max_packet = max_packet if max_packet is not None else max_statement_bytes(ctx)
        self.max_buffered = max_buffered
        self.log_limiter = PeerLogLimiter(log_lines_per_host, 60.0)
        self.connect_errors = ConnectErrors(max_connect_errors, host_block_time)
        self.login_throttle = LoginThrottle(login_failures_threshold, login_min_delay, login_max_delay)
        ctx.kill_connection = self.kill
        ctx.flush_hosts = self.connect_errors.flush
        self._server: asyncio.Server | None = None
        self._sessions: dict[int, Session] = {}
        self.senders: SenderProcesses | None = None  # dumps served by sender processes (workers.py), when configured
        self._ids = itertools.count(1)
        self._closing = False
        self._users: tuple[DownstreamUser, ...] = ()
        self.set_users(users)

    def __repr__(self) -> str:
        listening = self._server is not None and self._server.is_serving()
        where = "%s:%d" % self.address if listening else "not listening"
        return f"<DownstreamServer {where} connections={len(self._sessions)} tls={self.tls_context is not None}>"

    # -- accounts ------------------------------------------------------------------------------------------------

    @property
    def users(self) -> tuple[DownstreamUser, ...]:
        return self._users

    def set_users(self, users: Sequence[DownstreamUser]) -> None:
        """Replace the accounts (e.g. on a configuration reload); open connections are not affected. A changed
        password drops out of the caching_sha2 fast-auth cache by itself (Sha2Cache.lookup)."""
        users = tuple(users)
        if self.tls_context is None:
            needing = [u.account for u in users if u.tls == "required"]
            if needing:
                accounts = ", ".join(needing)
                raise ValueError(
                    f"account(s) {accounts} require TLS, but no TLS certificate is configured for the listener"
                )
        self._users = users

    def users_for(self, name: str, client_host: str) -> DownstreamUser | None:
        """The account `name` logs in as from `client_host` (None: no such account)."""
        return find_user(self._users, name, client_host)

    # -- lifecycle -----------------------------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the server is not listening")
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def connection_count(self) -> int:
        return len(self._sessions)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on host:port (port 0 picks a free one); returns the address actually bound."""
        if self._server is not None:
            raise RuntimeError("the server is already started")
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(self._new_protocol, host, port, reuse_address=True)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        address = self.address
        log.info("listening for replicas", host=address[0], port=address[1], tls=self.tls_context is not None,
                 users=len(self._users))
        return address

    def _new_protocol(self) -> ClientProtocol:
        return ClientProtocol(max_buffered=self.max_buffered, net_read_timeout=self.net_read_timeout,
                              tls_context=self.tls_context, on_connected=self._accept)

    @property
    def closing(self) -> bool:
        """close() has begun: new connections are dropped, ending ones are not handshake errors."""
        return self._closing

    def _accept(self, protocol: ClientProtocol) -> Session | None:
        if self._closing:
            protocol.abort()
            return None
        conn_id = next(self._ids)
        if conn_id > 0xFFFFFFFF:  # the greeting's field is 32 bits
            self._ids = itertools.count(1)
            conn_id = next(self._ids)
        session = Session(self, protocol, conn_id)
        self._sessions[conn_id] = session
        session.blocked = self.connect_errors.blocked(session.host)
        session.refusal = None if session.blocked else self.budget.admit(session)
        session.task = asyncio.get_running_loop().create_task(session.run(), name=f"downstream-conn-{conn_id}")
        return session

    def handshake_failed(self, session: Session) -> None:
        """A connection from `session.host` ended before its credentials were checked (closed, bad or timed-out
        handshake, TLS failure): a handshake error, what the servers count toward max_connect_errors."""
        if self.connect_errors.failed(session.host):
            log.warning("host blocked after failed logins", host=session.host,
                        max_connect_errors=self.connect_errors.limit,
                        block_time=self.connect_errors.block_seconds or "until FLUSH HOSTS")

    def release(self, session: Session) -> None:
        """The session ended (or was evicted): forget it and free its slot."""
        self._sessions.pop(session.conn_id, None)
        self.budget.release(session)

    def describe_logins(self) -> dict[str, Any]:
        """/status `logins`: the host blocking (max_connect_errors) and the password throttle, with their counts."""
        return {"host_blocking": self.connect_errors.describe(), "throttle": self.login_throttle.describe()}

    @property
    def authenticated_count(self) -> int:
        """Connections that have logged in (and still hold their slot)."""
        return self.budget.authenticated_count

    def end_older_dumps(self, session: Session) -> None:
        """A replica that starts a dump while an older one of its own still runs (it reconnected and the old
        TCP connection is not dead yet): end the older one, as MySQL and MariaDB do, with one log line."""
        identity = session.dumping
        if identity is None:
            return
        for other in list(self._sessions.values()):
            if other is not session and other.dumping == identity and self.kill(other.conn_id):
                other.dumping = None
                session.log.info(
                    "ended an older dump of the same replica", older_conn_id=other.conn_id,
                    **{"server_id" if identity[0] == "server_id" else "replica_uuid": identity[1]},
                )

    def kill(self, conn_id: int) -> bool:
        """End one connection (KILL, or a replica reconnecting with the same server_id/UUID); False if unknown."""
        session = self._sessions.get(conn_id)
        if session is None or session.task is None:
            return False
        session.task.cancel()
        return True

    async def close(self) -> None:
        """Stop listening and end every connection; replicas reconnect later. A running dump first gets up to
        ``dump_stop_grace`` seconds to reach a transaction boundary (``DownstreamContext.stop_dumps``, in this
        process and in the sender processes), so a graceful stop leaves no replica inside a transaction; what is
        still running then is cancelled."""
        self._closing = True
        server = self._server
        if server is not None:
            server.close()
        self.ctx.stop_dumps()
        if self.senders is not None:
            self.senders.stop_dumps()
        dumps = [s.dump_ended for s in list(self._sessions.values())
                 if s.dump_ended is not None and not s.dump_ended.done()]
        if dumps and self.dump_stop_grace > 0:
            _done, late = await asyncio.wait(dumps, timeout=self.dump_stop_grace)
            if late:
                log.warning("dumps still inside a transaction at the stop grace's end: cut", dumps=len(late),
                            grace_seconds=self.dump_stop_grace)
        tasks = [s.task for s in list(self._sessions.values()) if s.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT * 2)
            for session in list(self._sessions.values()):
                session.protocol.abort()
            for task in pending:
                with contextlib.suppress(BaseException):
                    await task
        if server is not None:
            await server.wait_closed()
        log.info("stopped listening for replicas")

    async def __aenter__(self) -> DownstreamServer:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()



__all__ = ["DownstreamServer"]
