"""Large window sums under a non-linear function, against scipy and JAX by hand.

Run from the repository root::

    PYTHONPATH=. python benchmarks/nonlinear_dense.py            # 1024²; writes RESULTS.md
    PYTHONPATH=. python benchmarks/nonlinear_dense.py --quick    # 512², print only

An image user writes the whole filter as one kernel: a clipped weighted sum
(``jnp.clip((u * W).sum(), 0, 1)``), an unsharp mask with a threshold, a
gradient magnitude of two derivative windows.  The columns:

* "xstencil": ``da.stencil.map`` as the user calls it (``backend="auto"``);
  the window sums are lowered densely and the rest applied point by point
  (:mod:`xstencil._engine.dense_split`);
* "cell by cell": the same kernel with that cut switched off, as xstencil
  ran it before session 28 (every window cell read at every point; above
  256 cells a gather of every window, refused over 1 GiB: "refused");
* "scipy": ``scipy.ndimage.correlate`` per sum, then numpy;
* "JAX by hand": ``jnp.pad`` and ``jax.scipy.signal.fftconvolve`` per sum,
  then ``jnp``, under ``jax.jit``.

Columns run interleaved in one process (``peers.measure``: two passes of
rounds, "pass 1 / pass 2" medians), after a first call each (compile
included, shown).  Every column's result is checked against scipy's after
timing.  Importing this module does no work; ``main(argv)`` runs it.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

try:  # run as ``python benchmarks/nonlinear_dense.py``: benchmarks/ is sys.path[0]
    import _harness as H
    import _peer_kernels as P
    import peers
except ImportError:  # imported as ``benchmarks.nonlinear_dense``
    from benchmarks import _harness as H
    from benchmarks import _peer_kernels as P
    from benchmarks import peers

np, xr = P.np, P.xr


def _weights(k: int) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    g = np.exp(-np.linspace(-2.0, 2.0, k) ** 2)
    ramp = np.linspace(-1.0, 1.0, k)
    return {
        "W": (rng.random((k, k)) / (k * k)).astype(np.float32),  # not separable: an FFT
        "G": (np.outer(g, g) / np.outer(g, g).sum()).astype(np.float32),  # separable
        "DX": (np.outer(g, ramp) / k).astype(np.float32),
        "DY": (np.outer(ramp, g) / k).astype(np.float32),
    }


def _cases(k: int) -> dict[str, tuple[Callable[..., Any], Callable[..., Any],
                                       Callable[..., Any]]]:
    """Per case: the kernel (given the weights), and its tail on the sums as
    numpy and as JAX arrays (the peers' ``f(u, sums)``)."""
    import jax.numpy as jnp

    w = _weights(k)

    def clip(u: Any) -> Any:
        return jnp.clip((u * w["W"]).sum() * 2, 0.0, 1.0)

    def unsharp(u: Any) -> Any:
        detail = u() - (u * w["G"]).sum()
        return u() + jnp.where(jnp.abs(detail) > 0.05, 1.5 * detail, 0.0)

    def magnitude(u: Any) -> Any:
        return jnp.sqrt((u * w["DX"]).sum() ** 2 + (u * w["DY"]).sum() ** 2)

    def unsharp_tail(xp: Any) -> Callable[..., Any]:
        def tail(u: Any, s: list[Any]) -> Any:
            detail = u - s[0]
            return u + xp.where(xp.abs(detail) > 0.05, 1.5 * detail, 0.0)
        return tail

    return {
        f"clip(sum) {k}×{k}": (clip, ["W"],
                                lambda xp: lambda u, s: xp.clip(s[0] * 2, 0.0, 1.0)),
        f"unsharp mask {k}×{k}": (unsharp, ["G"], unsharp_tail),
        f"gradient magnitude {k}×{k}": (magnitude, ["DX", "DY"],
                                         lambda xp: lambda u, s: xp.sqrt(s[0] ** 2 + s[1] ** 2)),
    }, w


def columns(n: int, k: int, name: str) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import scipy.ndimage as ndi
    from jax.scipy.signal import fftconvolve

    import xstencil
    from xstencil._engine import dense_split

    cases, w = _cases(k)
    kernel, names, tail = cases[name]
    rng = np.random.default_rng(0)
    a = rng.random((n, n)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    window = {"y": k, "x": k}
    r = k // 2

    def by_cell(u: Any) -> Any:  # a kernel object of its own: its own compiled program
        return kernel(u)

    def cell_by_cell() -> Any:
        keep = dense_split.SPLIT_CELLS
        dense_split.SPLIT_CELLS = 10**9
        try:
            return P.ready(da.stencil.map(by_cell, window=window, boundary="reflect"))
        finally:
            dense_split.SPLIT_CELLS = keep

    @jax.jit
    def hand(x: Any) -> Any:
        p = jnp.pad(x, r, mode="reflect")
        sums = [fftconvolve(p, jnp.asarray(w[m][::-1, ::-1]), mode="valid") for m in names]
        return tail(jnp)(x, sums)

    def scipy() -> Any:
        return tail(np)(a, [ndi.correlate(a, w[m], mode="mirror") for m in names])

    cols = {
        "xstencil": lambda: P.ready(da.stencil.map(kernel, window=window, boundary="reflect")),
        "cell by cell": cell_by_cell,
        "scipy": scipy,
        "JAX by hand": lambda: P.ready(hand(a)),
    }
    try:
        cell_by_cell()
    except xstencil.XStencilError as e:  # the gather of every window is over its limit
        print(f"    cell by cell refused: {str(e)[:90]}...", flush=True)
        del cols["cell by cell"]
    return cols


def check(cols: dict[str, Any], name: str) -> None:
    """Every column computes scipy's image (run after the timing, so that
    the first calls timed include the compile)."""
    want = cols["scipy"]()
    for col in [c for c in ("xstencil", "cell by cell", "JAX by hand") if c in cols]:
        err = float(np.abs(np.asarray(cols[col]()) - want).max())
        if not err <= 1e-3:
            raise AssertionError(f"{name}, {col}: differs from scipy's by {err}")


CASES = ["clip(sum) 17×17", "unsharp mask 9×9", "gradient magnitude 7×7", "clip(sum) 31×31"]


def table(sizes: list[int], rounds: int) -> str:
    names = ["xstencil", "cell by cell", "scipy", "JAX by hand"]
    rows = []
    for n in sizes:
        for case in CASES:
            k = int(case.rsplit(" ", 1)[1].split("×")[0])
            print(f"  {n}² {case}", flush=True)
            cols = columns(n, k, case)
            med, first = peers.measure(cols, rounds)
            check(cols, case)
            cells = [" / ".join(H.fmt_time(t) for t in med[c]) if c in med else "refused"
                     for c in names]
            ratios = [" / ".join(f"{x / y:.2f}×" for x, y in zip(med["xstencil"], med[c],
                                                                 strict=True))
                      if c in med else "–" for c in names[1:]]
            rows.append(f"| {case}, {n}² | " + " | ".join(cells) + " | " + " | ".join(ratios)
                        + " | " + " / ".join(H.fmt_time(first[c]) if c in first else "–"
                                             for c in names) + " |")
    head = ("| kernel, image (float32, 'reflect') | " + " | ".join(names)
            + " | xstencil ÷ cell by cell | xstencil ÷ scipy | xstencil ÷ JAX by hand"
            + " | first call (" + " / ".join(names) + ") |\n" + "|---" * (len(names) + 5) + "|")
    return "\n".join([head, *rows])


def main(argv: list[str] | None = None) -> None:
    H.sized_main(argv, __doc__, "nonlinear_dense",
                 "Window sums under a non-linear function against scipy and JAX by hand",
                 table, P.environment, ([1024], [512]), (5, 3))


if __name__ == "__main__":
    main()
