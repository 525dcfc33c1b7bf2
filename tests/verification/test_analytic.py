"""Analytic solutions: the heat kernel, advection by exact shift and
d'Alembert's wave solution, all on periodic domains.

Time stepping runs as a jitted ``lax.fori_loop`` whose body is one
``.stencil.map`` step on a DataArray (or Dataset) of traced values; the same
solutions through ``xstencil.scan`` are checked once the scan lands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from jax import lax

import xstencil

NU, T0, T_END, L = 1.0, 0.05, 0.1, 10.0
R = 0.25  # nu * dt / dx**2


def loop_of_maps(obj: xr.DataArray | xr.Dataset, kernel: Callable[..., Any], steps: int,
                 **options: Any) -> Any:
    """``steps`` applications of ``obj.stencil.map(kernel)``, jitted as one loop."""
    if isinstance(obj, xr.Dataset):
        names = list(obj.data_vars)

        def body(_: Any, state: Any) -> Any:
            ds = xr.Dataset({n: (obj[n].dims, a) for n, a in zip(names, state, strict=True)})
            out = ds.stencil.map(kernel, **options)
            return tuple(out[n].data for n in names)

        init: Any = tuple(jnp.asarray(obj[n].data) for n in names)
    else:
        def body(_: Any, a: Any) -> Any:
            return xr.DataArray(a, dims=obj.dims).stencil.map(kernel, **options).data

        init = jnp.asarray(obj.data)
    return jax.jit(lambda s: lax.fori_loop(0, steps, body, s))(init)


def gaussian(x: np.ndarray, t: float) -> np.ndarray:
    return np.exp(-(x**2) / (4 * NU * t)) / np.sqrt(4 * np.pi * NU * t)


def heat_setup(n: int) -> tuple[np.ndarray, xr.DataArray, int]:
    dx = L / n
    x = -L / 2 + dx * np.arange(n)
    steps = round(T_END * NU / (R * dx**2))
    assert np.isclose(steps * R * dx**2, T_END * NU)
    return x, xr.DataArray(gaussian(x, T0), dims="x", coords={"x": x}), steps


def ftcs(u: Any) -> Any:
    return u() + R * (u(x=1) - 2 * u() + u(x=-1))


def test_heat_kernel_gaussian_spreading(x64: None) -> None:
    """Explicit Euler from a Gaussian follows the heat kernel: second-order
    convergence (dt ~ dx^2), mass conserved, variance growing as 2 nu t."""
    ns = (50, 100, 200)
    errors = []
    for n in ns:
        x, u0, steps = heat_setup(n)
        u = np.asarray(loop_of_maps(u0, ftcs, steps, boundary="periodic"))
        assert u.dtype == np.float64
        errors.append(float(np.max(np.abs(u - gaussian(x, T0 + T_END)))))
        dx = L / n
        assert np.sum(u) * dx == pytest.approx(np.sum(u0.values) * dx, rel=1e-12)
    variance = np.sum(x**2 * u) / np.sum(u)
    assert variance == pytest.approx(2 * NU * (T0 + T_END), rel=1e-3)
    p = [np.log2(errors[i] / errors[i + 1]) for i in range(len(ns) - 1)]
    text = "heat equation (FTCS, r = 1/4) vs heat kernel\n" + "\n".join(
        f"N={n:>4} error={e:.3e}" + (f" order={p[i - 1]:.3f}" if i else "")
        for i, (n, e) in enumerate(zip(ns, errors, strict=True)))
    print("\n" + text)
    assert abs(p[-1] - 2) < 0.1, text


def f(x: np.ndarray) -> np.ndarray:
    return np.exp(np.sin(2 * np.pi * x))


def test_advection_by_exact_shift(x64: None) -> None:
    """Upwind at CFL 1 moves the profile by exactly one cell per step."""
    n, steps = 64, 37
    x = np.arange(n) / n
    u0 = xr.DataArray(f(x), dims="x")
    u = loop_of_maps(u0, lambda u: u() - 1.0 * (u() - u(x=-1)), steps, boundary="periodic")
    np.testing.assert_allclose(np.asarray(u), np.roll(u0.values, steps), rtol=0, atol=1e-13)
    np.testing.assert_allclose(np.asarray(u), f((x - steps / n) % 1.0), rtol=0, atol=1e-13)


def leapfrog(s: Any) -> Any:
    """u_tt = c^2 u_xx at c dt = dx: u[n+1] = u[n](x+1) + u[n](x-1) - u[n-1]."""
    return {"u": s["u"](x=1) + s["u"](x=-1) - s["v"](), "v": s["u"]()}


def test_dalembert_wave_solution(x64: None) -> None:
    """At CFL 1 the leapfrog scheme reproduces d'Alembert's solution
    (f(x - ct) + f(x + ct)) / 2 of an initial displacement at rest."""
    n, steps = 64, 100
    dx = 1.0 / n
    x = np.arange(n) * dx
    ds = xr.Dataset({"u": ("x", (f(x - dx) + f(x + dx)) / 2), "v": ("x", f(x))})
    u, _ = loop_of_maps(ds, leapfrog, steps, boundary="periodic")
    t = (steps + 1) * dx  # c = 1
    exact = (f((x - t) % 1.0) + f((x + t) % 1.0)) / 2
    np.testing.assert_allclose(np.asarray(u), exact, rtol=0, atol=1e-11)


needs_scan = pytest.mark.skipif(not hasattr(xstencil, "scan"),
                                reason="xstencil.scan has not landed yet")


@needs_scan
def test_heat_kernel_through_scan(x64: None) -> None:
    """The scan gives the loop of maps' numbers, hence the heat kernel."""
    x, u0, steps = heat_setup(100)

    def heat(u: Any) -> Any:
        return u(time=-1) + R * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))

    out = u0.stencil.scan(heat, dim="time", steps=steps, save_every="last",
                          boundary={"x": "periodic"})
    assert out.dtype == np.float64 and out.dims == ("x",)
    loop = np.asarray(loop_of_maps(u0, ftcs, steps, boundary="periodic"))
    np.testing.assert_allclose(out.values, loop, rtol=0, atol=1e-14)
    np.testing.assert_allclose(out.values, gaussian(x, T0 + T_END), rtol=0, atol=2e-3)


@needs_scan
def test_dalembert_through_scan(x64: None) -> None:
    """The wave equation as a two-level scan along time (u(time=-2) is the
    level before last) reproduces d'Alembert's solution at CFL 1."""
    n, steps = 64, 50
    dx = 1.0 / n
    x = np.arange(n) * dx
    u01 = xr.DataArray(np.stack([f(x), (f(x - dx) + f(x + dx)) / 2]), dims=("time", "x"))

    def wave(u: Any) -> Any:
        return u(time=-1, x=1) + u(time=-1, x=-1) - u(time=-2)

    out = u01.stencil.scan(wave, dim="time", steps=steps, boundary={"x": "periodic"})
    assert out.sizes["time"] == steps + 2
    for k in (0, 1, 17, steps + 1):
        t = k * dx
        exact = (f((x - t) % 1.0) + f((x + t) % 1.0)) / 2
        np.testing.assert_allclose(out.isel(time=k).values, exact, rtol=0, atol=1e-11)


@needs_scan
def test_advection_shift_through_scan(x64: None) -> None:
    n, steps = 32, 45
    x = np.arange(n) / n
    u0 = xr.DataArray(f(x), dims="x")
    out = u0.stencil.scan(lambda u: u(time=-1, x=-1), dim="time", steps=steps,
                          boundary={"x": "periodic"}, save_every="last")
    np.testing.assert_array_equal(out.values, np.roll(u0.values, steps))
