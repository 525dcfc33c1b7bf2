"""The columns of ``benchmarks/peers.py``: one zero-argument callable per
peer and case, each computing the same numbers (see peers.py for where the
boundary handling differs).  Optional peers that do not import are left out.

Nothing here runs at import time except the optional imports.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.fft as sfft
import scipy.ndimage as ndi
import xarray as xr
from jax import lax

import xstencil
from xstencil._engine import dense

try:
    import numba
    from numba import njit, prange, stencil
except ImportError:  # pragma: no cover - optional peer
    numba = None
try:
    import pystencils as ps
except ImportError:  # pragma: no cover - optional peer
    ps = None
try:
    import devito
except ImportError:  # pragma: no cover - optional peer
    devito = None

Columns = dict[str, Callable[[], Any]]
HEAT_A = 0.2


def ready(x: Any) -> Any:
    """``x`` once computed: a JAX array's own ``block_until_ready()``, a
    DataArray's array likewise, and a numpy array as it is (anything else,
    say a pytree, is an error: it would not be waited for).  One call into
    jaxlib: ``jax.block_until_ready``'s pytree walk and the duck-array checks
    of xarray's ``.data`` property cost 50-100 µs more with the caches cold
    after a large map, which no numpy column pays and a time loop of maps
    never runs."""
    if type(x) is xr.DataArray:
        x = x.variable._data
    return x if type(x) is np.ndarray else x.block_until_ready()


def environment() -> str:
    v = [f"jax {jax.__version__}", f"numpy {np.__version__}"]
    for name, mod in (("numba", numba), ("pystencils", ps), ("devito", devito)):
        v.append(f"{name} {mod.__version__}" if mod is not None else f"{name} not installed")
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores "
            f"(shared with other jobs); " + ", ".join(v)
            + f"; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}"
            + f", GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}.")


# --------------------------------------------------------------------------
# numba kernels

if numba is not None:
    @njit(parallel=True, fastmath=False, cache=False)
    def _lap2_fill(a: Any, out: Any) -> None:
        ny, nx = a.shape
        for i in prange(ny):
            for j in range(nx):
                s = -4 * a[i, j]
                if i > 0:
                    s += a[i - 1, j]
                if i < ny - 1:
                    s += a[i + 1, j]
                if j > 0:
                    s += a[i, j - 1]
                if j < nx - 1:
                    s += a[i, j + 1]
                out[i, j] = s

    @njit(parallel=True)
    def _lap2_periodic(a: Any, out: Any) -> None:
        ny, nx = a.shape
        for i in prange(ny):
            im, ip = (i - 1) % ny, (i + 1) % ny
            out[i, 0] = a[im, 0] + a[ip, 0] + a[i, nx - 1] + a[i, 1] - 4 * a[i, 0]
            for j in range(1, nx - 1):
                out[i, j] = a[im, j] + a[ip, j] + a[i, j - 1] + a[i, j + 1] - 4 * a[i, j]
            out[i, nx - 1] = (a[im, nx - 1] + a[ip, nx - 1] + a[i, nx - 2] + a[i, 0]
                              - 4 * a[i, nx - 1])

    @njit(parallel=True)
    def _lap3_fill(a: Any, out: Any) -> None:
        nz, ny, nx = a.shape
        for k in prange(nz):
            for i in range(ny):
                for j in range(nx):
                    s = -6 * a[k, i, j]
                    if k > 0:
                        s += a[k - 1, i, j]
                    if k < nz - 1:
                        s += a[k + 1, i, j]
                    if i > 0:
                        s += a[k, i - 1, j]
                    if i < ny - 1:
                        s += a[k, i + 1, j]
                    if j > 0:
                        s += a[k, i, j - 1]
                    if j < nx - 1:
                        s += a[k, i, j + 1]
                    out[k, i, j] = s

    @njit(parallel=True)
    def _heat(a: Any, steps: int, alpha: float) -> Any:
        u = a.copy()
        v = np.empty_like(a)
        ny, nx = a.shape
        c = a.dtype.type(alpha)
        for _ in range(steps):
            for i in prange(ny):
                for j in range(nx):
                    s = -4 * u[i, j]
                    if i > 0:
                        s += u[i - 1, j]
                    if i < ny - 1:
                        s += u[i + 1, j]
                    if j > 0:
                        s += u[i, j - 1]
                    if j < nx - 1:
                        s += u[i, j + 1]
                    v[i, j] = u[i, j] + c * s
            u, v = v, u
        return u

    @njit(parallel=True)
    def _dense(p: Any, w: Any, out: Any) -> None:
        ny, nx = out.shape
        ky, kx = w.shape
        for i in prange(ny):
            for j in range(nx):
                s = p.dtype.type(0)
                for a in range(ky):
                    for b in range(kx):
                        s += w[a, b] * p[i + a, j + b]
                out[i, j] = s

    @stencil
    def _st_lap2(a: Any) -> Any:
        return a[-1, 0] + a[1, 0] + a[0, -1] + a[0, 1] - 4 * a[0, 0]

    @stencil
    def _st_lap3(a: Any) -> Any:
        return (a[-1, 0, 0] + a[1, 0, 0] + a[0, -1, 0] + a[0, 1, 0] + a[0, 0, -1] + a[0, 0, 1]
                - 6 * a[0, 0, 0])

    @njit(parallel=True)
    def _st_lap2_run(a: Any, out: Any) -> None:
        _st_lap2(a, out=out)

    @njit(parallel=True)
    def _st_lap3_run(a: Any, out: Any) -> None:
        _st_lap3(a, out=out)

    @stencil
    def _st_heat(u: Any, c: Any) -> Any:
        return u[0, 0] + c * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1] - 4 * u[0, 0])

    @njit(parallel=True)
    def _st_heat_run(a: Any, steps: int, c: Any) -> Any:
        u = a.copy()
        v = np.zeros_like(a)
        for _ in range(steps):
            _st_heat(u, c, out=v)
            u, v = v, u
        return u


# --------------------------------------------------------------------------
# columns


def _lap_kernel(ndim: int) -> Callable[[Any], Any]:
    dims = ("z", "y", "x")[-ndim:]

    def kernel(u: Any) -> Any:
        s = -2 * ndim * u()
        for d in dims:
            s = s + u(**{d: 1}) + u(**{d: -1})
        return s

    return kernel


def _ps_laplace(ndim: int, dtype: Any) -> Any:
    src, dst = ps.fields(f"src, dst: {np.dtype(dtype).name}[{ndim}D]")
    offs = [tuple(s if d == k else 0 for d in range(ndim)) for k in range(ndim) for s in (1, -1)]
    cfg = ps.CreateKernelConfig()
    cfg.cpu.openmp.enable = True
    up = ps.Assignment(dst.center, sum(src[o] for o in offs) - 2 * ndim * src.center)
    return ps.create_kernel(up, cfg).compile()


def _devito_grid(shape: tuple[int, ...]) -> Any:
    return devito.Grid(shape=shape, extent=tuple(float(n - 1) for n in shape), dtype=np.float32)


def laplace_options(mode: str) -> dict[str, Any]:
    """The map options of the Laplacian cases: ``mode`` is "periodic" or "fill" (0)."""
    return {"boundary": "periodic"} if mode == "periodic" else {"boundary": "fill",
                                                                 "fill_value": 0.0}


def laplace_columns(shape: tuple[int, ...], mode: str) -> tuple[Callable[[], Any], Columns]:
    rng = np.random.default_rng(0)
    a = rng.random(shape, dtype=np.float32)
    out = np.empty_like(a)
    ndim = len(shape)
    dims = ("z", "y", "x")[-ndim:]
    da = xr.DataArray(a, dims=dims)
    kernel = _lap_kernel(ndim)
    opts = laplace_options(mode)
    xout = np.empty_like(a)
    cols: Columns = {
        # the default backend: numba loops on numpy data this large (docs/performance.rst),
        # each call a new result array, as a user gets without out=
        "xstencil": lambda: ready(da.stencil.map(kernel, **opts)),
        # into a preallocated array, as every peer column below writes
        "xstencil out=": lambda: da.stencil.map(kernel, out=xout, **opts),
        "xstencil XLA": lambda: ready(
            da.stencil.map(kernel, backend="xla", **opts))}
    if numba is not None:
        if ndim == 2:
            f = _lap2_periodic if mode == "periodic" else _lap2_fill
            cols["numba prange"] = lambda: f(a, out)
            if mode == "fill":
                cols["numba @stencil"] = lambda: _st_lap2_run(a, out)
        else:
            cols["numba prange"] = lambda: _lap3_fill(a, out)
            cols["numba @stencil"] = lambda: _st_lap3_run(a, out)
    if mode == "fill":
        if ps is not None:
            k = _ps_laplace(ndim, a.dtype)
            pa, pout = np.pad(a, 1), np.zeros(tuple(n + 2 for n in shape), a.dtype)
            cols["pystencils"] = lambda: k(src=pa, dst=pout)
        if devito is not None:
            grid = _devito_grid(shape)
            u = devito.Function(name="u", grid=grid, space_order=2)
            v = devito.Function(name="v", grid=grid, space_order=2)
            u.data[:] = a
            op = devito.Operator(devito.Eq(v, u.laplace))
            cols["devito"] = lambda: op.apply()
    ndi_mode = "wrap" if mode == "periodic" else "constant"
    cols["scipy.ndimage"] = lambda: ndi.laplace(a, output=out, mode=ndi_mode)

    def numpy_slices() -> None:
        np.multiply(a, -2 * ndim, out=out)
        for ax in range(ndim):
            lo = tuple(slice(1, None) if d == ax else slice(None) for d in range(ndim))
            hi = tuple(slice(None, -1) if d == ax else slice(None) for d in range(ndim))
            out[lo] += a[hi]
            out[hi] += a[lo]
            if mode == "periodic":
                first = tuple(0 if d == ax else slice(None) for d in range(ndim))
                last = tuple(-1 if d == ax else slice(None) for d in range(ndim))
                out[first] += a[last]
                out[last] += a[first]

    cols["numpy slices"] = numpy_slices
    # numpy's copy into a new array (a.copy()): what a fresh output costs numpy itself
    cols["copy (new array)"] = a.copy
    copy_out = np.empty_like(a)
    return lambda: np.copyto(copy_out, a), cols


def heat_columns(n: int, steps: int) -> Columns:
    a = np.random.default_rng(1).random((n, n), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    alpha = HEAT_A

    def kernel(u: Any) -> Any:
        c = u(time=-1)
        return c + alpha * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                            + u(time=-1, y=-1) - 4 * c)

    def run(blocking: Any) -> Any:
        return ready(xstencil.scan(
            da, kernel, "time", steps=steps, save_every="last", boundary="fill",
            fill_value=0.0, blocking=blocking))

    # the default (temporal blocking where the state is large), then each path forced
    cols: Columns = {"xstencil scan": lambda: run(None),
                     "xstencil blocked": lambda: run(True),
                     "xstencil unblocked": lambda: run(False)}
    if numba is not None:
        cols["numba prange"] = lambda: _heat(a, steps, alpha)
        c32 = np.float32(alpha)
        cols["numba @stencil"] = lambda: _st_heat_run(a, steps, c32)
    if ps is not None:
        src, dst = ps.fields("src, dst: float32[2D]")
        cfg = ps.CreateKernelConfig()
        cfg.cpu.openmp.enable = True
        up = ps.Assignment(dst.center, src.center + alpha * (
            src[1, 0] + src[-1, 0] + src[0, 1] + src[0, -1] - 4 * src.center))
        k = ps.create_kernel(up, cfg).compile()

        def pystencils_loop() -> Any:
            u, v = np.pad(a, 1), np.zeros((n + 2, n + 2), np.float32)
            for _ in range(steps):
                k(src=u, dst=v)
                u, v = v, u
            return u

        cols["pystencils"] = pystencils_loop
    if devito is not None:
        grid = _devito_grid((n, n))
        w = devito.TimeFunction(name="w", grid=grid, space_order=2)
        op = devito.Operator(devito.Eq(w.forward, w + alpha * w.laplace))

        def devito_loop() -> Any:
            w.data[0] = a
            op.apply(time_M=steps - 1)
            return w.data[steps % 2]

        cols["devito"] = devito_loop

    def numpy_loop() -> Any:
        u, v = a.copy(), np.empty_like(a)
        for _ in range(steps):
            np.multiply(u, 1 - 4 * alpha, out=v)
            v[1:] += alpha * u[:-1]
            v[:-1] += alpha * u[1:]
            v[:, 1:] += alpha * u[:, :-1]
            v[:, :-1] += alpha * u[:, 1:]
            u, v = v, u
        return u

    cols["numpy slices"] = numpy_loop
    return cols


def offset_array(a: np.ndarray, offset: int = 16, align: int = 64) -> np.ndarray:
    """A C-contiguous copy of ``a`` whose data start ``offset`` bytes past an
    ``align``-byte boundary.  XLA:CPU reads a numpy array in place only when
    it is 64-byte aligned and copies it otherwise; numpy's large arrays start
    16 bytes past a page when freshly mapped and anywhere 16-byte aligned when
    carved from the heap, so whether a benchmark's input is copied would
    otherwise depend on the order of earlier allocations (measured: the 21 x 21
    and 31 x 31 inputs landed 16 and 0 bytes past a boundary, and xstencil
    took 1.26x and 1.11x ``jnp.fft``'s CPU time; both 16 bytes past, 1.18x and
    1.19x)."""
    raw = np.empty(a.nbytes + align + offset, np.uint8)
    start = (offset - raw.ctypes.data) % align
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % align == offset % align
    return out


def dense_columns(n: int, k: int) -> tuple[Columns, str]:
    rng = np.random.default_rng(k)
    # the numpy input XLA must copy on every call, for every k alike (see offset_array)
    a = offset_array(rng.standard_normal((n, n)).astype(np.float32))
    w = rng.standard_normal((k, k)).astype(np.float32)
    h = k // 2
    da = xr.DataArray(a, dims=("y", "x"))
    x = jnp.asarray(a)

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    dj = xr.DataArray(x, dims=("y", "x"))
    cols: Columns = {
        # numpy in, as for scipy.ndimage, numba and the map cases
        "xstencil": lambda: ready(da.stencil.map(
            kernel, window={"y": k, "x": k}, boundary="periodic")),
        # a JAX array in, as for the jnp.fft and lax.conv columns
        "xstencil (JAX in)": lambda: ready(dj.stencil.map(
            kernel, window={"y": k, "x": k}, boundary="periodic"))}
    cols["scipy.ndimage"] = lambda: ndi.correlate(a, w, mode="wrap")
    kern = jnp.asarray(w)[None, None]

    @jax.jit
    def conv(x: Any) -> Any:
        p = jnp.pad(x, h, mode="wrap")
        return lax.conv_general_dilated(p[None, None], kern, (1, 1), "VALID")[0, 0]

    wpad = np.zeros((n, n), np.float32)
    wpad[:k, :k] = w
    wpad = np.roll(wpad, (-h, -h), axis=(0, 1))
    wf = jnp.asarray(np.conj(np.fft.rfft2(wpad)).astype(np.complex64))

    @jax.jit
    def fft(x: Any) -> Any:  # circular correlation: periodic, no padding at all
        return jnp.fft.irfft2(jnp.fft.rfft2(x) * wf, s=x.shape)

    spec = np.asarray(wf)
    workers = numba.get_num_threads() if numba is not None else (os.cpu_count() or 1)

    def scipy_fft() -> Any:  # the same correlation by scipy.fft on every core, numpy in
        big = sfft.rfft2(a, workers=workers)
        big *= spec
        return sfft.irfft2(big, s=a.shape, workers=workers, overwrite_x=True)

    cols["scipy.fft"] = scipy_fft
    cols["lax.conv"] = lambda: ready(conv(x))
    cols["jnp.fft"] = lambda: ready(fft(x))
    # the same program on the numpy array, copied into XLA's memory on each call as
    # the "xstencil" column's input is (XLA:CPU reads in place only 64-byte aligned data)
    cols["jnp.fft (numpy in)"] = lambda: ready(fft(a))
    if numba is not None:
        out = np.empty_like(a)
        cols["numba prange"] = lambda: _dense(np.pad(a, h, mode="wrap"), w, out)
    # Closed-over weights are inputs of the compiled function (compile once), so the
    # labelled map computes them in the program (xstencil._engine.affine) and picks the
    # lowering by the window's size: what dense.choose says for a traced weight array.
    return cols, dense.choose(jax.ShapeDtypeStruct(w.shape, w.dtype))


def padded_dense_columns(n: int, k: int, gaussian: bool = False, image: bool = False
                         ) -> Columns:
    """A dense k x k weighted sum at n², ``boundary="reflect"`` (mirrored
    about the edge cell: numpy's ``np.pad(mode="reflect")``, scipy.ndimage's
    ``mode="mirror"``): the non-periodic case, where the FFT runs over a
    padded block at an FFT-friendly size.  Columns: xstencil (numpy in),
    ``scipy.ndimage.correlate`` and a hand-written ``np.pad`` plus
    ``scipy.fft`` correlation with a precomputed spectrum, on numba's
    thread count.  ``gaussian``: Gaussian weights (rank 1, which xstencil runs
    as two 1-D passes), and a column of ``scipy.ndimage.correlate1d`` along
    each axis in turn, the separable way to filter with them.  ``image``: the
    data are a uint8 image (0-255) and every column returns float32 (scipy's
    passes write a float32 output, the hand FFT casts the padded image)."""
    rng = np.random.default_rng(100 + k)
    if image:
        a = offset_array(rng.integers(0, 256, (n, n)).astype(np.uint8))
    else:
        a = offset_array(rng.standard_normal((n, n)).astype(np.float32))
    w = rng.standard_normal((k, k)).astype(np.float32)
    g = np.exp(-((np.arange(k) - k // 2) / (k / 6)) ** 2 / 2)
    g = (g / g.sum()).astype(np.float32)
    if gaussian:
        w = np.outer(g, g)
    h = k // 2
    da = xr.DataArray(a, dims=("y", "x"))

    def kernel(u: Any) -> Any:
        return (u * w).sum()

    size = sfft.next_fast_len(n + k - 1, real=True)
    flipped = np.zeros((size, size), np.float32)
    flipped[:k, :k] = w[::-1, ::-1]  # correlation as a convolution: the flipped weights
    spec = sfft.rfft2(flipped).astype(np.complex64)
    workers = numba.get_num_threads() if numba is not None else (os.cpu_count() or 1)

    def hand() -> Any:
        big = sfft.rfft2(np.pad(a, h, mode="reflect").astype(np.float32, copy=False),
                         s=(size, size), workers=workers)
        big *= spec
        full = sfft.irfft2(big, s=(size, size), workers=workers, overwrite_x=True)
        return full[k - 1:k - 1 + n, k - 1:k - 1 + n]

    cols: Columns = {"xstencil": lambda: ready(da.stencil.map(
                         kernel, window={"y": k, "x": k}, boundary="reflect")),
                     "scipy.ndimage": lambda: ndi.correlate(a, w, mode="mirror"),
                     "np.pad + scipy.fft": hand}
    if gaussian:
        cols["scipy.ndimage 1-D passes"] = lambda: ndi.correlate1d(
            ndi.correlate1d(a, g, axis=0, mode="mirror", output=np.float32), g, axis=1,
            mode="mirror")
    return cols


def disk_count_columns(n: int, r: int) -> Columns:
    """A count over a disk of radius ``r`` on an n² ``bool`` mask, zero
    outside the field (a focal count, as rasters and images take one): the
    kernel ``(u.astype(int32) * disk).sum()``, an exact int32 result.
    Columns: xstencil (numpy in), ``scipy.ndimage.correlate`` of the mask as
    int32 (the mask cast first, as a user casts it), and a hand-written
    ``np.pad`` plus float64 ``scipy.fft`` correlation rounded back to int32,
    with a precomputed spectrum, on numba's thread count."""
    rng = np.random.default_rng(200 + r)
    a = offset_array(rng.random((n, n)) < 0.3)
    yy, xx = np.mgrid[-r:r + 1, -r:r + 1]
    disk = (yy**2 + xx**2 <= r * r).astype(np.int32)
    k = 2 * r + 1
    da = xr.DataArray(a, dims=("y", "x"))

    def kernel(u: Any) -> Any:
        return (u.astype(jnp.int32) * disk).sum()

    size = sfft.next_fast_len(n + k - 1, real=True)
    flipped = np.zeros((size, size))
    flipped[:k, :k] = disk[::-1, ::-1]
    spec = sfft.rfft2(flipped)
    workers = numba.get_num_threads() if numba is not None else (os.cpu_count() or 1)

    def hand() -> Any:
        big = sfft.rfft2(np.pad(a, r).astype(np.float64), s=(size, size), workers=workers)
        big *= spec
        full = sfft.irfft2(big, s=(size, size), workers=workers, overwrite_x=True)
        return np.rint(full[k - 1:k - 1 + n, k - 1:k - 1 + n]).astype(np.int32)

    return {"xstencil": lambda: ready(da.stencil.map(
                kernel, window={"y": k, "x": k}, boundary="fill", fill_value=False)),
            "scipy.ndimage": lambda: ndi.correlate(a.astype(np.int32), disk, mode="constant"),
            "np.pad + scipy.fft": hand}
