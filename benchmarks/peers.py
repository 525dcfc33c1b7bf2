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
("pass 1 / pass 2").  OpenMP peers run with ``OMP_WAIT_POLICY=PASSIVE`` and
``GOMP_SPINCOUNT=10000`` (the settings xstencil's loop backend applies where
the user has set none, ``xstencil/_backends/loops.py::omp_env``), so that
their idle threads do not spin long against XLA's; one libgomp serves every
OpenMP column of the process, so all run with the same settings.

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
in)" takes a JAX array, as ``jnp.fft`` and ``lax.conv`` do.  The ``jnp.fft``
column is the same periodic correlation as xstencil's FFT lowering (one
``rfft2``/``irfft2`` pair of the whole 1024² field, no padding, no crop) with
the weight spectrum a constant of its program, but it neither checks for
NaN/inf nor looks the spectrum up by the weights' current values, and it
reads a JAX array already in XLA's memory, where a numpy input is copied in
on every call (XLA:CPU reads a host array in place only when it is 64-byte
aligned); "jnp.fft (numpy in)" is the same jitted function called with the
numpy array.  "scipy.fft" is the same correlation by ``scipy.fft.rfft2`` /
``irfft2`` on the numpy array with ``workers=`` numba's thread count (the
spectrum precomputed, no checks): what xstencil's loop backend runs for these
windows on numpy data (``xstencil/_backends/hostfft.py``), hand-written.
The target ratio is the numpy "xstencil" column over the fastest of all the
ndimage, conv and FFT columns, JAX-in ones and scipy.fft included.

Dense timing: the dense columns whose warm call takes under 50 ms are
sampled 5 times a round, in sub-rounds of their own whose order alternates,
and the ratio is the median over sub-rounds of xstencil's time ÷ the best
peer's time in the same sub-round (two calls each, taken within ~20 ms of
each other), per pass; the best peer is the one with the lowest median in
that pass.  On this shared 2-core machine the load moves a 4 ms call by ±30%
from one second to the next, which the ratio of medians of samples taken
seconds apart (scipy's 0.5-2.4 s calls ran in between) turned into ratio
swings of 1.0-1.5 for the same program; the notes also give the ratio of
the medians, the paired ratio of CPU time (``time.process_time``, all
threads) and the paired ratio of "xstencil (JAX in)".

Steady state: every column whose warm call takes under 50 ms makes one
untimed call before each timed batch, so each is timed as a loop of its own
calls runs, with its own buffers (input, output, spectra) in the caches.
Without it the first call of a batch paid for whatever the columns before it
had evicted, and unevenly: the peers share one output array that the
ndimage and numpy columns kept warm, while xstencil's new result lives in its
own buffer (2048² periodic, session 15: the first call of a batch took 1.8 ms
against 0.87 ms for the others, its loop nest 1.35 against 0.66 ms).

Importing this module does no work; ``main(argv)`` runs it.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")
os.environ.setdefault("DEVITO_LANGUAGE", "openmp")
os.environ.setdefault("DEVITO_LOGGING", "ERROR")

import argparse  # noqa: E402
import atexit  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

try:  # run as ``python benchmarks/peers.py``: benchmarks/ is sys.path[0]
    import _harness as H
    import _peer_kernels as P
except ImportError:  # imported as ``benchmarks.peers``
    from benchmarks import _harness as H
    from benchmarks import _peer_kernels as P


def measure(cols: dict[str, Callable[[], Any]], rounds: int, slow_s: float = 0.5,
            repeat: int = 1, samples: dict[str, list[list[tuple[int, float, float]]]] | None
            = None) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Two passes of interleaved rounds; returns per-column pass medians and
    the first call of each column (compile included).  A column whose second,
    warm call took longer than ``slow_s`` runs 2 rounds a pass (judged by the
    warm call, so that a column that compiles on its first call is sampled as
    often as one that shares its compiled function: "xstencil" and "xstencil
    out=").  A column whose warm call took under :data:`FAST_S` makes one
    untimed call before each of its timed ones (see the module notes).

    ``repeat > 1`` (the dense cases) samples the columns whose warm call took
    under :data:`FAST_S` ``repeat`` times a round, one after another in
    sub-rounds of their own, in an order that alternates from one sub-round
    to the next (so no column always runs just after a slow one); the slow
    columns run once a round after them.  ``samples``, if given, receives per
    column and pass every sample as ``(sub-round, wall s, CPU s)``: samples
    with the same sub-round number were taken within a few milliseconds of
    each other, so their ratio is little moved by the load of the machine
    (see :func:`paired`)."""
    first, warm = {}, {}
    for name, f in cols.items():
        t0 = time.perf_counter()
        f()
        first[name] = time.perf_counter() - t0
        f()  # a counted run of a loop nest: asks for its parallel build
    H.settle()
    for name, f in cols.items():
        t0 = time.perf_counter()
        f()
        warm[name] = time.perf_counter() - t0
    fast = [name for name in cols if repeat > 1 and warm[name] < FAST_S]
    slow = [name for name in cols if name not in fast]
    medians: dict[str, list[float]] = {name: [] for name in cols}
    for _ in range(2):
        got: dict[str, list[tuple[int, float, float]]] = {name: [] for name in cols}
        sub = 0
        for r in range(rounds):
            blocks = [fast if i % 2 == 0 else fast[::-1] for i in range(repeat)] if fast else []
            blocks.append(slow)
            for names in blocks:
                sub += 1
                for name in names:
                    f = cols[name]
                    if r >= 2 and warm[name] > slow_s:
                        continue
                    number = max(1, int(0.01 / max(warm[name], 1e-6))) if warm[name] < 0.01 \
                        else 1
                    if warm[name] < FAST_S:  # untimed: the column's own buffers back in cache
                        f()
                    c0 = time.process_time()
                    t0 = time.perf_counter()
                    for _ in range(number):
                        f()
                    t1 = time.perf_counter()
                    got[name].append((sub, (t1 - t0) / number,
                                      (time.process_time() - c0) / number))
        for name in cols:
            medians[name].append(statistics.median(t for _, t, _ in got[name]))
            if samples is not None:
                samples.setdefault(name, []).append(got[name])
    return medians, first


#: Columns whose warm call takes less than this many seconds are sampled
#: ``repeat`` times a round by :func:`measure` (the dense cases).
FAST_S = 0.05


def paired(a: list[tuple[int, float, float]], b: list[tuple[int, float, float]],
           cpu: bool = False) -> float | None:
    """The median over sub-rounds of ``a``'s time ÷ ``b``'s time, from the
    samples of one pass that :func:`measure` took in the same sub-round
    (wall clock, or CPU time of the whole process with ``cpu``); ``None``
    when no sub-round sampled both."""
    i = 2 if cpu else 1
    bs = {s[0]: s[i] for s in b}
    ratios = [s[i] / bs[s[0]] for s in a if s[0] in bs and bs[s[0]] > 0]
    return statistics.median(ratios) if ratios else None


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


def dense_cases(quick: bool, rounds: int, ks: list[int] | None = None
                ) -> tuple[str, list[str]]:
    n = 512 if quick else 1024
    ks = ks or ([3, 9, 31] if quick else [3, 5, 9, 15, 21, 31, 63])
    peers = ["xstencil", "xstencil (JAX in)", "scipy.ndimage", "lax.conv", "jnp.fft",
             "jnp.fft (numpy in)", "scipy.fft", "numba prange"]
    best_of = ("scipy.ndimage", "lax.conv", "jnp.fft", "jnp.fft (numpy in)", "scipy.fft")
    lines = ["| k | xstencil first call | lowering | " + " | ".join(peers)
             + " | xstencil ÷ best of ndimage, conv, FFT | target |",
             "|---" * (len(peers) + 5) + "|"]
    notes = []
    for k in ks:
        print("   dense", k, flush=True)
        cols, how = P.dense_columns(n, k)
        got: dict[str, list[list[tuple[int, float, float]]]] = {}
        med, first = measure(cols, rounds, repeat=DENSE_REPEAT, samples=got)
        best = [min(best_of, key=lambda p, i=i: med[p][i]) for i in (0, 1)]
        ratio = _ratios(got, med, best, "xstencil")
        ok = max(ratio) <= 1.2 and first["xstencil"] <= 2.0
        lines.append(f"| {k} | {H.fmt_time(first['xstencil'])} | {how} | "
                     + " | ".join(_pair(med.get(p)) for p in peers)
                     + f" | {ratio[0]:.2f} / {ratio[1]:.2f} | {'✓' if ok else '✗'} |")
        plain = [med["xstencil"][i] / med[best[i]][i] for i in (0, 1)]
        cpu = _ratios(got, med, best, "xstencil", cpu=True)
        jax_in = _ratios(got, med, best, "xstencil (JAX in)")
        notes.append(f"dense {k}x{k}: {ratio[0]:.2f} / {ratio[1]:.2f} of the best "
                     f"({best[0]} / {best[1]}; ratio of medians {plain[0]:.2f} / "
                     f"{plain[1]:.2f}, CPU time {cpu[0]:.2f} / {cpu[1]:.2f}; JAX in "
                     f"{jax_in[0]:.2f} / {jax_in[1]:.2f}), first call {first['xstencil']:.2f} s")
    padded = ["xstencil", "scipy.ndimage", "np.pad + scipy.fft"]
    rows = ["| k | " + " | ".join(padded) + " | xstencil ÷ np.pad + scipy.fft |",
            "|---" * (len(padded) + 2) + "|"]
    for k in [k for k in ks if k >= 15][:2]:
        print("   dense reflect", k, flush=True)
        got = {}
        med, _ = measure(P.padded_dense_columns(n, k), rounds, repeat=DENSE_REPEAT,
                         samples=got)
        ratio = _ratios(got, med, ["np.pad + scipy.fft"] * 2, "xstencil")
        rows.append(f"| {k} | " + " | ".join(_pair(med.get(p)) for p in padded)
                    + f" | {ratio[0]:.2f} / {ratio[1]:.2f} |")
        notes.append(f"dense {k}x{k} reflect: {ratio[0]:.2f} / {ratio[1]:.2f} of np.pad + "
                     f"scipy.fft (paired by sub-round)")
    text = f"#### Dense k×k weighted sums at {n}², periodic, float32 (pass 1 / pass 2)\n\n" \
        + "\n".join(lines)
    if len(rows) > 2:
        text += (f"\n\n#### Dense k×k weighted sums at {n}², reflect (a padded block), "
                 "float32 (pass 1 / pass 2)\n\n" + "\n".join(rows))
    for image in (False, True):
        text += _gaussian_table(n, [k for k in ks if k >= 15][::2][:2], rounds, notes, image)
    text += _disk_table(n, [5, 15] if quick else [5, 8, 15], rounds, notes)
    return text, notes


def _disk_table(n: int, radii: list[int], rounds: int, notes: list[str]) -> str:
    """Counts over a disk on a bool mask (an exact int32 result), against
    scipy.ndimage's integer correlation and a hand-written float64 FFT
    rounded back to integers, with the first call's time."""
    cols_of = ["xstencil", "scipy.ndimage", "np.pad + scipy.fft"]
    rows = ["| r | cells | xstencil first call | " + " | ".join(cols_of)
            + " | xstencil ÷ best |", "|---" * (len(cols_of) + 4) + "|"]
    for r in radii:
        print("   disk count", r, flush=True)
        got: dict[str, Any] = {}
        cols = P.disk_count_columns(n, r)
        med, first = measure(cols, rounds, repeat=DENSE_REPEAT, samples=got)
        want = cols["scipy.ndimage"]()
        for c in ("xstencil", "np.pad + scipy.fft"):
            if not P.np.array_equal(P.np.asarray(cols[c]()), want):
                raise AssertionError(f"disk count r={r}: {c} is not the exact count")
        best = [min(cols_of[1:], key=lambda p, i=i: med[p][i]) for i in (0, 1)]
        ratio = _ratios(got, med, best, "xstencil")
        cells = sum(1 for i in range(-r, r + 1) for j in range(-r, r + 1) if i * i + j * j <= r * r)
        rows.append(f"| {r} | {cells} | {H.fmt_time(first['xstencil'])} | "
                    + " | ".join(_pair(med.get(p)) for p in cols_of)
                    + f" | {ratio[0]:.2f} / {ratio[1]:.2f} |")
        notes.append(f"disk count r={r} ({cells} cells) over a bool mask: {ratio[0]:.2f} / "
                     f"{ratio[1]:.2f} of the best ({best[0]} / {best[1]}), exact, "
                     f"first call {first['xstencil']:.2f} s")
    return (f"\n\n#### Counts over a disk on a bool mask at {n}², zero outside, int32 out "
            "(pass 1 / pass 2)\n\n" + "\n".join(rows))


def _gaussian_table(n: int, ks: list[int], rounds: int, notes: list[str], image: bool) -> str:
    """The Gaussian (rank-1 weights) table, reflect, against scipy.ndimage's
    two 1-D passes and ``np.pad`` + ``scipy.fft``: float32 data, or with
    ``image`` a uint8 image (float32 out) and the first call's time."""
    gauss = ["xstencil", "scipy.ndimage 1-D passes", "np.pad + scipy.fft"]
    first_col = "xstencil first call | " if image else ""
    rows = ["| k | " + first_col + " | ".join(gauss) + " | xstencil ÷ best |",
            "|---" * (len(gauss) + 2 + bool(image)) + "|"]
    for k in ks:
        print("   gaussian uint8 image" if image else "   gaussian reflect", k, flush=True)
        got: dict[str, Any] = {}
        cols = P.padded_dense_columns(n, k, gaussian=True, image=image)
        med, first = measure({c: cols[c] for c in gauss}, rounds, repeat=DENSE_REPEAT,
                             samples=got)
        best = [min(gauss[1:], key=lambda p, i=i: med[p][i]) for i in (0, 1)]
        ratio = _ratios(got, med, best, "xstencil")
        started = f"{H.fmt_time(first['xstencil'])} | " if image else ""
        rows.append(f"| {k} | {started}" + " | ".join(_pair(med.get(p)) for p in gauss)
                    + f" | {ratio[0]:.2f} / {ratio[1]:.2f} |")
        what = "over a uint8 image" if image else "reflect"
        tail = (f"first call {first['xstencil']:.2f} s" if image
                else "xstencil runs two 1-D passes")
        notes.append(f"gaussian {k}x{k} {what}: {ratio[0]:.2f} / {ratio[1]:.2f} of the best "
                     f"({best[0]} / {best[1]}; {tail})")
    if len(rows) == 2:
        return ""
    title = ("over a uint8 image at {n}², reflect, float32 out" if image
             else "(rank-1 weights) at {n}², reflect, float32").format(n=n)
    return f"\n\n#### Gaussian k×k {title} (pass 1 / pass 2)\n\n" + "\n".join(rows)


#: Sub-rounds a round of the dense cases' fast columns (see :func:`measure`).
DENSE_REPEAT = 5


def _ratios(got: dict[str, list[list[tuple[int, float, float]]]],
            med: dict[str, list[float]], best: list[str], col: str,
            cpu: bool = False) -> list[float]:
    """Per pass: ``col`` ÷ that pass's best peer, paired by sub-round
    (:func:`paired`), or the ratio of the medians where none pairs."""
    out = []
    for i in (0, 1):
        r = paired(got[col][i], got[best[i]][i], cpu)
        out.append(med[col][i] / med[best[i]][i] if r is None else r)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    H.add_output_flags(p, "smaller cases, fewer rounds (about a minute); print only")
    p.add_argument("--only", choices=["maps", "scans", "dense"], action="append")
    p.add_argument("--k", type=int, action="append",
                   help="dense cases: only this window size (repeatable)")
    args = p.parse_args(argv)
    # first calls are cold: numba's disk cache of the loop nests (loopcache) starts
    # empty, so a nest compiled by an earlier run is not loaded instead
    cold = tempfile.mkdtemp(prefix="xstencil-peers-")
    atexit.register(shutil.rmtree, cold, True)
    os.environ["XSTENCIL_CACHE_DIR"] = cold
    rounds = 5 if args.quick else 9
    parts, notes = [], []
    for name, fn in (("maps", map_cases), ("scans", scan_cases), ("dense", dense_cases)):
        if args.only and name not in args.only:
            continue
        print(name, flush=True)
        text, n = fn(args.quick, rounds, args.k) if name == "dense" else fn(args.quick, rounds)
        parts.append(text)
        notes += n
    head = ("### Against CPU peers (`benchmarks/peers.py`)\n\n"
            + P.environment() + "\n\n")
    body = head + "\n\n".join(parts) + "\n\n" + "\n".join(f"- {x}" for x in notes)
    H.publish("peers", body, args, partial=bool(args.only or args.k))


if __name__ == "__main__":
    main()
