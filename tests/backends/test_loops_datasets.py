"""Dataset maps on the numba loop backend (``xstencil/_backends/loops.py``):
several variables read and returned by one kernel, with coordinates, against
``backend="xla"`` and a numpy reference."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor

pytest.importorskip("numba")


def _both(ds: xr.Dataset, kernel: Any, **opts: Any) -> tuple[xr.Dataset, xr.Dataset]:
    a = ds.stencil.map(kernel, backend="loops", **opts)
    b = ds.stencil.map(kernel, backend="xla", **opts)
    assert set(a.data_vars) == set(b.data_vars)
    for v in a.data_vars:
        assert a[v].dtype == b[v].dtype and a[v].dims == b[v].dims
    return a, b


def test_three_variables_with_coordinates_float32(ran: list[int]) -> None:
    """float32 data with coordinates on the window dims (as read from a file):
    the coordinates, unread, no longer keep the map off the loops."""
    rng = np.random.default_rng(1)
    shape = (14, 11)
    ds = xr.Dataset({v: (("y", "x"), rng.random(shape, dtype=np.float32))
                     for v in ("u", "v", "h")},
                    coords={"y": np.linspace(0, 1, 14), "x": np.linspace(0, 2, 11)},
                    attrs={"title": "swe"})
    g, depth = 9.81, 0.5

    def tend(s: Any) -> Any:
        return {"u": -g * (s["h"](x=1) - s["h"](x=-1)),
                "v": -g * (s["h"](y=1) - s["h"](y=-1)),
                "h": -depth * (s["u"](x=1) - s["u"](x=-1) + s["v"](y=1) - s["v"](y=-1))}

    got, xla = _both(ds, tend, boundary="periodic")
    assert len(ran) == 1, "the loop backend did not run"
    u, v, h = (ds[k].values for k in ("u", "v", "h"))

    def sh(a: np.ndarray, dy: int, dx: int) -> np.ndarray:
        return np.roll(a, (-dy, -dx), axis=(0, 1))

    f = np.float32
    ref = {"u": f(-g) * (sh(h, 0, 1) - sh(h, 0, -1)),
           "v": f(-g) * (sh(h, 1, 0) - sh(h, -1, 0)),
           "h": f(-depth) * (sh(u, 0, 1) - sh(u, 0, -1) + sh(v, 1, 0) - sh(v, -1, 0))}
    for k, r in ref.items():
        assert got[k].dtype == np.float32
        np.testing.assert_array_equal(got[k].values, r)
        np.testing.assert_array_equal(got[k].values, xla[k].values)
    assert got.attrs == ds.attrs and np.array_equal(got["x"], ds["x"])


def test_variables_of_different_dtypes_and_results_of_new_ones(ran: list[int]) -> None:
    rng = np.random.default_rng(2)
    ds = xr.Dataset({"n": (("y", "x"), rng.integers(0, 256, (9, 12)).astype(np.uint8)),
                     "land": (("y", "x"), rng.random((9, 12)) > 0.7),
                     "t": (("y", "x"), rng.random((9, 12)))})  # float64

    def k(s: Any) -> Any:
        return {"n": s["n"].sum(),  # a uint8 window sum: widened, no wrap
                "land": s["land"](x=1) | s["land"](x=-1),  # bool stays bool
                "t": jnp.where(s["land"](), s["t"](y=1), s["t"]() * 2.0),  # float64
                "mix": s["t"]() + s["n"]().astype(jnp.float64)}  # a new variable

    got, xla = _both(ds, k, boundary="reflect", window={"y": 3, "x": 3}, new_vars="mix")
    assert len(ran) == 1
    n, land, t = (ds[v].values for v in ("n", "land", "t"))
    pn = np.pad(n.astype(np.int64), 1, mode="reflect")
    pl = np.pad(land, 1, mode="reflect")
    pt = np.pad(t, 1, mode="reflect")
    ref_n = sum(pn[1 + dy:10 + dy, 1 + dx:13 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1))
    assert ref_n.max() > 255
    ref = {"n": ref_n, "land": pl[1:-1, 2:] | pl[1:-1, :-2],
           "t": np.where(land, pt[2:, 1:-1], t * 2.0), "mix": t + n}
    assert got["n"].dtype.kind in "iu" and got["land"].dtype == bool
    assert got["t"].dtype == got["mix"].dtype == np.float64
    for v, r in ref.items():
        np.testing.assert_array_equal(got[v].values, r.astype(got[v].dtype))
        np.testing.assert_array_equal(got[v].values, xla[v].values)


def test_nan_fill_and_repeat_calls(ran: list[int]) -> None:
    rng = np.random.default_rng(3)
    for i in range(2):
        a = rng.random((8, 10), dtype=np.float32)
        a[3, 3] = np.nan
        ds = xr.Dataset({"a": (("y", "x"), a), "b": (("y", "x"), a * 2)})
        got, xla = _both(ds, lambda s: {"a": s["a"](x=1) - s["b"](y=-1)})  # NaN fill
        p = np.pad(a, 1, constant_values=np.nan)
        ref = p[1:-1, 2:] - np.float32(2) * p[:-2, 1:-1]
        np.testing.assert_array_equal(got["a"].values, ref)
        np.testing.assert_array_equal(got["a"].values, xla["a"].values)
        np.testing.assert_array_equal(got["b"].values, ds["b"].values)  # kept as it is
        assert len(ran) == i + 1
