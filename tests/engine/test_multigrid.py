"""The pure-JAX multigrid engine against dense matrices (numpy/scipy)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xstencil._engine import multigrid as mg


@pytest.mark.parametrize("modes", [("fill", "periodic"), ("extend", "fill"),
                                   ("periodic", "extend")])
def test_apply_is_the_matrix(x64, modes):
    op = mg.Poisson((1.5, 0.5), -0.25, modes, (6, 7))
    u = np.random.default_rng(0).standard_normal(op.shape)
    np.testing.assert_allclose(np.asarray(mg.apply(op, jnp.asarray(u))).ravel(),
                               mg.matrix(op) @ u.ravel(), rtol=1e-12)


@pytest.mark.parametrize("mode", ["fill", "periodic", "extend"])
def test_transfers_keep_smooth_fields(x64, mode):
    """Restriction then prolongation of a linear (periodic: constant) field
    returns it away from the edges."""
    n = 33 if mode == "fill" else 32
    op = mg.Poisson((1.0,), 0.0, (mode,), (n,))
    x = np.arange(n, dtype=float)
    f = np.full(n, 2.0) if mode == "periodic" else 2.0 + 0.1 * x
    back = np.asarray(mg._prolong(op, mg._restrict(op, jnp.asarray(f))))
    np.testing.assert_allclose(back[2:-2], f[2:-2], rtol=1e-12)


@pytest.mark.parametrize(("shape", "modes"), [((15, 17), ("periodic", "extend")),
                                              ((40, 9), ("fill", "periodic"))])
def test_awkward_sizes_still_converge(x64, shape, modes):
    """Sizes that do not halve stop coarsening early or fold an edge cell;
    the result is still the exact solution of the dense system."""
    op = mg.Poisson((1.0, 1.0), -0.5, modes, shape)
    b = np.random.default_rng(1).standard_normal(shape)
    x, n, r = jax.jit(lambda b: mg.solve(op, b, jnp.zeros_like(b), 1e-10, 200))(b)
    assert float(r) <= 1e-10
    want = np.linalg.solve(mg.matrix(op), b.ravel())
    np.testing.assert_allclose(np.asarray(x).ravel(), want, atol=1e-8 * np.abs(want).max())


def test_large_coarsest_grid_uses_cg(x64):
    op = mg.Poisson((1.0, 1.0), -0.1, ("periodic", "periodic"), (33, 35))
    assert len(mg.levels(op)) == 1 and np.prod(op.shape) > mg.DENSE
    b = np.random.default_rng(2).standard_normal(op.shape)
    x, _, r = jax.jit(lambda b: mg.solve(op, b, jnp.zeros_like(b), 1e-9, 500))(b)
    assert float(r) <= 1e-9
