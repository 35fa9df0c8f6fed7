"""The MHA hook docs/failover.md shows is the file tests/scenarios/test_mha.py gives MHA, byte for byte, and it
passes MHA's arguments to `relayproxy promote` as the doc says (a stand-in relayproxy records its argv)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "docs" / "hooks" / "mha_master_ip_failover"
MARKER = "<!-- docs/hooks/mha_master_ip_failover -->\n```sh\n"


def test_the_doc_shows_the_hook_byte_for_byte():
    doc = (ROOT / "docs" / "failover.md").read_text()
    assert doc.count(MARKER) == 1, "docs/failover.md should show the MHA hook once, after its marker"
    start = doc.index(MARKER) + len(MARKER)
    block = doc[start:doc.index("```\n", start)]
    assert block == HOOK.read_text(), "docs/failover.md's MHA hook differs from docs/hooks/mha_master_ip_failover"


def test_the_test_gives_mha_that_file():
    text = (ROOT / "tests" / "scenarios" / "test_mha.py").read_text()
    assert 'HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "mha_master_ip_failover"' in text
    assert "_dead_switch(trial, tmp_path, str(HOOK), _hook_env(trial))" in text
    assert os.access(HOOK, os.X_OK)


def _run(tmp_path: Path, *args: str) -> tuple[int, list[str]]:
    fake = tmp_path / "relayproxy"
    argv = tmp_path / "argv"
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > {argv}\nexit "${{FAKE_EXIT:-0}}"\n')
    fake.chmod(0o755)
    env = {**os.environ, "RELAYPROXY_HOOK_RELAYPROXY": str(fake), "RELAYPROXY_HOOK_RELAYS": "r1:3307 r2:3308"}
    env.update(dict(a.split("=", 1) for a in args if a.startswith("FAKE_EXIT=")))
    proc = subprocess.run(["sh", str(HOOK), *(a for a in args if not a.startswith("FAKE_EXIT="))], env=env,
                          capture_output=True, text=True, timeout=30)
    return proc.returncode, argv.read_text().splitlines() if argv.exists() else []


def test_the_hook_runs_promote_at_start_only(tmp_path):
    for command in ("status", "stop", "stopssh"):
        assert _run(tmp_path, f"--command={command}", "--orig_master_host=db1") == (0, [])
    code, argv = _run(tmp_path, "--command=start", "--ssh_user=root", "--orig_master_host=db1",
                      "--new_master_host=db2", "--new_master_ip=10.0.0.2", "--new_master_port=3306",
                      "--new_master_user='mha'", "--new_master_password=secret")
    assert code == 0
    assert argv == ["promote", "--candidate", "db2:3306", "--candidate-user", "mha", "--candidate-password-file",
                    "/etc/relayproxy/db.pw", "--relay", "r1:3307", "--relay", "r2:3308", "--relay-user", "admin",
                    "--relay-password-file", "/etc/relayproxy/relay.pw", "--repl-user", "repl",
                    "--repl-password-file", "/etc/relayproxy/repl.pw", "--timeout", "300", "--no-reset-replica",
                    "--json"]
    assert "secret" not in argv  # MHA's password argument is never passed on
    # promote's exit code is the hook's: MHA stops the failover on a non-zero one
    assert _run(tmp_path, "--command=start", "--new_master_host=db2", "--new_master_port=3306", "FAKE_EXIT=3")[0] == 3
    assert _run(tmp_path, "--command=bogus")[0] == 1
