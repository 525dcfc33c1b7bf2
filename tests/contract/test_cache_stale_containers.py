"""A kernel or step function that reads a DataArray, a pandas object or a
standard-library container that changes in place gets the new values.

Before session 26 these were keyed by identity in the compile cache: a
DataArray changed with ``coef[...] = 2`` (or an OrderedDict, a deque, a
masked array...) gave the first call's result again, with no warning, in
``map``, ``scan(step=...)`` and ``iterate(step=...)``.  They are now keyed
by content, so an equal object built anew also reuses the compiled code
(a step function written inside the function that calls ``scan`` compiled
again on every call, about a second each).  Every result here is checked
against numpy arithmetic on the current values.
"""

from __future__ import annotations

import array
import collections
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import xstencil
from tests.compiles import compiles

U0 = xr.DataArray(np.zeros(6), dims="x", coords={"x": np.arange(6.0)})


def _coef(value: float = 1.0) -> xr.DataArray:
    return xr.DataArray(np.full(6, value), dims="x", coords={"x": np.arange(6.0)})


def test_scan_step_reads_a_dataarray_changed_in_place() -> None:
    coef = _coef()

    def step(s: xr.DataArray) -> xr.DataArray:
        return s + coef

    for k in range(1, 4):
        out = U0.stencil.scan(None, "t", step=step, steps=2, save_every="last")
        np.testing.assert_array_equal(out.values, 2.0 * k)  # two steps of + k
        coef[...] = coef + 1


def test_iterate_step_reads_a_dataarray_changed_in_place() -> None:
    coef = _coef()
    got = []
    for value in (1.0, 100.0):
        coef[...] = value
        got.append(xstencil.iterate(U0, step=lambda s: (s + coef) * 0.5, tol=None,
                                    max_steps=3).field.values)
    np.testing.assert_allclose(got[0], 0.875)  # ((0 + 1)/2 + 1)/2 ... three times
    np.testing.assert_allclose(got[1], 87.5)


def test_map_kernel_reads_a_dataarray_attribute_and_coords() -> None:
    """A value read at trace time (``float(...)``), and a coordinate changed
    in place, are both part of the key."""
    coef = _coef(1.0)
    kernel = lambda u: u() + float(coef[0]) + float(coef.x[0])  # noqa: E731
    assert float(U0.stencil.map(kernel).values[0]) == 1.0
    coef[...] = 5.0
    assert float(U0.stencil.map(kernel).values[0]) == 5.0
    coef.coords["x"] = np.arange(6.0) + 10.0  # the same object, relabelled
    assert float(U0.stencil.map(kernel).values[0]) == 15.0
    coef.attrs["scale"] = 2.0  # attrs are keyed too (nothing reads them here)
    assert float(U0.stencil.map(kernel).values[0]) == 15.0


def test_dataset_read_by_a_step_function() -> None:
    params = xr.Dataset({"a": _coef(1.0), "b": _coef(2.0)})

    def step(s: xr.DataArray) -> xr.DataArray:
        return s * params["a"] + params["b"]

    first = U0.stencil.scan(None, "t", step=step, steps=1, save_every="last")
    params["b"][...] = 7.0
    second = U0.stencil.scan(None, "t", step=step, steps=1, save_every="last")
    np.testing.assert_array_equal(first.values, 2.0)
    np.testing.assert_array_equal(second.values, 7.0)


def _containers() -> list[tuple[str, Any, Callable[[Any], None], Callable[[Any], Any]]]:
    return [
        ("Series", pd.Series([1.0]), lambda c: c.__setitem__(0, 5.0),
         lambda c: lambda u: u() + float(c[0])),
        ("defaultdict", collections.defaultdict(float, nu=1.0),
         lambda c: c.__setitem__("nu", 5.0), lambda c: lambda u: u() + c["nu"]),
        ("OrderedDict", collections.OrderedDict(nu=1.0),
         lambda c: c.__setitem__("nu", 5.0), lambda c: lambda u: u() + c["nu"]),
        ("deque", collections.deque([1.0]), lambda c: c.__setitem__(0, 5.0),
         lambda c: lambda u: u() + c[0]),
        ("array", array.array("d", [1.0]), lambda c: c.__setitem__(0, 5.0),
         lambda c: lambda u: u() + c[0]),
        ("set", {1.0}, lambda c: (c.clear(), c.add(5.0)), lambda c: lambda u: u() + max(c)),
        ("bytearray", bytearray([1]), lambda c: c.__setitem__(0, 5),
         lambda c: lambda u: u() + c[0]),
        ("masked", np.ma.array([1.0, 2.0], mask=[False, True]),
         lambda c: c.__setitem__(0, 5.0), lambda c: lambda u: u() + c[0]),
        ("datetimes", np.array(["2000-01-01", "2000-01-02"], dtype="datetime64[D]"),
         lambda c: c.__setitem__(1, np.datetime64("2000-01-05")),
         lambda c: lambda u: u() + 1 + (float((c[1] - c[0]) / np.timedelta64(1, "D")) - 1)
         * 4 / 3),
        ("namespace", types.SimpleNamespace(nu=1.0), lambda c: setattr(c, "nu", 5.0),
         lambda c: lambda u: u() + c.nu),
    ]


@pytest.mark.parametrize("case", _containers(), ids=lambda c: c[0])
def test_container_changed_in_place(case: Any) -> None:
    """The same kernel object, and a new one, after the change: both 5."""
    _, obj, change, make = case
    kernel = make(obj)
    assert float(U0.stencil.map(kernel).values[0]) == 1.0
    change(obj)
    assert float(U0.stencil.map(kernel).values[0]) == 5.0
    assert float(U0.stencil.map(make(obj)).values[0]) == 5.0


def test_equal_dataarray_rebuilt_compiles_once() -> None:
    """A step function defined inside the caller, closing over a DataArray
    built anew each call with equal content, reuses the compiled loop."""

    def run(value: float) -> xr.DataArray:
        coef = _coef(value)
        return U0.stencil.scan(None, "t", step=lambda s: s + coef, steps=3,
                               save_every="last")

    run(1.0)
    with compiles() as got:
        again = run(1.0)
    assert got["compiles"] == 0
    np.testing.assert_array_equal(again.values, 3.0)
    with compiles() as got:
        other = run(2.0)
    assert got["compiles"] >= 1  # new content: a new program, the right numbers
    np.testing.assert_array_equal(other.values, 6.0)


def test_dask_backed_dataarray_keyed_by_its_graph() -> None:
    pytest.importorskip("dask")
    coef = _coef(1.0).chunk({"x": 3})
    kernel = lambda u: u() + float(coef.sum()) / 6  # noqa: E731
    assert float(U0.stencil.map(kernel).values[0]) == 1.0
    coef[...] = 5.0  # a new dask graph under the same DataArray object
    assert float(U0.stencil.map(kernel).values[0]) == 5.0


@pytest.mark.parametrize("kind", ["jax", "dict", "list"])
def test_long_arrays_in_attrs_are_keyed_by_content(kind: str) -> None:
    """A repr elides the middle of a long array: two DataArrays whose attrs
    differ only there shared a key (a first version of the content key)."""
    import jax.numpy as jnp

    got = []
    for v in (1.0, 5.0):
        big = np.zeros(2000)
        big[1000] = v
        attrs = {"jax": {"w": jnp.asarray(big)}, "dict": {"p": {"w": big}},
                 "list": {"w": [big]}}[kind]
        coef = xr.DataArray([1.0], dims="k", attrs=attrs)

        def read(c: xr.DataArray) -> float:
            w = c.attrs["p"]["w"] if kind == "dict" else c.attrs["w"]
            return float(np.asarray(w[0] if kind == "list" else w)[1000])

        got.append(float(U0.stencil.map(lambda u, coef=coef: u() + read(coef)).values[0]))
    assert got == [1.0, 5.0]
