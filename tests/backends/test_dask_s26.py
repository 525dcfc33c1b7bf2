"""Session 26's attack on the dask path, each case against the in-memory call.

* A float64 array closed over by a kernel, changed in place, with JAX's x64
  flag off: the blocks read the old values (JAX 0.10 keeps its float32 copy
  of a numpy array in a cache keyed by the array object).
* A Dataset kernel returning one value got the dask graph's name as its name.
* Every new field of the same layout compiled the block function again on
  every worker (0.3-0.6 s a call): the compile cache was keyed by the data's
  graph name and the argument values, which the blocks get as arguments.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil

dask = pytest.importorskip("dask")


def test_closure_changed_in_place_is_read_by_the_blocks() -> None:
    w = np.zeros((3, 3))  # float64 weights, float32 data, x64 off
    t = xr.DataArray(np.ones((8, 8), np.float32), dims=("y", "x"))
    kw = dict(window={"y": 3, "x": 3}, boundary="periodic")

    def blur(u):
        return (u * w).sum()

    with dask.config.set(scheduler="threads"):
        t.stencil.map(blur, **kw)
        t.chunk(4).stencil.map(blur, **kw).compute()
        w[:] = 1.0
        mem = t.stencil.map(blur, **kw)
        lazy = t.chunk(4).stencil.map(blur, **kw).compute()
    np.testing.assert_array_equal(mem.values, 9.0)
    np.testing.assert_array_equal(lazy.values, mem.values)


def test_dataset_single_result_has_no_graph_name() -> None:
    ds = xr.Dataset({"a": ("x", np.arange(8.0)), "b": ("x", np.ones(8))})
    k = lambda s: s["a"](x=1) + s["b"]()  # noqa: E731
    lazy = ds.chunk({"x": 4}).stencil.map(k, boundary="periodic")
    assert lazy.name is None
    xr.testing.assert_identical(lazy.compute(), ds.stencil.map(k, boundary="periodic"))


def lap(u):
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def heat(u):
    return u(time=-1) + 0.1 * (u(time=-1, x=1) + u(time=-1, x=-1) - 2 * u(time=-1))


def _field(seed: int) -> xr.DataArray:
    return xr.DataArray(np.random.default_rng(seed).random((32, 32)), dims=("y", "x"))


def test_new_fields_of_one_layout_compile_once() -> None:
    with dask.config.set(scheduler="threads"):
        for seed in range(3):
            before = xstencil.compile_count()
            got = _field(seed).chunk(16).stencil.map(lap, boundary="periodic").compute()
            if seed:
                assert xstencil.compile_count() == before
            xr.testing.assert_allclose(got, _field(seed).stencil.map(lap, boundary="periodic"))
        for seed in range(3):
            before = xstencil.compile_count()
            got = _field(seed).chunk(16).stencil.scan(heat, "time", steps=4, save_every="last",
                                                       halo_every=2).compute()
            if seed:
                assert xstencil.compile_count() == before
            want = _field(seed).stencil.scan(heat, "time", steps=4, save_every="last")
            xr.testing.assert_allclose(got, want)
