"""The package's layers, checked from the source: imports go only downward, nothing imports in a circle, and the
runtime never imports the lab (docs/architecture.md draws the same picture).

Every ``import`` / ``from ... import`` in ``relayproxy/`` counts, at module level or inside a function, except
those under ``if TYPE_CHECKING:`` (annotations only, never executed).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "relayproxy"

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


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The relayproxy modules `path` imports (a name imported from a package counts as its submodule if one exists)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [target]
            targets += [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
        else:
            continue
        for target in targets:
            if target.startswith("relayproxy") and target != me:
                found.add(target)
    return found


def build_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): {t for t in imports_of(p, modules) if t in modules} for p in paths}


GRAPH = build_graph()


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


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the list of modules around it, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in colour:
                continue
            if colour[nxt] == GREY:
                return stack[stack.index(nxt):] + [nxt]
            if colour[nxt] == WHITE and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        colour[node] = BLACK
        return None

    for start in sorted(graph):
        if colour[start] == WHITE and (cycle := visit(start)):
            return cycle
    return None


def _without_package_inits(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's __init__ re-exporting its modules is not a circle with them: Python imports the package first."""
    packages = {m for m in graph if (PACKAGE.parent / m.replace(".", "/") / "__init__.py").exists()}
    return {m: {t for t in ts if not (t in packages and m.startswith(t + "."))} for m, ts in graph.items()}


def test_no_import_circles_anywhere_in_the_package():
    assert find_cycle(_without_package_inits(GRAPH)) is None


@pytest.mark.parametrize("mutation", ["upward", "circle", "lab"])
def test_the_checks_catch_what_they_are_for(mutation):
    """Each rule fails on a graph that breaks it (so an empty answer above means something)."""
    graph = {m: set(ts) for m, ts in GRAPH.items()}
    if mutation == "upward":
        graph["relayproxy.wire.packets"].add("relayproxy.downstream.context")
        assert upward_imports(graph) == ["relayproxy.wire.packets -> relayproxy.downstream.context"]
    elif mutation == "circle":
        graph["relayproxy.binlog.constants"].add("relayproxy.binlog.reader")
        cycle = find_cycle(_without_package_inits(graph))
        assert cycle is not None and "relayproxy.binlog.constants" in cycle
    else:
        graph["relayproxy.upstream.session"].add("relayproxy.lab.sandbox")
        assert lab_imports(graph) == ["relayproxy.upstream.session -> relayproxy.lab.sandbox"]


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
