"""The binary exponent that scales the FFT lowering's sums (dense_finite._exponent).

It is read from the bits, not with ``jnp.frexp``: on a TPU v5e (JAX 0.10.2)
``jnp.frexp`` under ``vmap`` failed to compile ("shift-right-arithmetic with
different element types: s32 and u32"), which made every FFT-lowered map
there raise or hang.  The CPU cannot show that failure, so the test pins the
bits reading against numpy's frexp and checks that no frexp is traced.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xstencil._engine.dense_finite import _bits_exponent, _exponent


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_bits_exponent_is_frexps_for_normal_numbers_and_zero(dtype):
    info = np.finfo(dtype)
    rng = np.random.default_rng(0)
    vals = np.concatenate([[0.0, float(info.tiny), 1.0, 0.5, 0.75, 3.0, float(info.max)],
                           np.exp2(rng.uniform(info.minexp, info.maxexp - 1, 200))])
    vals = vals.astype(dtype)
    with jax.enable_x64(dtype == np.float64):
        got = np.asarray(jax.vmap(_bits_exponent)(jnp.asarray(vals)))
    np.testing.assert_array_equal(got, np.frexp(vals)[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exponent_matches_the_host_reading_and_traces_no_frexp(dtype):
    rng = np.random.default_rng(1)
    blocks = [rng.standard_normal((3, 6, 5)) * 10.0 ** rng.integers(-30, 30, (3, 1, 1)),
              np.zeros((2, 4, 4))]
    with jax.enable_x64(dtype == np.float64):
        for a in blocks:
            a = a.astype(dtype)
            a[0, 0, 0] = np.inf  # not finite: not counted
            got = np.asarray(jax.vmap(_exponent)(jnp.asarray(a)))
            np.testing.assert_array_equal(got, [_exponent(b) for b in a])
        text = str(jax.make_jaxpr(jax.vmap(_exponent))(jnp.asarray(blocks[0].astype(dtype))))
    assert "frexp" not in text
