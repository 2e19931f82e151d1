"""The package's import structure: the test fixtures (``hf_specmm.testing``) stay out of the core, and no
module imports itself back through a circle of imports. Imports are read from the source with ``ast``,
so a lazy import inside a function counts where noted."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "hf_specmm"
# the modules allowed to import the fixtures: the fixtures themselves, the benchmark presets, the world demo
MAY_IMPORT_TESTING = ("hf_specmm.testing", "hf_specmm.bench", "hf_specmm.world.demo")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(module: str, module_level_only: bool) -> set[str]:
    """The hf_specmm modules ``module`` imports (``from pkg import name`` counts as ``pkg.name`` when that is
    a module). ``module_level_only``: leave out imports inside functions and ``if TYPE_CHECKING:`` blocks."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    nodes: list[ast.AST] = [n for n in tree.body if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))]
    if not module_level_only:
        nodes = list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "hf_specmm"}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            if source.split(".")[0] != "hf_specmm":
                continue
            found |= {f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names}
    return {m for m in found if m in MODULES and m != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
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
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_reader_sees_every_kind_of_import():
    """The checks below would pass vacuously if the reader missed imports: it must see the fixtures' own
    relative imports, an absolute one, a lazy one, and the bench presets' import of the fixtures."""
    assert "hf_specmm.testing.registry" in _imports("hf_specmm.testing.llava", True)
    assert "hf_specmm.targets" in _imports("hf_specmm.testing.registry", True)
    assert "hf_specmm.testing" in _imports("hf_specmm.bench.presets", False)
    assert "hf_specmm.testing" not in _imports("hf_specmm.bench.presets", True)  # lazy: inside a function
    assert len(MODULES) > 40 and "hf_specmm.loop" in MODULES


def test_the_core_never_imports_the_fixtures():
    core = [m for m in MODULES if not m.startswith(MAY_IMPORT_TESTING)]
    offenders = {m: sorted(i for i in _imports(m, module_level_only=False) if i.startswith("hf_specmm.testing"))
                 for m in core}
    assert {m: i for m, i in offenders.items() if i} == {}


def test_no_import_cycle_in_the_package():
    """Module-level imports form no circle anywhere; inside the fixtures not even lazy imports do."""
    graph = {m: _imports(m, module_level_only=True) for m in MODULES}
    assert _cycles(graph) == []
    fixtures = {m: {i for i in _imports(m, module_level_only=False) if i.startswith("hf_specmm.testing")}
                for m in MODULES if m.startswith("hf_specmm.testing")}
    assert _cycles(fixtures) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail


def test_fixtures_are_registered_by_name_without_family_lists():
    """Every public fixture function looks its family up in the registry: no module of the fixtures
    branches on a list of family names (``family in MORE_FAMILIES``)."""
    from hf_specmm import testing

    assert testing.FAMILIES == tuple(name for name, family in testing.FIXTURES.items() if family.shared_suites)
    assert set(testing.FAMILIES) == set(testing.LLAVA_FAMILIES + testing.QWEN_FAMILIES + testing.MORE_FAMILIES)
    assert set(testing.FIXTURES) == set(testing.FAMILIES + testing.HYBRID_FAMILIES)
    for path in (PACKAGE / "testing").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                assert not names & {"FAMILIES", "MORE_FAMILIES", "QWEN_FAMILIES", "LLAVA_FAMILIES"}, \
                    f"{path.name}: {ast.unparse(node)}"
