"""MHA 0.58 (Debian's mha4mysql-manager and mha4mysql-node) run for real against a topology with the relay.

    M1 ──┬── R1  candidate (GTID slave_pos, log_bin, log_slave_updates)
         ├── R4  candidate (same)
         └── relayproxy ──┬── R2  by GTID
                          └── R3  by file/position

What MHA does with a relay, as run here (docs/failover.md, "MHA 0.58", has the log lines and the reasons):

- With the relay listed in app.cnf (``no_master=1``, ``ignore_fail=1``) MHA refuses it: ``masterha_check_repl``
  fails on the relay's missing relay-log.info (MHA applies relay logs by SQL on every replica it lists; the relay
  applies nothing) and the online switch stops at "Slave SQL thread is not running" on the relay.
- So app.cnf lists the servers only; the relay is repointed by the script MHA calls when the new master takes
  over (``master_ip_failover_script`` / ``master_ip_online_change_script`` ``--command=start``: lab/mha.py's hook,
  STOP SLAVE; CHANGE MASTER TO ... MASTER_USE_GTID=slave_pos; START SLAVE on the relay).
- ``master_binlog_dir`` of the master is the relay directory: the relay's files are the master's binlogs (names,
  offsets, bytes), so MHA's "Saving Dead Master's Binlog Phase" reads from them the transactions the candidates
  had not received, and applies them to the new master and the other candidate.

Debian's MHA 0.58 needs two one-line fixes on this Perl and MariaDB (lab/mha.py, OVERLAY_FIXES): made at test
time from the installed modules into a folder on PERL5LIB (and, through sshd's SetEnv, for the node tools).
Every MHA command's output is printed (pytest shows it for a failing test; -s shows it always).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from relayproxy.lab import mha
from relayproxy.lab.failover import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    BASENAME,
    REPL_PASSWORD,
    REPL_USER,
    MixedLoad,
    binlog_pos,
    covers,
    gtid_seqs,
    relay_sql,
    slave_pos,
    uids,
    wait_until,
)
from relayproxy.lab.harness import (
    RelayProcess,
    assert_same_data,
    change_master,
    free_port,
    replica_status,
    run_every_step,
    wait_relay,
    wait_replica,
)

pytestmark = [pytest.mark.server, pytest.mark.mha]

MHA_USER, MHA_PASSWORD = "mha", "mhapw"


@pytest.fixture(scope="module")
def mha_installed() -> None:
    missing = mha.missing_packages()
    if missing:
        pytest.fail(f"MHA is not installed here: missing {', '.join(missing)} (`make setup` installs "
                    f"{' '.join(mha.MHA_PACKAGES)} with apt)", pytrace=False)


def _candidate(mariadb, name: str, server_id: int):
    return mariadb(name, server_id=server_id, binlog_format="ROW", log_bin_name=BASENAME,
                   extra_config={"log_slave_updates": 1, "read_only": 1 if name != "m1" else None})


def _assert_every_uid_once(load: MixedLoad, servers: dict) -> None:
    for name, server in servers.items():
        for table, want in load.inserted.items():
            count, found = uids(server, table)
            assert count == len(found), f"{name}.{table}: {count - len(found)} rows inserted twice"
            assert found == want, (f"{name}.{table}: missing {sorted(want - found)[:10]}, "
                                   f"unexpected {sorted(found - want)[:10]}")


def _wait_converged(relay: RelayProcess, source, replicas: dict, timeout: float = 60.0) -> str:
    """The relay holds `source`'s gtid_binlog_pos without an upstream error; each replica has applied it."""

    def probe() -> str | None:
        want = binlog_pos(source)
        status = relay.status()
        assert not status.get("last_io_error"), f"relay: {status['last_io_error']}\n{relay.log_tail()}"
        if not covers(status["retrieved_gtid_set"], want):
            return None
        for name, replica in replicas.items():
            state = replica_status(replica)
            assert "No" not in (state.get("Slave_IO_Running"), state.get("Slave_SQL_Running")), (
                f"{name} stopped: {state.get('Last_IO_Error')} {state.get('Last_SQL_Error')}")
            if not covers(slave_pos(replica), want):
                return None
        return want

    return wait_until(f"the relay and {sorted(replicas)} to hold {source.basedir.name}'s GTIDs", probe, timeout,
                      relay.log_tail)


def _relay_master(relay_port: int) -> tuple[int, str]:
    row = relay_sql(relay_port, "SHOW SLAVE STATUS")[0]
    return int(row["Master_Port"]), row["Slave_IO_Running"]


def test_mha_switches_masters_with_the_relay(mha_installed, mariadb, tmp_path: Path):
    started = time.monotonic()
    timings: dict[str, float] = {}
    m1 = _candidate(mariadb, "m1", 1)
    r1 = _candidate(mariadb, "r1", 2)
    r4 = _candidate(mariadb, "r4", 4)
    r2 = mariadb("r2", server_id=5, log_bin=False)
    r3 = mariadb("r3", server_id=6, log_bin=False)
    m1.create_user(REPL_USER, REPL_PASSWORD)
    m1.execute("CREATE USER %s@'%%' IDENTIFIED BY %s", (MHA_USER, MHA_PASSWORD))
    m1.execute("GRANT ALL PRIVILEGES ON *.* TO %s@'%%' WITH GRANT OPTION", (MHA_USER,))
    load = MixedLoad(seed=5)
    load.create_schema(m1)
    relay_port = free_port()
    relay = RelayProcess(
        tmp_path / "relay", m1.port, server_id=100, gtid_mode="mariadb",
        extra=["--listen", f"127.0.0.1:{relay_port}",
               "--users", f"{REPL_USER}:{REPL_PASSWORD},{ADMIN_USER}:{ADMIN_PASSWORD}:admin,"
                        f"{MHA_USER}:{MHA_PASSWORD}:admin"])
    ssh = None
    try:
        relay.start()
        for candidate in (r1, r4):
            change_master(candidate, m1.port, file=None)
            candidate.execute("START SLAVE")
        load.run(m1, 60)
        wait_relay(relay, m1)
        first_file = relay_sql(relay_port, "SHOW BINARY LOGS")[0]["Log_name"]
        change_master(r2, relay_port, file=None)
        change_master(r3, relay_port, file=first_file, pos=4)
        for replica in (r1, r4, r2, r3):
            if replica in (r2, r3):
                replica.execute("START SLAVE")
            wait_replica(replica, m1)

        overlay = mha.build_overlay(tmp_path / "mha-overlay")
        ssh = mha.PrivateSshd(tmp_path / "ssh", set_env={"PERL5LIB": str(overlay)}).start()
        work = tmp_path / "mha"
        for sub in ("manager", "remote"):
            (work / sub).mkdir(parents=True, exist_ok=True)

        def config(name: str, servers: list[mha.MhaServer], *, relay_change: str | None = "gtid") -> Path:
            text = mha.app_cnf(workdir=work, user=MHA_USER, password=MHA_PASSWORD, repl_user=REPL_USER,
                               repl_password=REPL_PASSWORD, ssh=ssh, servers=servers)
            if relay_change:
                hook = mha.hook_command([relay_port], admin_user=ADMIN_USER, admin_password=ADMIN_PASSWORD,
                                        repl_user=REPL_USER, repl_password=REPL_PASSWORD, change=relay_change)
                text = text.replace("ping_interval=1\n", f"ping_interval=1\nmaster_ip_failover_script={hook}\n"
                                    f"master_ip_online_change_script={hook}\n", 1)
            path = work / f"{name}.cnf"
            path.write_text(text)
            print(f"--- {path}\n{text}", flush=True)
            return path

        def run(*argv: str) -> mha.MhaRun:
            return mha.run_mha(list(argv), overlay=overlay)

        relay_dir = str((tmp_path / "relay").absolute())
        m1_section = mha.MhaServer("server1", m1.port, {"candidate_master": 1, "master_binlog_dir": relay_dir})
        candidates = [mha.MhaServer("server2", r1.port, {"candidate_master": 1}),
                      mha.MhaServer("server3", r4.port, {"candidate_master": 1})]
        timings["topology"] = time.monotonic() - started

        # 1. The relay listed as a replica (no_master=1, ignore_fail=1): MHA's checks refuse it.
        listed = config("relay-listed", [m1_section, *candidates,
                                         mha.MhaServer("server4", relay_port, {"no_master": 1, "ignore_fail": 1})],
                        relay_change=None)
        check = run("masterha_check_repl", f"--conf={listed}", "--skip_check_ssh")
        assert check.returncode != 0, "MHA accepted the relay as a replica: update docs/failover.md"
        assert f"Could not open relay-log-info file {relay_dir}/relay-log.info" in check.output
        online = run("masterha_master_switch", "--master_state=alive", f"--conf={listed}",
                     "--new_master_host=127.0.0.1", f"--new_master_port={r1.port}", "--orig_master_is_new_slave",
                     "--interactive=0", "--running_updates_limit=10")
        assert online.returncode != 0
        assert f"Slave SQL thread is not running on 127.0.0.1(127.0.0.1:{relay_port})" in online.output
        assert _relay_master(relay_port) == (m1.port, "Yes")  # nothing was changed
        timings["relay listed: check_repl, online switch refused"] = time.monotonic() - started

        # 2. The servers only, the hook for the relay, the relay directory as the master's binlog directory. The
        # hook sends the relay what MHA sends the replicas it lists: the new master's file and position.
        cnf = config("app", [m1_section, *candidates], relay_change="file-pos")
        check = run("masterha_check_repl", f"--conf={cnf}")
        assert check.returncode == 0 and "MySQL Replication Health is OK." in check.output
        timings["check_repl"] = time.monotonic() - started

        # 3. Dead master: the candidates stop receiving, M1 commits more (the relay has it), then kill -9.
        for candidate in (r1, r4):
            candidate.execute("STOP SLAVE IO_THREAD")
        load.run(m1, 25)
        wait_relay(relay, m1)
        for replica in (r2, r3):
            wait_replica(replica, m1)
        final, behind = binlog_pos(m1), binlog_pos(r1)
        assert not covers(behind, final)  # the relay, R2 and R3 hold transactions no candidate has
        m1.kill()
        dead = run("masterha_master_switch", "--master_state=dead", f"--conf={cnf}",
                   "--dead_master_host=127.0.0.1", "--dead_master_ip=127.0.0.1", f"--dead_master_port={m1.port}",
                   "--new_master_host=127.0.0.1", f"--new_master_port={r1.port}", "--interactive=0",
                   "--ignore_last_failover")
        assert dead.returncode == 0, "MHA's dead-master switch failed"
        assert f"--binlog_dir={relay_dir}" in dead.output  # the missing transactions came from the relay's files
        mha_said = re.search(r"Statement should be: CHANGE MASTER TO MASTER_HOST='127\.0\.0\.1', "
                             rf"MASTER_PORT={r1.port}, MASTER_LOG_FILE='([^']+)', MASTER_LOG_POS=(\d+)", dead.output)
        assert mha_said, "MHA did not print the coordinates it gives the other replicas"
        file, position = mha_said.group(1), int(mha_said.group(2))
        assert f"relay 127.0.0.1:{relay_port} repointed at 127.0.0.1:{r1.port} at {file}:{position}" in dead.output
        timings["dead switch"] = time.monotonic() - started
        assert _relay_master(relay_port)[0] == r1.port
        switch = wait_until("the relay's switch decision", lambda: (relay.status().get("last_switch") or {})
                            .get("coordinates") and relay.status()["last_switch"], 30, relay.log_tail)
        assert switch["accepted"] and switch["coordinates"] == {"file": file, "position": position}, switch
        load.run(r1, 40)
        _wait_converged(relay, r1, {"R4": r4, "R2": r2, "R3": r3})
        _assert_every_uid_once(load, {"R1": r1, "R4": r4, "R2": r2, "R3": r3})
        for replica in (r4, r2, r3):
            assert_same_data(r1, replica)
        relay.stop()
        relay.start()
        load.run(r1, 10)
        _wait_converged(relay, r1, {"R4": r4, "R2": r2, "R3": r3})
        _assert_every_uid_once(load, {"R1": r1, "R2": r2, "R3": r3})
        timings["dead switch checked, relay restarted"] = time.monotonic() - started

        # 4. Online switch R1 -> R4; R1 becomes a replica of R4; the hook repoints the relay.
        cnf = config("online", [mha.MhaServer("server1", r1.port, {"candidate_master": 1}),
                                mha.MhaServer("server2", r4.port, {"candidate_master": 1})])
        online = run("masterha_master_switch", "--master_state=alive", f"--conf={cnf}",
                     "--new_master_host=127.0.0.1", f"--new_master_port={r4.port}", "--orig_master_is_new_slave",
                     "--interactive=0", "--running_updates_limit=10")
        assert online.returncode == 0, "MHA's online switch failed"
        assert "relay 127.0.0.1:%d repointed at 127.0.0.1:%d by GTID" % (relay_port, r4.port) in online.output
        timings["online switch"] = time.monotonic() - started
        assert _relay_master(relay_port)[0] == r4.port
        load.run(r4, 40)
        _wait_converged(relay, r4, {"R1": r1, "R2": r2, "R3": r3})
        _assert_every_uid_once(load, {"R4": r4, "R1": r1, "R2": r2, "R3": r3})
        for replica in (r1, r2, r3):
            assert_same_data(r4, replica)
        relay.stop()
        relay.start()
        load.run(r4, 10)
        _wait_converged(relay, r4, {"R1": r1, "R2": r2, "R3": r3})
        _assert_every_uid_once(load, {"R4": r4, "R2": r2, "R3": r3})
        timings["online switch checked, relay restarted"] = time.monotonic() - started
    finally:
        print("timings (s since the start): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()), flush=True)
        if ssh is not None:
            ssh.stop()
        relay.stop()


# -- a lossless failover driven by MHA: relayproxy promote in master_ip_failover_script ---------------------------------

HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "mha_master_ip_failover"
LAGGING_CANDIDATE = 0.4  # seconds the candidate's link holds each chunk of the master's stream


def _semi_sync_trial(workdir: Path):
    """lab/lossless.py's topology, started: a semi-sync master (AFTER_SYNC) whose only acker is the relay (`run
    --semi-sync`), a GTID replica T behind the relay, and a candidate C replicating straight from the master through a
    link that delays the stream. Stopped again if it fails to start."""
    from relayproxy.lab.lossless import Trial, TrialSpec

    spec = TrialSpec(seed=36, kind="master", relays=1, candidate_delay=LAGGING_CANDIDATE, replica=True,
                     load_seconds=2.5, big_chance=0.0)
    trial = Trial(workdir, spec)
    try:
        trial.start()
    except BaseException:
        trial.close()
        raise
    return trial


def _semi_sync_trial_killed(workdir: Path):
    """_semi_sync_trial, then four writers commit for 2.5 s, each recording every commit that returned; then kill -9
    of the master and every link to it dropped. C applies all it received; `result.direct_lost` counts the
    acknowledged commits it lacks (what promoting it as it is loses)."""
    trial = _semi_sync_trial(workdir)
    try:
        trial.load_and_kill()
        trial.direct_snapshot()
        assert trial.result.direct_lost > 0, "the candidate did not lag: nothing to show"
    except BaseException:
        trial.close()
        raise
    return trial


def _app_cnf(trial, work: Path, ssh: mha.PrivateSshd, hook: str, master: dict[str, str | int]) -> Path:
    """app.cnf listing the master (at the address the candidate replicates from: its link; `master`: more options of
    its section) and the candidate, with `hook` as master_ip_failover_script; the relay is not listed (it is refused
    as a replica, above)."""
    for sub in ("manager", "remote"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    text = mha.app_cnf(workdir=work, user=ADMIN_USER, password=ADMIN_PASSWORD, repl_user=REPL_USER,
                       repl_password=REPL_PASSWORD, ssh=ssh, servers=[
                           mha.MhaServer("server1", trial.candidate_link.port, {"candidate_master": 1, **master}),
                           mha.MhaServer("server2", trial.candidate.port, {"candidate_master": 1})])
    text = text.replace("ping_interval=1\n", f"ping_interval=1\nmaster_ip_failover_script={hook}\n", 1)
    cnf = work / "app.cnf"
    cnf.write_text(text)
    print(f"--- {cnf}\n{text}", flush=True)
    return cnf


def _dead_switch(trial, tmp_path: Path, hook: str, env: dict[str, str]) -> mha.MhaRun:
    """masterha_master_switch --master_state=dead with _app_cnf. The master's host is unreachable by ssh (its
    ssh_port is closed), as when the host itself is down: MHA cannot save the dead master's binlog, so what the
    candidate lacks can come only from the relay."""
    overlay = mha.build_overlay(tmp_path / "mha-overlay")
    ssh = mha.PrivateSshd(tmp_path / "ssh", set_env={"PERL5LIB": str(overlay)}).start()
    try:
        master_at = trial.candidate_link.port
        cnf = _app_cnf(trial, tmp_path / "mha", ssh, hook, {"ssh_port": free_port()})
        return mha.run_mha(["masterha_master_switch", "--master_state=dead", f"--conf={cnf}",
                            "--dead_master_host=127.0.0.1", "--dead_master_ip=127.0.0.1",
                            f"--dead_master_port={master_at}", "--new_master_host=127.0.0.1",
                            f"--new_master_port={trial.candidate.port}", "--interactive=0", "--ignore_last_failover"],
                           overlay=overlay, env=env)
    finally:
        ssh.stop()


def _hook_env(trial) -> dict[str, str]:
    """The hook's site settings for this trial, in the environment MHA runs it in."""
    return {"RELAYPROXY_HOOK_RELAYS": f"127.0.0.1:{trial.relay_ports[0]}",
            "RELAYPROXY_HOOK_RELAY_USER": ADMIN_USER,
            "RELAYPROXY_HOOK_RELAY_PASSWORD_FILE": str(trial.secrets / "admin"),
            "RELAYPROXY_HOOK_DB_USER": ADMIN_USER, "RELAYPROXY_HOOK_DB_PASSWORD_FILE": str(trial.secrets / "admin"),
            "RELAYPROXY_HOOK_REPL_USER": REPL_USER, "RELAYPROXY_HOOK_REPL_PASSWORD_FILE": str(trial.secrets / "repl"),
            "RELAYPROXY_HOOK_TIMEOUT": "60",
            "RELAYPROXY_HOOK_RELAYPROXY": str(Path(sys.executable).with_name("relayproxy"))}


def test_mha_dead_master_switch_with_relayproxy_promote_loses_no_acknowledged_commit(mha_installed, tmp_path: Path):
    """MHA's master_ip_failover_script is docs/hooks/mha_master_ip_failover (the file docs/failover.md shows): at
    --command=start it runs `relayproxy promote --no-reset-replica`. 0 acknowledged commits lost, the candidate
    writable with no replication left (MHA reset it), the relay and T following it, MHA's exit 0."""
    trial = _semi_sync_trial_killed(tmp_path / "trial")
    try:
        dead = _dead_switch(trial, tmp_path, str(HOOK), _hook_env(trial))
        assert dead.returncode == 0, "MHA's dead-master switch did not succeed"
        assert f"Master failover to 127.0.0.1(127.0.0.1:{trial.candidate.port}) completed successfully." in dead.output
        assert "Resetting slave info succeeded." in dead.output
        assert "SSH is NOT reachable" in dead.output or "is NOT reachable" in dead.output  # no binlog saved by MHA
        document = _promote_document(dead.output)
        assert document["fetched_count"] >= trial.result.direct_lost, document
        _assert_lossless(trial, f"the candidate lacked {trial.result.direct_lost} of them; MHA ran "
                                f"{dead.seconds:.1f} s")
    finally:
        trial.close()


def _promote_document(output: str) -> dict:
    """The hook's `relayproxy promote --json` document in MHA's output: outcome promoted, exit code 0."""
    document = json.loads(output[output.index("{\n"):output.index("\n}\n") + 2])
    assert document["outcome"] == "promoted" and document["exit_code"] == 0, document
    return document


def _assert_lossless(trial, said: str) -> None:
    """After MHA with the promote hook: the candidate writable with no replication left (MHA's own cleanup reset
    it); trial.check(), new writes on C reaching the relay and T, counts 0 acknowledged commits lost, none partial,
    no row twice, no GTID from another server, nothing the relay held dropped. Prints what it counted first."""
    assert replica_status(trial.candidate) == {}
    assert int(trial.candidate.execute("SELECT @@GLOBAL.read_only")[0][0]) == 0
    trial.check()
    r = trial.result
    print(f"acknowledged {r.acked} ({r.acked_rows} rows), {said}; after MHA with relayproxy promote: lost {r.lost}, "
          f"partial {r.partial}, rows twice {r.duplicate_rows}, errant {r.errant}", flush=True)
    assert (r.lost, r.partial, r.duplicate_rows, r.errant, r.relay_dropped) == (0, 0, 0, [], [])
    assert r.replica_caught_up is True


MANAGER_START_TIMEOUT = 120  # s for masterha_manager's checks at start, until it pings the master
MANAGER_FAILOVER_TIMEOUT = 180  # s from the master's kill until masterha_manager has exited


def _host_goes_down_with(server, sshd: mha.PrivateSshd) -> None:
    """From now on `server.kill()` (kill -9, lab/lossless.py's load_and_kill) first stops `sshd`, the ssh server of
    `server`'s "host": the host goes down, ssh and MariaDB together."""
    kill = server.kill

    def host_down() -> None:
        sshd.stop()
        kill()

    server.kill = host_down


def test_mha_manager_detects_the_dead_master_and_fails_over_with_relayproxy_promote(mha_installed, tmp_path: Path):
    """masterha_manager, started before the load, notices the master's death by itself and fails over; its
    master_ip_failover_script is docs/hooks/mha_master_ip_failover. The master's host has an sshd of its own (MHA
    checks ssh to every server and the master's binlog directory at start), stopped at the kill: MHA cannot save the
    dead master's binlog, what the candidate lacked can come only from the relay. 0 acknowledged commits lost."""
    trial = _semi_sync_trial(tmp_path / "trial")
    ssh = master_ssh = manager = None
    try:
        overlay = mha.build_overlay(tmp_path / "mha-overlay")
        ssh = mha.PrivateSshd(tmp_path / "ssh", set_env={"PERL5LIB": str(overlay)}).start()
        master_ssh = mha.PrivateSshd(tmp_path / "ssh-master", set_env={"PERL5LIB": str(overlay)},
                                     accept_key=ssh.client_key).start()
        master_at, port = trial.candidate_link.port, trial.candidate.port
        cnf = _app_cnf(trial, tmp_path / "mha", ssh, str(HOOK),
                       {"ssh_port": master_ssh.port, "master_binlog_dir": str(trial.master.binlog_dir)})
        manager = mha.start_mha(["masterha_manager", f"--conf={cnf}", "--ignore_last_failover"], overlay=overlay,
                                output_file=tmp_path / "mha" / "manager.out", env=_hook_env(trial))
        # MHA/HealthCheck.pm wait_until_unreachable, once its checks at start have passed and it pings the master
        manager.wait_for("Ping(SELECT) succeeded, waiting until MySQL doesn't respond..", MANAGER_START_TIMEOUT)
        monitoring = manager.output()
        assert "All SSH connection tests passed successfully." in monitoring  # the master's sshd included
        assert "Binlog setting check done." in monitoring  # save_binary_logs --command=test on the master's host

        _host_goes_down_with(trial.master, master_ssh)
        trial.load_and_kill()
        # what the candidate had received when its link dropped, beside what the relay held (read only: MHA is
        # about to promote the candidate)
        received = replica_status(trial.candidate).get("Gtid_IO_Pos", "")
        relayed = str(trial.relays[0].status()["retrieved_gtid_set"])
        print(f"at the kill: acknowledged {trial.result.acked}; the candidate had received {received}, the relay "
              f"held {relayed}: {gtid_seqs(relayed).get(0, 0) - gtid_seqs(received).get(0, 0)} transactions of "
              "domain 0 the candidate lacked", flush=True)

        run = manager.wait(MANAGER_FAILOVER_TIMEOUT)
        assert run.returncode == 0, "masterha_manager's failover did not succeed"
        out = run.output
        # MHA/HealthCheck.pm ssh_check, run at the first failed ping (its ssh_check_command on the master's host)
        assert "HealthCheck: SSH to 127.0.0.1 is NOT reachable." in out
        detected = [
            "Connection failed 4 time(s)..",  # MHA/HealthCheck.pm wait_until_unreachable: its 4th failure
            "Master is not reachable from health checker!",  # MHA/HealthCheck.pm wait_until_unreachable
            f"Master 127.0.0.1(127.0.0.1:{master_at}) is not reachable!",  # MHA/MasterMonitor.pm
            "SSH is NOT reachable.",  # MHA/MasterMonitor.pm wait_until_master_is_unreachable
            "Master is down!",  # MHA/MasterMonitor.pm wait_until_master_is_dead, the other servers checked again
            "Got exit code 20 (Master dead).",  # MHA/MasterMonitor.pm main: masterha_manager then fails over
            # MHA/MasterFailover.pm save_master_binlog
            "Dead Master is not SSH reachable. Could not save it's binlogs.",
            "Resetting slave info succeeded.",  # MHA/Server.pm reset_slave_on_new_master, the last phase
            f"Master failover to 127.0.0.1(127.0.0.1:{port}) completed successfully.",  # MHA/MasterFailover.pm
        ]
        at = 0
        for line in detected:  # each of them, in this order
            found = out.find(line, at)
            assert found >= 0, f"masterha_manager did not print {line!r} (after {detected[:detected.index(line)]})"
            at = found
        document = _promote_document(out)
        assert document["fetched_count"] > 0, document  # the candidate lagged: the relay had what it lacked
        _assert_lossless(trial, f"the hook's promote fetched {document['fetched_count']} transactions from the "
                                f"relay; masterha_manager ran {run.seconds:.1f} s")
    finally:
        problems = run_every_step([step for step in (
            manager and manager.stop, master_ssh and master_ssh.stop, ssh and ssh.stop, trial.close) if step])
        assert not problems, problems


def test_mha_dead_master_switch_with_the_plain_repointing_hook_loses_what_the_candidate_lacked(mha_installed,
                                                                                                 tmp_path: Path):
    """The same run with lab/mha.py's hook, which only repoints the relay: the candidate is promoted as it was, the
    acknowledged commits it lacked are lost, and the relay refuses to follow it (it lacks what the relay holds)."""
    from relayproxy.lab.lossless import present

    trial = _semi_sync_trial_killed(tmp_path / "trial")
    try:
        hook = mha.hook_command(trial.relay_ports, admin_user=ADMIN_USER, admin_password=ADMIN_PASSWORD,
                                repl_user=REPL_USER, repl_password=REPL_PASSWORD, change="gtid")
        dead = _dead_switch(trial, tmp_path, hook, {})
        assert dead.returncode == 0, "MHA's dead-master switch did not succeed"
        assert f"relay 127.0.0.1:{trial.relay_ports[0]} repointed at 127.0.0.1:{trial.candidate.port}" in dead.output
        have, twice = present(trial.candidate)
        lost = [t for t in trial.acked if have.get(t, 0) == 0]
        print(f"acknowledged {len(trial.acked)}, after MHA with the repointing hook: lost {len(lost)} "
              f"(the candidate lacked {trial.result.direct_lost})", flush=True)
        assert len(lost) == trial.result.direct_lost > 0 and twice == 0
        error = wait_until("the relay to refuse the new master", lambda: trial.relays[0].status().get(
            "last_io_error") or None, 30, trial.relays[0].log_tail)
        assert "lacks GTIDs the relay holds" in error, error
    finally:
        trial.close()


def test_mha_dead_master_switch_fails_its_cleanup_when_promote_resets_the_new_master(mha_installed, tmp_path: Path):
    """Why the hook passes --no-reset-replica: the same hook without it. promote resets the candidate's replication
    (RESET SLAVE ALL); MHA's phase 5 (MHA/Server.pm reset_slave_info) then runs STOP SLAVE and waits for SHOW SLAVE
    STATUS to show both threads stopped (wait_until_slave_stops), but MHA/DBHelper.pm check_slave_status answers
    Status 1 ("I am not a slave") for the empty result, which wait_until_slave_stops takes for a failure. Nothing
    acknowledged is lost, but MHA exits 10, which an HA tool reads as a failed failover."""
    from relayproxy.lab.lossless import present

    trial = _semi_sync_trial_killed(tmp_path / "trial")
    try:
        text = HOOK.read_text()
        assert text.count(" --no-reset-replica --json") == 1
        hook = tmp_path / "hook-resetting"
        hook.write_text(text.replace(" --no-reset-replica --json", " --json"))
        hook.chmod(0o755)
        dead = _dead_switch(trial, tmp_path, str(hook), _hook_env(trial))
        assert dead.returncode == 10, "MHA's cleanup accepted a new master with its replication reset: see the hook"
        port = trial.candidate.port
        assert f"Checking slave status failed on 127.0.0.1(127.0.0.1:{port})." in dead.output
        assert "Stopping slave failed!" in dead.output and "Resetting slave info failed." in dead.output
        assert f"Master failover to 127.0.0.1(127.0.0.1:{port}) done, but recovery on slave partially failed." \
            in dead.output
        have, twice = present(trial.candidate)
        assert not [t for t in trial.acked if have.get(t, 0) == 0] and twice == 0
    finally:
        trial.close()
