"""Grown mesh scans (``m.scan(..., steps=N)``) on the CPU loop backend.

A function mesh whose kernels read only the previous position is, applied to
the previous state, a function mesh of that state: each step runs the mesh's
loop nests (:class:`~xstencil._backends.loops_mesh.MeshLoops`, one per
region, in assignment order, the kept previous value first where the regions
leave cells uncovered) into the next state's buffers, reading the previous
state, between two buffers per advanced variable, as the DataArray and
Dataset loop scans do (:mod:`xstencil._labelled.loop_scan`, whose setup,
time loop and rewrap this module shares).  Each region's values are cast to
the state's dtype, as on XLA.

Regions must hold for every computed position: a region restricted along the
scanned dim (``m[{"time": slice(5, None)}]``), like everything the DataArray
loop scan does not take, returns ``None`` and the mesh scan runs on XLA.
A repeated call takes the scans' repeat-call fast path
(:mod:`~xstencil._labelled.scan_fast`, keyed by the mesh's regions too:
:func:`~xstencil._labelled.scan_repeat.mesh_repeat_entry`), which reruns
the same compiled nests on the new data without tracing the kernels again.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xstencil._backends.loops import MAX_STATEMENTS, resolve_mode
from xstencil._backends.loops_mesh import (
    AUTO_MAX_NESTS,
    MeshLoops,
    covered,
    pieces,
    write_nests,
)
from xstencil._engine.call import precision, split_static
from xstencil._engine.kcache import describe, rebuild
from xstencil._engine.mesh import Slab
from xstencil._labelled import loop_scan as LS
from xstencil._labelled.core import identity_caller, kernel_caller, sources
from xstencil._labelled.loop_previous import previous_kernel
from xstencil._labelled.scan_plan import ScanPlan
from xstencil._labelled.scan_result import rewrap
from xstencil._labelled.scan_setup import plan_scan

__all__ = ["loop_mesh_scan"]

_LOG = logging.getLogger("xstencil.loops")


def loop_mesh_scan(obj: Any, mesh: Any, kernels: Sequence[Any], o: ScanPlan, args: Any,
                   kwargs: Any, backend: str | None,
                   keep: Callable[..., None] | None = None) -> Any:
    """The mesh scan of ``obj`` (already cast to the state dtype) on the loop
    backend, or ``None`` where it does not apply (the caller runs XLA).
    ``keep(sp, repeat, outs, out)``, if given, is told the plan, the
    :class:`~xstencil._labelled.loop_scan.Repeat` that reruns the mesh's
    nests, the loop's output and the result (the repeat-call fast path)."""
    if not all(callable(k) for k in kernels) or not LS.eligible(
            obj, o.dim, o.grown, bool(o.checkpoint or o.period), args, kwargs, backend):
        return None
    mode = resolve_mode(backend)
    try:
        return _mesh_scan(obj, mesh, list(kernels), o, args, kwargs, mode, keep)
    except LS.Fallback as e:
        _LOG.debug("mesh scan runs with XLA: %s", e)
        return None


def _mesh_scan(obj: Any, mesh: Any, kernels: list[Any], o: ScanPlan, args: Any, kwargs: Any,
               mode: str, keep: Callable[..., None] | None) -> Any:
    call, dim = o.call, o.dim
    udyn, static = split_static(call, (args, kwargs))
    lifted = describe(kernels)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sp, f = plan_scan(obj, kernels, o, args, kwargs, lifted, static, udyn,
                              region_dims=mesh._region_dims())
            regions, masks = mesh.regions(sp.plan, dim)
        if caught:
            raise LS.Fallback(f"setup warned: {caught[0].message}")
    except LS.Fallback:
        raise
    except Exception as e:  # noqa: BLE001 - the XLA path decides and reports
        raise LS.Fallback(f"{type(e).__name__}: {e}") from e
    with precision(f.arrays, args, kwargs):  # 64-bit data computes in 64 bits, as on XLA
        slabs, consts, kept, plan = LS.previous_state(o, sp, f, kernels, args, kwargs)
        field = tuple(g.count for g in plan.geom)
        sregions, smasks = _spatial_regions(sp, regions, masks)
        parts = pieces(sregions, smasks, field, covered(sregions, smasks, field))
        if not parts or (mode == "auto" and len(parts) > AUTO_MAX_NESTS):
            raise LS.Fallback(f"{len(parts)} loop nests")
        leaves = list(lifted.leaves)
        srcs = LS.step_sources(slabs, consts, sp.evolving)
        loops = _mesh_loops(plan, lifted, static, dim, kept, len(kernels), parts, sp.names,
                            [s.dtype for s in slabs])
        built = loops._build(srcs, [], udyn, [], leaves, MAX_STATEMENTS[mode])  # noqa: SLF001
        if isinstance(built, str):
            raise LS.Fallback(built)
        step = _MeshStep(built)
        order = LS.outputs(step, sp, slabs)
        outs = LS.run_steps(step, sp, slabs, consts, order, jax.tree_util.tree_leaves(udyn),
                            leaves)
        out = rewrap(sp, f, obj, outs)
    out = LS.as_returned(out, sp.names)
    if keep is not None:
        keep(sp, LS.Repeat(step, sp, order), outs, out)
    return out


def _spatial_regions(sp: ScanPlan, regions: Sequence[Slab | int], masks: Sequence[Any]
                     ) -> tuple[list[Slab | int], list[np.ndarray]]:
    """The regions over the state's positions (the scanned axis dropped);
    raises :class:`~xstencil._labelled.loop_scan.Fallback` for a region
    that differs between computed positions."""
    t_ax, k, total = sp.plan.axis(sp.dim), sp.k, sp.total
    out: list[Slab | int] = []
    smasks: list[np.ndarray] = []
    for r in regions:
        if isinstance(r, Slab):
            a, b, s = r.ranges[t_ax]
            hits = set(range(a, b, s)) & set(range(k, total))
            if not hits:
                continue  # no computed position: never applies
            if len(hits) != total - k:
                raise LS.Fallback("a region is restricted along the scanned dim")
            out.append(Slab(r.ranges[:t_ax] + r.ranges[t_ax + 1:]))
            continue
        m = np.asarray(masks[r], dtype=bool)
        if m.shape[t_ax] == 1:
            sm = np.take(m, 0, axis=t_ax)
        else:
            sub = np.take(m, list(range(k, total)), axis=t_ax)
            sm = np.take(sub, 0, axis=t_ax)
            if not (sub == np.expand_dims(sm, t_ax)).all():
                raise LS.Fallback("a mask region differs along the scanned dim")
        smasks.append(np.ascontiguousarray(sm))
        out.append(len(smasks) - 1)
    return out, smasks


def _mesh_loops(plan: Any, lifted: Any, static: Any, dim: str, kept: frozenset[str] | None,
                n: int, parts: Sequence[Any], names: Sequence[str] | None,
                dtypes: Sequence[np.dtype]) -> MeshLoops:
    """The mesh's loop nests over the previous state: region ``i`` runs kernel
    ``i`` on its previous position; the kept input is the previous value;
    results are cast to the state's dtypes."""
    field = tuple(g.count for g in plan.geom)

    def region(i: int) -> Callable[..., Any]:
        def kernel(cells: Any, dyn: Any, lv: Any) -> Any:
            k = previous_kernel(rebuild(lifted, lv)[i], dim, kept)
            return kernel_caller(plan, k, static)(cells, dyn)

        return kernel

    def base(cells: Any, dyn: Any, lv: Any) -> Any:
        k = previous_kernel(rebuild(lifted, lv)[-1], dim, kept)
        return identity_caller(plan, kernel_caller(plan, k, static))(cells, dyn)

    def shapes(arrays: Any, coords: Any, dyn: Any, dynamic: Any, leaves: Any) -> Any:
        if names is None:
            return jnp.zeros(field, dtypes[0])
        return {n: jnp.zeros(field, dt) for n, dt in zip(names, dtypes, strict=True)}

    return MeshLoops(shapes, [region(i) for i in range(n)], base, parts,
                     lambda arrays, coords: sources(plan, arrays, coords), plan.geom, "loops")


class _MeshStep:
    """A compiled mesh (``loops_mesh._BuiltMesh``) run as the time loop of
    :mod:`~xstencil._labelled.loop_scan` runs a map's loop:
    ``fn(*outputs, *sources, *params)`` writes every nest, in order."""

    def __init__(self, built: Any):
        self.mesh = built
        self.tables: list[np.ndarray] = []
        self.fills: list[Any] = []
        self.params = built.params
        # what loop_scan.outputs reads of a loop's outputs: their dtypes, exactly (not a
        # JAX stand-in, which would narrow a 64-bit dtype with x64 off)
        self.out_avals = [np.empty(0, dt) for dt in built.out_dtypes]
        self.out_tree = built.out_tree

    def fn(self, *args: Any) -> None:
        nout, npar = len(self.out_avals), len(self.params)
        outs, srcs = args[:nout], args[nout:len(args) - npar]
        write_nests(self.mesh, outs, srcs, args[len(args) - npar:])
