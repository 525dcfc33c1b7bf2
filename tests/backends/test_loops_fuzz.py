"""Seeded random differential tests: the numba loop backend against XLA.

Two generators, each a fixed list of seeds (the default part small, the
``slow`` part larger), batched so that numba compiles once per batch (one
Dataset map whose kernel returns one variable per random kernel):

* **geometry**: random dims (1-3), shapes (1-7 per dim, so halos wider than
  the array), windows (1-7 per dim, at most 14 cells; slow seed 103 crashed
  the old loop shell), strides, boundary modes (one or one per dim, ``fill``
  with a fill value) through window sums, weighted sums, max,
  min and corner reads, on integer-valued data, so every sum is exact in any
  order and the results must be equal bitwise (XLA's regrouped constant-weight
  sums cannot show); an option set one path refuses, the other must refuse
  with the same error;
* **expressions**: random typed expression trees (depth 3) over Dataset
  variables of every dtype the loops support (bool, 8- to 64-bit integers,
  float32 and float64), with integer data over the type's full range (edges
  included: integer arithmetic wraps) and float data of small multiples of
  1/2 plus NaN, +-inf and +-0.0; arithmetic, ``maximum``/``minimum``, ``where``,
  comparisons, bitwise operations, ``clip``, ``floor``/``ceil``, ``isfinite``,
  float <-> integer <-> bool casts, casts of masks times values.  Each kernel
  must run as loops, with XLA's dtype, the same NaNs and signs of zero, and
  bitwise equal values.

XLA's own departures from IEEE (docs/performance.rst) are kept out of the
bitwise cases: every float intermediate is generated exactly representable
(a bound on its magnitude and binary digits is tracked), so XLA's ``a * b + c``
fusing and regrouped sums round nothing; division is only the root and only by
a window value (XLA multiplies by the reciprocal of a constant); an integer
``abs`` of a product is never generated (XLA drops it, the loop backend falls
back: ``test_abs_of_an_integer_product_runs_with_xla``).  ``sqrt`` at the root
is exact too (correctly rounded on both); ``exp``/``tanh`` at the root are
compared within 4 units in the last place.

A failure names the seed, the kernel's source and the first differing point
(loops vs XLA); ``_expression_batch(seed)`` rebuilds the case.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from xstencil._errors import XStencilError

pytest.importorskip("numba")

MODES = ["fill", "periodic", "extend", "reflect", "symmetric", "valid"]
DIMS = ("z", "y", "x")


def mismatch(got: np.ndarray, want: np.ndarray, ulps: int = 0) -> str | None:
    """None when equal (dtype, shape, NaNs, signs of zero, values within
    ``ulps`` units in the last place); else what differs, at the first point."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"dtype/shape: loops {got.dtype}{got.shape}, xla {want.dtype}{want.shape}"
    if got.dtype.kind == "f":
        nan_g, nan_w = np.isnan(got), np.isnan(want)
        fin = np.isfinite(want) & np.isfinite(got)
        tol = ulps * np.spacing(np.maximum(np.abs(got), np.abs(want)).astype(got.dtype))
        err = np.abs(np.where(fin, got, 0) - np.where(fin, want, 0))
        close = np.where(fin, err <= tol, got == want)
        same_zero = (got != 0) | (np.signbit(got) == np.signbit(want))
        bad = (nan_g != nan_w) | (~nan_w & ~nan_g & ~(close & same_zero))
    else:
        bad = got != want
    if not bad.any():
        return None
    i = tuple(int(j) for j in np.argwhere(bad)[0])
    return f"{int(bad.sum())} points differ, first at {i}: loops {got[i]!r}, xla {want[i]!r}"


class Reasons(logging.Handler):
    """Collects the messages of a logger (why a map fell back to XLA)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_ds(ds: xr.Dataset, kernel: Callable[[Any], dict[str, Any]], ran: list[int],
           **opts: Any) -> tuple[xr.Dataset, xr.Dataset] | tuple[str, str]:
    """The map on loops (asserted to have run as loops) and on XLA; or, where
    the options are refused, the two error messages."""
    n = len(ran)
    log, why = logging.getLogger("xstencil.loops"), Reasons()
    level = log.level
    log.addHandler(why)
    log.setLevel(logging.DEBUG)
    try:
        got = ds.stencil.map(kernel, backend="loops", **opts)
    except XStencilError as e:
        with pytest.raises(XStencilError) as info:
            ds.stencil.map(kernel, backend="xla", **opts)
        return str(e), str(info.value)
    finally:
        log.removeHandler(why)
        log.setLevel(level)
    assert len(ran) == n + 1, f"the map fell back to XLA ({why.messages}): {opts}"
    return got, ds.stencil.map(kernel, backend="xla", **opts)


# --------------------------------------------------------------------------
# geometry


def _geometry(seed: int) -> tuple[xr.Dataset, dict[str, Any], np.ndarray]:
    rng = np.random.default_rng(seed)
    nd = int(rng.choice([1, 2, 2, 3]))
    dims = DIMS[-nd:]
    shape = tuple(int(rng.integers(1, 8)) for _ in dims)
    # up to 7 cells: a window wider than a 1-3 point axis puts the interior's
    # start past the axis (the loop shell once wrote past the output there)
    opts: dict[str, Any] = {"window": {d: int(rng.integers(1, 8)) for d in dims}}
    while np.prod(list(opts["window"].values())) > 14:  # numba compiles in seconds
        opts["window"][dims[int(rng.integers(nd))]] -= 1
    if rng.random() < 0.5:
        opts["boundary"] = {d: str(rng.choice(MODES)) for d in dims}
    else:
        opts["boundary"] = str(rng.choice(MODES))
    opts["fill_value"] = int(rng.integers(-9, 10))
    if rng.random() < 0.4:
        opts["stride"] = {d: int(rng.integers(1, 4)) for d in dims}
    a = rng.integers(-50, 51, shape)
    ds = xr.Dataset({"f64": (dims, a.astype(np.float64)), "f32": (dims, a[::-1].astype(
        np.float32)), "i32": (dims, (a * 7).astype(np.int32)), "i8": (dims, a.astype(np.int8))})
    w = rng.integers(-3, 4, tuple(opts["window"].values())).astype(np.float64)
    return ds, opts, w


GEOMETRY_OUT = ("wsum", "isum", "max", "min", "corner")


def _geometry_kernel(w: np.ndarray) -> Callable[[Any], dict[str, Any]]:
    def kernel(s: Any) -> dict[str, Any]:
        f64, f32, i32, i8 = s["f64"], s["f32"], s["i32"], s["i8"]
        return {"wsum": (f64 * w).sum(), "isum": i32.sum(), "max": f32.max(),
                "min": i8.min(), "corner": f64.array.ravel()[0] - f64.array.ravel()[-1]}

    return kernel


def check_geometry(seed: int, ran: list[int]) -> None:
    ds, opts, w = _geometry(seed)
    got, want = run_ds(ds, _geometry_kernel(w), ran, new_vars=GEOMETRY_OUT, **opts)
    where = f"geometry seed {seed}: shape {dict(ds.sizes)}, {opts}, weights {w.tolist()}"
    if isinstance(got, str):
        assert got == want, f"{where}: loops and XLA refuse differently:\n{got}\n{want}"
        return
    for name in want.data_vars:
        assert isinstance(want, xr.Dataset)
        assert got[name].dims == want[name].dims, f"{where}, {name}: dims"
        bad = mismatch(np.asarray(got[name].data), np.asarray(want[name].data))
        assert bad is None, f"{where}, output {name!r}: {bad}"


GEOMETRY_SEEDS: list[Any] = [0, 2]


def _slow(seeds: range) -> list[Any]:
    """More seeds, marked ``slow``."""
    return [pytest.param(s, marks=pytest.mark.slow) for s in seeds]


@pytest.mark.parametrize("seed", GEOMETRY_SEEDS + _slow(range(100, 116)))
def test_random_geometries(seed: int, ran: list[int]) -> None:
    check_geometry(seed, ran)


# --------------------------------------------------------------------------
# expressions

VARS = {"b": "bool", "i8": "int8", "u8": "uint8", "i16": "int16", "i32": "int32",
        "u32": "uint32", "f32": "float32"}  # and, under x64, 64-bit types:
VARS64 = {**VARS, "f64": "float64", "i64": "int64", "u64": "uint64"}
OFFSETS = ["", "x=1", "x=-1", "y=1", "y=-1", "x=1, y=-1"]
BITWISE = {"and": "&", "or": "|", "xor": "^"}
FLOAT_VALUES = [-4.0, -2.5, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 4.0]


@dataclass(frozen=True)
class Node:
    """A generated expression: its source, dtype, and for floats a bound on
    its magnitude and binary digits (``exact``: representable, so that no
    rounding can differ), for integers whether it may be a product."""

    src: str
    dtype: np.dtype
    mag: float = 0.0
    frac: int = 0
    product: bool = False

    @property
    def exact(self) -> bool:
        return self.dtype.kind != "f" or self.mag * 2.0**self.frac < 2.0 ** (
            np.finfo(self.dtype).nmant)


class Expressions:
    """Random typed expression trees over the variables ``names``."""

    def __init__(self, rng: np.random.Generator, names: dict[str, str]) -> None:
        self.rng, self.names = rng, names

    def pick(self, seq: list[Any]) -> Any:
        return seq[int(self.rng.integers(len(seq)))]

    def leaf(self, dtype: np.dtype | None = None) -> Node:
        names = [n for n, d in self.names.items() if dtype is None or np.dtype(d) == dtype]
        name = self.pick(names)
        dt = np.dtype(self.names[name])
        src = f"s[{name!r}]({self.pick(OFFSETS)})"
        return Node(src, dt, 4.0, 1) if dt.kind == "f" else Node(src, dt)

    def cast(self, a: Node, dt: np.dtype) -> Node:
        if a.dtype == dt:
            return a
        src = f"{a.src}.astype({dt.name!r})"
        if dt.kind != "f":
            return Node(src, dt)
        if a.dtype.kind == "f":
            return Node(src, dt, a.mag, a.frac)
        info = np.iinfo(a.dtype) if a.dtype.kind != "b" else np.iinfo(np.uint8)
        return Node(src, dt, float(max(-int(info.min), int(info.max))), 0)

    def tree(self, depth: int) -> Node:
        if depth == 0 or (depth < 3 and self.rng.random() < 0.2):
            return self.leaf()
        node = self.unary(self.tree(depth - 1)) if self.rng.random() < 0.45 else \
            self.binary(self.tree(depth - 1), self.tree(depth - 1))
        return node if node.exact else self.leaf(node.dtype)

    def unary(self, a: Node) -> Node:
        k, f = a.dtype.kind, a.dtype.kind == "f"
        ops = ["cast"] + (["not"] if k in "biu" else []) + (
            ["cmp", "neg", "square", "cube", "clip", "scale"] if k != "b" else []) + (
            ["abs"] if k == "f" or (k in "iu" and not a.product) else []) + (
            ["floor", "ceil", "isfinite"] if f else [])
        op = self.pick(ops)
        if op == "cast":
            return self.cast(a, np.dtype(self.pick(list(self.names.values()))))
        if op == "cmp":
            return Node(f"({a.src} > {self.pick(['1', '2'])})", np.dtype(bool))
        if op == "not":
            return Node(f"(~{a.src})", a.dtype)
        if op in ("neg", "abs"):
            return Node(f"({'-' if op == 'neg' else 'abs'}({a.src}))", a.dtype, a.mag, a.frac)
        if op in ("square", "cube"):
            p = 2 if op == "square" else 3
            src = f"jnp.square({a.src})" if p == 2 else f"({a.src} ** 3)"
            return Node(src, a.dtype, a.mag**p, a.frac * p, True)
        if op == "clip":
            return Node(f"jnp.clip({a.src}, 1, 3)", a.dtype, min(a.mag, 3.0), a.frac, a.product)
        if op == "scale":
            return Node(f"({a.src} * 2 + 3)", a.dtype, a.mag * 2 + 3, a.frac, a.product)
        if op == "isfinite":
            return Node(f"jnp.isfinite({a.src})", np.dtype(bool))
        return Node(f"jnp.{op}({a.src})", a.dtype, a.mag + 1, 0)

    def binary(self, a: Node, b: Node) -> Node:
        b = self.cast(b, a.dtype)
        k = a.dtype.kind
        ops = ["max", "min", "where", "lt", "eq", "add", "mul"] + (
            ["sub"] if k != "b" else []) + (["and", "or", "xor"] if k in "biu" else [])
        op = self.pick(ops)
        mag, frac = max(a.mag, b.mag), max(a.frac, b.frac)
        if op in ("max", "min"):
            return Node(f"jnp.{op}imum({a.src}, {b.src})", a.dtype, mag, frac,
                        a.product or b.product)
        if op == "where":
            return Node(f"jnp.where({a.src} < {b.src}, {b.src}, {a.src})", a.dtype, mag, frac,
                        a.product or b.product)
        if op in ("lt", "eq"):
            return Node(f"({a.src} {'<' if op == 'lt' else '=='} {b.src})", np.dtype(bool))
        if op in ("and", "or", "xor"):
            return Node(f"({a.src} {BITWISE[op]} {b.src})",
                        a.dtype)
        if op == "mul":
            return Node(f"({a.src} * {b.src})", a.dtype, a.mag * b.mag, a.frac + b.frac, True)
        sym = "+" if op == "add" else "-"
        return Node(f"({a.src} {sym} {b.src})", a.dtype, a.mag + b.mag, frac)

    def root(self) -> tuple[Node, int]:
        """A tree, and the units in the last place it may differ by."""
        a = self.tree(3)
        if a.dtype.kind != "f" or self.rng.random() < 0.6:
            return a, 0
        op = self.pick(["div", "sqrt", "exp", "tanh"])
        if op == "div":
            return Node(f"({a.src} / {self.cast(self.tree(2), a.dtype).src})", a.dtype), 0
        return Node(f"jnp.{op}({a.src})", a.dtype), 0 if op == "sqrt" else 4


def _data(dtype: np.dtype, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        a = rng.integers(info.min, int(info.max) + 1, shape, dtype=dtype)
        a.flat[:5] = [info.min, info.max, 0, 1, info.max - 1]
        return a
    a = rng.choice(np.array(FLOAT_VALUES, dtype), shape)
    a.flat[:5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    rng.shuffle(a.ravel())
    return a


def _expression_batch(seed: int, n: int = 10) -> tuple[xr.Dataset, list[tuple[str, int]],
                                                          dict[str, Any], bool]:
    """The data, the kernels (source, ulps), the options and the x64 flag."""
    rng = np.random.default_rng(seed)
    x64 = seed % 2 == 1
    names = VARS64 if x64 else VARS
    shape = (int(rng.integers(2, 6)), int(rng.integers(2, 7)))
    ds = xr.Dataset({k: (("y", "x"), _data(np.dtype(d), rng, shape)) for k, d in names.items()})
    gen = Expressions(rng, names)
    kernels = [(node.src, ulps) for node, ulps in (gen.root() for _ in range(n))]
    mode = str(rng.choice(MODES[:5]))
    opts = {"boundary": mode} | ({"fill_value": 1} if mode == "fill" else {})
    return ds, kernels, opts, x64


def check_expressions(seed: int, ran: list[int]) -> None:
    ds, kernels, opts, x64 = _expression_batch(seed)
    funcs = [eval(f"lambda s: {src}", {"jnp": jnp}) for src, _ in kernels]  # noqa: S307
    outs = tuple(f"k{i}" for i in range(len(kernels)))

    def kernel(s: Any) -> dict[str, Any]:
        return {o: f(s) for o, f in zip(outs, funcs, strict=True)}

    with jax.enable_x64(x64):
        got, want = run_ds(ds, kernel, ran, new_vars=outs, **opts)
    assert isinstance(got, xr.Dataset) and isinstance(want, xr.Dataset), (seed, got)
    for o, (src, ulps) in zip(outs, kernels, strict=True):
        bad = mismatch(np.asarray(got[o].data), np.asarray(want[o].data), ulps)
        assert bad is None, (f"expression seed {seed} ({opts}, x64={x64}), kernel "
                             f"`lambda s: {src}`: {bad}")


@pytest.mark.parametrize("seed", [0, 1] + _slow(range(100, 110)))
def test_random_expressions(seed: int, ran: list[int]) -> None:
    check_expressions(seed, ran)


# --------------------------------------------------------------------------
# integer abs of a product: XLA's simplifier drops abs(x * x) (it takes a
# product of a value with itself, and a max or select of one, to be
# non-negative) also where the product wraps negative, and whether it sees
# x * x depends on its CSE of the lifted program (abs(square(a - b)) kept its
# abs in one boundary mode and lost it in another).  The loop backend cannot
# follow that, so it leaves an integer abs of any product of two non-literal
# values to XLA: the result is XLA's at every array size.

ABS_OF_PRODUCT = [
    lambda u: abs(u() * u()), lambda u: abs(jnp.square(u(x=1) - u(y=-1))),
    lambda u: abs((u(x=1) - u(y=-1)) * (u(x=1) - u(y=-1))), lambda u: abs(u() ** 2),
    lambda u: abs(jnp.maximum(u() * u(), u(x=1))), lambda u: abs(u() * u(x=1)),
    lambda u: abs(jnp.where(u() > 0, u() * u(), u(x=1))), lambda u: abs(jnp.clip(u() ** 3, 0, 9)),
]
ABS_ON_LOOPS = [lambda u: abs(u() * 3), lambda u: abs(u() + u(x=1)),
                lambda u: abs(-(u() * u())), lambda u: abs((u() * u()).astype(jnp.int16)),
                lambda u: abs(u()) * abs(u(x=1))]


@pytest.mark.parametrize("mode", ["periodic", "extend"])
def test_abs_of_an_integer_product_runs_with_xla(mode: str, ran: list[int]) -> None:
    a = xr.DataArray(np.arange(-128, 128).astype(np.int8).reshape(16, 16), dims=("y", "x"))
    for k in ABS_OF_PRODUCT:
        got = a.stencil.map(k, backend="loops", boundary=mode)
        assert not ran, "an integer abs of a product ran as loops"
        want = a.stencil.map(k, backend="xla", boundary=mode)
        assert mismatch(np.asarray(got), np.asarray(want)) is None
    for k in ABS_ON_LOOPS if mode == "periodic" else []:  # no product under the abs
        n = len(ran)
        got = a.stencil.map(k, backend="loops", boundary=mode)
        assert len(ran) == n + 1
        ref = a.stencil.map(k, backend="xla", boundary=mode)
        assert mismatch(np.asarray(got), np.asarray(ref)) is None


def test_abs_of_a_wrapping_square_does_not_depend_on_size(ran: list[int]) -> None:
    """``backend="auto"`` picks the loops from 512 x 512 points: there the
    loops gave |x * x| (an int8 31 in the fuzz) where XLA, below that size,
    gave the wrapped x * x (-31); now every size gives XLA's result."""
    small = np.arange(-128, 128).astype(np.int8).reshape(16, 16)
    big = xr.DataArray(np.tile(small, (32, 32)), dims=("y", "x"))  # 512 x 512

    def kernel(u: Any) -> Any:
        return abs(u() * u())

    auto = np.asarray(big.stencil.map(kernel, boundary="periodic"))
    assert not ran
    sm = np.asarray(xr.DataArray(small, dims=("y", "x")).stencil.map(kernel,
                                                                      boundary="periodic"))
    np.testing.assert_array_equal(auto, np.tile(sm, (32, 32)))  # periodic: the same cells
    np.testing.assert_array_equal(auto, np.asarray(big.stencil.map(kernel, backend="xla",
                                                                   boundary="periodic")))
