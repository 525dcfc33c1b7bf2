"""Geometric multigrid for Poisson-type operators (pure JAX).

The operator is ``A u = sum_d a_d (u[i+1] - 2 u[i] + u[i-1]) + c u`` along
every axis ``d`` (the 3-, 5- or 7-point Laplacian with coefficients), with
one boundary per axis, expressed by the ghost value next to the edge:

* ``"fill"``: the ghost is 0 (homogeneous Dirichlet; the unknowns are the
  interior nodes, vertex-centred: coarse node ``i`` is fine node ``2i + 1``);
* ``"extend"``: the ghost repeats the edge (homogeneous Neumann,
  cell-centred: coarse cell ``i`` covers fine cells ``2i`` and ``2i + 1``);
* ``"periodic"``: the ghost wraps (coarse node ``i`` is fine node ``2i``).

A V-cycle smooths with red-black Gauss-Seidel, restricts the residual by
full weighting, recurses with the operator rediscretized on the coarse grid
(``a_d / 4``), prolongs the correction by (bi/tri)linear interpolation and
smooths again.  The coarsest grid (at most ``COARSE`` points when the sizes
halve) is solved exactly by a pseudo-inverse computed once.  Each cycle
costs O(N).  Sizes that do not halve (an odd periodic length, fewer than 5
points) stop the coarsening early; a Neumann axis of odd length coarsens with
its last cell folded into the edge; a Dirichlet axis of even length coarsens
with a one-cell error at its far edge.  These cost more cycles, never
accuracy: cycles stop on the true residual.

Singular problems (every axis periodic or Neumann, ``c == 0``) are solved
for the zero-mean solution of the right-hand side with its mean removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xstencil._engine.krylov import cg

__all__ = ["Poisson", "apply", "levels", "solve", "COARSE", "MODES"]

#: Coarsening stops at this many points or fewer.
COARSE = 256
#: The largest coarsest grid solved directly (a dense pseudo-inverse); a larger
#: one (sizes that do not halve) is solved by conjugate gradients.
DENSE = 1024
MODES = ("fill", "extend", "periodic")
_PAD = {"fill": "constant", "extend": "edge", "periodic": "wrap"}


@dataclass(frozen=True)
class Poisson:
    """``A u = sum_d a[d] * (u(+1) - 2u + u(-1)) + c * u`` on ``shape``."""

    a: tuple[float, ...]
    c: float
    modes: tuple[str, ...]
    shape: tuple[int, ...]

    @property
    def singular(self) -> bool:
        return self.c == 0 and all(m != "fill" for m in self.modes)

    def diag(self) -> float:
        return self.c - 2 * sum(self.a)

    def coarse(self) -> Poisson | None:
        """The operator on the next coarser grid, or ``None`` at the bottom."""
        if int(np.prod(self.shape)) <= COARSE:
            return None
        shape = []
        for n, m in zip(self.shape, self.modes, strict=True):
            nc = (n - 1) // 2 if m == "fill" else n // 2
            if (m == "periodic" and n % 2) or nc < 2:
                return None
            shape.append(nc)
        return Poisson(tuple(a / 4 for a in self.a), self.c, self.modes, tuple(shape))


def apply(op: Poisson, u: Any) -> Any:
    """``A u`` by shifted slices of the padded array."""
    out = op.c * u
    for ax, (a, m) in enumerate(zip(op.a, op.modes, strict=True)):
        if a == 0:
            continue
        pad = [(0, 0)] * u.ndim
        pad[ax] = (1, 1)
        p = jnp.pad(u, pad, mode=_PAD[m])
        n = u.shape[ax]
        lo = jax.lax.slice_in_dim(p, 0, n, axis=ax)
        hi = jax.lax.slice_in_dim(p, 2, n + 2, axis=ax)
        out = out + a * (lo + hi - 2 * u)
    return out


def _colours(shape: tuple[int, ...]) -> Any:
    """The red cells (even index sum), built from iotas: a large constant
    array would make XLA's compile slow (constant folding)."""
    total = sum(jax.lax.broadcasted_iota(jnp.int32, shape, ax) for ax in range(len(shape)))
    return total % 2 == 0


def _smooth(op: Poisson, u: Any, b: Any, red: Any, sweeps: int) -> Any:
    d = op.diag()

    def sweep(_: Any, u: Any) -> Any:
        for colour in (red, ~red):
            u = jnp.where(colour, u + (b - apply(op, u)) / d, u)
        return u

    return jax.lax.fori_loop(0, sweeps, sweep, u) if sweeps > 1 else sweep(0, u)


def _restrict(op: Poisson, r: Any) -> Any:
    """Full weighting, one axis at a time."""
    for ax, m in enumerate(op.modes):
        n = r.shape[ax]
        take = lambda s, e, st=2, x=r, ax=ax: jax.lax.slice_in_dim(x, s, e, st, axis=ax)  # noqa: E731
        if m == "fill":
            nc = (n - 1) // 2
            r = 0.25 * take(0, 2 * nc - 1) + 0.5 * take(1, 2 * nc) + 0.25 * take(2, 2 * nc + 1)
        elif m == "periodic":
            left = jnp.roll(r, 1, axis=ax)
            right = jnp.roll(r, -1, axis=ax)
            r = jax.lax.slice_in_dim(0.25 * left + 0.5 * r + 0.25 * right, 0, n, 2, axis=ax)
        else:
            r = 0.5 * (take(0, n - 1) + take(1, n))
    return r


def _prolong(op: Poisson, e: Any) -> Any:
    """Linear interpolation of a coarse correction to the fine grid ``op.shape``."""
    for ax, (n, m) in enumerate(zip(op.shape, op.modes, strict=True)):
        nc = e.shape[ax]
        if m == "fill":
            pad = [(0, 0)] * e.ndim
            pad[ax] = (1, 1)
            p = jnp.pad(e, pad)
            mid = 0.5 * (jax.lax.slice_in_dim(p, 0, nc + 1, axis=ax)
                         + jax.lax.slice_in_dim(p, 1, nc + 2, axis=ax))  # fine 0, 2, ..., 2nc
            odd = e
            full = _interleave(mid, odd, ax, nc + 1, nc)
        elif m == "periodic":
            nxt = jnp.roll(e, -1, axis=ax)
            full = _interleave(e, 0.5 * (e + nxt), ax, nc, nc)
        else:
            prv = jnp.concatenate([jax.lax.slice_in_dim(e, 0, 1, axis=ax),
                                   jax.lax.slice_in_dim(e, 0, nc - 1, axis=ax)], axis=ax)
            nxt = jnp.concatenate([jax.lax.slice_in_dim(e, 1, nc, axis=ax),
                                   jax.lax.slice_in_dim(e, nc - 1, nc, axis=ax)], axis=ax)
            full = _interleave(0.75 * e + 0.25 * prv, 0.75 * e + 0.25 * nxt, ax, nc, nc)
        if full.shape[ax] < n:  # a fine axis of odd length (Neumann, periodic): repeat the edge
            full = jnp.concatenate([full] + [jax.lax.slice_in_dim(full, -1, None, axis=ax)]
                                   * (n - full.shape[ax]), axis=ax)
        e = jax.lax.slice_in_dim(full, 0, n, axis=ax)
    return e


def _interleave(even: Any, odd: Any, ax: int, ne: int, no: int) -> Any:
    """Positions 0, 2, 4, ... from ``even`` and 1, 3, ... from ``odd``."""
    if no < ne:
        pad = [(0, 0)] * odd.ndim
        pad[ax] = (0, ne - no)
        odd = jnp.pad(odd, pad)
    both = jnp.stack([even, odd], axis=ax + 1)
    shape = list(even.shape)
    shape[ax] = 2 * ne
    return both.reshape(shape)[(slice(None),) * ax + (slice(0, ne + no),)]


def levels(op: Poisson) -> list[Poisson]:
    """The grid hierarchy, finest first."""
    out = [op]
    while (nxt := out[-1].coarse()) is not None:
        out.append(nxt)
    return out


def matrix(op: Poisson) -> np.ndarray:
    """The dense matrix of ``op`` (numpy; for the coarsest grid)."""
    out = op.c * np.eye(int(np.prod(op.shape)))
    for ax, (n, a, m) in enumerate(zip(op.shape, op.a, op.modes, strict=True)):
        t = np.diag(-2.0 * np.ones(n)) + np.diag(np.ones(n - 1), 1) + np.diag(np.ones(n - 1), -1)
        if m == "periodic":
            t[0, -1] += 1
            t[-1, 0] += 1
        elif m == "extend":
            t[0, 0] += 1
            t[-1, -1] += 1
        k = np.ones((1, 1))
        for bx, nb in enumerate(op.shape):
            k = np.kron(k, t if bx == ax else np.eye(nb))
        out = out + a * k
    return out


def _coarse_inverse(op: Poisson, dtype: Any) -> Any:
    if int(np.prod(op.shape)) > DENSE:
        return None
    return jnp.asarray(np.linalg.pinv(matrix(op)), dtype)


def _coarse_solve(op: Poisson, inv: Any, b: Any) -> Any:
    """The exact coarse solve, or conjugate gradients (``-A`` is positive
    semi-definite for ``c <= 0``) to a relative residual of 1e-6."""
    if inv is not None:
        return (inv @ b.reshape(-1)).reshape(b.shape)
    if op.singular:
        b = b - jnp.mean(b)
    x, _, _ = cg(lambda v: -apply(op, v), -b, jnp.zeros_like(b), 1e-6, 10 * sum(op.shape))
    return x


def vcycle(ops: list[Poisson], inv: Any, u: Any, b: Any, pre: int = 2, post: int = 2) -> Any:
    """One V-cycle for ``A u = b`` starting from ``u``."""
    op = ops[0]
    if len(ops) == 1:  # a correction, so that a one-level "cycle" still converges
        return u + _coarse_solve(op, inv, b - apply(op, u))
    red = _colours(op.shape)
    u = _smooth(op, u, b, red, pre)
    rc = _restrict(op, b - apply(op, u))
    ec = vcycle(ops[1:], inv, jnp.zeros_like(rc), rc, pre, post)
    u = u + _prolong(op, ec)
    return _smooth(op, u, b, red, post)


def solve(op: Poisson, b: Any, x0: Any, tol: Any, maxiter: Any, pre: int = 2,
          post: int = 2) -> tuple[Any, Any, Any]:
    """V-cycles until ``|b - A x| <= tol |b|``: ``(x, cycles, relres)``."""
    ops = levels(op)
    inv = _coarse_inverse(ops[-1], b.dtype)
    if op.singular:
        b = b - jnp.mean(b)
    nb = jnp.sqrt(jnp.sum(b * b))
    stop = tol * jnp.where(nb > 0, nb, 1)

    def res(x: Any) -> Any:
        r = b - apply(op, x)
        return jnp.sqrt(jnp.sum(r * r))

    def cond(c: Any) -> Any:
        i, _, r = c
        return (i < maxiter) & (r > stop)

    def body(c: Any) -> Any:
        i, x, _ = c
        x = vcycle(ops, inv, x, b, pre, post)
        if op.singular:
            x = x - jnp.mean(x)
        return i + 1, x, res(x)

    i, x, r = jax.lax.while_loop(cond, body, (jnp.asarray(0, jnp.int32), x0, res(x0)))
    return x, i, jnp.where(nb > 0, r / jnp.where(nb > 0, nb, 1), r)
