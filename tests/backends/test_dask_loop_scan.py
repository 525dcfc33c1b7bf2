"""dask scan tasks on the CPU loop backend (``xstencil/_labelled/dask_loop_scan.py``).

Each task runs the in-memory loop scan on its chunk extended by a halo K
reaches deep, the halo on a global edge of a non-periodic dim left out.  The
reference is the in-memory loop scan (checked against numpy loops in
tests/backends/test_loops_*): the chunks' cells must be bitwise the same for
every boundary mode, chunking and save pattern; what the loops cannot do must
fall back to the XLA block program with XLA's result.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from tests.spies import count_calls
from xstencil._backends import tiles
from xstencil._backends.blockmesh import BlockMesh, local_regions
from xstencil._engine.mesh import Slab
from xstencil._labelled import dask_loop_scan

pytest.importorskip("numba")
dask = pytest.importorskip("dask")

MODES = ["fill", "extend", "periodic", "reflect", "symmetric"]


def _heat(u: Any) -> Any:
    return u(time=-1) + 0.2 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                               + u(time=-1, y=-1) - 4 * u(time=-1))


def _field(shape: tuple[int, int] = (24, 30), dtype: Any = np.float32,
           seed: int = 0) -> xr.DataArray:
    rng = np.random.default_rng(seed)
    return xr.DataArray(rng.random(shape).astype(dtype), dims=("y", "x"),
                        coords={"y": np.arange(shape[0]), "x": np.arange(shape[1]) * 0.5},
                        attrs={"units": "K"}, name="T")


@pytest.fixture
def tasks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the tasks that ran the loop scan (and did not decline)."""
    monkeypatch.delenv("XSTENCIL_BACKEND", raising=False)
    ran: list[int] = []
    orig = dask_loop_scan.BlockLoopScan.__call__

    def spy(self: Any, state: np.ndarray, consts: Any, n: int, regions: Any = None) -> Any:
        out = orig(self, state, consts, n, regions)
        if out is not None:
            ran.append(n)
        return out

    monkeypatch.setattr(dask_loop_scan.BlockLoopScan, "__call__", spy)
    return ran


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chunks, K", [({"y": 8, "x": 10}, 3),
                                       pytest.param({"y": (7, 9, 8)}, 2, marks=pytest.mark.slow),
                                       ({"x": (11, 19)}, None),
                                       pytest.param({"y": 24, "x": 30}, 4, marks=pytest.mark.slow)])
def test_tasks_match_the_memory_loop_scan_bitwise(mode: str, chunks: Any, K: Any,
                                                  tasks: list[int]) -> None:
    u0 = _field()
    lazy = u0.chunk(chunks)
    before = lazy.values.copy()
    kw = dict(steps=12, boundary=mode, fill_value=0.25, save_every=4, backend="loops")
    got = lazy.stencil.scan(_heat, "time", halo_every=K, **kw)
    assert got.chunks is not None
    got = got.compute()
    assert tasks, "no task ran the loop scan"
    want = u0.stencil.scan(_heat, "time", **kw)
    np.testing.assert_array_equal(got.values, want.values)
    assert got.dims == want.dims and got.dtype == np.float32
    np.testing.assert_array_equal(got.time.values, want.time.values)
    assert got.attrs == u0.attrs and got.name == u0.name
    np.testing.assert_array_equal(lazy.values, before)  # the input is untouched
    xla = u0.stencil.scan(_heat, "time", **{**kw, "backend": "xla"})
    np.testing.assert_allclose(got.values, xla.values, rtol=1e-5, atol=1e-6)


def test_numpy_time_loop_reference_with_per_dim_modes(tasks: list[int]) -> None:
    u0 = _field((20, 26), np.float64, seed=1)
    got = u0.chunk({"y": 5, "x": 13}).stencil.scan(
        _heat, "time", steps=7, boundary={"y": "reflect", "x": "periodic"},
        save_every="last", halo_every=3, backend="loops").values
    assert tasks
    a = u0.values.copy()
    ny, nx = a.shape
    for _ in range(7):
        new = np.empty_like(a)
        for i in range(ny):
            up = i + 1 if i + 1 < ny else ny - 2
            dn = i - 1 if i >= 1 else 1
            for j in range(nx):
                new[i, j] = a[i, j] + 0.2 * (a[i, (j + 1) % nx] + a[i, (j - 1) % nx]
                                             + a[up, j] + a[dn, j] - 4 * a[i, j])
        a = new
    np.testing.assert_allclose(got, a, rtol=1e-13, atol=0)


def test_kernel_arguments_and_a_grown_trajectory(tasks: list[int]) -> None:
    u0 = _field((18, 22), seed=2).expand_dims(time=[0.0])  # one initial position along dim

    def k(u: Any, c: float, *, d: float) -> Any:
        return u(time=-1) + c * (u(time=-1, x=1) - u(time=-1, x=-1)) - d * u(time=-1, y=1)

    kw = dict(steps=6, boundary="extend", backend="loops", dt=0.5)
    got = u0.chunk({"y": 6, "x": 11}).stencil.scan(k, "time", 0.1, d=0.05, halo_every=2, **kw)
    want = u0.stencil.scan(k, "time", 0.1, d=0.05, **kw)
    np.testing.assert_array_equal(got.values, want.values)
    np.testing.assert_array_equal(got.time.values, want.time.values)
    assert tasks


def test_backend_xla_and_small_auto_blocks_stay_on_xla(tasks: list[int]) -> None:
    u0 = _field()
    lazy = u0.chunk({"y": 12, "x": 15})
    a = lazy.stencil.scan(_heat, "time", steps=5, boundary="periodic", backend="xla").values
    b = lazy.stencil.scan(_heat, "time", steps=5, boundary="periodic").values  # auto: small
    assert tasks == []
    want = u0.stencil.scan(_heat, "time", steps=5, boundary="periodic", backend="xla")
    np.testing.assert_array_equal(a, want.values)
    np.testing.assert_array_equal(b, want.values)


def test_what_the_loops_cannot_do_falls_back(tasks: list[int]) -> None:
    u0 = _field((20, 24), np.float64, seed=3)
    lazy = u0.chunk({"y": 10, "x": 12})

    def reads_coord(u: Any) -> Any:
        x = u.coord("x")
        return u(time=-1) + 0.1 * (u(time=-1, x=1) - u(time=-1)) * x()

    def two_back(u: Any) -> Any:
        return 0.5 * u(time=-1) + 0.5 * u(time=-2, x=1)

    got = lazy.stencil.scan(reads_coord, "time", steps=4, boundary="extend", halo_every=2,
                            backend="loops")
    want = u0.stencil.scan(reads_coord, "time", steps=4, boundary="extend", backend="xla")
    np.testing.assert_allclose(got.values, want.values, rtol=1e-12)
    init = xr.concat([u0, u0 * 0.5], "time")
    got = init.chunk({"y": 10, "x": 12, "time": -1}).stencil.scan(
        two_back, "time", steps=4, boundary="periodic", halo_every=2, backend="loops")
    want = init.stencil.scan(two_back, "time", steps=4, boundary="periodic", backend="xla")
    np.testing.assert_allclose(got.values, want.values, rtol=1e-12)
    assert tasks == []


def _coupled(s: Any) -> Any:
    return {"u": s["u"](time=-1) + 0.1 * s["v"](time=-1, y=1) - 0.05 * s["b"](x=-1),
            "v": s["v"](time=-1) - 0.1 * s["u"](time=-1, y=-1) * s["b"]()}


@pytest.mark.parametrize("mode", ["periodic", "extend", "reflect"])
def test_dataset_with_a_constant(mode: str, tasks: list[int]) -> None:
    u0 = _field((20, 24), np.float64, seed=6)
    ds = xr.Dataset({"u": u0, "v": u0 * 2, "b": 0.5 + u0.copy(data=u0.values[::-1])})
    kw = dict(steps=6, boundary=mode, save_every=2, backend="loops")
    got = ds.chunk({"y": 7, "x": 12}).stencil.scan(_coupled, "time", halo_every=2, **kw)
    got = got.compute()
    assert tasks
    want = ds.stencil.scan(_coupled, "time", **kw)
    for n in ("u", "v"):
        np.testing.assert_array_equal(got[n].values, want[n].values)
        assert got[n].dims == want[n].dims
    np.testing.assert_array_equal(got["b"].values, ds["b"].values)


def test_large_chunks_use_loops_by_default(tasks: list[int]) -> None:
    u0 = _field((1100, 520), seed=4)  # two chunks of 550 x 520 (auto's floor: 512 x 512)
    got = u0.chunk({"y": 550}).stencil.scan(_heat, "time", steps=8, boundary="fill",
                                            fill_value=0.0, save_every="last").values
    assert len(tasks) == 2 * 1  # one segment (K = 8 steps) of two tasks
    want = u0.stencil.scan(_heat, "time", steps=8, boundary="fill", fill_value=0.0,
                           save_every="last")
    np.testing.assert_array_equal(got, want.values)


def test_many_tasks_on_the_threaded_scheduler(tasks: list[int]) -> None:
    u0 = _field((48, 48), np.float64, seed=5)
    with dask.config.set(scheduler="threads", num_workers=4):
        got = u0.chunk({"y": 8, "x": 12}).stencil.scan(
            _heat, "time", steps=9, boundary="symmetric", halo_every=3, save_every=3,
            backend="loops").values
    assert len(tasks) == 3 * 6 * 4
    want = u0.stencil.scan(_heat, "time", steps=9, boundary="symmetric", save_every=3,
                           backend="loops")
    np.testing.assert_array_equal(got, want.values)


def test_the_spy_counts_real_loop_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop scan a task runs is the in-memory one (run_loops of the nest)."""
    from xstencil._backends import loops

    monkeypatch.delenv("XSTENCIL_BACKEND", raising=False)
    ran = count_calls(monkeypatch, loops, "run_loops")
    got = _field().chunk({"y": 12}).stencil.scan(_heat, "time", steps=3, boundary="periodic",
                                                 halo_every=3, backend="loops").values
    assert ran  # the first task built and ran the nest; the second reuses it
    want = _field().stencil.scan(_heat, "time", steps=3, boundary="periodic", backend="xla")
    np.testing.assert_allclose(got, want.values, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_temporally_blocked_tiles_run_the_loop_scan(mode: str, tasks: list[int]) -> None:
    """``blocking=`` on numpy data: each tile runs the same loop scan."""
    u0 = _field((40, 36), np.float64, seed=8)
    kw = dict(steps=12, boundary=mode, fill_value=0.5, save_every=6, backend="loops")
    got = u0.stencil.scan(_heat, "time", blocking={"tile": 12, "steps": 4}, **kw)
    assert len(tasks) >= 2 * 9  # 9 tiles (3 x 3), at least two layers
    want = u0.stencil.scan(_heat, "time", **kw)  # blocking=None: the whole-array loop scan
    np.testing.assert_array_equal(got.values, want.values)
    assert got.dims == want.dims and got.dtype == want.dtype


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The tilings the temporally blocked scans chose."""
    out: list[Any] = []
    real = tiles.scan_tiles
    monkeypatch.setattr(tiles, "scan_tiles", lambda job, tiling, threads=None, loops=None: (
        out.append(tiling), real(job, tiling, threads, loops))[1])
    return out


@pytest.mark.parametrize("mode", ["fill", "periodic", "reflect"])
def test_blocking_true_on_the_loops_steps_whole_row_strips(mode: str, tasks: list[int],
                                                           seen: list[Any],
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """``blocking=True`` where the tiles run the loop scan: automatic tiles
    are strips of whole rows of about ``LOOP_TILE_BYTES`` (here made 24 rows'
    worth), each stepped up to ``LOOP_MAX_STEPS`` at a time; bitwise the
    whole-array loop scan."""
    u0 = _field((96, 40), np.float32, seed=4)
    monkeypatch.setattr(tiles, "LOOP_TILE_BYTES", 24 * 40 * 4)
    kw = dict(steps=20, boundary=mode, fill_value=0.5, save_every="last", backend="loops")
    got = u0.stencil.scan(_heat, "time", blocking=True, **kw)
    (tiling,) = seen
    assert tiling.bounds == (((0, 24), (24, 48), (48, 72), (72, 96)), ((0, 40),))
    assert tiling.steps == 3  # a halo of at most an eighth of a strip: 24 // 8
    assert len(tasks) == 4 * 7  # 4 strips, 7 layers of at most 3 steps
    want = u0.stencil.scan(_heat, "time", **kw)  # blocking=None: the whole-array loop scan
    np.testing.assert_array_equal(got.values, want.values)


def test_blocking_true_under_auto_keeps_square_tiles_below_the_floor(
        tasks: list[int], seen: list[Any]) -> None:
    """Under ``"auto"`` strips too small for the loops (below its 512 x 512
    floor) would run on XLA anyway: the XLA tiles' own square choice is kept."""
    u0 = _field((64, 64), np.float32, seed=5)
    got = u0.stencil.scan(_heat, "time", blocking=True, steps=12, save_every="last")
    (tiling,) = seen
    assert tiling.count == 2  # one tile per core; a strip would hold all 64 rows
    assert not tasks  # XLA tiles
    want = u0.stencil.scan(_heat, "time", steps=12, save_every="last", blocking=False)
    np.testing.assert_array_equal(got.values, want.values)


def test_a_netcdf_file_in_and_out_on_the_default_backend(tmp_path: Any,
                                                         tasks: list[int]) -> None:
    """The user's out-of-core path: a chunked file, a map and a scan on the
    default backend (loops for chunks of 512 x 512 and more), written back."""
    pytest.importorskip("h5netcdf")
    rng = np.random.default_rng(9)
    src = xr.Dataset({"T": (("y", "x"), rng.random((1100, 600)).astype(np.float32))},
                     coords={"y": np.arange(1100.0), "x": np.arange(600) * 0.5})
    src.to_netcdf(tmp_path / "in.nc", engine="h5netcdf")
    T = xr.open_dataset(tmp_path / "in.nc", engine="h5netcdf", chunks={"y": 550})["T"]
    bnd = {"x": "periodic", "y": "extend"}

    def lap(u: Any) -> Any:
        return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()

    T.stencil.map(lap, boundary=bnd).to_netcdf(tmp_path / "lap.nc", engine="h5netcdf")
    T.stencil.scan(_heat, "time", steps=16, save_every=8, boundary=bnd).to_netcdf(
        tmp_path / "traj.nc", engine="h5netcdf")
    assert tasks == [8] * 4  # two layers of 8 steps (one per save), two chunks each
    with xr.open_dataarray(tmp_path / "lap.nc", engine="h5netcdf") as got:
        np.testing.assert_array_equal(got.values,
                                      src["T"].stencil.map(lap, boundary=bnd).values)
    with xr.open_dataarray(tmp_path / "traj.nc", engine="h5netcdf") as got:
        want = src["T"].stencil.scan(_heat, "time", steps=16, save_every=8, boundary=bnd)
        np.testing.assert_array_equal(got.values, want.values)
        np.testing.assert_array_equal(got.time.values, want.time.values)


def test_a_declined_block_shape_does_not_send_other_shapes_to_xla() -> None:
    """Under "auto" a small edge block declines (size floor); a large block of
    the same scan still runs the loop scan, whichever task ran first."""
    scan = dask_loop_scan.BlockLoopScan("da.stencil.scan(...)", _heat, ("time", "y", "x"),
                                        None, (), {"boundary": "fill", "fill_value": 0.0},
                                        (), {}, "auto")
    rng = np.random.default_rng(10)
    small = rng.random((1, 40, 600)).astype(np.float32)
    large = rng.random((1, 600, 600)).astype(np.float32)
    assert scan(small, [], 3) is None  # 24,000 points: below auto's 512 x 512
    got = scan(large, [], 3)
    assert got is not None
    want = xr.DataArray(large[0], dims=("y", "x")).stencil.scan(
        _heat, "time", steps=3, boundary="fill", fill_value=0.0, save_every="last")
    np.testing.assert_array_equal(got[0], want.values)
    assert scan(small, [], 3) is None


# -- function meshes ------------------------------------------------------------------------

def _damp(u: Any) -> Any:
    return 0.5 * u(time=-1)


def _neg(u: Any) -> Any:
    return -u(time=-1)


def _mesh_of(da: xr.DataArray, mode: str, mask: xr.DataArray) -> Any:
    """Boxes by position and label, a strided slab and a mask, overlapping."""
    m = da.stencil.mesh(boundary=mode, fill_value=0.25)
    m[{"x": slice(3, 26)}] = _heat
    m[{"y": slice(6, 12)}] = _damp
    m[{"x": slice(0, 30, 4)}] = _heat  # strided: a mask over each block
    m[mask] = _neg
    m.loc[{"x": slice(5.0, 6.0)}] = _damp
    return m


@pytest.mark.parametrize("mode", ["fill", "periodic", "reflect"])
@pytest.mark.parametrize("chunks, K", [({"y": 8, "x": 10}, 3), ({"y": (11, 13)}, 4)])
def test_mesh_scan_tasks_run_the_loop_mesh_scan(mode: str, chunks: Any, K: int,
                                                tasks: list[int]) -> None:
    """A function mesh's dask scan: each task runs the in-memory loop mesh
    scan on its block, the regions over the block's own cells (a slab
    wrapped around a periodic edge, or strided, as a mask): bitwise the
    in-memory loop mesh scan."""
    da = _field(seed=11).astype(np.float64)
    mask = xr.DataArray(np.random.default_rng(12).random(da.shape) > 0.8, dims=da.dims)
    kw = dict(steps=12, save_every=4, backend="loops")
    want = _mesh_of(da, mode, mask).scan("time", **kw)
    got = _mesh_of(da.chunk(chunks), mode, mask).scan("time", halo_every=K, **kw)
    assert got.chunks is not None
    got = got.compute()
    blocks = 9 if "x" in chunks else 2
    assert len(tasks) == blocks * 3 * -(-4 // K)  # 3 saves, each in layers of at most K
    np.testing.assert_array_equal(got.values, want.values)
    xr.testing.assert_identical(got, want)


def test_mesh_scan_the_loops_decline_stays_on_xla(tasks: list[int]) -> None:
    """A region's kernel the loop scan does not take (it reads a coordinate):
    every task runs the XLA block program, with XLA's in-memory result."""
    da = _field(seed=13)

    def by_x(u: Any) -> Any:
        return u(time=-1) * (1.0 + 0.0 * u.coord("x")())

    def build(obj: Any) -> Any:
        m = obj.stencil.mesh(boundary="fill", fill_value=0.0)
        m[...] = _heat
        m[{"x": slice(0, 5)}] = by_x
        return m

    got = build(da.chunk({"y": 12})).scan("time", steps=6, halo_every=3,
                                          backend="loops").compute()
    assert not tasks
    np.testing.assert_allclose(got.values, build(da).scan("time", steps=6,
                                                          backend="xla").values, rtol=1e-6)


def test_dataset_mesh_scan_tasks_run_the_loops(tasks: list[int]) -> None:
    da = _field(seed=14).astype(np.float64)
    ds = xr.Dataset({"T": da, "k": 0.5 * da})

    def heat_k(s: Any) -> Any:
        return {"T": _heat(s["T"])}

    def damp_k(s: Any) -> Any:
        return {"T": s["k"]() * s["T"](time=-1)}

    def build(obj: Any) -> Any:
        m = obj.stencil.mesh(boundary="periodic")
        m[...] = heat_k
        m[{"x": slice(20, None)}] = damp_k
        return m

    kw = dict(steps=8, save_every="last", backend="loops")
    want = build(ds).scan("time", **kw)
    got = build(ds.chunk({"y": 12, "x": 15})).scan("time", halo_every=4, **kw).compute()
    assert len(tasks) == 4 * 2
    np.testing.assert_array_equal(got["T"].values, want["T"].values)


def test_local_regions_of_a_block() -> None:
    """Slabs over global positions as boxes or masks of a block's cells."""
    full = (0, 10, 1)
    bm = BlockMesh((Slab((full, (2, 5, 1), (0, 8, 1))),   # a box
                    Slab((full, (6, 9, 1), (0, 8, 1))),   # rows 6 and 7 (the axis has 8)
                    Slab((full, (0, 8, 2), (0, 8, 1))),   # strided
                    Slab(((0, 1, 1), (0, 8, 1), (0, 8, 1))),  # the initial position only
                    0,
                    Slab((full, (1, 7, 1), (2, 4, 1)))),  # split by the periodic wrap
                   (False,), (10, 8, 8), (True, False), 1)
    mask = np.zeros((6, 8), bool)
    mask[1, 2] = True
    got = local_regions(bm, (5, 0), (6, 8), [mask])  # global rows 5, 6, 7, 0, 1, 2
    assert got is not None
    assert got[0] == ("box", ((5, 6), (0, 8)))  # global row 2 is local row 5
    assert got[1] == ("box", ((1, 3), (0, 8)))
    assert got[2][0] == "mask"
    np.testing.assert_array_equal(got[2][1][:, 0], [False, True, False, True, False, True])
    assert got[3] is None
    assert got[4][0] == "mask" and got[4][1][1, 2] and got[4][1].sum() == 1
    assert got[5][0] == "mask"
    np.testing.assert_array_equal(got[5][1][:, 2], [True, True, False, False, True, True])
    assert got[5][1].sum() == 4 * 2
    partial = BlockMesh((Slab(((4, 10, 1), (0, 8, 1), (0, 8, 1))),), (), (10, 8, 8),
                        (False, False), 1)
    assert local_regions(partial, (0, 0), (8, 8), []) is None
    timed = BlockMesh((0,), (True,), (10, 8, 8), (False, False), 1)
    assert local_regions(timed, (0, 0), (8, 8), [np.zeros((8, 8), bool)]) is None


def test_one_strip_steps_every_step_between_saves() -> None:
    """A field that one strip holds has no halo to recompute: K is every
    step between saves, not ``LOOP_MAX_STEPS``."""
    one = tiles.choose((512, 512), (1, 1), 4, 1000, strips=True)
    assert one.count == 1 and one.steps == 1000
    two = tiles.choose((2048, 2048), (1, 1), 4, 1000, strips=True)
    assert two.count == 2 and two.steps == tiles.LOOP_MAX_STEPS
    assert tiles.choose((512, 512), (1, 1), 4, 1000, strips=True, steps=16).steps == 16
