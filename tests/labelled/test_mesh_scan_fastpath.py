"""The repeat-call fast path of function mesh scans (``m.scan(...)``).

A repeated mesh scan skips its setup (plan, kernel traces, region
resolution, rewrap recipe) as a plain scan does, on both routes: the XLA
loop (small or ``backend="xla"``) and the numba loop nests
(``backend="loops"``).  Every case checks the repeat against a fresh call
(caches cleared: bitwise, labels included) and against a numpy time loop,
and that whatever could change the result (the regions, which kernel each
runs, a mask's cells, a global, the data, the route) recomputes instead of
reusing a stale entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.spies import counting
from xstencil._labelled import loop_mesh_scan, scan_fast
from xstencil._labelled import scan as scan_mod

N = 10
STEPS = 6
NU = 0.2
ROUTES = ["xla"] + (["loops"] if loop_mesh_scan.LS.available() else [])


def heat(u: Any) -> Any:
    c = u(time=-1)
    return c + NU * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1)
                     - 4 * c)


def damp(u: Any) -> Any:
    return 0.5 * u(time=-1)


def _np_step(a: np.ndarray, rules: np.ndarray) -> np.ndarray:
    """One step with a zero halo: ``rules`` per cell 0 (heat) or 1 (damp)."""
    p = np.pad(a, 1)
    h = a + NU * (p[1:-1, 2:] + p[1:-1, :-2] + p[2:, 1:-1] + p[:-2, 1:-1] - 4 * a)
    return np.where(rules == 1, 0.5 * a, h)


def _np_scan(a: np.ndarray, rules: np.ndarray, steps: int = STEPS) -> np.ndarray:
    for _ in range(steps):
        a = _np_step(a, rules)
    return a


def _da(seed: int = 0) -> xr.DataArray:
    return xr.DataArray(np.random.default_rng(seed).random((N, N)), dims=("y", "x"),
                        coords={"y": np.arange(N) * 0.5, "x": np.arange(N) * 0.25},
                        name="T", attrs={"units": "K"})


def _mesh(da: xr.DataArray, cols: slice, first: Any = heat, second: Any = damp,
          mask: Any = None) -> Any:
    m = da.stencil.mesh(boundary="fill", fill_value=0.0)
    m[...] = first
    m[{"x": cols}] = second
    if mask is not None:
        m[mask] = damp
    return m


def _rules(cols: slice, swapped: bool = False, mask: Any = None) -> np.ndarray:
    r = np.zeros((N, N), int)
    r[:, cols] = 1
    if swapped:
        r = 1 - r
    if mask is not None:
        r[np.asarray(mask)] = 1
    return r


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Calls that took the fast path, and full mesh scans on each route."""
    n = counting(monkeypatch, {"fast": (scan_fast, "run"), "xla_full": (scan_mod, "_run"),
                               "loop_full": (loop_mesh_scan, "_mesh_scan")})
    xstencil.clear_caches()
    yield n
    xstencil.clear_caches()


def _scan(m: Any, route: str, **kw: Any) -> Any:
    return m.scan("time", steps=STEPS, backend=route, **{"save_every": "last", **kw})


def _fresh(build: Any, route: str, **kw: Any) -> Any:
    xstencil.clear_caches()
    return _scan(build(), route, **kw)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("save_every", [1, 2, "last"])
def test_repeat_takes_the_fast_path_bitwise(counts: dict[str, int], route: str,
                                           save_every: Any) -> None:
    da = _da()
    m = _mesh(da, slice(6, None))
    first = _scan(m, route, save_every=save_every)
    again = _scan(m, route, save_every=save_every)
    full = "loop_full" if route == "loops" else "xla_full"
    assert counts["fast"] == 1 and counts[full] == 1
    xr.testing.assert_identical(again, first)
    xr.testing.assert_identical(again, _fresh(lambda: _mesh(da, slice(6, None)), route,
                                              save_every=save_every))
    want = _np_scan(da.values, _rules(slice(6, None)))
    last = again if save_every == "last" else again.isel(time=-1)
    np.testing.assert_allclose(last.values, want, rtol=1e-12, atol=1e-14)
    # a mesh rebuilt with equal regions and kernels takes the same entry
    _scan(_mesh(da, slice(6, None)), route, save_every=save_every)
    assert counts["fast"] == 2


@pytest.mark.parametrize("route", ROUTES)
def test_changed_regions_and_assignments_are_not_stale(counts: dict[str, int],
                                                       route: str) -> None:
    da = _da(1)
    base = _scan(_mesh(da, slice(6, None)), route)
    moved = _scan(_mesh(da, slice(2, 5)), route)  # other positions, same kernels
    swapped = _scan(_mesh(da, slice(6, None), damp, heat), route)  # kernels swapped
    mask = xr.DataArray(np.arange(N * N).reshape(N, N) % 7 == 0, dims=("y", "x"))
    masked = _scan(_mesh(da, slice(6, None), mask=mask), route)
    other = mask.copy(data=np.arange(N * N).reshape(N, N) % 5 == 0)  # same shape, new cells
    masked2 = _scan(_mesh(da, slice(6, None), mask=other), route)
    assert counts["fast"] == 0  # every call had its own entry
    for got, rules in [(base, _rules(slice(6, None))), (moved, _rules(slice(2, 5))),
                       (swapped, _rules(slice(6, None), swapped=True)),
                       (masked, _rules(slice(6, None), mask=mask)),
                       (masked2, _rules(slice(6, None), mask=other))]:
        np.testing.assert_allclose(got.values, _np_scan(da.values, rules), rtol=1e-12,
                                   atol=1e-14)


@pytest.mark.parametrize("route", ROUTES)
def test_changed_global_and_data_are_read_afresh(counts: dict[str, int], route: str) -> None:
    global NU
    da = _da(2)
    m = _mesh(da, slice(6, None))
    _scan(m, route)
    old = NU
    try:
        NU = 0.1
        got = _scan(m, route)
        np.testing.assert_allclose(got.values, _np_scan(da.values, _rules(slice(6, None))),
                                   rtol=1e-12, atol=1e-14)
    finally:
        NU = old
    da2 = _da(3)  # same layout, new values: the same entry, the new data
    m2 = _mesh(da2, slice(6, None))
    got = _scan(m2, route)
    np.testing.assert_allclose(got.values, _np_scan(da2.values, _rules(slice(6, None))),
                               rtol=1e-12, atol=1e-14)
    assert counts["fast"] == 1  # the new data; the global's change compiled afresh


def test_route_is_part_of_the_entry(counts: dict[str, int]) -> None:
    if "loops" not in ROUTES:
        pytest.skip("numba is not installed")
    da = _da(4)
    xla = _scan(_mesh(da, slice(6, None)), "xla")
    loops = _scan(_mesh(da, slice(6, None)), "loops")
    assert counts["fast"] == 0 and counts["xla_full"] == 1 and counts["loop_full"] == 1
    np.testing.assert_allclose(loops.values, xla.values, rtol=1e-12)


def test_label_regions_follow_the_coordinates(counts: dict[str, int]) -> None:
    """Label regions are resolved against the data's coordinates: equal
    labels reuse the entry; shifted labels select other positions, which
    are part of the entry's key."""
    def build(shift: float) -> Any:
        d = _da(5).assign_coords(x=np.arange(N) * 0.25 + shift)
        m = d.stencil.mesh(boundary="fill", fill_value=0.0)
        m[...] = heat
        m.loc[{"x": slice(1.5, None)}] = damp
        return m

    a = _scan(build(0.0), "xla")
    b = _scan(build(0.0), "xla")  # equal labels, new index objects: the same entry
    assert counts["fast"] == 1
    xr.testing.assert_identical(a, b)
    c = _scan(build(0.5), "xla")  # x >= 1.5 from column 4 on
    assert counts["fast"] == 1
    vals = _da(5).values
    np.testing.assert_allclose(a.values, _np_scan(vals, _rules(slice(6, None))), rtol=1e-12,
                               atol=1e-14)
    np.testing.assert_allclose(c.values, _np_scan(vals, _rules(slice(4, None))), rtol=1e-12,
                               atol=1e-14)


@pytest.mark.parametrize("route", ROUTES)
def test_dataset_mesh_repeat_is_bitwise_the_fresh_call(counts: dict[str, int],
                                                      route: str) -> None:
    """A Dataset's mesh scan, one variable advanced and a constant field."""
    da = _da(6)
    ds = xr.Dataset({"T": da, "k": 0.5 * da})

    def heat_k(s: Any) -> Any:
        return {"T": heat(s["T"]) + 0.0 * s["k"]()}

    def damp_k(s: Any) -> Any:
        return {"T": s["k"]() * s["T"](time=-1)}

    def build() -> Any:
        m = ds.stencil.mesh(boundary="fill", fill_value=0.0)
        m[...] = heat_k
        m[{"x": slice(6, None)}] = damp_k
        return m

    _scan(build(), route)
    again = _scan(build(), route)
    assert counts["fast"] == 1
    xr.testing.assert_identical(again, _fresh(build, route))
    a, k = da.values, 0.5 * da.values
    for _ in range(STEPS):
        h = _np_step(a, np.zeros((N, N), int))
        a = np.where(_rules(slice(6, None)) == 1, k * a, h)
    np.testing.assert_allclose(again["T"].values, a, rtol=1e-12, atol=1e-14)
