"""Grown mesh scans (``m.scan(..., steps=N)``) on the numba loop backend.

Each case runs the same mesh scan with ``backend="loops"`` (checked to have
run as loops), with ``backend="xla"`` and as a plain numpy time loop that
applies the regions in assignment order to a copy of the previous state.
The loops match numpy bitwise; XLA:CPU regroups the 5-point heat update (as
for plain scans), so there the two paths are a few ulp apart, and bitwise
for updates of sums and differences.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from tests.spies import count_calls

pytest.importorskip("numba")

from xstencil._labelled import loop_scan as LS  # noqa: E402 - after the numba check

NU = 0.1
NP_MODE = {"fill": "constant", "periodic": "wrap", "extend": "edge"}


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the time loops run as numba loops; the environment's choice is cleared."""
    monkeypatch.delenv("XSTENCIL_BACKEND", raising=False)
    yield count_calls(monkeypatch, LS.loop_scan_steps, "run_loop")


def heat(u: Any) -> Any:
    c = u(time=-1)
    return c + NU * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1)
                     - 4 * c)


def _np_heat(p: np.ndarray) -> np.ndarray:
    """``heat`` of the padded previous state ``p`` (a halo of one)."""
    f = p.dtype.type
    c = p[1:-1, 1:-1]
    return c + f(NU) * (p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1] - f(4) * c)


def _field(shape: tuple[int, int] = (11, 13), dtype: Any = np.float32) -> xr.DataArray:
    rng = np.random.default_rng(shape[0])
    return xr.DataArray(rng.random(shape).astype(dtype), dims=("y", "x"),
                        coords={"x": np.arange(shape[1]) * 0.5}, attrs={"units": "K"},
                        name="T")


def _mask(shape: tuple[int, int]) -> np.ndarray:
    return np.random.default_rng(7).random(shape) > 0.8


def _mesh(u0: xr.DataArray, mode: str, covered: bool) -> Any:
    m = u0.stencil.mesh(boundary=mode, fill_value=0.0)
    if covered:
        m[...] = heat
    else:
        m[{"y": slice(1, 6)}] = heat  # rows 0 and 6.. keep their previous value
    m.loc[{"x": 0.0}] = lambda u: 1.0  # an int-free constant, cast to the state dtype
    m[{"x": -1}] = lambda u: u(time=-1, x=-1)
    m[xr.DataArray(_mask(u0.shape), dims=("y", "x"))] = lambda u: u(time=-1) * 0.5
    return m


def _np_mesh(a: np.ndarray, steps: int, mode: str, covered: bool) -> list[np.ndarray]:
    f = a.dtype.type
    mk = _mask(a.shape)
    out = [a]
    for _ in range(steps):
        kw = {"constant_values": 0} if mode == "fill" else {}
        p = np.pad(a, 1, mode=NP_MODE[mode], **kw)
        new = a.copy()
        h = _np_heat(p)
        if covered:
            new[...] = h
        else:
            new[1:6] = h[1:6]
        new[:, 0] = f(1.0)
        new[:, -1] = p[1:-1, -3]  # u(x=-1) at the last column
        new[mk] = a[mk] * f(0.5)
        a = new
        out.append(a)
    return out


@pytest.mark.parametrize("mode", ["periodic", "fill"])
@pytest.mark.parametrize("covered", [True, False])
@pytest.mark.parametrize("save_every", [pytest.param(1, marks=pytest.mark.slow), 2, "last"])
def test_mesh_scan_matches_numpy_bitwise_and_xla(ran: list[int], mode: str, covered: bool,
                                                 save_every: Any) -> None:
    u0 = _field()
    before = u0.copy(deep=True)
    m = _mesh(u0, mode, covered)
    got = m.scan("time", steps=6, save_every=save_every, dt=0.5, backend="loops")
    assert ran == [1], "the mesh scan fell back to XLA: the loops were not tested"
    want = m.scan("time", steps=6, save_every=save_every, dt=0.5, backend="xla")
    assert ran == [1]
    xr.testing.assert_identical(u0, before)
    assert got.dtype == want.dtype == np.float32 and type(got.data) is type(want.data)
    xr.testing.assert_identical(got.copy(data=np.asarray(want.data)), want)
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(np.asarray(got.values), np.asarray(want.values), rtol=8 * eps,
                               atol=8 * eps)
    ref = _np_mesh(u0.values, 6, mode, covered)
    want_np = ref[-1] if save_every == "last" else np.stack(ref[::save_every])
    np.testing.assert_array_equal(got.values, want_np)


def _sum_diff(s: Any) -> Any:
    h, q = s["h"], s["q"]
    return {"h": h(time=-1) - (q(time=-1, x=1) - q(time=-1, x=-1)),
            "q": q(time=-1) + (h(time=-1, y=1) - h(time=-1, y=-1))}


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_dataset_mesh_scan_is_bitwise_xla_where_the_order_is_kept(
        ran: list[int], dtype: Any) -> None:
    rng = np.random.default_rng(2)
    ds = xr.Dataset({"h": (("y", "x"), (rng.random((8, 10)) * 5).astype(dtype)),
                     "q": (("y", "x"), (rng.random((8, 10)) * 5).astype(dtype)),
                     "c": ("x", np.arange(10).astype(dtype))}, attrs={"title": "t"})
    m = ds.stencil.mesh(boundary="periodic")
    m[{"x": slice(1, None)}] = _sum_diff
    m[{"x": 0}] = lambda s: {"h": s["c"](), "q": s["q"](time=-1, y=1)}
    got = m.scan("time", steps=5, save_every=1, backend="loops")
    assert ran == [1]
    want = m.scan("time", steps=5, save_every=1, backend="xla")
    assert list(got.data_vars) == list(want.data_vars)
    for n in ("h", "q"):
        assert got[n].dtype == want[n].dtype
        np.testing.assert_array_equal(np.asarray(got[n].values), np.asarray(want[n].values))
    xr.testing.assert_identical(got.copy(data={n: np.asarray(want[n].data)
                                               for n in want.data_vars}), want)


def test_auto_by_size_and_fallbacks(ran: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    big = _field((512, 512))
    m = big.stencil.mesh(boundary="periodic")
    m[...] = heat
    m[{"x": 0}] = lambda u: 1.0
    got = m.scan("time", steps=2)
    assert ran == [1]
    monkeypatch.setenv("XSTENCIL_BACKEND", "xla")
    want = m.scan("time", steps=2)
    assert ran == [1]
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(np.asarray(got.values), np.asarray(want.values), rtol=4 * eps,
                               atol=4 * eps)
    monkeypatch.delenv("XSTENCIL_BACKEND")
    small = _field((8, 9))
    ms = small.stencil.mesh(boundary="periodic")
    ms[...] = heat
    ms.scan("time", steps=2)  # auto: small stays on XLA
    ms.scan("time", steps=2, progress=False, checkpoint=True, backend="loops")  # option
    ms.scan("time", steps=2, backend="xla")
    assert ran == [1]
    ms.scan("time", steps=2, backend="loops")
    assert ran == [1, 1]


def test_region_along_the_scanned_dim(ran: list[int]) -> None:
    """A region that selects the initial position only never applies to a
    computed one (as on XLA); the scan still runs as loops."""
    u0 = _field((6, 7)).expand_dims(time=[0.0])
    m = u0.stencil.mesh(boundary="periodic")
    m[...] = heat
    m[{"time": 0}] = lambda u: u(time=-1) * 0
    got = m.scan("time", steps=3, dt=1.0, backend="loops")
    want = m.scan("time", steps=3, dt=1.0, backend="xla")
    assert ran == [1]
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(np.asarray(got.values), np.asarray(want.values), rtol=4 * eps,
                               atol=4 * eps)
    ref = [u0.values[0]]
    for _ in range(3):
        ref.append(_np_heat(np.pad(ref[-1], 1, mode="wrap")))
    np.testing.assert_array_equal(got.values, np.stack(ref))


@pytest.mark.parametrize("wide", [False, True])
def test_float64_with_and_without_x64(ran: list[int], wide: bool) -> None:
    """float64 stays float64 (on the host with x64 off, as on XLA); an int
    region (``lambda u: 1``) is cast to the state's dtype."""
    u0 = _field((9, 10), np.float64)
    with jax.enable_x64(wide):
        m = u0.stencil.mesh(boundary="extend")
        m[...] = heat
        m[{"y": 0}] = lambda u: 1
        got = m.scan("time", steps=4, save_every=2, backend="loops")
        want = m.scan("time", steps=4, save_every=2, backend="xla")
    assert ran == [1]
    assert got.dtype == want.dtype == np.float64 and type(got.data) is type(want.data)
    if not wide:
        assert type(got.data) is np.ndarray
    xr.testing.assert_identical(got.copy(data=np.asarray(want.data)), want.copy(
        data=np.asarray(want.data)))
    ref = [u0.values]
    for _ in range(4):
        new = _np_heat(np.pad(ref[-1], 1, mode="edge"))
        new[0] = 1.0
        ref.append(new)
    np.testing.assert_array_equal(got.values, np.stack(ref[::2]))
    np.testing.assert_allclose(np.asarray(got.values), np.asarray(want.values), rtol=1e-14)
