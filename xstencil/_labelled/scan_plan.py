"""One frozen description of a labelled scan: :class:`ScanPlan`.

A scan request is validated once, at construction (as diffrax's ``SaveAt``
is), into a :class:`ScanPlan` that holds no arrays: the options (``dim``,
``window``, ``boundary``, ``steps``, ``save_every``, ...) and, once
:func:`xstencil._labelled.scan_setup.setup` has read the data's layout, the
:class:`~xstencil._labelled.plan.Plan` of the whole trajectory, the reach
back ``k`` along ``dim``, its length, the variables the kernels advance and
the trajectory's ``dim`` coordinate.  Everything the engine needs is derived
from it: the loop (:attr:`ScanPlan.loop`), the variables
(:attr:`ScanPlan.variables`) and the saved positions
(:attr:`ScanPlan.positions`).  Being frozen and array-free, a plan is what the
repeat-call fast path (:mod:`xstencil._labelled.scan_fast`) caches.

``ScanPlan`` replaces the former ``Opts`` (the options), ``Setup`` (the
layout; its arrays now travel separately as
:class:`~xstencil._labelled.core.Fields`) and ``make_loop``/``engine_vars``.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from xstencil import _progress
from xstencil._engine.boundary import canonical_mode
from xstencil._engine.tscan import Loop, Var
from xstencil._errors import XStencilError
from xstencil._labelled.plan import Plan
from xstencil._labelled.sizes import size_text

__all__ = ["ScanPlan", "MAX_STEPS", "check_dt"]

#: The most steps one scan runs: loop positions are int32 on the device.
MAX_STEPS = 2**31 - 2**16


def check_dt(call: str, dt: Any) -> None:
    """``dt=`` must be one positive, finite real number or timedelta."""
    ok = False
    if isinstance(dt, np.timedelta64) and np.datetime_data(dt.dtype)[0] in ("Y", "M"):
        raise XStencilError(
            f"{call}: dt={dt!r:.60} counts months or years, whose lengths vary, so it is no "
            f"fixed spacing; pass the positions with coord= (e.g. coord=pd.date_range(start, "
            f"periods=steps + 1, freq='MS').values) or a fixed dt (np.timedelta64(30, 'D'))")
    if isinstance(dt, np.timedelta64 | datetime.timedelta):
        td = np.timedelta64(dt)
        ok = not np.isnat(td) and td > np.timedelta64(0, td.dtype.str[-2:-1] or "s")
    elif isinstance(dt, numbers.Real) and not isinstance(dt, bool):
        ok = bool(np.isfinite(dt) and dt > 0)
    if not ok:
        raise XStencilError(
            f"{call}: dt={dt!r:.60} must be one positive, finite spacing between positions: "
            f"a real number (e.g. dt=0.5) or a timedelta for a datetime coordinate (e.g. "
            f"dt=np.timedelta64(6, 'h')); for irregular positions pass coord= instead")


def _check_steps(call: str, dim: str, steps: Any) -> int | None:
    if steps is None:
        return None
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
        raise XStencilError(f"{call}: steps={steps!r} must be an int >= 1 (the number of "
                            f"new positions to compute along {dim!r})")
    if steps > MAX_STEPS:
        raise XStencilError(
            f"{call}: steps={steps!r} is more than a scan can run: the loop counts "
            f"positions in int32, so at most {MAX_STEPS} steps, and the {dim!r} "
            f"coordinate alone would need {size_text(8 * (steps + 1))} (int64); split the "
            f"run into several scans of at most {MAX_STEPS} steps (save_every='last' "
            f"each, continuing from the last state)")
    return int(steps)


def _check_every(call: str, save_every: Any, steps: int | None) -> None:
    if save_every == "last":
        return
    if not isinstance(save_every, numbers.Integral) or isinstance(save_every, bool) \
            or save_every <= 0:
        raise XStencilError(f"{call}: save_every={save_every!r} must be an int >= 1 or "
                            f"'last'")
    if steps is not None and save_every > steps:
        raise XStencilError(f"{call}: save_every={save_every!r} is larger than "
                            f"steps={steps!r}, so nothing would be saved; use "
                            f"save_every<={steps} or save_every='last'")
    if steps is not None and steps % save_every:
        raise XStencilError(
            f"{call}: steps={steps!r} is not a multiple of save_every={save_every!r}; "
            f"use steps={steps - steps % save_every or save_every} or another save_every")


@dataclasses.dataclass(frozen=True, eq=False)
class ScanPlan:
    """A labelled scan request, validated at construction.

    The first group of fields are the options as :func:`xstencil.scan` takes
    them (``boundary`` with scipy/numpy mode names made xstencil's,
    ``steps`` an int); the second group is filled in by
    :func:`~xstencil._labelled.scan_setup.setup` from the data's layout
    (``plan is None`` until then).  Construct a request with
    ``ScanPlan(call, dim, ...)``; a complete plan with
    ``dataclasses.replace(request, plan=..., ...)``, which validates again.
    Compared by identity; :attr:`key` is the hashable part that decides the
    compiled code.
    """

    call: str
    dim: str
    window: Any = None
    boundary: Any = "fill"
    fill_value: Any = None
    steps: int | None = None
    dt: Any = None
    coord: Any = None
    save_every: int | str = 1
    progress: bool = False
    checkpoint: bool = False
    check_finite: bool = False
    period: Any = None
    # -- the layout (set by scan_setup.setup) --
    plan: Plan | None = None
    k: int = 0  # how far the window reaches back along dim: the initial positions
    total: int = 0  # positions along dim, initial ones included
    n0: int = 0  # the input's positions along dim
    evolving: tuple[int, ...] = ()  # indices of the variables the scan advances
    tvals: Any = None  # the trajectory's dim coordinate (None; step numbers: a RangeIndex)
    tmode: str = "fill"  # the boundary mode asked for dim

    def __post_init__(self) -> None:
        call, dim = self.call, self.dim
        if not isinstance(dim, str):
            raise XStencilError(f"{call}: dim={dim!r} must be a dim name (str), e.g. "
                                f"dim='time'")
        steps = _check_steps(call, dim, self.steps)
        _check_every(call, self.save_every, steps)
        if (self.dt is not None or self.coord is not None) and steps is None:
            raise XStencilError(f"{call}: dt= and coord= build the {dim!r} coordinate of a "
                                f"grown trajectory; they need steps=N")
        if self.dt is not None and self.coord is not None:
            raise XStencilError(f"{call}: pass dt= or coord=, not both")
        if self.dt is not None:
            check_dt(call, self.dt)
        b = self.boundary  # scipy.ndimage/numpy names ('wrap', 'nearest', ...) become xstencil's
        b = {d: canonical_mode(m) for d, m in b.items()} if isinstance(b, Mapping) \
            else canonical_mode(b)
        for name, value in (("steps", steps), ("boundary", b), ("progress", bool(self.progress)),
                            ("checkpoint", bool(self.checkpoint)),
                            ("check_finite", bool(self.check_finite))):
            object.__setattr__(self, name, value)
        if self.plan is not None and not 0 <= self.k <= self.total:
            raise XStencilError(f"{call}: internal: k={self.k} initial positions of "
                                f"{self.total}")

    @property
    def every(self) -> int:
        """The save interval; 0 for ``save_every='last'``."""
        return 0 if self.save_every == "last" else int(self.save_every)

    @property
    def grown(self) -> bool:
        """Whether the trajectory is grown by ``steps=`` (not the input's own)."""
        return self.steps is not None

    @property
    def names(self) -> tuple[str, ...] | None:
        """The advanced Dataset variables in the kernels' return order (``None``
        for a DataArray)."""
        if self.plan is None or self.plan.var_names is None:
            return None
        return tuple(self.plan.var_names[i] for i in self.evolving)

    @functools.cached_property
    def loop(self) -> Loop:
        """The engine's description of the time loop."""
        plan = self._ready()
        k, dim, every = self.k, self.dim, self.every
        steps = self.total - k
        if every:
            steps = steps // every * every
        cells = sum(int(np.prod([plan.shape[plan.axis(d)] for d in plan.var_dims[i]
                                 if d != dim])) for i in self.evolving)
        prog = _progress.check_every(steps, cells) if self.progress and steps else 0
        spec = plan.specs[plan.axis(dim)]
        return Loop(k, steps, every, spec.lo, spec.hi, 0 if self.grown else self.total,
                    self.tmode, self.checkpoint, prog, self.check_finite)

    @functools.cached_property
    def variables(self) -> tuple[Var, ...]:
        """The engine's description of each variable (field axes without dim)."""
        plan = self._ready()
        dim, evolving = self.dim, self.evolving
        wset = set(plan.window_dims)
        out = []
        for i, vdims in enumerate(plan.var_dims):
            axes = tuple(plan.axis(d) for d in vdims if d != dim)
            specs = [plan.specs[a] for a in axes]
            wd = [d for d in vdims if d in wset]
            out.append(Var(
                axes, tuple(a for a in axes if plan.dims[a] in wset),
                tuple((sp.pad_lo, sp.pad_hi) for sp in specs),
                tuple(sp.mode if sp.mode != "valid" else "fill" for sp in specs),
                0 if plan.fill_value is None else plan.fill_value,
                wd.index(dim) if dim in wd else None,
                evolving.index(i) if i in evolving else None,
                dim in vdims and not (self.grown and i in evolving)))
        return tuple(out)

    @functools.cached_property
    def positions(self) -> np.ndarray:
        """The saved positions along dim (initial ones included)."""
        loop = self.loop
        if loop.every == 0:
            return np.array([self.k + loop.steps - 1 if loop.steps else self.total - 1])
        return np.concatenate([np.arange(self.k), self.k - 1 + loop.every * np.arange(
            1, loop.saves + 1)]).astype(int)

    @property
    def options(self) -> tuple[Any, ...]:
        """The request's options, in field order (not hashable when an option
        holds a mapping or an array)."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self)[:_N_OPTIONS])

    @property
    def key(self) -> tuple[Any, ...]:
        """What decides the compiled loop (hashable)."""
        return (self._ready(), self.dim, self.loop, self.evolving, self.names, self.total)

    def _ready(self) -> Plan:
        if self.plan is None:
            raise XStencilError(f"{self.call}: internal: the scan's layout is not set up yet")
        return self.plan


#: ``call``, ``dim`` and the options: the fields of a request.
_N_OPTIONS = 13
