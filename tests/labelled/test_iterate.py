"""``xstencil.iterate``: converge-until loops in one compiled while_loop."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import xarray as xr

import xstencil


def jacobi_numpy(p: np.ndarray, tol: float, norm: str, max_steps: int = 100_000):
    """Jacobi for u'' = 0 with fixed ends, stopping like ``iterate``."""
    p = p.copy()
    for n in range(1, max_steps + 1):
        old = p.copy()
        p[1:-1] = 0.5 * (old[2:] + old[:-2])
        d = p - old
        r = {"l1": np.abs(d).sum() / np.abs(old).sum(),
             "l2": np.sqrt((d**2).sum()) / np.sqrt((old**2).sum()),
             "max": np.abs(d).max() / np.abs(old).max()}[norm]
        if r <= tol:
            return p, n, r
    return p, max_steps, r


def rod(n: int = 21, dtype=np.float64) -> xr.DataArray:
    p = np.zeros(n, dtype=dtype)
    p[-1] = 1.0
    return xr.DataArray(p, dims="x", coords={"x": np.linspace(0, 1, n)}, name="T",
                        attrs={"units": "K"})


def rod_mesh(p: xr.DataArray) -> xstencil.Mesh:
    m = p.stencil.mesh(boundary="extend")
    m[...] = lambda u: 0.5 * (u(x=-1) + u(x=1))
    m[{"x": 0}] = lambda u: u()
    m[{"x": -1}] = lambda u: u()
    return m


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
def test_iterate_matches_a_numpy_loop(norm):
    p = rod()
    want, n, r = jacobi_numpy(p.values, 1e-6, norm)
    res = p.stencil.iterate(rod_mesh(p), tol=1e-6, norm=norm)
    assert res.iterations == n and isinstance(res.iterations, int)
    assert res.converged is True
    np.testing.assert_allclose(res.residual, r, rtol=1e-6)
    np.testing.assert_allclose(res.field.values, want, rtol=1e-12)
    # and it approaches the straight line
    assert np.abs(res.field.values - np.linspace(0, 1, 21)).max() < 1e-2
    assert res.field.attrs == {"units": "K"} and res.field.name == "T"
    assert res.field.dtype == np.float64


def test_iterate_kernel_with_boundary_and_args():
    da = xr.DataArray(np.random.default_rng(0).random((12, 10)), dims=("y", "x"))
    w = np.float64(0.125)
    res = da.stencil.iterate(lambda u, w: 0.5 * u() + w * (u(x=1) + u(x=-1) + u(y=1) + u(y=-1)), w,
                             boundary="periodic", tol=1e-9, norm="max", relative=False)
    assert res.converged
    # periodic averaging converges to the mean
    np.testing.assert_allclose(res.field.values, da.values.mean(), atol=1e-7)


def test_float32_stays_float32():
    p = rod(dtype=np.float32)
    res = xstencil.iterate(p, rod_mesh(p), tol=1e-4, norm="max")
    assert res.field.dtype == np.float32 and res.converged


def test_max_steps_warns_and_reports():
    p = rod()
    with pytest.warns(xstencil.ConvergenceWarning, match=r"not converged after 10 iterations"):
        res = xstencil.iterate(p, rod_mesh(p), tol=1e-12, max_steps=10)
    assert res.iterations == 10 and res.converged is False and res.residual > 1e-12
    want, _, _ = jacobi_numpy(p.values, 0.0, "l1", max_steps=10)
    np.testing.assert_allclose(res.field.values, want, rtol=1e-12)


def test_tol_none_takes_exactly_max_steps():
    p = rod()
    res = xstencil.iterate(p, rod_mesh(p), tol=None, max_steps=7)
    want, _, _ = jacobi_numpy(p.values, 0.0, "l1", max_steps=7)
    assert res.iterations == 7 and res.converged
    np.testing.assert_allclose(res.field.values, want, rtol=1e-12)


def test_inside_jit_flags_instead_of_warning(x64):
    p = rod()
    m = rod_mesh(p)

    @jax.jit
    def run(data, tol):
        r = xstencil.iterate(p.copy(data=data), m, tol=tol, max_steps=2000)
        return r.field.data, r.iterations, r.converged

    data, n, ok = run(p.values, 1e-300)  # no warning: the flag says it
    assert int(n) == 2000 and not bool(ok)
    data2, n2, ok2 = run(p.values, 1e-3)  # a new tol does not retrace or recompile
    want, nw, _ = jacobi_numpy(p.values, 1e-3, "l1")
    assert bool(ok2) and int(n2) == nw
    np.testing.assert_allclose(np.asarray(data2), want, rtol=1e-12)


def test_inside_scan_step(x64):
    """A converged inner solve inside every time step of ``scan(step=...)``."""
    p = rod()

    def step(s):
        hot = s.copy(data=s.data.at[-1].add(1.0))
        return xstencil.iterate(hot, rod_mesh(hot), tol=1e-10, norm="max",
                                max_steps=20_000).field

    out = p.stencil.scan(step=step, dim="time", steps=3, dt=1.0)
    np.testing.assert_allclose(out.isel(time=-1).values, 4 * np.linspace(0, 1, 21), atol=1e-6)


def test_callable_norm_and_dataset():
    ds = xr.Dataset({"a": ("x", np.linspace(1, 2, 9)), "k": ("x", np.full(9, 0.5))})
    seen = []

    def norm(new, old):
        seen.append(sorted(new))
        return abs(new["a"] - old["a"]).max()

    res = ds.stencil.iterate(lambda s: {"a": s["k"]() * (s["a"](x=1) + s["a"](x=-1))},
                             boundary="periodic", tol=1e-8, norm=norm)
    assert res.converged and seen[0] == ["a", "k"]
    np.testing.assert_allclose(res.field["a"].values, 1.5, atol=1e-7)
    np.testing.assert_array_equal(res.field["k"].values, 0.5)


def test_accessor_and_function_agree():
    p = rod()
    m = rod_mesh(p)
    a = p.stencil.iterate(m, tol=1e-5)
    b = xstencil.iterate(p, m, tol=1e-5)
    assert a.iterations == b.iterations
    np.testing.assert_array_equal(a.field.values, b.field.values)


def test_repeated_calls_do_not_retrace():
    traces = []

    def k(u):
        traces.append(1)
        return 0.5 * u() + 0.25 * (u(x=1) + u(x=-1))

    da = xr.DataArray(np.random.default_rng(1).random(16), dims="x")
    for tol in (1e-3, 1e-4, 1e-5):
        xstencil.iterate(da, k, boundary="periodic", tol=tol, norm="max")
    n = len(traces)
    xstencil.iterate(da * 2, k, boundary="periodic", tol=1e-6, norm="max")
    assert len(traces) == n


@pytest.mark.parametrize(("kw", "match"), [
    ({"norm": "l3"}, r"norm='l3' is not a norm"),
    ({"tol": "small"}, r"tol='small' must be a number"),
    ({"max_steps": -1}, r"max_steps=-1 must be a non-negative int"),
    ({"step": lambda s: s}, r"either a kernel or mesh as body, or a function of the state"),
])
def test_errors(kw, match):
    da = xr.DataArray(np.zeros(5), dims="x")
    with pytest.raises(xstencil.XStencilError, match=match):
        xstencil.iterate(da, lambda u: u(x=1), boundary="periodic", **kw)


def test_error_messages_for_bodies():
    da = xr.DataArray(np.zeros(5), dims="x")
    with pytest.raises(xstencil.XStencilError, match=r"body=3 is neither a kernel"):
        xstencil.iterate(da, 3)
    with pytest.raises(xstencil.XStencilError, match=r"integer or bool data is needed"):
        xstencil.iterate(da.astype(str), lambda u: u())  # bool and integer states are fine
    m = xr.DataArray(np.zeros(6), dims="x").stencil.mesh()
    m[...] = lambda u: u()
    with pytest.raises(xstencil.XStencilError, match=r"mesh was built on data of sizes"):
        xstencil.iterate(da, m)
    m5 = da.stencil.mesh()
    m5[...] = lambda u: u()
    with pytest.raises(xstencil.XStencilError, match=r"boundary= is set on the mesh itself"):
        xstencil.iterate(da, m5, boundary="periodic")
    with pytest.raises(xstencil.XStencilError, match=r"obj=None needs a mesh"):
        xstencil.iterate(None, lambda u: u())


def test_input_not_mutated_and_coords_kept():
    p = rod()
    before = p.copy(deep=True)
    res = p.stencil.iterate(rod_mesh(p), tol=1e-3)
    xr.testing.assert_identical(p, before)
    xr.testing.assert_identical(res.field.coords.to_dataset(), p.coords.to_dataset())
