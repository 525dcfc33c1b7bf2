"""Running a function mesh in memory: how its regions are evaluated, and the
repeat-call fast path.

**Branches.**  Regions whose kernels are the same (the same function, or
kernels with equal :func:`~xstencil._engine.kcache.describe` keys reading the
same arrays) share one *branch*: the kernel is traced once however many
regions use it.

**Two ways to evaluate.**

* *select*: each branch runs over the whole output and a run-time
  *membership* array (the branch at each output position, -1 where the input
  is kept) picks per position, in one ``select``
  (:func:`~xstencil._engine.mesh.select_evaluate`).  Compile time grows with
  the number of branches, not regions, and the compiled code does not depend
  on where the regions lie (a mesh with moved regions reuses it).
* *slabs*: each rectangular region's kernel runs over its own slab only
  (:func:`~xstencil._engine.mesh.mesh_evaluate`), which is cheaper for large
  arrays with a few distinct kernels on thin regions.

Small outputs, and any mesh whose branches cost less than about the slabs,
take *select*.

**Fast path.**  As for ``map`` (fastpath.py), a repeated call skips
validation, planning and region resolution: the first call records an
:class:`Entry` under the data's layout, the options, the kernels' describe
key and the regions' key (positions by value, masks by digest), and later
calls, from the same mesh or one rebuilt with equal regions, go straight to
the compiled function.  DataArrays and Datasets (mesh_fast_ds.py) with numpy
or single-device JAX data take it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from xstencil._backends.loops import resolve_mode
from xstencil._engine.call import is_wide, outside_transforms, settled, split_static
from xstencil._engine.coords import coord_values
from xstencil._engine.kcache import Lifted, describe, put
from xstencil._engine.mesh import Mask, Slab, mesh_evaluate, select_evaluate
from xstencil._labelled.core import (
    Fields,
    dtype_probe,
    identity_caller,
    kernel_caller,
    sources,
)
from xstencil._labelled.fastpath import checked, coord_sources, signature
from xstencil._labelled.mesh_fast_ds import DsEntry, ds_datas, ds_entry, ds_signature, run_ds
from xstencil._labelled.mesh_regions import region_key
from xstencil._labelled.mesh_resolved import Resolved
from xstencil._labelled.plan import Plan
from xstencil._labelled.result import host64, replace_data, rewrap

__all__ = ["Layout", "layout", "how", "use_select", "Entry", "lookup", "run", "remember",
           "still_seen", "traced_call", "SMALL"]

#: Outputs of at most this many positions always take *select*.
SMALL = 1 << 18


class Layout(NamedTuple):
    """A mesh's kernels and regions, cached on the mesh while its regions
    are the same objects."""

    snapshot: tuple[Any, ...]  # the mesh's (region, kernel) pairs
    distinct: tuple[Any, ...]  # the kernel objects, in order of first use
    kidx: tuple[int, ...]  # per region: its kernel's index in ``distinct``
    key: Hashable  # the regions (by value) and ``kidx``


def layout(m: Any) -> Layout:
    """The :class:`Layout` of mesh ``m`` (kept on ``m._layout``)."""
    regions = m._regions
    old = getattr(m, "_layout", None)
    if old is not None and len(old.snapshot) == len(regions) and all(
            a is b for a, b in zip(old.snapshot, regions, strict=True)):
        return old
    distinct: dict[int, int] = {}
    kernels: list[Any] = []
    kidx = []
    for _, k in regions:
        i = distinct.setdefault(id(k), len(kernels))
        if i == len(kernels):
            kernels.append(k)
        kidx.append(i)
    lay = Layout(tuple(regions), tuple(kernels), tuple(kidx),
                 (tuple(region_key(r) for r, _ in regions), tuple(kidx)))
    m._layout = lay
    return lay


def _branches(lifted: Lifted) -> tuple[int, ...]:
    """Per distinct kernel, the index of the first kernel it shares a branch
    with: an equal describe key and the same arrays read."""
    groups: dict[Hashable, int] = {}
    out = []
    start = 0
    counts = lifted.counts or (0,) * len(lifted.key)  # type: ignore[arg-type]
    for i, (k, n) in enumerate(zip(lifted.key, counts, strict=True)):  # type: ignore[arg-type]
        leaves = lifted.leaves[start:start + n]
        start += n
        out.append(groups.setdefault((k, tuple(id(x) for x in leaves)), i))
    return tuple(out)


def how(plan: Plan, lay: Layout, lifted: Lifted, res: Resolved, traced: bool = False
        ) -> tuple[Hashable, Callable[..., Any], list[Any]]:
    """How to evaluate the mesh: ``(key_extra, body, dynamic)`` for
    :func:`~xstencil._labelled.core.call_engine`; ``res``: its regions over
    the plan, with their coverage and membership arrays built once
    (mesh_resolved.py).

    ``traced``: some input is a JAX tracer, so the call may be differentiated.
    Then rectangular regions keep *slabs*: under *select* a kernel also runs
    where it is not kept, and one singular there on finite data (``1 / h``
    over land where ``h == 0``) would turn the gradient into NaN.
    """
    regions, masks, covered = res.regions, res.masks, res.covered
    rep = _branches(lifted)
    reps = tuple(dict.fromkeys(rep))  # the distinct kernels that are traced
    branch = [reps.index(rep[i]) for i in lay.kidx]  # per region
    counts = plan.out_shape
    n = math.prod(counts)
    slab_work = n + sum(math.prod(r.counts()) if isinstance(r, Slab) else n for r in regions)
    rectangular = any(isinstance(r, Slab) for r in regions)
    if use_select(n, len(reps), slab_work) and not (traced and rectangular):
        dynamic = [] if covered and len(reps) == 1 else [res.member(tuple(branch), len(reps))]
        return ("mesh-select", reps, covered), _select_body(reps, covered), dynamic
    # the masks are run-time inputs
    return (("mesh", tuple(regions), lay.kidx, covered), _slab_body(regions, lay.kidx, covered),
            list(masks))


def use_select(n: int, branches: int, slab_work: int) -> bool:
    """Whether to evaluate by *select*: for small outputs (``n`` positions),
    or when the branches over the whole output cost little more than the
    slabs (``slab_work`` positions evaluated)."""
    return n <= SMALL or branches * n <= 1.5 * slab_work


def _select_body(reps: tuple[int, ...], covered: bool) -> Callable[..., Any]:
    def body(kernels: Sequence[Callable[..., Any]], plan: Plan, static: Any, arrays: Any,
             coords: Any, dyn: Any, dynamic: Any) -> Any:
        calls = [kernel_caller(plan, kernels[i], static) for i in reps]
        base = identity_caller(plan, calls[-1])
        member = dynamic[0] if dynamic else None
        return select_evaluate(calls, base, member, covered, sources(plan, arrays, coords),
                               plan.geom, dyn)

    return body


def _slab_body(regions: Sequence[Slab | int], kidx: tuple[int, ...],
               covered: bool) -> Callable[..., Any]:
    def body(kernels: Sequence[Callable[..., Any]], plan: Plan, static: Any, arrays: Any,
             coords: Any, dyn: Any, masks: Any) -> Any:
        calls = [kernel_caller(plan, kernels[i], static) for i in kidx]
        branches = [(r if isinstance(r, Slab) else Mask(masks[r]), c)
                    for r, c in zip(regions, calls, strict=True)]
        base = identity_caller(plan, calls[-1])
        return mesh_evaluate(branches, base, sources(plan, arrays, coords), plan.geom, dyn,
                             covered)

    return body


# -- the repeat-call fast path -------------------------------------------------------------

class Entry(NamedTuple):
    plan: Plan
    fn: Callable[..., Any]
    coords: list[Any]  # padded coordinate arrays on the device
    dynamic: list[Any]  # the membership array or masks, on the device
    sources: tuple[Any, ...]  # the coordinates' index objects (identity check)
    values: tuple[np.ndarray, ...]  # the coordinates' values (equality check)
    wide: bool  # run under x64
    simple: bool  # output has the input's shape and dims: rewrap by replacing the data


def _sig(m: Any, args: Any, kwargs: Any, dtype: Any) -> Hashable | None:
    if m._options.get("devices") is not None or m._options.get("mesh") is not None:
        return None
    opts = tuple(sorted(m._options.items())) + (("dtype()", None if dtype is None
                                                  else str(dtype)),)
    # the backend in effect (XSTENCIL_BACKEND may change): it chooses the compiled function
    opts += (("backend()", resolve_mode(m._options.get("backend"))),)
    if isinstance(m._obj, xr.Dataset):  # mesh_fast_ds.py
        return ds_signature(m._obj, opts, args, kwargs)
    return signature(m._obj, opts, args, kwargs)


def lookup(m: Any, args: Any, kwargs: Any,
           dtype: Any) -> tuple[Entry, Lifted] | None:
    """The fast-path entry for this call of mesh ``m``, or None.  ``m._seen``
    holds the data's index objects that the mesh's regions were checked
    against; any other index object takes the full path (which checks)."""
    obj = m._obj
    if not m._regions or not still_seen(m):
        return None
    lay = layout(m)
    sig = _sig(m, args, kwargs, dtype)
    if sig is None:
        return None
    lifted = describe(lay.distinct)
    data = ds_datas(obj) if isinstance(obj, xr.Dataset) else obj.variable._data
    if traced_call(data, args, kwargs, lifted):
        # a traced call may choose another evaluation than the recorded one (see
        # :func:`how`): it takes the full path
        return None
    # the branches too: equal kernels reading other arrays than last time split
    key = ("meshfast", lifted.key, sig, lay.key, _branches(lifted))
    entry = checked(key, obj)
    if entry is None:
        return None
    return entry, lifted


def still_seen(m: Any) -> bool:
    """Whether mesh ``m``'s data still has the index objects its regions
    were checked against (``m._seen``): only then may a repeat skip the
    full path, which checks them again."""
    seen, indexes = m._seen, getattr(m._obj, "_indexes", None)
    return seen is not None and indexes is not None and len(indexes) == len(seen) \
        and all(indexes.get(k) is v for k, v in seen.items())


def traced_call(data: Any, args: Any, kwargs: Any, lifted: Lifted) -> bool:
    """Whether the call may be differentiated: a JAX tracer among its inputs,
    or a trace in progress (see ``traced`` in :func:`how`)."""
    return not outside_transforms(jax.tree_util.tree_leaves((data, args, kwargs,
                                                             lifted.leaves)))


def run(entry: Entry | DsEntry, obj: Any, args: Any, kwargs: Any,
        lifted: Lifted) -> Any:
    """The compiled call and a cheap rewrap."""
    if isinstance(entry, DsEntry):  # a Dataset's mesh (mesh_fast_ds.py)
        return run_ds(entry, obj, args, kwargs, lifted)
    data = obj.variable._data
    dyn = split_static("map", (args, kwargs))[0] if args or kwargs else []
    leaves = list(lifted.leaves)
    inputs = (data, dyn, leaves)
    if entry.wide and not jax.config.read("jax_enable_x64"):
        with jax.enable_x64(True):
            out = settled(entry.fn([data], entry.coords, dyn, entry.dynamic, leaves), inputs)
        out = host64(out)
    else:
        out = settled(entry.fn([data], entry.coords, dyn, entry.dynamic, leaves), inputs)
    if entry.simple:
        return replace_data(obj, out)
    f = Fields(obj, entry.plan.dims, entry.plan.shape, None, [data], entry.plan.var_dims,
               entry.plan.var_dtypes)
    return rewrap(entry.plan, f, out)


def remember(m: Any, lifted: Lifted, plan: Plan, f: Fields, args: Any, kwargs: Any,
             dtype: Any, dynamic: Sequence[Any], used: dict[str, Any],
             leaf_dims: Any = None) -> None:
    """Record the entry after a successful full call (``used``: what
    :func:`~xstencil._labelled.core.call_engine` compiled and padded;
    ``leaf_dims``: a Dataset's result dims, see mesh_fast_ds.py)."""
    if "fn" not in used or not hasattr(f.obj, "_indexes"):
        return
    lay = layout(m)
    sig = _sig(m, args, kwargs, dtype)
    coords = used["coords"]
    if sig is None or any(isinstance(c, jax.core.Tracer) for c in coords) \
            or any(traced_call(x, args, kwargs, lifted) for x in f.arrays):
        return  # a traced call is not recorded (nor looked up): see lookup
    if f.names is not None:  # a Dataset's mesh (mesh_fast_ds.py)
        ds = ds_entry(plan, f, args, kwargs, used["fn"], coords, dynamic, leaf_dims)
        if ds is not None:
            put(("meshfast", lifted.key, sig, lay.key, _branches(lifted)), ds)
        return
    variables = f.obj.coords.variables
    values = tuple(coord_values(variables[d]) for d in plan.coord_dims)
    index = plan.input_index()
    simple = not plan.output_dims and all(
        s == slice(0, n, 1) for s, n in zip(index.values(), plan.shape, strict=True))
    entry = Entry(plan, used["fn"], coords, [jnp.asarray(x) for x in dynamic],
                  coord_sources(f.obj, plan), values,
                  is_wide(f.arrays, args, kwargs, dtype_probe(plan)), simple)
    put(("meshfast", lifted.key, sig, lay.key, _branches(lifted)), entry)
