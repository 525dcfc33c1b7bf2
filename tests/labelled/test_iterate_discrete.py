"""iterate on bool and integer states: flood fills, hysteresis, label spreading.

A port of scikit-image's Canny hysteresis needed a bool fixpoint, which
iterate refused ("iterative solves need floating point data").  The change
of a bool or integer state is the number of cells that changed (``l1``;
``l2`` its square root, ``max`` 1 if any), and a step whose result does not
fit the state exactly is refused rather than truncated or wrapped.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage as ndi
import xarray as xr

import xstencil
from xstencil import XStencilError

RNG = np.random.default_rng(3)


def test_hysteresis_as_a_bool_fixpoint_matches_numpy():
    strong = RNG.random((30, 40)) > 0.97
    weak = RNG.random((30, 40)) > 0.45
    ds = xr.Dataset({"edge": (("y", "x"), strong), "low": (("y", "x"), weak)})

    def grow(s):
        near = s["edge"].stencil.map(lambda u: u.any(), window={"y": 3, "x": 3},
                                     boundary="fill", fill_value=False)
        return s.assign(edge=s["edge"] | (near & s["low"]))

    res = xstencil.iterate(ds, step=grow, tol=0, max_steps=1000)
    # reference: the components of (weak | strong) (8-connected) that hold a strong cell
    lab, _ = ndi.label(weak | strong, structure=np.ones((3, 3)))
    keep = np.isin(lab, np.unique(lab[strong]))
    want = strong | (keep & weak)
    assert res.converged and res.residual == 0 and res.field["edge"].dtype == bool
    np.testing.assert_array_equal(res.field["edge"].values, want)
    assert res.iterations >= 2


@pytest.mark.parametrize("norm, scale", [("l1", lambda n: n), ("l2", np.sqrt),
                                         ("max", lambda n: float(n > 0))])
def test_integer_labels_spread_to_their_component_maximum(norm, scale):
    mask = RNG.random((25, 25)) > 0.4
    labels = np.where(mask, np.arange(mask.size).reshape(mask.shape), -1).astype(np.int32)
    da = xr.DataArray(labels, dims=("y", "x"))

    def spread(u):
        best = u()
        for off in ({"x": 1}, {"x": -1}, {"y": 1}, {"y": -1}):
            best = jnp.maximum(best, u(**off))
        return jnp.where(u() >= 0, best, u())

    res = xstencil.iterate(da, spread, boundary="fill", fill_value=-1, tol=0, norm=norm,
                           max_steps=2000)
    comp, n = ndi.label(mask)
    want = labels.copy()
    for c in range(1, n + 1):
        want[comp == c] = labels[comp == c].max()
    np.testing.assert_array_equal(res.field.values, want)
    assert res.field.dtype == np.int32 and res.converged
    # one step less than needed: the residual counts the cells that still changed
    short = xstencil.iterate(da, spread, boundary="fill", fill_value=-1, tol=None, norm=norm,
                             max_steps=int(res.iterations) - 1)
    before = xstencil.iterate(da, spread, boundary="fill", fill_value=-1, tol=None,
                              max_steps=int(res.iterations) - 2).field.values
    changed = int(np.count_nonzero(short.field.values != before))
    assert changed > 0 and float(short.residual) == pytest.approx(scale(changed))


def test_a_result_that_does_not_fit_the_state_is_refused():
    da = xr.DataArray((RNG.random((6, 7)) > 0.5).astype(np.uint8), dims=("y", "x"))
    with pytest.raises(XStencilError, match=r"as uint32, which does not fit the state's uint8"):
        xstencil.iterate(da, lambda u: u.sum(), window={"y": 3, "x": 3}, boundary="fill",
                         fill_value=0, tol=0, max_steps=3)
    flags = xr.DataArray(RNG.random((6, 7)) > 0.5, dims=("y", "x"))
    with pytest.raises(XStencilError, match=r"as float32, which does not fit the state's bool"):
        xstencil.iterate(flags, lambda u: jnp.where(u(x=1), 0.75, 0.25).astype(jnp.float32),
                         boundary="extend", tol=0, max_steps=3)


def test_solve_still_needs_floating_point_data():
    da = xr.DataArray(np.ones((4, 4), np.int32), dims=("y", "x"))
    with pytest.raises(XStencilError, match="floating point data is needed"):
        xstencil.solve(lambda u: 2 * u(), da)


def test_a_dataset_mixing_a_float_field_and_a_bool_mask():
    # the float variable adds its change, the bool one its changed cells; not relative
    u = xr.DataArray(np.linspace(0.0, 1.0, 8), dims="x")
    seen = xr.DataArray(np.arange(8) == 0, dims="x")
    ds = xr.Dataset({"u": u, "seen": seen})

    def step(s):
        near = s["seen"].stencil.map(lambda w: w.any(), window={"x": 3}, boundary="fill",
                                     fill_value=False)
        return s.assign(u=s["u"] * 0.5, seen=s["seen"] | near)

    one = xstencil.iterate(ds, step=step, tol=None, max_steps=1, norm="l1")
    want = float(np.abs(u.values * 0.5 - u.values).sum()) + 1.0  # one cell newly seen
    assert float(one.residual) == pytest.approx(want)
    # converging needs both: the mask stops after 7 steps, u keeps halving
    res = xstencil.iterate(ds, step=step, tol=1e-3, max_steps=100, norm="l1")
    assert res.field["seen"].values.all() and float(res.residual) <= 1e-3
