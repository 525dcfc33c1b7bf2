"""The dims of what a Dataset scan's kernel returns for each advanced variable.

A variable that a Dataset scan advances keeps its own dims: ``s(time, x)``
advanced next to ``T(time, y, x)`` stays ``(time, x)``.  Each step computes
the kernels' results over the whole slab (every dim of the Dataset but the
scanned one); the engine keeps, of a variable's result, the cells over its
own dims (:func:`xstencil._engine.tscan.stencil_step`).  That is exact only
when the result does not vary along the dims the variable lacks, so
:func:`check_advanced_dims` raises, before anything is compiled, where the
kernel computes it from a variable or a coordinate on another dim, or where
a mesh's regions vary along such a dim.  A variable is never broadcast up to
more dims: that would change its shape silently.

Which dims a result depends on comes from one trace of the kernel
(:func:`xstencil._labelled.returns.result_reads`), kept in the compile cache;
a scan whose advanced variables all have every dim of the Dataset traces
nothing here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from xstencil._backends import bufpool
from xstencil._engine.kcache import cached
from xstencil._errors import XStencilError
from xstencil._labelled.core import kernel_caller
from xstencil._labelled.returns import result_reads
from xstencil._labelled.scan_plan import ScanPlan

__all__ = ["check_advanced_dims", "short_buffers"]


def check_advanced_dims(sp: ScanPlan, obj: Any, kernels: Sequence[Any], lifted: Any,
                        static: Any, udyn: Any, wide: Any,
                        region_dims: Sequence[str] = ()) -> None:
    """Raise where a kernel's result for an advanced variable of a Dataset
    scan would vary along a dim that the variable does not have (``wide``:
    the arrays that decide the trace's precision; ``region_dims``: the dims
    along which a mesh's regions vary)."""
    plan, dim = sp.plan, sp.dim
    if plan is None or plan.var_names is None:
        return
    space = [d for d in plan.dims if d != dim]
    short = [i for i in sp.evolving if not set(space) <= set(plan.var_dims[i])]
    if not short:
        return
    shapes = tuple((tuple(np.shape(x)), str(getattr(x, "dtype", ""))) for x in udyn)

    def build() -> dict[Any, tuple[set[str], set[int]]]:
        out: dict[Any, tuple[set[str], set[int]]] = {}
        for kn in kernels:
            for n, (r, v) in result_reads(plan, kernel_caller(plan, kn, static), udyn,
                                          wide).items():
                r0, v0 = out.get(n, (set(), set()))
                out[n] = (r0 | r, v0 | v)
        return out

    reads = cached(("scan-advanced-dims", lifted.key, plan, static, shapes), build)
    for i in short:
        name = plan.var_names[i]
        own = set(plan.var_dims[i])
        read, vars_read = reads.get(name, (set(), set()))
        extra = [d for d in space if d in read and d not in own]
        regions = [d for d in space if d in region_dims and d not in own]
        if not extra and not regions:
            continue
        have = tuple(str(d) for d in obj[name].dims)
        got = tuple(d for d in plan.dims if (d in own and (d != dim or d in have))
                    or d in extra or d in regions)
        wider = [plan.var_names[k] for k in sorted(vars_read)
                 if set(extra) & set(plan.var_dims[k])]
        like = wider[0] if wider else next(
            (plan.var_names[k] for k in range(len(plan.var_names))
             if set(extra or regions) <= set(plan.var_dims[k])), "...")
        fix = (f"compute {name!r} from variables on {have!r} only, or give {name!r} the "
               f"missing dims first: ds[{name!r}] = ds[{name!r}].broadcast_like("
               f"ds[{like!r}])")
        if extra:
            src = (f"variable(s) {wider!r}" if wider else
                   f"the coordinate(s) {tuple(extra)!r}")
            raise XStencilError(
                f"{sp.call}: the kernel returns {name!r} on dims {got!r} (it is computed "
                f"from {src}), but {name!r} has dims {have!r}; a scan never broadcasts an "
                f"advanced variable to more dims (its shape would change). To fix it, {fix}")
        raise XStencilError(
            f"{sp.call}: the mesh's regions vary along {tuple(regions)!r}, so the kernels "
            f"would return {name!r} on dims {got!r}, but {name!r} has dims {have!r}; a scan "
            f"never broadcasts an advanced variable to more dims. To fix it, select the "
            f"regions along {have!r} only, or {fix}")


def short_buffers(sp: ScanPlan, slabs: Sequence[np.ndarray]
                  ) -> dict[int, tuple[np.ndarray, tuple[Any, ...]]]:
    """For the loop backend's scans (:mod:`~xstencil._labelled.loop_scan`):
    per advanced variable that lacks some of the Dataset's dims (index into
    ``sp.evolving``, ``slabs``: their states) a buffer over the whole field,
    which the loop writes, and the index of the variable's cells in it (the
    first along the dims it lacks: :func:`check_advanced_dims` made sure
    that the result does not vary along them)."""
    plan, dim = sp.plan, sp.dim
    space = [d for d in plan.dims if d != dim]
    field = tuple(plan.shape[plan.axis(d)] for d in space)
    out: dict[int, tuple[np.ndarray, tuple[Any, ...]]] = {}
    for j, i in enumerate(sp.evolving):
        own = plan.var_dims[i]
        if len(own) - (dim in own) != len(space):
            index = tuple(slice(None) if d in own else 0 for d in space)
            out[j] = (bufpool.empty(field, slabs[j].dtype), index)
    return out
