"""A function mesh's regions resolved over one plan's output positions, and
what is derived from them, computed once.

Resolving the regions (:func:`~xstencil._labelled.mesh_regions.engine_regions`),
finding whether they cover every output position, building the *select*
evaluation's membership array and the loop backend's nests each take a pass
over the whole field per region.  All of them depend only on the mesh's
regions, by value, and on the plan, so a :class:`Resolved` is kept in the
shared cache (:func:`~xstencil._engine.kcache.cached`) under the plan and the
regions' keys (:func:`~xstencil._labelled.mesh_regions.region_key`: positions
by value, masks by a digest of their cells, taken once per mesh when its
:func:`~xstencil._labelled.mesh_run.layout` is built).  A mesh called again
(also a Dataset mesh, which has no repeat-call fast path), or rebuilt with
equal regions, reuses it, so a call's cost outside the kernels' own work does
not grow with the number of regions.

It cannot go stale: a mask is copied when it is assigned
(:func:`~xstencil._labelled.mesh_regions.by_mask`), so changing the mask
DataArray afterwards does not change the mesh (its region was fixed when
assigned), and a new mesh's mask gets its own digest.  The arrays kept here
are read-only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from xstencil._backends.loops_mesh import Piece, covered, pieces
from xstencil._engine.kcache import cached
from xstencil._engine.mesh import Slab
from xstencil._labelled.plan import Plan

__all__ = ["Resolved", "resolved"]


def _frozen(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``."""
    v = a.view()
    v.flags.writeable = False
    return v


class Resolved:
    """A mesh's engine regions over a plan's output positions: ``regions``
    (:class:`Slab` or an index into ``masks``), read-only ``masks``,
    ``covered`` (no position keeps its input) and ``key`` (the regions by
    value); :meth:`member` and :meth:`pieces` are built on first use."""

    def __init__(self, regions: Sequence[Slab | int], masks: Sequence[np.ndarray],
                 counts: tuple[int, ...], key: Hashable):
        self.regions = tuple(regions)
        self.masks = tuple(_frozen(m) for m in masks)
        self.counts = tuple(counts)
        self.key = key
        self.covered = covered(self.regions, self.masks, self.counts)
        self._members: dict[tuple[int, ...], np.ndarray] = {}
        self._pieces: list[Piece] | None = None
        self._lock = threading.Lock()

    def member(self, branch: tuple[int, ...], branches: int) -> np.ndarray:
        """The *select* membership array: per output position, the branch of
        the last region that covers it (``branch[i]`` for region ``i``, out
        of ``branches``), -1 where the input is kept."""
        with self._lock:
            got = self._members.get(branch)
        if got is None:
            got = np.full(self.counts, -1, np.int8 if branches < 127 else np.int32)
            for r, b in zip(self.regions, branch, strict=True):
                got[tuple(slice(*rr) for rr in r.ranges) if isinstance(r, Slab)
                    else self.masks[r]] = b
            got = _frozen(got)
            with self._lock:
                got = self._members.setdefault(branch, got)
        return got

    def pieces(self) -> list[Piece]:
        """The loop backend's nests (:func:`~xstencil._backends.loops_mesh.pieces`)."""
        if self._pieces is None:
            self._pieces = pieces(self.regions, self.masks, self.counts, self.covered)
        return self._pieces


def resolved(plan: Plan, key: Hashable,
             build: Callable[[], tuple[Sequence[Slab | int], Sequence[np.ndarray]]]
             ) -> Resolved:
    """The :class:`Resolved` regions of a mesh whose regions have the keys
    ``key`` (``layout(m).key[0]``) over ``plan``; ``build()`` resolves them
    (``Mesh._regions_of(plan, None)``) on a miss."""
    return cached(("mesh-resolved", plan, key),
                  lambda: Resolved(*build(), tuple(plan.out_shape), key))
