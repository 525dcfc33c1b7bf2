"""The generated-loop CPU backend: maps on numpy data as numba loop nests.

XLA:CPU runs a stencil map at 0.1-0.2 of the memory bandwidth that numba
``prange`` loops reach (its pad/concatenate-rooted fusions and fresh output
buffers).  :class:`LoopOrJit` stands in for the jitted engine function of a
map: called on concrete numpy data on the CPU (or JAX arrays on one CPU
device, read through numpy views: :func:`host_views`), outside any JAX
transform, it runs a loop nest generated from the kernel's jaxpr
(:mod:`xstencil._engine.loopgen`) and compiled by numba; every other call
(tracers, sharded arrays, GPUs, a kernel the generator cannot express, numba
not installed) goes to the jitted XLA function, silently, with the same result.

The choice is ``backend=`` of the map (``"auto"``, ``"loops"``, ``"xla"``),
else the environment variable :data:`ENV`, else ``"auto"``: loops for fields
of at least :data:`AUTO_MIN_POINTS` output points (below that XLA's shorter
compile wins).  ``"loops"`` uses loops at any size where they apply.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from xstencil._backends import bufpool
from xstencil._backends.hostfft import HostFFT, host_fft
from xstencil._backends.hostwrap import Wrapper
from xstencil._backends.loop_variants import Nest
from xstencil._backends.tiered import Tiered, from_source, promote_after
from xstencil._engine import dense, dense_split
from xstencil._engine.lift import Unliftable
from xstencil._engine.loopgen import Param, boundary_tables
from xstencil._engine.loopweights import generate_variants
from xstencil._engine.lower import AxisGeom, Source, cell_avals
from xstencil._engine.x64flag import x64
from xstencil._errors import XStencilError

try:  # optional: the ``cpu`` extra
    import numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None

__all__ = ["AUTO_MIN_POINTS", "BACKENDS", "ENV", "LoopOrJit", "Staged", "available",
           "backend_arg", "fits", "host_views", "omp_env", "resolve_mode", "leaf_sig",
           "numpy_on_cpu", "on_host_cpu", "run_loops", "stage_loops"]

#: The environment variable that sets the default backend of maps.
ENV = "XSTENCIL_BACKEND"
BACKENDS = ("auto", "loops", "xla")
#: ``"auto"`` uses loops from this many output points on (512 x 512).  A
#: numba compile takes about a second, XLA's a tenth of that, and below this
#: size XLA's run time is already a fraction of a millisecond.
AUTO_MIN_POINTS = 2**18
#: The most statements (window reads and scalar operations) one output point
#: may take on the loop path, for ``"auto"`` and for ``"loops"``.  numba's
#: compile time grows faster than linearly with them: a 9 x 9 weighted sum
#: (about 320) compiled in 4.8 s of CPU time, a 15 x 15 one in over a minute.
MAX_STATEMENTS = {"auto": 200, "loops": 1000}

_LOG = logging.getLogger("xstencil.loops")


def available() -> bool:
    """Whether numba is installed (the loop backend can run at all)."""
    return numba is not None


def backend_arg(call: str, backend: Any) -> str | None:
    """``backend=`` of a map, checked (``None``: the environment's choice)."""
    if backend is None or backend in BACKENDS:
        return backend
    raise XStencilError(
        f"{call}: backend={backend!r} is not a backend; expected one of {BACKENDS!r} "
        f"('auto': numba loops on large numpy data on the CPU, XLA otherwise), or None for "
        f"the {ENV} environment variable's choice")


def resolve_mode(backend: str | None) -> str:
    if backend is not None:
        return backend
    env = os.environ.get(ENV)
    if env is None or env == "":
        return "auto"
    if env not in BACKENDS:
        raise XStencilError(
            f"{ENV}={env!r} is not a backend; expected one of {BACKENDS!r}; set it to one "
            f"of those or unset it")
    return env


def leaf_sig(x: Any) -> Any:
    """A leaf's shape and dtype for a compile key.  The dtype object itself, not
    ``str(dtype)``: numpy's ``dtype.__str__`` is Python code, which a map on a
    large array runs with cold caches on every call."""
    if type(x) is np.ndarray:
        return (x.shape, x.dtype)
    if isinstance(x, bool | int | float | complex):
        return type(x).__name__
    dt = getattr(x, "dtype", None)
    return (np.shape(x), dt if isinstance(dt, np.dtype) else str(dt or type(x).__name__))


def numpy_on_cpu(what: str, arrays: Sequence[Any], others: Sequence[Any]) -> bool:
    """Whether a call may run as loops: its data are non-empty numpy arrays
    of bool, integer or float dtypes, its other inputs concrete on the host
    (:func:`on_host_cpu`) and JAX's default backend the CPU.  JAX-array data
    (:func:`host_views` turns those on one CPU device into numpy views first)
    are logged as the reason."""
    if arrays and all(type(x) is np.ndarray and x.dtype.kind in "biuf" and x.size
                      for x in arrays):  # the common case, without the ABC checks below
        return on_host_cpu(others) and jax.default_backend() == "cpu"
    if any(isinstance(x, jax.Array) for x in arrays):
        _LOG.debug("%s runs with XLA: the data are JAX arrays that are not on one CPU "
                   "device, or of a dtype the loops do not take", what)
        return False
    if not arrays or not all(isinstance(x, np.ndarray) and x.dtype.kind in "biuf"
                             and x.size for x in arrays):
        return False
    return on_host_cpu(others) and jax.default_backend() == "cpu"


def host_views(arrays: Sequence[Any]) -> Sequence[Any]:
    """``arrays`` with each concrete JAX array on one CPU device (a map's
    result, say) replaced by ``np.asarray`` of it: a read-only view of the
    same memory, no copy, which a loop nest reads as it reads numpy data
    (before, such data ran with XLA: a time loop of maps ran the loops on its
    first call only).  Tracers, sharded, deleted and non-CPU arrays, and
    dtypes the loops do not take, are left as they are (XLA runs them)."""
    if all(type(x) is np.ndarray for x in arrays):  # the usual case, without the checks
        return arrays
    return [np.asarray(x) if _on_one_cpu(x) else x for x in arrays]


def _on_one_cpu(x: Any) -> bool:
    if not isinstance(x, jax.Array) or not on_host_cpu((x,)):  # tracers, other devices
        return False
    try:
        return (x.dtype.kind in "biuf" and not x.is_deleted()
                and len(x.sharding.device_set) == 1)
    except Exception:  # noqa: BLE001 - not an array JAX can tell us about: XLA decides
        return False


def on_host_cpu(xs: Sequence[Any]) -> bool:
    """No tracer among ``xs`` and every JAX array among them on this process's CPU."""
    for x in xs:
        if type(x) is np.ndarray:  # cheaper than the ABC checks below, and the usual case
            continue
        if isinstance(x, jax.core.Tracer):
            return False
        if isinstance(x, jax.Array) and (not x.is_fully_addressable or any(
                d.platform != "cpu" for d in x.sharding.device_set)):
            return False
    return True


_LEAF = jax.tree_util.tree_structure(0)


class _Quick(NamedTuple):
    """What :meth:`LoopOrJit.quick` checks and passes (see there)."""

    mode: str
    coords: Any  # the call's coordinate list, by identity
    shape: tuple[int, ...]
    dtype: np.dtype
    wide: bool  # JAX's x64 flag
    built: Any  # _Built
    leaves: tuple[tuple[tuple[int, ...], np.dtype], ...]  # closed-over numpy arrays' sigs


class Staged(NamedTuple):
    """A map call split around its loop nest: ``go()`` runs the nest (or the
    jitted function) and returns the output pytree; ``early`` is that same
    pytree where it exists before the nest runs (the nest's output buffers,
    already wrapped), else ``None``.  The labelled layer builds the result
    DataArray from ``early`` before calling ``go()``, while Python's code and
    data are still in the caches that the nest's streaming then evicts (see
    :mod:`~xstencil._backends.hostwrap`); it must not hand out that result
    before ``go()`` has returned."""

    early: Any
    go: Callable[[], Any]


class _Built:
    """A compiled loop kernel and the fixed arguments it takes (``fn``: a
    :class:`~xstencil._backends.loop_variants.Nest`, called as the numba
    function with the parameters last)."""

    def __init__(self, fn: Any, source: str, tables: list[np.ndarray], fills: list[Any],
                 params: list[Param], out_avals: list[Any], out_tree: Any,
                 field: tuple[int, ...]):
        self.fn, self.source, self.tables, self.fills = fn, source, tables, fills
        self.params, self.out_avals, self.out_tree = params, out_avals, out_tree
        self.field = field
        self.wraps = [Wrapper(field, a.dtype) for a in out_avals]  # jax.device_put, cheaper
        # makes the nest that also reports finiteness (a first argument ``fz``)
        self.make_checked: Callable[[], Nest] | None = None
        self._checked: Nest | None = None

    def checked(self) -> Nest | None:
        """The nest with ``check_finite``'s flags (see
        :func:`~xstencil._engine.loopnest.render`'s ``finite``), generated on
        first use (``None`` where it cannot be); each variant compiles on its
        first call, so maps and scans without the check never compile it."""
        if self._checked is None and self.make_checked is not None:
            self._checked, self.make_checked = self.make_checked(), None
        return self._checked

    def drop_checked(self) -> None:
        """Never offer the checked nest again (it failed to compile)."""
        self._checked = self.make_checked = None


class LoopOrJit:
    """The engine function of a map: numba loops where they apply, else ``jitted``.

    ``kernel(cells, dyn, leaves)`` is the kernel on per-cell windows, with the
    arrays it closes over as ``leaves`` (runtime arguments of the loop, never
    baked in); ``make_sources(arrays, coords)`` describes the inputs.
    """

    def __init__(self, jitted: Callable[..., Any], kernel: Callable[..., Any],
                 make_sources: Callable[[Any, Any], list[Source]], geom: Sequence[AxisGeom],
                 backend: str | None):
        self.jitted = jitted
        self.kernel = kernel
        self.make_sources = make_sources
        self.geom = list(geom)
        self.backend = backend
        self.built: dict[Any, _Built | str] = {}  # per input layout: the loop, or why not
        self.points = math.prod(g.count for g in self.geom)  # output points (0: empty)
        self._quick: _Quick | None = None  # the last plain call, for quick()

    def __getattr__(self, name: str) -> Any:  # .lower, .trace ... of the jitted function
        if name == "jitted":
            raise AttributeError(name)
        return getattr(self.jitted, name)

    def __call__(self, arrays: Any, coords: Any, dyn: Any, dynamic: Any, leaves: Any,
                 out: np.ndarray | None = None) -> Any:
        """The map's output pytree.  ``out`` (``map(..., out=)``, checked by
        the labelled layer: a writeable C-contiguous numpy array that shares
        no memory with the inputs) is returned itself, written by the loop,
        where the loop runs and its only output has ``out``'s shape and dtype;
        otherwise the result is a new array (the caller copies it)."""
        return self.stage(arrays, coords, dyn, dynamic, leaves, out).go()

    def stage(self, arrays: Any, coords: Any, dyn: Any, dynamic: Any, leaves: Any,
              out: np.ndarray | None = None) -> Staged:
        """The call in two halves (see :class:`Staged`): ``go()`` runs the
        loop nest, or the jitted function where the loops do not apply, and
        returns what :meth:`__call__` returns; ``early`` is that same
        output, already wrapped, where it is known before the nest runs."""
        staged = self._loops(arrays, coords, dyn, dynamic, leaves, out)
        if staged is not None:
            return staged
        return Staged(None, lambda: self.jitted(arrays, coords, dyn, dynamic, leaves))

    def try_loops(self, arrays: Any, coords: Any, dyn: Any, leaves: Any,
                  out: np.ndarray | None = None) -> Staged | None:
        """The call staged on the loop backend, or ``None`` where the loops do
        not apply (for a caller with its own XLA path: a dask block)."""
        return self._loops(arrays, coords, dyn, (), leaves, out)

    def _loops(self, arrays: Any, coords: Any, dyn: Any, dynamic: Any, leaves: Any,
               out: np.ndarray | None = None) -> Staged | None:
        mode = resolve_mode(self.backend)
        if mode == "xla" or numba is None or dynamic:
            return None
        if mode == "auto" and self.points < AUTO_MIN_POINTS:
            return None
        dleaves = jax.tree_util.tree_leaves(dyn) if dyn else []
        arrays = host_views(arrays)
        if not self.points or not numpy_on_cpu(  # empty: XLA's path is trivial
                "map", arrays, [*coords, *dleaves, *leaves]):
            return None
        key = (mode, tuple([(x.shape, x.dtype.str) for x in arrays]),
               tuple([leaf_sig(x) for x in coords]), tuple([leaf_sig(x) for x in dleaves]),
               tuple([leaf_sig(x) for x in leaves]), x64())

        def fallback() -> Any:  # the host FFT's exact path (see run_loops)
            return self.jitted(arrays, coords, dyn, dynamic, leaves)

        built = self.built.get(key)
        if built is None:  # the first call compiles by running
            built, res = self._build(arrays, coords, dyn, leaves, MAX_STATEMENTS[mode], out,
                                     fallback)
            self.built[key] = built
            if isinstance(built, str):
                _LOG.debug("map runs with XLA: %s", built)
                return None
            return Staged(None, lambda: res)
        if isinstance(built, str):
            return None
        if not dleaves and len(arrays) == 1 and all(type(x) is np.ndarray for x in leaves):
            self._remember(mode, arrays[0], coords, built, leaves)
        return stage_loops(built, arrays, coords, dleaves, leaves, out, fallback)

    def _remember(self, mode: str, data: np.ndarray, coords: Any, built: _Built,
                  leaves: Sequence[np.ndarray]) -> None:
        """Keep what :meth:`quick` needs to repeat this call (one array, no
        kernel arguments, closed-over arrays only as numpy arrays, one
        output, a loop nest or the host FFT)."""
        q = self._quick
        if q is not None and q.coords is coords and q.built is built and q.mode == mode:
            return
        if (isinstance(built.fn, Nest | HostFFT) and built.out_tree == _LEAF
                and len(built.params) == len(leaves)):
            self._quick = _Quick(mode, coords, data.shape, data.dtype, x64(), built,
                                 tuple((x.shape, x.dtype) for x in leaves))

    def quick(self, data: Any, coords: Any, out: np.ndarray | None = None,
              leaves: Sequence[Any] = ()) -> Staged | None:
        """The call staged as :meth:`stage` stages it where it repeats the last
        one :meth:`stage` ran as loops (the same ``coords`` object, numpy
        data, or a JAX array's :func:`host_views` view, of the same shape and
        dtype, no kernel arguments, closed-over ``leaves`` that are numpy
        arrays of the same shapes and dtypes, the same backend choice and x64
        flag), else ``None``: :func:`stage_loops` without :meth:`stage`'s
        general checks, which the repeat makes moot (a cold call spends its
        time in Python's layers, not in the nest).  The leaves' values are
        this call's: the nest reads them as its parameters, and the host FFT
        keys its spectra by them."""
        q = self._quick
        if q is None:
            return None
        if type(data) is not np.ndarray:  # a JAX array on the CPU: its view
            data = host_views((data,))[0]
        if (coords is not q.coords or type(data) is not np.ndarray or data.shape != q.shape
                or data.dtype != q.dtype or x64() != q.wide
                or resolve_mode(self.backend) != q.mode or len(leaves) != len(q.leaves)):
            return None
        for x, (shape, dtype) in zip(leaves, q.leaves, strict=True):
            if type(x) is not np.ndarray or x.shape != shape or x.dtype != dtype:
                return None

        def fallback() -> Any:  # the host FFT's exact path (see run_loops)
            return self.jitted([data], coords, [], [], leaves)

        return stage_loops(q.built, (data,), coords, (), leaves, out, fallback)

    def _build(self, arrays: Any, coords: Any, dyn: Any, leaves: Any,
               limit: int, out: np.ndarray | None = None,
               fallback: Callable[[], Any] | None = None) -> tuple[_Built | str, Any]:
        """Trace, generate, compile and run: the loop and the output, or a
        string that says why the loops do not apply (and ``None``).
        ``fallback()``: the call's XLA result (see :func:`run_loops`)."""
        promote_after()  # a bad XSTENCIL_PROMOTE_AFTER is the user's error, not a fallback
        try:
            coords = [np.asarray(c) for c in coords]
            sources = self.make_sources(list(arrays), coords)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                closed, shapes = jax.make_jaxpr(self.kernel, return_shape=True)(
                    cell_avals(sources, self.geom), dyn, list(leaves))
            if caught:  # the XLA path traces again and shows the warning
                return f"tracing warned: {caught[0].message}", None
            params = [Param(i, tuple(v.aval.shape), np.dtype(v.aval.dtype))
                      for i, v in enumerate(closed.jaxpr.invars[len(sources):])]
            out_avals = [v.aval for v in closed.jaxpr.outvars]
            field = tuple(g.count for g in self.geom)
            dleaves = jax.tree_util.tree_leaves(dyn)
            values = [*dleaves, *leaves]  # the parameters' values
            host = self._host_fft(closed, sources, params, values=values)

            def on_host(host: HostFFT) -> tuple[_Built, Any]:
                built = _Built(host, "host FFT (scipy.fft)", [], [], params, out_avals,
                               jax.tree_util.tree_structure(shapes), field)
                return built, run_loops(built, arrays, coords, dleaves, leaves, out,
                                        fallback=fallback)

            if host is not None:
                return on_host(host)
            if self.jitted is not None and _dense_for_xla(closed, sources, self.geom):
                return "a dense window of constant weights: XLA's separable passes or FFT", None
            if self.jitted is not None and _dense_for_xla(closed, sources, self.geom, values):
                return ("large window sums under a non-linear function: XLA's dense sums, "
                        "then the rest point by point"), None
            try:
                variants = generate_variants(closed, sources, self.geom, params, limit)
            except Unliftable:  # too large a nest: an integer window may still be exact FFTs
                host = self._host_fft(closed, sources, params, small=True, values=values)
                if host is None:
                    raise
                return on_host(host)
            omp_env()
            # runtime weights that multiply window values: an unmasked nest for
            # calls where none is 0, compiled on first use (loop_variants.py)
            fn = Nest(variants, _compile, len(params))
            source = variants.masked
            fills = [np.asarray(jnp.full((), s.fill_value, s.array.dtype))[()]
                     for s in sources]
            built = _Built(fn, source, boundary_tables(sources, self.geom), fills, params,
                           out_avals, jax.tree_util.tree_structure(shapes), field)
            built.make_checked = _checking(closed, sources, self.geom, params, limit)
            return built, run_loops(built, arrays, coords, jax.tree_util.tree_leaves(dyn),
                                    leaves, out)
        except Unliftable as e:
            return f"not expressible as loops: {e}", None
        except Exception as e:  # noqa: BLE001 - correctness first: XLA decides and reports
            return f"{type(e).__name__}: {e}", None

    def _host_fft(self, closed: Any, sources: Sequence[Source], params: list[Param],
                  small: bool = False, values: Sequence[Any] | None = None
                  ) -> HostFFT | None:
        """The map as :mod:`~xstencil._backends.hostfft`'s FFTs, where the
        kernel is a weighted sum the engine lowers to FFTs only (maps only:
        a scan's steps have no XLA program to fall back on); ``small``: an
        integer sum over a window of more than a few weights, whose loop
        nest is too large, read with this call's parameter ``values`` (see
        :func:`~xstencil._backends.hostfft.host_fft`)."""
        if self.jitted is None:
            return None
        try:
            return host_fft(closed, sources, self.geom, params, numba.get_num_threads, small,
                            values)
        except Exception as e:  # noqa: BLE001 - not for this kernel: the loop nest decides
            _LOG.debug("no host FFT: %s: %s", type(e).__name__, e)
            return None


def _dense_for_xla(closed: Any, sources: Sequence[Source], geom: Sequence[AxisGeom],
                   values: Sequence[Any] | None = None) -> bool:
    """Whether the kernel is a sum over a window of more than
    :data:`~xstencil._engine.dense.FFT_TAPS` constant weights that the engine
    lowers to separable passes or an FFT (:mod:`xstencil._engine.dense`),
    which the host FFT did not take: XLA's program then costs a few passes
    where a loop nest would read every window cell at every point (a 15 x 15
    box mean at 1024² float32: 3.8 s to compile and 29 ms a call as a nest,
    0.34 s and 5 ms as XLA's passes).  Smaller windows stay nests, which
    read their few cells faster than XLA's passes run.  With ``values`` (the
    call's parameters, from which runtime weights are read): whether the
    window sums that the kernel feeds to a non-linear function are such sums
    (:mod:`xstencil._engine.dense_split`; a 15 x 15 ``max(sum, 0)`` at 256²:
    5.6 s to compile as a nest)."""
    try:
        # copies: JAX keeps its 32-bit conversion of a float64 numpy array by
        # the array's object (x64 off), which a later trace would read stale
        plans = (dense.plan(closed, sources, geom) if values is None
                 else dense_split.plan(closed, sources, geom,
                                       [np.array(v) if isinstance(v, np.ndarray) else v
                                        for v in values]))
    except Exception:  # noqa: BLE001 - an optimisation only: the nest decides
        return False
    return plans is not None and any(dense.beats_cells(how, w)
                                     for terms, _ in plans for _, _, w, how in terms)


def _checking(closed: Any, sources: Sequence[Source], geom: Sequence[AxisGeom],
              params: list[Param], limit: int) -> Callable[[], Nest]:
    """Makes the nest of ``generate_variants(..., finite=True)``; keeps no
    input data alive (the sources' arrays become zero-stride stand-ins of
    their shapes and dtypes, all that the generator reads of them)."""
    light = [dataclasses.replace(s, array=np.broadcast_to(np.zeros((), s.array.dtype),
                                                          np.shape(s.array)))
             for s in sources]
    return lambda: Nest(generate_variants(closed, light, geom, params, limit, finite=True),
                        _compile, len(params))


#: How many times an idle OpenMP thread checks for work before it sleeps
#: (``GOMP_SPINCOUNT``; libgomp's default is 300,000 with no wait policy set,
#: 0 with ``OMP_WAIT_POLICY=PASSIVE``).
SPIN_COUNT = "10000"


def omp_env() -> None:
    """Set the OpenMP runtime's wait policy where the user has not: read by
    libgomp when numba first starts its threads (the first parallel nest).

    Idle threads that spin for long (libgomp's default) starve XLA's thread
    pool and every other process on a shared machine, and threads that
    sleep at once (``OMP_WAIT_POLICY=PASSIVE`` alone) must be woken at every
    parallel loop, which a loop scan runs every step: a 512 x 512 heat
    scan ran at 3984 Mcell-updates/s that way, against 13805 with
    ``GOMP_SPINCOUNT=10000`` (PASSIVE otherwise), while a jitted 1024**2
    FFT run just after a loop call took 3641 us against 4118 us (a spin count
    of 100,000: 6222 us, starved) and a 2048**2 map 1026 against 1123 us
    (one process, 15 rounds each, 2 cores, quiet machine)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)


def _compile(source: str) -> Tiered:
    """The nest of a generated source: serial first, parallel once its runs
    add up (:mod:`xstencil._backends.tiered`)."""
    return from_source(source, "<xstencil loop kernel>")


def fits(built: _Built, out: np.ndarray | None) -> bool:
    """Whether the loop can write its one output straight into ``out``."""
    return (out is not None and len(built.out_avals) == 1 and out.shape == built.field
            and out.dtype == np.dtype(built.out_avals[0].dtype) and out.flags.c_contiguous
            and out.flags.writeable)


def stage_loops(built: _Built, arrays: Sequence[np.ndarray], coords: Sequence[Any],
                dleaves: Sequence[Any], leaves: Sequence[Any],
                out: np.ndarray | None = None, fallback: Callable[[], Any] | None = None
                ) -> Staged:
    """:func:`run_loops` in two halves: the output buffers are taken and
    wrapped now, and ``go()`` runs the kernel (through :func:`run_loops`)."""
    outs, early = _outputs(built, out, arrays)
    return Staged(early, lambda: run_loops(built, arrays, coords, dleaves, leaves, out,
                                           (outs, early), fallback))


def _outputs(built: _Built, out: np.ndarray | None, arrays: Sequence[np.ndarray] = ()
             ) -> tuple[list[np.ndarray], Any]:
    """The buffers the kernel writes and, where it is known before the kernel
    runs, the output pytree that holds them: ``out`` itself where it
    :func:`fits`, else new buffers placed by the first input (``near`` of
    :func:`~xstencil._backends.bufpool.empty`), wrapped as JAX arrays where
    the wrap is verified to alias them (the kernel's writes are then what
    they hold)."""
    if fits(built, out):
        return [out], jax.tree_util.tree_unflatten(built.out_tree, [out])
    near = bufpool.near_of(arrays[0]) if arrays else None
    outs = [bufpool.empty(built.field, np.dtype(a.dtype), near) for a in built.out_avals]
    wrapped = [w.alias(o) for w, o in zip(built.wraps, outs, strict=True)]
    if any(w is None for w in wrapped):
        return outs, None
    return outs, jax.tree_util.tree_unflatten(built.out_tree, wrapped)


def run_loops(built: _Built, arrays: Sequence[np.ndarray], coords: Sequence[Any],
              dleaves: Sequence[Any], leaves: Sequence[Any],
              out: np.ndarray | None = None, prepared: tuple[list[np.ndarray], Any] | None = None,
              fallback: Callable[[], Any] | None = None) -> Any:
    """Run a compiled loop kernel: the map's output pytree (JAX arrays on the
    CPU that share the loop's output buffers), or ``out`` itself, written in
    place, where it :func:`fits`.  ``prepared``: the buffers and early output
    :func:`stage_loops` took (see :func:`_outputs`).

    New buffers come from :func:`xstencil._backends.bufpool.empty`: 64-byte
    aligned, so that ``jax.device_put`` (here its direct jaxlib call,
    :mod:`~xstencil._backends.hostwrap`) wraps them without a copy, on huge
    pages (numpy asks the kernel for them from 4 MiB on; numba's allocator
    does not, so the loop never allocates), and recycled from results that
    nothing holds any more, so that a loop of maps does not fault in fresh
    memory on every call (see bufpool.py).

    A kernel that returns ``False`` (the host FFT of
    :mod:`~xstencil._backends.hostfft`, on data or weights that are not all
    finite) has not written its outputs: ``fallback()``, the XLA program's
    result for the same call, is copied into them."""
    values = list(dleaves) + list(leaves)
    params = [np.ascontiguousarray(np.asarray(x, dtype=p.dtype)).reshape(-1)
              for x, p in zip(values, built.params, strict=True)]
    outs, early = _outputs(built, out, arrays) if prepared is None else prepared
    srcs = list(arrays) + [np.asarray(c) for c in coords]
    if built.fn(*outs, *srcs, *built.tables, *built.fills, *params) is False:
        assert fallback is not None, "a kernel that can decline runs with a fallback"
        for o, r in zip(outs, jax.tree_util.tree_leaves(fallback()), strict=True):
            np.copyto(o, np.asarray(r))
    if early is not None:
        return early
    return jax.tree_util.tree_unflatten(
        built.out_tree, [w(o) for w, o in zip(built.wraps, outs, strict=True)])
