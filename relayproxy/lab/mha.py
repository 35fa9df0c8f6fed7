"""MHA 0.58 (Debian's mha4mysql-manager / mha4mysql-node) run for real against a topology with the relay: a private
sshd, the two-line patch overlay Debian's MHA needs on this Perl and MariaDB, app.cnf, and the MHA commands.

Used by tests/scenarios/test_mha.py. Nothing here touches the system's sshd, root's ~/.ssh or the installed MHA files:

- ``PrivateSshd`` runs ``/usr/sbin/sshd -D`` on a free port of 127.0.0.1 with its own generated host key, key-only
  root login (``StrictModes no``: the keys live in a temporary folder) and a generated client key, which MHA is
  given through ``ssh_options=-i <key>`` in app.cnf. MHA needs ssh even on one host (its node tools run over ssh).
- ``build_overlay`` writes a copy of two installed MHA modules with one fix each into a folder put first on
  PERL5LIB for the manager, and through sshd's ``SetEnv`` for the node tools it runs over ssh. The copies are made
  from the installed files at test time (never kept in this repository); each fix is a substitution that must
  match exactly once, so a different MHA version fails loudly instead of being half patched:

  * ``MHA/NodeUtil.pm`` ``parse_mysql_version`` / ``parse_mysql_major_version``: ``sprintf('%03d%03d%03d',
    $str =~ m/(\\d+)/g)`` gets every number of the version string (``10.11.6-MariaDB-0+deb12u1-log``: five), and
    under ``use warnings FATAL => 'all'`` Perl 5.22+ dies with "Redundant argument in sprintf". The fix takes the
    first three (two) numbers, as mha4mysql-node's upstream fix does.
  * ``MHA/SlaveUtil.pm`` ``check_if_super_read_only``: ``SELECT @@global.super_read_only`` with RaiseError dies on
    MariaDB ("Unknown system variable 'super_read_only'"), which has no such variable. The fix treats an error
    there as "not present", which is what the caller prints for a server without it.

- ``run_mha`` runs one MHA command to its end; ``start_mha`` starts one in the background (``masterha_manager``,
  which monitors the master until it dies, then fails over) as an ``MhaProcess``, in a process group of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..downstream.sql.replication_parser import ChangeMaster, render_change_master
from .harness import free_port

MHA_PACKAGES = ("mha4mysql-manager", "mha4mysql-node", "openssh-server")
MHA_PERL_DIR = Path("/usr/share/perl5")
SSHD = Path("/usr/sbin/sshd")
# what each package provides, checked before anything starts
REQUIRED = {
    "mha4mysql-manager": [Path("/usr/bin/masterha_check_repl"), Path("/usr/bin/masterha_master_switch"),
                          Path("/usr/bin/masterha_manager"), MHA_PERL_DIR / "MHA/MasterFailover.pm"],
    "mha4mysql-node": [Path("/usr/bin/apply_diff_relay_logs"), Path("/usr/bin/save_binary_logs"),
                       MHA_PERL_DIR / "MHA/NodeUtil.pm", MHA_PERL_DIR / "MHA/SlaveUtil.pm"],
    "openssh-server": [SSHD],
}


def missing_packages() -> list[str]:
    """The Debian packages of MHA_PACKAGES whose files are not installed (empty: all there)."""
    missing = [pkg for pkg, paths in REQUIRED.items() if not all(p.exists() for p in paths)]
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        missing.append("openssh-client")
    return missing


# (module, what the fix is for, pattern, replacement): each pattern must match exactly once in the installed file.
OVERLAY_FIXES: tuple[tuple[str, str, str, str], ...] = (
    ("MHA/NodeUtil.pm", "parse_mysql_version: only the first three numbers of the version string",
     r"sprintf\( '%03d%03d%03d', \$str =~ m/\(\\d\+\)/g \);",
     "sprintf( '%03d%03d%03d', ( ( $str =~ m/(\\\\d+)/g ), 0, 0, 0 )[ 0 .. 2 ] );  # relayproxy test overlay"),
    ("MHA/NodeUtil.pm", "parse_mysql_major_version: only the first two numbers of the version string",
     r"sprintf\( '%03d%03d', \$str =~ m/\(\\d\+\)/g \);",
     "sprintf( '%03d%03d', ( ( $str =~ m/(\\\\d+)/g ), 0, 0 )[ 0 .. 1 ] );  # relayproxy test overlay"),
    ("MHA/SlaveUtil.pm", "check_if_super_read_only: a server without super_read_only (MariaDB) has it off",
     r"(my \$sth = \$dbh->prepare\(\"SELECT \\@\\@global\.super_read_only as Value\"\);\n)  \$sth->execute\(\);\n",
     "\\1  # relayproxy test overlay: MariaDB has no super_read_only (error 1193)\n"
     "  eval { $sth->execute(); };\n  return ( 0, 0 ) if ($@);\n"),
)


def build_overlay(folder: Path) -> Path:
    """Copy the two modules from the installed MHA into ``folder``/MHA with OVERLAY_FIXES applied; returns
    ``folder`` (put it first on PERL5LIB). Raises AssertionError when a fix does not match exactly once."""
    (folder / "MHA").mkdir(parents=True, exist_ok=True)
    texts: dict[str, str] = {}
    for module, why, pattern, replacement in OVERLAY_FIXES:
        text = texts.get(module)
        if text is None:
            text = (MHA_PERL_DIR / module).read_text()
        text, count = re.subn(pattern, replacement, text)
        if count != 1:
            raise AssertionError(f"MHA overlay: the fix for {module} ({why}) matched {count} times in "
                                 f"{MHA_PERL_DIR / module}; this MHA is not the 0.58 this overlay was written for")
        texts[module] = text
    for module, text in texts.items():
        header = ("# A copy of the installed " + str(MHA_PERL_DIR / module) + " (MHA 0.58, (C) DeNA Co.,Ltd., GPL v2)\n"
                  "# with the relayproxy test overlay's fixes (lines marked 'relayproxy test overlay'),\n"
                  "# generated at test time by relayproxy/lab/mha.py; never installed, never committed.\n")
        (folder / module).write_text(header + text)
    return folder


@dataclass
class PrivateSshd:
    """sshd on a free port of 127.0.0.1, accepting root with one generated key; ``SetEnv`` for the node tools.

    ``accept_key``: accept that client key (another PrivateSshd's ``client_key``) instead of generating one, for a
    second "host" on its own port: MHA's ``ssh_options`` name one key for every host it reaches."""

    workdir: Path
    set_env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen | None = None
    accept_key: Path | None = None

    @property
    def client_key(self) -> Path:
        return self.accept_key or self.workdir / "id_ed25519"

    @property
    def ssh_options(self) -> str:
        """For MHA's ``ssh_options`` (no quotes: MHA strips them)."""
        return (f"-i {self.client_key} -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes "
                "-o LogLevel=ERROR -o PasswordAuthentication=no")

    def start(self) -> PrivateSshd:
        self.workdir.mkdir(parents=True, exist_ok=True)
        host_key = self.workdir / "ssh_host_ed25519_key"
        for key in (host_key, self.client_key):
            if not key.exists() and (key == host_key or self.accept_key is None):
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "relayproxy-mha-test",
                                "-f", str(key)], check=True)
        (self.workdir / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        env_line = " ".join(f"{k}={v}" for k, v in self.set_env.items())
        self.port = free_port()
        config = self.workdir / "sshd_config"
        config.write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"PidFile {self.workdir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}", "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "UsePAM no", "StrictModes no", "PrintMotd no", "LogLevel ERROR", "Subsystem sftp internal-sftp",
            *([f"SetEnv {env_line}"] if env_line else []), "",
        ]))
        self.proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)],
                                     stdout=open(self.workdir / "sshd.log", "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sshd exited with {self.proc.returncode}: "
                                     f"{(self.workdir / 'sshd.log').read_text()[-2000:]}")
            probe = subprocess.run(["ssh", *self.ssh_options.split(), "-o", "StrictHostKeyChecking=no",
                                    "-o", "BatchMode=yes", "-p", str(self.port), "root@127.0.0.1", "true"],
                                   capture_output=True, text=True, timeout=10)
            if probe.returncode == 0:
                return self
            time.sleep(0.2)
        raise AssertionError(f"ssh to the private sshd on port {self.port} did not work: {probe.stderr}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


@dataclass
class MhaServer:
    """One [serverN] section of app.cnf."""

    name: str
    port: int
    options: dict[str, str | int] = field(default_factory=dict)


def app_cnf(*, workdir: Path, user: str, password: str, repl_user: str, repl_password: str, ssh: PrivateSshd,
            servers: list[MhaServer]) -> str:
    """app.cnf text: a [server default] section and one section per server, all on 127.0.0.1."""
    lines = [
        "[server default]",
        f"user={user}", f"password={password}", f"repl_user={repl_user}", f"repl_password={repl_password}",
        "ssh_user=root", f"ssh_port={ssh.port}", f"ssh_options={ssh.ssh_options}",
        f"manager_workdir={workdir / 'manager'}",  # no manager_log: MHA then writes its log to stdout
        f"remote_workdir={workdir / 'remote'}", "ping_interval=1", "",
    ]
    for s in servers:
        lines += [f"[{s.name}]", "hostname=127.0.0.1", f"port={s.port}",
                  *(f"{k}={v}" for k, v in s.options.items()), ""]
    return "\n".join(lines)


@dataclass
class MhaRun:
    """One MHA command's outcome: its argv, exit code, output (stdout and stderr, in order) and duration."""

    argv: list[str]
    returncode: int
    output: str
    seconds: float

    def __str__(self) -> str:
        return f"$ {' '.join(self.argv)}\n(exit {self.returncode} after {self.seconds:.1f} s)\n{self.output}"


def _mha_env(overlay: Path, env: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, **(env or {}),
            "PERL5LIB": str(overlay) + (":" + os.environ["PERL5LIB"] if os.environ.get("PERL5LIB") else "")}


def run_mha(argv: list[str], *, overlay: Path, timeout: float = 300, stdin: str | None = None,
            env: dict[str, str] | None = None) -> MhaRun:
    """Run one MHA command with the overlay first on PERL5LIB (and `env` added to the environment MHA and its
    hooks run in); the output is printed (the test log keeps it)."""
    started = time.monotonic()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=_mha_env(overlay, env), timeout=timeout, input=stdin)
    run = MhaRun(argv, proc.returncode, proc.stdout, time.monotonic() - started)
    print(run, flush=True)
    return run


@dataclass
class MhaProcess:
    """An MHA command running in the background (``masterha_manager``), started by `start_mha`: its output
    (stdout and stderr, in order) goes to a file, read as it grows. It runs in a process group of its own with
    everything it starts (ssh, its scripts), which `stop` ends."""

    argv: list[str]
    proc: subprocess.Popen
    output_file: Path
    started: float
    run: MhaRun | None = None  # once it has exited: its outcome, printed once

    def output(self) -> str:
        return self.output_file.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float) -> None:
        """Return once `text` is in the output; AssertionError (with the output) if it exits first or after
        `timeout` seconds (then it is stopped)."""
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.argv[0]} exited before printing {text!r}:\n{self._finish()}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"{self.argv[0]} did not print {text!r} within {timeout:.0f} s:\n{self.run}")
            time.sleep(0.1)

    def wait(self, timeout: float) -> MhaRun:
        """Wait for it to exit by itself; after `timeout` seconds it is stopped and AssertionError (with the
        output) raised."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"{self.argv[0]} did not exit within {timeout:.0f} s; stopped:\n{self.run}") \
                from None
        return self._finish()

    def stop(self) -> None:
        """SIGTERM to its process group (MHA's handler exits), SIGKILL after 10 s; then whatever of the group is
        left. Does nothing more once stopped."""
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait(10)
        self._finish()

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _finish(self) -> MhaRun:
        if self.run is None:
            self.proc.wait()
            self._signal_group(signal.SIGKILL)  # a child it left behind (ssh, a script), if any
            self.run = MhaRun(self.argv, self.proc.returncode, self.output(), time.monotonic() - self.started)
            print(self.run, flush=True)
        return self.run


def start_mha(argv: list[str], *, overlay: Path, output_file: Path, env: dict[str, str] | None = None) -> MhaProcess:
    """Start one MHA command in the background, as `run_mha` runs one (the overlay first on PERL5LIB, `env` added),
    in a new session (its own process group); its output goes to `output_file` and is printed when it ends."""
    output_file.parent.mkdir(parents=True, exist_ok=True)
    with open(output_file, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=_mha_env(overlay, env), start_new_session=True)
    return MhaProcess(argv, proc, output_file, time.monotonic())


# -- the hook MHA calls: repoint the relays at the new master ------------------------------------------------------

HOOK_LOG_ENV = "RELAYPROXY_MHA_HOOK_LOG"


def hook_command(relays: list[int], *, admin_user: str, admin_password: str, repl_user: str,
                 repl_password: str, change: str = "gtid") -> str:
    """The command line for app.cnf's master_ip_failover_script / master_ip_online_change_script: this module run
    with the venv's Python; MHA appends its own --command=... --new_master_host=... arguments."""
    import sys

    relays_arg = ",".join(f"127.0.0.1:{port}" for port in relays)
    return (f"{sys.executable} -m relayproxy.lab.mha --relays={relays_arg} --relay-user={admin_user} "
            f"--relay-password={admin_password} --repl-user={repl_user} --repl-password={repl_password} "
            f"--relay-change={change}")


def main(argv: list[str] | None = None) -> int:
    """MHA's master_ip_failover_script / master_ip_online_change_script contract: ``--command=status|stop|stopssh``
    exit 0 (no virtual IP here); ``--command=start`` repoints every relay at ``--new_master_ip:--new_master_port``
    (STOP SLAVE; CHANGE MASTER TO ...; START SLAVE as an admin account): ``--relay-change=gtid`` with
    MASTER_USE_GTID=slave_pos (docs/failover.md), ``file-pos`` with the new master's SHOW MASTER STATUS and no GTID
    option, the statement MHA sends every replica it lists. Unknown MHA arguments are accepted and ignored."""
    import argparse

    import pymysql

    parser = argparse.ArgumentParser(prog="relayproxy.lab.mha", allow_abbrev=False)
    parser.add_argument("--relays", default="")
    parser.add_argument("--relay-user", required=True)
    parser.add_argument("--relay-password", required=True)
    parser.add_argument("--repl-user", required=True)
    parser.add_argument("--repl-password", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--new_master_ip", "--new_master_host", dest="new_master_ip")
    parser.add_argument("--new_master_port", type=int)
    parser.add_argument("--new_master_user")
    parser.add_argument("--new_master_password")
    parser.add_argument("--relay-change", choices=("gtid", "file-pos"), default="gtid")
    args, _mha_rest = parser.parse_known_args(argv)
    log_path = os.environ.get(HOOK_LOG_ENV)

    def note(line: str) -> None:
        print(f"relayproxy MHA hook: {line}", flush=True)
        if log_path:
            with open(log_path, "a") as out:
                out.write(line + "\n")

    note(f"--command={args.command} new master {args.new_master_ip}:{args.new_master_port}")
    if args.command != "start":
        return 0
    account = {"host": args.new_master_ip, "port": args.new_master_port, "user": args.repl_user,
               "password": args.repl_password}
    if args.relay_change == "gtid":
        change, how = render_change_master(ChangeMaster.for_server("mariadb", **account, gtid=True)), "by GTID"
    else:  # where MHA points the replicas it lists: the new master's position when the hook runs
        with pymysql.connect(host=args.new_master_ip, port=args.new_master_port, user=args.new_master_user,
                             password=args.new_master_password, connect_timeout=10) as conn, conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            file, position = cur.fetchone()[:2]
        change = render_change_master(ChangeMaster.for_server("mariadb", **account, log_file=file, log_pos=position))
        how = f"at {file}:{position}"
    for relay in filter(None, args.relays.split(",")):
        host, port = relay.rsplit(":", 1)
        with pymysql.connect(host=host, port=int(port), user=args.relay_user, password=args.relay_password,
                             connect_timeout=10, read_timeout=60) as conn, conn.cursor() as cur:
            cur.execute("STOP SLAVE")
            cur.execute(change)
            cur.execute("START SLAVE")
        note(f"relay {relay} repointed at {args.new_master_ip}:{args.new_master_port} {how}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
