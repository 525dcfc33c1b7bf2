"""Scans on blocks with a deep halo: K steps per halo exchange.

Shared by the dask scan (:mod:`xstencil._dask_scan`, one task runs K steps of
one chunk) and the sharded scan (:mod:`xstencil._shard_scan`, one ``ppermute``
exchange every K steps).  A block extended by ``K * lo`` / ``K * hi`` cells of
neighbouring data along each split dim can advance K steps on its own: every
step, the cells within one window reach of the extended block's edge read a
wrong halo, so the wrong cells creep inward by the reach per step, and after
K steps they have not reached the block's own cells.  The block's own cells
are then exact, and are all that is kept.

Boundary modes along split dims are applied exactly:

* ``periodic``: the neighbour across the seam supplies the halo (dask's
  ``periodic`` overlap, a cyclic ``ppermute``);
* other modes, dask: the chunk at the global edge has no halo on that side,
  and the step's own virtual padding in that mode is the true boundary;
* other modes, sharded: every device has the same block shape, so the edge
  devices rebuild their outer halo from their own cells in that mode after
  every step (a ``where`` on ``axis_index``).

Scope: a DataArray or Dataset (see :mod:`xstencil._blockprep`) and one
kernel or a function mesh (regions by position, label or mask; see
:mod:`xstencil._blockmesh`).  The kernel may read coordinates, the scanned
dim's included.  The scanned dim must not be split.  Saving follows
:func:`xstencil.scan`: the ``k`` initial positions, then every
``save_every``-th computed one, or the last only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
import xarray as xr
from jax import lax

from xstencil._blockmesh import BlockMesh, mesh_step
from xstencil._engine.boundary import pad
from xstencil._engine.lower import AxisGeom, Source, evaluate
from xstencil._errors import XStencilError
from xstencil._labelled.coords import numeric_coord, pack_coord, pad_coord
from xstencil._labelled.plan import Plan

__all__ = ["ScanSpec", "run_steps", "segments", "padded_coords", "time_padded", "scale_out"]


@dataclass(frozen=True)
class ScanSpec:
    """A scan, reduced to what a block needs: the plan over ``(dim,) + space``,
    the reach back ``k`` and ahead ``ahead`` along ``dim``, and the saved
    positions."""

    plan: Plan
    dim: str
    k: int
    ahead: int
    total: int  # positions along dim, initial ones included
    grown: bool
    every: int  # 0: the last only
    nsave: int  # saved positions after the initial ones
    tmode: str

    @property
    def steps_per_save(self) -> int:
        return self.total - self.k if self.every == 0 else self.every

    @property
    def last(self) -> int:
        """The last position computed."""
        return self.k - 1 + self.nsave * self.steps_per_save

    @property
    def space_coords(self) -> tuple[str, ...]:
        """The spatial dims whose coordinates the kernel reads."""
        return tuple(d for d in self.plan.coord_dims if d != self.dim)

    @property
    def reads_time(self) -> bool:
        """Whether the kernel reads the coordinate along dim (``u.coord(dim)``)."""
        return self.dim in self.plan.coord_dims


def segments(spec: ScanSpec, K: int) -> list[tuple[int, int, bool]]:
    """``(first position, steps, saved after)`` per block of at most ``K`` steps."""
    out = []
    t = spec.k
    for _ in range(spec.nsave):
        left = spec.steps_per_save
        while left:
            n = min(K, left)
            left -= n
            out.append((t, n, left == 0))
            t += n
    return out


def padded_coords(spec: ScanSpec, obj: Any, width: Sequence[tuple[int, int]],
                  period: Mapping[str, float] | None
                  ) -> tuple[list[np.ndarray], tuple[float | None, ...]]:
    """The spatial coordinates read by the kernel, padded by ``width[axis]``
    ``(lo, hi)`` cells in the axis's boundary mode, and per coordinate its
    period where the axis is periodic (else ``None``).

    A periodic coordinate continues across the seam (``x[0] + period`` after
    ``x[-1]``), as the in-memory scan pads it.  A deep halo holds cells from
    across the seam, whose own windows must read the coordinate as those
    cells do in memory: :func:`run_steps` subtracts ``period`` times the
    cell's wrap count (see ``periods`` there).
    """
    from xstencil._labelled.coords import coord_period
    from xstencil._labelled.scan_setup import coord_dtype

    plan = spec.plan
    cdt = coord_dtype(plan)
    out, periods = [], []
    for d in spec.space_coords:
        a = plan.axis(d)
        c = numeric_coord(plan.call, d, np.asarray(obj[d].values))
        mode = plan.specs[a].mode
        per = None if period is None else period.get(d)
        out.append(pack_coord(pad_coord(plan.call, d, c, width[a][0], width[a][1], mode, per),
                              cdt))
        periods.append(coord_period(plan.call, d, c, per) if mode == "periodic" else None)
    return out, tuple(periods)


def run_steps(spec: ScanSpec, kernels: Sequence[Callable[..., Any]], static: Any, n: int,
              hist: tuple[Any, ...], inp: Any, coords: Sequence[Any], dyn: Any,
              modes: Sequence[str], repad: Callable[[Any], Any] | None = None,
              mesh: BlockMesh | None = None, where: tuple[Any, Sequence[Any]] | None = None,
              masks: Sequence[Any] = (), consts: Sequence[Any] = (),
              evolving: Sequence[str] | None = None,
              check: tuple[slice, ...] | None = None,
              tcoord: Any = None,
              periods: Sequence[float | None] = (),
              forced: Sequence[str] = (), forcing: Any = None) -> tuple[tuple[Any, ...], Any]:
    """Advance ``hist`` (the last ``k`` slabs, oldest first, each ``(V,
    *block)``: one row per advanced variable) by ``n`` steps.  ``inp`` holds
    the input slabs ``[t, t + n + ahead)``, ``(n + ahead, V, *block)``
    (``None`` when growing: reads at offsets >= 0 then see the latest slab).
    ``modes`` is the virtual padding per spatial axis; ``coords`` the spatial
    coordinates with ``pad_lo``/``pad_hi`` extra cells; ``repad`` rebuilds a
    new slab's outer halo (sharded edge devices).

    For a Dataset, ``evolving`` names the advanced variables (the rows of a
    slab) and ``consts`` holds the fields of the other variables without
    dim over the block, in the plan's variable order.  ``forced`` names the
    other variables with dim (read, not advanced); ``forcing`` holds their
    input at positions ``[t - k, t + n + ahead)``, ``(n + k + ahead, F,
    *block)``.

    With a function ``mesh`` (see :mod:`xstencil._blockmesh`), ``kernels``
    go with its regions, ``where`` is ``(t, origin)``: the position of the
    first step along dim and the global index of the block's first cell per
    spatial axis, and ``masks`` are the mask regions over the block,
    ``(n or 1, *block)``.  Without one, ``kernels`` holds one kernel.

    ``periods`` (from :func:`padded_coords`, with ``where``): a block cell
    from across a periodic seam reads the coordinate shifted back by the
    period times its wrap count, as that cell reads it in memory.

    ``tcoord`` is the coordinate along dim padded by ``(k, ahead)``, when
    the kernel reads it: the step at position ``t`` reads its window
    ``tcoord[t:t + k + 1 + ahead]``.

    With ``check`` (the block's own cells: slices per spatial axis; the
    halo's outer cells may read garbage), the first position whose new slab
    holds a NaN or Inf there is returned as well (-1 if none): the result is
    ``(hist, bad)``.

    Each time offset is its own spatial :class:`Source`, and the kernel's time
    window is stacked from their cells (a structural operation the lowering
    removes), so no slab is copied to build a window.
    """
    from xstencil._labelled.core import identity_caller, kernel_caller

    plan, k, ahead = spec.plan, spec.k, spec.ahead
    names = plan.var_names
    calls = [kernel_caller(plan, kn, static) for kn in kernels]
    # per variable of the plan: ("e", row) for an advanced one, ("f", j) for a
    # forcing (read along dim, not advanced), ("c", j) for a constant field
    order: list[tuple[str, int]] = [("e", 0)]
    if names is not None:
        const_names = [nm for nm in names if nm not in evolving and nm not in forced]
        order = [("e", list(evolving).index(nm)) if nm in evolving  # type: ignore[arg-type]
                 else ("f", list(forced).index(nm)) if nm in forced
                 else ("c", const_names.index(nm)) for nm in names]
    nvar = sum(kind == "e" for kind, _ in order)
    nforce = len(forced)
    width = k + 1 + ahead
    block = hist[0].shape[1:]
    space = tuple(range(len(block)))  # the step's field: the spatial axes only
    wset = tuple(plan.axis(d) - 1 for d in plan.window_dims if d != spec.dim)
    fill = 0 if plan.fill_value is None else plan.fill_value
    pads = tuple((s.pad_lo, s.pad_hi) for s in plan.specs[1:])
    geom = [AxisGeom(0, 1, nb, s.size) for nb, s in zip(block, plan.specs[1:], strict=True)]
    csrc = [Source(c, (plan.axis(d) - 1,), (plan.axis(d) - 1,))
            for d, c in zip(spec.space_coords, coords, strict=True)]
    # per periodic coordinate: the cells' wrap count times the period, one value per cell
    wraps = {}
    for d, per in zip(spec.space_coords, periods, strict=False):
        if per is not None:
            a = plan.axis(d) - 1
            p = where[1][a] + lax.iota(np.int32, block[a])  # type: ignore[index]
            cdt = coords[0].dtype
            shift = jnp.floor_divide(p, plan.shape[a + 1]).astype(cdt) * jnp.asarray(per, cdt)
            wraps[d] = Source(shift, (a,), ())
    csrc += list(wraps.values())
    nsrc = k if inp is None else width  # growing: the latest slab stands for offsets >= 0

    def stacked(call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` on cells laid out as the step's sources: per advanced
        variable its ``nsrc`` time cells, per forcing its ``width`` time
        cells, then the constants, the spatial coordinates and their wrap
        shifts; returns one output per advanced variable."""
        def run(cells: Sequence[Any], dyn: Any) -> Any:
            windows = []
            nf = nvar * nsrc  # the forcings' cells start here, then the constants'
            for kind, j in order:
                if kind == "c":
                    windows.append(cells[nf + nforce * width + j])
                    continue
                if kind == "f":
                    time_cells = list(cells[nf + j * width:nf + (j + 1) * width])
                else:
                    own = cells[j * nsrc:(j + 1) * nsrc]
                    time_cells = list(own) + [own[k - 1]] * (width - nsrc)
                windows.append(lax.concatenate([lax.expand_dims(c, (0,)) for c in time_cells],
                                               0))
            udyn, tw = dyn
            rest = iter(cells[nf + nforce * width + len(consts):])
            spatial = {d: next(rest) for d in spec.space_coords}
            for d in wraps:
                spatial[d] = spatial[d] - next(rest)
            cs = [tw if d == spec.dim else spatial[d] for d in plan.coord_dims]
            out = call(windows + cs, udyn)
            return (out,) if names is None else tuple(out[nm] for nm in evolving)

        return run

    def source(x: Any) -> Source:
        # inside a loop, one explicitly padded slab beats the interior/shell split,
        # whose dynamic-update-slices force copies of the loop carry
        if any(lo or hi for lo, hi in pads):
            x = lax.optimization_barrier(pad(x, pads, modes, fill))
        return Source(x, space, wset)

    const_srcs = [source(c) for c in consts]

    def step(i: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
        hist, bad = carry
        if inp is None:
            now = []
        else:
            now = [lax.dynamic_index_in_dim(inp, i + j, axis=0, keepdims=False)
                   for j in range(1 + ahead)]
        tw = None if tcoord is None else lax.dynamic_slice_in_dim(
            tcoord, where[0] + i, width)  # type: ignore[index]
        srcs = [source(x[v]) for v in range(nvar) for x in list(hist) + now]
        if nforce:
            fx = lax.dynamic_slice_in_dim(forcing, i, width, axis=0)
            srcs += [source(fx[j, f]) for f in range(nforce) for j in range(width)]
        srcs += const_srcs + csrc
        dtype = hist[0].dtype
        if mesh is None:
            new = evaluate(stacked(calls[0]), srcs, geom, (dyn, tw))
            new = tuple(x.astype(dtype) for x in new)
        else:
            t0, origin = where  # type: ignore[misc]
            now_masks = [lax.dynamic_index_in_dim(m, i, 0, False) if timed else m[0]
                         for m, timed in zip(masks, mesh.timed, strict=True)]
            base = stacked(identity_caller(plan, calls[-1]))
            new = mesh_step(mesh, [stacked(c) for c in calls], base, srcs, geom, (dyn, tw),
                            t0 + i, origin, now_masks, dtype)
        if repad is not None:
            new = tuple(repad(x) for x in new)
        new = jnp.stack(new)
        if check is not None and jnp.issubdtype(new.dtype, jnp.inexact):
            ok = jnp.all(jnp.isfinite(new[(slice(None),) + check]))
            at = jnp.asarray(where[0] + i, jnp.int32)  # type: ignore[index]
            bad = jnp.where((bad < 0) & ~ok, at, bad)
        return hist[1:] + (new,), bad

    carry = (tuple(hist), jnp.asarray(-1, jnp.int32))
    return step(0, carry) if n == 1 else lax.fori_loop(0, n, step, carry)


def time_padded(spec: ScanSpec, data: Any) -> Any:
    """The input along dim, padded by ``ahead`` positions in the dim's mode
    (the values reads past the end of the input see)."""
    if not spec.ahead:
        return data
    mode = spec.tmode if spec.tmode != "valid" else "fill"
    fill = 0 if spec.plan.fill_value is None else spec.plan.fill_value
    if hasattr(data, "dask"):
        import dask.array as dsa

        kw: dict[str, Any] = {"mode": {"fill": "constant", "extend": "edge",
                                       "periodic": "wrap"}.get(mode, mode)}
        if mode == "fill":
            kw["constant_values"] = fill
        widths = [(0, spec.ahead)] + [(0, 0)] * (data.ndim - 1)
        return dsa.pad(data, widths, **kw)
    widths = [(0, spec.ahead)] + [(0, 0)] * (data.ndim - 1)
    return pad(jnp.asarray(data), widths, [mode] + ["fill"] * (data.ndim - 1), fill)


def scale_out(obj: Any, kernel: Any, dim: str, args: Any, kwargs: Mapping[str, Any], *,
              mesh: Any = None, halo_every: int | None = None,
              function_mesh: Any = None) -> Any:
    """The dask-backed or sharded scan of ``obj``, or ``None`` when it is in
    memory on one device and ``mesh`` is not given (the caller scans then).

    ``kwargs`` holds the scan options (``window``, ``boundary``, ...) and the
    kernel's keyword arguments together, as :func:`xstencil.scan` receives them.
    ``function_mesh`` is a :class:`~xstencil.Mesh` to scan instead of ``kernel``.
    """
    from xstencil._dask import any_dask
    from xstencil._dask_scan import scan_dask
    from xstencil._shard import is_sharded
    from xstencil._shard_scan import scan_sharded

    arrays = [v.data for v in obj.data_vars.values()] if isinstance(obj, xr.Dataset) \
        else [getattr(obj, "data", None)]
    if any_dask(arrays):
        if mesh is not None:
            raise XStencilError("da.stencil.scan(...): mesh= shards JAX arrays; the data is a "
                                "dask array (drop mesh=, or .compute() the data first)")
        return scan_dask(obj, kernel, dim, *args, halo_every=halo_every,
                         function_mesh=function_mesh, **kwargs)
    if mesh is not None or is_sharded(arrays):
        return scan_sharded(obj, kernel, dim, *args, mesh=mesh, halo_every=halo_every or 1,
                            function_mesh=function_mesh, **kwargs)
    return None
