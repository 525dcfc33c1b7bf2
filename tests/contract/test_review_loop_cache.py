"""The compiled loops of ``iterate``, ``solve`` and ``scan(step=)``, keyed by
the body's structure with its closed-over arrays as inputs (session of the
loop-cache change): inputs where a cached loop was wrongly reused, or where
something that worked stopped working; and the wins kept (an inline body
over new arrays compiles once, an array changed in place is read).
References are plain numpy loops."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.compiles import compiles
from xstencil import XStencilError

N = 8
X = np.linspace(0.0, 1.0, N)
U0 = xr.DataArray(X, dims="x")


def _scaled(a: float) -> object:
    """A kernel whose factor is its own attribute (``k.alpha``): one code for all."""
    def k(u):
        return k.alpha * u()

    k.alpha = a
    return k


def test_kernels_of_one_code_with_different_own_attributes_do_not_share_a_loop():
    # the structure key left out a function's own attributes: the second
    # iterate ran the first kernel's alpha (2 * 2 * x instead of 3 * 3 * x)
    for a in (2.0, 3.0):
        out = xstencil.iterate(U0, _scaled(a), tol=None, max_steps=2, boundary="periodic")
        np.testing.assert_allclose(out.field.values, a * a * X)
    np.testing.assert_allclose(U0.stencil.map(_scaled(5.0)).values, 5.0 * X)


def test_a_kernels_own_attribute_changed_after_a_call_is_read():
    k = _scaled(2.0)
    for a in (2.0, 3.0, 4.0):  # the third call would be served by the walk's memo
        k.alpha = a
        out = xstencil.iterate(U0, k, tol=None, max_steps=1, boundary="periodic")
        np.testing.assert_allclose(out.field.values, a * X)
        np.testing.assert_allclose(U0.stencil.map(k).values, a * X)


def test_a_kernel_attribute_set_after_calls_is_read():
    def k(u):
        return getattr(k, "alpha", 1.0) * u()

    for a in (None, 2.0, 3.0):  # called thrice each: the walk's memo records it
        if a is not None:
            k.alpha = a
        for _ in range(3):
            np.testing.assert_allclose(U0.stencil.map(k).values, (a or 1.0) * X)
            out = xstencil.iterate(U0, k, tol=None, max_steps=1, boundary="periodic")
            np.testing.assert_allclose(out.field.values, (a or 1.0) * X)


def test_mesh_kernels_with_different_own_attributes_do_not_share_a_loop():
    for a in (2.0, 3.0):
        m = U0.stencil.mesh(boundary="periodic")
        m[...] = _scaled(a)
        m[{"x": 0}] = lambda u: -1.0
        want = a * X
        want[0] = -1.0
        np.testing.assert_allclose(
            xstencil.iterate(None, m, tol=None, max_steps=1).field.values, want)


def _halving(u):
    return 0.5 * u()


@pytest.mark.filterwarnings("ignore::xstencil.ConvergenceWarning")
def test_a_norm_closing_over_an_array_changed_in_place_is_read():
    # the norm was keyed by identity with its arrays baked in: after w[:] = 2
    # the loop still weighed changes by 1 (residual 0.125 instead of 0.25)
    w = np.ones(N)

    def norm(new, old):
        return (abs(new - old) * w).max()

    for weight in (1.0, 2.0):
        w[:] = weight
        out = xstencil.iterate(U0, _halving, tol=1e-30, max_steps=3, norm=norm,
                               boundary="periodic")
        # changes 0.5, 0.25, 0.125 of max|x| = 1, weighted
        assert float(out.residual) == pytest.approx(0.125 * weight)


@pytest.mark.filterwarnings("ignore::xstencil.ConvergenceWarning")
def test_a_norm_needing_its_array_concrete_still_works():
    w = np.array([3.0])
    out = xstencil.iterate(U0, _halving, tol=1e-30, max_steps=2,
                           norm=lambda new, old: float(w[0]) * abs(new - old).max(),
                           boundary="periodic")
    assert float(out.residual) == pytest.approx(3.0 * 0.25)


def _roll_ref(w: np.ndarray, steps: int) -> np.ndarray:
    u = X.copy()
    for _ in range(steps):
        u = u + np.roll(w, 1)
    return u


def test_step_functions_using_numpy_on_a_closed_over_array_still_run():
    # scan(step=) and iterate(step=) made the step's arrays traced inputs, so a
    # step calling numpy on one (np.roll, float(w[0])) raised JAX's raw
    # TracerArrayConversionError; it ran before: the arrays are baked in again
    for k in range(3):
        w = np.arange(N, dtype=float) * (k + 1)
        out = xstencil.scan(U0, step=lambda s: s + np.roll(w, 1), steps=3)  # noqa: B023
        np.testing.assert_allclose(out.isel(time=-1).values, _roll_ref(w, 3))
        it = xstencil.iterate(U0, step=lambda s: s * float(w[1]),  # noqa: B023
                              tol=None, max_steps=2)
        np.testing.assert_allclose(it.field.values, X * w[1] ** 2)


def test_a_baked_step_reads_an_array_changed_in_place():
    w = np.arange(N, dtype=float)

    def step(s):
        return s + np.roll(w, 1)

    for k in range(3):
        w[:] = np.arange(N) * (k + 2)
        out = xstencil.scan(U0, step=step, steps=2)
        np.testing.assert_allclose(out.isel(time=-1).values, _roll_ref(w, 2))
        it = xstencil.iterate(U0, step=step, tol=None, max_steps=2)
        np.testing.assert_allclose(it.field.values, _roll_ref(w, 2))


def test_a_step_needing_the_state_concrete_is_a_clear_error():
    with pytest.raises(XStencilError, match=r"step= function .*traced value.*jnp.roll"):
        xstencil.scan(U0, step=lambda s: s + np.roll(s.values, 1), steps=2)
    with pytest.raises(XStencilError, match=r"step= function .*traced value.*jnp.roll"):
        xstencil.iterate(U0, step=lambda s: s * float(s[0]), tol=None, max_steps=2)


def test_wins_inline_steps_and_rebuilt_meshes_over_new_arrays_compile_once():
    def run(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sc = xstencil.scan(U0, step=lambda s: s * w[0] + w[1], steps=3).isel(time=-1)
        it = xstencil.iterate(U0, step=lambda s: s * w[0] + w[1], tol=None, max_steps=3)
        m = U0.stencil.mesh(boundary="periodic")
        m[...] = lambda u: w[0] * u() + w[1]
        m[{"x": 0}] = lambda u: w[2]
        me = xstencil.iterate(None, m, tol=None, max_steps=3)
        return sc.values, it.field.values, me.field.values

    def ref(w: np.ndarray, mesh: bool) -> np.ndarray:
        u = X.copy()
        for _ in range(3):
            u = w[0] * u + w[1]
            if mesh:
                u[0] = w[2]
        return u

    run(np.array([1.0, 0.0, 0.0]))  # compiles the loops
    ws = [np.array([0.5, 1.0, 2.0]), np.array([2.0, -1.0, 3.0])]
    with compiles() as got:
        outs = [run(w) for w in ws]
    assert got["compiles"] == 0
    for w, (sc, it, me) in zip(ws, outs, strict=True):
        np.testing.assert_allclose(sc, ref(w, False))
        np.testing.assert_allclose(it, ref(w, False))
        np.testing.assert_allclose(me, ref(w, True))


def test_wins_in_place_changes_are_read_by_steps_and_meshes():
    w = np.array([0.5, 1.0, 2.0])

    def step(s):
        return s * w[0] + w[1]

    m = U0.stencil.mesh(boundary="periodic")
    m[...] = lambda u: w[0] * u() + w[1]
    for a in (0.5, 2.0):
        w[0] = a
        want = a * X + 1.0
        np.testing.assert_allclose(xstencil.scan(U0, step=step, steps=1).isel(time=-1).values,
                                   want)
        np.testing.assert_allclose(
            xstencil.iterate(None, m, tol=None, max_steps=1).field.values, want)


def test_a_baked_step_with_unchanged_arrays_compiles_once():
    w = np.arange(N, dtype=float)

    def step(s):
        return s + np.roll(w, 1)

    xstencil.scan(U0, step=step, steps=2)
    with compiles() as got:
        out = xstencil.scan(U0, step=step, steps=2)
    assert got["compiles"] == 0
    np.testing.assert_allclose(out.isel(time=-1).values, _roll_ref(w, 2))


def test_a_step_calling_a_mesh_it_closes_over_sees_the_mesh_change():
    # the mesh was keyed by identity (and the attributes the step's code names):
    # an array its kernel reads changed in place, or a region assigned after the
    # first call, reused the loop compiled with the old ones
    w = np.array([2.0])
    m = U0.stencil.mesh(boundary="periodic")
    m[...] = lambda u: w[0] * u()

    def step(s):
        return xstencil.iterate(s, m, tol=None, max_steps=1).field

    def both() -> tuple[np.ndarray, np.ndarray]:
        sc = xstencil.scan(U0, step=step, steps=1).isel(time=-1).values
        it = xstencil.iterate(U0, step=step, tol=None, max_steps=1).field.values
        return sc, it

    for got in both():
        np.testing.assert_allclose(got, 2.0 * X)
    w[0] = 3.0
    for got in both():
        np.testing.assert_allclose(got, 3.0 * X)
    m[{"x": 0}] = lambda u: -1.0
    want = 3.0 * X
    want[0] = -1.0
    for got in both():
        np.testing.assert_allclose(got, want)
    with compiles() as seen:  # unchanged: the compiled loops are reused
        for got in both():
            np.testing.assert_allclose(got, want)
    assert seen["compiles"] == 0


@pytest.mark.filterwarnings("ignore::xstencil.PrecisionWarning")
def test_iterate_outside_a_jit_after_one_inside_it_on_the_same_data():
    # JAX kept the 32-bit copy of the float64 data it made in the jitted call
    # (x64 off) by the array object, and handed it back to the later call under
    # x64: a float32 carry against a float64 step, a while_loop dtype error
    u0 = xr.DataArray(np.linspace(0.0, 1.0, N), dims="x")

    def f(a):
        return xstencil.iterate(u0, lambda u: a * u(), tol=None, max_steps=2,
                                boundary="periodic").field.data

    with jax.numpy_dtype_promotion("standard"):  # as users get it (x64 off too)
        inside = jax.jit(f)(2.0)
        out = f(np.float64(5.0))
    np.testing.assert_allclose(np.asarray(inside), 4.0 * u0.values, rtol=1e-6)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, 25.0 * u0.values, rtol=1e-15)


def _list_kernel(coef: list[float]):
    return lambda u, c: coef[0] * c.sum() * u()


def _list_step(coef: list[float]):
    return lambda s, c: s * coef[0] * c.sum()


def test_a_reused_loop_traced_again_runs_the_calling_kernel():
    # a loop cached by structure kept the first call's kernel; a later call of
    # equal key (its list read by content) whose kernel argument had a new
    # length traced it again with that first kernel, whose list had changed
    # in place since: the second call returned 5 * x instead of 2 * x
    def runs(coef: list[float], c: np.ndarray) -> list[np.ndarray]:
        return [
            U0.stencil.map(_list_kernel(coef), c).values,
            xstencil.iterate(U0, _list_kernel(coef), c, tol=None, max_steps=1).field.values,
            xstencil.scan(U0, None, "time", c, step=_list_step(coef),
                          steps=1).isel(time=-1).values,
        ]

    first = [2.0]
    for got in runs(first, np.ones(1)):
        np.testing.assert_allclose(got, 2.0 * X)
    first[0] = 5.0
    for got in runs([2.0], np.ones(2) / 2):
        np.testing.assert_allclose(got, 2.0 * X)


def test_a_reused_step_loop_traced_again_runs_the_calling_steps_dataarray():
    def step_of(coef: xr.DataArray):
        return lambda s, c: s * coef * c.sum()

    first = xr.DataArray(np.full(N, 2.0), dims="x")
    out = xstencil.scan(U0, None, "time", np.ones(1), step=step_of(first), steps=1)
    np.testing.assert_allclose(out.isel(time=-1).values, 2.0 * X)
    first[:] = 5.0
    again = xr.DataArray(np.full(N, 2.0), dims="x")
    out = xstencil.scan(U0, None, "time", np.ones(2) / 2, step=step_of(again), steps=1)
    np.testing.assert_allclose(out.isel(time=-1).values, 2.0 * X)


@pytest.mark.filterwarnings("ignore::xstencil.ConvergenceWarning")
def test_a_traced_again_loop_bakes_the_calling_norm_and_step():
    # the norm (and a step needing its arrays concrete) are baked in by value:
    # a trace of the cached loop for a kernel argument of a new length must bake
    # the calling ones, not the first ones whose list changed in place since
    def norm_of(scale: list[float]):
        return lambda new, old: scale[0] * abs(new - old).max()

    def step_of(scale: list[float], w: np.ndarray):
        return lambda s, c: s * scale[0] * c.sum() + np.roll(w, 1)

    def run(scale: list[float], c: np.ndarray) -> tuple[float, np.ndarray]:
        r = xstencil.iterate(U0, lambda u, c: 0.5 * c.sum() * u(), c, tol=1e-30, max_steps=1,
                             norm=norm_of(scale), boundary="periodic").residual
        w = np.arange(N, dtype=float)
        s = xstencil.iterate(U0, None, c, step=step_of(scale, w), tol=None, max_steps=1)
        return float(r), s.field.values

    first = [2.0]
    r, s = run(first, np.ones(1))
    assert r == pytest.approx(2.0 * 0.5)
    np.testing.assert_allclose(s, 2.0 * X + np.roll(np.arange(N), 1))
    first[0] = 5.0
    r, s = run([2.0], np.ones(2) / 2)
    assert r == pytest.approx(2.0 * 0.5)
    np.testing.assert_allclose(s, 2.0 * X + np.roll(np.arange(N), 1))
