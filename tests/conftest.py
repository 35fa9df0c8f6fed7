"""Shared fixtures: the real binlog corpus and real local mariadbd servers (missing ones fail, never skip)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from relayproxy.lab.sandbox import TEMPLATE_ENV, MariaDBSandbox, SandboxError

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report: pytest.TestReport = yield
    item.stash.setdefault(_outcomes, {})[report.when] = report
    if report.failed and report.when == "call":
        for sandbox in item.stash.get(_sandboxes, []):
            if not sandbox.error_log.exists():
                continue  # never got as far as starting; the failure itself says why
            report.sections.append(
                (f"mariadbd {sandbox.basedir.name} error log ({sandbox.error_log})", sandbox.error_log_tail(30))
            )
    return report
