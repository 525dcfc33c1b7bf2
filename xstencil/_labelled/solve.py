"""``xstencil.solve``: matrix-free linear solves with a stencil as the operator."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from xstencil._engine import multigrid as mg
from xstencil._engine.call import as_array, merge_static, own_loop, settled, split_static
from xstencil._engine.elements import linear_operator
from xstencil._engine.kcache import cached, settle
from xstencil._engine.krylov import KRYLOV
from xstencil._errors import XStencilError
from xstencil._labelled.iterate import Converged, report
from xstencil._labelled.loop_body import LoopBody
from xstencil._labelled.mesh import Mesh
from xstencil._labelled.operator import State, mesh_order, own_order, step_function
from xstencil._labelled.result import host64
from xstencil._labelled.step_labels import by_label

__all__ = ["solve"]

METHODS = ("cg", "bicgstab", "gmres", "multigrid")


def solve(operator: Any, rhs: xr.DataArray, *args: Any, method: str = "cg",
          tol: float = 1e-6, maxiter: int | None = None, x0: Any = None,
          boundary: Any = None, fill_value: Any = None, window: Any = None,
          period: Any = None, restart: int = 20, **kwargs: Any) -> Converged:
    """Solve ``operator(x) = rhs`` for ``x``, with a stencil kernel as the operator.

    The operator is applied matrix-free, by the same compiled map as
    :func:`xstencil.map`, inside one compiled solver loop.  The solve is
    differentiable: it goes through :func:`jax.lax.custom_linear_solve`, so
    gradients with respect to ``rhs`` and to array arguments of the kernel
    come from one more (transposed) solve, not from unrolling the iterations.

    Parameters
    ----------
    operator
        A linear kernel ``f(u, *args, **kwargs)``, as for :func:`xstencil.map`
        (e.g. a Laplacian), or a :class:`~xstencil.Mesh` whose regions supply
        boundary rows (Krylov methods only).
    rhs
        The right-hand side (a DataArray of floats).
    *args, **kwargs
        Passed to the kernel (arrays are traced and differentiable).
    method
        ``"cg"`` (symmetric definite operators), ``"bicgstab"``, ``"gmres"``
        (general operators) or ``"multigrid"`` (geometric multigrid for
        ``sum_d a_d (u(d=+1) - 2u + u(d=-1)) + c u``, the 3/5/7-point
        Laplacian with constant coefficients; the coefficients are read off
        the kernel and checked).
    tol
        Stop when ``|rhs - A x| <= tol * |rhs|`` (2-norm).
    maxiter
        At most this many iterations (V-cycles for multigrid).  Defaults to
        ``10 * rhs.size`` for Krylov methods and 100 cycles for multigrid.
    x0
        Initial guess (DataArray or array shaped like ``rhs``); zeros by default.
    boundary, fill_value, window, period
        As for :func:`xstencil.map`.  The operator must be linear, so a
        ``"fill"`` boundary needs ``fill_value=0`` (homogeneous Dirichlet:
        move known boundary values into ``rhs``); ``"extend"`` is a
        homogeneous Neumann boundary, ``"periodic"`` wraps.
    restart
        The GMRES restart length.

    Returns
    -------
    Converged
        ``(field, iterations, residual, converged)``: the solution with
        ``rhs``'s dims, coords and dtype, the iterations (V-cycles for
        multigrid; ``-1`` for GMRES, which JAX does not count), the relative
        residual and whether it is ``<= tol``.  Outside a transform, a
        :class:`~xstencil.ConvergenceWarning` reports a solve that stopped at
        ``maxiter``.

    Notes
    -----
    With only periodic and Neumann boundaries and no ``c u`` term the
    Laplacian is singular; multigrid then returns the zero-mean solution for
    ``rhs`` minus its mean, and reports the residual of that problem.

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> x = np.linspace(0, 1, 33)[1:-1]
    >>> f = xr.DataArray(-np.pi**2 * np.sin(np.pi * x), dims="x", coords={"x": x})
    >>> h2 = (x[1] - x[0]) ** 2
    >>> lap = lambda u: (u(x=1) - 2 * u() + u(x=-1)) / h2
    >>> res = xstencil.solve(lap, f, method="multigrid", boundary="fill", fill_value=0.0,
    ...                      tol=1e-10)
    >>> res.converged, bool(np.abs(res.field - np.sin(np.pi * x)).max() < 1e-3)
    (True, True)
    """
    call = "xstencil.solve(...)"
    if method not in METHODS:
        raise XStencilError(f"{call}: method={method!r:.60} is not a solver; use one of "
                            f"{METHODS!r}")
    if not isinstance(rhs, xr.DataArray):
        raise XStencilError(f"{call}: rhs must be a DataArray, got {type(rhs).__name__}: "
                            f"{rhs!r:.60}; solve one variable at a time (ds['p'])")
    if isinstance(operator, Mesh) and dict(operator._obj.sizes) != dict(rhs.sizes):
        raise XStencilError(
            f"{call}: the mesh was built on data of sizes {dict(operator._obj.sizes)!r} but rhs "
            f"has sizes {dict(rhs.sizes)!r}; build the mesh on data like rhs")
    given, rhs = rhs, mesh_order(rhs, operator)  # solved in the mesh's dim order
    if maxiter is None:
        maxiter = 100 if method == "multigrid" else 10 * int(rhs.size)
    for name, v in (("maxiter", maxiter), ("restart", restart)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise XStencilError(f"{call}: {name}={v!r} must be a positive int")
    state = State(call, rhs)
    (b,), state.arrays = state.arrays, []
    options = {"window": window, "boundary": boundary, "fill_value": fill_value,
               "period": period}
    step = step_function(call, operator, state, options)
    guess = _guess(call, x0, given)
    if guess is not None and rhs.dims != given.dims:
        guess = jnp.transpose(jnp.asarray(guess), [given.dims.index(d) for d in rhs.dims])
    with own_loop([b], args, kwargs):
        b = as_array(call, "rhs", b)
        guess = jnp.zeros_like(b) if guess is None else jnp.asarray(guess, b.dtype)
        dyn, static = split_static(call, (args, kwargs))
        a, kw = merge_static(dyn, static)

        def matvec(x: Any) -> Any:
            with linear_operator():  # transposable: see elements.linear_operator
                return step([x], a, kw)[0]

        if method != "multigrid":  # multigrid's own check (A v == fitted v) implies linearity
            _check_linear(call, matvec, b, boundary, fill_value)
        op = _poisson(call, matvec, b, operator, boundary, fill_value,
                                     tuple(map(str, state.dims))) if method == "multigrid" else None
        lb = LoopBody(operator)
        key = ("solve", method, op, int(maxiter), int(restart), state.key(), static,
               lb.key, tuple(sorted((k, repr(v)) for k, v in options.items())))
        fn = cached(key, lambda: _build(call, lb.resolve, state, options, static,
                                             method, op, int(maxiter), int(restart)))
        x, i, r, ok = settled(fn(b, guess, dyn, jnp.asarray(tol, jnp.real(b).dtype),
                                 lb.leaves), (b, guess, dyn))
        settle(lb.lifted)
    field = own_order(state.wrap([host64(x)]), given)
    return report(call, Converged(field, i, r, ok), tol)


def _build(call: str, resolve: Callable[[Any], Any], state: State, options: Mapping[str, Any],
           static: Any, method: str, op: mg.Poisson | None, maxiter: int, restart: int
           ) -> Callable[..., Any]:
    """The jitted solve.  The gradient solves the transposed system: with A
    itself only for multigrid's fitted operator, which is symmetric by
    construction (a Krylov operator may not be: ``reflect`` boundaries and
    variable coefficients are not, and CG converges on some such systems).
    Where A annihilates constants (a periodic or Neumann Laplacian, checked
    in the program when the gradient is taken), the forward solve gives the
    solution orthogonal to them, and the transposed solve takes its
    right-hand side's mean out (its part along the null space, where
    Aᵀ y = w has no solution and the iteration would diverge)."""
    def run(b: Any, x0: Any, dyn: Any, tol: Any, leaves: Any) -> Any:
        a, kw = merge_static(dyn, static)
        step = step_function(call, resolve(leaves), state, options)

        def matvec(x: Any) -> Any:
            with linear_operator():  # transposable: see elements.linear_operator
                return step([x], a, kw)[0]

        def method_fn(mv: Any, rhs: Any, start: Any) -> tuple[Any, Any]:
            if op is not None:
                x, i, r = mg.solve(op, rhs, start, tol, maxiter)
            elif method == "gmres":
                x, i, r = KRYLOV["gmres"](mv, rhs, start, tol, max(1, maxiter // restart),
                                          restart)
            else:
                x, i, r = KRYLOV[method](mv, rhs, start, tol, maxiter)
            return x, (i, r)

        def transposed(mv: Any, rhs: Any) -> tuple[Any, Any]:
            if op is None:
                rhs = jnp.where(_constants_in_null(matvec, rhs), rhs - jnp.mean(rhs), rhs)
            return method_fn(mv, rhs, jnp.zeros_like(rhs))

        x, (i, r) = jax.lax.custom_linear_solve(
            matvec, b, lambda mv, rhs: method_fn(mv, rhs, x0), transpose_solve=transposed,
            symmetric=op is not None, has_aux=True)
        return x, i, r, r <= tol

    return jax.jit(run)


def _guess(call: str, x0: Any, rhs: xr.DataArray) -> Any:
    if x0 is None:
        return None
    if isinstance(x0, xr.DataArray):
        if set(x0.dims) != set(rhs.dims):
            raise XStencilError(f"{call}: x0 has dims {tuple(x0.dims)!r} but rhs has "
                                f"{tuple(rhs.dims)!r}; pass an initial guess like rhs")
        x0 = by_label(call, x0, rhs.indexes, "x0 has", "rhs").transpose(*rhs.dims).data
    if tuple(np.shape(x0)) != tuple(rhs.shape):
        raise XStencilError(f"{call}: x0 has shape {tuple(np.shape(x0))!r} but rhs has "
                            f"{tuple(rhs.shape)!r}; pass an initial guess like rhs")
    return x0


def _concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _check_linear(call: str, matvec: Callable[..., Any], b: Any, boundary: Any,
                  fill_value: Any) -> None:
    """``A(0) == 0`` and ``A(2v) == 2 A(v)``: a constant term (a non-zero
    fill value, a source in the kernel) would make every method wrong."""
    with jax.ensure_compile_time_eval():
        zero = matvec(jnp.zeros(b.shape, b.dtype))
        if not _concrete(zero):
            return
        v = jnp.asarray(np.random.default_rng(0).random(b.shape) - 0.5, b.dtype)
        av, a2v = np.asarray(matvec(v)), np.asarray(matvec(2 * v))
    z = np.asarray(zero)
    scale = np.abs(av).max() if av.size else 1.0
    eps = 1e-3 if np.finfo(z.dtype).bits < 64 else 1e-8
    if not np.all(np.isfinite(z)) or np.abs(z).max() > eps * max(scale, 1.0):
        hint = (" (boundary='fill' with no fill_value fills the halo with NaN: pass "
                "fill_value=0.0, a homogeneous Dirichlet boundary, and move known boundary "
                "values into rhs)" if fill_value is None and _has_fill(boundary) else
                "; move constant terms (sources, non-zero fill values) into rhs")
        raise XStencilError(f"{call}: the operator is not linear: operator(0) is not 0 "
                            f"(max |A 0| = {np.abs(z).max()!r}){hint}")
    if not np.allclose(a2v, 2 * av, rtol=eps, atol=eps * scale):
        raise XStencilError(f"{call}: the operator is not linear: A(2v) != 2 A(v); solve "
                            f"linear problems only (Newton iterations can call solve per step)")


def _constants_in_null(matvec: Callable[..., Any], like: Any) -> Any:
    """Whether ``A 1 == 0`` to rounding (a periodic or Neumann Laplacian), in
    the program: ``|A 1|`` against ``|A v|`` for a fixed pseudo-random ``v``
    (no eager evaluation per call, and traced coefficients work too)."""
    if jnp.iscomplexobj(like):
        return jnp.asarray(False)
    real = jnp.real(like).dtype
    idx = jnp.arange(like.size, dtype=real).reshape(like.shape)
    v = jnp.sin(idx * 12.9898 + 0.5)
    a1 = jnp.max(jnp.abs(matvec(jnp.ones_like(like))))
    av = jnp.max(jnp.abs(matvec(v.astype(like.dtype))))
    return a1 <= 64 * jnp.finfo(real).eps * av


_apply = jax.jit(mg.apply, static_argnums=0)


def _has_fill(boundary: Any) -> bool:
    if boundary is None:
        return True
    if isinstance(boundary, str):
        return boundary == "fill"
    return isinstance(boundary, Mapping) and any(v == "fill" for v in boundary.values())


def _poisson(call: str, matvec: Callable[..., Any], b: Any, operator: Any,
             boundary: Any, fill_value: Any, dims: tuple[str, ...]) -> mg.Poisson:
    """Read ``a_d`` and ``c`` off the operator by probing it, then check the
    fitted operator against it on a random field."""
    if isinstance(operator, Mesh):
        raise XStencilError(f"{call}: method='multigrid' needs a kernel of the Laplacian "
                            f"type, not a mesh; use method='bicgstab' or 'gmres' for a mesh")
    modes = []
    for d in dims:
        m = boundary.get(d, "fill") if isinstance(boundary, Mapping) else (boundary or "fill")
        if m not in mg.MODES:
            raise XStencilError(
                f"{call}: method='multigrid' supports boundaries {mg.MODES!r} (Dirichlet, "
                f"Neumann, periodic); dim {d!r} has {m!r}")
        modes.append(m)
    shape = tuple(b.shape)
    if min(shape) < 3:
        raise XStencilError(f"{call}: method='multigrid' needs at least 3 points per dim; "
                            f"rhs has shape {shape!r}")
    centre = tuple(n // 2 for n in shape)
    delta = np.zeros(shape)
    delta[centre] = 1.0
    with jax.ensure_compile_time_eval():
        resp = matvec(jnp.asarray(delta, b.dtype))
        if not _concrete(resp):
            raise XStencilError(f"{call}: method='multigrid' reads the operator's "
                                f"coefficients before solving, so kernel arguments must be "
                                f"concrete (not traced); use method='cg' inside transforms")
        resp = np.asarray(resp, dtype=np.float64)
        if not np.all(np.isfinite(resp)):
            _check_linear(call, matvec, b, boundary, fill_value)  # names the cause
        coef = []
        for ax in range(len(shape)):
            lo = list(centre)
            lo[ax] -= 1
            hi = list(centre)
            hi[ax] += 1
            coef.append(0.5 * (resp[tuple(lo)] + resp[tuple(hi)]))
        c = float(resp[centre] + 2 * sum(coef))
        # c is 0 for a Neumann or periodic Laplacian, but in float32 its fit
        # rounds (a_x != a_y: -1.5e-5), and a non-zero c hides the singularity
        if abs(c) <= 16 * float(np.finfo(b.dtype).eps) * (abs(resp[centre]) + 2 * sum(
                abs(x) for x in coef)):
            c = 0.0
        op = mg.Poisson(tuple(float(x) for x in coef), c, tuple(modes), shape)
        v = jnp.asarray(np.random.default_rng(1).random(shape) - 0.5, b.dtype)
        want = np.asarray(matvec(v))
        got = np.asarray(_apply(op, v))
    eps = 1e-4 if np.finfo(want.dtype).bits < 64 else 1e-9
    if not np.allclose(got, want, rtol=eps, atol=eps * np.abs(want).max()):
        raise XStencilError(
            f"{call}: method='multigrid' solves sum_d a_d (u(d=+1) - 2 u + u(d=-1)) + c u with "
            f"constant a_d and c; this operator differs from that form (fitted a={op.a!r}, "
            f"c={c!r}: max error {np.abs(got - want).max():.3g}); use method='cg' (symmetric) "
            f"or 'bicgstab'")
    if any(a == 0 for a in op.a):
        raise XStencilError(f"{call}: method='multigrid': the operator does not couple "
                            f"neighbours along every dim (a={op.a!r}); use method='cg'")
    sign = np.sign(op.a[0])
    if any(np.sign(a) != sign for a in op.a) or np.sign(op.c) == sign:
        raise XStencilError(
            f"{call}: method='multigrid' needs a definite operator: coefficients a_d of one "
            f"sign and c of the other sign or 0 (fitted a={op.a!r}, c={op.c!r}); this one is "
            f"indefinite (a Helmholtz-type c, or a_d of mixed signs), where the V-cycles "
            f"diverge; use method='gmres' or 'bicgstab'")
    return op
