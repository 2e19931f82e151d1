"""The package's import structure: the test fixtures (``hf_specmm.testing``) stay out of the core, no module
imports itself back through a circle of imports (lazy imports inside functions included: a circle is not
dodged by hiding one of its imports in a function), no folder does either, and ``trees/`` stays the tensors-only
layer it promises to be. Imports are read from the source with ``ast``."""

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


def _imports(module: str, module_level_only: bool, type_checking: bool = True) -> set[str]:
    """The hf_specmm modules ``module`` imports (``from pkg import name`` counts as ``pkg.name`` when that is
    a module). ``module_level_only``: leave out imports inside functions and ``if TYPE_CHECKING:`` blocks;
    ``type_checking=False``: leave out the ``if TYPE_CHECKING:`` blocks only (they never run)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    checking = [n for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)]
    nodes: list[ast.AST] = [n for n in tree.body if n not in checking]
    if not module_level_only:
        hidden = set() if type_checking else {id(m) for n in checking for b in n.body for m in ast.walk(b)}
        nodes = [n for n in ast.walk(tree) if id(n) not in hidden]
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


RUNTIME = {m: _imports(m, module_level_only=False, type_checking=False) for m in MODULES}


def _folder(module: str) -> str:
    """The part of the package ``module`` belongs to: a top-level module, or a top-level folder with all below it."""
    return ".".join(module.split(".")[:2])


def test_no_import_cycle_in_the_package():
    """Imports, module-level and inside functions alike, form no circle of files anywhere."""
    assert _cycles(RUNTIME) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail


def test_no_import_cycle_counting_type_checking_imports():
    """Every import the source names, ``if TYPE_CHECKING:`` blocks included: a circle that only a type annotation
    closes is still two modules that cannot be read, moved or tested one without the other."""
    everything = {m: _imports(m, module_level_only=False, type_checking=True) for m in MODULES}
    assert "hf_specmm.bench.step" in everything["hf_specmm.bench.methods"]  # an import the runtime graph sees too
    checking = {m: i - RUNTIME[m] for m, i in everything.items() if i - RUNTIME[m]}
    assert checking, "no import under TYPE_CHECKING was read: the reader misses them"
    assert _cycles(everything) == []


def test_no_import_cycle_between_folders():
    """Folders (and the top-level modules) import each other one way: no ``trees/`` <-> ``drafts/``,
    ``trees/`` <-> ``budget.py`` or ``drafts/`` <-> ``hub.py`` through any of their files."""
    folders: dict[str, set[str]] = {}
    for module, imported in RUNTIME.items():
        folders.setdefault(_folder(module), set()).update(_folder(i) for i in imported if _folder(i) != _folder(module))
    assert _cycles(folders) == []
    assert _folder("hf_specmm.drafts.feature_head.eagle3") == "hf_specmm.drafts" and _folder("hf_specmm.loop") == "hf_specmm.loop"


def test_trees_import_nothing_of_the_package_but_compat():
    """``hf_specmm.trees`` is tree structure, expansion, masks and verification math: it imports no drafter,
    budget or loop module (tree drafting lives beside the drafters, ``hf_specmm.Tree`` beside ``DraftWrapper``)."""
    outside = {m: sorted(i for i in imported if not i.startswith("hf_specmm.trees") and i != "hf_specmm._compat")
               for m, imported in RUNTIME.items() if m.startswith("hf_specmm.trees")}
    assert {m: i for m, i in outside.items() if i} == {}
    assert len(outside) >= 4  # trees/__init__, tree, expand, verify


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
