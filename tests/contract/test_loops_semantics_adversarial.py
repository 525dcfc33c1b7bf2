"""Adversarial elementwise semantics: the numba loop backend against XLA.

``backend="auto"`` runs numpy maps of 512 x 512 outputs or more as generated
numba loops, so any difference between the loops and ``backend="xla"`` is a
result that silently depends on the array's size.  Each check here runs the
same map with ``backend="loops"`` (asserted to have run as loops, not to have
fallen back) and with ``backend="xla"`` and demands the same dtype, NaNs,
infinities, signs of zero and values (bitwise, or within a few ulps for
transcendental functions), on edge values the existing differential and fuzz
tests (``tests/backends/test_loops_differential.py``, ``test_loops_fuzz.py``)
do not reach: constant powers and bases, ``fmax``/``fmin``/``nan*``
reductions, ``hypot``/``logaddexp``/``sinc``/``modf``, unsigned wrap-around,
integer to float rounding, window sorts and arg-reductions, fill values.

The ``xfail(strict=True)`` tests are defects found by this hunt (see each
``reason``): a mask times a constant weight, int64 overflow (numba's
``nsw`` arithmetic lets LLVM fold wrapped comparisons), window ``sort`` with
NaN and ``argsort`` with ties (both backends differ from ``jnp`` applied by
hand), and XLA algebraic-simplifier rewrites the loops do not mirror.

Subnormal numbers are kept out of the data: XLA:CPU flushes them and the
loops do not (documented in docs/performance.rst).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from numpy.lib.stride_tricks import sliding_window_view

import xstencil  # noqa: F401 - registers the accessor
from tests.spies import count_calls
from xstencil._backends import loops
from xstencil._errors import XStencilError

pytest.importorskip("numba")

DIMS = ("z", "y", "x")
F32 = np.float32


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """One entry per map that ran as numba loops (did not fall back)."""
    monkeypatch.delenv(loops.ENV, raising=False)
    yield count_calls(monkeypatch, loops, "run_loops")


def _da(a: np.ndarray) -> xr.DataArray:
    return xr.DataArray(a, dims=DIMS[-a.ndim:])


def _flushed(x: np.ndarray) -> np.ndarray:
    """Subnormal results as signed zeros: XLA:CPU flushes them, the loops keep
    them (docs/performance.rst)."""
    return np.where(np.abs(x) < np.finfo(x.dtype).tiny, np.copysign(np.zeros_like(x), x), x)


def assert_same(got: np.ndarray, want: np.ndarray, ulps: int = 0, what: str = "") -> None:
    """Same dtype and shape, NaNs, infinities and signs of zero; values equal or
    within ``ulps`` units in the last place of the larger magnitude (subnormal
    results compare as zeros)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (
        what, got.dtype, got.shape, want.dtype, want.shape)
    if got.dtype.kind == "f":
        got, want = _flushed(got), _flushed(want)
    if got.dtype.kind != "f":
        bad = got != want
    else:
        nan_g, nan_w = np.isnan(got), np.isnan(want)
        fin = np.isfinite(got) & np.isfinite(want)
        with np.errstate(invalid="ignore", over="ignore"):
            tol = ulps * np.spacing(np.maximum(np.abs(got), np.abs(want))) if ulps else 0
            err = np.abs(np.where(fin, got, 0) - np.where(fin, want, 0))
        close = np.where(fin, err <= tol, got == want)
        zero = (got != 0) | (np.signbit(got) == np.signbit(want))
        bad = (nan_g != nan_w) | (~nan_g & ~nan_w & ~(close & zero))
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} points differ, first at {i}: "
                             f"loops {got[i]!r}, xla {want[i]!r}")


def run_batch(data: np.ndarray, kernels: Sequence[Callable[..., Any]], ran: list[int],
              *args: Any, **opts: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """Several kernels over the same data in one Dataset map (one numba
    compile), on loops (asserted to run as loops) and on XLA."""
    names = [f"k{i}" for i in range(len(kernels))]
    ds = xr.Dataset({n: (DIMS[-data.ndim:], data) for n in names})

    def kernel(s: Any, *a: Any) -> dict[str, Any]:
        return {n: k(s["k0"], *a) for n, k in zip(names, kernels, strict=True)}

    n = len(ran)
    got = ds.stencil.map(kernel, *args, backend="loops", **opts)
    assert len(ran) == n + 1, "the map fell back to XLA: the loops were not tested"
    want = ds.stencil.map(kernel, *args, backend="xla", **opts)
    return [(np.asarray(got[n]), np.asarray(want[n])) for n in names]


def run_one(data: np.ndarray, kernel: Callable[..., Any], ran: list[int],
            **opts: Any) -> tuple[np.ndarray, np.ndarray]:
    n = len(ran)
    got = _da(data).stencil.map(kernel, backend="loops", **opts)
    assert len(ran) == n + 1, "the map fell back to XLA: the loops were not tested"
    return np.asarray(got), np.asarray(_da(data).stencil.map(kernel, backend="xla", **opts))


# float32 edge values: no subnormals (XLA flushes them), nothing whose exp or
# exp2 lands next to overflow (XLA's exp2(88.72) is 17 ulps off the libm value)
FLOAT_EDGES = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 2.5, -7.25, 3.0,
               1e30, -3e9, 1.0, -1.0, 2.0, 0.1, 40.0, -60.0, 1e-30, -1e-30, 65504.0, 7.0]


def _c(v: Any) -> np.ndarray:
    return np.asarray(v, np.float32)


FLOAT_EXACT: list[Callable[..., Any]] = [
    lambda u: u() ** _c(2.0), lambda u: u() ** _c(-1.0), lambda u: u() ** _c(0.0),
    lambda u: u() ** _c(1.0), lambda u: _c(1.0) ** u(), lambda u: _c(-2.0) ** u(),
    lambda u: u() ** 0, lambda u: u() ** -3, lambda u: u() ** 5,
    lambda u: jnp.fmax(u(), u(x=1)), lambda u: jnp.fmin(u(), u(x=1)),
    lambda u: jnp.nanmax(u.array), lambda u: jnp.nanmin(u.array), lambda u: jnp.nansum(u.array),
    lambda u: u.max(), lambda u: u.min(), lambda u: jnp.argmax(u.array),
    lambda u: jnp.argmin(u.array), lambda u: jnp.nanargmax(u.array),
    lambda u: jnp.any(u.array > _c(0)), lambda u: jnp.all(u.array != _c(0)),
    lambda u: jnp.where(u() > u(x=1), u(), u(x=-1)), lambda u: jnp.where(u() != u(), _c(1), u()),
    lambda u: jnp.clip(u(), u(x=1), u(x=-1)), lambda u: jnp.maximum(u(), _c(np.nan)),
    lambda u: jnp.trunc(u()), lambda u: jnp.modf(u())[0], lambda u: jnp.isclose(u(), u(x=1)),
    lambda u: jnp.nan_to_num(u()), lambda u: jax.nn.relu(u()),
    lambda u: jnp.heaviside(u(), _c(0.5)),
    lambda u: _c(0.0) - u(), lambda u: u() + _c(-0.0), lambda u: _c(-0.0) * u(),
    lambda u: (u() > _c(0)).astype(jnp.float32) * u(x=1) * _c(2.0),
    lambda u: ((u.array > _c(0)).astype(jnp.float32) * u.array).sum(),
    lambda u: u().astype(jnp.uint8), lambda u: u().astype(jnp.uint32), lambda u: (-u()) < (-u(x=1)),
]
FLOAT_INEXACT: list[Callable[..., Any]] = [
    lambda u: u() ** _c(0.5), lambda u: u() ** _c(-0.5), lambda u: u() ** u(x=1),
    lambda u: _c(2.0) ** u(), lambda u: jnp.hypot(u(), u(x=1)),
    lambda u: jnp.logaddexp(u(), u(x=1)),
    lambda u: jax.nn.softplus(u()), lambda u: jnp.sinc(u()), lambda u: u() / jnp.exp(u(x=1)),
    lambda u: u() / jnp.sqrt(u(x=1)), lambda u: _c(1.0) / jnp.exp(-u()), lambda u: jnp.log2(u()),
    lambda u: jnp.log10(u()), lambda u: jnp.exp(u() + u(x=1)), lambda u: jnp.log(u() * u(x=1)),
    lambda u: jnp.mean(u.array), lambda u: jnp.median(u.array),
]


def test_float32_edge_values(ran: list[int]) -> None:
    a = np.array([FLOAT_EDGES, FLOAT_EDGES[::-1], FLOAT_EDGES[7:] + FLOAT_EDGES[:7]], np.float32)
    kernels = FLOAT_EXACT + FLOAT_INEXACT
    pairs = run_batch(a, kernels, ran, window={"y": 1, "x": 3}, boundary="periodic")
    for i, (got, want) in enumerate(pairs):
        assert_same(got, want, 0 if i < len(FLOAT_EXACT) else 4, f"kernel {i}")


def _int_data(dtype: str, n: int = 24, seed: int = 0) -> np.ndarray:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    a = rng.integers(info.min, int(info.max) + 1, (3, n), dtype=dtype)
    edges = [v for v in [info.min, info.max, 0, 1, info.max - 1, info.min + 1, 127, 128, 255,
                         -1, -100] if info.min <= v <= info.max]
    a[0, :len(edges)] = edges
    a[1, ::3] = a[1, 1::3]  # ties in windows
    return a


def _int_kernels(dtype: str) -> list[Callable[..., Any]]:
    def c(v: int) -> np.ndarray:
        return np.asarray(v).astype(dtype)

    return [
        lambda u: u() - u(x=1), lambda u: u() * u(x=1) - u(y=1),
        lambda u: ~u() & u(x=1), lambda u: jnp.maximum(u() + c(1), u()), lambda u: u() + c(1) > u(),
        lambda u: (u() - u(x=1)) > c(0), lambda u: jnp.clip(u() + c(5), c(0), c(100)),
        lambda u: u.sum(), lambda u: jnp.sum(u.array, dtype=dtype), lambda u: jnp.prod(u.array),
        lambda u: jnp.cumsum(u.array)[-1], lambda u: u.max(), lambda u: jnp.argmax(u.array),
        lambda u: jnp.argmin(u.array), lambda u: jnp.sort(u.array.ravel())[2],
        lambda u: jnp.any(u.array), lambda u: jnp.bitwise_xor.reduce(u.array.ravel()),
        lambda u: u().astype(jnp.float32) * F32(0.5),
        lambda u: u().astype(jnp.float32) > u(x=1).astype(jnp.float32),
        lambda u: u().astype(jnp.uint16),
        lambda u: jnp.where(u() > u(x=1), u() - u(x=1), u(x=1) - u()),
        lambda u: jnp.abs(u() - u(x=1)), lambda u: (u() > u(x=1)).astype(jnp.int8) + (
            u() < u(y=1)).astype(jnp.int8),
    ]


@pytest.mark.parametrize("dtype", ["int8", "uint32"])
def test_integer_wraparound_and_window_reductions(dtype: str, ran: list[int]) -> None:
    a = _int_data(dtype)
    pairs = run_batch(a, _int_kernels(dtype), ran, window={"y": 3, "x": 2}, boundary="reflect")
    for i, (got, want) in enumerate(pairs):
        assert_same(got, want, what=f"{dtype} kernel {i}")


def test_int64_and_uint64_to_float_round_once(ran: list[int]) -> None:
    """A 64-bit integer to float32 rounds once (via float64 it double-rounds:
    2**54 + 2**30 + 1 would go to 2**54 instead of 2**54 + 2**31)."""
    big = [2**54 + 2**30 + 1, -(2**54 + 2**30 + 1), 2**62 + 2**38 + 1, 2**63 - 1, -(2**63),
           2**53 + 1, 2**24 + 1, 3]
    ubig = [2**63 + 2**39 + 1, 2**64 - 1, 2**63, 2**54 + 2**30 + 1, 2**53 + 1, 2**64 - 2**39 - 1,
            2**63 + 2**10 + 1, 5]
    to = [lambda u: u().astype(jnp.float32), lambda u: u().astype(jnp.float64),
          lambda u: u().astype(jnp.int32), lambda u: u().astype(jnp.uint8)]
    with jax.enable_x64(True):
        for data in (np.array([big], np.int64), np.array([ubig], np.uint64)):
            pairs = run_batch(data, to, ran, boundary="periodic")
            for i, (got, want) in enumerate(pairs):
                assert_same(got, want, what=f"{data.dtype} cast {i}")
            # and numpy's (correctly rounded) conversion
            np.testing.assert_array_equal(pairs[0][0], data.astype(np.float32))


@pytest.mark.parametrize("opts", [
    {"boundary": "fill", "fill_value": -np.inf},
    {"boundary": {"y": "symmetric", "x": "reflect"}},
    {"boundary": {"y": "extend", "x": "periodic"}},
])
def test_boundary_modes_on_an_odd_shape(opts: dict[str, Any], ran: list[int]) -> None:
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((37, 41)) * 4).astype(np.float32)
    a.flat[::97] = np.nan
    a.flat[5::89] = -np.inf
    a.flat[7::83] = -0.0
    kernels = [lambda u: jnp.where(u(x=2) > u(y=-1), u(x=-1), u(y=1) - u()),
               lambda u: jnp.fmax(u(x=2, y=1), u(x=-1, y=-1)), lambda u: u.max(),
               lambda u: jnp.argmin(u.array), lambda u: u(x=2).astype(jnp.int16)]
    pairs = run_batch(a, kernels, ran, window={"y": 3, "x": 5}, **opts)
    for i, (got, want) in enumerate(pairs):
        assert_same(got, want, what=f"kernel {i}")


def test_integer_fill_values(ran: list[int]) -> None:
    a = _int_data("int16", 12)
    for fv in (-32768, -1, 32767):
        pairs = run_batch(a, [lambda u: u(x=2) - u(y=-1), lambda u: u.min()], ran,
                          window={"y": 3, "x": 5}, boundary="fill", fill_value=fv)
        for got, want in pairs:
            assert_same(got, want, what=f"fill_value={fv}")
    u8 = _int_data("uint8", 9)
    for fv in (-1, 256, 2.5):  # both paths refuse, with the same message
        msgs = []
        for backend in ("loops", "xla"):
            with pytest.raises(XStencilError, match="cannot be stored in uint8") as info:
                _da(u8).stencil.map(lambda u: u(x=1), boundary="fill", fill_value=fv,
                                    backend=backend)
            msgs.append(str(info.value))
        assert msgs[0] == msgs[1]


@pytest.mark.parametrize("w", [np.inf, np.nan, -0.0, -2.0])
def test_mask_times_a_runtime_weight(w: float, ran: list[int]) -> None:
    """A mask times a weight passed at run time: both paths multiply (IEEE)."""
    a = np.array([[1.0, np.inf, 6.0, np.nan, 2.0, -3.0, 7.0, -2.0, 0.0, -0.0]], np.float32)
    kernels = [lambda u, w: (u() > F32(5)).astype(jnp.float32) * w, lambda u, w: w * u(x=1),
               lambda u, w: (u() > F32(5)).astype(jnp.float32) * u(x=1) * w]
    for got, want in run_batch(a, kernels, ran, jnp.float32(w), boundary="periodic"):
        assert_same(got, want, what=f"w={w}")


# --------------------------------------------------------------------------
# defects


@pytest.mark.parametrize("c", [np.inf, np.nan, -2.0])
def test_mask_times_a_constant_is_a_select(c: float, ran: list[int]) -> None:
    """XLA rewrites convert(pred) * c to select(pred, c, 0): the loops gave
    NaN (inf or NaN weight) or -0.0 (negative weight) where the mask was off."""
    a = np.array([[1.0, np.inf, 6.0, np.nan, 2.0, -3.0, 7.0, -2.0, 0.0, 8.0]], np.float32)
    w = F32(c)
    got, want = run_one(a, lambda u: (u() > F32(5)).astype(jnp.float32) * w, ran,
                        boundary="periodic")
    assert_same(got, want)


@pytest.mark.parametrize("kernel", [
    lambda u: u() + 1 > u(),
    lambda u: abs(u() - u(x=1)),
    lambda u: jnp.clip(u() + 5, 0, 100),
    lambda u: (u() - u(x=1)) > 0,
], ids=["x+1>x", "abs_diff", "clip", "diff>0"])
def test_int64_overflow_wraps(kernel: Callable[..., Any], ran: list[int]) -> None:
    """numba's signed 64-bit arithmetic is LLVM's nsw: LLVM folded u() + 1 > u()
    to True and dropped the abs of a wrapped difference (numpy's default int)."""
    a = np.array([[2**63 - 1, 5, -(2**63), 7, -3, 2**62]], np.int64)
    got, want = run_one(a, kernel, ran, boundary="periodic")
    assert_same(got, want)


def _by_hand(a: np.ndarray, fn: Callable[[Any], Any], n: int) -> np.ndarray:
    """``fn`` applied with jnp to each periodic window of ``n`` along x."""
    p = np.pad(a, ((0, 0), ((n - 1) // 2, n // 2)), mode="wrap")
    windows = sliding_window_view(p, (1, n))[:, :, 0, :]
    return np.asarray(jax.jit(fn)(jnp.asarray(windows)))


@pytest.mark.parametrize("backend", ["loops", "xla"])
def test_window_sort_puts_nan_last(backend: str) -> None:
    """The unrolled sort compared with lax.lt, so a NaN stayed where it was."""
    a = np.array([[1.0, np.nan, 0.0, -0.0, 2.0, -1.0, np.nan, 3.0, 5.0]], np.float32)
    _same_places(a, jnp.sort, 3, backend)


def _same_places(a: np.ndarray, op: Callable[..., Any], n: int, backend: str) -> None:
    """Every place of ``op`` (``jnp.sort``, ``jnp.argsort``) over a periodic
    window of ``n`` along x, mapped on ``backend``, as jnp gives it."""
    for j in range(n):
        got = np.asarray(_da(a).stencil.map(lambda u, j=j: op(u.array)[j], window={"x": n},
                                            boundary="periodic", backend=backend))
        assert_same(got, _by_hand(a, lambda w, j=j: op(w, axis=-1)[..., j], n),
                    what=f"{op.__name__}()[{j}]")


@pytest.mark.parametrize("backend", ["loops", "xla"])
def test_window_argsort_of_ties_is_stable(backend: str) -> None:
    """Batcher's network is not stable: argsort of ties gave other indices."""
    a = np.random.default_rng(0).integers(0, 3, (1, 20)).astype(np.int32)
    _same_places(a, jnp.argsort, 5, backend)


class _Rolled:
    """A periodic window over a 2-D array for eager evaluation: ``u(x=k)``
    is the whole array shifted so that each point reads its ``k``-th
    neighbour along x."""

    def __init__(self, a: np.ndarray):
        self.a = a

    def __call__(self, x: int = 0) -> Any:
        return jnp.asarray(np.roll(self.a, -x, axis=-1))


def _eager(a: np.ndarray, kernel: Callable[..., Any]) -> np.ndarray:
    """``kernel`` run eagerly, one XLA operation at a time (each rounded as
    written, as numpy rounds it: no rewrite spans two operations)."""
    with jax.disable_jit():
        return np.asarray(kernel(_Rolled(a)))


# XLA's algebraic simplifier rewrites these (not IEEE); the loops round each
# operation as written (numpy's and eager jnp's answer), so the two differ by
# far more than an ulp: finite against inf, 0.5 against 0.0, -0.0 against 0.0
_XLA_REWRITES: dict[str, Callable[..., Any]] = {
    "(x+1e20)-1e20": lambda u: (u() + F32(1e20)) + F32(-1e20),
    "log(exp(x))": lambda u: jnp.log(jnp.exp(u())),
    "sqrt(x*x)": lambda u: jnp.sqrt(u() * u()),
    "x*1e30*1e-30": lambda u: u() * F32(1e30) * F32(1e-30),
    "x+0.0": lambda u: u() + F32(0.0),
    "exp(x)*exp(y)": lambda u: jnp.exp(u()) * jnp.exp(u(x=1)),
    "(x/y)/z": lambda u: (u() / u(x=1)) / u(x=-1),
}


@pytest.mark.parametrize("name", list(_XLA_REWRITES))
def test_xla_simplifier_rewrites_are_documented(name: str, ran: list[int]) -> None:
    """The loops round each operation as written, as numpy does (the
    divergence from XLA's rewrites is documented in docs/performance.rst)."""
    a = np.array([[0.5, -0.0, 100.0, 3e38, 1e38, -2.5, 1e20, 3e9, -3e9, 1.5]], np.float32)
    got, _ = run_one(a, _XLA_REWRITES[name], ran, boundary="periodic")
    assert_same(got, _eager(a, _XLA_REWRITES[name]), 2)


@pytest.mark.parametrize("kernel", [lambda u: jnp.abs(u()) >= 0, lambda u: u() * u() >= 0],
                         ids=["abs>=0", "square>=0"])
def test_xla_integer_sign_folds_are_documented(kernel: Callable[..., Any],
                                               ran: list[int]) -> None:
    """XLA folds abs(x) >= 0 and x * x >= 0 to True on wrapping integers; the
    loops wrap, as numpy does (documented in docs/performance.rst)."""
    a = np.array([[-(2**31), 2**31 - 1, 46341, -7, 65536, 3]], np.int32)
    got, _ = run_one(a, kernel, ran, boundary="periodic")
    assert_same(got, _eager(a, kernel))


@pytest.mark.parametrize("backend", ["loops", "xla"])
def test_window_sort_with_infinities_and_several_nans(backend: str) -> None:
    """NaNs are read as +inf through the network and written back into as
    many last places: a real +inf stays before them, -inf first."""
    a = np.array([[np.inf, np.nan, -np.inf, np.nan, 2.0, np.inf, np.nan, -1.0, 0.5, np.nan,
                   np.nan, 3.0, -np.inf]], np.float32)
    _same_places(a, jnp.sort, 5, backend)
    med = np.asarray(_da(a).stencil.map(lambda u: jnp.median(u.array), window={"x": 5},
                                        boundary="periodic", backend=backend))
    assert_same(med, _by_hand(a, lambda w: jnp.median(w, axis=-1), 5), what="median")
