"""The end of a scan (:mod:`xstencil._labelled.scan`): calling the compiled loop
(with its progress bar), the ``check_finite`` error, and rewrapping the saved
positions as a DataArray or Dataset."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from xstencil import _progress
from xstencil._engine.call import settled
from xstencil._errors import XStencilError
from xstencil._labelled.core import Fields
from xstencil._labelled.result import host64
from xstencil._labelled.scan_plan import ScanPlan

__all__ = ["call_with_progress", "finite", "initial_finite", "not_finite", "rewrap"]


def call_with_progress(fn: Any, runargs: Any, every: int, steps: int, call: str) -> Any:
    """``fn(*runargs, token)``, under a progress bar of ``steps`` steps when the
    loop reports every ``every`` steps (0: no bar, token 0)."""
    if not every:
        return settled(fn(*runargs, jnp.asarray(0, jnp.int32)), runargs)
    with _progress.Progress(steps, _progress.label(call)) as p:
        try:
            # not settled(), which would wait inside the runtime (for numpy inputs):
            # _wait waits in Python, where a Ctrl-C runs its handler at once
            # whatever the runtime does; the result is computed before returning
            # all the same (the block below)
            out = fn(*runargs, jnp.asarray(p.token, jnp.int32))
            _wait(out)
            jax.block_until_ready(out)
        except jax.errors.JaxRuntimeError as e:
            # Ctrl-C: the progress callback aborted the loop (see xstencil._progress)
            if p.interrupted:
                raise KeyboardInterrupt from e
            raise
        if p.interrupted:  # Ctrl-C after the last update: the run finished anyway
            raise KeyboardInterrupt
    return out


def _wait(out: Any) -> None:
    """Wait until ``out`` is computed, in Python, not inside the runtime, so
    that a Ctrl-C runs its handler (which the next progress update turns into
    an abort of the loop).  A helper thread blocks on the result and wakes
    this one at once; the timeout only lets a pending signal handler run.
    (Polling ``is_ready`` every 20 ms instead cost 10 ms per call on average,
    about 1.5 % of a 0.6 s scan.)"""
    leaves = [x for x in jax.tree_util.tree_leaves(out) if hasattr(x, "is_ready")]
    if all(x.is_ready() for x in leaves):
        return
    ready = threading.Event()

    def block() -> None:
        try:
            jax.block_until_ready(leaves)
        except Exception:  # the caller waits again, in its thread, and raises it
            pass
        finally:
            ready.set()

    threading.Thread(target=block, name="xstencil-progress-wait", daemon=True).start()
    while not ready.wait(0.05):
        pass


def finite(call: str, bad: Any, tvals: Any, dim: str) -> None:
    """Raise for ``check_finite=True`` when the loop reported the first
    position ``bad`` (>= 0) holding a NaN or Inf; ``tvals`` labels it."""
    if isinstance(bad, jax.core.Tracer):
        # inside jax.jit/vmap/grad/lax loops: check when the values exist, from a
        # callback; the error reaches the caller wrapped in a JaxRuntimeError
        # that carries this message (as equinox's error_if does)
        def check(b: Any) -> None:
            b = np.asarray(b).ravel()
            hit = b[b >= 0]
            if hit.size:
                raise not_finite(call, dim, tvals, int(hit.min()),
                                 " (raised inside a JAX transform)")

        jax.debug.callback(check, bad)
        return
    if int(bad) >= 0:
        raise not_finite(call, dim, tvals, int(bad))


def initial_finite(call: str, init: Sequence[Sequence[Any]], dim: str, k: int) -> None:
    """Raise for ``check_finite=True`` when the initial state (the first
    ``k`` positions along ``dim``, given in ``init``) already holds a NaN or
    Inf: the scan did not produce it, so the time step is not to blame."""
    for slabs in init:
        for x in slabs:
            if isinstance(x, jax.core.Tracer) or not jnp.issubdtype(x.dtype, jnp.inexact):
                continue
            if not bool(jnp.all(jnp.isfinite(x))):
                where = f"position 0 along {dim!r}" if k <= 1 else \
                    f"the first {k} positions along {dim!r}"
                raise XStencilError(
                    f"{call}: check_finite=True: the initial state ({where}) already holds "
                    f"a NaN or Inf, before any step; fix the input (e.g. "
                    f"obj.fillna(...) or a mask) rather than the time step")


def not_finite(call: str, dim: str, tvals: Any, position: int, where: str = "") -> XStencilError:
    """The ``check_finite=True`` error for the first bad ``position`` along
    ``dim``, whose coordinate values are ``tvals`` (or ``None``)."""
    label = f" ({dim}={np.asarray(tvals)[position]})" if tvals is not None else ""
    return XStencilError(
        f"{call}: check_finite=True: a NaN or Inf first appeared at position {position} along "
        f"{dim!r}{label}{where}; check the time step (stability) and the boundary values")


def rewrap(s: ScanPlan, f: Fields, obj: Any, outs: Sequence[Any]) -> Any:
    """The saved slabs ``outs`` (one per advanced variable, dim first) as a
    DataArray or Dataset like ``obj``; ``f`` (from :func:`~xstencil._labelled.
    scan_setup.setup`) holds the trajectory's coordinates."""
    outs = host64(outs)
    dim, plan, evolving = s.dim, s.plan, s.evolving
    assert plan is not None
    pos = s.positions
    coords = f.obj.coords.to_dataset()
    if dim in coords.dims:
        coords = coords.isel({dim: pos})
    datas = {}
    for i, x in zip(evolving, outs, strict=True):
        ax = list(plan.var_dims[i]).index(dim)
        # numpy for host results (float64 with x64 off): a jnp op would truncate them
        move = np.moveaxis if isinstance(x, np.ndarray) else jnp.moveaxis
        datas[i] = move(x, 0, ax) if ax else x
    if plan.var_names is None:
        out: Any = xr.DataArray(datas[0], dims=plan.var_dims[0], coords=coords.coords,
                                name=obj.name, attrs=dict(obj.attrs))
        own = tuple(obj.dims) if dim in obj.dims else (dim, *obj.dims)
        if out.dims != own:  # a block scan's plan has dim first
            out = out.transpose(*own, transpose_coords=False)
        if out.name is not obj.name:  # a dask array lends its own name
            out.name = obj.name
    else:
        names = [plan.var_names[i] for i in evolving]
        rest = obj.drop_vars(names)
        if s.grown:
            rest = rest.drop_vars([n for n, v in rest.variables.items() if dim in v.dims])
            rest = rest.assign_coords(coords.coords)
        elif dim in rest.dims:  # without: every variable along dim is advanced
            rest = rest.isel({dim: pos})
        for i, n in zip(evolving, names, strict=True):
            da = xr.DataArray(datas[i], dims=plan.var_dims[i], attrs=dict(obj[n].attrs))
            own = tuple(obj[n].dims)
            order = [d for d in (own if dim in own else (dim,) + own) if d in da.dims]
            order += [d for d in da.dims if d not in order]
            rest[n] = da.transpose(*order)
        out = rest[[str(n) for n in obj.data_vars]]
    return out.isel({dim: 0}) if s.every == 0 else out
