"""Compile once per structure (issue 13, section 1).

Compilations are counted with JAX's own monitoring events (one
``backend_compile_duration`` event per XLA compilation), and traces with a
counter that the kernels bump while they are traced.  After a warm-up, a
rebuilt mesh, a closure over a new weight array of the same shape and the
README's inline lambdas run without compiling or tracing again, and their
results still match numpy references.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

import xstencil
from tests.compiles import compiles

_TRACES = [0]


def _traced() -> int:
    """Bumps the trace counter (a kernel body runs only while being traced)."""
    _TRACES[0] += 1
    return 0


@contextmanager
def counting() -> Iterator[dict[str, int]]:
    """Counts XLA compilations and kernel traces inside the block."""
    start = _TRACES[0]
    with compiles() as got:
        try:
            yield got
        finally:
            got["traces"] = _TRACES[0] - start


def _field(seed: int, shape: tuple[int, int] = (24, 32)) -> xr.DataArray:
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    return xr.DataArray(x, dims=("y", "x"),
                        coords={"y": np.arange(shape[0]) * 0.1, "x": np.arange(shape[1]) * 0.1})


def _lap(u: Any) -> Any:
    return _traced() + u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def _build_mesh(T: xr.DataArray) -> xstencil.Mesh:
    """A mesh built inside a function: module-level and inline kernels,
    regions by label and by position."""
    m = T.stencil.mesh(boundary="periodic")
    m[...] = _lap
    m.loc[{"x": 0.0}] = lambda u: _traced() + 1.0
    m[{"y": -1}] = lambda u: _traced() + 2 * u()
    return m


def _mesh_reference(x: np.ndarray) -> np.ndarray:
    lap = (np.roll(x, -1, 1) + np.roll(x, 1, 1) + np.roll(x, -1, 0) + np.roll(x, 1, 0)
           - 4 * x)
    lap[:, 0] = 1.0
    lap[-1, :] = 2 * x[-1, :]
    return lap


def test_a_rebuilt_mesh_does_not_recompile() -> None:
    for seed in (0, 1):  # warm-up (a kernel whose trace writes a list settles in two)
        _build_mesh(_field(seed)).map()
    with counting() as n:
        outs = []
        for seed in (2, 3, 4):  # a new mesh over new data in a Python loop
            T = _field(seed)
            outs.append((T.values, _build_mesh(T).map().values))
    assert n["compiles"] == 0 and n["traces"] == 0, n
    for x, out in outs:
        np.testing.assert_allclose(out, _mesh_reference(x), rtol=1e-5, atol=1e-5)


def test_a_rebuilt_mesh_scan_does_not_recompile() -> None:
    def run(seed: int) -> np.ndarray:
        m = _field(seed).stencil.mesh(boundary="periodic")
        m[...] = lambda u: u(time=-1) + 0.1 * (u(time=-1, x=1) - 2 * u(time=-1)
                                               + u(time=-1, x=-1))
        m[{"x": 0}] = lambda u: 0.0
        return m.scan(dim="time", steps=4, save_every="last").values

    run(0)
    with counting() as n:
        out = run(1)
    assert n["compiles"] == 0, n
    ref = _field(1).values.astype(np.float64)
    for _ in range(4):
        ref = ref + 0.1 * (np.roll(ref, -1, 1) - 2 * ref + np.roll(ref, 1, 1))
        ref[:, 0] = 0.0
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def _correlate(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """sum_ab w[a, b] * x[i + a - c, j + b - c], periodic, by hand."""
    c0, c1 = (w.shape[0] - 1) // 2, (w.shape[1] - 1) // 2
    out = np.zeros(x.shape, np.float64)
    for a in range(w.shape[0]):
        for b in range(w.shape[1]):
            out += w[a, b] * np.roll(x, (c0 - a, c1 - b), axis=(0, 1))
    return out


def test_a_closure_over_new_weights_of_the_same_shape_does_not_recompile() -> None:
    T = _field(0)
    rng = np.random.default_rng(1)

    def blur(w: np.ndarray) -> xr.DataArray:
        return T.stencil.map(lambda u: _traced() + (u * w).sum(), window={"y": 9, "x": 9},
                             boundary="periodic")

    for _ in range(2):  # warm-up
        blur(rng.normal(size=(9, 9)).astype(np.float32))
    with counting() as n:
        ws = [rng.normal(size=(9, 9)).astype(np.float32) for _ in range(3)]
        outs = [blur(w).values for w in ws]
    assert n["compiles"] == 0 and n["traces"] == 0, n
    for w, out in zip(ws, outs, strict=True):
        np.testing.assert_allclose(out, _correlate(T.values, w), rtol=1e-4, atol=1e-4)
    with counting() as n:  # another shape is another structure: it compiles
        w5 = np.ones((5, 5), np.float32)
        out = T.stencil.map(lambda u: (u * w5).sum(), window={"y": 5, "x": 5},
                            boundary="periodic")
    assert n["compiles"] >= 1
    np.testing.assert_allclose(out.values, _correlate(T.values, w5), rtol=1e-4, atol=1e-4)


def test_an_array_changed_in_place_is_read_afresh() -> None:
    T = _field(0)
    w = np.ones((3, 3), np.float32)

    def k(u: Any) -> Any:
        return (u * w).sum()

    a = T.stencil.map(k, window={"y": 3, "x": 3}, boundary="periodic")
    w[...] = 2.0
    b = T.stencil.map(k, window={"y": 3, "x": 3}, boundary="periodic")
    np.testing.assert_allclose(a.values, _correlate(T.values, np.ones((3, 3))), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(b.values, 2 * a.values, rtol=1e-6)


def _readme_taste() -> str:
    text = (Path(__file__).parents[2] / "README.md").read_text()
    section = text.split("## A taste of the API", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_inline_lambdas_do_not_recompile_on_a_second_run(capsys: Any) -> None:
    """The README's code run again in the same namespace (a re-run notebook
    cell): new lambdas, a new mesh and new random data, no compilation."""
    ns: dict[str, Any] = {}
    exec(compile(_readme_taste(), "<readme>", "exec"), ns)
    first = {k: ns[k].values for k in ("lap", "blur", "ddx")}
    with counting() as n:
        exec(compile(_readme_taste(), "<readme>", "exec"), ns)
    assert n["compiles"] == 0, n
    assert ns["traj"].sizes["time"] == 11
    x = ns["T"].values
    lap = np.roll(x, -1, 1) + np.roll(x, 1, 1) + np.roll(x, -1, 0) + np.roll(x, 1, 0) - 4 * x
    np.testing.assert_allclose(ns["lap"].values, lap, rtol=1e-5, atol=1e-5)
    assert not np.array_equal(ns["lap"].values, first["lap"])  # new data, new result
    capsys.readouterr()


def test_clear_caches_compiles_again_with_the_same_result() -> None:
    T = _field(0)
    k = lambda u: u(x=1) - u(x=-1)  # noqa: E731
    a = T.stencil.map(k, boundary="periodic")
    xstencil.clear_caches()
    with counting() as n:
        b = T.stencil.map(k, boundary="periodic")
    assert n["compiles"] >= 1
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_allclose(a.values, np.roll(T.values, -1, 1) - np.roll(T.values, 1, 1),
                               rtol=1e-6, atol=1e-6)
