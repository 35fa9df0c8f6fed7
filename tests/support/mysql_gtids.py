"""The scripted MySQL master's own GTID-set arithmetic, written apart from relayproxy's ``GtidSet`` so that what
tests/support/fakemaster.py refuses and sends (the checks of MySQL's ``Binlog_sender`` and
``find_first_log_not_in_gtid_set``) is decided by code the relay does not run.

A set is a dict ``(uuid, tag) -> sorted list of disjoint, non-adjacent ``[first, last]`` runs`` (inclusive), built
from MySQL's text form or its binary form (the PREVIOUS_GTIDS body, COM_BINLOG_DUMP_GTID's data; untagged and
MySQL 8.3's tagged format), and written back in both. Small and plain on purpose: the sets of the tests are small.
tests/lab/test_mysql_gtids.py compares every operation with relayproxy's ``GtidSet`` on random sets.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable

_U64 = struct.Struct("<Q")
_UUID = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
_RUN = re.compile(r"^(\d+)(?:-(\d+))?$")
_TAG = re.compile(r"^[a-z_][a-z0-9_]{0,31}$")

Key = tuple[str, str]  # (uuid with dashes, lower case; tag, "" for none)


def _dashed(hex32: str) -> str:
    return f"{hex32[:8]}-{hex32[8:12]}-{hex32[12:16]}-{hex32[16:20]}-{hex32[20:]}"


def _normalise(runs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged (overlapping or touching runs become one)."""
    out: list[tuple[int, int]] = []
    for first, last in sorted(runs):
        if out and first <= out[-1][1] + 1:
            if last > out[-1][1]:
                out[-1] = (out[-1][0], last)
        else:
            out.append((first, last))
    return out


class Gtids:
    """A MySQL GTID set: ``(uuid, tag) -> runs``; immutable by convention (operations return new sets)."""

    __slots__ = ("runs",)

    def __init__(self, runs: dict[Key, list[tuple[int, int]]] | None = None):
        self.runs: dict[Key, list[tuple[int, int]]] = {}
        for key, value in (runs or {}).items():
            merged = _normalise(value)
            if merged:
                self.runs[key] = merged

    # -- reading ---------------------------------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> Gtids:
        """MySQL's text form: ``uuid:1-5:7[:tag:1-3...]``, elements separated by commas (spaces, newlines ignored)."""
        runs: dict[Key, list[tuple[int, int]]] = {}
        for element in "".join(text.split()).split(","):
            if not element:
                continue
            uuid, *parts = element.split(":")
            if not _UUID.match(uuid.lower()):
                raise ValueError(f"not a UUID: {uuid!r}")
            uuid = _dashed(uuid.lower().replace("-", ""))
            tag = ""
            for part in parts:
                match = _RUN.match(part)
                if match is None:
                    if not _TAG.match(part.lower()):
                        raise ValueError(f"neither a run nor a tag: {part!r}")
                    tag = part.lower()
                    continue
                first = int(match.group(1))
                last = int(match.group(2)) if match.group(2) else first
                if first < 1 or last < first:
                    raise ValueError(f"bad run {part!r}")
                runs.setdefault((uuid, tag), []).append((first, last))
        return cls(runs)

    @classmethod
    def decode(cls, data: bytes) -> Gtids:
        """The binary form: u64 header (untagged: the count of UUIDs; tagged: format 1 in the top and low bytes, the
        count in between), then per entry 16 bytes of UUID, [a tag: its length << 1 in one byte, then its bytes],
        a u64 count of runs, and per run u64 first and u64 end (exclusive)."""
        data = bytes(data)
        (header,) = _U64.unpack_from(data, 0)
        tagged = header >> 56 == 1
        count = (header >> 8) & ((1 << 48) - 1) if tagged else header
        if tagged and header & 0xFF != 1:
            raise ValueError(f"tagged header {header:#x} without the format in its low byte")
        pos, runs = 8, {}
        for _ in range(count):
            uuid = _dashed(data[pos:pos + 16].hex())
            pos += 16
            tag = ""
            if tagged:
                length_byte = data[pos]
                if length_byte & 1:
                    raise ValueError("tag lengths of more than one byte are not written by MySQL (tags <= 32)")
                length = length_byte >> 1
                tag = data[pos + 1:pos + 1 + length].decode("ascii").lower()
                pos += 1 + length
            (n,) = _U64.unpack_from(data, pos)
            pos += 8
            for _ in range(n):
                first, end = struct.unpack_from("<QQ", data, pos)
                pos += 16
                if not 0 < first < end:
                    raise ValueError(f"bad run [{first}, {end})")
                runs.setdefault((uuid, tag), []).append((first, end - 1))
        if pos != len(data):
            raise ValueError(f"{len(data) - pos} bytes left after the GTID set")
        return cls(runs)

    # -- writing ---------------------------------------------------------------------------------------------------

    def _ordered(self) -> list[Key]:
        return sorted(self.runs, key=lambda key: (bytes.fromhex(key[0].replace("-", "")), key[1]))

    def encode(self) -> bytes:
        keys = self._ordered()
        tagged = any(tag for _, tag in keys)
        out = bytearray(_U64.pack((1 << 56) | (len(keys) << 8) | 1 if tagged else len(keys)))
        for uuid, tag in keys:
            out += bytes.fromhex(uuid.replace("-", ""))
            if tagged:
                out += bytes([len(tag) << 1]) + tag.encode("ascii")
            runs = self.runs[(uuid, tag)]
            out += _U64.pack(len(runs))
            for first, last in runs:
                out += struct.pack("<QQ", first, last + 1)
        return bytes(out)

    def text(self, separator: str = ",\n") -> str:
        """As MySQL prints it: a UUID once, its untagged runs, then each tag with its runs."""
        elements: dict[str, list[str]] = {}
        for uuid, tag in self._ordered():
            runs = ":".join(f"{a}" if a == b else f"{a}-{b}" for a, b in self.runs[(uuid, tag)])
            elements.setdefault(uuid, []).append(f"{tag}:{runs}" if tag else runs)
        return separator.join(f"{uuid}:{':'.join(parts)}" for uuid, parts in elements.items())

    def __str__(self) -> str:
        return self.text(",")

    def __repr__(self) -> str:
        return f"Gtids({self.text(',')!r})"

    # -- arithmetic ------------------------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Gtids) and self.runs == other.runs

    def __bool__(self) -> bool:
        return bool(self.runs)

    def uuids(self) -> list[str]:
        return sorted({uuid for uuid, _ in self.runs})

    def contains(self, uuid: str, gno: int, tag: str = "") -> bool:
        return any(first <= gno <= last for first, last in self.runs.get((uuid, tag), ()))

    def add(self, uuid: str, gno: int, tag: str = "") -> Gtids:
        return self.union(Gtids({(uuid, tag): [(gno, gno)]}))

    def union(self, other: Gtids) -> Gtids:
        keys = set(self.runs) | set(other.runs)
        return Gtids({k: self.runs.get(k, []) + other.runs.get(k, []) for k in keys})

    def difference(self, other: Gtids) -> Gtids:
        out: dict[Key, list[tuple[int, int]]] = {}
        for key, runs in self.runs.items():
            left = list(runs)
            for cut_first, cut_last in other.runs.get(key, ()):
                kept = []
                for first, last in left:
                    if last < cut_first or first > cut_last:
                        kept.append((first, last))
                        continue
                    if first < cut_first:
                        kept.append((first, cut_first - 1))
                    if last > cut_last:
                        kept.append((cut_last + 1, last))
                left = kept
            out[key] = left
        return Gtids(out)

    def issubset(self, other: Gtids) -> bool:
        return not self.difference(other)

    def format(self, separator: str = ",\n") -> str:
        """``text``, under the name relayproxy's GtidSet gives it (callers written for either)."""
        return self.text(separator)
