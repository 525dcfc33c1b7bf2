"""64-bit numpy arrays changed in place between two calls, with x64 off.

JAX 0.10 converts a float64 or int64 numpy array that a trace reads as a
constant to 32 bits, in a cache keyed by the array object.  xstencil keys its
compiled code by the array's content, so a change makes it trace again, but
the trace got JAX's old copy: the first call's numbers came back, silently.
Session 26 fixed the plain map; session 27's hunt found the same on
``iterate``, ``solve``, ``scan(step=)``, ``iterate(step=)``, ``kmap``,
``kscan``, and through bound methods, callable instances and
``functools.partial`` on every path.  Traces now read views (new objects
over the same memory).
"""

from __future__ import annotations

import functools
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil

D = xr.DataArray(np.arange(4, dtype=np.float32), dims="x")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # float64 narrowed: said once, not the subject here
        yield


class Holder:
    def __init__(self, dtype=np.float64):
        self.w = np.array([1.0, 0.0], dtype=dtype)

    def kernel(self, u):
        return u() * jnp.sum(self.w)

    def step(self, s):
        return s * jnp.sum(self.w)

    def __call__(self, u):
        return u() * jnp.sum(self.w)


def _twice(run, change):
    first = np.asarray(run(), dtype=np.float64)
    change()
    return first, np.asarray(run(), dtype=np.float64)


def _check(run, change, factor=3.0, *, base=None):
    first, second = _twice(run, change)
    base = D.values.astype(np.float64) if base is None else base
    np.testing.assert_allclose(first, base)
    np.testing.assert_allclose(second, factor * base)


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_iterate_kernel_closure(dtype):
    w = np.array([1, 0], dtype=dtype)
    k = lambda u: u() * jnp.sum(w).astype(jnp.float32)  # noqa: E731

    def run():
        return xstencil.iterate(D, k, tol=None, max_steps=1, boundary="extend").field.values

    _check(run, lambda: w.__setitem__(0, 3))


def test_scan_step_closure_int64():
    w = np.array([1])

    def run():
        return D.stencil.scan(None, "time", step=lambda s: s * jnp.sum(w).astype(jnp.float32),
                              steps=1, save_every="last").values

    _check(run, lambda: w.__setitem__(0, 3))


@pytest.mark.parametrize("how", ["map", "map-dask", "scan-loops", "scan-xla", "mesh"])
def test_bound_method_attribute(how):
    h = Holder()
    held = h.w
    runs = {
        "map": lambda: D.stencil.map(h.kernel, boundary="extend").values,
        "map-dask": lambda: D.chunk({"x": 2}).stencil.map(h.kernel, boundary="extend").values,
        "scan-loops": lambda: D.stencil.scan(lambda u: u(time=-1) * jnp.sum(h.w), "time",
                                             steps=1, save_every="last",
                                             boundary="extend").values,
        "scan-xla": lambda: D.stencil.scan(h.kernel, "time", steps=1, save_every="last",
                                           boundary="extend", backend="xla").values,
    }
    if how == "mesh":
        m = D.stencil.mesh(boundary="extend")
        m[...] = h.kernel
        runs["mesh"] = m.map
    if how.startswith("scan"):
        h.kernel = None  # the scan kernels read u(time=-1)
        runs["scan-xla"] = lambda: D.stencil.scan(
            lambda u, h=h: u(time=-1) * jnp.sum(h.w), "time", steps=1, save_every="last",
            boundary="extend", backend="xla").values
    _check(runs[how], lambda: h.w.__setitem__(0, 3.0))
    assert h.w is held  # the views were only lent for the trace


def test_scan_loops_bound_method_and_partial():
    class Prev(Holder):
        def kernel(self, u):
            return u(time=-1) * jnp.sum(self.w)

    h = Prev()
    _check(lambda: D.stencil.scan(h.kernel, "time", steps=1, save_every="last",
                                  boundary="extend", backend="loops").values,
           lambda: h.w.__setitem__(0, 3.0))
    w = np.array([1.0, 0.0])
    k = functools.partial(lambda u, w: u(time=-1) * jnp.sum(w), w=w)
    _check(lambda: D.stencil.scan(k, "time", steps=1, save_every="last", boundary="extend",
                                  backend="loops").values,
           lambda: w.__setitem__(0, 3.0))


def test_partial_positional_array_in_map_and_step():
    w = np.array([1.0, 0.0])
    k = functools.partial(lambda w, u: u() * jnp.sum(w), w)
    _check(lambda: D.stencil.map(k, boundary="extend", backend="loops").values,
           lambda: w.__setitem__(0, 3.0))
    w2 = np.array([1.0, 0.0])
    step = functools.partial(lambda w, s: s * jnp.sum(w), w2)
    _check(lambda: D.stencil.scan(None, "time", step=step, steps=1, save_every="last").values,
           lambda: w2.__setitem__(0, 3.0))


def test_callable_instance_in_iterate_step_and_kmap_kscan():
    h = Holder()
    _check(lambda: xstencil.iterate(D, step=h.step, tol=None, max_steps=1).field.values,
           lambda: h.w.__setitem__(0, 3.0))
    x = jnp.asarray(D.values)
    kh = Holder()
    km = xstencil.kmap(lambda u: u[0] * jnp.sum(kh.w), kernel_size=(3,), padding="same",
                       relative=True)
    _check(lambda: km(x), lambda: kh.w.__setitem__(0, 3.0))
    ks = xstencil.kscan(kh, kernel_size=(1,), padding="same", relative=True)
    kh.w[0] = 1.0
    _check(lambda: ks(x), lambda: kh.w.__setitem__(0, 3.0))


def test_a_partial_subclass_keeps_its_own_call():
    class Times10(functools.partial):
        def __call__(self, *a, **k):
            return super().__call__(*a, **k) * 10

    k = Times10(lambda u, c: u() * c, c=1.0)
    np.testing.assert_allclose(D.stencil.map(k, boundary="extend").values, 10 * D.values)


def test_lent_views_go_back_after_concurrent_traces_and_keep_reassignments():
    import threading

    h = Holder()
    stored = h.w
    sizes = [5, 6, 7, 8, 9, 10]

    def run(n):
        xr.DataArray(np.arange(n, dtype=np.float32), dims="x").stencil.map(
            h.kernel, boundary="extend")

    threads = [threading.Thread(target=run, args=(n,)) for n in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.w is stored

    class Resets(Holder):
        def kernel(self, u):
            self.w = np.array([2.0, 0.0])  # the kernel's own assignment is kept
            return u() * 2.0

    r = Resets()
    D.stencil.map(r.kernel, boundary="extend")
    np.testing.assert_array_equal(r.w, [2.0, 0.0])


def test_interleaved_lends_of_one_attribute_put_the_stored_array_back():
    # two traces of the same object's method at once, ending in the other order: the
    # second saw the first's view as "the stored array" and left it there for good
    from xstencil._engine.fresh import _swapped

    h = Holder()
    stored = h.w
    held = [(h.__dict__, "w")]
    a, b = _swapped(held), _swapped(held)
    a.__enter__()
    b.__enter__()
    assert h.w is not stored and h.w.base is stored
    a.__exit__(None, None, None)
    assert h.w is not stored  # b still holds the view
    b.__exit__(None, None, None)
    assert h.w is stored
