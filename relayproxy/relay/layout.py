"""The layout of a relay directory: the relay's own file names (index, durable mark, the reserved prefix) and
what a relay file may be called.

A relay directory holds the relay files under the master's names, ``relayproxy.index`` listing them oldest
first, and ``relayproxy.durable``: a one-line cache of the last durable horizon position (``relay/durable.py``
writes both). Every other file of the relay's own (``relayproxy.epochs``, ``relayproxy.checkpoint``, the file
indexes, ``relayproxy.uuid``...) starts with ``RESERVED_PREFIX``, which no relay file may, so recovery never
mistakes one for the other.
"""

from __future__ import annotations

import re

INDEX_NAME = "relayproxy.index"
INDEX_TMP_NAME = INDEX_NAME + ".tmp"
DURABLE_MARK_NAME = "relayproxy.durable"
RESERVED_NAMES = frozenset({INDEX_NAME, INDEX_TMP_NAME, DURABLE_MARK_NAME})
# The relay's own files in its directory (index, durable mark, relayproxy.uuid, ...) start with
# this; relay files never do, so recovery never mistakes one for the other.
RESERVED_PREFIX = "relayproxy."
UNADOPTED_DIR = RESERVED_PREFIX + "unadopted"  # unlisted files recovery could not adopt, kept here
MAX_NAME_BYTES = 255
_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


def check_file_name(name: str) -> str:
    """Validate a relay file name (it comes from the master): a plain, printable basename."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"relay file name must be a non-empty string, not {name!r}")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise ValueError(f"relay file name is longer than {MAX_NAME_BYTES} bytes: {name[:40]!r}...")
    if "/" in name or "\\" in name or name.startswith(".") or any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise ValueError(f"relay file name {name!r} is not a plain file name")
    if name.startswith(RESERVED_PREFIX):
        raise ValueError(f"relay file name {name!r} is reserved for the relay's own files ({RESERVED_PREFIX}*)")
    if name != name.strip():
        raise ValueError(f"relay file name {name!r} has leading or trailing spaces")
    return name


def next_file_name(name: str) -> str | None:
    """The name the server gives the file after ``name`` (``bin.000009`` -> ``bin.000010``)."""
    m = _TRAILING_NUMBER.match(name)
    if not m:
        return None
    digits = m.group(2)
    return f"{m.group(1)}{int(digits) + 1:0{len(digits)}d}"

