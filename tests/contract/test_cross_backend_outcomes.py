"""The cross-backend cases compare outcomes, so a case that raised the same
error on every backend would pass them; here the in-memory outcome of each
case is pinned: the ordinary scans succeed, and a bad ``save_every`` raises."""

from __future__ import annotations

import numpy as np
import pytest

from tests.contract.cross_backend_cases import CASES, run

#: Ordinary scans, which must give a result (not an error) on every backend.
SUCCEED = ["da-grown", "da-grown-every-3", "da-grown-last", "da-trajectory",
           "da-trajectory-every-2", "da-trajectory-last", "da-time-coordinate-dt",
           "da-time-coordinate-given", "ds-grown", "ds-trajectory-with-forcing",
           "mesh-position", "mesh-label", "mesh-mask", "unread-unsorted-time-coordinate",
           "ds-trajectory-constant-first"]


@pytest.mark.parametrize("name", SUCCEED)
def test_ordinary_case_succeeds_in_memory(name: str) -> None:
    assert name in CASES
    out = run(name, "memory")
    assert out[0] == "ok", out
    values = out[1].to_array().values if hasattr(out[1], "data_vars") else out[1].values
    assert np.isfinite(values).all(), name


def test_bad_save_every_is_an_error() -> None:
    out = run("bad-save-every", "memory")
    assert out[0] == "error" and "save_every" in out[2], out


def test_growing_with_a_kernel_that_reads_ahead_is_an_error() -> None:
    out = run("grown-reading-ahead", "memory")
    assert out[0] == "error" and "reads u at offset >= 0 along 'time'" in out[2], out
