"""Matrix-free Krylov solvers on arrays (pure JAX): conjugate gradients and
BiCGSTAB as one ``lax.while_loop`` each, reporting iterations and the
relative residual; GMRES wraps :func:`jax.scipy.sparse.linalg.gmres`.

Every solver returns ``(x, iterations, relres)`` where ``relres`` is the
true relative residual ``|b - A x| / |b|`` of the returned ``x``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.sparse.linalg as jsl

__all__ = ["cg", "bicgstab", "gmres", "KRYLOV", "RESTARTS", "relres"]

Matvec = Callable[[Any], Any]


def _dot(a: Any, b: Any) -> Any:
    return jnp.vdot(a, b).real if jnp.iscomplexobj(a) else jnp.vdot(a, b)


def _nrm(a: Any) -> Any:
    return jnp.sqrt(jnp.real(jnp.vdot(a, a)))


def relres(matvec: Matvec, b: Any, x: Any) -> Any:
    """``|b - A x| / |b|`` (``|b - A x|`` when ``b`` is zero)."""
    return _relative(_nrm(b - matvec(x)), _nrm(b))


def _relative(r: Any, nb: Any) -> Any:
    return jnp.where(nb > 0, r / jnp.where(nb > 0, nb, 1), r)


#: Restarts of CG from its iterate when its recursive residual says converged
#: but the true one does not (the recursion drifts from b - A x by rounding).
RESTARTS = 4


def cg(matvec: Matvec, b: Any, x0: Any, tol: Any, maxiter: Any) -> tuple[Any, Any, Any]:
    """Conjugate gradients for a symmetric definite ``A``.  The iteration
    stops on its recursive residual; where the true residual ``b - A x`` is
    still above ``tol`` then (rounding: a long run stopped at 8725 of 39690
    allowed iterations with a warning to raise ``maxiter``), it restarts from
    its iterate, up to :data:`RESTARTS` times within ``maxiter``."""
    nb = _nrm(b)
    stop = tol * jnp.where(nb > 0, nb, 1)

    def cond(c: Any) -> Any:
        i, _, _, _, rr = c
        return (i < maxiter) & (jnp.sqrt(rr) > stop)

    def body(c: Any) -> Any:
        i, x, r, p, rr = c
        ap = matvec(p)
        alpha = rr / _dot(p, ap)
        x = x + alpha * p
        r = r - alpha * ap
        rr_new = _dot(r, r)
        p = r + (rr_new / rr) * p
        return i + 1, x, r, p, rr_new

    def run(c: Any) -> Any:
        k, i, x, r = c
        i, x, _, _, _ = jax.lax.while_loop(cond, body, (i, x, r, r, _dot(r, r)))
        return k + 1, i, x, b - matvec(x)

    def again(c: Any) -> Any:
        k, i, _, r = c
        return (k <= RESTARTS) & (i < maxiter) & (_nrm(r) > stop)

    r0 = b - matvec(x0)
    _, i, x, r = jax.lax.while_loop(again, run, (jnp.asarray(0, jnp.int32),
                                                 jnp.asarray(0, jnp.int32), x0, r0))
    return x, i, _relative(_nrm(r), nb)  # r is b - A x: the true residual


def bicgstab(matvec: Matvec, b: Any, x0: Any, tol: Any, maxiter: Any) -> tuple[Any, Any, Any]:
    """BiCGSTAB (van der Vorst) for a general non-singular ``A``.

    When the shadow residual becomes orthogonal to the residual (a
    breakdown, ``rho == 0``), it restarts with the current residual as the
    new shadow residual instead of dividing by zero.
    """
    nb = _nrm(b)
    stop = tol * jnp.where(nb > 0, nb, 1)
    r0 = b - matvec(x0)
    one = jnp.ones((), r0.dtype)
    tiny = jnp.finfo(jnp.real(r0).dtype).eps ** 2

    def cond(c: Any) -> Any:
        i, _, r, *_ = c
        return (i < maxiter) & (_nrm(r) > stop)

    def body(c: Any) -> Any:
        i, x, r, rhat, p, v, rho, alpha, omega = c
        rho_new = jnp.vdot(rhat, r)
        restart = jnp.abs(rho_new) <= tiny * jnp.real(jnp.vdot(r, r))
        rhat = jnp.where(restart, r, rhat)
        rho_new = jnp.where(restart, jnp.vdot(r, r), rho_new)
        beta = jnp.where(restart, 0, (rho_new / rho) * (alpha / omega))
        p = r + beta * (p - omega * v)
        v = matvec(p)
        rv = jnp.vdot(rhat, v)
        alpha = rho_new / jnp.where(rv != 0, rv, 1)
        s = r - alpha * v
        t = matvec(s)
        tt = jnp.vdot(t, t)
        omega = jnp.where(tt != 0, jnp.vdot(t, s) / jnp.where(tt != 0, tt, 1), 0)
        x = x + alpha * p + omega * s
        r = s - omega * t
        omega = jnp.where(omega != 0, omega, one)  # s == 0: converged this step
        return i + 1, x, r, rhat, p, v, rho_new, alpha, omega

    zero = jnp.zeros_like(r0)
    init = (jnp.asarray(0, jnp.int32), x0, r0, r0, zero, zero, one, one, one)
    i, x, *_ = jax.lax.while_loop(cond, body, init)
    return x, i, relres(matvec, b, x)


def gmres(matvec: Matvec, b: Any, x0: Any, tol: Any, maxiter: Any,
          restart: int = 20) -> tuple[Any, Any, Any]:
    """Restarted GMRES from :func:`jax.scipy.sparse.linalg.gmres`.

    JAX does not report the iteration count: ``iterations`` is ``-1``.
    """
    x, _ = jsl.gmres(matvec, b, x0=x0, tol=tol, atol=0.0, restart=restart,
                     maxiter=maxiter, solve_method="batched")
    return x, jnp.asarray(-1, jnp.int32), relres(matvec, b, x)


KRYLOV = {"cg": cg, "bicgstab": bicgstab, "gmres": gmres}
