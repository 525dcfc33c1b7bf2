"""A slow, obviously-correct numpy reference for the kernex-style array API.

Everything here is a plain Python loop over output positions; nothing is
vectorised and nothing is clever.  The tests compare ``xstencil.kmap``,
``kscan``, ``smap`` and ``sscan`` (and their function meshes) against
:func:`stencil`.

Semantics (KERNEX_SEMANTICS.md, plus xstencil's documented choices):

* The array is extended along each axis by its boundary mode (numpy's
  ``np.pad`` modes: ``fill`` -> ``constant``, ``extend`` -> ``edge``,
  ``periodic`` -> ``wrap``, ``reflect``, ``symmetric``); ``(lo, hi)`` padding
  selects ``[-lo, n + hi)`` of that extension, so negative padding trims.
  ``valid`` has no halo at all.
* kmap/kscan: output ``j`` along an axis reads the window starting at padded
  index ``j * stride``; there are ``(n + lo + hi - k) // stride + 1`` outputs.
  The window's centre is at ``(k - 1) // 2`` (even sizes lean left).
* smap/sscan: windows are centred on each position (``same`` padding) and the
  kernel runs at positions ``range(lo, n - hi, stride)`` of each axis; every
  other position passes the input through.
* kscan/sscan: output positions are visited in row-major order and each
  result is written into the padded working array at the window's centre
  before the next window is read.
* relative=True: index 0 is the centre, negative indices reach left (the
  window is rolled, as in kernex).  Named axes (``x["i+1", 0]``) are offsets
  relative to the centre.
* Meshes: the last region (numpy basic index or boolean mask over the output
  grid) containing a position picks its kernel; positions that no region
  covers keep their input value (the centre of their window).
* Scans and smap cast every result to the input's dtype (they write into the
  input's array); kmap keeps the kernel's dtype promoted with the input's
  (``out_dtype``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "NP_MODES",
    "RefWindow",
    "array_kernels",
    "data_dependent_kernel",
    "extend",
    "offset_kernel",
    "resolve",
    "stencil",
]

NP_MODES = {
    "fill": "constant",
    "extend": "edge",
    "periodic": "wrap",
    "reflect": "reflect",
    "symmetric": "symmetric",
}


def extend(x: np.ndarray, pads: Sequence[tuple[int, int]], modes: Sequence[str],
           fill_value: Any = 0) -> np.ndarray:
    """``x`` padded by ``pads`` (negative trims), one axis at a time."""
    for ax, ((lo, hi), mode) in enumerate(zip(pads, modes, strict=True)):
        width = [(0, 0)] * x.ndim
        width[ax] = (max(lo, 0), max(hi, 0))
        if mode == "valid":
            # no halo: smap/sscan windows never read it (their offsets keep
            # the kernel inside), so a NaN there shows up if one ever is
            hole = np.nan if x.dtype.kind in "fc" else fill_value
            x = np.pad(x, width, mode="constant", constant_values=hole)
        elif mode == "fill":
            x = np.pad(x, width, mode="constant", constant_values=fill_value)
        else:
            x = np.pad(x, width, mode=NP_MODES[mode])
        n = x.shape[ax]
        index = [slice(None)] * x.ndim
        index[ax] = slice(max(-lo, 0), n - max(-hi, 0))
        x = x[tuple(index)]
    return x


def direct_correlate(a: np.ndarray, w: np.ndarray, mode: str, fill: float = 0.0,
                     steps: tuple[int, ...] | None = None) -> np.ndarray:
    """``sum_c w[c] * a[j + c - (k - 1) // 2]`` over the cells of nonzero
    (real) weight only, so a cell of weight 0 is not read, in float64 on
    ``a`` padded by ``mode`` (:func:`extend`; an even window's centre is the
    lower of its middle two cells), every ``steps``-th point."""
    pads = [((k - 1) // 2, k // 2) for k in w.shape]
    p = extend(a.astype(np.float64), pads, [mode] * a.ndim, fill)
    out = np.zeros(a.shape, np.float64)
    with np.errstate(invalid="ignore"):
        for cell in zip(*np.nonzero(w), strict=True):
            out = out + float(w[cell]) * p[tuple(slice(c, c + n)
                                                  for c, n in zip(cell, a.shape, strict=True))]
    if steps is not None:
        out = out[tuple(slice(None, None, s) for s in steps)]
    return out


def integer_correlate(a: np.ndarray, w: np.ndarray, mode: str, fill: int = 0,
                      stride: tuple[int, ...] | None = None) -> np.ndarray:
    """``sum_c w[c] * a[i + c - k // 2]`` in numpy's int64 (Python ints
    for an object array), ``a`` padded by ``mode`` (:func:`extend`), every
    ``stride``-th point: the exact integer window sum of a kernel."""
    pads = [(k // 2, k - 1 - k // 2) for k in w.shape]
    p = extend(a.astype(np.int64), pads, [mode] * a.ndim, fill)
    out = np.zeros(a.shape, np.int64)
    for cell in np.ndindex(*w.shape):
        if w[cell]:
            out += int(w[cell]) * p[tuple(slice(c, c + n) for c, n in zip(cell, a.shape,
                                                                         strict=True))]
    if stride is not None:
        out = out[tuple(slice(None, None, s) for s in stride)]
    return out


def _pair(p: Any, k: int) -> tuple[int, int]:
    if p == "same":
        return (k - 1) // 2, k // 2
    if p == "valid":
        return 0, 0
    if isinstance(p, int):
        return p, p
    lo, hi = p
    return int(lo), int(hi)


def _per_axis(value: Any, ndim: int) -> list[Any]:
    return list(value) if isinstance(value, tuple | list) else [value] * ndim


def resolve(kind: str, shape: tuple[int, ...], kernel_size: Any, strides: Any = 1,
            padding: Any = 0, offset: Any = 0, boundary: Any = "fill") -> dict[str, Any]:
    """Sizes, paddings, strides, modes and (smap/sscan) offsets per axis."""
    ndim = len(shape)
    ks = (kernel_size,) if isinstance(kernel_size, int) else tuple(kernel_size)
    ks = tuple(n if k == -1 else k for k, n in zip(ks, shape, strict=True))
    st = tuple(_per_axis(strides, ndim))
    modes = tuple(_per_axis(boundary, ndim))
    if kind in ("smap", "sscan"):
        pads = [((k - 1) // 2, k // 2) for k in ks]
        offs = [_pair(o, 0) for o in _per_axis(offset, ndim)]
    else:
        if isinstance(padding, str | int):
            items = [padding] * ndim
        elif ndim == 1 and len(padding) == 2 and all(isinstance(v, int) for v in padding):
            items = [tuple(padding)]
        else:
            items = list(padding)
        pads = [_pair(p, k) for p, k in zip(items, ks, strict=True)]
        offs = None
    return {"sizes": ks, "pads": pads, "strides": st, "modes": modes, "offsets": offs}


_NAME = re.compile(r"^([A-Za-z_]\w*)([+-]\d+)?$")


class RefWindow:
    """A window read with kernex's named axes: ``x["i+1", 0]`` (offsets
    relative to the centre; ints on unnamed axes)."""

    def __init__(self, data: np.ndarray, names: Sequence[str | None], centre: Sequence[int]):
        self.data = data
        self.names = list(names)
        self.centre = tuple(centre)

    def __getitem__(self, key: Any) -> Any:
        items = key if isinstance(key, tuple) else (key,)
        assert len(items) == self.data.ndim
        off = [0] * self.data.ndim
        for pos, k in enumerate(items):
            if isinstance(k, str):
                m = _NAME.match(k.replace(" ", ""))
                assert m is not None, k
                ax = self.names.index(m.group(1))
                off[ax] = int(m.group(2) or 0)
            else:
                off[pos] = int(k)
        idx = tuple(c + o for c, o in zip(self.centre, off, strict=True))
        assert all(0 <= i < n for i, n in zip(idx, self.data.shape, strict=True)), idx
        return self.data[idx]


def _window_view(win: np.ndarray, centre: tuple[int, ...], relative: bool,
                 names: Sequence[str | None]) -> Any:
    if any(n is not None for n in names):
        return RefWindow(win, names, centre)
    if relative:
        return np.roll(win, [-c for c in centre], axis=tuple(range(win.ndim)))
    return win


def _region_mask(index: Any, counts: tuple[int, ...]) -> np.ndarray:
    mask = np.zeros(counts, dtype=bool)
    if isinstance(index, np.ndarray) and index.dtype == bool:
        return index.copy()
    mask[index] = True
    return mask


def stencil(
    kind: str,
    x: Any,
    kernel: Callable[..., Any] | None = None,
    *,
    regions: Sequence[tuple[Any, Callable[..., Any]]] = (),
    kernel_size: Any,
    strides: Any = 1,
    padding: Any = 0,
    offset: Any = 0,
    relative: bool = False,
    named_axis: dict[int, str] | None = None,
    boundary: Any = "fill",
    fill_value: Any = 0,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    out_dtype: Any = None,
    uncovered: str = "first",
) -> np.ndarray:
    """The output of ``xstencil.<kind>`` for ``kernel`` (or the mesh
    ``regions``, a list of ``(index, kernel)`` in assignment order).

    Mesh positions no region covers get the first region's kernel (kernex's
    rule, ``uncovered="first"``) or keep their input (``uncovered="input"``).

    Scans and smap write into the input's array, so their results have its
    dtype.  kmap keeps the kernel's dtype promoted with the input's; numpy's
    promotion differs from JAX's, so give that dtype as ``out_dtype`` when it
    is not the input's.
    """
    x = np.asarray(x)
    kwargs = kwargs or {}
    r = resolve(kind, x.shape, kernel_size, strides, padding, offset, boundary)
    ks, pads, st, modes = r["sizes"], r["pads"], r["strides"], r["modes"]
    centre = tuple((k - 1) // 2 for k in ks)
    names: list[str | None] = [None] * x.ndim
    for ax, name in (named_axis or {}).items():
        names[ax % x.ndim] = name
    work = extend(x, pads, modes, fill_value)

    if kind in ("smap", "sscan"):
        # every position is an output; the kernel runs on a strided sub-box
        counts = x.shape
        step = [1] * x.ndim
        box = [set(range(lo, n - hi, s)) for (lo, hi), n, s in
               zip(r["offsets"], x.shape, st, strict=True)]
    else:
        counts = tuple((n + lo + hi - k) // s + 1
                       for n, (lo, hi), k, s in zip(x.shape, pads, ks, st, strict=True))
        step = list(st)
        box = None

    if kernel is not None:
        regions = [(Ellipsis, kernel)]
    masks = [(_region_mask(idx, counts), f) for idx, f in regions]

    def pick(pos: tuple[int, ...]) -> Callable[..., Any] | None:
        if box is not None and not all(p in b for p, b in zip(pos, box, strict=True)):
            return None
        chosen = None
        for m, f in masks:
            if m[pos]:
                chosen = f
        if chosen is None and masks and uncovered == "first":
            chosen = masks[0][1]
        return chosen

    scanning = kind in ("kscan", "sscan")
    results: dict[tuple[int, ...], Any] = {}
    for pos in itertools.product(*(range(c) for c in counts)):
        start = [p * s for p, s in zip(pos, step, strict=True)]
        win = work[tuple(slice(a, a + k) for a, k in zip(start, ks, strict=True))]
        f = pick(pos)
        if f is None:
            val = np.asarray(win[centre])
        else:
            val = np.asarray(f(_window_view(win.copy(), centre, relative, names),
                               *args, **kwargs))
        if scanning:
            assert val.shape == (), "scan kernels return scalars"
            target = tuple(a + c for a, c in zip(start, centre, strict=True))
            work[target] = val.astype(x.dtype)
        results[pos] = val

    if scanning:
        index = tuple(slice(c, c + s * (n - 1) + 1, s)
                      for c, s, n in zip(centre, step, counts, strict=True))
        return work[index].astype(x.dtype)
    cell_shape = np.shape(next(iter(results.values()))) if results else ()
    dtype = x.dtype if out_dtype is None or kind == "smap" else np.dtype(out_dtype)
    out = np.empty(counts + cell_shape, dtype=dtype)
    for pos, val in results.items():
        out[pos] = np.asarray(val).astype(dtype)
    return out


# -- kernels usable with numpy (the reference) and jax.numpy (xstencil) ---------

def array_kernels(xp: Any, ks: Sequence[int], dtype: Any) -> dict[str, Callable[[Any], Any]]:
    """Kernels that use the window as an array.  ``xp`` is ``numpy`` for the
    reference and ``jax.numpy`` for xstencil; every constant has ``dtype``
    (JAX runs with strict dtype promotion in the tests)."""
    ks = tuple(ks)
    w = (np.arange(int(np.prod(ks))).reshape(ks) % 5 - 2).astype(dtype)
    v = (np.arange(ks[-1]) % 3 + 1).astype(dtype)
    return {
        "sum_w": lambda x: xp.sum(x * w),
        "max": lambda x: x.max(),
        "mean": lambda x: xp.mean(x),
        "matvec": lambda x: x @ v,
        "where": lambda x: xp.sum(xp.where(x > x.ravel()[0], x, 2 * x)),
        "median": lambda x: xp.median(x),
    }


def data_dependent_kernel(xp: Any) -> Callable[[Any], Any]:
    """Indexing by a data-dependent position: only the fallback can run it."""
    return lambda x: x.ravel()[xp.argmax(x)]


def offset_kernel(ks: Sequence[int], relative: bool,
                  cells: Sequence[Sequence[int]] | None = None) -> Callable[[Any], Any]:
    """Pure offset reads: a weighted sum of a few window cells, given as
    absolute window indices (``cells``; by default the first, centre and last
    cells) and read with relative or absolute indices."""
    centre = tuple((k - 1) // 2 for k in ks)
    if cells is None:
        cells = [tuple(0 for _ in ks), centre, tuple(k - 1 for k in ks)]
    idxs = [tuple(int(c) - ce for c, ce in zip(cell, centre, strict=True)) if relative
            else tuple(int(c) for c in cell) for cell in cells]
    coefs = [3 - 2 * i for i in range(len(idxs))]  # ints keep the dtype

    def kernel(x: Any) -> Any:
        out = x[idxs[0]] * coefs[0]
        for c, i in zip(coefs[1:], idxs[1:], strict=True):
            out = out + x[i] * c
        return out

    return kernel
