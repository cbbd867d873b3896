"""No import cycles between milliserve's packages (and top-level modules): dependencies
point one way, so a package can be read, tested and replaced on its own. Imports inside
functions count too: a local import that patches a cycle is still a cycle."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "milliserve"


def package_graph(root: Path = SRC) -> dict[str, dict[str, set[str]]]:
    """package -> {package it imports: {files that do}}; a package is a subfolder of
    ``milliserve`` or a top-level module, ``__init__.py`` re-exports left out."""
    graph: dict[str, dict[str, set[str]]] = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if rel.name == "__init__.py":
            continue
        src = rel.parts[0].removesuffix(".py")
        for name in imported(path):
            parts = name.split(".")
            if parts[0] == "milliserve" and len(parts) > 1 and parts[1] != src:
                graph.setdefault(src, {}).setdefault(parts[1], set()).add(str(rel))
    return graph


def imported(path: Path) -> list[str]:
    """What a file imports, anywhere in it: ``a.b`` for ``import a.b``, and for
    ``from a.b import c`` both ``a.b`` and ``a.b.c`` (c may be a module); relative imports
    left out."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def find_cycle(graph: dict[str, dict[str, set[str]]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles_between_packages() -> None:
    graph = package_graph()
    cycle = find_cycle(graph)
    if cycle:
        hops = [f"{a} -> {b} ({', '.join(sorted(graph[a][b]))})" for a, b in itertools.pairwise(cycle)]
        raise AssertionError("import cycle between packages:\n  " + "\n  ".join(hops))


def test_the_check_sees_a_cycle() -> None:
    # the detector itself: a two-package cycle is reported with both hops
    graph = {"a": {"b": {"a/x.py"}}, "b": {"a": {"b/y.py"}}, "c": {"a": {"c/z.py"}}}
    assert find_cycle(graph) == ["a", "b", "a"]
    assert find_cycle({"a": {"b": {"a/x.py"}}}) is None


def test_front_ends_never_import_backends_cache_or_batcher() -> None:
    # ARCHITECTURE.md: front ends depend on the data plane only
    for front in ("http", "grpc"):
        for path in (SRC / "server" / front).rglob("*.py"):
            text = path.read_text()
            for banned in ("milliserve.backends", "milliserve.cache", "milliserve.runtime.batcher"):
                assert banned not in text, f"{path.relative_to(SRC)} imports {banned}"


def module_graph(root: Path = SRC) -> dict[str, dict[str, set[str]]]:
    """module -> {module it imports: {itself}}, every module of ``milliserve`` (``a.b`` for
    ``milliserve/a/b.py``), imports inside functions included."""
    modules = {
        ".".join(p.relative_to(root).with_suffix("").parts): p
        for p in root.rglob("*.py")
        if p.name != "__init__.py"
    }
    graph: dict[str, dict[str, set[str]]] = {}
    for name, path in modules.items():
        for full in imported(path):
            target = full.removeprefix("milliserve.")
            if full.startswith("milliserve.") and target in modules and target != name:
                graph.setdefault(name, {}).setdefault(target, set()).add(str(path.relative_to(root)))
    return graph


# cycles between two files of one package that are known and owned elsewhere: each one
# here is a debt (none now)
KNOWN_MODULE_CYCLES: set[frozenset[str]] = set()


def test_no_import_cycles_between_modules() -> None:
    # within a package too: examples.sentiment <-> examples.sentiment_pipeline and
    # server.assembly <-> server.workers were such circles (issue 26)
    graph = module_graph()
    while cycle := find_cycle(graph):
        if frozenset(cycle) not in KNOWN_MODULE_CYCLES:
            hops = [f"{a} -> {b}" for a, b in itertools.pairwise(cycle)]
            raise AssertionError("import cycle between modules:\n  " + "\n  ".join(hops))
        graph[cycle[0]].pop(cycle[1])  # set the known one aside and look for another
