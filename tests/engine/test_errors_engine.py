"""Bad input to the array API: each error names the call, the argument and
the bad value, and says what is expected (issue 2, "Bad input")."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

import xstencil
from xstencil import WindowIndexError, XStencilError

A6 = np.arange(1.0, 7.0, dtype=np.float32)
M = np.arange(20.0, dtype=np.float32).reshape(4, 5)


def first(x):
    return x[0]


def E(text: str) -> str:
    return re.escape(text)


@pytest.mark.parametrize(
    "call,x,match",
    [
        (lambda: xstencil.kmap(kernel_size=(3, 3)), A6,
         E("xstencil.kmap: kernel_size=(3, 3) has rank 2 but the array has shape (6,)")),
        (lambda: xstencil.kscan(kernel_size=(3,)), M,
         E("xstencil.kscan: kernel_size=(3,) has rank 1 but the array has shape (4, 5)")),
        (lambda: xstencil.smap(kernel_size=3), M,
         E("xstencil.smap: kernel_size=3 is a single int but the array has 2 dims")),
    ],
)
def test_kernel_size_rank_mismatch(call, x, match):
    with pytest.raises(XStencilError, match=match):
        call()(first)(x)


@pytest.mark.parametrize(
    "kernel_size,padding,match",
    [
        ((9,), 0, "kernel_size 9 along axis 0 is larger than the padded length 6"),
        ((9,), 1, "kernel_size 9 along axis 0 is larger than the padded length 8"),
        ((3, 7), "same", None),  # fits once padded: no error
        ((3, 7), "valid", "kernel_size 7 along axis 1 is larger than the padded length 5"),
    ],
)
def test_kernel_larger_than_padded_array(kernel_size, padding, match):
    x = A6 if len(kernel_size) == 1 else M
    f = xstencil.kmap(kernel_size=kernel_size, padding=padding)(lambda u: u.sum())
    if match is None:
        assert f(x).shape == x.shape
        return
    with pytest.raises(XStencilError, match=E("xstencil.kmap: " + match)):
        f(x)


@pytest.mark.parametrize("strides,bad", [(0, "0"), (-1, "-1"), ((1, 0), "0"),
                                         ((2, -3), "-3"), (1.5, "1.5")])
@pytest.mark.parametrize("kind", ["kmap", "kscan", "smap", "sscan"])
def test_non_positive_strides(kind, strides, bad):
    with pytest.raises(XStencilError,
                       match=E(f"xstencil.{kind}: strides={strides!r} holds {bad}; strides "
                               f"must be positive ints")):
        getattr(xstencil, kind)(kernel_size=(3, 3), strides=strides)(first)(M)


@pytest.mark.parametrize(
    "padding,match",
    [
        (((-3, -2),), "larger than the padded length 1 (length 6, padding (-3, -2))"),
        (((-6, 0),), "larger than the padded length 0 (length 6, padding (-6, 0))"),
        (-2, "larger than the padded length 2 (length 6, padding (-2, -2))"),
    ],
)
@pytest.mark.parametrize("kind", ["kmap", "kscan"])
def test_padding_that_leaves_no_output(kind, padding, match):
    with pytest.raises(XStencilError, match=E(f"xstencil.{kind}: kernel_size 3 along axis 0 "
                                              f"is ") + ".*" + E(match)):
        getattr(xstencil, kind)(kernel_size=(3,), padding=padding)(first)(A6)


@pytest.mark.parametrize(
    "options,match",
    [
        ({"padding": "full"}, E("padding='full' holds 'full'; use 'same', 'valid', an int or")),
        ({"padding": ("same", "circular")},
         E("padding=('same', 'circular') holds 'circular'; use 'same', 'valid'")),
        ({"padding": ("same", (1, 2, 3))},
         E("padding=('same', (1, 2, 3)) holds (1, 2, 3); use 'same', 'valid', an int")),
        ({"padding": ("same",)}, E("padding=('same',) has 1 entries but the array has 2 dims")),
        ({"boundary": "clamp"}, E("boundary='clamp' is not a boundary mode; use one of ('fill', "
                                 "'extend', 'periodic', 'reflect', 'symmetric', 'valid')")),
        ({"boundary": ("fill", "zero")}, E("boundary='zero' is not a boundary mode")),
        ({"boundary": ("fill",)}, E("boundary=('fill',) has 1 entries but the array has 2")),
    ],
)
def test_unknown_padding_or_boundary(options, match):
    with pytest.raises(XStencilError, match=E("xstencil.kmap: ") + match):
        xstencil.kmap(kernel_size=(3, 3), **options)(first)(M)


def test_valid_boundary_cannot_pad():
    with pytest.raises(XStencilError,
                       match=E("xstencil.kmap: boundary 'valid' along axis 1 has no halo, but "
                               "padding=('valid', 'same') pads it by (1, 1)")):
        xstencil.kmap(kernel_size=(3, 3), padding=("valid", "same"),
                      boundary=("periodic", "valid"))(first)(M)
    with pytest.raises(XStencilError,
                       match=E("xstencil.smap: boundary 'valid' along axis 0 has no halo, but "
                               "offset=0 gives (0, 0) there")):
        xstencil.smap(kernel_size=(3,), boundary="valid")(first)(A6)
    # trimming and offsets that keep the windows inside are fine
    out = xstencil.smap(kernel_size=(3,), offset=1, boundary="valid", relative=True)(
        lambda u: u[-1] + u[1])(A6)
    np.testing.assert_array_equal(out, [1, 4, 6, 8, 10, 6])


@pytest.mark.parametrize("kind", ["kscan", "sscan"])
@pytest.mark.parametrize("kernel,shape", [(lambda u: u, "(3,)"),
                                          (lambda u: jnp.stack([u[0], u[1]]), "(2,)")])
def test_scan_kernel_returning_non_scalar(kind, kernel, shape):
    with pytest.raises(XStencilError,
                       match=E(f"xstencil.{kind}: kernel '<lambda>' returned shape {shape}; a "
                               f"scan writes each result back into the array, so the kernel "
                               f"must return a scalar")):
        getattr(xstencil, kind)(kernel_size=(3,))(kernel)(A6)


@pytest.mark.parametrize("value,text", [(3, "3"), ("f", "'f'"), (None, "None"),
                                        (np.ones(2), "array([1., 1.])")])
def test_mesh_assignment_must_be_callable(value, text):
    F = xstencil.kmap(kernel_size=(3, 3))
    with pytest.raises(XStencilError, match=E(f"xstencil.kmap: F[1:] = {text}: a mesh region "
                                              f"takes a kernel function, such as F[1:] = ")):
        F[1:] = value
    with pytest.raises(XStencilError, match=E(f"xstencil.kmap: F[:, ::2] = {text}: a mesh")):
        F[:, ::2] = value


@pytest.mark.parametrize(
    "index,match",
    [
        (10, "mesh index 10 is out of range along axis 0, whose output length is 4"),
        (-5, "mesh index -5 is out of range along axis 0, whose output length is 4"),
        ((0, 5), "mesh index (0, 5) is out of range along axis 1, whose output length is 5"),
        ((1, 2, 3), "mesh index (1, 2, 3) has 3 entries but the output has 2 dims"),
        (np.ones((4, 4), bool), "a mask region has shape (4, 4) but the output has shape "
                                "(4, 5)"),
        ((0, [1, 2]), "mesh index (0, [1, 2]) holds [1, 2]; use ints, slices"),
        ((0, np.array([1, 2])), "mesh index (0, <int64 array of shape (2,)>) holds "
                                "array([1, 2]); use ints, slices"),
        ((slice(None), 9), "mesh index (:, 9) is out of range along axis 1"),
    ],
    ids=["int", "negative", "axis-1", "too-many", "mask-shape", "fancy-list", "fancy-array",
         "slice-and-int"],
)
def test_mesh_index_out_of_range(index, match):
    F = xstencil.kmap(kernel_size=(3, 3), padding="same")
    F[index] = first
    with pytest.raises(XStencilError, match=E("xstencil.kmap: " + match)):
        F(M)


def test_mesh_index_is_checked_against_the_output_grid():
    """'valid' on 6 cells has 4 outputs: index 4 is out of range."""
    F = xstencil.kmap(kernel_size=(3,))
    F[4] = first
    with pytest.raises(XStencilError, match=E("mesh index 4 is out of range along axis 0, "
                                              "whose output length is 4")):
        F(A6)


@pytest.mark.parametrize(
    "x,match",
    [
        ([1.0, 2.0, 3.0], "the input must be an array (numpy or JAX), got list: [1.0, 2.0, 3.0]"),
        ("abc", "the input must be an array (numpy or JAX), got str: 'abc'"),
        (None, "the input must be an array (numpy or JAX), got NoneType: None"),
        (np.array(["a", "b", "c"]), "the input has dtype <U1, which is not numeric"),
        (np.float32(1.0), "the input is a scalar; stencils need an array"),
    ],
)
def test_non_array_input(x, match):
    with pytest.raises(XStencilError, match=E("xstencil.kmap: " + match)):
        xstencil.kmap(kernel_size=(1,))(first)(x)


# -- even windows with relative=True: the centre is at (k - 1) // 2, leaning left ------

@pytest.mark.parametrize(
    "k,reads",
    [(2, {0: [1, 2, 3, 4, 5], 1: [2, 3, 4, 5, 6]}),
     (4, {-1: [1, 2, 3], 0: [2, 3, 4], 1: [3, 4, 5], 2: [4, 5, 6]})],
)
def test_even_window_centre_leans_left(k, reads):
    """Size k reaches offsets -(k-1)//2 .. k//2: for k=4, x[0] is the window's
    second cell, x[-1] its first and x[2] its last."""
    for offset, expected in reads.items():
        out = xstencil.kmap(kernel_size=(k,), relative=True)(lambda u, o=offset: u[o])(A6)
        np.testing.assert_array_equal(out, expected)
    lo, hi = -((k - 1) // 2), k // 2
    for offset in (lo - 1, hi + 1):
        with pytest.raises(WindowIndexError,
                           match=E(f"read at offset {offset} along axis 0 is outside the "
                                   f"window, which reaches offsets {lo}..{hi}")):
            xstencil.kmap(kernel_size=(k,), relative=True)(lambda u, o=offset: u[o])(A6)


def test_even_window_centre_2d_and_same_padding():
    """'same' pads ((k-1)//2, k//2), so the centre of each window is its
    output position: x[0, 0] gives the input back for even sizes too."""
    out = xstencil.kmap(kernel_size=(2, 4), padding="same", relative=True)(
        lambda u: u[0, 0])(M)
    np.testing.assert_array_equal(out, M)
    out = xstencil.kmap(kernel_size=(2, 4), padding="same", relative=True)(
        lambda u: u[1, 2] - u[0, -1])(M)
    np.testing.assert_array_equal(out[:-1, 1:-2], M[1:, 3:] - M[:-1, :-3])


# -- reads outside the window ---------------------------------------------------------

@pytest.mark.parametrize(
    "options,kernel,x,match",
    [
        ({"kernel_size": (3,), "relative": True}, lambda u: u[2], A6,
         "x read at offset 2 along axis 0 is outside the window, which reaches offsets -1..1"),
        ({"kernel_size": (3, 3), "relative": True}, lambda u: u[0, -2], M,
         "x read at offset -2 along axis 1 is outside the window, which reaches offsets -1..1"),
        ({"kernel_size": (3, 3), "relative": True, "named_axis": {0: "n", 1: "i"}},
         lambda u: u["n-1", "i+2"], M,
         "x read at offset 2 along 'i' is outside the window, which reaches offsets -1..1"),
        ({"kernel_size": (5,), "named_axis": {0: "i"}, "relative": True},
         lambda u: u["i-3"], A6,
         "x read at offset -3 along 'i' is outside the window, which reaches offsets -2..2"),
    ],
)
@pytest.mark.parametrize("kind", ["kmap", "kscan", "smap"])
def test_read_outside_the_window_raises_index_error(kind, options, kernel, x, match):
    """kernex rolls the window, so such reads wrap around silently."""
    with pytest.raises(IndexError, match=E(match)) as info:
        getattr(xstencil, kind)(**options)(kernel)(x)
    assert isinstance(info.value, WindowIndexError)
    assert str(info.value).startswith(f"xstencil.{kind}: kernel '<lambda>'")


def test_read_outside_the_window_in_a_mesh_region():
    F = xstencil.kmap(kernel_size=(3,), relative=True, padding="same")
    F[...] = lambda u: u[0]
    F[0] = lambda u: u[-2]
    with pytest.raises(IndexError, match=E("offset -2 along axis 0 is outside the window")):
        F(A6)


@pytest.mark.parametrize("kind", ["smap", "sscan"])
def test_a_window_wider_than_the_data_names_kernel_size_for_smap(kind: str) -> None:
    """smap and sscan have no ``padding=``: the refusal of a window that pads
    past the data named it and raised a bare KeyError (found by
    tests/test_fuzz_specs.py); it names ``kernel_size`` and its fix."""
    fn = getattr(xstencil, kind)(lambda x: jnp.zeros((), x.dtype), kernel_size=(1, 2050))
    with pytest.raises(XStencilError, match=r"kernel_size=\(1, 2050\) pads axis 1 \(length 5\) "
                                            r"by \(1024, 1025\).*use a smaller kernel_size"):
        fn(jnp.zeros((4, 5), jnp.float32))


def test_padding_wider_than_the_data_names_padding_for_kmap() -> None:
    fn = xstencil.kmap(lambda x: x[0, 0], kernel_size=(1, 3), padding=((0, 0), (3000, 3000)))
    with pytest.raises(XStencilError, match=r"padding=.*pads axis 1 \(length 5\) by "
                                            r"\(3000, 3000\).*'same', 'valid' or a smaller int"):
        fn(jnp.zeros((4, 5), jnp.float32))
