"""The fan-out benchmarks' shared pieces (benchmarks/fanout.py runs them): the master's settings, the replica
account, the relay as they run it (``relayproxy run --listen`` through ``relayproxy.lab.relayprocess``), the log line
and small helpers. CPU and memory readings come from ``relayproxy.lab.procstat``."""

from __future__ import annotations

from pathlib import Path

from benchmarks import benchinfo
from benchmarks.common import logger
from relayproxy.lab.relayprocess import RelayProcess, py_spy_record
from relayproxy.lab.sandbox import MariaDBSandbox

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
REPL_USER, REPL_PASSWORD = "repl", "replpw"
OLTP_PAD = 200  # as relay_catchup.py: ~150-byte events on average
BINLOG_SEND_ANNOTATE_ROWS_EVENT = 2  # COM_BINLOG_DUMP flag: what a MariaDB replica with log_slave_updates asks
MASTER_CONFIG = {
    "sync_binlog": 0,
    "innodb_flush_log_at_trx_commit": 0,
    "innodb_buffer_pool_size": "256M",
    "innodb_doublewrite": 0,
    "max_connections": 1000,
    "rpl_semi_sync_master_enabled": 0,
}
USERS_TOML = f"""
[[users]]
name = "{REPL_USER}"
password = "{REPL_PASSWORD}"
plugin = "mysql_native_password"
"""


log = logger("fanout")


def master_end(master: MariaDBSandbox) -> tuple[str, int]:
    row = master.execute("SHOW MASTER STATUS")[0]
    return row[0], int(row[1])


def machine_info() -> dict:
    return benchinfo.machine_info(server=True)


class Relay(RelayProcess):
    """`relayproxy run --listen` as the fan-out benchmarks run it: the relay's own defaults (no test timings),
    replicas served on ``listen_port`` with the account of ``users_toml`` (``--config``), ``options`` (the
    ``--relay-option KEY=VALUE`` pairs) as flags, optionally under py-spy record (100 Hz), in its own session."""

    def __init__(self, work: Path, master, py_spy_output: Path | None = None,
                 options: list[tuple[str, str]] | None = None, *, users_toml: str = USERS_TOML,
                 extra: list[str] | None = None) -> None:
        config = work / "relay.toml"
        config.write_text(users_toml)
        flags: list[str] = []
        for key, value in options or ():  # --relay-option key=value: any option of `relayproxy run`, as a flag
            flags += ["--" + key.replace("_", "-"), value]
        super().__init__(
            work / "relay", master.port, user=REPL_USER, password=REPL_PASSWORD, gtid_mode=None,
            heartbeat_period=None, reconnect_max_delay=None, listen=True, config=config, extra=[*flags, *(extra or [])],
            log_path=work / "relay.log", new_session=True, error=RuntimeError,
            wrapper=py_spy_record(py_spy_output, 100) if py_spy_output is not None else None,
        )

    def start(self, timeout: float = 60.0) -> "Relay":
        super().start(timeout)
        return self

    def stop(self, timeout: float = 60.0) -> int | None:
        return super().stop(timeout)
