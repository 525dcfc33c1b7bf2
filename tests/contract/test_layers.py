"""The package's import layering, checked on the source (an AST walk).

Imports run one way: ``_labelled`` -> ``_backends`` -> ``_engine`` ->
``_errors``; the top-level modules (``__init__``, ``_accessor``, ``_demo``,
``__main__``) sit above them and ``_progress`` at the bottom.  No
first-party import hides inside a function, the engine and the backends
never import xarray, and the module graph has no cycle.  ``lint-imports``
(import-linter, configured in pyproject.toml) checks the same layers in CI.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "xstencil"

#: rank of each layer: a module may import only from its own rank or lower ones
RANK = {"_errors": 0, "_progress": 0, "_engine": 1, "_backends": 2, "_labelled": 3}
TOP = 4  # __init__, _accessor, _demo, __main__
NO_XARRAY = ("_errors", "_progress", "_engine", "_backends")


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _rank(module: str) -> int:
    return RANK.get(_layer(module) or "", TOP)


def _imports(tree: ast.AST) -> list[tuple[ast.stmt, str, bool]]:
    """(node, imported module, inside a function) for every import."""
    out: list[tuple[ast.stmt, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef
                                              | ast.Lambda)
            if isinstance(child, ast.Import):
                out.extend((child, a.name, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module:
                if child.module == "xstencil":  # from xstencil import _progress
                    out.extend((child, f"xstencil.{a.name}", in_function)
                               for a in child.names)
                else:
                    out.append((child, child.module, in_function))
            visit(child, inner)

    visit(tree, False)
    return out


SOURCES = sorted(PKG.rglob("*.py"))
GRAPH = {_module(p): _imports(ast.parse(p.read_text(), str(p))) for p in SOURCES}


def _where(module: str, node: ast.stmt) -> str:
    return f"{module}:{node.lineno}"


def test_the_walk_sees_the_package():
    assert {"xstencil._labelled.scan", "xstencil._backends.halo",
            "xstencil._engine.lower", "xstencil._errors"} <= set(GRAPH)


def test_no_first_party_import_inside_a_function():
    bad = [f"{_where(m, n)} imports {name}" for m, imps in GRAPH.items()
           for n, name, inner in imps if inner and name.split(".")[0] == "xstencil"]
    assert not bad, "first-party imports inside functions (move them to the top):\n" + \
        "\n".join(bad)


def test_imports_run_one_way():
    bad = []
    for m, imps in GRAPH.items():
        for n, name, _ in imps:
            if name.split(".")[0] == "xstencil" and _rank(name) > _rank(m):
                bad.append(f"{_where(m, n)} ({_layer(m)}) imports {name} ({_layer(name)})")
    assert not bad, "upward imports (_labelled -> _backends -> _engine -> _errors):\n" + \
        "\n".join(bad)


def test_engine_and_backends_never_import_xarray():
    bad = [f"{_where(m, n)} imports {name}" for m, imps in GRAPH.items()
           if _layer(m) in NO_XARRAY for n, name, _ in imps if name.split(".")[0] == "xarray"]
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    edges = {m: {name for _, name, inner in imps if name in GRAPH and not inner and name != m}
             for m, imps in GRAPH.items()}
    for m in list(edges):  # importing a.b.c runs the package a.b first (unless m is in it)
        for name in list(edges[m]):
            parts = name.split(".")
            parents = {".".join(parts[:i]) for i in range(2, len(parts))}
            edges[m] |= {p for p in parents if p in GRAPH and not (m + ".").startswith(p + ".")}
    state: dict[str, int] = {}
    path: list[str] = []

    def dfs(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (cycle := dfs(n)) is not None:
                return cycle
        state[m] = 2
        path.pop()
        return None

    for m in sorted(edges):
        if m not in state:
            cycle = dfs(m)
            assert cycle is None, " -> ".join(cycle)


def test_lower_layers_do_not_reach_xarray_through_other_modules():
    """The first-party modules an engine or backend module imports, directly
    or through others (the package ``__init__`` aside, which registers the
    accessor), import no xarray."""
    direct = {m: {name for _, name, _ in imps} for m, imps in GRAPH.items()}
    for m in GRAPH:
        if _layer(m) not in NO_XARRAY:
            continue
        seen, todo = set(), [m]
        while todo:
            cur = todo.pop()
            for name in direct[cur]:
                if name.split(".")[0] == "xarray":
                    pytest.fail(f"{m} reaches xarray through {cur}")
                if name in GRAPH and name != "xstencil" and name not in seen:
                    seen.add(name)
                    todo.append(name)


# `import xstencil` registers the accessor (xarray); as in tests/test_packaging.py, an
# empty `xstencil` package object stands in for it, then every backend module is imported.
_BACKENDS_IMPORT_SCRIPT = textwrap.dedent(
    """
    import importlib, importlib.util, pkgutil, sys

    spec = importlib.util.find_spec("xstencil")
    sys.modules["xstencil"] = importlib.util.module_from_spec(spec)
    backends = importlib.import_module("xstencil._backends")
    names = ["xstencil._progress", "xstencil._backends"] + [
        info.name for info in pkgutil.walk_packages(backends.__path__, "xstencil._backends.")]
    for name in names:
        importlib.import_module(name)
        if "xarray" in sys.modules:
            sys.exit(f"importing {name} imported xarray")
    print(len(names))
    """
)


def test_importing_the_backends_does_not_import_xarray() -> None:
    result = subprocess.run([sys.executable, "-c", _BACKENDS_IMPORT_SCRIPT],
                            capture_output=True, text=True, check=False, cwd=PKG.parent)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 8


def test_the_checks_catch_a_violation():
    """The walk reports an upward import and a function-level one."""
    tree = ast.parse("import os\ndef f():\n    from xstencil._labelled import scan\n")
    imps = _imports(tree)
    assert [(name, inner) for _, name, inner in imps] == [
        ("os", False), ("xstencil._labelled", True)]
    assert _rank("xstencil._labelled.scan") > _rank("xstencil._backends.halo")
