"""Order of accuracy of an explicit heat-equation scan (FTCS).

``u_t = nu u_xx`` on the periodic unit interval with ``u0 = sin(2 pi x)``.

* Time: at a fixed grid the semi-discrete system has the exact solution
  ``exp(nu lam_h t) sin(2 pi x)`` with ``lam_h = -(4 / dx^2) sin^2(pi dx)``;
  halving ``dt`` must halve the error against it (first order).
* Space: with ``dt = r dx^2 / nu`` (fixed ``r = 1/4``) the error against the
  PDE's exact solution ``exp(-4 pi^2 nu t) sin(2 pi x)`` falls as ``dx^2``
  (second order; the time error is ``O(dt) = O(dx^2)`` too).

The observed orders, ``log2(e_h / e_{h/2})``, are asserted within 0.1 of theory.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor

NU, T = 1.0, 0.01


def heat(u, r):
    return u(time=-1) + r * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


def _final(nx: int, steps: int) -> tuple[np.ndarray, np.ndarray, float]:
    x = np.arange(nx) / nx
    dx, dt = 1.0 / nx, T / steps
    u0 = xr.DataArray(np.sin(2 * np.pi * x), dims="x", coords={"x": x})
    out = u0.stencil.scan(heat, "time", NU * dt / dx**2, steps=steps, dt=dt,
                          save_every="last", boundary="periodic")
    np.testing.assert_allclose(float(out["time"]), T)
    return x, out.values, dx


def _orders(errors: list[float]) -> np.ndarray:
    e = np.asarray(errors)
    return np.log2(e[:-1] / e[1:])


def test_first_order_in_time(x64):
    nx = 32
    rows = []
    for steps in (40, 80, 160, 320):
        x, u, dx = _final(nx, steps)
        lam = -(4 / dx**2) * np.sin(np.pi * dx) ** 2
        exact = np.exp(NU * lam * T) * np.sin(2 * np.pi * x)
        rows.append((T / steps, np.abs(u - exact).max()))
    orders = _orders([e for _, e in rows])
    table = "\n".join(f"dt={dt:.2e}  error={e:.3e}" for dt, e in rows)
    print(f"time refinement (nx={nx}):\n{table}\norders: {orders}")
    np.testing.assert_allclose(orders, 1.0, atol=0.1, err_msg=table)


def test_second_order_in_space(x64):
    r = 0.25
    rows = []
    for nx in (32, 64, 128, 256):
        dx = 1.0 / nx
        steps = int(round(T / (r * dx**2 / NU)))
        x, u, _ = _final(nx, steps)
        exact = np.exp(-4 * np.pi**2 * NU * T) * np.sin(2 * np.pi * x)
        rows.append((dx, np.abs(u - exact).max()))
    orders = _orders([e for _, e in rows])
    table = "\n".join(f"dx={dx:.2e}  error={e:.3e}" for dx, e in rows)
    print(f"space refinement (dt = dx^2 / 4):\n{table}\norders: {orders}")
    np.testing.assert_allclose(orders, 2.0, atol=0.1, err_msg=table)


def test_wave_equation_conserves_discrete_energy(x64):
    """Leapfrog over 1000 steps: the discrete energy
    ``sum((u^{n+1} - u^n)^2 / dt^2 + c^2 (D+ u^{n+1}) (D+ u^n))`` is conserved
    to round-off, and the solution stays bounded."""
    nx, c, cfl = 64, 1.0, 0.5
    dx = 1.0 / nx
    dt = cfl * dx / c
    x = np.arange(nx) * dx
    g = np.exp(-100 * (x - 0.5) ** 2)
    init = xr.DataArray(np.stack([g, g]), dims=("time", "x"))
    s = (c * dt / dx) ** 2

    def wave(u):
        m = u(time=-1)
        return 2 * m - u(time=-2) + s * (u(time=-1, x=1) - 2 * m + u(time=-1, x=-1))

    out = init.stencil.scan(wave, dim="time", steps=1000, boundary="periodic").values

    def energy(a, b):
        kinetic = ((b - a) / dt) ** 2
        potential = c**2 * (np.roll(b, -1) - b) * (np.roll(a, -1) - a) / dx**2
        return dx * np.sum(kinetic + potential) / 2

    e = np.array([energy(out[n], out[n + 1]) for n in range(out.shape[0] - 1)])
    assert np.all(np.isfinite(out)) and np.abs(out).max() < 2
    np.testing.assert_allclose(e, e[0], rtol=1e-9)
