"""The per-call path of a repeated loop-backend map without ``out=``.

A repeated call takes its output buffer from the pool, wraps it as a JAX array
with one direct jaxlib call (``xstencil/_backends/hostwrap.py``) and builds the
result DataArray *before* the loop nest writes into that buffer
(``Staged`` in ``xstencil/_backends/loops.py``, ``run`` in
``xstencil/_labelled/fastpath.py``).  These tests check that the numbers are
still the numpy reference on every repeated call, that results stay
independent of each other and of the input, that dtype, dims, coords, attrs and
name are kept and not shared mutably with the input, and that the wrap is
``jax.device_put``'s result, sharing the buffer only where it says so.
"""

from __future__ import annotations

import gc
from typing import Any

import jax
import numpy as np
import pytest
import xarray as xr

from tests.spies import count_calls
from xstencil._backends import bufpool, hostwrap, loops

pytest.importorskip("numba")

DIMS = ("z", "y", "x")
SHAPES = {2: (512, 520), 3: (64, 64, 66)}  # pooled sizes (>= bufpool.MIN_BYTES in float32)


def _lap(ndim: int) -> Any:
    dims = DIMS[-ndim:]

    def kernel(u: Any) -> Any:
        return sum((u(**{d: s}) for d in dims for s in (1, -1)), start=-2 * ndim * u())

    return kernel


def _lap_ref(a: np.ndarray, mode: str, fill: float) -> np.ndarray:
    """The Laplacian with numpy slices, in the kernel's order of operations."""
    p = np.pad(a, 1, mode="wrap") if mode == "periodic" else np.pad(
        a, 1, mode="constant", constant_values=fill)
    inner = tuple(slice(1, -1) for _ in range(a.ndim))
    s = a.dtype.type(-2 * a.ndim) * p[inner]
    for ax in range(a.ndim):
        for lo in (2, 0):
            sl = list(inner)
            sl[ax] = slice(lo, lo + a.shape[ax])
            s = s + p[tuple(sl)]
    return s


def _opts(mode: str) -> dict[str, Any]:
    return {"boundary": "periodic"} if mode == "periodic" else {"boundary": "fill",
                                                                 "fill_value": 0.25}


def _labelled(a: np.ndarray) -> xr.DataArray:
    dims = DIMS[-a.ndim:]
    coords = {d: (d, np.linspace(0.0, 1.0, n), {"units": "m"}) for d, n in zip(dims, a.shape,
                                                                               strict=True)}
    coords["label"] = ((dims[-1],), np.arange(a.shape[-1]) * 2)
    return xr.DataArray(a, dims=dims, coords=coords, attrs={"units": "K"},
                        name="T")


@pytest.fixture
def staged(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls that took the staged path (the early result existed):
    ``stage_loops``, through ``LoopOrJit.stage`` or the repeat's ``quick``."""
    monkeypatch.delenv(loops.ENV, raising=False)
    return count_calls(monkeypatch, loops, "stage_loops")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("mode", ["fill", "periodic"])
def test_repeated_calls_hold_the_numpy_reference(mode: str, ndim: int, dtype: str,
                                                 ran: list[int], staged: list[int]) -> None:
    rng = np.random.default_rng(ndim)
    if dtype == "int32":
        arrays = [rng.integers(-1000, 1000, SHAPES[ndim]).astype(dtype) for _ in range(3)]
        opts = _opts(mode) | ({"fill_value": 3} if mode == "fill" else {})
        fill = 3
    else:
        arrays = [rng.random(SHAPES[ndim]).astype(dtype) for _ in range(3)]
        opts, fill = _opts(mode), 0.25
    originals = [a.copy() for a in arrays]
    kernel = _lap(ndim)
    kept: list[tuple[int, xr.DataArray]] = []
    for i in range(8):  # the first call compiles; the others take the fast, staged path
        a = arrays[i % 3]
        res = _labelled(a).stencil.map(kernel, backend="loops", **opts)
        assert isinstance(res.data, jax.Array)  # the documented result type
        assert res.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(np.asarray(res.data), _lap_ref(a, mode, fill))
        if i % 2 == 0:
            kept.append((i % 3, res))
        del res
        gc.collect()  # the dropped results' buffers come back and are handed out again
    assert len(ran) == 8, "the loop backend did not run"
    assert len(staged) >= 6, "repeated calls did not take the staged path"
    for i, (k, r) in enumerate(kept):  # every kept result still holds its own numbers
        np.testing.assert_array_equal(np.asarray(r.data), _lap_ref(arrays[k], mode, fill))
        for _, other in kept[i + 1:]:
            assert not np.shares_memory(np.asarray(r.data), np.asarray(other.data))
    for a, a0 in zip(arrays, originals, strict=True):
        np.testing.assert_array_equal(a, a0)  # inputs untouched
        assert not any(np.shares_memory(a, np.asarray(r.data)) for _, r in kept)


@pytest.mark.parametrize("mode", ["fill", "periodic"])
def test_metadata_is_kept_and_not_shared_mutably(mode: str, staged: list[int]) -> None:
    a = np.random.default_rng(3).random(SHAPES[2], dtype=np.float32)
    da = _labelled(a)
    before = da.copy(deep=True)
    kernel = _lap(2)
    da.stencil.map(kernel, backend="loops", **_opts(mode))  # compile
    res = da.stencil.map(kernel, backend="loops", **_opts(mode))
    assert staged, "the repeated call did not take the staged path"
    assert res.name == "T" and res.dims == da.dims
    assert res.attrs == {"units": "K"}
    xr.testing.assert_identical(res.coords.to_dataset(), da.coords.to_dataset())
    # edits of the result's metadata leave the input alone
    res.attrs["units"] = "changed"
    res.attrs["new"] = 1
    res.coords["x"].attrs["units"] = "changed"
    res.name = "other"
    res2 = res.assign_coords(label=res["label"] + 1)
    assert res2["label"][0] == 1
    xr.testing.assert_identical(da, before)
    # and so does a later call: it starts from the input's metadata again
    again = da.stencil.map(kernel, backend="loops", **_opts(mode))
    assert again.attrs == {"units": "K"} and again.name == "T"
    assert again.coords["x"].attrs == {"units": "m"}


def test_a_kernel_that_fails_hands_out_no_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """The result is built before the nest runs; when the nest raises, the
    error reaches the caller and that result is never returned."""
    monkeypatch.delenv(loops.ENV, raising=False)
    a = np.random.default_rng(4).random(SHAPES[2], dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    kernel = _lap(2)
    da.stencil.map(kernel, backend="loops", boundary="periodic")
    # type(), not isinstance(): a dead weak proxy among the objects raises ReferenceError
    built = [b for o in gc.get_objects() if type(o) is loops.LoopOrJit
             for b in o.built.values() if not isinstance(b, str) and b.field == a.shape]
    assert built

    def boom(*args: Any) -> None:
        raise RuntimeError("nest failed")

    for b in built:
        monkeypatch.setattr(b, "fn", boom)
    with pytest.raises(RuntimeError, match="nest failed"):
        da.stencil.map(kernel, backend="loops", boundary="periodic")


@pytest.mark.parametrize("dtype", ["float32", "int32", "uint8", "bool", "float16"])
def test_the_wrap_is_device_puts_result(dtype: str) -> None:
    x = bufpool.empty((700, 400), dtype)
    x[...] = (np.arange(x.size) % 97).reshape(x.shape).astype(dtype)
    w = hostwrap.Wrapper(x.shape, x.dtype)
    got, want = w(x), jax.device_put(x)
    assert type(got) is type(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.weak_type == want.weak_type
    assert got.sharding == want.sharding
    assert got.committed == want.committed
    np.testing.assert_array_equal(np.asarray(got), x)


def test_64_bit_data_without_x64_takes_device_put() -> None:
    """Without the x64 flag, device_put converts float64 (a copy): the wrap
    does the same, and ``alias`` refuses to promise sharing."""
    if jax.config.read("jax_enable_x64"):
        pytest.skip("x64 is on")
    x = bufpool.empty((600, 300), np.float64)
    x[...] = 1.5
    w = hostwrap.Wrapper(x.shape, x.dtype)
    assert w(x).dtype == jax.device_put(x).dtype
    assert w.alias(x) is None


@pytest.mark.parametrize("offset", [0, 4, 8])
def test_alias_shares_memory_or_says_it_does_not(offset: int) -> None:
    """Writes into the numpy array after ``alias`` show in its result, at
    any alignment; where jaxlib copies, ``alias`` says ``None``."""
    base = bufpool.empty((512 * 520 + 16,), np.float32)
    x = base.view(np.uint8)[offset:offset + 512 * 520 * 4].view(np.float32).reshape(512, 520)
    w = hostwrap.Wrapper(x.shape, x.dtype)
    for _ in range(2):  # the answer is measured, then looked up
        x[...] = 0
        j = w.alias(x)
        x[...] = np.arange(x.size, dtype=np.float32).reshape(x.shape)
        if j is not None:
            np.testing.assert_array_equal(np.asarray(j), x)
    if offset == 0:  # the pool's alignment: jaxlib shares it on the CPU
        assert w.alias(x) is not None


def test_a_failing_direct_call_falls_back_to_device_put(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("changed signature")

    monkeypatch.setattr(hostwrap, "_direct", broken)
    x = bufpool.empty((600, 500), np.float32)
    x[...] = 2.0
    w = hostwrap.Wrapper(x.shape, x.dtype)
    assert w.alias(x) is None  # the public way from now on, never assumed to share
    np.testing.assert_array_equal(np.asarray(w(x)), x)
    assert not w.direct
