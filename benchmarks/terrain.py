"""Terrain slope (Horn's method) on a DEM: xstencil against xarray-spatial.

Run from the repository root::

    PYTHONPATH=. python benchmarks/terrain.py            # 2048² and 4096²; writes RESULTS.md
    PYTHONPATH=. python benchmarks/terrain.py --quick    # 1024² only, print only

A raster user computes slope with ``xrspatial.slope`` (numba, one thread, a
new float32 array with a NaN border).  The "xstencil" column is the user's
port of it (tests/contract/test_port_xrspatial.py: Horn's 3 x 3 differences,
cell size read from the coordinates, a NaN fill), returning a new array as a
map without ``out=`` does; "xstencil XLA" is the same with
``backend="xla"``; "numpy" is the same arithmetic on whole-array slices
(``np.arctan`` on an interior view, a NaN ring written around it), as a
user who writes it in numpy would.  Columns run interleaved in one process
(``peers.measure``: two passes of rounds, the median of each pass quoted
"pass 1 / pass 2"), after a first call each (compile included, shown).
Every column's result is checked against xrspatial's before timing.
Importing this module does no work; ``main(argv)`` runs it.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

try:  # run as ``python benchmarks/terrain.py``: benchmarks/ is sys.path[0]
    import _harness as H
    import _peer_kernels as P
    import peers
except ImportError:  # imported as ``benchmarks.terrain``
    from benchmarks import _harness as H
    from benchmarks import _peer_kernels as P
    from benchmarks import peers

np, xr = P.np, P.xr


def _port() -> Any:
    """The slope kernel of the port test (one definition, shared)."""
    path = Path(__file__).resolve().parent.parent / "tests/contract/test_port_xrspatial.py"
    spec = importlib.util.spec_from_file_location("_terrain_port", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.NAN_RING, mod.dem, mod.slope_kernel


def _numpy_slope(z: np.ndarray, cx: float, cy: float, out: np.ndarray) -> np.ndarray:
    a, b, c = z[:-2, :-2], z[:-2, 1:-1], z[:-2, 2:]
    d, f = z[1:-1, :-2], z[1:-1, 2:]
    g, h, i = z[2:, :-2], z[2:, 1:-1], z[2:, 2:]
    dx = ((c + 2 * f + i) - (a + 2 * d + g)) / np.float32(8 * cx)
    dy = ((g + 2 * h + i) - (a + 2 * b + c)) / np.float32(8 * cy)
    np.degrees(np.arctan(np.sqrt(dx * dx + dy * dy)), out=out[1:-1, 1:-1])
    out[0], out[-1], out[:, 0], out[:, -1] = np.nan, np.nan, np.nan, np.nan
    return out


def columns(n: int) -> dict[str, Any]:
    import xrspatial

    ring, dem, kernel = _port()
    z = dem(ny=n, nx=n)
    cx = float(abs(z.x[1] - z.x[0]))
    cy = float(abs(z.y[1] - z.y[0]))
    buf = np.empty(z.shape, np.float32)
    cols = {
        "xstencil": lambda: P.ready(z.stencil.map(kernel, **ring)),
        "xstencil XLA": lambda: P.ready(z.stencil.map(kernel, backend="xla", **ring)),
        "xrspatial": lambda: xrspatial.slope(z),
        "numpy": lambda: _numpy_slope(z.values, cx, cy, buf),
    }
    want = xrspatial.slope(z).values
    for name, f in cols.items():  # every column computes the same slopes
        r = f()
        got = np.asarray(getattr(r, "values", r), np.float64)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        err = np.nanmax(np.abs(got - want))
        # xrspatial sums in float64 (numba promotes 2 * f), the others in float32:
        # a few thousand metres of relief round to about 1e-3 degrees of slope
        if not err <= 5e-3:
            raise AssertionError(f"{name}: slope differs from xrspatial's by {err} degrees")
    return cols


def table(sizes: list[int], rounds: int) -> str:
    names = ["xstencil", "xstencil XLA", "xrspatial", "numpy"]
    rows = []
    for n in sizes:
        print(f"  {n}²", flush=True)
        med, first = peers.measure(columns(n), rounds)
        cells = [" / ".join(H.fmt_time(t) for t in med[c]) for c in names]
        ratio = " / ".join(f"{a / b:.2f}×" for a, b in
                           zip(med["xstencil"], med["xrspatial"], strict=True))
        rows.append(f"| {n}² | " + " | ".join(cells) + f" | {ratio} | "
                    + " / ".join(H.fmt_time(first[c]) for c in names[:3]) + " |")
    head = ("| DEM (float32) | " + " | ".join(names)
            + " | xstencil ÷ xrspatial | first call (xstencil / XLA / xrspatial) |\n"
            + "|---" * (len(names) + 3) + "|")
    return "\n".join([head, *rows])


def main(argv: list[str] | None = None) -> None:
    H.sized_main(argv, __doc__, "terrain", "Terrain slope against xarray-spatial",
                 table, P.environment, ([2048, 4096], [1024]), (9, 5))


if __name__ == "__main__":
    main()
