"""JAX arrays sharded across devices: scans under :func:`jax.shard_map`.

:func:`scan_sharded` exchanges a halo ``halo_every`` (K) windows deep with
:func:`~xstencil._shard.exchange` every K steps, then advances K steps with
the shared block scan of :mod:`xstencil._blockscan`; the devices at the global
edge rebuild their outer halo after every step (``_repad``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from xstencil import _progress
from xstencil._blockmesh import block_mesh
from xstencil._engine.boundary import pad
from xstencil._engine.call import as_array, precision
from xstencil._errors import XStencilError
from xstencil._shard import Layout, exchange, layout, split_options

__all__ = ["scan_sharded"]


def _repad(new: Any, axis: int, name: str, p: int, lo: int, hi: int, mode: str,
           fill: Any) -> Any:
    """On the edge devices, rebuild the outer ``lo``/``hi`` cells of ``new``
    along ``axis`` from the cells inside, in boundary ``mode``."""
    n = new.shape[axis]
    idx = lax.axis_index(name)
    widths = [(0, 0)] * new.ndim
    modes = ["fill"] * new.ndim
    modes[axis] = mode
    # the outer w cells depend only on the w + 1 cells next to them, so only those
    # are padded and only the halo slab is written back
    if lo:
        widths[axis] = (lo, 0)
        inner = lax.slice_in_dim(new, lo, min(n, 2 * lo + 1), axis=axis)
        edge = lax.slice_in_dim(pad(inner, widths, modes, fill), 0, lo, axis=axis)
        old = lax.slice_in_dim(new, 0, lo, axis=axis)
        new = lax.dynamic_update_slice_in_dim(new, jnp.where(idx == 0, edge, old), 0, axis)
    if hi:
        widths[axis] = (0, hi)
        inner = lax.slice_in_dim(new, max(0, n - 2 * hi - 1), n - hi, axis=axis)
        m = inner.shape[axis]
        edge = lax.slice_in_dim(pad(inner, widths, modes, fill), m, m + hi, axis=axis)
        old = lax.slice_in_dim(new, n - hi, n, axis=axis)
        new = lax.dynamic_update_slice_in_dim(new, jnp.where(idx == p - 1, edge, old), n - hi,
                                              axis)
    return new


def scan_sharded(obj: Any, kernel: Callable[..., Any] | None, dim: str = "time", *args: Any,
                 mesh: Any = None, halo_every: int = 1, hlo: bool | str = False,
                 function_mesh: Any = None, **kwargs: Any) -> Any:
    """Scan a kernel along ``dim`` with the other dims sharded over devices.

    Every ``halo_every`` steps each device receives a halo ``halo_every``
    windows deep from its neighbours (one ``ppermute`` per side and sharded
    dim), then advances ``halo_every`` steps without communication.  Deeper
    halos mean fewer, larger messages and some redundant work at the block
    edges.  The result equals the in-memory :func:`xstencil.scan` and stays
    sharded.

    Parameters
    ----------
    obj
        A DataArray or Dataset: the initial state (with ``steps=N``) or the trajectory,
        as for :func:`xstencil.scan`; a sharded JAX array, or any array with
        ``mesh=``.  ``dim`` itself must not be sharded.
    kernel, dim, *args
        As for :func:`xstencil.scan`.
    mesh
        ``{dim: mesh_axis}`` or a :class:`jax.sharding.Mesh` with axes named
        after dims; defaults to the data's sharding.
    halo_every
        Steps between halo exchanges (K).  The halo is K times the window's
        reach, and every device must hold at least that many points.
    hlo
        ``True``: return the compiled HLO text instead of running (to inspect
        the communication: ``collective-permute``, and no ``all-gather``);
        ``"compiled"``: return the compiled executable (for
        ``memory_analysis()``, per device).
    function_mesh
        A :class:`~xstencil.Mesh` over ``obj`` (``kernel`` is then
        ``None``): its kernels on its regions, as ``m.scan(dim)`` does in
        memory.  Mask regions are sharded like the data and exchange halos
        with it.
    **kwargs
        ``window``, ``boundary``, ``fill_value``, ``steps``, ``dt``,
        ``coord``, ``save_every`` and ``period`` as for :func:`xstencil.scan`;
        other keywords go to the kernel.

    Returns
    -------
    DataArray or Dataset
        The saved trajectory, JAX arrays sharded like the input.

    Examples
    --------
    On however many devices there are (one CPU here):

    >>> import numpy as np, xarray as xr, xstencil
    >>> from xstencil._shard_scan import scan_sharded
    >>> u0 = xr.DataArray(np.eye(8, dtype=np.float32)[0], dims="x")
    >>> heat = lambda u: u(time=-1) + 0.25 * (u(time=-1, x=1) - 2 * u(time=-1)
    ...                                       + u(time=-1, x=-1))
    >>> out = scan_sharded(u0, heat, "time", steps=2, boundary="periodic", mesh={"x": "i"})
    >>> out.isel(time=1).values
    array([0.5 , 0.25, 0.  , 0.  , 0.  , 0.  , 0.  , 0.25], dtype=float32)
    """
    import xarray as xr

    from xstencil._blockprep import rewrap, setup
    from xstencil._blockscan import padded_coords, run_steps, time_padded

    call = f"{'ds' if isinstance(obj, xr.Dataset) else 'da'}.stencil.scan(...)"
    opts, kw = split_options(kwargs)
    K = int(halo_every)
    if K < 1:
        raise XStencilError(f"{call}: halo_every={halo_every!r} must be an int >= 1")
    kernels = (kernel,) if function_mesh is None else tuple(k for _, k in function_mesh._regions)
    prep = setup(call, obj, kernels, dim, args, kw, **opts)
    spec = prep.spec
    plan = spec.plan
    bmesh, masks = (None, []) if function_mesh is None else block_mesh(
        function_mesh, plan, dim, spec.total)
    timed = bmesh.timed if bmesh else ()
    with precision(prep.datas + prep.consts + prep.forcings, args, kw):
        datas = [as_array(call, "the data", d) for d in prep.datas]
        consts = [as_array(call, "the data", c)[None] for c in prep.consts]
        lay = layout(call, plan.dims, datas + consts, mesh)
        if lay.names[0] is not None and lay.size(0) > 1:
            raise XStencilError(
                f"{call}: the scanned dim {dim!r} is sharded over mesh axis {lay.names[0]!r}; "
                f"positions along it are computed in order, so shard the other dims")
        lay = Layout(lay.mesh, (None,) + lay.names[1:])
        split = [a for a in range(1, len(plan.dims)) if lay.names[a] and lay.size(a) > 1]
        for a in split:
            s, n, p = plan.specs[a], plan.shape[a], lay.size(a)
            d = plan.dims[a]
            if n % p:
                raise XStencilError(
                    f"{call}: dim {d!r} has {n} points, which does not divide evenly over the "
                    f"{p} devices of mesh axis {lay.names[a]!r}; pad the data to "
                    f"{-(-n // p) * p} points or use a mesh axis whose size divides {n}")
            need = K * max(s.lo, s.hi) + (1 if s.mode == "reflect" else 0)
            if n // p < need:
                raise XStencilError(
                    f"{call}: each device holds {n // p} points of {d!r}, fewer than a halo of "
                    f"halo_every={K} steps needs ({need}); use a smaller halo_every or fewer "
                    f"devices along {lay.names[a]!r}")
        local = {a: plan.shape[a] // lay.size(a) for a in split}
        deep = {a: (K * plan.specs[a].pad_lo, K * plan.specs[a].pad_hi) for a in split}
        width = [(s.pad_lo + deep.get(a, (0, 0))[0], s.pad_hi + deep.get(a, (0, 0))[1])
                 for a, s in enumerate(plan.specs)]
        coords, periods = padded_coords(spec, prep.obj, width, opts.get("period"))
        modes = tuple("extend" if a in split else s.mode
                      for a, s in enumerate(plan.specs) if a > 0)
        fill = 0 if plan.fill_value is None else plan.fill_value
        sharding = NamedSharding(lay.mesh, lay.spec())
        V = len(prep.evolving)

        def packed(fields: Any) -> Any:
            """Row j * V + v holds position j of advanced variable v."""
            x = jnp.stack(fields, axis=1)
            return x.reshape((-1,) + x.shape[2:])

        hist0 = jax.device_put(packed([d[:spec.k] for d in datas]), sharding)
        inp = None if spec.grown else jax.device_put(
            packed([time_padded(spec, d) for d in datas]), sharding)
        F = len(prep.forced)  # read along dim, not advanced: rows j * F + f
        forcing = None if not F else jax.device_put(
            packed([time_padded(spec, as_array(call, "the data", f)) for f in prep.forcings]),
            sharding)
        k, every, ahead = spec.k, spec.every, spec.ahead
        q, r = divmod(spec.steps_per_save, K)
        static = prep.static

        def repad(new: Any) -> Any:
            for a in split:
                s = plan.specs[a]
                if s.mode != "periodic":
                    new = _repad(new, a - 1, lay.names[a], lay.size(a), *deep[a], s.mode, fill)
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
                    size = local[a] + sum(width[a])
                    c = lax.dynamic_slice_in_dim(c, lax.axis_index(lay.names[a]) * local[a],
                                                 size)
                cs.append(c)
            now = None if inp is None else ext[k].reshape((-1, V) + ext[k].shape[1:])
            forced = None if forcing is None else ext[nin - 1].reshape(
                (-1, F) + ext[nin - 1].shape[1:])
            own = tuple(slice(deep[a][0], deep[a][0] + local[a]) if a in split else slice(None)
                        for a in range(1, len(plan.dims)))
            new, bad = run_steps(spec, kernels, static, n, tuple(ext[:k]), now, cs, dyn, modes,
                                 repad if split else None, mesh=bmesh, where=(t, origin),
                                 masks=ext[nin:nin + nm], consts=[c[0] for c in ext[nin + nm:]],
                                 evolving=prep.evolving,
                                 check=own if prep.check_finite else None, tcoord=tcoord,
                                 periods=periods, forced=prep.forced, forcing=forced)
            for a in split:
                new = tuple(lax.slice_in_dim(x, deep[a][0], deep[a][0] + local[a], axis=a)
                            for x in new)
            return new, bad

        n_steps = spec.total - k  # positions computed
        report_every = (_progress.every(n_steps, math.prod(plan.shape[1:]) * V)
                        if prep.progress else 0)

        # checkpoint=True: the backward pass keeps one carry per block of K steps and
        # recomputes the block, instead of keeping every step's intermediates
        run_block = jax.checkpoint(block, static_argnums=(3,)) if prep.checkpoint else block

        def body(hist0: Any, inp: Any, coords: Any, dyn: Any, masks: Any,
                 consts: Any, tcoord: Any, forcing: Any, token: Any) -> Any:
            def advance(hist: Any, t: Any, bad: Any, n: int) -> Any:
                hist, b = run_block(hist, inp, t, n, coords, dyn, masks, consts, tcoord,
                                    forcing)
                if report_every:  # a bar update each time a block passes a multiple of it
                    done = t + n - k
                    lax.cond(done // report_every > (t - k) // report_every,
                             lambda: jax.debug.callback(_progress.report, token, done),
                             lambda: None)
                return hist, t + n, jnp.where(bad < 0, b, bad)

            def one_save(carry: Any, _: Any) -> Any:
                hist, t, bad = carry
                if q:
                    hist, t, bad = lax.fori_loop(0, q, lambda i, c: advance(*c, K),
                                                 (hist, t, bad))
                if r:
                    hist, t, bad = advance(hist, t, bad, r)
                return (hist, t, bad), hist[-1]

            start = tuple(hist0[j * V:(j + 1) * V] for j in range(k))
            none = jnp.asarray(-1, jnp.int32)
            (_, _, bad), saved = lax.scan(one_save, (start, jnp.asarray(k, jnp.int32), none),
                                          None, length=spec.nsave)
            # the first bad position over all devices (-1: none)
            axes = tuple(n for n in lay.names if n)
            if axes:
                big = jnp.iinfo(jnp.int32).max
                first = lax.pmin(jnp.where(bad < 0, big, bad), axes)
                bad = jnp.where(first == big, -1, first)
            if every == 0:
                return tuple(saved[-1][v] for v in range(V)), bad
            traj = jnp.concatenate([jnp.stack(start), saved], axis=0)  # (time, V, *space)
            return tuple(traj[:, v] for v in range(V)), bad  # one array per variable

        out_spec = ((lay.spec() if every else P(*lay.names[1:]),) * V, P())
        key = ("shard-scan", spec, static, lay, K, bmesh, kernels,
               tuple(m.shape for m in masks), prep.evolving, len(consts), prep.check_finite,
               prep.forced, report_every, prep.checkpoint)

        def build() -> Callable[..., Any]:
            return jax.jit(jax.shard_map(body, mesh=lay.mesh,
                                         in_specs=(lay.spec(), lay.spec(), P(), P(),
                                                   [lay.spec()] * len(masks),
                                                   [lay.spec()] * len(consts), P(),
                                                   lay.spec(), P()),
                                         out_specs=out_spec, check_vma=False))

        from xstencil._labelled.kcache import compiled
        from xstencil._labelled.scan_result import call_with_progress

        fn = compiled(function_mesh if function_mesh is not None else kernel, key, build)
        inputs = (hist0, inp, [jnp.asarray(c) for c in coords], list(prep.dyn),
                  [jax.device_put(m, sharding) for m in masks],
                  [jax.device_put(c, sharding) for c in consts],
                  None if prep.tcoord is None else jnp.asarray(prep.tcoord), forcing)
        if hlo:
            exe = fn.lower(*inputs, jnp.asarray(0, jnp.int32)).compile()
            return exe if hlo == "compiled" else exe.as_text()
        out, bad = call_with_progress(fn, inputs, report_every, n_steps, call)
    if prep.check_finite and int(bad) >= 0:
        from xstencil._labelled.scan_result import not_finite

        raise not_finite(call, dim, prep.labels, int(bad))
    return rewrap(prep, list(out))
