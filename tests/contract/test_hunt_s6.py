"""Silently wrong results found by attacking the loop backend, meshes on
loops, ``map(out=)``, loop scans and the dense lowerings with odd inputs
(session 6 hunt).  Every test compares against an independent reference: a
plain numpy loop written here, or the XLA backend where loops are compared.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil


def _valid_dot(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``out[i] = sum_k a[i + k] * v[k]``, one term at a time."""
    n = a.size - v.size + 1
    out = np.empty(n, a.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(n):
            s = a.dtype.type(0)
            for k in range(v.size):
                s = s + a[i + k] * v[k]
            out[i] = s
    return out


@pytest.mark.parametrize("spelling", ["matmul", "einsum", "tensordot"])
def test_constant_dot_with_an_infinite_weight_is_the_direct_sum(spelling: str) -> None:
    """(a) ``x @ v`` with a constant ``v`` holding inf: the weight reader's
    dense ``einsum`` multiplied the structural zeros of the window's
    coefficient matrix by inf, so every output was NaN instead of inf."""
    a = np.arange(1.0, 31.0, dtype=np.float32)
    v = np.ones(11, np.float32)
    v[3], v[5] = np.inf, 0.5
    ref = _valid_dot(a, v)
    assert np.isinf(ref).all()
    ops = {"matmul": lambda x, w: x @ w, "einsum": lambda x, w: jnp.einsum("i,i->", x, w),
           "tensordot": lambda x, w: jnp.tensordot(x, w, 1)}

    @xstencil.kmap(kernel_size=(11,), padding="valid", relative=False)
    def f(x):
        return ops[spelling](x, jnp.asarray(v))

    out = np.asarray(f(jnp.asarray(a)))
    np.testing.assert_array_equal(out, ref)


def test_constant_dot_with_a_nan_weight_spoils_only_what_it_touches() -> None:
    """A NaN weight makes every output NaN (each window reads the cell), and
    a finite weight vector gives the finite direct sum."""
    a = np.arange(1.0, 31.0, dtype=np.float32)
    v = np.linspace(-1, 1, 11).astype(np.float32)
    for bad in (None, np.nan, -np.inf):
        w = v.copy()
        if bad is not None:
            w[7] = bad

        @xstencil.kmap(kernel_size=(11,), padding="valid", relative=False)
        def f(x, w=w):
            return x @ jnp.asarray(w)

        out = np.asarray(f(jnp.asarray(a)))
        ref = _valid_dot(a, w)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(out), np.isinf(ref))
        ok = np.isfinite(ref)
        np.testing.assert_allclose(out[ok], ref[ok], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [">f4", ">f8", ">i2"])
@pytest.mark.parametrize("backend", ["xla", "loops"])
def test_big_endian_data_map_like_native(dtype: str, backend: str) -> None:
    """Big-endian data (netCDF/HDF5 files hold it) used to crash inside
    ``jax.jit`` with an obscure TypeError; it now maps like native data."""
    a = np.arange(12.0).reshape(3, 4).astype(dtype)
    ref = a + np.roll(a, -1, axis=1)
    res = xr.DataArray(a, dims=("y", "x")).stencil.map(
        lambda u: u(x=1) + u(), boundary="periodic", backend=backend)
    assert res.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_array_equal(res.values, ref)
    ds = xr.Dataset({"v": (("y", "x"), a)})
    out = ds.stencil.map(lambda s: {"v": s["v"](x=1) + s["v"]()}, boundary="periodic",
                         backend=backend)
    np.testing.assert_array_equal(out["v"].values, ref)


def _skip_zero_correlate(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Periodic ``out[j] = sum_c w[c] * a[j + c - h]`` over the cells of
    nonzero weight only (a weight of 0 does not read its cell)."""
    ky, kx = w.shape
    p = np.pad(a, (((ky - 1) // 2, ky // 2), ((kx - 1) // 2, kx // 2)), mode="wrap")
    out = np.zeros(a.shape, a.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        for y in range(a.shape[0]):
            for x in range(a.shape[1]):
                s = a.dtype.type(0)
                for i in range(ky):
                    for j in range(kx):
                        if w[i, j] != 0:
                            s = s + w[i, j] * p[y + i, x + j]
                out[y, x] = s
    return out


@pytest.mark.parametrize("shape", [(1, 3), (2, 2), (3, 3), (5, 5)])
@pytest.mark.parametrize("backend", ["xla", "loops"])
def test_zero_weight_on_nan_is_not_read_on_every_lowering(shape: tuple[int, int],
                                                          backend: str) -> None:
    """(b) ``(u * w).sum()`` with a weight of 0 over a NaN cell: windows of up
    to 8 cells (shifted slices) and the loop backend gave NaN, larger windows
    (the dense lowerings) the sum over the nonzero weights, so ``"auto"``
    changed the answer with the array's size.  Every lowering now reads a
    cell under a zero weight as absent."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((9, 10)).astype(np.float32)
    a[4, 5], a[0, 0] = np.nan, np.inf
    w = rng.uniform(0.5, 1.5, shape).astype(np.float32)
    w.reshape(-1)[::2] = 0
    ref = _skip_zero_correlate(a, w)
    da = xr.DataArray(a, dims=("y", "x"))
    win = {"y": shape[0], "x": shape[1]}
    closed = da.stencil.map(lambda u: (u * w).sum(), window=win, boundary="periodic",
                            backend=backend).values
    arg = da.stencil.map(lambda u, ww: (u * ww).sum(), jnp.asarray(w), window=win,
                         boundary="periodic", backend=backend).values
    for out in (closed, arg):
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(out), np.isinf(ref))
        ok = np.isfinite(ref)
        np.testing.assert_allclose(out[ok], ref[ok], rtol=1e-5, atol=1e-5)


def test_zero_weight_rule_in_a_scan_and_a_named_offset_kernel() -> None:
    """The same rule for a kernel written with offsets and a runtime
    coefficient of 0, in a map and a scan (loops and XLA agree)."""
    a = np.array([1.0, np.nan, 2.0, 3.0, np.inf, 4.0], np.float32)
    da = xr.DataArray(a, dims=("x",))
    c = np.float32(0.0)

    def k(u, c):
        return u() + c * u(x=1)

    ref = a.copy()  # c * u(x=1) is 0 everywhere: u() itself
    for backend in ("xla", "loops"):
        out = da.stencil.map(k, jnp.asarray(c), boundary="periodic", backend=backend)
        np.testing.assert_array_equal(out.values, ref)


def _heat_ref(x0: np.ndarray, nu: float, steps: int) -> np.ndarray:
    p, out = x0.copy(), [x0.copy()]
    for _ in range(steps):
        p = (p + np.float32(nu) * (np.roll(p, -1) - 2 * p + np.roll(p, 1))).astype(np.float32)
        out.append(p)
    return np.array(out)


class _Model:
    def __init__(self) -> None:
        self.c = np.array([0.1], np.float32)

    def step(self, u):
        return u(time=-1) + self.c[0] * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


def _partial_kernel(u, p):
    return u(time=-1) + p["nu"] * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


@pytest.mark.parametrize("backend", ["xla", "loops"])
@pytest.mark.parametrize("how", ["method in place", "method rebound", "partial dict"])
def test_same_bound_method_or_partial_sees_changed_state(backend: str, how: str) -> None:
    """A bound method (``step = model.step``) or a ``functools.partial`` passed
    again after the state it reads changed: the compile caches keyed them by
    identity only, so the second call reused code traced with the old value
    (maps and scans, XLA and loops)."""
    import functools

    x0 = np.random.default_rng(0).random(17).astype(np.float32)
    u0 = xr.DataArray(x0, dims=("x",))
    model, params = _Model(), {"nu": 0.1}
    if how.startswith("method"):
        kernel = model.step

        def set_nu(v: float) -> None:
            if how == "method in place":
                model.c[0] = v
            else:
                model.c = np.array([v], np.float32)
    else:
        kernel = functools.partial(_partial_kernel, p=params)

        def set_nu(v: float) -> None:
            params["nu"] = v
    for nu in (0.1, 0.3, 0.2):
        set_nu(nu)
        out = u0.stencil.scan(kernel, dim="time", steps=4, boundary={"x": "periodic"},
                              backend=backend).values
        np.testing.assert_allclose(out, _heat_ref(x0, nu, 4), atol=1e-6)
        two = xr.DataArray(np.stack([x0, x0]), dims=("time", "x")).stencil.map(
            kernel, boundary={"time": "valid", "x": "periodic"}, backend=backend)
        np.testing.assert_allclose(two.values[0], _heat_ref(x0, nu, 1)[1], atol=1e-6)


def test_zero_weight_rule_keeps_gradients_with_respect_to_zero_weights() -> None:
    """The rule masks the window value, not the product: fitting a filter
    from zero weights still gets the gradient ``sum(2 * out * shifted)``."""
    import jax

    a = np.random.default_rng(0).random((6, 7)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))

    def loss(w):
        r = da.stencil.map(lambda u, ww: (u * ww).sum(), w, window={"y": 2, "x": 2},
                           boundary="periodic", backend="xla")
        return (r.data ** 2).sum()

    w0 = jnp.zeros((2, 2), jnp.float32).at[0, 0].set(1.0)
    g = np.asarray(jax.grad(loss)(w0))
    shifted = [[np.roll(a, (-i, -j), (0, 1)) for j in range(2)] for i in range(2)]
    out = shifted[0][0]
    ref = np.array([[(2 * out * shifted[i][j]).sum() for j in range(2)] for i in range(2)])
    np.testing.assert_allclose(g, ref, rtol=1e-4)
    assert np.all(g != 0)


@pytest.mark.parametrize("c", [-1.0, 1.0, 0.0])
def test_runtime_weight_products_bitwise_equal_on_loops_and_xla(c: float) -> None:
    """Products of window values and runtime weights (a bool converted to a
    float, a zero) give the same bits on both backends, sign of zero
    included, with negative, NaN and infinite data."""
    a = np.array([-1.0, np.nan, 2.0, -np.inf, -3.0, 0.5], np.float32)
    da = xr.DataArray(a, dims=("x",))
    kernels = [lambda u, c: u() * (c > 0).astype(jnp.float32) + 0 * u(x=1),
               lambda u, c: u() * c - u(x=-1) * c,
               lambda u, c: (c > 0).astype(jnp.float32) * u(x=1)]
    for k in kernels:
        outs = [da.stencil.map(k, jnp.float32(c), boundary="periodic", backend=b).values
                for b in ("xla", "loops")]
        np.testing.assert_array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


class _Scaled:
    def __init__(self) -> None:
        self.c = np.array([1.0], np.float32)
        self.s = 1.0

    def kernel(self, u):
        return u(x=1) * self.c[0] * self.s


_MODEL = _Scaled()


@pytest.mark.parametrize("backend", ["xla", "loops"])
def test_lambda_calling_a_method_sees_the_instance_state(backend: str) -> None:
    """``lambda u: model.kernel(u)``: the attributes read inside the method
    (``self.c``, ``self.s``) are not names of the lambda's code, so the
    compile cache did not key them and a changed ``model.c[0]`` or
    ``model.s`` reused code traced with the old values."""
    a = np.arange(6.0, dtype=np.float32)
    da = xr.DataArray(a, dims=("x",))

    def k(u):
        return _MODEL.kernel(u)

    for c, s in ((1.0, 1.0), (3.0, 1.0), (3.0, 2.0)):
        _MODEL.c[0], _MODEL.s = c, s
        out = da.stencil.map(k, boundary="periodic", backend=backend).values
        np.testing.assert_array_equal(out, np.roll(a, -1) * np.float32(c) * np.float32(s))


def test_mesh_map_option_error_says_where_the_option_goes() -> None:
    """``m.map(backend=...)`` said "backend= is not an option of this call"
    and then listed 'backend' among the options; it now says that a mesh
    takes it when it is made."""
    da = xr.DataArray(np.arange(6.0), dims=("x",))
    m = da.stencil.mesh(boundary="periodic")
    m[...] = lambda u: u(x=1)
    with pytest.raises(xstencil.XStencilError,
                       match=r"backend= of a function mesh is given when the mesh is made"):
        m.map(backend="loops")
