"""Who may connect, and how fast (sans-I/O): the listener's connection caps (``ConnectionBudget``: logged-in
clients, clients not logged in yet, per host, and the eviction of an idle unauthenticated one to make room), the
hosts blocked after handshake errors (``ConnectErrors``, max_connect_errors) and the password-guessing throttle
(``LoginThrottle``, connection_control). The listener (server.py) and the sessions (session.py) consult them; none
of them touches a socket or sleeps.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..wire.accounts import DownstreamUser
from . import privileges

DEFAULT_MAX_CONNECTIONS = 1000  # MySQL's max_connections default is 151; a relay fans out to more
DEFAULT_MAX_CONNECTIONS_PER_HOST = 0  # 0: no per-host cap
DEFAULT_MAX_UNAUTHENTICATED = 100  # connections between accept and a successful login
# An unauthenticated connection older than this may be dropped to make room for a new one when their budget is
# full: a client logs in within milliseconds, an idle socket that has sat this long holds a slot for nothing.
DEFAULT_UNAUTHENTICATED_GRACE = 1.0
DEFAULT_MAX_CONNECT_ERRORS = 100  # MariaDB's and MySQL's max_connect_errors
DEFAULT_HOST_BLOCK_TIME = 0.0  # seconds a blocked host stays blocked; 0: until FLUSH HOSTS (as the servers)
_HOST_CACHE_SIZE = 10_000  # hosts whose failed logins are remembered (the oldest is forgotten beyond)
# The servers never count a loopback client's connection errors (hostname.cc ip_to_hostname: "Do not count connect
# errors from localhost"): exactly these two addresses, not the rest of 127.0.0.0/8.
_LOOPBACK = frozenset({"127.0.0.1", "::1"})
# Password guessing (MySQL's connection_control): after this many consecutive wrong logins of one account from one
# host, each further attempt's answer waits 1, 2, 3... times the minimum delay, at most the maximum. connection_control
# allows up to 2147483 s; a relay's maximum stays below the replicas' connect/read timeout (slave_net_timeout, 60 s),
# so a replica with a wrong password still sees its 1045 rather than a lost connection.
DEFAULT_LOGIN_FAILURES_THRESHOLD = 3
DEFAULT_LOGIN_MIN_DELAY = 1.0
DEFAULT_LOGIN_MAX_DELAY = 30.0
_THROTTLE_KEYS = 10_000  # (account, host) pairs whose failures are remembered (the least recently failing forgotten)
_LOGGED_NAME_MAX = 64  # characters of a client-chosen name (user, program) that reach the log


def bounded_name(text: str | None) -> str | None:
    """A client-chosen string as it may appear in a log line or /status: bounded."""
    if text is None or len(text) <= _LOGGED_NAME_MAX:
        return text
    return f"{text[:_LOGGED_NAME_MAX]}...({len(text.encode('utf-8', 'surrogateescape'))} bytes)"


class Seat(Protocol):
    """What the budget knows of a connection (a session, session.py): its id, host and start time, whether it
    holds a slot, and how to drop it when a newcomer takes its unauthenticated slot."""

    @property
    def conn_id(self) -> int: ...

    host: str
    started: float  # time.monotonic() at accept
    counted: bool

    def evict(self) -> None: ...


class ConnectionBudget:
    """The listener's connection caps. `max_connections` logged-in clients plus one more for an admin account
    (MySQL's extra connection for SUPER / CONNECTION_ADMIN), checked after authentication as MySQL does. Clients
    that have not logged in yet have their own budget, `max_unauthenticated` (at most `max_connections`): when it
    is full, a newcomer takes the slot of the oldest one that has held it for `unauthenticated_grace` seconds
    (``Seat.evict``), else it is refused; so idle sockets cannot lock logins out. `max_connections_per_host`
    (0: no cap) counts every connection of one client address, checked before the greeting."""

    def __init__(self, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 max_connections_per_host: int = DEFAULT_MAX_CONNECTIONS_PER_HOST,
                 max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
                 unauthenticated_grace: float = DEFAULT_UNAUTHENTICATED_GRACE) -> None:
        self.max_connections = max_connections
        self.max_connections_per_host = max_connections_per_host
        self.max_unauthenticated = max_unauthenticated
        self.unauthenticated_grace = unauthenticated_grace
        self.unauthenticated: dict[int, Seat] = {}  # oldest first
        self.per_host: collections.Counter[str] = collections.Counter()
        self._held = 0  # connections holding a slot, logged in or not

    @property
    def authenticated_count(self) -> int:
        """Connections that have logged in (and still hold their slot)."""
        return self._held - len(self.unauthenticated)

    def admit(self, seat: Seat) -> str | None:
        """A new connection: why it is refused before its greeting, or None when it takes a slot (not logged in
        yet) and may try to log in."""
        refusal = self._refusal(seat)
        if refusal is None:
            self.unauthenticated[seat.conn_id] = seat
            self.per_host[seat.host] += 1
            self._held += 1
            seat.counted = True
        return refusal

    def _refusal(self, seat: Seat) -> str | None:
        host = seat.host
        cap = self.max_connections_per_host
        if cap > 0 and self.per_host[host] >= cap:
            return f"{self.per_host[host]} connections from this host (max_connections_per_host = {cap})"
        if self.authenticated_count >= self.max_connections + 1:
            return f"{self.authenticated_count} clients logged in (max_connections = {self.max_connections}, +1 admin)"
        budget = max(1, min(self.max_unauthenticated, self.max_connections))
        if len(self.unauthenticated) < budget:
            return None
        oldest = next(iter(self.unauthenticated.values()))
        if time.monotonic() - oldest.started < self.unauthenticated_grace:
            return f"{len(self.unauthenticated)} connections not logged in yet (max_unauthenticated_connections)"
        oldest.evict()
        return None

    def logged_in(self, seat: Seat, user: DownstreamUser) -> str | None:
        """Move an authenticated connection to the logged-in count; why not (None: it may), MySQL's rule: beyond
        max_connections only an admin account, and only one."""
        count = self.authenticated_count
        if count >= self.max_connections + 1 or (count >= self.max_connections and not user.has(privileges.ADMIN)):
            return f"{count} clients logged in (max_connections = {self.max_connections}, +1 for an admin account)"
        self.unauthenticated.pop(seat.conn_id, None)
        return None

    def release(self, seat: Seat) -> None:
        """The connection ended (or was evicted): its slot is free."""
        self.unauthenticated.pop(seat.conn_id, None)
        if seat.counted:
            seat.counted = False
            self._held -= 1
            self.per_host[seat.host] -= 1
            if self.per_host[seat.host] <= 0:
                del self.per_host[seat.host]


class ConnectErrors:
    """Connection errors per client host (MySQL's and MariaDB's max_connect_errors, sans-I/O): after `limit`
    consecutive handshake errors a host is blocked (new connections get 1129 before the greeting) until ``flush()``
    (FLUSH HOSTS) or, when `block_seconds` > 0, until that long has passed; a successful login resets the host's
    count. Connections that already logged in, and other hosts, are never affected. At most `max_hosts` hosts are
    remembered (the least recently failing is forgotten first), so a client spraying addresses cannot grow it
    without bound.

    What counts is what the servers count (Host_errors::sum_connect_errors: only handshake errors): a connection
    that ends before its credentials were checked (closed, bad or timed-out handshake, TLS failure). A wrong
    password or unknown account is an authentication error, which the servers do not count here (LoginThrottle
    slows those down instead), and a loopback client (127.0.0.1, ::1) is never counted nor blocked."""

    def __init__(self, limit: int = DEFAULT_MAX_CONNECT_ERRORS, block_seconds: float = DEFAULT_HOST_BLOCK_TIME,
                 *, max_hosts: int = _HOST_CACHE_SIZE, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1:
            raise ValueError(f"max_connect_errors must be at least 1, got {limit}")
        self.limit = limit
        self.block_seconds = block_seconds
        self.max_hosts = max_hosts
        self._clock = clock
        self._errors: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._blocked: dict[str, float] = {}  # host -> clock() when it was blocked

    @staticmethod
    def counted(host: str) -> bool:
        """Whether this host's connection errors count at all (not for the loopback addresses, as the servers)."""
        return host not in _LOOPBACK

    def blocked(self, host: str) -> bool:
        since = self._blocked.get(host)
        if since is None:
            return False
        if self.block_seconds > 0 and self._clock() - since >= self.block_seconds:
            del self._blocked[host]
            self._errors.pop(host, None)
            return False
        return True

    def failed(self, host: str) -> bool:
        """Count one handshake error; True when it blocks the host (once, at the limit)."""
        if not self.counted(host):
            return False
        count = self._errors.pop(host, 0) + 1
        self._errors[host] = count
        while len(self._errors) > self.max_hosts:
            forgotten, _ = self._errors.popitem(last=False)
            self._blocked.pop(forgotten, None)
        if count >= self.limit and host not in self._blocked:
            self._blocked[host] = self._clock()
            return True
        return False

    def succeeded(self, host: str) -> None:
        self._errors.pop(host, None)

    def count(self, host: str) -> int:
        return self._errors.get(host, 0)

    def flush(self) -> int:
        """FLUSH HOSTS: forget every count and unblock every host; how many were blocked."""
        blocked = len(self._blocked)
        self._errors.clear()
        self._blocked.clear()
        return blocked

    def describe(self) -> dict[str, Any]:
        return {"max_connect_errors": self.limit, "host_block_time": self.block_seconds,
                "hosts_counted": len(self._errors), "hosts_blocked": len(self._blocked)}


class LoginThrottle:
    """Password guessing slowed down per account and client host (MySQL's connection_control, sans-I/O): after
    `threshold` consecutive wrong logins of one user name from one host, the answer to each further attempt of that
    pair (right or wrong) waits ``delay()``: (failures - threshold + 1) x `min_delay`, at most `max_delay`. A
    successful login resets the pair. Never a lockout, and never a delay for another user name or another host.
    `threshold` 0 turns it off. At most `max_keys` pairs are remembered (the least recently failing is forgotten)."""

    def __init__(self, threshold: int = DEFAULT_LOGIN_FAILURES_THRESHOLD, min_delay: float = DEFAULT_LOGIN_MIN_DELAY,
                 max_delay: float = DEFAULT_LOGIN_MAX_DELAY, *, max_keys: int = _THROTTLE_KEYS) -> None:
        if threshold < 0:
            raise ValueError(f"login_failures_threshold must be 0 (off) or more, got {threshold}")
        if not 0 < min_delay <= max_delay:
            raise ValueError(f"login_min_delay ({min_delay:g}s) must be positive and at most login_max_delay "
                             f"({max_delay:g}s)")
        self.threshold = threshold
        self.min_delay = min_delay
        self.max_delay = max_delay
        self.max_keys = max_keys
        self._failures: collections.OrderedDict[tuple[str, str], int] = collections.OrderedDict()
        self.failed_logins = 0  # wrong logins counted since the start
        self.delayed_logins = 0  # logins whose answer was delayed since the start
        self.delaying = 0  # logins being delayed now

    def failures(self, user: str, host: str) -> int:
        return self._failures.get((user, host), 0)

    def delay(self, user: str, host: str) -> float:
        """Seconds the answer to this login attempt waits (0: at once)."""
        if self.threshold == 0:
            return 0.0
        over = self._failures.get((user, host), 0) - self.threshold + 1
        return 0.0 if over <= 0 else min(over * self.min_delay, self.max_delay)

    def failed(self, user: str, host: str) -> None:
        if self.threshold == 0:
            return
        self.failed_logins += 1
        key = (user, host)
        self._failures[key] = self._failures.pop(key, 0) + 1
        while len(self._failures) > self.max_keys:
            self._failures.popitem(last=False)

    def succeeded(self, user: str, host: str) -> None:
        self._failures.pop((user, host), None)

    def describe(self, limit: int = 10) -> dict[str, Any]:
        """For /status: the settings, the counters, and the `limit` pairs with the most consecutive failures among
        those being delayed (user names shortened: they are the client's)."""
        throttled = [(n, key) for key, n in self._failures.items() if self.threshold and n >= self.threshold]
        throttled.sort(key=lambda item: -item[0])
        return {
            "login_failures_threshold": self.threshold,
            "login_min_delay": self.min_delay,
            "login_max_delay": self.max_delay,
            "failed_logins": self.failed_logins,
            "delayed_logins": self.delayed_logins,
            "delaying_now": self.delaying,
            "throttled_accounts": len(throttled),
            "most_failing": [
                {"user": bounded_name(user), "host": host, "consecutive_failures": n,
                 "next_delay": self.delay(user, host)}
                for n, (user, host) in throttled[:limit]
            ],
        }



__all__ = ["ConnectErrors", "ConnectionBudget", "LoginThrottle", "Seat", "bounded_name"]
