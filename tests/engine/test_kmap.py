"""kmap and smap against the numpy loop reference (tests/reference.py)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import xstencil
from tests import reference as ref

BOUNDARIES = ["fill", "extend", "periodic", "reflect", "symmetric", "valid"]
DTYPES = [np.float32, np.float64, np.int32]
# ndim -> (shape, kernel_size); sizes mix odd and even windows
GRIDS = {1: ((9,), (3,)), 2: ((5, 6), (3, 2)), 3: ((4, 5, 3), (3, 1, 2))}


def data(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-9, 10, shape).astype(dtype)
    return (3 * rng.standard_normal(shape)).astype(dtype)


def check(out: Any, expected: np.ndarray, dtype: Any = None) -> None:
    out = np.asarray(out)
    dtype = expected.dtype if dtype is None else np.dtype(dtype)
    assert out.dtype == dtype
    assert out.shape == expected.shape
    if dtype.kind in "iub":
        np.testing.assert_array_equal(out, expected)
    else:
        tol = 1e-12 if dtype == np.float64 else 2e-5
        np.testing.assert_allclose(out, expected, rtol=tol, atol=10 * tol)


def stacked(xp: Any, ks: tuple[int, ...], dtype: Any) -> Any:
    """Every array-style kernel, plus pure offset reads, in one kernel (one
    compile): the result is their outputs, flattened and concatenated."""
    kernels = list(ref.array_kernels(xp, ks, dtype).values())
    kernels.append(ref.offset_kernel(ks, relative=False))

    def kernel(x: Any) -> Any:
        return xp.concatenate([xp.ravel(xp.asarray(k(x)).astype(x.dtype)) for k in kernels])

    return kernel


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_kernels_match_reference(boundary, ndim, dtype, fallbacks, request):
    """Offset reads, jnp.sum(x*w), max, mean, x @ v, where, median (lowered to
    shifted slices) and x.ravel()[argmax(x)] (the fallback) all agree with the
    loop, for every boundary mode, rank and dtype."""
    if dtype == np.float64:
        request.getfixturevalue("x64")
    shape, ks = GRIDS[ndim]
    x = data(shape, dtype, seed=ndim)
    opts = {"kernel_size": ks, "boundary": boundary, "fill_value": 2,
            "padding": "valid" if boundary == "valid" else "same"}

    out = xstencil.kmap(**opts)(stacked(jnp, ks, dtype))(x)
    check(out, ref.stencil("kmap", x, stacked(np, ks, dtype), **opts))
    assert fallbacks == [], "array-style kernels must lower to shifted slices"

    out = xstencil.kmap(**opts)(ref.data_dependent_kernel(jnp))(x)
    check(out, ref.stencil("kmap", x, ref.data_dependent_kernel(np), **opts))
    assert fallbacks, "data-dependent indexing must take the fallback"


def test_reference_reproduces_kernex_measurements():
    """The reference itself gives KERNEX_SEMANTICS.md's measured numbers."""
    a = np.arange(1.0, 7.0)
    s = ref.stencil
    np.testing.assert_array_equal(
        s("kmap", a, lambda x: x[1], kernel_size=(2,), relative=True), [2, 3, 4, 5, 6])
    np.testing.assert_array_equal(
        s("kmap", a, lambda x: x[0] * 10 + x[1], kernel_size=(2,), padding="same"),
        [12, 23, 34, 45, 56, 60])
    np.testing.assert_array_equal(
        s("kmap", a, lambda x: x[0], kernel_size=(4,), padding="same"), [0, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(
        s("kmap", a, lambda x: x[0], kernel_size=(3,), strides=2, padding="same",
          relative=True), [1, 3, 5])
    np.testing.assert_array_equal(s("kmap", a, lambda x: x.sum(), kernel_size=(-1,)), [21])
    np.testing.assert_array_equal(
        s("kmap", a, lambda x: x[0], kernel_size=(3,), padding=2, relative=True),
        [0, 1, 2, 3, 4, 5, 6, 0])
    np.testing.assert_array_equal(
        s("smap", a, lambda x: x[-1] + x[1], kernel_size=(3,), offset=((1, 2),),
          relative=True), [1, 4, 6, 8, 5, 6])
    np.testing.assert_array_equal(
        s("kscan", a, lambda x: x[-1] + x[0], kernel_size=(3,), padding="same",
          relative=True), [1, 3, 6, 10, 15, 21])
    np.testing.assert_array_equal(
        s("kscan", a, lambda x: x[-1] + x[0], kernel_size=(3,), strides=2, relative=True),
        [3, 7])
    np.testing.assert_array_equal(
        s("kscan", a, lambda x: x[0] + x[1], kernel_size=(2,)), [3, 5, 7, 9, 11])
    m = np.arange(1.0, 10.0).reshape(3, 3)
    np.testing.assert_array_equal(
        s("kmap", m, lambda x: x["i+1", 0], kernel_size=(3, 3), padding="same",
          named_axis={0: "i"}, relative=True),
        [[4, 5, 6], [7, 8, 9], [0, 0, 0]])


def test_reference_extension_matches_engine_boundary():
    """np.pad-based halos equal the engine's index arithmetic, for widths
    beyond the array length and for trims."""
    from xstencil._engine.boundary import source_index

    for mode in ["fill", "extend", "periodic", "reflect", "symmetric"]:
        for n in (1, 2, 3, 5):
            x = np.arange(1.0, n + 1)
            for lo, hi in [(0, 0), (3, 7), (-1, 4), (9, -2), (2, 2)]:
                if n + lo + hi <= 0:
                    continue
                idx = source_index(np.arange(-lo, n + hi), n, mode)
                expected = np.where(idx < 0, -7.0, x[np.clip(idx, 0, None)])
                got = ref.extend(x, [(lo, hi)], [mode], -7.0)
                np.testing.assert_array_equal(got, expected, err_msg=f"{mode} {n} {lo} {hi}")


# -- every option -------------------------------------------------------------------

PADDINGS = [
    "same",
    "valid",
    1,
    (1, 0),                      # one int per dim, both sides
    ((1, 2), (0, 1)),            # (lo, hi) per dim
    ("valid", (2, 0)),           # mixed strings and pairs
    ((-1, 2), (1, -1)),          # negative values trim
    ((-1, -1), 0),
]


@pytest.mark.parametrize("boundary", ["fill", "periodic", "reflect"])
@pytest.mark.parametrize("padding", PADDINGS, ids=repr)
def test_padding_forms(padding, boundary):
    x = data((5, 6), np.float32)
    ks = (3, 2)
    w = np.arange(1.0, 7.0, dtype=np.float32).reshape(ks)
    opts = {"kernel_size": ks, "padding": padding, "boundary": boundary, "fill_value": -1.5}
    out = xstencil.kmap(**opts)(lambda u: jnp.sum(u * w))(x)
    check(out, ref.stencil("kmap", x, lambda u: np.sum(u * w), **opts))


@pytest.mark.parametrize(
    "shape,ks,strides,padding",
    [
        ((9,), (3,), 2, "same"),
        ((10,), (4,), 3, "valid"),
        ((10,), (2,), (3,), ((1, 2),)),
        ((7, 8), (3, 3), (2, 1), "same"),
        ((7, 8), (2, 3), (1, 3), ((0, 1), (-1, 2))),
        ((5, 6, 4), (3, 3, 1), 2, "same"),
    ],
)
@pytest.mark.parametrize("boundary", ["fill", "symmetric"])
def test_strides(shape, ks, strides, padding, boundary):
    x = data(shape, np.float32, seed=3)
    opts = {"kernel_size": ks, "strides": strides, "padding": padding, "boundary": boundary}
    kernel = ref.offset_kernel(ks, relative=True)
    out = xstencil.kmap(relative=True, **opts)(kernel)(x)
    check(out, ref.stencil("kmap", x, kernel, relative=True, **opts))


@pytest.mark.parametrize(
    "shape,ks,padding",
    [((6,), (-1,), 0), ((4, 5), (-1, 3), "same"), ((4, 5), (3, -1), ((1, 1), 0)),
     ((4, 5), (-1, -1), "valid")],
)
def test_kernel_size_minus_one_is_the_whole_dim(shape, ks, padding):
    x = data(shape, np.float32, seed=4)
    full = tuple(n if k == -1 else k for k, n in zip(ks, shape, strict=True))
    w = np.arange(float(np.prod(full)), dtype=np.float32).reshape(full)
    opts = {"kernel_size": ks, "padding": padding}
    out = xstencil.kmap(**opts)(lambda u: jnp.sum(u * w))(x)
    check(out, ref.stencil("kmap", x, lambda u: np.sum(u * w), **opts))
    if padding in (0, "valid"):
        assert all(np.shape(out)[i] == 1 for i, k in enumerate(ks) if k == -1)


def test_kernel_size_int_for_1d():
    x = data((7,), np.float32)
    a = xstencil.kmap(kernel_size=3, padding="same")(lambda u: u[0] - u[2])(x)
    b = xstencil.kmap(kernel_size=(3,), padding="same")(lambda u: u[0] - u[2])(x)
    np.testing.assert_array_equal(a, b)
    check(a, ref.stencil("kmap", x, lambda u: u[0] - u[2], kernel_size=3, padding="same"))


@pytest.mark.parametrize("ks", [(3,), (4,), (2, 3), (4, 2)])
@pytest.mark.parametrize("relative", [False, True])
def test_relative_and_absolute_reads(ks, relative):
    """Absolute reads index the window from its first cell; relative reads
    from the centre at (k-1)//2, so even sizes lean left."""
    shape = (7,) if len(ks) == 1 else (5, 6)
    x = data(shape, np.float32, seed=5)
    kernel = ref.offset_kernel(ks, relative)
    opts = {"kernel_size": ks, "padding": "same", "relative": relative}
    out = xstencil.kmap(**opts)(kernel)(x)
    check(out, ref.stencil("kmap", x, kernel, **opts))


def test_relative_window_as_array_is_rolled():
    """relative=True and the window used as an array: index 0 is the centre
    (kernex rolls the window, and so does xstencil)."""
    x = data((4, 6), np.float32, seed=6)
    w = np.arange(1.0, 13.0, dtype=np.float32).reshape(3, 4)
    opts = {"kernel_size": (3, 4), "padding": "same", "relative": True}
    out = xstencil.kmap(**opts)(lambda u: jnp.sum(u * w))(x)
    check(out, ref.stencil("kmap", x, lambda u: np.sum(u * w), **opts))


@pytest.mark.parametrize(
    "named_axis,kernel",
    [
        ({0: "n", 1: "i"}, lambda x: x["i+1", "n-1"] * 3 - x["n", "i-1"] + x["n+1", "i"]),
        # key order does not matter when every axis is named
        ({1: "i", 0: "n"}, lambda x: x["n-1", "i+1"] * 3 - x["i-1", "n"] + x["i", "n+1"]),
        ({0: "i"}, lambda x: x["i+1", 0] * 3 - x["i-1", 1] + x["i", -1]),
        ({1: "j"}, lambda x: x[1, "j-1"] * 3 - x[-1, "j"] + x[0, "j+1"]),
    ],
    ids=["full", "full-reordered", "partial-0", "partial-1"],
)
def test_named_axis(named_axis, kernel):
    x = data((4, 5), np.float32, seed=7)
    opts = {"kernel_size": (3, 3), "padding": "same", "relative": True,
            "named_axis": named_axis}
    out = xstencil.kmap(**opts)(kernel)(x)
    check(out, ref.stencil("kmap", x, kernel, **opts))


def test_named_axis_even_window_and_3d():
    x = data((4, 3, 5), np.float32, seed=8)
    opts = {"kernel_size": (2, 3, 4), "padding": "same", "relative": True,
            "named_axis": {0: "t", 2: "x"}}

    def kernel(u):
        return u["t+1", 0, "x+2"] * 2 + u["t", -1, "x-1"] - u["t", 1, "x"]

    out = xstencil.kmap(**opts)(kernel)(x)
    check(out, ref.stencil("kmap", x, kernel, **opts))


@pytest.mark.parametrize(
    "boundary",
    [("periodic", "reflect"), ("extend", "fill"), ("symmetric", "periodic"),
     ("valid", "periodic")],
    ids=lambda b: "-".join(b),
)
def test_boundary_per_axis(boundary):
    x = data((5, 7), np.float32, seed=9)
    ks = (3, 5)
    padding = tuple("valid" if b == "valid" else "same" for b in boundary)
    w = np.arange(15.0, dtype=np.float32).reshape(ks)
    opts = {"kernel_size": ks, "padding": padding, "boundary": boundary, "fill_value": 4.0}
    out = xstencil.kmap(**opts)(lambda u: jnp.sum(u * w))(x)
    check(out, ref.stencil("kmap", x, lambda u: np.sum(u * w), **opts))


def test_boundary_3d_mixed_wide_halo():
    """Halos wider than the array along an axis (reflected several times)."""
    x = data((3, 2, 4), np.float32, seed=10)
    opts = {"kernel_size": (3, 3, 3), "padding": ((4, 2), (3, 3), (1, 5)),
            "boundary": ("reflect", "symmetric", "periodic")}
    out = xstencil.kmap(**opts)(lambda u: u[0, 0, 0] * 2 + u[2, 1, 2])(x)
    check(out, ref.stencil("kmap", x, lambda u: u[0, 0, 0] * 2 + u[2, 1, 2], **opts))


@pytest.mark.parametrize("fill_value", [0, -3.5, np.nan])
def test_fill_value(fill_value):
    x = data((6,), np.float32)
    opts = {"kernel_size": (3,), "padding": "same", "fill_value": fill_value}
    out = xstencil.kmap(**opts)(lambda u: u[0] + 2 * u[2])(x)
    check(out, ref.stencil("kmap", x, lambda u: u[0] + 2 * u[2], **opts))
    if fill_value == 0:  # the default is kernex's zero padding
        np.testing.assert_array_equal(
            xstencil.kmap(kernel_size=(3,), padding="same")(lambda u: u[0] + 2 * u[2])(x), out)


def test_extra_args_and_kwargs_are_forwarded():
    x = data((7,), np.float32)
    w = np.asarray([1.0, -2.0, 3.0], np.float32)

    def kernel(u, w, scale, *, shift=0.0, bias=None):
        return jnp.sum(u * w) * scale + shift + bias[0]

    f = xstencil.kmap(kernel_size=(3,), padding="same")(kernel)
    out = f(x, jnp.asarray(w), 2.0, shift=0.5, bias=np.asarray([10.0], np.float32))
    expected = ref.stencil("kmap", x, lambda u: np.sum(u * w) * 2.0 + 0.5 + 10.0,
                           kernel_size=(3,), padding="same")
    check(out, expected)


def test_kernel_returning_an_array_adds_trailing_dims():
    """Returning the window extracts patches: output shape + window shape."""
    x = data((4, 5), np.int32)
    opts = {"kernel_size": (3, 2), "padding": "same"}
    out = xstencil.kmap(**opts)(lambda u: u)(x)
    check(out, ref.stencil("kmap", x, lambda u: u, **opts))
    assert np.asarray(out).shape == (4, 5, 3, 2)


def test_decorator_forms_and_execution_kwargs():
    """kmap(f, ...), kmap(...)(f) and the kernex execution options agree."""
    x = data((8,), np.float32)

    def kernel(u):
        return u[0] * u[2]

    a = xstencil.kmap(kernel, kernel_size=(3,))(x)
    b = xstencil.kmap(kernel_size=(3,))(kernel)(x)
    c = xstencil.kmap(kernel_size=(3,), map_kind="lmap", map_kwargs={"batch_size": 2})(kernel)(x)
    d = xstencil.kmap(kernel_size=(3,), map_kind="pmap")(kernel)(x)
    expected = ref.stencil("kmap", x, kernel, kernel_size=(3,))
    for out in (a, b, c, d):
        check(out, expected)


# -- smap ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shape,ks,offset,strides",
    [
        ((8,), (3,), 0, 1),
        ((8,), (3,), ((1, 2),), 1),
        ((8,), (4,), 1, 2),
        ((9,), (3,), ((2, 0),), 3),
        ((5, 6), (3, 3), 1, 1),
        ((5, 6), (3, 2), ((1, 0), (0, 2)), (2, 1)),
        ((5, 6), (3, 3), (1, 0), 2),
        ((3, 4, 5), (3, 1, 3), ((0, 1), 0, (1, 1)), (1, 2, 2)),
    ],
)
@pytest.mark.parametrize("boundary", ["fill", "reflect"])
def test_smap(shape, ks, offset, strides, boundary):
    """The kernel runs at positions range(lo, n - hi, stride) with centred
    windows; every other position passes the input through."""
    x = data(shape, np.float32, seed=11)
    opts = {"kernel_size": ks, "offset": offset, "strides": strides, "relative": True,
            "boundary": boundary}
    kernel = ref.offset_kernel(ks, relative=True)
    out = xstencil.smap(**opts)(kernel)(x)
    expected = ref.stencil("smap", x, kernel, **opts)
    check(out, expected)
    assert np.asarray(out).shape == x.shape


def test_smap_int_input_keeps_dtype():
    x = np.arange(1, 9, dtype=np.int32)
    out = xstencil.smap(kernel_size=(3,), offset=1, relative=True)(lambda u: u[-1] * u[1])(x)
    check(out, ref.stencil("smap", x, lambda u: u[-1] * u[1], kernel_size=(3,), offset=1,
                           relative=True))
