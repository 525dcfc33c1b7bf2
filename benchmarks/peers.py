"""xstencil on the CPU against the tools a CPU user would pick instead (issue 17).

Run from the repository root::

    PYTHONPATH=. python benchmarks/peers.py            # full run; writes RESULTS.md
    PYTHONPATH=. python benchmarks/peers.py --quick    # smaller cases, about a minute

Peers, each where it installs (a missing one reads "—"): numba ``prange``
loops (written here), numba ``@stencil``, pystencils (OpenMP), devito
(``DEVITO_LANGUAGE=openmp``), ``scipy.ndimage``, ``jnp.fft``,
``lax.conv_general_dilated`` and numpy.  All run side by side in one process:
every case is timed in two passes, each pass made of interleaved rounds (one
call of every column per round), and the median of each pass is quoted
("pass 1 / pass 2").  OpenMP peers run with ``OMP_WAIT_POLICY=PASSIVE`` so
that their idle threads do not spin against XLA's.

Boundary handling differs where a peer cannot express a mode: pystencils and
devito update the interior of an array whose one-cell ghost layer holds the
zero fill (the same numbers as ``boundary="fill", fill_value=0``), numba
``@stencil`` sets the border cells to 0 (not the same numbers on the border),
and none of the three does periodic boundaries here ("—").

Map columns: "xstencil" is the default backend (numba loops on numpy data
this large, where numba is installed), "xstencil XLA" is ``backend="xla"``.

Output buffers: "copy" (``np.copyto``) and every peer column (numba,
pystencils, devito, ``scipy.ndimage(output=)``, numpy slices) write into an
array allocated once, before the timing.  "xstencil" and "xstencil XLA" return
a new array on every call, as a map without ``out=`` does; "xstencil out="
writes into a preallocated array (``map(..., out=buf)``), the like-for-like
comparison with the peers.  "copy (new array)" (``a.copy()``) shows what a
fresh output costs numpy itself: page faults and zeroing by the kernel take
about as long as the copy.

Columns: maps report the time per call and its bandwidth as a fraction of
numpy's copy of the same array (``np.copyto``: one read, one write, the
minimum traffic of a map); scans report million cell updates per second;
dense windows report the time per call and, for xstencil, the first call
(trace and compile included).  The dense "xstencil" column takes the numpy
array, as ``scipy.ndimage``, numba and every map case do; "xstencil (JAX
in)" takes a JAX array, as ``jnp.fft`` and ``lax.conv`` do (it measured no
faster: the target ratio uses the numpy column).

Importing this module does no work; ``main(argv)`` runs it.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("DEVITO_LANGUAGE", "openmp")
os.environ.setdefault("DEVITO_LOGGING", "ERROR")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

try:  # run as ``python benchmarks/peers.py``: benchmarks/ is sys.path[0]
    import _harness as H
    import _peer_kernels as P
except ImportError:  # imported as ``benchmarks.peers``
    from benchmarks import _harness as H
    from benchmarks import _peer_kernels as P


def measure(cols: dict[str, Callable[[], Any]], rounds: int, slow_s: float = 0.5
            ) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Two passes of interleaved rounds; returns per-column pass medians and
    the first call of each column (compile included).  A column whose second,
    warm call took longer than ``slow_s`` runs 2 rounds a pass (judged by the
    warm call, so that a column that compiles on its first call is sampled as
    often as one that shares its compiled function: "xstencil" and "xstencil
    out=")."""
    first, warm = {}, {}
    for name, f in cols.items():
        t0 = time.perf_counter()
        f()
        first[name] = time.perf_counter() - t0
        t0 = time.perf_counter()
        f()
        warm[name] = time.perf_counter() - t0
    medians: dict[str, list[float]] = {name: [] for name in cols}
    for _ in range(2):
        samples: dict[str, list[float]] = {name: [] for name in cols}
        for r in range(rounds):
            for name, f in cols.items():
                if r >= 2 and warm[name] > slow_s:
                    continue
                number = max(1, int(0.01 / max(warm[name], 1e-6))) if warm[name] < 0.01 else 1
                t0 = time.perf_counter()
                for _ in range(number):
                    f()
                samples[name].append((time.perf_counter() - t0) / number)
        for name in cols:
            medians[name].append(statistics.median(samples[name]))
    return medians, first


def _pair(ts: list[float] | None, fmt: Callable[[float], str] = H.fmt_time) -> str:
    if not ts:
        return "—"
    return " / ".join(fmt(t) for t in ts)


def map_cases(quick: bool, rounds: int) -> tuple[str, list[str]]:
    sizes2 = [(1024, "fill"), (1024, "periodic")] if quick else [
        (2048, "fill"), (2048, "periodic"), (4096, "fill"), (4096, "periodic")]
    sizes3 = [128] if quick else [256]
    peers = ["xstencil", "xstencil out=", "xstencil XLA", "numba prange", "numba @stencil",
             "pystencils", "devito", "scipy.ndimage", "numpy slices", "copy (new array)"]
    lines = ["| case | copy | " + " | ".join(peers) + " |",
             "|---" * (len(peers) + 2) + "|"]
    bw_lines = ["| case | " + " | ".join(peers) + " |", "|---" * (len(peers) + 1) + "|"]
    notes = []
    cases = [(f"5-point {n}², {mode}", P.laplace_columns((n, n), mode)) for n, mode in sizes2]
    cases += [(f"7-point {n}³, fill", P.laplace_columns((n, n, n), "fill")) for n in sizes3]
    for label, (copy, cols) in cases:
        print("  ", label, flush=True)
        med, first = measure({"copy": copy, **cols}, rounds)
        row = [_pair(med["copy"])] + [_pair(med.get(p)) for p in peers]
        lines.append(f"| {label} | " + " | ".join(row) + " |")
        bw = []
        for p in peers:
            if p not in med:
                bw.append("—")
                continue
            bw.append(" / ".join(f"{c / t:.2f}" for c, t in zip(med["copy"], med[p],
                                                                     strict=True)))
        bw_lines.append(f"| {label} | " + " | ".join(bw) + " |")
        fastest = [min(med[p][i] for p in med
                       if not p.startswith("copy") and not p.startswith("xstencil"))
                   for i in range(2)]
        ratio = [med["xstencil"][i] / fastest[i] for i in range(2)]
        into = [med["xstencil out="][i] / fastest[i] for i in range(2)]
        notes.append(f"{label}: xstencil ÷ fastest peer = {ratio[0]:.2f} / {ratio[1]:.2f} "
                     f"(out=: {into[0]:.2f} / {into[1]:.2f}); "
                     f"first call {first['xstencil']:.2f} s (XLA: "
                     f"{first['xstencil XLA']:.2f} s)")
    text = ("#### Maps: time per call (pass 1 / pass 2)\n\n" + "\n".join(lines)
            + "\n\n#### Maps: bandwidth as a fraction of numpy's copy\n\n" + "\n".join(bw_lines))
    return text, notes


def scan_cases(quick: bool, rounds: int) -> tuple[str, list[str]]:
    cases = [(256, 200)] if quick else [(512, 1000), (2048, 200)]
    peers = ["xstencil scan", "xstencil blocked", "xstencil unblocked", "numba prange",
             "numba @stencil", "pystencils", "devito", "numpy slices"]
    lines = ["| case | " + " | ".join(peers) + " |", "|---" * (len(peers) + 1) + "|"]
    notes = []
    for n, steps in cases:
        label = f"heat {n}² × {steps}"
        print("  ", label, flush=True)
        cols = P.heat_columns(n, steps)
        med, _ = measure(cols, max(3, rounds // 2))
        rate = n * n * steps / 1e6
        lines.append(f"| {label} | " + " | ".join(
            _pair(med.get(p), lambda t, r=rate: f"{r / t:.0f}") for p in peers) + " |")
        ratio = [med["xstencil scan"][i] / med["numba prange"][i] for i in range(2)]
        notes.append(f"{label}: xstencil ÷ numba prange = {ratio[0]:.2f} / {ratio[1]:.2f}")
    return ("#### Heat-equation scans: million cell updates per second (pass 1 / pass 2)\n\n"
            + "\n".join(lines)), notes


def dense_cases(quick: bool, rounds: int) -> tuple[str, list[str]]:
    n = 512 if quick else 1024
    ks = [3, 9, 31] if quick else [3, 5, 9, 15, 21, 31, 63]
    peers = ["xstencil", "xstencil (JAX in)", "scipy.ndimage", "lax.conv", "jnp.fft",
             "numba prange"]
    lines = ["| k | xstencil first call | lowering | " + " | ".join(peers)
             + " | xstencil ÷ best of ndimage, conv, FFT | target |",
             "|---" * (len(peers) + 5) + "|"]
    notes = []
    for k in ks:
        print("   dense", k, flush=True)
        cols, how = P.dense_columns(n, k)
        med, first = measure(cols, rounds)
        best = [min(med[p][i] for p in ("scipy.ndimage", "lax.conv", "jnp.fft")) for i in (0, 1)]
        ratio = [med["xstencil"][i] / best[i] for i in (0, 1)]
        ok = max(ratio) <= 1.2 and first["xstencil"] <= 2.0
        lines.append(f"| {k} | {H.fmt_time(first['xstencil'])} | {how} | "
                     + " | ".join(_pair(med.get(p)) for p in peers)
                     + f" | {ratio[0]:.2f} / {ratio[1]:.2f} | {'✓' if ok else '✗'} |")
        notes.append(f"dense {k}x{k}: {ratio[0]:.2f} / {ratio[1]:.2f} of the best, first call "
                     f"{first['xstencil']:.2f} s")
    return (f"#### Dense k×k weighted sums at {n}², periodic, float32 (pass 1 / pass 2)\n\n"
            + "\n".join(lines)), notes


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    H.add_output_flags(p, "smaller cases, fewer rounds (about a minute); print only")
    p.add_argument("--only", choices=["maps", "scans", "dense"], action="append")
    args = p.parse_args(argv)
    rounds = 5 if args.quick else 9
    parts, notes = [], []
    for name, fn in (("maps", map_cases), ("scans", scan_cases), ("dense", dense_cases)):
        if args.only and name not in args.only:
            continue
        print(name, flush=True)
        text, n = fn(args.quick, rounds)
        parts.append(text)
        notes += n
    head = ("### Against CPU peers (`benchmarks/peers.py`)\n\n"
            + P.environment() + "\n\n")
    body = head + "\n\n".join(parts) + "\n\n" + "\n".join(f"- {x}" for x in notes)
    H.publish("peers", body, args, partial=bool(args.only))


if __name__ == "__main__":
    main()
