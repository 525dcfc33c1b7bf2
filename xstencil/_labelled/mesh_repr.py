"""How a function mesh shows itself: ``repr(m)``, the notebook table, and
``m.loc`` (assignment by coordinate label)."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from xstencil._errors import raised_here

__all__ = ["MeshRepr", "Loc"]


class Loc:
    """``m.loc[{dim: label}] = kernel``: assign by coordinate label."""

    def __init__(self, mesh: Any):
        self._mesh = mesh

    def __repr__(self) -> str:
        return (f"<{self._mesh._call[:-5]}.loc: assign by coordinate label, "
                f"m.loc[{{dim: label}}] = f>")

    @raised_here
    def __setitem__(self, key: Any, kernel: Callable[..., Any]) -> None:
        self._mesh._assign(self._mesh._by_label(key), kernel, key, by_label=True)
        self._mesh._keys[-1] = f".loc[{key!r}]"


class MeshRepr:
    """The reprs of :class:`~xstencil.Mesh` (a mixin; the mesh holds
    ``_obj``, ``_options``, ``_keys`` and ``_regions``)."""

    _obj: Any
    _options: dict[str, Any]
    _keys: list[str]
    _regions: list[Any]

    def _summary(self) -> tuple[str, list[tuple[str, str]]]:
        sizes = ", ".join(f"{d}: {n}" for d, n in self._obj.sizes.items())
        opts = "".join(f", {k}={v!r}" for k, v in self._options.items())
        head = f"xstencil.Mesh over a {type(self._obj).__name__} ({sizes}){opts}"
        rows = [(k, getattr(f, "__name__", None) or repr(f))
                for k, (_, f) in zip(self._keys, self._regions, strict=True)]
        return head, rows

    def __repr__(self) -> str:
        head, rows = self._summary()
        if not rows:
            return f"<{head}: no regions; assign with m[...] = f>"
        width = max(len(k) for k, _ in rows) + 2
        lines = [f"<{head}: {len(rows)} region{'s' if len(rows) > 1 else ''}, later wins"]
        lines += [f"  m{k:<{width}}= {f}" for k, f in rows]
        return "\n".join(lines) + ">"

    def _repr_html_(self) -> str:
        head, rows = self._summary()
        cells = "".join(f"<tr><td><code>m{html.escape(k)}</code></td>"
                        f"<td><code>{html.escape(f)}</code></td></tr>" for k, f in rows)
        table = (f"<table><tr><th>region (later wins)</th><th>kernel</th></tr>{cells}</table>"
                 if rows else "<p>no regions; assign with <code>m[...] = f</code></p>")
        return f"<div><strong>{html.escape(head)}</strong>{table}</div>"
