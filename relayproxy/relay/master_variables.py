"""The master's replication-relevant variables: which ones the relay asks for, and their durable copy.

At every connect the upstream session asks the master for ``VARIABLES`` in one statement
(``select_statement``); a flavour or version that lacks one answers ER_UNKNOWN_SYSTEM_VARIABLE (1193), and
then each is asked alone (``single_statement``), the missing ones recorded in ``absent``. The answer is kept
in ``<relay_dir>/relayproxy.master-variables.json`` (written atomically, with the master's identity and the time
it was fetched; rewritten only when what it says changes, and for a new master only once the relay's files
follow it), so the SQL layer still answers truthfully while the master is down and after a restart. A
damaged file, or one from another master than the relay's files came from, is reported and ignored: the next
connect fetches the variables again. Nothing here does network I/O.

Which variables, and who reads them:

- ``binlog_format`` -- Debezium, Maxwell, go-mysql's canal and Flink CDC refuse anything but ROW at start.
- ``binlog_row_image`` -- Debezium and Maxwell want FULL (a MINIMAL image has holes in its rows).
- ``binlog_row_metadata`` -- python-mysql-replication asks it on its control connection; FULL makes it decode
  with the column names and charsets of the TABLE_MAP events (told MINIMAL, it guesses, and decodes latin1 as
  UTF-8).
- ``binlog_row_value_options`` -- MySQL: PARTIAL_JSON changes how JSON updates are encoded (Debezium reads it).
- ``binlog_checksum`` -- every replica and python-mysql-replication (the relay's own files' FDE wins: that is
  what a dump sends).
- ``gtid_mode``, ``enforce_gtid_consistency`` -- MySQL replicas (``SELECT @@GLOBAL.GTID_MODE``), Debezium, Maxwell.
- ``log_bin`` -- Debezium and Maxwell check it (the relay answers its own: it keeps binlogs).
- ``max_allowed_packet`` -- go-mysql and drivers (the relay answers its own limit; the master's is kept for status).
- ``version``, ``version_comment`` -- every client; kept for status (``@@version`` is what the relay emulates).
- ``character_set_server``, ``collation_server`` -- Debezium's DDL parser takes the server default for columns
  declared without a charset; MySQL replicas compare ``COLLATION_SERVER``.
- ``time_zone``, ``system_time_zone`` -- MySQL replicas compare ``TIME_ZONE``; Debezium for temporal columns.
- ``lower_case_table_names`` -- Debezium's table filters and DDL parser.
- ``gtid_domain_id``, ``gtid_strict_mode`` -- MariaDB replicas.
- ``binlog_gtid_index`` -- MariaDB 11.4+ (absent elsewhere).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..log import get_logger
from .durable import write_file_atomically

log = get_logger("relayproxy.relay")

FILE_NAME = "relayproxy.master-variables.json"
FORMAT_VERSION = 1

VARIABLES: tuple[str, ...] = (
    "binlog_format",
    "binlog_row_image",
    "binlog_row_metadata",
    "binlog_row_value_options",
    "binlog_checksum",
    "gtid_mode",
    "enforce_gtid_consistency",
    "log_bin",
    "max_allowed_packet",
    "version",
    "version_comment",
    "character_set_server",
    "collation_server",
    "time_zone",
    "system_time_zone",
    "lower_case_table_names",
    "gtid_domain_id",
    "gtid_strict_mode",
    "binlog_gtid_index",
)


_MYSQL_ONLY = ("binlog_row_value_options", "gtid_mode", "enforce_gtid_consistency")
_MARIADB_ONLY = ("gtid_domain_id", "gtid_strict_mode", "binlog_gtid_index")


def variables_for(flavour: str) -> tuple[str, ...]:
    """The names worth asking a master of ``flavour`` ('mysql' or 'mariadb'): the other flavour's own variables
    would only cost a 1193 and a round of single queries. A version that lacks one of these still answers 1193."""
    other = _MARIADB_ONLY if flavour == "mysql" else _MYSQL_ONLY
    return tuple(name for name in VARIABLES if name not in other)


def select_statement(names: tuple[str, ...] = VARIABLES) -> str:
    """One statement for all of ``names``."""
    return "SELECT " + ", ".join(f"@@GLOBAL.{name}" for name in names)


def single_statement(name: str) -> str:
    return f"SELECT @@GLOBAL.{name}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


@dataclass(frozen=True)
class MasterVariables:
    """What one master said: ``values`` by lower-case name (text, or None for a NULL), ``absent`` the names it
    does not have (1193); ``server_id``/``server_uuid``/``host``/``port`` who said it; ``fetched_at`` when."""

    values: dict[str, str | None]
    absent: tuple[str, ...] = ()
    server_id: int | None = None
    server_uuid: str | None = None
    host: str | None = None
    port: int | None = None
    fetched_at: float = 0.0

    @classmethod
    def from_row(cls, names: tuple[str, ...], row: list | tuple, **identity: Any) -> "MasterVariables":
        """The one-statement answer: one row, a value per name."""
        if len(row) != len(names):
            raise ValueError(f"the master answered {len(row)} values for {len(names)} variables")
        return cls(values={n: _text(v) for n, v in zip(names, row)}, **identity)

    @classmethod
    def from_singles(cls, answers: dict[str, Any], absent: list[str] | tuple[str, ...], **identity: Any
                     ) -> "MasterVariables":
        """The one-by-one answer: a value per name the master has, and the names it does not have."""
        return cls(values={n: _text(v) for n, v in answers.items()}, absent=tuple(absent), **identity)

    def same_master(self, server_id: int | None, server_uuid: str | None) -> bool:
        if server_id is None or self.server_id != server_id:
            return False
        return self.server_uuid is None or server_uuid is None or self.server_uuid == server_uuid

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "master": {"server_id": self.server_id, "server_uuid": self.server_uuid, "host": self.host,
                       "port": self.port},
            "fetched_at": self.fetched_at,
            "variables": dict(sorted(self.values.items())),
            "absent": sorted(self.absent),
        }

    @classmethod
    def from_json(cls, doc: Any) -> "MasterVariables":
        """Strict: anything unexpected raises ValueError (the file is then ignored, never half trusted)."""
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_VERSION:
            raise ValueError("not a master variables document of format 1")
        master, variables, absent = doc.get("master"), doc.get("variables"), doc.get("absent", [])
        if not isinstance(master, dict) or not isinstance(variables, dict) or not isinstance(absent, list):
            raise ValueError("master, variables or absent missing or of the wrong type")
        if not all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in variables.items()):
            raise ValueError("a variable value is not text or null")
        if not all(isinstance(a, str) for a in absent):
            raise ValueError("absent holds a non-name")
        server_id = master.get("server_id")
        if not isinstance(server_id, int) or isinstance(server_id, bool):
            raise ValueError("master.server_id is not an integer")
        fetched_at = doc.get("fetched_at")
        if not isinstance(fetched_at, (int, float)) or isinstance(fetched_at, bool):
            raise ValueError("fetched_at is not a time")
        uuid, host, port = master.get("server_uuid"), master.get("host"), master.get("port")
        if not (uuid is None or isinstance(uuid, str)) or not (host is None or isinstance(host, str)) or not (
                port is None or isinstance(port, int)):
            raise ValueError("master identity of the wrong type")
        return cls(values=dict(variables), absent=tuple(absent), server_id=server_id, server_uuid=uuid, host=host,
                   port=port, fetched_at=float(fetched_at))

    def describe(self) -> dict[str, Any]:
        """What the SQL layer and /status read (``UpstreamStatus.master_variables`` is ``values``)."""
        return {"server_id": self.server_id, "server_uuid": self.server_uuid, "host": self.host, "port": self.port,
                "fetched_at": self.fetched_at, "absent": list(self.absent)}


class MasterVariablesFile:
    """``<relay_dir>/relayproxy.master-variables.json``: written atomically, read strictly."""

    def __init__(self, relay_dir: Path) -> None:
        self.path = Path(relay_dir) / FILE_NAME
        self.error: str | None = None  # why the last load ignored the file

    def load(self) -> MasterVariables | None:
        """The persisted variables, or None (no file; a damaged one is logged, ``error`` says why)."""
        self.error = None
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.error = f"cannot read {self.path}: {exc}"
        else:
            try:
                return MasterVariables.from_json(json.loads(raw))
            except (ValueError, UnicodeDecodeError) as exc:
                self.error = f"{self.path} is damaged ({exc}); ignored until the next connect fetches them again"
        log.warning("master variables file ignored", error=self.error)
        return None

    def save(self, variables: MasterVariables) -> None:
        data = (json.dumps(variables.to_json(), indent=1, sort_keys=True) + "\n").encode()
        write_file_atomically(self.path, data)


__all__ = ["FILE_NAME", "VARIABLES", "MasterVariables", "MasterVariablesFile", "select_statement",
           "single_statement", "variables_for"]
