"""The fast path really is fused shifted slices: no gathers, no loops, and no
stack of windows (the per-position vmap that kernex compiles to)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xstencil
from tests import reference as ref
from tests.jaxprs import eqns

X = jnp.asarray(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32))
W9 = jnp.asarray(np.random.default_rng(1).standard_normal((9, 9)).astype(np.float32))


def hlo(F: Any, x: Any) -> str:
    return jax.jit(F).lower(x).as_text()


def max_rank(F: Any, x: Any) -> int:
    closed = jax.make_jaxpr(F)(x)
    return max(len(v.aval.shape) for e in eqns(closed.jaxpr) for v in e.outvars)


def fast(text: str, *, scatter: bool = False) -> None:
    ops = ["stablehlo.gather", "stablehlo.while", "stablehlo.dynamic_slice"]
    if not scatter:
        ops.append("stablehlo.scatter")
    for op in ops:
        assert op not in text, op


def laplacian(boundary: str = "fill") -> Any:
    return xstencil.kmap(kernel_size=(3, 3), padding="same", relative=True, boundary=boundary)(
        lambda u: u[1, 0] + u[-1, 0] + u[0, 1] + u[0, -1] - 4 * u[0, 0])


@pytest.mark.parametrize("boundary", ["fill", "periodic", "reflect"])
def test_laplacian_is_fused_slices(boundary, fallbacks):
    F = laplacian(boundary)
    fast(hlo(F, X))
    assert max_rank(F, X) == 2, "no window stack: every value is at most field-shaped"
    assert fallbacks == []


def test_weighted_sum_9x9_is_fused_slices(fallbacks):
    F = xstencil.kmap(kernel_size=(9, 9), padding="same")(lambda u: jnp.sum(u * W9))
    text = hlo(F, X)
    fast(text)
    assert "stablehlo.reduce" not in text, "the window sum is unrolled into adds"
    assert max_rank(F, X) == 2
    assert fallbacks == []
    expected = ref.stencil("kmap", np.asarray(X), lambda u: np.sum(u * np.asarray(W9)),
                           kernel_size=(9, 9), padding="same")
    np.testing.assert_allclose(np.asarray(F(X)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["sum_w", "max", "mean", "matvec", "where", "median"])
def test_array_style_kernels_are_fused(name, fallbacks):
    kernel = ref.array_kernels(jnp, (3, 3), np.float32)[name]
    F = xstencil.kmap(kernel_size=(3, 3), padding="same", boundary="extend")(kernel)
    fast(hlo(F, X))
    # matvec returns a vector per position: field dims plus one
    assert max_rank(F, X) == (3 if name == "matvec" else 2)
    assert fallbacks == []


def test_data_dependent_kernel_falls_back_and_agrees(fallbacks):
    F = xstencil.kmap(kernel_size=(3, 3), padding="same")(lambda u: u.ravel()[jnp.argmax(u)])
    text = hlo(F, X)
    assert fallbacks, "argmax-indexing cannot be lifted"
    assert "stablehlo.gather" in text or max_rank(F, X) > 2
    expected = ref.stencil("kmap", np.asarray(X), lambda u: u.ravel()[np.argmax(u)],
                           kernel_size=(3, 3), padding="same")
    np.testing.assert_array_equal(np.asarray(F(X)), expected)


def test_strided_map_is_fused_slices(fallbacks):
    F = xstencil.kmap(kernel_size=(3, 3), strides=(2, 2), boundary="valid")(lambda u: u.max())
    fast(hlo(F, X))
    assert max_rank(F, X) == 2
    assert fallbacks == []


def test_mesh_of_slab_regions_has_no_gather_or_loop():
    F = xstencil.kmap(kernel_size=(3, 3), padding="same", relative=True, boundary="periodic")
    F[...] = lambda u: u[1, 0] + u[-1, 0] - 2 * u[0, 0]
    F[0] = F[-1] = lambda u: u[0, 0]
    F[:, 1:-1] = lambda u: u[0, 1] * 2
    fast(hlo(F, X))
    # a stepped region is computed on its cells only and written with one
    # (sorted, unique-index) scatter
    F[:, ::2] = lambda u: u[0, -1] * 3
    fast(hlo(F, X), scatter=True)


@pytest.mark.parametrize("boundary", ["periodic", "reflect", "fill"])
def test_padding_is_virtual(boundary, monkeypatch):
    """No padded copy of the field is ever built (jnp.pad-style): the interior
    reads the array itself and only the thin boundary shell reads halo blocks.
    (The CPU lowering; off the CPU the default is the fused one, which pads:
    test_lowering_fused.py.)"""
    monkeypatch.setenv("XSTENCIL_LOWERING", "cpu")
    closed = jax.make_jaxpr(laplacian(boundary))(X)
    built = [tuple(v.aval.shape) for e in eqns(closed.jaxpr)
             if e.primitive.name in ("concatenate", "pad") for v in e.outvars]
    assert built, "the shell needs some halo blocks"
    assert all(min(shape) <= 3 for shape in built), built
