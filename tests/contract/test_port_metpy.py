"""MetPy calculations ported to xstencil kernels, checked against ``metpy.calc``.

The kernels are written as an atmospheric scientist would port MetPy's lat/lon
kinematics: MetPy's three-point non-uniform first derivative (Bowen 2005) read
by dim name, grid spacing from ``u.coord("lat")`` / ``u.coord("lon")`` on a
sphere, and MetPy's map-factor corrections (parallel scale ``1/cos(lat)``,
meridional scale 1), whose latitude derivative MetPy also takes numerically.

MetPy is given a spherical CRS (``earth_radius=R``) so that both sides use the
same Earth; with the default WGS84 ellipsoid MetPy's ``dy`` differs from
``R * dlat`` by up to ~0.5 %.

Data: a Rossby-Haurwitz-like wave on solid-body rotation, a temperature front,
geopotential; dims ``(time, level, lat, lon)``, ``datetime64`` times, Gaussian
latitudes running north to south (as ERA5 orders them), longitudes 0..357.5
periodic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xstencil  # noqa: F401  (registers the .stencil accessor)

mpcalc = pytest.importorskip("metpy.calc")
mpconsts = pytest.importorskip("metpy.constants")

R = 6371229.0
DEG = np.pi / 180
G = float(mpconsts.g.m_as("m/s^2"))
OMEGA = float(mpconsts.omega.m_as("1/s"))
B = {"lon": "periodic", "lat": "fill"}


# ---------------------------------------------------------------- data


def _gauss_lat(n: int) -> np.ndarray:
    x, _ = np.polynomial.legendre.leggauss(n)
    return np.degrees(np.arcsin(x))[::-1]  # north to south, non-uniform


def make_ds(nlat=32, dlon=5.0, nt=2, levels=(850.0, 500.0), dtype=np.float64, lat=None):
    lat = _gauss_lat(nlat) if lat is None else np.asarray(lat)
    lon = np.arange(0, 360, dlon)
    time = pd.date_range("2024-01-01", periods=nt, freq="6h").values
    lev = np.asarray(levels)
    LAT, LON = np.meshgrid(lat * DEG, lon * DEG, indexing="ij")
    n = 4
    out = {k: np.empty((nt, len(lev), len(lat), len(lon))) for k in ("u", "v", "T", "Z")}
    for it in range(nt):
        for ik in range(len(lev)):
            ph = 0.1 * it + 0.3 * ik
            c, s = np.cos(LAT), np.sin(LAT)
            out["u"][it, ik] = 20 * c + 8 * c ** (n - 1) * (n * s**2 - c**2) * np.cos(n * LON + ph)
            out["v"][it, ik] = -8 * n * c ** (n - 1) * s * np.sin(n * LON + ph)
            out["T"][it, ik] = (280 - 40 * s**2 + 10 * np.tanh((LAT - 0.7) / 0.1) * np.cos(LON + ph)
                                - 20 * ik)
            out["Z"][it, ik] = 5500 + 300 * c**2 + 50 * c**n * s * np.cos(n * LON + ph) + 1000 * ik
    units = {"u": "m/s", "v": "m/s", "T": "K", "Z": "m"}
    dims = ("time", "level", "lat", "lon")
    coords = {
        "time": time,
        "level": ("level", lev, {"units": "hPa"}),
        "lat": ("lat", lat, {"units": "degrees_north"}),
        "lon": ("lon", lon, {"units": "degrees_east"}),
    }
    return xr.Dataset({k: (dims, a.astype(dtype), {"units": units[k]}) for k, a in out.items()},
                      coords=coords)


_CRS = {}


def metpy(func, *das, **kw):
    """Call ``metpy.calc.func`` on a spherical Earth, as a float64 DataArray.

    MetPy's xarray path (``ds.metpy.assign_crs(grid_mapping_name="latitude_longitude",
    earth_radius=R)`` then ``func(ds.u, ds.v)``) rebuilds a pyproj CRS from the CF
    attributes on every access, about 0.5 s each on the test machine, so the tests take
    MetPy's documented array path with one prebuilt CRS: the same ``dx``/``dy``
    (``nominal_lat_lon_grid_deltas``) and map factors (``Proj.get_factors``) and, checked
    while writing these tests, bitwise the same results.
    """
    from metpy.units import units
    from pyproj import CRS

    if "crs" not in _CRS:
        _CRS["crs"] = CRS.from_cf({"grid_mapping_name": "latitude_longitude", "earth_radius": R})
    like = das[0]
    args = [units.Quantity(np.asarray(d.transpose(*like.dims).values, dtype=np.float64),
                           d.attrs["units"]) for d in das]
    lat = like["lat"].values
    out = getattr(mpcalc, func)(
        *args, longitude=units.Quantity(like["lon"].values, "degrees"),
        latitude=units.Quantity(lat[:, None] if func == "geostrophic_wind" else lat, "degrees"),
        crs=_CRS["crs"], **kw)
    wrap = lambda q: xr.DataArray(np.asarray(q.m, dtype=np.float64), dims=like.dims,  # noqa: E731
                                  coords=like.coords)
    return tuple(wrap(q) for q in out) if isinstance(out, tuple) else wrap(out)


def interior(a, n=1):
    return a.isel(lat=slice(n, -n), lon=slice(n, -n))


def rel_err(x, ref):
    x = np.asarray(x.transpose(*ref.dims).values, dtype=np.float64)
    ref = np.asarray(ref.values, dtype=np.float64)
    assert np.isfinite(x).all(), "NaN/inf where MetPy has a value"
    return float(np.max(np.abs(x - ref)) / np.max(np.abs(ref)))


# ---------------------------------------------------------------- kernels (public API only)


def d1(w, c, dim, scale, mode="c"):
    """MetPy's first_derivative: centred (c), forward (f) or backward (b), non-uniform."""
    o = lambda k: {dim: k}  # noqa: E731
    if mode == "c":
        a = (c() - c(**o(-1))) * scale
        b = (c(**o(1)) - c()) * scale
        return (-b / ((a + b) * a)) * w(**o(-1)) + ((b - a) / (a * b)) * w() \
            + (a / ((a + b) * b)) * w(**o(1))
    if mode == "f":
        a = (c(**o(1)) - c()) * scale
        b = (c(**o(2)) - c(**o(1))) * scale
        return (-(2 * a + b) / ((a + b) * a)) * w() + ((a + b) / (a * b)) * w(**o(1)) \
            - (a / ((a + b) * b)) * w(**o(2))
    a = (c(**o(-1)) - c(**o(-2))) * scale
    b = (c() - c(**o(-1))) * scale
    return (b / ((a + b) * a)) * w(**o(-2)) - ((a + b) / (a * b)) * w(**o(-1)) \
        + ((a + 2 * b) / ((a + b) * b)) * w()


class Shift:
    """A window read at a fixed extra offset (derivative of a derivative in one kernel)."""

    def __init__(self, w, **off):
        self.w, self.off = w, off

    def __call__(self, **k):
        o = dict(self.off)
        for d, v in k.items():
            o[d] = o.get(d, 0) + v
        return self.w(**o)

    def coord(self, name):
        return Shift(self.w.coord(name), **self.off)


class Derived:
    """A derived field, read like a window."""

    def __init__(self, f):
        self.f = f

    def __call__(self, **o):
        return self.f(**o)


def vec_deriv(u, v, lat, lon, ml="c"):
    """MetPy's vector_derivative on a sphere (map-factor corrected)."""
    p = lambda **k: 1.0 / jnp.cos(lat(**k) * DEG)  # noqa: E731
    pc = p()
    corr = d1(p, lat, "lat", R * DEG, ml) / pc
    dudx = pc * d1(u, lon, "lon", R * DEG) - v() * corr
    dvdx = pc * d1(v, lon, "lon", R * DEG) + u() * corr
    return dudx, d1(u, lat, "lat", R * DEG, ml), dvdx, d1(v, lat, "lat", R * DEG, ml)


def vorticity(s, ml="c"):
    _, dudy, dvdx, _ = vec_deriv(s.u, s.v, s.u.coord("lat"), s.u.coord("lon"), ml)
    return dvdx - dudy


def divergence(s, ml="c"):
    dudx, _, _, dvdy = vec_deriv(s.u, s.v, s.u.coord("lat"), s.u.coord("lon"), ml)
    return dudx + dvdy


def grad(w, lat, lon):
    """MetPy's geospatial_gradient on a sphere."""
    return d1(w, lon, "lon", R * DEG) / jnp.cos(lat() * DEG), d1(w, lat, "lat", R * DEG)


def advection(s):
    tx, ty = grad(s.T, s.T.coord("lat"), s.T.coord("lon"))
    return -(s.u() * tx + s.v() * ty)


def geostrophic(s):
    lat = s.Z.coord("lat")
    f = 2 * OMEGA * jnp.sin(lat() * DEG)
    zx, zy = grad(s.Z, lat, s.Z.coord("lon"))
    return {"ug": -G / f * zy, "vg": G / f * zx}


def laplacian(z):
    """MetPy's geospatial_laplacian = divergence(geospatial_gradient), fused in one kernel."""
    lat, lon = z.coord("lat"), z.coord("lon")
    gx = Derived(lambda **o: grad(Shift(z, **o), Shift(lat, **o), Shift(lon, **o))[0])
    gy = Derived(lambda **o: grad(Shift(z, **o), Shift(lat, **o), Shift(lon, **o))[1])
    dudx, _, _, dvdy = vec_deriv(gx, gy, lat, lon)
    return dudx + dvdy


def frontogenesis(s):
    lat, lon = s.th.coord("lat"), s.th.coord("lon")
    tx, ty = grad(s.th, lat, lon)
    mag = jnp.sqrt(tx**2 + ty**2)
    dudx, dudy, dvdx, dvdy = vec_deriv(s.u, s.v, lat, lon)
    shrd, strd = dvdx + dudy, dudx - dvdy
    psi = 0.5 * jnp.arctan2(shrd, strd)
    safe = jnp.where(mag != 0, mag, 1.0)
    sinb = jnp.where(mag != 0, (tx * jnp.cos(psi) + ty * jnp.sin(psi)) / safe, 0.0)
    return 0.5 * mag * (jnp.sqrt(shrd**2 + strd**2) * (1 - 2 * sinb**2) - (dudx + dvdy))


# ---------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def ds():
    return make_ds()


@pytest.fixture(scope="module")
def ref(ds):
    return {"vort": metpy("vorticity", ds.u, ds.v), "div": metpy("divergence", ds.u, ds.v)}


@pytest.fixture(scope="module")
def fg_ref(ds):
    from metpy.units import units

    theta = mpcalc.potential_temperature(units.Quantity(ds.level.values[:, None, None], "hPa"),
                                         units.Quantity(ds.T.values, "K"))
    theta = ds.T.copy(data=np.asarray(theta.m_as("K"))).assign_attrs(units="K")
    return theta, metpy("frontogenesis", theta, ds.u, ds.v)


@pytest.mark.parametrize("order", ["north_to_south", "south_to_north"])
def test_vorticity_divergence_interior_and_labels(ds, ref, order):
    """Interior points agree with MetPy to float64 accuracy, on Gaussian latitudes in either
    order; float64 stays float64 with x64 off; labels and datetimes survive; lat edges are NaN
    under the default fill, and the periodic lon seam is filled."""
    d, r = ds, ref
    if order == "south_to_north":
        d = ds.isel(lat=slice(None, None, -1))
        r = {k: v.isel(lat=slice(None, None, -1)) for k, v in ref.items()}
    assert not jax.config.jax_enable_x64
    out = d.stencil.map(lambda s: {"vort": vorticity(s), "div": divergence(s)},
                        boundary=B, new_vars=("vort", "div"))
    for k in ("vort", "div"):
        z = out[k]
        assert z.dtype == np.float64
        assert z.dims == ("time", "level", "lat", "lon")
        assert z.time.dtype.kind == "M" and (z.time.values == d.time.values).all()
        np.testing.assert_array_equal(z.lat.values, d.lat.values)
        assert z.level.attrs == {"units": "hPa"}
        # float64: the wave's derivative terms cancel ~4 digits in the vorticity and ~6 in
        # the (nearly zero) divergence; float32 misses these bounds by orders of magnitude
        assert rel_err(interior(z), interior(r[k])) < (1e-10 if k == "vort" else 1e-8)
        # default fill: the first and last latitude rows are NaN, the lon seam is not
        assert np.isnan(z.isel(lat=[0, -1]).values).all()
        assert np.isfinite(z.isel(lat=slice(1, -1), lon=[0, -1]).values).all()


def test_vorticity_all_points_with_metpy_edges(ds, ref):
    """A mesh with MetPy's one-sided second-order formulas on the first/last latitude rows
    reproduces MetPy on every latitude. Across the periodic lon seam xstencil is centred;
    MetPy, which is not periodic, is one-sided there, so compare the seam with MetPy's
    interior value on data rolled so that the seam is inside."""
    m = ds.stencil.mesh(boundary=B)
    m[...] = lambda s: vorticity(s, "c")
    m[{"lat": 0}] = lambda s: vorticity(s, "f")
    m[{"lat": -1}] = lambda s: vorticity(s, "b")
    z = m.map()
    assert z.dtype == np.float64
    cols = slice(1, -1)
    assert rel_err(z.isel(lon=cols), ref["vort"].isel(lon=cols)) < 1e-10
    rolled = ds.roll(lon=ds.sizes["lon"] // 2, roll_coords=True)
    # roll_coords leaves a jump 355 -> 0 in the middle; MetPy's np.diff(lon) would see it,
    # so give MetPy monotonic labels (same spacing)
    rolled = rolled.assign_coords(lon=np.arange(ds.sizes["lon"]) * float(ds.lon[1] - ds.lon[0]))
    r2 = metpy("vorticity", rolled.u, rolled.v)
    n = ds.sizes["lon"] // 2
    seam_ref = r2.isel(lon=[n - 1, n]).assign_coords(lon=ds.lon.values[[-1, 0]])
    assert rel_err(z.isel(lon=[-1, 0]), seam_ref) < 1e-10
    # and MetPy's own (one-sided) seam is measurably different: the comparison can fail
    assert rel_err(ref["vort"].isel(lon=[-1, 0]), seam_ref) > 1e-4


def test_advection_geostrophic_laplacian_float64(ds):
    def adv_geo(s):
        return {"adv": advection(s), **geostrophic(s)}

    out = ds.stencil.map(adv_geo, boundary=B, new_vars=("adv", "ug", "vg"))
    assert set(out.data_vars) == {"adv", "ug", "vg", "u", "v", "T", "Z"}
    assert all(out[k].dtype == np.float64 for k in ("adv", "ug", "vg"))
    assert rel_err(interior(out.adv), interior(metpy("advection", ds.T, ds.u, ds.v))) < 1e-10
    ug, vg = metpy("geostrophic_wind", ds.Z)
    assert rel_err(interior(out.ug), interior(ug)) < 1e-10
    assert rel_err(interior(out.vg), interior(vg)) < 1e-10

    lap = ds.Z.stencil.map(laplacian, boundary=B)  # reads +-2 cells: two NaN rows per edge
    assert lap.name == "Z" and lap.dtype == np.float64
    assert np.isnan(lap.isel(lat=[0, 1, -2, -1]).values).all()
    # a Laplacian of geopotential cancels ~3 digits: 1e-9 of the field's scale
    assert rel_err(interior(lap, 2), interior(metpy("geospatial_laplacian", ds.Z), 2)) < 1e-9


@pytest.mark.parametrize("dtype", ["float32"])
def test_frontogenesis_dtype(ds, fg_ref, dtype):
    """float32 data (as netCDF holds it) stays float32, with float32 accuracy; the potential
    temperature is computed in a kernel from the pressure coordinate."""
    kappa = float(mpconsts.kappa.m_as(""))
    theta, ref = fg_ref
    d = ds.astype(dtype)
    th = d.stencil.map(lambda s: s.T() * (1000.0 / s.T.coord("level")()) ** kappa,
                       window={"level": 1})
    assert th.dtype == dtype
    assert rel_err(th, theta) < (1e-6 if dtype == "float32" else 1e-14)
    fg = d.assign(th=th).stencil.map(frontogenesis, boundary=B)
    assert fg.dtype == dtype
    assert rel_err(interior(fg), interior(ref)) < (1e-3 if dtype == "float32" else 1e-10)


def test_dask_chunks_match_in_memory():
    """Chunked along time and along the periodic lon: lazy, same values, same dtype."""
    pytest.importorskip("dask")
    d = make_ds(nt=3).astype("float32")
    eager = d.stencil.map(vorticity, boundary=B)
    for chunks in ({"time": 1, "lat": 16, "lon": 24},):
        lazy = d.chunk(chunks).stencil.map(vorticity, boundary=B)
        assert type(lazy.data).__module__.startswith("dask")
        got = lazy.compute()
        assert got.dtype == np.float32
        np.testing.assert_array_equal(np.isnan(got.values), np.isnan(eager.values))
        np.testing.assert_allclose(got.values, eager.values, rtol=0, atol=1e-6 * 1e-5)


def test_grad_and_jit_of_vorticity_loss(x64):
    """jax.grad and jax.jit through a labelled vorticity (Dataset as a pytree) equal the
    gradient of the same discretisation written in plain jnp."""
    d = make_ds(nlat=16, dlon=10.0, nt=1, levels=(500.0,))[["u", "v"]]
    lat, lon = jnp.asarray(d.lat.values), jnp.asarray(d.lon.values)
    bnd = {"lon": "periodic", "lat": "valid"}

    def loss(ds_):
        return jnp.sum((ds_.stencil.map(vorticity, boundary=bnd).data * 1e5) ** 2)

    def plain(U, V):
        a = (lat[1:-1] - lat[:-2])[:, None] * R * DEG
        b = (lat[2:] - lat[1:-1])[:, None] * R * DEG

        def dy(f):
            return (-b / ((a + b) * a)) * f[..., :-2, :] + ((b - a) / (a * b)) * f[..., 1:-1, :] \
                + (a / ((a + b) * b)) * f[..., 2:, :]

        dx = (lon[1] - lon[0]) * R * DEG
        p = jnp.broadcast_to((1 / jnp.cos(lat * DEG))[:, None], U.shape[-2:])
        pc = p[1:-1]
        dvdx = (jnp.roll(V, -1, -1) - jnp.roll(V, 1, -1)) / (2 * dx)
        z = pc * dvdx[..., 1:-1, :] + U[..., 1:-1, :] * dy(p) / pc - dy(U)
        return jnp.sum((z * 1e5) ** 2)

    g = jax.jit(jax.grad(loss))(d)  # jit and grad at once: one compile
    gu, gv = jax.jit(jax.grad(plain, argnums=(0, 1)))(jnp.asarray(d.u.values),
                                                      jnp.asarray(d.v.values))
    assert isinstance(g, xr.Dataset) and g.u.dtype == np.float64 and g.u.dims == d.u.dims
    assert g.time.dtype.kind == "M"
    np.testing.assert_allclose(np.asarray(g.u.values), np.asarray(gu), rtol=1e-9,
                               atol=1e-9 * float(jnp.max(jnp.abs(gu))))
    np.testing.assert_allclose(np.asarray(g.v.values), np.asarray(gv), rtol=1e-9,
                               atol=1e-9 * float(jnp.max(jnp.abs(gv))))
