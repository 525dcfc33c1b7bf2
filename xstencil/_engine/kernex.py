"""The array API: a drop-in for kernex 0.2's ``kmap``, ``kscan``, ``smap``
and ``sscan``, lowered to fused whole-array slices.

Deliberate differences from kernex (see ``docs/kernex.rst``):

* a relative read outside the window raises ``IndexError`` while tracing
  (kernex rolls the window, so such reads wrap around silently);

Mesh rule: as in kernex, output positions that no mesh region covers get the
first registered function (so a mesh with a single region applies it
everywhere).  ``uncovered="input"`` opts in to the labelled API's rule:
uncovered positions keep their input value (the centre of their window).

Extensions: ``boundary=`` (one mode or one per axis) and ``fill_value=``
replace kernex's zero padding; the default stays zero fill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from xstencil._engine.advice import advice_for
from xstencil._engine.call import (
    as_array,
    is_weak,
    merge_static,
    precision,
    promote,
    split_static,
)
from xstencil._engine.fresh import fresh
from xstencil._engine.kcache import describe, new_memo, settle, values_key
from xstencil._engine.kscan import kscan_array
from xstencil._engine.kxargs import (
    MAX_HALO,
    check_fill,
    check_offsets,
    check_valid,
    index_text,
    intersect,
    normal,
    pair,
    parse_kernel_sizes,
    parse_modes,
    parse_named,
    parse_paddings,
    parse_strides,
    per_axis,
    region,
)
from xstencil._engine.lower import Source
from xstencil._engine.mesh import Slab, mesh_evaluate
from xstencil._engine.spec import AxisSpec, geometry
from xstencil._engine.window import Window
from xstencil._errors import KernelError, WindowIndexError, XStencilError

__all__ = ["kmap", "kscan", "smap", "sscan", "KernelMesh"]


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
        self._alias: dict[Any, Any] = {}  # values_key after a trace settled -> before
        self._memo = new_memo()

    @property
    def _call_name(self) -> str:
        return f"xstencil.{self._kind}"

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self._options.items() if v is not None)
        return f"<xstencil.{self._kind}({opts}) with {len(self._branches)} regions>"

    def __setitem__(self, index: Any, func: Any) -> None:
        if not callable(func):
            raise XStencilError(
                f"{self._call_name}: F[{index_text(index, bare=True)}] = {func!r:.60}: a mesh "
                f"region takes a kernel function, such as "
                f"F[{index_text(index, bare=True)}] = lambda x: x[0]"
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
                self._jitted = jax.jit(self._run, static_argnums=(2, 3))
            # the kernels' globals and closed-over arrays are traced as constants:
            # key the jit on their values, or a changed one reuses the old trace
            kernels = [self._func] if self._func is not None else \
                [f for _, f in self._branches]
            # a record of this transform's own: the shared one would hold its kernels alive
            lifted = describe(kernels, memo=self._memo)
            token = values_key(kernels, lifted)
            token = self._alias.get(token, token)
            out = self._jitted(x, dyn, static, token)
            if lifted.containers:  # a list the trace wrote to (a trace counter) is keyed by
                settle(lifted)  # identity from now on: the same code as the token it had
                after = values_key(kernels, describe(kernels, memo=self._memo))
                if after != token:
                    self._alias[after] = token
            return out

    # The traced body: everything static is known here (``token``: the kernels' values).
    def _run(self, x: Any, dyn: Any, static: Any, token: Any = None) -> Any:
        o = self._options
        call = self._call_name
        if x.ndim == 0:
            raise XStencilError(f"{call}: the input is a scalar; stencils need an array")
        sizes = parse_kernel_sizes(call, o["kernel_size"], x.shape)
        strides = parse_strides(call, o["strides"], x.ndim)
        modes = parse_modes(call, o["boundary"], x.ndim)
        names = parse_named(call, o["named_axis"], x.ndim)
        scanning = self._kind in ("kscan", "sscan")
        if self._kind in ("smap", "sscan"):
            # Every position is an output; the kernel runs on positions
            # range(lo, n - hi, stride) of each axis (see `keep` below).
            pads = [((k - 1) // 2, k // 2) for k in sizes]
            offsets = [pair(call, "offset", v, 0, o["offset"])
                       for v in per_axis(call, "offset", o["offset"], x.ndim)]
            check_offsets(call, o["offset"], offsets, pads, modes)
            steps = (1,) * x.ndim
        else:
            pads = parse_paddings(call, o["padding"], sizes)
            offsets = None
            check_valid(call, o["padding"], pads, modes)
            steps = strides
        check_fill(call, o["fill_value"], x.dtype, modes)
        for ax, ((lo, hi), n) in enumerate(zip(pads, x.shape, strict=True)):
            if max(lo, hi) > max(n, MAX_HALO):
                if "padding" in o:  # kmap, kscan
                    given, fix = f"padding={o['padding']!r:.60}", "'same', 'valid' or a smaller int"
                else:  # smap, sscan pad by the window: (k - 1) // 2 and k // 2
                    given, fix = f"kernel_size={o['kernel_size']!r:.60}", "a smaller kernel_size"
                raise XStencilError(
                    f"{call}: {given} pads axis {ax} (length {n}) by ({lo}, {hi}); padding "
                    f"wider than the data (or {MAX_HALO} cells) is not supported; use {fix}"
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
        keep_input = o["uncovered"] == "input" and self._func is None

        def wrap(func: Callable[..., Any]) -> Any:
            def kernel_call(cells: Sequence[Any], d: Any) -> Any:
                a, kw = merge_static(d, static)
                cell = cells[0]
                win = Window(cell, names, centre, rolled=relative, absolute=not relative,
                             label="x")
                try:
                    out = fresh(func)(win, *a, **kw)
                except (XStencilError, WindowIndexError) as e:
                    msg = str(e)
                    if msg.startswith(call):
                        raise
                    name = getattr(func, "__name__", repr(func))
                    raise type(e)(f"{call}: kernel {name!r}: {msg}") from None
                except Exception as e:  # a bug in the user's kernel
                    name = getattr(func, "__name__", repr(func))
                    detail, advice = str(e), advice_for(e)
                    if advice:  # JAX's long note hides what to do
                        detail = (detail.strip().splitlines() or [""])[0]
                    raise KernelError(
                        f"{call}: kernel {name!r} failed on a window of shape "
                        f"{tuple(cell.shape)} ({type(e).__name__}: {detail}){advice}"
                    ) from e
                try:
                    out = jax.numpy.asarray(out)
                except (TypeError, ValueError):
                    name = getattr(func, "__name__", repr(func))
                    raise XStencilError(
                        f"{call}: kernel {name!r} returned {type(out).__name__} "
                        f"({out!r:.60}); return a number or an array of numbers") from None
                if (scanning or self._kind == "smap") and out.shape != ():
                    name = getattr(func, "__name__", repr(func))
                    what = "a scan" if scanning else "smap (its output keeps the input's shape)"
                    raise XStencilError(
                        f"{call}: kernel {name!r} returned shape {out.shape}; {what} writes "
                        f"each result back into the array, so the kernel must return a scalar"
                    )
                if scanning or self._kind == "smap":
                    return out.astype(x.dtype)  # written back into the input's array
                if keep_input:
                    # uncovered cells keep the input: promote with the input's
                    # dtype (a Python scalar takes it, as in JAX), so that mesh
                    # regions and uncovered cells agree
                    return out.astype(promote(x.dtype, out))
                if is_weak(out):
                    # a Python scalar: kernex's dtype (int32/float32, or 64-bit
                    # with x64), not the data's; the array API is a drop-in for
                    # kernex, unlike the labelled map's JAX weak-type rule
                    return jax.lax.convert_element_type(out, out.dtype)
                return out  # kmap keeps the kernel's dtype (as the labelled map does)

            return kernel_call

        ident = self._identity(centre)
        if self._func is not None:
            whole = (Slab(tuple((0, c, 1) for c in counts)), wrap(self._func))
            branches = [whole]
        else:
            branches = [(region(call, idx, counts), wrap(f)) for idx, f in self._branches]
            if not keep_input:
                # kernex's rule: positions no region covers get the first
                # registered function (evaluated first, so every region wins)
                whole = Slab(tuple((0, c, 1) for c in counts))
                branches.insert(0, (whole, wrap(self._branches[0][1])))
        if offsets is not None:
            keep = Slab(tuple(normal(range(lo, n - hi, s)) for (lo, hi), n, s
                              in zip(offsets, counts, strides, strict=True)))
            branches = [(intersect(r, keep), f) for r, f in branches]
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
        if opts["uncovered"] not in ("first", "input"):
            raise XStencilError(
                f"xstencil.{kind}: uncovered={opts['uncovered']!r}; expected 'first' (kernex's "
                f"rule: mesh positions no region covers get the first registered function) or "
                f"'input' (they keep their input value)"
            )
        return KernelMesh(kind, func, opts)

    factory.__name__ = kind
    factory.__qualname__ = kind
    factory.__doc__ = _DOC.format(kind=kind, what=_WHAT[kind])
    return factory


_WHAT = {
    "kmap": "Map a kernel over every window of an array (kernex's ``kmap``)",
    "kscan": "Scan a kernel over the windows, writing each result back in place "
             "(kernex's ``kscan``)",
    "smap": "Map a kernel over the windows, keeping the input's shape (kernex's ``smap``)",
    "sscan": "Scan a kernel over the windows, keeping the input's shape (kernex's ``sscan``)",
}

_DOC = """{what}.

Takes kernex 0.2's arguments (``kernel_size``, ``strides``, ``padding`` or
``offset``, ``relative``, ``named_axis``, ``map_kind``/``scan_kind`` and their
kwargs) and gives kernex's numbers; see ``docs/kernex.rst``.  Use it as a
decorator, ``xstencil.{kind}(kernel_size=(3,))(kernel)``, or as a function
mesh, ``F = xstencil.{kind}(kernel_size=(3,)); F[1:] = kernel``.

Parameters
----------
func
    The kernel (optional: without it, decorate or assign mesh regions).
kernel_size, strides, padding, offset, relative, named_axis
    As in kernex 0.2.
boundary, fill_value
    Extensions: the halo mode (one or one per axis; default zero ``"fill"``
    as in kernex) and the fill value.
uncovered
    The mesh rule for positions no region covers: ``"first"`` (default, as in
    kernex) applies the first registered function there; ``"input"`` keeps
    their input value (the labelled API's rule).

Returns
-------
KernelMesh
    Call it on an array; extra arguments are passed to the kernel.

Examples
--------
>>> import jax.numpy as jnp, xstencil
>>> F = xstencil.kmap(kernel_size=(3,), padding="same", relative=True)
>>> F[0] = lambda x: x[0] * 0 + 2.0
>>> F[1] = lambda x: x[0] * 0 + 3.0
>>> F(jnp.arange(1.0, 7.0)).tolist()
[2.0, 3.0, 2.0, 2.0, 2.0, 2.0]
"""


_COMMON = {"kernel_size": None, "strides": 1, "relative": False, "named_axis": None,
           "boundary": "fill", "fill_value": 0, "uncovered": "first"}

kmap = _make("kmap", {**_COMMON, "padding": 0})
kscan = _make("kscan", {**_COMMON, "padding": 0})
smap = _make("smap", {**_COMMON, "offset": 0})
sscan = _make("sscan", {**_COMMON, "offset": 0})
