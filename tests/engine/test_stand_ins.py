"""Stand-ins for tracing are built with the dtype JAX can hold at that moment.

JAX 0.11 warns (an error under ``filterwarnings = error``) when a
``ShapeDtypeStruct`` asks for float64 with x64 off, and narrows it at
construction; 0.10 narrowed it silently when traced.  xstencil builds every
stand-in through :func:`xstencil._engine.call.stand_in`, inside the x64 block
of the call that traces it, so 64-bit data keeps 64-bit stand-ins on both.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jax
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401
from xstencil._engine.call import stand_in

PACKAGE = Path(xstencil.__file__).parent


@pytest.mark.parametrize("dtype, narrow", [(np.float64, np.float32), (np.int64, np.int32),
                                           (np.uint64, np.uint32), (np.complex128, np.complex64),
                                           (np.float32, np.float32), (np.uint8, np.uint8)])
def test_stand_in_narrows_only_with_x64_off(dtype, narrow):
    with jax.enable_x64(False):
        assert stand_in((2, 3), dtype).dtype == narrow
    with jax.enable_x64(True):
        s = stand_in((2, 3), dtype)
        assert s.dtype == dtype and s.shape == (2, 3)


def test_every_stand_in_goes_through_the_helper():
    # a bare ShapeDtypeStruct of a data dtype would warn on JAX 0.11 and be
    # narrowed outside the x64 block; only fixed 32-bit ones may be built directly
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "ShapeDtypeStruct"):
                src = ast.unparse(node)
                if path.name == "call.py" or "int32" in src:
                    continue
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {src}")
    assert not offenders, offenders


@pytest.mark.parametrize("chunked", [False, True])
def test_float64_dataset_with_coords_keeps_float64_and_does_not_warn(chunked):
    x = np.linspace(0.0, 1.0, 9)
    ds = xr.Dataset({"a": ("x", x**2), "b": ("x", np.cos(x))}, coords={"x": x})
    if chunked:
        pytest.importorskip("dask")
        ds = ds.chunk({"x": 4})
    out = ds.stencil.map(lambda s: {"a": s["a"](x=1) * s["b"]() / s["a"].coord("x")(x=1)},
                         boundary="nearest")
    # past the last point the coordinate continues with its spacing (1.125)
    xs = np.append(x[1:], x[-1] + (x[1] - x[0]))
    ref = np.append(x[1:], x[-1]) ** 2 * np.cos(x) / xs
    assert out["a"].dtype == np.float64
    np.testing.assert_allclose(out["a"].values, ref, rtol=1e-14)
