"""Dataset scans whose advanced variables lack some of the Dataset's dims
(``xstencil/_labelled/scan_dims.py``, ``_engine/tscan.py``'s ``_fitter``).

An advanced ``s(time, x)`` next to ``T(time, y, x)`` keeps its dims when the
kernel computes it from variables on ``x`` only: same numbers on XLA, on the
default route and as a numpy time loop.  A result that would vary along a dim
the variable lacks (read from ``T``, from a ``y`` coordinate, or from mesh
regions along ``y``) raises, naming the variable, its dims, the returned dims
and the fix, on every route; it is never broadcast up.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from tests.spies import count_calls
from xstencil._errors import XStencilError
from xstencil._labelled import loop_scan as LS

A, B, C = 0.1, 0.5, 0.2


def kernel(s: Any) -> dict[str, Any]:
    """T on (y, x) reads s on x; s on x and q on y advance on their own dims."""
    return {"T": s["T"](time=-1) + A * (s["T"](time=-1, x=1) - s["T"](time=-1))
            + C * s["s"](time=-1) * s["q"](time=-1),
            "s": B * s["s"](time=-1) + A * s["s"](time=-1, x=-1),
            "q": s["q"](time=-1) - A * s["q"](time=-1, y=1) + C * s["b"]()}


def numpy_reference(T0: np.ndarray, s0: np.ndarray, q0: np.ndarray, b: np.ndarray,
                    steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``kernel`` as a plain numpy time loop, periodic in x and y."""
    Ts, ss, qs = [T0], [s0], [q0]
    for _ in range(steps):
        T, s, q = Ts[-1], ss[-1], qs[-1]
        Ts.append(T + A * (np.roll(T, -1, 1) - T) + C * s[None, :] * q[:, None])
        ss.append(B * s + A * np.roll(s, 1))
        qs.append(q - A * np.roll(q, -1) + C * b)
    return np.stack(Ts), np.stack(ss), np.stack(qs)


def start(ny: int = 5, nx: int = 7, dtype: Any = np.float64) -> xr.Dataset:
    rng = np.random.default_rng(3)
    return xr.Dataset(
        {"T": (("y", "x"), rng.random((ny, nx)).astype(dtype), {"units": "K"}),
         "s": ("x", rng.random(nx).astype(dtype)),
         "q": ("y", rng.random(ny).astype(dtype)),
         "b": ("y", rng.random(ny).astype(dtype))},
        coords={"x": np.arange(nx) * 0.5, "y": np.arange(ny) * 2.0}, attrs={"title": "t"})


def trajectory(ds: xr.Dataset, n: int) -> xr.Dataset:
    """``ds`` with ``n`` copies of T, s and q along a leading time dim."""
    return ds.assign({v: (("time",) + ds[v].dims, np.stack([ds[v].values] * n), ds[v].attrs)
                      for v in ("T", "s", "q")})


def check(out: xr.Dataset, ds: xr.Dataset, steps: int, rtol: float = 1e-12) -> None:
    T, s, q = numpy_reference(ds.T.values, ds.s.values, ds.q.values, ds.b.values, steps)
    assert out["T"].dims == ("time", "y", "x")
    assert out["s"].dims == ("time", "x")
    assert out["q"].dims == ("time", "y")
    assert out["b"].dims == ("y",)
    np.testing.assert_allclose(out["T"].values, T, rtol=rtol)
    np.testing.assert_allclose(out["s"].values, s, rtol=rtol)
    np.testing.assert_allclose(out["q"].values, q, rtol=rtol)
    assert out["T"].attrs == {"units": "K"} and out.attrs == {"title": "t"}


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the scans whose time loop ran as numba loops."""
    return count_calls(monkeypatch, LS.loop_scan_steps, "run_loop")


@pytest.mark.parametrize("backend", ["xla", "loops", None])
def test_grown_variables_keep_their_own_dims(backend: str | None, ran: list[int]) -> None:
    ds = start()
    before = ds.copy(deep=True)
    for _ in range(2):  # the second call takes the repeat-call fast path
        out = ds.stencil.scan(kernel, "time", steps=4, boundary="periodic", backend=backend)
        check(out, ds, 4)
    xr.testing.assert_identical(ds, before)
    if LS.available():  # "loops" runs them as loops; small data stays on XLA by default
        assert len(ran) == (2 if backend == "loops" else 0)


@pytest.mark.parametrize("save_every", [2, "last"])
def test_loops_and_xla_agree_on_saves(save_every: object, ran: list[int]) -> None:
    ds = start(6, 9)
    outs = [ds.stencil.scan(kernel, "time", steps=6, save_every=save_every,
                            boundary="periodic", backend=b) for b in ("loops", "xla")]
    xr.testing.assert_allclose(outs[0], outs[1], rtol=1e-12)
    assert outs[0]["s"].dims == (("x",) if save_every == "last" else ("time", "x"))
    if LS.available():
        assert len(ran) == 1


def test_grown_large_default_route_matches_numpy(ran: list[int]) -> None:
    """Large enough for the default route to take the numba loops."""
    ds = start(512, 520)
    out = ds.stencil.scan(kernel, "time", steps=3, boundary="periodic")
    check(out, ds, 3)
    if LS.available():
        assert len(ran) == 1
    xla = ds.stencil.scan(kernel, "time", steps=3, boundary="periodic", backend="xla")
    xr.testing.assert_allclose(out, xla, rtol=1e-12)


def test_saves_and_float32() -> None:
    ds = start(dtype=np.float32)
    out = ds.stencil.scan(kernel, "time", steps=6, save_every=3, boundary="periodic")
    T, s, q = numpy_reference(*(ds[n].values.astype(np.float64) for n in "Tsqb"), 6)
    assert out["s"].dtype == np.float32 and out["s"].dims == ("time", "x")
    np.testing.assert_allclose(out["s"].values, s[::3], rtol=1e-5)
    np.testing.assert_allclose(out["q"].values, q[::3], rtol=1e-5)
    last = ds.stencil.scan(kernel, "time", steps=6, save_every="last", boundary="periodic")
    assert last["s"].dims == ("x",) and last["q"].dims == ("y",)
    np.testing.assert_allclose(last["T"].values, T[-1], rtol=1e-5)
    np.testing.assert_allclose(last["s"].values, s[-1], rtol=1e-5)


def test_own_trajectory_input() -> None:
    """Scanning the input's own trajectory (no steps=): the initial position
    is kept, later positions are computed."""
    ds = start()
    traj = trajectory(ds, 4)
    for backend in ("xla", None):
        out = traj.stencil.scan(kernel, "time", boundary="periodic", backend=backend)
        check(out, ds, 3)


@pytest.mark.parametrize("backend", ["xla", "loops"])
@pytest.mark.parametrize("short_first", [False, True])
def test_transposed_and_short_variable(backend: str, short_first: bool) -> None:
    """A full variable stored as (x, y) next to a short one: each keeps its
    order (the short one first: the Dataset's dims then start with x)."""
    ds = start(6, 6)
    ds["T"] = ds["T"].transpose("x", "y")
    if short_first:
        ds = ds[["s", "T", "q", "b"]]
    out = ds.stencil.scan(kernel, "time", steps=3, boundary="periodic", backend=backend)
    T, s, _ = numpy_reference(ds.T.values.T, ds.s.values, ds.q.values, ds.b.values, 3)
    assert out["T"].dims == ("time", "x", "y")
    np.testing.assert_allclose(out["T"].transpose("time", "y", "x").values, T, rtol=1e-12)
    np.testing.assert_allclose(out["s"].values, s, rtol=1e-12)


def wider(s: Any) -> dict[str, Any]:
    return {"T": s["T"](time=-1), "s": s["s"](time=-1) + s["T"](time=-1),
            "q": s["q"](time=-1)}


@pytest.mark.parametrize("backend", ["xla", "loops", None])
def test_result_from_a_wider_variable_raises(backend: str | None) -> None:
    ds = start()
    with pytest.raises(XStencilError, match=r"ds\.stencil\.scan\(\.\.\.\): the kernel returns "
                       r"'s' on dims \('y', 'x'\) \(it is computed from variable\(s\) "
                       r"\['T'\]\), but 's' has dims \('x',\); a scan never broadcasts .*"
                       r"ds\['s'\]\.broadcast_like\(ds\['T'\]\)"):
        ds.stencil.scan(wider, "time", steps=2, boundary="periodic", backend=backend)
    traj = trajectory(ds, 3)
    with pytest.raises(ValueError, match=r"returns 's' on dims \('time', 'y', 'x'\) .*"
                       r"'s' has dims \('time', 'x'\)"):
        traj.stencil.scan(wider, "time", boundary="periodic", backend=backend)


def test_large_default_route_raises_too() -> None:
    ds = start(512, 520)
    with pytest.raises(XStencilError, match="'s' has dims \\('x',\\)"):
        ds.stencil.scan(wider, "time", steps=2, boundary="periodic")


def test_result_from_a_coordinate_raises() -> None:
    ds = start()
    k = lambda s: {"T": s["T"](time=-1), "q": s["q"](time=-1),  # noqa: E731
                   "s": s["s"](time=-1) + s["T"].coord("y")()}
    with pytest.raises(XStencilError, match=r"computed from the coordinate\(s\) \('y',\)\), "
                       r"but 's' has dims \('x',\)"):
        ds.stencil.scan(k, "time", steps=2, window={"y": 1, "time": (1, 0)})


def test_mesh_regions_along_a_missing_dim_raise(ran: list[int]) -> None:
    ds = start()
    plain = lambda s: {"T": s["T"](time=-1), "s": s["s"](time=-1),  # noqa: E731
                       "q": s["q"](time=-1)}
    double = lambda s: {"T": 2 * s["T"](time=-1), "s": 2 * s["s"](time=-1),  # noqa: E731
                        "q": 2 * s["q"](time=-1)}
    m = ds.stencil.mesh(boundary="periodic")
    m[...] = plain
    m[{"y": 0}] = double
    for backend in ("xla", "loops"):
        with pytest.raises(XStencilError, match=r"the mesh's regions vary along \('y',\), so "
                           r"the kernels would return 's' on dims \('y', 'x'\), but 's' has "
                           r"dims \('x',\)"):
            m.scan("time", steps=2, backend=backend)
    ok = ds.drop_vars("q").stencil.mesh(boundary="periodic")
    ok[...] = lambda s: {"T": s["T"](time=-1), "s": s["s"](time=-1)}
    ok[{"x": 1}] = lambda s: {"T": 2 * s["T"](time=-1), "s": 3 * s["s"](time=-1)}
    for backend in ("xla", "loops"):
        before = len(ran)
        out = ok.scan("time", steps=2, backend=backend)
        if LS.available():
            assert len(ran) == before + (backend == "loops")
        factor = np.where(np.arange(ds.sizes["x"]) == 1, 3.0, 1.0)
        np.testing.assert_allclose(out["s"].values, ds.s.values * factor ** np.arange(3)[:, None],
                                   rtol=1e-12)
        assert out["s"].dims == ("time", "x")
