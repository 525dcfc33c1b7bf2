"""Side by side with kernex 0.2.1: every case of tests/kernex_cases.py run
with ``lib=xstencil`` against the outputs that kernex itself produced
(tests/data/kernex_reference.npz).

Cases where xstencil deliberately differs (``DIVERGENT``) or where kernex
does something the docs do not settle (``QUIRKS``) assert xstencil's
documented behaviour instead, case by case, below.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import xstencil

TESTS = Path(__file__).resolve().parents[1]
DATA = TESTS / "data" / "kernex_reference.npz"

try:
    kc = importlib.import_module("tests.kernex_cases")
except ImportError:  # pragma: no cover - the case file is part of the repository
    kc = None

pytestmark = pytest.mark.skipif(
    kc is None or not DATA.exists(),
    reason="tests/kernex_cases.py or tests/data/kernex_reference.npz is missing "
           "(regenerate with tests/data/make_kernex_reference.py)",
)

A6 = np.arange(1.0, 7.0, dtype=np.float32)


def _names() -> list[str]:
    if kc is None:
        return []
    return sorted(kc.CASES) + sorted(f"{n}__f64" for n in kc.F64_CASES)


@pytest.fixture(scope="module")
def expected() -> Any:
    with np.load(DATA) as archive:
        return {k: archive[k] for k in archive.files}


def run(name: str) -> np.ndarray:
    # kernex users write kernels under JAX's default (standard) promotion,
    # e.g. an int window times 0.5; the tests' strict mode would reject them.
    with jax.numpy_dtype_promotion("standard"):
        if name.endswith("__f64"):
            with jax.enable_x64(True):
                return np.asarray(kc.run_case(name, xstencil))
        return np.asarray(kc.run_case(name, xstencil))


def assert_matches(out: np.ndarray, ref: np.ndarray, name: str) -> None:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    tol = 1e-12 if ref.dtype == np.float64 else 1e-5
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol, err_msg=name)


# kmap follows the kernel's dtype, as kernex does (with uncovered="input" it
# promotes with the input's, so that cells keeping the input fit).
DTYPE_DIFFERENCES: dict[str, object] = {}

SPECIAL = set(getattr(kc, "DIVERGENT", {})) | set(getattr(kc, "QUIRKS", {}))


@pytest.mark.parametrize("name", [n for n in _names() if n.split("__")[0] not in SPECIAL])
def test_same_numbers_as_kernex(name, expected):
    assert name in expected, f"{name} has no stored kernex output; regenerate the archive"
    out = run(name)
    ref = expected[name]
    assert_matches(out, ref, name)
    assert out.dtype == DTYPE_DIFFERENCES.get(name, ref.dtype)


def test_every_stored_output_has_a_case(expected):
    assert set(expected) - {"__meta__"} == set(_names())
    assert set(kc.DIVERGENT) | set(kc.QUIRKS) <= set(kc.CASES)


# -- documented differences (DESIGN.md section 3, docstring of xstencil.kmap) ---------

def test_divergent_read_outside_the_window_raises():
    # kernex rolls the window, so x[2] in a size-3 window silently reads x[-1]
    with pytest.raises(IndexError, match=r"offset 2 .*outside the window"):
        run("quirk_relative_wrap_read")


# -- kernex quirks that the docs do not settle: what xstencil does --------------------

def test_quirks_that_match_kernex(expected):
    """relative=True passes the rolled window (index 0 is the centre) when the
    kernel uses it as an array, as kernex does."""
    for name in ("quirk_relative_window_array_rolled", "quirk_relative_return_window"):
        assert_matches(run(name), expected[name], name)


def test_quirk_stepped_slices_follow_numpy(expected):
    # kernex tests pos % step == 0, so f[1::2] hits 2 and 4; numpy slicing hits 1, 3, 5
    np.testing.assert_array_equal(run("quirk_mesh_step_offset"), [1, 200, 3, 400, 5, 600])
    np.testing.assert_array_equal(expected["quirk_mesh_step_offset"], [1, 2, 300, 4, 500, 6])


def test_quirk_later_assignment_wins_even_for_a_reused_function():
    # kernex orders regions by each function's first registration
    np.testing.assert_array_equal(run("quirk_mesh_reassign_same_fn"), [1, 20, 3, 40, 50, 60])


def test_quirk_mesh_indices_are_output_positions():
    # 'valid' on 6 cells: outputs 0..3 with centres 1..4; f[1] is output 1
    # (x[0] = 3), f[-1] is output 3 (x[0] = 5)
    np.testing.assert_array_equal(run("quirk_mesh_valid_centre_index"), [2, 300, 4, 5000])
    # 'same' with stride 2 has 3 outputs, so f[3] is out of range
    with pytest.raises(xstencil.XStencilError, match=r"mesh index 3 is out of range"):
        run("quirk_mesh_stride_centre_index")


def test_quirk_named_axes_are_centre_relative_even_when_not_relative():
    # kernex indexes the un-rolled window with centre-relative names, so 'i-1'
    # wraps to the last cell; xstencil reads the left neighbour
    out = run("quirk_named_axis_absolute")
    np.testing.assert_array_equal(out, np.stack([A6[:-2], A6[1:-1], A6[2:]], axis=1))


def test_quirk_scan_kwargs_do_not_change_the_result(expected):
    # kernex's scan_kwargs={'reverse': True} walks last-to-first; xstencil accepts
    # and ignores execution options, so this is the plain row-major kscan
    np.testing.assert_array_equal(run("quirk_kscan_reverse"), expected["beh_kscan_same_sum3"])
    assert not np.array_equal(expected["quirk_kscan_reverse"], expected["beh_kscan_same_sum3"])


def test_every_special_case_is_covered_here():
    covered = {
        "quirk_relative_wrap_read", "quirk_relative_window_array_rolled",
        "quirk_relative_return_window", "quirk_mesh_step_offset",
        "quirk_mesh_reassign_same_fn", "quirk_mesh_valid_centre_index",
        "quirk_mesh_stride_centre_index", "quirk_named_axis_absolute", "quirk_kscan_reverse",
    }
    assert SPECIAL == covered, "a new DIVERGENT/QUIRKS case needs its own test here"
