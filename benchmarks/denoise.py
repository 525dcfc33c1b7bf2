"""Total-variation denoising (Chambolle): xstencil against scikit-image.

Run from the repository root::

    PYTHONPATH=. python benchmarks/denoise.py            # 512² and 1024²; writes RESULTS.md
    PYTHONPATH=. python benchmarks/denoise.py --quick    # 256² only, print only

An image user calls ``skimage.restoration.denoise_tv_chambolle`` (numpy,
one thread; ``eps=0`` so that it runs all iterations).  The "xstencil"
column is the user's port of it (tests/contract/test_port_skimage_tv.py: two
maps and xarray arithmetic per iteration, in a ``scan(step=...)``, the step
function built anew on every call as a user writes it); "JAX by hand" is
the same arithmetic on slices in a ``lax.fori_loop`` under ``jax.jit``.
Columns run interleaved in one process (``peers.measure``: two passes of
rounds, the median of each pass quoted "pass 1 / pass 2"), after a first
call each (compile included, shown).  Every column's result is checked
against scikit-image's before timing.  Importing this module does no work;
``main(argv)`` runs it.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

try:  # run as ``python benchmarks/denoise.py``: benchmarks/ is sys.path[0]
    import _harness as H
    import _peer_kernels as P
    import peers
except ImportError:  # imported as ``benchmarks.denoise``
    from benchmarks import _harness as H
    from benchmarks import _peer_kernels as P
    from benchmarks import peers

np, xr = P.np, P.xr

ITERATIONS = 100
WEIGHT = 0.1


def _port() -> Any:
    """The port test's ``denoise`` (one definition, shared)."""
    path = Path(__file__).resolve().parent.parent / "tests/contract/test_port_skimage_tv.py"
    spec = importlib.util.spec_from_file_location("_denoise_port", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.denoise


def _by_hand(n_iter: int) -> Any:
    import jax
    import jax.numpy as jnp

    def neg_div(py: Any, px: Any) -> Any:
        d = -py - px
        return d.at[1:].add(py[:-1]).at[:, 1:].add(px[:, :-1])

    @jax.jit
    def tv(f: Any, weight: Any) -> Any:
        def body(_: Any, p: Any) -> Any:
            py, px = p
            out = f + neg_div(py, px)
            gy = jnp.zeros_like(f).at[:-1].set(out[1:] - out[:-1])
            gx = jnp.zeros_like(f).at[:, :-1].set(out[:, 1:] - out[:, :-1])
            norm = 1 + 0.25 / weight * jnp.sqrt(gy * gy + gx * gx)
            return (py - 0.25 * gy) / norm, (px - 0.25 * gx) / norm

        zero = jnp.zeros_like(f)
        py, px = jax.lax.fori_loop(0, n_iter - 1, body, (zero, zero))
        return f + neg_div(py, px)

    return tv


def columns(n: int) -> dict[str, Any]:
    from skimage.restoration import denoise_tv_chambolle

    denoise = _port()
    rng = np.random.default_rng(0)
    a = (np.add.outer(np.sin(np.arange(n) / 9), np.cos(np.arange(n) / 13))
         + 0.3 * rng.standard_normal((n, n))).astype(np.float32)
    image = xr.DataArray(a, dims=("y", "x"))
    hand = _by_hand(ITERATIONS)
    cols = {
        "xstencil": lambda: P.ready(denoise(image, WEIGHT, ITERATIONS)),
        "JAX by hand": lambda: P.ready(hand(a, np.float32(WEIGHT))),
        "scikit-image": lambda: denoise_tv_chambolle(a, weight=WEIGHT, eps=0.0,
                                                     max_num_iter=ITERATIONS),
    }
    want = cols["scikit-image"]()
    results = {"xstencil": denoise(image, WEIGHT, ITERATIONS).values,
               "JAX by hand": np.asarray(hand(a, np.float32(WEIGHT)))}
    for name, got in results.items():  # every column computes the same image
        err = float(np.abs(got - want).max())
        if not err <= 1e-4:
            raise AssertionError(f"{name}: differs from scikit-image's by {err}")
    return cols


def table(sizes: list[int], rounds: int) -> str:
    names = ["xstencil", "JAX by hand", "scikit-image"]
    rows = []
    for n in sizes:
        print(f"  {n}²", flush=True)
        med, first = peers.measure(columns(n), rounds)
        cells = [" / ".join(H.fmt_time(t) for t in med[c]) for c in names]
        ratios = [" / ".join(f"{a / b:.2f}×" for a, b in zip(med["xstencil"], med[c],
                                                             strict=True))
                  for c in ("JAX by hand", "scikit-image")]
        rows.append(f"| {n}² × {ITERATIONS} | " + " | ".join(cells) + " | "
                    + " | ".join(ratios) + " | "
                    + " / ".join(H.fmt_time(first[c]) for c in names) + " |")
    head = ("| image (float32) × iterations | " + " | ".join(names)
            + " | xstencil ÷ JAX by hand | xstencil ÷ scikit-image"
            + " | first call (xstencil / JAX / scikit-image) |\n"
            + "|---" * (len(names) + 4) + "|")
    return "\n".join([head, *rows])


def main(argv: list[str] | None = None) -> None:
    H.sized_main(argv, __doc__, "denoise", "Total-variation denoising against scikit-image",
                 table, P.environment, ([512, 1024], [256]), (5, 3))


if __name__ == "__main__":
    main()
