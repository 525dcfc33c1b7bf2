"""Boundary modes: the values of the halo around an array.

Modes follow xgcm's vocabulary plus numpy's mirror modes:

``fill``
    the halo holds ``fill_value``.
``extend``
    the edge value is repeated (numpy ``edge``).
``periodic``
    the array wraps around (numpy ``wrap``).
``reflect``
    mirrored about the edge cell, which is not repeated (numpy ``reflect``).
``symmetric``
    mirrored including the edge cell (numpy ``symmetric``).

``valid`` means no halo at all; callers give it zero width.

Halos are built from static slices, reversals and one ``concatenate`` per
axis (:func:`block`), never from ``jnp.pad(mode="wrap")``, which measured
1.3-2x slower on XLA:CPU.  The map lowering asks only for the small padded
blocks that the boundary shell of the output reads.  Under the fused
lowering (:func:`pads_fuse`: off the CPU) a block whose every axis is
``fill`` is one ``lax.pad`` instead: on a TPU v5e the concatenation left a
2048² heat scan at 11.8 ms for 200 steps and an 8192² Laplacian at 3187 µs,
``lax.pad`` 5.2 ms and 2512 µs (hand-written ``jnp.pad``: 4.8 ms, 2512 µs).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xstencil._errors import XStencilError

__all__ = ["MODES", "ALIASES", "MODE_HELP", "canonical_mode", "source_index", "index_runs",
           "block", "pad", "LOWERING_ENV", "pads_fuse"]

MODES = ("fill", "extend", "periodic", "reflect", "symmetric", "valid")

#: Names from scipy.ndimage and numpy.pad accepted for the modes above.  Not
#: ``reflect``: scipy's ``reflect`` (``d c b a | a b c d``) is xstencil's
#: ``symmetric``; xstencil's ``reflect`` is numpy's (``d c b | a b c d``),
#: scipy's ``mirror``.
ALIASES = {"wrap": "periodic", "grid-wrap": "periodic", "nearest": "extend",
           "edge": "extend", "mirror": "reflect", "grid-mirror": "symmetric",
           "constant": "fill", "grid-constant": "fill"}

#: The end of every unknown-boundary message.
MODE_HELP = ("scipy.ndimage/numpy names are accepted too: 'wrap' (periodic), 'nearest' or "
             "'edge' (extend), 'mirror' (reflect), 'constant' (fill); note that scipy's "
             "'reflect' (d c b a | a b c d) is xstencil's 'symmetric', and xstencil's 'reflect' "
             "is numpy's (d c b | a b c d)")


def canonical_mode(mode: Any) -> Any:
    """``mode`` with a scipy.ndimage/numpy alias replaced by xstencil's name."""
    return ALIASES.get(mode, mode) if isinstance(mode, str) else mode


def source_index(p: np.ndarray, n: int, mode: str) -> np.ndarray:
    """For unpadded positions ``p`` (any ints), the array index each reads,
    or -1 where the halo holds the fill value."""
    p = np.asarray(p, dtype=np.int64)
    inside = (p >= 0) & (p < n)
    if mode in ("fill", "valid"):
        return np.where(inside, p, -1)
    if mode == "extend":
        return np.clip(p, 0, n - 1)
    if mode == "periodic":
        return np.mod(p, n)
    if mode == "reflect":
        if n == 1:
            return np.zeros_like(p)
        period = 2 * n - 2
        q = np.mod(p, period)
        return np.where(q < n, q, period - q)
    if mode == "symmetric":
        period = 2 * n
        q = np.mod(p, period)
        return np.where(q < n, q, period - 1 - q)
    raise ValueError(f"unknown boundary mode {mode!r}")


def index_runs(idx: np.ndarray) -> list[tuple[int, int, int]]:
    """Split static source indices (from :func:`source_index`) into
    ``(first, last, step)`` runs: step +1/-1, or 0 for a single cell;
    ``first == -1`` marks a run of ``last`` fill cells."""
    out = []
    k = 0
    while k < len(idx):
        i = int(idx[k])
        j = k + 1
        if i < 0:
            while j < len(idx) and idx[j] < 0:
                j += 1
            out.append((-1, j - k, 0))
        else:
            step = int(idx[j]) - i if j < len(idx) and idx[j] >= 0 else 0
            if abs(step) != 1:
                step = 0
            else:
                while j < len(idx) and idx[j] >= 0 and int(idx[j]) - int(idx[j - 1]) == step:
                    j += 1
            out.append((i, int(idx[j - 1]), step))
        k = j
    return out


#: The environment variable that picks the lowering: ``"cpu"`` (a map's
#: interior read in place plus a boundary shell; a scan step's halo built
#: behind an optimization barrier) or ``"fused"`` (one padded block per
#: source, its padding left to XLA's fusion).  Unset: ``"fused"`` where JAX's
#: default backend is not the CPU (see :func:`pads_fuse`).
LOWERING_ENV = "XSTENCIL_LOWERING"


def pads_fuse() -> bool:
    """Whether to lower for a backend whose XLA fuses padding into the
    slices that read it (decided when a kernel is traced): ``XSTENCIL_LOWERING``,
    else whether JAX's default backend is not the CPU.

    XLA:CPU runs pad- and concatenate-rooted fusions at several times a copy,
    so on the CPU a map reads its interior in place and only a thin shell reads
    a padded copy.  On a TPU v5e the shell's pieces, written into one buffer
    by dynamic-update-slices, cost more than the arithmetic: a 5-point
    Laplacian at 2048² ran 192 µs a call against 125 µs for slices of one
    padded block, the same as ``jnp.pad`` and slices written by hand (126 µs),
    with bitwise the same results (docs/performance.rst, "On an
    accelerator").  Read when a kernel is traced: compiled functions keep the
    lowering they were traced with (``xstencil.clear_caches()`` after changing
    the variable in a running process)."""
    how = os.environ.get(LOWERING_ENV, "").strip().lower()
    if not how:
        return jax.default_backend() != "cpu"
    if how not in ("cpu", "fused"):
        raise XStencilError(f"{LOWERING_ENV}={how!r} is not a lowering; set it to 'cpu' or "
                            f"'fused', or unset it (the default backend decides)")
    return how == "fused"


def block(
    x: Any,
    ranges: Sequence[tuple[int, int]],
    pads: Sequence[tuple[int, int]],
    modes: Sequence[str],
    fill_value: Any = 0,
) -> Any:
    """The part ``[a, b)`` per axis of ``x`` padded by ``pads`` (in padded
    indices), without materializing the whole padded array.

    It is one nested concatenation whose leaves are slices of ``x`` itself
    (or fill values), so XLA builds it in a single fused pass; padding axis
    by axis would materialize each stage.
    """
    if pads_fuse() and all(m == "fill" for m in modes):  # one lax.pad, which XLA fuses
        # (negative widths trim: padded index p is array index p - lo)
        widths = [(lo - a, b - lo - n, 0)
                  for (a, b), (lo, _), n in zip(ranges, pads, x.shape, strict=True)]
        return lax.pad(x, jnp.asarray(fill_value, x.dtype), widths)
    runs = [index_runs(source_index(np.arange(a, b) - lo, n, mode))
            for (a, b), (lo, _), n, mode in zip(ranges, pads, x.shape, modes, strict=True)]

    def build(axis: int, starts: list[int], stops: list[int], rev: list[int],
              fill_shape: list[int] | None) -> Any:
        if axis == x.ndim:
            if fill_shape is not None:
                return jnp.full(fill_shape, fill_value, x.dtype)
            piece = x
            if starts != [0] * x.ndim or stops != list(x.shape):
                piece = lax.slice(x, starts, stops)
            return lax.rev(piece, tuple(rev)) if rev else piece
        parts = []
        for first, last, step in runs[axis]:
            if first < 0:
                shape = list(fill_shape) if fill_shape is not None else [
                    b - a for a, b in zip(starts, stops, strict=True)]
                shape[axis] = last
                parts.append(build(axis + 1, starts, stops, rev, shape))
                continue
            lo, hi = (first, last) if step >= 0 else (last, first)
            st, sp = list(starts), list(stops)
            st[axis], sp[axis] = lo, hi + 1
            shape = None
            if fill_shape is not None:
                shape = list(fill_shape)
                shape[axis] = hi + 1 - lo
            parts.append(build(axis + 1, st, sp, rev + [axis] if step < 0 else rev, shape))
        return parts[0] if len(parts) == 1 else lax.concatenate(parts, axis)

    return build(0, [0] * x.ndim, list(x.shape), [], None)


def pad(
    x: Any,
    pads: Sequence[tuple[int, int]],
    modes: Sequence[str],
    fill_value: Any = 0,
) -> Any:
    """Pad every axis of ``x`` by its ``(lo, hi)`` width (negative trims)."""
    ranges = [(0, lo + n + hi) for (lo, hi), n in zip(pads, x.shape, strict=True)]
    return block(x, ranges, pads, modes, fill_value)
