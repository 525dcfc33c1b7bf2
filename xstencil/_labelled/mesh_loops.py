"""Whether a function mesh may run on the CPU loop backend, and the hook
that wraps its jitted function (:mod:`xstencil._backends.loops_mesh`).

The XLA mesh's *select* evaluation keeps its regions in a run-time array, so
one compiled function serves meshes whose regions moved.  The loops need the
regions themselves, so a mesh that may run as loops is compiled under a key
that also holds its regions (by value, masks by the digest its layout took
once), from which its loop nests follow.  Only such meshes take that key:
large numpy data on the CPU outside JAX transforms, with numba installed and
the backend not ``"xla"``; every other mesh keeps the XLA path's key and
sharing.  The nests and the coverage they need are built once per regions
and plan (mesh_resolved.py), not per call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from xstencil._backends.loops import (
    AUTO_MIN_POINTS,
    available,
    host_views,
    numpy_on_cpu,
    resolve_mode,
)
from xstencil._backends.loops_mesh import AUTO_MAX_NESTS, MeshLoops
from xstencil._engine.kcache import rebuild
from xstencil._labelled.core import identity_caller, kernel_caller, sources
from xstencil._labelled.mesh_resolved import Resolved
from xstencil._labelled.plan import Plan

__all__ = ["loop_hook"]


def loop_hook(plan: Plan, arrays: Sequence[Any], kidx: Sequence[int], res: Resolved,
              key_extra: Any, backend: str | None, traced: bool
              ) -> tuple[Hashable, Callable[..., Any]] | None:
    """``(key, loops)`` for :func:`~xstencil._labelled.core.call_engine` when
    the loop backend may run this mesh, else ``None`` (XLA as before).

    ``kidx``: per region, its kernel's index among the distinct kernels;
    ``res``: the regions over the plan, whose loop nests and key are built
    once (mesh_resolved.py), so a call costs the same whatever the number of
    regions; ``key_extra``: the XLA evaluation
    :func:`~xstencil._labelled.mesh_run.how` chose, whose kept-input dtype
    the loops follow."""
    mode = resolve_mode(backend)
    if mode == "xla" or traced or not available():
        return None
    n = math.prod(plan.out_shape)
    if not n or (mode == "auto" and n < AUTO_MIN_POINTS):
        return None
    if not numpy_on_cpu("mesh", host_views(arrays), ()):
        return None
    parts = res.pieces()
    if not parts or (mode == "auto" and len(parts) > AUTO_MAX_NESTS):
        return None
    # the kept input takes the dtype of the kernel the XLA body passes to
    # identity_caller: the last distinct kernel (select) or region (slabs)
    like = key_extra[1][-1] if key_extra[0] == "mesh-select" else kidx[-1]
    # the nests follow from the regions (by value, masks by digest) and the
    # plan, which the engine's key holds
    key = ("loops-mesh", backend, tuple(kidx), like, res.key)

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
