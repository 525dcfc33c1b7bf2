"""DataArray and Dataset as JAX pytrees: jit, grad and vmap over labelled code,
and a diffusion coefficient fitted by gradient descent through ``map``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the pytrees
from xstencil._labelled.pytree import LabelledStatic


def lap(u):
    return u(x=1) - 2 * u() + u(x=-1)


def _da(dtype=np.float32) -> xr.DataArray:
    x = np.linspace(0, 1, 8, endpoint=False)
    return xr.DataArray(np.sin(2 * np.pi * x).astype(dtype)[None, :] * np.arange(1, 4)[:, None]
                        .astype(dtype),
                        dims=("y", "x"),
                        coords={"x": x, "y": [10, 20, 30], "note": ("y", list("abc"))},
                        attrs={"units": "K", "weights": np.arange(3)}, name="T")


def _ds() -> xr.Dataset:
    da = _da()
    return xr.Dataset({"T": da, "h": da.isel(y=0, drop=True) * 2},
                      attrs={"title": "t"})


def test_flatten_roundtrip_and_static_equality():
    da = _da()
    leaves, treedef = jax.tree_util.tree_flatten(da)
    assert len(leaves) == 1 and leaves[0] is da.data
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    xr.testing.assert_identical(back, da)
    _, t2 = jax.tree_util.tree_flatten(da.copy(deep=True))
    assert t2 == treedef and hash(t2) == hash(treedef)
    _, t3 = jax.tree_util.tree_flatten(da.assign_coords(x=da.x + 1))
    assert t3 != treedef
    _, t4 = jax.tree_util.tree_flatten(da.assign_attrs(weights=np.arange(1, 4)))
    assert t4 != treedef
    ds = _ds()
    leaves, treedef = jax.tree_util.tree_flatten(ds)
    assert len(leaves) == 2
    xr.testing.assert_identical(jax.tree_util.tree_unflatten(treedef, leaves), ds)
    static = treedef.node_data()[1]
    assert isinstance(static, LabelledStatic) and "Dataset" in repr(static)


def test_jit_takes_and_returns_dataarrays_and_datasets():
    traces = []

    @jax.jit
    def step(da):
        traces.append(1)
        return da + 0.1 * da.stencil.map(lap, boundary="periodic")

    da = _da()
    out = step(da)
    expect = da + 0.1 * da.stencil.map(lap, boundary="periodic")
    xr.testing.assert_allclose(out, expect)
    assert out.name == "T" and out.attrs["units"] == "K"
    xr.testing.assert_identical(out.coords.to_dataset(), da.coords.to_dataset())
    step(da.copy(data=da.values * 2))
    assert len(traces) == 1  # same labels: jit's cache hits
    step(da.assign_coords(x=da.x * 2))
    assert len(traces) == 2  # new coords are new static data

    @jax.jit
    def tend(ds):
        return ds.stencil.map(lambda s: {"h": s.h(x=1) - s.h(x=-1)}, boundary="periodic")

    ds = _ds()
    got = tend(ds)
    assert isinstance(got, xr.Dataset) and got.attrs == ds.attrs
    # a result keeps its variable's dims (h is 1-D): it does not grow to (y, x)
    expect = np.roll(ds.h.values, -1) - np.roll(ds.h.values, 1)
    assert got.h.dims == ("x",)
    np.testing.assert_allclose(got.h.values, expect, rtol=1e-6)


def test_grad_returns_a_labelled_gradient():
    def loss(da):
        return (da.stencil.map(lap, boundary="periodic") ** 2).sum().data

    da = _da()
    g = jax.grad(loss)(da)
    assert isinstance(g, xr.DataArray) and g.dims == da.dims and g.name == "T"
    a = jnp.asarray(da.values)

    def loss_ref(a):
        return ((jnp.roll(a, -1, 1) - 2 * a + jnp.roll(a, 1, 1)) ** 2).sum()

    np.testing.assert_allclose(g.values, jax.grad(loss_ref)(a), rtol=1e-5, atol=1e-5)
    gds = jax.grad(lambda ds: (ds.h ** 2).sum().data + ds["T"].sum().data)(_ds())
    np.testing.assert_allclose(gds.h.values, 2 * _ds().h.values)
    np.testing.assert_allclose(gds["T"].values, 1.0)


def test_vmap_over_the_leading_dim():
    da = _da()

    def f(row):
        assert row.dims == ("x",) and "note" not in row.coords  # y is mapped away
        return row.stencil.map(lap, boundary="periodic")

    out = jax.vmap(f)(da)
    assert out.dims == ("batch", "x")
    np.testing.assert_allclose(out.values, da.stencil.map(lap, boundary="periodic").values,
                               rtol=1e-6)
    np.testing.assert_array_equal(out.x.values, da.x.values)
    # a plain array batch against one labelled object
    scales = jnp.arange(3.0, dtype=jnp.float32)
    res = jax.vmap(lambda c, d: d * c, in_axes=(0, None))(scales, da)
    assert res.dims == ("batch", "y", "x") and res.shape == (3, 3, 8)


def test_eval_shape_gives_labelled_shapes():
    out = jax.eval_shape(lambda d: d.stencil.map(lap, boundary="periodic"), _da())
    assert isinstance(out, xr.DataArray) and out.shape == (3, 8) and out.dtype == np.float32


def test_fit_diffusion_coefficient_by_gradient_descent():
    """Recover nu from one explicit diffusion step, differentiating through map."""
    x = np.linspace(0, 1, 32, endpoint=False)
    u0 = xr.DataArray(np.exp(-50 * (x - 0.5) ** 2).astype(np.float32), dims="x",
                      coords={"x": x})
    dx2 = np.float32((x[1] - x[0]) ** 2)

    def step(u, nu):
        return u + nu * u.stencil.map(lap, boundary="periodic") / dx2

    true_nu = np.float32(2e-4)
    target = u0
    for _ in range(5):
        target = step(target, true_nu)

    @jax.jit
    def loss(nu):
        u = u0
        for _ in range(5):
            u = step(u, nu)
        return ((u - target) ** 2).sum().data

    grad = jax.jit(jax.grad(loss))
    nu = jnp.float32(0.0)
    # the loss is nearly quadratic in nu: scale the step by its curvature
    curvature = float(grad(jnp.float32(1e-4)) - grad(jnp.float32(0.0))) / 1e-4
    lr = 0.5 / curvature
    first = float(loss(nu))
    for _ in range(30):
        nu = nu - lr * grad(nu)
    assert float(loss(nu)) < 1e-6 * first
    assert float(nu) == pytest.approx(float(true_nu), rel=2e-2)


@pytest.mark.slow  # a fresh interpreter: 41 s on a loaded 2-core host
def test_conflicting_registration_warns_clearly():
    code = textwrap.dedent("""
        import warnings
        import jax, xarray as xr
        jax.tree_util.register_pytree_node(
            xr.DataArray, lambda d: ((d.data,), tuple(d.dims)),
            lambda dims, leaves: xr.DataArray(leaves[0], dims=dims))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import xstencil
            from xstencil._labelled.pytree import PytreeRegistrationWarning
        msgs = [str(w.message) for w in caught
                if issubclass(w.category, PytreeRegistrationWarning)]
        assert len(msgs) == 1, msgs
        print(msgs[0])
        import numpy as np
        ds = xr.Dataset({"v": ("x", np.zeros(2))})
        assert len(jax.tree_util.tree_leaves(ds)) == 1  # Dataset is still ours
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "xarray.DataArray is already registered as a JAX pytree by another library" \
        in res.stdout
    assert "import xstencil before the other library" in res.stdout


def test_registration_is_idempotent():
    from xstencil._labelled import pytree

    pytree.register()  # already ours: no warning (filterwarnings=error), no error
    assert pytree._registered_by_us(xr.DataArray) is True


def test_unflatten_checks_shapes_and_copies_coordinates():
    da = _da()
    halved = jax.tree_util.tree_map(lambda a: a[:, :4], da.isel(y=slice(0, 2)).drop_vars("x"))
    assert halved.shape == (2, 4)
    with pytest.raises(ValueError, match=r"conflicting sizes|do not match|must have shape"):
        jax.tree_util.tree_map(lambda a: a[:, :4], da)
    out = jax.jit(lambda d: d * 2)(da)
    out.coords["x"].attrs["units"] = "m"
    out.attrs["new"] = 1
    assert da.coords["x"].attrs == {} and "new" not in da.attrs
    ds = _ds()
    back = jax.jit(lambda d: d)(ds)
    xr.testing.assert_identical(back, ds)
