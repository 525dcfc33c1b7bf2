"""How the engine calls a labelled kernel: :func:`kernel_caller` builds the
kernel's argument (a Window, or a WindowSet for a Dataset) from the window
cells inside the trace, calls the kernel with its extra arguments, and
normalizes what it returns (shape per point, dtype); :func:`identity_caller`
keeps the input where no mesh region applies."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xstencil._engine.advice import advice_for
from xstencil._engine.call import is_weak, merge_static, promote
from xstencil._engine.coords import read_dtype
from xstencil._engine.coordwindow import CoordWindow
from xstencil._engine.fresh import fresh
from xstencil._engine.window import Window
from xstencil._engine.windowset import WindowSet
from xstencil._errors import KernelError, WindowIndexError, XStencilError
from xstencil._labelled.kernel_checks import check_returned, traced_error
from xstencil._labelled.plan import Plan, unknown_keyword, with_call

__all__ = ["dtype_probe", "result_dtype", "windows", "kernel_caller", "normalize",
           "identity_caller"]


def _out_dtype(plan: Plan, name: str | None) -> Any:
    if plan.var_names is not None and name in plan.var_names:
        return plan.var_dtypes[plan.var_names.index(name)]
    return promote(*plan.var_dtypes)


def dtype_probe(plan: Plan) -> Any:
    """See :meth:`Plan.dtype_probe`."""
    return plan.dtype_probe()


def result_dtype(plan: Plan, name: str | None, v: Any) -> Any:
    """The dtype of a kernel result ``v`` for variable ``name`` (see
    ``Plan.out_dtype``): the kernel's own dtype, a Python scalar's (weakly
    typed) resolved against the data's dtype as JAX would; the state's dtype
    (scans); or an explicit ``dtype=``."""
    if plan.out_dtype is None:
        return _out_dtype(plan, name)
    if isinstance(plan.out_dtype, np.dtype):
        return plan.out_dtype
    if is_weak(v):
        return promote(v, _out_dtype(plan, name))
    return v.dtype


def windows(plan: Plan, cells: Sequence[Any]) -> Any:
    """The kernel's argument: a Window, or a WindowSet for a Dataset."""
    field = plan.reach()
    nvar = len(plan.var_dims)
    coords = {}
    for k, d in enumerate(plan.coord_dims):
        coords[d] = CoordWindow(cells[nvar + k], (d,), (plan.specs[plan.axis(d)].lo,),
                                field=field, label=f"u.coord({d!r})",
                                read_dtype=read_dtype(plan.var_dtypes),
                                single=(d,) if plan.shape[plan.axis(d)] == 1 else ())
    wins = []
    for k, vdims in enumerate(plan.var_dims):
        # the cells come in the variable's dim order; the window's axes are in
        # the window= order (Plan.window_axes), so that u * w means the same on
        # data stored (y, x) or (x, y)
        held = [d for d in vdims if d in plan.window_dims]
        wd = plan.window_axes(vdims)
        data = cells[k]
        if list(wd) != held:
            data = jnp.transpose(data, [held.index(d) for d in wd])
        centre = tuple(plan.specs[plan.axis(d)].lo for d in wd)
        label = "u" if plan.var_names is None else f"s[{plan.var_names[k]!r}]"
        wins.append(Window(data, wd, centre, field=field, coords=coords, label=label))
    if plan.var_names is None:
        return wins[0]
    return WindowSet(dict(zip(plan.var_names, wins, strict=True)))


def kernel_caller(plan: Plan, kernel: Callable[..., Any], static: Any) -> Callable[..., Any]:
    """The engine-facing kernel: cells in, normalized outputs out."""
    name = getattr(kernel, "__name__", repr(kernel))

    def call(cells: Sequence[Any], dyn: Any) -> Any:
        a, kw = merge_static(dyn, static)
        arg = windows(plan, cells)
        try:
            out = fresh(kernel)(arg, *a, **kw)
        except (XStencilError, WindowIndexError) as e:
            raise with_call(plan.call, kernel, e) from None
        except Exception as e:
            typo = unknown_keyword(plan.call, kernel, e, kw) or traced_error(plan.call, kernel, e)
            if typo is not None:
                raise typo from e
            shape = {d: plan.specs[plan.axis(d)].size for d in plan.window_axes(plan.dims)}
            detail, advice = str(e), advice_for(e)
            if advice:  # JAX's long note hides what to do
                detail = (detail.strip().splitlines() or [""])[0]
            raise KernelError(
                f"{plan.call}: kernel {name!r} failed on a window {shape} "
                f"({type(e).__name__}: {detail}){advice}") from e
        check_returned(plan.call, kernel, out, plan.var_names is not None)
        return normalize(plan, name, out)

    return call


def normalize(plan: Plan, name: str, out: Any) -> Any:
    if plan.var_names is not None and isinstance(out, Mapping):
        res = {}
        for k, v in out.items():
            if not isinstance(k, str):
                raise XStencilError(f"{plan.call}: kernel {name!r} returned a dict with key "
                                    f"{k!r}; keys must be variable names (str)")
            res[k] = _leaf(plan, name, v, k)
        return res
    if isinstance(out, Mapping):
        raise XStencilError(
            f"{plan.call}: kernel {name!r} returned a dict, which only a Dataset kernel may do")
    return _leaf(plan, name, out, None)


def _leaf(plan: Plan, name: str, v: Any, var: str | None) -> Any:
    v = jnp.asarray(v)
    if v.ndim != len(plan.output_dims):
        if not plan.output_dims:
            names = tuple(f'k{i}' for i in range(v.ndim))
            field = _field_dims(plan, v.shape)
            if field is not None:  # output_dims would make an outer product of it
                raise XStencilError(
                    f"{plan.call}: kernel {name!r} returned an array of shape {v.shape} per "
                    f"point, the data's own sizes along {field!r}: an array of the field's "
                    f"shape that the kernel closes over is read whole at every point, not at "
                    f"the point. For a coefficient field on the same grid, put it in a Dataset "
                    f"with the data, e.g. ds = xr.Dataset({{'u': da, 'c': c}}), and read it in "
                    f"the kernel as s['c']() (s['u'](x=1) for the data); only if the kernel "
                    f"really returns an array per point, name its dims with "
                    f"output_dims={names!r}")
            raise XStencilError(
                f"{plan.call}: kernel {name!r} returned an array of shape {v.shape} per point; "
                f"name its dims with output_dims=(...), e.g. output_dims="
                f"{names!r}, or return a scalar"
            )
        raise XStencilError(
            f"{plan.call}: kernel {name!r} returned shape {v.shape} per point, which does not "
            f"match output_dims={plan.output_dims!r}"
        )
    return v.astype(result_dtype(plan, var, v))


def _field_dims(plan: Plan, shape: tuple[int, ...]) -> tuple[str, ...] | None:
    """The data's dims, in order, whose sizes are ``shape`` (one dim at
    least, all of size 2 or more), or ``None``: a per-point result of the
    field's own shape is most likely a whole field closed over."""
    n = len(shape)
    if min(shape) < 2 or n == 1 and len(plan.dims) > 1 and shape[0] in {
            plan.specs[plan.axis(d)].size for d in plan.window_dims}:
        return None  # one dim of several, as long as a window: a window patch, most likely
    for start in range(len(plan.dims) - n + 1):
        if tuple(plan.shape[start:start + n]) == tuple(shape):
            return plan.dims[start:start + n]
    return None


def identity_caller(plan: Plan, like: Callable[..., Any]) -> Callable[..., Any]:
    """Keeps the input: the centre of each variable the kernel returns."""

    def keep(cells: Sequence[Any], dyn: Any) -> Any:
        shapes = jax.eval_shape(like, cells, dyn)
        centres = []
        for k, vdims in enumerate(plan.var_dims):
            wd = [d for d in vdims if d in plan.window_dims]
            centres.append(cells[k][tuple(plan.specs[plan.axis(d)].lo for d in wd)])
        if isinstance(shapes, Mapping):
            out = {}
            for n, sd in shapes.items():
                if plan.var_names is None or n not in plan.var_names:
                    raise XStencilError(
                        f"{plan.call}: a mesh kernel returned {n!r}, which is not a data "
                        f"variable, so uncovered points have no input value to keep")
                c = centres[plan.var_names.index(n)]
                out[n] = jnp.broadcast_to(c[(...,) + (None,) * sd.ndim], sd.shape).astype(
                    _kept_dtype(plan, c, sd))
            return out
        c = centres[0]
        return jnp.broadcast_to(c, shapes.shape).astype(_kept_dtype(plan, c, shapes))

    return keep


def _kept_dtype(plan: Plan, centre: Any, shape: Any) -> Any:
    """The dtype of kept input values: the input's own (promoted with the
    kernels' results by the mesh), the state's (scans) or ``dtype=``."""
    if plan.out_dtype is None:
        return shape.dtype
    if isinstance(plan.out_dtype, np.dtype):
        return plan.out_dtype
    return centre.dtype
