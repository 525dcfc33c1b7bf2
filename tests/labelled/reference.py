"""A slow, obviously-correct numpy reference for the labelled API.

Plain Python loops over output points; nothing is vectorised.  The kernel
receives a :class:`RefWindow` that supports the same reads as xstencil's
window (``u()``, ``u(x=1)``, ``u[1, -1]``, ``u.array``, ``u.sum()``,
``u * w``, ``u.coord("x")``), backed by numpy.

Semantics (DESIGN.md section 2):

* ``window={dim: (lo, hi)}``: the window reaches ``lo`` cells before and
  ``hi`` after the centre; a size ``k`` means ``((k - 1) // 2, k // 2)``.
* Boundaries pad each windowed dim with numpy's ``np.pad`` modes (fill ->
  constant, extend -> edge, periodic -> wrap, reflect, symmetric); ``valid``
  does not pad, so only centres whose window fits are computed.
* ``stride={dim: s}`` keeps every s-th of those centres, starting at the first.
* Coordinates in the halo: linear extrapolation (fill/extend/valid), shifted
  by a period (periodic), mirrored about the edge point (reflect) or about
  the point half a spacing beyond the edge (symmetric).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = ["RefWindow", "reach", "pad", "pad_coord", "ref_map", "ref_mesh"]

NP_MODES = {"fill": "constant", "extend": "edge", "periodic": "wrap",
            "reflect": "reflect", "symmetric": "symmetric"}


def reach(window: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    out = {}
    for d, v in window.items():
        out[d] = ((v - 1) // 2, v // 2) if isinstance(v, int) else tuple(v)
    return out


def pad(x: np.ndarray, axis: int, lo: int, hi: int, mode: str, fill: Any) -> np.ndarray:
    if mode == "valid" or (lo == 0 and hi == 0):
        return x
    width = [(0, 0)] * x.ndim
    width[axis] = (lo, hi)
    if mode == "fill":
        return np.pad(x, width, mode="constant", constant_values=fill)
    return np.pad(x, width, mode=NP_MODES[mode])


def pad_coord(c: np.ndarray, lo: int, hi: int, mode: str, period: float | None = None
              ) -> np.ndarray:
    """The coordinate with its halo, one point at a time."""
    c = np.asarray(c, dtype=np.float64)
    n = len(c)

    def mirrored(p: int) -> float:
        # a position past an end is the mirror image, about that end's mirror
        # point, of the position it reflects to (recursively, for deep halos)
        if 0 <= p < n:
            return c[p]
        if mode == "reflect":
            return 2 * c[0] - mirrored(-p) if p < 0 else 2 * c[-1] - mirrored(2 * (n - 1) - p)
        if p < 0:
            return 2 * (c[0] - (c[1] - c[0]) / 2) - mirrored(-p - 1)
        return 2 * (c[-1] + (c[-1] - c[-2]) / 2) - mirrored(2 * n - 1 - p)

    out = []
    for p in range(-lo, n + hi):
        if 0 <= p < n:
            out.append(c[p])
        elif mode in ("fill", "extend", "valid"):
            out.append(c[0] + p * (c[1] - c[0]) if p < 0 else c[-1] + (p - n + 1) * (c[-1] - c[-2]))
        elif mode == "periodic":
            per = period if period is not None else n * (c[1] - c[0])
            out.append(c[p % n] + (p // n) * per)
        else:
            out.append(mirrored(p))
    return np.asarray(out)


def _op(fn: Callable[..., Any], reflected: bool = False) -> Callable[..., Any]:
    def method(self: RefWindow, other: Any) -> Any:
        other = other.array if isinstance(other, RefWindow) else other
        return fn(other, self.array) if reflected else fn(self.array, other)

    return method


class RefWindow:
    """A numpy window: ``data`` has one axis per dim in ``dims``; ``centre`` is
    the centre's index along each."""

    __array_priority__ = 1000

    def __init__(self, data: np.ndarray, dims: tuple[str, ...], centre: tuple[int, ...],
                 coords: dict[str, RefWindow] | None = None):
        self.data, self.dims, self.centre = data, dims, centre
        self.coords = coords or {}

    @property
    def array(self) -> np.ndarray:
        return self.data

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.data, dtype=dtype)

    def __call__(self, **offsets: int) -> Any:
        idx = list(self.centre)
        for d, o in offsets.items():
            if d in self.dims:
                idx[self.dims.index(d)] += o
        return self.data[tuple(idx)]

    def __getitem__(self, rel: Any) -> Any:
        rel = rel if isinstance(rel, tuple) else (rel,)
        return self.data[tuple(c + r for c, r in zip(self.centre, rel, strict=True))]

    def coord(self, d: str) -> RefWindow:
        return self.coords[d]

    def sum(self, *a: Any, **k: Any) -> Any:
        return self.data.sum(*a, **k)

    def max(self, *a: Any, **k: Any) -> Any:
        return self.data.max(*a, **k)

    def min(self, *a: Any, **k: Any) -> Any:
        return self.data.min(*a, **k)

    def mean(self, *a: Any, **k: Any) -> Any:
        return self.data.mean(*a, **k)

    __add__, __radd__ = _op(operator.add), _op(operator.add, True)
    __sub__, __rsub__ = _op(operator.sub), _op(operator.sub, True)
    __mul__, __rmul__ = _op(operator.mul), _op(operator.mul, True)
    __truediv__ = _op(operator.truediv)


def _centres(n: int, lo: int, hi: int, mode: str, stride: int) -> list[int]:
    """Input positions of the outputs along one dim."""
    if mode == "valid":
        return list(range(lo, n - hi, stride))
    return list(range(0, n, stride))


def ref_map(data: np.ndarray, dims: tuple[str, ...], kernel: Callable[..., Any], *,
            window: Mapping[str, Any], boundary: str | Mapping[str, str] = "fill",
            fill_value: Any = np.nan, stride: Mapping[str, int] | None = None,
            coords: Mapping[str, np.ndarray] | None = None,
            period: Mapping[str, float] | None = None,
            out_dtype: Any = None) -> tuple[np.ndarray, dict[str, list[int]]]:
    """``kernel`` at every output point; returns the result and, per dim, the
    input positions the outputs sit on."""
    data = np.asarray(data)
    r = reach(window)
    modes = {d: boundary if isinstance(boundary, str) else boundary.get(d, "fill")
             for d in dims}
    stride = dict(stride or {})
    padded = data
    pads = {}
    for ax, d in enumerate(dims):
        lo, hi = r.get(d, (0, 0))
        mode = modes[d] if (d in r or modes[d] == "valid") else "fill"
        pl, ph = (0, 0) if mode == "valid" else (lo, hi)
        pads[d] = (pl, ph, mode)
        padded = pad(padded, ax, pl, ph, mode, fill_value)
    cpad = {d: pad_coord(c, pads[d][0], pads[d][1], pads[d][2], (period or {}).get(d))
            for d, c in (coords or {}).items() if d in r}
    pos = {d: _centres(n, *r.get(d, (0, 0)), pads[d][2], stride.get(d, 1))
           for d, n in zip(dims, data.shape, strict=True)}
    wdims = tuple(d for d in dims if d in r)
    results = {}
    for point in itertools.product(*(pos[d] for d in dims)):
        sl, centre, cws = [], [], {}
        for d, p in zip(dims, point, strict=True):
            lo, hi = r.get(d, (0, 0))
            q = p + pads[d][0]  # padded index of the centre
            if d in r:
                sl.append(slice(q - lo, q + hi + 1))
                centre.append(lo)
                if d in cpad:
                    cws[d] = RefWindow(cpad[d][q - lo:q + hi + 1], (d,), (lo,))
            else:
                sl.append(q)
        win = RefWindow(padded[tuple(sl)], wdims, tuple(centre), cws)
        results[point] = np.asarray(kernel(win))
    sample = next(iter(results.values()))
    shape = tuple(len(pos[d]) for d in dims) + sample.shape
    out = np.empty(shape, dtype=out_dtype or data.dtype)
    for idx in itertools.product(*(range(len(pos[d])) for d in dims)):
        point = tuple(pos[d][i] for d, i in zip(dims, idx, strict=True))
        out[idx] = results[point]
    return out, pos


def ref_mesh(data: np.ndarray, dims: tuple[str, ...],
             regions: list[tuple[np.ndarray | None, Callable[..., Any]]], *,
             window: Mapping[str, Any], **options: Any) -> np.ndarray:
    """A mesh: ``regions`` are (boolean mask over the input, or None for
    everywhere; kernel); later ones win; uncovered points keep the input."""
    out, pos = ref_map(data, dims, lambda u: u(), window=window, **options)
    chosen = np.full(out.shape, -1)
    ix = np.ix_(*(pos[d] for d in dims))
    for k, (region, kern) in enumerate(regions):
        vals, _ = ref_map(data, dims, kern, window=window, **options)
        sel = np.ones(out.shape, bool) if region is None else np.asarray(region)[ix]
        out = np.where(sel, vals, out)
        chosen = np.where(sel, k, chosen)
    return out
