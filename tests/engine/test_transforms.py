"""JAX transforms of wrapped functions (jit, vmap, grad), dtypes, purity,
compile caching and memory."""

from __future__ import annotations

import gc
import tracemalloc
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import xstencil
from tests import reference as ref


def data(shape: tuple[int, ...], seed: int = 0, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def lap(u: Any) -> Any:
    return u[1, 0] + u[-1, 0] + u[0, 1] + u[0, -1] - 4 * u[0, 0]


def laplacian() -> Any:
    return xstencil.kmap(kernel_size=(3, 3), padding="same", relative=True)(lap)


def mesh() -> Any:
    F = xstencil.kmap(kernel_size=(3, 3), padding="same", relative=True,
                      boundary="periodic")
    F[...] = lambda u, w: jnp.sum(u * w)
    F[0] = F[-1] = lambda u, w: u[0, 0] ** 2 * w[1, 1]
    F[:, 0] = lambda u, w: jnp.tanh(u[1, 0]) - u[0, 1] * w[0, 0]
    return F


def convection() -> Any:
    return xstencil.kscan(kernel_size=(3, 3), padding="same", relative=True)(
        lambda u, c: u[-1, 0] - c * (u[-1, 0] - u[-1, -1]) + 0.1 * jnp.sin(u[0, 0]))


# -- jit and vmap -------------------------------------------------------------------

@pytest.mark.parametrize("make", [laplacian, mesh, convection], ids=["kmap", "mesh", "kscan"])
def test_jit_of_wrapped_function(make):
    F = make()
    x = jnp.asarray(data((6, 7), seed=1))
    args = {laplacian: (), mesh: (jnp.asarray(data((3, 3), seed=2)),),
            convection: (jnp.float32(0.3),)}[make]
    eager = F(x, *args)
    np.testing.assert_allclose(jax.jit(F)(x, *args), eager, rtol=1e-6)
    # closed over, the mesh's weights are constants of the outer trace, where the
    # eager call passes them as runtime weights: a 9-weight sum of runtime weights
    # is centred on each window's centre value (dense_centre), constant ones that
    # do not cancel are not, so the two round apart by ulps of the window's scale
    np.testing.assert_allclose(jax.jit(lambda v: F(v, *args) * 2)(x), 2 * eager, rtol=1e-6,
                               atol=1e-6 * float(np.abs(np.asarray(2 * eager)).max()))


def test_vmap_over_data_and_arguments():
    f = xstencil.kmap(kernel_size=(3,), padding="same", relative=True)(
        lambda u, w, b: u[-1] * w + u[1] - b)
    xb = jnp.asarray(data((4, 9), seed=3))
    wb = jnp.arange(4.0, dtype=jnp.float32)
    out = jax.vmap(f, in_axes=(0, 0, None))(xb, wb, jnp.float32(0.5))
    for i in range(4):
        np.testing.assert_allclose(out[i], f(xb[i], wb[i], jnp.float32(0.5)), rtol=1e-6)
    out_t = jax.vmap(f, in_axes=(1, None, None), out_axes=1)(xb.T, jnp.float32(2.0),
                                                             jnp.float32(0.0))
    np.testing.assert_allclose(out_t[:, 0], f(xb[0], jnp.float32(2.0), jnp.float32(0.0)),
                               rtol=1e-6)


@pytest.mark.parametrize("make", [laplacian, mesh, convection], ids=["kmap", "mesh", "kscan"])
def test_nested_vmap(make):
    F = make()
    x = jnp.asarray(data((2, 3, 5, 6), seed=4))
    args = {laplacian: (), mesh: (jnp.asarray(data((3, 3), seed=5)),),
            convection: (jnp.float32(0.3),)}[make]
    out = jax.vmap(jax.vmap(lambda v: F(v, *args)))(x)
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(out[i, j], F(x[i, j], *args), rtol=1e-6, atol=1e-7)


# -- gradients ----------------------------------------------------------------------

def test_grad_of_laplacian_energy(x64):
    """d/dx sum(lap(x)**2) = 2 lap^T lap(x); the 5-point stencil with zero
    padding is symmetric, so the gradient is 2 lap(lap(x))."""
    F = laplacian()
    x = jnp.asarray(data((6, 7), seed=6, dtype=np.float64))
    g = jax.grad(lambda v: jnp.sum(F(v) ** 2))(x)
    np.testing.assert_allclose(g, 2 * F(F(x)), rtol=1e-12, atol=1e-12)


def test_grad_with_respect_to_weights(x64):
    """L = sum of all window sums weighted by w, so dL/dw[i, j] is the sum of
    the padded array over the cells that window cell (i, j) visits."""
    x = data((5, 6), seed=7, dtype=np.float64)
    F = xstencil.kmap(kernel_size=(3, 3), padding="same", boundary="reflect")(
        lambda u, w: jnp.sum(u * w))
    g = jax.grad(lambda w: jnp.sum(F(x, w)))(jnp.zeros((3, 3)))
    padded = ref.extend(x, [(1, 1), (1, 1)], ["reflect", "reflect"])
    expected = np.array([[padded[i:i + 5, j:j + 6].sum() for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(g, expected, rtol=1e-12)


ORDER1 = {
    "kmap": (lambda: xstencil.kmap(kernel_size=(3, 3), padding="same", boundary="symmetric")(
        lambda u, w: jnp.sum(u * w) + jnp.sin(u[1, 1]) * u[0, 2]), ((4, 5), (3, 3))),
    "kmap-fallback": (lambda: xstencil.kmap(kernel_size=(3, 3), padding="same")(
        lambda u, w: u.ravel()[jnp.argmax(u)] * w[0, 0] + u[1, 1]), ((4, 5), (3, 3))),
    "mesh": (mesh, ((4, 5), (3, 3))),
    "kscan": (lambda: xstencil.kscan(kernel_size=(3, 3), padding="same", relative=True)(
        lambda u, w: w[0, 0] * u[-1, 0] + w[1, 2] * jnp.sin(u[0, -1]) + u[0, 0] * u[1, 1]),
        ((4, 5), (3, 3))),
    "kscan-mesh": (lambda: _scan_mesh(), ((5, 4), (3, 3))),
    "sscan": (lambda: xstencil.sscan(kernel_size=(3,), offset=((1, 0),), relative=True)(
        lambda u, w: w[0] * u[-1] + jnp.cos(u[0]) * w[1]), ((7,), (2,))),
}


def _scan_mesh() -> Any:
    F = xstencil.kscan(kernel_size=(3, 3), padding="same", relative=True)
    F[1:, 1:-1] = lambda u, w: u[-1, 0] - w[0, 0] * (u[-1, 0] - u[-1, -1])
    F[:, 0] = lambda u, w: w[1, 1] * u[0, 1]
    return F


@pytest.mark.parametrize("case", list(ORDER1))
def test_check_grads_order_1(case, x64):
    make, (xshape, wshape) = ORDER1[case]
    F = make()
    x = jnp.asarray(data(xshape, seed=8, dtype=np.float64))
    w = jnp.asarray(data(wshape, seed=9, dtype=np.float64))
    check_grads(F, (x, w), order=1, modes=("fwd", "rev"))


ORDER2 = {
    "kmap": lambda: xstencil.kmap(kernel_size=(3,), padding="same", relative=True)(
        lambda u, w: w[0] * u[-1] * u[1] + jnp.sin(u[0]) * w[1]),
    "mesh": lambda: _mesh_1d(),
    "kscan": lambda: xstencil.kscan(kernel_size=(3,), padding="same", relative=True)(
        lambda u, w: w[0] * u[-1] + jnp.sin(u[0]) * u[1] * w[1]),
}


def _mesh_1d() -> Any:
    F = xstencil.kmap(kernel_size=(3,), padding="same", relative=True)
    F[1:-1] = lambda u, w: w[0] * (u[-1] - 2 * u[0] + u[1]) + u[0] ** 2
    F[0] = F[-1] = lambda u, w: jnp.tanh(u[0]) * w[1]
    return F


@pytest.mark.parametrize("case", list(ORDER2))
def test_check_grads_order_2(case, x64):
    F = ORDER2[case]()
    x = jnp.asarray(data((6,), seed=10, dtype=np.float64))
    w = jnp.asarray(data((2,), seed=11, dtype=np.float64))
    check_grads(F, (x, w), order=2, modes=("fwd", "rev"))


# -- dtypes and purity ----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["kmap", "kscan", "smap", "sscan", "mesh"])
def test_float64_numpy_input_gives_float64_with_x64_off(kind):
    assert not jax.config.read("jax_enable_x64")
    x = data((8,), seed=12, dtype=np.float64) + 1e-9  # not representable in float32
    kernel = lambda u: u[-1] * 0.5 + u[0] - u[1] * 1e-3  # noqa: E731
    opts: dict[str, Any] = {"kernel_size": (3,), "relative": True}
    if kind in ("kmap", "kscan", "mesh"):
        opts["padding"] = "same"
    if kind == "mesh":
        F = xstencil.kmap(**opts)
        F[...] = kernel
        F[0] = lambda u: u[0] + 1e-9
        out = F(x)
        expected = ref.stencil("kmap", x, regions=[(Ellipsis, kernel),
                                                   (0, lambda u: u[0] + 1e-9)], **opts)
    else:
        out = getattr(xstencil, kind)(**opts)(kernel)(x)
        expected = ref.stencil(kind, x, kernel, **opts)
    assert out.dtype == np.float64
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-14)
    assert not jax.config.read("jax_enable_x64"), "the global x64 flag must stay off"
    assert not jnp.zeros(1).dtype == np.float64


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.int64, np.bool_])
@pytest.mark.parametrize("kind", ["kmap", "kscan"])
def test_output_dtype_follows_input(kind, dtype):
    x = (np.arange(10) % 3).astype(dtype)

    def kernel(u):
        return u[0] | u[2] if dtype == np.bool_ else u[0] + u[2]

    out = getattr(xstencil, kind)(kernel_size=(3,), padding="same")(kernel)(x)
    assert out.dtype == dtype
    np.testing.assert_array_equal(
        out, ref.stencil(kind, x, kernel, kernel_size=(3,), padding="same"))


def test_kmap_keeps_the_kernels_precision_on_int_input():
    """int input, float kernel: kmap's output is float (kernex gives float;
    kmap does not write into the input)."""
    x = np.arange(1, 7, dtype=np.int32)
    with jax.numpy_dtype_promotion("standard"):
        out = xstencil.kmap(kernel_size=(3,), relative=True)(lambda u: u[0] * 0.5)(x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.0, 1.5, 2.0, 2.5])


@pytest.mark.parametrize("kind", ["kmap", "kscan", "smap", "sscan"])
def test_inputs_are_never_mutated(kind):
    x = data((5, 6), seed=13)
    w = data((3, 3), seed=14)
    x0, w0 = x.copy(), w.copy()
    opts: dict[str, Any] = {"kernel_size": (3, 3), "relative": True}
    if kind in ("kmap", "kscan"):
        opts["padding"] = "same"
    F = getattr(xstencil, kind)(**opts)
    F[...] = lambda u, w: u[-1, 0] * w[0, 0] + u[0, -1]
    F[1:3] = lambda u, w: u[0, 0] + w[1, 1]
    out = F(x, w)
    out = F(x, w)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(w, w0)
    xj = jnp.asarray(x)
    F(xj, w)
    np.testing.assert_array_equal(np.asarray(xj), x0)
    assert not np.shares_memory(np.asarray(out), x)


# -- compile caching and memory ------------------------------------------------------

@pytest.mark.parametrize("kind", ["kmap", "kscan", "mesh"])
def test_no_retrace_on_repeated_calls(kind):
    traces = []

    def kernel(u, w):
        traces.append(1)  # runs only while JAX traces
        return u[-1] * w + u[1]

    opts = {"kernel_size": (3,), "padding": "same", "relative": True}
    if kind == "mesh":
        F = xstencil.kmap(**opts)
        F[1:] = kernel
    else:
        F = getattr(xstencil, kind)(**opts)(kernel)
    x = data((8,), seed=15)
    F(x, np.float32(2.0))
    first = len(traces)
    assert first > 0
    for k in range(3):
        F(x + k, np.float32(k))           # new values, same shapes: no trace
        F(jnp.asarray(x), jnp.float32(k))
    assert len(traces) == first
    F(data((9,)), np.float32(2.0))       # a new shape traces again
    assert len(traces) > first


def test_fresh_kernels_do_not_accumulate():
    """kernex lru-caches its closures, so a kernel created per call leaks.
    Here every fresh transform and kernel is collected, and memory stays flat."""
    x = jnp.arange(8.0)

    def fresh(n: int, refs: list[Any]) -> None:
        for k in range(n):
            F = xstencil.kmap(kernel_size=(3,), padding="same", relative=True)
            kernel = lambda u, k=k: u[-1] + u[1] * k  # noqa: E731
            F[...] = kernel
            F(x).block_until_ready()
            refs.append((weakref.ref(F), weakref.ref(kernel)))

    refs: list[Any] = []
    fresh(5, refs)  # warm up JAX's own caches
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fresh(40, refs)
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert all(f() is None and k() is None for f, k in refs), "a transform or kernel leaked"
    # holding on to each transform costs ~40 kB per call; a flat cache costs ~1 kB
    assert growth / 40 < 10_000, f"{growth / 40:.0f} bytes per fresh transform"
