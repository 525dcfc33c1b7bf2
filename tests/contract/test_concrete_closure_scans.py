"""A scan kernel that needs a closed-over array concrete (``float(W[i])``)
fails alike in memory, on JAX data and on dask (a dask scan baked the values
in and ran, while the same kernel raised everywhere else); the remedy the
message gives (``W.tolist()``) works on all three."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - the accessor
from xstencil import KernelError

U = xr.DataArray(np.random.default_rng(1).random((5, 8)), dims=("t", "x"))


def _objs() -> dict[str, xr.DataArray]:
    return {"numpy": U, "dask": U.chunk(x=4), "jax": U.copy(data=jnp.asarray(U.values))}


def _ref(w: list[float]) -> np.ndarray:
    out = [U.values[0]]
    for _ in range(4):
        p = np.pad(out[-1], 1, mode="edge")
        out.append(w[0] * p[:-2] + w[1] * p[1:-1] + w[2] * p[2:])
    return np.stack(out)


@pytest.mark.parametrize("kind", ["numpy", "dask", "jax"])
def test_concrete_use_of_a_closed_over_array_fails_alike_in_scans(kind):
    W = np.array([0.25, 0.5, 0.25])

    def step(u):
        return float(W[0]) * u(t=-1, x=-1) + float(W[1]) * u(t=-1) + float(W[2]) * u(t=-1, x=1)

    obj = _objs()[kind]
    with pytest.raises(KernelError, match=r"kernel 'step' used a traced value .*tolist"):
        obj.stencil.scan(step, dim="t", boundary="extend")
    w = W.tolist()
    out = obj.stencil.scan(lambda u: w[0] * u(t=-1, x=-1) + w[1] * u(t=-1) + w[2] * u(t=-1, x=1),
                           dim="t", boundary="extend")
    np.testing.assert_allclose(np.asarray(out), _ref(w), rtol=1e-6)
