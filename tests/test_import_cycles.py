"""The package's import graph: no cycles, and the layer rules of the guide (store, tui, compute).

Every module of compute/, store/ and tui/ is parsed with ``ast`` (not imported): module-level imports and those inside
functions both count, since a function-level import that closes a cycle is still a cycle (it only moves the failure to
run time). Imports under ``if TYPE_CHECKING:`` never run and are left out. A module's own enclosing packages are no
edge (``from . import schema`` in store/copying.py): Python initialises them before the module, so they close no
cycle."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("compute", "store", "tui")
STDLIB = frozenset(sys.stdlib_module_names)


def module_files(root: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the checked packages."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


class _Imports(ast.NodeVisitor):
    """(dotted name, lazy) of every import statement; lazy = inside a function."""

    def __init__(self):
        self.found: list[tuple[str, bool, ast.AST]] = []
        self._depth = 0

    def _function(self, node):
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node: ast.If):
        test = node.test
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
        if name == "TYPE_CHECKING":  # never executed
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import):
        for alias in node.names:
            self.found.append((alias.name, self._depth > 0, node))

    def visit_ImportFrom(self, node: ast.ImportFrom):
        self.found.append((node, self._depth > 0, node))


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, bool]]:
    """(imported dotted name, lazy) for one module, relative imports resolved. ``from X import y`` yields X and, when
    X.y is itself a module of the packages, X.y too."""
    is_package = path.name == "__init__.py"
    visitor = _Imports()
    visitor.visit(ast.parse(path.read_text(), str(path)))
    out = []
    for item, lazy, _node in visitor.found:
        if isinstance(item, str):
            out.append((item, lazy))
            continue
        node = item
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module
        out.append((target, lazy))
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            if sub in modules:
                out.append((sub, lazy))
    return out


def import_graph(root: Path = REPO) -> tuple[dict[str, set[str]], dict[str, list[tuple[str, bool]]]]:
    """(edges between the packages' own modules, every import of every module)."""
    modules = module_files(root)
    every = {m: imports_of(m, p, modules) for m, p in modules.items()}
    edges = {m: {t for t, _ in imps if t in modules and t != m and not m.startswith(t + ".")}
             for m, imps in every.items()}
    return edges, every


@functools.cache
def repo_graph():
    """The checked-out packages' graph, parsed once per session."""
    return import_graph()


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (iterative DFS with colours)."""
    colour = dict.fromkeys(edges, 0)  # 0 new, 1 on the stack, 2 done
    for start in sorted(edges):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(edges[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                colour[node] = 2
            elif colour[child] == 1:
                return path[path.index(child):] + [child]
            elif colour[child] == 0:
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(edges[child]))))
    return None


def top(name: str) -> str:
    return name.split(".")[0]


def torch_modules(every: dict[str, list[tuple[str, bool]]]) -> set[str]:
    """The packages' modules that import torch when imported (directly or through module-level imports)."""
    eager = {m: {t for t, lazy in imps if not lazy} for m, imps in every.items()}
    heavy = {m for m, ts in eager.items() if any(top(t) in ("torch", "transformers") for t in ts)}
    grown = True
    while grown:
        more = {m for m, ts in eager.items() if m not in heavy and ts & heavy}
        heavy |= more
        grown = bool(more)
    return heavy


# ----------------------------------------------------------------------------------------------------------------
def test_graph_is_not_empty():
    """The parser sees the packages (a test that finds nothing would pass on anything)."""
    edges, every = repo_graph()
    assert {"compute.runner", "compute.run.plan", "compute.head_pass", "store.reader", "tui.app"} <= set(edges)
    assert "compute.padding" in edges["compute.head_pass"]
    assert ("compute.head_pass", True) in every["compute.run.head_masks"]  # a function-level import is seen


def test_no_import_cycles():
    edges, _ = repo_graph()
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_reports_one():
    """The detector itself: a planted cycle is found and printed in order."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_relative_imports_resolve(tmp_path):
    pkg = tmp_path / "compute" / "methods" / "_internals"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "store", tmp_path / "tui"):
        d.mkdir()
        (d / "__init__.py").write_text("")
    (tmp_path / "compute" / "__init__.py").write_text("")
    (tmp_path / "compute" / "errors.py").write_text("")
    (tmp_path / "compute" / "methods" / "__init__.py").write_text("from ._internals import base\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text("from ...errors import X\n\ndef f():\n    from .. import alti\n")
    (tmp_path / "compute" / "methods" / "alti.py").write_text("from ._internals.base import Method\n")
    edges, _ = import_graph(tmp_path)
    assert edges["compute.methods"] == {"compute.methods._internals", "compute.methods._internals.base"}
    assert edges["compute.methods._internals.base"] == {"compute.errors", "compute.methods.alti"}  # no parent
    assert find_cycle(edges) == ["compute.methods._internals.base", "compute.methods.alti",
                                 "compute.methods._internals.base"]


# Store.to_pandas imports pandas inside the method: an optional export, never needed to read or write a store.
STORE_LAZY_OPTIONAL = {"pandas"}


def test_store_imports_only_numpy_h5py_stdlib():
    _, every = repo_graph()
    bad = []
    for m, imps in every.items():
        if top(m) != "store":
            continue
        for t, lazy in imps:
            if top(t) in STDLIB or top(t) in ("numpy", "h5py", "store", "__future__"):
                continue
            if lazy and top(t) in STORE_LAZY_OPTIONAL:
                continue
            bad.append(f"{m} imports {t}")
    assert not bad, "\n".join(bad)


def test_tui_never_imports_torch_or_compute_torch_modules():
    _, every = repo_graph()
    heavy = torch_modules(every)
    assert "compute.runner" in heavy and "compute.methods" in heavy  # the closure sees through the packages
    bad = [f"{m} imports {t}" for m, imps in every.items() if top(m) == "tui"
           for t, _ in imps if top(t) in ("torch", "transformers") or t in heavy]
    assert not bad, "\n".join(bad)


def test_compute_never_imports_textual():
    _, every = repo_graph()
    bad = [f"{m} imports {t}" for m, imps in every.items() if top(m) == "compute"
           for t, _ in imps if top(t) in ("textual", "textual_plotext", "tui")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module", ["compute.runner", "compute.head_pass", "compute.methods._internals.gradients",
                                    "compute.methods._internals.relevance"])
def test_former_cycles_are_gone(module):
    """runner <-> head_pass (_pad) and gradients <-> relevance (the LRP record) were the cycles of issue 15."""
    edges, _ = repo_graph()
    partner = {"compute.runner": "compute.head_pass", "compute.head_pass": "compute.runner",
               "compute.methods._internals.gradients": "compute.methods._internals.relevance",
               "compute.methods._internals.relevance": "compute.methods._internals.gradients"}[module]
    assert not (partner in edges[module] and module in edges[partner])
