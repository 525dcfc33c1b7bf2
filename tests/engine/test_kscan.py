"""kscan and sscan: row-major visiting order, every write visible to later
windows (checked against the numpy loop), and the dependency analysis that
decides which axes are walked in order."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xstencil
from tests import reference as ref
from xstencil._engine.kscan import sequential_axes


def data(shape: tuple[int, ...], seed: int = 0, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def close(out: Any, expected: np.ndarray, tol: float = 2e-5) -> None:
    out = np.asarray(out)
    assert out.dtype == expected.dtype
    assert out.shape == expected.shape
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol)


# -- 1-D recurrences ----------------------------------------------------------------

RECURRENCES = {
    "left": ((3,), "same", 1, True, lambda x: x[-1] + x[0]),
    "left-and-right": ((3,), "same", 1, True, lambda x: 0.5 * x[-1] + x[0] - 0.25 * x[1]),
    "two-back": ((5,), "same", 1, True, lambda x: x[-2] * 0.5 - x[-1] * 0.25 + x[2]),
    "strided": ((3,), "valid", 2, True, lambda x: x[-1] + x[0]),
    "strided-2-back": ((5,), ((2, 1),), 2, True, lambda x: x[-2] * 0.5 + x[0] + x[1]),
    "wide-padding": ((3,), 2, 1, True, lambda x: 0.5 * (x[-1] + x[0] + x[1])),
    "pad-right": ((3,), ((0, 2),), 1, True, lambda x: 0.5 * (x[-1] + x[0] + x[1])),
    "trimmed": ((3,), -1, 1, True, lambda x: 0.5 * x[-1] + x[0] - 0.25 * x[1]),
    "even-window": ((4,), "same", 1, False, lambda x: 0.25 * x.sum()),
    "forward-only": ((2,), 0, 1, False, lambda x: x[0] + x[1]),
}


@pytest.mark.parametrize("boundary", ["fill", "extend", "periodic", "reflect"])
@pytest.mark.parametrize("case", list(RECURRENCES))
def test_1d_recurrences(case, boundary):
    """The halo is filled once from the input, before the walk (writes into
    the array do not refresh it, e.g. for periodic)."""
    ks, padding, strides, relative, kernel = RECURRENCES[case]
    x = data((9,), seed=1)
    opts = {"kernel_size": ks, "padding": padding, "strides": strides, "relative": relative,
            "boundary": boundary, "fill_value": 0.5}
    out = xstencil.kscan(**opts)(kernel)(x)
    close(out, ref.stencil("kscan", x, kernel, **opts))


def test_kernex_readme_running_sum():
    out = xstencil.kscan(kernel_size=(3,))(lambda w: jnp.sum(w))(jnp.arange(1, 6))
    np.testing.assert_array_equal(out, [6, 13, 22])
    assert out.dtype == jnp.int32


def test_int_input_truncates_at_every_write():
    """A float kernel on int data: each result is cast to int before the next
    window reads it (as kernex does)."""
    x = np.arange(1, 8, dtype=np.int32)
    kernel = lambda u: u[0] * 0.5 + u[-1]  # noqa: E731
    opts = {"kernel_size": (3,), "padding": "same", "relative": True}
    with jax.numpy_dtype_promotion("standard"):  # int * float, as kernex users write it
        out = xstencil.kscan(**opts)(kernel)(x)
    np.testing.assert_array_equal(out, ref.stencil("kscan", x, kernel, **opts))
    assert np.asarray(out).dtype == np.int32


# -- 2-D and 3-D --------------------------------------------------------------------

def convection(u: Any, c: float = 0.4) -> Any:
    return u[-1, 0] - c * (u[-1, 0] - u[-1, -1])


@pytest.mark.parametrize("boundary", ["fill", ("fill", "periodic"), ("extend", "reflect")],
                         ids=str)
def test_2d_time_causal(boundary):
    """Linear convection style: every read is at n-1."""
    x = data((12, 9), seed=2)
    opts = {"kernel_size": (3, 3), "padding": ((1, 1), (1, 1)), "relative": True,
            "boundary": boundary}
    out = xstencil.kscan(**opts)(convection)(x)
    close(out, ref.stencil("kscan", x, convection, **opts))


def test_2d_time_causal_equals_a_hand_scan_over_rows():
    """With padding (0, 1) along time, output j is row j + 1 of the input,
    computed from row j: row 0 is the initial condition."""
    x = data((10, 8), seed=3)
    out = xstencil.kscan(kernel_size=(3, 3), padding=((0, 1), (1, 1)), relative=True,
                         fill_value=0.5)(convection)(x)

    def step(prev, _):
        left = jnp.concatenate([jnp.full((1,), 0.5, prev.dtype), prev[:-1]])
        new = prev - 0.4 * (prev - left)
        return new, new

    _, rows = jax.lax.scan(step, jnp.asarray(x[0]), None, length=x.shape[0] - 1)
    np.testing.assert_allclose(np.asarray(out), np.asarray(rows), rtol=1e-5, atol=1e-6)


def causal_and_ahead(u: Any) -> Any:
    """Reads the previous row and the *next* row's input (never written yet)."""
    return 0.5 * u[-1, 0] + 0.25 * u[-1, 1] - 0.125 * u[1, 0]


@pytest.mark.parametrize("boundary", ["fill", "periodic", "reflect", ("symmetric", "fill"),
                                      ("extend", "periodic")], ids=str)
@pytest.mark.parametrize(
    "padding,strides",
    [("same", 1), ("valid", 1), ((2, 1), 1), (((1, 2), (1, 1)), 1), ("same", (1, 2)),
     ("same", (2, 1)), (((0, 1), (2, 0)), 1)],
    ids=["same", "valid", "wide", "lopsided", "stride-x", "stride-t", "shifted"],
)
def test_time_causal_rows(boundary, padding, strides):
    """Walking rows only, with the array carried unpadded where every write
    lands inside it (halo rows along time come from blocks built before the
    walk), and padded otherwise: both agree with the numpy loop."""
    x = data((9, 7), seed=5)
    opts = {"kernel_size": (3, 3), "padding": padding, "strides": strides, "relative": True,
            "boundary": boundary, "fill_value": 0.75}
    out = xstencil.kscan(**opts)(causal_and_ahead)(x)
    close(out, ref.stencil("kscan", x, causal_and_ahead, **opts))


def gauss_seidel(u: Any) -> Any:
    return 0.25 * (u[-1, 0] + u[1, 0] + u[0, -1] + u[0, 1])


@pytest.mark.parametrize(
    "kernel,ks,padding,strides",
    [
        (gauss_seidel, (3, 3), "same", 1),
        (lambda u: 0.5 * u[0, -1] + 0.3 * u[-1, 1] + 0.1 * u[1, -1], (3, 3), "same", 1),
        (lambda u: 0.5 * u[0, -1] + u[0, 0] * 0.25, (1, 3), "same", 1),   # row recurrence
        (lambda u: 0.5 * u[-1, 0] - 0.25 * u[1, 0] + u[0, 1] * 0.1, (3, 3), "same", 1),
        (lambda u: 0.3 * (u[-2, 0] + u[0, -2] + u[2, 2]), (5, 5), "same", 2),
        (lambda u: 0.3 * (u[-1, 0] + u[0, -1] + u[1, 1]), (3, 3), "same", (2, 1)),
        (lambda u: 0.5 * (u[0, 0] + u[1, 1]), (2, 2), 0, 1),             # forward only
    ],
    ids=["gauss-seidel", "left-and-up-right", "row-recurrence", "up-and-down",
         "stride-2", "stride-2-1", "forward-only"],
)
def test_2d_dependencies(kernel, ks, padding, strides):
    x = data((7, 8), seed=4)
    opts = {"kernel_size": ks, "padding": padding, "strides": strides, "relative": True,
            "boundary": "symmetric"}
    out = xstencil.kscan(**opts)(kernel)(x)
    close(out, ref.stencil("kscan", x, kernel, **opts))


def test_3d_time_causal_named():
    x = data((5, 4, 6), seed=5)
    opts = {"kernel_size": (3, 3, 3), "padding": "same", "relative": True,
            "named_axis": {0: "n", 1: "i", 2: "j"}, "boundary": ("fill", "periodic", "extend")}

    def heat(u):
        c = u["n-1", "i", "j"]
        return c + 0.1 * (u["n-1", "i+1", "j"] + u["n-1", "i-1", "j"] + u["n-1", "i", "j+1"]
                          + u["n-1", "i", "j-1"] - 4 * c)

    out = xstencil.kscan(**opts)(heat)(x)
    close(out, ref.stencil("kscan", x, heat, **opts))


def test_3d_recurrence_along_every_axis():
    x = data((3, 4, 5), seed=6)
    kernel = lambda u: 0.3 * (u[-1, 0, 0] + u[0, -1, 1] + u[0, 0, -1]) + u[1, 1, 1] * 0.1  # noqa: E731
    opts = {"kernel_size": (3, 3, 3), "padding": "same", "relative": True}
    out = xstencil.kscan(**opts)(kernel)(x)
    close(out, ref.stencil("kscan", x, kernel, **opts))


def test_data_dependent_kernel_takes_the_fallback_and_agrees(fallbacks):
    x = data((4, 6), seed=7)
    kernel = lambda u: 0.5 * u.ravel()[jnp.argmax(u)] + 0.25 * u[1, 1]  # noqa: E731
    np_kernel = lambda u: 0.5 * u.ravel()[np.argmax(u)] + 0.25 * u[1, 1]  # noqa: E731
    opts = {"kernel_size": (3, 3), "padding": "same"}
    out = xstencil.kscan(**opts)(kernel)(x)
    assert fallbacks
    close(out, ref.stencil("kscan", x, np_kernel, **opts))


# -- meshes ---------------------------------------------------------------------------

def test_kernex_readme_convection_mesh():
    """kernex's README linear convection (smaller): four kernels on a mesh."""
    nt, nx = 20, 13
    courant = 0.5 * (0.5 / (nt - 1)) / (2.0 / (nx - 1))
    quarter, half = (nx - 1) // 4 + 1, (nx - 1) // 2

    def upwind(u):
        return u["i", "n-1"] - courant * (u["i", "n-1"] - u["i-1", "n-1"])

    regions = [((slice(None), 0), lambda u: 1.0), ((slice(None), -1), lambda u: 1.0),
               ((slice(None), slice(None, quarter)), lambda u: 1.0),
               ((slice(None), slice(half, None)), lambda u: 1.0),
               ((slice(0, 1), slice(quarter, half)), lambda u: 2.0),
               ((slice(1, None), slice(1, -1)), upwind)]
    opts = {"kernel_size": (3, 3), "padding": ((1, 1), (1, 1)),
            "named_axis": {0: "n", 1: "i"}, "relative": True}
    F = xstencil.kscan(**opts)
    for index, kernel in regions:
        F[index] = kernel
    x = np.ones((nt, nx), np.float32)
    close(F(x), ref.stencil("kscan", x, regions=regions, **opts))


@pytest.mark.parametrize("kind", ["kscan", "sscan"])
def test_scan_mesh_with_row_recurrence_and_mask(kind):
    x = data((6, 7), seed=8)
    mask = (np.add.outer(np.arange(6), np.arange(7)) % 3) == 0
    regions = [(Ellipsis, lambda u: 0.5 * u[-1, 0] + 0.5 * u[0, 0]),
               ((slice(2, 5), slice(1, None, 2)), lambda u: 0.5 * u[0, -1] + 0.25 * u[1, 1]),
               (mask, lambda u: u[-1, -1] * 0.9),
               (-1, lambda u: u[0, 0] - 1.0)]
    opts: dict[str, Any] = {"kernel_size": (3, 3), "relative": True, "boundary": "reflect"}
    if kind == "kscan":
        opts["padding"] = "same"
    else:
        opts["offset"] = ((1, 0), (0, 1))
    F = getattr(xstencil, kind)(**opts)
    for index, kernel in regions:
        F[index] = kernel
    close(F(x), ref.stencil(kind, x, regions=regions, **opts))


# -- sscan ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shape,ks,offset,strides,kernel",
    [
        ((8,), (3,), ((2, 0),), 1, lambda u: u[-1] + u[0] * 0.5 + u[1] * 0.25),
        ((9,), (3,), 1, 2, lambda u: u[-1] * 0.5 + u[0]),
        ((5, 6), (3, 3), 1, 1, lambda u: 0.5 * (u[-1, 0] + u[0, -1])),
        ((5, 6), (3, 3), ((1, 0), (1, 1)), (1, 2), lambda u: 0.3 * (u[-1, 0] + u[0, -1]
                                                                    + u[-1, 1])),
    ],
)
def test_sscan(shape, ks, offset, strides, kernel):
    x = data(shape, seed=9)
    opts = {"kernel_size": ks, "offset": offset, "strides": strides, "relative": True}
    out = xstencil.sscan(**opts)(kernel)(x)
    close(out, ref.stencil("sscan", x, kernel, **opts))


# -- the dependency analysis ----------------------------------------------------------

@pytest.mark.parametrize(
    "offsets,strides,expected",
    [
        ([(-1, -1), (-1, 0), (-1, 1)], (1, 1), (0,)),          # time-causal: rows in order
        ([(-1,), (0,), (1,)], (1,), (0,)),                    # 1-D recurrence
        ([(0, -1), (0, 0)], (1, 1), (1,)),                    # row recurrence only
        ([(0, -1), (1, 0)], (1, 1), (1,)),                    # + a later row, same column
        ([(0, -1), (1, -1)], (1, 1), (0, 1)),                 # a later row, an earlier column
        ([(-1, 0), (1, 0), (0, -1), (0, 1)], (1, 1), (0, 1)),  # Gauss-Seidel
        ([(0, 1), (1, 0), (1, 1)], (1, 1), ()),               # forward only: parallel
        ([(-1, 0)], (2, 1), ()),                              # stride skips written rows
        ([(-2, 0)], (2, 1), (0,)),
        ([(0, 0, -1)], (1, 1, 1), (2,)),
        ([(-1, 0, 0), (0, 1, -1)], (1, 1, 1), (0,)),           # later cell in the same slab
        ([(-1, 0, 0), (0, -1, 1)], (1, 1, 1), (0, 1)),
        ([(0, 0, -1), (0, 1, -1)], (1, 1, 1), (1, 2)),
        ([], (1, 1), ()),
    ],
)
def test_sequential_axes(offsets, strides, expected):
    assert sequential_axes(offsets, strides) == expected


def test_time_causal_kscan_walks_rows_only():
    """The read offsets of a time-causal kernel, found at trace time, make
    axis 0 the only sequential axis: the compiled scan has one loop whose
    body writes a whole row."""
    nt, nx = 16, 11
    F = xstencil.kscan(kernel_size=(3, 3), padding="same", relative=True)(convection)
    text = jax.jit(F).lower(jnp.ones((nt, nx), jnp.float32)).as_text()
    assert text.count("stablehlo.while") == 1
    updates = [line for line in text.splitlines() if "dynamic_update_slice" in line]
    assert updates and all(f"tensor<1x{nx}xf32>" in line for line in updates), updates
    # the loop carries the array itself, not a padded copy of it
    loops = [line for line in text.splitlines() if "stablehlo.while" in line]
    assert f"tensor<{nt}x{nx}xf32>" in loops[0] and f"tensor<{nt + 2}x" not in loops[0]
