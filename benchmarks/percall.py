"""Per-call cost of a loop-backend map that returns a new array (issue 17).

Run from the repository root::

    PYTHONPATH=. python benchmarks/percall.py                    # 2048², zero fill
    PYTHONPATH=. python benchmarks/percall.py --n 2048 --mode periodic --rounds 200
    PYTHONPATH=. python benchmarks/percall.py --n 256 --ndim 3
    PYTHONPATH=. python benchmarks/percall.py --mode periodic --chained

Interleaved rounds of one call each of: the map returning a new array
("new", as ``peers.py``'s "xstencil" column), the map into a preallocated
array ("out="), the numba ``prange`` loop of ``peers.py`` and ``np.copyto``
("copy"); with ``--chained``, also the map on an earlier result, whose data
is a JAX array ("chained", as in a time loop of maps).  Every call therefore
follows one that streamed the arrays through the caches, as in ``peers.py``.
Prints, per column, the median and the 10th and 25th percentiles, and the
medians of the per-round ratios (new ÷ prange, out= ÷ prange, new − out=,
copy ÷ new as bandwidth, chained ÷ new): on a loaded machine a column takes
2-5x longer in the rounds where another process holds a core, and per-round
ratios and low percentiles see through that better than column medians.  To
compare two versions of xstencil, run it with ``PYTHONPATH`` pointing at
each checkout, alternately, a few times.
Prints only.  Importing this module does no work; ``main(argv)`` runs it.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

try:  # run as ``python benchmarks/percall.py``: benchmarks/ is sys.path[0]
    import _harness as H
    import _peer_kernels as P
except ImportError:  # imported as ``benchmarks.percall``
    from benchmarks import _harness as H
    from benchmarks import _peer_kernels as P


def _pct(xs: list[float], p: float) -> float:
    v = sorted(xs)
    return v[int(p * (len(v) - 1))]


def _chained(shape: tuple[int, ...], mode: str) -> Any:
    """The map of the "new" column on a previous call's result: its data a
    JAX array (read by the loops through a numpy view), as in a time loop
    written as repeated maps.  Every call maps the same first result."""
    a = P.np.random.default_rng(0).random(shape, dtype=P.np.float32)
    kernel = P._lap_kernel(len(shape))
    opts = P.laplace_options(mode)
    first = P.xr.DataArray(a, dims=("z", "y", "x")[-len(shape):]).stencil.map(kernel, **opts)
    return lambda: P.ready(first.stencil.map(kernel, **opts))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2048, help="points per dim (default 2048)")
    ap.add_argument("--ndim", type=int, default=2, choices=(2, 3))
    ap.add_argument("--mode", default="fill", choices=("fill", "periodic"))
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--chained", action="store_true",
                    help="also time the map on the last call's result (a JAX array)")
    a = ap.parse_args(argv)
    if P.numba is None:
        raise SystemExit("percall.py needs numba (the loop backend and the prange peer)")
    if a.ndim == 3 and a.mode == "periodic":
        raise SystemExit("peers.py has no 3-D periodic prange peer; use --mode fill")
    copy, cols = P.laplace_columns((a.n,) * a.ndim, a.mode)
    run = {"new": cols["xstencil"], "out=": cols["xstencil out="],
           "prange": cols["numba prange"], "copy": copy}
    if a.chained:
        run["chained"] = _chained((a.n,) * a.ndim, a.mode)
    for f in run.values():  # compile, then one warm call
        f()
        f()
    H.settle()  # every nest on its parallel build: the steady state
    t: dict[str, list[float]] = {k: [] for k in run}
    ratio: dict[str, list[float]] = {k: [] for k in ("new/prange", "out=/prange", "new-out=",
                                                     "copy/new")}
    if a.chained:
        ratio["chained/new"] = []
    for _ in range(a.rounds):
        row = {}
        for k, f in run.items():
            t0 = time.perf_counter_ns()
            f()
            row[k] = (time.perf_counter_ns() - t0) / 1e3
            t[k].append(row[k])
        ratio["new/prange"].append(row["new"] / row["prange"])
        ratio["out=/prange"].append(row["out="] / row["prange"])
        ratio["new-out="].append(row["new"] - row["out="])
        ratio["copy/new"].append(row["copy"] / row["new"])
        if a.chained:
            ratio["chained/new"].append(row["chained"] / row["new"])
    print(f"{a.n}^{a.ndim} float32, {a.mode}, {a.rounds} rounds, "
          f"load average {os.getloadavg()[0]:.2f}")
    for k, xs in t.items():
        print(f"  {k:7s} median {statistics.median(xs):8.0f} µs   p10 {_pct(xs, 0.1):8.0f}"
              f"   p25 {_pct(xs, 0.25):8.0f}")
    print("  per-round medians: " + ", ".join(
        f"{k} {statistics.median(v):.3f}" if k != "new-out=" else
        f"{k} {statistics.median(v):.0f} µs" for k, v in ratio.items()))


if __name__ == "__main__":
    main()
