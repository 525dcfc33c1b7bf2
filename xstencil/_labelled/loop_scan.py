"""Grown scans on the CPU loop backend: the time loop over a generated map.

The simplest and most common scan grows a DataArray by ``steps=`` with a
kernel that reads only the previous position, ``u(time=-1, x=...)``.  Such a
kernel, applied to the previous state, is a spatial stencil of it: this
module runs the kernel as a map of the previous slab through the map's loop
generator (:mod:`xstencil._backends.loops`), with ``u(time=-1, x=a)`` read as
``u(x=a)``, and drives the time loop between two preallocated buffers
(saved positions are written straight into the preallocated trajectory):
from Python for the first step, then, once the nest is hot (scans have asked
it for :data:`~xstencil._backends.loop_steps.HOT_STEPS` steps in all), in
compiled chunks of many steps (:mod:`xstencil._backends.loop_steps`: a numba
driver that calls the same nest with the same buffers, on one thread or all
of numba's, whichever measures faster).  Each step performs the kernel's operations in the order it
writes them on the same boundary cells, so the result is a numpy time loop's,
bitwise; XLA:CPU may fuse a multiply-add or regroup a constant-weight sum,
so the XLA scan can differ by about one ulp per step (docs/performance.rst).

A Dataset grown the same way (coupled fields: ``s["u"](time=-1, x=1)``,
``s["v"](time=-1, y=-1)``, returning ``{"u": ..., "v": ...}``) runs as the
Dataset map of its previous state: one loop nest per step computes every
advanced variable from the previous positions of all of them (each variable
double-buffered, so every new value reads the old state, as the XLA step
does); variables without the scanned dim are constants, read as they are.

An advanced variable without some of the Dataset's dims (``s(time, x)``
next to ``T(time, y, x)``, checked by :mod:`~xstencil._labelled.scan_dims`
not to vary along them) is written by the loop over the whole field into a
scratch buffer, whose first cells along the missing dims are copied into its
state (:func:`~xstencil._labelled.scan_dims.short_buffers`), as the XLA
step keeps them.

Anything else (reads at other time offsets, coordinate reads, a kernel the
generator cannot express, a result dtype other than the state's, an advanced
variable whose dims are not in the Dataset's order, JAX or dask data, tracers,
``checkpoint`` or ``period``) returns ``None``: the caller runs the XLA scan,
silently.

``check_finite=True`` runs on the loops as on XLA: the initial state is
checked before the first step (the same error), and every step's new slabs
after the step (the XLA loop tests each step's new slabs too).  A map's
nest computes that itself as it writes (the variant of
:meth:`loops._Built.checked <xstencil._backends.loops._Built.checked>`:
``(x - x) == 0`` folded per row into a flag array ``fz``, which LLVM
vectorizes; compiled on the first checked scan, so scans without the check
run the nest they always ran); a mesh's nests, and scratch-buffer steps
(variables on fewer dims), read the new floating-point slabs after the step
with :func:`~xstencil._backends.finite.all_finite` (one serial read, which
cost 0.6-1 ms per step at 2048² float32, where the flags cost 0.1-0.2).
The initial state is read by ``all_finite`` too, and only a failing read
goes to XLA's check for the error.  The first position that holds a NaN or
Inf stops the loop (XLA runs on and reports it after) and raises XLA's
error, naming that position and its coordinate.

``progress=True`` runs on the loops too: the Python time loop moves the same
tqdm bar as the XLA loop (:class:`xstencil._progress.Progress`, same label),
between two steps, by the XLA loop's rule (:func:`xstencil._progress.advance`,
driven by :class:`xstencil._progress.Ticker`): the first report after one
step, then about :data:`~xstencil._progress.INTERVAL` seconds ahead at the
measured speed, early if the clock, read a few times in between, says the
loop slowed down.  The steps themselves are unchanged, so the result is
bitwise the one without a bar; a report costs about ten microseconds, about
five times a second.  A Ctrl-C (which the open bar turns into a flag) stops
the loop at the next report with ``KeyboardInterrupt``; the input was never
written, and the partial result is dropped.  The setup and the rewrap are the
XLA scan's own (:func:`~xstencil._labelled.scan_setup.plan_scan`,
:func:`~xstencil._labelled.scan_result.rewrap`).

A repeated call skips the setup as the XLA scan's does: the first call hands
a :class:`Repeat` (the compiled step and the plan) to the caller's ``keep``,
which records it in the repeat-call table of
:mod:`xstencil._labelled.scan_fast` under the same signature, coordinate
checks and kernel key; :func:`candidate` is part of that signature, so an
entry recorded for one route (loops or XLA) never serves a call that a fresh
run would send down the other.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import xarray as xr

from xstencil._backends import loop_steps
from xstencil._backends.hostwrap import wrap
from xstencil._backends.loops import (
    AUTO_MIN_POINTS,
    MAX_STATEMENTS,
    LoopOrJit,
    available,
    leaf_sig,
    resolve_mode,
)
from xstencil._backends.tiered import eager
from xstencil._engine.call import outside_transforms, precision, split_static
from xstencil._engine.fresh import fresh
from xstencil._engine.kcache import describe, rebuild
from xstencil._labelled import loop_scan_steps
from xstencil._labelled.core import kernel_caller, prepare, sources, unwrap
from xstencil._labelled.loop_previous import previous_kernel
from xstencil._labelled.loop_scan_steps import run_steps, step_sources
from xstencil._labelled.scan_loop import inputs
from xstencil._labelled.scan_plan import ScanPlan
from xstencil._labelled.scan_result import rewrap
from xstencil._labelled.scan_setup import plan_scan

__all__ = ["backend_mode", "candidate", "eligible", "loop_scan", "Repeat", "Fallback",
           "as_returned", "clear", "outputs", "previous_state", "run_steps", "step_sources"]

_LOG = logging.getLogger("xstencil.loops")
_BUILT: dict[Any, Any] = {}  # per kernel structure and layout: the loop, or why not
_MAX_BUILT = 64


def clear() -> None:
    """Drop every compiled time-loop step (``xstencil.clear_caches``)."""
    _BUILT.clear()


def _eligible(obj: Any, kernel: Any, o: ScanPlan, args: Any, kwargs: Any,
              backend: str | None) -> bool:
    return callable(kernel) and eligible(
        obj, o.dim, o.grown, bool(o.checkpoint or o.period), args, kwargs, backend)


def eligible(obj: Any, dim: str, grown: bool, other: bool, args: Any, kwargs: Any,
             backend: str | None) -> bool:
    """Whether a scan of the DataArray or Dataset ``obj`` may run on the loop
    backend (:func:`candidate`; for a Dataset, every data variable's array)."""
    if type(obj) is xr.DataArray:
        return candidate(obj, obj.variable._data, dim, grown, other, args, kwargs, backend)
    if type(obj) is not xr.Dataset or not obj.data_vars:
        return False
    variables = [obj._variables[n] for n in obj.data_vars]
    return _candidate(obj, [(v.dims, v._data) for v in variables], dim, grown, other, args,
                      kwargs, backend)


def candidate(obj: Any, data: Any, dim: str, grown: bool, other: bool, args: Any,
              kwargs: Any, backend: str | None) -> bool:
    """Whether a scan of the DataArray ``obj`` (``data``: its array) may run on
    the loop backend; the kernel and the state's dtype decide the rest
    (``grown``: ``steps=`` given; ``other``: ``checkpoint`` or ``period``; a
    ``progress`` bar and ``check_finite`` run on the loops)."""
    return _candidate(obj, [(obj.dims, data)], dim, grown, other, args, kwargs, backend)


def _candidate(obj: Any, variables: Sequence[tuple[tuple[Any, ...], Any]], dim: str,
               grown: bool, other: bool, args: Any, kwargs: Any, backend: str | None) -> bool:
    mode = resolve_mode(backend)  # first: a bad XSTENCIL_BACKEND is an error on every call
    if mode == "xla" or not available() or not grown or other:
        return False
    # under "auto", the size first: a repeated small scan is rejected here cheaply
    if mode == "auto":
        sizes = obj.sizes.items() if type(obj) is xr.Dataset \
            else zip(obj.dims, obj.shape, strict=True)
        if math.prod([n for d, n in sizes if d != dim]) < AUTO_MIN_POINTS:
            return False
    for dims, data in variables:
        if type(data) is not np.ndarray or data.dtype.kind not in "biuf" or not data.size:
            return False
        if dim in dims and data.shape[dims.index(dim)] != 1:
            return False
    if jax.default_backend() != "cpu":
        return False
    return outside_transforms(jax.tree_util.tree_leaves((args, kwargs)))


def backend_mode(backend: str | None) -> str:
    """``backend=`` of a scan, else the environment's choice, else ``"auto"``."""
    return resolve_mode(backend)


def _spatial(option: Any, dim: str) -> Any:
    if isinstance(option, Mapping):
        return {k: v for k, v in option.items() if k != dim}
    return option


def loop_scan(obj: Any, kernel: Any, o: ScanPlan, args: Any, kwargs: Any,
              backend: str | None, keep: Callable[..., None] | None = None) -> Any:
    """The scan of ``obj`` (already cast to the state dtype) on the loop
    backend, or ``None`` where it does not apply (the caller runs XLA).
    ``keep(sp, repeat, outs, out)``, if given, is told the plan, the
    :class:`Repeat` that reruns the loop, the loop's output and the result."""
    if not _eligible(obj, kernel, o, args, kwargs, backend):
        return None
    try:
        return _loop_scan(obj, kernel, o, args, kwargs, MAX_STATEMENTS[resolve_mode(backend)],
                          keep)
    except Fallback as e:
        _LOG.debug("scan runs with XLA: %s", e)
        return None


class Fallback(Exception):
    """The loops do not apply (the message says why): the caller runs XLA."""


def _loop_scan(obj: Any, kernel: Any, o: ScanPlan, args: Any, kwargs: Any,
               limit: int, keep: Callable[..., None] | None) -> Any:
    call = o.call
    udyn, static = split_static(call, (args, kwargs))
    lifted = describe([kernel])
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sp, f = plan_scan(obj, [kernel], o, args, kwargs, lifted, static, udyn)
        if caught:
            raise Fallback(f"setup warned: {caught[0].message}")
    except Fallback:
        raise
    except Exception as e:  # noqa: BLE001 - the XLA path decides and reports
        raise Fallback(f"{type(e).__name__}: {e}") from e
    with precision(f.arrays, args, kwargs):  # 64-bit data computes in 64 bits, as on XLA
        out, repeat, outs = _in_precision(obj, kernel, o, args, kwargs, limit, sp, f, lifted,
                                          static, udyn)
    out = as_returned(out, sp.names)  # outside x64, where 64-bit data goes to the host
    if keep is not None:
        keep(sp, repeat, outs, out)
    return out


def _in_precision(obj: Any, kernel: Any, o: ScanPlan, args: Any, kwargs: Any, limit: int,
                  sp: ScanPlan, f: Any, lifted: Any, static: Any, udyn: Any
                  ) -> tuple[Any, Repeat, list[np.ndarray]]:
    dim = o.dim
    slabs, consts, kept, plan = previous_state(o, sp, f, [kernel], args, kwargs)
    dleaves = jax.tree_util.tree_leaves(udyn)
    leaves = list(lifted.leaves)
    srcs = step_sources(slabs, consts, sp.evolving)
    key = (lifted.key, plan, static, tuple((x.shape, x.dtype.str) for x in srcs),
           tuple(map(leaf_sig, dleaves)), tuple(map(leaf_sig, leaves)),
           bool(jax.config.read("jax_enable_x64")), limit)
    try:
        hash(key)
    except TypeError as e:  # e.g. an unhashable static argument: XLA's path decides
        raise Fallback(f"uncacheable: {e}") from e
    built = _BUILT.get(key)
    if built is None:
        long = sp.loop.steps >= max(loop_steps.HOT_STEPS, loop_steps.MIN_STEPS)
        with eager(long):  # a long scan's nest: the driver's (parallel) build at once
            built = _build(plan, lifted, static, dim, kept, srcs, udyn, leaves, limit)
        if len(_BUILT) >= _MAX_BUILT:
            _BUILT.pop(next(iter(_BUILT)))
        _BUILT[key] = built
    if isinstance(built, str):
        raise Fallback(built)
    order = outputs(built, sp, slabs)
    outs = run_steps(built, sp, slabs, consts, order, dleaves, leaves)
    return rewrap(sp, f, obj, outs), Repeat(built, sp, order), outs


def previous_state(o: ScanPlan, sp: ScanPlan, f: Any, kernels: Sequence[Any], args: Any,
                   kwargs: Any) -> tuple[list[np.ndarray], list[np.ndarray | None],
                                         frozenset[str] | None, Any]:
    """The previous state as the loops read it: per advanced variable its
    initial slab, per variable its constant array (or ``None``), the names of
    a Dataset's constants (``None`` for a DataArray) and the plan of the map
    of that state by the kernels on their previous position; raises
    :class:`Fallback` where the loops do not apply."""
    call, dim = o.call, o.dim
    names = sp.plan.var_names
    try:
        if sp.k != 1:
            raise Fallback("not one initial position")
        arrays_in, init = inputs(sp, f.arrays)
        slabs, consts = _state(sp, arrays_in, init)
        sdims = [tuple(d for d in vd if d != dim) for vd in sp.plan.var_dims]
        if names is None:
            prev: Any = xr.DataArray(slabs[0], dims=sdims[0])
            kept = None
        else:
            prev = xr.Dataset({n: (sdims[i], slabs[sp.evolving.index(i)] if c is None else c)
                               for i, (n, c) in enumerate(zip(names, consts, strict=True))})
            kept = frozenset(n for n, c in zip(names, consts, strict=True) if c is not None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pf = unwrap(call, prev)
            pks = [previous_kernel(k, dim, kept) for k in kernels]
            plan = prepare(call, pf, pks, window=_spatial(o.window, dim),
                           boundary=_spatial(o.boundary, dim), fill_value=o.fill_value,
                           stride=None, output_dims=None, args=args, kwargs=kwargs)
        if caught:
            raise Fallback(f"setup warned: {caught[0].message}")
        if plan.coord_dims:
            raise Fallback("the kernel reads coordinates")
        if plan.var_dims != tuple(sdims) or any(
                sdims[i] != tuple(d for d in plan.dims if d in sdims[i]) for i in sp.evolving):
            raise Fallback("an advanced variable's dims are not in the Dataset's order")
    except Fallback:
        raise
    except Exception as e:  # noqa: BLE001 - the XLA path decides and reports
        raise Fallback(f"{type(e).__name__}: {e}") from e
    return slabs, consts, kept, plan


def _state(sp: ScanPlan, arrays_in: Sequence[Any], init: Sequence[Sequence[Any]]
           ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    """Per advanced variable its initial slab, and per variable its array
    if it is a constant (without ``dim``; ``None`` for advanced ones), all
    C-contiguous numpy arrays in the plan's dim order."""
    slabs = [np.ascontiguousarray(np.asarray(x[0])) for x in init]
    consts: list[np.ndarray | None] = []
    for i, a in enumerate(arrays_in):
        if i in sp.evolving:
            consts.append(None)
        elif a is None:
            raise Fallback("a variable along the scanned dim is not advanced")
        else:
            consts.append(np.ascontiguousarray(np.asarray(a)))
    return slabs, consts


def outputs(built: Any, sp: ScanPlan, slabs: Sequence[np.ndarray]) -> tuple[int, ...]:
    """Per loop output, the advanced variable (index into ``sp.evolving``) it
    is; each must have the state's dtype."""
    n = len(built.out_avals)
    tree = jax.tree_util.tree_unflatten(built.out_tree, list(range(n)))
    names = sp.names
    if names is None:
        if n != 1:
            raise Fallback("the kernel's result is not one array")
        order = (0,)
    else:
        if not isinstance(tree, Mapping) or sorted(tree) != sorted(names) or n != len(names):
            raise Fallback("the kernel's result is not one array per advanced variable")
        order = tuple(names.index(m) for m, _ in sorted(tree.items(), key=lambda kv: kv[1]))
    for m, j in enumerate(order):
        if np.dtype(built.out_avals[m].dtype) != slabs[j].dtype:
            raise Fallback("the kernel's result does not have the state's dtype")
    return order


class Repeat:
    """A loop scan rerun on new data (the repeat-call fast path), called as
    the XLA scan's compiled loop is: ``(arrays, init, coords, tcoord, masks,
    dyn, leaves, token) -> ([saved slabs, dim first], first bad position)``;
    only ``arrays`` (a Dataset's constants), ``init`` (the initial slabs),
    ``dyn`` (the kernel arguments' arrays), ``leaves`` (the kernel's
    closed-over arrays, read afresh) and ``token`` (the open progress bar to
    move, 0 for none) are used."""

    __slots__ = ("built", "sp", "order", "post")

    def __init__(self, built: Any, sp: ScanPlan, order: tuple[int, ...],
                 post: tuple[tuple[tuple[int, ...], ...], bool] | None = None):
        self.built, self.sp, self.order, self.post = built, sp, order, post

    def posted(self, perms: tuple[tuple[int, ...], ...], last: bool) -> Repeat:
        """This repeat with the fast path's ``post`` done on the host: per
        output, its first position only (``last``) and the transposition
        ``perms``; views of the loop's numpy outputs where no copy is needed,
        instead of an XLA program that copies every output."""
        return Repeat(self.built, self.sp, self.order, (perms, last))

    def __call__(self, arrays: Any, init: Any, coords: Any, tcoord: Any, masks: Any,
                 dyn: Any, leaves: Any, token: Any) -> tuple[list[Any], Any]:
        slabs, consts = _state(self.sp, arrays, init)
        outs = loop_scan_steps.run_loop(self.built, self.sp, slabs, consts, self.order,
                                        list(dyn), list(leaves), int(token))
        if self.post is not None:
            perms, last = self.post
            outs = [np.ascontiguousarray((x[0] if last else x).transpose(p))
                    for x, p in zip(outs, perms, strict=True)]
        # JAX arrays as the XLA loop returns (64-bit: under x64, then on the host)
        return [wrap(out) for out in outs], _NO_BAD


_NO_BAD = np.int32(-1)  # no bad position to report: with check_finite, run_loop raises itself


def _build(plan: Any, lifted: Any, static: Any, dim: str, kept: frozenset[str] | None,
           srcs: list[np.ndarray], udyn: Any, leaves: list[Any], limit: int) -> Any:
    """The compiled loop of one step (``loops._Built``), or why not (a string)."""

    def kern(cells: Any, dyn: Any, lv: Any) -> Any:
        k = previous_kernel(fresh(rebuild(lifted, lv)[0]), dim, kept)  # before wrapping it
        return kernel_caller(plan, k, static)(cells, dyn)

    lj = LoopOrJit(None, kern, lambda arrays, coords: sources(plan, arrays, coords), plan.geom,
                   "loops")
    built, _ = lj._build(srcs, [], udyn, leaves, limit)  # noqa: SLF001
    return built


def _host(x: Any) -> Any:
    """An array as the XLA scan returns it: a JAX array, but numpy for 64-bit
    data while JAX's x64 flag is off (see ``result.host64``)."""
    x = np.asarray(x)
    if x.dtype.itemsize >= 8 and not jax.config.read("jax_enable_x64"):
        # rewrap ran under x64 and may hand back a 64-bit JAX array, which the next
        # JAX operation outside x64 would truncate: numpy, as the XLA scan returns
        return x
    return wrap(x)  # jax.device_put(x), by its direct jaxlib call


def as_returned(out: Any, names: Sequence[str] | None) -> Any:
    """The result with its advanced variables' data as the XLA scan returns them."""
    if names is None:
        x = _host(out.data)
        return out if x is out.data else out.copy(data=x)
    for n in names:  # a Dataset made by rewrap for this call: set in place
        v = out.variables[n]
        v.data = _host(v.data)
    return out
