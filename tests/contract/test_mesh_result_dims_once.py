"""Mesh.map on a Dataset traces the kernels for the result dims once, like map.

The dims of each result (returns.py) come from a trace of the kernels; map and
mesh share one cached helper, so a repeated ``mesh(...).map()`` does not trace
again, while new kernels get their own trace; a Dataset scan likewise traces
the names its kernel returns once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import xarray as xr

import xstencil._labelled.map as map_module
import xstencil._labelled.scan_setup as scan_module  # where the scan looks its names up
from tests.spies import count_calls


def _ds() -> xr.Dataset:
    return xr.Dataset({"h": (("y", "x"), np.arange(12.0).reshape(3, 4)),
                       "lat": ("y", np.array([10.0, 20.0, 30.0]))},
                      coords={"x": np.arange(4.0), "y": np.arange(3.0)})


def _lat(s: Any) -> Any:
    return {"lat": s.lat() + 1}


def test_repeated_mesh_map_traces_result_dims_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_calls(monkeypatch, map_module, "result_dims")
    ds = _ds()
    m = ds.stencil.mesh()
    m[...] = _lat
    first = m.map()
    second = m.map()
    assert len(calls) == 1
    for res in (first, second):
        assert res.lat.dims == ("y",)
        np.testing.assert_allclose(res.lat.values, ds.lat.values + 1)
    # a new kernel is a new cache entry: traced once more, with its own dims
    m2 = ds.stencil.mesh()
    m2[{"y": [0, 1]}] = lambda s: {"h": s.h() + s.lat()}
    m2[{"y": [2]}] = lambda s: {"h": s.h() * 2}
    res = m2.map()
    assert len(calls) == 2
    assert res.h.dims == ("y", "x")
    want = np.where(ds.y.values[:, None] < 2, ds.h.values + ds.lat.values[:, None],
                    ds.h.values * 2)
    np.testing.assert_allclose(res.h.values, want)


def test_repeated_dataset_scan_traces_the_returned_names_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_calls(monkeypatch, scan_module, "returned")
    ds = xr.Dataset({"h": ("x", np.arange(4.0))}, coords={"x": np.arange(4.0)})

    def step(s: Any) -> Any:
        return {"h": s.h(time=-1) + 1.0}

    outs = [ds.stencil.scan(step, "time", steps=3) for _ in range(2)]
    assert len(calls) == 1
    for out in outs:
        want = ds.h.values[None, :] + np.arange(4.0)[:, None]
        np.testing.assert_allclose(out.h.transpose("time", "x").values, want)
