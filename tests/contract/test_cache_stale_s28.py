"""Stale results found in session 28 (a helper's pass over the compile cache).

Each test calls the public API twice around an in-place change that plain
Python or numpy would see, and compares the second result with a fresh numpy
reference.  With JAX's x64 flag off, JAX keeps its 32-bit copy of a float64
numpy array by the array object for as long as an old trace holds it; the
garbage collector is held off between the calls (:func:`_no_gc`) so that the
old copy is reliably alive, as it is in a long session.
"""

from __future__ import annotations

import functools
import gc
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil

D = xr.DataArray(np.arange(4, dtype=np.float32), dims="x")
BASE = D.values.astype(np.float64)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # float64 narrowed: said once, not the subject here
        yield


def _no_gc(run: Callable[[], Any], change: Callable[[], Any]) -> tuple[Any, Any]:
    was = gc.isenabled()
    gc.disable()
    try:
        first = np.asarray(run(), dtype=np.float64)
        change()
        return first, np.asarray(run(), dtype=np.float64)
    finally:
        if was:
            gc.enable()


def _check(run: Callable[[], Any], change: Callable[[], Any], factor: float = 3.0) -> None:
    first, second = _no_gc(run, change)
    np.testing.assert_allclose(first, BASE)
    np.testing.assert_allclose(second, factor * BASE)


def _w(dtype: Any = np.float64) -> np.ndarray:
    return np.array([1.0, 0.0], dtype=dtype)


class Box:
    pass


class Model:
    def __init__(self) -> None:
        self.params = Box()
        self.params.w = _w()

    def kernel(self, u):
        return u() * jnp.sum(self.params.w)

    def __call__(self, u):
        return u() * jnp.sum(self.params.w)


def _map(k):
    return lambda: D.stencil.map(k, boundary="extend").values


def _scan(k):
    return lambda: D.stencil.scan(lambda u: u(time=-1) * k(), "time", steps=1,
                                  save_every="last", boundary="extend").values


def _step(k):
    return lambda: D.stencil.scan(None, "time", step=lambda s: s * k(), steps=1,
                                  save_every="last").values


def _iterate(k):
    return lambda: xstencil.iterate(D, lambda u: u() * k(), tol=None, max_steps=1,
                                    boundary="extend").field.values


@pytest.mark.parametrize("how", ["bound", "instance"])
def test_an_attribute_of_an_attribute_of_self(how):
    m = Model()
    held = m.params.w
    _check(_map(m.kernel if how == "bound" else m), lambda: m.params.w.__setitem__(0, 3.0))
    assert m.params.w is held  # the view was only lent for the trace


@pytest.mark.parametrize("path", [_map, _scan, _step, _iterate])
def test_an_attribute_of_an_attribute_closed_over(path):
    cfg = Box()
    cfg.inner = Box()
    cfg.inner.w = _w()
    run = path(lambda u=None: (u() if u is not None else 1.0) * jnp.sum(cfg.inner.w)) \
        if path is _map else path(lambda: jnp.sum(cfg.inner.w))
    _check(run, lambda: cfg.inner.w.__setitem__(0, 3.0))


class _Pair(NamedTuple):
    w: np.ndarray
    n: int


class Slotted:
    __slots__ = ("w",)

    def __init__(self) -> None:
        self.w = _w()


def _kernels() -> dict[str, tuple[Any, Callable[[Any], np.ndarray], Callable[..., Any]]]:
    """Per holder: the object, how to reach its array, a kernel naming the path."""
    o = Box()
    o.d, o.ls, o.t, o.nt = {"w": _w()}, [_w()], (_w(),), _Pair(_w(), 2)
    s = Slotted()
    return {"dict": (o, lambda o: o.d["w"], lambda u: u() * jnp.sum(o.d["w"])),
            "list": (o, lambda o: o.ls[0], lambda u: u() * jnp.sum(o.ls[0])),
            "tuple": (o, lambda o: o.t[0], lambda u: u() * jnp.sum(o.t[0])),
            "namedtuple": (o, lambda o: o.nt.w, lambda u: u() * jnp.sum(o.nt.w)),
            "slots": (s, lambda o: o.w, lambda u: u() * jnp.sum(s.w))}


@pytest.mark.parametrize("where", ["dict", "list", "tuple", "namedtuple", "slots"])
def test_arrays_in_containers_held_by_an_attribute(where):
    o, get, kernel = _kernels()[where]
    _check(_map(kernel), lambda: get(o).__setitem__(0, 3.0))
    assert isinstance(get(o), np.ndarray) and get(o).base is None  # put back


class Table:
    w = _w()
    d = {"w": _w()}


@pytest.mark.parametrize("where", ["attribute", "dict"])
def test_a_class_attribute(where):
    get = (lambda: Table.w) if where == "attribute" else (lambda: Table.d["w"])
    _check(_map(lambda u: u() * jnp.sum(get())), lambda: get().__setitem__(0, 3.0))
    assert get().base is None


@pytest.mark.parametrize("read", ["values", "data"])
def test_a_float64_dataarray_changed_through_values(read):
    coef = xr.DataArray(_w(), dims="k")
    held = coef.values
    _check(_map(lambda u: u() * jnp.sum(getattr(coef, read))),
           lambda: coef.values.__setitem__(0, 3.0))
    assert coef.values is held


def test_a_float64_dataset_variable_in_a_step_function():
    ds = xr.Dataset({"w": ("k", _w())})
    _check(_step(lambda: jnp.sum(ds["w"].values)), lambda: ds["w"].values.__setitem__(0, 3.0))


# -- a second pass (session 28, continued) -----------------------------------------------

F = xr.DataArray(np.arange(12, dtype=np.float32).reshape(3, 4), dims=("y", "x"))


def _diff(c: float) -> np.ndarray:
    v = F.values.astype(np.float64)
    return c * (np.concatenate([v[:, 1:], v[:, -1:]], 1) - v)


class Stepper:
    def __init__(self, c: float) -> None:
        self.c = c

    def k(self, u):
        return self.c * (u(x=1) - u())


def _scaled_diff(u, c):
    return c * (u(x=1) - u())


def test_an_inline_bound_method_compiles_once():
    from tests.compiles import compiles

    m = Stepper(0.5)
    F.stencil.map(m.k, boundary="extend")  # m.k is a new object at each access
    with compiles() as n:
        got = F.stencil.map(m.k, boundary="extend").values
    assert n["compiles"] == 0, n
    np.testing.assert_allclose(got, _diff(0.5))
    m.c = 3.0  # still seen
    np.testing.assert_allclose(F.stencil.map(m.k, boundary="extend").values, _diff(3.0))
    other = Stepper(2.0)  # the same function, another object: its own numbers
    np.testing.assert_allclose(F.stencil.map(other.k, boundary="extend").values, _diff(2.0))


def test_an_inline_partial_compiles_once():
    from tests.compiles import compiles

    F.stencil.map(functools.partial(_scaled_diff, c=0.5), boundary="extend")
    with compiles() as n:
        got = F.stencil.map(functools.partial(_scaled_diff, c=0.5), boundary="extend").values
    assert n["compiles"] == 0, n
    np.testing.assert_allclose(got, _diff(0.5))
    np.testing.assert_allclose(
        F.stencil.map(functools.partial(_scaled_diff, c=3.0), boundary="extend").values,
        _diff(3.0))


def _get_alpha(o):
    return o.alpha


def _get_w(o):
    return o.w


class Scaler:
    def times(self, o, u):
        return u() * o.alpha


class Holds:
    def __init__(self, p: Any) -> None:
        self.p = p

    def k(self, u):
        return u() * _get_alpha(self.p)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64])
@pytest.mark.parametrize("how", ["helper", "getattr", "method_of_another", "partial", "bound"])
def test_an_attribute_read_by_a_helper_given_the_object(how, dtype):
    """``get_alpha(p)`` reads ``p.alpha`` in the helper, a name the kernel's
    code lacks: the kernel was keyed without it."""
    data = F.astype(dtype)
    p = Box()
    p.alpha = dtype(1)
    s = Scaler()
    kernel = {"helper": lambda u: u() * _get_alpha(p),
              "getattr": lambda u: u() * getattr(p, "alpha"),  # noqa: B009 - the case
              "method_of_another": lambda u: s.times(p, u),
              "partial": functools.partial(lambda u, o: u() * _get_alpha(o), o=p),
              "bound": Holds(p).k}[how]  # a helper given an attribute of self
    first = np.asarray(data.stencil.map(kernel, boundary="extend").values)
    p.alpha = dtype(3)
    second = np.asarray(data.stencil.map(kernel, boundary="extend").values)
    np.testing.assert_array_equal(first, data.values)
    np.testing.assert_array_equal(second, 3 * data.values)


def test_an_array_attribute_read_by_a_helper():
    p = Box()
    p.w = np.array([1.0, 0.0], dtype=np.float32)
    k = lambda u: u() * jnp.sum(_get_w(p))  # noqa: E731
    np.testing.assert_allclose(F.stencil.map(k, boundary="extend").values, F.values)
    p.w[0] = 3.0
    np.testing.assert_allclose(F.stencil.map(k, boundary="extend").values, 3 * F.values)


@pytest.mark.parametrize("kind", ["matrix", "array"])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "bsr", "dia", "lil", "dok"])
@pytest.mark.parametrize("read", ["sum", "toarray"])
def test_a_scipy_sparse_matrix_changed_in_place(fmt, kind, read):
    sparse = pytest.importorskip("scipy.sparse")
    M = getattr(sparse, f"{fmt}_{kind}")(np.array([[1, 0], [0, 0]], dtype=np.float32))
    k = (lambda u: u() * M.sum()) if read == "sum" else (lambda u: u() * M.toarray()[0, 0])

    def change():
        if fmt in ("lil", "dok"):
            M[0, 0] = 3.0
        else:
            M.data[...] *= 3.0

    _check(_map(k), change)


_G = {"w": np.array([1.0, 0.0], dtype=np.float32)}


@functools.lru_cache
def _cached_w():
    return _G["w"]


@functools.cache
def _cached_scale(n):
    return _G["w"][0] * n


@pytest.mark.parametrize("helper", ["array", "scalar"])
def test_an_lru_cache_helper_returning_a_global_array(helper):
    """The helper's cache returns the array itself (or, for the scalar one,
    a value computed from it), so it reads the array changed in place; the
    kernel was keyed by the wrapper's identity only."""
    _G["w"][0] = 1.0
    k = (lambda u: u() * jnp.sum(_cached_w())) if helper == "array" else \
        (lambda u: u() * _cached_scale(2.0) / 2.0)
    for factor in (1.0, 3.0, 5.0):  # three calls: the memo of a kernel seen again too
        _G["w"][0] = factor
        _cached_scale.cache_clear()  # Python's own cache: cleared, as a caller would
        np.testing.assert_allclose(F.stencil.map(k, boundary="extend").values, factor * F.values)


@pytest.mark.parametrize("wrap", ["dataarray", "bare"])
def test_a_dask_array_read_from_a_store_rewritten_in_place(tmp_path, wrap):
    """dask reads its sources again on every compute; keyed by the graph's
    name, a zarr store rewritten in place gave the old numbers back."""
    da = pytest.importorskip("dask.array")
    zarr = pytest.importorskip("zarr")
    from tests.compiles import compiles

    path = str(tmp_path / "c.zarr")
    z = zarr.open(path, mode="w", shape=(4,), chunks=(2,), dtype="f4")
    z[:] = [1.0, 0.0, 0.0, 0.0]
    lazy = da.from_zarr(path)
    C = xr.DataArray(lazy, dims="k") if wrap == "dataarray" else lazy
    k = (lambda u: u() * C.values.sum()) if wrap == "dataarray" else \
        (lambda u: u() * C.sum().compute())
    np.testing.assert_allclose(F.stencil.map(k, boundary="extend").values, F.values)
    with compiles() as n:  # unchanged: the compiled code is reused
        F.stencil.map(k, boundary="extend")
    assert n["compiles"] == 0, n
    zarr.open(path, mode="r+")[:] = [3.0, 0.0, 0.0, 0.0]
    assert float(lazy.sum()) == 3.0  # what dask itself says now
    np.testing.assert_allclose(F.stencil.map(k, boundary="extend").values, 3 * F.values)
