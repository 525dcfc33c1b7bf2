"""Integer window sums over windows that are not separable, on the loop
backend: float64 FFTs rounded to the nearest integer (``hostfft.py``).

A count over a disk on a ``bool`` mask (a focal count, a raster's
neighbourhood statistic) was a term per window cell: 81 cells at 1024²
ran 160 ms a call on XLA (the loop nest was over its statement budget),
197 cells 460 ms, where scipy.ndimage took 80-180 ms; now 10 ms, first call
0.1 s.  Results must be the exact integer sums, wrap included, against
numpy's int64 sums; where the FFT could miss (a bound on its error, or the
values after it) the call runs the XLA program, which is exact too.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from tests.reference import integer_correlate
from xstencil._backends import hostfft

pytest.importorskip("numba")

#: Points enough for the loop backend to take the map (loops.AUTO_MIN_POINTS).
SHAPE = (560, 520)
MODES = ["fill", "periodic", "reflect", "symmetric", "extend"]


def _disk(r: int, dtype: Any = np.int32) -> np.ndarray:
    yy, xx = np.mgrid[-r:r + 1, -r:r + 1]
    return (yy**2 + xx**2 <= r * r).astype(dtype)


def _data(dtype: Any, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random(SHAPE) < 0.3
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, SHAPE).astype(dtype)


def _summed(w: np.ndarray) -> Any:
    """The kernel ``sum(w * u)``, in int32 (``w``'s dtype)."""
    return lambda u: (u.astype(jnp.int32) * w).sum()


def _map(a: np.ndarray, kernel: Any, k: int, mode: str, *args: Any, **kw: Any) -> xr.DataArray:
    opts: dict[str, Any] = {"boundary": mode}
    if mode == "fill":
        opts["fill_value"] = 0
    return xr.DataArray(a, dims=("y", "x")).stencil.map(kernel, *args, window={"y": k, "x": k},
                                                        **opts, **kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int16])
def test_a_disk_count_is_exact_and_runs_as_host_ffts(calls: dict[str, list[Any]], mode: str,
                                                     dtype: Any) -> None:
    a = _data(dtype, seed=MODES.index(mode))
    disk = _disk(8)
    got = _map(a, _summed(disk), 17, mode)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got.values, integer_correlate(a, disk, mode))
    assert calls["host"] == [True]  # the host FFT answered (no XLA fallback)


def test_a_window_whose_loop_nest_is_too_large_is_ffts_too(calls: dict[str, list[Any]],
                                                           nests: list[int]) -> None:
    a = _data(np.bool_, seed=5)
    disk = _disk(5)  # 81 of 121 cells: under FFT_TAPS, but one nest statement per cell
    got = _map(a, _summed(disk), 11, "fill")
    np.testing.assert_array_equal(got.values, integer_correlate(a, disk, "fill"))
    assert calls["host"] == [True]


def test_a_small_window_stays_a_loop_nest(calls: dict[str, list[Any]], nests: list[int]) -> None:
    a = _data(np.uint8, seed=6)
    disk = _disk(2)  # 21 of 25 cells: a nest that reads them is cheaper than FFTs
    got = _map(a, _summed(disk), 5, "reflect")
    np.testing.assert_array_equal(got.values, integer_correlate(a, disk, "reflect"))
    assert calls["host"] == [] and len(nests) == 1


def test_signed_weights_a_bias_and_a_stride() -> None:
    a = _data(np.uint8, seed=7)
    w = _disk(9) * 3 - 1  # a ring of -1 around a disk of 2s: not separable
    w[9, 9] = -40

    def kernel(u: Any) -> Any:
        return (u.astype(jnp.int32) * w).sum() + 1000

    got = _map(a, kernel, 19, "symmetric", stride={"y": 3, "x": 2})
    want = integer_correlate(a, w, "symmetric", stride=(3, 2)) + 1000
    np.testing.assert_array_equal(got.values, want)


def test_a_sum_past_the_dtype_wraps_as_the_kernel_does(calls: dict[str, list[Any]]) -> None:
    a = _data(np.uint8, seed=8)
    w = _disk(8, np.int16) * 2  # sums near 50,000: past int16's 32767, which wraps

    def kernel(u: Any) -> Any:
        return (u.astype(jnp.int16) * w).sum(dtype=jnp.int16)

    got = _map(a, kernel, 17, "periodic")
    assert got.dtype == np.int16
    want = integer_correlate(a, w, "periodic")
    assert want.max() > 2**15  # it does wrap
    np.testing.assert_array_equal(got.values, want.astype(np.int16))
    xla = _map(a, kernel, 17, "periodic", backend="xla")
    np.testing.assert_array_equal(got.values, xla.values)
    assert calls["host"] == [True]


def test_weights_closed_over_or_passed_follow_their_values(calls: dict[str, list[Any]]) -> None:
    a = _data(np.bool_, seed=9)
    w = _disk(7)

    def closed(u: Any) -> Any:
        return (u.astype(jnp.int32) * w).sum()

    first = _map(a, closed, 15, "fill")
    np.testing.assert_array_equal(first.values, integer_correlate(a, w, "fill"))
    w[7, :] = 5  # changed in place: a new spectrum, never a stale one
    again = _map(a, closed, 15, "fill")
    np.testing.assert_array_equal(again.values, integer_correlate(a, w, "fill"))
    v = _disk(6, np.int32) * 2
    passed = _map(a, lambda u, q: (u.astype(jnp.int32) * q).sum(), 15, "fill", np.pad(v, 1))
    np.testing.assert_array_equal(passed.values, integer_correlate(a, np.pad(v, 1), "fill"))
    assert calls["host"] == [True, True, True]


def test_weights_that_become_separable_or_zero_stay_exact() -> None:
    a = _data(np.int16, seed=10)
    w = _disk(8)

    def kernel(u: Any) -> Any:
        return (u.astype(jnp.int32) * w).sum()

    _map(a, kernel, 17, "extend")
    w[...] = 1  # a box now: the same compiled map, its weights read again
    got = _map(a, kernel, 17, "extend")
    np.testing.assert_array_equal(got.values, integer_correlate(a, w, "extend"))
    w[...] = 0
    got = _map(a, kernel, 17, "extend")
    np.testing.assert_array_equal(got.values, np.zeros(SHAPE, np.int32))


def test_data_too_wide_for_the_bound_run_the_exact_xla_program(calls: dict[str, list[Any]]
                                                               ) -> None:
    a = _data(np.int32, seed=11)  # values up to 2**31: the FFT's error bound is far over 1/8
    w = _disk(8)
    assert hostfft.exact_error(w, 2.0**31, (576, 536)) > hostfft.ROUND_SLACK
    got = _map(a, _summed(w), 17, "fill")
    np.testing.assert_array_equal(got.values, integer_correlate(a, w, "fill").astype(np.int32))
    assert calls["host"] == [False]  # declined: the XLA program's result


@pytest.mark.parametrize("top, host", [(1000, True), (2**18, True), (2**26, False)])
def test_int32_data_is_bound_by_its_own_values(calls: dict[str, list[Any]], top: int,
                                               host: bool) -> None:
    """The range of int32 (2**31) bounds the FFT's error far over 1/8, so
    each call bounds it by its data's 2-norm instead (labels, counts or
    earlier sums stored as int32 are small): the host FFT answers where that
    bound holds, and the call runs the exact XLA program where it does not.
    The data's values stay exact either way, negative ones and a bias
    included; the second call repeats the first's answer."""
    rng = np.random.default_rng(top % 1000 + 7)
    a = rng.integers(-top, top + 1, SHAPE).astype(np.int32)
    w = _disk(8) * np.where(np.arange(17) % 2 == 0, 3, -1)[:, None].astype(np.int32)
    assert hostfft.exact_error(w, 2.0**31, (576, 536)) > hostfft.ROUND_SLACK  # by the dtype

    def kernel(u: Any) -> Any:
        return (u * w).sum() + 7

    want = (integer_correlate(a, w, "symmetric") + 7).astype(np.int32)
    for _ in range(2):
        got = _map(a, kernel, 17, "symmetric")
        np.testing.assert_array_equal(got.values, want)
    assert calls["host"] == [host, host]


def test_values_off_an_integer_after_the_fft_decline(monkeypatch: pytest.MonkeyPatch,
                                                     calls: dict[str, list[Any]]) -> None:
    real = hostfft.HostFFT._correlate

    def off(self: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        out = real(self, *args, **kwargs)
        out[3, 4] += 0.3  # as a wrong FFT would be
        return out

    monkeypatch.setattr(hostfft.HostFFT, "_correlate", off)
    a = _data(np.uint8, seed=12)
    w = _disk(8)
    got = _map(a, _summed(w), 17, "reflect")
    np.testing.assert_array_equal(got.values, integer_correlate(a, w, "reflect"))
    assert calls["host"] == [False]


@pytest.mark.parametrize("shape", [(256, 256), (210, 330), (97, 131)])
def test_the_error_bound_holds(shape: tuple[int, int]) -> None:
    """:func:`hostfft.exact_error` bounds the float64 FFT's error on data at
    the bound's peak (uniform values over the whole range), with room."""
    rng = np.random.default_rng(sum(shape))
    peak = 2.0**20
    x = rng.integers(-(2**20), 2**20, shape).astype(np.float64)
    w = rng.integers(-300, 300, (15, 15)).astype(np.float64)
    big = np.zeros(shape)
    big[:15, :15] = w
    got = np.fft.irfft2(np.fft.rfft2(x) * np.conj(np.fft.rfft2(big)), shape)
    xi, wi = x.astype(np.int64), w.astype(np.int64)
    want = np.zeros(shape, np.int64)
    for i, j in np.ndindex(15, 15):
        want += wi[i, j] * np.roll(xi, (-i, -j), axis=(0, 1))
    err = np.abs(got - want).max()
    assert 0 < err <= hostfft.exact_error(w, peak, shape) / 10


@pytest.mark.parametrize("seed", range(10))
def test_random_windows_match_the_xla_program_bitwise(calls: dict[str, list[Any]],
                                                      seed: int) -> None:
    """Random integer windows of over 100 nonzero cells (not separable), data
    dtypes, boundaries and strides: the host FFT's rounded sums are XLA's
    integer sums, cell by cell, bit for bit."""
    rng = np.random.default_rng(1000 + seed)
    dtype = [np.bool_, np.uint8, np.int8, np.uint16, np.int16][seed % 5]
    mode = MODES[seed % len(MODES)]
    shape = (int(rng.integers(60, 90)), int(rng.integers(60, 90)))
    if dtype == np.bool_:
        a = rng.random(shape) < 0.5
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
    w = (rng.integers(-5, 6, (13, 13)) * (rng.random((13, 13)) < 0.8)).astype(np.int32)
    stride = {"y": int(rng.integers(1, 3)), "x": int(rng.integers(1, 3))}
    got = _map(a, _summed(w), 13, mode, stride=stride, backend="loops")
    want = _map(a, _summed(w), 13, mode, stride=stride, backend="xla")
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(got.values, integer_correlate(
        a, w, mode, stride=(stride["y"], stride["x"])))
    assert calls["host"] == [True]
