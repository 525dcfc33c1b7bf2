"""The repeat-call fast path of a Dataset's function mesh
(``xstencil/_labelled/mesh_fast_ds.py``): the same result as the full path
(identical Datasets), and never a stale entry when globals, closures,
arguments, data, dtype, masks, positions or coordinates change.

References are plain numpy; ``prepare`` raising proves the fast path ran.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
import xstencil._labelled.mesh as mesh_module
from xstencil._labelled import mesh_run

N = 10
SCALE = 0.5


def _ds(seed: int = 0, x: np.ndarray | None = None) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    a, b = rng.random((N, N)), rng.random((N, N))
    return xr.Dataset(
        {"u": (("y", "x"), a, {"units": "m/s"}), "v": (("x", "y"), b.T, {"units": "m"}),
         "lat": ("y", np.linspace(-1, 1, N))},
        coords={"y": np.arange(N) * 0.1, "x": np.arange(N) * 0.1 if x is None else x,
                "label": ("x", [f"c{i}" for i in range(N)])},
        attrs={"title": "two fields"})


def inner(s: Any) -> dict[str, Any]:
    return {"u": s["u"](x=1) - s["u"](x=-1) + s["v"](), "v": s["v"](y=1) * s["lat"]()}


def edge(s: Any) -> dict[str, Any]:
    return {"u": s["u"]() * SCALE, "v": -s["v"]()}


def _mesh(ds: xr.Dataset, rows: list[int], fresh: bool = False) -> xstencil.Mesh:
    m = ds.stencil.mesh(boundary="periodic")
    m[...] = inner
    for r in rows:
        m[{"y": r}] = (lambda s: {"u": s["u"]() * SCALE, "v": -s["v"]()}) if fresh else edge
    return m


def _ref(ds: xr.Dataset, rows: list[int], scale: float = SCALE) -> tuple[np.ndarray, ...]:
    a, b = ds.u.values, ds.v.transpose("y", "x").values
    lat = ds.lat.values[:, None]
    u = np.roll(a, -1, 1) - np.roll(a, 1, 1) + b
    v = np.roll(b, -1, 0) * lat
    for r in rows:
        u[r], v[r] = a[r] * scale, -b[r]
    return u, v


def _check(out: xr.Dataset, ds: xr.Dataset, rows: list[int], scale: float = SCALE) -> None:
    u, v = _ref(ds, rows, scale)
    np.testing.assert_allclose(out.u.values, u, rtol=1e-12)
    np.testing.assert_allclose(out.v.transpose("y", "x").values, v, rtol=1e-12)


def _no_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("planned again: the fast path was not taken")

    monkeypatch.setattr(mesh_module, "prepare", boom)


@pytest.mark.parametrize("force", ["select", "slabs"])
def test_repeat_and_rebuilt_calls_match_the_full_path(monkeypatch: pytest.MonkeyPatch,
                                                      force: str) -> None:
    monkeypatch.setattr(mesh_run, "use_select", lambda *a: force == "select")
    ds = _ds(1)
    before = ds.copy(deep=True)
    rows = [0, 4, N - 1]
    m = _mesh(ds, rows)
    full = m.map()
    _check(full, ds, rows)
    assert full.v.dims == ("x", "y") and full.lat.dims == ("y",)
    xr.testing.assert_identical(_mesh(ds, rows, fresh=True).map(), full)  # its own code
    _no_planning(monkeypatch)
    for again in (m.map(), _mesh(ds, rows, fresh=True).map()):
        xr.testing.assert_identical(again, full)
        assert list(again.data_vars) == list(full.data_vars)
        assert all(type(again[n].data) is type(full[n].data) for n in again.data_vars)
        assert again.u.dtype == full.u.dtype == np.float64
    xr.testing.assert_identical(ds, before)


def test_results_do_not_share_attrs_with_the_input(monkeypatch: pytest.MonkeyPatch) -> None:
    ds = _ds(2)
    m = _mesh(ds, [3])
    m.map()
    _no_planning(monkeypatch)
    out = m.map()
    out.attrs["title"] = "changed"
    out.u.attrs["units"] = "changed"
    out.x.attrs["note"] = "changed"
    assert ds.attrs == {"title": "two fields"} and ds.u.attrs == {"units": "m/s"}
    assert ds.x.attrs == {}
    assert m.map().attrs == {"title": "two fields"}


def test_changed_positions_labels_and_masks_are_never_stale() -> None:
    ds = _ds(3)
    for rows in ([1, 2], [1, 3], [4], [0, N - 1]):
        for _ in range(2):
            _check(_mesh(ds, rows).map(), ds, rows)
    for r in (2, 7):
        m = ds.stencil.mesh(boundary="periodic")
        m[...] = inner
        m.loc[{"y": float(ds.y[r])}] = edge
        for _ in range(2):
            _check(m.map(), ds, [r])
    for t in (0.3, 0.6):
        mask = ds.u > t
        m = ds.stencil.mesh(boundary="periodic")
        m[...] = inner
        m[mask] = lambda s: {"u": s["u"]() * SCALE, "v": s["v"]()}
        u, v = _ref(ds, [])
        u[mask.values] = ds.u.values[mask.values] * SCALE
        v[mask.values] = ds.v.transpose("y", "x").values[mask.values]
        for _ in range(2):
            out = m.map()
            np.testing.assert_allclose(out.u.values, u, rtol=1e-12)
            np.testing.assert_allclose(out.v.transpose("y", "x").values, v, rtol=1e-12)


def test_changed_globals_closures_args_data_and_dtype_are_never_stale() -> None:
    global SCALE
    ds = _ds(5)
    rows = [2, 6]
    m = _mesh(ds, rows)
    m.map()
    old = SCALE
    try:
        SCALE = 3.0  # a global the kernels read
        _check(m.map(), ds, rows, 3.0)
        _check(_mesh(ds, rows, fresh=True).map(), ds, rows, 3.0)
    finally:
        SCALE = old
    for w in (2.0, -1.0):  # a closed-over array of the same shape
        w_arr = np.full((), w)
        m = ds.stencil.mesh(boundary="periodic")
        m[...] = inner
        m[{"y": 2}] = lambda s, w_arr=w_arr: {"u": s["u"]() * w_arr, "v": -s["v"]()}
        for _ in range(2):
            _check(m.map(), ds, [2], w)
    m = ds.stencil.mesh(boundary="periodic")
    m[...] = lambda s, c: {"u": s["u"]() * c, "v": s["v"]()}
    for c in (2.0, 5.0, 2.0):  # a static argument
        np.testing.assert_allclose(m.map(c).u.values, ds.u.values * c, rtol=1e-12)
    for c in (2.0, 7.0, 2.0):  # an array argument (traced, not static)
        np.testing.assert_allclose(m.map(np.full((), c)).u.values, ds.u.values * c,
                                   rtol=1e-12)
    m = _mesh(ds, rows)
    m.map()
    new = np.random.default_rng(9).random((N, N))
    ds["u"].data = new  # the data replaced in place: the mesh reads it
    _check(m.map(), ds, rows)
    assert m.map(dtype="float32").u.dtype == np.float32
    assert m.map().u.dtype == np.float64
    for n in ("u", "v", "lat"):  # every variable float32 now
        ds[n].data = ds[n].values.astype(np.float32)
    out = m.map()
    assert out.u.dtype == out.v.dtype == np.float32
    u, v = _ref(ds, rows)
    np.testing.assert_allclose(out.u.values, u, rtol=1e-5)


def test_a_changed_dataset_is_an_error_not_a_stale_result() -> None:
    ds = _ds(6)
    m = _mesh(ds, [1])
    m.map()
    m.map()
    ds["w"] = ds.u * 2  # a variable added after the mesh was made
    with pytest.raises(xstencil.XStencilError, match="changed after the mesh was created"):
        m.map()
    ds = _ds(6)
    m = _mesh(ds, [1])
    m.map()
    ds["x"] = ds.x * 2
    with pytest.raises(xstencil.XStencilError, match="coordinate labels changed after the "
                                                     "mesh was created"):
        m.map()


def test_changed_coords_read_by_the_kernel_are_never_stale() -> None:
    def ddx(s: Any) -> dict[str, Any]:
        x = s["u"].coord("x")
        return {"u": (s["u"](x=1) - s["u"](x=-1)) / (x(x=1) - x(x=-1)), "v": s["v"]()}

    for x in (np.arange(N) * 0.1, np.arange(N) * 0.5, np.linspace(0, 1, N) ** 2, None):
        ds = _ds(7, x=x)
        xv = ds.x.values
        for _ in range(2):
            m = ds.stencil.mesh(boundary="extend")
            m[...] = ddx
            m[{"y": 0}] = edge
            out = m.map()
            a = ds.u.values
            want = (a[:, 2:] - a[:, :-2]) / (xv[2:] - xv[:-2])
            np.testing.assert_allclose(out.u.values[1:, 1:-1], want[1:], rtol=1e-12)
            np.testing.assert_allclose(out.u.values[0], a[0] * SCALE, rtol=1e-12)


def test_new_variables_and_jax_data(monkeypatch: pytest.MonkeyPatch) -> None:
    ds = _ds(8)
    m = ds.stencil.mesh(boundary="periodic", new_vars=("speed",))
    m[...] = lambda s: {"speed": s["u"]() * s["lat"](), "u": s["u"]()}
    m[{"x": 0}] = lambda s: {"speed": 0.0 * s["u"](), "u": -s["u"]()}
    full = m.map()
    jds = ds.copy(data={n: jnp.asarray(ds[n].values) for n in ds.data_vars})
    jm = jds.stencil.mesh(boundary="periodic", new_vars=("speed",))
    jm[...] = lambda s: {"speed": s["u"]() * s["lat"](), "u": s["u"]()}
    jm[{"x": 0}] = lambda s: {"speed": 0.0 * s["u"](), "u": -s["u"]()}
    jfull = jm.map()
    _no_planning(monkeypatch)
    xr.testing.assert_identical(m.map(), full)
    xr.testing.assert_identical(jm.map(), jfull)
    want = ds.u.values * ds.lat.values[:, None]
    want[:, 0] = 0.0
    np.testing.assert_allclose(full.speed.values, want, rtol=1e-12)
    assert list(full.data_vars) == ["u", "v", "lat", "speed"]
    np.testing.assert_allclose(jfull.speed.values, want, rtol=1e-6)


def test_equal_kernels_reading_other_arrays_never_share_a_branch() -> None:
    ds = _ds(12)
    a = ds.u.values
    w1, w2 = np.full((), 2.0), np.full((), 3.0)

    def scaled(w: Any) -> Any:
        return lambda s: {"u": s["u"]() * w, "v": s["v"]()}  # one code object

    for second in (w1, w2, w1, w2):
        for _ in range(2):  # the second time from the fast path
            m = ds.stencil.mesh(boundary="periodic")
            m[...] = lambda s: {"u": s["u"](), "v": s["v"]()}
            m[{"y": 1}] = scaled(w1)
            m[{"y": 4}] = scaled(second)
            out = m.map().u.values
            np.testing.assert_allclose(out[1], a[1] * 2.0, rtol=1e-12)
            np.testing.assert_allclose(out[4], a[4] * float(second), rtol=1e-12)
