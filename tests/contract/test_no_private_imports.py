"""No module of the package imports another module's private names: what is
shared between modules is public within the package (issue 15)."""

from __future__ import annotations

import ast
from pathlib import Path

import xstencil

PACKAGE = Path(xstencil.__file__).parent


def test_no_private_name_is_imported_from_another_module():
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("xstencil"):
                for alias in node.names:
                    # a private *module* (xstencil._progress) is fine; a private name is not
                    module = f"{node.module}.{alias.name}"
                    is_module = (PACKAGE.parent / (module.replace(".", "/") + ".py")).exists() \
                        or (PACKAGE.parent / module.replace(".", "/")).is_dir()
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and not is_module:
                        found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: "
                                     f"from {node.module} import {alias.name}")
    assert not found, found
