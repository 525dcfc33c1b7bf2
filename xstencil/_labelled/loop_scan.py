"""Grown scans on the CPU loop backend: the time loop over a generated map.

The simplest and most common scan grows a DataArray by ``steps=`` with a
kernel that reads only the previous position, ``u(time=-1, x=...)``.  Such a
kernel, applied to the previous state, is a spatial stencil of it: this
module runs the kernel as a map of the previous slab through the map's loop
generator (:mod:`xstencil._backends.loops`), with ``u(time=-1, x=a)`` read as
``u(x=a)``, and drives the time loop from Python between two preallocated
buffers (saved positions are written straight into the preallocated
trajectory).  Each step performs the XLA step's operations in the same order
on the same boundary cells, so the result is the XLA scan's, bitwise.

Anything else (a Dataset, reads at other time offsets, coordinate reads, a
kernel the generator cannot express, a result dtype other than the state's,
JAX or dask data, tracers, ``checkpoint``, ``check_finite`` or ``period``)
returns ``None``: the caller runs the XLA scan, silently.

``progress=True`` runs on the loops too: the Python time loop moves the same
tqdm bar as the XLA loop (:class:`xstencil._progress.Progress`, same label),
between two steps, by the XLA loop's rule (:func:`xstencil._progress.advance`):
the first report after one step, then about
:data:`~xstencil._progress.INTERVAL` seconds ahead at the measured speed,
early if the clock, read a few times in between, says the loop slowed down
(:class:`_Ticker`).  The steps themselves are unchanged, so the result is
bitwise the one without a bar; a report costs about ten microseconds, about
five times a second.  A Ctrl-C
(which the open bar turns into a flag) stops the loop at the next report with
``KeyboardInterrupt``; the input was never written, and the partial result is
dropped.  The setup and the rewrap are the
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
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import xarray as xr

from xstencil import _progress
from xstencil._backends.loops import (
    AUTO_MIN_POINTS,
    MAX_STATEMENTS,
    LoopOrJit,
    aligned_empty,
    available,
    leaf_sig,
    resolve_mode,
)
from xstencil._engine.call import outside_transforms, precision, split_static
from xstencil._engine.kcache import describe, rebuild
from xstencil._labelled.core import kernel_caller, prepare, sources, unwrap
from xstencil._labelled.scan_loop import inputs
from xstencil._labelled.scan_plan import ScanPlan
from xstencil._labelled.scan_result import rewrap
from xstencil._labelled.scan_setup import plan_scan

__all__ = ["backend_mode", "candidate", "loop_scan", "Repeat"]

_LOG = logging.getLogger("xstencil.loops")
_BUILT: dict[Any, Any] = {}  # per kernel structure and layout: the loop, or why not
_MAX_BUILT = 64


class _NotPrevious(Exception):
    """The kernel does something other than read the previous position."""


class _Previous:
    """The window a kernel sees: ``u(dim=-1, x=a)`` reads ``u(x=a)`` of the
    previous state; anything else raises :class:`_NotPrevious`."""

    __slots__ = ("_w", "_dim")

    def __init__(self, w: Any, dim: str):
        self._w, self._dim = w, dim

    def __call__(self, *positional: Any, **offsets: Any) -> Any:
        if positional or offsets.pop(self._dim, None) != -1:
            raise _NotPrevious("reads other than the previous position")
        return self._w(**offsets)

    def __getattr__(self, name: str) -> Any:
        raise _NotPrevious(f"window attribute {name!r}")


def _previous_kernel(kernel: Callable[..., Any], dim: str) -> Callable[..., Any]:
    def prev(u: Any, *args: Any, **kwargs: Any) -> Any:
        return kernel(_Previous(u, dim), *args, **kwargs)

    prev.__name__ = getattr(kernel, "__name__", "kernel")
    return prev


def _eligible(obj: Any, kernel: Any, o: ScanPlan, args: Any, kwargs: Any,
              backend: str | None) -> bool:
    return callable(kernel) and type(obj) is xr.DataArray and candidate(
        obj, obj.data, o.dim, o.grown, bool(o.checkpoint or o.check_finite or o.period),
        args, kwargs, backend)


def candidate(obj: Any, data: Any, dim: str, grown: bool, other: bool, args: Any,
              kwargs: Any, backend: str | None) -> bool:
    """Whether a scan of the DataArray ``obj`` (``data``: its array) may run on
    the loop backend; the kernel and the state's dtype decide the rest
    (``grown``: ``steps=`` given; ``other``: any of ``checkpoint``,
    ``check_finite`` or ``period``; a ``progress`` bar runs on the loops)."""
    mode = resolve_mode(backend)
    if mode == "xla" or not available():
        return False
    if type(data) is not np.ndarray or data.dtype.kind not in "biuf" or not data.size:
        return False
    if not grown or other:
        return False
    dims, shape = obj.dims, data.shape
    if dim in dims and shape[dims.index(dim)] != 1:
        return False
    if mode == "auto" and math.prod(s for d, s in zip(dims, shape, strict=True)
                                    if d != dim) < AUTO_MIN_POINTS:
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
    except _Fallback as e:
        _LOG.debug("scan runs with XLA: %s", e)
        return None


class _Fallback(Exception):
    pass


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
            raise _Fallback(f"setup warned: {caught[0].message}")
    except _Fallback:
        raise
    except Exception as e:  # noqa: BLE001 - the XLA path decides and reports
        raise _Fallback(f"{type(e).__name__}: {e}") from e
    with precision(f.arrays, args, kwargs):  # 64-bit data computes in 64 bits, as on XLA
        out, repeat, outs = _in_precision(obj, kernel, o, args, kwargs, limit, sp, f, lifted,
                                          static, udyn)
    out = _as_returned(out)  # outside the x64 context, where 64-bit data goes to the host
    if keep is not None:
        keep(sp, repeat, outs, out)
    return out


def _in_precision(obj: Any, kernel: Any, o: ScanPlan, args: Any, kwargs: Any, limit: int,
                  sp: ScanPlan, f: Any, lifted: Any, static: Any, udyn: Any
                  ) -> tuple[Any, Repeat, list[np.ndarray]]:
    call, dim = o.call, o.dim
    try:
        if sp.k != 1 or tuple(sp.evolving) != (0,):
            raise _Fallback("not one evolving variable with one initial position")
        arrays_in, init = inputs(sp, f.arrays)
        slab = np.ascontiguousarray(np.asarray(init[0][0]))
        state = np.dtype(slab.dtype)
        sdims = tuple(d for d in sp.plan.var_dims[0] if d != dim)
        prev = xr.DataArray(slab, dims=sdims)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pf = unwrap(call, prev)
            pk = _previous_kernel(kernel, dim)
            plan = prepare(call, pf, [pk], window=_spatial(o.window, dim),
                           boundary=_spatial(o.boundary, dim), fill_value=o.fill_value,
                           stride=None, output_dims=None, args=args, kwargs=kwargs)
        if caught:
            raise _Fallback(f"setup warned: {caught[0].message}")
        if plan.coord_dims:
            raise _Fallback("the kernel reads coordinates")
    except _Fallback:
        raise
    except Exception as e:  # noqa: BLE001 - the XLA path decides and reports
        raise _Fallback(f"{type(e).__name__}: {e}") from e
    dleaves = jax.tree_util.tree_leaves(udyn)
    leaves = list(lifted.leaves)
    key = (lifted.key, plan, static, slab.shape, slab.dtype.str, tuple(map(leaf_sig, dleaves)),
           tuple(map(leaf_sig, leaves)), bool(jax.config.read("jax_enable_x64")), limit)
    try:
        hash(key)
    except TypeError as e:  # e.g. an unhashable static argument: XLA's path decides
        raise _Fallback(f"uncacheable: {e}") from e
    built = _BUILT.get(key)
    if built is None:
        built = _build(plan, lifted, static, dim, slab, udyn, leaves, limit)
        if len(_BUILT) >= _MAX_BUILT:
            _BUILT.pop(next(iter(_BUILT)))
        _BUILT[key] = built
    if isinstance(built, str):
        raise _Fallback(built)
    if len(built.out_avals) != 1 or np.dtype(built.out_avals[0].dtype) != state:
        raise _Fallback("the kernel's result is not one array of the state's dtype")
    out = _with_bar(built, sp, slab, dleaves, leaves)
    return rewrap(sp, f, obj, [out]), Repeat(built, sp), [out]


def _with_bar(built: Any, sp: ScanPlan, slab: np.ndarray, dleaves: list[Any],
              leaves: list[Any]) -> np.ndarray:
    """:func:`_steps`, under a progress bar where the scan asks for one (as
    :func:`~xstencil._labelled.scan_result.call_with_progress` opens it for
    the XLA loop and for a repeated call)."""
    if not sp.loop.progress_every:
        return _steps(built, sp, slab, dleaves, leaves)
    with _progress.Progress(sp.loop.steps, _progress.label(sp.call)) as p:
        out = _steps(built, sp, slab, dleaves, leaves, p.token)
        if p.interrupted:  # Ctrl-C after the last report: the run finished anyway
            raise KeyboardInterrupt
    return out


class Repeat:
    """A loop scan rerun on new data (the repeat-call fast path), called as
    the XLA scan's compiled loop is: ``(arrays, init, coords, tcoord, masks,
    dyn, leaves, token) -> ([saved slabs, dim first], first bad position)``;
    only ``init`` (the initial slab), ``dyn`` (the kernel arguments' arrays),
    ``leaves`` (the kernel's closed-over arrays, read afresh) and ``token``
    (the open progress bar to move, 0 for none) are used."""

    __slots__ = ("built", "sp")

    def __init__(self, built: Any, sp: ScanPlan):
        self.built, self.sp = built, sp

    def __call__(self, arrays: Any, init: Any, coords: Any, tcoord: Any, masks: Any,
                 dyn: Any, leaves: Any, token: Any) -> tuple[list[Any], Any]:
        slab = np.ascontiguousarray(np.asarray(init[0][0]))
        out = _steps(self.built, self.sp, slab, list(dyn), list(leaves), int(token))
        # a JAX array as the XLA loop returns (64-bit: under x64, then on the host)
        return [jax.device_put(out)], _NO_BAD


_NO_BAD = np.int32(-1)  # no position was checked for NaN or Inf (check_finite is off)


def _build(plan: Any, lifted: Any, static: Any, dim: str, slab: np.ndarray, udyn: Any,
           leaves: list[Any], limit: int) -> Any:
    """The compiled loop of one step (``loops._Built``), or why not (a string)."""

    def kern(cells: Any, dyn: Any, lv: Any) -> Any:
        k = _previous_kernel(rebuild(lifted, lv)[0], dim)
        return kernel_caller(plan, k, static)(cells, dyn)

    lj = LoopOrJit(None, kern, lambda arrays, coords: sources(plan, arrays, coords), plan.geom,
                   "loops")
    built, _ = lj._build([slab], [], udyn, leaves, limit)  # noqa: SLF001
    return built


def _steps(built: Any, sp: ScanPlan, slab: np.ndarray, dleaves: list[Any],
           leaves: list[Any], token: int = 0) -> np.ndarray:
    """Run ``sp.loop.steps`` steps from ``slab``: the saved positions, dim
    first.  ``token``: the open progress bar (:mod:`xstencil._progress`) to
    move between steps (:class:`_Ticker`; 0: none, and the test for a due
    report never passes)."""
    loop = sp.loop
    params = [np.ascontiguousarray(np.asarray(x, dtype=p.dtype)).reshape(-1)
              for x, p in zip(list(dleaves) + list(leaves), built.params, strict=True)]
    fixed = [*built.tables, *built.fills, *params]
    every, steps = loop.every, loop.steps
    n = loop.saves + 1 if every else 1
    out = aligned_empty((n, *slab.shape), slab.dtype)
    if every:
        out[0] = slab
    cur = slab  # never written: it may share the caller's data
    spares = (aligned_empty(slab.shape, slab.dtype), aligned_empty(slab.shape, slab.dtype))
    tick = _Ticker(token)
    due = 1 if token else steps + 1  # the first report after one step: it times a step
    for t in range(1, steps + 1):
        if every and t % every == 0:
            nxt = out[t // every]
        elif not every and t == steps:
            nxt = out[0]
        else:
            nxt = spares[0] if cur is not spares[0] else spares[1]
        built.fn(nxt, cur, *fixed)
        cur = nxt
        if t >= due:
            due = tick(t)
    if not every and steps == 0:
        out[0] = slab
    return out


class _Ticker:
    """When the time loop moves bar ``token``: called after step ``done``
    when the step count it last returned comes due, it returns the next one.

    It reports (:func:`~xstencil._progress.advance`, the XLA loop's rule:
    the next report about :data:`~xstencil._progress.INTERVAL` seconds
    ahead at the speed measured since the last) when that report is due, and
    in between reads the clock four times per interval at that speed, to
    report early once ``INTERVAL`` seconds have passed: a loop that slows
    down by a factor ``f`` mid-interval still reports within about
    ``INTERVAL * (1 + f / 4)`` seconds, not ``INTERVAL * f``.  A Ctrl-C
    noted by the bar ends the loop as ``KeyboardInterrupt`` (the XLA loop's
    caller turns the aborted call into the same).
    """

    __slots__ = ("token", "at", "next", "every")

    def __init__(self, token: int):
        self.token, self.at, self.next, self.every = token, 0.0, 1, 1

    def __call__(self, done: int) -> int:
        now = time.perf_counter()
        if done >= self.next or now - self.at >= _progress.INTERVAL:
            try:
                self.next = int(_progress.advance(self.token, done))
            except _progress.Interrupted:
                raise KeyboardInterrupt from None
            self.at, self.every = now, max(1, (self.next - done) // 4)
        return min(self.next, done + self.every)


def _as_returned(out: xr.DataArray) -> xr.DataArray:
    """The data as the XLA scan returns it: a JAX array, but numpy for 64-bit
    data while JAX's x64 flag is off (see ``result.host64``)."""
    x = np.asarray(out.data)
    if x.dtype.itemsize >= 8 and not jax.config.read("jax_enable_x64"):
        # rewrap ran under x64 and may hand back a 64-bit JAX array, which the next
        # JAX operation outside x64 would truncate: numpy, as the XLA scan returns
        return out if type(out.data) is np.ndarray else out.copy(data=x)
    return out.copy(data=jax.device_put(x))
