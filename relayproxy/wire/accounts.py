"""The accounts a client may log in to the relay's server port as: name, password (kept out of every repr and
error), plugin, TLS requirement, host pattern and privileges, and MySQL's most-specific-host-wins look-up."""

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
PRIVILEGES_FIELD = "privileges="  # ... or [:privileges=a+b] naming them

# The relay's privileges, modelled on the servers' (docs/operations.md "Accounts and privileges"):
REPLICATION_SLAVE = "replication_slave"  # COM_REGISTER_SLAVE, COM_BINLOG_DUMP, COM_BINLOG_DUMP_GTID
REPLICATION_CLIENT = "replication_client"  # SHOW SLAVE|REPLICA STATUS, SHOW BINARY LOGS / MASTER STATUS / BINLOG EVENTS
BINLOG_ADMIN = "binlog_admin"  # PURGE BINARY LOGS
ADMIN = "admin"  # everything: CHANGE MASTER, START/STOP SLAVE, KILL of any connection, FLUSH HOSTS, and all the above
PRIVILEGES = (REPLICATION_SLAVE, REPLICATION_CLIENT, BINLOG_ADMIN, ADMIN)
# Other names for the same privilege (MariaDB's split of REPLICATION CLIENT, with underscores).
PRIVILEGE_ALIASES = {"slave_monitor": REPLICATION_CLIENT, "replica_monitor": REPLICATION_CLIENT,
                     "binlog_monitor": REPLICATION_CLIENT}
# What an account declared without `privileges` may do: what every account could do before privileges existed
# (dump and monitor). `admin = true` adds ADMIN, which implies every privilege.
DEFAULT_PRIVILEGES = frozenset((REPLICATION_SLAVE, REPLICATION_CLIENT))


def parse_privileges(value: object, who: str = "account") -> frozenset[str]:
    """Privilege names (a list, or one string separated by commas or '+') as a set of canonical names;
    ValueError naming the unknown one and the known ones."""
    if isinstance(value, str):
        items: list[object] = [v for v in value.replace("+", ",").split(",") if v.strip()]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        raise ValueError(f"{who}: privileges must be a list of names, got {type(value).__name__}")
    out = set()
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"{who}: a privilege must be a name, got {item!r}")
        name = item.strip().lower().replace(" ", "_").replace("-", "_")
        name = PRIVILEGE_ALIASES.get(name, name)
        if name not in PRIVILEGES:
            known = ", ".join((*PRIVILEGES, *PRIVILEGE_ALIASES))
            raise ValueError(f"{who}: unknown privilege {item.strip()[:40]!r} (known: {known})")
        out.add(name)
    return frozenset(out)


@dataclass(frozen=True)
class DownstreamUser:
    """One account a client may authenticate as.

    `password` is the cleartext secret, which the server needs: mysql_native_password and caching_sha2_password
    both verify a scramble derived from it. It never appears in repr() or in an error message.
    `host` is a MySQL-style host pattern (``%`` and ``_`` wildcards) matched against the client's address.
    `privileges` names what the account may do (PRIVILEGES; None: DEFAULT_PRIVILEGES, dump and monitor);
    `admin` (the older flag) adds ADMIN, which implies every privilege. `granted` is the effective set.
    """

    name: str
    password: str = field(repr=False)
    plugin: str = AUTO_PLUGIN
    tls: str = "optional"
    host: str = "%"
    admin: bool = False
    privileges: frozenset[str] | None = None

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
        if self.privileges is not None:
            object.__setattr__(self, "privileges", parse_privileges(self.privileges, f"user {self.name!r}"))

    def __repr__(self) -> str:
        return (
            f"DownstreamUser(name={self.name!r}, password='***', plugin={self.plugin!r}, tls={self.tls!r}, "
            f"host={self.host!r}, admin={self.admin!r}, privileges={sorted(self.granted)!r})"
        )

    @property
    def granted(self) -> frozenset[str]:
        """The account's effective privileges (ADMIN implies all of them)."""
        own = DEFAULT_PRIVILEGES if self.privileges is None else self.privileges
        if self.admin or ADMIN in own:
            return frozenset(PRIVILEGES)
        return own

    def has(self, privilege: str) -> bool:
        return privilege in self.granted

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
