"""A kernel called again after a value it reads changed gets the new value
(session 27): each case below returned the previous call's result, with no
warning, before the fixes it names.

* a walk past the budget (a 2100-item global tuple, a 2100-entry params dict)
  or too deep (a 3000-deep nested list) kept only the kernel's identity, so
  a changed scalar global read by the same kernel was missed: such a kernel
  now traces afresh on every call;
* a NamedTuple was not walked (its items, a list or array changed in place);
* a property's getter was not walked (a global it reads, ``self._x``
  assigned outside any method);
* ChainMap, UserDict, UserList and MappingProxyType were keyed by identity;
* an int subclass's instance attributes were not keyed;
* values that compare equal but differ shared a key (aware datetimes of one
  instant in two time zones, ``range(0)`` and ``range(3, 3)``);
* a table of numbers (a list or tuple of more than 16) is keyed as one
  digest, so it no longer runs the walk past its budget (a compile per call).

Every result is checked against numpy arithmetic on the current values.
"""

from __future__ import annotations

import collections
import datetime
import types
import typing
import warnings
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil

X = np.arange(6, dtype=np.float32)
D = xr.DataArray(X, dims="x")
NEXT = np.r_[X[1:], X[-1]]  # u(x=1) with boundary="extend"


def _map(k: Callable[..., Any]) -> np.ndarray:
    return np.asarray(D.stencil.map(k, boundary="extend").values)


def _twice(k: Callable[..., Any], change: Callable[[], None], before: np.ndarray,
           after: np.ndarray, run: Callable[[Callable[..., Any]], Any] = _map) -> None:
    """``run(k)``, ``change()``, ``run(k)`` again: each equals its numpy answer."""
    np.testing.assert_allclose(np.asarray(run(k)), before, rtol=1e-6)
    change()
    np.testing.assert_allclose(np.asarray(run(k)), after, rtol=1e-6)


# -- 1. a walk too large or too deep: traced afresh on each call ----------------------

C = 1.0
BIG = tuple(f"s{i}" for i in range(2100))  # not numbers: walked item by item
PARAMS = {"c": 1.0, **{f"p{i}": float(i) for i in range(2100)}}
DEEP: list[Any] = [1.0]
for _ in range(3000):
    DEEP = [DEEP]


def _set_c(value: float) -> None:
    global C
    C = value


def _over_budget(u: Any) -> Any:
    return u() * C + 0 * len(BIG[0])


def _too_deep(u: Any) -> Any:
    x = DEEP
    while isinstance(x, list) and isinstance(x[0], list):
        x = x[0]
    return u() * x[0] * C


OVER = pytest.mark.filterwarnings("ignore::xstencil.CompileWarning")


@OVER
@pytest.mark.parametrize("kernel", [_over_budget, _too_deep], ids=["budget", "recursion"])
def test_map_over_budget_kernel_sees_a_changed_global(kernel: Any) -> None:
    _set_c(1.0)
    try:
        _twice(kernel, lambda: _set_c(3.0), X, 3.0 * X)
        _twice(kernel, lambda: _set_c(2.0), 3.0 * X, 2.0 * X)
    finally:
        _set_c(1.0)


@OVER
def test_map_scan_kmap_large_params_dict_item() -> None:
    params = dict(PARAMS)
    _twice(lambda u: u() * params["c"], lambda: params.__setitem__("c", 3.0), X, 3.0 * X)
    params["c"] = 1.0

    def scan(k: Any) -> Any:
        return D.stencil.scan(k, "time", steps=1, save_every="last", boundary="extend").values

    _twice(lambda u: u(time=-1) * params["c"], lambda: params.__setitem__("c", 3.0), X,
           3.0 * X, run=scan)
    params["c"] = 1.0
    f = xstencil.kmap(lambda u: u[0] * params["c"], kernel_size=(3,), padding="same",
                      relative=True)
    _twice(f, lambda: params.__setitem__("c", 3.0), X, 3.0 * X,
           run=lambda g: g(jnp.asarray(X)))


@OVER
def test_bound_method_over_budget_sees_a_changed_attribute() -> None:
    class Model:
        def __init__(self) -> None:
            self.c = 1.0
            self.table = tuple(f"s{i}" for i in range(2100))

        def k(self, u: Any) -> Any:
            return u() * self.c + 0 * len(self.table[0])

    m = Model()
    _twice(m.k, lambda: setattr(m, "c", 3.0), X, 3.0 * X)


def test_an_over_budget_kernel_warns_once_that_it_compiles_every_call() -> None:
    names = {f"p{i}": float(i) for i in range(2100)}

    def k(u: Any) -> Any:
        return u() * names["p2"]

    with pytest.warns(xstencil.CompileWarning, match="compiled again on every call"):
        D.stencil.map(k, boundary="extend")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per kernel
        np.testing.assert_allclose(D.stencil.map(k, boundary="extend").values, 2.0 * X)

    class Big:  # a callable instance: warned once per class, not on every call
        def __init__(self) -> None:
            self.names = {f"p{i}": float(i) for i in range(2100)}

        def __call__(self, u: Any) -> Any:
            return u() * self.names["p3"]

    big = Big()
    with pytest.warns(xstencil.CompileWarning):
        D.stencil.map(big, boundary="extend")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(D.stencil.map(big, boundary="extend").values, 3.0 * X)


# -- 2. NamedTuple contents --------------------------------------------------------------

class NT(typing.NamedTuple):
    a: float
    w: np.ndarray
    items: list


def _nt() -> NT:
    return NT(1.0, np.array([1.0, 2.0], np.float32), [1.0])


def test_namedtuple_array_changed_in_place() -> None:
    nt = _nt()
    _twice(lambda u: u() * nt.w[0] + u(x=1) * nt.w[1], lambda: nt.w.__setitem__(1, 5.0),
           X + 2.0 * NEXT, X + 5.0 * NEXT)


def test_namedtuple_list_changed_in_place_by_name_and_index() -> None:
    nt = _nt()
    _twice(lambda u: u() * nt.items[0], lambda: nt.items.__setitem__(0, 5.0), X, 5.0 * X)
    nt2 = _nt()
    _twice(lambda u: u() * nt2[2][0], lambda: nt2[2].__setitem__(0, 4.0), X, 4.0 * X)


def test_namedtuple_global_array_lifted_in_scan() -> None:
    nt = _nt()

    def scan(k: Any) -> Any:
        return D.stencil.scan(k, "time", steps=1, save_every="last", boundary="extend").values

    _twice(lambda u: u(time=-1) * nt.w[1], lambda: nt.w.__setitem__(1, 5.0), 2.0 * X,
           5.0 * X, run=scan)


def test_namedtuple_type_is_in_the_key() -> None:
    class A(typing.NamedTuple):
        v: float

    class B(typing.NamedTuple):
        v: float

    holder = [A(1.0)]
    _twice(lambda u: u() * (2.0 if isinstance(holder[0], B) else 1.0),
           lambda: holder.__setitem__(0, B(1.0)), X, 2.0 * X)


# -- 3. properties ---------------------------------------------------------------------

G = 1.0


def _set_g(value: float) -> None:
    global G
    G = value


def test_property_reading_a_global() -> None:
    class P:
        @property
        def c(self) -> float:
            return G

    p = P()
    try:
        _twice(lambda u: u() * p.c, lambda: _set_g(3.0), X, 3.0 * X)
    finally:
        _set_g(1.0)


def test_property_reading_an_attribute_set_outside_methods() -> None:
    class P:
        @property
        def c(self) -> float:
            return self._x * 2

    p = P()
    p._x = 1.0  # type: ignore[attr-defined]
    _twice(lambda u: u() * p.c, lambda: setattr(p, "_x", 2.0), 2.0 * X, 4.0 * X)


def test_bound_method_reading_a_property() -> None:
    class P:
        def __init__(self) -> None:
            self._c = 1.0

        @property
        def c(self) -> float:
            return self._c

        def k(self, u: Any) -> Any:
            return u() * self.c

    p = P()
    _twice(p.k, lambda: setattr(p, "_c", 3.0), X, 3.0 * X)


# -- 4. other mappings and sequences ------------------------------------------------------

def test_chainmap_userdict_userlist_mappingproxy_items() -> None:
    cm = collections.ChainMap({"a": 1.0})
    _twice(lambda u: u() * cm["a"], lambda: cm.maps[0].__setitem__("a", 3.0), X, 3.0 * X)
    ud = collections.UserDict({"a": 1.0})
    _twice(lambda u: u() * ud["a"], lambda: ud.__setitem__("a", 3.0), X, 3.0 * X)
    ul = collections.UserList([1.0])
    _twice(lambda u: u() * ul[0], lambda: ul.__setitem__(0, 3.0), X, 3.0 * X)
    backing = {"a": 1.0}
    mp = types.MappingProxyType(backing)
    _twice(lambda u: u() * mp["a"], lambda: backing.__setitem__("a", 3.0), X, 3.0 * X)


def test_userdict_array_changed_in_place() -> None:
    ud = collections.UserDict({"w": np.array([1.0, 2.0], np.float32)})
    _twice(lambda u: u() * ud["w"][1], lambda: ud["w"].__setitem__(1, 5.0), 2.0 * X, 5.0 * X)


# -- 5. a number subclass with instance attributes -------------------------------------

def test_int_and_float_subclass_attributes() -> None:
    class Cint(int):
        pass

    class Cfloat(float):
        pass

    ci = Cint(1)
    ci.s = 1.0  # type: ignore[attr-defined]
    _twice(lambda u: u() * ci.s, lambda: setattr(ci, "s", 3.0), X, 3.0 * X)
    cf = Cfloat(1.0)
    cf.s = 1.0  # type: ignore[attr-defined]
    k = lambda u: u() * cf.s  # noqa: E731 - the same kernel object, called three times
    _twice(k, lambda: setattr(cf, "s", 2.0), X, 2.0 * X)
    _twice(k, lambda: setattr(cf, "s", 4.0), 2.0 * X, 4.0 * X)  # past the memo's record


# -- 6. equal but different values -------------------------------------------------------

T = datetime.datetime(2020, 1, 1, 0, tzinfo=datetime.UTC)
R = range(0)


def test_aware_datetime_same_instant_other_zone() -> None:
    global T
    t0 = T

    def shift() -> None:
        global T
        T = T.astimezone(datetime.timezone(datetime.timedelta(hours=5)))

    try:
        _twice(lambda u: u() * (T.hour + 1), shift, X, 6.0 * X)
    finally:
        T = t0


def test_equal_ranges_with_other_start() -> None:
    global R

    def other() -> None:
        global R
        R = range(3, 3)

    try:
        _twice(lambda u: u() * (R.start + 1), other, X, 4.0 * X)
    finally:
        R = range(0)


TABLE = [0.5] * 600  # a table of coefficients: keyed as one value, not 600
ROWS = tuple(range(500))


def test_number_tables_are_keyed_whole_compile_once_and_see_changes():
    from tests.compiles import compiles

    def k(u):
        return u(x=1) * TABLE[3] + 0 * ROWS[1]

    np.testing.assert_allclose(D.stencil.map(k, boundary="extend").values, NEXT * 0.5)
    with compiles() as got:
        again = D.stencil.map(k, boundary="extend")
    assert got["compiles"] == 0  # over the walk's budget item by item, it compiled each call
    np.testing.assert_allclose(again.values, NEXT * 0.5)
    TABLE[3] = 2.0
    try:
        np.testing.assert_allclose(D.stencil.map(k, boundary="extend").values, NEXT * 2.0)
    finally:
        TABLE[3] = 0.5
    # -0.0 and 0.0, True and 1 are told apart
    tab = [0.0] * 20

    def inv(u):
        return u(x=1) + 1.0 / jnp.float32(tab[0])

    assert np.isposinf(D.stencil.map(inv, boundary="extend").values).all()
    tab[0] = -0.0
    assert np.isneginf(D.stencil.map(inv, boundary="extend").values).all()


def test_nested_number_tables_and_tuple_subclasses_with_their_own_make():
    from tests.compiles import compiles

    w = np.linspace(0.0, 1.0, 25).reshape(5, 5).tolist()  # what the advice suggests

    def k(u):
        return sum(w[i][j] * u(x=j - 2) for i in range(1) for j in range(5))

    first = D.stencil.map(k, boundary="extend")
    with compiles() as got:
        D.stencil.map(k, boundary="extend")
    assert got["compiles"] == 0
    w[0][4] = 7.0
    p = np.pad(X, 2, mode="edge")
    want = sum(w[0][j] * p[j:j + 6] for j in range(5))
    np.testing.assert_allclose(D.stencil.map(k, boundary="extend").values, want, rtol=1e-6)
    assert not np.allclose(first.values, want)

    class Pair(tuple):
        @classmethod
        def _make(cls, a, b):  # not a NamedTuple's _make(iterable)
            return cls((a, b))

    pair = Pair((np.ones(2, np.float32), 1.0))
    out = D.stencil.map(lambda u: u() * jnp.sum(pair[0]) * pair[1], boundary="extend")
    np.testing.assert_allclose(out.values, 2 * X)
    pair[0][0] = 3.0
    out = D.stencil.map(lambda u: u() * jnp.sum(pair[0]) * pair[1], boundary="extend")
    np.testing.assert_allclose(out.values, 4 * X)
