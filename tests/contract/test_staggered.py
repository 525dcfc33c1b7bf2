"""Staggered grids without xgcm: grids as mappings and COMODO attributes,
reads in cells, the errors, meshes and scans on C-grids, a forward-backward
shallow-water model against hand-written numpy (1000 steps, mass to
round-off) and jax.grad through it against finite differences."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil

GRID = {"X": {"center": "x_c", "left": "x_g"}, "Y": {"center": "y_c", "left": "y_g"}}
CENTRE = {"X": "center", "Y": "center"}
U_AT = {"X": "left", "Y": "center"}
V_AT = {"X": "center", "Y": "left"}


def c_grid(nx: int = 16, ny: int = 8, seed: int = 0, dtype: type = np.float64) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    return xr.Dataset(
        {"u": (("y_c", "x_g"), rng.standard_normal((ny, nx)).astype(dtype)),
         "v": (("y_g", "x_c"), rng.standard_normal((ny, nx)).astype(dtype)),
         "h": (("y_c", "x_c"), (1 + 0.1 * rng.standard_normal((ny, nx))).astype(dtype))},
        coords={"x_c": np.arange(nx) + 0.5, "x_g": np.arange(nx) * 1.0,
                "y_c": np.arange(ny) + 0.5, "y_g": np.arange(ny) * 1.0})


def comodo(ds: xr.Dataset) -> xr.Dataset:
    ds = ds.copy()
    for d, axis, shift in (("x_c", "X", None), ("x_g", "X", -0.5), ("y_c", "Y", None),
                           ("y_g", "Y", -0.5)):
        ds[d].attrs = {"axis": axis} | ({} if shift is None else {"c_grid_axis_shift": shift})
    return ds


def divergence(s):
    return s.u(X=0.5) - s.u(X=-0.5) + s.v(Y=0.5) - s.v(Y=-0.5)


def divergence_numpy(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Periodic in x, zero beyond the top in y (xgcm's 'fill')."""
    vn = np.vstack([v[1:], np.zeros((1, v.shape[1]))])
    return np.roll(u, -1, 1) - u + vn - v


# -- grids and reads -----------------------------------------------------------------------

@pytest.mark.parametrize("how", ["mapping", "comodo", "at-only"])
def test_grid_sources_agree(how: str) -> None:
    ds = c_grid()
    bnd = {"X": "periodic", "Y": "fill"}
    if how == "mapping":
        out = ds.stencil.map(divergence, grid=GRID, at=CENTRE, boundary=bnd)
    elif how == "comodo":
        out = comodo(ds).stencil.map(divergence, grid="comodo", at=CENTRE, boundary=bnd)
    else:  # at= alone reads the COMODO attributes
        out = comodo(ds).stencil.map(divergence, at=CENTRE, boundary=bnd)
    assert out.dims == ("y_c", "x_c")
    np.testing.assert_allclose(out.values, divergence_numpy(ds.u.values, ds.v.values),
                               rtol=1e-6)


def test_at_omitted_when_inputs_share_a_position() -> None:
    ds = c_grid()[["u"]]
    out = ds.stencil.map(lambda s: s.u(X=1) - s.u(X=-1), grid=GRID, boundary="periodic")
    assert out.dims == ("y_c", "x_g")
    np.testing.assert_allclose(out.values, np.roll(ds.u.values, -1, 1)
                               - np.roll(ds.u.values, 1, 1), rtol=1e-6)


def test_at_accepts_dim_names() -> None:
    ds = c_grid()
    a = ds.stencil.map(divergence, grid=GRID, at={"X": "x_c", "Y": "y_c"}, boundary="periodic")
    b = ds.stencil.map(divergence, grid=GRID, at=CENTRE, boundary="periodic")
    xr.testing.assert_identical(a, b)


def test_float32_stays_float32() -> None:
    ds = c_grid(dtype=np.float32)
    out = ds.stencil.map(divergence, grid=GRID, at=CENTRE, boundary="periodic")
    assert out.dtype == np.float32


def test_repeated_calls_trace_once() -> None:
    ds = c_grid()
    traces = []

    def k(s):
        traces.append(1)
        return divergence(s)

    ds.stencil.map(k, grid=GRID, at=CENTRE, boundary="periodic")
    first = len(traces)
    ds.stencil.map(k, grid=GRID, at=CENTRE, boundary="periodic")
    assert len(traces) == first


def test_input_not_mutated() -> None:
    ds = c_grid()
    before = ds.copy(deep=True)
    ds.stencil.map(divergence, grid=GRID, at=CENTRE, boundary="periodic")
    xr.testing.assert_identical(ds, before)


# -- errors ------------------------------------------------------------------------------

@pytest.mark.parametrize(("kernel", "match"), [
    (lambda s: s.u(X=0.5), r"s\['u'\]\(X=0.5\).*falls between its points.*0, ±1"),
    (lambda s: s.h(X=1), r"s\['h'\]\(X=1\).*output is at 'left'.*±0.5, ±1.5"),
    (lambda s: s.h(), r"s\['h'\]\(X=0\).*falls between its points"),
    (lambda s: s.u(x_g=1), r"'x_g' is a dim of grid axis 'X'.*s\['u'\]\(X=0.5\)"),
    (lambda s: s.u(X="a"), r"offsets are numbers of cells"),
])
def test_reads_that_do_not_land_raise(kernel, match: str) -> None:
    ds = c_grid()[["u", "h"]]
    with pytest.raises(xstencil.XStencilError, match=match):
        ds.stencil.map(kernel, grid=GRID, at=U_AT, boundary="periodic")


@pytest.mark.parametrize(("kw", "match"), [
    ({"at": None}, r"different positions along axis 'X'.*pass at="),
    ({"at": {"Z": "center"}}, r"'Z' is not a grid axis"),
    ({"at": {"X": "right"}}, r"axis 'X' has positions .*not 'right'"),
    ({"at": ["X"]}, r"at=\['X'\] must map axis names to positions"),
    ({"boundary": {"x_g": "periodic"}}, r"'x_g' is a dim of axis 'X'; key it by the axis"),
    ({"boundary": "valid"}, r"boundary 'valid' along axis"),
    ({"grid": 3}, r"grid=3 is not a grid"),
    ({"grid": {"X": {"middle": "x_c"}}}, r"position 'middle' is not one of"),
    ({"grid": {"X": {"center": "nope"}}}, r"no data variable has a dim of the grid \['nope'\]"),
    ({"grid": {"X": {"left": "x_g"}}}, r"grid axis 'X' has no 'center' dim"),
])
def test_bad_options_raise(kw: dict, match: str) -> None:
    ds = c_grid()
    opts = {"grid": GRID, "at": CENTRE, "boundary": "periodic"} | kw
    if opts["at"] is None:
        del opts["at"]
    with pytest.raises(xstencil.XStencilError, match=match):
        ds.stencil.map(divergence, **opts)


def test_missing_padding_raises() -> None:
    with pytest.raises(xstencil.XStencilError, match=r"axis 'X' has no padding.*boundary="):
        c_grid().stencil.map(divergence, grid=GRID, at=CENTRE)


def test_outer_position_raises() -> None:
    ds = c_grid().assign_coords(x_o=np.arange(17.0))
    ds["psi"] = ("x_o", np.arange(17.0))
    grid = {"X": {"center": "x_c", "left": "x_g", "outer": "x_o"},
            "Y": GRID["Y"]}
    with pytest.raises(xstencil.XStencilError, match=r"'psi' is at the 'outer' position"):
        ds.stencil.map(divergence, grid=grid, at=CENTRE, boundary="periodic")


def test_scan_step_with_grid_raises() -> None:
    with pytest.raises(xstencil.XStencilError, match=r"grid= goes to the maps inside step="):
        c_grid().stencil.scan(step=lambda s: s, steps=2, grid=GRID)


# -- meshes -------------------------------------------------------------------------------

def test_mesh_regions_by_label_position_and_axis_name() -> None:
    ds = c_grid()
    m = ds.stencil.mesh(grid=GRID, at=V_AT, boundary={"X": "periodic", "Y": "fill"})
    m[...] = lambda s: s.h(Y=0.5) - s.h(Y=-0.5)
    m.loc[{"y_g": 0.0}] = lambda s: 0.0  # the southern wall, by coordinate label
    m[{"X": 0}] = lambda s: -1.0  # by position along an axis name
    out = m.map()
    h = ds.h.values
    ref = h - np.vstack([np.zeros((1, h.shape[1])), h[:-1]])
    ref[0] = 0.0
    ref[:, 0] = -1.0
    assert out.dims == ("y_g", "x_c")
    np.testing.assert_allclose(out.values, ref, rtol=1e-6)


# -- shallow water -----------------------------------------------------------------------

DT, GRAV, DX = 0.05, 9.81, 1.0
WALLS = {"X": "periodic", "Y": "fill"}  # a periodic channel between walls in y


def continuity(s):
    """h at the next step, flux form: h at faces by averaging."""
    fe = 0.5 * (s.h() + s.h(X=1)) * s.u(X=0.5)
    fw = 0.5 * (s.h() + s.h(X=-1)) * s.u(X=-0.5)
    fn = 0.5 * (s.h() + s.h(Y=1)) * s.v(Y=0.5)
    fs = 0.5 * (s.h() + s.h(Y=-1)) * s.v(Y=-0.5)
    return s.h() - DT * (fe - fw + fn - fs) / DX


def forward_backward(state: xr.Dataset) -> xr.Dataset:
    """One step: h forward, then u and v from the new h; v = 0 on the
    southern wall (y_g = 0), and beyond the northern one by the fill."""
    state = state.assign(h=state.stencil.map(continuity, grid=GRID, at=CENTRE,
                                             boundary=WALLS))
    u = state.stencil.map(lambda s: s.u() - DT * GRAV * (s.h(X=0.5) - s.h(X=-0.5)) / DX,
                          grid=GRID, at=U_AT, boundary=WALLS)
    m = state.stencil.mesh(grid=GRID, at=V_AT, boundary=WALLS)
    m[...] = lambda s: s.v() - DT * GRAV * (s.h(Y=0.5) - s.h(Y=-0.5)) / DX
    m.loc[{"y_g": 0.0}] = lambda s: 0.0
    return state.assign(u=u, v=m.map())


def forward_backward_numpy(u: np.ndarray, v: np.ndarray, h: np.ndarray, steps: int
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    zero = np.zeros((1, h.shape[1]))
    for _ in range(steps):
        fu = 0.5 * (h + np.roll(h, 1, 1)) * u  # at x faces: between cells i-1 and i
        fv = 0.5 * (h + np.vstack([zero, h[:-1]])) * v  # at y faces, zero below the wall
        h = h - DT * (np.roll(fu, -1, 1) - fu + np.vstack([fv[1:], zero]) - fv) / DX
        u = u - DT * GRAV * (h - np.roll(h, 1, 1)) / DX
        v = v - DT * GRAV * (h - np.vstack([zero, h[:-1]])) / DX
        v[0] = 0.0
    return u, v, h


def bump(nx: int = 24, ny: int = 12) -> xr.Dataset:
    ds = c_grid(nx, ny)
    x, y = np.meshgrid(ds.x_c.values, ds.y_c.values)
    h = 1 + 0.1 * np.exp(-((x - nx / 3) ** 2 + (y - ny / 2) ** 2) / 6)
    return ds.assign(u=0 * ds.u, v=0 * ds.v, h=(("y_c", "x_c"), h))


@pytest.mark.slow
def test_shallow_water_matches_numpy_and_conserves_mass(x64: None) -> None:
    ds = bump()
    out = ds.stencil.scan(step=forward_backward, steps=1000, save_every=100)
    u, v, h = forward_backward_numpy(ds.u.values, ds.v.values, ds.h.values, 1000)
    final = out.isel(time=-1)
    np.testing.assert_allclose(final.h.values, h, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(final.u.values, u, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(final.v.values, v, rtol=1e-10, atol=1e-12)
    assert np.abs(final.v.values).max() > 1e-3  # something moved
    mass = out.h.sum(("y_c", "x_c")).values
    np.testing.assert_allclose(mass, mass[0], rtol=1e-14, atol=0)
    assert (out.u.dims, out.v.dims, out.h.dims) == (
        ("time", "y_c", "x_g"), ("time", "y_g", "x_c"), ("time", "y_c", "x_c"))
    assert (out.v.isel(y_g=0) == 0).all()


def h_next(s, x: float = 0, y: float = 0):
    """h at the next step, at (x, y) cells from the output point, from the
    previous step's values (so u and v can use it inside one scan step)."""
    h = lambda a, b: s.h(time=-1, X=x + a, Y=y + b)  # noqa: E731
    fe = 0.5 * (h(0, 0) + h(1, 0)) * s.u(time=-1, X=x + 0.5, Y=y)
    fw = 0.5 * (h(0, 0) + h(-1, 0)) * s.u(time=-1, X=x - 0.5, Y=y)
    fn = 0.5 * (h(0, 0) + h(0, 1)) * s.v(time=-1, X=x, Y=y + 0.5)
    fs = 0.5 * (h(0, 0) + h(0, -1)) * s.v(time=-1, X=x, Y=y - 0.5)
    return h(0, 0) - DT * (fe - fw + fn - fs) / DX


KERNELS = {
    "h": h_next,
    "u": lambda s: s.u(time=-1) - DT * GRAV * (h_next(s, x=0.5) - h_next(s, x=-0.5)) / DX,
    "v": lambda s: s.v(time=-1) - DT * GRAV * (h_next(s, y=0.5) - h_next(s, y=-0.5)) / DX,
}


def test_scan_one_kernel_per_position_matches_numpy(x64: None) -> None:
    """A scan with {name: kernel}: each variable advanced at its own position
    (doubly periodic, so numpy's rolls are the reference)."""
    ds = bump()
    out = ds.stencil.scan(KERNELS, dim="time", steps=100, grid=GRID, boundary="periodic",
                          save_every="last")
    u, v, h = ds.u.values, ds.v.values, ds.h.values
    for _ in range(100):
        fu = 0.5 * (h + np.roll(h, 1, 1)) * u
        fv = 0.5 * (h + np.roll(h, 1, 0)) * v
        h = h - DT * (np.roll(fu, -1, 1) - fu + np.roll(fv, -1, 0) - fv) / DX
        u = u - DT * GRAV * (h - np.roll(h, 1, 1)) / DX
        v = v - DT * GRAV * (h - np.roll(h, 1, 0)) / DX
    np.testing.assert_allclose(out.h.values, h, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.u.values, u, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out.v.values, v, rtol=1e-10, atol=1e-12)
    assert out.u.dims == ("y_c", "x_g") and out.v.dims == ("y_g", "x_c")
    np.testing.assert_allclose(out.h.sum().item(), ds.h.sum().item(), rtol=1e-14)


def test_scan_one_position_tracer_advection(x64: None) -> None:
    """One kernel, output at the centres: a tracer advected by a fixed u on
    the x faces (a constant of the scan, at its own position)."""
    ds = c_grid()[["u", "h"]]
    ds = ds.assign(u=ds.u * 0 + 0.5 + 0.1 * ds.u)
    dt = 0.2

    def upwind(s):
        fe = s.u(X=0.5) * s.h(time=-1)  # u > 0: the flux carries the upwind cell
        fw = s.u(X=-0.5) * s.h(time=-1, X=-1)
        return {"h": s.h(time=-1) - dt * (fe - fw)}

    out = ds.stencil.scan(upwind, dim="time", steps=30, grid=GRID, at=CENTRE,
                          boundary="periodic", save_every="last")
    u, h = ds.u.values, ds.h.values
    for _ in range(30):
        f = u * np.roll(h, 1, 1)  # at face i: from cell i-1
        h = h - dt * (np.roll(f, -1, 1) - f)
    np.testing.assert_allclose(out.h.values, h, rtol=1e-12)
    xr.testing.assert_identical(out.u.drop_vars("time"), ds.u)  # a constant, where it was


def test_grad_through_shallow_water_matches_finite_differences(x64: None) -> None:
    ds = bump(12, 8)
    weight = np.asarray(ds.y_c.values)[:, None] * np.ones(ds.h.shape)

    def loss(h0):
        out = ds.assign(h=(("y_c", "x_c"), h0)).stencil.scan(
            step=forward_backward, steps=15, save_every="last")
        return jnp.sum(out.h.data ** 2 * weight) + jnp.sum(out.v.data ** 2)

    h0 = jnp.asarray(ds.h.values)
    grad = jax.grad(loss)(h0)
    rng = np.random.default_rng(3)
    for _ in range(3):
        d = rng.standard_normal(h0.shape)
        eps = 1e-6
        fd = (loss(h0 + eps * d) - loss(h0 - eps * d)) / (2 * eps)
        np.testing.assert_allclose(float(jnp.sum(grad * d)), float(fd), rtol=1e-6)


def test_coord_at_the_output_and_of_a_variable() -> None:
    """``s.coord("X")`` is the output position's coordinate; ``s.u.coord("X")``
    is u's own (x_g), half a cell off at a centre output."""
    ds = c_grid()
    out = ds.stencil.map(lambda s: {"here": s.coord("X")(), "east": s.u.coord("X")(X=0.5),
                                    "west": s.u.coord("X")(X=-0.5)},
                         grid=GRID, at=CENTRE, boundary="periodic",
                         new_vars=("here", "east", "west"))  # new names are declared
    x_c = ds.x_c.values

    def row(v: xr.DataArray) -> np.ndarray:  # the result may keep only the dims it varies on
        assert v.dims[-1] == "x_c", v.dims
        return v.isel({d: 0 for d in v.dims if d != "x_c"}).values

    np.testing.assert_allclose(row(out.here), x_c)
    np.testing.assert_allclose(row(out.east), x_c + 0.5)  # across the seam: + period
    np.testing.assert_allclose(row(out.west), x_c - 0.5)


def test_mesh_scan_inflow_by_label(x64: None) -> None:
    """A grid mesh scanned along time: upwind advection at the centres by a
    constant u on the faces, with the first column held by coordinate label."""
    ds = c_grid()[["u", "h"]]
    ds = ds.assign(u=0 * ds.u + 0.5)
    m = ds.stencil.mesh(grid=GRID, at=CENTRE, boundary={"X": "extend", "Y": "periodic"})
    m[...] = lambda s: {"h": s.h(time=-1) - 0.4 * (s.u(X=0.5) * s.h(time=-1)
                                                   - s.u(X=-0.5) * s.h(time=-1, X=-1))}
    m.loc[{"x_c": 0.5}] = lambda s: {"h": 2.0}
    out = m.scan("time", steps=10, save_every="last")
    h = ds.h.values.copy()
    for _ in range(10):
        new = h - 0.4 * 0.5 * (h - np.concatenate([h[:, :1], h[:, :-1]], axis=1))
        new[:, 0] = 2.0
        h = new
    assert out.h.dims == ("y_c", "x_c")
    np.testing.assert_allclose(out.h.values, h, rtol=1e-12)


def test_scan_output_moved_off_its_position_raises() -> None:
    ds = c_grid()[["u", "h"]]
    with pytest.raises(xstencil.XStencilError, match=r"advances 'u', which is at .*'left'"):
        ds.stencil.scan(lambda s: {"u": s.u(time=-1, X=0.5)}, dim="time", steps=2, grid=GRID,
                        at=CENTRE, boundary="periodic")
