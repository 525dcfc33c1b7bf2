"""xstencil on an accelerator: accuracy and speed against hand-written JAX.

Runs on whatever JAX's default device is (a TPU or GPU where one is present;
the CPU otherwise, where it is a dry run of the script).  Every input is put
on the device first (``jnp.asarray``), wrapped in a DataArray, and every
labelled call is timed per call in a stream: ``--calls`` calls queued, then one
``block_until_ready``; the figure is the median of ``--rounds`` such streams,
the columns of a case interleaved round by round.

Cases (float32 unless named):

* 5-point Laplacian maps at 2048², zero fill and periodic, against
  ``jnp.pad`` + slices;
* heat 2048² x 200 steps (scan, last position) against ``lax.fori_loop``;
* dense k x k weighted sums at 1024², zero fill, k = 3 ... 63 with random
  weights of full rank: xstencil, ``lax.conv`` at ``Precision.HIGHEST`` and at
  JAX's default precision, and a hand FFT (``jnp.fft.rfft2`` of the padded
  block).  Each column's error is its largest absolute difference from a
  float64 numpy FFT reference, divided by ``sum(|w|) * max|u|``: a TPU's
  default-precision convolution rounds its inputs to bfloat16 (about 4e-3);
* a 31 x 31 Gaussian (separable) against two hand 1-D passes;
* ``--only lowerings``: hand-written lowerings of the dense k x k sum at
  1024² (k = 15, 31, 63), each with its compile time (``lower().compile()``)
  and its time a call: a ``lax.fori_loop`` over the window's rows (what
  xstencil runs on an accelerator from 101 to 1024 cells), FFTs at a
  5-smooth and a power-of-two size with the weight spectrum precomputed,
  banded Toeplitz matmuls at ``Precision.HIGHEST``, and one sum of every
  cell (k = 15 only);
* warm per-call cost: a scan of 10 steps at 64² against a jitted ``lax.scan``,
  a mesh of 32 regions at 64² against a plain map;
* integer, bool and float64 results against numpy: a uint8 3 x 3 sum (must
  not wrap), a bool neighbour count (an integer), the Laplacian in float64
  under ``jax.enable_x64`` (the device's float64 precision).

The first call of each xstencil column (compile included) is reported too.
Run: ``PYTHONPATH=. python benchmarks/accelerator.py [--quick] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from jax import lax

import xstencil  # noqa: F401  (the accessor)


def ready(out: Any) -> Any:
    """Block on a result: a DataArray's data or a JAX array."""
    data = out.data if isinstance(out, xr.DataArray) else out
    return jax.block_until_ready(data)


def streams(columns: dict[str, Callable[[], Any]], calls: int, rounds: int) -> dict[str, float]:
    """Median seconds per call of each column, ``calls`` queued per stream,
    the columns interleaved round by round (each is warmed first)."""
    for fn in columns.values():
        ready(fn())
    times: dict[str, list[float]] = {k: [] for k in columns}
    for _ in range(rounds):
        for name, fn in columns.items():
            t0 = time.perf_counter()
            out = None
            for _ in range(calls):
                out = fn()
            ready(out)
            times[name].append((time.perf_counter() - t0) / calls)
    return {k: statistics.median(v) for k, v in times.items()}


def first_call(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    ready(fn())
    return time.perf_counter() - t0


def lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def hand_lap(periodic: bool) -> Callable[[Any], Any]:
    @jax.jit
    def f(a: Any) -> Any:
        p = jnp.pad(a, 1, mode="wrap" if periodic else "constant")
        return p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1] - 4 * a
    return f


def laplacian_cases(n: int, calls: int, rounds: int) -> list[dict[str, Any]]:
    rows = []
    x = np.random.default_rng(0).random((n, n), dtype=np.float32)
    da = xr.DataArray(jnp.asarray(x), dims=("y", "x"))
    for mode in ("fill", "periodic"):
        opts = {"boundary": mode} | ({"fill_value": 0.0} if mode == "fill" else {})
        hand = hand_lap(mode == "periodic")
        xs = lambda opts=opts: da.stencil.map(lap, **opts)  # noqa: E731
        first = first_call(xs)
        err = float(jnp.max(jnp.abs(xs().data - hand(da.data))))
        t = streams({"xstencil": xs, "hand": lambda hand=hand: hand(da.data)}, calls, rounds)
        rows.append({"case": f"Laplacian {n}² {mode}", "first_s": first, "max_diff": err, **t})
    return rows


def heat_case(n: int, steps: int, calls: int, rounds: int) -> dict[str, Any]:
    a = 0.2
    x = jnp.asarray(np.random.default_rng(1).random((n, n), dtype=np.float32))
    da = xr.DataArray(x, dims=("y", "x"))

    def kernel(u: Any) -> Any:
        c = u(time=-1)
        return c + a * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                        + u(time=-1, y=-1) - 4 * c)

    @jax.jit
    def hand(u0: Any) -> Any:
        def step(_: Any, u: Any) -> Any:
            p = jnp.pad(u, 1)
            return u + a * (p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1] - 4 * u)
        return lax.fori_loop(0, steps, step, u0)

    xs = lambda: da.stencil.scan(kernel, "time", steps=steps, save_every="last",  # noqa: E731
                                 boundary="fill", fill_value=0.0)
    first = first_call(xs)
    diff = float(jnp.max(jnp.abs(jnp.squeeze(xs().data) - hand(x))))
    t = streams({"xstencil": xs, "hand": lambda: hand(x)}, max(2, calls // 10), rounds)
    return {"case": f"heat {n}² x {steps} steps", "first_s": first, "max_diff": diff, **t}


def correlate_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Zero-fill 'same' correlation in float64 by numpy's FFT (centre at k//2)."""
    k = w.shape[0]
    h = k // 2
    n0, n1 = x.shape
    p = np.pad(x.astype(np.float64), h)
    s = (p.shape[0] + k, p.shape[1] + k)
    spec = np.fft.rfft2(p, s) * np.conj(np.fft.rfft2(w.astype(np.float64), s))
    return np.fft.irfft2(spec, s)[:n0, :n1]


def dense_columns(da: xr.DataArray, w: np.ndarray) -> dict[str, Callable[[], Any]]:
    k = w.shape[0]
    h = k // 2
    wj = jnp.asarray(w)
    x = da.data

    def conv(precision: Any) -> Callable[[], Any]:
        f = jax.jit(lambda a: lax.conv_general_dilated(
            a[None, None], wj[None, None], (1, 1), [(h, h), (h, h)], precision=precision)[0, 0])
        return lambda: f(x)

    @jax.jit
    def fft(a: Any) -> Any:
        p = jnp.pad(a, h)
        s = (p.shape[0] + k, p.shape[1] + k)
        spec = jnp.fft.rfft2(p, s) * jnp.conj(jnp.fft.rfft2(wj, s))
        return jnp.fft.irfft2(spec, s)[:a.shape[0], :a.shape[1]]

    return {"xstencil": lambda: da.stencil.map(lambda u: (u * w).sum(), window={"y": k, "x": k},
                                               boundary="fill", fill_value=0.0),
            "conv highest": conv(lax.Precision.HIGHEST),
            "conv default": conv(None),
            "fft": lambda: fft(x)}


def dense_cases(n: int, ks: list[int], calls: int, rounds: int) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(2)
    x = rng.random((n, n), dtype=np.float32)
    da = xr.DataArray(jnp.asarray(x), dims=("y", "x"))
    for k in ks:
        w = rng.standard_normal((k, k)).astype(np.float32)
        ref = correlate_ref(x, w)
        scale = float(np.abs(w).sum() * np.abs(x).max())
        cols = dense_columns(da, w)
        print(f"  dense {k}x{k}: first xstencil call", flush=True)
        first = first_call(cols["xstencil"])
        errs = {}
        for name, fn in cols.items():
            print(f"  dense {k}x{k}: {name}", flush=True)
            errs[f"err {name}"] = float(np.max(np.abs(np.asarray(ready(fn())) - ref))) / scale
        t = streams(cols, max(2, calls // 5), rounds)
        row = {"case": f"dense {k}x{k} {n}² fill", "first_s": first, **errs, **t}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def gaussian_case(n: int, k: int, calls: int, rounds: int) -> dict[str, Any]:
    h = k // 2
    g = np.exp(-0.5 * ((np.arange(k) - h) / (k / 6)) ** 2)
    g = (g / g.sum()).astype(np.float32)
    w = np.outer(g, g)
    x = np.random.default_rng(3).random((n, n), dtype=np.float32)
    da = xr.DataArray(jnp.asarray(x), dims=("y", "x"))
    gj = jnp.asarray(g)

    @jax.jit
    def hand(a: Any) -> Any:
        p = jnp.pad(a, h)
        rows = sum(gj[i] * p[i:i + a.shape[0], :] for i in range(k))
        return sum(gj[j] * rows[:, j:j + a.shape[1]] for j in range(k))

    xs = lambda: da.stencil.map(lambda u: (u * w).sum(), window={"y": k, "x": k},  # noqa: E731
                                boundary="fill", fill_value=0.0)
    first = first_call(xs)
    ref = correlate_ref(x, w)
    err = float(np.max(np.abs(np.asarray(xs().data) - ref)))
    t = streams({"xstencil": xs, "hand": lambda: hand(da.data)}, max(2, calls // 5), rounds)
    return {"case": f"Gaussian {k}x{k} {n}² fill", "first_s": first, "max_err": err, **t}


def _smooth5(m: int) -> int:
    """The least ``n >= m`` with no prime factor over 5."""
    while True:
        r = m
        for f in (2, 3, 5):
            while r % f == 0:
                r //= f
        if r == 1:
            return m
        m += 1


def hand_lowering(kind: str, w: np.ndarray, n: int) -> Callable[[Any], Any]:
    """A hand-written zero-fill 'same' correlation of an ``n x n`` array with
    ``w`` (centre ``k // 2``), lowered as ``kind``."""
    k = w.shape[0]
    h = k // 2
    wj = jnp.asarray(w)
    if kind in ("fft 5-smooth", "fft 2^m"):
        m = n + 2 * h + k
        s = _smooth5(m) if kind == "fft 5-smooth" else 1 << (m - 1).bit_length()
        spec = jnp.asarray(np.conj(np.fft.rfft2(np.pad(w.astype(np.float64),
                                                       ((0, s - k), (0, s - k))))
                                   ).astype(np.complex64))
        return lambda a: jnp.fft.irfft2(
            jnp.fft.rfft2(jnp.pad(a, ((h, s - n - h), (h, s - n - h)))) * spec, (s, s))[:n, :n]
    if kind == "rows loop":
        def rows(a: Any) -> Any:
            p = jnp.pad(a, h)

            def body(dy: Any, acc: Any) -> Any:
                blk = lax.dynamic_slice(p, (dy, 0), (n, n + 2 * h))
                wr = lax.dynamic_index_in_dim(wj, dy, keepdims=False)
                return acc + sum(wr[dx] * blk[:, dx:dx + n] for dx in range(k))
            return lax.fori_loop(0, k, body, jnp.zeros((n, n), a.dtype))
        return rows
    if kind == "one sum":
        return lambda a: sum(w[dy, dx] * jnp.pad(a, h)[dy:dy + n, dx:dx + n]
                             for dy in range(k) for dx in range(k))
    # banded Toeplitz: out[y, j] = sum_dy sum_c p[y + dy, c] * T[dy, c, j],
    # where T[dy, c, j] = w[dy, c - j]
    t = np.zeros((k, n + 2 * h, n), np.float32)
    for dx in range(k):
        t[:, np.arange(n) + dx, np.arange(n)] = w[:, dx][:, None]
    tj = jnp.asarray(t)

    def toeplitz(a: Any) -> Any:
        p = jnp.pad(a, h)

        def body(dy: Any, acc: Any) -> Any:
            blk = lax.dynamic_slice(p, (dy, 0), (n, n + 2 * h))
            return acc + jnp.dot(blk, tj[dy], precision=lax.Precision.HIGHEST)
        return lax.fori_loop(0, k, body, jnp.zeros((n, n), a.dtype))
    return toeplitz


def lowering_cases(n: int, ks: list[int], calls: int, rounds: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(6)
    x = rng.random((n, n), dtype=np.float32)
    xd = jnp.asarray(x)
    rows = []
    for k in ks:
        w = rng.standard_normal((k, k)).astype(np.float32)
        ref = correlate_ref(x, w)
        scale = float(np.abs(w).sum() * np.abs(x).max())
        for kind in ("rows loop", "fft 5-smooth", "fft 2^m", "toeplitz matmuls", "one sum"):
            if kind == "one sum" and k > 15:
                continue
            t0 = time.perf_counter()
            compiled = jax.jit(hand_lowering(kind, w, n)).lower(xd).compile()
            took = time.perf_counter() - t0
            err = float(np.max(np.abs(np.asarray(ready(compiled(xd))) - ref))) / scale
            t = streams({"call": lambda c=compiled: c(xd)}, calls, rounds)
            row = {"case": f"lowering {kind} {k}x{k} {n}²", "compile_s": took, "err": err, **t}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def overhead_cases(calls: int, rounds: int) -> list[dict[str, Any]]:
    x = jnp.asarray(np.random.default_rng(4).random((64, 64), dtype=np.float32))
    da = xr.DataArray(x, dims=("y", "x"))

    def kernel(u: Any) -> Any:
        return u(time=-1) + 0.1 * (u(time=-1, x=1) + u(time=-1, x=-1) - 2 * u(time=-1))

    @jax.jit
    def hand(u0: Any) -> Any:
        def step(u: Any, _: Any) -> Any:
            v = u + 0.1 * (jnp.roll(u, -1, 1) + jnp.roll(u, 1, 1) - 2 * u)
            return v, v
        return lax.scan(step, u0, None, length=10)[1]

    scan = lambda: da.stencil.scan(kernel, "time", steps=10, boundary="periodic")  # noqa: E731
    t_scan = streams({"xstencil": scan, "hand": lambda: hand(x)}, calls, rounds)
    m = da.stencil.mesh(boundary="periodic")
    m[...] = lap
    for i in range(1, 32):
        m[{"y": 2 * i - 1}] = lambda u: 0.5 * u()
    mesh = lambda: m.map()  # noqa: E731
    plain = lambda: da.stencil.map(lap, boundary="periodic")  # noqa: E731
    t_mesh = streams({"xstencil": mesh, "hand": plain}, calls, rounds)
    return [{"case": "scan 10 steps 64² (vs lax.scan)", **t_scan},
            {"case": "mesh 32 regions 64² (vs a map)", **t_mesh}]


def dtype_checks() -> list[dict[str, Any]]:
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (256, 256), dtype=np.uint8)
    box = xr.DataArray(jnp.asarray(img), dims=("y", "x")).stencil.map(
        lambda u: u.sum(), window={"y": 3, "x": 3}, boundary="fill", fill_value=0)
    p = np.pad(img.astype(np.int64), 1)
    ref = sum(p[i:i + 256, j:j + 256] for i in range(3) for j in range(3))
    rows = [{"case": "uint8 3x3 sum", "dtype": str(box.dtype),
             "max_diff": int(np.max(np.abs(np.asarray(box.data).astype(np.int64) - ref)))}]
    alive = rng.random((256, 256)) < 0.3
    count = xr.DataArray(jnp.asarray(alive), dims=("y", "x")).stencil.map(
        lambda u: u.sum() - u(), window={"y": 3, "x": 3}, boundary="periodic")
    pa = np.pad(alive.astype(np.int64), 1, mode="wrap")
    cref = sum(pa[i:i + 256, j:j + 256] for i in range(3) for j in range(3)) - alive
    rows.append({"case": "bool neighbour count", "dtype": str(count.dtype),
                 "max_diff": int(np.max(np.abs(np.asarray(count.data).astype(np.int64) - cref)))})
    with jax.enable_x64(True):
        x = rng.random((512, 512))
        out = xr.DataArray(jnp.asarray(x), dims=("y", "x")).stencil.map(lap, boundary="periodic")
        r = (np.roll(x, -1, 1) + np.roll(x, 1, 1) + np.roll(x, -1, 0) + np.roll(x, 1, 0) - 4 * x)
        rows.append({"case": "float64 Laplacian (x64)", "dtype": str(out.dtype),
                     "max_diff": float(np.max(np.abs(np.asarray(out.data) - r)))})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/accelerator.py",
                                description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, few calls")
    p.add_argument("--json", help="write the rows as JSON here")
    p.add_argument("--skip-dense", action="store_true", help="leave out the dense k x k cases")
    p.add_argument("--only", choices=["maps", "dense", "lowerings", "overhead", "dtypes"],
                   help="one part only")
    args = p.parse_args(argv)
    dev = jax.devices()[0]
    print(f"device: {jax.default_backend()} ({dev.device_kind}), jax {jax.__version__}",
          flush=True)
    n_map, n_dense, steps = (256, 128, 20) if args.quick else (2048, 1024, 200)
    ks = [3, 9, 21] if args.quick else [3, 5, 9, 15, 21, 31, 63]
    calls, rounds = (10, 3) if args.quick else (50, 5)
    rows: list[dict[str, Any]] = []
    parts = {"maps": lambda: laplacian_cases(n_map, calls, rounds)
             + [heat_case(n_map, steps, calls, rounds)],
             "dense": lambda: dense_cases(n_dense, ks, calls, rounds)
             + [gaussian_case(n_dense, 31 if not args.quick else 9, calls, rounds)],
             "lowerings": lambda: lowering_cases(n_dense, [9] if args.quick else [15, 31, 63],
                                                 calls, rounds),
             "overhead": lambda: overhead_cases(calls, rounds),
             "dtypes": dtype_checks}
    for name, part in parts.items():
        if args.only not in (None, name) or (name == "dense" and args.skip_dense):
            continue
        for row in part():
            rows.append(row)
            if not row["case"].startswith(("dense ", "lowering ")):  # printed as measured
                print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": f"{jax.default_backend()} ({dev.device_kind})",
                       "jax": jax.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
