"""SQL text the relay writes for a server to read: string literals (file names, GTIDs, CHANGE MASTER values)."""

from __future__ import annotations


def sql_string(text: str) -> str:
    """``text`` as an SQL string literal, quotes and backslashes escaped (MySQL's and MariaDB's default
    sql_mode, where a backslash escapes; NO_BACKSLASH_ESCAPES servers read the same literal the same way for any
    text without a backslash)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
