"""The package's import structure: the data path flows one way.

Every module of ``src/pystrom`` is parsed (not imported) and its imports resolved to modules of the
package. Five rules:

1. Module-level imports form no cycle anywhere in the package.
2. Among the modules of the PostgreSQL path (``pystrom.io.postgres``), no import at any depth, inside
   functions included, leads back to a module it came from: plan -> stream -> decode -> assemble, one way.
3. Elsewhere an import inside a function may close a loop only where a convenience method reaches up
   a layer (``Table.export()`` importing ``pystrom.ipc``); such an import says so on its line, with a
   ``# up:`` comment naming why, so every loop in the package is written down where it is made.
4. The Arrow file path's stages (``pystrom.io.arrow``: file, codecs, read, scan, write) import only
   stages before their own, at any depth, inside functions too: the read path flows one way.
5. The memory layer (``pystrom.memory``) imports nothing above it: only itself and the package's
   foundations (errors, settings, types, the C++ core, the kernel loader, the fork-safe pools).
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


# -- rules 4 and 5 ----------------------------------------------------------------------------------

ARROW = "pystrom.io.arrow"
ARROW_STAGES = ("file", "codecs", "read", "scan", "write")  # each may import only those before it
MEMORY = "pystrom.memory"
BELOW_MEMORY = {
    "pystrom.errors",
    "pystrom._settings",
    "pystrom._pools",
    "pystrom._types",
    "pystrom._core",
    "pystrom._dist",
    "pystrom.kernels",
}


def _arrow_stage(module: str) -> int | None:
    """The position of ``module``'s stage in ARROW_STAGES; None outside them (the package's own __init__)."""
    if not module.startswith(ARROW + "."):
        return None
    stage = module[len(ARROW) + 1 :].split(".")[0]
    return ARROW_STAGES.index(stage) if stage in ARROW_STAGES else None


def _against_the_stages(edges: list[Edge]) -> list[str]:
    bad = []
    for e in edges:
        source, target = _arrow_stage(e.source), _arrow_stage(e.target)
        if source is not None and target is not None and target > source:
            bad.append(f"{e.source}:{e.line} ({ARROW_STAGES[source]}) imports {e.target} ({ARROW_STAGES[target]})")
    return bad


def _above_memory(edges: list[Edge]) -> list[str]:
    return [
        f"{e.source}:{e.line} imports {e.target}"
        for e in edges
        if e.source.startswith(MEMORY)
        and not (e.target == MEMORY or e.target.startswith(MEMORY + ".") or e.target in BELOW_MEMORY)
    ]


def test_every_arrow_module_is_in_a_stage():
    """A module added at io/arrow/'s top level would escape rule 4: only the package's __init__ lives there."""
    loose = [m for m in _modules() if m.startswith(ARROW + ".") and _arrow_stage(m) is None]
    assert not loose, f"modules of {ARROW} outside its stages {ARROW_STAGES}: {loose}"
    stages = {_arrow_stage(m) for m in _modules() if m.startswith(ARROW + ".")}
    assert stages == set(range(len(ARROW_STAGES)))


def test_arrow_stages_import_only_earlier_stages():
    bad = _against_the_stages(_edges())
    assert not bad, "imports against the order of io/arrow's stages:\n" + "\n".join(bad)


def test_memory_layer_imports_nothing_above_it():
    modules = [m for m in _modules() if m.startswith(MEMORY + ".")]
    assert len(modules) >= 6
    bad = _above_memory(_edges())
    assert not bad, "the memory layer imports from above it:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "target", "top_level"),
    [
        ("pystrom.io.arrow.read.direct", "pystrom.io.arrow.scan.scan", True),  # read -> scan
        ("pystrom.io.arrow.read.host", "pystrom.io.arrow.write.writer", False),  # read -> write, in a function
        ("pystrom.io.arrow.codecs.decompress", "pystrom.io.arrow.read.compressed_reads", True),  # codecs -> read
        ("pystrom.io.arrow.file.metadata", "pystrom.io.arrow.codecs.plan", False),  # file -> codecs
        ("pystrom.io.arrow.scan.sieve", "pystrom.io.arrow.write.write", True),  # scan -> write
    ],
)
def test_stage_checker_finds_a_planted_violation(source, target, top_level):
    assert not _against_the_stages(_edges())
    planted = Edge(source, target, 1, top_level, "up: a comment does not excuse it")
    assert _against_the_stages(_edges() + [planted]) == [
        f"{source}:1 ({source.split('.')[3]}) imports {target} ({target.split('.')[3]})"
    ]


@pytest.mark.parametrize(
    "target", ["pystrom.table", "pystrom.io.arrow.file.ranges", "pystrom.ipc.export", "pystrom._ops"]
)
def test_memory_checker_finds_a_planted_violation(target):
    assert not _above_memory(_edges())
    planted = Edge("pystrom.memory.bitmap", target, 7, False, "")
    assert _above_memory(_edges() + [planted]) == [f"pystrom.memory.bitmap:7 imports {target}"]
