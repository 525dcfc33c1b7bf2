"""A block's halo on a global edge, rebuilt from its own cells.

Both block backends give every block the same shape, halo included, whatever
its position: the dask blocks (:mod:`xstencil._backends.dask_halo`,
:mod:`xstencil._backends.dask_scan`) and the sharded devices
(:mod:`xstencil._backends.shard_scan`).  A block on the global edge of a
non-periodic dim has no neighbour there, so its outer halo is rebuilt in the
dim's boundary mode from the cells inside, under a traced flag (the dask
block's edge flags, or ``axis_index`` on the edge devices), so one compiled
program serves every position.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import lax

from xstencil._engine.boundary import pad

__all__ = ["repad"]


def repad(x: Any, axis: int, lo: int, hi: int, mode: str, fill: Any, at_lo: Any,
          at_hi: Any) -> Any:
    """Where ``at_lo`` / ``at_hi`` (traced bools), rebuild the outer ``lo`` /
    ``hi`` cells of ``x`` along ``axis`` from the cells inside, in ``mode``."""
    n = x.shape[axis]
    widths = [(0, 0)] * x.ndim
    modes = ["fill"] * x.ndim
    modes[axis] = mode
    # the outer w cells depend only on the w + 1 cells next to them, so only those
    # are padded and only the halo slab is written back
    if lo:
        widths[axis] = (lo, 0)
        inner = lax.slice_in_dim(x, lo, min(n, 2 * lo + 1), axis=axis)
        edge = lax.slice_in_dim(pad(inner, widths, modes, fill), 0, lo, axis=axis)
        if hi and n - hi < 2 * lo + 1:
            # the w + 1 cells reach into the high halo, which is a neighbour's
            # cells, or, where the high side is a global edge too (one block
            # along the axis), not rebuilt yet: there the mode reads the core only
            core = lax.slice_in_dim(x, lo, n - hi, axis=axis)
            alone = lax.slice_in_dim(pad(core, widths, modes, fill), 0, lo, axis=axis)
            edge = jnp.where(at_hi, alone, edge)
        old = lax.slice_in_dim(x, 0, lo, axis=axis)
        x = lax.dynamic_update_slice_in_dim(x, jnp.where(at_lo, edge, old), 0, axis)
    if hi:
        widths[axis] = (0, hi)
        inner = lax.slice_in_dim(x, max(0, n - 2 * hi - 1), n - hi, axis=axis)
        m = inner.shape[axis]
        edge = lax.slice_in_dim(pad(inner, widths, modes, fill), m, m + hi, axis=axis)
        old = lax.slice_in_dim(x, n - hi, n, axis=axis)
        x = lax.dynamic_update_slice_in_dim(x, jnp.where(at_hi, edge, old), n - hi, axis)
    return x
