"""The array API: a drop-in for kernex 0.2's ``kmap``, ``kscan``, ``smap``
and ``sscan``, lowered to fused whole-array slices.

Deliberate differences from kernex (see ``docs/kernex.rst``):

* a relative read outside the window raises ``IndexError`` while tracing
  (kernex rolls the window, so such reads wrap around silently);
* output positions that no mesh region covers keep their input value (the
  centre of their window); kernex gives them the first registered function;
* a mesh with a single region applies it to that region only (kernex applies
  it everywhere).

Extensions: ``boundary=`` (one mode or one per axis) and ``fill_value=``
replace kernex's zero padding; the default stays zero fill.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from xstencil._engine.call import as_array, merge_static, precision, promote, split_static
from xstencil._engine.kscan import kscan_array
from xstencil._engine.lower import Source
from xstencil._engine.mesh import Mask, Slab, mesh_evaluate
from xstencil._engine.spec import AxisSpec, check_mode, geometry
from xstencil._engine.window import Window
from xstencil._errors import KernelError, WindowIndexError, XStencilError

__all__ = ["kmap", "kscan", "smap", "sscan", "KernelMesh"]


# -- argument parsing ----------------------------------------------------------

def _per_axis(call: str, arg: str, value: Any, ndim: int) -> tuple[Any, ...]:
    if isinstance(value, tuple | list):
        if len(value) != ndim:
            raise XStencilError(
                f"{call}: {arg}={value!r} has {len(value)} entries but the array has {ndim} "
                f"dims; give one entry per dim"
            )
        return tuple(value)
    return (value,) * ndim


def _kernel_sizes(call: str, kernel_size: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    if isinstance(kernel_size, numbers.Integral) and not isinstance(kernel_size, bool):
        kernel_size = (kernel_size,) * len(shape) if len(shape) == 1 else kernel_size
    if not isinstance(kernel_size, tuple | list):
        if isinstance(kernel_size, numbers.Integral) and not isinstance(kernel_size, bool):
            raise XStencilError(
                f"{call}: kernel_size={kernel_size!r} is a single int but the array has "
                f"{len(shape)} dims {shape}; give one size per dim, e.g. "
                f"kernel_size={(kernel_size,) * len(shape)!r}"
            )
        raise XStencilError(f"{call}: kernel_size={kernel_size!r} must be a tuple of ints")
    if len(kernel_size) != len(shape):
        raise XStencilError(
            f"{call}: kernel_size={tuple(kernel_size)!r} has rank {len(kernel_size)} but the "
            f"array has shape {shape}; give one size per dim (-1 means the whole dim)"
        )
    out = []
    for k, n in zip(kernel_size, shape, strict=True):
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or (k < 1 and k != -1):
            raise XStencilError(
                f"{call}: kernel_size={tuple(kernel_size)!r} holds {k!r}; sizes must be "
                f"positive ints, or -1 for the whole dim"
            )
        out.append(n if k == -1 else int(k))
    return tuple(out)


def _strides(call: str, strides: Any, ndim: int) -> tuple[int, ...]:
    out = _per_axis(call, "strides", strides, ndim)
    for s in out:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1:
            raise XStencilError(
                f"{call}: strides={strides!r} holds {s!r}; strides must be positive ints"
            )
    return tuple(int(s) for s in out)


def _pair(call: str, arg: str, value: Any, k: int, whole: Any) -> tuple[int, int]:
    if isinstance(value, str):
        if value == "same":
            return (k - 1) // 2, k // 2
        if value == "valid":
            return 0, 0
        raise XStencilError(
            f"{call}: {arg}={whole!r} holds {value!r}; use 'same', 'valid', an int or a "
            f"(lo, hi) pair"
        )
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value), int(value)
    if (isinstance(value, tuple | list) and len(value) == 2
            and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value)):
        return int(value[0]), int(value[1])
    raise XStencilError(
        f"{call}: {arg}={whole!r} holds {value!r}; use 'same', 'valid', an int or a (lo, hi) "
        f"pair of ints"
    )


def _paddings(call: str, padding: Any, sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    ndim = len(sizes)
    if isinstance(padding, str) or isinstance(padding, numbers.Integral):
        items: Sequence[Any] = (padding,) * ndim
    elif isinstance(padding, tuple | list):
        if (ndim == 1 and len(padding) == 2
                and all(isinstance(v, numbers.Integral) for v in padding)):
            items = (tuple(padding),)
        elif len(padding) != ndim:
            raise XStencilError(
                f"{call}: padding={padding!r} has {len(padding)} entries but the array has "
                f"{ndim} dims; give one entry per dim"
            )
        else:
            items = padding
    else:
        raise XStencilError(
            f"{call}: padding={padding!r} must be 'same', 'valid', an int, or one entry per dim"
        )
    return [_pair(call, "padding", p, k, padding) for p, k in zip(items, sizes, strict=True)]


def _modes(call: str, boundary: Any, ndim: int) -> tuple[str, ...]:
    modes = _per_axis(call, "boundary", boundary, ndim)
    return tuple(check_mode(call, "boundary", m) for m in modes)


def _named(call: str, named_axis: Any, ndim: int) -> tuple[str | None, ...]:
    names: list[str | None] = [None] * ndim
    if named_axis is None:
        return tuple(names)
    if not isinstance(named_axis, dict):
        raise XStencilError(
            f"{call}: named_axis={named_axis!r} must be a dict such as {{0: 'i', 1: 'j'}}"
        )
    for ax, name in named_axis.items():
        if isinstance(ax, bool) or not isinstance(ax, numbers.Integral) or not -ndim <= ax < ndim:
            raise XStencilError(
                f"{call}: named_axis={named_axis!r} names axis {ax!r}, but the array has "
                f"{ndim} dims"
            )
        if not isinstance(name, str) or not name.isidentifier():
            raise XStencilError(
                f"{call}: named_axis={named_axis!r} uses {name!r}; axis names must be "
                f"identifiers such as 'i'"
            )
        names[int(ax) % ndim] = name
    if len({n for n in names if n is not None}) != sum(n is not None for n in names):
        raise XStencilError(f"{call}: named_axis={named_axis!r} repeats a name")
    return tuple(names)


def _index_text(index: Any, bare: bool = False) -> str:
    """A mesh index as the user wrote it: ``1:``, ``0, ::2``, ``...``."""
    def one(i: Any) -> str:
        if isinstance(i, slice):
            text = ":".join("" if v is None else repr(v) for v in (i.start, i.stop))
            return text + ("" if i.step is None else f":{i.step!r}")
        if i is Ellipsis:
            return "..."
        if isinstance(i, np.ndarray | jax.Array):
            return f"<{i.dtype} array of shape {tuple(i.shape)}>"
        return repr(i)

    if isinstance(index, tuple):
        inner = ", ".join(one(i) for i in index)
        return inner if bare else f"({inner},)" if len(index) == 1 else f"({inner})"
    return one(index)


# -- mesh regions ----------------------------------------------------------------

def _region(call: str, index: Any, counts: tuple[int, ...]) -> Slab | Mask:
    """A numpy basic index (or boolean mask) over the output grid."""
    if isinstance(index, np.ndarray | jax.Array) and np.dtype(index.dtype) == np.bool_:
        if tuple(index.shape) != counts:
            raise XStencilError(
                f"{call}: a mask region has shape {tuple(index.shape)} but the output has "
                f"shape {counts}; give a boolean array of the output's shape"
            )
        return Mask(index)
    items = index if isinstance(index, tuple) else (index,)
    if sum(i is Ellipsis for i in items) > 1:
        raise XStencilError(f"{call}: mesh index {_index_text(index)} has more than one '...'")
    if any(i is Ellipsis for i in items):  # `in` would compare arrays elementwise
        k = next(j for j, i in enumerate(items) if i is Ellipsis)
        items = items[:k] + (slice(None),) * (len(counts) - len(items) + 1) + items[k + 1:]
    if len(items) > len(counts):
        raise XStencilError(
            f"{call}: mesh index {_index_text(index)} has {len(items)} entries but the "
            f"output has {len(counts)} dims"
        )
    items = items + (slice(None),) * (len(counts) - len(items))
    ranges = []
    for ax, (i, n) in enumerate(zip(items, counts, strict=True)):
        if isinstance(i, numbers.Integral) and not isinstance(i, bool):
            if not -n <= i < n:
                raise XStencilError(
                    f"{call}: mesh index {_index_text(index)} is out of range along axis "
                    f"{ax}, whose output length is {n}"
                )
            j = int(i) % n
            ranges.append((j, j + 1, 1))
        elif isinstance(i, slice):
            start, stop, step = i.indices(n)
            r = range(start, stop, step)
            if step < 0:
                r = r[::-1]
            ranges.append((r.start, r.start + len(r) * r.step if len(r) else r.start, r.step)
                          if len(r) else (0, 0, 1))
        else:
            raise XStencilError(
                f"{call}: mesh index {_index_text(index)} holds {i!r}; use ints, slices, '...' "
                f"or a boolean array"
            )
    return Slab(tuple(ranges))


# -- the callable ------------------------------------------------------------------

class KernelMesh:
    """A stencil transform of arrays, as returned by :func:`kmap` and friends.

    Call it on an array to run it.  Assign kernels to regions of the output
    (``F[1:, 0] = f``) to build a function mesh, or call it with a function to
    use it as a decorator.
    """

    def __init__(self, kind: str, func: Callable[..., Any] | None, options: dict[str, Any]):
        self._kind = kind
        self._func = func
        self._options = options
        self._branches: list[tuple[Any, Callable[..., Any]]] = []
        self._jitted: Any = None

    @property
    def _call_name(self) -> str:
        return f"xstencil.{self._kind}"

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self._options.items() if v is not None)
        return f"<xstencil.{self._kind}({opts}) with {len(self._branches)} regions>"

    def __setitem__(self, index: Any, func: Any) -> None:
        if not callable(func):
            raise XStencilError(
                f"{self._call_name}: F[{_index_text(index, bare=True)}] = {func!r:.60}: a mesh "
                f"region takes a kernel function, such as "
                f"F[{_index_text(index, bare=True)}] = lambda x: x[0]"
            )
        if self._func is not None:
            raise XStencilError(
                f"{self._call_name}: this transform already wraps {self._func!r}; build a "
                f"mesh from a transform without a function"
            )
        if isinstance(index, np.ndarray) or isinstance(index, jax.Array):
            index = np.asarray(index)
        self._branches.append((index, func))
        self._jitted = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if (self._func is None and not self._branches and len(args) == 1 and not kwargs
                and callable(args[0]) and not hasattr(args[0], "shape")):
            return KernelMesh(self._kind, args[0], self._options)
        if not args:
            raise XStencilError(f"{self._call_name}: call the transform with an array")
        if self._func is None and not self._branches:
            raise XStencilError(
                f"{self._call_name}: no kernel; decorate a function, or assign regions with "
                f"F[...] = kernel before calling"
            )
        array, rest = args[0], args[1:]
        with precision(array, rest, kwargs):
            x = as_array(self._call_name, "the input", array)
            dyn, static = split_static(self._call_name, (rest, kwargs))
            if self._jitted is None:
                self._jitted = jax.jit(self._run, static_argnums=(2,))
            return self._jitted(x, dyn, static)

    # The traced body: everything static is known here.
    def _run(self, x: Any, dyn: Any, static: Any) -> Any:
        o = self._options
        call = self._call_name
        if x.ndim == 0:
            raise XStencilError(f"{call}: the input is a scalar; stencils need an array")
        sizes = _kernel_sizes(call, o["kernel_size"], x.shape)
        strides = _strides(call, o["strides"], x.ndim)
        modes = _modes(call, o["boundary"], x.ndim)
        names = _named(call, o["named_axis"], x.ndim)
        scanning = self._kind in ("kscan", "sscan")
        if self._kind in ("smap", "sscan"):
            # Every position is an output; the kernel runs on positions
            # range(lo, n - hi, stride) of each axis (see `keep` below).
            pads = [((k - 1) // 2, k // 2) for k in sizes]
            offsets = [_pair(call, "offset", v, 0, o["offset"])
                       for v in _per_axis(call, "offset", o["offset"], x.ndim)]
            _check_offsets(call, o["offset"], offsets, pads, modes)
            steps = (1,) * x.ndim
        else:
            pads = _paddings(call, o["padding"], sizes)
            offsets = None
            _check_valid(call, o["padding"], pads, modes)
            steps = strides
        _check_fill(call, o["fill_value"], x.dtype, modes)
        for ax, ((lo, hi), n) in enumerate(zip(pads, x.shape, strict=True)):
            if max(lo, hi) > max(n, _MAX_HALO):
                raise XStencilError(
                    f"{call}: padding={o['padding']!r:.60} pads axis {ax} (length {n}) by "
                    f"({lo}, {hi}); padding wider than the data (or {_MAX_HALO} cells) is not "
                    f"supported; use 'same', 'valid' or a smaller int"
                )
        # a stride beyond the padded length gives one output, as that length does
        steps = tuple(min(s, max(n + lo + hi, 1))
                      for s, n, (lo, hi) in zip(steps, x.shape, pads, strict=True))
        specs = [AxisSpec((k - 1) // 2, k // 2, lo, hi, s, m)
                 for k, (lo, hi), s, m in zip(sizes, pads, steps, modes, strict=True)]
        for ax, (n, sp) in enumerate(zip(x.shape, specs, strict=True)):
            if n + sp.pad_lo + sp.pad_hi < sp.size:
                raise XStencilError(
                    f"{call}: kernel_size {sp.size} along axis {ax} is larger than the padded "
                    f"length {n + sp.pad_lo + sp.pad_hi} (length {n}, padding "
                    f"({sp.pad_lo}, {sp.pad_hi})); use a smaller kernel or more padding"
                )
        geom = geometry(x.shape, specs)
        counts = tuple(g.count for g in geom)
        centre = tuple(sp.lo for sp in specs)
        relative = bool(o["relative"])

        def wrap(func: Callable[..., Any]) -> Any:
            def kernel_call(cells: Sequence[Any], d: Any) -> Any:
                a, kw = merge_static(d, static)
                cell = cells[0]
                win = Window(cell, names, centre, rolled=relative, absolute=not relative,
                             label="x")
                try:
                    out = func(win, *a, **kw)
                except (XStencilError, WindowIndexError) as e:
                    msg = str(e)
                    if msg.startswith(call):
                        raise
                    name = getattr(func, "__name__", repr(func))
                    raise type(e)(f"{call}: kernel {name!r}: {msg}") from None
                except Exception as e:  # a bug in the user's kernel
                    name = getattr(func, "__name__", repr(func))
                    raise KernelError(
                        f"{call}: kernel {name!r} failed on a window of shape "
                        f"{tuple(cell.shape)} ({type(e).__name__}: {e})"
                    ) from e
                out = jax.numpy.asarray(out)
                if scanning and out.shape != ():
                    name = getattr(func, "__name__", repr(func))
                    raise XStencilError(
                        f"{call}: kernel {name!r} returned shape {out.shape}; a scan writes "
                        f"each result back into the array, so the kernel must return a scalar"
                    )
                if scanning or self._kind == "smap":
                    return out.astype(x.dtype)  # written back into the input's array
                # kmap keeps the kernel's precision, promoted with the input's so
                # that mesh regions and uncovered cells (which keep the input) agree
                return out.astype(promote(x.dtype, out))

            return kernel_call

        ident = self._identity(centre)
        if self._func is not None:
            whole = (Slab(tuple((0, c, 1) for c in counts)), wrap(self._func))
            branches = [whole]
        else:
            branches = [(_region(call, idx, counts), wrap(f)) for idx, f in self._branches]
        if offsets is not None:
            keep = Slab(tuple(_normal(range(lo, n - hi, s)) for (lo, hi), n, s
                              in zip(offsets, counts, strides, strict=True)))
            branches = [(_intersect(r, keep), f) for r, f in branches]
        fill = o["fill_value"]
        if scanning:
            return kscan_array(branches, ident, x, [(sp.pad_lo, sp.pad_hi) for sp in specs],
                               modes, fill, geom, dyn, centre)
        src = Source(x, tuple(range(x.ndim)), tuple(range(x.ndim)),
                     tuple((sp.pad_lo, sp.pad_hi) for sp in specs), modes, fill)
        return mesh_evaluate(branches, ident, [src], geom, dyn)

    @staticmethod
    def _identity(centre: tuple[int, ...]) -> Any:
        def keep(cells: Sequence[Any], d: Any) -> Any:
            return cells[0][centre]

        return keep


def _normal(r: range) -> tuple[int, int, int]:
    """``(start, stop, step)`` of a non-empty increasing range, or the empty one."""
    if not len(r):
        return (0, 0, 1)
    return (r[0], r[-1] + 1, r.step if len(r) > 1 else 1)


def _intersect(region: Slab | Mask, keep: Slab) -> Slab | Mask:
    """``region`` restricted to the slab ``keep``.  Two arithmetic progressions
    intersect in an arithmetic progression, so a slab stays a slab."""
    if isinstance(region, Mask):
        mask = np.zeros(np.shape(region.array), dtype=bool)
        mask[tuple(slice(*r) for r in keep.ranges)] = True
        return Mask(np.asarray(region.array) & mask)
    ranges = []
    for a, b in zip(region.ranges, keep.ranges, strict=True):
        common = sorted(set(range(*a)) & set(range(*b)))
        if not common:
            return Slab(tuple((0, 0, 1) for _ in region.ranges))
        step = common[1] - common[0] if len(common) > 1 else 1
        ranges.append((common[0], common[-1] + 1, step))
    return Slab(tuple(ranges))


#: The widest padding (cells per side) beyond the data's own length.
_MAX_HALO = 1024


def _check_fill(call: str, fill_value: Any, dtype: Any, modes: Sequence[str]) -> None:
    """``fill_value`` must be a number that the data's dtype can hold."""
    number = isinstance(fill_value, numbers.Number | np.generic) and not isinstance(
        fill_value, str) and np.ndim(fill_value) == 0
    if not number:
        raise XStencilError(
            f"{call}: fill_value={fill_value!r:.60} must be a number, such as fill_value=0"
        )
    dt = np.dtype(dtype)
    v = fill_value.item() if isinstance(fill_value, np.generic) else fill_value
    ok = True
    if isinstance(v, complex) and dt.kind != "c":
        ok = v.imag == 0
        v = v.real
    if dt.kind in "iu":
        ok = ok and not (isinstance(v, float) and not v.is_integer()) and bool(
            np.iinfo(dt).min <= v <= np.iinfo(dt).max)
    elif dt.kind == "b":
        ok = ok and v in (0, 1)
    if not ok and "fill" in modes:
        raise XStencilError(
            f"{call}: fill_value={fill_value!r} cannot be stored in {dt} data; pass a "
            f"fill_value that {dt} can hold, or convert the array with .astype(...)"
        )


def _check_valid(call: str, padding: Any, pads: Sequence[tuple[int, int]],
                 modes: Sequence[str]) -> None:
    """``boundary='valid'`` has no halo, so it cannot pad (it may trim)."""
    for ax, ((lo, hi), mode) in enumerate(zip(pads, modes, strict=True)):
        if mode == "valid" and (lo > 0 or hi > 0):
            raise XStencilError(
                f"{call}: boundary 'valid' along axis {ax} has no halo, but "
                f"padding={padding!r} pads it by ({lo}, {hi}); use padding='valid' (or 0) "
                f"along that axis, or a boundary that fills the halo such as 'fill'"
            )


def _check_offsets(call: str, offset: Any, offsets: Sequence[tuple[int, int]],
                   pads: Sequence[tuple[int, int]], modes: Sequence[str]) -> None:
    for ax, ((lo, hi), (reach_lo, reach_hi), mode) in enumerate(
            zip(offsets, pads, modes, strict=True)):
        if lo < 0 or hi < 0:
            raise XStencilError(
                f"{call}: offset={offset!r} holds ({lo}, {hi}) along axis {ax}; offsets "
                f"count positions skipped at each end and must be >= 0"
            )
        if mode == "valid" and (lo < reach_lo or hi < reach_hi):
            raise XStencilError(
                f"{call}: boundary 'valid' along axis {ax} has no halo, but "
                f"offset={offset!r} gives ({lo}, {hi}) there, so some windows reach past "
                f"the array; use an offset of at least ({reach_lo}, {reach_hi}) along that "
                f"axis, or a boundary that fills the halo such as 'fill'"
            )


def _make(kind: str, defaults: dict[str, Any]) -> Callable[..., Any]:
    def factory(func: Callable[..., Any] | None = None, /, **options: Any) -> KernelMesh:
        unknown = set(options) - set(defaults) - {"map_kind", "map_kwargs", "scan_kind",
                                                  "scan_kwargs"}
        if unknown:
            raise XStencilError(
                f"xstencil.{kind}: unknown argument(s) {sorted(unknown)!r}; accepted are "
                f"{sorted(defaults)!r}"
            )
        if "kernel_size" not in options:
            raise XStencilError(f"xstencil.{kind}: kernel_size is required, e.g. kernel_size=(3,)")
        opts = dict(defaults)
        opts.update({k: v for k, v in options.items() if k in defaults})
        return KernelMesh(kind, func, opts)

    factory.__name__ = kind
    factory.__qualname__ = kind
    return factory


_COMMON = {"kernel_size": None, "strides": 1, "relative": False, "named_axis": None,
           "boundary": "fill", "fill_value": 0}

kmap = _make("kmap", {**_COMMON, "padding": 0})
kscan = _make("kscan", {**_COMMON, "padding": 0})
smap = _make("smap", {**_COMMON, "offset": 0})
sscan = _make("sscan", {**_COMMON, "offset": 0})
