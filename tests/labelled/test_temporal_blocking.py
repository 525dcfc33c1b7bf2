"""Temporal blocking of in-memory scans (``blocking=``, issue 17 item 2).

The blocked path (tiles stepped K steps at a time on threads) must give the
whole-array scan's results bitwise, labels included, and must step aside
silently for everything it does not support (JAX transforms, ``step=``,
function meshes, progress bars, ``check_finite``).  Each test spies on the
tile backend to know which path ran.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil._backends import tiles
from xstencil._errors import XStencilError
from xstencil._labelled import blocking as blocking_mod


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The tilings the tile backend ran, one per blocked scan."""
    seen: list[Any] = []
    real = tiles.scan_tiles

    def scan_tiles(job: Any, tiling: Any, threads: Any = None, loops: Any = None) -> Any:
        seen.append(tiling)
        return real(job, tiling, threads, loops)

    monkeypatch.setattr(tiles, "scan_tiles", scan_tiles)
    return seen


def heat(u: Any) -> Any:
    c = u(time=-1)
    return c + 0.2 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1)
                      - 4 * c)


def field(shape: tuple[int, ...] = (30, 22), dtype: Any = np.float32, seed: int = 0
          ) -> xr.DataArray:
    a = np.random.default_rng(seed).random(shape).astype(dtype)
    return xr.DataArray(a, dims=("y", "x")[-len(shape):] if len(shape) <= 2 else ("z", "y", "x"),
                        coords={"x": np.arange(shape[-1]) * 0.5}, name="T",
                        attrs={"units": "K"})


def both(obj: Any, kernel: Any, how: Any, spy: list[Any], **kw: Any) -> tuple[Any, Any]:
    """(whole-array scan, blocked scan), checking that the second was blocked."""
    ref = xstencil.scan(obj, kernel, "time", blocking=False, **kw)
    assert spy == []
    got = xstencil.scan(obj, kernel, "time", blocking=how, **kw)
    assert len(spy) == 1, "the blocked path did not run"
    return ref, got


# -- bitwise equal to the whole-array scan ----------------------------------------------

@pytest.mark.parametrize("boundary", ["fill", "periodic", "extend", "reflect", "symmetric",
                                      {"x": "periodic", "y": "extend"}])
@pytest.mark.parametrize("save_every", [1, 6, "last"])
def test_heat_bitwise_over_boundaries_and_saves(boundary: Any, save_every: Any,
                                                spy: list[Any]) -> None:
    da = field()
    ref, got = both(da, heat, {"tile": 8, "steps": 3}, spy, steps=24, save_every=save_every,
                    boundary=boundary, fill_value=0.5)
    assert spy[0].count > 4 and spy[0].steps == (1 if save_every == 1 else 3)
    xr.testing.assert_identical(got, ref)
    assert type(got.data) is type(ref.data)


def test_matches_a_numpy_loop(spy: list[Any], x64: None) -> None:
    da = field((40, 36), np.float64)
    got = xstencil.scan(da, heat, "time", steps=30, save_every=10, boundary="periodic",
                        blocking={"tile": {"y": 10, "x": 12}, "steps": 4})
    assert len(spy) == 1 and [len(b) for b in spy[0].bounds] == [4, 3]
    u = da.values.copy()
    ref = [u]
    for _ in range(30):
        lap = (np.roll(u, 1, 0) + np.roll(u, -1, 0) + np.roll(u, 1, 1) + np.roll(u, -1, 1)
               - 4 * u)
        u = u + 0.2 * lap
        ref.append(u)
    np.testing.assert_allclose(got.values, np.stack(ref)[::10], rtol=1e-13, atol=1e-14)


def test_uneven_tiles_reach_two_and_two_time_levels(spy: list[Any]) -> None:
    def wave(u: Any) -> Any:  # leapfrog: reads two earlier positions, two cells away
        c = u(time=-1)
        return 2 * c - u(time=-2) + 0.05 * (u(time=-1, x=2) + u(time=-1, x=-2)
                                            + u(time=-1, y=1) + u(time=-1, y=-1) - 4 * c)

    da = field((29, 23))
    u0 = xr.concat([da, da * 0.9], "time")
    ref, got = both(u0, wave, {"tile": 7, "steps": 2}, spy, steps=20, save_every=5,
                    boundary="reflect")
    xr.testing.assert_identical(got, ref)


def test_float64_with_x64_off_stays_numpy_and_equal(spy: list[Any]) -> None:
    da = field(dtype=np.float64)
    ref, got = both(da, heat, {"tile": 9, "steps": 4}, spy, steps=16, save_every="last",
                    boundary="extend")
    assert got.dtype == np.float64 and isinstance(got.data, np.ndarray)
    xr.testing.assert_identical(got, ref)


def test_dataset_with_a_constant_field(spy: list[Any]) -> None:
    rng = np.random.default_rng(3)
    ds = xr.Dataset({"h": (("y", "x"), rng.random((24, 20), np.float32)),
                     "v": (("y", "x"), rng.random((24, 20), np.float32)),
                     "depth": (("y", "x"), 1 + rng.random((24, 20), np.float32))},
                    coords={"y": np.arange(24.0)}, attrs={"title": "swe-ish"})

    def step(s: Any) -> Any:
        h, v, d = s["h"], s["v"], s["depth"]
        return {"h": h(time=-1) - 0.1 * d() * (v(time=-1, x=1) - v(time=-1, x=-1)),
                "v": v(time=-1) - 0.1 * (h(time=-1, y=1) - h(time=-1, y=-1))}

    ref, got = both(ds, step, {"tile": 6, "steps": 3}, spy, steps=18, save_every=9,
                    boundary="periodic")
    xr.testing.assert_identical(got, ref)


def test_time_coordinates_read_by_the_kernel(spy: list[Any]) -> None:
    def forced(u: Any) -> Any:  # a source that grows with the time read
        return heat(u) + 0.01 * u.coord("time")()

    ref, got = both(field(), forced, {"tile": 8, "steps": 4}, spy, steps=12, dt=0.25,
                    save_every=4, boundary="fill", fill_value=0.0)
    xr.testing.assert_identical(got, ref)
    np.testing.assert_allclose(got["time"].values, [0.0, 1.0, 2.0, 3.0])


def test_a_given_trajectory_with_datetimes(spy: list[Any]) -> None:
    times = np.datetime64("2020-01-01") + np.arange(13) * np.timedelta64(6, "h")
    base = field((16, 18)).expand_dims(time=times).copy()
    base.values[1:] *= 0.01  # the input along time, read at offset 0 as a forcing

    def relax(u: Any) -> Any:
        return heat(u) + 0.1 * u()

    ref, got = both(base, relax, {"tile": 6, "steps": 3}, spy, save_every=3,
                    boundary="periodic")
    xr.testing.assert_identical(got, ref)
    assert got.sizes["time"] == 5


def test_reads_ahead_and_spatial_coordinates_across_a_periodic_seam(spy: list[Any]) -> None:
    base = field((18, 20)).expand_dims(time=np.arange(10.0)).copy()

    def ahead(u: Any) -> Any:  # the input one position ahead, and x read across the seam
        return heat(u) + 0.05 * u(time=1) + 0.01 * (u.coord("x")(x=1) - u.coord("x")())

    ref, got = both(base, ahead, {"tile": 5, "steps": 3}, spy, save_every=3,
                    boundary={"time": "extend", "x": "periodic", "y": "reflect"},
                    period={"x": 10.0})
    xr.testing.assert_identical(got, ref)


def test_one_and_three_dims(spy: list[Any]) -> None:
    line = xr.DataArray(np.random.default_rng(5).random(50, np.float32), dims="x")

    def heat1(u: Any) -> Any:
        return u(time=-1) + 0.3 * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))

    ref, got = both(line, heat1, {"tile": 11, "steps": 4}, spy, steps=16,
                    save_every="last", boundary="periodic")
    xr.testing.assert_identical(got, ref)
    spy.clear()
    cube = xr.DataArray(np.random.default_rng(6).random((10, 12, 9), np.float32),
                        dims=("z", "y", "x"))

    def heat3(u: Any) -> Any:
        return heat(u) + 0.1 * (u(time=-1, z=1) + u(time=-1, z=-1) - 2 * u(time=-1))

    ref, got = both(cube, heat3, {"tile": 5, "steps": 2}, spy, steps=8, save_every=4,
                    boundary="extend")
    xr.testing.assert_identical(got, ref)


def test_closed_over_arrays_and_arguments_are_not_stale(spy: list[Any]) -> None:
    """The block program is cached across calls: a kernel closing over other
    values, or called with other arguments, must not reuse stale ones."""
    da = field()
    outs = []
    for c in (np.float32(0.1), np.float32(0.2)):
        w = jnp.asarray(c)

        def closed(u: Any, w: Any = w) -> Any:
            return u(time=-1) + w * (u(time=-1, x=1) - u(time=-1))

        got = xstencil.scan(da, closed, "time", steps=8, save_every="last",
                            boundary="periodic", blocking=True)
        ref = xstencil.scan(da, closed, "time", steps=8, save_every="last",
                            boundary="periodic", blocking=False)
        xr.testing.assert_identical(got, ref)
        outs.append(got)

        def arg(u: Any, a: Any) -> Any:
            return u(time=-1) + a * (u(time=-1, y=1) - u(time=-1))

        got = xstencil.scan(da, arg, "time", c, steps=8, save_every="last", blocking=True)
        ref = xstencil.scan(da, arg, "time", c, steps=8, save_every="last", blocking=False)
        xr.testing.assert_identical(got, ref)
        outs.append(got)
    assert len(spy) == 4
    assert not np.array_equal(outs[0].values, outs[2].values)
    assert not np.array_equal(outs[1].values, outs[3].values)


def test_accessor_and_function_agree(spy: list[Any]) -> None:
    da = field()
    a = da.stencil.scan(heat, "time", steps=6, save_every="last", blocking=True)
    b = xstencil.scan(da, heat, "time", steps=6, save_every="last", blocking=True)
    assert len(spy) == 2
    xr.testing.assert_identical(a, b)


def test_input_is_not_mutated(spy: list[Any]) -> None:
    da = field()
    before = da.copy(deep=True)
    xstencil.scan(da, heat, "time", steps=9, save_every=3, blocking={"tile": 8})
    assert len(spy) == 1
    xr.testing.assert_identical(da, before)


# -- when it is used ----------------------------------------------------------------------

def test_automatic_only_for_large_states(spy: list[Any],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    da = field((128, 128))
    xstencil.scan(da, heat, "time", steps=40, save_every="last")
    assert spy == []  # 64 KiB: far below the threshold
    monkeypatch.setattr(blocking_mod, "MIN_BYTES", da.nbytes)
    xstencil.clear_caches()  # the repeat-call fast path remembers the first call's path
    got = xstencil.scan(da, heat, "time", steps=40, save_every="last")
    assert len(spy) == 1 and spy[0].steps >= blocking_mod.MIN_STEPS
    xr.testing.assert_identical(got, xstencil.scan(da, heat, "time", steps=40,
                                                   save_every="last", blocking=False))
    xstencil.scan(da, heat, "time", steps=40, save_every=2)  # too few steps between saves
    assert len(spy) == 1


def test_transforms_and_unsupported_options_take_the_whole_array_loop(
        spy: list[Any]) -> None:
    da = field()
    kw: dict[str, Any] = dict(steps=6, save_every="last", blocking=True, boundary="periodic")

    def run(c: Any) -> Any:
        return xstencil.scan(da * c, heat, "time", **kw).data.sum()

    ref = run(1.0)
    assert len(spy) == 1
    spy.clear()
    np.testing.assert_array_equal(jax.jit(run)(1.0), ref)
    jax.grad(run)(1.0)
    jax.vmap(run)(jnp.ones(2))

    def closing(c: Any) -> Any:  # concrete data, a traced value closed over by the kernel
        return xstencil.scan(da, lambda u: heat(u) * c, "time", **kw).data.sum()

    jax.jit(closing)(1.0)
    xstencil.scan(da, heat, "time", check_finite=True, **kw)
    xstencil.scan(da, step=lambda s: s + 1, **kw)
    m = xstencil.mesh(da)
    m[...] = heat
    m.scan("time", steps=6, save_every="last", blocking=True)  # not a kernel argument
    xstencil.scan(da, heat, "time", blocking=False, steps=6)
    assert spy == []


# -- the option and the choice of sizes ---------------------------------------------------

@pytest.mark.parametrize("bad, match", [
    ("yes", r"blocking='yes' must be None \(automatic\), True, False, or a dict"),
    ({"tiles": 4}, r"blocking=\{'tiles': 4\} must be None"),
    ({"steps": 0}, r"blocking=\{'steps': 0\} must be an int >= 1"),
    ({"tile": -3}, r"blocking=\{'tile': -3\} must be an int >= 1 or a dict"),
    ({"tile": {"x": 2.5}}, r"blocking=\{'tile': \{'x': 2.5\}\} must be an int >= 1 or a dict"),
])
def test_bad_blocking_is_refused(bad: Any, match: str) -> None:
    with pytest.raises(XStencilError, match=r"da\.stencil\.scan\(\.\.\.\): " + match):
        xstencil.scan(field(), heat, "time", steps=4, blocking=bad)
    with pytest.raises(XStencilError, match=match):  # also where blocking would not apply
        xstencil.scan(field(), step=lambda s: s, steps=4, blocking=bad)


def test_tile_for_an_unknown_dim_is_refused() -> None:
    with pytest.raises(XStencilError, match=r"blocking=\{'tile': \{'q': 4\}\}: dim 'q' is not "
                       r"a dim the scan tiles; available dims are \('y', 'x'\)"):
        xstencil.scan(field(), heat, "time", steps=4, blocking={"tile": {"q": 4}})


def test_choose_sizes() -> None:
    t = tiles.choose((2048, 2048), (1, 1), 4, 200, cores=2)
    assert [len(b) for b in t.bounds] == [4, 4] and t.steps == tiles.MAX_STEPS
    assert {b - a for bs in t.bounds for a, b in bs} == {512}
    # at least one tile per core; K within the steps between saves and the halo in a tile
    t = tiles.choose((64, 64), (1, 1), 4, 5, cores=8)
    assert t.count >= 8 and t.steps == 16 // 8  # the halo at most an eighth of a tile
    assert tiles.choose((2048, 2048), (1, 1), 4, 5, cores=2).steps == 5
    t = tiles.choose((100, 90), (3, 1), 8, 100, tile=(20, 30), steps=50, cores=1)
    assert [len(b) for b in t.bounds] == [5, 3] and t.steps == 20 // 3
    # an axis without reach is not split by default
    t = tiles.choose((4000, 6), (1, 0), 4, 100, cores=2)
    assert len(t.bounds[1]) == 1 and t.count >= 2
