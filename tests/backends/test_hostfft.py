"""Large dense windows on numpy data run as ``scipy.fft`` FFTs on the host
(``xstencil/_backends/hostfft.py``).

Checked against a float64 direct sum (``np.pad`` by the boundary mode, one
shifted slice per window cell) within FFT rounding, against the XLA
program, and on what must not go quietly wrong: NaN and inf (the host
declines and XLA's exact path answers), huge finite values, weights changed
in place or rebound between calls, dtypes kept, several sources and a bias.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from tests.reference import extend
from tests.spies import count_calls
from xstencil._backends import hostfft
from xstencil._engine.dense_hoist import RETRY

pytest.importorskip("numba")

MODES = ["periodic", "reflect", "symmetric", "extend", "fill"]


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each host FFT call returned (``False``: it declined to XLA)."""
    seen: list[bool] = []
    real = hostfft.HostFFT.__call__

    def spy(self: Any, *args: Any) -> Any:
        seen.append(real(self, *args))
        return seen[-1]

    monkeypatch.setattr(hostfft.HostFFT, "__call__", spy)
    return seen


def _direct(a: np.ndarray, w: np.ndarray, mode: str, fill: float = 0.0,
            stride: tuple[int, ...] | None = None) -> np.ndarray:
    """``out[i] = sum_c w[c] * a[i + c - k // 2]`` in float64, padded by ``mode``."""
    a64 = a.astype(np.float64)
    pads = [(k // 2, k - 1 - k // 2) for k in w.shape]
    p = extend(a64, pads, [mode] * a.ndim, fill)
    out = np.zeros(a.shape)
    for cell in np.ndindex(*w.shape):
        out += float(w[cell]) * p[tuple(slice(c, c + n) for c, n in zip(cell, a.shape,
                                                                        strict=True))]
    if stride is not None:
        out = out[tuple(slice(None, None, s) for s in stride)]
    return out


def _bound(a: np.ndarray, w: np.ndarray, eps: float) -> float:
    """FFT rounding: a few eps of the transform's scale."""
    return 20 * eps * float(np.abs(a).max()) * float(np.abs(w).sum()) + 1e-300


@pytest.mark.parametrize("mode", MODES)
def test_every_boundary_mode_matches_the_direct_sum_and_xla(host: list[bool], mode: str) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((61, 70)).astype(np.float32)
    w = rng.standard_normal((13, 11)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"), coords={"x": np.arange(70.0)}, name="t",
                      attrs={"units": "K"})
    opts = {"window": {"y": 13, "x": 11}, "boundary": mode, "fill_value": 7.0}
    got = da.stencil.map(lambda u: (u * w).sum(), backend="loops", **opts)
    assert host == [True]
    xla = da.stencil.map(lambda u: (u * w).sum(), backend="xla", **opts)
    want = _direct(a, w, mode, 7.0)
    bound = _bound(extend(a, [(7, 7)] * 2, [mode] * 2, 7.0), w, np.finfo(np.float32).eps)
    assert got.dtype == np.float32 and got.name == "t" and got.attrs == {"units": "K"}
    np.testing.assert_array_equal(got.x, da.x)
    assert np.abs(got.values - want).max() < bound
    assert np.abs(got.values - xla.values).max() < bound
    assert np.abs(got.values - want).max() > 0  # an FFT, not the direct sum
    buf = np.full(a.shape, np.nan, np.float32)
    res = da.stencil.map(lambda u: (u * w).sum(), backend="loops", out=buf, **opts)
    assert host == [True, True] and np.shares_memory(res.values, buf)
    np.testing.assert_array_equal(buf, got.values)


def test_strides_and_constant_weights(host: list[bool]) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, 90)).astype(np.float32)
    w = np.round(rng.standard_normal((11, 11)), 2)
    wl = w.tolist()  # Python floats: literals of the program, not a closed-over array

    def kernel(u: Any) -> Any:
        return sum(wl[i][j] * u(y=i - 5, x=j - 5) for i in range(11) for j in range(11))

    da = xr.DataArray(a, dims=("y", "x"))
    got = da.stencil.map(kernel, window={"y": 11, "x": 11}, boundary="periodic",
                         stride={"y": 2, "x": 3}, backend="loops")
    assert host == [True]
    want = _direct(a, w, "periodic", stride=(2, 3))
    assert got.shape == want.shape
    assert np.abs(got.values - want).max() < _bound(a, w, np.finfo(np.float32).eps)


def test_float64_stays_float64_and_float16_stays_float16(host: list[bool]) -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((11, 11))
    a = rng.standard_normal((50, 40))
    with jax.enable_x64(True):
        got = xr.DataArray(a, dims=("y", "x")).stencil.map(
            lambda u: (u * w).sum(), window={"y": 11, "x": 11}, boundary="reflect",
            backend="loops")
    assert got.dtype == np.float64
    assert np.abs(got.values - _direct(a, w, "reflect")).max() < _bound(
        a, w, np.finfo(np.float64).eps)
    w16 = w.astype(np.float16)
    h = xr.DataArray(a.astype(np.float16), dims=("y", "x")).stencil.map(
        lambda u: (u * w16).sum(), window={"y": 11, "x": 11}, boundary="reflect",
        backend="loops")
    assert h.dtype == np.float16
    ref = _direct(a.astype(np.float16), w16, "reflect")
    assert np.abs(h.values.astype(np.float64) - ref).max() < 0.02 * np.abs(ref).max()
    assert host == [True, True]


def test_nan_in_the_data_gives_the_direct_sums_footprint(host: list[bool]) -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((60, 60)).astype(np.float32)
    a[30, 12] = np.nan
    a[5, 50] = np.inf
    w = rng.standard_normal((11, 11)).astype(np.float32)
    w[0, 0] = 0.0  # a cell of weight 0 is not read
    da = xr.DataArray(a, dims=("y", "x"))
    opts = {"window": {"y": 11, "x": 11}, "boundary": "periodic"}

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    got = da.stencil.map(kernel, backend="loops", **opts)
    assert host == [False]  # declined: XLA's exact path answered
    xla = da.stencil.map(kernel, backend="xla", **opts)
    np.testing.assert_array_equal(np.isnan(got.values), np.isnan(xla.values))
    np.testing.assert_array_equal(np.isinf(got.values), np.isinf(xla.values))
    want = _direct(np.where(np.isfinite(a), a, 0), w, "periodic")
    ok = np.isfinite(xla.values)
    assert 0 < ok.sum() < ok.size
    assert np.abs(got.values[ok] - want[ok]).max() < 1e-3
    # the next RETRY calls decline at once (NaN land stays); then the host tries again
    clean = xr.DataArray(np.nan_to_num(a, posinf=0.0), dims=("y", "x"))
    for _ in range(RETRY + 1):
        last = clean.stencil.map(kernel, backend="loops", **opts)
    assert host[1:] == [False] * RETRY + [True]
    assert np.abs(last.values - _direct(clean.values, w, "periodic")).max() < 1e-3


def test_a_non_finite_weight_and_huge_finite_data_decline(host: list[bool]) -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((40, 40)).astype(np.float32)
    w = rng.standard_normal((11, 11)).astype(np.float32)
    w[3, 4] = np.inf
    da = xr.DataArray(a, dims=("y", "x"))
    opts = {"window": {"y": 11, "x": 11}, "boundary": "extend", "backend": "loops"}
    got = da.stencil.map(lambda u: (u * w).sum(), **opts)
    assert host == [False]
    assert np.isinf(got.values).all() or np.isnan(got.values).any()
    xla = da.stencil.map(lambda u: (u * w).sum(), **{**opts, "backend": "xla"})
    np.testing.assert_array_equal(got.values, xla.values)
    # huge but finite: the host FFT's sums overflow, the direct sum's do not
    big = xr.DataArray(a * np.float32(3e36), dims=("y", "x"))
    v = rng.standard_normal((11, 11)).astype(np.float32)
    got = big.stencil.map(lambda u: (u * v).sum(), **opts)
    assert host[-1] is False
    assert np.isfinite(got.values).all()
    want = _direct(big.values, v, "extend")
    assert np.abs(got.values - want).max() < 1e-4 * np.abs(want).max()


def test_weights_changed_in_place_or_rebound_are_not_stale(host: list[bool]) -> None:
    rng = np.random.default_rng(6)
    a = rng.standard_normal((48, 52)).astype(np.float32)
    w = rng.standard_normal((11, 11)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))

    def run() -> np.ndarray:
        return da.stencil.map(lambda u: (u * w).sum(), window={"y": 11, "x": 11},
                              boundary="periodic", backend="loops").values

    first = run()
    w *= -2  # in place
    second = run()
    bound = _bound(a, w, np.finfo(np.float32).eps)
    assert np.abs(second - _direct(a, w, "periodic")).max() < bound
    assert np.abs(second + 2 * first).max() < bound
    w = np.ones((11, 11), np.float32)  # the global rebound
    third = run()
    assert np.abs(third - _direct(a, w, "periodic")).max() < bound
    assert host == [True, True, True]


def test_two_sources_and_a_bias(host: list[bool]) -> None:
    rng = np.random.default_rng(7)
    ds = xr.Dataset({"u": (("y", "x"), rng.standard_normal((40, 44)).astype(np.float32)),
                     "v": (("y", "x"), rng.standard_normal((40, 44)).astype(np.float32))})
    w1 = rng.standard_normal((11, 11)).astype(np.float32)
    w2 = rng.standard_normal((11, 11)).astype(np.float32)

    def kernel(f: Any) -> Any:
        return (f["u"] * w1).sum() - (f["v"] * w2).sum() + 2.5

    opts = {"window": {"y": 11, "x": 11}, "boundary": "symmetric"}
    got = ds.stencil.map(kernel, backend="loops", **opts)
    assert host == [True]
    want = (_direct(ds.u.values, w1, "symmetric") - _direct(ds.v.values, w2, "symmetric")
            + 2.5)
    bound = 2 * _bound(ds.u.values, w1 + np.abs(w2), np.finfo(np.float32).eps)
    assert np.abs(got.values - want).max() < bound


def test_three_dims(host: list[bool]) -> None:
    rng = np.random.default_rng(8)
    a = rng.standard_normal((20, 22, 24)).astype(np.float32)
    w = rng.standard_normal((5, 5, 5)).astype(np.float32)
    da = xr.DataArray(a, dims=("z", "y", "x"))
    got = da.stencil.map(lambda u: (u * w).sum(), window={"z": 5, "y": 5, "x": 5},
                         boundary="reflect", backend="loops")
    assert host == [True]
    assert np.abs(got.values - _direct(a, w, "reflect")).max() < _bound(
        a, w, np.finfo(np.float32).eps)


def test_inputs_are_not_mutated_and_the_default_backend_uses_it(host: list[bool]) -> None:
    rng = np.random.default_rng(9)
    a = rng.standard_normal((512, 512)).astype(np.float32)
    keep = a.copy()
    w = rng.standard_normal((15, 15)).astype(np.float32)
    wk = w.copy()
    got = xr.DataArray(a, dims=("y", "x")).stencil.map(
        lambda u: (u * w).sum(), window={"y": 15, "x": 15}, boundary="periodic")
    assert host == [True]  # 512 x 512: the default backend's size
    np.testing.assert_array_equal(a, keep)
    np.testing.assert_array_equal(w, wk)
    assert np.abs(got.values - _direct(a, w, "periodic")).max() < _bound(
        a, w, np.finfo(np.float32).eps)


@pytest.mark.parametrize(("shape", "boundary"), [((128, 64), "periodic"),
                                                 ((96, 80), "periodic"),
                                                 ((96, 80), "reflect")])
def test_the_transforms_by_axis_in_work_arrays_equal_scipy_ffts_functions(
        host: list[bool], monkeypatch: pytest.MonkeyPatch, shape: Any, boundary: str) -> None:
    """The private bindings' path (by axis, in work arrays kept by the map,
    the inverse written straight into the output) against the public
    ``scipy.fft.rfftn``/``irfftn`` path: the same bits where every size is a
    power of 2, else within the public path's own rounding (the inverse
    scales per axis); a padded block (``reflect``) too, called twice so that
    the second call reuses the work arrays (zeros after the block stay)."""
    rng = np.random.default_rng(10)
    a = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((11, 11)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    made: list[tuple[int, ...]] = []
    real_take = hostfft.HostFFT._take

    def take(self: Any, key: Any, make: Any) -> np.ndarray:
        got = real_take(self, key, make)
        made.append(got.shape)
        return got

    monkeypatch.setattr(hostfft.HostFFT, "_take", take)

    def run() -> np.ndarray:
        return da.stencil.map(lambda u: (u * w).sum(), window={"y": 11, "x": 11},
                              boundary=boundary, backend="loops").values

    by_axis, again = run(), run()
    assert made and host == [True, True]
    monkeypatch.setattr(hostfft, "_r2c", None)
    public = run()
    assert host == [True, True, True]
    np.testing.assert_array_equal(again, by_axis)
    if boundary == "periodic" and all(n & (n - 1) == 0 for n in shape):
        np.testing.assert_array_equal(by_axis, public)
    scale = np.abs(public).max()
    assert np.abs(by_axis - public).max() <= 8 * np.finfo(np.float32).eps * scale
    assert np.abs(by_axis - _direct(a, w, boundary)).max() < _bound(
        a, w, np.finfo(np.float32).eps)


def test_calls_at_once_each_take_their_own_work_array() -> None:
    """Two threads in one map's FFT at once (dask's threaded scheduler) never
    share a work array: what one takes, the other cannot until it is given
    back, and at most :data:`~hostfft.SPARE` free ones are kept."""
    fft = hostfft.HostFFT([], lambda: [], [], [], [], lambda: 1)
    made = iter(range(100))
    first = fft._take("k", lambda: np.full(3, next(made)))
    second = fft._take("k", lambda: np.full(3, next(made)))
    assert first[0] != second[0]
    for arr in (first, second, np.zeros(3)):
        fft._give("k", arr)
    assert len(fft.work["k"]) == hostfft.SPARE
    assert {fft._take("k", list)[0] for _ in range(2)} == {0, 1}


def test_work_arrays_kept_are_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A map keeps at most :data:`~hostfft.WORK_BYTES` of free work arrays:
    a large field's are made anew on each call, not held for the map's
    lifetime."""
    monkeypatch.setattr(hostfft, "WORK_BYTES", 1000)
    fft = hostfft.HostFFT([], lambda: [], [], [], [], lambda: 1)
    fft._give("small", np.zeros(100, np.float32))  # 400 bytes
    fft._give("big", np.zeros(200, np.float32))  # 800 more: over the bound
    fft._give("small", np.zeros(100, np.float32))
    assert [a.nbytes for a in fft.work["small"]] == [400, 400]
    assert fft.work["big"] == []


def test_a_forked_child_gets_its_own_thread_pool() -> None:
    """The row-split helper's pool is remade in a child process (a forked
    child inherits the pool object but not its threads: it would wait
    forever), checked without forking by faking the pool's process id."""
    out = np.empty((256, 512), np.float32)
    acc = np.arange(out.size, dtype=np.float32).reshape(out.shape)
    assert hostfft._copy_check(out, acc, 2)
    first = hostfft._POOL[0]
    hostfft._POOL[1] = -1  # as in a child: another process
    np.testing.assert_array_equal(out, acc)
    out[...] = 0
    assert hostfft._copy_check(out, acc, 2)
    np.testing.assert_array_equal(out, acc)
    assert hostfft._POOL[0] is not first and hostfft._POOL[1] > 0


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(256, 512), (8, 8), ()])
def test_the_output_check_finds_one_non_finite_value_anywhere(dtype: Any, shape: Any) -> None:
    """The outputs' check (copy and check, in one thread or in blocks of
    rows on two) finds a single NaN or inf in any block, and lets huge
    finite values through where a sum of them would overflow."""
    huge = np.full(shape, np.finfo(dtype).max, dtype)  # its sum overflows
    out = np.empty(shape, dtype)
    assert hostfft._copy_check(out, huge, 2)
    np.testing.assert_array_equal(out, huge)
    cells = [()] if shape == () else [(0, 0), (shape[0] - 1, shape[1] - 1), (shape[0] // 2, 3)]
    for bad in (np.nan, np.inf, -np.inf):
        for cell in cells:
            acc = huge.copy()
            acc[cell] = bad
            assert not hostfft._copy_check(out, acc, 2)
            assert not hostfft._copy_check(acc, acc, 2)  # written in place: the check alone
            assert not hostfft._copy_check(out, acc, 1)


@pytest.mark.slow  # 47 s on 2 cores: one FFT program per vector component, both paths
def test_a_kernel_returning_a_vector_per_cell_matches_xla(host: list[bool]) -> None:
    """Per-cell vectors are not written by the host FFT (its outputs have the
    field's shape); whichever path runs, the answer is XLA's."""
    rng = np.random.default_rng(11)
    w1 = rng.standard_normal((11, 11)).astype(np.float32)
    w2 = rng.standard_normal((11, 11)).astype(np.float32)
    da = xr.DataArray(rng.standard_normal((64, 70)).astype(np.float32), dims=("y", "x"))

    def kernel(u: Any) -> Any:
        return jnp.stack([(u * w1).sum(), (u * w2).sum()])

    opts = {"window": {"y": 11, "x": 11}, "boundary": "reflect", "output_dims": ["c"]}
    got = da.stencil.map(kernel, backend="loops", **opts)
    want = da.stencil.map(kernel, backend="xla", **opts)
    assert got.shape == (64, 70, 2) and host == []
    np.testing.assert_allclose(got.values, want.values, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("shape", "window", "boundary", "stride"), [
    ((40, 37), {"y": 11, "x": 11}, "reflect", None),
    ((40, 37), {"y": 11, "x": 11}, "symmetric", None),
    ((40, 37), {"y": 11, "x": 11}, "extend", None),
    ((40, 37), {"y": 11, "x": 11}, "fill", None),
    ((40, 37), {"y": (2, 12), "x": (9, 3)}, {"y": "periodic", "x": "reflect"}, None),
    ((40, 37), {"y": 12, "x": 11}, {"y": "fill", "x": "periodic"}, {"y": 2, "x": 3}),
    ((5, 40), {"y": 11, "x": 11}, "reflect", None),  # the window wider than the field
    ((4, 40), {"y": 13, "x": 11}, {"y": "symmetric", "x": "extend"}, None),
    ((3, 30, 26), {"z": 3, "y": 7, "x": 7}, {"z": "periodic", "y": "reflect", "x": "fill"}, None),
])
def test_the_block_written_by_numpy_is_the_xla_block(
        host: list[bool], monkeypatch: pytest.MonkeyPatch, shape: Any, window: Any,
        boundary: Any, stride: Any) -> None:
    """The padded block the host FFT writes with numpy (``_HostBlock``) is
    bitwise the block of the engine's jitted function it replaces, for
    every boundary mode, mixed per dim, asymmetric and strided windows, a
    field narrower than the window (reflected more than once), 3-D; the work
    array stays zero after the block; and the map equals the direct sum."""
    rng = np.random.default_rng(12)
    a = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(tuple(v if isinstance(v, int) else sum(v) + 1
                                  for v in window.values())).astype(np.float32)
    dims = ("z", "y", "x")[-len(shape):]
    seen: list[tuple[Any, Any]] = []
    real = hostfft.HostFFT._run

    def spy(self: Any, args: Any) -> bool:
        seen.append((self, args))
        return real(self, args)

    monkeypatch.setattr(hostfft.HostFFT, "_run", spy)
    got = xr.DataArray(a, dims=dims).stencil.map(
        lambda u: (u * w).sum(), window=window, boundary=boundary, fill_value=2.5,
        stride=stride, backend="loops")
    assert host == [True]
    fft, args = seen[0]
    (term,), = fft.terms
    assert term.host is not None and term.block is not None
    src = args[1 + term.index]
    want = np.asarray(term.block(src))
    written = term.host.write(np.zeros(term.shape, np.float32), src)
    assert written.shape == term.shape and term.host.extent == want.shape
    np.testing.assert_array_equal(written[tuple(slice(0, n) for n in want.shape)], want)
    outside = np.ones(term.shape, bool)
    outside[tuple(slice(0, n) for n in want.shape)] = False
    assert not written[outside].any()
    xla = xr.DataArray(a, dims=dims).stencil.map(
        lambda u: (u * w).sum(), window=window, boundary=boundary, fill_value=2.5,
        stride=stride, backend="xla")
    scale = float(np.abs(a).max()) * float(np.abs(w).sum())
    assert np.abs(got.values - xla.values).max() <= 20 * np.finfo(np.float32).eps * scale


def test_a_block_in_another_dtype_is_made_by_xla(host: list[bool],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """float16 data are transformed in float32, cast as XLA casts them: the
    block comes from the engine's jitted function, not from numpy."""
    rng = np.random.default_rng(13)
    a = rng.standard_normal((40, 37)).astype(np.float16)
    w = rng.standard_normal((11, 11)).astype(np.float16)
    writes: list[int] = []
    real = hostfft._HostBlock.write
    monkeypatch.setattr(hostfft._HostBlock, "write",
                        lambda self, *args: writes.append(1) or real(self, *args))
    got = xr.DataArray(a, dims=("y", "x")).stencil.map(
        lambda u: (u * w).sum(), window={"y": 11, "x": 11}, boundary="reflect",
        backend="loops")
    assert host == [True] and writes == [] and got.dtype == np.float16


def _gauss(k: int, width: float) -> np.ndarray:
    x = np.arange(k) - (k - 1) / 2
    g = np.exp(-x**2 / (2 * width**2))
    return g / g.sum()


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per call of the separable passes."""
    return count_calls(monkeypatch, hostfft.HostFFT, "_separable")


@pytest.mark.parametrize(("shape", "window", "boundary", "stride", "dtype"), [
    ((90, 70), (15, 15), "reflect", None, np.float32),
    ((90, 70), (17, 13), "periodic", None, np.float32),
    ((90, 70), (15, 15), {"y": "fill", "x": "extend"}, {"y": 2, "x": 3}, np.float32),
    ((40, 52), (15, 17), "symmetric", None, np.float64),
    ((5, 60), (15, 15), "reflect", None, np.float32),  # narrower than the window
])
def test_rank_one_weights_run_as_two_passes_and_match_the_direct_sum(
        host: list[bool], passes: list[bool], shape: Any, window: Any, boundary: Any,
        stride: Any, dtype: Any) -> None:
    """Weights that are an outer product (a Gaussian) run as two 1-D passes
    over the padded block, for every boundary mode, mixed, strided, float64,
    a field narrower than the window; the result is the direct sum's to FFT
    rounding or better, and its dtype, shape and coords are the map's."""
    rng = np.random.default_rng(14)
    a = rng.standard_normal(shape).astype(dtype)
    w = np.outer(_gauss(window[0], 2.5), _gauss(window[1], 3.0)).astype(dtype)
    da = xr.DataArray(a, dims=("y", "x"), coords={"x": np.arange(shape[1]) * 0.5})
    kw = {"window": {"y": window[0], "x": window[1]}, "boundary": boundary,
          "fill_value": 1.5, "stride": stride}
    got = da.stencil.map(lambda u: (u * w).sum(), backend="loops", **kw)
    assert host == [True] and passes == [True]
    xla = da.stencil.map(lambda u: (u * w).sum(), backend="xla", **kw)
    assert got.dtype == dtype and got.shape == xla.shape
    np.testing.assert_array_equal(got.coords["x"].values, xla.coords["x"].values)
    mode = boundary if isinstance(boundary, str) else None
    if mode is not None:
        ref = _direct(a, w.astype(np.float64), mode, 1.5)
        assert np.abs(got.values - ref).max() < _bound(a, w, np.finfo(dtype).eps)
    assert np.abs(got.values - xla.values).max() < 2 * _bound(a, w, np.finfo(dtype).eps)


def test_weights_that_are_not_rank_one_or_cost_more_take_the_fft(
        host: list[bool], passes: list[bool]) -> None:
    """Random weights, a rank-1 product perturbed past the tolerance, and a
    window so wide for its field that the passes would cost more than the
    FFT (:data:`hostfft.PASS_PER_FFT`) all run the FFT; weights changed in
    place from rank 1 to full rank on the same map are never stale."""
    rng = np.random.default_rng(15)
    a = rng.standard_normal((96, 96)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    w = np.outer(_gauss(15, 2.0), _gauss(15, 3.0)).astype(np.float32)

    def run(k: int = 15) -> np.ndarray:
        return da.stencil.map(lambda u: (u * w).sum(), window={"y": k, "x": k},
                              boundary="periodic", backend="loops").values

    np.testing.assert_allclose(run(), _direct(a, w, "periodic"), atol=1e-5)
    assert passes == [True]
    w[3, 4] += 1e-3  # no longer rank 1: the FFT, with the new values
    np.testing.assert_allclose(run(), _direct(a, w, "periodic"), atol=1e-5)
    w[...] = rng.standard_normal((15, 15))
    np.testing.assert_allclose(run(), _direct(a, w, "periodic"), atol=1e-4)
    assert passes == [True] and host == [True, True, True]
    w = np.outer(_gauss(63, 8.0), _gauss(63, 8.0)).astype(np.float32)
    np.testing.assert_allclose(run(63), _direct(a, w, "periodic"), atol=1e-5)
    assert passes == [True]


def test_rank_one_weights_with_a_bias_and_nan_data(host: list[bool], passes: list[bool]) -> None:
    """A constant added to the sum (a bias) is added after the passes; a NaN
    in the data still hands the call to XLA's exact path (the direct sum's
    NaN footprint), as for the FFT."""
    rng = np.random.default_rng(16)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    w = np.outer(_gauss(15, 2.0), _gauss(15, 2.0)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    got = da.stencil.map(lambda u: (u * w).sum() + 2.0, window={"y": 15, "x": 15},
                         boundary="reflect", backend="loops")
    assert passes == [True] and host == [True]
    np.testing.assert_allclose(got.values, _direct(a, w, "reflect") + 2.0, atol=1e-5)
    bad = a.copy()
    bad[20, 30] = np.nan
    out = xr.DataArray(bad, dims=("y", "x")).stencil.map(
        lambda u: (u * w).sum() + 2.0, window={"y": 15, "x": 15}, boundary="reflect",
        backend="loops").values
    assert host[-1] is False
    assert np.isnan(out).sum() == 15 * 15 and np.isnan(out[20, 30]) and not np.isnan(out[50, 5])
