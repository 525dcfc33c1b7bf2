"""Bad input to ``scan``: each gets a clear error naming the call, the
argument, the value and the fix."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil import XStencilError


def heat(u):
    return u(time=-1) + 0.2 * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


@pytest.fixture
def da():
    return xr.DataArray(np.linspace(0, 1, 6), dims="x")


@pytest.fixture
def traj():
    return xr.DataArray(np.zeros((4, 6)), dims=("time", "x"),
                        coords={"time": [0.0, 1.0, 2.0, 3.0]})


def test_dim_not_in_data(da):
    with pytest.raises(XStencilError, match=r"scan\(\.\.\.\): dimension 'time' not found; "
                                            r"available dims are \('x',\).*steps=N"):
        da.stencil.scan(heat, dim="time")


def test_dim_must_be_a_name(da):
    with pytest.raises(XStencilError, match=r"dim=3 must be a dim name"):
        da.stencil.scan(heat, dim=3)


def test_read_ahead_when_growing(da):
    with pytest.raises(XStencilError, match=r"reads u at offset >= 0 along 'time'.*"
                                            r"no input there.*u\(time=-1\)"):
        da.stencil.scan(lambda u: u(time=-1) + u(), dim="time", steps=3, boundary="extend")


def test_read_ahead_allowed_on_full_trajectory(traj):
    out = traj.stencil.scan(lambda u: u(time=-1) + u(time=1), dim="time",
                            boundary={"x": "extend", "time": "extend"})
    assert out.sizes["time"] == 4


def test_kernel_without_past_cannot_grow(da):
    with pytest.raises(XStencilError, match=r"reads no earlier position along 'time'"):
        da.stencil.scan(lambda u: u(x=1), dim="time", steps=3, boundary="extend")


def test_steps_with_longer_trajectory(traj):
    with pytest.raises(XStencilError, match=r"steps=5 grows a trajectory.*first 1 "
                                            r"position\(s\).*has 4 position\(s\).*"
                                            r"obj.isel\(time=slice\(0, 1\)\)"):
        traj.stencil.scan(heat, dim="time", steps=5, boundary="periodic")


def test_steps_needs_k_initial_slices(da):
    def wave(u):
        return 2 * u(time=-1) - u(time=-2)

    with pytest.raises(XStencilError, match=r"first 2 position\(s\).*has no 'time'"):
        da.stencil.scan(wave, dim="time", steps=3, boundary="periodic")


@pytest.mark.parametrize("bad", [0, -2])
def test_save_every_not_positive(da, bad):
    with pytest.raises(XStencilError, match=rf"save_every={bad} must be an int >= 1 or 'last'"):
        da.stencil.scan(heat, dim="time", steps=4, save_every=bad)


def test_save_every_larger_than_steps(da):
    with pytest.raises(XStencilError, match=r"save_every=9 is larger than steps=4.*"
                                            r"save_every<=4 or save_every='last'"):
        da.stencil.scan(heat, dim="time", steps=4, save_every=9)


def test_save_every_must_divide_steps(da):
    with pytest.raises(XStencilError, match=r"steps=7 is not a multiple of save_every=3; "
                                            r"use steps=6"):
        da.stencil.scan(heat, dim="time", steps=7, save_every=3)


def test_save_every_wrong_type(da):
    with pytest.raises(XStencilError, match=r"save_every='all' must be an int"):
        da.stencil.scan(heat, dim="time", steps=4, save_every="all")


def test_bad_steps(da):
    with pytest.raises(XStencilError, match=r"steps=0 must be an int >= 1"):
        da.stencil.scan(heat, dim="time", steps=0)


def test_dt_needs_steps(traj):
    with pytest.raises(XStencilError, match=r"dt= and coord= .* need steps=N"):
        traj.stencil.scan(heat, dim="time", dt=0.1)


def test_dt_and_coord(da):
    with pytest.raises(XStencilError, match=r"pass dt= or coord=, not both"):
        da.stencil.scan(heat, dim="time", steps=2, dt=0.1, coord=[0, 1, 2])


def test_coord_wrong_length(da):
    with pytest.raises(XStencilError, match=r"coord= has shape \(2,\); give 4 values"):
        da.stencil.scan(heat, dim="time", steps=3, coord=[0.0, 1.0])


def test_non_monotonic_time_read_by_coord():
    a = xr.DataArray(np.zeros((4, 3)), dims=("time", "x"),
                     coords={"time": [0.0, 2.0, 1.0, 3.0]})

    def forced(u):
        return u(time=-1) + u.coord("time")()

    with pytest.raises(XStencilError, match=r"reads u.coord\('time'\), but coordinate 'time' "
                                            r"does not increase strictly.*sortby"):
        a.stencil.scan(forced, dim="time", boundary="periodic")
    # not read: no error
    a.stencil.scan(lambda u: u(time=-1) + 1.0, dim="time", boundary="periodic")


def test_datetime_time_reads_as_seconds(x64):
    t = np.array(["2020-01-01T00:00", "2020-01-01T00:01", "2020-01-01T00:03"],
                 dtype="datetime64[ns]")
    a = xr.DataArray(np.zeros((3, 2)), dims=("time", "x"), coords={"time": t})
    out = a.stencil.scan(lambda u: u.coord("time")() - u.coord("time")(time=-1),
                         dim="time", boundary="periodic")
    np.testing.assert_allclose(out.values[:, 0], [0.0, 60.0, 120.0])


def test_unknown_variable_in_dict():
    ds = xr.Dataset({"u": ("x", np.zeros(4)), "h": ("x", np.ones(4))})
    with pytest.raises(XStencilError, match=r"returned \['v'\], which are not data variables; "
                                            r"available are \('u', 'h'\)"):
        ds.stencil.scan(lambda s: {"u": s["u"](time=-1), "v": s["h"](time=-1)}, dim="time",
                        steps=2, boundary="periodic")


def test_dataset_kernel_returning_a_constant():
    ds = xr.Dataset({"u": (("time", "x"), np.zeros((3, 4))), "b": ("x", np.ones(4))})
    with pytest.raises(XStencilError, match=r"returned \['b'\], which have no dim 'time'"):
        ds.stencil.scan(lambda s: {"u": s["u"](time=-1), "b": s["b"]()}, dim="time",
                        boundary="periodic")


def test_dataset_kernel_must_return_dict():
    ds = xr.Dataset({"u": ("x", np.zeros(4))})
    with pytest.raises(XStencilError, match=r"must return a dict of the variables"):
        ds.stencil.scan(lambda s: s["u"](time=-1), dim="time", steps=2, boundary="periodic")


def test_grown_dataset_must_advance_every_time_variable():
    ds = xr.Dataset({"u": (("time", "x"), np.zeros((1, 4))),
                     "v": (("time", "x"), np.zeros((1, 4)))})
    with pytest.raises(XStencilError, match=r"variables \['v'\] have dim 'time' but the "
                                            r"kernel does not return them"):
        ds.stencil.scan(lambda s: {"u": s["u"](time=-1)}, dim="time", steps=2, dt=1.0,
                        boundary="periodic")


def test_valid_boundary_in_scan(da):
    with pytest.raises(XStencilError, match=r"boundary 'valid' along 'x' would shrink"):
        da.stencil.scan(heat, dim="time", steps=2, boundary="valid")


def test_check_finite_reports_first_position(x64):
    u0 = xr.DataArray(np.ones(4), dims="x")
    with pytest.raises(XStencilError, match=r"check_finite=True: a NaN or Inf first appeared "
                                            r"at position 3 along 'time' \(time=0.3"):
        u0.stencil.scan(lambda u: jnp.where(u.coord("time")() > 0.25, jnp.inf, u(time=-1)),
                        dim="time", steps=5, dt=0.1, boundary="periodic", check_finite=True)
    # off by default: the NaN/Inf is returned
    out = u0.stencil.scan(lambda u: u(time=-1) * jnp.inf, dim="time", steps=2,
                          boundary="periodic")
    assert np.isinf(out.values[-1]).all()


def test_kernel_not_callable(da):
    with pytest.raises(XStencilError, match=r"kernel=3 is not callable"):
        da.stencil.scan(3, dim="time", steps=2)


def test_step_and_kernel(da):
    with pytest.raises(XStencilError, match=r"pass a kernel or step=, not both"):
        xstencil.scan(da, heat, step=lambda s: s, steps=2)


def test_step_needs_steps(da):
    with pytest.raises(XStencilError, match=r"step= grows a trajectory.*pass steps=N"):
        xstencil.scan(da, step=lambda s: s)


def test_step_returning_wrong_thing(da):
    with pytest.raises(XStencilError, match=r"step= returned int; return a DataArray"):
        xstencil.scan(da, step=lambda s: 3, steps=2)


def test_out_of_window_read_raises_index_error(da):
    with pytest.raises(IndexError, match=r"outside the window"):
        da.stencil.scan(lambda u: u(time=-2), dim="time", steps=2, window={"time": (1, 0)})


def test_coord_error_says_how_many_values_when_the_input_has_no_labels():
    """Without a coordinate along dim, "4 values or 4 values for the new ones"
    named the same count twice; the message says why the initial positions
    must be labelled too, and how to pass only the new ones."""
    da = xr.DataArray(np.zeros((1, 4)), dims=("time", "x"))
    with pytest.raises(XStencilError, match=r"shape \(3,\); give 4 values: the 1 initial "
                       r"position\(s\) have no 'time' coordinate.*pass 3 values"):
        da.stencil.scan(lambda u: u(time=-1), dim="time", steps=3, coord=[1.0, 2.0, 3.0])
    labelled = da.assign_coords(time=[0.0])
    with pytest.raises(XStencilError, match=r"give 4 values .* or 3 values for the new"):
        labelled.stencil.scan(lambda u: u(time=-1), dim="time", steps=3, coord=[1.0, 2.0])
    out = labelled.stencil.scan(lambda u: u(time=-1), dim="time", steps=3,
                                coord=[1.0, 2.0, 3.0])
    np.testing.assert_array_equal(out.time.values, [0.0, 1.0, 2.0, 3.0])
