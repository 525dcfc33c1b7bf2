"""Temporal blocking with tiles narrower than the window's reach (session 12 attack).

A blocked scan reads each tile's halo from its next neighbour only.  The
tiling preferred an even split so strongly that ``blocking={"tile": 4}`` on
a 5-row field gave 5 tiles of 1 row, and a tile narrower than the reach
(2 rows here) cannot hold the halo of even one step: the scan came back
silently wrong (max error 2.3 after 3 steps, 90 of 240 probe cases wrong),
on the loops and on XLA alike.  ``tiles.choose`` now never makes a tile
narrower than its axis's reach and caps K per axis.  Reference: a numpy
time loop with ``np.pad``.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from xstencil._backends.tiles import choose

_NP = {"periodic": "wrap", "reflect": "reflect", "symmetric": "symmetric", "extend": "edge"}


def _step(a: np.ndarray, mode: str) -> np.ndarray:
    p = np.pad(a, 2, constant_values=0.0) if mode == "fill" else np.pad(a, 2, mode=_NP[mode])
    n0, n1 = a.shape
    c = p[2:2 + n0, 2:2 + n1]
    return 0.6 * c + 0.1 * (p[4:4 + n0, 2:2 + n1] + p[0:n0, 2:2 + n1]
                            + p[2:2 + n0, 3:3 + n1] + p[2:2 + n0, 1:1 + n1])


def _kernel(u: object) -> object:
    return 0.6 * u(t=-1) + 0.1 * (u(t=-1, y=2) + u(t=-1, y=-2) + u(t=-1, x=1)  # type: ignore[operator]
                                  + u(t=-1, x=-1))  # type: ignore[operator]


@pytest.mark.parametrize("backend", ["xla", "loops"])
@pytest.mark.parametrize(("mode", "shape", "tile", "steps"), [
    ("periodic", (5, 33), 4, 2),
    ("reflect", (7, 4), 1, 1),
    ("fill", (16, 9), 1, 3),
    ("symmetric", (5, 33), {"y": 3, "x": 100}, 2),
    ("extend", (9, 12), 2, 4),
])
def test_small_tiles_give_the_unblocked_result(backend: str, mode: str, shape: tuple[int, int],
                                               tile: object, steps: int) -> None:
    if backend == "loops":
        pytest.importorskip("numba")
    a = np.random.default_rng(sum(shape)).standard_normal(shape)
    ref = a
    for _ in range(9):
        ref = _step(ref, mode)
    da = xr.DataArray(a, dims=("y", "x"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = da.stencil.scan(_kernel, dim="t", steps=9, boundary=mode, fill_value=0.0,
                              backend=backend, blocking={"tile": tile, "steps": steps},
                              save_every="last")
    np.testing.assert_allclose(got.values, ref, rtol=1e-12, atol=1e-12)


def test_no_tile_is_narrower_than_the_reach_and_the_halo_fits() -> None:
    """Every tiling, asked for any tile size: a split axis's tiles are at
    least its reach wide, and K times the reach fits in its smallest tile."""
    rng = np.random.default_rng(0)
    for _ in range(400):
        nd = int(rng.integers(1, 4))
        shape = tuple(int(n) for n in rng.integers(1, 40, nd))
        reach = tuple(int(r) for r in rng.integers(0, 6, nd))
        tile = tuple(int(t) for t in rng.integers(1, 12, nd))
        t = choose(shape, reach, 8, int(rng.integers(1, 50)), tile=tile,
                   steps=int(rng.integers(1, 40)))
        assert t.steps >= 1
        for n, r, bs in zip(shape, reach, t.bounds, strict=True):
            assert bs[0][0] == 0 and bs[-1][1] == n
            assert all(a < b for a, b in bs)
            assert all(b1 == a2 for (_, b1), (a2, _) in itertools.pairwise(bs))
            if len(bs) > 1 and r:
                assert min(b - a for a, b in bs) >= t.steps * r, (shape, reach, tile, t)
