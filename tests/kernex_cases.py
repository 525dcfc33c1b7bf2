"""Side-by-side cases for the kernex 0.2.1 drop-in API.

Every case is a function ``case_NAME(lib)`` where ``lib`` is any module that
provides ``kmap``, ``kscan``, ``smap`` and ``sscan`` (``kernex`` or
``xstencil``).  It builds its own small deterministic input, runs the stencil
through ``lib`` and returns a numpy array.  Cases that take a ``dtype`` keyword
are floating-point problems; they are also recorded in float64 (run with JAX's
x64 flag on) under the name ``NAME__f64``.

The expected outputs, computed with kernex 0.2.1, live in
``tests/data/kernex_reference.npz`` (see ``tests/data/README.md``).

Groups of names:

* ``readme_*``: the examples of kernex's README (re-expressed, small inputs).
* ``ktest_*``: scenarios from kernex's own test-suite (diffusion with sscan,
  meshes inside ``lax.scan``, ...).
* ``sem_*``: every measured example of shared/KERNEX_SEMANTICS.md.
* ``beh_*``: further kernex behaviour a compatible implementation must match.
* ``quirk_*``: kernex behaviour that xstencil reproduces only if it chooses to.
  ``DIVERGENT`` lists the cases where xstencil is *documented* to differ
  (DESIGN.md section 3), ``QUIRKS`` those where kernex does something odd that
  the docs do not settle yet.  Tests should expect the reference values only
  for names in neither set, and compare the others deliberately.

Notes for running these against kernex itself:

* kernex's function-mesh objects only accept ``jax.Array`` input (a numpy array
  raises ``ValueError``), so every input is converted with ``jnp.asarray``.
* a kernex mesh is single-use: its second call re-normalises its (already
  normalised) regions and slice regions stop matching.  Every case therefore
  builds a fresh mesh and calls (or traces) it exactly once.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["CASES", "F64_CASES", "DIVERGENT", "QUIRKS", "run_case"]

_A6 = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def _a6(dtype=np.float32):
    return jnp.asarray(np.array(_A6, dtype=dtype))


def _rand(seed, shape, dtype=np.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(dtype))


def _np(x):
    return np.asarray(x)


# --------------------------------------------------------------------------
# README examples
# --------------------------------------------------------------------------


def case_readme_sum_kmap(lib):
    """Window sums of size 3, no padding, int input -> [6, 9, 12]."""
    window_sum = lib.kmap(kernel_size=(3,))(lambda w: jnp.sum(w))
    return _np(window_sum(jnp.arange(1, 6)))


def case_readme_sum_kscan(lib):
    """Same kernel, but sequential in-place: -> [6, 13, 22]."""
    running = lib.kscan(kernel_size=(3,))(lambda w: jnp.sum(w))
    return _np(running(jnp.arange(1, 6)))


def _powers_mesh(lib):
    mesh = lib.kmap(kernel_size=(1,))
    mesh[0] = lambda w: w[0] ** 2
    mesh[1:] = lambda w: w[0] ** 3
    return mesh


def case_readme_mesh_powers(lib):
    """Function mesh: square at index 0, cube elsewhere."""
    values = jnp.arange(1, 11).astype(jnp.float32)
    return _np(_powers_mesh(lib)(values))


def case_readme_mesh_powers_grad(lib):
    """Gradient through the same mesh: [2, 12, 27, ...]."""
    values = jnp.arange(1, 11).astype(jnp.float32)
    mesh = _powers_mesh(lib)
    return _np(jax.grad(lambda v: jnp.sum(mesh(v)))(values))


def case_readme_conv_channels(lib):
    """Channel-first conv2d as a (C, 3, 3) window, padding ("valid", "same", "same")."""
    x = _rand(11, (3, 8, 8))
    w = _rand(12, (3, 3, 3))

    @jax.jit
    @lib.kmap(kernel_size=(3, 3, 3), padding=("valid", "same", "same"))
    def conv(window, weight):
        return jnp.sum(window * weight)

    return _np(conv(x, w))  # shape (1, 8, 8)


def case_readme_laplacian_valid(lib, dtype=np.float32):
    """9-term relative Laplacian with zero weights on the corners, 'valid'."""

    @lib.kmap(kernel_size=(3, 3), padding="valid", relative=True)
    def lap(u):
        return (
            0 * u[1, -1]
            + 1 * u[1, 0]
            + 0 * u[1, 1]
            + 1 * u[0, -1]
            - 4 * u[0, 0]
            + 1 * u[0, 1]
            + 0 * u[-1, -1]
            + 1 * u[-1, 0]
            + 0 * u[-1, 1]
        )

    return _np(lap(_rand(21, (10, 10), dtype)))


def case_readme_laplacian_ones(lib):
    """The README's literal check: Laplacian of ones(10, 10) is zeros(8, 8)."""
    lap = lib.kmap(kernel_size=(3, 3), padding="valid", relative=True)(
        lambda u: u[1, 0] + u[0, -1] - 4 * u[0, 0] + u[0, 1] + u[-1, 0]
    )
    return _np(lap(jnp.ones((10, 10))))


def case_readme_identity_centre(lib):
    """relative=True: u[0, 0] is the centre of each valid 3x3 window."""
    mat = jnp.arange(1, 26).reshape(5, 5)
    return _np(lib.kmap(kernel_size=(3, 3), relative=True)(lambda u: u[0, 0])(mat))


def case_readme_patches_same(lib):
    """Returning the window gives a (5, 5, 3, 3) patch array (int input)."""
    mat = jnp.arange(1, 26).reshape(5, 5)
    patches = jax.jit(lib.kmap(kernel_size=(3, 3), padding="same")(lambda u: u))
    return _np(patches(mat))


def _convection_mesh(lib, nt, nx, dtype):
    tmax, xmax, c = 0.5, 2.0, 0.5
    dt, dx = tmax / (nt - 1), xmax / (nx - 1)
    courant = c * dt / dx
    mesh = lib.kscan(
        kernel_size=(3, 3),
        padding=((1, 1), (1, 1)),
        named_axis={0: "n", 1: "i"},
        relative=True,
    )

    def wall(u):
        return 1

    def low(u):
        return 1

    def high(u):
        return 2

    def upwind(u):
        return u["i", "n-1"] - courant * (u["i", "n-1"] - u["i-1", "n-1"])

    quarter, half = (nx - 1) // 4 + 1, (nx - 1) // 2
    mesh[:, 0] = mesh[:, -1] = wall
    mesh[:, :quarter] = mesh[:, half:] = low
    mesh[0:1, quarter:half] = high
    mesh[1:, 1:-1] = upwind
    return mesh, jnp.ones((nt, nx), dtype)


def case_readme_linear_convection(lib, dtype=np.float32):
    """README linear convection: kscan over (t, x) with a 4-function mesh, 151x51."""
    mesh, u0 = _convection_mesh(lib, 151, 51, dtype)
    return _np(mesh(u0))


def case_readme_gaussian_blur(lib, dtype=np.float32):
    """Gaussian blur: window used as an array, (w * weights).sum(), padding 'same'."""
    size, sigma = 5, 1.5
    r = jnp.linspace(-(size - 1) / 2.0, (size - 1) / 2.0, size, dtype=dtype)
    g = jnp.exp(-0.5 * r**2 * jax.lax.rsqrt(jnp.asarray(sigma, dtype)))
    weights = jnp.outer(g, g)
    weights = weights / weights.sum()

    blur = lib.kmap(kernel_size=(size, size), padding="same")(lambda u: jnp.sum(u * weights))
    return _np(blur(_rand(31, (16, 16), dtype)))


def case_readme_depthwise_conv(lib):
    """jax.vmap over channels of a kmap taking a per-channel weight (int data)."""
    x = jnp.arange(1, 51).reshape(2, 5, 5)
    w = jnp.arange(1, 19).reshape(2, 3, 3)
    per_channel = lib.kmap(kernel_size=(3, 3), padding=("same", "same"))(
        lambda u, k: jnp.sum(u * k)
    )
    return _np(jax.jit(jax.vmap(per_channel))(x, w))


def case_readme_avgpool(lib):
    """3x3 average pool, stride 2, no padding, vmapped over channels."""
    x = _rand(41, (2, 7, 7))
    pool = jax.vmap(lib.kmap(kernel_size=(3, 3), strides=(2, 2))(lambda u: jnp.mean(u)))
    return _np(pool(x))


def case_readme_maxpool_same(lib):
    """2x2 max pool, stride 2, padding 'same', vmapped over batch and channel."""
    x = jnp.arange(1, 26).reshape(1, 1, 5, 5)
    pool = lib.kmap(kernel_size=(2, 2), strides=(2, 2), padding="same")(lambda u: jnp.max(u))
    return _np(jax.vmap(jax.vmap(pool))(x))  # [[7, 9, 10], [17, 19, 20], [22, 24, 25]]


def case_readme_rk4(lib, dtype=np.float32):
    """README RK4 for dy/dt = y: kscan over a (2, n) [y; t] array, mesh, jitted."""
    n = 5
    t = jnp.linspace(0, 1, n, dtype=dtype)
    state = jnp.stack([jnp.zeros(n, dtype), t], axis=0)
    h = t[1] - t[0]

    def rhs(tn, yn):
        return yn

    def start(u):
        return 1.0

    def step(u):
        # row 0 holds y (already updated to the left), row 1 holds t
        t0, y0 = u[1, -1], u[0, -1]
        k1 = h * rhs(t0, y0)
        k2 = h * rhs(t0 + h / 2, y0 + k1 / 2)
        k3 = h * rhs(t0 + h / 2, y0 + k2 / 2)
        k4 = h * rhs(t0 + h, y0 + k3)
        return y0 + (k1 + 2 * k2 + 2 * k3 + k4) / 6

    mesh = lib.kscan(kernel_size=(2, 3), relative=True, padding=(0, 1))
    mesh[0:1, 1:] = step
    mesh[0, 0] = start
    solve = jax.jit(mesh.__call__)
    return _np(solve(state))  # shape (1, n); row 0 is y(t)


# --------------------------------------------------------------------------
# scenarios from kernex's own tests
# --------------------------------------------------------------------------


def case_ktest_scan_of_kscan_mesh(lib):
    """A kscan mesh as the body of lax.scan (1-D, size-1 window)."""
    mesh = lib.kscan(kernel_size=(1,), relative=True, padding="same")
    mesh[1:-1] = lambda u: u[0] + 1
    mesh[0] = mesh[-1] = lambda u: u[0]
    out, _ = jax.lax.scan(lambda c, _: (mesh(c), None), jnp.ones(10), None, length=9)
    return _np(out)


def case_ktest_scan_of_kscan_mesh3(lib):
    """A kscan mesh with a size-3 window as the body of lax.scan (2 steps)."""
    mesh = lib.kscan(kernel_size=(3,), relative=True, padding="same")
    mesh[1:-1] = lambda u: u[0] + u[-1] + u[1]
    mesh[0] = mesh[-1] = lambda u: u[0]
    out, _ = jax.lax.scan(lambda c, _: (mesh(c), None), jnp.ones(10), None, length=2)
    return _np(out)


def case_ktest_scan_of_kmap_mesh3(lib):
    """A kmap mesh as the body of lax.scan: interior 3-sum, ends fixed (2 steps)."""
    mesh = lib.kmap(kernel_size=(3,), relative=True, padding="same")
    mesh[1:-1] = lambda u: u[0] + u[-1] + u[1]
    mesh[0] = mesh[-1] = lambda u: u[0]
    out, _ = jax.lax.scan(lambda c, _: (mesh(c), None), jnp.ones(10), None, length=2)
    return _np(out)


def case_ktest_scan_of_kmap_heat(lib, dtype=np.float32):
    """Explicit heat equation: lax.scan over a 2-D kmap mesh (Dirichlet edges)."""
    mesh = lib.kmap(kernel_size=(3, 3), padding="same", relative=True)
    mesh[:, :] = lambda u: u[0, 0] + 0.2 * (u[1, 0] + u[-1, 0] + u[0, 1] + u[0, -1] - 4 * u[0, 0])
    mesh[0] = mesh[-1] = lambda u: u[0, 0]
    mesh[:, 0] = mesh[:, -1] = lambda u: u[0, 0]
    u0 = jnp.abs(_rand(51, (12, 10), dtype))
    out, _ = jax.lax.scan(lambda c, _: (mesh(c), None), u0, None, length=20)
    return _np(out)


def case_ktest_diffusion_sscan(lib, dtype=np.float32):
    """2-D diffusion as sscan over (n, i, j), fully named axes, extra args, jitted."""
    nx = ny = 10
    nt = 5
    nu = 1.0
    dx, dy = 2 / (nx - 1), 2 / (ny - 1)
    dt = 0.25 * dx * dy / nu

    @jax.jit
    @lib.sscan(
        kernel_size=(3, 3, 3),
        offset=((1, 0), (1, 1), (1, 1)),
        named_axis={0: "n", 1: "i", 2: "j"},
        relative=True,
    )
    def diffuse(T, nu, dt, dx, dy):
        c = T["n-1", "i", "j"]
        return (
            c
            + nu * dt / dy**2 * (T["n-1", "i+1", "j"] - 2 * c + T["n-1", "i-1", "j"])
            + nu * dt / dx**2 * (T["n-1", "i", "j+1"] - 2 * c + T["n-1", "i", "j-1"])
        )

    u = np.ones((ny, nx), dtype)
    u[int(0.5 / dy) : int(1 / dy + 1), int(0.5 / dx) : int(1 / dx + 1)] = 2
    U = jnp.ones((nt + 3, ny, nx), dtype).at[0].set(u)
    return _np(diffuse(U, nu, dt, dx, dy))


def case_ktest_convection_sscan(lib, dtype=np.float32):
    """Linear convection with an sscan mesh: identity everywhere, upwind inside."""
    nt, nx = 151, 51
    dt, dx, c = 0.5 / (nt - 1), 2.0 / (nx - 1), 0.5
    u = np.ones((nt, nx), dtype)
    for i in range(1, nx - 1):
        if (nx - 1) / 4 < i < (nx - 1) / 2:
            u[0, i] = 2
    mesh = lib.sscan(kernel_size=(3, 3), named_axis={0: "n", 1: "i"}, relative=True)
    mesh[:] = lambda v: v["i", "n"]
    mesh[1:, 1:-1] = lambda v: v["i", "n-1"] - (c * dt / dx) * (v["i", "n-1"] - v["i-1", "n-1"])
    return _np(mesh(jnp.asarray(u)))


def case_ktest_mesh_1d(lib):
    """kernex test_mesh (1-D): three regions covering the whole array."""
    mesh = lib.kmap(kernel_size=(1,), relative=True, padding="same")
    mesh[0] = lambda u: u[0] * 10
    mesh[1] = lambda u: u[0] * -10
    mesh[2:] = lambda u: u[0] * 100
    return _np(mesh(jnp.arange(1, 11)))


# --------------------------------------------------------------------------
# KERNEX_SEMANTICS.md measured examples
# --------------------------------------------------------------------------


def case_sem_kmap_k2_relative(lib):
    return _np(lib.kmap(kernel_size=(2,), relative=True)(lambda x: x[1])(_a6()))


def case_sem_kmap_k2_same(lib):
    return _np(lib.kmap(kernel_size=(2,), padding="same")(lambda x: x[0] * 10 + x[1])(_a6()))


def case_sem_kmap_k4_same(lib):
    return _np(lib.kmap(kernel_size=(4,), padding="same")(lambda x: x[0])(_a6()))


def case_sem_kmap_stride2_same_relative(lib):
    f = lib.kmap(kernel_size=(3,), strides=2, padding="same", relative=True)
    return _np(f(lambda x: x[0])(_a6()))


def case_sem_kmap_full_dim(lib):
    return _np(lib.kmap(kernel_size=(-1,))(lambda x: x.sum())(_a6()))


def case_sem_kmap_pad2_relative(lib):
    return _np(lib.kmap(kernel_size=(3,), padding=2, relative=True)(lambda x: x[0])(_a6()))


def case_sem_smap_offset_1_2(lib):
    f = lib.smap(kernel_size=(3,), offset=((1, 2),), relative=True)
    return _np(f(lambda x: x[-1] + x[1])(_a6()))


def case_sem_kscan_same_relative(lib):
    f = lib.kscan(kernel_size=(3,), padding="same", relative=True)
    return _np(f(lambda x: x[-1] + x[0])(_a6()))


def case_sem_kscan_stride2_relative(lib):
    f = lib.kscan(kernel_size=(3,), strides=2, relative=True)
    return _np(f(lambda x: x[-1] + x[0])(_a6()))


def case_sem_kscan_k2(lib):
    return _np(lib.kscan(kernel_size=(2,))(lambda x: x[0] + x[1])(_a6()))


def case_sem_named_partial_2d(lib):
    m = jnp.arange(1.0, 10.0).reshape(3, 3)
    f = lib.kmap(kernel_size=(3, 3), padding="same", named_axis={0: "i"}, relative=True)
    return _np(f(lambda x: x["i+1", 0])(m))


# --------------------------------------------------------------------------
# further behaviour (kernex-compatible)
# --------------------------------------------------------------------------


def case_beh_named_full_order(lib):
    """All axes named: x['i+1','n-1'] and x['n-1','i+1'] are the same cell."""
    m = jnp.arange(1.0, 10.0).reshape(3, 3)
    f = lib.kmap(kernel_size=(3, 3), padding="same", named_axis={0: "n", 1: "i"}, relative=True)
    return _np(f(lambda x: x["i+1", "n-1"] * 100 + x["n-1", "i+1"])(m))


def case_beh_named_partial_axis1(lib):
    """Only axis 1 named: x[1, 'j-1'] (int first, name second)."""
    m = jnp.arange(1.0, 10.0).reshape(3, 3)
    f = lib.kmap(kernel_size=(3, 3), padding="same", named_axis={1: "j"}, relative=True)
    return _np(f(lambda x: x[1, "j-1"])(m))


def case_beh_named_even_window(lib):
    """Named axis with an even window (4): names run i-1 .. i+2."""
    f = lib.kmap(kernel_size=(4,), named_axis={0: "i"}, relative=True)
    return _np(f(lambda x: jnp.stack([x["i-1"], x["i"], x["i+1"], x["i+2"]]))(_a6()))


def case_beh_named_args_kwargs(lib):
    f = lib.kmap(kernel_size=(3,), named_axis={0: "i"}, relative=True)
    return _np(f(lambda x, c, d=0.0: x["i+1"] * c + d)(_a6(), 2.0, d=0.5))


def case_beh_padding_mixed_2d(lib):
    """Per-dim padding mixing a string and a (lo, hi) pair."""
    m = _rand(61, (5, 6))
    f = lib.kmap(kernel_size=(3, 3), padding=("valid", (2, 0)))
    return _np(f(lambda x: x[0, 0] + 10 * x[2, 2])(m))


def case_beh_padding_int_tuple(lib):
    """Tuple of ints: the same padding on both sides of each dim."""
    m = _rand(62, (4, 5))
    f = lib.kmap(kernel_size=(3, 2), padding=(1, 0), relative=True)
    return _np(f(lambda x: x[0, 0] - x[1, 1])(m))


def case_beh_padding_negative_trim(lib):
    f = lib.kmap(kernel_size=(3,), padding=((-1, 2),), relative=True)
    return _np(f(lambda x: x[0])(_a6()))


def case_beh_args_kwargs(lib):
    """Extra positional and keyword arguments are passed to the kernel."""
    f = lib.kmap(kernel_size=(3,), relative=True)(lambda x, w, b=1.0: x[0] * w + b)
    return _np(f(_a6(), 10.0, b=0.5))


def case_beh_array_arg(lib):
    """An array argument is passed whole (not split per window)."""
    w = jnp.array([1.0, 10.0, 100.0])
    return _np(lib.kmap(kernel_size=(3,))(lambda x, k: (x * k).sum())(_a6(), w))


def case_beh_window_array_absolute(lib):
    """relative=False: the window as an array is in natural order."""
    w = jnp.array([1.0, 10.0, 100.0])
    return _np(lib.kmap(kernel_size=(3,))(lambda x: (x * w).sum())(_a6()))


def case_beh_vector_output(lib):
    """A kernel returning a vector adds a trailing dim."""
    f = lib.kmap(kernel_size=(3,), padding="same")(lambda x: jnp.stack([x.min(), x.max()]))
    return _np(f(_a6()))


def case_beh_int_input_float_kernel_kmap(lib):
    """kmap output dtype is the kernel's: int32 input, float kernel -> float32."""
    f = lib.kmap(kernel_size=(3,), relative=True)(lambda x: x[0] * 0.5)
    return _np(f(jnp.arange(1, 7)))


def case_beh_int_input_float_kernel_smap(lib):
    """smap writes into the input: result cast back to int32 (truncation)."""
    f = lib.smap(kernel_size=(3,), relative=True)(lambda x: x[0] * 0.5 + x[1])
    return _np(f(jnp.arange(1, 7)))


def case_beh_int_input_float_kernel_kscan(lib):
    """kscan also writes into the (int) working array: cast to int32."""
    f = lib.kscan(kernel_size=(3,), padding="same", relative=True)(lambda x: x[0] * 0.5 + x[-1])
    return _np(f(jnp.arange(1, 7)))


def case_beh_kernel_returns_python_int(lib):
    """kmap of a kernel returning a Python int on float input -> int32 output."""
    return _np(lib.kmap(kernel_size=(3,))(lambda x: 1)(_a6()))


def case_beh_kscan_same_sum3(lib):
    """kscan 'same': the last window reads the (not yet visited) zero pad."""
    f = lib.kscan(kernel_size=(3,), padding="same", relative=True)
    return _np(f(lambda x: x[-1] + x[0] + x[1])(_a6()))


def case_beh_kscan_pad2(lib):
    """kscan with padding wider than 'same': results land in pad cells and are read back."""
    f = lib.kscan(kernel_size=(3,), padding=2, relative=True)
    return _np(f(lambda x: x[-1] + x[0] + x[1])(_a6()))


def case_beh_kscan_pad_right(lib):
    f = lib.kscan(kernel_size=(3,), padding=((0, 2),), relative=True)
    return _np(f(lambda x: x[-1] + x[0] + x[1])(_a6()))


def case_beh_kscan_k4_same(lib):
    return _np(lib.kscan(kernel_size=(4,), padding="same")(lambda x: x.sum())(_a6()))


def case_beh_kscan_2d_same(lib):
    m = jnp.arange(1.0, 17.0).reshape(4, 4)
    f = lib.kscan(kernel_size=(3, 3), padding="same", relative=True)
    return _np(f(lambda x: x[-1, 0] + x[0, -1] + x[0, 0])(m))


def case_beh_kscan_2d_stride2(lib):
    m = jnp.arange(1.0, 17.0).reshape(4, 4)
    f = lib.kscan(kernel_size=(3, 3), padding="same", strides=2, relative=True)
    return _np(f(lambda x: x[-1, 0] + x[0, -1] + x[0, 0])(m))


def case_beh_smap_2d_offset1(lib):
    m = jnp.arange(1.0, 17.0).reshape(4, 4)
    f = lib.smap(kernel_size=(3, 3), offset=1, relative=True)
    return _np(f(lambda x: x[-1, 0] + x[1, 0] + 100)(m))


def case_beh_smap_2d_offset_pairs(lib):
    m = jnp.arange(1.0, 17.0).reshape(4, 4)
    f = lib.smap(kernel_size=(3, 3), offset=((1, 0), (0, 2)), relative=True)
    return _np(f(lambda x: x[-1, 0] + x[0, 1] + 100)(m))


def case_beh_smap_2d_offset_int_tuple(lib):
    """offset=(1, 0): dim 0 skips one row at each end, dim 1 skips nothing."""
    m = jnp.arange(1.0, 17.0).reshape(4, 4)
    f = lib.smap(kernel_size=(3, 3), offset=(1, 0), relative=True)
    return _np(f(lambda x: x[0, 0] + x[0, 1] + 100)(m))


def case_beh_smap_offset0_absolute(lib):
    """smap windows are centred with zero padding: absolute x[0] is the left neighbour."""
    return _np(lib.smap(kernel_size=(3,))(lambda x: x[0])(_a6()))


def case_beh_smap_stride2(lib):
    f = lib.smap(kernel_size=(3,), offset=1, strides=2, relative=True)
    return _np(f(lambda x: x[0] + 100)(_a6()))


def case_beh_smap_mesh(lib):
    """smap mesh: indices are array positions; only the offset range is computed."""
    f = lib.smap(kernel_size=(3,), offset=1, relative=True)
    f[:] = lambda x: x[0] * 10
    f[2] = lambda x: x[0] * 0 - 1.0
    return _np(f(_a6()))


def case_beh_sscan_docstring(lib):
    f = lib.sscan(kernel_size=(3,), relative=True, offset=((2, 0),))
    return _np(f(lambda x: x[-1] + x[0] + x[1])(jnp.arange(1, 6)))


def case_beh_smap_docstring(lib):
    f = lib.smap(kernel_size=(2,), relative=True, offset=((2, 0),))
    return _np(f(lambda x: x[0] + x[1])(jnp.arange(1, 6)))


def case_beh_sscan_2d_offset1(lib):
    m = jnp.arange(1.0, 17.0).reshape(4, 4)
    f = lib.sscan(kernel_size=(3, 3), offset=1, relative=True)
    return _np(f(lambda x: x[-1, 0] + x[0, -1])(m))


def case_beh_sscan_2d_offset_pairs(lib):
    m = jnp.arange(1.0, 17.0).reshape(4, 4)
    f = lib.sscan(kernel_size=(3, 3), offset=((1, 0), (1, 1)), relative=True)
    return _np(f(lambda x: x[-1, 0] + x[0, -1] + x[-1, 1])(m))


def case_beh_mesh_later_wins(lib):
    f = lib.kmap(kernel_size=(3,), padding="same", relative=True)
    f[:] = lambda x: x[0]
    f[1:4] = lambda x: x[0] * 10
    f[2] = lambda x: x[0] * 100
    return _np(f(_a6()))


def case_beh_mesh_chained_2d(lib):
    m = _rand(71, (4, 5))
    f = lib.kmap(kernel_size=(3, 3), padding="same", relative=True)
    f[:, :] = lambda x: x[0, 0]
    f[:, 0] = f[:, -1] = lambda x: x[0, 1] + x[0, -1]
    f[0, 1:] = lambda x: 10 * x[1, 0]
    return _np(f(m))


def case_beh_mesh_negative_index(lib):
    f = lib.kmap(kernel_size=(3,), padding="same", relative=True)
    f[:] = lambda x: x[0]
    f[-1] = lambda x: x[-1] * 100
    f[:-4] = lambda x: x[1] * 10
    return _np(f(_a6()))


def case_beh_mesh_step_from_zero(lib):
    """Stepped slice starting at 0 (kernex is right for these; see quirk_mesh_step_offset)."""
    f = lib.kmap(kernel_size=(3,), padding="same", relative=True)
    f[:] = lambda x: x[0]
    f[::2] = lambda x: x[1] + x[-1]
    return _np(f(_a6()))


def case_beh_mesh_int_row_2d(lib):
    """A single int on a 2-D mesh selects a whole row."""
    m = _rand(72, (3, 4))
    f = lib.kmap(kernel_size=(3, 3), padding="same", relative=True)
    f[:, :] = lambda x: x[0, 0]
    f[1] = lambda x: x[-1, 0] + x[1, 0]
    return _np(f(m))


def case_beh_map_kind_lmap(lib):
    f = lib.kmap(kernel_size=(3,), relative=True, map_kind="lmap")
    return _np(f(lambda x: x[-1] + x[0] + x[1])(_a6()))


def case_beh_grad_kmap(lib, dtype=np.float32):
    """Gradient through a 'same' 5-point Laplacian (sum of squares)."""
    lap = lib.kmap(kernel_size=(3, 3), padding="same", relative=True)(
        lambda u: u[1, 0] + u[-1, 0] + u[0, 1] + u[0, -1] - 4 * u[0, 0]
    )
    x = _rand(81, (6, 7), dtype)
    return _np(jax.grad(lambda v: jnp.sum(lap(v) ** 2))(x))


def case_beh_grad_kscan(lib, dtype=np.float32):
    """Gradient through a kscan (sequential dependency)."""
    f = lib.kscan(kernel_size=(3,), padding="same", relative=True)(
        lambda x: 0.5 * x[-1] + x[0] * x[1]
    )
    x = _rand(82, (8,), dtype)
    return _np(jax.grad(lambda v: jnp.sum(f(v)))(x))


def case_beh_jit_vmap_kmap(lib):
    """jit(vmap(kmap)) over a batch of 1-D signals."""
    f = lib.kmap(kernel_size=(3,), padding="same", relative=True)(lambda x: x[-1] - 2 * x[0] + x[1])
    return _np(jax.jit(jax.vmap(f))(_rand(83, (3, 9))))


# --------------------------------------------------------------------------
# kernex quirks (see DIVERGENT / QUIRKS below)
# --------------------------------------------------------------------------


def case_quirk_mesh_uncovered_first_fn(lib):
    """kernex: uncovered cells get the first-registered function -> [2,3,2,2,2,2]."""
    f = lib.kmap(kernel_size=(3,), padding="same", relative=True)
    f[0] = lambda x: x[0] * 0 + 2.0
    f[1] = lambda x: x[0] * 0 + 3.0
    return _np(f(_a6()))


def case_quirk_mesh_single_region(lib):
    """kernex: a mesh with one region applies it everywhere -> all 2."""
    f = lib.kmap(kernel_size=(3,), padding="same", relative=True)
    f[0] = lambda x: x[0] * 0 + 2.0
    return _np(f(_a6()))


def case_quirk_ktest_mesh_2d(lib):
    """kernex test_mesh (2-D): row 0 cols 1.. and (1, 0) are uncovered -> first fn."""
    mesh = lib.kmap(kernel_size=(3, 3), relative=True, padding="same")
    mesh[0, 0] = lambda x: x[0, 0] * 10
    mesh[1, 1:] = lambda x: x[0, 0] * -10
    mesh[2:] = lambda x: x[0, 0] * 100
    return _np(mesh(jnp.arange(1, 26).reshape(5, 5)))


def case_quirk_relative_wrap_read(lib):
    """kernex: relative x[2] in a size-3 window wraps to x[-1]; xstencil raises."""
    return _np(lib.kmap(kernel_size=(3,), relative=True)(lambda x: x[2])(_a6()))


def case_quirk_relative_window_array_rolled(lib):
    """relative=True + window used as an array: kernex passes the *rolled* window
    [centre, right, left], so (x * w).sum() weights it in that order."""
    w = jnp.array([1.0, 10.0, 100.0])
    return _np(lib.kmap(kernel_size=(3,), relative=True)(lambda x: (x * w).sum())(_a6()))


def case_quirk_relative_return_window(lib):
    """relative=True, returning the window: rolled order [c, c+1, ..., c-1]."""
    return _np(lib.kmap(kernel_size=(4,), relative=True)(lambda x: x)(_a6()))


def case_quirk_mesh_step_offset(lib):
    """kernex tests `pos % step == 0` (not `(pos - start) % step`): f[1::2] hits 2 and 4."""
    f = lib.kmap(kernel_size=(3,), padding="same", relative=True)
    f[:] = lambda x: x[0]
    f[1::2] = lambda x: x[0] * 100
    return _np(f(_a6()))


def case_quirk_mesh_reassign_same_fn(lib):
    """Regions are grouped per function object, ordered by the function's *first*
    registration: re-assigning f at [2] after g covered [1:] does not win."""
    f_ = lambda x: x[0]  # noqa: E731
    g_ = lambda x: x[0] * 10  # noqa: E731
    f = lib.kmap(kernel_size=(3,), padding="same", relative=True)
    f[:] = f_
    f[1:] = g_
    f[2] = f_
    return _np(f(_a6()))


def case_quirk_mesh_valid_centre_index(lib):
    """Mesh indices are window-centre positions in *input* coordinates, not output
    positions: with 'valid' padding output j has centre j+1, so f[1] hits output 0
    and f[-1] (= input 5) hits nothing."""
    f = lib.kmap(kernel_size=(3,), padding="valid", relative=True)
    f[:] = lambda x: x[0]
    f[1] = lambda x: x[0] * 100
    f[-1] = lambda x: x[0] * 1000
    return _np(f(_a6()))


def case_quirk_mesh_stride_centre_index(lib):
    """Same with strides: 'same', stride 2 -> centres 0, 2, 4; f[2] hits output 1."""
    f = lib.kmap(kernel_size=(3,), padding="same", strides=2, relative=True)
    f[:] = lambda x: x[0]
    f[2] = lambda x: x[0] * 100
    f[3] = lambda x: x[0] * 1000
    return _np(f(_a6()))


def case_quirk_named_axis_absolute(lib):
    """named_axis with relative=False: names still span i-1..i+1 but index the
    un-rolled window, so 'i-1' is the window's *last* cell (wrap)."""
    f = lib.kmap(kernel_size=(3,), named_axis={0: "i"}, relative=False)
    return _np(f(lambda x: jnp.stack([x["i-1"], x["i"], x["i+1"]]))(_a6()))


def case_quirk_kscan_reverse(lib):
    """scan_kwargs={'reverse': True} visits windows last-to-first (changes the result)."""
    f = lib.kscan(kernel_size=(3,), padding="same", relative=True, scan_kwargs={"reverse": True})
    return _np(f(lambda x: x[-1] + x[0] + x[1])(_a6()))


# Cases where xstencil is documented (DESIGN.md section 3) to differ from kernex.
DIVERGENT = {
    "quirk_relative_wrap_read": "out-of-window reads raise IndexError in xstencil",
}

# kernex behaviour that the docs do not settle; compare only deliberately.
QUIRKS = {
    "quirk_relative_window_array_rolled": "relative=True passes the rolled window",
    "quirk_relative_return_window": "relative=True passes the rolled window",
    "quirk_mesh_step_offset": "kernex step test ignores the slice start",
    "quirk_mesh_reassign_same_fn": "priority by first registration of a function",
    "quirk_mesh_valid_centre_index": "mesh index = window centre in input coords",
    "quirk_mesh_stride_centre_index": "mesh index = window centre in input coords",
    "quirk_named_axis_absolute": "named axes assume relative indexing",
    "quirk_kscan_reverse": "scan_kwargs reverse changes the visiting order",
}


def _collect():
    cases, f64 = {}, set()
    for name, fn in list(globals().items()):
        if name.startswith("case_") and callable(fn):
            key = name[len("case_") :]
            cases[key] = fn
            if "dtype" in inspect.signature(fn).parameters:
                f64.add(key)
    return cases, frozenset(f64)


CASES, F64_CASES = _collect()


def run_case(name, lib, dtype=None):
    """Run case ``name`` (strip a ``__f64`` suffix for the float64 variant)."""
    if name.endswith("__f64"):
        return CASES[name[: -len("__f64")]](lib, dtype=np.float64)
    fn = CASES[name]
    return fn(lib) if dtype is None else fn(lib, dtype=dtype)
