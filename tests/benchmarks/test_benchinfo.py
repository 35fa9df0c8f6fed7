"""benchmarks/benchinfo.py: a results header marks the tree dirty for uncommitted code only, and names the files."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _load_benchinfo():
    spec = importlib.util.spec_from_file_location("benchinfo", REPO_ROOT / "benchmarks" / "benchinfo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


benchinfo = _load_benchinfo()


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    files = {
        "relayproxy/__init__.py": "",
        "relayproxy/relay/store.py": "x = 1\n",
        "benchmarks/fanout.py": "print(1)\n",
        "benchmarks/fanout_notes.md": "notes\n",
        "benchmarks/results/fanout.md": "results\n",
        "benchmarks/results/spark_parse_cost/summary.md": "results\n",
        "setup.cfg": "[metadata]\n",
        "pyproject.toml": "[build-system]\n",
        "README.md": "readme\n",
        "docs/fanout.md": "docs\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    return root


def test_results_notes_and_docs_never_mark_the_tree_dirty(repo):
    head = git(repo, "rev-parse", "--short", "HEAD").strip()
    assert benchinfo.commit_info(repo) == head
    (repo / "benchmarks/results/fanout.md").write_text("new results\n")
    (repo / "benchmarks/results/spark_parse_cost/summary.md").unlink()
    (repo / "benchmarks/results/relay_catchup.png").write_bytes(b"\x89PNG")  # untracked results
    (repo / "benchmarks/fanout_notes.md").write_text("new findings\n")
    (repo / "benchmarks/failover_time_notes.md").write_text("untracked notes\n")
    (repo / "README.md").write_text("new headline\n")
    (repo / "docs/fanout.md").write_text("new docs\n")
    git(repo, "add", "benchmarks/results/fanout.md")  # staged results too
    assert benchinfo.dirty_code_files(repo) == []
    assert benchinfo.commit_info(repo) == head


def test_code_changes_mark_the_tree_dirty_and_are_named(repo):
    head = git(repo, "rev-parse", "--short", "HEAD").strip()
    (repo / "benchmarks/results/fanout.md").write_text("new results\n")  # not named below
    (repo / "relayproxy/relay/store.py").write_text("x = 2\n")  # modified
    (repo / "relayproxy/relay/horizon.py").write_text("y = 1\n")  # untracked
    (repo / "benchmarks/fanout.py").write_text("print(2)\n")
    (repo / "setup.cfg").write_text("[metadata]\nname = x\n")
    git(repo, "add", "setup.cfg")  # staged
    git(repo, "mv", "pyproject.toml", "pyproject.toml.old")  # renamed away: pyproject.toml changed
    assert benchinfo.dirty_code_files(repo) == [
        "benchmarks/fanout.py", "pyproject.toml", "relayproxy/relay/horizon.py", "relayproxy/relay/store.py",
        "setup.cfg",
    ]
    assert benchinfo.commit_info(repo) == (
        f"{head} + uncommitted changes to code: benchmarks/fanout.py, pyproject.toml, relayproxy/relay/horizon.py, "
        "relayproxy/relay/store.py, setup.cfg"
    )


def test_many_dirty_files_are_counted_not_all_listed(repo):
    for i in range(benchinfo.SHOWN_DIRTY + 3):
        (repo / f"relayproxy/m{i:02d}.py").write_text("")
    info = benchinfo.commit_info(repo)
    assert info.count("relayproxy/m") == benchinfo.SHOWN_DIRTY and info.endswith(" and 3 more")


def test_pycache_is_not_code(repo):
    (repo / "relayproxy/__pycache__").mkdir()
    (repo / "relayproxy/__pycache__/store.cpython-312.pyc").write_bytes(b"\0")  # no .gitignore in this repo
    assert benchinfo.dirty_code_files(repo) == []


def test_not_a_repository_is_an_error_not_a_clean_tree(tmp_path):
    with pytest.raises(subprocess.CalledProcessError):
        benchinfo.dirty_code_files(tmp_path)


def test_machine_info_records_commit_info():
    assert benchinfo.machine_info()["relayproxy commit"] == benchinfo.commit_info()


def test_alternating_orders_and_median_range():

    assert benchinfo.alternating_orders(3, ["relay", "peer"]) == [["relay", "peer"], ["peer", "relay"], ["relay", "peer"]]
    seen = benchinfo.run_alternating(4, ["a", "b"], lambda order, i: {"first": order[0], "i": i})
    assert [r["first"] for r in seen] == ["a", "b", "a", "b"] and seen[1]["order"] == "b then a"
    assert benchinfo.median_range([3, 1, 2]) == (2, 1, 3)
    assert benchinfo.median_range([4, 1, 2, 3]) == (2.5, 1, 4)
    assert benchinfo.fmt_median_range([40.5, 38.1, 41.2], "{:.1f}", "x") == "40.5x (range 38.1x - 41.2x, 3 runs)"
    assert benchinfo.verdict([40.5, 38.1, 41.2], 40).startswith("met, within noise")
    assert benchinfo.verdict([38.5, 38.1, 40.2], 40).startswith("MISSED, within noise")
    assert benchinfo.verdict([45, 44, 46], 40) == "met" and benchinfo.verdict([35, 34, 36], 40) == "MISSED"
    assert benchinfo.verdict([300, 290, 310], 500, higher_is_better=False) == "met"
    assert benchinfo.verdict([480, 450, 520], 500, higher_is_better=False).startswith("met, within noise")


def test_header_block_names_commit_cleanliness_and_repeats():

    machine = {"cpu": "X", "cores": "2", "kernel": "k", "python": "3.11", "date": "d", "relayproxy commit": "abc1234"}
    text = "\n".join(benchinfo.header_block("benchmarks/parse_cost.py", ["--json"], machine, runs=3))
    assert "commit: abc1234; tree: clean" in text and "3 runs" in text and "parse_cost.py --json" in text
    machine["relayproxy commit"] = "abc1234 + uncommitted changes to code: relayproxy/x.py"
    text = "\n".join(benchinfo.header_block("benchmarks/parse_cost.py", [], machine, runs=3))
    assert "tree: DIRTY: uncommitted changes to code: relayproxy/x.py" in text


def test_header_block_says_a_single_run_is_one_run():
    machine = {"relayproxy commit": "abc1234"}
    lines = benchinfo.header_block("benchmarks/soak.py", ["--minutes", "1"], machine, runs=1, what="a seeded soak")
    repeats = next(line for line in lines if line.startswith("- repeats:"))
    assert repeats == "- repeats: a single run; a seeded soak: no median or range, the figures are that run's"
    assert "alternated" not in "\n".join(lines)
    many = next(line for line in benchinfo.header_block("x.py", [], machine, runs=3) if line.startswith("- repeats:"))
    assert "3 runs, the order of relay and peer alternated" in many and "median with the range" in many
    # A report rendered again from saved figures names the command that measured them.
    assert "python benchmarks/soak.py --minutes 12" in benchinfo.header_block(
        "benchmarks/soak.py", [], machine, runs=1, command="python benchmarks/soak.py --minutes 12")
