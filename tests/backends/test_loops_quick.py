"""The repeat's short path of a loop-backend map (``LoopOrJit.quick``).

A map called again with the same kernel, options and layout skips the loop
backend's general checks and runs the nest it ran last time.  These tests
check that it is taken where it should be, that every way the call can
differ from the last one (the data's type, shape or dtype, the backend
chosen by the environment, JAX's x64 flag, the coordinates, kernel
arguments and closed-over arrays) takes the general path instead, and that
the numbers are the numpy reference either way.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

from tests.spies import recorded
from xstencil._backends import loops

pytest.importorskip("numba")


def lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def _ref(a: np.ndarray) -> np.ndarray:
    """The periodic 5-point Laplacian, in the kernel's order of operations."""
    r = np.roll
    return r(a, -1, 1) + r(a, 1, 1) + r(a, -1, 0) + r(a, 1, 0) - a.dtype.type(4) * a


def _da(a: np.ndarray, dx: float = 1.0) -> xr.DataArray:
    ny, nx = a.shape
    return xr.DataArray(a, dims=("y", "x"), name="T", attrs={"units": "K"},
                        coords={"x": np.arange(nx) * dx, "y": np.arange(ny) * 0.5})


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each ``LoopOrJit.quick`` call ran the repeat (else ``None``)."""
    monkeypatch.delenv(loops.ENV, raising=False)
    return recorded(monkeypatch, loops.LoopOrJit, "quick", lambda args, out: out is not None)


def _map(da: xr.DataArray, **kw: Any) -> xr.DataArray:
    return da.stencil.map(lap, boundary="periodic", backend="loops", **kw)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16"])
def test_repeats_take_the_short_path_and_hold_the_reference(quick: list[bool], ran: list[int],
                                                            dtype: str) -> None:
    rng = np.random.default_rng(0)
    arrays = [(rng.random((40, 48)) * 100).astype(dtype) for _ in range(3)]
    kept = []
    for i in range(6):
        a = arrays[i % 3]
        res = _map(_da(a))
        assert res.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(np.asarray(res), _ref(a))
        assert res.name == "T" and res.attrs == {"units": "K"}
        kept.append((a, res))
    assert len(ran) == 6, "the loop backend did not run every call"
    if dtype == "float64":  # with x64 off: run under x64 and kept on the host (the full path)
        assert not any(quick)
    else:
        assert sum(quick) >= 3, "repeated calls did not take the short path"
    for a, res in kept:  # every result still holds its own numbers
        np.testing.assert_array_equal(np.asarray(res), _ref(a))


def test_out_on_the_short_path(quick: list[bool]) -> None:
    a = np.random.default_rng(1).random((40, 48), dtype=np.float32)
    da = _da(a)
    buf = np.empty_like(a)
    for _ in range(3):
        buf[...] = np.nan
        res = _map(da, out=buf)
        assert res.data is buf
        np.testing.assert_array_equal(buf, _ref(a))
    assert quick[-1], "the repeated out= call did not take the short path"
    wrong = np.empty((40, 48), np.float64)  # not the result's dtype: refused, nothing written
    with pytest.raises(Exception, match="out="):
        _map(da, out=wrong)


def test_the_environment_switching_to_xla_is_honoured(quick: list[bool], ran: list[int],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    a = np.random.default_rng(2).random((40, 48), dtype=np.float32)
    da = _da(a)
    for _ in range(3):
        da.stencil.map(lap, boundary="periodic")
    monkeypatch.setenv(loops.ENV, "xla")
    before = len(ran)
    res = da.stencil.map(lap, boundary="periodic")
    assert len(ran) == before, "the loops ran although XSTENCIL_BACKEND=xla"
    assert quick[-1] is False
    np.testing.assert_allclose(np.asarray(res), _ref(a), rtol=1e-5, atol=1e-5)


def test_jax_data_of_the_same_layout_is_read_through_its_view(quick: list[bool],
                                                              ran: list[int]) -> None:
    a = np.random.default_rng(3).random((40, 48), dtype=np.float32)
    for _ in range(3):
        _map(_da(a))
    b = a[::-1].copy()
    x = jnp.asarray(b)
    res = _map(_da(x))  # a time loop of maps hands each call the last result
    assert quick[-1] is True and len(ran) == 4
    np.testing.assert_array_equal(np.asarray(res), _ref(b))
    np.testing.assert_array_equal(np.asarray(x), b)  # the input is left alone
    res = _map(res)
    np.testing.assert_array_equal(np.asarray(res), _ref(_ref(b)))
    gone = jnp.asarray(b)
    da = _da(gone)
    gone.delete()  # no view: the general path, and XLA's error
    with pytest.raises(RuntimeError, match="deleted"):
        _map(da)
    assert quick[-1] is False


def test_other_shapes_coords_and_x64_do_not_reuse_the_last_nest(quick: list[bool]) -> None:
    rng = np.random.default_rng(4)
    small, large = rng.random((40, 48), dtype=np.float32), rng.random((48, 40), dtype=np.float32)
    for _ in range(2):  # one memo slot: alternating layouts still give the right numbers
        for a in (small, large):
            np.testing.assert_array_equal(np.asarray(_map(_da(a))), _ref(a))
    # new coordinate values: a new entry, and the right numbers
    np.testing.assert_array_equal(np.asarray(_map(_da(small, dx=2.0))), _ref(small))
    with jax.enable_x64(True):
        res = _map(_da(small))
        assert res.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(res), _ref(small))
    np.testing.assert_array_equal(np.asarray(_map(_da(small))), _ref(small))


def test_arguments_and_new_kernels_take_the_general_path(quick: list[bool]) -> None:
    a = np.random.default_rng(5).random((40, 48), dtype=np.float32)
    da = _da(a)
    for scale in (1.0, 2.0, 3.0):
        w = np.float32(scale) * np.ones((), np.float32)

        def scaled(u: Any) -> Any:
            return w * lap(u)  # noqa: B023 - called in this iteration only

        res = da.stencil.map(scaled, boundary="periodic", backend="loops")
        np.testing.assert_allclose(np.asarray(res), scale * _ref(a), rtol=1e-6)
        res = da.stencil.map(lambda u, c: c * lap(u), np.float32(scale), boundary="periodic",
                             backend="loops")
        np.testing.assert_allclose(np.asarray(res), scale * _ref(a), rtol=1e-6)
    assert not any(quick), "a call with arguments or a new kernel took the short path"


def test_closed_over_numpy_arrays_take_the_short_path_with_their_current_values(
        quick: list[bool]) -> None:
    """A repeated map whose kernel closes over numpy weights takes the short
    path and reads the weights' values of each call: changed in place,
    rebound to new values of the same layout, or rebound to another dtype
    (the general path) or a JAX array (the general path), the numbers are
    always the direct sum of the current weights."""
    rng = np.random.default_rng(7)
    a = rng.random((40, 48), dtype=np.float32)
    da = _da(a)
    w = rng.random((3, 3), dtype=np.float32)

    def weighted(u: Any) -> Any:
        return (u * w).sum()

    def ref(weights: np.ndarray) -> np.ndarray:
        out = np.zeros(a.shape, np.float64)
        for i in range(3):
            for j in range(3):
                out += float(weights[i, j]) * np.roll(a, (1 - i, 1 - j), axis=(0, 1))
        return out

    def run() -> np.ndarray:
        return np.asarray(da.stencil.map(weighted, window={"y": 3, "x": 3},
                                         boundary="periodic", backend="loops"))

    first = run()
    np.testing.assert_allclose(first, ref(w), rtol=1e-5, atol=1e-5)
    for _ in range(2):  # the first repeat records the entry's coordinates for the next
        np.testing.assert_array_equal(run(), first)
    assert quick[-1] is True, "the repeat with closed-over weights took the general path"
    w[1, 1] = 7.0  # changed in place
    np.testing.assert_allclose(run(), ref(w), rtol=1e-5, atol=1e-5)
    assert quick[-1] is True
    w = rng.random((3, 3), dtype=np.float32)  # rebound: same layout
    np.testing.assert_allclose(run(), ref(w), rtol=1e-5, atol=1e-5)
    for other in (w.astype(np.float64), jnp.asarray(w)):  # the general path (a new entry
        w = other  # for the float64 weights: no repeat to take; a JAX array: not numpy)
        seen = len(quick)
        np.testing.assert_allclose(run(), ref(np.asarray(w)), rtol=1e-5, atol=1e-5)
        assert not any(quick[seen:])


def test_the_host_fft_repeat_takes_the_short_path_and_declines_to_xla(
        quick: list[bool]) -> None:
    """A large window closed over as numpy weights (the host FFT) repeats on
    the short path; a NaN in the data still hands the call to XLA's exact
    path there (the short path passes it the fallback), whose result has the
    direct sum's NaN footprint."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    w = rng.standard_normal((15, 15)).astype(np.float32)

    def run(x: np.ndarray) -> np.ndarray:
        return np.asarray(xr.DataArray(x, dims=("y", "x")).stencil.map(
            lambda u: (u * w).sum(), window={"y": 15, "x": 15}, boundary="periodic",
            backend="loops"))

    first = run(a)
    for _ in range(2):
        np.testing.assert_array_equal(run(a), first)
    assert quick[-1] is True
    bad = a.copy()
    bad[10, 20] = np.nan
    got = run(bad)
    assert quick[-1] is True
    nan = np.isnan(got)
    assert nan.sum() == 15 * 15 and nan[10, 20] and not nan[30, 40]
    np.testing.assert_allclose(got[~nan], first[~nan], atol=1e-3)  # far cells: finite


def test_a_kernel_reading_coordinates_sees_new_ones(quick: list[bool]) -> None:
    def ddx(u: Any) -> Any:
        return (u(x=1) - u(x=-1)) / (u.coord("x")(x=1) - u.coord("x")(x=-1))

    a = np.random.default_rng(6).random((40, 48))
    ref = (np.roll(a, -1, 1) - np.roll(a, 1, 1)) / 2.0
    # float64 data read coordinates on the loop backend; under the suite's strict
    # promotion this also checks that window inference probes coordinates in
    # float64 next to float64 data (a float32 probe raised TypePromotionError)
    with jax.enable_x64(True):
        for dx in (1.0, 1.0, 1.0, 2.0, 0.5, 2.0):
            res = _da(a, dx).stencil.map(ddx, boundary="extend", backend="loops")
            np.testing.assert_allclose(np.asarray(res)[:, 1:-1], ref[:, 1:-1] / dx,
                                       rtol=1e-12)
    # 64-bit data take the full path today (entry.wide); whichever path runs,
    # a new spacing must reach the nest
    assert not any(quick)
