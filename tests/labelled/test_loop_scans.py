"""Grown scans on the numba loop backend (``xstencil/_backends/loop_scan.py``).

Every case runs the same scan with ``backend="loops"`` (checked to have run as
loops, or to have fallen back), with ``backend="xla"``, and (for the values)
as a plain numpy time loop built with ``np.pad``.  The loops perform the
numpy reference's operations in its order, so they match it bitwise; XLA:CPU
rounds some float32 sums differently (it does on maps too), so the loops
match XLA within a few ulp, and exactly for integers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dask.array
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from xstencil._errors import XStencilError

pytest.importorskip("numba")

from tests.spies import count_calls  # noqa: E402
from xstencil._labelled import loop_scan as LS  # noqa: E402 - after the numba check

NP_MODE = {"fill": "constant", "extend": "edge", "periodic": "wrap", "reflect": "reflect",
           "symmetric": "symmetric"}
NU = 0.1


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the scans whose time loop ran as loops."""
    yield count_calls(monkeypatch, LS.loop_scan_steps, "run_loop")


def heat2(u: Any) -> Any:
    return u(time=-1) + NU * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                              + u(time=-1, y=-1) - 4 * u(time=-1))


def heat1(u: Any) -> Any:
    return u(time=-1) + NU * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


def np_heat(a: np.ndarray, steps: int, mode: str, fill: float = 0.0) -> list[np.ndarray]:
    """Every position of the numpy reference (the initial one first)."""
    f = a.dtype.type
    out = [a]
    for _ in range(steps):
        kw = {"constant_values": fill} if mode == "fill" else {}
        p = np.pad(a, 1, mode=NP_MODE[mode], **kw)
        c = p[tuple(slice(1, -1) for _ in a.shape)]
        nb = []
        for ax in range(a.ndim):
            for s in (2, 0):  # x=1 then x=-1
                idx = [slice(1, -1)] * a.ndim
                idx[ax] = slice(s, s + a.shape[ax])
                nb.append(p[tuple(idx)])
        if a.ndim == 2:
            lap = nb[0] + nb[1] + nb[2] + nb[3] - f(4) * c
        else:
            lap = nb[0] - f(2) * c + nb[1]
        a = c + f(NU) * lap
        out.append(a)
    return out


def _field(shape: tuple[int, ...], dtype: Any = np.float32) -> xr.DataArray:
    rng = np.random.default_rng(sum(shape))
    dims = ("x", "y")[:len(shape)]
    return xr.DataArray(rng.random(shape).astype(dtype), dims=dims,
                        coords={"x": np.arange(shape[0]) * 0.5}, attrs={"units": "K"},
                        name="T")


def _ulp_close(a: np.ndarray, b: np.ndarray, ulps: int = 4) -> None:
    eps = np.finfo(a.dtype).eps
    np.testing.assert_allclose(a, b, rtol=ulps * eps, atol=ulps * eps)


@pytest.mark.parametrize("mode", list(NP_MODE))
@pytest.mark.parametrize("save_every", [1, 4, "last"])
def test_heat_2d_matches_numpy_bitwise_and_xla(ran: list[int], mode: str,
                                               save_every: Any) -> None:
    u0 = _field((23, 17))
    before = u0.copy(deep=True)
    opts = dict(steps=8, save_every=save_every, boundary=mode, fill_value=0.0, dt=0.25)
    got = u0.stencil.scan(heat2, backend="loops", **opts)
    assert ran == [1]
    want = u0.stencil.scan(heat2, backend="xla", **opts)
    assert ran == [1]
    xr.testing.assert_identical(u0, before)  # the input is not written
    assert got.dtype == want.dtype == np.float32
    xr.testing.assert_identical(got.copy(data=np.asarray(want.data)), want)  # coords, attrs
    _ulp_close(np.asarray(got.values), np.asarray(want.values))
    ref = np_heat(u0.values, 8, mode)
    if save_every == "last":
        np.testing.assert_array_equal(got.values, ref[-1])
    else:
        np.testing.assert_array_equal(got.values, np.stack(ref[::save_every]))
        np.testing.assert_array_equal(got["time"].values, 0.25 * np.arange(0, 9, save_every))


def test_heat_1d_float64_and_time_dim_input(ran: list[int]) -> None:
    u0 = _field((31,), np.float64).expand_dims(time=[3.0])
    got = u0.stencil.scan(heat1, steps=6, boundary="periodic", dt=1.0, backend="loops")
    want = u0.stencil.scan(heat1, steps=6, boundary="periodic", dt=1.0, backend="xla")
    assert ran == [1]
    assert got.dtype == want.dtype
    xr.testing.assert_identical(got.copy(data=np.asarray(want.data)), want)
    _ulp_close(np.asarray(got.values), np.asarray(want.values))
    np.testing.assert_array_equal(got.values, np.stack(np_heat(u0.values[0], 6, "periodic")))


def test_arguments_and_time_last(ran: list[int]) -> None:
    u0 = _field((14, 11)).expand_dims(time=[0.0], axis=-1)
    w = np.full((), 0.2, np.float32)

    def k(u: Any, w: Any, c: float = 1.0) -> Any:
        return c * u(time=-1) + w * (u(time=-1, x=1) - u(time=-1, y=-1))

    opts = dict(steps=6, save_every=2, boundary="reflect", dt=1.0, c=0.5)
    got = u0.stencil.scan(k, "time", w, backend="loops", **opts)
    want = u0.stencil.scan(k, "time", w, backend="xla", **opts)
    assert ran == [1]
    assert got.dims == want.dims == ("x", "y", "time")
    xr.testing.assert_identical(got.copy(data=np.asarray(want.data)), want)
    _ulp_close(np.asarray(got.values), np.asarray(want.values))
    again = u0.stencil.scan(k, "time", w * 2, backend="loops", **opts)  # a new array: read
    assert ran == [1, 1]
    assert not np.allclose(again.values, got.values)
    _ulp_close(np.asarray(again.values), np.asarray(u0.stencil.scan(
        k, "time", w * 2, backend="xla", **opts).values))


def test_integer_state_exact_with_xla(ran: list[int]) -> None:
    u0 = xr.DataArray(np.arange(40, dtype=np.int32).reshape(8, 5) % 7, dims=("x", "y"))

    def k(u: Any) -> Any:
        return u(time=-1, x=1) + u(time=-1, y=-1) - 2 * u(time=-1)

    opts = dict(steps=5, boundary={"x": "periodic", "y": "extend"})
    got = u0.stencil.scan(k, backend="loops", **opts)
    want = u0.stencil.scan(k, backend="xla", **opts)
    assert ran == [1]
    assert got.dtype == want.dtype
    xr.testing.assert_identical(got.copy(data=np.asarray(want.data)), want)
    np.testing.assert_array_equal(got.values, want.values)


def test_dtype_rules_follow_xla(ran: list[int]) -> None:
    u0 = _field((12, 9), np.float32)
    got = u0.stencil.scan(heat2, steps=3, boundary="periodic", dtype="float64",
                          backend="loops")
    want = u0.stencil.scan(heat2, steps=3, boundary="periodic", dtype="float64",
                           backend="xla")
    assert got.dtype == want.dtype == np.float64
    _ulp_close(np.asarray(got.values), np.asarray(want.values))
    assert ran == [1]
    u8 = xr.DataArray(np.arange(30, dtype=np.uint8).reshape(6, 5), dims=("x", "y"))

    def add(u: Any) -> Any:
        return u(time=-1, x=1) + u(time=-1, y=-1)

    got = u8.stencil.scan(add, steps=3, boundary="periodic", backend="loops")
    want = u8.stencil.scan(add, steps=3, boundary="periodic", backend="xla")
    assert got.dtype == want.dtype  # the state's dtype as docs/dtypes.rst says, both ways
    np.testing.assert_array_equal(got.values, want.values)


def test_auto_uses_loops_when_large_and_env_chooses(ran: list[int],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    u0 = _field((512, 512))
    got = u0.stencil.scan(heat2, steps=2, boundary="periodic")
    assert ran == [1]
    monkeypatch.setenv("XSTENCIL_BACKEND", "xla")
    want = u0.stencil.scan(heat2, steps=2, boundary="periodic")
    assert ran == [1]
    _ulp_close(np.asarray(got.values), np.asarray(want.values))
    small = _field((16, 16))
    monkeypatch.delenv("XSTENCIL_BACKEND")
    small.stencil.scan(heat2, steps=2, boundary="periodic")  # auto: small stays on XLA
    assert ran == [1]
    monkeypatch.setenv("XSTENCIL_BACKEND", "loops")
    small.stencil.scan(heat2, steps=2, boundary="periodic")
    assert ran == [1, 1]


def _reads_coord(u: Any) -> Any:
    return u(time=-1) + 0.0 * u.coord("x")(x=1)


def _reads_input(u: Any) -> Any:
    return u(time=-1) + u(x=1)


@pytest.mark.parametrize("case", ["coord", "xla", "checkpoint", "dask"])
def test_fallbacks_run_xla(ran: list[int], case: str) -> None:
    u0 = _field((10, 8))
    kernel, opts = heat2, dict(steps=4, boundary="periodic")
    obj: Any = u0
    backend = "loops"
    if case == "coord":
        kernel = _reads_coord
    elif case == "xla":
        backend = "xla"
    elif case == "checkpoint":  # check_finite runs on the loops (test_loops_check_finite.py)
        opts["checkpoint"] = True
    elif case == "dask":
        obj = u0.copy(data=dask.array.from_array(u0.values, chunks=5))
    got = obj.stencil.scan(kernel, backend=backend, **opts)
    assert ran == []
    want = obj.stencil.scan(kernel, backend="xla", **{**opts, "blocking": False}) \
        if case != "dask" else u0.stencil.scan(kernel, backend="xla", **opts)
    xr.testing.assert_allclose(got.compute(), want)


@pytest.mark.parametrize("backend", ["loops", "auto"])
def test_blocking_false_runs_the_loops(ran: list[int], backend: str) -> None:
    """``blocking=False`` never blocks; it used to run XLA's scan, even for
    ``backend="loops"``, where the loops' scan is not blocked either."""
    u0 = _field((10, 8))
    got = u0.stencil.scan(heat2, steps=4, boundary="periodic", blocking=False,
                          backend=backend)
    assert ran == ([1] if backend == "loops" else [])  # auto: a small field stays on XLA
    want = u0.stencil.scan(heat2, steps=4, boundary="periodic", backend="xla")
    xr.testing.assert_allclose(got, want)


def test_reads_ahead_still_raise(ran: list[int]) -> None:
    with pytest.raises(XStencilError, match="offset >= 0"):
        _field((6, 5)).stencil.scan(_reads_input, steps=2, backend="loops")
    assert ran == []


def test_bad_backend_is_refused() -> None:
    with pytest.raises(XStencilError, match=r"backend='numba' is not a backend"):
        _field((6, 5)).stencil.scan(heat2, steps=2, backend="numba")
