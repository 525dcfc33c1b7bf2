"""``xstencil.iterate``: apply a kernel or a mesh until the field stops
changing, in one compiled ``lax.while_loop``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from xstencil._engine.call import as_array, merge_static, own_loop, settled, split_static
from xstencil._engine.kcache import cached, current_copy, describe, values_key
from xstencil._errors import ConvergenceWarning, XStencilError
from xstencil._labelled.loop_body import LoopBody, baking
from xstencil._labelled.mesh import Mesh
from xstencil._labelled.operator import State, mesh_order, own_order, step_function
from xstencil._labelled.result import host64

__all__ = ["iterate", "Converged", "report"]

_NORMS = ("l1", "l2", "max")


class Converged(NamedTuple):
    """The result of :func:`xstencil.iterate` and :func:`xstencil.solve`.

    A named tuple (and so a JAX pytree: it can be returned from ``jax.jit``).
    Outside a transform, ``iterations`` is an ``int``, ``residual`` a
    ``float`` and ``converged`` a ``bool``; inside ``jax.jit`` or a
    ``scan(step=...)`` they are traced scalars.
    """

    #: The last iterate (or the solution), with the input's dims, coords, attrs and name.
    field: Any
    #: Steps taken (kernel applications for ``iterate``, iterations or V-cycles for ``solve``).
    iterations: Any
    #: The final residual: the norm of the last change (``iterate``) or the
    #: relative residual ``|b - A x| / |b|`` (``solve``).
    residual: Any
    #: Whether ``residual <= tol`` (``False`` for NaN).
    converged: Any


def _norm(call: str, norm: Any, relative: bool) -> Callable[..., Any]:
    if callable(norm):
        return norm
    if norm not in _NORMS:
        raise XStencilError(f"{call}: norm={norm!r:.60} is not a norm; use 'l1', 'l2', 'max' "
                            f"or a function norm(new, old) -> scalar")

    def size(xs: Any) -> Any:
        if norm == "l1":
            return sum(jnp.sum(jnp.abs(x)) for x in xs)
        if norm == "l2":
            return jnp.sqrt(sum(jnp.sum(jnp.abs(x) ** 2) for x in xs))
        return jnp.max(jnp.stack([jnp.max(jnp.abs(x)) for x in xs]))

    def builtin(new: Any, old: Any) -> Any:
        news = [new] if not isinstance(new, Mapping) else list(new.values())
        olds = [old] if not isinstance(old, Mapping) else list(old.values())
        # a bool or integer variable changes by the cells that changed (a float one
        # of a Dataset beside it by its values), and then nothing is relative
        rdt = residual_dtype(news)
        change = size([(a != b).astype(rdt) if _discrete(a) else a - b
                       for a, b in zip(news, olds, strict=True)])
        if not relative or any(_discrete(a) for a in news):
            return change
        ref = size(olds)
        return jnp.where(ref > 0, change / jnp.where(ref > 0, ref, 1), change)

    return builtin


def _discrete(x: Any) -> bool:
    return np.dtype(x.dtype).kind in "biu"


def residual_dtype(arrays: Any) -> Any:
    """The dtype of the change and of ``tol``: the state's real float dtype,
    float32 for a bool or integer state."""
    # numpy's promotion (JAX's strict mode refuses float32 with float64), then JAX's
    return jax.dtypes.canonicalize_dtype(np.result_type(
        *[jnp.real(x).dtype if not _discrete(x) else np.float32 for x in arrays]))


def report(call: str, res: Converged, tol: Any) -> Converged:
    """Concrete numbers and a :class:`ConvergenceWarning` outside a transform."""
    leaves = (res.iterations, res.residual, res.converged)
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return res
    it, r, ok = int(res.iterations), float(res.residual), bool(res.converged)
    if not ok:
        knob = "maxiter" if call.startswith("xstencil.solve") else "max_steps"
        after = f"after {it} iterations" if it >= 0 else "(GMRES reports no iteration count)"
        if np.isfinite(r):
            why = f"the residual is {r:.3g}, above tol={tol!r}; raise {knob} or loosen tol"
        else:  # more iterations will not help
            why = (f"the residual is {r}: the iteration diverged (a NaN or inf in the input, "
                   f"or an operator the method does not fit)")
        warnings.warn(f"{call}: not converged {after}: {why} (the result holds the last "
                      f"iterate)", ConvergenceWarning, stacklevel=3)
    return Converged(res.field, it, r, ok)


def iterate(obj: xr.DataArray | xr.Dataset | None, body: Any = None, *args: Any,
            step: Callable[..., Any] | None = None, tol: float | None = 1e-4,
            norm: str | Callable[..., Any] = "l1", relative: bool = True,
            max_steps: int = 10_000, min_steps: int = 1, window: Any = None,
            boundary: Any = None, fill_value: Any = None, period: Any = None,
            **kwargs: Any) -> Converged:
    """Apply a kernel (or a mesh) repeatedly until the change falls below ``tol``.

    The whole loop is one compiled ``lax.while_loop``: each step is the same
    shifted-slice map as :func:`xstencil.map` (or :meth:`xstencil.Mesh.map`),
    and the stopping test runs on the device.  It works inside ``jax.jit``
    and inside ``scan(step=...)``, so a pressure solve can sit inside a time
    step.

    Parameters
    ----------
    obj
        The initial field (DataArray or Dataset).  ``None`` with a mesh:
        start from the data the mesh was built on.
    body
        A kernel ``f(u, *args, **kwargs)``, as for :func:`xstencil.map`, or a
        :class:`~xstencil.Mesh` (whose regions supply boundary rows; its
        ``boundary`` and ``window`` are the mesh's own).
    step
        Instead of ``body``: a function of the state (a DataArray or Dataset
        of traced arrays) returning the next state, as for
        ``scan(step=...)``; it may call :func:`xstencil.map`, meshes,
        :func:`iterate` and :func:`solve`.
    *args, **kwargs
        Passed to the kernel, as for :func:`xstencil.map` (arrays are traced).
    tol
        Stop when ``norm(new, old) <= tol``.  A traced value: changing it
        does not recompile.  ``None``: take exactly ``max_steps`` steps
        (``converged`` is then ``True``; ``residual`` is the last change).
    norm
        ``"l1"`` (sum of absolute changes), ``"l2"``, ``"max"``, or a function
        ``norm(new, old)`` of the state's arrays (a dict of arrays for a
        Dataset) returning a scalar.
    relative
        Divide the built-in norms by the same norm of the old field (when it
        is non-zero): ``"l1"`` is then CFD Python's
        ``sum|p - pn| / sum|pn|``.  A bool or integer state (a flood fill,
        hysteresis, labels spreading) changes by whole cells: its built-in
        norm is the number of cells that changed (``"l2"``: its square root,
        ``"max"``: 1 if any did), never relative (in a Dataset that mixes
        them, float variables add their changes to those counts), and each
        step must return
        values of the state's dtype (a comparison for bool; a result that
        would be truncated or wrapped, such as a uint32 sum for a uint8 state,
        is refused).
    max_steps
        Stop after this many steps even if not converged; the result then has
        ``converged=False``, and outside a transform a
        :class:`~xstencil.ConvergenceWarning` says so.
    min_steps
        Take at least this many steps.
    window, boundary, fill_value, period
        As for :func:`xstencil.map` (kernels only; a mesh has its own).

    Returns
    -------
    Converged
        ``(field, iterations, residual, converged)``: the last iterate with
        the input's dims, coords, attrs, name and dtype (float64 stays
        float64), the number of steps, the last change and whether it is
        ``<= tol``.

    Notes
    -----
    The loop is a ``lax.while_loop``: JAX differentiates it in forward mode
    only.  For reverse-mode gradients through a converged linear problem use
    :func:`xstencil.solve` (implicit gradients).

    Examples
    --------
    >>> import numpy as np, xarray as xr, xstencil
    >>> p0 = xr.DataArray(np.zeros(9), dims="x")
    >>> m = p0.stencil.mesh(boundary="extend")
    >>> m[...] = lambda u: 0.5 * (u(x=-1) + u(x=1))
    >>> m[{"x": 0}] = lambda u: 0.0
    >>> m[{"x": -1}] = lambda u: 1.0
    >>> res = xstencil.iterate(None, m, tol=1e-6, norm="max", max_steps=5000)
    >>> res.converged, bool(np.allclose(res.field, np.linspace(0, 1, 9), atol=1e-4))
    (True, True)
    """
    call = "xstencil.iterate(...)"
    if (body is None) == (step is None):
        raise XStencilError(f"{call}: pass either a kernel or mesh as body, or a function of "
                            f"the state as step=, not {'both' if step is not None else 'neither'}")
    free = step is not None
    body = step if free else body
    fixed = tol is None
    tol = -1.0 if fixed else tol
    obj = _checked(call, obj, body, max_steps, min_steps, tol)
    given, obj = obj, mesh_order(obj, body)  # runs in the mesh's dim order, returns in obj's
    state = State(call, obj, discrete=True)
    data, state.arrays = state.arrays, []  # the compiled loop keeps the layout, not the data
    fnorm = _norm(call, norm, relative)
    options = {"window": window, "boundary": boundary, "fill_value": fill_value,
               "period": period}
    step_function(call, body, state, options, free)  # validates body and options now
    with own_loop(data, args, kwargs):
        arrays = [as_array(call, "the data", x) for x in data]
        dyn, static = split_static(call, (args, kwargs))
        # a norm function is called as it is, its arrays constants of the loop: keyed
        # by value (by identity, one changed in place reused the loop baked with the
        # old values), the loop tracing a copy of this call's norm
        nl = describe([norm]) if callable(norm) else None
        nkey = values_key([norm], nl) if nl is not None else (norm, relative)
        lim = jnp.asarray([min_steps, max_steps], jnp.int32)

        def attempt(lb: LoopBody) -> Any:
            key = ("iterate", free, fixed, state.key(), static, lb.key, nkey,
                   tuple(sorted((k, repr(v)) for k, v in options.items())))

            def build() -> Callable[..., Any]:
                f = fnorm if nl is None else (lambda: current_copy(nl)[0])
                return _loop(call, state, options, free, fixed, static, lb.resolve, f,
                             nl is not None)

            fn = cached(key, build)
            return settled(fn(arrays, dyn, jnp.asarray(tol, residual_dtype(arrays)), lim,
                              lb.leaves), (arrays, dyn))

        xs, i, r, ok = baking(call, body, free, attempt)
    xs = host64(xs)
    field = own_order(state.wrap(xs), given)
    return report(call, Converged(field, i, r, ok), None if fixed else tol)


def _checked(call: str, obj: Any, body: Any, max_steps: Any, min_steps: Any, tol: Any) -> Any:
    """The field to iterate (a mesh's own data when ``obj`` is None), after
    checking it against a mesh body, and the step limits and ``tol``."""
    if obj is None:
        if not isinstance(body, Mesh):
            raise XStencilError(f"{call}: obj=None needs a mesh as the body; pass the initial "
                                f"field, e.g. xstencil.iterate(p, kernel, ...)")
        obj = body._obj
    if isinstance(body, Mesh):
        if dict(body._obj.sizes) != dict(obj.sizes):
            raise XStencilError(
                f"{call}: the mesh was built on data of sizes {dict(body._obj.sizes)!r} but the "
                f"field has sizes {dict(obj.sizes)!r}; build the mesh on data like the field")
    for name, v in (("max_steps", max_steps), ("min_steps", min_steps)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
            raise XStencilError(f"{call}: {name}={v!r} must be a non-negative int, such as "
                                f"{name}=1000")
    if isinstance(tol, bool) or not isinstance(tol, int | float | np.floating | np.integer
                                               | jax.Array):
        raise XStencilError(f"{call}: tol={tol!r:.60} must be a number, such as tol=1e-4")
    return obj


def _loop(call: str, state: Any, options: dict[str, Any], free: bool, fixed: bool,
          static: Any, resolve: Callable[[Any], Any], fnorm: Any, given: bool = False
          ) -> Callable[..., Any]:
    """The compiled ``while_loop``: ``run(arrays, dyn, tol, (min_steps,
    max_steps), leaves)`` returns the field, the steps taken, the last
    residual and whether it converged (``leaves``: the arrays the body
    closes over, see :class:`~xstencil._labelled.operator.LoopBody`).
    ``given``: ``fnorm()`` gives the user's norm function at trace time."""
    names = state.names

    def as_norm_arg(xs: Any) -> Any:
        return xs[0] if names is None else dict(zip(names, xs, strict=True))

    def run(arrays: Any, dyn: Any, tol: Any, lim: Any, leaves: Any) -> Any:
        a, kw = merge_static(dyn, static)
        f = fnorm() if given else fnorm
        step = step_function(call, resolve(leaves), state, options, free)

        def cond(c: Any) -> Any:
            i, _, r = c
            return (i < lim[1]) & ((i < lim[0]) | ~(r <= tol))

        def body_fn(c: Any) -> Any:
            i, xs, _ = c
            new = step(xs, a, kw)
            r = jnp.asarray(f(as_norm_arg(new), as_norm_arg(xs)))
            return i + 1, new, r.astype(rdt)

        rdt = residual_dtype(arrays)
        init = (jnp.asarray(0, jnp.int32), list(arrays), jnp.asarray(jnp.inf, rdt))
        i, xs, r = jax.lax.while_loop(cond, body_fn, init)
        return xs, i, r, (r <= tol) | fixed

    return jax.jit(run)
