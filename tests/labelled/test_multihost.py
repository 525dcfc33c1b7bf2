"""open_sharded, write_sharded and gather in one process (one CPU device).

The two-process run is tests/backends/test_multiprocess.py; here the
round trips, the file formats and the errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil import XStencilError

pytest.importorskip("zarr")


def _ds() -> xr.Dataset:
    rng = np.random.default_rng(3)
    T = xr.DataArray(rng.random((6, 8)), dims=("y", "x"), name="T", attrs={"units": "K"},
                     coords={"y": np.arange(6.0), "x": np.linspace(0.0, 1.4, 8)})
    depth = xr.DataArray(np.arange(6, dtype=np.int32), dims="y", attrs={"units": "m"})
    return xr.Dataset({"T": T, "depth": depth, "mask": ("x", np.arange(8) > 3)},
                      attrs={"title": "t"})


def _read(path) -> xr.Dataset:
    with xr.open_dataset(path, engine="zarr", consolidated=False) as ds:
        return ds.load()


def _read_da(path) -> xr.DataArray:
    with xr.open_dataarray(path, engine="zarr", consolidated=False) as da:
        return da.load()


@pytest.mark.parametrize("fmt", ["zarr", "nc"])
def test_open_sharded_reads_files(tmp_path, fmt):
    ds = _ds()
    path = tmp_path / f"in.{fmt}"
    if fmt == "zarr":
        ds.to_zarr(path, consolidated=False)
    else:
        ds.to_netcdf(path)
    got = xstencil.open_sharded(path, {"x": "i"})
    assert set(got.data_vars) == {"T", "mask"} | {"depth"}
    # T and mask span the sharded dim x: global JAX arrays; depth does not: numpy
    assert tuple(got["T"].data.sharding.spec) == (None, "i")
    assert isinstance(got["depth"].data, np.ndarray)
    assert got["T"].dtype == np.float64 and got["depth"].dtype == np.int32
    xr.testing.assert_identical(xstencil.gather(got), ds)
    assert got.attrs == ds.attrs and got["T"].attrs == {"units": "K"}


def test_round_trip_through_write_sharded(tmp_path):
    ds = _ds()
    sh = xstencil.open_sharded(ds, {"y": "a", "x": "b"})
    lap = sh["T"].stencil.map(lambda u: u(x=1) + u(x=-1) - 2 * u(), boundary="periodic")
    ref = ds["T"].stencil.map(lambda u: u(x=1) + u(x=-1) - 2 * u(), boundary="periodic")
    xstencil.write_sharded(lap, tmp_path / "lap.zarr")
    got = _read_da(tmp_path / "lap.zarr")
    xr.testing.assert_identical(got, ref)
    np.testing.assert_array_equal(got.values, ref.values)
    # a Dataset with a numpy variable (written by process 0) and an unnamed DataArray
    xstencil.write_sharded(sh, tmp_path / "all.zarr")
    xr.testing.assert_identical(_read(tmp_path / "all.zarr"), ds)
    xstencil.write_sharded(sh["T"].rename(None), tmp_path / "unnamed.zarr")
    back = _read_da(tmp_path / "unnamed.zarr")
    assert back.name is None and np.array_equal(back.values, ds["T"].values)


def test_write_sharded_modes(tmp_path):
    da = xstencil.open_sharded(_ds()["T"], {"x": "i"})
    xstencil.write_sharded(da, tmp_path / "a.zarr")
    with pytest.raises(XStencilError, match=r"write_sharded\(...\): store=.*a.zarr' already "
                                            r"exists; pass mode='w' to overwrite it"):
        xstencil.write_sharded(da, tmp_path / "a.zarr")
    twice = xstencil.open_sharded(2 * _ds()["T"], {"x": "i"})
    xstencil.write_sharded(twice, tmp_path / "a.zarr", mode="w")
    got = _read_da(tmp_path / "a.zarr")
    np.testing.assert_array_equal(got.values, 2 * _ds()["T"].values)


def test_make_devices_and_public_names():
    import jax

    mesh = xstencil.make_devices({"y": 1, "x": jax.device_count()})
    assert mesh.axis_names == ("y", "x")
    assert str(mesh.axis_types[0]).endswith("Auto")
    for name in ("make_devices", "open_sharded", "write_sharded", "gather", "compile_count",
                 "sharded_hlo"):
        assert name in xstencil.__all__ and getattr(xstencil, name).__module__.startswith(
            "xstencil")
    assert isinstance(xstencil.compile_count(), int)


def test_errors(tmp_path):
    ds = _ds()
    with pytest.raises(XStencilError, match=r"open_sharded\(...\): devices=\{'z': 'i'\}: "
                                            r"dimension 'z' not found"):
        xstencil.open_sharded(ds, {"z": "i"})
    with pytest.raises(XStencilError, match=r"devices=\['x'\] must map dim names"):
        xstencil.open_sharded(ds, ["x"])
    with pytest.raises(XStencilError, match=r"shards two dims over one mesh axis"):
        xstencil.open_sharded(ds, {"x": "i", "y": "i"})
    with pytest.raises(XStencilError, match=r"source=42 must be a path"):
        xstencil.open_sharded(42, {"x": "i"})
    mesh = xstencil.make_devices(("z",))
    with pytest.raises(XStencilError, match=r"has axis 'z', which is not a dim"):
        xstencil.open_sharded(ds, mesh)
    with pytest.raises(XStencilError, match=r"write_sharded\(...\): mode='a' must be 'w-'"):
        xstencil.write_sharded(ds, tmp_path / "x.zarr", mode="a")
    with pytest.raises(XStencilError, match=r"write_sharded\(...\): expected a DataArray"):
        xstencil.write_sharded(np.zeros(3), tmp_path / "x.zarr")
    with pytest.raises(XStencilError, match=r"gather\(...\): expected a DataArray"):
        xstencil.gather(np.zeros(3))


def test_a_failed_write_raises_instead_of_waiting(tmp_path):
    """A failure on process 0 is re-raised after the collective that tells the others."""
    da = xstencil.open_sharded(_ds()["T"], {"x": "i"})
    path = tmp_path / "file.zarr"
    path.write_text("not a store")
    with pytest.raises(FileExistsError, match="File exists"):  # zarr's own, re-raised
        xstencil.write_sharded(da, path, mode="w")
