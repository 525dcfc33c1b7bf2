"""Gradients through every entry point, checked against finite differences
with ``jax.test_util.check_grads`` (orders 1 and 2, forward and reverse).

The checks run in float64 (the ``x64`` fixture): finite differences in
float32 are too coarse to check second derivatives.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from jax.test_util import check_grads

import xstencil

MODES = ["fwd", "rev"]
ORDERS = [1, 2]
TOL = {"atol": 1e-5, "rtol": 1e-5}


def _data(shape: tuple[int, ...] = (5, 6), seed: int = 0) -> Any:
    return jnp.asarray(np.random.default_rng(seed).uniform(0.5, 1.5, shape))


def smooth(u: Any) -> Any:
    """Nonlinear in the window, so second derivatives are not trivially zero."""
    return u(x=1) * u(y=-1) + jnp.sin(u()) - 0.3 * u(x=-1) ** 2


def weighted(u: Any, w: Any, nu: Any) -> Any:
    return (u * w).sum() + nu * jnp.tanh(u())


def cube(u: Any) -> Any:
    return u(x=1) ** 3


def decay(u: Any) -> Any:
    return jnp.exp(-u(y=1))


def product(u: Any) -> Any:
    return u() * u(x=-1)


def two_fields(s: Any) -> Any:
    return {"u": s["u"](x=1) * s["h"](x=-1), "h": jnp.cos(s["h"]()) + s["h"](x=1) ** 2}


MASK = xr.DataArray(np.asarray(_data()) > 1.2, dims=("y", "x"))


def _grad_check(fn: Any, args: tuple[Any, ...], order: int, mode: str) -> None:
    # under jit the labelled call (and a mesh built inside fn) is traced once per
    # derivative, not once per finite-difference evaluation
    check_grads(jax.jit(fn), args, order=order, modes=[mode], **TOL)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("boundary", ["periodic", "fill"])
def test_map_wrt_data(x64: None, order: int, mode: str, boundary: str) -> None:
    def fn(a: Any) -> Any:
        return xr.DataArray(a, dims=("y", "x")).stencil.map(smooth, boundary=boundary,
                                                            fill_value=0.5).data

    _grad_check(fn, (_data(),), order, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("order", ORDERS)
def test_map_wrt_kernel_argument_and_window_array(x64: None, order: int, mode: str) -> None:
    da = xr.DataArray(np.asarray(_data()), dims=("y", "x"))

    def fn(w: Any, nu: Any) -> Any:
        out = da.stencil.map(weighted, w, nu, window={"y": 3, "x": 3}, boundary="extend")
        return out.data

    _grad_check(fn, (_data((3, 3), 1), jnp.float64(0.7)), order, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("order", ORDERS)
def test_mesh(x64: None, order: int, mode: str) -> None:
    def fn(a: Any) -> Any:
        da = xr.DataArray(a, dims=("y", "x"), coords={"x": np.arange(6.0)})
        m = da.stencil.mesh(boundary="symmetric")
        m[...] = smooth
        m[{"x": 0}] = cube
        m.loc[{"x": slice(4.0, None)}] = decay
        m[MASK] = product  # a mask must be concrete: it picks the kernels statically
        return m.map().data

    _grad_check(fn, (_data(),), order, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("order", ORDERS)
def test_dataset_kernel(x64: None, order: int, mode: str) -> None:
    def fn(u: Any, h: Any) -> Any:
        ds = xr.Dataset({"u": (("y", "x"), u), "h": (("x",), h)})
        out = ds.stencil.map(two_fields, boundary="periodic")
        return out["u"].data, out["h"].data

    _grad_check(fn, (_data(), _data((6,), 2)), order, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("order", ORDERS)
def test_kmap(x64: None, order: int, mode: str) -> None:
    @xstencil.kmap(kernel_size=(3, 3), padding="same", boundary="periodic", relative=True)
    def f(x: Any) -> Any:
        return x[1, 0] * x[0, -1] + jnp.sin(x[0, 0])

    _grad_check(f, (_data(),), order, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("order", ORDERS)
def test_kscan(x64: None, order: int, mode: str) -> None:
    @xstencil.kscan(kernel_size=(3,), padding="same", relative=True)
    def f(x: Any) -> Any:
        return 0.5 * x[-1] + jnp.sin(x[0]) * x[1]

    _grad_check(f, (_data((7,)),), order, mode)


needs_scan = pytest.mark.skipif(not hasattr(xstencil, "scan"),
                                reason="xstencil.scan has not landed yet")


@needs_scan
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("order", ORDERS)
def test_scan(x64: None, order: int, mode: str) -> None:
    def heat(u: Any, nu: Any) -> Any:
        lap = u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1)
        return u(time=-1) + nu * lap + 0.1 * jnp.sin(u(time=-1))

    def fn(a: Any, nu: Any) -> Any:
        u0 = xr.DataArray(a, dims="x")
        return u0.stencil.scan(heat, dim="time", nu=nu, steps=4,
                               boundary={"x": "periodic"}).data

    _grad_check(fn, (_data((6,)), jnp.float64(0.2)), order, mode)
