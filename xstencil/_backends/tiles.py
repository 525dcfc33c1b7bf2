"""In-memory temporal blocking: a scan stepped tile by tile, K steps at a time.

An in-memory scan (:mod:`xstencil._engine.tscan`) steps the whole array once
per step, so a large array streams through memory once per step.  Here the
spatial domain is cut into cache-sized tiles, and each tile is advanced
``K`` steps at once from a copy extended by a halo ``K`` times the window's
reach deep (the deep-halo argument of :mod:`xstencil._backends.halo`: the
wrong cells at the extended tile's edge creep inward by one reach per step
and never reach the tile's own cells).  The array then streams through
memory once per ``K`` steps, and the tiles of one layer run on a thread
pool, one compiled block program per tile shape.

The block program is the dask scan's (:class:`~xstencil._backends.dask_scan.
BlockScan`): the same pieces (a tile's own cells and its neighbours' edge
strips, :func:`~xstencil._backends.dask_halo.halo_array`'s layout), the same
halo rebuilt on a global edge, the same segments between saves.  Only the
scheduling differs: numpy views of the in-memory arrays instead of dask
tasks, a barrier per layer instead of a graph.  Results are therefore those
of the dask scan, which equal the in-memory scan's bitwise.

:func:`choose` picks the tile size and ``K``; :func:`scan_tiles` runs a
:class:`~xstencil._backends.halo.BlockJob` whose arrays are in memory.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from xstencil._backends.dask_halo import Overlap, block_pieces, neighbour_offsets, strip_slices
from xstencil._backends.dask_scan import BlockScan
from xstencil._backends.halo import BlockJob, padded_coords, segments, time_padded
from xstencil._engine.call import precision
from xstencil._engine.kcache import describe

__all__ = ["LOOP_MAX_STEPS", "LOOP_TILE_BYTES", "MAX_STEPS", "TILE_BYTES", "Tiling", "choose",
           "scan_tiles", "workers"]

#: The bytes of state one tile holds by default (its own cells, all rows):
#: a tile, the halo'd copy the block program steps and its new slab stay
#: within a core's share of the last-level cache (measured: see
#: docs/performance.rst, "Temporal blocking").
TILE_BYTES = 1 << 20
#: The most steps a tile runs per layer by default (more adds halo work for
#: little further saving of memory traffic).
MAX_STEPS = 32
#: The bytes of state one tile holds by default where the tiles run the numba
#: loop scan (``choose(..., strips=True)``): each tile's scan runs on every
#: core in turn, and costs a join and a call besides its steps, so tiles are
#: full-row strips this large (measured: docs/performance.rst, "Temporal
#: blocking").
LOOP_TILE_BYTES = 8 << 20
#: The most steps a loop-scan strip runs per layer by default.
LOOP_MAX_STEPS = 64


@dataclass(frozen=True)
class Tiling:
    """Tile bounds per spatial axis and ``steps`` (K) per layer.

    ``bounds[a]`` lists ``(start, stop)`` per tile along spatial axis ``a``.
    """

    bounds: tuple[tuple[tuple[int, int], ...], ...]
    steps: int

    @property
    def count(self) -> int:
        """The number of tiles."""
        return math.prod(len(b) for b in self.bounds)


def workers() -> int:
    """The CPU cores this process may use (its affinity mask where known)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _split(n: int, tile: int, least: int = 1) -> tuple[tuple[int, int], ...]:
    """``[0, n)`` in near-equal tiles of at most about ``tile`` cells, none
    smaller than ``least`` (a tile's halo comes from its next neighbour
    only, so each must hold at least the window's reach; fewer, larger
    tiles where ``tile`` is smaller, one where ``n < 2 * least``); an even
    split is preferred (one tile shape, so one compile along this axis)."""
    most = max(1, n // max(1, least))  # the most tiles of at least ``least`` cells
    m = min(max(1, -(-n // max(1, tile))), most)
    for cand in range(m, min(m + 3, most) + 1):  # a nearby count that divides n evenly
        if n % cand == 0:
            m = cand
            break
    edges = [round(i * n / m) for i in range(m + 1)]
    return tuple((a, b) for a, b in zip(edges[:-1], edges[1:], strict=True))


def choose(shape: Sequence[int], reach: Sequence[int], row_bytes: int, steps_per_save: int, *,
           tile: Sequence[int] | None = None, steps: int | None = None,
           cores: int | None = None, strips: bool = False) -> Tiling:
    """The tiling of a spatial domain ``shape``.

    ``reach`` is the window's reach per spatial axis (its widest side);
    ``row_bytes`` the bytes per cell of the state (all rows: history depth
    times advanced variables times itemsize).  By default a tile holds about
    :data:`TILE_BYTES` of state, square in cells over the axes with a reach
    (axes without one are not split unless needed), and there are at least
    as many tiles as cores; ``K`` is the largest number of steps, at most
    :data:`MAX_STEPS` and the steps between saves, whose halo (``K`` times
    the reach, per side) is at most an eighth of the smallest tile.
    With ``strips`` (the tiles run the numba loop scan, one at a time on
    every core), a tile is instead a strip of whole rows: the first spatial
    axis cut so that a strip holds about :data:`LOOP_TILE_BYTES`, and ``K``
    at most :data:`LOOP_MAX_STEPS` (all the steps between saves where one
    strip holds the whole field: it has no halo).
    ``tile`` (cells per spatial axis) and ``steps`` override either choice;
    ``K`` is then still capped by the steps between saves and so that the
    halo fits in a neighbouring tile.  No tile is narrower than the reach
    along its axis (a halo is read from the next tile only): a smaller
    ``tile`` gets fewer, larger tiles.

    Examples
    --------
    A 2048² float32 heat scan (reach 1, 200 steps between saves) on 2 cores:
    16 tiles of 512², 32 steps at a time.

    >>> from xstencil._backends.tiles import choose
    >>> t = choose((2048, 2048), (1, 1), 4, 200, cores=2)
    >>> t.count, t.bounds[0][:2], t.steps
    (16, ((0, 512), (512, 1024)), 32)

    On the loop scan: 2 strips of 1024 whole rows, 64 steps at a time.

    >>> t = choose((2048, 2048), (1, 1), 4, 200, strips=True)
    >>> t.count, t.bounds, t.steps
    (2, (((0, 1024), (1024, 2048)), ((0, 2048),)), 64)
    """
    cores = cores or workers()
    nd = len(shape)
    most = LOOP_MAX_STEPS if strips else MAX_STEPS
    if tile is None and strips:
        rest = math.prod(shape[1:])
        tile = [min(shape[0], max(1, LOOP_TILE_BYTES // max(1, row_bytes * rest))),
                *shape[1:]]
    if tile is None:
        cells = max(1, TILE_BYTES // max(1, row_bytes))
        axes = [a for a in range(nd) if reach[a]] or list(range(nd))
        fixed = math.prod(shape[a] for a in range(nd) if a not in axes)
        side = max(8, int((cells / max(1, fixed)) ** (1 / len(axes))))
        want = [min(shape[a], side) if a in axes else shape[a] for a in range(nd)]
        # at least one tile per core: halve the longest split axis until there are enough
        while math.prod(-(-shape[a] // want[a]) for a in range(nd)) < cores:
            a = max(axes, key=lambda b: want[b])
            if want[a] <= 8:
                break
            want[a] = -(-want[a] // 2)
        tile = want
    bounds = tuple(_split(n, t, r) for n, t, r in zip(shape, tile, reach, strict=True))
    # per split axis with a reach: how many steps of halo its smallest tile holds
    fit = [min(b - a for a, b in bounds[ax]) // reach[ax] for ax in range(nd)
           if reach[ax] and len(bounds[ax]) > 1]
    if steps is None and strips and not fit:  # one strip: no halo to recompute, no limit
        k = steps_per_save
    elif steps is None:
        k = min([most] + [max(1, f // 8) for f in fit])
    else:
        k = steps
    # the halo (K times the reach) must fit in the neighbouring tile, which
    # _split keeps at least one reach wide
    k = min([k] + fit)
    assert k >= 1, (bounds, reach)
    return Tiling(bounds, max(1, min(k, steps_per_save)))


def _digest(x: Any) -> tuple[Any, ...]:
    a = np.ascontiguousarray(np.asarray(x))
    return (a.shape, str(a.dtype), hashlib.sha1(a.view(np.uint8).reshape(-1)).hexdigest())


def _token(job: BlockJob, depth: tuple[int, ...], periods: Any, periodic: Any) -> Hashable:
    """The compile-cache key of the block program: what it bakes in at trace
    time (the kernels with the values they close over, the plan, the halo),
    not the data, so every call of one scan structure shares one compile."""
    lifted = describe(job.kernels)
    return ("xstencil-tiles", lifted.key, tuple(_digest(x) for x in lifted.leaves), job.spec,
            job.static, depth, tuple(periods), tuple(periodic), job.evolving, job.forced,
            tuple((np.shape(x), str(np.asarray(x).dtype)) for x in job.dyn),
            tuple((np.shape(x), str(np.asarray(x).dtype)) for x in job.consts),
            job.tcoord is None)


def _interleave(fields: Sequence[np.ndarray]) -> np.ndarray:
    """Fields ``(n, *space)`` as one ``(n * len(fields), *space)`` array
    whose row ``j * len(fields) + v`` is row ``j`` of field ``v``."""
    if len(fields) == 1:
        return fields[0]
    return np.stack(fields, axis=1).reshape((-1,) + fields[0].shape[1:])


def _tile_pieces(x: np.ndarray, depth: tuple[int, ...], rows: tuple[int, int] | None,
                 c: tuple[int, ...], bounds: Sequence[Sequence[tuple[int, int]]],
                 periodic: Sequence[bool]) -> Any:
    """Tile ``c``'s pieces of ``x`` (its own cells and its neighbours' edge
    strips; ``c`` and ``depth`` include axis 0, ``bounds`` the spatial axes
    only), laid out as :func:`~xstencil._backends.dask_halo.halo_array`
    gives them to a dask task."""
    grid = [1] + [len(b) for b in bounds]  # axis 0 (rows: positions, variables) is whole

    def chunk(cc: Sequence[int]) -> np.ndarray:
        return x[(slice(None),) + tuple(slice(*bounds[a - 1][j]) for a, j in enumerate(cc)
                                        if a)]

    ov = Overlap(x, depth, rows)
    strips: list[np.ndarray | None] = []
    for o in neighbour_offsets(depth)[1:]:
        cc = [(ci + oi) % grid[a] if periodic[a] else ci + oi
              for a, (ci, oi) in enumerate(zip(c, o, strict=True))]
        if any(j < 0 or j >= n for j, n in zip(cc, grid, strict=True)):
            strips.append(None)
            continue
        a = next(a for a, oi in enumerate(o) if oi)
        strips.append(chunk(cc)[strip_slices(ov, a, o[a] < 0)])
    return block_pieces(Overlap(None, depth, rows), chunk(c), strips)


def _edges(c: tuple[int, ...], grid: Sequence[int], periodic: Sequence[bool]) -> np.ndarray:
    """Per axis, whether tile ``c``'s low / high side is a global edge of a
    non-periodic axis (its halo there is rebuilt from its own cells)."""
    return np.array([[not periodic[a] and c[a] == 0, not periodic[a] and c[a] == n - 1]
                     for a, n in enumerate(grid)], dtype=bool)


def scan_tiles(job: BlockJob, tiling: Tiling, threads: int | None = None,
               loops: Any = None) -> list[np.ndarray]:
    """Scan the in-memory fields of ``job`` tile by tile: the saved trajectory
    (or last state) of each advanced variable, numpy arrays with dim first.

    Each layer advances every tile of ``tiling`` by up to ``tiling.steps``
    (K) steps on ``threads`` threads (default: :func:`workers`), reading a
    halo K times the window's reach deep from the previous layer; layers end
    at the saved positions.  ``job`` has no function mesh and no
    ``check_finite``.  ``loops``: the labelled layer's loop scan of a
    block (see :class:`~xstencil._backends.dask_scan.BlockScan`), which
    runs each tile where it applies.
    """
    spec, plan = job.spec, job.spec.plan
    if job.mesh is not None or job.finite is not None:
        raise ValueError("scan_tiles: function meshes and check_finite are not supported")
    V, K, F = len(job.evolving), tiling.steps, len(job.forced)
    with precision(list(job.datas), job.dyn):
        fields = [np.asarray(d) for d in job.datas]
        inp = None if spec.grown else _interleave(
            [np.asarray(time_padded(spec, f)) for f in fields])
        forcing = None if not F else _interleave(
            [np.asarray(time_padded(spec, np.asarray(f))) for f in job.forcings])
    data = _interleave(fields)
    grid = (1,) + tuple(len(b) for b in tiling.bounds)
    reach = [max(s.lo, s.hi) for s in plan.specs]
    depth = tuple(K * reach[a] if a and grid[a] > 1 else 0 for a in range(data.ndim))
    periodic = tuple(s.mode == "periodic" for s in plan.specs)
    width = tuple((depth[a] + s.pad_lo, depth[a] + s.pad_hi) for a, s in enumerate(plan.specs))
    coords, periods = padded_coords(job, width)
    starts = ((0,),) + tuple(tuple(a for a, _ in b) for b in tiling.bounds)
    dyn = tuple(np.asarray(x) for x in job.dyn)
    tok = _token(job, depth, periods, periodic)
    consts = [np.asarray(c)[None] for c in job.consts]
    rows = spec.k * V
    state, spare = data[:rows].copy(), np.empty_like(data[:rows])
    traj = None if spec.every == 0 else np.empty(((spec.k + spec.nsave) * V,) + data.shape[1:],
                                                 data.dtype)
    if traj is not None:
        traj[:rows] = data[:rows]
    saved = 0
    tiles = list(np.ndindex(*grid))
    first = {}  # one tile per tile shape, run alone first: one compile per shape, not per thread
    for c in tiles:
        first.setdefault(tuple(b[j][1] - b[j][0] for b, j in zip(tiling.bounds, c[1:],
                                                                   strict=True)), c)
    with ThreadPoolExecutor(max_workers=threads or workers()) as pool:
        for t, n, save in segments(spec, K):
            fn = BlockScan(tok, spec, job.hooks, job.kernels, None, job.static, dyn,  # type: ignore[arg-type]
                           tuple(coords), periods, width, depth, periodic, starts, t, n,
                           inp is not None, F, 0, job.evolving, job.forced, None, job.tcoord,
                           loops)
            ins: list[tuple[np.ndarray, tuple[int, int] | None]] = [(state, None)]
            if inp is not None:
                ins.append((inp, (t * V, (t + K + spec.ahead) * V)))
            if forcing is not None:  # positions [t - k, t + K + ahead)
                ins.append((forcing, ((t - spec.k) * F, (t + K + spec.ahead) * F)))
            ins += [(x, None) for x in consts]

            def one(c: tuple[int, ...], fn: BlockScan = fn, ins: Any = ins,
                    out: np.ndarray = spare) -> None:
                pieces = [_tile_pieces(x, depth, r, c, tiling.bounds, periodic) for x, r in ins]
                own = tuple(slice(*b[j]) for b, j in zip(tiling.bounds, c[1:], strict=True))
                out[(slice(None),) + own] = fn(c, _edges(c, grid, periodic), pieces)

            rest = [c for c in tiles if c not in first.values()] if first else tiles
            for c in first.values():
                one(c)
            first = {}
            list(pool.map(one, rest))
            state, spare = spare, state
            if save and traj is not None:
                saved += 1
                traj[(spec.k - 1 + saved) * V:(spec.k + saved) * V] = state[-V:]
    if traj is None:
        return [state[-V + v] for v in range(V)]
    return [traj if V == 1 else np.ascontiguousarray(traj[v::V]) for v in range(V)]
