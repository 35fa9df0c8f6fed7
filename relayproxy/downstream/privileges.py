"""Who may do what on the relay's server port: every privilege check (the server's dump and register commands,
the SQL layer's status, PURGE, replication admin, KILL and FLUSH statements) goes through ``denial``.

The privileges are the account's (wire/accounts.py: replication_slave, replication_client, binlog_admin, admin);
a refusal is the servers' ERR 1227 naming the privilege as the relay's flavour names it (MariaDB splits
REPLICATION CLIENT into SLAVE MONITOR and BINLOG MONITOR; MySQL 8 names the dynamic privileges), followed by
the relay's own privilege name so the operator knows what to grant in ``[[users]]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..wire.accounts import (
    ADMIN,
    BINLOG_ADMIN,
    DEFAULT_PRIVILEGES,
    PRIVILEGES,
    REPLICATION_CLIENT,
    REPLICATION_SLAVE,
    DownstreamUser,
    find_user,
)
from ..wire.errors import ER_SPECIFIC_ACCESS_DENIED_ERROR
from .context import ConnectionState


@dataclass(frozen=True)
class Action:
    """Something that needs a privilege: the relay's privilege and what MySQL / MariaDB call what they check."""

    privilege: str
    mysql: str
    mariadb: str


# The servers' names are those of their ER_SPECIFIC_ACCESS_DENIED_ERROR texts (MariaDB 10.11 checked against a
# real server in tests/downstream/test_privileges.py; MySQL 8.0's from its documentation and sql_parse.cc).
DUMP = Action(REPLICATION_SLAVE, "REPLICATION SLAVE", "REPLICATION SLAVE")  # COM_BINLOG_DUMP[_GTID]
REGISTER = DUMP  # COM_REGISTER_SLAVE
SHOW_REPLICA_STATUS = Action(REPLICATION_CLIENT, "SUPER, REPLICATION CLIENT", "SUPER, SLAVE MONITOR")
SHOW_BINARY_LOGS = Action(REPLICATION_CLIENT, "SUPER, REPLICATION CLIENT", "SUPER, BINLOG MONITOR")  # + MASTER STATUS
SHOW_BINLOG_EVENTS = Action(REPLICATION_CLIENT, "REPLICATION SLAVE", "BINLOG MONITOR")
PURGE = Action(BINLOG_ADMIN, "SUPER or BINLOG_ADMIN", "SUPER, BINLOG ADMIN")
REPLICATION_ADMIN = Action(ADMIN, "SUPER or REPLICATION_SLAVE_ADMIN", "SUPER, REPLICATION SLAVE ADMIN")
FLUSH_HOSTS = Action(ADMIN, "RELOAD", "RELOAD")
SHOW_OTHER_GRANTS = Action(ADMIN, "SELECT", "SELECT")  # the servers need SELECT on the mysql schema


def account_of(ctx, conn: ConnectionState) -> DownstreamUser | None:
    """The account a connection logged in as: the one the server recorded at login, else (sans-I/O callers)
    the configuration's account for its user and host."""
    account = getattr(conn, "account", None)
    if account is not None:
        return account
    return find_user(ctx.settings.users, conn.user, conn.host)


def granted(ctx, conn: ConnectionState) -> frozenset[str]:
    """The connection's privileges. A context with no accounts at all (a sans-I/O caller: the server refuses to
    listen without one) has the default ones; a connection whose account is not configured has none."""
    account = account_of(ctx, conn)
    if account is not None:
        return account.granted
    return DEFAULT_PRIVILEGES if not ctx.settings.users else frozenset()


def has(ctx, conn: ConnectionState, privilege: str) -> bool:
    return privilege in granted(ctx, conn)


def denial(ctx, conn: ConnectionState, action: Action, flavour: str | None = None) -> tuple[int, str, str] | None:
    """None when the connection may do `action`; else the ERR (code, sqlstate, message) the servers give."""
    if has(ctx, conn, action.privilege):
        return None
    flavour = flavour or getattr(ctx, "flavour", "mysql")
    names = action.mariadb if flavour == "mariadb" else action.mysql
    return (
        ER_SPECIFIC_ACCESS_DENIED_ERROR,
        "42000",
        f"Access denied; you need (at least one of) the {names} privilege(s) for this operation "
        f"(relayproxy: the account needs {action.privilege} in its [[users]] privileges, or admin = true)",
    )


# SHOW GRANTS: the relay's privileges as the servers' GRANT statements name them.
_GRANT_NAMES = {
    "mysql": {REPLICATION_SLAVE: "REPLICATION SLAVE", REPLICATION_CLIENT: "REPLICATION CLIENT",
              BINLOG_ADMIN: "BINLOG_ADMIN", ADMIN: "SUPER, REPLICATION_SLAVE_ADMIN, CONNECTION_ADMIN, RELOAD"},
    "mariadb": {REPLICATION_SLAVE: "REPLICATION SLAVE", REPLICATION_CLIENT: "BINLOG MONITOR, SLAVE MONITOR",
                BINLOG_ADMIN: "BINLOG ADMIN", ADMIN: "SUPER, REPLICATION SLAVE ADMIN, CONNECTION ADMIN, RELOAD"},
}


def grant_statement(account: DownstreamUser | None, user: str, host: str, flavour: str) -> str:
    """``GRANT ... ON *.* TO `user`@`host```: what SHOW GRANTS answers for the account's privileges."""
    privileges = account.granted if account is not None else frozenset()
    names = _GRANT_NAMES["mariadb" if flavour == "mariadb" else "mysql"]
    if ADMIN in privileges:
        listed = names[ADMIN].split(", ") + [names[p] for p in PRIVILEGES if p != ADMIN]
    else:
        listed = [names[p] for p in PRIVILEGES if p in privileges]
    words: list[str] = []
    for item in listed:
        for word in item.split(", "):
            if word not in words:
                words.append(word)
    granted_text = ", ".join(words) if words else "USAGE"
    return f"GRANT {granted_text} ON *.* TO `{user}`@`{host}`"
