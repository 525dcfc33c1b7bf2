"""Scans on blocks with a deep halo: K steps per halo exchange.

Shared by the dask scan (:mod:`xstencil._backends.dask_scan`, one task runs K steps of
one chunk) and the sharded scan (:mod:`xstencil._backends.shard_scan`, one ``ppermute``
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

Scope: a DataArray or Dataset (set up as in memory, then reduced to a
:class:`BlockJob` by :mod:`xstencil._labelled.scale`) and one kernel or a function mesh
(regions by position, label or mask; see :mod:`xstencil._backends.blockmesh`).
The kernel may read coordinates, the scanned dim's included.  The scanned
dim must not be split.  Saving follows :func:`xstencil.scan`: the ``k`` initial
positions, then every
``save_every``-th computed one, or the last only.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from xstencil._backends.blockmesh import BlockMesh, mesh_step
from xstencil._backends.jobs import Hooks
from xstencil._engine.boundary import pad
from xstencil._engine.coords import coord_period, padded, read_dtype
from xstencil._engine.lower import AxisGeom, Source, evaluate

Plan = Any  # xstencil._labelled.plan.Plan: a frozen description; backends read its fields

__all__ = ["ScanSpec", "BlockJob", "Stepper", "Block", "Role", "Slot", "slots", "run_steps",
           "segments", "padded_coords", "time_padded"]


@dataclass(frozen=True)
class ScanSpec:
    """A scan, reduced to what a block needs: the plan over ``(dim,) + space``,
    the reach back ``k`` and ahead ``ahead`` along ``dim``, and the saved
    positions.

    Plain data, copied from the labelled scan's validated ``ScanPlan`` (by
    ``xstencil._labelled.blockprep.block_spec``); it checks nothing itself."""

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


@dataclass(frozen=True, eq=False)
class BlockJob:
    """A dask-backed or sharded scan reduced to raw arrays (built by
    ``xstencil._labelled.scale``); what the block backends receive.

    ``datas`` holds per advanced variable its input with dim first, ``(n or
    1, *space)``; ``consts`` the other variables without dim, ``(*space)``;
    ``forcings`` those with dim (read, not advanced), ``(n, *space)``.
    ``coords`` maps each spatial dim whose coordinate the kernel reads to
    its numeric, unpadded values.  ``mesh`` and ``masks`` are a function
    mesh's regions (``None`` and ``()`` for one kernel).  ``finite(position,
    where)`` builds check_finite's error (``None``: no check).
    """

    call: str
    spec: ScanSpec
    hooks: Hooks
    kernels: tuple[Callable[..., Any], ...]
    owner: Any
    datas: tuple[Any, ...]
    consts: tuple[Any, ...]
    forcings: tuple[Any, ...]
    evolving: tuple[str, ...]
    forced: tuple[str, ...]
    static: Any
    dyn: tuple[Any, ...]
    tcoord: Any
    coords: Mapping[str, np.ndarray]
    period: Mapping[str, float] | None
    mesh: BlockMesh | None
    masks: tuple[np.ndarray, ...]
    finite: Callable[[int, str], Exception] | None
    progress: bool
    checkpoint: bool


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


def padded_coords(job: BlockJob, width: Sequence[tuple[int, int]]
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
    plan, call, per = job.spec.plan, job.call, job.period or {}
    dims = job.spec.space_coords
    values = {d: job.coords[d] for d in dims}
    widths = {d: tuple(width[plan.axis(d)]) for d in dims}
    modes = {d: plan.specs[plan.axis(d)].mode for d in dims}
    out = padded(call, values, widths, modes, job.period, read_dtype(plan.var_dtypes))
    periods = tuple(coord_period(call, d, values[d], per.get(d)) if modes[d] == "periodic"
                    else None for d in dims)
    return list(out), periods


class Role(enum.Enum):
    """What a variable of the plan is to a block step."""

    ADVANCED = "advanced"  # returned by the kernels: a row of the state
    FORCED = "forced"  # read along dim, not advanced: a row of the forcing
    CONST = "const"  # without dim: one field


@dataclass(frozen=True)
class Slot:
    """A variable of the plan: its role and its row among that role's variables."""

    role: Role
    row: int


def slots(plan: Plan, evolving: Sequence[str], forced: Sequence[str]) -> tuple[Slot, ...]:
    """Per variable of the plan (one for a DataArray), its :class:`Slot`."""
    names = plan.var_names
    if names is None:
        return (Slot(Role.ADVANCED, 0),)
    consts = [nm for nm in names if nm not in evolving and nm not in forced]
    return tuple(Slot(Role.ADVANCED, list(evolving).index(nm)) if nm in evolving
                 else Slot(Role.FORCED, list(forced).index(nm)) if nm in forced
                 else Slot(Role.CONST, consts.index(nm)) for nm in names)


@dataclass(frozen=True, eq=False)
class Stepper:
    """What every step of a block scan shares (fixed at trace time).

    ``modes`` is the virtual padding per spatial axis; ``evolving`` names the
    advanced variables (the rows of a slab) and ``forced`` the variables read
    along dim but not advanced.  ``mesh`` is a function mesh's regions (see
    :mod:`xstencil._backends.blockmesh`); ``kernels`` go with its regions,
    or hold one kernel without one.  ``periods`` (from
    :func:`padded_coords`): a block cell from across a periodic seam reads
    the coordinate shifted back by the period times its wrap count, as that
    cell reads it in memory.  With ``check`` (the block's own cells: slices
    per spatial axis; the halo's outer cells may read garbage), the first
    position whose new slab holds a NaN or Inf there is reported.  ``repad``
    rebuilds a new slab's outer halo (sharded edge devices).
    """

    spec: ScanSpec
    hooks: Hooks
    kernels: tuple[Callable[..., Any], ...]
    static: Any
    modes: tuple[str, ...]
    evolving: tuple[str, ...] = ("",)
    forced: tuple[str, ...] = ()
    mesh: BlockMesh | None = None
    periods: tuple[float | None, ...] = ()
    check: tuple[slice, ...] | None = None
    repad: Callable[[Any], Any] | None = None

    @property
    def width(self) -> int:
        """The time window: ``k`` earlier positions, the current one, ``ahead`` later."""
        return self.spec.k + 1 + self.spec.ahead


@dataclass(frozen=True, eq=False)
class Block:
    """The arrays of one block (traced inside the backend's compiled code).

    ``hist`` holds the last ``k`` slabs, oldest first, each ``(V, *block)``;
    ``inp`` the input slabs ``[t, t + n + ahead)``, ``(n + ahead, V,
    *block)`` (``None`` when growing: reads at offsets >= 0 then see the
    latest slab); ``coords`` the spatial coordinates with ``pad_lo``/``pad_hi``
    extra cells; ``where`` is ``(t, origin)``: the position of the first step
    along dim and the global index of the block's first cell per spatial
    axis.  ``masks`` are the mask regions over the block, ``(n or 1,
    *block)``; ``consts`` the constant fields over the block, in the plan's
    variable order; ``forcing`` the forced variables at positions ``[t - k,
    t + n + ahead)``, ``(n + k + ahead, F, *block)``; ``tcoord`` the
    coordinate along dim padded by ``(k, ahead)``, when the kernel reads it.
    """

    hist: tuple[Any, ...]
    inp: Any
    coords: Sequence[Any]
    dyn: Any
    where: tuple[Any, Sequence[Any]] | None = None
    masks: Sequence[Any] = ()
    consts: Sequence[Any] = ()
    tcoord: Any = None
    forcing: Any = None


def _coord_sources(st: Stepper, b: Block, block: Sequence[int]) -> list[Source]:
    """The spatial coordinates as sources, then per periodic coordinate the
    cells' wrap count times the period (one value per cell)."""
    plan, spec = st.spec.plan, st.spec
    srcs = [Source(c, (plan.axis(d) - 1,), (plan.axis(d) - 1,))
            for d, c in zip(spec.space_coords, b.coords, strict=True)]
    wraps = []
    for d, per in zip(spec.space_coords, st.periods, strict=False):
        if per is not None:
            a = plan.axis(d) - 1
            p = b.where[1][a] + lax.iota(np.int32, block[a])  # type: ignore[index]
            cdt = b.coords[0].dtype
            shift = jnp.floor_divide(p, plan.shape[a + 1]).astype(cdt) * jnp.asarray(per, cdt)
            wraps.append(Source(shift, (a,), ()))
    return srcs + wraps


def _stacked(st: Stepper, call: Callable[..., Any], nsrc: int, nconst: int
             ) -> Callable[..., Any]:
    """``call`` on cells laid out as the step's sources: per advanced
    variable its ``nsrc`` time cells, per forcing its ``width`` time cells,
    then the constants, the spatial coordinates and their wrap shifts;
    returns one output per advanced variable.  Each variable's time window
    is stacked from its cells (a structural operation the lowering removes),
    so no slab is copied to build a window."""
    spec, width, k = st.spec, st.width, st.spec.k
    plan = spec.plan
    order = slots(plan, st.evolving, st.forced)
    nvar = sum(s.role is Role.ADVANCED for s in order)
    nforce = len(st.forced)
    wrapped = [d for d, per in zip(spec.space_coords, st.periods, strict=False)
               if per is not None]

    def window(cells: Sequence[Any], s: Slot) -> Any:
        nf = nvar * nsrc  # the forcings' cells start here, then the constants'
        if s.role is Role.CONST:
            return cells[nf + nforce * width + s.row]
        if s.role is Role.FORCED:
            time_cells = list(cells[nf + s.row * width:nf + (s.row + 1) * width])
        else:
            own = cells[s.row * nsrc:(s.row + 1) * nsrc]
            time_cells = list(own) + [own[k - 1]] * (width - nsrc)
        return lax.concatenate([lax.expand_dims(c, (0,)) for c in time_cells], 0)

    def run(cells: Sequence[Any], dyn: Any) -> Any:
        windows = [window(cells, s) for s in order]
        udyn, tw = dyn
        rest = iter(cells[nvar * nsrc + nforce * width + nconst:])
        spatial = {d: next(rest) for d in spec.space_coords}
        for d in wrapped:
            spatial[d] = spatial[d] - next(rest)
        cs = [tw if d == spec.dim else spatial[d] for d in plan.coord_dims]
        out = call(windows + cs, udyn)
        return (out,) if plan.var_names is None else tuple(out[nm] for nm in st.evolving)

    return run


def _source(st: Stepper, x: Any) -> Source:
    """A spatial slab as a source of the step's field (the spatial axes)."""
    plan = st.spec.plan
    pads = tuple((s.pad_lo, s.pad_hi) for s in plan.specs[1:])
    wset = tuple(plan.axis(d) - 1 for d in plan.window_dims if d != st.spec.dim)
    # inside a loop, one explicitly padded slab beats the interior/shell split,
    # whose dynamic-update-slices force copies of the loop carry
    if any(lo or hi for lo, hi in pads):
        fill = 0 if plan.fill_value is None else plan.fill_value
        x = lax.optimization_barrier(pad(x, pads, st.modes, fill))
    return Source(x, tuple(range(x.ndim)), wset)


def _new_slab(st: Stepper, b: Block, i: Any, srcs: list[Source], geom: list[AxisGeom],
              tw: Any, dtype: Any, nsrc: int) -> tuple[Any, ...]:
    """The kernels (or the mesh's kernels on their regions) at step ``i``."""
    plan = st.spec.plan
    calls = [st.hooks.caller(plan, kn, st.static) for kn in st.kernels]
    nconst = len(b.consts)
    if st.mesh is None:
        new = evaluate(_stacked(st, calls[0], nsrc, nconst), srcs, geom, (b.dyn, tw))
        return tuple(x.astype(dtype) for x in new)
    t0, origin = b.where  # type: ignore[misc]
    now_masks = [lax.dynamic_index_in_dim(m, i, 0, False) if timed else m[0]
                 for m, timed in zip(b.masks, st.mesh.timed, strict=True)]
    base = _stacked(st, st.hooks.identity(plan, calls[-1]), nsrc, nconst)
    return mesh_step(st.mesh, [_stacked(st, c, nsrc, nconst) for c in calls], base, srcs,
                     geom, (b.dyn, tw), t0 + i, origin, now_masks, dtype)


def run_steps(st: Stepper, n: int, b: Block) -> tuple[tuple[Any, ...], Any]:
    """Advance ``b.hist`` by ``n`` steps: ``(hist, bad)``, the last ``k``
    slabs and the first position whose new slab held a NaN or Inf in the
    block's own cells (-1 if none, or without ``st.check``).

    Each time offset is its own spatial :class:`Source`, and the kernel's time
    window is stacked from their cells, so no slab is copied to build a window.
    """
    spec, width, ahead = st.spec, st.width, st.spec.ahead
    nvar, nforce = len(st.evolving), len(st.forced)
    block = b.hist[0].shape[1:]
    geom = [AxisGeom(0, 1, nb, s.size) for nb, s in zip(block, spec.plan.specs[1:],
                                                         strict=True)]
    csrc = _coord_sources(st, b, block)
    nsrc = spec.k if b.inp is None else width  # growing: the latest slab stands for offsets >= 0
    const_srcs = [_source(st, c) for c in b.consts]

    def step(i: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
        hist, bad = carry
        now = [] if b.inp is None else [
            lax.dynamic_index_in_dim(b.inp, i + j, axis=0, keepdims=False)
            for j in range(1 + ahead)]
        tw = None if b.tcoord is None else lax.dynamic_slice_in_dim(
            b.tcoord, b.where[0] + i, width)  # type: ignore[index]
        srcs = [_source(st, x[v]) for v in range(nvar) for x in list(hist) + now]
        if nforce:
            fx = lax.dynamic_slice_in_dim(b.forcing, i, width, axis=0)
            srcs += [_source(st, fx[j, f]) for f in range(nforce) for j in range(width)]
        new = _new_slab(st, b, i, srcs + const_srcs + csrc, geom, tw, hist[0].dtype, nsrc)
        if st.repad is not None:
            new = tuple(st.repad(x) for x in new)
        new = jnp.stack(new)
        if st.check is not None and jnp.issubdtype(new.dtype, jnp.inexact):
            ok = jnp.all(jnp.isfinite(new[(slice(None),) + st.check]))
            at = jnp.asarray(b.where[0] + i, jnp.int32)  # type: ignore[index]
            bad = jnp.where((bad < 0) & ~ok, at, bad)
        return hist[1:] + (new,), bad

    carry = (tuple(b.hist), jnp.asarray(-1, jnp.int32))
    # ``n`` may be traced (the dask scan's run-time step count)
    return step(0, carry) if isinstance(n, int) and n == 1 else lax.fori_loop(0, n, step, carry)


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
