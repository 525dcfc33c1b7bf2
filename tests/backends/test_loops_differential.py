"""Differential tests: the numba loop backend against the XLA path.

``backend="auto"`` runs numpy maps of 512 x 512 points or more as generated
loops, so every difference from XLA reaches users silently.  Each case runs
one map with ``backend="loops"`` (checked to have run as loops: the point is
to test the generator, not its fallback) and with ``backend="xla"``, the
reference, and demands the same dtype, the same NaNs, the same signs of zero
and the same values: bitwise for exact operations, within a few units in the
last place where XLA contracts ``a * b + c`` into an FMA or uses its own
``exp``/``tanh``.  Operations the generator cannot express exactly (integer
division and ``%``, shifts, ``sign``, ``round``, float16, complex) must fall
back, which the XLA result then covers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import xstencil  # noqa: F401 - registers the accessor
from tests.spies import count_calls
from xstencil._backends import loops
from xstencil._errors import XStencilError
from xstencil._labelled import loop_scan_steps

pytest.importorskip("numba")

DIMS = ("z", "y", "x")


def _da(a: np.ndarray) -> xr.DataArray:
    return xr.DataArray(a, dims=DIMS[-a.ndim:])


def _flushed(x: np.ndarray) -> np.ndarray:
    """``x`` with subnormal numbers as (signed) zeros: XLA:CPU flushes them,
    numba's loops keep them as numpy does (docs/performance.rst)."""
    tiny = np.finfo(x.dtype).tiny
    return np.where(np.abs(x) < tiny, np.copysign(np.zeros_like(x), x), x)


def assert_same(got: np.ndarray, want: np.ndarray, ulps: int = 0) -> None:
    """Equal dtype and shape; NaN where ``want`` is NaN; equal signs of zero;
    values equal, or within ``ulps`` units of the larger magnitude; subnormal
    numbers compare as zeros (XLA:CPU flushes them, the loops keep them)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.kind == "c":
        assert_same(got.real, want.real, ulps)
        assert_same(got.imag, want.imag, ulps)
        return
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, want)
        return
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    g, w = _flushed(got[~nan]), _flushed(want[~nan])
    if ulps == 0:
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))
        return
    assert (np.isinf(g) == np.isinf(w)).all() and (g[np.isinf(g)] == w[np.isinf(w)]).all()
    fin = np.isfinite(w)
    scale = np.maximum(np.abs(g[fin]), np.abs(w[fin]))
    err = np.abs(g[fin] - w[fin])
    assert (err <= ulps * np.spacing(scale)).all(), (g[fin], w[fin])


def run_both(data: np.ndarray, kernel: Callable[..., Any], ran: list[int],
             **opts: Any) -> tuple[np.ndarray, np.ndarray]:
    """The map on the loop backend (asserted to have run as loops) and on XLA."""
    n = len(ran)
    got = _da(data).stencil.map(kernel, backend="loops", **opts)
    assert len(ran) == n + 1, "the map fell back to XLA: the loops were not tested"
    want = _da(data).stencil.map(kernel, backend="xla", **opts)
    return np.asarray(got), np.asarray(want)


def run_batch(data: np.ndarray, kernels: Sequence[Callable[..., Any]], ran: list[int],
              **opts: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """Several kernels on the same data in one map (a Dataset kernel with one
    output per kernel: one numba compile), on loops and on XLA."""
    names = [f"k{i}" for i in range(len(kernels))]
    ds = xr.Dataset({n: (DIMS[-data.ndim:], data) for n in names})

    def kernel(s: Any) -> dict[str, Any]:
        return {n: k(s["k0"]) for n, k in zip(names, kernels, strict=True)}

    n = len(ran)
    got = ds.stencil.map(kernel, backend="loops", **opts)
    assert len(ran) == n + 1, "the map fell back to XLA: the loops were not tested"
    want = ds.stencil.map(kernel, backend="xla", **opts)
    return [(np.asarray(got[n]), np.asarray(want[n])) for n in names]


def _specials(dtype: Any, shape: tuple[int, ...] = (4, 6), seed: int = 0) -> np.ndarray:
    """Random data of ``dtype`` with the edge values of the type in it."""
    dt = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        a = rng.integers(info.min, int(info.max) + 1, n, dtype=dt)
        edges = [info.min, info.max, 0, 1, info.max - 1]
    else:
        a = (rng.standard_normal(n) * 4).astype(dt)
        edges = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 2.5, -1.5, 3e9, -3e9, 300.0]
    a[:len(edges)] = edges[:n]
    return a.reshape(shape)


def _saturated(v: float, dtype: str) -> int:
    """XLA's float to integer conversion of one value (in Python integers)."""
    info = np.iinfo(dtype)
    if np.isnan(v):
        return 0
    return int(info.max) if v >= info.max else int(info.min) if v <= info.min else int(v)


INTS = ["uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOATS = ["float32", "float64"]


# float -> integer casts: XLA truncates, saturates at the type's bounds and maps
# NaN to 0; a C cast is undefined there (numba gave INT_MIN, or wrapped)
@pytest.mark.parametrize("src", FLOATS)
def test_float_to_int_casts_saturate_like_xla(src: str, ran: list[int]) -> None:
    a = _specials(src)
    a.flat[12:18] = [127.5, -128.9, 255.9, 2.0**31, 2.0**63, -(2.0**63) - 4096]
    dsts = ["int8", "uint8", "int16", "int32", "uint32", "int64", "uint64", "bool"]
    with jax.enable_x64(True):  # int64 and uint64 results
        pairs = run_batch(a, [_as(d) for d in dsts], ran, boundary="extend")
    for dst, (got, want) in zip(dsts, pairs, strict=True):
        assert_same(got, want)
        if dst != "bool":  # and XLA's rule is the one stated above
            ref = np.array([_saturated(v, dst) for v in a.ravel().tolist()], dst)
            np.testing.assert_array_equal(got.ravel(), ref)


def _as(dtype: str) -> Callable[[Any], Any]:
    return lambda u: u().astype(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_min_max_clip_clamp_nan_and_signed_zeros(dtype: str, ran: list[int]) -> None:
    a = np.array([[0.0, -0.0, np.nan, 1.0, -0.0, 0.0, 2.0, np.nan, -1.0]], dtype)
    lo, hi = np.array(-0.5, dtype), np.array(0.5, dtype)
    kernels = [lambda u: jnp.maximum(u(), u(x=1)), lambda u: jnp.minimum(u(), u(x=1)),
               lambda u: jnp.maximum(u(x=1), u()), lambda u: jnp.minimum(u(x=1), u()),
               lambda u: jnp.clip(u(), lo, hi), lambda u: jax.lax.clamp(lo, u(), hi),
               lambda u: jax.lax.clamp(u(x=1), u(), hi), lambda u: u.max(), lambda u: u.min()]
    pairs = run_batch(a, kernels, ran, window={"x": 3}, boundary="periodic")
    for got, want in pairs:
        assert_same(got, want)
    # lax.clamp propagates NaN (the loops returned the lower bound) and keeps -0.0
    got = pairs[5][0]
    assert np.isnan(got[0, 2]) and np.signbit(got[0, 1])
    # max(+0.0, -0.0) is +0.0 either way round (the loops returned the second)
    assert not np.signbit(pairs[0][0][0, 0]) and np.signbit(pairs[1][0][0, 0])


def test_a_mask_times_inf_or_nan_is_zero_as_in_xla(ran: list[int]) -> None:
    """XLA rewrites ``convert(pred) * x`` to ``select(pred, x, 0)``: where the
    mask is off the product is +0.0 even for an infinite, NaN or negative
    ``x`` (IEEE, numpy and the loops before the fix: NaN and -0.0)."""
    a = np.array([[1.0, np.inf, 6.0, np.nan, 2.0, -3.0, 7.0, -2.0]], np.float32)
    kernels = [lambda u: (u() > 5).astype(jnp.float32) * u(x=1),
               lambda u: u(x=1) * (u() > 5).astype(jnp.float32),
               lambda u: (u() > 5).astype(jnp.float32) * u(x=1) + (u() > 5).astype(jnp.float32),
               lambda u: jnp.where(u() > 5, 1.0, 0.0) * u(x=1),  # no rewrite: IEEE
               lambda u: (u() > 5).astype(jnp.float32) / u(x=1)]
    pairs = run_batch(a, kernels, ran, boundary="periodic")
    for got, want in pairs:
        assert_same(got, want)
    masked, ieee = pairs[0][0][0], pairs[3][0][0]  # off at 0 (x = inf) and 4 (x = -3)
    assert (masked[[0, 4]] == 0).all() and not np.signbit(masked[[0, 4]]).any()
    assert np.isnan(ieee[0]) and ieee[4] == 0 and np.signbit(ieee[4])


def _int_kernels() -> list[Callable[..., Any]]:
    return [lambda u: u() + u(x=1), lambda u: u() - u(x=1), lambda u: u() * u(x=1),
            lambda u: -u(), lambda u: abs(u()), lambda u: ~u(), lambda u: u() & u(x=1),
            lambda u: u() | u(y=1) ^ u(x=-1), lambda u: u() * 3 + 7, lambda u: u() - 100,
            lambda u: u() ** 3, lambda u: jnp.square(u()), lambda u: u.sum(),
            lambda u: jnp.maximum(u(), u(x=1)), lambda u: jnp.clip(u(), 2, 100),
            lambda u: jnp.where(u() > u(x=1), u(), u(y=1)),
            lambda u: u().astype(jnp.int8), lambda u: u().astype(jnp.uint8),
            lambda u: u().astype(bool), lambda u: u().astype(jnp.float32)]


@pytest.mark.parametrize("dtype", ["int8", "uint64", pytest.param("uint8", marks=pytest.mark.slow),
                                   pytest.param("int16", marks=pytest.mark.slow),
                                   pytest.param("uint16", marks=pytest.mark.slow),
                                   pytest.param("int32", marks=pytest.mark.slow),
                                   pytest.param("uint32", marks=pytest.mark.slow),
                                   pytest.param("int64", marks=pytest.mark.slow)])
def test_integer_wraparound(dtype: str, ran: list[int]) -> None:
    a = _specials(dtype)
    with jax.enable_x64(np.dtype(dtype).itemsize == 8):
        pairs = run_batch(a, _int_kernels(), ran, window={"y": 3, "x": 3}, boundary="reflect")
    for got, want in pairs:
        assert_same(got, want)
    # abs(INT_MIN) and -INT_MIN wrap to INT_MIN in XLA too
    assert pairs[4][0].flat[0] == np.iinfo(dtype).min


def test_bool_data(ran: list[int]) -> None:
    a = _specials(bool)
    kernels = [lambda u: u.sum(), lambda u: u() & u(x=1), lambda u: u() + u(x=1),
               lambda u: ~u(), lambda u: u() * u(x=1), lambda u: jnp.where(u(), 1, 2),
               lambda u: u().astype(jnp.float32) * 2.5, lambda u: u.max(),
               lambda u: u(x=1) | u(x=-1)]
    for opts in [{"boundary": "periodic"}, {"boundary": "fill", "fill_value": True}]:
        for got, want in run_batch(a, kernels, ran, window={"y": 3, "x": 3}, **opts):
            assert_same(got, want)


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_operations(dtype: str, ran: list[int]) -> None:
    a = _specials(dtype)
    exact = [lambda u: u() / (u(x=1) * 0), lambda u: jnp.floor(u()), lambda u: jnp.ceil(u()),
             lambda u: jnp.sqrt(u()), lambda u: abs(u()), lambda u: -u(),
             lambda u: jnp.where(u() > 0, u(x=1), u(x=-1)), lambda u: jnp.isfinite(u()),
             lambda u: u() ** 2, lambda u: u() ** -2, lambda u: (u() > u(x=1)) & (u() < 1),
             lambda u: u() * 2 + 1, lambda u: u().astype(jnp.float32) + u(x=1).astype(
                 jnp.float32), lambda u: jax.nn.relu(u())]
    # XLA's own exp, tanh, log ...: a few units in the last place
    inexact = [lambda u: jnp.exp(u()), lambda u: jnp.tanh(u()), lambda u: jnp.log(u()),
               lambda u: u() ** 0.5, lambda u: u() ** u(x=1), lambda u: jax.lax.rsqrt(u()),
               lambda u: jnp.expm1(u()), lambda u: jnp.log1p(u())]
    pairs = run_batch(a, exact + inexact, ran, boundary="periodic")
    for i, (got, want) in enumerate(pairs):
        assert_same(got, want, ulps=0 if i < len(exact) else 4)


@pytest.mark.parametrize("dtype", FLOATS)
def test_inverse_trigonometry(dtype: str, ran: list[int]) -> None:
    """``atan``, ``atan2``, ``asin`` and ``acos`` (slope and aspect of a DEM,
    great-circle distances) run on the loops: numba's libm against XLA's own
    approximations, up to 5 ulp apart (measured over 300,000 values in
    float32), with the same NaNs, infinities and signed zeros; inputs
    outside [-1, 1] give NaN on both."""
    rng = np.random.default_rng(1)
    a = _specials(dtype, (48, 40))
    a[8:24] = rng.uniform(-1.1, 1.1, (16, 40)).astype(dtype)  # asin and acos's domain, edges
    a[24:26] = np.array([[1.0, -1.0, 0.0, -0.0] * 10] * 2, dtype)
    kernels = [lambda u: jnp.arctan(u()), lambda u: jnp.arctan2(u(), u(x=1)),
               lambda u: jnp.arctan2(u(y=1), u()), lambda u: jnp.arcsin(u()),
               lambda u: jnp.arccos(u())]
    with np.errstate(invalid="ignore"):
        pairs = run_batch(a, kernels, ran, boundary="periodic")
    for got, want in pairs:
        assert_same(got, want, ulps=6)


def test_weak_scalars_and_mixed_dtypes(ran: list[int]) -> None:
    """Python scalars take the data's dtype; int data times a float32 scalar
    gives float32 (not float64), under JAX's standard promotion."""
    f32 = np.float32(1.25)
    cases = {"int8": ([lambda u: u() * 2.5, lambda u: u() / 7,
                       lambda u: jnp.where(u() > 0.5, 1.5, u())], "float32"),
             "uint8": ([lambda u: u() + 300, lambda u: u() - 1000], "uint8"),
             "uint16": ([lambda u: u() * f32], "float32"),
             "float32": ([lambda u: u() * np.float64(1.1)], "float32")}
    with jax.numpy_dtype_promotion("standard"):
        for dtype, (kernels, result) in cases.items():
            for got, want in run_batch(_specials(dtype), kernels, ran, boundary="periodic"):
                assert got.dtype == result
                assert_same(got, want, ulps=1)  # XLA divides by 7 as a product


@pytest.mark.parametrize("dtype", ["float16", "complex64"])
def test_unsupported_data_falls_back(dtype: str, ran: list[int]) -> None:
    a = np.random.default_rng(4).standard_normal((4, 6)).astype(dtype)
    a.flat[:3] = [np.nan, np.inf, -0.0]
    got = _da(a).stencil.map(lambda u: u(x=1) - u(), backend="loops", boundary="periodic")
    want = _da(a).stencil.map(lambda u: u(x=1) - u(), backend="xla", boundary="periodic")
    assert not ran
    assert_same(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("kernel", [lambda u: u() // u(x=1), lambda u: u() % u(x=1),
                                    lambda u: u() % 3, lambda u: u() << 9,
                                    lambda u: u() >> u(x=1), lambda u: jnp.sign(u()),
                                    lambda u: jnp.power(u(), u(x=1) % 5)])
def test_c_semantics_operations_fall_back(kernel: Any, ran: list[int]) -> None:
    """Integer ``//``, ``%``, shifts and integer ``pow`` have Python (floor)
    semantics and defined results for a zero divisor or a shift past the
    width in XLA, not in C: the loop backend leaves them to XLA."""
    a = _specials("int32")
    got = _da(a).stencil.map(kernel, backend="loops", boundary="periodic")
    want = _da(a).stencil.map(kernel, backend="xla", boundary="periodic")
    assert not ran
    assert_same(np.asarray(got), np.asarray(want))


def _asym(u: Any) -> Any:
    return u(x=2) - u(x=-1) + u(y=1) - u(y=-2) + u(x=1, y=1) - u(x=1, y=1)


@pytest.mark.parametrize("shape", [(1, 9), (7, 5), *(pytest.param(s, marks=pytest.mark.slow)
                                                     for s in [(9, 1), (2, 2), (1, 1)])])
@pytest.mark.parametrize("mode", ["fill", "periodic", "extend", "symmetric", "reflect",
                                  "valid"])
def test_boundaries_on_odd_shapes(shape: tuple[int, int], mode: str, ran: list[int]) -> None:
    a = _specials("float32", shape, seed=3)
    a[np.isinf(a) | (np.abs(a) > 1e6)] = 1.0
    small = min(shape) < 2 if mode == "reflect" else min(shape) < 4 if mode == "valid" else False
    if small:  # both paths refuse, with the same error
        with pytest.raises(XStencilError, match="needs at least|nothing is left"):
            _da(a).stencil.map(_asym, backend="loops", boundary=mode)
        with pytest.raises(XStencilError, match="needs at least|nothing is left"):
            _da(a).stencil.map(_asym, backend="xla", boundary=mode)
        return
    got, want = run_both(a, _asym, ran, boundary=mode)
    assert_same(got, want)


@pytest.mark.slow
def test_fill_values_windows_strides_and_dims(ran: list[int]) -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 7))
    cases: list[tuple[np.ndarray, Any, dict[str, Any]]] = [
        (a, _asym, {"boundary": "fill", "fill_value": np.nan}),
        (a, _asym, {"boundary": "fill", "fill_value": -2.5}),
        (a, _asym, {"boundary": {"x": "periodic", "y": "fill"}, "fill_value": 1.5}),
        (a, _asym, {"boundary": {"x": "valid", "y": "symmetric"}}),
        (a, _asym, {"boundary": "periodic", "stride": {"x": 2, "y": 3}}),
        (a, _asym, {"boundary": "valid", "stride": {"x": 2}}),
        (a, lambda u: u.sum(), {"window": {"y": 2, "x": 4}, "boundary": "fill",
                                "fill_value": 0.0}),
        (a[:2, :3], lambda u: u.sum(), {"window": {"y": 5, "x": 5}, "boundary": "periodic"}),
        (a[:2, :3], lambda u: u.max(), {"window": {"y": 5, "x": 5}, "boundary": "reflect"}),
        (a[:2, :3], lambda u: u.min(), {"window": {"y": 5, "x": 5}, "boundary": "symmetric"}),
        (a[0], lambda u: u(x=1) - u(x=-3), {"boundary": "reflect"}),
        (a[0], lambda u: u(x=1) - u(x=-3), {"boundary": "fill"}),
        (rng.standard_normal((3, 4, 5)), lambda u: u(z=1) - u(x=-1) + u(y=1) - u(z=-1, x=1),
         {"boundary": "symmetric"}),
    ]
    for data, k, opts in cases:
        got, want = run_both(data, k, ran, **opts)
        # XLA rounds some boundary sums in another order than the kernel's
        # (an ulp of the terms, data of order 1)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-13, equal_nan=True)
    # ... the loops keep the kernel's order: numpy in that order, bitwise
    p = np.pad(a, 2, constant_values=-2.5)

    def at(dy: int, dx: int) -> np.ndarray:
        return p[2 + dy:8 + dy, 2 + dx:9 + dx]

    ref = at(0, 2) - at(0, -1) + at(1, 0) - at(-2, 0) + at(1, 1) - at(1, 1)
    got = _da(a).stencil.map(_asym, boundary="fill", fill_value=-2.5, backend="loops")
    np.testing.assert_array_equal(got.values, ref)


@pytest.mark.slow
def test_input_layouts(ran: list[int]) -> None:
    """Fortran order, negative strides, a strided view, read-only data: the
    same result, and the input untouched."""
    a = np.random.default_rng(6).standard_normal((8, 9))
    ro = a.copy()
    ro.flags.writeable = False
    for data in [np.asfortranarray(a), a[::-1, ::-2], a[1:7:2, :], ro, a.T]:
        before = data.copy()
        got, want = run_both(data, _asym, ran, boundary="reflect")
        assert_same(got, want)
        np.testing.assert_array_equal(data, before)


def test_weighted_sums_within_an_fma(ran: list[int]) -> None:
    """XLA contracts ``a * b + c`` into FMAs: a few units in the last place."""
    a = np.random.default_rng(7).standard_normal((6, 7))
    w = np.random.default_rng(8).standard_normal((3, 3))
    for data, weights in [(a, w), (a.astype(np.float32), w.astype(np.float32))]:
        got, want = run_both(data, _weighted(weights), ran, window={"y": 3, "x": 3},
                             boundary="reflect")
        np.testing.assert_allclose(got, want, rtol=0, atol=64 * np.finfo(data.dtype).eps)


def _weighted(w: np.ndarray) -> Callable[[Any], Any]:
    return lambda u: (u * w).sum()


# --------------------------------------------------------------------------
# property test: random data (special values included) through a fixed set of
# kernels, dtypes and shapes, so that numba compiles once per combination


def _k_mix(u: Any) -> Any:
    return jnp.where(u(x=1) > u(), u(x=1) - u(y=-1), jnp.maximum(u(), u(y=1)))


def _k_cast(u: Any) -> Any:
    return u(x=-1).astype(jnp.int16) + u().astype(jnp.int16)


def _k_minmax(u: Any) -> Any:
    return jnp.minimum(u.max(), jnp.maximum(u(), u(x=1)))


@pytest.mark.slow
@settings(max_examples=12)
@given(data=st.data())
def test_property_loops_equal_xla(data: st.DataObject) -> None:
    # four combinations: four numba compiles (about 10 s each on a busy machine)
    dtype = data.draw(st.sampled_from(["float32", "int8"]))
    shape = (4, 6)
    mode = data.draw(st.sampled_from(["fill", "periodic"]))
    dt = np.dtype(dtype)
    if dt.kind == "f":
        # no subnormal inputs: XLA:CPU reads them as zeros (a comparison of two
        # can branch differently), the loops as numpy does (docs/performance.rst)
        elements = st.floats(width=8 * dt.itemsize, allow_nan=True, allow_infinity=True,
                             allow_subnormal=False)
    else:
        info = np.iinfo(dt)
        elements = st.integers(int(info.min), int(info.max))
    a = data.draw(hnp.arrays(dt, shape, elements=elements))
    fill = {"fill_value": data.draw(st.sampled_from([0, 1]))} if mode == "fill" else {}
    with pytest.MonkeyPatch.context() as mp:  # the ``ran`` fixture, per example
        calls = count_calls(mp, loops, "run_loops")
        pairs = run_batch(a, [_k_mix, _k_cast, _k_minmax], calls, window={"y": 3, "x": 3},
                          boundary=mode, **fill)
    for got, want in pairs:
        assert_same(got, want)


# --------------------------------------------------------------------------
# scans grown with steps= on the loop backend (xstencil/_labelled/loop_scan.py)


@pytest.mark.parametrize(("data", "kernel", "opts"), [
    (np.array([100, -100, 7, 1], np.int8),  # int8 wraps, step after step
     lambda u: u(time=-1, x=1) * 3 + u(time=-1), {"save_every": 1}),
    (np.array([0.0, -0.0, np.nan, 1.0, -2.0], np.float32),  # NaN and -0.0 through max
     lambda u: jnp.maximum(u(time=-1, x=1), -u(time=-1)), {"save_every": "last"}),
    (np.array([1, -1, 0, 5], np.int32),  # a saturating cast of the state, every step
     lambda u: (u(time=-1, x=1).astype(jnp.float32) * 1e10).astype(jnp.int32), {"save_every": 2}),
])
def test_loop_scans_equal_xla(data: np.ndarray, kernel: Any, opts: dict[str, Any],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    steps = count_calls(monkeypatch, loop_scan_steps, "run_loop")
    t0 = np.array(["2026-01-01"], "M8[ns]")
    u0 = xr.DataArray(data[None], dims=("time", "x"), coords={"time": t0}, name="u")
    run = dict(dim="time", steps=4, dt=np.timedelta64(90, "s"), boundary="periodic", **opts)
    got = u0.stencil.scan(kernel, backend="loops", **run)
    assert len(steps) == 1, "the scan fell back to XLA: the loops were not tested"
    want = u0.stencil.scan(kernel, backend="xla", **run)
    assert got.dims == want.dims and got.name == want.name
    np.testing.assert_array_equal(got.time.values, want.time.values)
    assert_same(np.asarray(got.data), np.asarray(want.data))
