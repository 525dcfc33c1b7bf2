"""A repeated ``scan(step=...)`` does not trace its step again.

The state's dtype (the input's promoted with the step's result) was found by
tracing the step with ``jax.eval_shape`` on every call: 40 ms of a 2-step
call on 256² (the TV-denoising port, tests/contract/test_port_skimage_tv.py).
It is now found once per step, layout and what the step reads; a change of
any of them (a global the step reads, an argument's dtype) finds it again.
"""

from __future__ import annotations

import jax
import numpy as np
import xarray as xr

import xstencil  # noqa: F401 - registers the .stencil accessor

U0 = xr.DataArray(np.zeros((4, 5), np.float32), dims=("y", "x"))
FACTOR = 1.0
CALLS = []


def step(s: xr.DataArray) -> xr.DataArray:
    CALLS.append(1)
    return s.stencil.map(lambda u: u(x=1), boundary="periodic") + FACTOR


def test_repeated_step_scan_traces_nothing() -> None:
    global FACTOR
    FACTOR = 1.0
    first = U0.stencil.scan(None, "t", step=step, steps=3, save_every="last")
    # the first trace wrote to CALLS: from now on it is keyed by identity (a
    # counter), which the second call records
    U0.stencil.scan(None, "t", step=step, steps=3, save_every="last")
    CALLS.clear()
    again = U0.stencil.scan(None, "t", step=step, steps=3, save_every="last")
    assert CALLS == []
    np.testing.assert_array_equal(first.values, again.values)
    np.testing.assert_array_equal(again.values, 3.0)
    assert again.dtype == np.float32


def test_the_step_result_dtype_is_found_again_when_a_global_changes() -> None:
    global FACTOR
    FACTOR = 1.0
    U0.stencil.scan(None, "t", step=step, steps=2, save_every="last")
    FACTOR = np.complex64(1j)  # the state widens to complex64 now
    with jax.numpy_dtype_promotion("standard"):
        out = U0.stencil.scan(None, "t", step=step, steps=2, save_every="last")
    FACTOR = 1.0
    assert out.dtype == np.complex64
    np.testing.assert_array_equal(out.values, 2j)


def test_an_argument_of_another_dtype_widens_the_state() -> None:
    f = lambda s, c: s + c  # noqa: E731
    a = U0.stencil.scan(None, "t", np.float32(1), step=f, steps=2, save_every="last")
    with jax.numpy_dtype_promotion("standard"):
        b = U0.stencil.scan(None, "t", np.complex64(1j), step=f, steps=2, save_every="last")
    assert a.dtype == np.float32 and b.dtype == np.complex64
    np.testing.assert_array_equal(b.values, 2j)
