"""The accounts replicas and tools log in to the relay with, as the configuration declares them: parsing
``[[users]]`` tables and ``name:password`` specs, and where their passwords come from (literal, environment
variable or file). The account model itself is ``wire/accounts.py``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..wire.accounts import (
    ADMIN_FLAG,
    CACHING_SHA2_PASSWORD,
    NATIVE_PASSWORD,
    PLUGINS,
    PRIVILEGES_FIELD,
    TLS_MODES,
    DownstreamUser,
    find_user,
    host_pattern_matches,
)

# Keys a [[users]] table may carry; exactly one of the password sources.
_PASSWORD_SOURCES = ("password", "password_env", "password_file")
_TABLE_KEYS = frozenset(("name", "plugin", "tls", "host", "admin", "privileges", *_PASSWORD_SOURCES))


# -- parsing ------------------------------------------------------------------------------------------------------


def parse_users(value: Any, *, environ: Mapping[str, str] | None = None) -> list[DownstreamUser]:
    """The accounts the configuration declares.

    `value` is either what TOML gives for ``[[users]]`` tables (a list of dicts with ``name``, exactly one of
    ``password`` / ``password_env`` (an environment variable's name) / ``password_file`` (its first line), and
    optionally ``plugin``, ``tls``, ``host``, ``admin`` (a boolean), ``privileges`` (a list of names, see
    wire/accounts.py PRIVILEGES); a string in the list is read as below), or a string from a flag or an
    environment variable: comma-separated ``name:passwordspec[:tls][:plugin][:admin][:privileges=a+b]`` entries
    where passwordspec is ``env:VAR``, ``file:PATH`` or the password itself (a literal password cannot contain a
    comma, nor start with ``env:``/``file:``, nor end with ``:admin``, ``:privileges=...`` or a tls/plugin value;
    use those forms then). A list of
    DownstreamUser is returned as is (after the duplicate check).

    Raises ValueError naming the entry (by index and name), never showing a password.
    """
    env = os.environ if environ is None else environ
    if value is None:
        return []
    users: list[DownstreamUser]
    if isinstance(value, str):
        users = [_parse_spec(i, spec.strip(), env) for i, spec in enumerate(value.split(",")) if spec.strip()]
    elif isinstance(value, Mapping):
        raise ValueError("users must be a list of tables ([[users]] in TOML), not a single table")
    elif isinstance(value, (list, tuple)):
        users = [_parse_entry(i, entry, env) for i, entry in enumerate(value)]
    else:
        kind = type(value).__name__
        raise ValueError(f"users must be a list of [[users]] tables or a 'name:password,...' string, got {kind}")
    seen: set[tuple[str, str]] = set()
    for i, user in enumerate(users):
        key = (user.name, user.host.lower())
        if key in seen:
            raise ValueError(f"users[{i}]: account {user.account} is declared twice")
        seen.add(key)
    return users


def _parse_entry(index: int, entry: Any, env: Mapping[str, str]) -> DownstreamUser:
    if isinstance(entry, DownstreamUser):
        return entry
    if isinstance(entry, str):  # users = ["name:env:VAR", ...] in TOML
        return _parse_spec(index, entry.strip(), env)
    return _parse_table(index, entry, env)


def _where(index: int, name: object = None) -> str:
    return f"users[{index}]" + (f" ({name!r})" if isinstance(name, str) and name else "")


def _parse_table(index: int, entry: Any, env: Mapping[str, str]) -> DownstreamUser:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{_where(index)}: expected a table with name and password, got {type(entry).__name__}")
    normalized = {str(key).replace("-", "_"): item for key, item in entry.items()}
    name = normalized.get("name")
    where = _where(index, name)
    unknown = sorted(set(normalized) - _TABLE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(_TABLE_KEYS))})")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: 'name' is required and must be a non-empty string")
    sources = [key for key in _PASSWORD_SOURCES if key in normalized]
    if len(sources) != 1:
        given = ", ".join(sources) if sources else "none"
        raise ValueError(f"{where}: exactly one of password, password_env, password_file is required (given: {given})")
    source = sources[0]
    raw = normalized[source]
    if not isinstance(raw, str):
        raise ValueError(f"{where}: {source} must be a string")
    if source == "password":
        password = raw
    elif source == "password_env":
        password = _from_env(where, raw, env)
    else:
        password = _from_file(where, raw)
    options: dict[str, Any] = {key: normalized[key] for key in ("plugin", "tls", "host") if key in normalized}
    for key, item in options.items():
        if not isinstance(item, str):
            raise ValueError(f"{where}: {key} must be a string")
    if "admin" in normalized:
        if not isinstance(normalized["admin"], bool):
            raise ValueError(f"{where}: admin must be true or false")
        options["admin"] = normalized["admin"]
    if "privileges" in normalized:
        if not isinstance(normalized["privileges"], (list, tuple, str)):
            raise ValueError(f"{where}: privileges must be a list of names, e.g. [\"replication_client\"]")
        options["privileges"] = normalized["privileges"]
    return _build(where, name, password, options)


def _parse_spec(index: int, spec: str, env: Mapping[str, str]) -> DownstreamUser:
    name, sep, rest = spec.partition(":")
    if not sep or not name:
        # Not echoed: without the separator the entry may well be a mistyped name+password.
        what = "no ':'" if not sep else "an empty name"
        raise ValueError(f"{_where(index)}: expected name:password (or name:env:VAR, name:file:PATH), got {what}")
    where = _where(index, name)
    # Optional trailing fields are recognised by their value, so that file paths may contain ':'.
    options: dict[str, Any] = {}
    while True:
        head, sep, last = rest.rpartition(":")
        if not sep:
            break
        if last == ADMIN_FLAG and "admin" not in options:
            options["admin"] = True
        elif last.startswith(PRIVILEGES_FIELD) and "privileges" not in options:
            options["privileges"] = last[len(PRIVILEGES_FIELD):]
        elif last in TLS_MODES and "tls" not in options:
            options["tls"] = last
        elif last in PLUGINS and "plugin" not in options:
            options["plugin"] = last
        else:
            break
        rest = head
    if rest.startswith("env:"):
        password = _from_env(where, rest[4:], env)
    elif rest.startswith("file:"):
        password = _from_file(where, rest[5:])
    else:
        password = rest
    return _build(where, name, password, options)


def _from_env(where: str, variable: str, env: Mapping[str, str]) -> str:
    if not variable:
        raise ValueError(f"{where}: password_env / env: needs an environment variable name")
    try:
        return env[variable]
    except KeyError:
        raise ValueError(f"{where}: environment variable {variable} (the password) is not set") from None


def _from_file(where: str, path: str) -> str:
    """The file's first line, as for the upstream password_file."""
    if not path:
        raise ValueError(f"{where}: password_file / file: needs a path")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{where}: cannot read password file {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{where}: password file {path!r} is not UTF-8 text") from None
    lines = text.splitlines()
    return lines[0] if lines else ""


def _build(where: str, name: str, password: str, options: Mapping[str, Any]) -> DownstreamUser:
    try:
        return DownstreamUser(name, password, **options)
    except ValueError as exc:
        # DownstreamUser's messages name the user and never the password.
        raise ValueError(f"{where}: {exc}") from None


__all__ = [
    "CACHING_SHA2_PASSWORD",
    "NATIVE_PASSWORD",
    "DownstreamUser",
    "find_user",
    "host_pattern_matches",
    "parse_users",
]
