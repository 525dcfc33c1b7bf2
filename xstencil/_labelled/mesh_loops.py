"""Whether a function mesh may run on the CPU loop backend, and the hook
that wraps its jitted function (:mod:`xstencil._backends.loops_mesh`).

The XLA mesh's *select* evaluation keeps its regions in a run-time array, so
one compiled function serves meshes whose regions moved.  The loops need the
regions themselves, so a mesh that may run as loops is compiled under a key
that also holds its loop nests (boxes by value, masks by digest).  Only such
meshes take that key: large numpy data on the CPU outside JAX transforms,
with numba installed and the backend not ``"xla"``; every other mesh keeps
the XLA path's key and sharing.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import numpy as np

from xstencil._backends.loops import AUTO_MIN_POINTS, available, resolve_mode
from xstencil._backends.loops_mesh import AUTO_MAX_NESTS, MeshLoops, pieces
from xstencil._engine.kcache import rebuild
from xstencil._engine.mesh import Slab
from xstencil._labelled.core import identity_caller, kernel_caller, sources
from xstencil._labelled.plan import Plan

__all__ = ["loop_hook"]


def loop_hook(plan: Plan, arrays: Sequence[Any], kidx: Sequence[int],
              regions: Sequence[Slab | int], masks: Sequence[np.ndarray], key_extra: Any,
              backend: str | None, traced: bool
              ) -> tuple[Hashable, Callable[..., Any]] | None:
    """``(key, loops)`` for :func:`~xstencil._labelled.core.call_engine` when
    the loop backend may run this mesh, else ``None`` (XLA as before).

    ``kidx``: per region, its kernel's index among the distinct kernels;
    ``key_extra``: the XLA evaluation :func:`~xstencil._labelled.mesh_run.how`
    chose, whose kept-input dtype the loops follow."""
    mode = resolve_mode(backend)
    if mode == "xla" or traced or not available() or jax.default_backend() != "cpu":
        return None
    n = math.prod(plan.out_shape)
    if not n or (mode == "auto" and n < AUTO_MIN_POINTS):
        return None
    if not arrays or not all(isinstance(x, np.ndarray) and x.dtype.kind in "biuf"
                             for x in arrays):
        return None
    hit = np.zeros(plan.out_shape, bool)
    for r in regions:
        hit[tuple(slice(*rr) for rr in r.ranges) if isinstance(r, Slab) else masks[r]] = True
    parts = pieces(regions, masks, plan.out_shape, bool(hit.all()))
    if not parts or (mode == "auto" and len(parts) > AUTO_MAX_NESTS):
        return None
    # the kept input takes the dtype of the kernel the XLA body passes to
    # identity_caller: the last distinct kernel (select) or region (slabs)
    like = key_extra[1][-1] if key_extra[0] == "mesh-select" else kidx[-1]
    key = ("loops-mesh", backend, tuple(kidx), like,
           tuple((p.kernel, p.box, None if p.mask is None else
                  hashlib.blake2b(p.mask.tobytes(), digest_size=20).digest()) for p in parts))

    def wrap(jitted: Callable[..., Any], template: Any, static: Any) -> MeshLoops:
        def region(i: int) -> Callable[..., Any]:
            def kernel(cells: Any, dyn: Any, leaves: Any) -> Any:
                return kernel_caller(plan, rebuild(template, leaves)[i], static)(cells, dyn)

            return kernel

        def base(cells: Any, dyn: Any, leaves: Any) -> Any:
            call = kernel_caller(plan, rebuild(template, leaves)[like], static)
            return identity_caller(plan, call)(cells, dyn)

        return MeshLoops(jitted, [region(i) for i in kidx], base, parts,
                         lambda arrays, coords: sources(plan, arrays, coords), plan.geom,
                         backend)

    return key, wrap
