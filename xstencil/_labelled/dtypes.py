"""The dtype of results (see docs/dtypes.rst).

* map and mesh: the result has the dtype the kernel returns, as in numpy and
  JAX (a Python scalar, weakly typed, takes the data's dtype); ``dtype=``
  casts explicitly.
* scan: the kernel's result feeds the next step, so the state (the carry)
  takes the promoted dtype of the input and the kernel's result, found by
  tracing the kernel until the dtype no longer changes; the initial
  conditions are cast to it (a safe cast: it is a promotion).  ``dtype=``
  sets the state's dtype and casts the kernel's result to it.
* float64 under a JAX transform with x64 off: JAX itself turns the leaves
  into float32 before xstencil sees them; :func:`warn_narrowed` says so.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import jax
import numpy as np
import xarray as xr

from xstencil._engine.call import dtype_kind, is_weak, precision, promote, split_static
from xstencil._engine.kcache import compiled, describe, freeze, rebuild
from xstencil._errors import PrecisionWarning, XStencilError
from xstencil._labelled.core import kernel_caller
from xstencil._labelled.plan import Plan
from xstencil._labelled.returns import kernel_cells
from xstencil._labelled.scan_plan import ScanPlan
from xstencil._labelled.scan_setup import coord_dtype, setup

__all__ = ["out_dtype", "carry_dtypes", "cast_state", "state_dtype", "state_casts",
           "PrecisionWarning", "warn_narrowed"]


def out_dtype(call: str, dtype: Any) -> Any:
    """``Plan.out_dtype`` for a ``dtype=`` option: ``"kernel"`` when omitted,
    else the checked numpy dtype."""
    if dtype is None:
        return "kernel"
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dtype_kind(dt) not in "biufc":
        raise XStencilError(
            f"{call}: dtype={dtype!r:.60} is not a numeric dtype; pass e.g. dtype='float32', "
            f"dtype=numpy.int32 or dtype=bool, or leave it out to keep the dtype the kernel "
            f"returns")
    return dt.newbyteorder("=") if not dt.isnative else dt  # '>f8': a native result


def carry_dtypes(call: str, plan: Plan, kernels: Sequence[Any], args: Any, kwargs: Any,
                 cdt: Any) -> dict[int, np.dtype]:
    """Per variable index, the dtype a scan's state must have so that every
    kernel's result fits in it without wrapping or truncation: the promoted
    dtype of the input and the results, traced to a fixed point."""
    dtypes = [np.dtype(d) for d in plan.var_dtypes]
    names = plan.var_names
    # the arrays the kernels close over are abstract here, as in a compiled scan
    # (their inputs): a kernel that needs one concrete (float(w[0])) fails alike
    # in memory and on dask, whose blocks would bake them in
    lifted = describe(kernels)
    with precision([np.zeros(0, d) for d in dtypes], args, kwargs):
        udyn, static = split_static(call, (args, kwargs))
        for _ in range(4):
            kplan = replace(plan, var_dtypes=tuple(dtypes), out_dtype="kernel")
            new = list(dtypes)
            for k in range(len(kernels)):
                def one(cs: Any, d: Any, leaves: Any, k: int = k, kplan: Plan = kplan) -> Any:
                    return kernel_caller(kplan, rebuild(lifted, leaves)[k], static)(cs, d)

                out = jax.eval_shape(one, kernel_cells(kplan, dtypes, cdt), udyn,
                                     list(lifted.leaves))
                if names is None:
                    items: list[tuple[int, Any]] = [(0, out)]
                elif isinstance(out, Mapping):
                    items = [(names.index(n), v) for n, v in out.items() if n in names]
                else:
                    items = []
                for i, v in items:
                    new[i] = np.dtype(promote(new[i], v.dtype))
            if new == dtypes:
                break
            dtypes = new
        else:
            raise XStencilError(
                f"{call}: the kernel's result dtype keeps widening from step to step "
                f"({[str(d) for d in dtypes]}); pass dtype=... to fix the state's dtype")
    return {i: d for i, d in enumerate(dtypes) if d != np.dtype(plan.var_dtypes[i])}


def state_dtype(call: str, obj: Any, kernels: Sequence[Any], owner: Any, o: ScanPlan,
                args: Any, kwargs: Any, dtype: Any) -> Any:
    """``obj`` with the scanned variables cast to the state's dtype: ``dtype=``
    if given, else the promoted dtype of the input and the kernels' results
    (:func:`carry_dtypes`; a no-op when the kernels keep the input's dtype)."""
    return cast_state(obj, *state_casts(call, obj, kernels, owner, o, args, kwargs, dtype))


def state_casts(call: str, obj: Any, kernels: Sequence[Any], owner: Any, o: ScanPlan,
                args: Any, kwargs: Any, dtype: Any) -> tuple[dict[int, Any], Any]:
    """What :func:`state_dtype` casts: ``({variable index: dtype}, variable
    names)`` (names ``None`` for a DataArray)."""
    explicit = None if dtype is None else out_dtype(call, dtype)
    udyn, static = split_static(call, (args, kwargs))
    # weak types too: a weakly typed float32 argument keeps a float16 state, a strong one not
    shapes = tuple((tuple(np.shape(x)), str(getattr(x, "dtype", "")), is_weak(x)) for x in udyn)
    x64 = bool(jax.config.read("jax_enable_x64"))
    # a repeated call with the same layout skips the setup (as map's fast path)
    sig: Any = ("carry-call", _layout(obj), freeze(o.options), static, shapes,
                tuple(kernels), x64, None if explicit is None else str(explicit))
    try:
        hash(sig)
    except TypeError:
        sig = None

    def decide() -> Any:
        # the dtypes only: whether the saved trajectory fits in memory is the
        # in-memory scan's own check (dask-backed and sharded ones need not fit)
        s, _ = setup(obj, kernels, o, args, kwargs, in_memory=False)
        plan = s.plan
        assert plan is not None
        if explicit is not None:
            casts = {i: explicit for i in s.evolving
                     if np.dtype(plan.var_dtypes[i]) != explicit}
        else:
            cdt = coord_dtype(plan)
            found = compiled(owner, ("carry", plan, static, shapes, tuple(kernels), str(cdt),
                                     x64),
                             lambda: carry_dtypes(call, plan, kernels, args, kwargs, cdt).copy)()
            casts = {i: d for i, d in found.items() if i in s.evolving}
        names = plan.var_names
        return lambda: (dict(casts), names)

    if sig is None:
        return decide()()
    return compiled(owner, sig, decide)()


def _layout(obj: Any) -> Any:
    """What decides a scan's plan and dtypes, apart from the options: the
    type, each variable's dims, shape and dtype, and the coordinates' dims
    and dtypes."""
    if isinstance(obj, xr.DataArray):
        variables: Any = [(None, obj.variable)]
    elif isinstance(obj, xr.Dataset):
        variables = [(str(n), obj[n].variable) for n in obj.data_vars]
    else:
        return ("other", id(obj))
    coords = tuple((str(k), v.dims, str(v.dtype)) for k, v in obj.coords.variables.items())
    return (type(obj).__name__, tuple((n, v.dims, v.shape, str(v.dtype)) for n, v in variables),
            coords)


def cast_state(obj: Any, casts: Mapping[int, Any], names: Sequence[str] | None) -> Any:
    """``obj`` with variables cast (by index into ``names``; a DataArray: 0)."""
    if not casts:
        return obj
    if isinstance(obj, xr.DataArray):
        return obj.astype(casts[0])
    assert names is not None
    return obj.assign({names[i]: obj[names[i]].astype(d) for i, d in casts.items()})


def warn_narrowed(dtype: Any, leaf: Any) -> None:
    """Warn when a leaf that was 64-bit when flattened comes back 32-bit
    inside a JAX transform because x64 is off."""
    if dtype is None or jax.config.read("jax_enable_x64"):
        return
    got = getattr(leaf, "dtype", None)
    if got is None or not isinstance(leaf, jax.core.Tracer):
        return
    if np.dtype(got).itemsize >= np.dtype(dtype).itemsize:
        return
    warnings.warn(
        f"xstencil: {np.dtype(dtype)} data became {np.dtype(got)} inside a JAX transform "
        f"(jax.jit, jax.vmap, lax.fori_loop, lax.while_loop, lax.scan, ...): JAX's x64 flag is "
        f"off, and JAX converts 64-bit arguments to 32 bits at the transform's boundary, "
        f"before xstencil sees them. To keep {np.dtype(dtype)}, enable x64: "
        f"jax.config.update('jax_enable_x64', True), or run the transform inside "
        f"`with jax.enable_x64(True):`; or call the stencil outside the transform (xstencil "
        f"keeps float64 there)", PrecisionWarning, stacklevel=4)
