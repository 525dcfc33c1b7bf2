"""What to tell a user whose kernel asked a traced value for a concrete one
(numpy, ``math``, ``float()`` or a Python ``if`` on window values)."""

from __future__ import annotations

import jax

__all__ = ["TRACED_ADVICE", "WINDOW_ADVICE", "is_traced_error", "advice_for"]

#: What a user must know when a kernel needs a concrete value.
TRACED_ADVICE = (
    "kernels are traced by JAX: the window holds abstract (traced) values, so numpy "
    "functions (np.sin, np.where), the math module, float()/int()/bool() and a Python "
    "`if` on a window value cannot work; use jax.numpy (jnp.sin, jnp.exp, ...) and "
    "jnp.where(cond, a, b) for branches, e.g. `jnp.where(u() > 5, u(x=1), u(x=-1))` "
    "instead of `u(x=1) if u() > 5 else u(x=-1)`. numpy arrays the kernel closes over "
    "(a footprint, weights) are traced too, as inputs of the compiled code: use "
    "jnp.where(fp, u.array, fill) instead of u.array[fp] or `if fp[0, 1]`; where the "
    "kernel needs their values as Python numbers (offsets such as u(y=rr[i]), or skipping "
    "zero weights), close over Python lists instead: rr = rr.tolist()")

#: What a user must know when a lax function or a transform got the window object.
WINDOW_ADVICE = (
    "lax functions (lax.rev, lax.slice, lax.sort, ...) and JAX transforms of the window "
    "(jax.grad, jax.hessian, jax.vmap of a function of u) take arrays, not the window "
    "object: pass u.array, the window as a JAX array, e.g. lax.rev(u.array, (0,)) or "
    "jax.hessian(g)(u.array); jax.numpy functions (jnp.sum(u), u * w) take the window as it is")

_TRACED = (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError,
           jax.errors.TracerBoolConversionError, jax.errors.TracerIntegerConversionError,
           jax.errors.NonConcreteBooleanIndexError)


def is_traced_error(e: BaseException) -> bool:
    """Whether ``e`` is JAX refusing to turn a traced value into a concrete one."""
    return isinstance(e, _TRACED)


def advice_for(e: BaseException) -> str:
    """``"; <what to do>"`` for a kernel failure JAX explains badly, else ``""``."""
    if is_traced_error(e):
        return f"; {TRACED_ADVICE}"
    if "__jax_array__" in str(e) or getattr(e, "window_transform", False):
        return f"; {WINDOW_ADVICE}"
    return ""
