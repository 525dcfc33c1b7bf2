"""dask map blocks on the CPU loop backend (``xstencil/_backends/dask_loops.py``).

Each block is joined with its neighbours' strips in numpy, its halo on a
global edge rebuilt in numpy, and the kernel runs as the in-memory map's loop
nest.  The reference is the in-memory map (itself checked against numpy
loops elsewhere) and the dask blocks on XLA: results must be bitwise the
same, inputs untouched, and what the loops cannot do must fall back.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from xstencil._backends import dask_loops
from xstencil._backends.dask_base import compile_count
from xstencil._backends.edges import repad

pytest.importorskip("numba")
dask = pytest.importorskip("dask")

MODES = ["fill", "extend", "periodic", "reflect", "symmetric", "valid"]


def _lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


def _field(shape: tuple[int, ...], dtype: Any = np.float32, seed: int = 0) -> xr.DataArray:
    rng = np.random.default_rng(seed)
    dims = ("z", "y", "x")[-len(shape):]
    return xr.DataArray((rng.standard_normal(shape) * 10).astype(dtype), dims=dims,
                        coords={d: np.arange(n) for d, n in zip(dims, shape, strict=True)},
                        attrs={"units": "K"}, name="t")


@pytest.mark.parametrize("mode", MODES)
# every mode on the smallest, uneven blocks in the fast run; the other chunkings (2-11 s a
# case on 2 cores) with the slow tests
@pytest.mark.parametrize("chunks", [pytest.param((10, 16), marks=pytest.mark.slow), (7, 9),
                                    pytest.param((23, 40), marks=pytest.mark.slow)])
def test_blocks_match_memory_bitwise(mode: str, chunks: tuple[int, int],
                                     ran: list[int]) -> None:
    da = _field((23, 40))
    lazy = da.chunk({"y": chunks[0], "x": chunks[1]})
    before = lazy.values.copy()
    got = lazy.stencil.map(_lap, boundary=mode, fill_value=1.5, backend="loops")
    assert got.chunks is not None  # still lazy
    got = got.compute()
    assert ran, "the blocks did not run as loops"
    want = da.stencil.map(_lap, boundary=mode, fill_value=1.5, backend="xla")
    xla = lazy.stencil.map(_lap, boundary=mode, fill_value=1.5, backend="xla").compute()
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(xla.values, want.values)
    assert got.dtype == np.float32 and got.attrs == da.attrs and got.name == da.name
    xr.testing.assert_identical(got.coords.to_dataset(), want.coords.to_dataset())
    np.testing.assert_array_equal(lazy.values, before)  # the input is untouched


def test_numpy_loop_reference_with_per_dim_modes(ran: list[int]) -> None:
    da = _field((3 * 7, 2 * 9 + 4), np.float64, seed=3)
    lazy = da.chunk({"y": 7, "x": 9})

    def k(u: Any) -> Any:
        return 0.5 * u(x=2) - u(x=-1) + 0.25 * u(y=1) * u(y=-1)

    got = lazy.stencil.map(k, boundary={"x": "periodic", "y": "reflect"},
                           backend="loops").values
    assert ran
    a = da.values
    ny, nx = a.shape
    want = np.empty_like(a)
    for i in range(ny):
        for j in range(nx):
            up = i + 1 if i + 1 < ny else ny - 2  # reflect: the edge cell not repeated
            dn = i - 1 if i >= 1 else 1
            want[i, j] = (0.5 * a[i, (j + 2) % nx] - a[i, (j - 1) % nx]
                          + 0.25 * a[up, j] * a[dn, j])
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)


def test_3d_strided_and_kwargs(ran: list[int]) -> None:
    da = _field((12, 10, 14), seed=4)
    lazy = da.chunk({"z": 5, "y": 4, "x": 7})

    def k(u: Any, c: float) -> Any:
        return c * (u(x=1) - u(x=-1)) + u(z=1) * u(y=-1)

    for stride in ({"x": 2}, {"z": 3, "x": 2}):
        got = lazy.stencil.map(k, 0.7, boundary="extend", stride=stride, backend="loops")
        # the same nest as in memory: bitwise; XLA may contract a multiply-add
        # that LLVM does not (or the reverse): within an ulp or two
        same = da.stencil.map(k, 0.7, boundary="extend", stride=stride, backend="loops")
        xla = da.stencil.map(k, 0.7, boundary="extend", stride=stride, backend="xla")
        np.testing.assert_array_equal(got.values, same.values)
        np.testing.assert_allclose(got.values, xla.values, rtol=3e-7, atol=1e-4)
        assert got.shape == xla.shape
    assert ran


def test_integer_dtypes_as_in_memory(ran: list[int]) -> None:
    da = xr.DataArray(np.full((16, 16), 200, np.uint8), dims=("y", "x"))
    lazy = da.chunk({"y": 5, "x": 6})
    for k in (lambda u: u(x=1) + u(x=-1) + u(),  # uint8 + uint8 wraps, as in numpy
              lambda u: u(x=1).astype(jnp.int32) * 3 - u(y=-1).astype(jnp.int32)):
        got = lazy.stencil.map(k, boundary="periodic", backend="loops")
        want = da.stencil.map(k, boundary="periodic", backend="xla")
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.values, want.values)
    assert got.dtype == np.int32 and int(got.values.max()) == 400
    assert ran


def test_float64_stays_float64(ran: list[int]) -> None:
    da = _field((20, 20), np.float64, seed=6) / 3.0
    got = da.chunk({"y": 8, "x": 8}).stencil.map(_lap, boundary="fill", fill_value=0.0,
                                                 backend="loops")
    assert got.dtype == np.float64
    want = da.stencil.map(_lap, boundary="fill", fill_value=0.0, backend="xla")
    np.testing.assert_array_equal(got.values, want.values)
    assert ran


def test_dataset_with_two_results(ran: list[int]) -> None:
    ds = xr.Dataset({"a": _field((18, 21), seed=7), "b": _field((18, 21), seed=8)})
    lazy = ds.chunk({"y": 6, "x": 7})

    def k(s: Any) -> Any:
        return {"a": s["a"](x=1) - s["a"](x=-1), "b": s["a"]() * s["b"](y=1)}

    got = lazy.stencil.map(k, boundary="symmetric", backend="loops").compute()
    want = ds.stencil.map(k, boundary="symmetric", backend="xla")
    for name in ("a", "b"):
        np.testing.assert_array_equal(got[name].values, want[name].values)
    assert ran


def test_backend_xla_and_small_auto_blocks_stay_on_xla(ran: list[int]) -> None:
    da = _field((40, 40), seed=9)

    def k(u: Any) -> Any:  # a kernel of its own: its block function is traced anew
        return u(x=1) - 3 * u(y=-1)

    n0 = compile_count()
    da.chunk({"y": 20, "x": 20}).stencil.map(k, backend="xla").compute()
    da.chunk({"y": 20, "x": 20}).stencil.map(k).compute()  # auto: 400 points per block
    assert ran == [] and compile_count() > n0


def test_env_variable_chooses_the_blocks_backend(ran: list[int],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    da = _field((30, 30), seed=10)

    def k(u: Any) -> Any:
        return u(x=1) * 2 - u(y=1)

    monkeypatch.setenv("XSTENCIL_BACKEND", "loops")
    n0 = compile_count()
    got = da.chunk({"y": 10, "x": 15}).stencil.map(k, boundary="extend").values
    assert ran and compile_count() == n0 + 1  # one loop nest for the one block shape
    np.testing.assert_array_equal(got, da.stencil.map(k, boundary="extend",
                                                      backend="xla").values)


def test_large_blocks_use_loops_by_default(ran: list[int]) -> None:
    da = _field((1024, 520), seed=11)  # 2 blocks of 512 x 520 outputs (auto's floor)
    lazy = da.chunk({"y": 512, "x": 520})
    got = lazy.stencil.map(_lap, boundary="periodic").values
    assert len(ran) == 2
    np.testing.assert_array_equal(got, da.stencil.map(_lap, boundary="periodic").values)


def test_kernels_the_loops_cannot_express_fall_back(ran: list[int]) -> None:
    ia = xr.DataArray(np.arange(24 * 20, dtype=np.int32).reshape(24, 20) - 200,
                      dims=("y", "x"))
    lazy = ia.chunk({"y": 8, "x": 10})
    got = lazy.stencil.map(lambda u: u(x=1) // 3, boundary="periodic", backend="loops")
    np.testing.assert_array_equal(got.values, np.roll(ia.values, -1, axis=1) // 3)
    table = np.arange(10.0, dtype=np.float32) * 2
    got = lazy.stencil.map(lambda u: jnp.asarray(table)[jnp.clip(u(y=1), 0, 9)],
                           boundary="extend", backend="loops")
    up = np.concatenate([ia.values[1:], ia.values[-1:]])
    np.testing.assert_array_equal(got.values, table[np.clip(up, 0, 9)])
    got = lazy.stencil.map(lambda u: jnp.stack([u(x=1), u()]), boundary="periodic",
                           output_dims="k", backend="loops")
    np.testing.assert_array_equal(got.values[..., 0], np.roll(ia.values, -1, axis=1))
    np.testing.assert_array_equal(got.values[..., 1], ia.values)
    assert ran == []


def test_many_blocks_on_the_threaded_scheduler(ran: list[int]) -> None:
    da = _field((64, 64), np.float64, seed=13)
    lazy = da.chunk({"y": 8, "x": 8})  # 64 blocks, run by dask's thread pool
    with dask.config.set(scheduler="threads", num_workers=4):
        got = lazy.stencil.map(_lap, boundary="reflect", backend="loops").values
    assert len(ran) == 64
    np.testing.assert_array_equal(got, da.stencil.map(_lap, boundary="reflect",
                                                      backend="xla").values)


@pytest.mark.parametrize("mode", ["fill", "extend", "reflect", "symmetric"])
@pytest.mark.parametrize("n, w", [(9, 2), (4, 1), (12, 3)] + [
    pytest.param(n, w, marks=pytest.mark.slow) for n, w in [(5, 2), (6, 2), (9, 3)]])
def test_repad_host_matches_the_traced_repad(mode: str, n: int, w: int) -> None:
    rng = np.random.default_rng(n * 10 + w)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    for axis, lo, hi, at_lo, at_hi in [(0, w, w, True, True), (0, w, w, True, False),
                                       (0, w, 0, True, True), (1, 1, 2, False, True)]:
        want = np.asarray(jax.jit(repad, static_argnums=(1, 2, 3, 4))(
            x, axis, lo, hi, mode, -7.0, at_lo, at_hi))
        got = x.copy()
        dask_loops.repad_host(got, axis, lo, hi, mode, -7.0, at_lo, at_hi)
        np.testing.assert_array_equal(got, want, err_msg=f"{mode} {axis} {lo} {hi}")


def test_repad_host_casts_the_fill_as_jax_does() -> None:
    x = np.arange(12, dtype=np.int32).reshape(4, 3)
    dask_loops.repad_host(x, 0, 1, 1, "fill", 2.7, True, True)
    want = np.asarray(repad(jnp.arange(12, dtype=jnp.int32).reshape(4, 3), 0, 1, 1, "fill",
                            2.7, True, True))
    np.testing.assert_array_equal(x, want)


def test_join_host_never_returns_a_view_of_a_piece() -> None:
    own = np.arange(12.0).reshape(3, 4)
    joined = dask_loops.join_host([[own]], (0, 0), (None, None), 0.0,
                                  np.zeros((2, 2), bool))
    assert not np.may_share_memory(joined, own)
    np.testing.assert_array_equal(joined, own)


def test_dataset_results_of_different_dtypes(ran: list[int]) -> None:
    """Results of different dtypes travel packed as raw bytes (dask_pack.py)."""
    rng = np.random.default_rng(14)
    ds = xr.Dataset({"a": (("y", "x"), rng.random((20, 24)).astype(np.float32)),
                     "b": (("y", "x"), rng.integers(0, 9, (20, 24)).astype(np.int32))})

    def k(s: Any) -> Any:
        return {"a": s["a"](x=1) * 2, "b": s["b"](y=-1) + s["b"]()}

    got = ds.chunk({"y": 7, "x": 12}).stencil.map(k, boundary="periodic",
                                                  backend="loops").compute()
    assert ran
    want = ds.stencil.map(k, boundary="periodic", backend="xla")
    for n in ("a", "b"):
        assert got[n].dtype == want[n].dtype
        np.testing.assert_array_equal(got[n].values, want[n].values)


# -- function meshes --------------------------------------------------------------------


@pytest.fixture
def mesh_blocks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per mesh block that tried the loops: whether they ran it."""
    monkeypatch.delenv("XSTENCIL_BACKEND", raising=False)
    seen: list[bool] = []
    orig = dask_loops.BlockMeshLoops.run

    def spy(self: Any, *args: Any) -> Any:
        out = orig(self, *args)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(dask_loops.BlockMeshLoops, "run", spy)
    return seen


def _mesh(obj: xr.DataArray, mask: xr.DataArray, mode: str, backend: str) -> Any:
    m = obj.stencil.mesh(boundary=mode, fill_value=0.5, backend=backend)
    m[...] = _lap
    m.loc[{"x": slice(None, 5.0)}] = lambda u: u() * 2  # by label: the first chunk only
    m[mask] = lambda u: u(y=1) - u()  # by mask: different cells in every block
    m[{"y": slice(30, None)}] = lambda u: u(x=-1) * 0.5  # by position, over the mask
    return m


# every mode on uneven x chunks and periodic on 4x3 blocks in the fast run (8-14 s a case
# on 2 cores for the 4x3 blocks); the rest with the slow tests
@pytest.mark.parametrize(("chunks", "mode"), [
    pytest.param(chunks, mode, id=f"chunks{i}-{mode}",
                 marks=() if i == 2 or (i == 0 and mode == "periodic") else pytest.mark.slow)
    for i, chunks in enumerate([{"y": 13, "x": 20}, {"y": 30, "x": 48}, {"x": (6, 42)}])
    for mode in ["periodic", "reflect", "fill", "extend"]])
def test_mesh_blocks_match_memory_bitwise(mode: str, chunks: Any,
                                          mesh_blocks: list[bool]) -> None:
    da = _field((40, 48), seed=15)
    mask = da > 5.0
    lazy = da.chunk(chunks)
    before = lazy.values.copy()
    got = _mesh(lazy, mask, mode, "loops").map()
    assert got.chunks is not None
    got = got.compute()
    assert mesh_blocks and all(mesh_blocks), "the mesh blocks did not run as loops"
    want = _mesh(da, mask, mode, "loops").map()
    xla = _mesh(lazy, mask, mode, "xla").map().compute()
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(xla.values, want.values)
    assert got.dtype == want.dtype and got.attrs == da.attrs
    np.testing.assert_array_equal(lazy.values, before)


def test_mesh_masks_are_each_blocks_own(mesh_blocks: list[bool]) -> None:
    """Blocks of one structure share compiled nests; each reads its own mask."""
    da = xr.DataArray(np.zeros((32, 32), np.float32), dims=("y", "x"))
    mask = xr.DataArray(np.zeros((32, 32), bool), dims=("y", "x"))
    mask[3, 5] = mask[20, 7] = mask[9, 28] = mask[30, 30] = True
    m = da.chunk({"y": 16, "x": 16}).stencil.mesh(boundary="periodic", backend="loops")
    m[mask] = lambda u: u() + 1.0
    got = m.map().values
    assert len(mesh_blocks) == 4 and all(mesh_blocks)
    np.testing.assert_array_equal(got, mask.values.astype(np.float32))


def test_mesh_of_different_dtypes_and_a_fallback(mesh_blocks: list[bool]) -> None:
    ia = xr.DataArray(np.arange(24 * 20, dtype=np.int32).reshape(24, 20) - 200,
                      dims=("y", "x"))
    lazy = ia.chunk({"y": 8, "x": 10})
    m = lazy.stencil.mesh(boundary="periodic", backend="loops")
    m[...] = lambda u: u(x=1).astype(jnp.float32) * 0.5  # float32 over int32: promoted
    m[{"y": slice(0, 4)}] = lambda u: u(y=1) + u()
    got = m.map().values
    mm = ia.stencil.mesh(boundary="periodic", backend="xla")
    mm[...] = lambda u: u(x=1).astype(jnp.float32) * 0.5
    mm[{"y": slice(0, 4)}] = lambda u: u(y=1) + u()
    want = mm.map()
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want.values)
    assert mesh_blocks and all(mesh_blocks)
    mesh_blocks.clear()
    m = lazy.stencil.mesh(boundary="periodic", backend="loops")
    m[...] = lambda u: u(x=1) // 3  # integer division: no loop form
    np.testing.assert_array_equal(m.map().values, np.roll(ia.values, -1, axis=1) // 3)
    assert not any(mesh_blocks)


def test_graphs_on_loops_and_on_xla_do_not_share_task_names() -> None:
    """A graph on the loops and one on XLA (floats may differ in the last bits)
    are named apart, so a persisted result of one never answers the other."""
    lazy = _field((30, 30), seed=16).chunk({"y": 15})
    names = {b: lazy.stencil.map(_lap, boundary="periodic", backend=b).data.name
             for b in ("loops", "xla", "auto")}
    assert len(set(names.values())) == 3
    assert lazy.stencil.map(_lap, boundary="periodic", backend="loops").data.name \
        == names["loops"]  # deterministic
    scans = {b: lazy.stencil.scan(lambda u: u(time=-1, x=1), "time", steps=2,
                                  boundary="periodic", backend=b).data.name
             for b in ("loops", "xla")}
    assert scans["loops"] != scans["xla"]


def test_a_kernel_reading_a_descending_coordinate(ran: list[int]) -> None:
    """float64 data read their coordinates on the loops (float32 ones fall back):
    each block reads its own slice of the padded coordinate."""
    rng = np.random.default_rng(17)
    x = np.sort(rng.random(30))[::-1] * 10  # descending, non-uniform
    da = xr.DataArray(rng.random((12, 30)), dims=("y", "x"), coords={"x": x})

    def ddx(u: Any) -> Any:
        c = u.coord("x")
        return (u(x=1) - u(x=-1)) / (c(x=1) - c(x=-1))

    got = da.chunk({"x": (9, 11, 10)}).stencil.map(ddx, boundary="extend", backend="loops")
    want = da.stencil.map(ddx, boundary="extend", backend="loops")
    np.testing.assert_array_equal(got.values, want.values)
    assert ran
