"""Shared fixtures: the real binlog corpus and real local mariadbd servers (missing ones fail, never skip)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from relayproxy.lab.sandbox import FORBID_ENV, TEMPLATE_ENV, MariaDBSandbox, SandboxError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO_ROOT.parent / "shared" / "corpus" / "binlogs"

_sandboxes = pytest.StashKey[list[MariaDBSandbox]]()
_outcomes = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.fixture(scope="session", autouse=True)
def datadir_templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """New sandbox datadirs (here and in the demos and labs the tests start) copy one `mariadb-install-db` output
    per option set, kept in this session's temporary folder (lab/sandbox.py), instead of bootstrapping each."""
    before = os.environ.get(TEMPLATE_ENV)
    if before is None:
        os.environ[TEMPLATE_ENV] = str(tmp_path_factory.getbasetemp() / "datadir-templates")
    yield
    if before is None:
        os.environ.pop(TEMPLATE_ENV, None)


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """The real binlog corpus: $RELAYPROXY_CORPUS, else <repo>/../shared/corpus/binlogs."""
    configured = os.environ.get("RELAYPROXY_CORPUS")
    path = Path(configured).resolve() if configured else DEFAULT_CORPUS.resolve()
    if not (path / "manifest.json").is_file():
        source = "RELAYPROXY_CORPUS" if configured else "the default location"
        pytest.fail(
            f"binlog corpus not found: {path} (from {source}) has no manifest.json; "
            "set RELAYPROXY_CORPUS to the corpus folder (default <repo>/../shared/corpus/binlogs)",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def manifest(corpus_dir: Path) -> list[dict[str, Any]]:
    """manifest.json's entries, one per corpus file; each entry's "file" is relative to corpus_dir."""
    entries = json.loads((corpus_dir / "manifest.json").read_text())
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) and "file" in e for e in entries):
        pytest.fail(f"{corpus_dir / 'manifest.json'} is not a non-empty list of entries with a 'file'", pytrace=False)
    missing = [e["file"] for e in entries if not (corpus_dir / e["file"]).is_file()]
    if missing:
        pytest.fail(f"corpus files listed in manifest.json are missing from {corpus_dir}: {missing}", pytrace=False)
    return entries


@pytest.fixture
def mariadb(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., MariaDBSandbox]]:
    """Factory: `mariadb(name="master", **MariaDBSandbox options)` starts a server in its own temporary directory.

    Every server is stopped when the test ends; its directory is removed if the test passed and kept (with the
    error log's tail in the report) if it failed. A server that cannot start fails the test with the reason.
    """
    started: list[MariaDBSandbox] = []
    request.node.stash[_sandboxes] = started

    def start(name: str = "master", **options: Any) -> MariaDBSandbox:
        sandbox = MariaDBSandbox(tmp_path_factory.mktemp(name), **options)
        started.append(sandbox)
        try:
            sandbox.start()
        except SandboxError as exc:
            problem = str(exc)
        else:
            return sandbox
        pytest.fail(f"could not start mariadbd {name!r} for this test: {problem}", pytrace=False)

    yield start

    problems = []
    for sandbox in reversed(started):
        try:
            sandbox.stop()
        except Exception as exc:  # keep stopping the others; report all at the end
            problems.append(f"{sandbox!r}: {exc}")
    if problems:
        pytest.fail("could not stop mariadbd: " + "; ".join(problems), pytrace=False)
    outcomes = request.node.stash.get(_outcomes, {})
    if all(report.passed for report in outcomes.values()):
        for sandbox in started:
            shutil.rmtree(sandbox.basedir, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests that start servers carry the `server` marker (registered in setup.cfg), so `-m "not server"` works.
    for item in items:
        if "mariadb" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.server)


# -- a test that starts what its markers do not say fails ---------------------------------------------------------
# `make test-quick` (-m "not server and not spark and ...") trusts the markers, so they are checked: while a test runs
# (setup, call, teardown), a program it starts from this process is looked up here, and one that needs a marker the
# test lacks fails the test (the program is not started). A mariadbd started by a child process (the demo, a
# benchmark, the relay as a process) is refused by lab/sandbox.py itself, through FORBID_ENV set below.
PROGRAM_MARKERS = {
    "mariadbd": "server", "mysqld": "server", "mariadb-install-db": "server", "mysql_install_db": "server",
    "spark-submit": "spark", "java": "spark",
    "docker": "docker", "docker-compose": "docker",
    "sshd": "mha", "masterha_manager": "mha", "masterha_check_repl": "mha", "masterha_master_switch": "mha",
}
_running: pytest.Item | None = None
_violations = pytest.StashKey[list[str]]()


def _programs(executable: Any, args: Any) -> set[str]:
    words: list[Any] = [executable]
    if isinstance(args, (str, bytes, os.PathLike)):
        words.append(args)
    elif args:
        args = list(args)
        words.append(args[0])
        if len(args) >= 3 and os.path.basename(os.fsdecode(args[0])) in ("sh", "bash") and args[1] == "-c":
            words.extend(os.fsdecode(args[2]).split())  # shell=True: the command line's words
    return {os.path.basename(os.fsdecode(w)) for w in words if w}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen" or _running is None:
        return
    item = _running
    for program in _programs(args[0], args[1]):
        marker = PROGRAM_MARKERS.get(program)
        if marker is not None and item.get_closest_marker(marker) is None:
            problem = f"{item.nodeid} starts {program} but has no @pytest.mark.{marker} (setup.cfg lists the markers)"
            item.stash.setdefault(_violations, []).append(problem)
            raise RuntimeError(problem)


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_audit)  # audit hooks cannot be removed; with no test running it returns at once


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _running
    forbid_before = os.environ.get(FORBID_ENV)
    if item.get_closest_marker("server") is None:
        os.environ[FORBID_ENV] = f"{item.nodeid} has no @pytest.mark.server"
    else:
        os.environ.pop(FORBID_ENV, None)
    _running = item
    try:
        return (yield)
    finally:
        _running = None
        if forbid_before is None:
            os.environ.pop(FORBID_ENV, None)
        else:
            os.environ[FORBID_ENV] = forbid_before


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report: pytest.TestReport = yield
    problems = item.stash.get(_violations, [])
    outcomes = item.stash.setdefault(_outcomes, {})
    if problems and report.when == "teardown" and not any(r.failed for r in (*outcomes.values(), report)):
        # The test caught the RuntimeError the audit hook raised: the marker is missing all the same.
        report.outcome = "failed"
        report.longrepr = "\n".join(problems)
    outcomes[report.when] = report
    if report.failed and report.when == "call":
        for sandbox in item.stash.get(_sandboxes, []):
            if not sandbox.error_log.exists():
                continue  # never got as far as starting; the failure itself says why
            report.sections.append(
                (f"mariadbd {sandbox.basedir.name} error log ({sandbox.error_log})", sandbox.error_log_tail(30))
            )
    return report
