"""Per-call overhead of ``da.stencil.map`` on a small array (issue 3, item 7).

On a 64x64 float32 DataArray with coordinates, a 5-point Laplacian is run
three ways, each already compiled:

* ``jit``: a bare ``jax.jit`` call on the raw array (the hand-written slicing);
* ``jit+rewrap``: the same call, its result put back into the DataArray with
  ``da.copy(data=...)`` (the floor for any labelled call);
* ``stencil.map``: ``da.stencil.map(lap, boundary="periodic")``.

The columns are timed in interleaved rounds (so load on a shared machine hits
them alike), each call ends in ``block_until_ready``, and the figure is the
median per-call time.  The target is ``stencil.map <= 2x jit+rewrap``.

``--scan`` times the warm scan cases of ``benchmarks/scan.py`` instead
(``da.stencil.scan`` of 10 steps at 64²: all positions saved, the last only, a
two-variable Dataset, a kernel reading a coordinate), each against its jitted
hand ``lax.scan`` call, in the same interleaved rounds (issue 17: <= 3x).

Run: ``python benchmarks/overhead.py [--calls 2000] [--profile] [--scan]``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

import xstencil  # noqa: F401

try:  # run as ``python benchmarks/overhead.py``: benchmarks/ is sys.path[0]
    import _harness as H
except ImportError:  # imported as ``benchmarks.overhead`` from the repository root
    from benchmarks import _harness as H


def lap(u):
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


@jax.jit
def lap_jnp(a):
    return (jnp.roll(a, 1, 0) + jnp.roll(a, -1, 0) + jnp.roll(a, 1, 1) + jnp.roll(a, -1, 1)
            - 4 * a)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--profile", action="store_true", help="cProfile the stencil.map calls")
    p.add_argument("--scan", action="store_true",
                   help="time the warm scan cases of scan.py against hand lax.scan calls")
    a = p.parse_args()
    if a.scan:
        _scan(a)
        return

    n = a.n
    da = xr.DataArray(np.random.default_rng(0).random((n, n), dtype=np.float32),
                      dims=("y", "x"), coords={"y": np.arange(n) * 0.1, "x": np.arange(n) * 0.1},
                      attrs={"units": "K"}, name="T")
    raw = jnp.asarray(da.values)

    def bare():
        return lap_jnp(raw).block_until_ready()

    def rewrap():
        return da.copy(data=lap_jnp(raw).block_until_ready())

    def stencil():
        out = da.stencil.map(lap, boundary="periodic")
        out.data.block_until_ready()
        return out

    cases = {"jit": bare, "jit+rewrap": rewrap, "stencil.map": stencil}
    np.testing.assert_allclose(stencil().values, bare(), rtol=1e-5, atol=1e-5)
    for f in cases.values():  # compile and warm up
        for _ in range(50):
            f()

    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.calls):
            stencil()
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
        return

    per_round = max(1, a.calls // a.rounds)
    med = H.round_robin(cases, a.rounds, per_round)
    floor = med["jit+rewrap"]
    print(f"per-call time on {n}x{n} float32, median of {a.rounds} rounds x {per_round} calls")
    for k, v in med.items():
        print(f"  {k:12s} {v * 1e6:8.1f} us   {v / floor:5.2f}x jit+rewrap")
    print(f"target: stencil.map <= 2.00x jit+rewrap -> "
          f"{'met' if med['stencil.map'] <= 2 * floor else 'NOT met'}")


def _scan(a: argparse.Namespace) -> None:
    """The warm scan cases (``scan.warm_cases``) against their hand calls,
    timed as ``scan.py`` times them (``warm_pair``: alternating runs, the
    ratio the median of the per-run ratios)."""
    try:
        import scan as S
    except ImportError:
        from benchmarks import scan as S

    cases = S.warm_cases()
    if a.profile:
        for _, xs, _ in cases:  # compile and warm up
            for _ in range(50):
                xs()
        prof = cProfile.Profile()
        prof.enable()
        for _, xs, _ in cases:
            for _ in range(a.calls // len(cases)):
                jax.block_until_ready(xs())
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return
    print(f"warm scan calls: median of {a.rounds} alternating runs "
          f"(target <= {S.WARM_TARGET:g}x the hand lax.scan call)")
    for case in cases:
        r = S.warm_pair(case, a.rounds)
        print(f"  {r['name']:62s} {r['xstencil'].median * 1e6:8.1f} us  hand "
              f"{r['hand'].median * 1e6:7.1f} us  {r['ratio']:5.2f}x")


if __name__ == "__main__":
    main()
