"""Adversarial checks of function meshes and scans against plain numpy loops.

Every expected value here comes from an independent numpy reference: a time
loop (or one pass over the regions) that pads with ``np.pad`` in the matching
mode (library ``reflect``/``symmetric`` = numpy's, ``extend`` = ``edge``,
``periodic`` = ``wrap``, ``fill`` = ``constant``), evaluates every region's
kernel on the *old* state and lets the later region win.  Data are small
integers and the coefficients powers of two, so float64 results are exact and
compared bitwise; each case runs on ``backend="xla"`` and ``"loops"`` and,
for scans, with temporal blocking (tiles that do not divide the field, one
step or several per layer).  ``blocking=False`` keeps the whole-array XLA loop
(docs/performance.rst), so the whole-array loop scan is ``blocking=None``.

Two tests record silently wrong boundaries this pass found and the fix: a
``fill_value`` that underflowed to zero in the data's dtype (a boundary
silently zero) and an integer ``fill_value`` the float dtype cannot hold
(silently rounded) are refused now.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from numpy.lib.stride_tricks import sliding_window_view

import xstencil  # noqa: F401 - registers the accessor

pytest.importorskip("numba")

_NP = {"reflect": "reflect", "symmetric": "symmetric", "extend": "edge", "periodic": "wrap"}
BACKENDS = ("xla", "loops")


def _pad(a: np.ndarray, dims: tuple[str, ...], boundary: Any, h: int, fill: float) -> np.ndarray:
    out = a
    for ax, d in enumerate(dims):
        mode = boundary[d] if isinstance(boundary, dict) else boundary
        width = [(0, 0)] * a.ndim
        width[ax] = (h, h)
        out = (np.pad(out, width, mode="constant", constant_values=fill) if mode == "fill"
               else np.pad(out, width, mode=_NP[mode]))
    return out


class _Win:
    """numpy stand-in for a kernel's window: ``u(time=-1, x=1)`` is a shifted
    view of the padded state ``-time`` steps back."""

    def __init__(self, states: dict[int, np.ndarray], dims: tuple[str, ...], boundary: Any,
                 fill: float, h: int = 2) -> None:
        self.p = {t: _pad(s, dims, boundary, h, fill) for t, s in states.items()}
        self.dims, self.h = dims, h
        self.shape = next(iter(states.values())).shape

    def __call__(self, time: int = 0, **off: int) -> np.ndarray:
        return self.p[time][tuple(slice(self.h + off.get(d, 0), self.h + off.get(d, 0) + n)
                                  for d, n in zip(self.dims, self.shape, strict=True))]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _mask(pos: xr.DataArray, sel: Any, loc: bool) -> np.ndarray:
    """The cells ``pos.isel(sel)`` (``pos.sel`` with ``loc``) selects, as xarray does."""
    if sel is ...:
        return np.ones(pos.shape, bool)
    if isinstance(sel, xr.DataArray):
        return sel.transpose(*pos.dims).reindex_like(pos).values
    idx = (pos.sel(sel) if loc else pos.isel(sel)).values.ravel()
    m = np.zeros(pos.shape, bool)
    m.flat[idx] = True
    return m


def _assign(m: Any, sel: Any, loc: bool, k: Any) -> None:
    if loc:
        m.loc[sel] = k
    else:
        m[sel] = k


# ---------------------------------------------------------------- meshes (map)

def _lin(*terms: tuple[float, dict[str, int]]) -> Callable[[Any], Any]:
    def k(u: Any) -> Any:
        acc = None
        for c, off in terms:
            v = c * u(**off)
            acc = v if acc is None else acc + v
        return acc
    return k


_DESC = np.arange(6, dtype=float)[::-1] * 0.25          # descending labels
_PERM = np.array([3.0, 1.0, 5.0, 0.0, 2.0, 4.0])         # non-monotonic labels


@pytest.mark.parametrize("boundary", ["reflect", "symmetric", "extend", "periodic", "fill",
                                      {"y": "periodic", "x": "symmetric"}])
def test_overlapping_regions_by_position_label_and_mask_match_numpy(boundary: Any) -> None:
    """Regions by negative-step slices, integer lists, labels on descending and
    non-monotonic coordinates and a transposed, flipped mask; they overlap
    (later wins) and leave cells uncovered (they keep the input)."""
    ny, nx = 6, 7
    rng = np.random.default_rng(7)
    a = rng.integers(-5, 6, (ny, nx)).astype(float)
    # a periodic dim needs a uniform coordinate (its period is inferred)
    coords = {"y": _DESC if "periodic" in str(boundary) else _PERM,
              "x": np.arange(nx) * 3 + 10}
    da = xr.DataArray(a, dims=("y", "x"), coords=coords, name="T", attrs={"units": "K"})
    pos = xr.DataArray(np.arange(ny * nx).reshape(ny, nx), dims=("y", "x"), coords=coords)
    land = xr.DataArray(rng.random((ny, nx)) < 0.3, dims=("y", "x"), coords=coords)
    regions: list[tuple[Any, bool, Any]] = [
        ({"y": slice(-1, 0, -2), "x": slice(None, None, -3)}, False,
         _lin((2.0, {"y": -2, "x": 1}), (-1.0, {}))),
        ({"x": [6, 0, 3]}, False, _lin((1.0, {"y": 1}), (1.0, {"y": -1}), (-0.5, {"x": 2}))),
        ({"y": coords["y"][2].item()}, True, _lin((0.25, {"x": -2}))),
        ({"x": slice(13, 19)}, True, lambda u: -3.0),
        (land.transpose("x", "y").isel(y=slice(None, None, -1)), False,
         _lin((1.0, {"y": 2, "x": 2}), (-1.0, {"y": -2, "x": -2}))),
        ({"y": slice(1, 3), "x": -1}, False, _lin((4.0, {"x": 1}))),
    ]
    w = _Win({0: a}, ("y", "x"), boundary, 5.0)
    want = a.copy()
    for sel, loc, k in regions:
        mk = _mask(pos, sel, loc)
        want[mk] = np.broadcast_to(np.asarray(k(w), float), a.shape)[mk]
    assert not np.any([_mask(pos, s, lc) for s, lc, _ in regions], axis=0).all()
    for backend in BACKENDS:
        m = da.stencil.mesh(boundary=boundary, fill_value=5.0, backend=backend)
        for sel, loc, k in regions:
            _assign(m, sel, loc, k)
        got = m.map()
        np.testing.assert_array_equal(np.asarray(got.values), want, err_msg=backend)
        assert got.dims == ("y", "x") and got.name == "T" and got.attrs == {"units": "K"}
        for d in ("y", "x"):
            np.testing.assert_array_equal(got[d].values, coords[d])


def test_label_selections_follow_sel_on_datetimes_duplicates_and_floats() -> None:
    """``m.loc`` selects exactly the cells ``.sel`` does: partial datetime
    strings, string slices, duplicated labels, float slices between labels
    and a label slice with a negative step."""
    t = pd.date_range("2020-01-30", periods=6, freq="D")
    cases: list[tuple[xr.DataArray, Any]] = [
        (xr.DataArray(np.arange(6.0), dims="t", coords={"t": t}), {"t": "2020-02"}),
        (xr.DataArray(np.arange(6.0), dims="t", coords={"t": t}),
         {"t": slice("2020-01-31", "2020-02-02")}),
        (xr.DataArray(np.arange(6.0), dims="x", coords={"x": [0.0, 1, 1, 2, 3, 3]}),
         {"x": slice(1.0, 3.0)}),
        (xr.DataArray(np.arange(6.0), dims="x", coords={"x": np.linspace(0, 1, 6)}),
         {"x": slice(0.7, 0.1, -1)}),
        (xr.DataArray(np.arange(6.0), dims="x", coords={"x": _PERM}), {"x": slice(1.0, 0.0)}),
        (xr.DataArray(np.arange(6.0), dims="x", coords={"x": _DESC}), {"x": slice(1.0, 0.25)}),
    ]
    for da, sel in cases:
        pos = xr.DataArray(np.arange(da.size), dims=da.dims, coords=da.coords)
        want = da.values.copy()
        want[_mask(pos, sel, True)] = -1.0
        for backend in BACKENDS:
            m = da.stencil.mesh(backend=backend)
            m.loc[sel] = lambda u: u() * 0.0 - 1.0
            np.testing.assert_array_equal(m.map().values, want, err_msg=f"{sel} {backend}")


@pytest.mark.parametrize(("boundary", "stride"), [("reflect", {"y": 2, "x": 3}),
                                                  ("valid", {"y": 2, "x": 1}),
                                                  ("fill", {"y": 1, "x": 3})])
def test_window_array_kernels_with_stride_and_valid(boundary: str, stride: dict[str, int]
                                                    ) -> None:
    """Kernels that use the window as an array (``(u * w).sum()``, ``u.max()``,
    ``u[0, 0]``) per region, subsampled by ``stride`` and trimmed by
    ``valid``: the cells of the full-resolution numpy mesh."""
    ny, nx, wy, wx = 7, 8, 5, 3
    rng = np.random.default_rng(3)
    a = rng.integers(-5, 6, (ny, nx)).astype(float)
    W = rng.integers(-2, 3, (wy, wx)).astype(float)
    da = xr.DataArray(a, dims=("y", "x"), coords={"y": np.arange(ny) * 1.0,
                                                    "x": np.arange(nx) * 2.0})
    pos = xr.DataArray(np.arange(ny * nx).reshape(ny, nx), dims=("y", "x"))
    if boundary == "valid":
        win, crop = sliding_window_view(a, (wy, wx)), (slice(2, -2), slice(1, -1))
    else:
        win = sliding_window_view(_pad(a, ("y", "x"), boundary, 2, -7.0)[:, 1:-1], (wy, wx))
        crop = (slice(None), slice(None))
    regions: list[tuple[Any, Any, Any]] = [
        (..., lambda u: (u * W).sum(), (win * W).sum(axis=(-1, -2))),
        ({"x": slice(None, None, -2)}, lambda u: u.max() - u(), win.max(axis=(-1, -2))
         - win[..., 2, 1]),
        ({"y": [0, -1, 3]}, lambda u: u[0, 0] * 2.0, win[..., 2, 1] * 2.0),
    ]
    want = a[crop].copy()
    for sel, _, v in regions:
        mk = _mask(pos, sel, False)[crop]
        want[mk] = v[mk]
    want = want[::stride["y"], ::stride["x"]]
    for backend in BACKENDS:
        m = da.stencil.mesh(boundary=boundary, fill_value=-7.0, window={"y": wy, "x": wx},
                            stride=stride, backend=backend)
        for sel, k, _ in regions:
            m[sel] = k
        got = m.map()
        np.testing.assert_array_equal(np.asarray(got.values), want, err_msg=backend)
        np.testing.assert_array_equal(got.x.values, da.x.values[crop[1]][::stride["x"]])
        np.testing.assert_array_equal(got.y.values, da.y.values[crop[0]][::stride["y"]])


def test_region_dtypes_promote_without_truncation() -> None:
    """An int32 region next to a float32 one on uint8 data: float32, no wrap
    in the int region, kept cells converted exactly; a bool region on fully
    covered data stays bool-valued in the promoted dtype."""
    u8 = xr.DataArray(np.array([250, 251, 252, 253, 254, 255], np.uint8), dims="x")
    for backend in BACKENDS:
        m = u8.stencil.mesh(boundary="extend", backend=backend)
        m[{"x": slice(0, 2)}] = lambda u: u().astype(jnp.float32) + jnp.float32(0.5)
        m[{"x": slice(2, 4)}] = lambda u: u().astype(jnp.int32) * 1000
        got = m.map()
        assert got.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(got.values),
                                      [250.5, 251.5, 252000, 253000, 254, 255])
        m = u8.stencil.mesh(boundary="extend", backend=backend)
        m[{"x": slice(0, 3)}] = lambda u: u() > 251
        got = m.map()
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(np.asarray(got.values), [0, 0, 1, 253, 254, 255])


# ---------------------------------------------------------------- scans

def _scan_ref(hist: list[np.ndarray], kernel: Callable[[Any], Any], steps: int,
              dims: tuple[str, ...], boundary: Any, fill: float) -> list[np.ndarray]:
    hist = list(hist)
    for _ in range(steps):
        w = _Win({-1: hist[-1], -2: hist[-2] if len(hist) > 1 else hist[-1]}, dims, boundary,
                 fill)
        hist.append(np.broadcast_to(np.asarray(kernel(w), float), hist[-1].shape).copy())
    return hist


def _saved(hist: list[np.ndarray], k: int, save_every: Any) -> np.ndarray:
    if save_every == "last":
        return hist[-1]
    return np.stack(hist[:k] + hist[k::][save_every - 1::save_every])


def _sum_kernel(*terms: tuple[float, int, dict[str, int]]) -> Callable[[Any], Any]:
    def k(u: Any) -> Any:
        acc = None
        for c, t, off in terms:
            v = c * u(time=t, **off)
            acc = v if acc is None else acc + v
        return acc
    return k


_SCAN_CASES = [
    # dims/shape, boundary, terms, steps, save_every, tile, K
    ((9, 7), {"y": "periodic", "x": "reflect"},
     [(0.5, -1, {"y": 2, "x": -1}), (0.25, -1, {"x": 2}), (-0.5, -1, {})], 6, 3, 2, 3),
    ((5, 11), "symmetric", [(1.0, -1, {"y": -2}), (-0.25, -1, {"x": 1, "y": 1})], 5, 1, 1, 4),
    ((4,), "periodic", [(0.5, -1, {"x": -2}), (0.25, -1, {"x": 2}), (0.125, -1, {})], 7, "last",
     3, 2),
    ((6, 3), "fill", [(0.5, -1, {"x": 1}), (0.5, -1, {"y": -1})], 4, 2, 5, 1),
    ((7, 8), "extend", [(0.5, -1, {"x": 1}), (0.25, -2, {"y": -1}), (0.25, -2, {})], 6, 2, 3, 2),
]


@pytest.mark.parametrize(("shape", "boundary", "terms", "steps", "save_every", "tile", "K"),
                         _SCAN_CASES)
def test_grown_scans_match_numpy_on_every_path(shape: tuple[int, ...], boundary: Any,
                                               terms: list[Any], steps: int, save_every: Any,
                                               tile: int, K: int) -> None:
    """Grown scans (one or two levels back, per-dim boundaries, ``save_every``
    of 1, a divisor or ``"last"``) on the whole-array XLA and loop scans and
    blocked with tiles that do not divide the field: values, time labels,
    dims, name, attrs and dtype."""
    dims = ("y", "x")[-len(shape):]
    k = 2 if any(t == -2 for _, t, _ in terms) else 1
    rng = np.random.default_rng(len(terms) + steps)
    dt = 0.5
    if k == 2:
        a = rng.integers(-4, 5, (2, *shape)).astype(float)
        da = xr.DataArray(a, dims=("time", *dims), coords={"time": [3.0, 3.5]}, name="v",
                          attrs={"a": 1})
        hist, t0 = [a[0], a[1]], [3.0, 3.5]
    else:
        a = rng.integers(-4, 5, shape).astype(float)
        da = xr.DataArray(a, dims=dims, name="v", attrs={"a": 1})
        hist, t0 = [a], [0.0]
    kern = _sum_kernel(*terms)
    hist = _scan_ref(hist, kern, steps, dims, boundary, 2.0)
    times = t0 + [t0[-1] + dt * (i + 1) for i in range(steps)]
    want = _saved(hist, k, save_every)
    want_t = times[-1] if save_every == "last" else _saved(
        [np.asarray(t) for t in times], k, save_every)
    for backend, blocking in [("xla", None), ("loops", None), ("xla", True), ("loops", True),
                              ("xla", {"tile": tile, "steps": K}),
                              ("loops", {"tile": tile, "steps": K})]:
        with _quiet():
            got = da.stencil.scan(
                kern, dim="time", steps=steps, dt=dt, boundary=boundary, fill_value=2.0,
                save_every=save_every, backend=backend, blocking=blocking)
        where = f"{backend} blocking={blocking}"
        np.testing.assert_array_equal(np.asarray(got.values), want, err_msg=where)
        np.testing.assert_array_equal(got.time.values, want_t, err_msg=where)
        assert got.dims == (dims if save_every == "last" else ("time", *dims)), where
        assert got.name == "v" and got.attrs == {"a": 1} and got.dtype == np.float64, where


def test_full_trajectory_with_forcing_two_levels_back_and_saves() -> None:
    """Scanning a given trajectory: reads at offset 0 see the input (forcing),
    negative ones the computed values, two levels back; the saved positions'
    labels are the input's own (non-uniform) times."""
    nt, nx = 8, 6
    rng = np.random.default_rng(4)
    a = rng.integers(-4, 5, (nt, nx)).astype(float)
    tc = np.cumsum(rng.integers(1, 4, nt)) * 0.25
    da = xr.DataArray(a, dims=("time", "x"), coords={"time": tc, "x": np.arange(nx) * 1.0})

    def kern(u: Any) -> Any:
        return 0.5 * u(time=-1, x=1) - 0.25 * u(time=-2, x=-2) + u(time=0, x=2)

    out = a.copy()
    for t in range(2, nt):
        p1, p2, p0 = (_pad(v, ("x",), "reflect", 2, 0.0) for v in (out[t - 1], out[t - 2], a[t]))
        out[t] = 0.5 * p1[3:3 + nx] - 0.25 * p2[0:nx] + p0[4:4 + nx]
    for backend in BACKENDS:
        for blocking in (None, {"tile": 4, "steps": 3}):
            with _quiet():
                got = da.stencil.scan(
                    kern, dim="time", boundary={"x": "reflect"}, save_every=3,
                    backend=backend, blocking=blocking)
            np.testing.assert_array_equal(np.asarray(got.values), out[[0, 1, 4, 7]])
            np.testing.assert_array_equal(got.time.values, tc[[0, 1, 4, 7]])


def test_coupled_dataset_scan_reads_only_old_values() -> None:
    """Two coupled fields and a constant: each new field is computed from the
    old values of both, never from a partly updated state, on every path."""
    ny, nx = 7, 9
    rng = np.random.default_rng(0)
    u0, h0, c = (rng.integers(-4, 5, (ny, nx)).astype(float) for _ in range(3))
    ds = xr.Dataset({"u": (("y", "x"), u0), "h": (("y", "x"), h0), "c": (("y", "x"), c)},
                    attrs={"title": "sw"})

    def k(s: Any) -> Any:
        return {"u": s["h"](time=-1, x=1) - 0.5 * s["u"](time=-1, y=-1) + 0.25 * s["c"](),
                "h": s["u"](time=-1, x=-1) + 0.5 * s["h"](time=-1)}

    u, h, hist = u0, h0, [(u0, h0)]
    for _ in range(4):
        pu, ph = _pad(u, ("y", "x"), "periodic", 1, 0), _pad(h, ("y", "x"), "periodic", 1, 0)
        u, h = (ph[1:-1, 2:] - 0.5 * pu[:-2, 1:-1] + 0.25 * c,
                pu[1:-1, :-2] + 0.5 * h)
        hist.append((u, h))
    for backend in BACKENDS:
        for blocking in (None, False, {"tile": 3, "steps": 2}):
            with _quiet():
                got = ds.stencil.scan(
                    k, dim="time", steps=4, boundary="periodic", save_every=2, backend=backend,
                    blocking=blocking)
            where = f"{backend} {blocking}"
            for i, j in enumerate((0, 2, 4)):
                np.testing.assert_array_equal(got["u"].isel(time=i).values, hist[j][0], where)
                np.testing.assert_array_equal(got["h"].isel(time=i).values, hist[j][1], where)
            assert "time" not in got["c"].dims and list(got.data_vars) == ["u", "h", "c"]
            assert got.attrs == {"title": "sw"}


def test_dataset_mesh_scan_swap_region_reads_old_values() -> None:
    """A mesh region that swaps two variables (``u <- h``, ``h <- u``) under a
    transposed land mask, a wall row and an interior kernel, every step."""
    ny, nx = 5, 7
    rng = np.random.default_rng(2)
    u0, h0 = (rng.integers(-4, 5, (ny, nx)).astype(float) for _ in range(2))
    land = xr.DataArray(rng.random((nx, ny)) < 0.3, dims=("x", "y"))
    ds = xr.Dataset({"u": (("y", "x"), u0), "h": (("y", "x"), h0)})

    def interior(s: Any) -> Any:
        return {"u": s["u"](time=-1) - 0.5 * s["h"](time=-1, x=1),
                "h": s["h"](time=-1) - 0.25 * s["u"](time=-1, y=-1)}

    def wall(s: Any) -> Any:
        return {"u": 0.0 * s["u"](time=-1), "h": s["h"](time=-1, y=1)}

    def swap(s: Any) -> Any:
        return {"u": s["h"](time=-1), "h": s["u"](time=-1)}

    L = land.transpose("y", "x").values
    u, h, hist = u0, h0, [(u0, h0)]
    for _ in range(4):
        pu, ph = np.pad(u, 1, mode="edge"), np.pad(h, 1, mode="edge")
        nu, nh = u - 0.5 * ph[1:-1, 2:], h - 0.25 * pu[:-2, 1:-1]
        nu[0], nh[0] = 0.0, ph[2, 1:-1]
        nu[L], nh[L] = h[L], u[L]
        u, h = nu, nh
        hist.append((u, h))
    for backend in BACKENDS:
        m = ds.stencil.mesh(boundary="extend", backend=backend)
        m[...] = interior
        m[{"y": 0}] = wall
        m[land] = swap
        got = m.scan(dim="time", steps=4)
        for j in range(5):
            np.testing.assert_array_equal(got["u"].isel(time=j).values, hist[j][0], backend)
            np.testing.assert_array_equal(got["h"].isel(time=j).values, hist[j][1], backend)


def test_mesh_scan_over_a_trajectory_with_time_masks_and_overlaps() -> None:
    """A mesh scan of a given trajectory, two levels back: a (time, x) mask, a
    region by position along time that overrides it, and cells left
    uncovered, which keep the input at their position."""
    nt, nx = 7, 6
    rng = np.random.default_rng(5)
    a = rng.integers(-4, 5, (nt, nx)).astype(float)
    tm = rng.random((nt, nx)) < 0.5
    da = xr.DataArray(a, dims=("time", "x"), coords={"time": np.arange(nt) * 0.5})
    M = xr.DataArray(tm, dims=("time", "x"), coords={"time": da.time}).isel(
        time=slice(None, None, -1))  # aligned by label

    def k1(u: Any) -> Any:
        return 0.5 * u(time=-1, x=1) + 0.25 * u(time=-2, x=-1)

    def k2(u: Any) -> Any:
        return u(time=-1) - u(time=0, x=1)

    out = a.copy()
    for t in range(2, nt):
        v1 = 0.5 * np.roll(out[t - 1], -1) + 0.25 * np.roll(out[t - 2], 1)
        v2 = out[t - 1] - np.roll(a[t], -1)
        new = a[t].copy()
        new[1:4] = v2[1:4]
        new[tm[t]] = -2.0
        if t == 3:
            new[:] = v1
        out[t] = new
    for backend in BACKENDS:
        m = da.stencil.mesh(boundary="periodic", backend=backend)
        m[{"x": slice(1, 4)}] = k2
        m[M] = lambda u: -2.0 + 0.0 * u(time=-1)
        m[{"time": 3}] = k1
        for se, idx in ((1, slice(None)), (5, [0, 1, 6])):
            got = m.scan(dim="time", save_every=se)
            np.testing.assert_array_equal(np.asarray(got.values), out[idx], backend)
        assert float(m.scan(dim="time", save_every="last").time) == 3.0


def test_integer_and_float16_states_round_and_wrap_like_numpy() -> None:
    """A uint8 state whose sums wrap, and a float16 state, on every path."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (6, 7)).astype(np.uint8)
    f = (rng.random((6, 7)) * 10).astype(np.float16)

    def ku(u: Any) -> Any:
        return u(time=-1, x=1) + u(time=-1, y=-1) + u(time=-1) * np.uint8(3)

    def kf(u: Any) -> Any:
        return u(time=-1) * np.float16(0.3) + u(time=-1, x=1) * np.float16(0.7)

    su, sf = a, f
    for _ in range(5):
        p = _pad(su, ("y", "x"), "reflect", 1, 0)
        su = (p[1:-1, 2:] + p[:-2, 1:-1] + p[1:-1, 1:-1] * np.uint8(3)).astype(np.uint8)
        q = _pad(sf, ("y", "x"), "periodic", 1, 0)
        sf = q[1:-1, 1:-1] * np.float16(0.3) + q[1:-1, 2:] * np.float16(0.7)
    for backend in BACKENDS:
        for blocking in (None, {"tile": 2, "steps": 2}):
            for data, kernel, mode, want in ((a, ku, "reflect", su), (f, kf, "periodic", sf)):
                with _quiet():
                    got = xr.DataArray(data, dims=("y", "x")).stencil.scan(
                        kernel, dim="time", steps=5, boundary=mode, backend=backend,
                        blocking=blocking, save_every="last")
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(np.asarray(got.values), want)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("boundary", ["reflect", "symmetric", "extend", "periodic", "fill"])
def test_fields_smaller_than_the_reach(n: int, boundary: str) -> None:
    """A reach of 2 on fields of 2 and 3 points (numpy's repeated
    reflection), mapped and scanned, blocked with 1-point tiles too."""
    a = np.arange(1.0, n + 1)
    da = xr.DataArray(a, dims="x")
    p = _pad(a, ("x",), boundary, 2, 0.0)
    for backend in BACKENDS:
        got = da.stencil.map(lambda u: u(x=-2) + 10.0 * u(x=-1) + 100.0 * u(x=2),
                             boundary=boundary, fill_value=0.0, backend=backend)
        np.testing.assert_array_equal(np.asarray(got.values),
                                      p[0:n] + 10.0 * p[1:1 + n] + 100.0 * p[4:4 + n])
    st = a
    for _ in range(3):
        q = _pad(st, ("x",), boundary, 2, 0.0)
        st = 0.5 * q[0:n] + 0.25 * q[4:4 + n] + 0.125 * q[2:2 + n]
    for backend in BACKENDS:
        for blocking in (None, {"tile": 1, "steps": 2}):
            with _quiet():
                got = da.stencil.scan(
                    lambda u: 0.5 * u(time=-1, x=-2) + 0.25 * u(time=-1, x=2) + 0.125 * u(time=-1),
                    dim="time", steps=3, boundary=boundary, fill_value=0.0,
                    backend=backend, blocking=blocking, save_every="last")
            np.testing.assert_array_equal(np.asarray(got.values), st)


def test_mirrored_coordinates_under_blocking() -> None:
    """A kernel reading a non-uniform coordinate near ``reflect`` edges reads
    mirrored labels (docs/window.rst), with and without tiles."""
    rng = np.random.default_rng(1)
    ny, nx = 6, 13
    x = np.cumsum(rng.integers(1, 4, nx) * 0.5)
    a = rng.integers(-3, 4, (ny, nx)).astype(float)
    xp = np.concatenate([2 * x[0] - x[2:0:-1], x, 2 * x[-1] - x[-2:-4:-1]])

    def k(u: Any) -> Any:
        X = u.coord("x")
        return u(time=-1) + 0.5 * (X(x=1) - X(x=-1)) * u(time=-1, x=1) + 0.25 * (X(x=2) - X())

    st = a
    for _ in range(4):
        p = np.pad(st, ((0, 0), (2, 2)), mode="reflect")
        st = st + 0.5 * (xp[3:3 + nx] - xp[1:1 + nx]) * p[:, 3:3 + nx] + 0.25 * (
            xp[4:4 + nx] - xp[2:2 + nx])
    da = xr.DataArray(a, dims=("y", "x"), coords={"x": x})
    for backend in BACKENDS:
        for blocking in (None, {"tile": {"x": 4, "y": 2}, "steps": 2}):
            with _quiet():
                got = da.stencil.scan(
                    k, dim="time", steps=4, boundary="reflect", backend=backend,
                    blocking=blocking, save_every="last")
            np.testing.assert_array_equal(np.asarray(got.values), st)


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
def test_iterate_stops_at_the_first_step_below_tol(norm: str) -> None:
    """Iterations, residual, converged and field equal a numpy Jacobi loop
    that stops at the first step whose (relative) change is below ``tol``,
    honouring ``min_steps`` and ``max_steps``."""
    a = np.random.default_rng(0).random(12)
    da = xr.DataArray(a, dims="x")
    f = {"l1": lambda d: np.abs(d).sum(), "l2": lambda d: np.sqrt((d * d).sum()),
         "max": lambda d: np.abs(d).max()}[norm]

    def ref(tol: Any, mx: int, mn: int) -> tuple[np.ndarray, int, float, bool]:
        u, r = a.copy(), np.inf
        for i in range(1, mx + 1):
            p = np.pad(u, 1, mode="edge")
            new = 0.5 * (p[:-2] + p[2:])
            r = f(new - u) / f(u)
            u = new
            if tol is not None and i >= mn and r < tol:
                return u, i, r, True
        return u, mx, r, tol is None

    for tol, mx, mn in [(1e-3, 1000, 1), (1e-3, 5, 1), (1e-1, 1000, 7), (None, 9, 1),
                        (10.0, 100, 3)]:
        with _quiet():
            res = da.stencil.iterate(
                lambda u: 0.5 * (u(x=-1) + u(x=1)), tol=tol, norm=norm, max_steps=mx,
                min_steps=mn, boundary="extend")
        u, it, r, conv = ref(tol, mx, mn)
        assert (res.iterations, bool(res.converged)) == (it, conv), (tol, mx, mn)
        np.testing.assert_allclose(res.field.values, u, rtol=1e-12)
        assert res.residual == pytest.approx(r, rel=1e-9)


# ---------------------------------------------------------------- known bugs

@pytest.mark.parametrize(("dtype", "fill"), [(np.float32, 1e-50), (np.float16, 1e-8),
                                             (np.float32, 1e-40)])
def test_a_fill_value_that_underflows_is_refused(dtype: Any, fill: float) -> None:
    """A fill value the dtype flushes to 0 (or to a subnormal's few bits) was
    accepted and the boundary was silently 0; it is refused, as
    ``fill_value=1e300`` on float32 is, in maps, meshes and scans alike."""
    da = xr.DataArray(np.ones(3, dtype), dims="x")
    with pytest.raises(xstencil.XStencilError, match="fill_value=.*cannot be stored"):
        da.stencil.scan(lambda u: u(time=-1, x=1), dim="time", steps=1, boundary="fill",
                        fill_value=fill, save_every="last", backend="xla")
    with pytest.raises(xstencil.XStencilError, match="fill_value=.*cannot be stored"):
        da.stencil.map(lambda u: u(x=1), boundary="fill", fill_value=fill)
    m = da.stencil.mesh(boundary="fill", fill_value=fill, backend="xla")
    with pytest.raises(xstencil.XStencilError, match="fill_value=.*cannot be stored"):
        m[{"x": -1}] = lambda u: u(x=1)
        m.map()


def test_an_integer_fill_value_the_dtype_cannot_hold_is_refused() -> None:
    """An integer is meant exactly: 2**24 + 1 in float32 (16777216) is refused;
    a float is rounded as numpy casts it (0.1 in float32 is kept)."""
    da = xr.DataArray(np.ones(3, np.float32), dims="x")
    with pytest.raises(xstencil.XStencilError, match="fill_value=16777217 cannot be stored"):
        m = da.stencil.mesh(boundary="fill", fill_value=2**24 + 1, backend="xla")
        m[{"x": -1}] = lambda u: u(x=1)
        m.map()
    out = da.stencil.map(lambda u: u(x=1), boundary="fill", fill_value=0.1)
    assert float(out.values[-1]) == float(np.float32(0.1))
    out = da.stencil.map(lambda u: u(x=1), boundary="fill", fill_value=2**24)
    assert float(out.values[-1]) == 2.0**24
