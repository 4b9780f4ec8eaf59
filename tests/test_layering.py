"""The import layering of the pd packages, read from their source with ``ast`` (as
param-decomp's layering test does): no import cycles between modules, counting the imports
inside functions that hide them from Python's own import; no module importing a private name
(``_x``, or anything inside a ``_x`` module) that belongs to another module or package; the five
packages' direction (pd-init, pd-sharding, pd-launch and pd-probe import no other pd package);
and no test module importing another test module.

Imports under ``if TYPE_CHECKING:`` count: a type-only back-edge is still a back-edge in the
layering. Known back-edges and private names that other work in flight still owns would be
listed below with why (both lists are empty now); each must still exist (a fixed one is removed
from its list), and nothing else may be added."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "pd_init": ROOT / "packages/pd-init/src/pd_init",
    "pd_sharding": ROOT / "packages/pd-sharding/src/pd_sharding",
    "pd_launch": ROOT / "packages/pd-launch/src/pd_launch",
    "pd_probe": ROOT / "packages/pd-probe/src/pd_probe",
    "pd_train": ROOT / "packages/pd-train/src/pd_train",
}
TESTS = ROOT / "tests"

#: (importer, imported) edges known to close a cycle, left for the work that owns the files
#: (none now: a new one is fixed where it is made, not listed).
KNOWN_BACK_EDGES: dict[tuple[str, str], str] = {}

#: "importer imports dotted" private names known to cross modules, left for their owners.
KNOWN_PRIVATE: set[str] = set()


def _modules() -> dict[str, Path]:
    """``{dotted module name: file}`` for every module of the five packages."""
    out = {}
    for top, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([top, *parts])] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str) -> list[tuple[str, str | None, int]]:
    """``(module, imported attribute or None, line)`` of every import in module ``name``,
    at any depth (function-level imports included), relative imports resolved."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, None, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.extend((base, alias.name, node.lineno) for alias in node.names)
    return out


def _target_module(module: str, attribute: str | None) -> str | None:
    """The pd module an import reaches: ``from a import b`` reaches module ``a.b`` when that is
    a module, else ``a``; None outside the five packages."""
    if attribute is not None and f"{module}.{attribute}" in MODULES:
        return f"{module}.{attribute}"
    parts = module.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name in MODULES:
        for module, attribute, _line in _imports(name):
            target = _target_module(module, attribute)
            if target is None or target == name:
                continue
            # A package's __init__ re-exporting its own submodules is how the public API is
            # built; a submodule importing its package's __init__ back would be a cycle.
            graph[name].add(target)
    return graph


def _layered_graph() -> dict[str, set[str]]:
    graph = _graph()
    for importer, imported in KNOWN_BACK_EDGES:
        graph[importer].discard(imported)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _private_owner(dotted: str) -> str | None:
    """The module or package a private name belongs to: for ``pd_train.run._x`` it is
    ``pd_train.run``; for ``pd_train.ci._base.Thing`` it is ``pd_train.ci``; None when no
    component of ``dotted`` is private."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _private_violations() -> dict[str, str]:
    """{"importer imports dotted": where} for every private name used outside its owner."""
    problems = {}
    for name in MODULES:
        for module, attribute, line in _imports(name):
            if module.split(".")[0] not in PACKAGES:
                continue
            dotted = module if attribute is None else f"{module}.{attribute}"
            owner = _private_owner(dotted)
            if owner is None:
                continue
            # Private to ``owner``: only ``owner`` itself and the modules inside it may use it.
            if name == owner or name.startswith(owner + "."):
                continue
            where = MODULES[name].relative_to(ROOT)
            problems[f"{name} imports {dotted}"] = f"{where}:{line} (private to {owner})"
    return problems


def test_the_modules_were_found() -> None:
    assert {"pd_train.train", "pd_train.cli", "pd_launch", "pd_init"} <= set(MODULES)
    assert len(MODULES) > 60


def test_no_import_cycles_between_modules() -> None:
    cycles = _cycles(_layered_graph())
    assert not cycles, "import cycles (lazy and TYPE_CHECKING imports count):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_known_back_edges_still_exist() -> None:
    """A back-edge that was fixed leaves KNOWN_BACK_EDGES (the list only shrinks)."""
    graph = _graph()
    stale = [edge for edge in KNOWN_BACK_EDGES if edge[1] not in graph[edge[0]]]
    assert not stale, f"no longer imported, remove from KNOWN_BACK_EDGES: {stale}"


def test_the_cycle_check_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_module_imports_a_private_name_of_another_module() -> None:
    problems = _private_violations()
    new = {k: v for k, v in problems.items() if k not in KNOWN_PRIVATE}
    assert not new, "\n".join(f"{where}: {k}" for k, where in sorted(new.items()))
    stale = sorted(KNOWN_PRIVATE - problems.keys())
    assert not stale, f"fixed, remove from KNOWN_PRIVATE: {stale}"


def test_the_private_check_sees_a_private_name() -> None:
    assert _private_owner("pd_train.run._hooks.Hook") == "pd_train.run"
    assert _private_owner("pd_train.ci._base.Thing") == "pd_train.ci"
    assert _private_owner("pd_train.run.target_dtype") is None
    assert _private_owner("pd_train.run._target_dtype") == "pd_train.run"


@pytest.mark.parametrize("package", ["pd_init", "pd_sharding", "pd_launch", "pd_probe"])
def test_the_leaf_packages_import_no_other_pd_package(package: str) -> None:
    problems = []
    for name in MODULES:
        if name.split(".")[0] != package:
            continue
        for module, _attribute, line in _imports(name):
            top = module.split(".")[0]
            if top in PACKAGES and top != package:
                problems.append(f"{MODULES[name].relative_to(ROOT)}:{line} imports {module}")
    assert not problems, "\n".join(problems)


def test_no_test_module_imports_another_test_module() -> None:
    """Shared test code lives in conftest.py (fixtures) or a support module (``_x.py``), not
    in another ``test_*.py``."""
    problems = []
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                leaf = (node.module or "").split(".")[-1]
                names = [a.name for a in node.names]
                if leaf.startswith("test_") or (
                    node.level and not node.module and any(n.startswith("test_") for n in names)
                ):
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[-1].startswith("test_"):
                        problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name}")
    assert not problems, "test modules importing other test modules:\n" + "\n".join(problems)
