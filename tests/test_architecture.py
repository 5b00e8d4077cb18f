"""The import graph of ``dreamgym/`` flows one way: no package imports another that (directly or not) imports
it back, at any depth (top-level packages, and the modules inside each package). Every ``import`` counts:
module-level, function-level and ``TYPE_CHECKING`` ones.

The top-level order is the paper's data flow: types → envs → {llm, replay} → sft → experience → curriculum →
agent → rl → {baselines, pretrain, adapters} → pipeline → bench → cli (stats and software: leaves beside types).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "dreamgym"
# Lower layers never import higher ones; packages in one layer do not import each other.
LAYERS: list[set[str]] = [
    {"types", "stats", "software"},
    {"envs"},
    {"llm", "replay"},
    {"sft"},
    {"experience"},
    {"curriculum"},
    {"agent", "collect"},
    {"rl"},
    {"baselines", "pretrain", "plots", "report", "adapters"},
    {"pipeline"},
    {"bench"},
    {"cli"},
    {"__main__"},
]


def module_name(path: Path) -> str:
    parts = ["dreamgym", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def known_modules() -> set[str]:
    return {module_name(p) for p in ROOT.rglob("*.py")}


def imports(path: Path, modules: set[str]) -> Iterator[tuple[str, int]]:
    """``(imported dreamgym module, line)`` for every import statement of a file (``from a import b`` names
    ``a.b`` when that is a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in modules else target), node.lineno


def edges() -> dict[tuple[str, str], str]:
    """``{(importer, imported): "file:line"}`` between dreamgym modules."""
    modules = known_modules()
    out: dict[tuple[str, str], str] = {}
    for path in sorted(ROOT.rglob("*.py")):
        src = module_name(path)
        for dst, line in imports(path, modules):
            if dst.startswith("dreamgym.") or dst == "dreamgym":
                out.setdefault((src, dst), f"{path.relative_to(ROOT.parent)}:{line}")
    return out


def child_of(package: str, module: str) -> str | None:
    """The direct child of ``package`` that ``module`` is or lies in (None: outside it, or the package itself)."""
    if not module.startswith(package + "."):
        return None
    return module[len(package) + 1 :].split(".")[0]


def cycles_in(package: str, all_edges: dict[tuple[str, str], str]) -> list[list[str]]:
    """Strongly connected components (size > 1) among the direct children of ``package``, with an example
    import of each edge inside them."""
    graph: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], str] = {}
    for (src, dst), loc in all_edges.items():
        a, b = child_of(package, src), child_of(package, dst)
        if a and b and a != b:
            graph[a].add(b)
            where.setdefault((a, b), loc)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                members = set(component)
                found.append(sorted(f"{package}.{a} -> {b} ({where[(a, b)]})" for a in members
                                    for b in graph[a] if b in members))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def packages() -> list[str]:
    return sorted(module_name(p) for p in ROOT.rglob("__init__.py"))


@pytest.mark.parametrize("package", packages())
def test_no_import_cycle_inside(package: str) -> None:
    assert cycles_in(package, edges()) == []


def test_top_level_packages_follow_the_layers() -> None:
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    children = {child_of("dreamgym", m) for m in known_modules()} - {None}
    assert children <= set(layer) | {"__init__"}, f"place new packages in LAYERS: {children - set(layer)}"
    upward = []
    for (src, dst), loc in edges().items():
        a, b = child_of("dreamgym", src), child_of("dreamgym", dst)
        if a in layer and b in layer and a != b and layer[a] <= layer[b]:
            upward.append(f"{a} -> {b} ({loc})")
    assert sorted(upward) == []


def test_the_checker_finds_a_cycle() -> None:
    """The test can fail: a made-up back edge is reported with its file and line."""
    fake = {**edges(), ("dreamgym.types", "dreamgym.rl.losses"): "dreamgym/types.py:1"}
    assert any("types -> rl" in edge for cycle in cycles_in("dreamgym", fake) for edge in cycle)
