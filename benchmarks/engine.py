"""Benchmark the array engine against hand-written JAX, kernex, lax.conv and scipy.

Run from the repository root::

    PYTHONPATH=. python benchmarks/engine.py            # full run, writes RESULTS.md
    PYTHONPATH=. python benchmarks/engine.py --quick    # small sizes, prints only
    PYTHONPATH=. python benchmarks/engine.py --kernex-python /path/to/kxvenv/bin/python

Every figure is the median per-call time over at least 7 runs after warm-up,
all in one process, with compile time (``jax.jit(f).lower(*a).compile()``)
measured on its own.  See ``benchmarks/README.md`` for what each case
measures and how to read the ratios.

kernex: if ``import kernex`` works here, its column is measured in this
process.  Otherwise, with ``--kernex-python PY`` (or the environment variable
``XSTENCIL_KERNEX_PYTHON``), this same script is run under ``PY`` with
``--only kernex`` and its JSON results are merged in; that interpreter needs
kernex, jax, numpy and scipy but not xstencil.  Without either, the kernex
column reads "not run".

Importing this module does no work; ``main(argv)`` runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:  # run as ``python benchmarks/engine.py``: benchmarks/ is sys.path[0]
    import _harness as H
except ImportError:  # imported as ``benchmarks.engine`` from the repository root
    from benchmarks import _harness as H

HERE = Path(__file__).resolve().parent

COLUMNS = ("xstencil", "hand", "kernex", "lax.conv", "scipy")
#: The hand baseline timed again, interleaved with kernex (see _kernex_ratio).
KX_HAND = "hand (kernex pass)"

# A builder takes the NumPy input and returns (function, "jax" | "py", note),
# or None when the column does not apply to the case.
Built = tuple[Callable[..., Any], str, str]
Builder = Callable[[Any], "Built | list[Built] | None"]


@dataclasses.dataclass
class Case:
    name: str
    kind: str  # "map" or "scan"
    make: Callable[[], Any]  # the NumPy float32 input
    builders: dict[str, Builder]
    hand_target: float  # xstencil / hand must be at most this
    kernex_target: float | None  # kernex / xstencil must be at least this
    kernex_runs: int | None = None  # fewer runs for very slow kernex calls
    scipy_target: bool = False  # xstencil must beat scipy
    memory: bool = False  # report peak memory / array size


# -- kernels -------------------------------------------------------------------------


def _rng_input(shape: tuple[int, ...], seed: int = 0) -> Callable[[], Any]:
    def make() -> Any:
        import numpy as np

        return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

    return make


def laplacian_cell(x: Any) -> Any:
    """The 5-point Laplacian on a relative 3x3 window (kernex README style)."""
    return x[1, 0] + x[-1, 0] + x[0, 1] + x[0, -1] - 4 * x[0, 0]


def _laplacian_case(n: int, boundary: str) -> Case:
    periodic = boundary == "periodic"

    def xstencil(x: Any) -> Built:
        import xstencil as xs

        kw = {"boundary": "periodic"} if periodic else {}
        f = xs.kmap(kernel_size=(3, 3), padding="same", relative=True, **kw)(laplacian_cell)
        return f, "jax", ""

    def hand(x: Any) -> list[Built]:
        import jax.numpy as jnp

        if not periodic:
            def pad_slices(x: Any) -> Any:
                p = jnp.pad(x, 1)
                return p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * x

            return [(pad_slices, "jax", "jnp.pad + slices")]

        def roll(x: Any) -> Any:
            return (jnp.roll(x, 1, 0) + jnp.roll(x, -1, 0) + jnp.roll(x, 1, 1)
                    + jnp.roll(x, -1, 1) - 4 * x)

        def wrap_slices(x: Any) -> Any:
            p = jnp.pad(x, 1, mode="wrap")
            return p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * x

        return [(roll, "jax", "jnp.roll"), (wrap_slices, "jax", "jnp.pad(wrap) + slices")]

    def kernex(x: Any) -> Built:
        import kernex as kex

        f = kex.kmap(kernel_size=(3, 3), padding="same", relative=True)(laplacian_cell)
        return f, "jax", ""

    def conv(x: Any) -> Built:
        import jax.numpy as jnp
        from jax import lax

        k = jnp.asarray([[0, 1, 0], [1, -4, 1], [0, 1, 0]], x.dtype)[None, None]

        def f(x: Any) -> Any:
            if periodic:
                y = lax.conv_general_dilated(jnp.pad(x, 1, mode="wrap")[None, None], k,
                                             (1, 1), "VALID")
            else:
                y = lax.conv_general_dilated(x[None, None], k, (1, 1), "SAME")
            return y[0, 0]

        return f, "jax", "pad(wrap) + VALID" if periodic else "SAME"

    def scipy(x: Any) -> Built:
        from scipy import ndimage

        mode = "wrap" if periodic else "constant"
        return (lambda x: ndimage.laplace(x, mode=mode)), "py", f"laplace(mode={mode!r})"

    label = "periodic" if periodic else "fill 0"
    return Case(
        name=f"Laplacian 5-pt {n}² ({label})",
        kind="map",
        make=_rng_input((n, n)),
        # kernex pads with zeros only: no periodic column
        builders={"xstencil": xstencil, "hand": hand, "lax.conv": conv, "scipy": scipy,
                  **({} if periodic else {"kernex": kernex})},
        hand_target=1.15,
        kernex_target=30,
        memory=True,
    )


def _gaussian_weights(k: int, sigma: float = 2.0) -> Any:
    import numpy as np

    r = np.linspace(-(k - 1) / 2, (k - 1) / 2, k)
    g = np.exp(-0.5 * r**2 / sigma**2)
    w = np.outer(g, g)
    return (w / w.sum()).astype(np.float32)


def _gaussian_case(n: int, k: int = 9) -> Case:
    w = _gaussian_weights(k)
    h = k // 2

    def xstencil(x: Any) -> Built:
        import jax.numpy as jnp

        import xstencil as xs

        wj = jnp.asarray(w)
        f = xs.kmap(kernel_size=(k, k), padding="same")(lambda u: jnp.sum(u * wj))
        return f, "jax", "jnp.sum(x * w)"

    def hand(x: Any) -> Built:
        import jax.numpy as jnp

        def unrolled(x: Any) -> Any:
            p = jnp.pad(x, h)
            n0, n1 = x.shape
            out = None
            for i in range(k):
                for j in range(k):
                    term = float(w[i, j]) * p[i:i + n0, j:j + n1]
                    out = term if out is None else out + term
            return out

        return unrolled, "jax", f"{k * k}-term unrolled sum of slices"

    def kernex(x: Any) -> Built:
        import jax.numpy as jnp
        import kernex as kex

        wj = jnp.asarray(w)
        f = kex.kmap(kernel_size=(k, k), padding="same")(lambda u: jnp.sum(u * wj))
        return f, "jax", ""

    def conv(x: Any) -> Built:
        import jax.numpy as jnp
        from jax import lax

        kk = jnp.asarray(w)[None, None]
        return ((lambda x: lax.conv_general_dilated(x[None, None], kk, (1, 1), "SAME")[0, 0]),
                "jax", "SAME")

    def scipy(x: Any) -> Built:
        from scipy import ndimage

        return (lambda x: ndimage.correlate(x, w, mode="constant")), "py", "correlate"

    return Case(
        name=f"Gaussian {k}×{k} sum(x*w) {n}²",
        kind="map",
        make=_rng_input((n, n), 1),
        builders={"xstencil": xstencil, "hand": hand, "kernex": kernex, "lax.conv": conv,
                  "scipy": scipy},
        hand_target=1.5,
        kernex_target=30,
        scipy_target=True,
    )


def _maxpool_case(n: int) -> Case:
    def xstencil(x: Any) -> Built:
        import xstencil as xs

        f = xs.kmap(kernel_size=(3, 3), strides=(2, 2), padding="valid")(lambda u: u.max())
        return f, "jax", ""

    def hand(x: Any) -> Built:
        import jax.numpy as jnp

        def strided(x: Any) -> Any:
            m0, m1 = (x.shape[0] - 3) // 2 + 1, (x.shape[1] - 3) // 2 + 1
            parts = [x[i:i + 2 * m0 - 1:2, j:j + 2 * m1 - 1:2] for i in range(3)
                     for j in range(3)]
            out = parts[0]
            for p in parts[1:]:
                out = jnp.maximum(out, p)
            return out

        return strided, "jax", "max of 9 strided slices"

    def kernex(x: Any) -> Built:
        import kernex as kex

        f = kex.kmap(kernel_size=(3, 3), strides=(2, 2), padding="valid")(lambda u: u.max())
        return f, "jax", ""

    def reduce_window(x: Any) -> Built:
        import jax.numpy as jnp
        from jax import lax

        return ((lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (3, 3), (2, 2), "VALID")),
                "jax", "lax.reduce_window")

    def scipy(x: Any) -> Built:
        from scipy import ndimage

        return ((lambda x: ndimage.maximum_filter(x, 3)[1:-1:2, 1:-1:2]), "py",
                "maximum_filter, then every 2nd")

    return Case(
        name=f"max-pool 3×3 stride 2 {n}²",
        kind="map",
        make=_rng_input((n, n), 2),
        builders={"xstencil": xstencil, "hand": hand, "kernex": kernex,
                  "lax.conv": reduce_window, "scipy": scipy},
        hand_target=1.15,
        kernex_target=30,
    )


def _convection_mesh(module: Any, nt: int, nx: int) -> Any:
    """The kernex README's linear convection mesh, verbatim apart from sizes."""
    tmax, xmax = 0.5, 2.0
    dt, dx = tmax / (nt - 1), xmax / (nx - 1)
    c = 0.5
    F = module.kscan(kernel_size=(3, 3), padding=((1, 1), (1, 1)),
                     named_axis={0: "n", 1: "i"}, relative=True)

    def bc(u: Any) -> Any:
        return 1

    def ic1(u: Any) -> Any:
        return 1

    def ic2(u: Any) -> Any:
        return 2

    def linear_convection(u: Any) -> Any:
        return u["i", "n-1"] - (c * dt / dx) * (u["i", "n-1"] - u["i-1", "n-1"])

    F[:, 0] = F[:, -1] = bc
    F[:, :int((nx - 1) / 4) + 1] = F[:, int((nx - 1) / 2):] = ic1
    F[0:1, int((nx - 1) / 4) + 1:int((nx - 1) / 2)] = ic2
    F[1:, 1:-1] = linear_convection
    return F


def _convection_case(nt: int, nx: int, kernex_runs: int | None = None) -> Case:
    r = 0.5 * (0.5 / (nt - 1)) / (2.0 / (nx - 1))

    def make() -> Any:
        import numpy as np

        x = np.ones((nt, nx), np.float32)  # the mesh sets row 0 again; the hand scan reads it
        x[0, int((nx - 1) / 4) + 1:int((nx - 1) / 2)] = 2
        return x

    def xstencil(x: Any) -> Built:
        import xstencil as xs

        return _convection_mesh(xs, nt, nx), "jax", "kscan mesh"

    def hand(x: Any) -> Built:
        return (lambda u: H.convection_rows(u, r)), "jax", "lax.scan over time rows"

    def kernex(x: Any) -> Built:
        import kernex as kex

        note = f"{kernex_runs} runs, no warm-up" if kernex_runs else ""
        return _convection_mesh(kex, nt, nx), "jax", note

    return Case(
        name=f"linear convection kscan {nt}×{nx}",
        kind="scan",
        make=make,
        builders={"xstencil": xstencil, "hand": hand, "kernex": kernex},
        hand_target=1.3,
        kernex_target=1000 if nt * nx >= 500 * 1000 else None,
        kernex_runs=kernex_runs,
    )


def _iir_case(n: int, a: float = 0.9) -> Case:
    # kscan writes each result at the window centre, so the recurrence
    # y[i] = a*y[i-1] + x[i] reads the previous (already written) cell at -1.
    def iir(w: Any) -> Any:
        return a * w[-1] + w[0]

    def xstencil(x: Any) -> Built:
        import xstencil as xs

        f = xs.kscan(kernel_size=(3,), padding="same", relative=True)(iir)
        return f, "jax", "a*x[-1] + x[0]"

    def hand(x: Any) -> Built:
        import jax.numpy as jnp
        from jax import lax

        def scan_elems(x: Any) -> Any:
            def step(y: Any, xi: Any) -> tuple[Any, Any]:
                y = a * y + xi
                return y, y

            return lax.scan(step, jnp.zeros((), x.dtype), x)[1]

        return scan_elems, "jax", "lax.scan over elements"

    def kernex(x: Any) -> Built:
        import kernex as kex

        f = kex.kscan(kernel_size=(3,), padding="same", relative=True)(iir)
        return f, "jax", ""

    def scipy(x: Any) -> Built:
        from scipy import signal

        return (lambda x: signal.lfilter([1.0], [1.0, -a], x)), "py", "signal.lfilter"

    return Case(
        name=f"IIR kscan 1-D, n={n:,}",
        kind="scan",
        make=_rng_input((n,), 3),
        builders={"xstencil": xstencil, "hand": hand, "kernex": kernex, "scipy": scipy},
        hand_target=1.3,
        kernex_target=None,
    )


def cases(quick: bool) -> list[Case]:
    if quick:
        return [
            _laplacian_case(256, "fill"),
            _laplacian_case(512, "fill"),
            _laplacian_case(512, "periodic"),
            _gaussian_case(256),
            _maxpool_case(512),
            _convection_case(151, 51),
            _convection_case(100, 200),
            _iir_case(2000),
        ]
    return [
        _laplacian_case(1024, "fill"),
        _laplacian_case(2048, "fill"),
        _laplacian_case(2048, "periodic"),
        _gaussian_case(1024),
        _maxpool_case(2048),
        _convection_case(151, 51),
        _convection_case(500, 1000, kernex_runs=3),
        _iir_case(10_000),
    ]


# -- measuring -----------------------------------------------------------------------


@dataclasses.dataclass
class Cell:
    """One measured (case, column)."""

    timing: H.Timing | None = None
    note: str = ""
    error: str | None = None  # max |out - hand| / max |hand|
    memory: H.Memory | None = None
    alternatives: list[tuple[str, H.Timing]] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "timing": self.timing.to_json() if self.timing else None,
            "note": self.note,
            "error": self.error,
            "memory": dataclasses.asdict(self.memory) if self.memory else None,
            "alternatives": [(n, t.to_json()) for n, t in self.alternatives],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Cell:
        return cls(
            timing=H.Timing.from_json(d["timing"]) if d["timing"] else None,
            note=d["note"],
            error=d["error"],
            memory=H.Memory(**d["memory"]) if d["memory"] else None,
            alternatives=[(n, H.Timing.from_json(t)) for n, t in d["alternatives"]],
        )


def _rel_error(out: Any, ref: Any) -> str:
    import numpy as np

    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if out.shape != ref.shape:
        return f"shape {out.shape} ≠ {ref.shape}"
    scale = max(float(np.abs(ref).max()), 1e-30)
    return f"{float(np.abs(out - ref).max()) / scale:.1e}"


def _prepare(fn: Callable[..., Any], how: str, x_np: Any, x_jax: Any, runs: int,
             warmup: int) -> tuple[H.Runner, Any, H.Memory | None]:
    """A runner for one function, its output (for the check) and its memory."""
    if how == "py":
        return H.Runner(lambda: fn(x_np), runs, max(warmup, 1)), fn(x_np), None
    compiled, compile_s = H.compile_jax(lambda x: fn(x), x_jax)

    def call() -> Any:
        return H.block(compiled(x_jax))

    return H.Runner(call, runs, warmup, compile_s=compile_s), call(), H.memory(compiled)


def measure(case: Case, columns: tuple[str, ...], runs: int, warmup: int,
            log: Callable[[str], None]) -> dict[str, Cell]:
    """Time the given columns of one case, interleaved run by run."""
    import jax
    import numpy as np

    x_np = case.make()
    x_jax = jax.device_put(x_np)
    ref = None  # the hand-written output, also when only kernex is measured
    prepared: list[tuple[str, str, H.Runner, Any, H.Memory | None]] = []
    for col in ["hand"] + [c for c in columns if c != "hand"]:
        builder = case.builders.get(col)
        built = builder(x_np) if builder is not None else None
        if built is None:
            continue
        options = built if isinstance(built, list) else [built]
        if col not in columns:  # hand: only the reference output
            ref = np.asarray(jax.jit(options[0][0])(x_jax))
            continue
        r, w = runs, warmup
        if col == "kernex" and case.kernex_runs:
            r, w = case.kernex_runs, 0
        for fn, how, note in options:
            log(f"  compile {col} {note}")
            prepared.append((col, note, *_prepare(fn, how, x_np, x_jax, r, w)))
    log(f"  timing {len(prepared)} functions, interleaved")
    timings = H.interleave([p[2] for p in prepared])
    out: dict[str, Cell] = {}
    outputs: dict[str, Any] = {}
    for col in columns:
        mine = [(note, t, y, mem) for (c, note, _, y, mem), t in zip(prepared, timings,
                                                                      strict=True) if c == col]
        if not mine:
            continue
        note, t, outputs[col], mem = min(mine, key=lambda m: m[1].median)
        cell = Cell(timing=t, note=note, memory=mem)
        if len(mine) > 1:
            cell.note = f"best: {note}"
            cell.alternatives = [(n, tt) for n, tt, _, _ in mine]
        out[col] = cell
    if "hand" in outputs:
        ref = np.asarray(outputs["hand"])
    for col, cell in out.items():
        if col != "hand" and ref is not None:
            cell.error = _rel_error(outputs[col], ref)
    return out


def _kernex_importable() -> bool:
    try:
        import kernex  # noqa: F401
    except Exception:
        return False
    return True


def _kernex_subprocess(python: str, quick: bool, extra: list[str],
                       log: Callable[[str], None]) -> dict[str, Any]:
    """Run ``--only kernex`` under another interpreter; return its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernex.json"
        cmd = [python, str(Path(__file__).resolve()), "--only", "kernex", "--json", str(path)]
        if quick:
            cmd.append("--quick")
        cmd += extra
        log(f"kernex: running {' '.join(cmd)}")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
        subprocess.run(cmd, check=True, env=env)
        return json.loads(path.read_text())


# -- reporting -----------------------------------------------------------------------


def _ratio(a: H.Timing | None, b: H.Timing | None) -> float | None:
    if a is None or b is None:
        return None
    return a.median / b.median


def _kernex_ratio(cells: dict[str, Cell]) -> float | None:
    """kernex / xstencil, chained through the hand baseline.

    kernex is timed in its own pass (possibly in another process), interleaved
    with the hand baseline; xstencil is timed interleaved with the same
    baseline in the main pass.  (kernex / hand) x (hand / xstencil) cancels a
    change in machine speed between the two passes, which a direct
    kernex / xstencil would not.
    """
    kx = cells.get("kernex", Cell()).timing
    xs = cells.get("xstencil", Cell()).timing
    hand, kx_hand = cells.get("hand", Cell()).timing, cells.get(KX_HAND, Cell()).timing
    if kx is None or xs is None:
        return None
    if hand is None or kx_hand is None:
        return kx.median / xs.median
    return (kx.median / kx_hand.median) * (hand.median / xs.median)


def _mark(ok: bool | None) -> str:
    return "" if ok is None else (" ✓" if ok else " ✗")


def _fmt_ratio(r: float | None, digits: int = 2) -> str:
    if r is None:
        return "—"
    if r >= 100:
        return f"{r:,.0f}×"
    return f"{r:.{digits}f}×"


def _time_cell(cell: Cell | None, runs: int) -> str:
    if cell is None or cell.timing is None:
        return "—"
    s = H.fmt_time(cell.timing.median)
    if cell.timing.runs < runs:
        s += f" ({cell.timing.runs} runs)"
    if cell.note.startswith("best: "):
        s += f" ({cell.note[6:]})"
    return s


def table(results: list[tuple[Case, dict[str, Cell]]], kernex_status: str, runs: int) -> str:
    lines = [
        "| case | xstencil | hand | kernex 0.2.1 | lax.conv / reduce_window | scipy | "
        "xstencil / hand (target) | kernex / xstencil (target) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    misses = []
    for case, cells in results:
        xs_t = cells.get("xstencil", Cell()).timing
        hand_r = _ratio(xs_t, cells.get("hand", Cell()).timing)
        kx_r = _kernex_ratio(cells)
        hand_ok = None if hand_r is None else hand_r <= case.hand_target
        kx_ok = None if kx_r is None or case.kernex_target is None else (
            kx_r >= case.kernex_target)
        row = [case.name] + [_time_cell(cells.get(c), runs) for c in COLUMNS]
        if "kernex" not in cells and case.builders.get("kernex") is not None:
            row[3] = kernex_status
        row.append(f"{_fmt_ratio(hand_r)} (≤ {case.hand_target}×){_mark(hand_ok)}")
        kx_goal = "no target" if case.kernex_target is None else f"≥ {case.kernex_target:,}×"
        row.append("—" if kx_r is None else f"{_fmt_ratio(kx_r, 1)} ({kx_goal}){_mark(kx_ok)}")
        lines.append("| " + " | ".join(row) + " |")
        if hand_ok is False:
            misses.append(f"{case.name}: xstencil / hand = {hand_r:.2f}× > {case.hand_target}×")
        if kx_ok is False:
            misses.append(f"{case.name}: kernex / xstencil = {kx_r:.1f}× < "
                          f"{case.kernex_target}×")
        if case.scipy_target:
            sp = _ratio(xs_t, cells.get("scipy", Cell()).timing)
            if sp is not None and sp >= 1:
                misses.append(f"{case.name}: xstencil is {sp:.2f}× scipy.ndimage (target < 1×)")
    out = "\n".join(lines)
    out += "\n\nOther targets:\n\n"
    for case, cells in results:
        if case.scipy_target:
            sp = _ratio(cells.get("xstencil", Cell()).timing, cells.get("scipy", Cell()).timing)
            out += (f"- {case.name}: xstencil / scipy.ndimage = {_fmt_ratio(sp)} "
                    f"(target < 1×){_mark(None if sp is None else sp < 1)}\n")
    for case, cells in results:
        if not case.memory:
            continue
        for col in ("xstencil", "hand"):
            cell = cells.get(col)
            if cell is None or cell.memory is None:
                continue
            x_bytes = cell.memory.argument  # the input array is the only argument
            m = cell.memory
            peak = m.peak / x_bytes
            target = f" (target ≤ 4×){_mark(peak <= 4)}" if col == "xstencil" else ""
            out += (f"- {case.name}, {col}: peak memory {peak:.2f}× the array "
                    f"(input {m.argument / x_bytes:.2f} + output {m.output / x_bytes:.2f} + "
                    f"XLA temp {m.temp / x_bytes:.3f}){target}\n")
            if col == "xstencil" and peak > 4:
                misses.append(f"{case.name}: peak memory {peak:.2f}× the array > 4×")
    out += "\nMissed targets:" + (" none\n" if not misses else "\n\n")
    out += "".join(f"- {m}\n" for m in misses)
    return out


def details(results: list[tuple[Case, dict[str, Cell]]]) -> str:
    lines = [
        "| case | column | median | IQR | runs × calls | compile | max rel. diff vs hand "
        "| note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, cells in results:
        for col in (*COLUMNS, KX_HAND):
            cell = cells.get(col)
            if cell is None or cell.timing is None:
                continue
            t = cell.timing
            lines.append(
                f"| {case.name} | {col} | {H.fmt_time(t.median)} | {H.fmt_time(t.iqr)} | "
                f"{t.runs} × {t.number} | {H.fmt_time(t.compile_s)} | {cell.error or '—'} | "
                f"{cell.note} |"
            )
            for name, alt in cell.alternatives:
                lines.append(f"| | ↳ {col}: {name} | {H.fmt_time(alt.median)} | "
                             f"{H.fmt_time(alt.iqr)} | {alt.runs} × {alt.number} | "
                             f"{H.fmt_time(alt.compile_s)} | | |")
    return "\n".join(lines)


def _revision() -> str:
    """The git commit of the checkout, and whether xstencil/ has local changes."""
    root = HERE.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "xstencil"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "(not a git checkout)"
    return f"at commit {head}" + (" with uncommitted changes in xstencil/" if dirty else "")


def _machine(load_before: tuple[float, ...], load_after: tuple[float, ...],
             kernex_where: str, kernex_version: str) -> str:
    import jax
    import numpy as np
    import scipy

    return (
        f"- date: {datetime.datetime.now().isoformat(timespec='minutes')}; "
        f"xstencil {_revision()}\n"
        f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"{platform.system()} {platform.release()}; JAX backend "
        f"{jax.default_backend()} ({jax.devices()[0].device_kind})\n"
        f"- Python {platform.python_version()}, jax {jax.__version__}, "
        f"numpy {np.__version__}, scipy {scipy.__version__}, kernex {kernex_version} "
        f"({kernex_where})\n"
        f"- process niceness {os.nice(0)}; load average (1, 5, 15 min) before: "
        f"{', '.join(f'{v:.2f}' for v in load_before)}; after: "
        f"{', '.join(f'{v:.2f}' for v in load_after)}\n"
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/engine.py", description=__doc__.split("\n")[0])
    H.add_output_flags(p, "small sizes and fewer runs; prints only (unless --write)")
    p.add_argument("--no-kernex", action="store_true", help="skip the kernex column")
    p.add_argument("--kernex-python", default=os.environ.get("XSTENCIL_KERNEX_PYTHON"),
                   help="interpreter with kernex installed, used when kernex does not "
                        "import here (default: $XSTENCIL_KERNEX_PYTHON)")
    p.add_argument("--only", choices=COLUMNS, help="measure one column only")
    p.add_argument("--json", type=Path, help="write the raw results as JSON here")
    p.add_argument("--runs", type=int, default=None,
                   help="timed runs per figure (default 15; 5 with --quick)")
    p.add_argument("--case", action="append", default=[],
                   help="run only cases whose name contains this text (repeatable)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    runs = args.runs or (5 if args.quick else 15)
    warmup = 1 if args.quick else 2
    selected = [c for c in cases(args.quick)
                if not args.case or any(s.lower() in c.name.lower() for s in args.case)]

    if args.only:
        # the hand baseline is timed alongside, interleaved (see _kernex_ratio)
        columns: tuple[str, ...] = tuple(dict.fromkeys(("hand", args.only)))
        selected = [c for c in selected if args.only in c.builders]
    else:
        columns = tuple(c for c in COLUMNS if c != "kernex")

    load_before = os.getloadavg()
    results: list[tuple[Case, dict[str, Cell]]] = []
    for case in selected:
        log(f"{case.name}")
        results.append((case, measure(case, columns, runs, warmup, log)))

    kernex_version = "—"
    if args.only:
        kernex_status = ""
    elif args.no_kernex:
        kernex_status, kernex_where = "not run (--no-kernex)", "skipped"
    elif _kernex_importable():
        import kernex

        kernex_version = getattr(kernex, "__version__", "?")
        kernex_where = "same process"
        kernex_status = ""
        for case, cells in results:
            if "kernex" in case.builders:
                log(f"{case.name} [kernex]")
                got = measure(case, ("hand", "kernex"), runs, warmup, log)
                cells["kernex"], cells[KX_HAND] = got["kernex"], got["hand"]
    elif args.kernex_python:
        extra = [a for s in args.case for a in ("--case", s)]
        if args.runs:
            extra += ["--runs", str(args.runs)]
        data = _kernex_subprocess(args.kernex_python, args.quick, extra, log)
        kernex_version = data["version"]
        kernex_where = (f"separate process: {args.kernex_python} --only kernex, "
                        f"jax {data['jax']}")
        kernex_status = "not run"
        for case, cells in results:
            got = data["cells"].get(case.name, {})
            if "kernex" in got:
                cells["kernex"] = Cell.from_json(got["kernex"])
            if "hand" in got:
                cells[KX_HAND] = Cell.from_json(got["hand"])
    else:
        kernex_status = "not installed"
        kernex_where = "not installed; pass --kernex-python"
    load_after = os.getloadavg()

    if args.only:
        if args.json:
            import jax

            version = "—"
            if args.only == "kernex":
                import kernex

                version = getattr(kernex, "__version__", "?")
            args.json.write_text(json.dumps({
                "version": version,
                "jax": jax.__version__,
                "cells": {case.name: {c: cell.to_json() for c, cell in cells.items()}
                          for case, cells in results},
            }))
        return 0

    title = "## Engine (`benchmarks/engine.py" + (" --quick" if args.quick else "") + "`)"
    section = (
        f"{title}\n\n{_machine(load_before, load_after, kernex_where, kernex_version)}\n"
        f"Per-call medians over {runs} runs after {warmup} warm-up call(s) (fewer where "
        f"marked), the columns of a case timed in round-robin order; calls shorter than "
        f"{H.MIN_RUN_S * 1e3:.0f} ms are batched within a run. Ratios are of medians. "
        f"kernex is timed in its own pass together with the hand baseline, and "
        f"kernex / xstencil = (kernex / hand) × (hand / xstencil), each factor from columns "
        f"timed together (the details list both hand timings). "
        f"✓/✗: target met/missed.\n\n"
        f"{table(results, kernex_status, runs)}\n### Details\n\n{details(results)}\n"
    )
    if args.json:
        args.json.write_text(json.dumps({
            "cells": {case.name: {c: cell.to_json() for c, cell in cells.items()}
                      for case, cells in results}}))
    H.publish("engine", section, args, log, partial=bool(args.case))
    return 0


if __name__ == "__main__":
    sys.exit(main())
