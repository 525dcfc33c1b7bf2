"""Scalar code for the CPU loop backend (:mod:`xstencil._engine.loopgen`).

:class:`CodeAlgebra` is the algebra :func:`~xstencil._engine.lift.interpret`
replays a kernel's per-cell jaxpr with: every element is a :class:`Code`, a
scalar expression of Python source with its dtype, and each primitive
becomes the numba-compilable source of the same operation, with numpy's
and XLA's dtype rules (wrapping integer arithmetic, float-to-int casts that
saturate as XLA's do, NaN-propagating min and max).  :class:`Param` is a
runtime parameter of the generated function.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xstencil._engine.lift import Unliftable

__all__ = ["Code", "CodeAlgebra", "Param", "dtype_of", "literal", "cast"]

_KINDS = "biuf"

_ARITH = {"add": "+", "sub": "-", "mul": "*"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_FLOAT_FUNCS = {"exp": "np.exp", "log": "np.log", "sqrt": "np.sqrt", "tanh": "np.tanh",
                "sin": "np.sin", "cos": "np.cos", "log1p": "np.log1p", "expm1": "np.expm1",
                "floor": "np.floor", "ceil": "np.ceil", "exp2": "np.exp2",
                "atan": "np.arctan", "asin": "np.arcsin", "acos": "np.arccos"}
_IDENTITY = ("stop_gradient", "copy", "copy_p", "reduce_precision_identity")


@dataclass(frozen=True)
class Code:
    """A scalar element: a Python expression (a name or literal) and its dtype."""

    expr: str
    dtype: np.dtype
    const: bool = False  # a literal (weakly typed in the jaxpr: it takes the other operand's dtype)
    pred: str | None = None  # a float converted from this bool expression
    # an integer that XLA's simplifier may take to be non-negative: a product
    # of two non-literal values (they may be one value after CSE), or a max,
    # min, select or clamp of one (see ``abs`` in :meth:`CodeAlgebra.apply`)
    square: bool = False


@dataclass(frozen=True)
class Param:
    """A runtime array argument of the generated function (flattened)."""

    index: int
    shape: tuple[int, ...]
    dtype: np.dtype


def dtype_of(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind not in _KINDS or (dt.kind == "f" and dt.itemsize not in (4, 8)):
        raise Unliftable(f"dtype {dt} is not supported by the loop backend")
    return dt


def source_dtype(dtype: Any) -> np.dtype:
    """The dtype of a window source's cells: a loop dtype, or complex (a
    float32 coordinate's float pair, :func:`~xstencil._engine.coords.
    pack_coord`, or complex data), read only through ``real`` and ``imag``:
    :meth:`CodeAlgebra.apply` refuses any other use of a complex value."""
    dt = np.dtype(dtype)
    if dt in (np.complex64, np.complex128):
        return dt
    return dtype_of(dt)


def literal(value: Any, dtype: Any) -> str:
    """A typed scalar literal of ``dtype`` holding ``value`` exactly."""
    dt = dtype_of(dtype)
    v = np.asarray(value).astype(dt).item()
    if dt.kind == "b":
        return "True" if v else "False"
    if dt.kind == "f":
        if np.isnan(v):
            return f"np.{dt.name}(np.nan)"
        if np.isinf(v):
            return f"np.{dt.name}({'-' if v < 0 else ''}np.inf)"
        return f"np.{dt.name}({float(v)!r})"
    return f"np.{dt.name}({int(v)})"


def cast(e: Code, dt: np.dtype) -> str:
    if e.dtype == dt:
        return e.expr
    if dt.kind == "b":
        return f"({e.expr} != 0)"
    if e.dtype.kind == "f" and dt.kind in "iu":
        return _float_to_int(e.expr, dt)
    return f"np.{dt.name}({e.expr})"


def _float_to_int(x: str, dt: np.dtype) -> str:
    """XLA's float to integer conversion: truncation, saturating at the
    type's bounds, NaN to 0 (a plain C cast of NaN or of an out-of-range
    value is undefined: numba gives INT_MIN or wraps)."""
    info = np.iinfo(dt)
    hi, lo = float(info.max), float(info.min)  # hi rounds up to a power of two
    return (f"(np.{dt.name}(0) if {x} != {x} else np.{dt.name}({info.max}) if {x} >= {hi!r} "
            f"else np.{dt.name}({info.min}) if {x} <= {lo!r} else np.{dt.name}({x}))")


def _minmax(name: str, a: str, b: str, dt: np.dtype) -> str:
    """``lax.max``/``lax.min``: on floats NaN propagates and -0.0 < +0.0, as
    in XLA.  Two equal zeros take the sum (max) or the negated difference
    (min), which carry XLA's zero sign; everything else a NaN-propagating
    select (non-short-circuit ``|``: numba vectorizes it)."""
    op = ">" if name == "max" else "<"
    if dt.kind != "f":
        return f"({a} if {a} {op} {b} else {b})"
    tie = f"{a} + {b}" if name == "max" else f"-(-{a} - {b})"
    return (f"(({a} if ({a} {op} {b}) | ({a} != {a}) else {b}) "
            f"if ({a} != {b}) | ({a} != 0) else {tie})")


class CodeAlgebra:
    """Elements are :class:`Code`; operations append statements to ``lines``."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.prologue: list[str] = []  # constants and parameter reads, hoisted out of the loops
        self._hoisted: dict[str, str] = {}
        self._n = 0
        self.cells: set[str] = set()  # names of window reads and values computed from them
        # values computed from constants and parameters only go to the prologue
        self._into = self.lines
        self.invariant = 0  # how many statements went there
        self._values: dict[str, Any] = {}  # literal names -> values
        # the zero-weight rule's masks of runtime weights (line number -> the
        # unmasked statement) and those weights (see loopweights.py)
        self.plain: dict[int, str] = {}
        self.weights: list[str] = []

    def _new(self, expr: str, dt: np.dtype, square: bool = False) -> Code:
        name = f"v{self._n}"
        self._n += 1
        self._into.append(f"{name} = {expr}")
        self.invariant += self._into is self.prologue
        return Code(name, dt, square=square)

    def _hoist(self, expr: str, prefix: str) -> str:
        name = self._hoisted.get(expr)
        if name is None:
            name = self._hoisted[expr] = f"{prefix}{len(self._hoisted)}"
            self.prologue.append(f"{name} = {expr}")
        return name

    def constant(self, value: Any, idx: tuple[int, ...]) -> Code:
        if isinstance(value, Param):
            flat = int(np.ravel_multi_index(idx, value.shape)) if value.shape else 0
            # "c", not "q": a boxed nest names its output starts q0, q1 ... (loopnest)
            return Code(self._hoist(f"p{value.index}[{flat}]", "c"), value.dtype)
        if isinstance(value, Code):
            return value
        if not isinstance(value, np.ndarray | np.generic | int | float | bool):
            try:
                value = np.asarray(value)
            except Exception as e:  # a tracer or something foreign
                raise Unliftable(f"constant {type(value).__name__}") from e
        arr = np.asarray(value)
        v = arr[idx] if idx else arr
        name = self._hoist(literal(v, arr.dtype), "k")
        self._values[name] = v
        return Code(name, dtype_of(arr.dtype), const=True)

    def apply(self, prim: Any, elems: Sequence[Any], params: dict[str, Any],
              dtypes: Sequence[Any]) -> Code:
        window = any(isinstance(e, Code) and e.expr in self.cells for e in elems)
        self._into = self.lines if window else self.prologue
        try:
            out = self._apply(prim, elems, params, dtypes)
        finally:
            self._into = self.lines
        if window:
            self.cells.add(out.expr)  # a value computed from the window
        return out

    def _weighted(self, x: str, w: str, weight: Code, dt: np.dtype, first: bool) -> Code:
        """A window value ``x`` times a weight ``w``: a weight of 0 does not
        read its cell (NaN or inf there counts as 0), as on XLA
        (elements.unread_zero_weight) and in the dense lowerings.  A literal
        nonzero weight needs no mask; a runtime one is masked, and
        :func:`~xstencil._engine.loopweights.generate_variants` also writes
        the nest without the masks."""
        if weight.const:
            with np.errstate(all="ignore"):
                nonzero = bool(np.asarray(self._values[weight.expr]).astype(dt) != 0)
            if nonzero:
                return self._new(f"{x} * {w}" if first else f"{w} * {x}", dt)
        else:
            self.plain[len(self.lines)] = f"v{self._n} = {x}"
            if w not in self.weights:
                self.weights.append(w)
        kept = self._new(f"({x} if ({w} != 0) | np.isfinite({x}) else {literal(0, dt)})", dt)
        return self._new(f"{kept.expr} * {w}" if first else f"{w} * {kept.expr}", dt)

    def _apply(self, prim: Any, elems: Sequence[Any], params: dict[str, Any],
               dtypes: Sequence[Any]) -> Code:
        name = prim.name
        if any(isinstance(e, Code) and e.dtype.kind == "c" for e in elems):
            # a coordinate's float pair, hi + 1j * lo: its parts, as XLA reads them
            if name not in ("real", "imag"):
                raise Unliftable(f"primitive {name!r} on a complex value")
            part = np.dtype(np.float32 if elems[0].dtype == np.complex64 else np.float64)
            return self._new(f"{elems[0].expr}.{name}", part)
        es = [e if isinstance(e, Code) else self.constant(e, ()) for e in elems]
        # binary ops: the operands share one dtype (a literal may be declared wider)
        typed = [dtype_of(d) if d is not None else e.dtype for e, d in zip(es, dtypes, strict=True)]
        if name in _ARITH or name in _COMPARE or name in ("div", "max", "min", "pow", "and",
                                                           "or", "xor", "rem", "atan2"):
            dt = next((t for t, e in zip(typed, es, strict=True) if not e.const), typed[0])
            a, b = (cast(e, dt) for e in es)
            masked, other = (es[0], es[1]) if es[0].pred else (es[1], es[0])
            if name == "mul" and dt.kind == "f" and masked.pred and (
                    (es[0].expr in self.cells) == (es[1].expr in self.cells)
                    or (masked.expr in self.cells and other.const)):
                # XLA rewrites convert(pred) * x to select(pred, x, 0): 0, not
                # NaN, where x is inf or NaN, and +0.0 for a negative x, where
                # the mask and x are both window values (or neither is), and
                # for a window mask times a constant (inf, NaN, -2.0); a mask
                # or a weight from a runtime argument it multiplies (0 * inf is
                # NaN), as _weighted does (tests/contract/test_hunt_s6.py and
                # test_loops_semantics_adversarial.py check all four)
                p, x = (es[0].pred, b) if es[0].pred else (es[1].pred, a)
                return self._new(f"({x} if {p} else {literal(0, dt)})", dt)
            if name == "mul" and dt.kind == "f" and (es[0].expr in self.cells) != (
                    es[1].expr in self.cells):
                first = es[0].expr in self.cells
                x, w, weight = (a, b, es[1]) if first else (b, a, es[0])
                return self._weighted(x, w, weight, dt, first)
            if name in _ARITH:
                if dt.kind == "f":  # numba keeps float32 arithmetic in float32
                    return self._new(f"{a} {_ARITH[name]} {b}", dt)
                square = name == "mul" and not (es[0].const ^ es[1].const)
                return self._new(_int_arith(a, _ARITH[name], b, dt) if dt.kind != "b"
                                 else _bool_arith(name, a, b), dt, square)
            if name in _COMPARE:
                return self._new(f"({a} {_COMPARE[name]} {b})", np.dtype(bool))
            if name == "div":
                if dt.kind != "f":
                    raise Unliftable("integer division")
                return self._new(f"{a} / {b}", dt)
            if name == "atan2":
                if dt.kind != "f":
                    raise Unliftable("atan2 on ints")
                return self._new(f"np.{dt.name}(np.arctan2({a}, {b}))", dt)
            if name == "pow":
                if dt.kind != "f":
                    raise Unliftable("integer pow")
                return self._new(f"np.{dt.name}({a} ** {b})", dt)
            if name in ("max", "min"):
                return self._new(_minmax(name, a, b, dt), dt, es[0].square or es[1].square)
            if name in ("and", "or", "xor"):
                sym = {"and": "&", "or": "|", "xor": "^"}[name]
                if dt.kind == "f":
                    raise Unliftable(f"{name} on floats")
                expr = f"({a} {sym} {b})"
                return self._new(expr if dt.kind == "b" else f"np.{dt.name}{expr}", dt)
            raise Unliftable(f"primitive {name!r}")
        if name == "neg":
            (e,), dt = es, typed[0]
            if dt.kind == "b":
                raise Unliftable("neg on bool")
            if dt.kind == "f":
                return self._new(f"-{cast(e, dt)}", dt)
            return self._new(_int_arith("0", "-", cast(e, dt), dt), dt)
        if name == "abs":
            dt = typed[0]
            if dt.kind == "b":
                raise Unliftable("abs on bool")
            if dt.kind != "f" and es[0].square:
                # XLA drops abs(x * x) (x * x >= 0), also where the product
                # wraps negative: the loops would give |x * x|, so the
                # result would depend on the array's size under "auto"
                raise Unliftable("abs of an integer product (XLA drops it even where "
                                 "the product wraps negative)")
            if dt == np.int64:  # abs(INT64_MIN) wraps to itself, as in XLA (see _int_arith)
                x = self._new(cast(es[0], dt), dt).expr
                return self._new(f"({_int_arith('0', '-', x, dt)} if {x} < 0 else {x})", dt)
            return self._new(f"np.{dt.name}(abs({cast(es[0], dt)}))", dt)
        if name == "not":
            dt = typed[0]
            if dt.kind == "b":
                return self._new(f"(not {cast(es[0], dt)})", dt)
            if dt.kind == "f":
                raise Unliftable("not on floats")
            return self._new(f"np.{dt.name}(~{cast(es[0], dt)})", dt)
        if name == "integer_pow":
            return self._integer_pow(es[0], typed[0], int(params["y"]))
        if name == "square":
            a = cast(es[0], typed[0])
            return self._new(_mul(a, a, typed[0]), typed[0], typed[0].kind in "iu")
        if name == "rsqrt":
            dt = typed[0]
            if dt.kind != "f":
                raise Unliftable("rsqrt on ints")
            one = self.constant(np.ones((), dt), ())
            return self._new(f"{one.expr} / np.sqrt({cast(es[0], dt)})", dt)
        if name in _FLOAT_FUNCS:
            dt = typed[0]
            if dt.kind != "f":
                raise Unliftable(f"{name} on ints")
            return self._new(f"np.{dt.name}({_FLOAT_FUNCS[name]}({cast(es[0], dt)}))", dt)
        if name == "is_finite":
            return self._new(f"np.isfinite({cast(es[0], typed[0])})", np.dtype(bool))
        if name == "convert_element_type":
            dt = dtype_of(params["new_dtype"])
            out = self._new(cast(Code(cast(es[0], typed[0]), typed[0]), dt), dt)
            if typed[0].kind == "b" and dt.kind == "f":
                return Code(out.expr, dt, pred=cast(es[0], typed[0]))
            return out
        if name == "select_n":
            pred, cases = es[0], es[1:]
            dt = typed[1]
            vals = [cast(c, dt) for c in cases]
            p = cast(pred, typed[0])
            if typed[0].kind == "b":
                if len(vals) != 2:
                    raise Unliftable("select_n with a bool predicate and many cases")
                return self._new(f"({vals[1]} if {p} else {vals[0]})", dt,
                                 any(c.square for c in cases))
            expr = vals[-1]
            for k in range(len(vals) - 2, -1, -1):
                expr = f"({vals[k]} if {p} == {k} else {expr})"
            return self._new(expr, dt, any(c.square for c in cases))
        if name == "clamp":
            lo, x, hi = (cast(e, typed[1]) for e in es)
            dt = typed[1]  # min(max(lo, x), hi) as XLA: a NaN anywhere gives NaN
            inner = self._new(_minmax("max", lo, x, dt), dt)
            return self._new(_minmax("min", hi, inner.expr, dt), dt, any(e.square for e in es))
        if name in _IDENTITY:
            return es[0]
        raise Unliftable(f"primitive {name!r} in the loop backend")

    def _integer_pow(self, x: Code, dt: np.dtype, y: int) -> Code:
        """``x ** y`` by repeated squaring, in the order of jax's lowering."""
        if dt.kind == "b":
            raise Unliftable("integer_pow on bool")
        if y == 0:
            return self.constant(np.ones((), dt), ())
        recip, y = y < 0, abs(y)
        acc: Code | None = None
        base = Code(cast(x, dt), dt)
        while y > 0:
            if y & 1:
                acc = base if acc is None else self._new(_mul(acc.expr, base.expr, dt), dt)
            y >>= 1
            if y > 0:
                base = self._new(_mul(base.expr, base.expr, dt), dt)
        assert acc is not None
        if recip:
            if dt.kind != "f":
                raise Unliftable("negative integer_pow on ints")
            return self._new(f"{self.constant(np.ones((), dt), ()).expr} / {acc.expr}", dt)
        if dt.kind in "iu" and (x.square or acc.expr != x.expr):
            return Code(acc.expr, dt, square=True)  # x ** 2 is x * x (see abs)
        return acc


def _mul(a: str, b: str, dt: np.dtype) -> str:
    return f"{a} * {b}" if dt.kind == "f" else _int_arith(a, "*", b, dt)


def _int_arith(a: str, op: str, b: str, dt: np.dtype) -> str:
    """``a op b`` (``+``, ``-``, ``*``) in the integer ``dt``, wrapping as
    XLA does.  numba computes narrower integers in 64 bits, where they
    cannot overflow, and casts back (which wraps); but its signed 64-bit
    arithmetic is LLVM's ``nsw`` (overflow is undefined), so LLVM folds
    ``x + 1 > x`` to ``True`` and drops the sign of a wrapped ``abs``: int64
    is computed in uint64, which wraps, and cast back."""
    if dt == np.int64:
        return f"np.int64(np.uint64({a}) {op} np.uint64({b}))"
    return f"np.{dt.name}({a} {op} {b})"


def _bool_arith(name: str, a: str, b: str) -> str:
    if name == "add":
        return f"({a} or {b})"
    if name == "mul":
        return f"({a} and {b})"
    raise Unliftable(f"{name} on bool")
