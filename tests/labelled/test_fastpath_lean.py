"""The describe memo (xstencil/_engine/kmemo.py): a kernel object called again
is checked slot by slot, and every change a walk would see gives a new key
and the new answer, never the recorded one."""

from __future__ import annotations

import functools
import operator
import types

import jax
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - the accessor
from xstencil._engine import kcache
from xstencil._engine.x64flag import x64

SCALE = 2.0
HELPER_C = 1.0
W = np.array([1.0, 2.0, 3.0], np.float32)


def _helper(x):
    return x * HELPER_C


def _global_kernel(u):
    return u(x=1) * SCALE


def _helper_kernel(u):
    return _helper(u(x=-1))


def _array_kernel(u):
    return (u * W).sum()


def _ref_shift(a: np.ndarray, k: int) -> np.ndarray:
    """a[i + k] with a zero fill, by a numpy loop."""
    out = np.zeros_like(a)
    for i in range(a.size):
        if 0 <= i + k < a.size:
            out[i] = a[i + k]
    return out


@pytest.fixture
def da() -> xr.DataArray:
    return xr.DataArray(np.arange(1.0, 9.0, dtype=np.float32), dims="x")


def _run(da: xr.DataArray, k) -> np.ndarray:
    return np.asarray(da.stencil.map(k, boundary="fill", fill_value=0.0))


def _memo_hits(kernel) -> bool:
    """Whether describe([kernel]) is served from the memo now."""
    return kcache._MEMO.get([kernel]) is not None


def test_memo_records_on_second_sighting_and_hits(da):
    kcache.clear()
    k = _global_kernel
    kcache.describe([k])
    assert not _memo_hits(k)  # first sighting: noted only
    kcache.describe([k])
    assert _memo_hits(k)
    assert kcache.describe([k]) is kcache.describe([k])
    np.testing.assert_array_equal(_run(da, k), _ref_shift(da.values, 1) * SCALE)


@pytest.mark.parametrize(("kernel", "name", "shift"), [
    (_global_kernel, "SCALE", 1),  # read by the kernel itself
    (_helper_kernel, "HELPER_C", -1),  # read by a function the kernel calls
])
def test_changed_global_is_seen(da, kernel, name, shift):
    mod = globals()
    kcache.clear()
    for _ in range(3):
        _run(da, kernel)
    assert _memo_hits(kernel)
    old = mod[name]
    try:
        mod[name] = 5.0
        assert not _memo_hits(kernel)
        np.testing.assert_array_equal(_run(da, kernel), _ref_shift(da.values, shift) * 5.0)
    finally:
        mod[name] = old
    np.testing.assert_array_equal(_run(da, kernel), _ref_shift(da.values, shift) * old)


def test_global_defined_later_is_seen(da):
    code = compile("def k(u):\n    return u(x=1) + LATER\n", "<test>", "exec")
    g = {"__name__": "user_mod"}
    exec(code, g)  # noqa: S102
    k = g["k"]
    kcache.clear()
    g["LATER"] = 1.0
    for _ in range(3):
        _run(da, k)
    assert _memo_hits(k)
    del g["LATER"]
    assert not _memo_hits(k)
    g["LATER"] = 4.0
    np.testing.assert_array_equal(_run(da, k), _ref_shift(da.values, 1) + 4.0)


def test_changed_closure_cell_is_seen(da):
    c = 2.0

    def k(u):
        return u(x=1) * c

    kcache.clear()
    for _ in range(3):
        _run(da, k)
    assert _memo_hits(k)
    c = 7.0  # noqa: F841 - read by k through its cell
    assert not _memo_hits(k)
    np.testing.assert_array_equal(_run(da, k), _ref_shift(da.values, 1) * 7.0)


def test_changed_defaults_and_kwdefaults_are_seen(da):
    def k(u, c=2.0, *, d=1.0):
        return u(x=1) * c + d

    kcache.clear()
    for _ in range(3):
        _run(da, k)
    assert _memo_hits(k)
    k.__defaults__ = (3.0,)
    assert not _memo_hits(k)
    np.testing.assert_array_equal(_run(da, k), _ref_shift(da.values, 1) * 3.0 + 1.0)
    for _ in range(2):
        _run(da, k)
    assert _memo_hits(k)
    k.__kwdefaults__["d"] = 10.0  # the same dict, changed in place
    assert not _memo_hits(k)
    np.testing.assert_array_equal(_run(da, k), _ref_shift(da.values, 1) * 3.0 + 10.0)


def test_changed_code_is_seen(da):
    def k(u):
        return u(x=1)

    def other(u):
        return u(x=-1)

    kcache.clear()
    for _ in range(3):
        _run(da, k)
    k.__code__ = other.__code__
    assert not _memo_hits(k)
    np.testing.assert_array_equal(_run(da, k), _ref_shift(da.values, -1))


def test_array_changed_in_place_is_read_afresh(da):
    kcache.clear()
    ref = da.values.copy()
    win = np.stack([_ref_shift(ref, -1), ref, _ref_shift(ref, 1)])
    for _ in range(3):
        got = np.asarray(da.stencil.map(_array_kernel, window={"x": 3}, boundary="fill",
                                        fill_value=0.0))
    assert _memo_hits(_array_kernel)
    np.testing.assert_allclose(got, (win * W[:, None]).sum(0), rtol=1e-6)
    old = W.copy()
    try:
        W[:] = [0.0, 0.0, 5.0]  # in place: a dynamic input, read on this call
        assert _memo_hits(_array_kernel)  # same key, same (lifted) array object
        got = np.asarray(da.stencil.map(_array_kernel, window={"x": 3}, boundary="fill",
                                        fill_value=0.0))
        np.testing.assert_allclose(got, 5.0 * _ref_shift(ref, 1), rtol=1e-6)
    finally:
        W[:] = old


def test_array_reshaped_in_place_is_a_miss():
    w = np.array([1.0, 2.0, 3.0, 4.0])

    def k(u):
        return (u * w).sum()

    kcache.clear()
    kcache.describe([k])
    first = kcache.describe([k])  # recorded on the second sighting
    assert kcache.describe([k]) is first
    w.shape = (2, 2)
    got = kcache.describe([k])
    assert got is not first and got.key != first.key
    w.shape = (4,)
    w.dtype = np.float32  # in place: 8 float32 now
    got = kcache.describe([k])
    assert got.key != first.key and got.leaves[0].dtype == np.float32


@pytest.mark.parametrize("holder", ["list", "dict", "object", "method", "partial"])
def test_mutable_reach_is_never_memoised(da, holder):
    class Cfg:
        c = 2.0

        def scale(self, x):
            return x * self.c

    cfg = Cfg()
    box = {"list": [2.0], "dict": {"c": 2.0}}.get(holder)
    if holder == "list":
        def k(u):
            return u(x=1) * box[0]
    elif holder == "dict":
        def k(u):
            return u(x=1) * box["c"]
    elif holder == "object":
        def k(u):
            return u(x=1) * cfg.c
    elif holder == "method":
        f = cfg.scale

        def k(u):
            return f(u(x=1))
    else:
        f = functools.partial(operator.mul, 2.0)

        def k(u):
            return f(u(x=1))

    kcache.clear()
    for _ in range(3):
        _run(da, k)
    assert not _memo_hits(k)
    if holder == "list":
        box[0] = 6.0
    elif holder == "dict":
        box["c"] = 6.0
    elif holder in ("object", "method"):
        cfg.c = 6.0
    if holder != "partial":
        np.testing.assert_array_equal(_run(da, k), _ref_shift(da.values, 1) * 6.0)


def test_inline_lambdas_are_not_recorded():
    kcache.clear()
    for _ in range(3):
        kcache.describe([lambda u: u(x=1) + 1.0])
    assert all(v[1] is not None and not isinstance(v[1], tuple)
               for v in kcache._MEMO.table.values())


def test_memo_is_bounded_and_cleared():
    kcache.clear()
    made = [types.FunctionType(_global_kernel.__code__, globals()) for _ in range(200)]
    for f in made:
        kcache.describe([f])
    assert len(kcache._MEMO.table) <= kcache._MEMO.size
    kcache.clear()
    assert not kcache._MEMO.table


def test_global_rebound_every_call_stops_recording_and_stays_right(da):
    g = {"__name__": "user_mod", "T": 0.0}
    exec(compile("def k(u):\n    return u(x=1) + T\n", "<test>", "exec"), g)  # noqa: S102
    k = g["k"]
    kcache.clear()
    for step in range(10):
        g["T"] = float(step)
        np.testing.assert_array_equal(_run(da, k), _ref_shift(da.values, 1) + step)
    assert kcache._MEMO.table[(id(k),)][1] is not None and not _memo_hits(k)
    assert kcache._MEMO.table[(id(k),)][3] > 0


def test_x64_flag_read_matches_jax_config():
    before = jax.config.read("jax_enable_x64")
    assert x64() is bool(before)
    with jax.enable_x64(not before):
        assert x64() is (not before) is bool(jax.config.read("jax_enable_x64"))
    assert x64() is bool(before)


def test_fast_path_sees_x64_toggle():
    """Under each flag, repeated (fast) calls give the first (slow) call's dtype
    and values, whichever flag the previous calls ran under."""
    da = xr.DataArray(np.arange(6, dtype=np.int16), dims="x")

    def k(u):
        return (u(x=1) + 1).astype(int)  # int32, or int64 under x64

    want = {}
    for flag in (False, True):
        kcache.clear()
        with jax.enable_x64(flag):
            want[flag] = da.stencil.map(k, boundary="fill", fill_value=0)
    assert want[False].dtype != want[True].dtype  # the flag matters for this call
    kcache.clear()
    for flag in (False, True, False, True, True, False):
        with jax.enable_x64(flag):
            got = da.stencil.map(k, boundary="fill", fill_value=0)
        assert got.dtype == want[flag].dtype
        np.testing.assert_array_equal(np.asarray(got), _ref_shift(da.values, 1) + 1)
