"""JAX arrays sharded across devices: scans under :func:`jax.shard_map`.

:func:`scan_sharded` exchanges a halo ``halo_every`` (K) windows deep with
:func:`~xstencil._backends.shard.exchange` every K steps, then advances K steps with
the shared block scan of :mod:`xstencil._backends.halo`; the devices at the global
edge rebuild their outer halo after every step
(:func:`~xstencil._backends.edges.repad`).  The labelled
front end is :func:`xstencil._labelled.scale.scan_sharded`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from xstencil import _progress
from xstencil._backends.edges import repad as edge_repad
from xstencil._backends.halo import Block, BlockJob, Stepper, padded_coords, run_steps, time_padded
from xstencil._backends.shard import Layout, check_divides, exchange, layout
from xstencil._engine.call import as_array
from xstencil._engine.kcache import values_key
from xstencil._errors import XStencilError

__all__ = ["Compiled", "scan_sharded"]


@dataclass(frozen=True)
class _Grid:
    """How the spatial axes are split: the layout, the split axes, per split
    axis its cells per device and its deep halo ``(K * pad_lo, K * pad_hi)``,
    and per axis the coordinate padding (window padding plus deep halo)."""

    lay: Layout
    split: tuple[int, ...]
    local: dict[int, int]
    deep: dict[int, tuple[int, int]]
    width: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Compiled:
    """A sharded scan ready to run: ``fn(*inputs, token)`` returns
    ``(outputs per advanced variable, first bad position or -1)``."""

    fn: Callable[..., Any]
    inputs: tuple[Any, ...]
    report_every: int  # 1: the loop feeds a progress bar (0: no bar)
    steps: int  # positions computed


def _grid(job: BlockJob, datas: Sequence[Any], devices: Any, K: int) -> _Grid:
    call, plan, dim = job.call, job.spec.plan, job.spec.dim
    lay = layout(call, plan.dims, datas, devices)
    if lay.names[0] is not None and lay.size(0) > 1:
        raise XStencilError(
            f"{call}: the scanned dim {dim!r} is sharded over mesh axis {lay.names[0]!r}; "
            f"positions along it are computed in order, so shard the other dims")
    lay = Layout(lay.mesh, (None,) + lay.names[1:])
    split = tuple(a for a in range(1, len(plan.dims)) if lay.names[a] and lay.size(a) > 1)
    for a in split:
        s, n, p = plan.specs[a], plan.shape[a], lay.size(a)
        d = plan.dims[a]
        check_divides(call, f"dim {d!r} has {n} points", d, n, p, lay.names[a])
        need = K * max(s.lo, s.hi) + (1 if s.mode == "reflect" else 0)
        if n // p < need:
            raise XStencilError(
                f"{call}: each device holds {n // p} points of {d!r}, fewer than a halo of "
                f"halo_every={K} steps needs ({need}); use a smaller halo_every or fewer "
                f"devices along {lay.names[a]!r}")
    local = {a: plan.shape[a] // lay.size(a) for a in split}
    deep = {a: (K * plan.specs[a].pad_lo, K * plan.specs[a].pad_hi) for a in split}
    width = tuple((s.pad_lo + deep.get(a, (0, 0))[0], s.pad_hi + deep.get(a, (0, 0))[1])
                  for a, s in enumerate(plan.specs))
    return _Grid(lay, split, local, deep, width)


def _packed(fields: Any) -> Any:
    """Row j * V + v holds position j of advanced variable v."""
    x = jnp.stack(fields, axis=1)
    return x.reshape((-1,) + x.shape[2:])


def _block(job: BlockJob, g: _Grid, periods: Any) -> Callable[..., Any]:
    """``block(hist, inp, t, n, coords, dyn, masks, consts, tcoord, forcing)``:
    exchange a deep halo, then advance ``n`` steps on each device."""
    spec, lay, split, deep, local = job.spec, g.lay, g.split, g.deep, g.local
    plan, k, ahead = spec.plan, spec.k, spec.ahead
    V, F = len(job.evolving), len(job.forced)
    timed = job.mesh.timed if job.mesh else ()
    modes = tuple("extend" if a in split else s.mode
                  for a, s in enumerate(plan.specs) if a > 0)
    fill = 0 if plan.fill_value is None else plan.fill_value

    def repad(new: Any) -> Any:  # on the edge devices, rebuild the outer halo
        for a in split:
            s = plan.specs[a]
            if s.mode != "periodic":
                idx = lax.axis_index(lay.names[a])
                new = edge_repad(new, a - 1, *deep[a], s.mode, fill, idx == 0,
                                 idx == lay.size(a) - 1)
        return new

    def block(hist: Any, inp: Any, t: Any, n: int, coords: Any, dyn: Any,
              masks: Any, consts: Any, tcoord: Any, forcing: Any) -> Any:
        # hist: a tuple of k slabs (V, *space); inp: (time * V, *space); masks:
        # (time, *space); consts: (1, *space): the spatial axis a is axis a of each
        ext = list(hist)
        if inp is not None:
            ext.append(lax.dynamic_slice_in_dim(inp, t * V, (n + ahead) * V, axis=0))
        if forcing is not None:  # positions [t - k, t + n + ahead)
            ext.append(lax.dynamic_slice_in_dim(forcing, (t - k) * F, (n + k + ahead) * F,
                                                axis=0))
        ext += [lax.dynamic_slice_in_dim(m, t, n, axis=0) if tm else m
                for m, tm in zip(masks, timed, strict=True)]
        ext += list(consts)
        for a in split:
            s = plan.specs[a]
            ext = [exchange(e, a, lay.names[a], lay.size(a), *deep[a], s.mode, fill)
                   for e in ext]
        nin = k + (inp is not None) + (forcing is not None)
        nm = len(masks)
        origin = [lax.axis_index(lay.names[a]) * local[a] - deep[a][0] if a in split
                  else 0 for a in range(1, len(plan.dims))]
        cs = []
        for d, c in zip(spec.space_coords, coords, strict=True):
            a = plan.axis(d)
            if a in split:
                size = local[a] + sum(g.width[a])
                c = lax.dynamic_slice_in_dim(c, lax.axis_index(lay.names[a]) * local[a], size)
            cs.append(c)
        now = None if inp is None else ext[k].reshape((-1, V) + ext[k].shape[1:])
        forced = None if forcing is None else ext[nin - 1].reshape(
            (-1, F) + ext[nin - 1].shape[1:])
        own = tuple(slice(deep[a][0], deep[a][0] + local[a]) if a in split else slice(None)
                    for a in range(1, len(plan.dims)))
        stepper = Stepper(spec, job.hooks, job.kernels, job.static, modes, job.evolving,
                          job.forced, job.mesh, tuple(periods),
                          own if job.finite is not None else None, repad if split else None)
        new, bad = run_steps(stepper, n, Block(
            tuple(ext[:k]), now, cs, dyn, (t, origin), ext[nin:nin + nm],
            [c[0] for c in ext[nin + nm:]], tcoord, forced))
        for a in split:
            new = tuple(lax.slice_in_dim(x, deep[a][0], deep[a][0] + local[a], axis=a)
                        for x in new)
        return new, bad

    return block


def _body(job: BlockJob, g: _Grid, block: Callable[..., Any], K: int,
          report_every: int) -> Callable[..., Any]:
    """The per-device loop: ``nsave`` saves of ``steps_per_save`` steps, in
    blocks of K steps between halo exchanges."""
    spec, lay = job.spec, g.lay
    k, V = spec.k, len(job.evolving)
    q, r = divmod(spec.steps_per_save, K)
    # checkpoint=True: the backward pass keeps one carry per block of K steps and
    # recomputes the block, instead of keeping every step's intermediates
    run_block = jax.checkpoint(block, static_argnums=(3,)) if job.checkpoint else block

    def body(hist0: Any, inp: Any, coords: Any, dyn: Any, masks: Any,
             consts: Any, tcoord: Any, forcing: Any, token: Any) -> Any:
        # the lead device's loop feeds the bar, at the step counts that the host
        # asks for (the adaptive rule of the in-memory scans, _progress.advance)
        lead = jnp.asarray(True)
        for name in (n for n in lay.names if n):
            lead = lead & (lax.axis_index(name) == 0)

        def advance(hist: Any, t: Any, bad: Any, due: Any, n: int) -> Any:
            hist, b = run_block(hist, inp, t, n, coords, dyn, masks, consts, tcoord, forcing)
            if report_every:  # after each block of K steps: is a bar update due?
                due = _progress.report_if_due(token, t + n - k, due, lead)
            return hist, t + n, jnp.where(bad < 0, b, bad), due

        def one_save(carry: Any, _: Any) -> Any:
            if q:
                carry = lax.fori_loop(0, q, lambda i, c: advance(*c, K), carry)
            if r:
                carry = advance(*carry, r)
            return carry, carry[0][-1]

        start = tuple(hist0[j * V:(j + 1) * V] for j in range(k))
        none = jnp.asarray(-1, jnp.int32)
        (_, _, bad, _), saved = lax.scan(
            one_save, (start, jnp.asarray(k, jnp.int32), none, jnp.asarray(0, jnp.int32)),
            None, length=spec.nsave)
        # the first bad position over all devices (-1: none)
        axes = tuple(n for n in lay.names if n)
        if axes:
            big = jnp.iinfo(jnp.int32).max
            first = lax.pmin(jnp.where(bad < 0, big, bad), axes)
            bad = jnp.where(first == big, -1, first)
        if spec.every == 0:
            return tuple(saved[-1][v] for v in range(V)), bad
        traj = jnp.concatenate([jnp.stack(start), saved], axis=0)  # (time, V, *space)
        return tuple(traj[:, v] for v in range(V)), bad  # one array per variable

    return body


def scan_sharded(job: BlockJob, devices: Any = None, halo_every: int = 1) -> Compiled:
    """Compile the scan of ``job`` with the spatial dims sharded over devices
    (call it, and ``job``'s setup, under ``precision``).

    Every ``halo_every`` steps each device receives a halo ``halo_every``
    windows deep from its neighbours (one ``ppermute`` per side and sharded
    dim), then advances ``halo_every`` steps without communication.  Deeper
    halos mean fewer, larger messages and some redundant work at the block
    edges.  ``devices`` is ``{dim: mesh_axis}`` or a
    :class:`jax.sharding.Mesh` with axes named after dims; it defaults to the
    data's sharding.
    """
    call, spec = job.call, job.spec
    K = int(halo_every)
    if K < 1:
        raise XStencilError(f"{call}: halo_every={halo_every!r} must be an int >= 1")
    datas = [as_array(call, "the data", d) for d in job.datas]
    consts = [as_array(call, "the data", c)[None] for c in job.consts]
    g = _grid(job, datas + consts, devices, K)
    coords, periods = padded_coords(job, g.width)
    sharding = NamedSharding(g.lay.mesh, g.lay.spec())
    hist0 = jax.device_put(_packed([d[:spec.k] for d in datas]), sharding)
    inp = None if spec.grown else jax.device_put(
        _packed([time_padded(spec, d) for d in datas]), sharding)
    forcing = None if not job.forced else jax.device_put(
        _packed([time_padded(spec, as_array(call, "the data", f)) for f in job.forcings]),
        sharding)
    n_steps = spec.total - spec.k  # positions computed
    report_every = 1 if job.progress else 0  # the loop asks the host when to report
    body = _body(job, g, _block(job, g, periods), K, report_every)
    lay, masks = g.lay, job.masks
    out_spec = ((lay.spec() if spec.every else P(*lay.names[1:]),) * len(job.evolving), P())
    key = ("shard-scan", spec, job.static, lay, K, job.mesh, job.kernels,
           tuple(m.shape for m in masks), job.evolving, len(consts), job.finite is not None,
           job.forced, report_every, job.checkpoint,
           values_key(job.kernels))  # closed-over arrays are traced as constants

    def build() -> Callable[..., Any]:
        return jax.jit(jax.shard_map(body, mesh=lay.mesh,
                                     in_specs=(lay.spec(), lay.spec(), P(), P(),
                                               [lay.spec()] * len(masks),
                                               [lay.spec()] * len(consts), P(),
                                               lay.spec(), P()),
                                     out_specs=out_spec, check_vma=False))

    fn = job.hooks.compiled(job.owner, key, build)
    inputs = (hist0, inp, [jnp.asarray(c) for c in coords], list(job.dyn),
              [jax.device_put(m, sharding) for m in masks],
              [jax.device_put(c, sharding) for c in consts],
              None if job.tcoord is None else jnp.asarray(job.tcoord), forcing)
    return Compiled(fn, inputs, report_every, n_steps)
