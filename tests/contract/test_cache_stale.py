"""A cache may only make things faster, never different (issue 12, section 1).

Each test changes something a kernel reads between two calls (a class
attribute, a global read by a helper, a global read by the kernel itself, the
sign of a closed-over zero, a module global read by a dask-mapped kernel) and
checks every result against a numpy reference.  Before the kernel cache keyed
on what kernels read, each of these returned the first call's result again.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import hypothesis.strategies as st
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings

import xstencil


def _data(n: int = 12) -> xr.DataArray:
    x = np.random.default_rng(0).normal(size=n).astype(np.float32)
    return xr.DataArray(x, dims="x", coords={"x": np.arange(n) * 0.5}, name="u")


def _lap(x: np.ndarray) -> np.ndarray:
    """Periodic second difference, by hand."""
    return np.roll(x, -1) - 2 * x + np.roll(x, 1)


class Cfg:
    nu = 1.0


def test_class_attribute_sweep_in_map() -> None:
    da = _data()
    for nu in (1.0, 2.0, 3.0):
        Cfg.nu = nu
        out = da.stencil.map(lambda u: Cfg.nu * (u(x=1) - 2 * u() + u(x=-1)),
                             boundary="periodic")
        np.testing.assert_allclose(out.values, nu * _lap(da.values), rtol=1e-6, atol=1e-6)


def test_class_attribute_sweep_in_scan() -> None:
    u0 = _data()
    for nu in (0.1, 0.2):
        Cfg.nu = nu
        traj = u0.stencil.scan(lambda u: u(time=-1) + Cfg.nu * (
            u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1)),
            dim="time", steps=3, boundary="periodic")
        ref = [u0.values.astype(np.float64)]
        for _ in range(3):
            ref.append(ref[-1] + nu * _lap(ref[-1]))
        np.testing.assert_allclose(traj.values, np.stack(ref), rtol=1e-5, atol=1e-6)


ALPHA = 1.0


def _helper(x: Any) -> Any:
    return ALPHA * x


def test_global_helper_reading_a_changed_global() -> None:
    global ALPHA
    da = _data()
    outs = []
    for alpha in (1.0, 2.0):
        ALPHA = alpha
        outs.append(da.stencil.map(lambda u: _helper(u(x=1)), boundary="periodic").values)
    np.testing.assert_allclose(outs[0], np.roll(da.values, -1))
    np.testing.assert_allclose(outs[1], 2 * np.roll(da.values, -1))


GNUM = 1


def _gnum_kernel(u: Any) -> Any:
    return u() + GNUM


def test_same_def_kernel_reading_a_changed_numeric_global() -> None:
    global GNUM
    da = _data()
    for g in (1, 2):
        GNUM = g
        out = da.stencil.map(_gnum_kernel)
        np.testing.assert_allclose(out.values, da.values + g)


def _signed(z: float) -> Any:
    return lambda u: jnp.copysign(jnp.ones_like(u()), z) * u()


def test_zero_and_negative_zero_do_not_share_code() -> None:
    da = xr.DataArray(np.array([1.0, 2.0, 3.0], np.float32), dims="x")
    pos = da.stencil.map(_signed(0.0))
    neg = da.stencil.map(_signed(-0.0))
    np.testing.assert_array_equal(pos.values, da.values)
    np.testing.assert_array_equal(neg.values, -da.values)


def test_dask_module_level_kernel_reading_a_changed_module_global(tmp_path: Any,
                                                                  monkeypatch: Any) -> None:
    """dask tokenizes an importable module-level function by its name; the
    graph (and the per-process compiled block function) must still change
    when a module global the kernel reads changes."""
    pytest.importorskip("dask.array")
    (tmp_path / "_xs_nu_kernel.py").write_text(
        "NU = 3.0\n\n\ndef kernel(u):\n    return NU * (u(x=1) - u(x=-1))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("_xs_nu_kernel")
    try:
        da = _data(16).chunk({"x": 8})
        ref = np.roll(da.values, -1) - np.roll(da.values, 1)
        for nu in (3.0, 4.0):
            mod.NU = nu
            out = da.stencil.map(mod.kernel, boundary="periodic")
            np.testing.assert_allclose(out.compute().values, nu * ref, rtol=1e-6)
    finally:
        sys.modules.pop("_xs_nu_kernel", None)


# -- a property test: mutate what a kernel reads, compare with an uncached run -----------

HG = 1.0


class HCls:
    a = 1.0


def _make_kernel() -> tuple[Any, Any]:
    c = 1.0

    def kernel(u: Any, d: float = 1.0) -> Any:
        return HG * u(x=1) + c * u() + HCls.a * u(x=-1) + d

    def set_cell(v: float) -> None:
        nonlocal c
        c = v

    return kernel, set_cell


_KERNEL, _SET_CELL = _make_kernel()
_values = st.sampled_from([0.0, -0.0, 1.0, -2.5, 3.0, 0.5])


@settings(max_examples=12)
@given(g=_values, cell=_values, attr=_values, default=_values,
       fresh=st.booleans(), mesh=st.booleans())
def test_mutations_match_an_uncached_run(g: float, cell: float, attr: float,
                                         default: float, fresh: bool, mesh: bool) -> None:
    global HG
    HG, HCls.a = g, attr
    _SET_CELL(cell)
    _KERNEL.__defaults__ = (default,)
    da = _data(8)
    kernel = _KERNEL if not fresh else (lambda u: _KERNEL(u))  # a fresh wrapper

    def run() -> np.ndarray:
        if mesh:
            m = da.stencil.mesh(boundary="periodic")
            m[...] = kernel
            return np.asarray(m.map().values)
        return np.asarray(da.stencil.map(kernel, boundary="periodic").values)

    cached = run()
    xstencil.clear_caches()
    uncached = run()
    x = da.values
    ref = g * np.roll(x, -1) + cell * x + attr * np.roll(x, 1) + default
    np.testing.assert_array_equal(cached, uncached)
    np.testing.assert_allclose(cached, ref, rtol=1e-6, atol=1e-6)


_NS = types.SimpleNamespace(a=2.0)
_PARAMS = {"nu": 1.0}


def _ns_kernel(u: Any) -> Any:
    return u() * _NS.a + _PARAMS["nu"]


def test_namespace_attribute_and_dict_item_on_the_same_def_kernel() -> None:
    da = _data()
    for a, nu in ((2.0, 1.0), (3.0, 1.0), (3.0, 5.0)):
        _NS.a, _PARAMS["nu"] = a, nu
        out = da.stencil.map(_ns_kernel)
        np.testing.assert_allclose(out.values, da.values * a + nu, rtol=1e-6)
