"""``python -m xstencil demo``: a heated plate cooling with its edges in ice.

A square aluminium plate starts at room temperature with three hot spots. Its
four edges are held at 0 °C; the edges are picked by coordinate label with a
function mesh (``m.loc[{"x": 0.0}] = ...``). The heat equation is stepped with
explicit Euler in one compiled scan along a new ``time`` dim, and the run is
checked against the analytic decay of the plate's fundamental mode,
``exp(-2 pi^2 kappa t / L^2)``.

Writes ``heat.nc`` (every saved snapshot, via h5netcdf) and ``heat.png``
(snapshots through xarray's ``.plot``) to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor

__all__ = ["Result", "heat_plate", "run_demo", "add_arguments"]

KAPPA = 9.7e-5  # thermal diffusivity of aluminium, m^2/s
SIDE = 0.2  # plate side, m
ROOM = 20.0  # °C
WALL = 0.0  # °C: the edges sit in ice water


@dataclass
class Result:
    """What the demo computed and wrote."""

    trajectory: xr.DataArray
    wall_time: float
    mode_error: float
    dt: float
    netcdf: Path
    png: Path | None


def initial_plate(size: int) -> xr.DataArray:
    """The plate at t = 0: room temperature plus three hot spots."""
    x = np.linspace(0.0, SIDE, size)
    y = np.linspace(0.0, SIDE, size)
    X, Y = np.meshgrid(x, y)
    T = np.full((size, size), ROOM)
    spots = [(0.06, 0.13, 0.025, 180.0), (0.14, 0.07, 0.02, 140.0), (0.13, 0.15, 0.012, 120.0)]
    for cx, cy, r, temp in spots:
        T = np.where((X - cx) ** 2 + (Y - cy) ** 2 < r**2, temp, T)
    T[:, 0] = T[:, -1] = T[0, :] = T[-1, :] = WALL
    return xr.DataArray(
        T.astype(np.float32),
        dims=("y", "x"),
        coords={
            "y": ("y", y, {"units": "m", "long_name": "y"}),
            "x": ("x", x, {"units": "m", "long_name": "x"}),
        },
        name="T",
        attrs={"units": "°C", "long_name": "temperature"},
    )


def time_step(T0: xr.DataArray) -> float:
    """A stable explicit step: 0.2 dx^2 / kappa (the limit is 0.25)."""
    return 0.2 * float(T0.x[1] - T0.x[0]) ** 2 / KAPPA


def heat_plate(T0: xr.DataArray, steps: int, save_every: int,
               progress: bool = True) -> xr.DataArray:
    """Step the heat equation on ``T0`` with its edges held at ``WALL``.

    The kernel reads the previous time level (``u(time=-1, ...)``); the edges
    are set by coordinate label, so the same code runs at any resolution.
    """
    dt = time_step(T0)
    r = KAPPA * dt / float(T0.x[1] - T0.x[0]) ** 2

    def diffuse(u):
        lap = (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1)
               - 4 * u(time=-1))
        return u(time=-1) + r * lap

    def ice(u):
        return WALL

    x0, x1 = float(T0.x[0]), float(T0.x[-1])
    y0, y1 = float(T0.y[0]), float(T0.y[-1])
    m = T0.stencil.mesh(boundary="extend")
    m[...] = diffuse
    for edge in ({"x": x0}, {"x": x1}, {"y": y0}, {"y": y1}):
        m.loc[edge] = ice
    traj = m.scan(dim="time", steps=steps, dt=dt, save_every=save_every, progress=progress)
    traj["time"].attrs.update(units="s", long_name="time")
    return traj


def fundamental_amplitude(T: xr.DataArray) -> np.ndarray:
    """Projection of ``T`` on the plate's slowest mode sin(pi x/L) sin(pi y/L)."""
    mode = np.sin(np.pi * T.x / SIDE) * np.sin(np.pi * T.y / SIDE)
    return ((T * mode).sum(("x", "y")) / (mode * mode).sum()).values


def plot(traj: xr.DataArray, path: Path) -> Path:
    """Snapshots, a temperature profile and the mode decay, all through xarray's ``.plot``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm
    from matplotlib.ticker import ScalarFormatter

    tt = traj.time.values
    picks = sorted({int(np.abs(tt - f * tt[-1]).argmin()) for f in (0, 0.03, 0.1, 0.3, 1.0)})
    fig = plt.figure(figsize=(3.0 * len(picks) + 1.0, 6.6), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.0, 0.95])
    axs = top.subplots(1, len(picks), sharey=True)
    norm = PowerNorm(0.5, vmin=0.0, vmax=float(traj.max()))
    for i, (ax, k) in enumerate(zip(axs, picks, strict=True)):
        im = traj.isel(time=k).plot.pcolormesh(ax=ax, cmap="inferno", norm=norm,
                                               add_colorbar=False, rasterized=True)
        ax.set_title(f"t = {tt[k]:.1f} s")
        ax.set_aspect("equal")
        ax.set_xticks(np.linspace(float(traj.x[0]), float(traj.x[-1]), 3))
        ax.set_yticks(np.linspace(float(traj.y[0]), float(traj.y[-1]), 5))
        if i:
            ax.set_ylabel("")
    top.colorbar(im, ax=axs, label="temperature [°C]", shrink=0.85)
    fig.suptitle("A plate with three hot spots cools; its edges (set by coordinate label) "
                 "are held at 0 °C", fontsize="large")
    left, right = bottom.subplots(1, 2)
    y_spot = float(traj.y[np.abs(traj.y.values - 0.13).argmin()])
    prof = traj.sel(y=y_spot).isel(time=picks)
    prof["time"] = prof.time.round(1)
    prof.plot.line(x="x", hue="time", ax=left)
    left.set_title(f"profile through the hottest spot (y = {y_spot:.3f} m)")
    amp = traj.copy(data=np.zeros_like(traj.values))[:, 0, 0].rename("amplitude")
    amp.values = fundamental_amplitude(traj)
    amp.attrs = {"units": "°C", "long_name": "fundamental-mode amplitude"}
    analytic = amp[0] * np.exp(-2 * np.pi**2 * KAPPA * traj.time / SIDE**2)
    amp.plot.line(ax=right, marker="o", linestyle="none", markersize=4, label="xstencil")
    right.plot(traj.time, analytic, color="k", lw=1,
               label=r"analytic $a_0\, e^{-2\pi^2 \kappa t / L^2}$")
    right.set_yscale("log")
    right.yaxis.set_major_formatter(ScalarFormatter())
    right.yaxis.set_minor_formatter(ScalarFormatter())
    right.legend()
    right.set_title("slowest mode: decay vs analytic")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _save_every(steps: int, snapshots: int = 40) -> int:
    """The divisor of ``steps`` nearest ``steps / snapshots`` (a scan saves whole intervals)."""
    divisors = [d for d in range(1, steps + 1) if steps % d == 0]
    return min(divisors, key=lambda d: abs(d - steps / snapshots))


def run_demo(out: Path, steps: int = 4000, size: int = 128, make_plot: bool = True,
             progress: bool = True) -> Result:
    """Run the demo, write its files and return what it computed."""
    out.mkdir(parents=True, exist_ok=True)
    T0 = initial_plate(size)
    save_every = _save_every(steps)
    t = time.perf_counter()
    traj = heat_plate(T0, steps, save_every, progress=progress)
    traj = traj.copy(data=np.asarray(traj.values))  # waits for the device
    wall = time.perf_counter() - t
    amp = fundamental_amplitude(traj)
    tt = traj.time.values
    analytic = amp[0] * np.exp(-2 * np.pi**2 * KAPPA * tt / SIDE**2)
    mode_error = float(np.max(np.abs(amp - analytic)) / abs(amp[0]))
    ds = traj.to_dataset()
    ds.attrs.update(title="xstencil demo: heat equation on a plate with its edges in ice",
                    kappa=KAPPA, steps=steps, save_every=save_every)
    nc = out / "heat.nc"
    ds.to_netcdf(nc, engine="h5netcdf")
    png = plot(traj, out / "heat.png") if make_plot else None
    return Result(traj, wall, mode_error, time_step(T0), nc, png)


def summary(res: Result, steps: int, size: int) -> str:
    """The lines printed at the end of the demo."""
    traj = res.trajectory
    dx = float(traj.x[1] - traj.x[0])
    lines = [
        "xstencil demo: 2-D heat equation, edges held at 0 °C (set by coordinate label)",
        f"  grid        {size} x {size} (y, x), dx = {dx * 1e3:.3g} mm, float32",
        f"  steps       {steps} explicit Euler steps of dt = {res.dt:.3g} s, "
        f"simulated {float(traj.time[-1]):.3g} s; {traj.sizes['time']} snapshots saved",
        f"  wall time   {res.wall_time:.2f} s (including compilation)",
        f"  check       fundamental-mode amplitude vs analytic exp(-2 pi^2 kappa t / L^2): "
        f"max error {res.mode_error:.2e} of the initial amplitude",
        f"  wrote       {res.netcdf}",
    ]
    if res.png is not None:
        lines.append(f"  wrote       {res.png}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The demo's command-line options."""
    p.add_argument("--out", type=Path, default=Path("xstencil-demo-output"),
                   help="directory for heat.nc and heat.png (default: %(default)s)")
    p.add_argument("--steps", type=int, default=4000,
                   help="time steps to take (default: %(default)s)")
    p.add_argument("--size", type=int, default=128,
                   help="grid points per side (default: %(default)s)")
    p.add_argument("--no-plot", action="store_true",
                   help="skip the PNG (no matplotlib needed)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def main(args: argparse.Namespace) -> int:
    """Entry point for ``python -m xstencil demo``."""
    if args.steps < 2 or args.size < 8:
        raise SystemExit("xstencil demo: --steps must be >= 2 and --size >= 8")
    needed = ["h5netcdf", "h5py"] + ([] if args.no_plot else ["matplotlib"])
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"xstencil demo: needs {', '.join(missing)}; install them with "
                         f"pip install \"xstencil[demo]\" (or pip install -e \".[demo]\" in a "
                         f"clone){'' if args.no_plot else ', or pass --no-plot to skip the PNG'}")
    res = run_demo(args.out, args.steps, args.size, make_plot=not args.no_plot,
                   progress=not args.no_progress)
    print(summary(res, args.steps, args.size))
    return 0

