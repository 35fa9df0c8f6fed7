"""Real backups of sandbox servers with Debian's mariadb-backup: take one (``--backup`` then ``--prepare``) and
restore it into a new sandbox's datadir (``--copy-back``), as a DBA restores last night's backup before a PITR."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .sandbox import MariaDBSandbox, SandboxError, find_binary


def take_backup(server: MariaDBSandbox, target_dir: Path, *, timeout: float = 600.0) -> Path:
    """A prepared full backup of a running sandbox in ``target_dir`` (created); its mariadb_backup_binlog_info names
    the binlog position and GTID of the backup's consistent point."""
    tool = find_binary("mariadb-backup", "mariabackup")
    target_dir = Path(target_dir)
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    log = target_dir.parent / f"{target_dir.name}.log"
    with open(log, "ab") as out:
        for step in (["--backup", f"--target-dir={target_dir}", f"--host={server.host}", f"--port={server.port}",
                      "--user=root", f"--datadir={server.datadir}"],
                     ["--prepare", f"--target-dir={target_dir}"]):
            done = subprocess.run([tool, *step], stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
            if done.returncode != 0:
                raise SandboxError(f"mariadb-backup {step[0]} failed ({done.returncode}); see {log}: "
                                   + log.read_text(errors="replace")[-2000:])
    return target_dir


def restore_backup(backup_dir: Path, sandbox: MariaDBSandbox, *, timeout: float = 600.0) -> MariaDBSandbox:
    """Copy a prepared backup into a sandbox that was never started (its datadir must not exist yet), then start
    it: the restored instance."""
    if sandbox.running or sandbox.datadir.exists():
        raise SandboxError(f"restore into {sandbox.basedir}: its datadir exists; restore into a new sandbox")
    tool = find_binary("mariadb-backup", "mariabackup")
    sandbox.basedir.mkdir(parents=True, exist_ok=True)
    log = sandbox.basedir / "restore.log"
    with open(log, "ab") as out:
        done = subprocess.run([tool, "--copy-back", f"--target-dir={backup_dir}", f"--datadir={sandbox.datadir}"],
                              stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    if done.returncode != 0:
        raise SandboxError(f"mariadb-backup --copy-back failed ({done.returncode}); see {log}: "
                           + log.read_text(errors="replace")[-2000:])
    return sandbox.start()
