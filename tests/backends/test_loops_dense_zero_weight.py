"""The zero-weight rule on the loop backend with runtime weights
(``xstencil/_backends/loop_variants.py``).

A window value times a weight of exactly 0 does not read its cell: NaN or
inf there counts as 0, as in ``scipy.ndimage.correlate``.  The loop backend
compiles an unmasked nest for calls whose runtime weights are all nonzero
and a masked one, lazily, for calls where one is 0.  These tests check the
values against ``scipy.ndimage`` and a numpy loop, which nest ran, and that
a call with a zero weight after calls with dense weights (same kernel, same
shapes: the same cache entry) never reuses the unmasked nest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import scipy.ndimage as ndi
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from tests.spies import recorded

pytest.importorskip("numba")

from xstencil._backends import loops as L  # noqa: E402 - after the numba check
from xstencil._backends import loops_mesh as LM  # noqa: E402
from xstencil._backends.loop_variants import Nest  # noqa: E402
from xstencil._engine.loopweights import Variants  # noqa: E402
from xstencil._labelled import loop_scan as LS  # noqa: E402

K = 5
SHAPE = (23, 19)  # small: interior and boundary shell both read the marked cells


@pytest.fixture
def nests(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Nest]]:
    """The compiled nest of each map call that ran as loops."""
    monkeypatch.delenv(L.ENV, raising=False)
    yield recorded(monkeypatch, L, "run_loops", lambda args, out: args[0].fn)


@pytest.fixture(params=[np.float32, np.float64], ids=["float32", "float64"])
def dtype(request: pytest.FixtureRequest) -> Any:
    if request.param == np.float64:
        request.getfixturevalue("x64")
    return request.param


def _reference(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Periodic correlation as a numpy loop over the window, in float64:
    cells under a weight of 0 are not read."""
    h = w.shape[0] // 2
    p = np.pad(a.astype(np.float64), h, mode="wrap")
    out = np.zeros(a.shape)
    for i, j in np.ndindex(w.shape):
        if w[i, j] != 0:
            out += float(w[i, j]) * p[i:i + a.shape[0], j:j + a.shape[1]]
    return out


def _check(got: xr.DataArray, a: np.ndarray, w: np.ndarray) -> None:
    ref = _reference(a, w)
    tol = 1e-5 if a.dtype == np.float32 else 1e-12
    assert got.dtype == a.dtype
    np.testing.assert_allclose(got.values, ref, rtol=tol, atol=tol)  # NaN where ref has it
    scipy = ndi.correlate(a.astype(np.float64), w.astype(np.float64), mode="wrap")
    np.testing.assert_allclose(got.values, scipy, rtol=tol, atol=tol)


def _data(dtype: Any, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(dtype)


def _weights(dtype: Any) -> np.ndarray:
    w = np.random.default_rng(1).uniform(0.5, 1.5, (K, K)).astype(dtype)
    return w * np.where(np.arange(K * K).reshape(K, K) % 2, 1, -1).astype(dtype)


def _marked(a: np.ndarray) -> np.ndarray:
    """``a`` with NaN in the interior and inf/-inf at an edge and a corner."""
    a = a.copy()
    a[11, 9], a[0, 7], a[22, 18] = np.nan, np.inf, -np.inf
    return a


def test_dense_weights_compile_and_run_only_the_unmasked_nest(
        nests: list[Nest], dtype: Any) -> None:
    a, w = _data(dtype), _weights(dtype)
    da = xr.DataArray(a, dims=("y", "x"))

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    for _ in range(2):
        got = da.stencil.map(kernel, window={"y": K, "x": K}, boundary="periodic",
                             backend="loops")
        _check(got, a, w)
    assert len(nests) == 2 and nests[0] is nests[1]
    assert nests[-1].compiled == ("plain",) and nests[-1].last == "plain"
    # non-finite data under nonzero weights: read by every output whose window holds it
    got = xr.DataArray(_marked(a), dims=("y", "x")).stencil.map(
        kernel, window={"y": K, "x": K}, boundary="periodic", backend="loops")
    assert (~np.isfinite(got.values)).sum() == 3 * K * K
    _check(got, _marked(a), w)
    assert nests[-1].compiled == ("plain",)


def test_zero_weight_after_dense_calls_ignores_nan_and_inf(
        nests: list[Nest], dtype: Any) -> None:
    a, w = _data(dtype), _weights(dtype)
    da = xr.DataArray(a, dims=("y", "x"))
    opts: dict[str, Any] = dict(window={"y": K, "x": K}, boundary="periodic", backend="loops")

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    _check(da.stencil.map(kernel, **opts), a, w)
    assert nests[-1].last == "plain"
    marked = xr.DataArray(_marked(a), dims=("y", "x"))
    w[1, 3] = 0.0  # in place: the same kernel, the same shapes, the same cache entry
    w[4, 0] = -0.0
    got = marked.stencil.map(kernel, **opts)
    assert nests[-1] is nests[0] and nests[-1].last == "masked"
    assert nests[-1].compiled == ("plain", "masked")
    _check(got, _marked(a), w)
    # each non-finite cell is skipped by the two outputs that read it with weight 0
    assert (~np.isfinite(got.values)).sum() == 3 * (K * K - 2)
    xla = marked.stencil.map(kernel, **{**opts, "backend": "xla"})
    np.testing.assert_allclose(got.values, xla.values, rtol=1e-5, atol=1e-5)
    # dense again: back to the unmasked nest, no new compile
    w[1, 3], w[4, 0] = 2.0, -3.0
    _check(marked.stencil.map(kernel, **opts), _marked(a), w)
    assert nests[-1].last == "plain" and nests[-1].compiled == ("plain", "masked")


def test_zero_weight_from_the_first_call_compiles_only_the_masked_nest(
        nests: list[Nest]) -> None:
    a = _marked(_data(np.float32, seed=3))
    w = _weights(np.float32)
    w[2, 2] = 0.0
    da = xr.DataArray(a, dims=("y", "x"))
    got = da.stencil.map(lambda u, c: (u * c).sum(), w, window={"y": K, "x": K},
                         boundary="periodic", backend="loops")
    _check(got, a, w)
    assert nests[-1].compiled == ("masked",) and nests[-1].last == "masked"


def test_weights_computed_from_arguments_are_checked_too(nests: list[Nest]) -> None:
    """A weight computed in the kernel from an argument (``c - 1``) is 0
    only at run time: the unmasked nest sees it and refuses."""
    a = _data(np.float32, seed=4)
    da = xr.DataArray(a, dims=("y", "x"))
    opts: dict[str, Any] = dict(window={"x": 3}, boundary="periodic", backend="loops")

    def kernel(u: Any, c: Any) -> Any:
        return u(x=-1) * (c - 1) + u() * c + u(x=1) * 2.0

    def ref(a: np.ndarray, c: float) -> np.ndarray:
        w = np.array([[c - 1, c, 2.0]], np.float32)
        p = np.pad(a.astype(np.float64), ((0, 0), (1, 1)), mode="wrap")
        return sum(float(w[0, j]) * p[:, j:j + a.shape[1]]
                   for j in range(3) if w[0, j] != 0)

    got = da.stencil.map(kernel, np.float32(3.0), **opts)
    np.testing.assert_allclose(got.values, ref(a, 3.0), rtol=1e-5, atol=1e-5)
    assert nests[-1].last == "plain"
    marked = a.copy()
    marked[5, 4] = np.nan
    got = xr.DataArray(marked, dims=("y", "x")).stencil.map(kernel, np.float32(1.0), **opts)
    assert nests[-1].last == "masked" and nests[-1].compiled == ("plain", "masked")
    np.testing.assert_allclose(got.values, ref(marked, 1.0), rtol=1e-5, atol=1e-5)
    assert np.isnan(got.values).sum() == 2  # the cell and its right neighbour's reader


def test_scan_on_loops_keeps_the_rule_after_dense_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop scan runs the same nests every step: dense weights, then a
    zero weight over a NaN (a new call of the same scan)."""
    monkeypatch.delenv(L.ENV, raising=False)
    ran: list[tuple[Nest, str | None]] = []
    real = LS.loop_scan_steps.run_loop

    def spy(built: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(built, *args, **kwargs)
        ran.append((built.fn, built.fn.last))
        return out

    monkeypatch.setattr(LS.loop_scan_steps, "run_loop", spy)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((9, 13)).astype(np.float32)
    u0 = xr.DataArray(a, dims=("y", "x")).expand_dims(time=[0.0])

    def kernel(u: Any, c: Any) -> Any:
        return c[0] * u(time=-1, x=-1) + c[1] * u(time=-1) + c[2] * u(time=-1, x=1)

    def ref(a: np.ndarray, c: np.ndarray, steps: int) -> np.ndarray:
        for _ in range(steps):
            p = np.pad(a, ((0, 0), (1, 1)), mode="wrap")
            a = sum((c[j] * p[:, j:j + a.shape[1]] for j in range(3) if c[j] != 0),
                    np.zeros_like(a))
        return a

    opts: dict[str, Any] = dict(steps=4, save_every="last", boundary="periodic",
                                dt=1.0, backend="loops")
    c = np.array([0.25, 0.5, 0.25], np.float32)
    got = u0.stencil.scan(kernel, "time", c, **opts)
    np.testing.assert_allclose(got.values.reshape(a.shape), ref(a, c, 4), rtol=1e-5, atol=1e-6)
    marked = a.copy()
    marked[4, 6] = np.nan
    c0 = np.array([0.0, 0.5, 0.5], np.float32)  # reads x and x+1 only: NaN spreads left
    got = xr.DataArray(marked, dims=("y", "x")).expand_dims(time=[0.0]).stencil.scan(
        kernel, "time", c0, **opts)
    want = ref(marked, c0, 4)
    assert np.isnan(want).sum() == 5
    np.testing.assert_allclose(got.values.reshape(a.shape), want, rtol=1e-5, atol=1e-6)
    assert [last for _, last in ran] == ["plain", "masked"]
    assert ran[1][0].compiled[-1] == "masked"


def test_a_zero_among_many_weights_is_found(nests: list[Nest]) -> None:
    """7 x 7 weights: the unmasked nest tests them in groups of 32; a zero
    in the second group sends the call to the masked nest."""
    k = 7
    a = _data(np.float32, seed=6)
    w = np.random.default_rng(7).uniform(0.5, 1.5, (k, k)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    opts: dict[str, Any] = dict(window={"y": k, "x": k}, boundary="periodic", backend="loops")

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    _check(da.stencil.map(kernel, **opts), a, w)
    assert nests[-1].last == "plain"
    w[5, 6] = 0.0  # weight 41 of 49
    marked = _marked(a)
    got = xr.DataArray(marked, dims=("y", "x")).stencil.map(kernel, **opts)
    assert nests[-1].last == "masked"
    _check(got, marked, w)
    assert (~np.isfinite(got.values)).sum() == 3 * (k * k - 1)


@pytest.mark.parametrize("check", ["    return True", "    raise ValueError(p0)"])
def test_a_wrong_host_guess_never_reaches_the_unmasked_nest(check: str) -> None:
    """The host check is only a guess: where it says "no zero" (or fails)
    and a weight is 0, the unmasked nest refuses and the masked one writes."""
    plain = ("def kernel(o, p0):\n    if p0[0] == 0:\n        return False\n"
             "    o[0] = 1\n    return True\n")
    masked = "def kernel(o, p0):\n    o[0] = 2\n"

    def make(source: str) -> Any:
        namespace: dict[str, Any] = {}
        exec(source, namespace)  # noqa: S102 - plain Python stand-ins for the numba nests
        return namespace["kernel"]

    nest = Nest(Variants(masked, plain, f"def check(p0):\n{check}\n", 1), make, 1)
    out = np.zeros(1)
    for weight, written, last in ((0.0, 2, "masked"), (1.0, 1, "plain"), (0.0, 2, "masked")):
        nest(out, np.array([weight]))
        assert out[0] == written and nest.last == last
    assert nest.compiled == ("plain", "masked")


def test_mesh_regions_with_runtime_weights_keep_the_rule(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Mesh nests keep the masked products: dense weights, then a zero
    weight over NaN/inf, equal to the numpy reference and to XLA."""
    monkeypatch.delenv(L.ENV, raising=False)
    ran: list[int] = []
    real = LM.run_mesh

    def spy(*args: Any, **kwargs: Any) -> Any:
        ran.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(LM, "run_mesh", spy)
    a = _marked(_data(np.float32, seed=8))
    w = _weights(np.float32)[1:4, 1:4].copy()
    da = xr.DataArray(a, dims=("y", "x"))

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    for zero in (False, True):
        if zero:
            w[0, 2] = 0.0
        outs = []
        for backend in ("loops", "xla"):
            m = da.stencil.mesh(boundary="periodic", window={"y": 3, "x": 3}, backend=backend)
            m[...] = kernel
            m[{"x": 0}] = lambda u: u() * 2.0
            outs.append(m.map().values)
        ref = _reference(a, w)
        ref[:, 0] = 2.0 * a[:, 0]
        np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(outs[1], ref, rtol=1e-5, atol=1e-5)
    assert ran == [1, 1]


@pytest.mark.parametrize("shape", [(29,), (7, 6, 9)], ids=["1d", "3d"])
def test_one_and_three_dims(nests: list[Nest], shape: tuple[int, ...]) -> None:
    """The unmasked nest's entry test and its ``return True`` in the 1-D
    and 3-D loop nests, dense weights then a zero one over a NaN."""
    rng = np.random.default_rng(len(shape))
    a = rng.standard_normal(shape).astype(np.float32)
    a[(3,) * len(shape)] = np.nan
    w = rng.uniform(0.5, 1.5, (3,) * len(shape)).astype(np.float32)
    dims = ("z", "y", "x")[-len(shape):]
    da = xr.DataArray(a, dims=dims)

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    for zero, last in ((False, "plain"), (True, "masked")):
        if zero:
            w[(0,) * len(shape)] = 0.0
        got = da.stencil.map(kernel, window=dict.fromkeys(dims, 3), boundary="reflect",
                             backend="loops")
        assert nests[-1].last == last
        ref = ndi.correlate(a.astype(np.float64), w.astype(np.float64), mode="mirror")
        np.testing.assert_allclose(got.values, ref, rtol=1e-5, atol=1e-5)
        assert np.isnan(got.values).sum() == 3 ** len(shape) - zero


def test_mesh_edge_region_reads_its_runtime_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """A boundary strip's nest takes its box as runtime values named q0, q1
    ...; the weights read from parameters must not share those names (they
    did: the strip multiplied by its own output starts)."""
    monkeypatch.delenv(L.ENV, raising=False)
    ran: list[int] = []
    real = LM.run_mesh

    def spy(*args: Any, **kwargs: Any) -> Any:
        ran.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(LM, "run_mesh", spy)
    a = _data(np.float32, seed=9)
    w = _weights(np.float32)[:3, :3].copy()
    da = xr.DataArray(a, dims=("y", "x"))
    m = da.stencil.mesh(boundary="periodic", window={"y": 3, "x": 3}, backend="loops")
    m[...] = lambda u: u()
    m[{"x": 0}] = lambda u: (u * w).sum()
    m[{"y": -1}] = lambda u, c=w[0, 0]: u(x=1) * c
    got = m.map().values
    assert ran == [1]
    ref = a.astype(np.float64)
    ref[:, 0] = _reference(a, w)[:, 0]
    ref[-1, :] = np.roll(a[-1], -1) * float(w[0, 0])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
