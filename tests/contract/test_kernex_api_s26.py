"""Session 26's differential attack on the array API (kmap, kscan, smap),
against hand-written JAX on explicit windows and numpy: each case crashed,
was silently wrong or misled before.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xstencil
from xstencil import KernelError, XStencilError

A = jnp.arange(1.0, 7.0)
V = jnp.array([1.0, 2.0, 3.0])


def _windows(z: jax.Array) -> jax.Array:
    """The size-3 'same' windows of a 1-D array, zero padded, by hand."""
    p = jnp.pad(z, 1)
    return jnp.stack([p[i:i + 3] for i in range(z.shape[0])])


@pytest.mark.parametrize("name, kernel, by_hand", [
    ("matmul", lambda x: x @ V, lambda w: w @ V),
    ("dot", lambda x: jnp.dot(x, V), lambda w: w @ V),
    ("einsum", lambda x: jnp.einsum("i,i", x, V), lambda w: w @ V),
    ("prod", lambda x: jnp.prod(x + 1.0), lambda w: jnp.prod(w + 1.0, axis=1)),
    ("cumprod", lambda x: jnp.cumprod(x + 1.0)[-1], lambda w: jnp.prod(w + 1.0, axis=1)),
])
def test_reverse_mode_through_products(name: str, kernel, by_hand) -> None:
    """``jax.grad`` failed: the engine's own products lacked JAX's params."""
    f = xstencil.kmap(kernel_size=(3,), padding="same")(kernel)
    got = jax.grad(lambda z: f(z).sum())(A)
    want = jax.grad(lambda z: by_hand(_windows(z)).sum())(A)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(f(A)), np.asarray(by_hand(_windows(A))), rtol=1e-6)


@pytest.mark.parametrize("kernel, reference", [
    (lambda x: x[0] + x[1:].sum(), lambda w: w[0] + w[1:].sum()),
    (lambda x: x[0] * x[1:1].prod(), lambda w: w[0] * w[1:1].prod()),
    (lambda x: x[0] + jnp.max(x[1:1], initial=-1.0), lambda w: w[0] + np.max(w[1:1], initial=-1)),
    (lambda x: x[0] + jnp.cumsum(x[1:1]).sum(), lambda w: w[0] + np.cumsum(w[1:1]).sum()),
])
def test_reductions_over_an_empty_slice(kernel, reference) -> None:
    """An empty slice of the window crashed (IndexError deep in the unroller)."""
    got = xstencil.kmap(kernel_size=(1,))(kernel)(A)
    want = [reference(np.asarray(A)[i:i + 1]) for i in range(6)]
    np.testing.assert_array_equal(np.asarray(got), want)


def test_empty_row_slice_in_2d() -> None:
    b = jnp.arange(12.0).reshape(3, 4)
    got = xstencil.kmap(kernel_size=(2, 2))(lambda x: x[:, 1:1].sum(axis=1).sum() + x[0, 0])(b)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(b)[:2, :3])


@pytest.mark.parametrize("offset", [0, 1])
def test_smap_refuses_a_non_scalar_kernel(offset: int) -> None:
    """offset=0 silently returned a (6, 3) array of patches; smap keeps the
    input's shape, as kernex says (it raises 'Output must be scalar')."""
    with pytest.raises(XStencilError, match="must return a scalar"):
        xstencil.smap(kernel_size=(3,), relative=True, offset=offset)(lambda x: x)(A)


@pytest.mark.parametrize("value", [None, {"a": 1}])
def test_kernel_returning_no_number_is_named(value) -> None:
    with pytest.raises(XStencilError, match="return a number or an array"):
        xstencil.kmap(kernel_size=(3,))(lambda x: value)(A)


@pytest.mark.parametrize("relative", [True, False])
def test_hessian_of_the_window_object_is_refused(relative: bool) -> None:
    """It came back rolled twice: [0, 0, ...] instead of 6 x the window sum."""
    k = lambda x: jnp.diag(jax.hessian(lambda u: (u ** 3).sum())(x)).sum()  # noqa: E731
    with pytest.raises(XStencilError, match="u.array"):
        xstencil.kmap(kernel_size=(3,), padding="same", relative=relative)(k)(A)
    k2 = lambda x: jnp.diag(jax.hessian(lambda u: (u ** 3).sum())(x.array)).sum()  # noqa: E731
    got = xstencil.kmap(kernel_size=(3,), padding="same", relative=relative)(k2)(A)
    np.testing.assert_allclose(np.asarray(got), 6 * np.asarray(_windows(A)).sum(axis=1))


def test_grad_of_the_window_object_reads_in_window_order() -> None:
    k = lambda x: jax.grad(lambda w: (w.array ** 2 * jnp.arange(3.0)).sum())(x)[1]  # noqa: E731
    got = xstencil.kmap(kernel_size=(3,), padding="same", relative=True)(k)(A)
    right = np.append(np.asarray(A)[1:], 0.0)  # relative: index 1 is the right neighbour
    np.testing.assert_allclose(np.asarray(got), 2 * right)


def test_lax_on_the_window_says_use_array() -> None:
    with pytest.raises(KernelError, match=r"pass u.array"):
        xstencil.kmap(kernel_size=(3,), padding="same")(lambda x: lax.rev(x, (0,))[0])(A)
    got = xstencil.kmap(kernel_size=(3,), padding="same")(lambda x: lax.rev(x.array, (0,))[0])(A)
    np.testing.assert_array_equal(np.asarray(got), [2.0, 3, 4, 5, 6, 0])


@pytest.mark.parametrize("upper, lower", [("SAME", "same"), ("VALID", "valid")])
def test_upper_case_padding_names(upper: str, lower: str) -> None:
    k = lambda x: x.sum()  # noqa: E731
    np.testing.assert_array_equal(
        np.asarray(xstencil.kmap(kernel_size=(3,), padding=upper)(k)(A)),
        np.asarray(xstencil.kmap(kernel_size=(3,), padding=lower)(k)(A)))


def test_numpy_integer_outside_an_absolute_window_raises() -> None:
    """relative=False: a Python int past the window raised, a numpy integer
    was left to JAX's indexing, which clamps to the last cell."""
    f = xstencil.kmap(kernel_size=(3,), relative=False)(lambda x: x[np.int64(5)])
    with pytest.raises(IndexError, match="outside the window"):
        f(A)
    inside = xstencil.kmap(kernel_size=(3,), relative=False)(lambda x: x[np.int64(2)])(A)
    np.testing.assert_array_equal(np.asarray(inside), np.asarray(A)[2:])
