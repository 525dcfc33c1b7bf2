"""Staggered kernels against xgcm 0.10.1 as the oracle (float64, 1e-12), on
periodic, fill and extend axes: vorticity at corners, divergence at centres,
``interp(h) * u`` fluxes, kinetic energy at centres, a tracer Laplacian with
non-uniform spacing (metrics), and the round trip of results into xgcm."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers .stencil

xgcm = pytest.importorskip("xgcm")

PADDINGS = ["periodic", "fill", "extend"]
COORDS = {"X": {"center": "x_c", "left": "x_g"}, "Y": {"center": "y_c", "left": "y_g"}}


def c_grid(nx: int = 7, ny: int = 6, seed: int = 0) -> xr.Dataset:
    """A C-grid Dataset on a non-uniform mesh: u on x faces, v on y faces,
    h and c at centres, with the MITgcm-style metrics (dxC between centres at
    the faces, dxF across the cell at the centres)."""
    rng = np.random.default_rng(seed)
    xg = np.concatenate([[0.0], np.cumsum(rng.uniform(0.5, 1.5, nx))])  # nx + 1 faces
    yg = np.concatenate([[0.0], np.cumsum(rng.uniform(0.5, 1.5, ny))])
    xc, yc = (xg[1:] + xg[:-1]) / 2, (yg[1:] + yg[:-1]) / 2
    lx, ly = xg[-1], yg[-1]
    dxc = xc - np.concatenate([[xc[-1] - lx], xc[:-1]])  # periodic distance to the left centre
    dyc = yc - np.concatenate([[yc[-1] - ly], yc[:-1]])
    ds = xr.Dataset(
        {"u": (("y_c", "x_g"), rng.standard_normal((ny, nx))),
         "v": (("y_g", "x_c"), rng.standard_normal((ny, nx))),
         "h": (("y_c", "x_c"), 1 + 0.1 * rng.standard_normal((ny, nx))),
         "c": (("y_c", "x_c"), rng.standard_normal((ny, nx)))},
        coords={"x_c": xc, "x_g": xg[:-1], "y_c": yc, "y_g": yg[:-1],
                "dxC": ("x_g", dxc), "dxF": ("x_c", np.diff(xg)),
                "dyC": ("y_g", dyc), "dyF": ("y_c", np.diff(yg))},
        attrs={"title": "c-grid"})
    ds["u"].attrs["units"] = "m/s"
    return ds


def grid(ds: xr.Dataset, padding: str) -> object:
    return xgcm.Grid(ds, coords=COORDS, padding=padding, autoparse_metadata=False,
                     metrics={("X",): ["dxC", "dxF"], ("Y",): ["dyC", "dyF"]})


def close(a: xr.DataArray, b: xr.DataArray) -> None:
    assert set(a.dims) == set(b.dims)
    np.testing.assert_allclose(np.asarray(a.transpose(*b.dims).values), b.values,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("padding", PADDINGS)
def test_vorticity_at_corners(x64: None, padding: str) -> None:
    ds = c_grid()
    g = grid(ds, padding)
    out = ds.stencil.map(lambda s: s.v(X=0.5) - s.v(X=-0.5) - s.u(Y=0.5) + s.u(Y=-0.5),
                         grid=g, at={"X": "left", "Y": "left"})
    ref = g.diff(ds.v, "X") - g.diff(ds.u, "Y")
    close(out, ref)
    assert set(out.dims) == {"y_g", "x_g"}
    np.testing.assert_array_equal(out["x_g"].values, ds["x_g"].values)
    assert out.dtype == np.float64


@pytest.mark.parametrize("padding", PADDINGS)
def test_divergence_at_centres(x64: None, padding: str) -> None:
    ds = c_grid()
    g = grid(ds, padding)
    out = ds.stencil.map(lambda s: s.u(X=0.5) - s.u(X=-0.5) + s.v(Y=0.5) - s.v(Y=-0.5),
                         grid=g, at={"X": "center", "Y": "center"})
    close(out, g.diff(ds.u, "X") + g.diff(ds.v, "Y"))


@pytest.mark.parametrize("padding", PADDINGS)
def test_flux_interp_h_times_u(x64: None, padding: str) -> None:
    ds = c_grid()
    g = grid(ds, padding)
    out = ds.stencil.map(lambda s: 0.5 * (s.h(X=-0.5) + s.h(X=0.5)) * s.u(),
                         grid=g, at={"X": "left", "Y": "center"})
    close(out, g.interp(ds.h, "X") * ds.u)
    # the same from the DataArray alone: at= names only the axis that moves
    hu = ds.h.stencil.map(lambda h: 0.5 * (h(X=-0.5) + h(X=0.5)), grid=g, at={"X": "left"})
    close(hu * ds.u, g.interp(ds.h, "X") * ds.u)
    assert hu.name == "h"


@pytest.mark.parametrize("padding", PADDINGS)
def test_kinetic_energy_at_centres(x64: None, padding: str) -> None:
    ds = c_grid()
    g = grid(ds, padding)
    out = ds.stencil.map(
        lambda s: 0.25 * (s.u(X=-0.5) ** 2 + s.u(X=0.5) ** 2 + s.v(Y=-0.5) ** 2
                          + s.v(Y=0.5) ** 2),
        grid=g, at={"X": "center", "Y": "center"})
    close(out, 0.5 * (g.interp(ds.u ** 2, "X") + g.interp(ds.v ** 2, "Y")))


def laplacian(edge_x: str | None = None, edge_y: str | None = None):
    """The flux-form Laplacian of ``c`` with metrics.  ``edge_*`` gives the
    face flux beyond the last cell as xgcm pads its intermediate flux there:
    ``"fill"`` (0) or ``"extend"`` (the last interior face's flux)."""

    def lap(s):
        dx, dy = s.metric("X"), s.metric("Y")

        def fx(r):  # the x flux at a face, r = +-0.5 cells from the centre
            return (s.c(X=r + 0.5) - s.c(X=r - 0.5)) / dx(X=r)

        def fy(r):
            return (s.c(Y=r + 0.5) - s.c(Y=r - 0.5)) / dy(Y=r)

        east = {None: fx, "fill": lambda r: 0.0, "extend": lambda r: fx(-0.5)}[edge_x](0.5)
        north = {None: fy, "fill": lambda r: 0.0, "extend": lambda r: fy(-0.5)}[edge_y](0.5)
        return (east - fx(-0.5)) / dx() + (north - fy(-0.5)) / dy()

    return lap


@pytest.mark.parametrize("padding", PADDINGS)
def test_laplacian_nonuniform_metrics(x64: None, padding: str) -> None:
    """Periodic: one map.  Fill and extend: xgcm pads the intermediate face
    flux, not the tracer, at the far edge; a mesh writes that edge flux."""
    ds = c_grid()
    g = grid(ds, padding)
    at = {"X": "center", "Y": "center"}
    if padding == "periodic":
        out = ds.stencil.map(laplacian(), grid=g, at=at)
    else:
        m = ds.stencil.mesh(grid=g, at=at)
        m[...] = laplacian()
        m[{"X": -1}] = laplacian(edge_x=padding)
        m[{"Y": -1}] = laplacian(edge_y=padding)
        m[{"X": -1, "Y": -1}] = laplacian(padding, padding)
        out = m.map()
    ref = (g.diff(g.diff(ds.c, "X") / ds.dxC, "X") / ds.dxF
           + g.diff(g.diff(ds.c, "Y") / ds.dyC, "Y") / ds.dyF)
    close(out, ref)


def _x_row(out: xr.DataArray) -> xr.DataArray:
    """The x_g row of a result that may keep only the dims it varies on."""
    assert out.dims[-1] == "x_g", out.dims
    return out.isel({d: 0 for d in out.dims if d != "x_g"})


@pytest.mark.parametrize("padding", ["fill", "extend"])
def test_coord_differences_match_metrics(x64: None, padding: str) -> None:
    """``u.coord("X")`` reads the coordinate of the variable's own points:
    centre-to-centre distances at the interior faces equal dxC."""
    ds = c_grid()
    g = grid(ds, padding)
    out = ds.stencil.map(lambda s: s.c.coord("X")(X=0.5) - s.c.coord("X")(X=-0.5),
                         grid=g, at={"X": "left", "Y": "center"})
    np.testing.assert_allclose(_x_row(out).isel(x_g=slice(1, None)).values,
                               ds.dxC.values[1:], rtol=1e-12)


def test_periodic_coord_continues_by_one_period(x64: None) -> None:
    ds = c_grid()
    g = grid(ds, "periodic")
    lx = float(ds.dxF.sum())
    out = ds.stencil.map(lambda s: s.c.coord("X")(X=0.5) - s.c.coord("X")(X=-0.5),
                         grid=g, at={"X": "left", "Y": "center"}, period={"X": lx})
    np.testing.assert_allclose(_x_row(out).values, ds.dxC.values, rtol=1e-12)


def test_result_feeds_back_into_xgcm(x64: None) -> None:
    ds = c_grid()
    g = grid(ds, "periodic")
    zeta = ds.stencil.map(lambda s: s.v(X=0.5) - s.v(X=-0.5) - s.u(Y=0.5) + s.u(Y=-0.5),
                          grid=g, at={"X": "left", "Y": "left"})
    back = g.interp(g.interp(zeta, "X"), "Y")  # no renaming needed
    assert set(back.dims) == {"y_c", "x_c"}
    ref = g.interp(g.interp(g.diff(ds.v, "X") - g.diff(ds.u, "Y"), "X"), "Y")
    close(back, ref)


def test_attrs_and_dataset_outputs(x64: None) -> None:
    ds = c_grid()
    g = grid(ds, "periodic")
    out = ds.stencil.map(lambda s: {"u": 2 * s.u(), "hu": 0.5 * (s.h(X=-0.5) + s.h(X=0.5))},
                         grid=g, at={"X": "left", "Y": "center"}, new_vars=("hu",))
    assert out["u"].attrs == {"units": "m/s"}
    assert out.attrs == ds.attrs
    assert out["hu"].dims == ("y_c", "x_g")
    close(out["hu"], g.interp(ds.h, "X"))
    xr.testing.assert_identical(out["v"], ds["v"])  # untouched inputs stay where they were
    assert not [n for n in out.variables if str(n).startswith("__xs_")]
    close(out["u"], 2 * ds.u)


def test_grid_without_padding_needs_boundary(x64: None) -> None:
    ds = c_grid()
    g = xgcm.Grid(ds, coords=COORDS, autoparse_metadata=False)
    with pytest.raises(xstencil.XStencilError, match="axis 'X' has no padding"):
        ds.stencil.map(lambda s: s.u(X=0.5) - s.u(X=-0.5), grid=g, at={"X": "center",
                                                                      "Y": "center"})
    out = ds[["u"]].stencil.map(lambda s: s.u(X=0.5) - s.u(X=-0.5), grid=g,
                                at={"X": "center"},
                                boundary={"X": "periodic", "Y": "fill"})
    g2 = grid(ds, "periodic")
    close(out, g2.diff(ds.u, "X"))


def test_fill_value_comes_from_the_grid(x64: None) -> None:
    ds = c_grid()
    with pytest.warns(DeprecationWarning, match="fill_value"):  # xgcm's own notice
        g = xgcm.Grid(ds, coords=COORDS, padding="fill", fill_value=2.5,
                      autoparse_metadata=False)
    out = ds.stencil.map(lambda s: s.u(X=0.5) - s.u(X=-0.5) + s.v(Y=0.5) - s.v(Y=-0.5),
                         grid=g, at={"X": "center", "Y": "center"})
    close(out, g.diff(ds.u, "X") + g.diff(ds.v, "Y"))
    assert out.isel(x_c=-1, y_c=0).item() == pytest.approx(
        2.5 - ds.u.values[0, -1] + ds.v.values[1, -1] - ds.v.values[0, -1])
