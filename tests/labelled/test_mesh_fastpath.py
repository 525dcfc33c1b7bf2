"""A function mesh's per-call cost and compile cost do not grow with its
region count (issue 17, item 4), and its repeat-call cache is never stale.

References are plain numpy: a periodic 5-point Laplacian and per-row rules.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil
import xstencil._labelled.mesh as mesh_module
from xstencil._labelled import mesh_run

N = 12
SCALE = 0.5


def _da(seed: int = 0, n: int = N, coords: np.ndarray | None = None) -> xr.DataArray:
    x = np.arange(n) * 0.1 if coords is None else coords
    return xr.DataArray(np.random.default_rng(seed).random((n, n)), dims=("y", "x"),
                        coords={"y": np.arange(n) * 0.1, "x": x}, name="T",
                        attrs={"units": "K"})


def lap(u):
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def edge(u):
    return u() * SCALE


def _lap_ref(a: np.ndarray) -> np.ndarray:
    return (np.roll(a, -1, 1) + np.roll(a, 1, 1) + np.roll(a, -1, 0) + np.roll(a, 1, 0)
            - 4 * a)


def _rows_mesh(da: xr.DataArray, rows: list[int], fresh: bool = False) -> xstencil.Mesh:
    m = da.stencil.mesh(boundary="periodic")
    m[...] = lap
    for r in rows:
        # fresh=True: a new, structurally equal lambda per region
        m[{"y": r}] = (lambda u: u() * SCALE) if fresh else edge
    return m


def _rows_ref(a: np.ndarray, rows: list[int], scale: float = SCALE) -> np.ndarray:
    out = _lap_ref(a)
    for r in rows:
        out[r] = a[r] * scale
    return out


@pytest.mark.parametrize("force", ["select", "slabs"])
@pytest.mark.parametrize("fresh", [False, True])
def test_many_regions_match_the_reference(monkeypatch: pytest.MonkeyPatch, force: str,
                                          fresh: bool) -> None:
    monkeypatch.setattr(mesh_run, "use_select", lambda *a: force == "select")
    da = _da()
    rows = list(range(0, N, 2))
    out = _rows_mesh(da, rows, fresh).map()
    np.testing.assert_allclose(out.values, _rows_ref(da.values, rows), rtol=1e-12)
    assert out.dims == da.dims and out.name == "T" and out.attrs == da.attrs


@pytest.mark.parametrize("force", ["select", "slabs"])
def test_overlaps_masks_and_uncovered_cells(monkeypatch: pytest.MonkeyPatch,
                                            force: str) -> None:
    monkeypatch.setattr(mesh_run, "use_select", lambda *a: force == "select")
    da = _da(1)
    land = da > 0.7
    m = da.stencil.mesh(boundary="periodic")
    m[{"x": slice(2, 9)}] = lap             # not everywhere: the rest keeps its input
    m[{"y": 3}] = edge
    m[land] = lambda u: -u()
    m[{"y": 3, "x": [1, 4]}] = edge        # later wins over the mask
    a = da.values
    want = a.copy()
    want[:, 2:9] = _lap_ref(a)[:, 2:9]
    want[3] = a[3] * SCALE
    want[land.values] = -a[land.values]
    want[3, [1, 4]] = a[3, [1, 4]] * SCALE
    np.testing.assert_allclose(m.map().values, want, rtol=1e-12)


def test_repeat_and_rebuilt_calls_skip_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    da = _da(2)
    rows = [0, 5, N - 1]
    m = _rows_mesh(da, rows)
    first = m.map().values
    np.testing.assert_array_equal(_rows_mesh(da, rows, fresh=True).map().values, first)

    def boom(*a, **k):
        raise AssertionError("planned again: the fast path was not taken")

    monkeypatch.setattr(mesh_module, "prepare", boom)
    np.testing.assert_array_equal(m.map().values, first)
    # a mesh rebuilt with the same regions and fresh, equal lambdas: also cached
    np.testing.assert_array_equal(_rows_mesh(da, rows, fresh=True).map().values, first)
    # by label: resolved to the same positions
    m2 = da.stencil.mesh(boundary="periodic")
    m2[...] = lap
    for r in rows:
        m2.loc[{"y": float(da.y[r])}] = edge
    np.testing.assert_array_equal(m2.map().values, first)


def test_changed_positions_labels_and_masks_are_never_stale() -> None:
    da = _da(3)
    for rows in ([1, 2], [1, 3], [4], [0, N - 1]):
        np.testing.assert_allclose(_rows_mesh(da, rows).map().values,
                                   _rows_ref(da.values, rows), rtol=1e-12)
    for r in (2, 7):
        m = da.stencil.mesh(boundary="periodic")
        m[...] = lap
        m.loc[{"y": float(da.y[r])}] = edge
        np.testing.assert_allclose(m.map().values, _rows_ref(da.values, [r]), rtol=1e-12)
    for t in (0.3, 0.6):
        mask = da > t
        m = da.stencil.mesh(boundary="periodic")
        m[...] = lap
        m[mask] = edge
        want = _lap_ref(da.values)
        want[mask.values] = da.values[mask.values] * SCALE
        np.testing.assert_allclose(m.map().values, want, rtol=1e-12)


def test_a_mask_is_fixed_when_assigned() -> None:
    da = _da(4)
    mask = da > 0.5
    m = da.stencil.mesh(boundary="periodic")
    m[...] = lap
    m[mask] = edge
    want = _lap_ref(da.values)
    want[mask.values] = da.values[mask.values] * SCALE
    np.testing.assert_allclose(m.map().values, want, rtol=1e-12)
    mask.values[:] = ~mask.values  # changing the mask afterwards changes nothing
    np.testing.assert_allclose(m.map().values, want, rtol=1e-12)


def test_changed_globals_closures_args_data_and_dtype_are_never_stale() -> None:
    global SCALE
    da = _da(5)
    rows = [2, 6]
    m = _rows_mesh(da, rows)
    m.map()
    old = SCALE
    try:
        SCALE = 3.0  # a global the kernels read
        np.testing.assert_allclose(m.map().values, _rows_ref(da.values, rows, 3.0), rtol=1e-12)
        np.testing.assert_allclose(_rows_mesh(da, rows, fresh=True).map().values,
                                   _rows_ref(da.values, rows, 3.0), rtol=1e-12)
    finally:
        SCALE = old
    for w in (np.float64(2.0), np.float64(-1.0)):  # a closed-over array of the same shape
        w_arr = np.full((), w)
        m = da.stencil.mesh(boundary="periodic")
        m[...] = lap
        m[{"y": 2}] = lambda u, w_arr=w_arr: u() * w_arr
        np.testing.assert_allclose(m.map().values, _rows_ref(da.values, [2], float(w)),
                                   rtol=1e-12)
    m = da.stencil.mesh(boundary="periodic")
    m[...] = lambda u, c: u() * c
    for c in (2.0, 5.0):  # a static argument
        np.testing.assert_allclose(m.map(c).values, da.values * c, rtol=1e-12)
    m = _rows_mesh(da, rows)
    m.map()
    new = np.random.default_rng(9).random((N, N))
    da.data = new  # the data replaced in place: the mesh reads it
    np.testing.assert_allclose(m.map().values, _rows_ref(new, rows), rtol=1e-12)
    assert m.map(dtype="float32").dtype == np.float32
    assert m.map().dtype == np.float64
    da.data = new.astype(np.float32)
    assert m.map().dtype == np.float32


def test_changed_coords_are_never_stale() -> None:
    def ddx(u):
        x = u.coord("x")
        return (u(x=1) - u(x=-1)) / (x(x=1) - x(x=-1))

    def run(da: xr.DataArray) -> np.ndarray:
        m = da.stencil.mesh(boundary="extend")
        m[...] = ddx
        m[{"y": 0}] = edge
        return m.map().values

    for x in (np.arange(N) * 0.1, np.arange(N) * 0.5, np.linspace(0, 1, N) ** 2):
        da = _da(6, coords=x)
        a = da.values
        want = (a[:, 2:] - a[:, :-2]) / (x[2:] - x[:-2])  # interior columns
        got = run(da)
        np.testing.assert_allclose(got[1:, 1:-1], want[1:], rtol=1e-12)
        np.testing.assert_allclose(got[0], a[0] * SCALE, rtol=1e-12)
    # coordinates changed in place after the mesh was made: an error, never a stale result
    da = _da(6)
    m = da.stencil.mesh(boundary="extend")
    m[...] = ddx
    m.map()
    da["x"] = da.x * 2
    with pytest.raises(xstencil.XStencilError, match="coordinate labels changed after the "
                                                     "mesh was created"):
        m.map()


def test_each_distinct_kernel_is_traced_once_however_many_regions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    real = mesh_run.kernel_caller

    def counting(plan, kernel, static):
        made.append(1)
        return real(plan, kernel, static)

    monkeypatch.setattr(mesh_run, "kernel_caller", counting)

    def traced(rows: list[int], fresh: bool) -> int:
        da = _da(7, n=40)
        xstencil.clear_caches()
        made.clear()
        out = _rows_mesh(da, rows, fresh).map()
        np.testing.assert_allclose(out.values, _rows_ref(da.values, rows), rtol=1e-12)
        return len(made)

    for fresh in (False, True):
        one, many = traced([3], fresh), traced(list(range(1, 40, 2)), fresh)
        assert one == many == 2, (fresh, one, many)  # the Laplacian and the row kernel


def test_an_empty_region_varies_along_nothing() -> None:
    da = _da(8)
    m = da.stencil.mesh(boundary="periodic")
    m[...] = lap
    with pytest.warns(UserWarning, match="selects no cells"):
        m[{"x": []}] = edge
    assert m._region_dims() == ()
    ds = xr.Dataset({"a": ("x", np.arange(4.0)), "b": ("y", np.arange(3.0))})
    m = ds.stencil.mesh(boundary="extend")
    m[...] = lambda s: {"a": s["a"](x=1)}
    with pytest.warns(UserWarning, match="selects no cells"):
        m[{"y": []}] = lambda s: {"a": s["a"]() * 2}
    out = m.map()
    assert out["a"].dims == ("x",)
    np.testing.assert_array_equal(out["a"].values, [1.0, 2.0, 3.0, 3.0])


def test_regions_along_a_dim_the_result_lacks_name_the_regions() -> None:
    ds = xr.Dataset({"a": ("x", np.arange(4.0)), "b": ("y", np.arange(3.0))})
    m = ds.stencil.mesh(boundary="extend")
    m[...] = lambda s: {"a": s["a"](x=1)}
    m[{"y": 0}] = lambda s: {"a": s["a"]() * 2}
    with pytest.raises(xstencil.XStencilError,
                       match=r"mesh\(\.\.\.\)\.map\(\): the mesh's regions vary along "
                             r"\('y',\), but the kernel's result 'a' is computed from "
                             r"variables on \(\('x',\),\) only") as e:
        m.map()
    assert "taggered" not in str(e.value)


@pytest.mark.parametrize("force", ["select", "slabs"])
def test_strides_valid_and_output_dims(monkeypatch: pytest.MonkeyPatch, force: str) -> None:
    import jax.numpy as jnp

    monkeypatch.setattr(mesh_run, "use_select", lambda *a: force == "select")
    da = _da(10)
    a = da.values
    for _ in range(2):  # the second call takes the fast path
        m = da.stencil.mesh(boundary={"x": "valid", "y": "periodic"}, stride={"y": 2})
        m[...] = lap
        m[{"y": 4}] = edge
        out = m.map()
        want = _lap_ref(a)[::2, 1:-1]
        want[2] = a[4, 1:-1] * SCALE
        np.testing.assert_allclose(out.values, want, rtol=1e-12)
        np.testing.assert_array_equal(out.x.values, da.x.values[1:-1])
        np.testing.assert_array_equal(out.y.values, da.y.values[::2])
        m = da.stencil.mesh(boundary="periodic", output_dims="k")
        m[...] = lambda u: jnp.stack([u(), u(x=1)])
        m[{"x": [0, 3]}] = lambda u: jnp.stack([-u(), u(x=-1)])
        out = m.map()
        want = np.stack([a, np.roll(a, -1, 1)], axis=-1)
        want[:, [0, 3], 0] = -a[:, [0, 3]]
        want[:, [0, 3], 1] = np.roll(a, 1, 1)[:, [0, 3]]
        assert out.dims == ("y", "x", "k")
        np.testing.assert_allclose(out.values, want, rtol=1e-12)


@pytest.mark.parametrize("force", ["select", "slabs"])
def test_a_dataset_mesh(monkeypatch: pytest.MonkeyPatch, force: str) -> None:
    monkeypatch.setattr(mesh_run, "use_select", lambda *a: force == "select")
    da = _da(11)
    ds = xr.Dataset({"u": da, "v": da * 2})
    m = ds.stencil.mesh(boundary="periodic")
    m[...] = lambda s: {"u": s["u"](x=1) + s["v"](), "v": s["v"]()}
    m[{"y": [1, 5]}] = lambda s: {"u": s["u"]() * SCALE, "v": -s["v"]()}
    out = m.map()
    a = da.values
    u = np.roll(a, -1, 1) + 2 * a
    v = 2 * a
    u[[1, 5]] = a[[1, 5]] * SCALE
    v[[1, 5]] = -2 * a[[1, 5]]
    np.testing.assert_allclose(out["u"].values, u, rtol=1e-12)
    np.testing.assert_allclose(out["v"].values, v, rtol=1e-12)


def test_equal_kernels_reading_other_arrays_never_share_a_branch() -> None:
    da = _da(12)
    a = da.values
    w1, w2 = np.full((), 2.0), np.full((), 3.0)
    def scaled(w):
        return lambda u: u() * w  # one code object: equal kernels, told apart by w

    for second in (w1, w2, w1, w2):  # the same array for both rows, then another one
        want = _lap_ref(a)
        want[1] = a[1] * 2.0
        want[4] = a[4] * float(second)
        for _ in range(2):  # the second time from the fast path
            m = da.stencil.mesh(boundary="periodic")
            m[...] = lap
            m[{"y": 1}] = scaled(w1)
            m[{"y": 4}] = scaled(second)
            np.testing.assert_allclose(m.map().values, want, rtol=1e-12)
