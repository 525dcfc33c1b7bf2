"""The repeat-call fast path of loop scans (``loop_scan.Repeat`` in ``scan_fast``'s table).

A repeated grown scan that runs as numba loops skips its setup (plan, trace,
rewrap recipe) as the XLA scan does.  Every case checks the repeat against a
fresh call (caches cleared: bitwise, coords and attrs included) and against a
plain numpy time loop, and that whatever could change the result (a global,
a closed-over array, an argument, coordinates, dtype, the route between loops
and XLA) recomputes instead of reusing a stale entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.spies import counting
from xstencil._engine import kcache
from xstencil._engine.kcache import freeze
from xstencil._labelled import scan as scan_mod
from xstencil._labelled import scan_fast

pytest.importorskip("numba")

from xstencil._labelled import loop_scan as LS  # noqa: E402 - after the numba check

NU = 0.2
OPTS: dict[str, Any] = dict(dim="time", steps=4, boundary="fill", fill_value=0.0,
                            backend="loops")


def heat(u: Any) -> Any:
    c = u(time=-1)
    return c + NU * (u(time=-1, x=1) - 2 * c + u(time=-1, x=-1))


def np_heat(x0: np.ndarray, steps: int, nu: Any = NU) -> np.ndarray:
    """Every position of ``heat`` with a zero halo along the last axis, in numpy."""
    f = np.asarray(x0).dtype.type
    out = [np.asarray(x0)]
    for _ in range(steps):
        u = out[-1]
        p = np.pad(u, [(0, 0)] * (u.ndim - 1) + [(1, 1)])
        out.append(u + f(nu) * (p[..., 2:] - f(2) * u + p[..., :-2]))
    return np.stack(out)


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Calls that took the fast path, the full loop path, the full XLA path,
    and time loops run as numba loops (fast or full)."""
    n = counting(monkeypatch, {"fast": (scan_fast, "run"), "loop_full": (LS, "_loop_scan"),
                               "xla_full": (scan_mod, "_run"),
                               "loops": (LS.loop_scan_steps, "run_loop")})
    xstencil.clear_caches()
    yield n
    xstencil.clear_caches()


def _da(values: Any = None, x: Any = None, dtype: Any = np.float64, **kw: Any) -> xr.DataArray:
    v = np.random.default_rng(0).random((3, 9)).astype(dtype) if values is None else values
    x = np.arange(9) * 0.5 if x is None else x
    return xr.DataArray(v, dims=("y", "x"), coords={"y": [10, 20, 30], "x": x,
                                                      "label": ("y", ["a", "b", "c"])},
                        name=kw.pop("name", "T"), attrs=kw.pop("attrs", {"units": "K"}), **kw)


def _fresh(obj: Any, kernel: Any, *args: Any, **opts: Any) -> Any:
    """The same call with every cache cleared (the full path)."""
    xstencil.clear_caches()
    return obj.stencil.scan(kernel, *args, **opts)


def _same(a: Any, b: Any) -> None:
    """Bitwise the same result, with the same labels and array type."""
    xr.testing.assert_identical(a, b)
    np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    assert type(a.data) is type(b.data) and a.dtype == b.dtype


@pytest.mark.parametrize("save_every", [1, 2, "last"])
def test_repeat_takes_the_fast_path_and_matches_fresh_and_numpy(counts, save_every):
    da = _da()
    opts = {**OPTS, "save_every": save_every}
    first = da.stencil.scan(heat, **opts)
    again = da.stencil.scan(heat, **opts)
    assert counts == {"fast": 1, "loop_full": 1, "xla_full": 0, "loops": 2}
    _same(again, first)
    _same(again, _fresh(da, heat, **opts))
    ref = np_heat(da.values, 4)
    want = ref[-1] if save_every == "last" else ref[::save_every]
    np.testing.assert_allclose(again.values, want, rtol=1e-12, atol=1e-15)


def test_float32_repeat_is_bitwise_the_fresh_call(counts):
    da = _da(dtype=np.float32)
    da.stencil.scan(heat, **OPTS)
    again = da.stencil.scan(heat, **OPTS)
    assert counts["fast"] == 1 and again.dtype == np.float32
    _same(again, _fresh(da, heat, **OPTS))
    np.testing.assert_array_equal(again.values, np_heat(da.values, 4))


def test_changed_global_is_not_stale(counts):
    global NU
    da = _da()
    da.stencil.scan(heat, **OPTS)
    old = NU
    try:
        NU = 0.05
        out = da.stencil.scan(heat, **OPTS)
        assert counts["fast"] == 0 and counts["loop_full"] == 2
        np.testing.assert_allclose(out.values, np_heat(da.values, 4, 0.05), rtol=1e-12)
        _same(out, _fresh(da, heat, **OPTS))
    finally:
        NU = old


def test_changed_closed_over_array_is_read_afresh(counts):
    coef = np.array([0.2])

    def kern(u: Any) -> Any:
        c = u(time=-1)
        return c + coef[0] * (u(time=-1, x=1) - 2 * c + u(time=-1, x=-1))

    da = _da()
    da.stencil.scan(kern, **OPTS)
    coef[0] = 0.1  # changed in place
    a = da.stencil.scan(kern, **OPTS)
    np.testing.assert_allclose(a.values, np_heat(da.values, 4, 0.1), rtol=1e-12)
    coef = np.array([0.3])  # noqa: F841 - rebound: the kernel's closure reads it
    b = da.stencil.scan(kern, **OPTS)
    np.testing.assert_allclose(b.values, np_heat(da.values, 4, 0.3), rtol=1e-12)
    assert counts["fast"] == 2 and counts["loops"] == 3  # the array is an input, not a key
    _same(b, _fresh(da, kern, **OPTS))


def _heat_c(u: Any, c: Any) -> Any:
    """Heat with its coefficient as a kernel argument."""
    return u(time=-1) + c * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


def test_changed_argument_and_input_values_are_read_afresh(counts):
    da = _da()
    opts = {k: v for k, v in OPTS.items() if k != "dim"}
    da.stencil.scan(_heat_c, "time", np.float64(0.2), **opts)
    other = da.copy(data=da.values[::-1].copy())
    out = other.stencil.scan(_heat_c, "time", np.float64(0.1), **opts)
    assert counts["fast"] == 1
    np.testing.assert_allclose(out.values, np_heat(other.values, 4, 0.1), rtol=1e-12)
    _same(out, _fresh(other, _heat_c, "time", np.float64(0.1), **opts))


def test_changed_coordinates_are_not_stale(counts):
    a = _da().stencil.scan(heat, **OPTS)
    moved = _da(x=np.arange(9) * 2.0 + 1)
    b = moved.stencil.scan(heat, **OPTS)
    np.testing.assert_array_equal(b["x"].values, np.arange(9) * 2.0 + 1)
    np.testing.assert_array_equal(a.values, b.values)
    _same(b, _fresh(moved, heat, **OPTS))
    # the grown time coordinate continues the input's own
    u0 = _da()
    c = u0.assign_coords(time=7.0).stencil.scan(heat, **{**OPTS, "dt": 1.0})
    d = u0.assign_coords(time=9.0).stencil.scan(heat, **{**OPTS, "dt": 1.0})
    np.testing.assert_array_equal(c["time"].values, 7.0 + np.arange(5))
    np.testing.assert_array_equal(d["time"].values, 9.0 + np.arange(5))
    _same(d, _fresh(u0.assign_coords(time=9.0), heat, **{**OPTS, "dt": 1.0}))


def test_changed_attrs_and_name_are_the_calls_own(counts):
    _da().stencil.scan(heat, **OPTS)
    out = _da(name="S", attrs={"units": "mK"}).stencil.scan(heat, **OPTS)
    assert counts["fast"] == 1
    assert out.name == "S" and out.attrs == {"units": "mK"}
    out["time"].attrs["units"] = "s"  # a result changed afterwards does not reach the cache
    out["x"].attrs["units"] = "m"
    again = _da().stencil.scan(heat, **OPTS)
    assert "units" not in again["time"].attrs and "units" not in again["x"].attrs
    _same(again, _fresh(_da(), heat, **OPTS))


def test_changed_dtype_is_not_stale(counts):
    _da().stencil.scan(heat, **OPTS)
    f32 = _da(dtype=np.float32)
    out = f32.stencil.scan(heat, **OPTS)
    assert counts["fast"] == 0 and out.dtype == np.float32
    np.testing.assert_array_equal(out.values, np_heat(f32.values, 4))
    ints = xr.DataArray(np.arange(12, dtype=np.int32).reshape(3, 4), dims=("y", "x"))

    def add(u: Any) -> Any:
        return u(time=-1) + u(time=-1, x=1)

    a = ints.stencil.scan(add, **OPTS)
    b = ints.astype(np.int64).stencil.scan(add, **OPTS)
    assert a.dtype == np.int32 and b.dtype == np.int64
    want = [ints.values]
    for _ in range(4):
        u = want[-1]
        want.append(u + np.pad(u[:, 1:], [(0, 0), (0, 1)]))
    np.testing.assert_array_equal(b.values, np.stack(want))
    _same(b, _fresh(ints.astype(np.int64), add, **OPTS))


def test_jax_data_entry_does_not_serve_numpy_data_or_the_reverse(counts):
    da = _da(dtype=np.float32)
    on_jax = da.copy(data=jax.numpy.asarray(da.values))
    opts = {**OPTS, "backend": "auto"}  # small: auto runs XLA; loops= forces the route
    x = on_jax.stencil.scan(heat, **OPTS)  # JAX data never runs as loops
    assert counts["loops"] == 0 and counts["xla_full"] == 1
    y = da.stencil.scan(heat, **OPTS)  # numpy data: loops, as a fresh call would
    assert counts["loops"] == 1
    _same(y, _fresh(da, heat, **OPTS))
    x2 = on_jax.stencil.scan(heat, **OPTS)
    assert counts["loops"] == 2  # the fresh call's; the repeat on JAX data ran XLA
    _same(x2, x)
    np.testing.assert_allclose(x.values, np_heat(da.values, 4), rtol=1e-5)
    a = da.stencil.scan(heat, **opts)
    assert counts["loops"] == 2
    np.testing.assert_allclose(a.values, np_heat(da.values, 4), rtol=1e-5)


def test_inside_jit_runs_xla_after_a_loop_entry(counts):
    da = _da()
    opts = {k: v for k, v in OPTS.items() if k != "dim"}
    da.stencil.scan(_heat_c, "time", np.float64(0.2), **opts)
    da.stencil.scan(_heat_c, "time", np.float64(0.2), **opts)
    assert counts["fast"] == 1 and counts["loops"] == 2
    with jax.enable_x64(True):
        got = jax.jit(lambda c: da.stencil.scan(_heat_c, "time", c, **opts).data)(
            np.float64(0.2))
    assert counts["loops"] == 2  # traced: XLA, not the loop entry
    np.testing.assert_allclose(np.asarray(got), np_heat(da.values, 4), rtol=1e-12)


def test_blocking_false_runs_the_loops_under_its_own_entry(counts):
    """``blocking=False`` (never block) runs the unblocked loop scan, as the
    default does (it ran XLA, also under ``backend="loops"``), under an entry
    of its own: the default may block a large scan that the loops decline."""
    da = _da()
    first = da.stencil.scan(heat, **OPTS)
    out = da.stencil.scan(heat, blocking=False, **OPTS)
    assert counts["loop_full"] == 2 and counts["xla_full"] == 0 and counts["fast"] == 0
    again = da.stencil.scan(heat, blocking=False, **OPTS)
    assert counts["fast"] == 1 and counts["loops"] == 3 and counts["xla_full"] == 0
    np.testing.assert_allclose(out.values, np_heat(da.values, 4), rtol=1e-12)
    np.testing.assert_array_equal(out.values, first.values)
    np.testing.assert_array_equal(again.values, first.values)


def test_freeze_keeps_apart_what_compares_equal():
    assert freeze((1, True, 1.0)) != freeze((True, 1, 1.0))
    assert freeze(0.0) != freeze(-0.0) and freeze(float("nan")) == freeze(float("nan"))
    assert freeze((1, 2)) != freeze([1, 2])
    assert freeze(("a", None, (2.5,))) == freeze(("a", None, (2.5,)))
    assert freeze(np.float32(2)) != freeze(2.0)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.float32])
def test_loop_result_is_returned_as_the_xla_scans(counts, dtype):
    """64-bit results live on the host while JAX's x64 flag is off (a 64-bit
    JAX array would be truncated by the next JAX operation); the loop path
    used to return one, made under its own x64 context."""
    da = _da(dtype=dtype) if dtype != np.int64 else _da(
        values=np.arange(27, dtype=np.int64).reshape(3, 9))
    loops = da.stencil.scan(heat if dtype != np.int64 else _shift, **OPTS)
    xla = da.stencil.scan(heat if dtype != np.int64 else _shift, **{**OPTS, "backend": "xla"})
    assert counts["loops"] == 1 and counts["xla_full"] == 1
    assert type(loops.data) is type(xla.data) and loops.dtype == xla.dtype == dtype
    if np.dtype(dtype).itemsize == 8:
        assert type(loops.data) is np.ndarray
    else:
        assert isinstance(loops.data, jax.Array)
    np.testing.assert_allclose(loops.values, xla.values, rtol=1e-6)
    assert (loops * 2).dtype == dtype  # follow-up arithmetic keeps it


def _shift(u: Any) -> Any:
    return u(time=-1) + u(time=-1, x=1)


def test_input_with_its_initial_position_last_repeats_fresh(counts):
    """An input holding its one initial position along the scanned dim, that
    dim last: the repeat puts it first, as the full path does."""
    da = _da().expand_dims(time=[3.0], axis=-1)
    opts = {**OPTS, "dt": 0.5, "save_every": 2}
    da.stencil.scan(heat, **opts)
    again = da.stencil.scan(heat, **opts)
    assert counts["fast"] == 1 and counts["loops"] == 2
    assert again.dims == ("y", "x", "time")
    np.testing.assert_array_equal(again["time"].values, [3.0, 4.0, 5.0])
    ref = np_heat(da.values[..., 0], 4)[::2]
    np.testing.assert_allclose(again.values, np.moveaxis(ref, 0, -1), rtol=1e-12)
    _same(again, _fresh(da, heat, **opts))


def heat_dx(u: Any) -> Any:
    """``heat`` scaled by the local spacing read from the x coordinate."""
    c, x = u(time=-1), u.coord("x")
    return c + NU * (u(time=-1, x=1) - 2 * c + u(time=-1, x=-1)) * (0.5 / (x(x=1) - x()))


@pytest.mark.parametrize("save_every", [1, 2, "last"])
@pytest.mark.parametrize("kernel", [heat, heat_dx])
def test_xla_repeat_matches_fresh_for_every_output_mode(counts, save_every, kernel):
    """The XLA route's repeat (its cheaper rewrap and dispatch) against a fresh
    call and numpy, for saved trajectories, the last state and a kernel reading
    a coordinate; a Dataset too."""
    xs = np.arange(9) * 0.5
    opts = {**OPTS, "backend": "xla", "save_every": save_every}
    da = _da(x=xs)
    da.stencil.scan(kernel, **opts)
    again = da.stencil.scan(kernel, **opts)
    assert counts["fast"] == 1 and counts["xla_full"] == 1 and counts["loops"] == 0
    _same(again, _fresh(da, kernel, **opts))
    ref = np_heat(da.values, 4)  # uniform spacing 0.5: the factor is 1
    want = ref[-1] if save_every == "last" else ref[::save_every]
    np.testing.assert_allclose(again.values, want, rtol=1e-12, atol=1e-15)
    ds = xr.Dataset({"T": da, "S": 2 * da})

    def both(s: Any) -> Any:
        return {"T": kernel(s["T"]), "S": kernel(s["S"])}

    ds.stencil.scan(both, **opts)
    dsa = ds.stencil.scan(both, **opts)
    assert counts["fast"] == 2
    xr.testing.assert_identical(dsa, _fresh(ds, both, **opts))
    np.testing.assert_allclose(dsa["S"].values, 2 * want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("layout", ["time first", "time last"])
@pytest.mark.parametrize("save_every", [2, "last"])
def test_loop_repeat_lays_out_its_result_on_the_host(counts, layout, save_every):
    """A loop scan's repeat keeps the last position and transposes on the
    host (views of the loop's buffers where no copy is needed), not with an
    XLA program: bitwise the fresh call, a JAX array for float32, and a
    result held from an earlier call is not changed by a later one (the
    buffers it views stay its own)."""
    da = _da(dtype=np.float32)
    if layout == "time last":
        da = da.expand_dims(time=[0.0], axis=-1)
    opts = {**OPTS, "save_every": save_every, "dt": 0.5}
    first = da.stencil.scan(heat, **opts)
    again = da.stencil.scan(heat, **opts)
    assert counts["fast"] == 1 and counts["loops"] == 2
    entry = next(v for k, v in _fast_entries())
    assert entry.post is None
    assert (entry.fn.post is not None) == (save_every == "last" or layout == "time last")
    _same(again, first)
    _same(again, _fresh(da, heat, **opts))
    assert isinstance(again.data, jax.Array)
    kept = again.values.copy()
    other = (2 * da).stencil.scan(heat, **opts)
    np.testing.assert_array_equal(again.values, kept)
    base = np_heat(np.squeeze(da.values, -1) if layout == "time last" else da.values, 4)
    want = base[-1] if save_every == "last" else base[::2]
    if layout == "time last" and save_every != "last":
        want = np.moveaxis(want, 0, -1)
    np.testing.assert_array_equal(again.values, want)
    np.testing.assert_allclose(other.values, 2 * want, rtol=1e-6)


def _fast_entries() -> list[tuple[Any, Any]]:
    """The scan fast path's entries in the compile cache."""
    # the table's keys are (key, JAX's x64 flag)
    return [(k, v) for (k, _), v in kcache._TABLE.items() if isinstance(k, tuple) and k[:1] == (
        "scan-fast",)]
