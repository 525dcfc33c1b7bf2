"""Argument parsing and checks for the array API (:mod:`xstencil._engine.kernex`):
per-axis options, paddings, boundary modes, named axes and mesh regions.
Every bad value raises :class:`~xstencil.XStencilError` naming the call, the
argument and the fix."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from xstencil._engine.mesh import Mask, Slab
from xstencil._engine.spec import check_mode
from xstencil._errors import XStencilError

# -- argument parsing ----------------------------------------------------------

def per_axis(call: str, arg: str, value: Any, ndim: int) -> tuple[Any, ...]:
    if isinstance(value, tuple | list):
        if len(value) != ndim:
            raise XStencilError(
                f"{call}: {arg}={value!r} has {len(value)} entries but the array has {ndim} "
                f"dims; give one entry per dim"
            )
        return tuple(value)
    return (value,) * ndim


def parse_kernel_sizes(call: str, kernel_size: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    if isinstance(kernel_size, numbers.Integral) and not isinstance(kernel_size, bool):
        kernel_size = (kernel_size,) * len(shape) if len(shape) == 1 else kernel_size
    if not isinstance(kernel_size, tuple | list):
        if isinstance(kernel_size, numbers.Integral) and not isinstance(kernel_size, bool):
            raise XStencilError(
                f"{call}: kernel_size={kernel_size!r} is a single int but the array has "
                f"{len(shape)} dims {shape}; give one size per dim, e.g. "
                f"kernel_size={(kernel_size,) * len(shape)!r}"
            )
        raise XStencilError(f"{call}: kernel_size={kernel_size!r} must be a tuple of ints")
    if len(kernel_size) != len(shape):
        raise XStencilError(
            f"{call}: kernel_size={tuple(kernel_size)!r} has rank {len(kernel_size)} but the "
            f"array has shape {shape}; give one size per dim (-1 means the whole dim)"
        )
    out = []
    for k, n in zip(kernel_size, shape, strict=True):
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or (k < 1 and k != -1):
            raise XStencilError(
                f"{call}: kernel_size={tuple(kernel_size)!r} holds {k!r}; sizes must be "
                f"positive ints, or -1 for the whole dim"
            )
        out.append(n if k == -1 else int(k))
    return tuple(out)


def parse_strides(call: str, strides: Any, ndim: int) -> tuple[int, ...]:
    out = per_axis(call, "strides", strides, ndim)
    for s in out:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1:
            raise XStencilError(
                f"{call}: strides={strides!r} holds {s!r}; strides must be positive ints"
            )
    return tuple(int(s) for s in out)


def pair(call: str, arg: str, value: Any, k: int, whole: Any) -> tuple[int, int]:
    if isinstance(value, str):
        if value.lower() == "same":  # kernex takes 'SAME' and 'VALID' too
            return (k - 1) // 2, k // 2
        if value.lower() == "valid":
            return 0, 0
        raise XStencilError(
            f"{call}: {arg}={whole!r} holds {value!r}; use 'same', 'valid', an int or a "
            f"(lo, hi) pair"
        )
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value), int(value)
    if (isinstance(value, tuple | list) and len(value) == 2
            and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value)):
        return int(value[0]), int(value[1])
    raise XStencilError(
        f"{call}: {arg}={whole!r} holds {value!r}; use 'same', 'valid', an int or a (lo, hi) "
        f"pair of ints"
    )


def parse_paddings(call: str, padding: Any, sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    ndim = len(sizes)
    if isinstance(padding, str) or isinstance(padding, numbers.Integral):
        items: Sequence[Any] = (padding,) * ndim
    elif isinstance(padding, tuple | list):
        if (ndim == 1 and len(padding) == 2
                and all(isinstance(v, numbers.Integral) for v in padding)):
            items = (tuple(padding),)
        elif len(padding) != ndim:
            raise XStencilError(
                f"{call}: padding={padding!r} has {len(padding)} entries but the array has "
                f"{ndim} dims; give one entry per dim"
            )
        else:
            items = padding
    else:
        raise XStencilError(
            f"{call}: padding={padding!r} must be 'same', 'valid', an int, or one entry per dim"
        )
    return [pair(call, "padding", p, k, padding) for p, k in zip(items, sizes, strict=True)]


def parse_modes(call: str, boundary: Any, ndim: int) -> tuple[str, ...]:
    modes = per_axis(call, "boundary", boundary, ndim)
    return tuple(check_mode(call, "boundary", m) for m in modes)


def parse_named(call: str, named_axis: Any, ndim: int) -> tuple[str | None, ...]:
    names: list[str | None] = [None] * ndim
    if named_axis is None:
        return tuple(names)
    if not isinstance(named_axis, dict):
        raise XStencilError(
            f"{call}: named_axis={named_axis!r} must be a dict such as {{0: 'i', 1: 'j'}}"
        )
    for ax, name in named_axis.items():
        if isinstance(ax, bool) or not isinstance(ax, numbers.Integral) or not -ndim <= ax < ndim:
            raise XStencilError(
                f"{call}: named_axis={named_axis!r} names axis {ax!r}, but the array has "
                f"{ndim} dims"
            )
        if not isinstance(name, str) or not name.isidentifier():
            raise XStencilError(
                f"{call}: named_axis={named_axis!r} uses {name!r}; axis names must be "
                f"identifiers such as 'i'"
            )
        names[int(ax) % ndim] = name
    if len({n for n in names if n is not None}) != sum(n is not None for n in names):
        raise XStencilError(f"{call}: named_axis={named_axis!r} repeats a name")
    return tuple(names)


def index_text(index: Any, bare: bool = False) -> str:
    """A mesh index as the user wrote it: ``1:``, ``0, ::2``, ``...``."""
    def one(i: Any) -> str:
        if isinstance(i, slice):
            text = ":".join("" if v is None else repr(v) for v in (i.start, i.stop))
            return text + ("" if i.step is None else f":{i.step!r}")
        if i is Ellipsis:
            return "..."
        if isinstance(i, np.ndarray | jax.Array):
            return f"<{i.dtype} array of shape {tuple(i.shape)}>"
        return repr(i)

    if isinstance(index, tuple):
        inner = ", ".join(one(i) for i in index)
        return inner if bare else f"({inner},)" if len(index) == 1 else f"({inner})"
    return one(index)


# -- mesh regions ----------------------------------------------------------------

def region(call: str, index: Any, counts: tuple[int, ...]) -> Slab | Mask:
    """A numpy basic index (or boolean mask) over the output grid."""
    if isinstance(index, np.ndarray | jax.Array) and np.dtype(index.dtype) == np.bool_:
        if tuple(index.shape) != counts:
            raise XStencilError(
                f"{call}: a mask region has shape {tuple(index.shape)} but the output has "
                f"shape {counts}; give a boolean array of the output's shape"
            )
        return Mask(index)
    items = index if isinstance(index, tuple) else (index,)
    if sum(i is Ellipsis for i in items) > 1:
        raise XStencilError(f"{call}: mesh index {index_text(index)} has more than one '...'")
    if any(i is Ellipsis for i in items):  # `in` would compare arrays elementwise
        k = next(j for j, i in enumerate(items) if i is Ellipsis)
        items = items[:k] + (slice(None),) * (len(counts) - len(items) + 1) + items[k + 1:]
    if len(items) > len(counts):
        raise XStencilError(
            f"{call}: mesh index {index_text(index)} has {len(items)} entries but the "
            f"output has {len(counts)} dims"
        )
    items = items + (slice(None),) * (len(counts) - len(items))
    ranges = []
    for ax, (i, n) in enumerate(zip(items, counts, strict=True)):
        if isinstance(i, numbers.Integral) and not isinstance(i, bool):
            if not -n <= i < n:
                raise XStencilError(
                    f"{call}: mesh index {index_text(index)} is out of range along axis "
                    f"{ax}, whose output length is {n}"
                )
            j = int(i) % n
            ranges.append((j, j + 1, 1))
        elif isinstance(i, slice):
            start, stop, step = i.indices(n)
            r = range(start, stop, step)
            if step < 0:
                r = r[::-1]
            ranges.append((r.start, r.start + len(r) * r.step if len(r) else r.start, r.step)
                          if len(r) else (0, 0, 1))
        else:
            raise XStencilError(
                f"{call}: mesh index {index_text(index)} holds {i!r}; use ints, slices, '...' "
                f"or a boolean array"
            )
    return Slab(tuple(ranges))


def normal(r: range) -> tuple[int, int, int]:
    """``(start, stop, step)`` of a non-empty increasing range, or the empty one."""
    if not len(r):
        return (0, 0, 1)
    return (r[0], r[-1] + 1, r.step if len(r) > 1 else 1)


def intersect(region: Slab | Mask, keep: Slab) -> Slab | Mask:
    """``region`` restricted to the slab ``keep``.  Two arithmetic progressions
    intersect in an arithmetic progression, so a slab stays a slab."""
    if isinstance(region, Mask):
        mask = np.zeros(np.shape(region.array), dtype=bool)
        mask[tuple(slice(*r) for r in keep.ranges)] = True
        return Mask(np.asarray(region.array) & mask)
    ranges = []
    for a, b in zip(region.ranges, keep.ranges, strict=True):
        common = sorted(set(range(*a)) & set(range(*b)))
        if not common:
            return Slab(tuple((0, 0, 1) for _ in region.ranges))
        step = common[1] - common[0] if len(common) > 1 else 1
        ranges.append((common[0], common[-1] + 1, step))
    return Slab(tuple(ranges))


#: The widest padding (cells per side) beyond the data's own length.
MAX_HALO = 1024


def check_fill(call: str, fill_value: Any, dtype: Any, modes: Sequence[str]) -> None:
    """``fill_value`` must be a number that the data's dtype can hold."""
    number = isinstance(fill_value, numbers.Number | np.generic) and not isinstance(
        fill_value, str) and np.ndim(fill_value) == 0
    if not number:
        raise XStencilError(
            f"{call}: fill_value={fill_value!r:.60} must be a number, such as fill_value=0"
        )
    dt = np.dtype(dtype)
    v = fill_value.item() if isinstance(fill_value, np.generic) else fill_value
    ok = True
    if isinstance(v, complex) and dt.kind != "c":
        ok = v.imag == 0
        v = v.real
    if dt.kind in "iu":
        ok = ok and not (isinstance(v, float) and not v.is_integer()) and bool(
            np.iinfo(dt).min <= v <= np.iinfo(dt).max)
    elif dt.kind == "b":
        ok = ok and v in (0, 1)
    if not ok and "fill" in modes:
        raise XStencilError(
            f"{call}: fill_value={fill_value!r} cannot be stored in {dt} data; pass a "
            f"fill_value that {dt} can hold, or convert the array with .astype(...)"
        )


def check_valid(call: str, padding: Any, pads: Sequence[tuple[int, int]],
                 modes: Sequence[str]) -> None:
    """``boundary='valid'`` has no halo, so it cannot pad (it may trim)."""
    for ax, ((lo, hi), mode) in enumerate(zip(pads, modes, strict=True)):
        if mode == "valid" and (lo > 0 or hi > 0):
            raise XStencilError(
                f"{call}: boundary 'valid' along axis {ax} has no halo, but "
                f"padding={padding!r} pads it by ({lo}, {hi}); use padding='valid' (or 0) "
                f"along that axis, or a boundary that fills the halo such as 'fill'"
            )


def check_offsets(call: str, offset: Any, offsets: Sequence[tuple[int, int]],
                   pads: Sequence[tuple[int, int]], modes: Sequence[str]) -> None:
    for ax, ((lo, hi), (reach_lo, reach_hi), mode) in enumerate(
            zip(offsets, pads, modes, strict=True)):
        if lo < 0 or hi < 0:
            raise XStencilError(
                f"{call}: offset={offset!r} holds ({lo}, {hi}) along axis {ax}; offsets "
                f"count positions skipped at each end and must be >= 0"
            )
        if mode == "valid" and (lo < reach_lo or hi < reach_hi):
            raise XStencilError(
                f"{call}: boundary 'valid' along axis {ax} has no halo, but "
                f"offset={offset!r} gives ({lo}, {hi}) there, so some windows reach past "
                f"the array; use an offset of at least ({reach_lo}, {reach_hi}) along that "
                f"axis, or a boundary that fills the halo such as 'fill'"
            )
