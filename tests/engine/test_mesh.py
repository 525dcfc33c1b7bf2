"""Function meshes (``F[index] = kernel``) against the per-cell reference: the
last region that holds a position picks its kernel (a per-cell ``lax.switch``),
and positions that no region covers keep their input value."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xstencil
from tests import reference as ref
from tests.jaxprs import eqns

A6 = np.arange(1.0, 7.0, dtype=np.float32)


def data(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# Kernels written with window methods and relative indices, so that the same
# function runs on xstencil's window and on the reference's rolled numpy array.
def k_centre(u: Any) -> Any:
    return u[0, 0] * 2


def k_up(u: Any) -> Any:
    return u[-1, 0] + 10


def k_sum(u: Any) -> Any:
    return u.sum() - 100


def k_max(u: Any) -> Any:
    return u.max() * u[1, -1]


MASK = np.array([[(i * 7 + j * 3) % 4 == 0 for j in range(6)] for i in range(5)])

SCENARIOS: dict[str, list[tuple[Any, Any]]] = {
    "row-col": [(Ellipsis, k_centre), ((slice(1, None), 0), k_up)],
    "chained-bc": [(Ellipsis, k_centre), (0, k_up), (-1, k_up)],
    "overlap-later-wins": [((slice(0, 4), slice(1, 5)), k_centre), ((slice(2, None), 3), k_up),
                           ((2, slice(None)), k_sum)],
    "uncovered-keep-input": [((slice(1, 3), slice(2, 4)), k_sum)],
    "two-regions-rest-uncovered": [(0, k_sum), ((slice(None), 5), k_max)],
    "mask": [(Ellipsis, k_centre), (MASK, k_up), ((1, slice(None)), k_sum), (~MASK, k_max)],
    "negative-indices": [(-1, k_centre), ((slice(None), -2), k_up),
                         ((slice(-3, None), slice(None, -4)), k_sum)],
    "step-slices": [((slice(None, None, 2),), k_centre),
                    ((slice(1, None, 3), slice(None, None, -2)), k_up),
                    ((slice(4, 0, -2), 1), k_sum), ((slice(None), slice(1, 6, 2)), k_max)],
    "ellipsis": [((Ellipsis, 0), k_centre), ((2, Ellipsis), k_up)],
    "whole-cover-last": [(0, k_up), ((slice(None), 1), k_sum), (Ellipsis, k_centre)],
}


def build(kind: str, regions: list[tuple[Any, Any]], **opts: Any) -> Any:
    F = getattr(xstencil, kind)(**opts)
    for index, kernel in regions:
        F[index] = kernel
    return F


@pytest.mark.parametrize("kind,boundary", [("kmap", "fill"), ("kmap", "periodic"),
                                           ("smap", "reflect")])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_mesh_matches_per_cell_switch(scenario, kind, boundary):
    x = data((5, 6), seed=1)
    opts: dict[str, Any] = {"kernel_size": (3, 3), "relative": True, "boundary": boundary}
    if kind == "kmap":
        opts["padding"] = "same"
    else:
        opts["offset"] = ((1, 0), (0, 1))
    regions = SCENARIOS[scenario]
    out = build(kind, regions, **opts)(x)
    expected = ref.stencil(kind, x, regions=regions, **opts)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6, atol=1e-6)


def test_chained_assignment():
    """F[0] = F[-1] = bc assigns both ends."""
    x = data((5, 6), seed=2)
    F = xstencil.kmap(kernel_size=(3, 3), padding="same", relative=True)
    F[...] = k_centre
    F[0] = F[-1] = k_up
    F[:, 0] = F[:, -1] = k_sum
    regions = [(Ellipsis, k_centre), (0, k_up), (-1, k_up), ((slice(None), 0), k_sum),
               ((slice(None), -1), k_sum)]
    expected = ref.stencil("kmap", x, regions=regions, kernel_size=(3, 3), padding="same",
                           relative=True)
    np.testing.assert_allclose(np.asarray(F(x)), expected, rtol=1e-6)


def test_documented_differences_from_kernex():
    """kernex's rule by default (uncovered cells get the first function, so a
    single region applies everywhere); with uncovered="input" uncovered cells
    keep their input and a single region applies only to itself; the later
    assignment wins."""
    K = xstencil.kmap(kernel_size=(3,), padding="same", relative=True)
    K[0] = lambda x: x[0] * 0 + 2.0
    np.testing.assert_array_equal(K(A6), [2, 2, 2, 2, 2, 2])
    K[1] = lambda x: x[0] * 0 + 3.0
    np.testing.assert_array_equal(K(A6), [2, 3, 2, 2, 2, 2])
    F = xstencil.kmap(kernel_size=(3,), padding="same", relative=True, uncovered="input")
    F[0] = lambda x: x[0] * 0 + 2.0
    np.testing.assert_array_equal(F(A6), [2, 2, 3, 4, 5, 6])
    F[1] = lambda x: x[0] * 0 + 3.0
    np.testing.assert_array_equal(F(A6), [2, 3, 3, 4, 5, 6])
    G = xstencil.kmap(kernel_size=(3,), padding="same", relative=True)
    G[:] = lambda x: x[0]
    G[1:4] = lambda x: x[0] * 10
    G[2] = lambda x: x[0] * 100
    np.testing.assert_array_equal(G(A6), [1, 20, 300, 40, 5, 6])
    # the same function re-assigned later still wins (kernex groups by function)
    f, g = (lambda x: x[0]), (lambda x: x[0] * 10)
    H = xstencil.kmap(kernel_size=(3,), padding="same", relative=True)
    H[:], H[1:], H[2] = f, g, f
    np.testing.assert_array_equal(H(A6), [1, 20, 3, 40, 50, 60])


@pytest.mark.parametrize("padding,strides", [("valid", 1), ("same", 2), (((2, 0),), 3)])
def test_regions_index_the_output_grid(padding, strides):
    """Indices are output positions; an uncovered output keeps the centre of
    its window (an input cell, or a halo cell under padding)."""
    x = np.arange(1.0, 11.0, dtype=np.float32)
    opts = {"kernel_size": (3,), "padding": padding, "strides": strides, "relative": True}
    regions = [(1, lambda u: u[-1] * 100), (slice(-1, None), lambda u: u[1] * 1000)]
    out = build("kmap", regions, **opts)(x)
    np.testing.assert_array_equal(out, ref.stencil("kmap", x, regions=regions, **opts))


def test_mesh_is_reusable_and_reassignable():
    x = data((4, 5), seed=3)
    F = xstencil.kmap(kernel_size=(3, 3), padding="same", relative=True)
    F[...] = k_centre
    F[1:3, 1:3] = k_up
    first = np.asarray(F(x))
    np.testing.assert_array_equal(F(x), first)  # kernex meshes are single-use
    np.testing.assert_array_equal(F(x + 1), np.asarray(F(x + 1)))
    F[0] = k_sum
    regions = [(Ellipsis, k_centre), ((slice(1, 3), slice(1, 3)), k_up), (0, k_sum)]
    expected = ref.stencil("kmap", x, regions=regions, kernel_size=(3, 3), padding="same",
                           relative=True)
    np.testing.assert_allclose(np.asarray(F(x)), expected, rtol=1e-6)
    assert not np.allclose(first, expected)


def test_mesh_forwards_arguments_to_every_region():
    x = data((7,), seed=4)
    F = xstencil.kmap(kernel_size=(3,), padding="same", relative=True)
    F[...] = lambda u, w, c=0.0: u[-1] * w[0] + c
    F[::3] = lambda u, w, c=0.0: u[1] * w[1] - c
    w = np.asarray([2.0, -3.0], np.float32)
    out = F(x, w, c=0.5)
    regions = [(Ellipsis, lambda u: u[-1] * w[0] + 0.5),
               (slice(None, None, 3), lambda u: u[1] * w[1] - 0.5)]
    expected = ref.stencil("kmap", x, regions=regions, kernel_size=(3,), padding="same",
                           relative=True)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)


def test_jax_boolean_mask_region():
    x = data((5, 6), seed=5)
    F = xstencil.kmap(kernel_size=(3, 3), padding="same", relative=True)
    F[...] = k_centre
    F[jnp.asarray(MASK)] = k_sum
    expected = ref.stencil("kmap", x, regions=[(Ellipsis, k_centre), (MASK, k_sum)],
                           kernel_size=(3, 3), padding="same", relative=True)
    np.testing.assert_allclose(np.asarray(F(x)), expected, rtol=1e-6)


# -- cost: a strip region is computed only on its slab --------------------------------

def _shapes_of(fn: Any, x: Any, primitive: str) -> list[tuple[int, ...]]:
    closed = jax.make_jaxpr(fn)(x)
    return [tuple(v.aval.shape) for e in eqns(closed.jaxpr) if e.primitive.name == primitive
            for v in e.outvars]


def test_strip_region_is_evaluated_only_on_its_slab():
    """Each kernel carries a marker primitive; the strips' markers act on
    arrays no bigger than the strip, never on the whole (12, 10) field."""
    x = jnp.ones((12, 10), jnp.float32)
    F = xstencil.kmap(kernel_size=(3, 3), padding="same", relative=True)
    F[...] = lambda u: jnp.sin(u[0, 0]) + u[1, 0] + u[0, -1]
    F[0] = lambda u: jnp.cos(u[0, 0]) + u[0, 1]             # top row
    F[:, -1] = lambda u: jnp.tanh(u[0, 0]) + u[1, 0]         # right column
    F[3, 4] = lambda u: jnp.exp(u[0, 0]) + u[1, 1]           # one cell

    sin, cos = _shapes_of(F, x, "sin"), _shapes_of(F, x, "cos")
    tanh, exp = _shapes_of(F, x, "tanh"), _shapes_of(F, x, "exp")
    assert sin and cos and tanh and exp
    assert sum(int(np.prod(s)) for s in sin) == 12 * 10   # the base covers the field once
    assert all(s[0] == 1 and s[1] <= 10 for s in cos), cos
    assert sum(int(np.prod(s)) for s in cos) == 10
    assert all(s[1] == 1 and s[0] <= 12 for s in tanh), tanh
    assert sum(int(np.prod(s)) for s in tanh) == 12
    assert exp == [(1, 1)]
    expected = ref.stencil(
        "kmap", np.asarray(x), kernel_size=(3, 3), padding="same", relative=True,
        regions=[(Ellipsis, lambda u: np.sin(u[0, 0]) + u[1, 0] + u[0, -1]),
                 (0, lambda u: np.cos(u[0, 0]) + u[0, 1]),
                 ((slice(None), -1), lambda u: np.tanh(u[0, 0]) + u[1, 0]),
                 ((3, 4), lambda u: np.exp(u[0, 0]) + u[1, 1])])
    np.testing.assert_allclose(np.asarray(F(x)), expected, rtol=1e-6)


def test_stepped_strip_is_evaluated_only_on_its_cells():
    x = jnp.ones((9, 8), jnp.float32)
    F = xstencil.kmap(kernel_size=(3, 3), padding="same", relative=True)
    F[...] = lambda u: u[0, 0] + u[1, 1]
    F[1::3, ::2] = lambda u: jnp.cos(u[0, 0]) + u[-1, 1]
    cos = _shapes_of(F, x, "cos")
    assert sum(int(np.prod(s)) for s in cos) == 3 * 4, cos


def test_mask_region_is_merged_with_select():
    x = jnp.ones((5, 6), jnp.float32)
    F = xstencil.kmap(kernel_size=(3, 3), padding="same", relative=True)
    F[...] = lambda u: u[0, 0] + u[1, 0]
    F[MASK] = lambda u: jnp.cos(u[0, 0])
    selects = _shapes_of(F, x, "select_n")
    assert (5, 6) in selects
