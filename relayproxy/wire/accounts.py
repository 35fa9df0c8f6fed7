"""The accounts a client may log in to the relay's server port as: name, password (kept out of every repr and
error), plugin, TLS requirement, host pattern and privilege, and MySQL's most-specific-host-wins look-up."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

NATIVE_PASSWORD = "mysql_native_password"
CACHING_SHA2_PASSWORD = "caching_sha2_password"
AUTO_PLUGIN = "auto"  # the relay's flavour decides: mysql_native_password for MariaDB, caching_sha2_password for MySQL
PLUGINS = (AUTO_PLUGIN, CACHING_SHA2_PASSWORD, NATIVE_PASSWORD)
TLS_MODES = ("optional", "required")

ADMIN_FLAG = "admin"  # the trailing field of a NAME:PASSWORDSPEC[:tls][:plugin][:admin] spec


@dataclass(frozen=True)
class DownstreamUser:
    """One account a client may authenticate as.

    `password` is the cleartext secret, which the server needs: mysql_native_password and caching_sha2_password
    both verify a scramble derived from it. It never appears in repr() or in an error message.
    `host` is a MySQL-style host pattern (``%`` and ``_`` wildcards) matched against the client's address.
    `admin` lets the account manage the relay's files (``PURGE BINARY LOGS``: MySQL's SUPER / BINLOG_ADMIN).
    """

    name: str
    password: str = field(repr=False)
    plugin: str = AUTO_PLUGIN
    tls: str = "optional"
    host: str = "%"
    admin: bool = False

    def __post_init__(self) -> None:
        if not self.name or "\0" in self.name:
            raise ValueError(f"user name {self.name!r} must be non-empty and without NUL bytes")
        if len(self.name.encode("utf-8")) > 255:
            raise ValueError(f"user name {self.name[:20]!r}... is longer than 255 bytes")
        if not isinstance(self.password, str):
            raise ValueError(f"user {self.name!r}: the password must be a string")
        if "\0" in self.password:
            # caching_sha2_password's full authentication sends the password NUL-terminated.
            raise ValueError(f"user {self.name!r}: the password contains a NUL byte")
        if self.plugin not in PLUGINS:
            raise ValueError(f"user {self.name!r}: plugin must be one of {', '.join(PLUGINS)}, got {self.plugin!r}")
        if self.tls not in TLS_MODES:
            raise ValueError(f"user {self.name!r}: tls must be one of {', '.join(TLS_MODES)}, got {self.tls!r}")
        if not self.host:
            raise ValueError(f"user {self.name!r}: host pattern must not be empty (use '%' for any host)")
        if not isinstance(self.admin, bool):
            raise ValueError(f"user {self.name!r}: admin must be true or false, got {self.admin!r}")

    def __repr__(self) -> str:
        return (
            f"DownstreamUser(name={self.name!r}, password='***', plugin={self.plugin!r}, tls={self.tls!r}, "
            f"host={self.host!r}, admin={self.admin!r})"
        )

    @property
    def account(self) -> str:
        """'name'@'host', as MySQL spells an account in messages."""
        return f"'{self.name}'@'{self.host}'"

    def matches_host(self, client_host: str) -> bool:
        """Whether a client connecting from `client_host` (an IP address) may use this account."""
        return host_pattern_matches(self.host, client_host)


def host_pattern_matches(pattern: str, host: str) -> bool:
    """MySQL account host matching: ``%`` is any run of characters, ``_`` any one character, case-insensitive."""
    if pattern == "%":
        return True
    regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, host, flags=re.IGNORECASE) is not None


def find_user(users: Iterable[DownstreamUser], name: str, client_host: str) -> DownstreamUser | None:
    """The account `name` may log in as from `client_host`: the most specific host pattern wins, as in MySQL
    (an exact host before patterns, patterns with more literal characters before shorter ones, '%' last)."""
    candidates = [u for u in users if u.name == name and u.matches_host(client_host)]
    if not candidates:
        return None
    return max(candidates, key=lambda u: (u.host != "%", not _has_wildcard(u.host), len(u.host.replace("%", ""))))


def _has_wildcard(pattern: str) -> bool:
    return "%" in pattern or "_" in pattern
