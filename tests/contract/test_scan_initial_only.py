"""A trajectory that holds only its initial conditions has nothing to scan.

In memory, ``save_every='last'`` used to return the input's last position
unchanged (a scan that computed nothing), while the dask and sharded scans
raised; ``save_every=1`` said "use save_every<=0".  Every backend now raises
the same error (the cross-backend cases ``only-initial-positions*`` compare
them)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from xstencil import XStencilError

MSG = (r"da\.stencil\.scan\(\.\.\.\): the window reaches 1 position\(s\) back along 'time', "
       r"which has 1: the first 1 are the initial conditions, so there is nothing to compute; "
       r".*steps=N")


def _one() -> xr.DataArray:
    return xr.DataArray(np.arange(6.0).reshape(1, 6), dims=("time", "x"))


def step(u):
    return u(time=-1) + u(time=-1, x=1)


@pytest.mark.parametrize("every", [1, 2, "last"])
def test_only_initial_positions_raise_in_memory(every):
    with pytest.raises(XStencilError, match=MSG):
        _one().stencil.scan(step, dim="time", save_every=every, boundary="periodic")


@pytest.mark.parametrize("every", [1, "last"])
def test_only_initial_positions_raise_on_dask(every):
    with pytest.raises(XStencilError, match=MSG):
        _one().chunk({"x": 3}).stencil.scan(step, dim="time", save_every=every,
                                            boundary="periodic")


def test_two_positions_still_scan_with_last():
    """The boundary of the check: one position to compute is a scan."""
    u = xr.DataArray(np.arange(12.0).reshape(2, 6), dims=("time", "x"))
    out = u.stencil.scan(step, dim="time", save_every="last", boundary="periodic")
    x0 = u.values[0]
    np.testing.assert_allclose(out.values, x0 + np.roll(x0, -1))
