"""What to tell a user whose kernel asked a traced value for a concrete one
(numpy, ``math``, ``float()`` or a Python ``if`` on window values)."""

from __future__ import annotations

import jax

__all__ = ["TRACED_ADVICE", "is_traced_error"]

#: What a user must know when a kernel needs a concrete value.
TRACED_ADVICE = (
    "kernels are traced by JAX: the window holds abstract (traced) values, so numpy "
    "functions (np.sin, np.where), the math module, float()/int()/bool() and a Python "
    "`if` on a window value cannot work; use jax.numpy (jnp.sin, jnp.exp, ...) and "
    "jnp.where(cond, a, b) for branches, e.g. `jnp.where(u() > 5, u(x=1), u(x=-1))` "
    "instead of `u(x=1) if u() > 5 else u(x=-1)`")

_TRACED = (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError,
           jax.errors.TracerBoolConversionError, jax.errors.TracerIntegerConversionError)


def is_traced_error(e: BaseException) -> bool:
    """Whether ``e`` is JAX refusing to turn a traced value into a concrete one."""
    return isinstance(e, _TRACED)
