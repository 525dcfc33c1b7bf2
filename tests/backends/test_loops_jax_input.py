"""Maps and meshes on JAX-array data on the CPU run on the loop backend.

A map's result holds a JAX array, so a time loop written as repeated maps
(``u = u.stencil.map(step)``) hands every call after the first JAX data.
Such data on one CPU device are read by the loops through ``np.asarray``'s
view (``xstencil._backends.loops.host_views``, no copy); before, they ran
with XLA (2.4x slower at 2048², and rounded unlike the first call).  These
tests check that the loops run, that each step is bitwise the numpy loop,
that the input is neither mutated nor shared with the result, and that
what the loops cannot read (bfloat16, deleted arrays, tracers) still takes
XLA with its result or its error.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

from tests.spies import count_calls
from xstencil._backends import loops, loops_mesh

pytest.importorskip("numba")


def step(u: Any) -> Any:
    return u() + np.float32(0.1) * (u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u())


def _step_ref(a: np.ndarray) -> np.ndarray:
    r = np.roll
    f = np.float32
    return a + f(0.1) * (r(a, -1, 1) + r(a, 1, 1) + r(a, -1, 0) + r(a, 1, 0) - f(4) * a)


def _da(a: Any) -> xr.DataArray:
    ny, nx = a.shape
    return xr.DataArray(a, dims=("y", "x"), coords={"x": np.arange(nx), "y": np.arange(ny)},
                        name="u", attrs={"units": "K"})


def test_a_time_loop_of_maps_runs_the_loops_at_every_step(ran: list[int]) -> None:
    a = np.random.default_rng(0).random((48, 40), dtype=np.float32)
    u, want = _da(a), a
    history = []
    for _ in range(5):
        u = u.stencil.map(step, boundary="periodic", backend="loops")
        want = _step_ref(want)
        assert isinstance(u.data, jax.Array) and u.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(u.data), want)  # bitwise: the loops' rounding
        assert u.name == "u" and u.attrs == {"units": "K"}
        history.append((u, want))
    assert len(ran) == 5, "a call on the last result did not run the loops"
    for i, (r, w) in enumerate(history):  # every step's result is its own
        np.testing.assert_array_equal(np.asarray(r.data), w)
        for other, _ in history[i + 1:]:
            assert not np.shares_memory(np.asarray(r.data), np.asarray(other.data))


def test_jax_input_is_not_mutated_and_out_is_written(ran: list[int]) -> None:
    a = np.random.default_rng(1).random((48, 40), dtype=np.float32)
    x = jnp.asarray(a)
    buf = np.full_like(a, np.nan)
    res = _da(x).stencil.map(step, boundary="periodic", backend="loops", out=buf)
    assert res.data is buf and ran == [1]
    np.testing.assert_array_equal(buf, _step_ref(a))
    np.testing.assert_array_equal(np.asarray(x), a)


def test_a_mesh_on_jax_data_runs_the_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loops.ENV, raising=False)
    seen = count_calls(monkeypatch, loops_mesh, "run_mesh")
    a = np.random.default_rng(2).random((48, 40), dtype=np.float32)
    u = _da(jnp.asarray(a))
    m = u.stencil.mesh(boundary="periodic", backend="loops")
    m[{"y": slice(0, 24)}] = step
    res = m.map()
    want = a.copy()
    want[:24] = _step_ref(a)[:24]
    assert seen == [1], "the mesh on JAX data did not run the loops"
    np.testing.assert_array_equal(np.asarray(res.data), want)


def test_what_the_loops_cannot_read_takes_xla(ran: list[int]) -> None:
    a = np.random.default_rng(3).random((48, 40), dtype=np.float32)
    half = jnp.asarray(a, dtype=jnp.bfloat16)
    res = _da(half).stencil.map(lambda u: u(x=1) - u(x=-1), boundary="periodic",
                                backend="loops")
    assert ran == [] and res.dtype == jnp.bfloat16
    b = np.asarray(half.astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(res.data.astype(jnp.float32)),
                                  np.asarray((jnp.asarray(np.roll(b, -1, 1), jnp.bfloat16)
                                              - jnp.asarray(np.roll(b, 1, 1), jnp.bfloat16))
                                             .astype(jnp.float32)))
    gone = jnp.asarray(a)
    da = _da(gone)
    gone.delete()
    with pytest.raises(RuntimeError, match="deleted"):
        da.stencil.map(step, boundary="periodic", backend="loops")
    assert ran == []

    @jax.jit
    def traced(x: Any) -> Any:
        return _da(x).stencil.map(step, boundary="periodic", backend="loops").data

    np.testing.assert_allclose(np.asarray(traced(jnp.asarray(a))), _step_ref(a), rtol=1e-6,
                               atol=1e-6)
    assert ran == []
