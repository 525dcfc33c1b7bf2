"""Function meshes on the numba loop backend (``xstencil/_backends/loops_mesh.py``).

Every mesh runs three ways: ``backend="loops"`` (checked to have run as
loops, or to have fallen back), ``backend="xla"``, and a numpy reference that
applies each region's kernel to an ``np.pad``-ed array, later regions
winning, uncovered cells keeping the input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.spies import count_calls
from xstencil._backends import loops as L
from xstencil._backends import loops_mesh as LM
from xstencil._errors import XStencilError
from xstencil._labelled import mesh as mesh_module

pytest.importorskip("numba")

NP_MODE = {"fill": "constant", "extend": "edge", "periodic": "wrap", "reflect": "reflect",
           "symmetric": "symmetric"}


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the meshes that ran as loops."""
    monkeypatch.delenv(L.ENV, raising=False)
    yield count_calls(monkeypatch, LM, "run_mesh")


def _shifted(a: np.ndarray, mode: str, fill: Any) -> Callable[[int, int], np.ndarray]:
    """``get(dy, dx)``: the field read at offset ``(dy, dx)``, halo by ``mode``."""
    if mode == "fill":
        p = np.pad(a, 2, mode="constant", constant_values=fill)
    else:
        p = np.pad(a, 2, mode=NP_MODE[mode])
    ny, nx = a.shape
    return lambda dy, dx: p[2 + dy:2 + dy + ny, 2 + dx:2 + dx + nx]


def _reference(a: np.ndarray, regions: list[tuple[Any, Callable[..., np.ndarray]]],
               mode: str, fill: Any, dtype: Any) -> np.ndarray:
    """Later regions win; ``region`` is an index tuple or a boolean mask."""
    get = _shifted(a, mode, fill)
    out = a.astype(dtype)
    for region, ref in regions:
        out[region] = np.asarray(ref(get)).astype(dtype)[region]
    return out


def _run(da: xr.Dataset | xr.DataArray, assign: Callable[[Any], None], **opts: Any
         ) -> tuple[Any, Any]:
    out = []
    for backend in ("loops", "xla"):
        m = da.stencil.mesh(backend=backend, **opts)
        assign(m)
        out.append(m.map())
    return out[0], out[1]


def _lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def _lap_ref(get: Callable[[int, int], np.ndarray]) -> np.ndarray:
    c = get(0, 0)
    return get(0, 1) + get(0, -1) + get(1, 0) + get(-1, 0) - c.dtype.type(4) * c


@pytest.mark.parametrize("mode", ["fill", "extend", "periodic", "reflect", "symmetric"])
def test_edges_overlaps_and_masks_every_mode(mode: str, ran: list[int]) -> None:
    rng = np.random.default_rng(1)
    a = rng.random((23, 17), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"), coords={"x": np.arange(17.0), "y": np.arange(23.0)})
    mask = a > 0.8
    opts: dict[str, Any] = {"boundary": mode, "fill_value": 0.25 if mode == "fill" else None}

    def assign(m: Any) -> None:
        m[...] = _lap
        m[{"x": 0}] = lambda u: u(x=-1) * 2 + u(x=1)  # reads the halo at its edge
        m[{"y": slice(3, 9), "x": slice(2, None, 3)}] = lambda u: u(y=-1) - u(y=1)  # overlaps
        m[da > 0.8] = lambda u: u(x=-1) * u(y=1)  # a mask over all of them
        m[{"y": -1}] = lambda u: u(y=1) + 0.5  # the last row, over the mask too

    got, xla = _run(da, assign, **opts)
    assert ran, "the loop backend did not run"
    assert got.dtype == xla.dtype == np.float32
    rows = np.zeros(a.shape, bool)
    rows[3:9, 2::3] = True
    ref = _reference(a, [(..., _lap_ref),
                         ((slice(None), 0), lambda g: g(0, -1) * 2 + g(0, 1)),
                         (rows, lambda g: g(-1, 0) - g(1, 0)),
                         (mask, lambda g: g(0, -1) * g(1, 0)),
                         ((-1, slice(None)), lambda g: g(1, 0) + np.float32(0.5))],
                     mode, 0.25, np.float32)
    # float32, the same operations in the same order: bitwise, and equal to XLA
    np.testing.assert_array_equal(got.values, ref)
    np.testing.assert_array_equal(got.values, xla.values)


def _sum9(get: Callable[[int, int], np.ndarray]) -> np.ndarray:
    return sum(get(dy, dx).astype(np.int64) for dy in (-1, 0, 1) for dx in (-1, 0, 1))


def test_uncovered_cells_keep_the_input_and_dtypes_promote(ran: list[int]) -> None:
    a = (np.arange(20 * 12) % 251).astype(np.uint8).reshape(20, 12)
    da = xr.DataArray(a, dims=("y", "x"))

    def assign(m: Any) -> None:
        # a uint8 window sum is widened (no wrap at 255), as on the XLA path
        m[{"y": slice(2, 15)}] = lambda u: u.sum()
        m[{"x": slice(0, 4)}] = lambda u: u().astype(jnp.float32) * 0.5  # float32 elsewhere
        m[da > 200] = lambda u: u(y=1) > u(y=-1)  # bool in a third
        m[{"x": 7}] = lambda u: u(x=1) + u(x=-1)  # uint8 + uint8 wraps, as in numpy and JAX

    got, xla = _run(da, assign, boundary="periodic", window={"y": 3, "x": 3})
    assert len(ran) == 1
    assert got.dtype == xla.dtype == np.float32
    ref = _reference(a, [((slice(2, 15),), _sum9),
                         ((slice(None), slice(0, 4)),
                          lambda g: g(0, 0).astype(np.float32) * np.float32(0.5)),
                         (a > 200, lambda g: g(1, 0) > g(-1, 0)),
                         ((slice(None), 7), lambda g: g(0, 1) + g(0, -1))],
                     "periodic", 0, np.float32)
    assert _sum9(_shifted(a, "periodic", 0))[2:15].max() > 255  # a uint8 sum would wrap
    np.testing.assert_array_equal(got.values, ref)
    np.testing.assert_array_equal(got.values, xla.values)
    assert np.array_equal(got.values[0, 5:7], a[0, 5:7])  # kept


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_])
def test_integer_and_bool_meshes(dtype: Any, ran: list[int]) -> None:
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, (9, 14)).astype(dtype)
    da = xr.DataArray(a, dims=("y", "x"))

    def assign(m: Any) -> None:
        m[...] = lambda u: u.sum()  # counts bools, widens uint8
        m[{"x": [0, -1]}] = lambda u: u() * u(y=1)  # the data's own dtype (wraps, ands)

    got, xla = _run(da, assign, boundary="reflect", window={"y": 3, "x": 3})
    assert len(ran) == 1
    assert got.dtype == xla.dtype
    assert got.dtype.kind in "iu"
    get = _shifted(a, "reflect", 0)
    ref = _sum9(get)
    edge = get(0, 0) & get(1, 0) if dtype is np.bool_ else get(0, 0) * get(1, 0)
    ref[:, [0, -1]] = edge[:, [0, -1]]
    np.testing.assert_array_equal(got.values, ref.astype(got.dtype))
    np.testing.assert_array_equal(got.values, xla.values)


def test_float64_nan_and_the_default_fill(ran: list[int]) -> None:
    a = np.random.default_rng(3).random((11, 10))
    a[4, 4] = np.nan
    da = xr.DataArray(a, dims=("y", "x"))

    def assign(m: Any) -> None:
        m[...] = lambda u: jnp.maximum(u(x=1), u(x=-1)) - jnp.exp(u())
        m[{"y": 0}] = lambda u: u(y=-1)  # the halo: NaN (the default fill)

    got, xla = _run(da, assign)  # boundary: fill with NaN
    assert len(ran) == 1
    assert got.dtype == xla.dtype == np.float64
    get = _shifted(a, "fill", np.nan)
    ref = np.where(np.isnan(get(0, 1)) | (get(0, 1) > get(0, -1)) & ~np.isnan(get(0, -1)),
                   get(0, 1), get(0, -1)) - np.exp(a)
    ref[0] = np.nan
    np.testing.assert_allclose(got.values, ref, rtol=1e-15, equal_nan=True)
    assert np.isnan(got.values[4, 3:6]).all()
    # exp: numba's libm against XLA's approximation, a few ulp apart
    np.testing.assert_allclose(got.values, xla.values, rtol=4e-16, atol=0, equal_nan=True)


def test_stride_valid_and_dataset(ran: list[int]) -> None:
    rng = np.random.default_rng(4)
    a = rng.random((16, 18), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))

    def assign(m: Any) -> None:
        m[...] = lambda u: u(x=1) - u(y=-1)
        m[{"x": 0}] = lambda u: u() * 3

    got, xla = _run(da, assign, boundary={"x": "valid", "y": "periodic"},
                    stride={"y": 2})
    assert got.shape == xla.shape == (8, 17)  # the window along x: (0, 1)
    np.testing.assert_array_equal(got.values, xla.values)
    ref = (a[:, 1:] - np.roll(a, 1, axis=0)[:, :-1])[::2]
    ref[:, 0] = a[::2, 0] * 3
    np.testing.assert_array_equal(got.values, ref)
    ds = xr.Dataset({"u": (("y", "x"), a), "h": (("y", "x"), a[::-1].copy())})

    def assign_ds(m: Any) -> None:
        m[...] = lambda s: {"u": s["u"](x=1) * s["h"](), "h": s["h"]() + 1}
        m[{"y": [0, -1]}] = lambda s: {"u": s["u"](), "h": s["u"](y=-1)}

    got, xla = _run(ds, assign_ds, boundary="extend")
    assert len(ran) == 2
    h = a[::-1]
    ref_u = np.concatenate([a[:, 1:], a[:, -1:]], axis=1) * h
    ref_h = h + np.float32(1)
    ref_u[[0, -1]] = a[[0, -1]]
    ref_h[0], ref_h[-1] = a[0], a[-2]
    for v, ref in (("u", ref_u), ("h", ref_h)):
        assert got[v].dtype == xla[v].dtype == np.float32
        np.testing.assert_array_equal(got[v].values, ref)
        np.testing.assert_array_equal(got[v].values, xla[v].values)


def test_repeat_calls_take_the_fast_path_with_new_data(ran: list[int],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fast: list[int] = []
    real = mesh_module.run

    def spy(*a: Any, **k: Any) -> Any:
        fast.append(1)
        return real(*a, **k)

    monkeypatch.setattr(mesh_module, "run", spy)
    rng = np.random.default_rng(5)
    for _ in range(3):
        a = rng.random((12, 10), dtype=np.float32)
        m = xr.DataArray(a, dims=("y", "x")).stencil.mesh(boundary="periodic",
                                                         backend="loops")
        m[...] = _lap
        m[{"x": 0}] = lambda u: u(x=-1)
        ref = _reference(a, [(..., _lap_ref), ((slice(None), 0), lambda g: g(0, -1))],
                         "periodic", 0, np.float32)
        np.testing.assert_array_equal(m.map().values, ref)
    assert len(ran) == 3
    assert len(fast) == 2  # the rebuilt meshes skipped planning and ran the loops


def test_fallbacks_give_the_xla_result(ran: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    a = np.arange(9 * 8, dtype=np.int32).reshape(9, 8) - 30
    da = xr.DataArray(a, dims=("y", "x"))

    def assign(m: Any) -> None:
        m[...] = lambda u: u(x=1) + u()
        m[{"x": 0}] = lambda u: u(x=1) // 3  # integer division: not expressible

    got, xla = _run(da, assign, boundary="periodic")
    np.testing.assert_array_equal(got.values, xla.values)
    ref = np.roll(a, -1, axis=1) + a
    ref[:, 0] = a[:, 1] // 3
    np.testing.assert_array_equal(got.values, ref)
    assert not ran

    def assign_f(m: Any) -> None:
        m[...] = lambda u: u(x=1) * 2.0
        m[{"y": 0}] = lambda u: u()

    f = xr.DataArray(a.astype(np.float32), dims=("y", "x"))

    @jax.jit
    def traced(x: Any) -> Any:  # inside jit: XLA
        m = xr.DataArray(x, dims=("y", "x")).stencil.mesh(boundary="periodic",
                                                         backend="loops")
        assign_f(m)
        return m.map().data

    ref = np.roll(f.values, -1, axis=1) * 2
    ref[0] = f.values[0]
    np.testing.assert_array_equal(np.asarray(traced(f.values)), ref)
    # JAX array data on the CPU runs the loops (test_loops_jax_input.py); bfloat16 cannot
    bf = xr.DataArray(jnp.asarray(f.values, jnp.bfloat16), dims=("y", "x"))
    out = _run(bf, assign_f, boundary="periodic")[0]
    assert out.dtype == jnp.bfloat16 and not ran
    # "xla", and "auto" below its size: XLA
    m = f.stencil.mesh(boundary="periodic")
    assign_f(m)
    np.testing.assert_array_equal(m.map().values, ref)
    assert not ran
    monkeypatch.setenv(L.ENV, "loops")  # the environment's choice
    m = f.stencil.mesh(boundary="periodic")
    assign_f(m)
    np.testing.assert_array_equal(m.map().values, ref)
    assert len(ran) == 1


def test_auto_uses_loops_from_its_size_and_up_to_its_nests(ran: list[int]) -> None:
    side = int(np.sqrt(L.AUTO_MIN_POINTS))
    a = np.random.default_rng(6).random((side, side), dtype=np.float32)
    m = xr.DataArray(a, dims=("y", "x")).stencil.mesh(boundary="periodic")
    m[...] = _lap
    m[{"x": 0}] = lambda u: u(x=-1)
    out = m.map()
    assert len(ran) == 1
    ref = _reference(a, [(..., _lap_ref), ((slice(None), 0), lambda g: g(0, -1))],
                     "periodic", 0, np.float32)
    np.testing.assert_array_equal(out.values, ref)
    many = xr.DataArray(a, dims=("y", "x")).stencil.mesh(boundary="periodic")
    for i in range(LM.AUTO_MAX_NESTS + 1):
        many[{"x": i}] = lambda u: u(x=-1)
    out = many.map()
    assert len(ran) == 1  # too many loop nests to compile for "auto": XLA
    np.testing.assert_array_equal(out.values[:, :9], np.roll(a, 1, axis=1)[:, :9])


def test_bad_backend_names_raise() -> None:
    da = xr.DataArray(np.zeros((3, 4), np.float32), dims=("y", "x"))
    with pytest.raises(XStencilError, match=r"mesh\(...\): backend='numba' is not a backend"):
        da.stencil.mesh(backend="numba")
    with pytest.raises(XStencilError, match=r"backend='gpu' is not a backend"):
        xstencil.mesh(da, backend="gpu")


@pytest.mark.parametrize("mode", ["fill", "symmetric"])
def test_negative_steps_position_lists_and_stacked_masks(mode: str, ran: list[int]) -> None:
    """Differential: regions by negative-step slices, position lists (with
    repeats and negative positions) and several masks, loops against XLA and
    a numpy reference built from the same index expressions."""
    rng = np.random.default_rng(8)
    a = rng.random((11, 13), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    kernels = [(lambda u: u(x=1) - u(y=-1), lambda g: g(0, 1) - g(-1, 0)),
               (lambda u: u() * 2 + u(x=-1), lambda g: g(0, 0) * np.float32(2) + g(0, -1)),
               (lambda u: u(y=1) * u(x=-1), lambda g: g(1, 0) * g(0, -1))]
    ys = [-2, 4, 4, 0]
    regions: list[tuple[Any, Any, int]] = [
        ({"x": slice(-4, None, -2)}, (slice(None), slice(-4, None, -2)), 0),
        (da > 0.6, a > 0.6, 1),
        ({"y": ys, "x": slice(1, None, 3)}, np.ix_(ys, range(1, 13, 3)), 2),
        (da < 0.2, a < 0.2, 0),
        ({"x": slice(None, None, -1), "y": -1}, (-1, slice(None, None, -1)), 1),
    ]

    def assign(m: Any) -> None:
        for key, _, k in regions:
            m[key] = kernels[k][0]

    got, xla = _run(da, assign, boundary=mode, fill_value=0.5 if mode == "fill" else None)
    assert len(ran) == 1
    ref = _reference(a, [(index, kernels[k][1]) for _, index, k in regions], mode, 0.5,
                     np.float32)
    np.testing.assert_array_equal(got.values, ref)
    np.testing.assert_array_equal(got.values, xla.values)


def test_a_moved_mask_compiles_no_new_nest(ran: list[int],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[str] = []
    real = LM._compile

    def spy(source: str, parallel: bool) -> Any:
        compiled.append(source)
        return real(source, parallel)

    monkeypatch.setattr(LM, "_compile", spy)
    xstencil.clear_caches()
    a = np.random.default_rng(9).random((10, 12), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    for i, cut in enumerate((0.3, 0.6, 0.9)):
        m = da.stencil.mesh(boundary="extend", backend="loops")
        m[...] = lambda u: u(x=1) - u()
        m[da > cut] = lambda u: u(y=-1) * 2
        ref = _reference(a, [(..., lambda g: g(0, 1) - g(0, 0)),
                             (a > cut, lambda g: g(-1, 0) * np.float32(2))],
                         "extend", 0, np.float32)
        np.testing.assert_array_equal(m.map().values, ref)
        assert len(ran) == i + 1
        assert len(compiled) == 2  # the two nests of the first mesh, reused
