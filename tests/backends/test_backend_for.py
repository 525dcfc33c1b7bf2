"""Choosing a backend from the arrays, the ``devices=`` keyword (``mesh=``
deprecated), deterministic dask tokens, and per-call option names."""

from __future__ import annotations

import threading
from typing import Any

import dask.array as dsa
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers .stencil
from tests.fields import field, heat, same
from xstencil import XStencilError
from xstencil._backends import backend_for
from xstencil._backends.dask_base import token


def lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) - 2 * u()


def test_backend_for_raw_arrays():
    assert backend_for([np.zeros(3)]) == "memory"
    assert backend_for([jnp.zeros(3), np.zeros(3)]) == "memory"
    assert backend_for([np.zeros(3), dsa.zeros(3, chunks=2)]) == "dask"
    assert backend_for([np.zeros(3)], devices={"x": "i"}) == "shard"
    with pytest.raises(XStencilError, match=r"f\(\): devices=\{'x': 'i'\} shards JAX arrays "
                                            r".*dask array; drop devices="):
        backend_for([dsa.zeros(3, chunks=2)], "f()", devices={"x": "i"})


def test_devices_keyword_and_deprecated_mesh_alias():
    da = field(shape=(6, 8))
    ref = da.stencil.map(lap, boundary="periodic")
    out = da.stencil.map(lap, boundary="periodic", devices={"x": "i"})  # one device here
    same(out, ref)
    with pytest.warns(DeprecationWarning, match=r"mesh= is deprecated .*pass "
                                                r"devices=\{'x': 'i'\} instead"):
        old = da.stencil.map(lap, boundary="periodic", mesh={"x": "i"})
    same(old, ref)
    with pytest.raises(XStencilError, match=r"devices=.* and mesh=.* both given; mesh= is the "
                                            r"old name of devices="):
        da.stencil.map(lap, devices={"x": "i"}, mesh={"x": "i"})
    kw = dict(steps=3, boundary="periodic")
    with pytest.warns(DeprecationWarning, match=r"pass devices="):
        old = da.stencil.scan(heat, "time", mesh={"x": "i"}, **kw)
    same(old, da.stencil.scan(heat, "time", **kw), rtol=1e-5)
    with pytest.warns(DeprecationWarning, match=r"mesh\(\.\.\.\): mesh= is deprecated"):
        m = da.stencil.mesh(boundary="periodic", mesh={"x": "i"})
    m[...] = lap
    same(m.map(), ref)


def test_unpicklable_kernel_on_dask_gets_a_deterministic_token():
    """Kernels are tokenized by what they read (``_engine/ktoken``), not by
    pickling: one closing over a lock runs on dask, names the same graph on
    each call, and matches the in-memory result."""
    lock = threading.Lock()

    def locked(u: Any) -> Any:
        with lock:
            return u(x=1) - u()

    da = field(shape=(6, 8)).chunk({"x": 4})
    first = da.stencil.map(locked, boundary="periodic")
    again = da.stencil.map(locked, boundary="periodic")
    assert first.data.name == again.data.name
    np.testing.assert_allclose(first.values, np.roll(da.values, -1, axis=1) - da.values)


def test_an_untokenizable_graph_part_raises_instead_of_a_random_token():
    class Unpicklable:
        def __reduce__(self) -> Any:
            raise TypeError("cannot pickle Unpicklable")

    with pytest.raises(XStencilError, match=r"f\(\): the kernel or its arguments cannot be "
                                            r"tokenized deterministically by dask"
                                            r".*make the kernel picklable"):
        token("f()", "xstencil-map", Unpicklable())


def test_a_typo_in_map_lists_map_options_only():
    da = xr.DataArray(np.arange(4.0), dims="x")
    with pytest.raises(XStencilError, match=r"did you mean boundary=") as info:
        da.stencil.map(lap, bondary="periodic")
    assert "'stride'" in str(info.value) and "save_every" not in str(info.value)
    with pytest.raises(XStencilError, match=r"did you mean save_every=") as info:
        da.stencil.scan(lambda u: u(time=-1), "time", steps=2, save_evry=1)
    assert "'halo_every'" in str(info.value) and "'stride'" not in str(info.value)
