"""JAX arrays sharded across devices: maps under :func:`jax.shard_map`.

When the data is a JAX array sharded with a :class:`~jax.sharding.NamedSharding`
or the call passes ``devices={dim: axis_name}``, each device evaluates the kernel
on its own block.  The halo comes from the neighbouring devices through
``lax.ppermute`` along the mesh axis that the dim is sharded over (keyed by
dim name), so no device ever sees the whole field:

* ``periodic`` dims exchange cyclically (the last device sends to the first);
* other modes exchange with the open-ended permutation, and the devices at
  the global edge build their outer halo from their own block with the
  engine's boundary padding (``extend``, ``reflect``, ``symmetric``, ``fill``).

The exchange is one ``ppermute`` per side per sharded dim, applied dim after
dim on the already-extended block, so corner cells come from diagonal
neighbours without extra messages.  Dims that are not sharded keep the
engine's virtual padding.  The output has the input's sharding.

Sharded scans (:func:`~xstencil._backends.shard_scan.scan_sharded`) live in
:mod:`xstencil._backends.shard_scan`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from xstencil._backends.jobs import Hooks, MapJob
from xstencil._engine.boundary import pad
from xstencil._engine.call import as_array, precision, split_static
from xstencil._engine.coords import padded, read_dtype
from xstencil._engine.kcache import values_key
from xstencil._engine.lower import AxisGeom, Source, evaluate
from xstencil._engine.mesh import Mask, Slab, mesh_evaluate
from xstencil._errors import XStencilError

Plan = Any  # xstencil._labelled.plan.Plan: a frozen description; backends read its fields

__all__ = ["Layout", "device_axes", "is_sharded", "layout", "make_mesh", "map_sharded",
           "prepared", "exchange", "sharded_axes", "check_divides"]


@dataclass(frozen=True)
class Layout:
    """A device mesh and, per field dim, the mesh axis it is sharded over."""

    mesh: Mesh
    names: tuple[str | None, ...]

    def size(self, k: int) -> int:
        name = self.names[k]
        return 1 if name is None else int(self.mesh.shape[name])

    def spec(self, extra: int = 0) -> P:
        return P(*self.names, *([None] * extra))


def is_sharded(arrays: Sequence[Any]) -> bool:
    """Whether any array is a JAX array split over several devices."""
    for x in arrays:
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            sh = getattr(x, "sharding", None)
            if isinstance(sh, NamedSharding) and not x.is_fully_replicated:
                return True
    return False


def make_mesh(axes: Mapping[str, int] | Sequence[str], devices: Sequence[Any] | None = None
              ) -> Mesh:
    """A device mesh with ``Auto`` axes (``jax.make_mesh`` defaults to
    ``Explicit`` ones, under which padded slices of sharded dims fail).

    ``axes`` maps axis names to sizes, or lists names: one name takes every
    device, two names split them as squarely as possible.
    """
    devices = list(jax.devices() if devices is None else devices)
    if isinstance(axes, Mapping):
        names, shape = tuple(axes), tuple(int(v) for v in axes.values())
    else:
        names = tuple(axes)
        n = len(devices)
        if len(names) == 1:
            shape = (n,)
        else:
            a = max(f for f in range(1, int(math.isqrt(n)) + 1) if n % f == 0)
            shape = (n // a, a) + (1,) * (len(names) - 2)
    count = math.prod(shape)
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names),
                         devices=devices[:count])


def layout(call: str, dims: tuple[str, ...], arrays: Sequence[Any], mesh: Any) -> Layout:
    """The layout of a call: from ``devices=`` (a ``{dim: axis}`` dict or a
    ``jax.sharding.Mesh`` whose axes are named after dims), or from the
    sharding of the data."""
    data_mesh, data_names = None, None
    for x in arrays:
        got = sharded_axes(call, x, dims)
        if got is not None:
            data_mesh, data_names = got
            break
    if mesh is None:
        assert data_mesh is not None
        return Layout(data_mesh, data_names)
    names = device_axes(call, mesh, dims)
    if isinstance(mesh, Mesh):
        devmesh = mesh
    elif data_mesh is not None and all(v in data_mesh.axis_names for v in names.values()):
        devmesh = data_mesh
    else:
        devmesh = make_mesh(tuple(names.values()))
    return Layout(devmesh, tuple(names.get(d) for d in dims))


def sharded_axes(call: str, x: Any, dims: Sequence[Hashable]
                 ) -> tuple[Mesh, tuple[str | None, ...]] | None:
    """The mesh ``x`` is split over and, per axis of ``x`` (named by
    ``dims``), the mesh axis it is sharded over; ``None`` when ``x`` is not
    split over several devices."""
    sh = getattr(x, "sharding", None)
    if not isinstance(sh, NamedSharding) or x.is_fully_replicated:
        return None
    spec = tuple(sh.spec) + (None,) * (x.ndim - len(sh.spec))
    for d, s in zip(dims, spec, strict=False):
        if isinstance(s, tuple):
            if len(s) != 1:
                raise XStencilError(
                    f"{call}: dim {d!r} is sharded over several mesh axes {s!r}; "
                    f"shard each dim over at most one axis")
    return sh.mesh, tuple(s[0] if isinstance(s, tuple) else s for s in spec)


def check_divides(call: str, has: str, dim: Hashable, n: int, p: int, axis: Any) -> None:
    """Raise unless the ``n`` points of ``dim`` split evenly over the ``p``
    devices of mesh ``axis``; ``has`` starts the message (``"dim 'x' has 47
    points"``)."""
    if n % p:
        m = -(-n // p) * p
        raise XStencilError(
            f"{call}: {has}, which does not divide evenly over the {p} devices of mesh axis "
            f"{axis!r}; pad the data to {m} points (e.g. with .pad({{{dim!r}: (0, {m - n})}}, "
            f"mode='edge')) or use a mesh axis whose size divides {n}")


def device_axes(call: str, devices: Any, dims: Sequence[Hashable]) -> dict[Hashable, str]:
    """Check ``devices=`` against the data's ``dims``; return ``{dim: mesh axis}``.

    ``devices`` is a non-empty ``{dim: axis name}`` mapping, each dim of the
    data with its own axis, or a :class:`jax.sharding.Mesh` whose axes are
    named after dims (each axis shards the dim of its name).

    Examples
    --------
    >>> from xstencil._backends.shard import device_axes
    >>> device_axes("f()", {"x": "i"}, ("y", "x"))
    {'x': 'i'}
    """
    if isinstance(devices, Mesh):
        for name in devices.axis_names:
            if name not in dims:
                raise XStencilError(
                    f"{call}: devices={devices!r} has axis {name!r}, which is not a dim of the "
                    f"data {tuple(dims)!r}; name the axes after the dims, or pass "
                    f"devices={{dim: axis}}")
        return {d: d for d in devices.axis_names}
    if not isinstance(devices, Mapping) or not devices or not all(
            isinstance(v, str) for v in devices.values()):
        raise XStencilError(
            f"{call}: devices={devices!r} must map dim names to mesh axis names, such as "
            f"{{{(tuple(dims) or ('x',))[-1]!r}: 'i'}}, or be a jax.sharding.Mesh whose axes "
            f"are named after dims (xstencil.make_devices)")
    for d in devices:
        if d not in dims:
            raise XStencilError(
                f"{call}: devices={dict(devices)!r}: dimension {d!r} not found; available "
                f"dims are {tuple(dims)!r}")
    if len(set(devices.values())) != len(devices):
        raise XStencilError(f"{call}: devices={dict(devices)!r} shards two dims over one mesh "
                            f"axis; give each dim its own axis")
    return dict(devices)


def _check(plan: Plan, lay: Layout) -> None:
    for k, (d, n, s) in enumerate(zip(plan.dims, plan.shape, plan.specs, strict=True)):
        p = lay.size(k)
        if p == 1:
            continue
        check_divides(plan.call, f"dim {d!r} has {n} points", d, n, p, lay.names[k])
        local = n // p
        if s.mode == "valid" and (s.lo or s.hi):
            raise XStencilError(
                f"{plan.call}: boundary 'valid' along the sharded dim {d!r} is not supported "
                f"(the output would not split evenly over the devices); use a padding mode "
                f"and trim the result with .isel")
        if local % s.stride:
            raise XStencilError(
                f"{plan.call}: stride {s.stride} along {d!r} does not divide the {local} "
                f"points each device holds; pick a stride that divides {local}")
        need = max(s.lo, s.hi) + (1 if s.mode == "reflect" else 0)
        if local < need:
            raise XStencilError(
                f"{plan.call}: each device holds {local} points of {d!r}, fewer than the "
                f"window's halo of {max(s.lo, s.hi)} needs ({need}); use fewer devices along "
                f"{lay.names[k]!r} or a smaller window")


def exchange(x: Any, axis: int, name: str, p: int, lo: int, hi: int, mode: str,
             fill_value: Any = 0) -> Any:
    """Extend the local block ``x`` by ``lo``/``hi`` halo cells along
    ``axis`` from the neighbours on mesh axis ``name`` (inside ``shard_map``).

    ``periodic`` exchanges cyclically; other modes pad the outer side of the
    first and last device from their own block.
    """
    n = x.shape[axis]
    cyclic = mode == "periodic"
    idx = lax.axis_index(name)
    parts = []

    def edge(pads: tuple[int, int], take: slice) -> Any:
        widths = [(0, 0)] * x.ndim
        widths[axis] = pads
        modes = ["fill"] * x.ndim
        modes[axis] = mode
        padded = pad(x, widths, modes, fill_value)
        return lax.slice_in_dim(padded, take.start, take.stop, axis=axis)

    if lo:
        send = lax.slice_in_dim(x, n - lo, n, axis=axis)
        perm = [(i, (i + 1) % p) for i in range(p if cyclic else p - 1)]
        got = lax.ppermute(send, name, perm)
        if not cyclic:
            got = jnp.where(idx == 0, edge((lo, 0), slice(0, lo)), got)
        parts.append(got)
    parts.append(x)
    if hi:
        send = lax.slice_in_dim(x, 0, hi, axis=axis)
        perm = [((i + 1) % p, i) for i in range(p if cyclic else p - 1)]
        got = lax.ppermute(send, name, perm)
        if not cyclic:
            got = jnp.where(idx == p - 1, edge((0, hi), slice(n, n + hi)), got)
        parts.append(got)
    return parts[0] if len(parts) == 1 else lax.concatenate(parts, axis)


def _global_masks(plan: Plan, regions: Sequence[Slab | int], masks: Sequence[np.ndarray]
                  ) -> list[np.ndarray]:
    """Every mesh region as a boolean mask over the output (masks shard like the data)."""
    out = []
    for r in regions:
        if isinstance(r, Slab):
            m = np.zeros(plan.out_shape, dtype=bool)
            m[tuple(slice(*t) for t in r.ranges)] = True
            out.append(m)
        else:
            out.append(np.asarray(masks[r], dtype=bool))
    return out


def _body(plan: Plan, lay: Layout, hooks: Hooks, kernels: Sequence[Callable[..., Any]],
          static: Any, is_mesh: bool, covered: bool = False) -> Callable[..., Any]:
    local = [n // lay.size(k) for k, n in enumerate(plan.shape)]
    wset = tuple(plan.axis(d) for d in plan.window_dims)
    fill = 0 if plan.fill_value is None else plan.fill_value

    def body(arrays: Any, coords: Any, dyn: Any, masks: Any) -> Any:
        srcs = []
        for x in arrays:
            for k, s in enumerate(plan.specs):
                if lay.names[k] is not None and (s.lo or s.hi):
                    x = exchange(x, k, lay.names[k], lay.size(k), s.pad_lo, s.pad_hi, s.mode,
                                 fill)
            pads = tuple((0, 0) if lay.names[k] is not None else (s.pad_lo, s.pad_hi)
                         for k, s in enumerate(plan.specs))
            modes = tuple("fill" if lay.names[k] is not None or s.mode == "valid" else s.mode
                          for k, s in enumerate(plan.specs))
            srcs.append(Source(x, tuple(range(x.ndim)), wset, pads, modes, fill))
        for c, d in zip(coords, plan.coord_dims, strict=True):
            k = plan.axis(d)
            if lay.names[k] is not None:
                s = plan.specs[k]
                start = lax.axis_index(lay.names[k]) * local[k]
                c = lax.dynamic_slice_in_dim(c, start, local[k] + s.pad_lo + s.pad_hi)
            srcs.append(Source(c, (k,), (k,)))
        geom = []
        for k, (s, g) in enumerate(zip(plan.specs, plan.geom, strict=True)):
            if lay.names[k] is None:
                geom.append(g)
            else:
                geom.append(AxisGeom(0, s.stride, local[k] // s.stride, s.size))
        calls = [hooks.caller(plan, k, static) for k in kernels]
        if not is_mesh:
            return evaluate(calls[0], srcs, geom, dyn)
        branches = [(Mask(m), c) for m, c in zip(masks, calls, strict=True)]
        return mesh_evaluate(branches, hooks.identity(plan, calls[-1]), srcs, geom, dyn,
                             covered)

    return body


def prepared(job: MapJob) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The compiled ``shard_map`` function of a map and its inputs (call it
    under ``precision``); its ``.lower(*inputs)`` gives the HLO."""
    plan, regions = job.plan, job.regions
    job.check_full("on sharded devices")
    lay = layout(plan.call, plan.dims, job.arrays, job.devices)
    _check(plan, lay)
    is_mesh = regions is not None
    gmasks = _global_masks(plan, regions, job.masks) if is_mesh else []
    nout = len(plan.output_dims)
    dyn, static = split_static(plan.call, (job.args, job.kwargs))
    data_sharding = NamedSharding(lay.mesh, lay.spec())
    arrays = [jax.device_put(as_array(plan.call, "the data", x), data_sharding)
              for x in job.arrays]
    gm = [jax.device_put(m, data_sharding) for m in gmasks]
    pads = {d: (plan.specs[plan.axis(d)].pad_lo, plan.specs[plan.axis(d)].pad_hi)
            for d in plan.coord_dims}
    modes = {d: plan.specs[plan.axis(d)].mode for d in plan.coord_dims}
    coords = list(padded(plan.call, job.coords, pads, modes, job.period,
                         read_dtype(plan.var_dtypes)))
    # every position covered: the kept input's dtype takes no part in the result's
    covered = bool(np.logical_or.reduce(gmasks).all()) if gmasks else False
    # the kernels' closed-over arrays are traced as constants: keyed by content
    key = ("shard", plan, static, lay, is_mesh, tuple(regions or ()), covered,
           values_key(job.kernels))

    def build() -> Callable[..., Any]:
        body = _body(plan, lay, job.hooks, job.kernels, static, is_mesh, covered)
        mapped = jax.shard_map(body, mesh=lay.mesh,
                               in_specs=(lay.spec(), P(), P(), lay.spec()),
                               out_specs=lay.spec(nout), check_vma=False)
        return jax.jit(mapped)

    fn = job.hooks.compiled(job.owner, key, build)
    return fn, (arrays, coords, list(dyn), gm)


def map_sharded(job: MapJob) -> Any:
    """Run a map (or mesh map) under ``shard_map``; the output keeps the
    input's sharding."""
    with precision(job.arrays, job.args, job.kwargs, job.plan.dtype_probe()):
        fn, inputs = prepared(job)
        return fn(*inputs)
