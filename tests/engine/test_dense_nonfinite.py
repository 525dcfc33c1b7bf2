"""NaN and infinity in dense window sums, on every lowering (issue 17, item 3).

A direct weighted sum ``out[j] = sum_c w[c] * x[j + c]`` over the cells of
nonzero weight (cells of weight 0 are not read) makes non-finite only the
outputs whose windows meet a non-finite term: NaN where a term is NaN
(``nan * w``, ``inf * 0``, a NaN weight) or infinities of both signs meet,
else the infinity.  An FFT alone spreads one NaN or inf over the whole field;
the FFT lowering must give the direct sum's footprint and values.

The reference is a numpy loop over the window cells (``_direct``), written
independently of the library; each lowering (``slices``, ``separable``,
``fft`` padded and circular) runs with constant weights (a program constant)
and with runtime weights (a closed-over array, an input of the program).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from jax.test_util import check_grads

import xstencil  # noqa: F401
from xstencil._engine import dense

NUMPY_MODE = {"fill": "constant", "extend": "edge", "periodic": "wrap"}


def _direct(a: np.ndarray, w: np.ndarray, mode: str, fill: float = np.nan) -> np.ndarray:
    """The direct sum, one output and one nonzero-weight cell at a time."""
    ky, kx = w.shape
    kw = {"constant_values": fill} if mode == "fill" else {}
    p = np.pad(a, ((ky // 2, ky // 2), (kx // 2, kx // 2)), mode=NUMPY_MODE[mode], **kw)
    out = np.empty(a.shape)
    cells = [(i, j) for i in range(ky) for j in range(kx) if w[i, j] != 0]
    with np.errstate(invalid="ignore", over="ignore"):
        for y in range(a.shape[0]):
            for x in range(a.shape[1]):
                s = 0.0
                for i, j in cells:
                    s = s + w[i, j] * p[y + i, x + j]
                out[y, x] = s
    return out


def _check(out: np.ndarray, ref: np.ndarray) -> None:
    """Same NaN and +-inf footprint; the finite values agree."""
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(out), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(out), np.isneginf(ref))
    ok = np.isfinite(ref)
    np.testing.assert_allclose(out[ok], ref[ok], rtol=1e-9, atol=1e-9)


def _data(seed: int, shape: tuple[int, int] = (40, 44)) -> np.ndarray:
    a = np.random.default_rng(seed).standard_normal(shape)
    a[5, 7] = np.nan  # land
    a[20, 30] = np.inf
    a[22, 33] = -np.inf  # meets the +inf in some windows: NaN there
    a[30, 10] = 0.0
    return a


def _weights(how: str, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if how == "separable":
        return np.outer(rng.random(k) + 0.1, rng.random(k) + 0.1)
    w = rng.standard_normal((k, k))
    w[w < -1.0] = 0.0  # some cells not read
    return w


def _run(a: np.ndarray, w: np.ndarray, mode: str, const: bool) -> np.ndarray:
    k = w.shape[0]
    da = xr.DataArray(a, dims=("y", "x"))
    if const:
        wc = tuple(map(tuple, w.tolist()))

        def kernel(u: Any) -> Any:  # weights built in the program: constants
            return (u * jnp.asarray(wc, u.dtype)).sum()
    else:
        def kernel(u: Any) -> Any:  # a closed-over array: a runtime input
            return (u * w).sum()
    return da.stencil.map(kernel, window={"y": k, "x": k}, boundary=mode).values


CASES = [("slices", 9), ("separable", 11), ("fft", 13)]


# runtime weights compile for 8-16 s each on 2 cores: every mode with constant weights and
# periodic with runtime ones in the fast run, the other runtime cases with the slow tests
MODES_CONST = [pytest.param("periodic", True, id="periodic-constant"),
               pytest.param("periodic", False, id="periodic-runtime"),
               pytest.param("extend", True, id="extend-constant"),
               pytest.param("extend", False, id="extend-runtime", marks=pytest.mark.slow),
               pytest.param("fill", True, id="fill-constant"),
               pytest.param("fill", False, id="fill-runtime", marks=pytest.mark.slow)]


@pytest.mark.parametrize(("mode", "const"), MODES_CONST)
@pytest.mark.parametrize(("how", "k"), CASES)
def test_nan_and_inf_data_keep_the_direct_sums_footprint(x64: None, how: str, k: int,
                                                         mode: str, const: bool) -> None:
    w = _weights(how, k, 1)
    if const:
        assert dense.choose(w) == how
    a = _data(2)
    ref = _direct(a, w, mode)
    assert np.isfinite(ref).mean() > 0.3 and np.isinf(ref).any()
    _check(_run(a, w, mode, const), ref)


@pytest.mark.parametrize("const", [True, False], ids=["constant", "runtime"])
@pytest.mark.parametrize("mode", ["periodic", "extend"])
@pytest.mark.parametrize(("how", "k"), CASES)
def test_infinite_weights_give_the_direct_sum(x64: None, how: str, k: int, mode: str,
                                              const: bool) -> None:
    """An infinite weight used to make every output NaN (its ``0 * inf``
    bias); the direct sum gives +-inf, NaN only where the infinite weight
    meets a 0, a NaN or an infinity of the other sign."""
    w = _weights(how, k, 3)
    w[1, 2] = np.inf
    w[k - 1, 0] = -np.inf
    a = _data(4)
    a[a > 2.0] = 0.0  # more zeros under the infinite weights
    ref = _direct(a, w, mode)
    assert np.isposinf(ref).any() and np.isneginf(ref).any() and np.isnan(ref).any()
    _check(_run(a, w, mode, const), ref)


@pytest.mark.parametrize("const", [True, False], ids=["constant", "runtime"])
@pytest.mark.parametrize(("how", "k"), CASES)
def test_a_nan_weight_makes_every_output_nan(x64: None, how: str, k: int,
                                             const: bool) -> None:
    w = _weights(how, k, 5)
    w[0, 0] = np.nan
    a = np.random.default_rng(6).standard_normal((20, 22))
    ref = _direct(a, w, "periodic")
    assert np.isnan(ref).all()
    assert np.isnan(_run(a, w, "periodic", const)).all()


@pytest.mark.parametrize("how", ["slices", "separable", "fft"])
def test_correlate_on_a_padded_block(x64: None, how: str) -> None:
    """The engine's correlation (every lowering, a strided 'valid'
    correlation of a padded block) against the loop."""
    rng = np.random.default_rng(7)
    w = _weights(how, 11, 8)
    p = rng.standard_normal((50, 47))
    p[10, 12], p[30, 31], p[31, 30] = np.nan, np.inf, -np.inf
    counts = (40, 37)
    out = np.asarray(jax.jit(lambda p: dense.correlate(p, w, (1, 1), counts, how))(p))
    ref = _direct(p, w, "extend")[5:45, 5:42]  # 'valid': the loop's inner outputs
    _check(out, ref)


@pytest.mark.slow
@pytest.mark.parametrize("k", [9, 13])
def test_gradients_stay_finite_next_to_nans_and_infs(x64: None, k: int) -> None:
    """Outputs a non-finite value reaches are dropped from the loss; the
    gradients with respect to the data and the (runtime) weights are finite
    and agree with jax's derivatives of the direct sum (the library's sum is
    checked by ``check_grads`` at a point without non-finite values too).
    A weight of 0 has the derivative of a read cell whose non-finite values
    read as 0 (as in the slices lowering's rule)."""
    rng = np.random.default_rng(9)
    a = _data(10)
    w0 = _weights("fft", k, 11)
    h = k // 2

    def direct(x: Any, w: Any) -> Any:  # the direct sum in jnp, periodic
        p = jnp.pad(x, h, mode="wrap")
        out = 0.0
        for i in range(k):  # every cell: on finite data a weight of 0 adds 0, and
            for j in range(k):  # its derivative is that of a cell read
                out = out + w[i, j] * p[i:i + x.shape[0], j:j + x.shape[1]]
        return out

    def library(x: Any, w: Any) -> Any:
        return xr.DataArray(x, dims=("y", "x")).stencil.map(
            lambda u: (u * w).sum(), window={"y": k, "x": k}, boundary="periodic").data

    keep = np.isfinite(_direct(a, w0, "periodic"))
    probe = rng.standard_normal(a.shape)

    def loss(f: Any) -> Any:
        def inner(x: Any, w: Any) -> Any:
            return jnp.sum(jnp.where(keep, f(x, w), 0.0) * probe)
        return inner

    xs = jnp.where(jnp.isfinite(a), a, 0.0)  # the data the finite outputs read
    g_lib = jax.grad(loss(library), argnums=(0, 1))(jnp.asarray(a), jnp.asarray(w0))
    g_ref = jax.grad(loss(direct), argnums=(0, 1))(xs, jnp.asarray(w0))
    assert all(np.isfinite(np.asarray(g)).all() for g in g_lib)
    np.testing.assert_allclose(g_lib[1], g_ref[1], rtol=1e-9, atol=1e-9)
    fin = np.isfinite(a)
    np.testing.assert_allclose(np.asarray(g_lib[0])[fin], np.asarray(g_ref[0])[fin],
                               rtol=1e-9, atol=1e-9)
    small = rng.standard_normal((12, 14))
    check_grads(lambda x, w: library(x, w), (small, w0), order=1, modes=("rev",))
