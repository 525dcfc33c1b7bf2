"""Cheap XLA:CPU settings for plain maps, each measured on its own (issue 17).

Run from the repository root::

    PYTHONPATH=. python benchmarks/xla_cpu.py            # 2048², prints a table
    PYTHONPATH=. python benchmarks/xla_cpu.py --quick    # 1024²

``XLA_FLAGS`` is read once per process, so every setting runs in a fresh
child process that times, on a float32 5-point Laplacian: xstencil's map
on numpy-backed data (zero fill and periodic), the fill map under ``jax.jit``
on a JAX array ("jit"), on a fresh copy of the numpy array ("put+jit"), on
that copy donated ("put+jit donated"), on a zero-copy ``jnp.from_dlpack``
view ("dlpack+jit"), a hand-written version that pads the whole array first
(``jnp.pad`` then slices: a pad-rooted fusion), and numpy's copy as the
bandwidth yardstick.  A flag this jaxlib does not know makes XLA abort the
child; its row then says so.

Importing this module does no work; ``main(argv)`` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SETTINGS = [
    ("default", ""),
    ("multi_thread_eigen=false", "--xla_cpu_multi_thread_eigen=false"),
    ("parallel_codegen_split_count=8", "--xla_cpu_parallel_codegen_split_count=8"),
    ("use_thunk_runtime=false", "--xla_cpu_use_thunk_runtime=false"),
    ("enable_fast_math=true", "--xla_cpu_enable_fast_math=true"),
    ("prefer_vector_width=512", "--xla_cpu_prefer_vector_width=512"),
]

CHILD = r"""
import json, statistics, sys, time
import numpy as np, jax, jax.numpy as jnp, xarray as xr
import xstencil
n = int(sys.argv[1])
a = np.random.default_rng(0).random((n, n), dtype=np.float32)
da = xr.DataArray(a, dims=("y", "x"))
def lap(u):
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()
def hand_pad(x):
    p = jnp.pad(x, 1)
    return p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1] - 4 * x
hp = jax.jit(hand_pad)
def xs(x):
    return xr.DataArray(x, dims=("y", "x")).stencil.map(lap, boundary="fill",
                                                         fill_value=0.0).data
jitted = jax.jit(xs)
donated = jax.jit(xs, donate_argnums=0)
out = np.empty_like(a)
x = jnp.asarray(a)
cols = {
    "copy": lambda: np.copyto(out, a),
    "fill": lambda: jax.block_until_ready(da.stencil.map(lap, boundary="fill",
                                                         fill_value=0.0).data),
    "periodic": lambda: jax.block_until_ready(da.stencil.map(lap, boundary="periodic").data),
    "jit": lambda: jax.block_until_ready(jitted(x)),
    "put+jit": lambda: jax.block_until_ready(jitted(jnp.asarray(a))),
    "put+jit donated": lambda: jax.block_until_ready(donated(jnp.asarray(a))),
    "dlpack+jit": lambda: jax.block_until_ready(jitted(jnp.from_dlpack(a))),
    "pad-rooted": lambda: jax.block_until_ready(hp(x)),
}
for f in cols.values():
    f(); f()
samples = {k: [] for k in cols}
for _ in range(15):
    for k, f in cols.items():
        t = time.perf_counter(); f(); samples[k].append(time.perf_counter() - t)
print(json.dumps({k: statistics.median(v) for k, v in samples.items()}))
"""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1024² instead of 2048²")
    args = p.parse_args(argv)
    n = 1024 if args.quick else 2048
    cols = ["fill", "periodic", "jit", "put+jit", "put+jit donated", "dlpack+jit",
            "pad-rooted"]
    print(f"5-point Laplacian {n}² float32: ms per call (fraction of numpy's copy bandwidth)")
    print("| setting | copy | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for name, flags in SETTINGS:
        env = dict(os.environ, XLA_FLAGS=flags)
        r = subprocess.run([sys.executable, "-c", CHILD, str(n)], env=env, capture_output=True,
                           text=True, timeout=600)
        if r.returncode != 0:
            print(f"| {name} | not accepted by this jaxlib: "
                  f"{(r.stderr.strip().splitlines() or ['?'])[-1][:80]} |")
            continue
        t = json.loads(r.stdout.strip().splitlines()[-1])
        cells = [f"{t[c] * 1e3:.2f} ({t['copy'] / t[c]:.2f})" for c in cols]
        print(f"| {name} | {t['copy'] * 1e3:.2f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
