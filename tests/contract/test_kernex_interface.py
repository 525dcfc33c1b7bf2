"""kernex 0.2.1's public-interface scenarios (its ``tests/test_interface.py``),
re-run with ``import xstencil as kernex``.

Each scenario checks xstencil against an independent reference (a numpy
finite-difference loop, ``lax.conv_general_dilated`` or values worked out by
hand from kernex's mesh rule), and, where the installed kernex runs, against
kernex itself.  kernex's ``pmap`` map kind needs one device per position, so
kernex is only run with ``vmap``/``lmap`` here; xstencil accepts every kind.

The mesh rule is kernex's: positions no region covers get the first
registered function.  ``uncovered="input"`` opts in to the labelled API's
rule (uncovered positions keep their input); it is tested at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xstencil as kernex

try:
    import kernex as real_kernex
except ImportError:  # pragma: no cover - kernex is in the test group
    real_kernex = None

MAP_KINDS = ["vmap", "lmap", "pmap"]


def against_kernex(build: Callable[[Any], Any], ours: np.ndarray, *, atol: float = 0.0) -> None:
    """Build the same transform with real kernex (a fresh, single-use mesh)
    and compare its output with ``ours``."""
    if real_kernex is None:  # pragma: no cover
        pytest.skip("kernex is not installed")
    theirs = np.asarray(build(real_kernex))
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=atol)


# -- heat equation with sscan (kernex: test_Diffusion2D) ------------------------------

def diffusion_loop(u0: np.ndarray, steps: int, nu: float, dt: float, dx: float,
                   dy: float) -> np.ndarray:
    """Explicit 2-D diffusion, boundary rows/cols fixed, plain numpy."""
    u = u0.astype(np.float64).copy()
    for _ in range(steps):
        old = u.copy()
        for i in range(1, u.shape[0] - 1):
            for j in range(1, u.shape[1] - 1):
                u[i, j] = (old[i, j]
                           + nu * dt / dy**2 * (old[i + 1, j] - 2 * old[i, j] + old[i - 1, j])
                           + nu * dt / dx**2 * (old[i, j + 1] - 2 * old[i, j] + old[i, j - 1]))
    return u


def make_diffusion(lib: Any) -> Callable[..., Any]:
    @jax.jit
    @lib.sscan(kernel_size=(3, 3, 3), offset=((1, 0), (1, 1), (1, 1)),
               named_axis={0: "n", 1: "i", 2: "j"}, relative=True)
    def step(T: Any, nu: float, dt: float, dx: float, dy: float) -> Any:
        c = T["n-1", "i", "j"]
        return (c + nu * dt / dy**2 * (T["n-1", "i+1", "j"] - 2 * c + T["n-1", "i-1", "j"])
                + nu * dt / dx**2 * (T["n-1", "i", "j+1"] - 2 * c + T["n-1", "i", "j-1"]))

    return step


def test_diffusion_2d_with_sscan():
    nx = ny = 10
    nt, nu = 5, 1.0
    dx, dy = 2 / (nx - 1), 2 / (ny - 1)
    dt = 0.25 * dx * dy / nu
    u0 = np.ones((ny, nx))
    u0[2:5, 2:5] = 2.0  # the hat: 0.5 <= x, y <= 1
    U = jnp.ones((nt + 3, ny, nx)).at[0].set(u0)
    out = np.asarray(make_diffusion(kernex)(U, nu, dt, dx, dy))
    # sscan computes slices 1 .. nt+1 in order; slice k is k diffusion steps
    for k in range(nt + 2):
        np.testing.assert_allclose(out[k], diffusion_loop(u0, k, nu, dt, dx, dy), atol=1e-5)
    against_kernex(lambda lib: make_diffusion(lib)(U, nu, dt, dx, dy), out, atol=1e-6)


# -- 1-D linear convection with meshes (kernex: test_linear_convection) ---------------

NT, NX, C = 151, 51, 0.5
DT, DX = 0.5 / (NT - 1), 2.0 / (NX - 1)


def convection_fdm() -> np.ndarray:
    """Upwind linear convection, time along axis 0, both ends held at 1."""
    u = np.ones((NT, NX))
    u[0, NX // 4 + 1: NX // 2] = 2.0  # 12.5 < i < 25
    for n in range(NT - 1):
        u[n + 1, 1:-1] = u[n, 1:-1] - C * DT / DX * (u[n, 1:-1] - u[n, :-2])
    return u


def convection_input() -> Any:
    u = np.ones((NT, NX))
    u[0, NX // 4 + 1: NX // 2] = 2.0
    return jnp.asarray(u)


def upwind(u: Any) -> Any:
    return u["i", "n-1"] - (C * DT / DX) * (u["i", "n-1"] - u["i-1", "n-1"])


def convection_sscan(lib: Any) -> Any:
    F = lib.sscan(kernel_size=(3, 3), named_axis={0: "n", 1: "i"}, relative=True)
    F[:] = lambda u: u["i", "n"]
    F[1:, 1:-1] = upwind
    return F(convection_input())


def convection_kscan(lib: Any) -> Any:
    F = lib.kscan(kernel_size=(3, 3), padding=((1, 1), (1, 1)),
                  named_axis={0: "n", 1: "i"}, relative=True)
    F[:, 0] = F[:, -1] = lambda u: 1.0
    F[0:1, NX // 4 + 1: NX // 2] = lambda u: 2.0
    F[:, : NX // 4 + 1] = F[:, NX // 2:] = lambda u: 1.0
    F[1:, 1:-1] = upwind
    assert "kscan" in repr(F)
    return F(convection_input())


@pytest.mark.parametrize("build", [convection_sscan, convection_kscan])
def test_linear_convection(build):
    out = np.asarray(build(kernex))
    np.testing.assert_allclose(out, convection_fdm(), atol=1e-3)
    against_kernex(build, out, atol=1e-5)


# -- the mesh rule (kernex: test_mesh) -----------------------------------------------

def mesh_1d(lib: Any, map_kind: str) -> Any:
    M = lib.kmap(kernel_size=(1,), relative=True, padding="same", map_kind=map_kind)
    M[0] = lambda x: x[0] * 10
    M[1] = lambda x: x[0] * -10
    M[2:] = lambda x: x[0] * 100
    return M(jnp.arange(1, 11))


def mesh_2d(lib: Any, uncovered: str | None = None) -> Any:
    extra = {} if uncovered is None else {"uncovered": uncovered}
    M = lib.kmap(kernel_size=(3, 3), relative=True, padding="same", **extra)
    M[0, 0] = lambda x: x[0, 0] * 10
    M[1, 1:] = lambda x: x[0, 0] * -10
    M[2:] = lambda x: x[0, 0] * 100
    return M(jnp.arange(1, 26).reshape(5, 5))


@pytest.mark.parametrize("map_kind", MAP_KINDS)
def test_mesh_1d_every_cell_covered(map_kind):
    x = np.arange(1, 11)
    want = np.concatenate([[10 * x[0], -10 * x[1]], 100 * x[2:]])
    out = np.asarray(mesh_1d(kernex, map_kind))
    np.testing.assert_array_equal(out, want)
    against_kernex(lambda lib: mesh_1d(lib, "vmap"), out)


def test_mesh_2d_uncovered_cells_get_the_first_function():
    x = np.arange(1, 26).reshape(5, 5)
    want = 10 * x                       # the first function, wherever nothing else is
    want[1, 1:] = -10 * x[1, 1:]
    want[2:] = 100 * x[2:]
    out = np.asarray(mesh_2d(kernex))
    np.testing.assert_array_equal(out, want)
    assert out[0, 1] == 20 and out[1, 0] == 60  # cells no region covers
    against_kernex(mesh_2d, out)


# -- meshes inside lax.scan (kernex: test_lax_scan_with_kscan / _kmap) ---------------

def iterate(F: Any, a: Any, n: int) -> Any:
    out, _ = jax.lax.scan(lambda c, _: (F(c), None), a, jnp.arange(n))
    return out


def ends_fixed(lib: Any, kind: str, size: int, map_kind: str = "vmap") -> Any:
    extra = {"map_kind": map_kind} if kind == "kmap" else {}
    F = getattr(lib, kind)(kernel_size=(size,), relative=True, padding="same", **extra)
    if size == 1:
        F[1:-1] = lambda x: x[0] + 1
    else:
        F[1:-1] = lambda x: x[0] + x[-1] + x[1]
    F[0] = F[-1] = lambda x: x[0]
    return F


def loop_reference(kind: str, size: int, a: np.ndarray, n: int) -> np.ndarray:
    """One application per iteration; kscan updates in place, left to right."""
    a = a.astype(np.float64).copy()
    for _ in range(n):
        src = a if kind == "kscan" else a.copy()
        for i in range(1, len(a) - 1):
            a[i] = src[i] + 1 if size == 1 else src[i - 1] + src[i] + src[i + 1]
    return a


@pytest.mark.parametrize(("kind", "size", "n"),
                         [("kscan", 1, 9), ("kscan", 3, 2), ("kmap", 1, 9), ("kmap", 3, 2)])
def test_mesh_in_lax_scan(kind, size, n):
    a = np.ones(10, np.float32)
    once = np.asarray(ends_fixed(kernex, kind, size)(jnp.asarray(a)))
    np.testing.assert_allclose(once, loop_reference(kind, size, a, 1))
    out = np.asarray(iterate(ends_fixed(kernex, kind, size), jnp.asarray(a), n))
    np.testing.assert_allclose(out, loop_reference(kind, size, a, n))
    against_kernex(lambda lib: iterate(ends_fixed(lib, kind, size), jnp.asarray(a), n), out)


@pytest.mark.parametrize("map_kind", MAP_KINDS)
def test_kmap_map_kind_does_not_change_the_result(map_kind):
    a = jnp.ones(10, jnp.float32)
    out = np.asarray(iterate(ends_fixed(kernex, "kmap", 3, map_kind), a, 2))
    np.testing.assert_allclose(out, [1, 7, 9, 9, 9, 9, 9, 9, 7, 1])


# -- a convolution and its gradient (kernex: test_conv2d) ----------------------------

def conv_kmap(lib: Any, map_kind: str) -> Callable[..., Any]:
    @jax.jit
    @lib.kmap(kernel_size=(3, 3, 3), padding=("valid", "same", "same"), relative=False,
              map_kind=map_kind)
    def conv(x: Any, w: Any) -> Any:
        return jnp.sum(x * w)

    return conv


def lax_conv(x: Any, w: Any) -> Any:
    return jax.lax.conv_general_dilated(x[None], w[None], (1, 1), "SAME",
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"))[0]


@pytest.mark.parametrize("map_kind", MAP_KINDS)
def test_conv2d_and_its_gradient(map_kind):
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 16, 16))
    w = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 3))
    conv = conv_kmap(kernex, map_kind)
    out = np.asarray(conv(x, w))
    np.testing.assert_allclose(out, lax_conv(x, w), atol=1e-4)
    g_ours = jax.grad(lambda w: jnp.sum(conv(x, w)))(w)
    g_lax = jax.grad(lambda w: jnp.sum(lax_conv(x, w)))(w)
    np.testing.assert_allclose(g_ours, g_lax[0] if g_lax.ndim == 4 else g_lax, atol=1e-3)
    against_kernex(lambda lib: conv_kmap(lib, "vmap")(x, w), out, atol=1e-4)


# -- the opt-in rule: uncovered cells keep their input --------------------------------

def test_opt_in_uncovered_cells_keep_their_input():
    x = np.arange(1, 26).reshape(5, 5)
    want = x.copy()
    want[0, 0] = 10
    want[1, 1:] = -10 * x[1, 1:]
    want[2:] = 100 * x[2:]
    np.testing.assert_array_equal(np.asarray(mesh_2d(kernex, "input")), want)


# padding 0 (kmap/kscan): output j is centred on input j + 1; smap/sscan keep
# every position.  Uncovered cells keep the centre of their window.
@pytest.mark.parametrize(("kind", "kept"), [("kmap", [3.0, 4, 5]),
                                            ("kscan", [3.0, 4, 5]),
                                            ("smap", [2.0, 3, 4, 5, 6]),
                                            ("sscan", [2.0, 3, 4, 5, 6])])
def test_single_region_first_rule_and_opt_in(kind, kept):
    a = jnp.arange(1.0, 7.0)
    F = getattr(kernex, kind)(kernel_size=(3,), relative=True)
    F[0] = lambda x: x[0] * 0 + 2.0
    G = getattr(kernex, kind)(kernel_size=(3,), relative=True, uncovered="input")
    G[0] = lambda x: x[0] * 0 + 2.0
    n = len(kept) + 1
    np.testing.assert_array_equal(F(a), [2.0] * n)             # kernex: everywhere
    np.testing.assert_array_equal(G(a), [2.0] + kept)


def test_uncovered_must_be_first_or_input():
    with pytest.raises(kernex.XStencilError,
                       match=r"xstencil.kmap: uncovered='keep'; expected 'first'.*or 'input'"):
        kernex.kmap(kernel_size=(3,), uncovered="keep")
