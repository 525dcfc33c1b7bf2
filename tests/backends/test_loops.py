"""The numba loop backend of in-memory maps (``xstencil/_backends/loops.py``).

Every case runs the same map three ways: ``backend="loops"`` (checked to have
run as loops, or to have fallen back), ``backend="xla"``, and a plain numpy
reference built with ``np.pad``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from xstencil._backends import loops as L
from xstencil._errors import XStencilError

pytest.importorskip("numba")

NP_MODE = {"fill": "constant", "extend": "edge", "periodic": "wrap", "reflect": "reflect",
           "symmetric": "symmetric"}
DIMS = ("z", "y", "x")


def _padded(a: np.ndarray, modes: list[str], fill: float, width: int = 1) -> np.ndarray:
    out = a
    for ax, m in enumerate(modes):
        pw = [(0, 0)] * a.ndim
        pw[ax] = (width, width)
        if m == "fill":
            out = np.pad(out, pw, mode="constant", constant_values=fill)
        else:
            out = np.pad(out, pw, mode=NP_MODE[m])
    return out


def _lap(ndim: int) -> Any:
    """The Laplacian: the centre term, then the 2 * ndim unit offsets in
    ``_lap_ref``'s order."""
    offsets = [{d: step} for d in DIMS[-ndim:] for step in (1, -1)]

    def kernel(u: Any) -> Any:
        return sum((u(**o) for o in offsets), start=-2 * ndim * u())

    return kernel


def _lap_ref(a: np.ndarray, modes: list[str], fill: float) -> np.ndarray:
    """The Laplacian in the kernel's order of operations."""
    p = _padded(a, modes, fill)
    inner = tuple(slice(1, -1) for _ in range(a.ndim))
    s = a.dtype.type(-2 * a.ndim) * p[inner]
    for ax in range(a.ndim):
        for lo in (2, 0):
            sl = list(inner)
            sl[ax] = slice(lo, lo + a.shape[ax])
            s = s + p[tuple(sl)]
    return s


def _both(da: xr.DataArray, kernel: Any, **opts: Any) -> tuple[np.ndarray, np.ndarray]:
    a = da.stencil.map(kernel, backend="loops", **opts)
    b = da.stencil.map(kernel, backend="xla", **opts)
    assert a.dtype == b.dtype and a.dims == b.dims and a.shape == b.shape
    return np.asarray(a), np.asarray(b)


@pytest.mark.parametrize("mode", ["fill", "extend", "periodic", "reflect", "symmetric"])
@pytest.mark.parametrize("ndim", [1, 2])
def test_laplacian_every_mode_matches_numpy_and_xla(mode: str, ndim: int,
                                                     ran: list[int]) -> None:
    shape = (13, 9)[:ndim] if ndim == 2 else (17,)
    a = np.random.default_rng(ndim).random(shape, dtype=np.float32)
    da = xr.DataArray(a, dims=DIMS[-ndim:])
    opts: dict[str, Any] = {"boundary": mode}
    if mode == "fill":
        opts["fill_value"] = 0.5
    got, xla = _both(da, _lap(ndim), **opts)
    assert ran, "the loop backend did not run"
    ref = _lap_ref(a, [mode] * ndim, 0.5)
    # float32, the same operations in the same order: bitwise
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got, xla)


@pytest.mark.parametrize("modes", [("periodic", "fill", "reflect"),
                                   ("symmetric", "extend", "periodic")])
def test_3d_mixed_modes(modes: tuple[str, str, str], ran: list[int]) -> None:
    a = np.random.default_rng(3).random((6, 7, 8), dtype=np.float32)
    da = xr.DataArray(a, dims=DIMS)
    got, xla = _both(da, _lap(3), boundary=dict(zip(DIMS, modes, strict=True)),
                     fill_value=-1.0)
    assert ran
    np.testing.assert_array_equal(got, _lap_ref(a, list(modes), -1.0))
    # XLA's linear-weight lowering may regroup the 7-term sum: ulp-level apart
    np.testing.assert_allclose(got, xla, rtol=0, atol=4 * np.finfo(np.float32).eps * 8)


def test_wide_window_and_pads_beyond_the_array(ran: list[int]) -> None:
    """A 7-wide window over 4 cells: the halo wraps/mirrors more than once."""
    a = np.arange(4, dtype=np.float64).reshape(4) + 1.5
    da = xr.DataArray(a, dims="x")
    w = np.array([1.0, -2.0, 3.0, 0.5, 4.0, -1.0, 2.0])
    for mode in ("periodic", "symmetric", "reflect", "extend", "fill"):
        got, xla = _both(da, lambda u: (u * w).sum(), window={"x": 7}, boundary=mode,
                         fill_value=0.0)
        p = _padded(a, [mode], 0.0, width=3)
        ref = np.array([(p[i:i + 7] * w).sum() for i in range(4)])
        np.testing.assert_allclose(got, ref, rtol=1e-12)
        np.testing.assert_allclose(got, xla, rtol=1e-12)
    assert len(ran) == 5


def test_stride_valid_and_asymmetric_window(ran: list[int]) -> None:
    a = np.random.default_rng(4).random((11, 10), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    k = lambda u: u(x=2) - u(y=-1) * u()  # noqa: E731
    win = {"x": (0, 2), "y": (1, 0)}
    for opts in ({"boundary": "valid", "window": win},
                 {"boundary": "periodic", "stride": {"x": 3, "y": 2}},
                 {"boundary": "extend", "window": win}):
        got, xla = _both(da, k, **opts)
        # XLA:CPU contracts ``a - b * c`` into a fused multiply-add; the loops
        # round each operation, as numpy does (values < 1: 2 ulp of 1)
        np.testing.assert_allclose(got, xla, rtol=0, atol=2 * np.finfo(np.float32).eps)
    # valid: the output shrinks to the windows inside the array
    v = da.stencil.map(k, backend="loops", boundary="valid", window=win)
    np.testing.assert_array_equal(np.asarray(v), a[1:, 2:] - a[:-1, :-2] * a[1:, :-2])
    assert len(ran) == 4


def test_dtype_rules_on_the_loop_path(ran: list[int]) -> None:
    img = xr.DataArray(np.full((5, 6), 255, np.uint8), dims=("y", "x"))
    s = img.stencil.map(lambda u: u.sum(), window={"y": 3, "x": 3}, boundary="reflect",
                        backend="loops")
    s_xla = img.stencil.map(lambda u: u.sum(), window={"y": 3, "x": 3}, boundary="reflect",
                            backend="xla")
    assert s.dtype == s_xla.dtype and s.dtype.kind == "u" and s.dtype.itemsize >= 4
    assert int(s[2, 2]) == 9 * 255  # widened, not wrapped
    land = xr.DataArray(np.array([[1, 0, 1], [0, 1, 0], [0, 0, 0]], bool), dims=("y", "x"))
    n = land.stencil.map(lambda u: u.sum(), window={"y": 3, "x": 3}, boundary="fill",
                         fill_value=False, backend="loops")
    assert n.dtype == np.int32
    np.testing.assert_array_equal(n.values[0], [2, 3, 2])
    # uint8 arithmetic inside the kernel wraps, as in numpy and JAX
    small = xr.DataArray(np.array([250, 3, 9], np.uint8), dims="x")
    w = small.stencil.map(lambda u: u(x=1) - u(), boundary="periodic", backend="loops")
    assert w.dtype == np.uint8
    np.testing.assert_array_equal(w.values, np.array([3, 9, 250], np.uint8)
                                  - np.array([250, 3, 9], np.uint8))
    # float64 stays float64 with JAX's x64 flag off (on the host, as on the XLA path)
    f = xr.DataArray(np.linspace(0, 1, 7) + 1e-12, dims="x")
    out = f.stencil.map(lambda u: u(x=1) - u(), boundary="extend", backend="loops")
    assert out.dtype == np.float64 and isinstance(out.data, np.ndarray)
    ref = np.append(np.diff(f.values), 0.0)
    np.testing.assert_array_equal(out.values, ref)
    # float32 results are JAX arrays, as on the XLA path
    out32 = f.astype(np.float32).stencil.map(lambda u: u(x=1) - u(), boundary="extend",
                                             backend="loops")
    assert isinstance(out32.data, jax.Array) and out32.dtype == np.float32
    assert len(ran) == 5


def test_int_data_with_float_kernel_and_dtype_option(ran: list[int]) -> None:
    a = np.arange(24, dtype=np.int32).reshape(4, 6) * 7 - 30
    da = xr.DataArray(a, dims=("y", "x"))
    got, xla = _both(da, lambda u: (u(x=1).astype(jnp.float32) * 0.5
                                     + u(y=-1).astype(jnp.float32)), boundary="fill", fill_value=3)
    np.testing.assert_array_equal(got, xla)
    got, xla = _both(da, lambda u: u(x=1) * 2 + u(y=-1), boundary="periodic", dtype="int16")
    assert got.dtype == np.int16
    np.testing.assert_array_equal(got, xla)
    assert len(ran) == 2


def test_operations(ran: list[int]) -> None:
    rng = np.random.default_rng(5)
    a = (rng.random((9, 8), dtype=np.float32) - 0.3) * 4
    a[2, 3] = np.nan
    da = xr.DataArray(a, dims=("y", "x"))

    def k(u: Any) -> Any:
        c, e = u(), u(x=1)
        t = jnp.where(c > e, c ** 2, -e) + jnp.maximum(c, e) - jnp.minimum(c, 0.25)
        t = t + jnp.abs(e) ** 3 + (c * e) ** -2 + (c >= 0).astype(jnp.float32)
        t = t + jnp.sqrt(jnp.abs(c)) + jnp.exp(-jnp.abs(e)) + jnp.log1p(jnp.abs(c))
        return t + jnp.clip(e, -1, 1) / 3 + jnp.abs(c) ** e

    got, xla = _both(da, k, boundary="symmetric")
    assert ran
    assert np.array_equal(np.isnan(got), np.isnan(xla)) and np.isnan(got).any()
    # transcendental functions: numba's libm against XLA's approximations
    np.testing.assert_allclose(got, xla, rtol=2e-6, atol=1e-6)


def test_closed_over_arrays_and_arguments_are_runtime_inputs(ran: list[int]) -> None:
    a = np.random.default_rng(6).random((8, 9), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    w = np.array([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]], np.float32)

    def k(u: Any, c: Any) -> Any:
        return (u * w).sum() * c

    first = da.stencil.map(k, 2.0, window={"y": 3, "x": 3}, boundary="periodic",
                           backend="loops")
    w[1, 1] = 10.0  # same shape: no recompile, and never a stale result
    second = da.stencil.map(k, 0.5, window={"y": 3, "x": 3}, boundary="periodic",
                            backend="loops")
    p = _padded(a, ["periodic"] * 2, 0.0)
    for out, ww, c in ((first, [-4.0], 2.0), (second, [10.0], 0.5)):
        wk = np.array([[0, 1, 0], [1, ww[0], 1], [0, 1, 0]], np.float64)
        ref = sum(wk[i, j] * p[i:i + 8, j:j + 9] for i in range(3) for j in range(3)) * c
        np.testing.assert_allclose(out.values, ref, rtol=1e-5, atol=1e-5)
    assert len(ran) == 2
    # a changed global is never served stale either
    global SCALE
    SCALE = 1.0
    g1 = da.stencil.map(_scaled, boundary="extend", backend="loops")
    SCALE = 3.0
    g2 = da.stencil.map(_scaled, boundary="extend", backend="loops")
    np.testing.assert_allclose(g2.values, 3 * g1.values, rtol=1e-6)


SCALE = 1.0


def _scaled(u: Any) -> Any:
    return u(x=1) * SCALE


def test_dataset_and_coordinates(ran: list[int]) -> None:
    x = np.cumsum(np.random.default_rng(7).random(12)) + 1.0
    ds = xr.Dataset({"u": ("x", np.sin(x)), "h": (("y", "x"), np.random.default_rng(8)
                                                  .random((5, 12)))},
                    coords={"x": x, "y": np.arange(5.0)})

    def k(s: Any) -> Any:
        xc = s["u"].coord("x")
        return {"du": (s["u"](x=1) - s["u"](x=-1)) / (xc(x=1) - xc(x=-1)),
                "h": s["h"](y=1) + s["h"]()}

    a = ds.stencil.map(k, boundary="extend", new_vars="du", backend="loops")
    b = ds.stencil.map(k, boundary="extend", new_vars="du", backend="xla")
    assert ran
    for v in ("du", "h"):
        assert a[v].dims == b[v].dims and a[v].dtype == b[v].dtype
        np.testing.assert_allclose(a[v].values, b[v].values, rtol=1e-12)
    xp = np.concatenate([[x[0]], x, [x[-1]]])
    up = np.sin(xp)
    ref = (up[2:] - up[:-2]) / (xp[2:] - xp[:-2])
    ref[0] = (up[2] - up[0]) / (xp[2] - xp[0]) if xp[2] != xp[0] else ref[0]
    np.testing.assert_allclose(a["du"].values[1:-1], ref[1:-1], rtol=1e-12)


def test_repeat_calls_take_the_fast_path_with_new_data(ran: list[int]) -> None:
    rng = np.random.default_rng(9)
    k = _lap(2)
    for _ in range(3):
        a = rng.random((6, 5), dtype=np.float32)
        out = xr.DataArray(a, dims=("y", "x")).stencil.map(k, boundary="periodic",
                                                           backend="loops")
        np.testing.assert_array_equal(out.values, _lap_ref(a, ["periodic"] * 2, 0.0))
    assert len(ran) == 3


def test_fallbacks_give_the_xla_result(ran: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    a = np.random.default_rng(10).random((7, 6), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    ref = da.stencil.map(_lap(2), boundary="reflect", backend="xla").values

    # inside jit and grad (tracers)
    @jax.jit
    def f(x: Any) -> Any:
        return xr.DataArray(x, dims=("y", "x")).stencil.map(_lap(2), boundary="reflect",
                                                           backend="loops").data

    np.testing.assert_allclose(np.asarray(f(a)), ref, rtol=1e-6)
    g = jax.grad(lambda x: f(x).sum())(a)
    assert g.shape == a.shape
    # JAX array data of a dtype the loops do not take (on the CPU, float32 JAX data
    # runs the loops: test_loops_jax_input.py)
    bf = xr.DataArray(jnp.asarray(a, jnp.bfloat16), dims=("y", "x"))
    out = bf.stencil.map(_lap(2), boundary="reflect", backend="loops")
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out.values, np.float32), np.asarray(
        bf.stencil.map(_lap(2), boundary="reflect", backend="xla").values, np.float32))
    # a kernel the loops cannot express: integer division, data-dependent indexing
    ia = xr.DataArray(np.arange(42, dtype=np.int32).reshape(7, 6) - 20, dims=("y", "x"))
    out = ia.stencil.map(lambda u: u(x=1) // 3, boundary="periodic", backend="loops")
    np.testing.assert_array_equal(out.values, np.roll(ia.values, -1, axis=1) // 3)
    table = np.arange(10.0, dtype=np.float32) * 2
    out = ia.stencil.map(lambda u: jnp.asarray(table)[jnp.clip(u(), 0, 9)],
                         boundary="periodic", backend="loops")
    np.testing.assert_array_equal(out.values, table[np.clip(ia.values, 0, 9)])
    # a kernel returning an array per point
    out = da.stencil.map(lambda u: jnp.stack([u(x=1), u()]), boundary="periodic",
                         output_dims="k", backend="loops")
    np.testing.assert_array_equal(out.values[..., 0], np.roll(a, -1, axis=1))
    # a kernel over the statement limit (numba's compile time grows with it)
    monkeypatch.setitem(L.MAX_STATEMENTS, "loops", 8)
    out = da.stencil.map(_lap(2), boundary="reflect", backend="loops")
    np.testing.assert_array_equal(out.values, ref)
    monkeypatch.setitem(L.MAX_STATEMENTS, "loops", 1000)
    assert not ran
    # backend="xla", the environment variable, and auto below its size
    da.stencil.map(_lap(2), boundary="reflect", backend="xla")
    da.stencil.map(_lap(2), boundary="reflect")
    monkeypatch.setenv(L.ENV, "xla")
    da.stencil.map(_lap(2), boundary="reflect")
    assert not ran
    monkeypatch.setenv(L.ENV, "loops")
    out = da.stencil.map(_lap(2), boundary="reflect")
    assert len(ran) == 1
    np.testing.assert_array_equal(out.values, ref)


def test_dask_data_stays_lazy(ran: list[int]) -> None:
    dask = pytest.importorskip("dask.array")
    a = np.random.default_rng(11).random((8, 8), dtype=np.float32)
    da = xr.DataArray(dask.from_array(a, chunks=4), dims=("y", "x"))
    out = da.stencil.map(_lap(2), boundary="periodic", backend="loops")
    assert isinstance(out.data, dask.Array)
    np.testing.assert_allclose(out.values, _lap_ref(a, ["periodic"] * 2, 0.0), rtol=1e-6)


def test_auto_uses_loops_from_its_size(ran: list[int]) -> None:
    side = int(np.sqrt(L.AUTO_MIN_POINTS))
    a = np.random.default_rng(12).random((side, side), dtype=np.float32)
    out = xr.DataArray(a, dims=("y", "x")).stencil.map(_lap(2), boundary="periodic")
    assert len(ran) == 1
    np.testing.assert_array_equal(out.values, _lap_ref(a, ["periodic"] * 2, 0.0))


def test_bad_backend_names_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    da = xr.DataArray(np.zeros(5, np.float32), dims="x")
    with pytest.raises(XStencilError, match=r"backend='numba' is not a backend"):
        da.stencil.map(lambda u: u(x=1), backend="numba")
    monkeypatch.setenv(L.ENV, "fast")
    with pytest.raises(XStencilError, match=r"XSTENCIL_BACKEND='fast' is not a backend"):
        da.stencil.map(lambda u: u(x=-1), boundary="periodic")


def test_layouts_nan_fill_and_constant_kernels(ran: list[int]) -> None:
    a = np.random.default_rng(13).random((6, 7)).astype(np.float32)
    k = lambda u: u(x=1) - 2 * u(y=-1)  # noqa: E731
    ro = a.copy()
    ro.setflags(write=False)
    cases = [(xr.DataArray(a.T, dims=("x", "y")), "periodic"),  # not C-contiguous
             (xr.DataArray(ro, dims=("y", "x")), "periodic"),  # read-only
             (xr.DataArray(np.asfortranarray(a), dims=("y", "x")), "reflect"),
             (xr.DataArray(a, dims=("y", "x")), "fill")]  # the default fill: NaN
    for da, mode in cases:
        got, xla = _both(da, k, boundary=mode)
        np.testing.assert_array_equal(got, xla)
    assert np.isnan(got[0]).all() and not np.isnan(got[1:, :-1]).any()
    assert len(ran) == 4
    out = xr.DataArray(a, dims=("y", "x")).stencil.map(lambda u: 1.0, window={"x": 3},
                                                       backend="loops")
    assert out.dtype == np.float32 and (out.values == 1).all()
    assert len(ran) == 5
    # empty data: XLA's path
    empty = xr.DataArray(np.zeros((0, 5), np.float32), dims=("y", "x"))
    assert empty.stencil.map(k, boundary="periodic", backend="loops").shape == (0, 5)
    assert len(ran) == 5
