"""Clear errors for kernels and their inputs, raised in the labelled layer: a
kernel that uses numpy, ``math`` or a Python ``if`` on traced values, a kernel
returning something that is not a number or an array, a DataArray or Dataset
passed as an extra kernel argument, and dask chunks of unknown size."""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from typing import Any

import xarray as xr

from xstencil._engine.advice import TRACED_ADVICE, is_traced_error
from xstencil._errors import KernelError, XStencilError

__all__ = ["TRACED_ADVICE", "traced_error", "check_returned", "check_extra_args",
           "check_known_chunks"]

def _name(kernel: Any) -> str:
    return getattr(kernel, "__name__", repr(kernel))


def traced_error(call: str, kernel: Callable[..., Any], e: Exception) -> KernelError | None:
    """A clear error for a kernel that asked a traced value for a concrete
    one (numpy, ``math``, ``float()``, ``if``), or ``None`` for other errors."""
    if not is_traced_error(e):
        return None
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return KernelError(
        f"{call}: kernel {_name(kernel)!r} used a traced value (a window value, or an "
        f"array it closes over) where Python needs a concrete one ({type(e).__name__}: "
        f"{first:.120}); {TRACED_ADVICE}")


def check_returned(call: str, kernel: Callable[..., Any], out: Any, dataset: bool) -> None:
    """Raise for a kernel result that is not a number, an array or (for a
    Dataset kernel) a flat dict of those."""
    name = _name(kernel)
    if dataset and isinstance(out, Mapping):
        for k, v in out.items():
            if isinstance(v, Mapping):
                raise XStencilError(
                    f"{call}: kernel {name!r} returned a nested dict (key {k!r} holds a "
                    f"{type(v).__name__}); return a flat dict of variable name -> value, "
                    f"such as {{{k!r}: s[{k!r}](x=1) - s[{k!r}]()}}")
            _check_leaf(call, name, v, f" for {k!r}")
        return
    if isinstance(out, Mapping):
        return  # the caller says a DataArray kernel cannot return a dict
    _check_leaf(call, name, out, "")


def _check_leaf(call: str, name: str, v: Any, where: str) -> None:
    if v is None:
        raise XStencilError(
            f"{call}: kernel {name!r} returned None{where}; a kernel must return the value "
            f"of the output point (a number or an array); check for a missing `return`")
    if isinstance(v, str | bytes):
        raise XStencilError(
            f"{call}: kernel {name!r} returned the string {v!r:.40}{where}; a kernel must "
            f"return a number or an array, such as u(x=1) - u()")
    if isinstance(v, types.GeneratorType | map | filter | range):
        raise XStencilError(
            f"{call}: kernel {name!r} returned a {type(v).__name__}{where}; a kernel must "
            f"return a number or an array: build one, e.g. jnp.stack([u(x=i) for i in "
            f"range(3)]) or sum(u(x=i) for i in range(3))")
    if isinstance(v, xr.DataArray | xr.Dataset):
        raise XStencilError(
            f"{call}: kernel {name!r} returned an xarray {type(v).__name__}{where}; a "
            f"kernel returns the value of one output point (a number or a jax array)")


def check_extra_args(call: str, args: Any, kwargs: Mapping[str, Any]) -> None:
    """Refuse a DataArray or Dataset as an extra kernel argument: its labels
    cannot follow the window, so say how to pass a field."""
    items = [(f"args[{k}]", v) for k, v in enumerate(args)]
    items += [(f"{k}=", v) for k, v in kwargs.items()]
    for where, v in items:
        if isinstance(v, xr.DataArray | xr.Dataset):
            kind = type(v).__name__
            shape = dict(v.sizes)
            var = "w" if where.startswith("args") else where.rstrip("=")
            raise XStencilError(
                f"{call}: extra kernel argument {where} is an xarray {kind} with sizes "
                f"{shape!r}; extra arguments are passed to the kernel as plain arrays, not "
                f"aligned to the window. For a field on the same grid, put it in a Dataset "
                f"with the data, e.g. ds = xr.Dataset({{'u': da, {var!r}: {var}}}), and read it "
                f"in the kernel as s[{var!r}]() or s[{var!r}](x=1); for a constant array "
                f"(weights), pass {var}.values")



def check_known_chunks(call: str, names: Any, var_dims: Any, arrays: Any) -> None:
    """Refuse dask arrays whose chunk sizes are unknown (NaN), as after boolean
    indexing: halos and outputs need every chunk's length."""
    for k, (x, dims) in enumerate(zip(arrays, var_dims, strict=True)):
        chunks = getattr(x, "chunks", None)
        if not isinstance(chunks, tuple):
            continue
        for d, c in zip(dims, chunks, strict=False):
            if any(isinstance(n, float) and math.isnan(n) for n in c):
                what = "the data" if names is None else f"variable {names[k]!r}"
                raise XStencilError(
                    f"{call}: {what} is a dask array with chunks of unknown size along {d!r} "
                    f"(chunks={tuple(c)!r}, as after boolean indexing); a stencil needs "
                    f"every chunk's length for its halo: call .compute_chunk_sizes() on the "
                    f"dask array first, e.g. da = da.copy(data=da.data.compute_chunk_sizes())")
