"""Dataset scans grown with ``steps=`` on the numba loop backend (``loop_scan.py``).

A coupled system (CFD Python's step 8, 2-D Burgers with ``u`` and ``v``) runs
with ``backend="loops"`` (checked to have run as loops), with ``backend="xla"``
and as a plain numpy time loop built with ``np.pad``.  The loops perform the
numpy reference's operations in its order, so they match it bitwise; every
new value reads the old state of both fields.  XLA:CPU regroups some float32
products and sums of this update (as it does for the heat equation), so the
loops match XLA within a few ulp there, and bitwise where XLA keeps the order
(sums and differences of neighbours, integers).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.spies import count_calls

pytest.importorskip("numba")

from xstencil._labelled import loop_scan as LS  # noqa: E402 - after the numba check
from xstencil._labelled import scan_fast  # noqa: E402

NP_MODE = {"fill": "constant", "extend": "edge", "periodic": "wrap", "reflect": "reflect",
           "symmetric": "symmetric"}
C = 0.05  # dt / dx (dx = dy)
D = 0.01  # nu dt / dx**2


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the time loops run as numba loops; the environment's choice is cleared."""
    monkeypatch.delenv("XSTENCIL_BACKEND", raising=False)
    yield count_calls(monkeypatch, LS.loop_scan_steps, "run_loop")


def burgers(s: Any) -> Any:
    """CFD Python step 8: 2-D Burgers, backward upwind advection, central diffusion."""
    u, v = s["u"], s["v"]
    uc, vc = u(time=-1), v(time=-1)
    un = (uc - C * uc * (uc - u(time=-1, x=-1)) - C * vc * (uc - u(time=-1, y=-1))
          + D * (u(time=-1, x=1) - 2 * uc + u(time=-1, x=-1))
          + D * (u(time=-1, y=1) - 2 * uc + u(time=-1, y=-1)))
    vn = (vc - C * uc * (vc - v(time=-1, x=-1)) - C * vc * (vc - v(time=-1, y=-1))
          + D * (v(time=-1, x=1) - 2 * vc + v(time=-1, x=-1))
          + D * (v(time=-1, y=1) - 2 * vc + v(time=-1, y=-1)))
    return {"u": un, "v": vn}


def np_burgers(u: np.ndarray, v: np.ndarray, steps: int, mode: str,
               fill: float = 1.0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every position of ``burgers`` (the initial one first), in numpy."""
    f = u.dtype.type
    ny, nx = u.shape
    us, vs = [u], [v]
    for _ in range(steps):
        kw = {"constant_values": fill} if mode == "fill" else {}
        pu, pv = (np.pad(a, 1, mode=NP_MODE[mode], **kw) for a in (u, v))

        def at(p: np.ndarray, dy: int, dx: int) -> np.ndarray:
            return p[1 + dy:1 + dy + ny, 1 + dx:1 + dx + nx]

        un = (u - f(C) * u * (u - at(pu, 0, -1)) - f(C) * v * (u - at(pu, -1, 0))
              + f(D) * (at(pu, 0, 1) - f(2) * u + at(pu, 0, -1))
              + f(D) * (at(pu, 1, 0) - f(2) * u + at(pu, -1, 0)))
        vn = (v - f(C) * u * (v - at(pv, 0, -1)) - f(C) * v * (v - at(pv, -1, 0))
              + f(D) * (at(pv, 0, 1) - f(2) * v + at(pv, 0, -1))
              + f(D) * (at(pv, 1, 0) - f(2) * v + at(pv, -1, 0)))
        u, v = un, vn
        us.append(u)
        vs.append(v)
    return us, vs


def _state(shape: tuple[int, int] = (19, 23), dtype: Any = np.float32) -> xr.Dataset:
    """A hat of 2 in a field of 1 (CFD Python's initial condition), perturbed."""
    rng = np.random.default_rng(shape[0] * shape[1])
    u = np.ones(shape) + (rng.random(shape) > 0.6) + 0.1 * rng.random(shape)
    v = np.ones(shape) + (rng.random(shape) > 0.4) + 0.1 * rng.random(shape)
    ny, nx = shape
    return xr.Dataset(
        {"u": (("y", "x"), u.astype(dtype), {"units": "m/s"}),
         "v": (("y", "x"), v.astype(dtype), {"units": "m/s", "long_name": "northward"})},
        coords={"y": np.arange(ny) * 0.1, "x": np.arange(nx) * 0.1,
                "label": ("x", [f"c{i}" for i in range(nx)])},
        attrs={"title": "burgers"})


def _ulps(a: np.ndarray, b: np.ndarray) -> float:
    """The largest difference in units of the last place of ``b``'s magnitude."""
    return float(np.max(np.abs(a - b) / np.spacing(np.maximum(np.abs(b), 1).astype(b.dtype))))


def _same_layout(got: xr.Dataset, want: xr.Dataset) -> None:
    """Dims, coords, attrs, names, dtypes and array types equal; data apart."""
    assert list(got.data_vars) == list(want.data_vars)
    for n in want.data_vars:
        assert got[n].dtype == want[n].dtype
        assert type(got[n].data) is type(want[n].data), n
    xr.testing.assert_identical(got.copy(data={n: np.asarray(want[n].data)
                                               for n in want.data_vars}), want)


@pytest.mark.parametrize("mode", ["periodic", "fill"])
@pytest.mark.parametrize("save_every", [1, 3, "last"])
def test_burgers_float32_matches_numpy_bitwise_and_xla(ran: list[int], mode: str,
                                                       save_every: Any) -> None:
    ds = _state()
    before = ds.copy(deep=True)
    opts = dict(steps=12, save_every=save_every, boundary=mode, fill_value=1.0, dt=0.5)
    got = ds.stencil.scan(burgers, "time", backend="loops", **opts)
    assert ran == [1], "the scan fell back to XLA: the loops were not tested"
    want = ds.stencil.scan(burgers, "time", backend="xla", **opts)
    assert ran == [1]
    xr.testing.assert_identical(ds, before)  # the input is not written
    _same_layout(got, want)
    for n in ("u", "v"):  # XLA regroups this update in float32: a few ulp apart
        assert _ulps(np.asarray(got[n].values), np.asarray(want[n].values)) <= 8
    us, vs = np_burgers(ds.u.values, ds.v.values, 12, mode)
    pick = (lambda xs: xs[-1]) if save_every == "last" else \
        (lambda xs: np.stack(xs[::save_every]))
    np.testing.assert_array_equal(got.u.values, pick(us))
    np.testing.assert_array_equal(got.v.values, pick(vs))
    if save_every != "last":
        np.testing.assert_array_equal(got.time.values, 0.5 * np.arange(0, 13, save_every))


@pytest.mark.parametrize("mode", ["periodic", "fill"])
@pytest.mark.parametrize("save_every", [1, 4, "last"])
def test_burgers_float64_x64(ran: list[int], x64: None, mode: str, save_every: Any) -> None:
    ds = _state((12, 9), np.float64)
    opts = dict(steps=8, save_every=save_every, boundary=mode, fill_value=1.0)
    got = ds.stencil.scan(burgers, "time", backend="loops", **opts)
    want = ds.stencil.scan(burgers, "time", backend="xla", **opts)
    assert ran == [1]
    _same_layout(got, want)
    for n in ("u", "v"):
        assert _ulps(np.asarray(got[n].values), np.asarray(want[n].values)) <= 8
    us, vs = np_burgers(ds.u.values, ds.v.values, 8, mode)
    last = save_every == "last"
    np.testing.assert_array_equal(got.u.values, us[-1] if last else np.stack(us[::save_every]))
    np.testing.assert_array_equal(got.v.values, vs[-1] if last else np.stack(vs[::save_every]))


def test_float64_without_x64_stays_float64_on_the_host(ran: list[int]) -> None:
    ds = _state((10, 8), np.float64)
    got = ds.stencil.scan(burgers, "time", steps=5, boundary="periodic", backend="loops")
    want = ds.stencil.scan(burgers, "time", steps=5, boundary="periodic", backend="xla")
    assert ran == [1]
    _same_layout(got, want)
    assert type(got.u.data) is np.ndarray and got.u.dtype == np.float64
    us, vs = np_burgers(ds.u.values, ds.v.values, 5, "periodic")
    np.testing.assert_array_equal(got.u.values, np.stack(us))
    np.testing.assert_array_equal(got.v.values, np.stack(vs))


def wave(s: Any) -> Any:
    """A coupled update of sums and differences only: XLA keeps its order."""
    h, q = s["h"], s["q"]
    return {"h": h(time=-1) - (q(time=-1, x=1) - q(time=-1, x=-1)),
            "q": q(time=-1) - (h(time=-1, x=1) - h(time=-1, x=-1)) + (q(time=-1, y=1)
                                                                      - q(time=-1, y=-1))}


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("mode", ["periodic", "fill", "reflect"])
@pytest.mark.parametrize("save_every", [1, 2, "last"])
def test_same_order_is_bitwise_xla(ran: list[int], dtype: Any, mode: str,
                                   save_every: Any) -> None:
    rng = np.random.default_rng(3)
    ds = xr.Dataset({"h": (("y", "x"), (rng.random((7, 11)) * 4).astype(dtype)),
                     "q": (("y", "x"), (rng.random((7, 11)) * 4).astype(dtype))})
    opts = dict(steps=6, save_every=save_every, boundary=mode, fill_value=2)
    got = ds.stencil.scan(wave, "time", backend="loops", **opts)
    assert ran == [1]
    want = ds.stencil.scan(wave, "time", backend="xla", **opts)
    _same_layout(got, want)
    for n in ("h", "q"):
        np.testing.assert_array_equal(np.asarray(got[n].values), np.asarray(want[n].values))


def test_every_field_reads_the_old_state(ran: list[int]) -> None:
    """A swap: with in-place (Gauss-Seidel) updates both would end up equal."""
    ds = xr.Dataset({"a": ("x", np.arange(5.0)), "b": ("x", -np.arange(5.0))})

    def swap(s: Any) -> Any:
        return {"b": s["a"](time=-1), "a": s["b"](time=-1, x=1)}

    got = ds.stencil.scan(swap, "time", steps=3, boundary="periodic", backend="loops")
    assert ran == [1]
    a, b = np.arange(5.0), -np.arange(5.0)
    for t in range(4):
        np.testing.assert_array_equal(got.a.values[t], a)
        np.testing.assert_array_equal(got.b.values[t], b)
        a, b = np.roll(b, -1), a
    want = ds.stencil.scan(swap, "time", steps=3, boundary="periodic", backend="xla")
    np.testing.assert_array_equal(got.a.values, want.a.values)
    np.testing.assert_array_equal(got.b.values, want.b.values)


def test_constants_arguments_time_input_and_own_dim_orders(ran: list[int]) -> None:
    """A variable without ``time`` is a constant (read at time offset 0 or -1),
    arguments and closed-over arrays are inputs, the input may hold its one
    position along ``time`` (last here), and a variable stored as (x, y)
    keeps its order."""
    ds = _state((9, 13)).expand_dims(time=[2.0], axis=-1)
    ds["v"] = ds.v.transpose("x", "y", "time")
    ds["depth"] = ("x", np.linspace(1, 2, 13, dtype=np.float32), {"units": "m"})
    w = np.float32(0.3)
    closed = np.linspace(0, 1, 13, dtype=np.float32)

    def k(s: Any, w: Any, c: float = 1.0) -> Any:
        u, v, d = s["u"], s["v"], s["depth"]
        return {"u": u(time=-1) + w * d(x=1) * (v(time=-1, x=1) - u(time=-1)),
                "v": c * v(time=-1) - d(time=-1) * u(time=-1, y=-1) * closed[3]}

    opts = dict(steps=6, save_every=2, boundary="extend", dt=0.5, c=0.5)
    got = ds.stencil.scan(k, "time", w, backend="loops", **opts)
    assert ran == [1]
    want = ds.stencil.scan(k, "time", w, backend="xla", **opts)
    _same_layout(got, want)
    assert got.v.dims == ("x", "y", "time") and got.depth.dims == ("x",)
    for n in ("u", "v"):
        assert _ulps(np.asarray(got[n].values), np.asarray(want[n].values)) <= 4
    closed[3] = 0.9  # a closed-over array is read afresh
    again = ds.stencil.scan(k, "time", w, backend="loops", **opts)
    assert ran == [1, 1]
    assert not np.allclose(again.v.values, got.v.values)
    want = ds.stencil.scan(k, "time", w, backend="xla", **opts).v.values
    np.testing.assert_allclose(again.v.values, want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_auto_chooses_by_size_and_environment(ran: list[int],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    big = _state((512, 512))
    got = big.stencil.scan(burgers, "time", steps=2, boundary="periodic")
    assert ran == [1]
    _state((16, 16)).stencil.scan(burgers, "time", steps=2, boundary="periodic")
    assert ran == [1]  # auto: small stays on XLA
    monkeypatch.setenv("XSTENCIL_BACKEND", "xla")
    want = big.stencil.scan(burgers, "time", steps=2, boundary="periodic")
    assert ran == [1]
    for n in ("u", "v"):
        assert _ulps(np.asarray(got[n].values), np.asarray(want[n].values)) <= 4


def test_repeat_call_takes_the_fast_path(ran: list[int],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fast = count_calls(monkeypatch, scan_fast, "run")
    xstencil.clear_caches()
    ds = _state((10, 12))
    opts = dict(steps=4, save_every=2, boundary="periodic", backend="loops")
    first = ds.stencil.scan(burgers, "time", **opts)
    other = ds.copy(data={"u": ds.u.values[::-1].copy(), "v": ds.v.values})
    second = other.stencil.scan(burgers, "time", **opts)
    assert fast == [1] and ran == [1, 1]
    xstencil.clear_caches()
    fresh = other.stencil.scan(burgers, "time", **opts)
    assert fast == [1] and ran == [1, 1, 1]
    xr.testing.assert_identical(second, fresh)
    _same_layout(second, first)
    us, vs = np_burgers(other.u.values, other.v.values, 4, "periodic")
    np.testing.assert_array_equal(second.u.values, np.stack(us[::2]))
    np.testing.assert_array_equal(second.v.values, np.stack(vs[::2]))


def _two_back(s: Any) -> Any:  # two initial positions
    return {"u": 2 * s["u"](time=-1) - s["u"](time=-2), "v": s["v"](time=-1, x=1)}


def _coord(s: Any) -> Any:
    return {"u": s["u"](time=-1) + 0 * s["u"].coord("x")(x=1), "v": s["v"](time=-1)}


def _array_window(s: Any) -> Any:
    return {"u": s["u"](time=-1), "v": s["v"][-1, 0, 1]}


@pytest.mark.parametrize("case", ["two_back", "coord", "array", "checkpoint", "xla"])
def test_unsupported_scans_fall_back_to_xla(ran: list[int], case: str) -> None:
    """As for DataArrays, ``backend="loops"`` falls back silently (the
    ``xstencil.loops`` logger says why) with XLA's result.  (dask-backed
    Datasets run their tasks on the loops: tests/backends/test_dask_loop_scan.py.)"""
    ds = _state((6, 7))
    kernel, opts, backend = burgers, dict(steps=3, boundary="periodic"), "loops"
    if case == "two_back":
        ds = xr.concat([ds, ds * 2], "time")
        kernel = _two_back
    elif case == "coord":
        kernel = _coord
    elif case == "array":
        kernel = _array_window
        opts["window"] = {"time": (1, 0), "y": 3, "x": 3}
    elif case == "checkpoint":  # check_finite runs on the loops (test_loops_check_finite.py)
        opts["checkpoint"] = True
    elif case == "xla":
        backend = "xla"
    got = ds.stencil.scan(kernel, "time", backend=backend, **opts)
    assert ran == []
    want = ds.compute().stencil.scan(kernel, "time", backend="xla",
                                     **{**opts, "blocking": False})
    xr.testing.assert_identical(got.compute(), want)


def test_mixed_dtypes_follow_the_state_dtype_rules(ran: list[int], x64: None) -> None:
    """A float32 field advanced with a float64 one takes the promoted state
    dtype, an int32 constant stays int32, uint8 fields wrap: as on XLA."""
    rng = np.random.default_rng(5)
    ds = xr.Dataset({"u": (("y", "x"), rng.random((6, 5)).astype(np.float32)),
                     "v": (("y", "x"), rng.random((6, 5))),
                     "m": (("y", "x"), rng.integers(0, 3, (6, 5)).astype(np.int32))})

    def k(s: Any) -> Any:
        u, v, f64 = s["u"], s["v"], jnp.float64
        return {"v": v(time=-1) - 0.1 * u(time=-1, x=1).astype(f64),
                "u": u(time=-1).astype(f64) + 0.1 * v(time=-1, y=-1) * s["m"](x=1).astype(f64)}

    got = ds.stencil.scan(k, "time", steps=4, boundary="periodic", backend="loops")
    want = ds.stencil.scan(k, "time", steps=4, boundary="periodic", backend="xla")
    assert ran == [1]
    _same_layout(got, want)
    assert got.u.dtype == np.float64 and got.m.dtype == np.int32
    for n in ("u", "v"):
        assert _ulps(np.asarray(got[n].values), np.asarray(want[n].values)) <= 4
    ds8 = xr.Dataset({"a": ("x", np.arange(200, 210, dtype=np.uint8)),
                      "b": ("x", np.arange(10, dtype=np.uint8)[::-1].copy())})

    def k8(s: Any) -> Any:
        return {"a": s["a"](time=-1, x=1) + s["b"](time=-1),
                "b": s["b"](time=-1, x=-1) + s["a"](time=-1)}

    got = ds8.stencil.scan(k8, "time", steps=3, boundary="periodic", backend="loops")
    want = ds8.stencil.scan(k8, "time", steps=3, boundary="periodic", backend="xla")
    assert ran == [1, 1]
    _same_layout(got, want)
    a, b = ds8.a.values, ds8.b.values
    for t in range(1, 4):
        a, b = np.roll(a, -1) + b, np.roll(b, 1) + a  # uint8 wraps
        np.testing.assert_array_equal(got.a.values[t], a)
        np.testing.assert_array_equal(got.b.values[t], b)


def test_fast_path_reads_new_constants(ran: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    fast = count_calls(monkeypatch, scan_fast, "run")
    xstencil.clear_caches()
    base = _state((8, 10))

    def k(s: Any) -> Any:
        return {"u": s["u"](time=-1) + s["f"](x=1), "v": s["v"](time=-1, y=1) * s["f"]()}

    outs = []
    for f in (np.zeros(10, np.float32), np.linspace(0, 1, 10, dtype=np.float32)):
        ds = base.assign(f=("x", f))
        outs.append(ds.stencil.scan(k, "time", steps=3, boundary="periodic", backend="loops"))
    assert fast == [1] and ran == [1, 1]
    u, v, f = base.u.values, base.v.values, np.linspace(0, 1, 10, dtype=np.float32)
    for t in range(1, 4):
        u, v = u + np.roll(f, -1), np.roll(v, -1, axis=0) * f
        np.testing.assert_array_equal(outs[1].u.values[t], u)
        np.testing.assert_array_equal(outs[1].v.values[t], v)
    xr.testing.assert_identical(outs[1].f, base.assign(f=("x", f)).f)
