"""Validate a labelled call and turn it into a static :class:`Plan`.

A plan holds everything about a call that does not depend on data values:
the field's dims and shape, the window reach, boundary mode, padding and
stride per dim, and how each variable's dims sit in the field.  It is
hashable, so it keys the compile cache.  All user errors are raised here,
before anything is traced.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from xstencil._engine.boundary import MODE_HELP, MODES, canonical_mode
from xstencil._engine.call import stand_in
from xstencil._engine.coords import read_dtype
from xstencil._engine.lower import AxisGeom
from xstencil._engine.spec import AxisSpec, geometry
from xstencil._engine.window import Window, positional_read, whole
from xstencil._engine.windowset import WindowSet
from xstencil._errors import KernelError, WindowIndexError, XStencilError
from xstencil._labelled.fill import check_fill, fill_for
from xstencil._labelled.kernel_checks import check_returned, traced_error
from xstencil._labelled.options import options_for

__all__ = ["Plan", "make_plan", "infer_window", "check_options", "with_call"]

#: The widest halo (cells per side) beyond the data's own length; wider
#: windows are almost certainly a mistake, and would allocate without bound.
MAX_HALO = 1024


@dataclass(frozen=True)
class Plan:
    """The static description of a labelled stencil call."""

    call: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    specs: tuple[AxisSpec, ...]
    window_dims: tuple[str, ...]
    fill_value: Any
    var_names: tuple[str, ...] | None  # None: a DataArray
    var_dims: tuple[tuple[str, ...], ...]
    var_dtypes: tuple[Any, ...]
    coord_dims: tuple[str, ...]
    output_dims: tuple[str, ...] = ()
    #: the dtype of the results: ``None``, each variable's own (a scan's
    #: state); ``"kernel"``, the dtype the kernel returns (map and mesh);
    #: a ``numpy.dtype``, an explicit ``dtype=`` cast
    out_dtype: Any = None
    #: ``fill_value`` exactly (``float.hex``): plans are cache keys, and
    #: ``0.0 == -0.0`` although a fill of ``-0.0`` gives ``1 / fill == -inf``
    fill_bits: Any = None
    #: the dims of ``window=`` in the order the user wrote them (empty where
    #: the window was inferred): the axis order of the window as an array
    #: (``u * w``, ``u[1, -1]``), as ``rolling(...).construct`` orders its
    #: window dims by its arguments, not by the data's dim order
    window_order: tuple[str, ...] = ()

    def window_axes(self, vdims: Sequence[str]) -> tuple[str, ...]:
        """The window dims of a variable with dims ``vdims``, in the order of
        its window's axes: the ``window=`` order, then the other window dims
        (a scan's time dim) in the variable's order."""
        own = [d for d in vdims if d in self.window_dims]
        first = [d for d in self.window_order if d in own]
        return tuple(first + [d for d in own if d not in first])

    def dtype_probe(self) -> Any:
        """A zero-size array of an explicit ``dtype=`` (``None`` without one),
        for :func:`~xstencil._engine.call.precision`: a requested float64 runs
        under x64."""
        return np.zeros(0, self.out_dtype) if isinstance(self.out_dtype, np.dtype) else None

    @property
    def geom(self) -> list[AxisGeom]:
        return geometry(self.shape, self.specs)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(g.count for g in self.geom)

    def axis(self, dim: str) -> int:
        return self.dims.index(dim)

    def reach(self) -> tuple[tuple[str, tuple[int, int]], ...]:
        return tuple((d, (s.lo, s.hi)) for d, s in zip(self.dims, self.specs, strict=True))

    def input_index(self) -> dict[str, slice]:
        """For each dim, the input positions the outputs sit on."""
        out = {}
        for d, s, g in zip(self.dims, self.specs, self.geom, strict=True):
            first = s.lo - s.pad_lo
            out[d] = slice(first, first + s.stride * (g.count - 1) + 1 if g.count else first,
                           s.stride)
        return out


def _dims_mapping(call: str, arg: str, value: Any, dims: tuple[str, ...],
                  check: Callable[[str, Any], Any]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise XStencilError(
            f"{call}: {arg}={value!r} must be a dict mapping dim names to values, such as "
            f"{{{dims[-1]!r}: 3}}" if dims else f"{call}: {arg}={value!r} must be a dict")
    out = {}
    for d, v in value.items():
        if d not in dims:
            raise XStencilError(
                f"{call}: {arg}={dict(value)!r}: dimension {d!r} not found; available dims are "
                f"{dims!r}"
            )
        out[d] = check(d, v)
    return out


def parse_window(call: str, window: Any, dims: tuple[str, ...],
            sizes: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    def check(d: str, v: Any) -> tuple[int, int]:
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            if v < 1:
                raise XStencilError(
                    f"{call}: window={{{d!r}: {v!r}}}: a window size must be >= 1; use "
                    f"{{{d!r}: 3}} for a centred window of 3 cells"
                )
            return (int(v) - 1) // 2, int(v) // 2
        if (isinstance(v, tuple | list) and len(v) == 2
                and all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in v)):
            lo, hi = int(v[0]), int(v[1])
            if lo < 0 or hi < 0:
                raise XStencilError(
                    f"{call}: window={{{d!r}: {tuple(v)!r}}}: (lo, hi) count the cells before "
                    f"and after the centre and must be >= 0; e.g. {{{d!r}: (1, 0)}} reads "
                    f"offsets -1 and 0"
                )
            return lo, hi
        raise XStencilError(
            f"{call}: window={{{d!r}: {v!r}}}: give a size (an int >= 1) or a (lo, hi) pair of "
            f"cell counts before and after the centre"
        )

    return _dims_mapping(call, "window", window, dims, check)


def _modes(call: str, boundary: Any, dims: tuple[str, ...]) -> dict[str, str]:
    def check(d: str, m: Any) -> str:
        m = canonical_mode(m)
        if not isinstance(m, str) or m not in MODES:
            raise XStencilError(
                f"{call}: boundary={boundary!r}: {m!r} is not a boundary mode for dim {d!r}; "
                f"use one of {MODES!r}; {MODE_HELP}"
            )
        return m

    if isinstance(boundary, str) or not isinstance(boundary, Mapping):
        if not isinstance(boundary, str) or canonical_mode(boundary) not in MODES:
            raise XStencilError(
                f"{call}: boundary={boundary!r} is not a boundary mode; use one of {MODES!r}, "
                f"or a dict such as {{'x': 'periodic', 'y': 'reflect'}}; {MODE_HELP}"
            )
        return dict.fromkeys(dims, canonical_mode(boundary))
    given = _dims_mapping(call, "boundary", boundary, dims, check)
    return {d: given.get(d, "fill") for d in dims}


def _strides(call: str, stride: Any, dims: tuple[str, ...]) -> dict[str, int]:
    def check(d: str, s: Any) -> int:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1:
            raise XStencilError(
                f"{call}: stride={{{d!r}: {s!r}}}: strides must be ints >= 1"
            )
        return int(s)

    if stride is None:
        return {}
    if isinstance(stride, numbers.Integral) and not isinstance(stride, bool):
        return {d: check(d, stride) for d in dims}
    return _dims_mapping(call, "stride", stride, dims, check)


def check_options(call: str, dims: tuple[str, ...], *, boundary: Any, stride: Any,
                  fill_value: Any) -> None:
    """Check the options that do not depend on the kernel, so that a bad option
    fails before the kernel is traced to infer its window."""
    _modes(call, boundary, dims)
    _strides(call, stride, dims)
    check_fill(call, fill_value)


class _Probe:
    """Records the offsets a kernel reads, to infer its window."""

    def __init__(self, dims: tuple[str, ...]):
        self.dims = dims
        self.reads: dict[str, set[int]] = {d: {0} for d in dims}
        self.coords: set[str] = set()  # the names the kernel passed to u.coord


class _ProbeWindow(Window):
    def __init__(self, data: Any, probe: _Probe, label: str, own: tuple[str, ...],
                 coords: dict[str, Window] | None = None):
        super().__init__(data, (), (), field=(), coords=coords, label=label)
        self._probe = probe
        self._own = own

    @property
    def array(self) -> Any:
        raise _ArrayUse(self._label)

    def __call__(self, /, *positional: Any, **offsets: int) -> Any:
        if positional:
            raise XStencilError(positional_read(self._label, positional, self._probe.dims))
        for d, o in offsets.items():
            if d not in self._probe.dims:
                raise XStencilError(
                    f"{self._label}({d}=...): dimension {d!r} not found; available dims are "
                    f"{self._probe.dims!r}"
                )
            if whole(o):
                o = int(o)  # a numpy integer (from np.nonzero) reads as the int it is
            if not isinstance(o, int) or isinstance(o, bool):
                raise XStencilError(
                    f"{self._label}({d}={o!r}): offsets must be integers, relative to the "
                    f"centre")
            self._probe.reads[d].add(o)
        return self._data

    def __getitem__(self, key: Any) -> Any:
        raise _ArrayUse(self._label)

    def coord(self, name: str) -> Window:
        self._probe.coords.add(name)
        return super().coord(name)


class _ArrayUse(Exception):
    pass


def infer_window(call: str, kernel: Callable[..., Any], plan_dims: tuple[str, ...],
                 var_names: tuple[str, ...] | None, var_dims: Sequence[tuple[str, ...]],
                 dtypes: Sequence[Any], coord_dims: Sequence[str],
                 args: Any, kwargs: Any, coords_read: set[str] | None = None
                 ) -> dict[str, tuple[int, int]]:
    """Trace the kernel once on probe windows and collect the offsets it reads
    (and, into ``coords_read``, the coordinates it reads with ``u.coord``)."""
    probe = _Probe(plan_dims)

    def run(*scalars: Any) -> Any:
        cs = {d: _ProbeWindow(scalars[-1], probe, f"u.coord({d!r})", (d,)) for d in coord_dims}
        wins = [_ProbeWindow(s, probe, f"s[{n!r}]" if var_names else "u", dims, cs)
                for s, n, dims in zip(scalars, var_names or ("u",), var_dims, strict=False)]
        arg = WindowSet(dict(zip(var_names, wins, strict=True))) if var_names else wins[0]
        out = kernel(arg, *args, **kwargs)
        check_returned(call, kernel, out, var_names is not None)
        return out

    # coordinates in the dtype the engine reads them in (a float32 probe next to
    # float64 data failed strict promotion under x64)
    avals = [stand_in((), dt) for dt in dtypes] + [stand_in((), read_dtype(dtypes))]
    try:
        jax.eval_shape(run, *avals)
    except _ArrayUse:
        raise XStencilError(
            f"{call}: cannot infer the window because the kernel uses the window as an array "
            f"(arithmetic on it, u[...], u.sum(), ...); pass window={{dim: size}}, e.g. "
            f"window={dict.fromkeys(plan_dims[-2:], 3)!r}"
        ) from None
    except (XStencilError, WindowIndexError) as e:
        raise with_call(call, kernel, e) from None
    except Exception as e:
        name = getattr(kernel, "__name__", repr(kernel))
        typo = unknown_keyword(call, kernel, e, kwargs) or traced_error(call, kernel, e)
        if typo is not None:
            raise typo from e
        raise KernelError(
            f"{call}: kernel {name!r} failed while its window was being inferred "
            f"({type(e).__name__}: {e})") from e
    if coords_read is not None:
        coords_read |= probe.coords
    return {d: (max(0, -min(r)), max(0, max(r))) for d, r in probe.reads.items()
            if min(r) < 0 or max(r) > 0}


def make_plan(
    call: str,
    *,
    dims: tuple[str, ...],
    shape: tuple[int, ...],
    window: Mapping[str, tuple[int, int]] | None,
    window_arg: Any,
    boundary: Any,
    fill_value: Any,
    stride: Any,
    var_names: tuple[str, ...] | None,
    var_dims: tuple[tuple[str, ...], ...],
    var_dtypes: tuple[Any, ...],
    coord_dims: tuple[str, ...],
    output_dims: tuple[str, ...] = (),
    window_order: tuple[str, ...] = (),
) -> Plan:
    """Validate the options and build the plan (``window`` already parsed or
    inferred; ``window_arg`` is what the user passed, for messages)."""
    sizes = dict(zip(dims, shape, strict=True))
    reach = dict(window or {})
    modes = _modes(call, boundary, dims)
    strides = _strides(call, stride, dims)
    specs = []
    for d in dims:
        lo, hi = reach.get(d, (0, 0))
        mode = modes[d] if d in reach else "fill"
        if d not in reach and modes[d] == "valid":
            mode = "valid"
        pad = (0, 0) if mode == "valid" else (lo, hi)
        n = sizes[d]
        if max(lo, hi) > max(n, MAX_HALO):
            raise XStencilError(
                f"{call}: window={window_arg!r} reaches {lo} cells before and {hi} after the "
                f"centre along {d!r}, which has {n}; a halo wider than the data (or "
                f"{MAX_HALO} cells) is not supported; use a smaller window or smaller offsets"
            )
        if mode == "valid" and lo + hi + 1 > n:
            raise XStencilError(
                f"{call}: window={window_arg!r} spans {lo + hi + 1} cells along {d!r}, which "
                f"has only {n}; with boundary 'valid' nothing is left (use a smaller window or "
                f"a padding boundary mode)"
            )
        if mode in ("reflect",) and n < 2 and (lo or hi):
            fix = {k: "symmetric" if k == d else m for k, m in modes.items()}
            raise XStencilError(
                f"{call}: boundary 'reflect' along {d!r} needs at least 2 points, it has {n} "
                f"(it mirrors about the edge cell, and "
                f"{'one point has' if n == 1 else 'there is'} no other cell to mirror); use "
                f"'symmetric' along {d!r}, which mirrors including the edge cell (on one "
                f"point the same as 'extend': the value repeated), e.g. boundary={fix!r}"
            )
        # a stride beyond the dim's length gives one output, as the length does
        stride_d = min(strides.get(d, 1), max(n, 1))
        specs.append(AxisSpec(lo, hi, pad[0], pad[1], stride_d, mode))
    window_dims = tuple(d for d in dims if d in reach)
    needs_fill = any(s.mode == "fill" and (s.pad_lo or s.pad_hi) for s in specs)
    fill = fill_for(call, fill_value, var_dtypes, needs_fill, var_names)
    bits = fill.hex() if isinstance(fill, float) else (fill.real.hex(), fill.imag.hex()) \
        if isinstance(fill, complex) else None
    return Plan(call, dims, shape, tuple(specs), window_dims, fill, var_names, var_dims,
                var_dtypes, tuple(d for d in coord_dims if d in window_dims), output_dims,
                fill_bits=bits, window_order=window_order)


def with_call(call: str, kernel: Any, e: Exception) -> Exception:
    """``e`` (a window read error from inside a kernel) with the call and the
    kernel's name in front of its message, keeping its type."""
    msg = str(e)
    if msg.startswith(call):
        return e
    name = getattr(kernel, "__name__", repr(kernel))
    return type(e)(f"{call}: kernel {name!r}: {msg}")


def unknown_keyword(call: str, kernel: Any, e: Exception,
                    kwargs: Mapping[str, Any]) -> XStencilError | None:
    """A misspelled option (``bondary=...``) is passed on to the kernel, which
    rejects it with a TypeError; say so instead of blaming the kernel."""
    if not isinstance(e, TypeError) or "unexpected keyword argument" not in str(e):
        return None
    bad = [k for k in kwargs if repr(k) in str(e)]
    if not bad:
        return None
    name = getattr(kernel, "__name__", repr(kernel))
    options = options_for(call)
    close = difflib.get_close_matches(bad[0], options, n=1)
    hint = ("" if not close else f"{bad[0]}= is not an option of this call; " if close[0] ==
            bad[0] else f"did you mean {close[0]}=...? ")
    if close and close[0] == bad[0] and ".mesh(" in call and ").map(" in call:
        hint = (f"{bad[0]}= of a function mesh is given when the mesh is made "
                f"(da.stencil.mesh(..., {bad[0]}=...)), not to its .map(); ")
        options = ("dtype",)
    return XStencilError(
        f"{call}: unknown keyword {bad[0]}={kwargs[bad[0]]!r:.40}: extra keywords are passed "
        f"to the kernel, and kernel {name!r} does not take {bad[0]!r}; {hint}the options are "
        f"{options!r}")
