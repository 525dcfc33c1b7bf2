"""What a Dataset kernel may return, and the dims each result gets.

A Dataset kernel reads some variables and returns one value or a dict of
values.  Each result gets the dims of what it read, never more:

* a result named after an existing data variable keeps that variable's dims,
  in that variable's order; computing it from a field with more dims raises;
* a new result (declared with ``new_vars=``, or the single value of a
  non-dict kernel) gets the dims of the variables it read, in the order of
  the read variable that has them all;
* a result that would need more dims than any variable it read (staggered
  variables such as ``u`` on ``(y_c, x_g)`` and ``v`` on ``(y_g, x_c)``)
  raises instead of broadcasting to an outer product;
* a name that is a coordinate, or that is neither a data variable nor
  declared in ``new_vars``, raises.

Which variables a result read comes from one trace of the kernel on
per-cell windows: a result depends on a variable if any window cell of that
variable reaches it in the jaxpr (a conservative walk over the equations).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import xarray as xr
from jax.extend.core import Literal

from xstencil._engine.call import precision, stand_in
from xstencil._errors import XStencilError
from xstencil._labelled.plan import Plan
from xstencil._labelled.staggered_hidden import HIDDEN

__all__ = ["check_new_vars", "kernel_cells", "result_dims", "result_reads", "to_dims"]


def check_new_vars(call: str, new_vars: Any) -> tuple[str, ...]:
    """``new_vars=`` as a tuple of names."""
    if new_vars is None:
        return ()
    names = (new_vars,) if isinstance(new_vars, str) else new_vars
    if not isinstance(names, Sequence | set | frozenset) \
            or not all(isinstance(n, str) for n in names):
        raise XStencilError(
            f"{call}: new_vars={new_vars!r:.60} must be a variable name or a tuple of names "
            f"(str), such as new_vars=('speed',)")
    return tuple(names)


def _depends(closed: Any, n_cells: int) -> list[set[int]]:
    """For each output of the jaxpr, the input positions (< n_cells) it depends on."""
    jaxpr = closed.jaxpr
    dep: dict[Any, set[int]] = {}
    for k, v in enumerate(jaxpr.invars):
        dep[v] = {k} if k < n_cells else set()
    for eqn in jaxpr.eqns:
        s: set[int] = set()
        for v in eqn.invars:
            if not isinstance(v, Literal):
                s |= dep.get(v, set())
        for v in eqn.outvars:
            dep[v] = s
    return [set() if isinstance(v, Literal) else dep.get(v, set())
            for v in jaxpr.outvars]


def kernel_cells(plan: Plan, dtypes: Sequence[Any], cdt: Any) -> list[Any]:
    """Stand-ins (``jax.ShapeDtypeStruct``) for the windows a kernel reads: one
    per variable (in ``dtypes``), then one per coordinate (in ``cdt``)."""
    cells = [stand_in(
        tuple(plan.specs[plan.axis(d)].size for d in vd if d in plan.window_dims), np.dtype(dt))
        for vd, dt in zip(plan.var_dims, dtypes, strict=True)]
    return cells + [stand_in((plan.specs[plan.axis(d)].size,), cdt)
                    for d in plan.coord_dims]


def _reads(plan: Plan, caller: Callable[..., Any], dyn: Any, wide: Any
           ) -> dict[str | None, tuple[set[str], set[int]]]:
    """Per result name (None: not a dict), the dims it read and the data
    variables (by index) it read."""
    with precision(*wide):
        avals = kernel_cells(plan, plan.var_dtypes, np.float32)  # only the structure matters
        closed, shapes = jax.make_jaxpr(caller, return_shape=True)(avals, dyn)
    deps = _depends(closed, len(avals))
    nvar = len(plan.var_dims)
    dims_of = list(plan.var_dims) + [(d,) for d in plan.coord_dims]
    # one leaf per name, in the flattened (sorted-key) order of the dict
    flat = sorted(shapes) if isinstance(shapes, Mapping) else [None]
    out: dict[str | None, tuple[set[str], set[int]]] = {}
    for n, d in zip(flat, deps, strict=True):
        read: set[str] = set().union(*(set(dims_of[k]) for k in d))
        out[n] = (read, {k for k in d if k < nvar})
    return out


def result_reads(plan: Plan, caller: Callable[..., Any], dyn: Any, wide: Any
                 ) -> dict[str | None, tuple[set[str], set[int]]]:
    """Per result name (``None``: not a dict), the dims it read and the data
    variables (by index) it read (one trace of ``caller``)."""
    return _reads(plan, caller, dyn, wide)


def result_dims(plan: Plan, obj: xr.Dataset, callers: Sequence[Callable[..., Any]], dyn: Any,
                wide: Any, new_vars: tuple[str, ...] = (),
                region_dims: Sequence[str] = ()) -> dict[str | None, tuple[str, ...]]:
    """The field dims of each result of a Dataset kernel, in the result's order;
    raises on unknown or coordinate names, staggered outer products and grown dims."""
    assert plan.var_names is not None
    call = plan.call
    reads: dict[str | None, tuple[set[str], set[int]]] = {}
    for caller in callers:
        for k, (r, v) in _reads(plan, caller, dyn, wide).items():
            r0, v0 = reads.get(k, (set(), set()))
            reads[k] = (r0 | r, v0 | v)
    for n in reads:
        if n is None:
            continue
        if n in obj.coords:
            kind = "an index coordinate" if n in obj.indexes else "a coordinate"
            raise XStencilError(
                f"{call}: the kernel returned {n!r}, which is {kind} of the Dataset, not a data "
                f"variable; results never replace coordinates. Return it under another name "
                f"(declared with new_vars=) and assign it with ds.assign_coords(...) if you "
                f"mean to")
        if n not in plan.var_names and n not in new_vars:
            raise XStencilError(
                f"{call}: the kernel returned {n!r}, which is not a data variable of the "
                f"Dataset {tuple(v for v in plan.var_names if not v.startswith(HIDDEN))!r}; "
                f"fix the name, or declare a new variable with new_vars=({n!r},)")
    var_dims = dict(zip(plan.var_names, plan.var_dims, strict=True))
    out: dict[str | None, tuple[str, ...]] = {}
    for n, (read, vars_read) in reads.items():
        kernel_read = set(read)
        read = read | set(region_dims)
        vars_read = vars_read or set(range(len(plan.var_dims)))  # reads nothing: any variable
        own = [tuple(obj[plan.var_names[k]].dims) for k in sorted(vars_read)]
        if n is not None and n in var_dims:
            fits = kernel_read <= set(var_dims[n])
            _check_region_dims(call, n, read, fits, [tuple(obj[n].dims)], plan.dims)
        elif read and not any(read <= set(o) for o in own):
            fits = not kernel_read or any(kernel_read <= set(o) for o in own)
            _check_region_dims(call, n, read, fits, own, plan.dims)
        if read and not any(read <= set(o) for o in own):
            got = tuple(d for d in plan.dims if d in read)
            raise XStencilError(
                f"{call}: the kernel's result{'' if n is None else f' {n!r}'} combines "
                f"variables on different dims {tuple(dict.fromkeys(own))!r}; it would "
                f"broadcast to an outer product over {got!r}. Combine variables that share "
                f"their dims: interpolate to common points first (on a staggered grid, "
                f"grid= and at= read each variable at the output's points: "
                f"docs/staggered.rst), or reduce over the extra dims in the kernel")
        if n is not None and n in var_dims:
            if not read <= set(var_dims[n]):
                extra = tuple(d for d in plan.dims if d in read and d not in var_dims[n])
                raise XStencilError(
                    f"{call}: the kernel returned {n!r} computed from dims {extra!r} that "
                    f"{n!r} {tuple(obj[n].dims)!r} does not have; it would grow a dim. Reduce "
                    f"over them in the kernel, or return a new variable (new_vars=)")
            out[n] = tuple(str(d) for d in obj[n].dims)
            continue
        order = next((o for o in own if read <= set(o)), plan.dims)
        out[n] = tuple(str(d) for d in order if d in read) if read else tuple(order)
    return out


def _check_region_dims(call: str, n: str | None, read: set[str], fits: bool,
                       own: list[tuple[str, ...]], dims: tuple[str, ...]) -> None:
    """Raise when only the mesh's regions (not the kernel's reads) would give
    result ``n`` dims its variables lack (``fits``: the reads alone fit)."""
    if not fits or any(read <= set(o) for o in own):
        return
    extra = tuple(d for d in dims if d in read and not any(d in o for o in own))
    name = "" if n is None else f" {n!r}"
    raise XStencilError(
        f"{call}: the mesh's regions vary along {extra!r}, but the kernel's result{name} is "
        f"computed from variables on {tuple(dict.fromkeys(own))!r} only; different kernels "
        f"along {extra!r} would give it dims it does not have. Select the regions along the "
        f"result's own dims, or compute it from a variable that has {extra!r}")


def to_dims(plan: Plan, v: Any, dims: tuple[str, ...]) -> Any:
    """A field-shaped result (plan dims + output dims) reduced to ``dims`` (in
    that order) + output dims: dims it did not read are constant along them."""
    if tuple(d for d in plan.dims if d in dims) == dims and len(dims) == len(plan.dims):
        return v
    index = tuple(slice(None) if d in dims else 0 for d in plan.dims)
    v = v[index]
    kept = [d for d in plan.dims if d in dims]
    perm = [kept.index(d) for d in dims] + list(range(len(dims), v.ndim))
    return v.transpose(perm) if perm != list(range(v.ndim)) else v
