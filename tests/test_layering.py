"""The package's import structure: the data path flows one way.

Every module of ``src/pystrom`` is parsed (not imported) and its imports resolved to modules of the
package. Three rules:

1. Module-level imports form no cycle anywhere in the package.
2. Among the modules of the PostgreSQL path (``pystrom.io.postgres``), no import at any depth, inside
   functions included, leads back to a module it came from: plan -> stream -> decode -> assemble, one way.
3. Elsewhere an import inside a function may close a loop only where a convenience method reaches up
   a layer (``Table.export()`` importing ``pystrom.ipc``); such an import says so on its line, with a
   ``# up:`` comment naming why, so every loop in the package is written down where it is made.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import pystrom

# The source tree next to the tests (an installed copy may be older than the checkout).
_SOURCE = Path(__file__).resolve().parents[1] / "src" / "pystrom"
ROOT = _SOURCE if _SOURCE.is_dir() else Path(pystrom.__file__).parent
PACKAGE = "pystrom"


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    top_level: bool  # executed when the module is imported (not inside a function)
    comment: str


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PACKAGE, *parts])


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_extension(name: str) -> bool:
    """A compiled module of the package (pystrom._core), which imports nothing of ours."""
    folder = ROOT.joinpath(*name.split(".")[1:-1])
    return (
        any(folder.glob(name.rsplit(".", 1)[1] + ".*.so")) or folder.joinpath(name.rsplit(".", 1)[1] + ".pyi").exists()
    )


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _resolve(importer: str, node: ast.ImportFrom | ast.Import, modules: dict[str, Path]) -> list[tuple[str, bool]]:
    """The package modules one import statement names: (module, top_level_flag filled by caller)."""
    found: list[str] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                found.append(alias.name)
    else:
        if node.level:
            base = importer if _is_package(importer, modules) else importer.rsplit(".", 1)[0]
            for _ in range(node.level - 1):
                base = base.rsplit(".", 1)[0]
            target = f"{base}.{node.module}" if node.module else base
        else:
            target = node.module or ""
        if not (target == PACKAGE or target.startswith(PACKAGE + ".")):
            return []
        for alias in node.names:  # `from pkg import submodule` names the submodule
            sub = f"{target}.{alias.name}"
            if sub in modules:
                found.append(sub)
            elif not _is_extension(sub):  # a name defined by the package's __init__
                found.append(target)
    return [(m, True) for m in dict.fromkeys(found) if m in modules]


def _edges() -> list[Edge]:
    modules = _modules()
    edges = []
    for name, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source, str(path))

        def visit(node: ast.AST, top: bool, name: str = name, lines: list[str] = lines) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    comment = lines[child.lineno - 1].partition("#")[2].strip()
                    for target, _ in _resolve(name, child, modules):
                        if target != name:
                            edges.append(Edge(name, target, child.lineno, top, comment))
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(child, False)
                elif isinstance(child, ast.If) and _is_type_checking(child.test):
                    continue  # typing-only imports never run
                else:
                    visit(child, top)

        visit(tree, True)
    return edges


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return False


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, as its modules in order, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def _graph(edges: list[Edge], keep=lambda e: True) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for e in edges:
        if keep(e):
            graph.setdefault(e.source, set()).add(e.target)
    return graph


def _is_package_init_reexport(edge: Edge, modules: dict[str, Path]) -> bool:
    """A package's __init__ importing its own children is how public names are re-exported; the
    child importing a sibling through the parent package would be the loop, and that edge counts."""
    return _is_package(edge.source, modules) and edge.target.startswith(edge.source + ".")


def test_the_parser_sees_the_package():
    edges = _edges()
    names = {e.source for e in edges}
    assert "pystrom.table" in names and "pystrom.io.postgres.read" in names
    assert any(e.source == "pystrom.io.postgres.read" and e.target == "pystrom.io.postgres.assemble" for e in edges)


def test_module_level_imports_are_acyclic():
    cycle = _cycle(_graph(_edges(), lambda e: e.top_level))
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)


def test_postgres_path_flows_one_way():
    prefix = "pystrom.io.postgres."
    modules = _modules()
    edges = [
        e
        for e in _edges()
        if e.source.startswith(prefix) and e.target.startswith(prefix) and not _is_package_init_reexport(e, modules)
    ]
    assert len({e.source for e in edges}) >= 5  # the path really is split into stages
    cycle = _cycle(_graph(edges))
    assert cycle is None, "import loop in the PostgreSQL path: " + " -> ".join(cycle)


def test_every_loop_is_declared_where_it_is_made():
    """An import inside a function that leads back to its own module (at any depth, through
    module-level or function-level imports) must carry a ``# up:`` comment saying why."""
    modules = _modules()
    edges = [e for e in _edges() if not _is_package_init_reexport(e, modules)]
    graph = _graph(edges)
    undeclared = [
        f"{e.source}:{e.line} imports {e.target}"
        for e in edges
        if not e.top_level and _reaches(graph, e.target, e.source) and not e.comment.startswith("up:")
    ]
    assert not undeclared, "imports that close a loop without a '# up: why' comment:\n" + "\n".join(undeclared)


@pytest.mark.parametrize(
    ("source", "target"),
    [("pystrom.io.postgres.decode", "pystrom.io.postgres.assemble"), ("pystrom.table", "pystrom.io.arrow.scan.scan")],
)
def test_checker_finds_a_planted_loop(source, target):
    """The checker itself: a loop added to the real graph is found."""
    edges = _edges() + [Edge(source, target, 1, True, "")]
    assert _cycle(_graph(edges, lambda e: e.top_level)) is not None
