"""The in-memory scan's loop (:mod:`xstencil._labelled.scan`): what the kernels
read along the scanned dim, the jitted loop over a
:class:`~xstencil._labelled.scan_plan.ScanPlan`, and its inputs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xstencil import _progress
from xstencil._engine.call import as_array, stand_in
from xstencil._engine.kcache import cached, rebuild
from xstencil._engine.lower import AxisGeom, Source
from xstencil._engine.mesh import Mask, Slab
from xstencil._engine.tscan import Var, run_loop, stencil_step, time_reads
from xstencil._errors import XStencilError
from xstencil._labelled.core import identity_caller, kernel_caller
from xstencil._labelled.plan import Plan
from xstencil._labelled.scan_plan import ScanPlan
from xstencil._labelled.scan_setup import check_monotonic, time_coord, time_placeholder

__all__ = ["time_input", "build_loop", "inputs"]


def time_input(sp: ScanPlan, kernels: Sequence[Any], lifted: Any, static: Any, udyn: Any,
                coords: Sequence[Any]) -> Any:
    """The padded time coordinate when the kernels read it (else a one-window
    stand-in, or ``None``); raises for reads ahead when growing."""
    call, dim, plan = sp.call, sp.dim, sp.plan
    # the padded time coordinate is as long as the trajectory: built only if read
    tcoord = time_placeholder(sp)
    t_ax = plan.axis(dim)
    sub = [AxisGeom(0, 1, 1, 1) if a == t_ax else g for a, g in enumerate(plan.geom)]
    slab_avals = [stand_in(
        tuple(plan.shape[plan.axis(d)] for d in vd if d != dim), np.dtype(dt))
        for vd, dt in zip(plan.var_dims, plan.var_dtypes, strict=True)]
    space = [d for d in plan.coord_dims if d != dim]
    extra = [Source(c, (plan.axis(d),), (plan.axis(d),))
             for d, c in zip(space, coords, strict=True)]
    lcalls = [_labelled_call(plan, kernel_caller(plan, k, static), dim, sp.names)
              for k in kernels]
    shapes = tuple((tuple(np.shape(x)), str(getattr(x, "dtype", ""))) for x in udyn)
    reads, t_used = cached(("reads", lifted.key, sp.key, static, tcoord is None, shapes),
                           lambda: time_reads(lcalls, sp.variables, slab_avals, extra, sub,
                                              t_ax, tcoord, udyn, sp.loop))
    if sp.grown:
        ahead = sorted({(plan.var_names or ("u",))[v] for v, off in reads
                        if off >= 0 and sp.variables[v].state is not None})
        if ahead:
            what = "u" if plan.var_names is None else f"s[{ahead[0]!r}]"
            raise XStencilError(
                f"{call}: the kernel reads {what} at offset >= 0 along {dim!r} (e.g. "
                f"{what}() or {what}({dim}=1)); when growing a trajectory with steps= "
                f"there is no input there; read the previous value {what}({dim}=-1)")
    if t_used:
        check_monotonic(call, dim, sp.tvals)
        tcoord = time_coord(sp)
    return tcoord


def build_loop(sp: ScanPlan, lifted: Any, static: Any,
               regions: Sequence[Any]) -> Callable[..., Any]:
    """The jitted loop: ``run(arrays, init, coords, tcoord, masks, udyn,
    leaves, token) -> (saved slabs, first bad position)``; with
    ``save_every="last"`` each variable's final state, without the axis
    along ``dim`` (a repeated call then needs no second program to drop it)."""
    plan, dim, loop, k = sp.plan, sp.dim, sp.loop, sp.k
    space = [d for d in plan.coord_dims if d != dim]
    t_ax = plan.axis(dim)

    def run(arrays: Any, init: Any, coords: Any, tcoord: Any, masks: Any, udyn: Any,
            leaves: Any, token: Any) -> Any:
        kernels = rebuild(lifted, leaves)  # reading this call's closed-over arrays
        calls = [_labelled_call(plan, kernel_caller(plan, kn, static), dim, sp.names)
                 for kn in kernels]
        base = _labelled_call(plan, identity_caller(
            plan, kernel_caller(plan, kernels[-1], static)), dim, sp.names)
        branches = [(r if isinstance(r, Slab) else Mask(masks[r]), c)
                    for r, c in zip(regions, calls, strict=True)]
        ex = [Source(c, (plan.axis(d),), (plan.axis(d),))
              for d, c in zip(space, coords, strict=True)]
        stepf = stencil_step(branches, base, list(sp.variables), arrays, ex, plan.geom, t_ax,
                             tcoord, udyn, loop, sp.total)
        prog = (_progress.advance, token) if loop.progress_every else None
        saved, bad = run_loop(stepf, init, loop, prog)
        outs = []
        for h, x in zip(init, saved, strict=True):
            if loop.every and k:
                x = jnp.concatenate([jnp.stack(h[-k:]), x])
            outs.append(x if loop.every else x[0])
        return outs, bad

    return jax.jit(run)


def inputs(sp: ScanPlan, arrays: Sequence[Any]) -> tuple[list[Any], list[list[Any]]]:
    """The loop's inputs from the variables' data (in the plan's dims):
    per variable its input with dim first (``None`` where the loop does not
    read it), and per evolving variable its initial slabs."""
    dim = sp.dim
    xs = [_input(x, vd, dim) for x, vd in zip(arrays, sp.plan.var_dims, strict=True)]
    variables = sp.variables
    init = [_initial(xs[i], sp, variables[i]) for i in sp.evolving]
    return [a if v.has_time or v.state is None else None
            for a, v in zip(xs, variables, strict=True)], init


def _labelled_call(plan: Plan, caller: Any, dim: str, order: Sequence[str] | None) -> Any:
    """Engine-facing: ``cells`` = variables then spatial coords, ``dyn`` =
    ``(user dyn, time-coordinate window)``; returns a tuple (one per evolving
    variable, in ``order``)."""
    nvar = len(plan.var_dims)

    def c(cells: Sequence[Any], dyn: Any) -> Any:
        udyn, tw = dyn
        it = iter(cells[nvar:])
        cs = [tw if d == dim else next(it) for d in plan.coord_dims]
        out = caller(list(cells[:nvar]) + cs, udyn)
        if order is None:
            return out
        return tuple(out[n] for n in order) if isinstance(out, Mapping) else out

    return c


def _input(x: Any, vdims: Sequence[str], dim: str) -> Any:
    x = as_array("scan", "the data", x)
    if dim in vdims:
        ax = list(vdims).index(dim)
        if ax:
            x = jnp.moveaxis(x, ax, 0)
    return x


def _initial(x: Any, s: ScanPlan, v: Var) -> list[Any]:
    """The last ``max(k, 1)`` initial slabs, oldest first."""
    if s.k == 0:
        return [jnp.zeros(x.shape[1:], x.dtype)]
    if not v.has_time and s.grown and x.ndim == len(v.axes):
        return [x]
    return [x[i] for i in range(s.k)]
