"""Convergence orders on grid refinement, measured through ``da.stencil.map``.

Each test prints its table (run with ``-s``) and puts it in the assertion
message.  The measured order between the two finest grids must be within 0.1
of the theoretical order; the coarser pairs are shown for information.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xarray as xr

import xstencil  # noqa: F401  (registers the accessor)

TWO_PI = 2 * np.pi


def f(x: np.ndarray) -> np.ndarray:
    """Smooth and periodic on [0, 1), with all Fourier modes present."""
    return np.exp(np.sin(TWO_PI * x))


def df(x: np.ndarray) -> np.ndarray:
    return TWO_PI * np.cos(TWO_PI * x) * f(x)


def d2f(x: np.ndarray) -> np.ndarray:
    return TWO_PI**2 * (np.cos(TWO_PI * x) ** 2 - np.sin(TWO_PI * x)) * f(x)


def orders(ns: Sequence[int], errors: Sequence[float]) -> list[float]:
    return [float(np.log(errors[i] / errors[i + 1]) / np.log(ns[i + 1] / ns[i]))
            for i in range(len(ns) - 1)]


def table(title: str, ns: Sequence[int], errors: Sequence[float]) -> str:
    p = orders(ns, errors)
    rows = [f"{title}", f"{'N':>6} {'max error':>12} {'order':>7}"]
    for i, (n, e) in enumerate(zip(ns, errors, strict=True)):
        rows.append(f"{n:>6} {e:>12.4e} {p[i - 1]:>7.3f}" if i else f"{n:>6} {e:>12.4e} {'':>7}")
    return "\n".join(rows)


def check_order(title: str, ns: Sequence[int], errors: Sequence[float], theory: float) -> None:
    text = table(title, ns, errors)
    print("\n" + text)
    measured = orders(ns, errors)[-1]
    assert abs(measured - theory) < 0.1, f"expected order {theory}\n{text}"


def uniform(n: int) -> xr.DataArray:
    x = np.arange(n) / n
    return xr.DataArray(f(x), dims="x", coords={"x": x})


def mapped(n: int) -> xr.DataArray:
    """A smoothly stretched periodic grid (spacing varies by a factor ~2)."""
    s = np.arange(n) / n
    x = s + 0.1 * np.sin(TWO_PI * s)
    return xr.DataArray(f(x), dims="x", coords={"x": x})


def d1_2(u: Any) -> Any:
    dx = u.coord("x")(x=1) - u.coord("x")()
    return (u(x=1) - u(x=-1)) / (2 * dx)


def d1_4(u: Any) -> Any:
    dx = u.coord("x")(x=1) - u.coord("x")()
    return (-u(x=2) + 8 * u(x=1) - 8 * u(x=-1) + u(x=-2)) / (12 * dx)


def d2_2(u: Any) -> Any:
    dx = u.coord("x")(x=1) - u.coord("x")()
    return (u(x=1) - 2 * u() + u(x=-1)) / dx**2


def d2_4(u: Any) -> Any:
    dx = u.coord("x")(x=1) - u.coord("x")()
    return (-u(x=2) + 16 * u(x=1) - 30 * u() + 16 * u(x=-1) - u(x=-2)) / (12 * dx**2)


def d1_nonuniform(u: Any) -> Any:
    """The three-point Lagrange derivative on any grid (second order)."""
    x = u.coord("x")
    h1, h2 = x() - x(x=-1), x(x=1) - x()
    return (-h2 / (h1 * (h1 + h2)) * u(x=-1) + (h2 - h1) / (h1 * h2) * u()
            + h1 / (h2 * (h1 + h2)) * u(x=1))


def d2_nonuniform(u: Any) -> Any:
    x = u.coord("x")
    h1, h2 = x() - x(x=-1), x(x=1) - x()
    return 2 * ((u(x=1) - u()) / h2 - (u() - u(x=-1)) / h1) / (h1 + h2)


NS = (32, 64, 128, 256)


def _errors(grid: Callable[[int], xr.DataArray], kernel: Any, exact: Any,
            ns: Sequence[int] = NS, **kw: Any) -> list[float]:
    out = []
    for n in ns:
        da = grid(n)
        got = da.stencil.map(kernel, boundary="periodic", **kw)
        assert got.dtype == np.float64
        out.append(float(np.max(np.abs(got.values - exact(da["x"].values)))))
    return out


def test_centred_first_derivative_second_order() -> None:
    check_order("d/dx, 2nd-order centred", NS, _errors(uniform, d1_2, df), 2)


def test_centred_first_derivative_fourth_order() -> None:
    check_order("d/dx, 4th-order centred", NS[:3], _errors(uniform, d1_4, df, NS[:3]), 4)


def test_centred_second_derivative_second_order() -> None:
    check_order("d2/dx2, 2nd-order centred", NS, _errors(uniform, d2_2, d2f), 2)


def test_centred_second_derivative_fourth_order() -> None:
    check_order("d2/dx2, 4th-order centred", NS[:3], _errors(uniform, d2_4, d2f, NS[:3]), 4)


def test_nonuniform_first_derivative_with_coord() -> None:
    errors = _errors(mapped, d1_nonuniform, df, period={"x": 1.0})
    check_order("d/dx, non-uniform grid via u.coord", NS, errors, 2)


def test_nonuniform_second_derivative_with_coord() -> None:
    errors = _errors(mapped, d2_nonuniform, d2f, period={"x": 1.0})
    check_order("d2/dx2, non-uniform (smoothly stretched) grid via u.coord", NS, errors, 2)


def test_upwind_advection_first_order() -> None:
    """u_t + c u_x = 0 by first-order upwind at CFL 0.5 to t = 0.25, against the
    exact shifted solution (a Python loop of map steps, one shared kernel)."""
    c, t_end, cfl = 1.0, 0.25, 0.5
    ns = (64, 128, 256, 512)
    errors = []
    for n in ns:
        da = uniform(n)
        dx = 1.0 / n
        steps = round(t_end * c / (cfl * dx))

        def upwind(u: Any) -> Any:
            return u() - cfl * (u() - u(x=-1))

        u = da
        for _ in range(steps):
            u = u.stencil.map(upwind, boundary="periodic")
        exact = f((da["x"].values - c * t_end) % 1.0)
        errors.append(float(np.max(np.abs(u.values - exact))))
    check_order("advection, 1st-order upwind, CFL 0.5", ns, errors, 1)
