"""The package's layers, checked from the source: imports go only downward, nothing imports in a circle, and the
runtime never imports the lab (docs/architecture.md draws the same picture).

Every ``import`` / ``from ... import`` in ``relayproxy/`` counts, at module level or inside a function. The layers
leave out those under ``if TYPE_CHECKING:`` (annotations only, never executed); the circles count them too, and a
``from package import name`` depends on the package's ``__init__`` (its re-exports), not only on the submodule.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "relayproxy"

# Lower numbers are lower layers; a module may import its own layer (same top-level folder) or a lower one.
# upstream and downstream share a level but are separate rooms: neither imports the other.
LAYERS = {
    "relayproxy": 0,  # the package root: __version__ only
    "relayproxy.log": 0,  # every layer logs; imports nothing of relayproxy
    "relayproxy.binlog": 1,
    "relayproxy.wire": 2,
    "relayproxy.relay": 3,
    "relayproxy.upstream": 4,
    "relayproxy.downstream": 4,
    "relayproxy.ops": 5,
    "relayproxy.commands": 6,
    "relayproxy.lab": 7,
}
# The one runtime module allowed to use the lab: `relayproxy demo` runs the lab's failure story by design.
LAB_USERS = {"relayproxy.commands.demo"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def room(module: str) -> str:
    """The layer key of a module: its top-level folder, or the root / log module."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
            if name == "TYPE_CHECKING":
                for child in node.body:
                    skip.update(id(n) for n in ast.walk(child))
    return skip


def imports_of(path: Path, modules: set[str], *, annotations: bool = False) -> set[str]:
    """The relayproxy modules `path` imports (see ``imports_in``)."""
    return imports_in(path.read_text(encoding="utf-8"), module_name(path), package=path.name == "__init__.py",
                      modules=modules, annotations=annotations)


def import_target(node: ast.ImportFrom, here: str) -> str:
    """The module a ``from ... import`` reads, its dots resolved against ``here`` (the importing package)."""
    if not node.level:
        return node.module or ""
    base = here.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_in(source: str, me: str, *, package: bool, modules: set[str], annotations: bool = False) -> set[str]:
    """The relayproxy modules that module `me` (a package's ``__init__`` when ``package``) imports in `source`.
    ``from package import name`` depends on the package (its ``__init__``) and, when ``name`` is a submodule, on
    it too. ``annotations``: count imports under ``if TYPE_CHECKING:``, and a module importing from itself (a
    package's ``__init__`` reading its own re-exports) as a self-loop."""
    tree = ast.parse(source)
    skip = set() if annotations else _type_checking_nodes(tree)
    here = me if package else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
            if annotations and me in targets:
                found.add(me)
        elif isinstance(node, ast.ImportFrom):
            target = import_target(node, here)
            submodules = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
            if annotations and target == me and not submodules:
                found.add(me)  # names read back from its own, half-initialised namespace
            targets = [target, *submodules]
        else:
            continue
        for target in targets:
            if target.startswith("relayproxy") and target != me:
                found.add(target)
    return found


def build_graph(*, annotations: bool = False) -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): {t for t in imports_of(p, modules, annotations=annotations) if t in modules}
            for p in paths}


GRAPH = build_graph()
FULL_GRAPH = build_graph(annotations=True)  # for the circles: TYPE_CHECKING imports and self-loops count


def test_every_module_belongs_to_a_layer():
    assert not [m for m in GRAPH if room(m) not in LAYERS], "add the new folder to LAYERS and docs/architecture.md"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a higher layer, or of a sibling room on the same layer (upstream <-> downstream)."""
    bad = []
    for module, targets in graph.items():
        for target in targets:
            mine, theirs = room(module), room(target)
            if mine == theirs or target == "relayproxy" or (theirs == "relayproxy.lab" and module in LAB_USERS):
                continue
            if LAYERS[theirs] >= LAYERS[mine]:
                bad.append(f"{module} -> {target}")
    return sorted(bad)


def lab_imports(graph: dict[str, set[str]]) -> list[str]:
    """Runtime modules that import the lab."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if room(t) == "relayproxy.lab" and room(m) != "relayproxy.lab" and m not in LAB_USERS)


def test_layers_import_only_downward():
    assert upward_imports(GRAPH) == []


def test_the_runtime_never_imports_the_lab():
    assert lab_imports(GRAPH) == []


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle: the strongly connected components of more than one module (Tarjan's algorithm), and
    the modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                circles.append(sorted(component))

    for start in sorted(graph):
        if start not in index:
            visit(start)
    return sorted(circles)


def describe_circle(graph: dict[str, set[str]], members: list[str]) -> str:
    inside = set(members)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & inside))}" for m in members)


def test_no_import_circles_anywhere_in_the_package():
    """Counting TYPE_CHECKING imports and packages' __init__ re-exports: a circle is a module graph nobody can
    read bottom-up, even when Python happens to import it."""
    circles = import_circles(FULL_GRAPH)
    assert not circles, "import circles: " + " | ".join(describe_circle(FULL_GRAPH, c) for c in circles)


@pytest.mark.parametrize("mutation", ["upward", "circle", "annotation", "init", "self", "lab"])
def test_the_checks_catch_what_they_are_for(mutation):
    """Each rule fails on a graph that breaks it (so an empty answer above means something)."""
    graph = {m: set(ts) for m, ts in FULL_GRAPH.items()}
    if mutation == "upward":
        graph = {m: set(ts) for m, ts in GRAPH.items()}
        graph["relayproxy.wire.packets"].add("relayproxy.downstream.context")
        assert upward_imports(graph) == ["relayproxy.wire.packets -> relayproxy.downstream.context"]
    elif mutation == "circle":
        graph["relayproxy.binlog.constants"].add("relayproxy.binlog.reader")
        assert any("relayproxy.binlog.constants" in c and "relayproxy.binlog.reader" in c
                   for c in import_circles(graph))
    elif mutation == "annotation":  # one side only under TYPE_CHECKING
        source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .workers import SenderPool\n"
        found = imports_of_source(source, "relayproxy.downstream.transport")
        assert "relayproxy.downstream.workers" in found
        graph["relayproxy.downstream.transport"] |= found
        assert ["relayproxy.downstream.transport", "relayproxy.downstream.workers"] in import_circles(graph)
    elif mutation == "init":  # a submodule importing a sibling through its package's __init__
        found = imports_of_source("from . import closed_files\n", "relayproxy.relay.store")
        assert found == {"relayproxy.relay", "relayproxy.relay.closed_files"}
        graph["relayproxy.relay.store"] |= found
        assert any({"relayproxy.relay", "relayproxy.relay.store"} <= set(c) for c in import_circles(graph))
    elif mutation == "self":  # a package's __init__ reading its own re-exports
        found = imports_of_source("from relayproxy.relay import Horizon\n", "relayproxy.relay", package=True)
        graph["relayproxy.relay"] |= found
        assert ["relayproxy.relay"] in import_circles(graph)
    else:
        graph = {m: set(ts) for m, ts in GRAPH.items()}
        graph["relayproxy.upstream.session"].add("relayproxy.lab.sandbox")
        assert lab_imports(graph) == ["relayproxy.upstream.session -> relayproxy.lab.sandbox"]


def imports_of_source(source: str, module: str, *, package: bool = False) -> set[str]:
    """``imports_in`` for a made-up source text of ``module``, with the circles' rules (the checks' own test)."""
    return imports_in(source, module, package=package, modules=set(FULL_GRAPH), annotations=True)


def test_every_package_says_what_it_owns():
    missing = [str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("__init__.py")
               if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]
    assert missing == []


REPO = PACKAGE.parent


def test_readme_layout_and_architecture_doc_match_the_tree():
    """Every folder of the package is in the README's layout; every module is named in docs/architecture.md,
    and every module file the document names exists."""
    readme = (REPO / "README.md").read_text(encoding="utf-8").split("## Layout", 1)[1].split("\n## ", 1)[0]
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    folders = sorted({p.parent.relative_to(PACKAGE).parts[0] for p in PACKAGE.rglob("*/__init__.py")})
    assert [f for f in folders if f"  {f}/" not in readme] == []
    modules = [p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    assert sorted(str(p.relative_to(PACKAGE)) for p in modules if f"`{p.name}`" not in doc) == []
    named = set(re.findall(r"`([a-z_]+\.py)`", doc))
    existing = {p.name for p in PACKAGE.rglob("*.py")}
    assert sorted(named - existing) == []


# -- names shared between modules are public -----------------------------------------------------------------------
# A leading underscore says "only this module uses it". A name another module of the package imports is part of a
# seam and is named as such; the compiled extensions (`_sendbatch`, `_fsync`) are modules, not names, and a
# third-party library's private name (pymysql's `_auth`) is that library's business.
PRIVATE_ALLOWED = {"_sendbatch", "_fsync"}


def private_imports_in(source: str, me: str, *, package: bool) -> list[str]:
    tree = ast.parse(source)
    here = me if package else me.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        target = import_target(node, here)
        if not target.startswith("relayproxy"):
            continue
        for alias in node.names:
            name = alias.name
            if name.startswith("_") and not name.startswith("__") and name not in PRIVATE_ALLOWED:
                found.append(f"{me} imports {name} from {target} (line {node.lineno})")
    return found


def test_no_module_imports_another_modules_private_name():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += private_imports_in(path.read_text(encoding="utf-8"), module_name(path),
                                    package=path.name == "__init__.py")
    assert not found, "private names used across modules (make them public, or keep them in one module):\n" + \
        "\n".join(found)


def test_the_private_import_check_sees_relative_and_absolute_imports():
    source = "from .files import _U32, header\nfrom relayproxy.wire import _x\nfrom . import _fsync\nimport pymysql\n"
    assert private_imports_in(source, "relayproxy.relay.store", package=False) == [
        "relayproxy.relay.store imports _U32 from relayproxy.relay.files (line 1)",
        "relayproxy.relay.store imports _x from relayproxy.wire (line 2)",
    ]
