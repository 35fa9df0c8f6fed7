"""docs/architecture.md against the tree: every module it names exists where it says, each once in the folder walk,
and every module of the package is in the walk.

Names are read from `backticks` and code blocks. A path with a folder (`relay/store.py`, `downstream/dump/chunks.py`,
`relayproxy/log.py`, `tests/downstream/test_dump_chunks.py`) must be a file of the repository ending in that path. In "What each
folder owns", a bare name (`store.py`) belongs to the folder of its paragraph (**relay/**), or to the subfolder a
list item opens with (`` `sql/` the statements: `parser.py` ... ``); anywhere else it must exist somewhere in the
package, tests/ or benchmarks/. A code block (the diagrams) writes every module with its folder, so that a module
drawn in the wrong place fails too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "relayproxy"
SEARCHED = ("relayproxy", "tests", "benchmarks")

_MODULE = re.compile(r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)*[A-Za-z_]\w*\.py)\b")
_FOLDER_HEAD = re.compile(r"^\*\*(\w+)/\*\*")
_ITEM_FOLDER = re.compile(r"^- `(\w+)/`")

TEXT = DOC.read_text(encoding="utf-8")


def _files() -> list[str]:
    found = []
    for top in SEARCHED:
        found += [p.relative_to(REPO).as_posix() for p in (REPO / top).rglob("*.py") if "__pycache__" not in p.parts]
    found += [p.name for p in REPO.glob("*.py")]
    return found


FILES = _files()


def _exists(name: str) -> bool:
    return any(f == name or f.endswith("/" + name) for f in FILES)


def _names(text: str, *, code_only: bool = False) -> list[str]:
    """Module names in backticks and in code blocks (a diagram names modules without backticks)."""
    names: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if code_only and not fenced:
            continue
        spans = [line] if fenced else re.findall(r"`([^`]+)`", line)
        for span in spans:
            names += _MODULE.findall(span)
    return names


def _folder_walk() -> list[tuple[str, str, int]]:
    """(folder under relayproxy/, name, line) for each bare name in "What each folder owns" (a name written with
    its folder there is a reference to a module described elsewhere, checked as a path)."""
    section = TEXT.split("## What each folder owns", 1)[1].split("\n## ", 1)[0]
    start = TEXT[: TEXT.index("## What each folder owns")].count("\n") + 1
    out = []
    folder = sub = None
    for number, line in enumerate(section.splitlines(), start):
        head = _FOLDER_HEAD.match(line)
        if head:
            folder, sub = head.group(1), None
        elif not line.strip():
            folder = sub = None
        elif line.startswith("- "):
            item = _ITEM_FOLDER.match(line)
            sub = item.group(1) if item else None
        if folder is None:
            continue
        for span in re.findall(r"`([^`]+)`", line):
            for name in _MODULE.findall(span):
                if "/" not in name:
                    out.append((f"{folder}/{sub}" if sub else folder, name, number))
    return out


WALK = _folder_walk()


def test_the_doc_names_modules_at_all():
    assert len(_names(TEXT)) > 80 and len(WALK) > 80, "the patterns no longer find the doc's module names"


@pytest.mark.parametrize("name", sorted({n for n in _names(TEXT) if "/" in n}))
def test_every_path_the_doc_names_exists(name):
    assert _exists(name), f"docs/architecture.md names {name}, which is no file of the repository"


@pytest.mark.parametrize("name", sorted({n for n in _names(TEXT) if "/" not in n}))
def test_every_bare_module_name_exists_somewhere(name):
    assert _exists(name), f"docs/architecture.md names {name}, which is no module of the package, tests or benchmarks"


def test_the_diagrams_write_each_module_with_its_folder():
    bare = sorted({n for n in _names(TEXT, code_only=True) if "/" not in n})
    assert not bare, f"docs/architecture.md's code blocks name {bare} without a folder: write e.g. relay/store.py"


def test_each_module_in_the_folder_walk_is_in_that_folder():
    wrong = [f"line {line}: {name} under {folder}/" for folder, name, line in WALK if not (PACKAGE / folder / name).is_file()]
    assert not wrong, "docs/architecture.md places modules where they are not: " + "; ".join(wrong)


def test_the_folder_walk_names_each_module_once():
    seen: dict[str, int] = {}
    twice = []
    for folder, name, line in WALK:
        key = f"{folder}/{name}"
        if key in seen:
            twice.append(f"{key} (lines {seen[key]} and {line})")
        seen.setdefault(key, line)
    assert not twice, "docs/architecture.md describes a module twice in 'What each folder owns': " + "; ".join(twice)


def test_every_module_of_the_package_is_in_the_doc():
    named = {n for n in _names(TEXT)}
    walked = {f"{folder}/{name}" for folder, name, _ in WALK}
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" or "__pycache__" in path.parts:
            continue
        if rel not in walked and not any(rel == n or rel.endswith("/" + n) or f"relayproxy/{rel}" == n for n in named
                                         if "/" in n):
            missing.append(rel)
    assert not missing, "modules docs/architecture.md does not place in its folder walk: " + ", ".join(missing)


# -- the tests' own layout ------------------------------------------------------------------------------------------
_TEST_FOLDER_ROW = re.compile(r"^\| `tests/(\w+)/` \|", re.M)
TESTS = REPO / "tests"


def test_tests_are_laid_out_by_layer_as_the_doc_says():
    """No test module sits loose in tests/; every folder of tests/ is a package the doc's "Tests, by layer" table
    lists, and every folder the table lists exists; each layer of the package has its folder."""
    loose = sorted(p.name for p in TESTS.glob("*.py") if p.name not in ("__init__.py", "conftest.py"))
    assert not loose, f"test modules outside a layer's folder: {loose}"
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    listed = set(_TEST_FOLDER_ROW.findall(TEXT))
    assert folders == listed, f"tests/ has {sorted(folders - listed)} not in the doc's table; the table lists " \
                              f"{sorted(listed - folders)} that tests/ lacks"
    assert all((TESTS / name / "__init__.py").is_file() for name in folders), "each tests/ folder is a package"
    layers = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert layers <= folders, f"layers of the package without a tests/ folder: {sorted(layers - folders)}"
