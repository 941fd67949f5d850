"""No import cycle in the library, and no module over 500 lines without a reason.

The graph is read statically (with :mod:`ast`) from every module under ``leasekit/``
and ``backends/*``. An edge is an import that runs when the module is loaded: at
module level, or under ``if TYPE_CHECKING:`` (counted apart: a cycle there costs only
the type checker, but still says two modules know each other). Imports inside a
function run on first call, after both modules loaded, and do not count. An import
``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``;
importing ``a.b`` also runs ``a/__init__``, which is not counted as an edge (else every
package would be one cycle with each of its modules that import a sibling).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 500
REASON = "over 500 lines:"

# Exceptions to the rules: none. Each list is checked both ways (an entry that no
# longer applies fails too), so an entry added here must say why, next to it.
KNOWN_BACKEND_CYCLES: list[tuple[str, ...]] = []
KNOWN_CORE_CYCLES: list[tuple[str, ...]] = []
KNOWN_LONG_MODULES: list[str] = []


def _library_files() -> Iterator[Path]:
    yield from sorted((ROOT / "leasekit").rglob("*.py"))
    for package in sorted((ROOT / "backends").iterdir()):
        if (package / "__init__.py").is_file():
            yield from sorted(package.rglob("*.py"))


def _module_name(path: Path) -> str:
    base = ROOT if path.is_relative_to(ROOT / "leasekit") else ROOT / "backends"
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(path): path for path in _library_files()}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _load_time_imports(
    body: list[ast.stmt], typing_only: bool
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """The imports run when the module loads: (node, under ``if TYPE_CHECKING:``)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, typing_only
        elif isinstance(node, ast.If):
            yield from _load_time_imports(node.body, typing_only or _is_type_checking(node.test))
            yield from _load_time_imports(node.orelse, typing_only)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _load_time_imports(block, typing_only)
            for handler in node.handlers:
                yield from _load_time_imports(handler.body, typing_only)
        elif isinstance(node, ast.With | ast.ClassDef):
            yield from _load_time_imports(node.body, typing_only)


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    if node.level:
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in MODULES else base


def _graph(*, typing_only: bool) -> dict[str, set[str]]:
    """module -> the library modules it imports at load time (and, with ``typing_only``,
    also those it imports under ``if TYPE_CHECKING:``)."""
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, typing in _load_time_imports(tree.body, False):
            if typing and not typing_only:
                continue
            graph[name].update(t for t in _targets(name, node) if t in MODULES and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _is_core(cycle: tuple[str, ...]) -> bool:
    return any(module == "leasekit" or module.startswith("leasekit.") for module in cycle)


def test_the_graph_sees_the_imports() -> None:
    # Guards the tests below against a walker that finds nothing.
    graph = _graph(typing_only=True)
    assert "leasekit._contract" in graph["leasekit"]
    assert "leasekit.sync" in graph["leasekit"]  # under TYPE_CHECKING only
    assert "leasekit.sync" not in _graph(typing_only=False)["leasekit"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]


@pytest.mark.parametrize("typing_only", [False, True], ids=["runtime", "with-type-checking"])
def test_no_import_cycle_in_core(typing_only: bool) -> None:
    cycles = [cycle for cycle in _cycles(_graph(typing_only=typing_only)) if _is_core(cycle)]
    new = [cycle for cycle in cycles if cycle not in KNOWN_CORE_CYCLES]
    assert new == [], f"import cycles in leasekit/: {new}; known ones: {KNOWN_CORE_CYCLES}"
    if typing_only:
        gone = [cycle for cycle in KNOWN_CORE_CYCLES if cycle not in cycles]
        assert gone == [], f"known core cycles that no longer exist, unlist them: {gone}"


@pytest.mark.parametrize("typing_only", [False, True], ids=["runtime", "with-type-checking"])
def test_no_import_cycle_in_backends_but_the_known_ones(typing_only: bool) -> None:
    cycles = [cycle for cycle in _cycles(_graph(typing_only=typing_only)) if not _is_core(cycle)]
    new = [cycle for cycle in cycles if cycle not in KNOWN_BACKEND_CYCLES]
    assert new == [], f"import cycles in backends/: {new}; known ones: {KNOWN_BACKEND_CYCLES}"
    if typing_only:
        gone = [cycle for cycle in KNOWN_BACKEND_CYCLES if cycle not in cycles]
        assert gone == [], f"known backend cycles that no longer exist, unlist them: {gone}"


def _has_reason(path: Path) -> bool:
    """A line near the top (a comment or the docstring's) says why the module is long."""
    return any(REASON in line for line in path.read_text(encoding="utf-8").splitlines()[:15])


def test_no_long_module_without_a_reason() -> None:
    long = {
        path.relative_to(ROOT).as_posix(): path
        for path in _library_files()
        if len(path.read_text(encoding="utf-8").splitlines()) > LIMIT
    }
    unexplained = sorted(name for name, path in long.items() if not _has_reason(path))
    new = [name for name in unexplained if name not in KNOWN_LONG_MODULES]
    assert new == [], (
        f"modules over {LIMIT} lines: split them, or say why at the top with a line "
        f"containing {REASON!r}: {new}"
    )
    fixed = [name for name in KNOWN_LONG_MODULES if name not in unexplained]
    assert fixed == [], f"no longer long or now explained, unlist them: {fixed}"
