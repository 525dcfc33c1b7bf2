"""Calling the engine: float64 handling and static/dynamic kernel arguments.

* float64 stays float64 even when JAX's x64 flag is off: a call whose inputs
  are 64-bit runs under ``jax.enable_x64(True)`` for its duration only, so no
  global flag changes for the user.
* Extra kernel arguments are split into array leaves (dynamic: traced, so a
  new value does not recompile and gradients flow) and everything else
  (static: hashable Python values baked into the trace).
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xstencil._engine.x64flag import x64
from xstencil._errors import PrecisionWarning, XStencilError

__all__ = ["is_wide", "precision", "as_array", "split_static", "merge_static", "promote",
           "dtype_kind", "is_weak", "settled", "stand_in", "outside_transforms",
           "narrowed_here", "own_loop", "avals"]


def avals(xs: Any) -> tuple[tuple[tuple[int, ...], str], ...]:
    """The shapes and dtypes of the array leaves of ``xs``: what a compiled
    function's array arguments fix (their values do not)."""
    return tuple((tuple(np.shape(x)), str(getattr(x, "dtype", type(x).__name__)))
                 for x in jax.tree_util.tree_leaves(xs))


def stand_in(shape: tuple[int, ...], dtype: Any, weak_type: bool = False) -> Any:
    """A ``jax.ShapeDtypeStruct`` of ``dtype`` as JAX can hold it right now.

    With x64 off a 64-bit dtype is narrowed here (float64 -> float32), as JAX
    would narrow it when the stand-in is traced; JAX 0.11 warns when it is
    asked for a dtype it cannot hold, so the narrowing is done first.  Build
    stand-ins inside the :func:`precision` block that traces them, so that
    64-bit inputs get 64-bit stand-ins.
    """
    return jax.ShapeDtypeStruct(tuple(shape), jax.dtypes.canonicalize_dtype(np.dtype(dtype)),
                                weak_type=weak_type)


def dtype_kind(dtype: Any) -> str:
    """numpy's one-letter kind of ``dtype``, with JAX's extra floats
    (bfloat16, float8_*: numpy kind ``"V"``) reported as ``"f"``."""
    dt = np.dtype(dtype)
    if dt.kind == "V" and jnp.issubdtype(dt, jnp.floating):
        return "f"
    return dt.kind


def is_weak(x: Any) -> bool:
    """Whether ``x`` is weakly typed (a Python scalar's type in JAX)."""
    try:
        return bool(jax.typeof(x).weak_type)
    except TypeError:
        return False


def _dtype(x: Any) -> Any:
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    return np.dtype(dt)


def is_wide(*xs: Any) -> bool:
    """Whether any input carries a 64-bit dtype."""
    for leaf in jax.tree_util.tree_leaves(xs):
        dt = _dtype(leaf)
        if dt is None:
            continue
        if dt.kind in "fiu" and dt.itemsize == 8 or dt.kind == "c" and dt.itemsize == 16:
            return True
    return False


@contextlib.contextmanager
def precision(*xs: Any) -> Iterator[None]:
    """Run the block with x64 enabled if the inputs are 64-bit.

    Not inside a JAX transform of the caller's (a trace in progress, x64
    off): float64 tracers handed back into a 32-bit trace broke ``jacrev``,
    ``hessian`` and ``jvp`` with dtype errors from deep inside JAX, and the
    numpy constants JAX converted meanwhile stayed 64-bit in its caches, so
    later plain JAX calls on them failed.  There the block runs in 32 bits,
    as the same code written in JAX would, and says so once."""
    if is_wide(*xs) and not x64():
        if not outside_transforms(()) and not _OWN.get():
            warn_transform_narrows()
            yield
            return
        with jax.enable_x64(True):
            yield
    else:
        yield


#: True while xstencil traces a compiled loop of its own (``scan(step=)``,
#: ``iterate``, ``solve``) that was called outside any JAX transform: maps the
#: step calls are then not inside a caller's transform, and keep float64.
_OWN: contextvars.ContextVar[bool] = contextvars.ContextVar("xstencil_own_trace",
                                                             default=False)


@contextlib.contextmanager
def own_loop(*xs: Any) -> Iterator[None]:
    """:func:`precision` for the inputs ``xs`` of a compiled loop of
    xstencil's own (``scan(step=)``, ``iterate``, ``solve``), with the block
    marked as that loop's trace (see :data:`_OWN`), unless the loop itself
    runs inside a caller's transform."""
    with precision(*xs):
        token = _OWN.set(_OWN.get() or outside_transforms(()))
        try:
            yield
        finally:
            _OWN.reset(token)


def narrowed_here() -> bool:
    """Inside a JAX transform of the caller's with x64 off: 64-bit data is
    computed in 32 bits here (:func:`precision`), so a repeat-call fast path
    recorded for 64-bit data outside must not run (it would switch x64 on)."""
    return not x64() and not _OWN.get() and not outside_transforms(())


def warn_transform_narrows() -> None:
    warnings.warn(
        "xstencil: 64-bit data inside a JAX transform (jax.jit, grad, vmap, jacrev, "
        "lax loops, ...) is computed in 32 bits, because JAX's x64 flag is off and a "
        "64-bit result cannot enter a 32-bit trace. To keep float64, enable x64: "
        "jax.config.update('jax_enable_x64', True), or run the transform inside "
        "`with jax.enable_x64(True):`; or call the stencil outside the transform "
        "(xstencil keeps float64 there)", PrecisionWarning, stacklevel=4)


def native(x: Any) -> Any:
    """Data in native byte order: a big-endian ``'>f4'`` array (read from a
    netCDF or HDF5 file; numpy, a numpy scalar, or dask, converted lazily per
    block) is converted, as JAX and numba take native data only; anything
    else is returned as it is."""
    dt = getattr(x, "dtype", None)
    if isinstance(dt, np.dtype) and not dt.isnative and hasattr(x, "astype"):
        return x.astype(dt.newbyteorder("="))
    return x


def as_array(call: str, arg: str, x: Any) -> Any:
    """A JAX array (or tracer) with the input's dtype; no copy of JAX arrays."""
    if isinstance(x, jax.Array | jax.core.Tracer):
        return x
    if isinstance(x, np.ndarray | np.generic):
        if dtype_kind(x.dtype) not in "biufc":
            raise XStencilError(
                f"{call}: {arg} has dtype {x.dtype}, which is not numeric; stencils run on "
                f"bool, int, float or complex data (convert with .astype(float))"
            )
        # a view: JAX keeps the 32-bit copy it made of a 64-bit array read in a trace
        # with x64 off, by the array object, and handed that copy back here later
        # under x64 (an iterate over data a jitted iterate had read: a float32
        # carry against a float64 step, a dtype error)
        x = native(x)
        return jnp.asarray(x.view() if isinstance(x, np.ndarray) else x)
    raise XStencilError(
        f"{call}: {arg} must be an array (numpy or JAX), got {type(x).__name__}: {x!r:.80}; "
        f"wrap it with numpy.asarray"
    )


class _Dynamic:
    """Marks a dynamic leaf's position in a static template."""

    def __repr__(self) -> str:
        return "<dynamic>"


DYNAMIC = _Dynamic()


def split_static(call: str, tree: Any) -> tuple[list[Any], Any]:
    """Split kernel arguments into dynamic array leaves and a hashable
    template of everything else."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    dyn, template = [], []
    for leaf in leaves:
        if isinstance(leaf, jax.Array | jax.core.Tracer | np.ndarray | np.generic):
            dyn.append(native(leaf))
            template.append(DYNAMIC)
            continue
        try:
            hash(leaf)
        except TypeError:
            raise XStencilError(
                f"{call}: the kernel argument {leaf!r:.80} is neither an array nor hashable; "
                f"pass arrays as numpy/JAX arrays and other values as hashable constants"
            ) from None
        template.append((type(leaf), leaf, _exact(leaf)))
    return dyn, (treedef, tuple(template))


def _exact(leaf: Any) -> Any:
    """What tells equal floats apart in a static template: ``0.0 == -0.0``,
    but ``1 / -0.0`` is ``-inf`` (so a kernel given ``-0.0`` must not reuse
    code traced with ``0.0``)."""
    if isinstance(leaf, float):
        return leaf.hex()
    if isinstance(leaf, complex):
        return leaf.real.hex(), leaf.imag.hex()
    return None


def merge_static(dyn: list[Any], static: Any) -> Any:
    treedef, template = static
    it = iter(dyn)
    leaves = [next(it) if t is DYNAMIC else t[1] for t in template]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def promote(*xs: Any) -> Any:
    """JAX's standard promotion of dtypes/values, whatever the user's
    ``jax_numpy_dtype_promotion`` setting (library-internal merging only)."""
    with jax.numpy_dtype_promotion("standard"), warnings.catch_warnings():
        # inside a caller's transform with x64 off, 64-bit inputs are computed in
        # 32 bits (``precision``, which warns once); JAX's own warning about the
        # 64-bit dtype it cannot give would repeat that for every merge
        warnings.filterwarnings("ignore", message="Explicitly requested dtype")
        return jnp.result_type(*xs)


def settled(out: Any, inputs: Any) -> Any:
    """``out``, computed before returning when any of ``inputs`` is a numpy
    array.

    jit may read a numpy input in place (no copy on the CPU) and runs
    asynchronously, so a caller that changed its array right after the call
    (``w[...] = 2``) could otherwise change a result it already holds.
    """
    if _any_numpy(inputs):
        jax.block_until_ready(out)
    return out


def _any_numpy(inputs: Any) -> bool:
    """Whether a leaf of ``inputs`` is a numpy array; a sequence of flat
    lists (a repeated call's data, arguments and closed-over arrays) is
    read without walking the tree, the usual case on a warm call."""
    if type(inputs) is tuple and all(type(g) is list for g in inputs):
        flat = [x for g in inputs for x in g]
        if all(type(x) is np.ndarray or isinstance(x, jax.Array) for x in flat):
            return any(type(x) is np.ndarray for x in flat)
    return any(isinstance(x, np.ndarray) for x in jax.tree_util.tree_leaves(inputs))


def outside_transforms(leaves: Sequence[Any]) -> bool:
    """No JAX tracer among ``leaves`` and no trace in progress (a kernel may
    close over a traced value that is not among the arguments): a call may
    then run outside JAX (numba loops, threads) without losing a derivative.
    Where JAX does not expose its trace state, only the leaves are checked."""
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        return False
    clean = getattr(getattr(getattr(jax, "_src", None), "core", None), "trace_state_clean",
                    None)
    return clean is None or bool(clean())
