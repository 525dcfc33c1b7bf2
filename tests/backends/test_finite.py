"""``xstencil._backends.finite.all_finite`` against ``np.isfinite(x).all()``."""

from __future__ import annotations

import numpy as np
import pytest

from xstencil._backends.finite import all_finite


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.complex64, np.int32,
                                   np.bool_])
@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf])
def test_matches_numpy(dtype: type, bad: float | None) -> None:
    x = np.random.default_rng(1).random((37, 41)).astype(dtype)
    if bad is not None and np.dtype(dtype).kind in "fc":
        x[36, 40] = bad
    assert all_finite(x) is bool(np.isfinite(x).all())


def test_no_overflow_false_positive_and_cancelling_infinities() -> None:
    big = np.full(1000, np.finfo(np.float64).max)
    assert all_finite(big)  # a plain sum would overflow to inf
    big[3], big[7] = np.inf, -np.inf  # a sum of inf and -inf is NaN, still caught
    assert not all_finite(big)
    assert not all_finite(np.array([np.nan], np.float32))
    assert all_finite(np.zeros((0, 3)))


def test_views_and_non_contiguous() -> None:
    x = np.ones((6, 8))
    x[::2, ::3] = np.inf
    assert not all_finite(x[::2, ::3]) and all_finite(x[1::2])
