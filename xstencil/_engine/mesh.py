"""Function meshes: different kernels on different regions of the output.

The result equals a per-cell ``lax.switch`` over the assigned kernels, with
the later assignment winning where regions overlap.  A rectangular region
(slices, with steps) is evaluated only over its own slab of outputs, so a
one-cell boundary strip costs one strip, not a full-array evaluation of every
branch.  Boolean-mask regions are evaluated everywhere and merged with
``select``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xstencil._engine.call import promote
from xstencil._engine.lower import AxisGeom, KernelCall, Source, evaluate, trace
from xstencil._errors import XStencilError

__all__ = ["Slab", "Mask", "branches", "mesh_evaluate", "select_evaluate", "slab_geometry",
           "region_values", "write_region", "write_slab"]


@dataclass(frozen=True)
class Slab:
    """Output positions ``range(start, stop, step)`` per field axis."""

    ranges: tuple[tuple[int, int, int], ...]

    def covers(self, geom: Sequence[AxisGeom]) -> bool:
        return all(r == (0, g.count, 1) for r, g in zip(self.ranges, geom, strict=True))

    def counts(self) -> tuple[int, ...]:
        return tuple(len(range(*r)) for r in self.ranges)


@dataclass(frozen=True, eq=False)
class Mask:
    """A boolean array of the output's field shape."""

    array: Any


def branches(regions: Sequence[Slab | int], masks: Sequence[Any],
             calls: Sequence[KernelCall]) -> list[tuple[Slab | Mask, KernelCall]]:
    """A function mesh's ``(region, call)`` branches for :func:`mesh_evaluate`:
    each region is a :class:`Slab`, or the index of its mask in ``masks``."""
    return [(r if isinstance(r, Slab) else Mask(masks[r]), c)
            for r, c in zip(regions, calls, strict=True)]


def slab_geometry(geom: Sequence[AxisGeom], slab: Slab) -> list[AxisGeom]:
    return [AxisGeom(g.start + a * g.step, g.step * c, len(range(a, b, c)), g.size)
            for g, (a, b, c) in zip(geom, slab.ranges, strict=True)]


def mesh_evaluate(
    branches: Sequence[tuple[Slab | Mask, KernelCall]],
    base: KernelCall,
    sources: Sequence[Source],
    geom: Sequence[AxisGeom],
    dyn: Any,
    covered: bool = False,
) -> Any:
    """Evaluate ``base`` everywhere, then each branch on its region, in order.

    Each branch reads non-finite inputs as zero at the positions whose result
    is discarded (outside its mask, or overwritten by a later region), so
    NaN on land never reaches the gradient of what the sea kernel keeps.
    ``covered``: the caller knows that the regions cover every position (its
    masks are run-time inputs here), so the kept input's dtype takes no part
    in the result's, as when slabs cover it.
    """
    same_results([c for _, c in branches], sources, geom, dyn)
    start = 0
    for k, (region, _) in enumerate(branches):
        if isinstance(region, Slab) and region.covers(geom):
            start = k
    if branches and isinstance(branches[start][0], Slab) and branches[start][0].covers(geom):
        out = guarded(branches[start][1], sources, geom, dyn, kept(branches, start, geom))
        rest = branches[start + 1:]
        offset = start + 1
    elif _tiles(branches, geom):
        # the slabs cover every position: no need to evaluate the base
        first = branches[0]
        vals = guarded(first[1], sources, slab_geometry(geom, first[0]), dyn,
                       kept(branches, 0, geom))
        out = jax.tree_util.tree_map(
            lambda v: jnp.zeros(tuple(g.count for g in geom) + v.shape[len(geom):], v.dtype),
            vals)
        out = jax.tree_util.tree_map(lambda o, v: write_slab(o, v, first[0]), out, vals)
        rest = branches[1:]
        offset = 1
    else:
        out = evaluate(base, sources, geom, dyn)
        rest = branches
        offset = 0
    leaves, treedef = jax.tree_util.tree_flatten(out)
    evaluated = [(region, vals) for k, (region, call) in enumerate(rest, offset)
                 if (vals := region_values(region, call, sources, geom, dyn,
                                           kept(branches, k, geom))) is not None]
    # every region writes into one array: promote to a dtype that holds them all
    # (the kept input's only where some position keeps it)
    base_kept = not (covered and offset == 0 and evaluated)
    for k in range(len(leaves)):
        parts = ([leaves[k]] if base_kept else []) + [vals[k] for _, vals in evaluated]
        leaves[k] = leaves[k].astype(promote(*parts))
    for region, vals in evaluated:
        leaves = write_region(leaves, region, vals)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def region_values(region: Slab | Mask, call: KernelCall, sources: Sequence[Source],
                  geom: Sequence[AxisGeom], dyn: Any, guard: Any = None) -> list[Any] | None:
    """The output leaves of ``call`` over ``region`` (its slab only, for a
    slab; everywhere, for a mask), or ``None`` for an empty slab.  ``guard``
    marks the outputs that are kept (see :func:`kept`)."""
    if isinstance(region, Slab):
        if 0 in region.counts():
            return None
        geom = slab_geometry(geom, region)
    elif guard is None:
        guard = jnp.asarray(region.array, dtype=bool)
    return jax.tree_util.tree_leaves(guarded(call, sources, geom, dyn, guard))


def guarded(call: KernelCall, sources: Sequence[Source], geom: Sequence[AxisGeom], dyn: Any,
            guard: Any) -> Any:
    """``evaluate`` whose derivatives ignore non-finite inputs outside ``guard``.

    Outside ``guard`` the caller discards the values, but not their
    derivatives: a zero cotangent times a NaN partial derivative is NaN.  The
    derivative rule therefore evaluates the kernel with non-finite inputs
    read as zero there (the double-``where`` pattern), which keeps the
    gradient of the kept values exact.  The values themselves are computed
    without the guard, at no extra cost.  Values the kernel closes over
    (``lambda u: u() * nu`` inside a differentiated function) are hoisted
    into arguments with :func:`jax.closure_convert`; a kernel that closes
    over no traced value needs no conversion.  The kernel is traced once and
    both variants are lowered from that trace.
    """
    if guard is None:
        return evaluate(call, sources, geom, dyn)
    arrays = [s.array for s in sources]
    closed = trace(call, sources, geom, dyn)  # the kernel is traced once for both variants

    def run(arrays: Any, dyn: Any, guard: Any, safe: bool) -> Any:
        srcs = [dataclasses.replace(s, array=a) for s, a in zip(sources, arrays, strict=True)]
        return evaluate(call, srcs, geom, dyn, closed, guard=guard if safe else None)

    if not any(isinstance(c, jax.core.Tracer) for c in closed[0].consts):
        # nothing traced is closed over: no closure conversion needed
        @jax.custom_jvp
        def direct(arrays: Any, dyn: Any, guard: Any) -> Any:
            return run(arrays, dyn, None, False)

        @direct.defjvp
        def _direct_jvp(primals: Any, tangents: Any) -> Any:
            arrays, dyn, guard = primals
            ta, td, _ = tangents
            return jax.jvp(lambda a, d: run(a, d, guard, True), (arrays, dyn), (ta, td))

        return direct(arrays, dyn, guard)

    plain, plain_consts = jax.closure_convert(lambda a, d: run(a, d, None, False), arrays, dyn)
    safe, safe_consts = jax.closure_convert(lambda a, d, g: run(a, d, g, True), arrays, dyn,
                                            guard)

    @jax.custom_jvp
    def values(arrays: Any, dyn: Any, guard: Any, pc: Any, sc: Any) -> Any:
        return plain(arrays, dyn, *pc)

    @values.defjvp
    def _jvp(primals: Any, tangents: Any) -> Any:
        arrays, dyn, guard, _, sc = primals
        ta, td, _, _, tsc = tangents
        return jax.jvp(lambda a, d, c: safe(a, d, guard, *c), (arrays, dyn, sc), (ta, td, tsc))

    return values(arrays, dyn, guard, list(plain_consts), list(safe_consts))


def select_evaluate(calls: Sequence[KernelCall], base: KernelCall, member: Any, covered: bool,
                    sources: Sequence[Source], geom: Sequence[AxisGeom], dyn: Any) -> Any:
    """A function mesh as one ``select`` over its distinct kernels.

    ``member`` (an integer array of the output's field shape, a run-time
    input) holds at each output position the index of the kernel in
    ``calls`` that computes it, or -1 where no region covers it and ``base``
    keeps the input; ``covered`` says that no position holds -1 (``base``
    is then not evaluated).  Each kernel is traced once, however many
    regions use it, and the compiled code does not depend on where the
    regions lie.  Each kernel's derivatives ignore non-finite inputs at the
    positions it does not compute (see :func:`guarded`).
    """
    if len(calls) == 1 and covered:
        return evaluate(calls[0], sources, geom, dyn)
    same_results(calls, sources, geom, dyn)
    member = jnp.asarray(member).astype(jnp.int32)
    cases = []
    if not covered:
        cases.append(jax.tree_util.tree_flatten(evaluate(base, sources, geom, dyn)))
    for b, call in enumerate(calls):
        cases.append(jax.tree_util.tree_flatten(
            guarded(call, sources, geom, dyn, member == b)))
    treedef = cases[0][1]
    which = member if covered else member + 1
    out = []
    for k in range(len(cases[0][0])):
        leaves = [c[0][k] for c in cases]
        dt = promote(*leaves)  # every kernel writes into one array
        leaves = [v.astype(dt) for v in leaves]
        w = which
        if leaves[0].ndim > w.ndim:  # per-point outputs with trailing dims
            w = jnp.broadcast_to(lax.expand_dims(w, tuple(range(w.ndim, leaves[0].ndim))),
                                 leaves[0].shape)
        out.append(lax.select_n(w, *leaves))
    return jax.tree_util.tree_unflatten(treedef, out)


def same_results(calls: Sequence[KernelCall], sources: Sequence[Source],
                 geom: Sequence[AxisGeom], dyn: Any) -> None:
    """Raise unless every kernel of a mesh returns the same structure and
    per-point shapes: all write into one result, leaf by leaf, so a Dataset
    kernel returning other variables than another would write into the wrong
    one, and a smaller array would be broadcast over the larger."""
    first = None
    for call in dict.fromkeys(calls):
        closed, tree = trace(call, sources, geom, dyn)
        shapes = tuple(tuple(v.aval.shape) for v in closed.jaxpr.outvars)
        if first is None:
            first = (tree, shapes)
        elif tree != first[0]:
            raise XStencilError(
                f"a function mesh's kernels return different results: {_names(first[0])} and "
                f"{_names(tree)}; every region writes into one result, so every kernel must "
                f"return the same variables (with the same shapes): return each variable from "
                f"every kernel, e.g. s['h']() to keep 'h' as it is")
        elif shapes != first[1]:
            pairs = [(a, b) for a, b in zip(first[1], shapes, strict=True) if a != b]
            raise XStencilError(
                f"a function mesh's kernels return different results: per-point shapes "
                f"{pairs[0][0]} and {pairs[0][1]}; every region writes into one result, so "
                f"every kernel must return the same shape (the same length along each of "
                f"output_dims)")


def _names(tree: Any) -> str:
    """The variables a kernel result's structure holds (its dict keys), or the structure."""
    value = jax.tree_util.tree_unflatten(tree, [0] * tree.num_leaves)
    return repr(sorted(value)) if isinstance(value, dict) else str(tree)


def _in_slab(slab: Slab, domain: Sequence[tuple[int, int, int]],
             counts: tuple[int, ...]) -> Any:
    """Whether each position of ``domain`` (per axis: start, step, count of
    output positions) lies in ``slab``, built from iotas (no constant array)."""
    inside = None
    for a, ((s0, c0, n0), (a1, b1, c1)) in enumerate(zip(domain, slab.ranges, strict=True)):
        if set(range(s0, s0 + c0 * n0, c0)) <= set(range(a1, b1, c1)):
            continue
        p = s0 + c0 * lax.broadcasted_iota(jnp.int32, counts, a)
        hit = (p >= a1) & (p < b1) & ((p - a1) % c1 == 0)
        inside = hit if inside is None else inside & hit
    return jnp.ones(counts, bool) if inside is None else inside


def kept(branches: Sequence[tuple[Slab | Mask, KernelCall]], k: int,
         geom: Sequence[AxisGeom]) -> Any:
    """The outputs of branch ``k`` (over its slab, or everywhere for a mask)
    that no later branch overwrites and, for a mask, that the mask selects;
    ``None`` when all of them are kept."""
    region = branches[k][0]
    if isinstance(region, Slab):
        domain = [(a, c, len(range(a, b, c))) for a, b, c in region.ranges]
    else:
        domain = [(0, 1, g.count) for g in geom]
    counts = tuple(n for _, _, n in domain)
    keep = None if isinstance(region, Slab) else jnp.asarray(region.array, dtype=bool)
    for later, _ in branches[k + 1:]:
        if isinstance(later, Slab):
            if not _overlaps(later, domain):
                continue
            hit = _in_slab(later, domain, counts)
        else:
            m = jnp.asarray(later.array, dtype=bool)
            hit = m[tuple(slice(a, a + c * (n - 1) + 1, c) for a, c, n in domain)] \
                if isinstance(region, Slab) else m
        keep = ~hit if keep is None else keep & ~hit
    return keep


def _overlaps(slab: Slab, domain: Sequence[tuple[int, int, int]]) -> bool:
    """Whether ``slab`` shares a position with ``domain`` (ranges start, step, count)."""
    for (s0, c0, n0), (a1, b1, c1) in zip(domain, slab.ranges, strict=True):
        if not set(range(s0, s0 + c0 * n0, c0)) & set(range(a1, b1, c1)):
            return False
    return True


def write_region(leaves: Sequence[Any], region: Slab | Mask, vals: Sequence[Any]) -> list[Any]:
    """``leaves`` with ``vals`` written into ``region`` (cast to the leaves' dtypes)."""
    if isinstance(region, Slab):
        return [write_slab(o, v, region) for o, v in zip(leaves, vals, strict=True)]
    out = []
    for o, v in zip(leaves, vals, strict=True):
        m = jnp.asarray(region.array, dtype=bool)
        if o.ndim > m.ndim:  # per-point outputs with trailing dims
            m = lax.expand_dims(m, tuple(range(m.ndim, o.ndim)))
        out.append(jnp.where(m, v.astype(o.dtype), o))
    return out


def _tiles(branches: Sequence[tuple[Slab | Mask, KernelCall]],
           geom: Sequence[AxisGeom]) -> bool:
    """Whether the slab regions together cover every output position."""
    counts = tuple(g.count for g in geom)
    if not branches or any(isinstance(r, Mask) for r, _ in branches):
        return False
    if math.prod(counts) > 4_000_000:
        return False
    hit = np.zeros(counts, dtype=bool)
    for r, _ in branches:
        hit[tuple(slice(*rr) for rr in r.ranges)] = True  # type: ignore[union-attr]
    return bool(hit.all())


def write_slab(out: Any, vals: Any, slab: Slab) -> Any:
    vals = vals.astype(out.dtype)
    if all(step == 1 for _, _, step in slab.ranges):
        starts = [a for a, _, _ in slab.ranges] + [0] * (out.ndim - len(slab.ranges))
        return lax.dynamic_update_slice(out, vals, starts)
    return out.at[tuple(slice(*r) for r in slab.ranges)].set(vals)
