"""The kernel walker behind the compile cache's keys (:mod:`.kcache`).

:class:`Walk` visits a kernel, the values it closes over, its defaults, the
globals its code names and the plain functions among those, recursively, and
splits what it finds into a hashable key and the arrays that become dynamic
inputs (the rules are in :mod:`.kcache`'s docstring).  :func:`freeze` is the
exact, hashable stand-in for an option value; :class:`Identity` keys an
object by identity while keeping it alive.
"""

from __future__ import annotations

import array
import collections
import copy
import enum
import functools
import hashlib
import sys
import threading
import types
import warnings
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from xstencil._engine.call import native
from xstencil._errors import CompileWarning

__all__ = ["freeze", "Identity", "Opaque", "Walk", "code_names", "read_names", "is_library",
           "is_array", "instance_key", "uncached", "BUDGET", "SINKS", "LOCK", "VALUE_KEYS",
           "digest"]

#: Lists and dicts a trace wrote to, by id: keyed by identity from then on
#: (:func:`xstencil._engine.kcache.settle` adds them, under :data:`LOCK`).
SINKS: OrderedDict[int, tuple[Any]] = OrderedDict()
LOCK = threading.Lock()

_SCALARS = (bool, int, str, bytes, type(None), type(Ellipsis))
_SEQUENCES = (collections.deque, array.array, bytearray, set, frozenset)
_LIBRARIES = frozenset({"numpy", "jax", "jaxlib", "scipy", "xarray", "xstencil", "pandas",
                        "dask", "equinox", "optax", "builtins"}) | frozenset(
    getattr(sys, "stdlib_module_names", ()))
BUDGET = 2000  # values visited per kernel before it is keyed as uncached (see uncached)
#: Keyers for library containers that can change in place (a DataArray, a
#: pandas Series): each takes a value and returns a hashable key of its whole
#: content, or ``None`` for a value it does not know (or cannot read: a
#: tracer).  The layer that knows a type registers its keyer at import (the
#: engine never imports xarray).  Such values stay in the kernel as they are,
#: baked into the compiled code, so a key by content is what makes reuse safe.
VALUE_KEYS: list[Any] = []
_ATOMS = frozenset({type(None), str, int, bool})  # keyed as they are by freeze()
_LRU = functools._lru_cache_wrapper  # functools.lru_cache and functools.cache


def freeze_each(values: Sequence[Any]) -> tuple[Hashable, ...]:
    """``freeze`` of each of ``values`` (a call's options), the atoms (None,
    names, counts, flags: most of them) without a call each; a repeated
    call's signature computes it on every call."""
    return tuple([(type(v), v) if type(v) in _ATOMS else freeze(v) for v in values])


def freeze(x: Any) -> Hashable:
    """A hashable, exact stand-in for an option value in a cache key:
    mappings and sequences by content, arrays by bytes, numpy scalars with
    their dtype (``timedelta64(5, 'ns')`` is not ``(5, 'ps')``), floats
    exactly (``-0.0`` is not ``0.0``; NaN equals itself)."""
    t = type(x)
    if t in _ATOMS:  # the common options (None, names, counts, flags), first
        return (t, x)
    if t is float:
        return (t, x.hex())
    if t is tuple:
        return ("tuple",) + tuple([freeze(v) for v in x])
    if isinstance(x, Mapping):
        return ("<map>",) + tuple((k, freeze(v)) for k, v in x.items())
    if isinstance(x, list | tuple):
        return (type(x).__name__,) + tuple(freeze(v) for v in x)
    if isinstance(x, np.ndarray):
        return ("<array>", x.dtype.str, x.shape, x.tobytes())
    if isinstance(x, np.generic):
        return (type(x), x.dtype.str, freeze(x.item()))
    if isinstance(x, float):
        return (type(x), x.hex())
    if isinstance(x, complex):
        return (type(x), x.real.hex(), x.imag.hex())
    return (type(x), x)

class Identity:
    """Compares by identity and keeps its object alive (so no id is reused)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return type(other) is Identity and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __repr__(self) -> str:
        return f"<id {type(self.obj).__name__} {id(self.obj):#x}>"


class Opaque(Exception):
    """Something the kernel reads cannot be keyed by value."""


@functools.lru_cache(maxsize=1024)
def code_names(code: types.CodeType) -> tuple[str, ...]:
    """Global (and attribute) names read by ``code`` and the code nested in it."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out.update(code_names(c))
    return tuple(sorted(out))


@functools.lru_cache(maxsize=1024)
def read_names(code: types.CodeType) -> frozenset[str]:
    """:func:`code_names` and the identifier-like string constants of
    ``code`` and the code nested in it (``getattr(o, "alpha")``): the
    attributes ``code`` may read of an object it is given."""
    out = set(code_names(code))
    for c in code.co_consts:
        if type(c) is str and c.isidentifier():
            out.add(c)
        elif isinstance(c, types.CodeType):
            out |= read_names(c)
    return frozenset(out)


@functools.lru_cache(maxsize=4096)
def is_library(module: str | None) -> bool:
    return module is not None and module.partition(".")[0] in _LIBRARIES


def is_array(v: Any) -> bool:
    if isinstance(v, jax.Array):
        return True
    # a masked array is not a JAX input: keyed by content instead (``Walk.value``)
    return isinstance(v, np.ndarray) and v.dtype.kind in "biufc" \
        and not isinstance(v, np.ma.MaskedArray)


def digest(a: np.ndarray) -> Hashable:
    """An array by content: shape, dtype and a digest of its bytes (of the
    ``repr`` of its items for object arrays), the same in every process."""
    a = np.asarray(a)
    if a.dtype.kind == "O":  # objects: arrays among them by content, not by repr
        return (a.shape, "O", tuple(digest(x) if isinstance(x, np.ndarray) else
                                    ("v", repr(x)) for x in a.ravel()))
    raw = a.tobytes()
    return (a.shape, str(a.dtype), hashlib.blake2b(raw, digest_size=16).hexdigest())


def _float(v: float) -> Hashable:
    return v.hex()  # exact: keeps -0.0 apart from 0.0, and NaN equal to itself


class Walk:
    """One walk over a kernel: the key, the leaves in visit order, and (with
    ``subst``) a copy of each value with the leaves replaced."""

    def __init__(self, subst: Iterator[Any] | None = None):
        self.leaves: list[Any] = []
        self.subst = subst
        self.seen: dict[int, int] = {}
        self.made: dict[int, Any] = {}  # id of a function -> its copy (with subst)
        self.budget = BUDGET
        self.opaque = False
        # > 0 while walking what the kernel reaches through an attribute or a bound
        # method: its copy is not what the kernel calls, so arrays there are keyed
        # by identity and content rather than lifted (a lifted one would be baked in)
        self.fixed = 0
        self.containers: list[tuple[Any, tuple[Any, ...]]] = []  # lists/dicts, their items
        # every name the code walked reads (attributes, globals, identifier-like
        # strings), and each object walked with the names its attributes were read for
        self.names: set[str] = set()
        self.objs: list[tuple[Any, set[str]]] = []

    def value(self, v: Any, names: tuple[str, ...], lift: bool = True) -> tuple[Hashable, Any]:
        self.budget -= 1
        if self.budget < 0:
            raise Opaque
        if isinstance(v, _SCALARS):
            return self.attrs((type(v), v), v, names), v
        if isinstance(v, float):
            return self.attrs((type(v), _float(v)), v, names), v
        if isinstance(v, complex):
            return self.attrs((type(v), _float(v.real), _float(v.imag)), v, names), v
        if isinstance(v, np.generic) and v.dtype.kind in "biufc":
            return (type(v), self.value(v.item(), names)[0]), v
        if is_array(v):
            if lift and not self.fixed:
                # in native byte order (weights read from a file may be '>f4'),
                # keyed by the array's own dtype
                self.leaves.append(native(v))
                new = next(self.subst) if self.subst is not None else v
                return ("leaf", tuple(np.shape(v)), str(v.dtype)), new
            if isinstance(v, np.ndarray):  # read through an attribute: by content
                # a digest, not hash(): the same in every process (a stored fingerprint)
                return ("array", Identity(v), digest(v)), v
            return ("array", Identity(v)), v
        if isinstance(v, np.ma.MaskedArray):
            return ("masked", digest(v.data), digest(np.ma.getmaskarray(v)),
                    repr(v.fill_value)), v
        if isinstance(v, np.ndarray):  # datetimes, strings, objects: not JAX inputs
            return ("ndarray", digest(v)), v
        if type(v) in (tuple, list) and _table_size(v) > _MANY:
            return self.numbers(v), v  # a table of numbers: one value, not one per item
        if isinstance(v, tuple):  # a NamedTuple too: by its items and its type
            return self.tup(v, names, lift)
        if type(v) in (list, dict) or isinstance(v, list | dict) and is_library(
                type(v).__module__):  # OrderedDict, defaultdict, Counter too
            return self.mutable(v, names, lift)
        if isinstance(v, _SEQUENCES):  # changes in place: by content
            items = sorted(v, key=repr) if isinstance(v, set | frozenset) else tuple(v)
            return (type(v).__name__, self.value(tuple(items), names, lift=False)[0]), v
        if type(v) is types.FunctionType:
            if is_library(v.__module__):
                return ("id", Identity(v)), v
            return self.function(v)
        if isinstance(v, types.MethodType):
            self.fixed += 1
            try:
                fk, _ = self.value(v.__func__, names, lift=False)
                return ("method", fk, self.obj(v.__self__, names)), v
            finally:
                self.fixed -= 1
        if isinstance(v, functools.partial):  # by what it carries: keywords change in place
            self.fixed += 1
            try:
                fn = v.func
                own = code_names(fn.__code__) if type(fn) is types.FunctionType else ()
                return ("partial", self.value(fn, names, lift=False)[0],
                        self.value(v.args, own, lift=False)[0],
                        self.value(dict(v.keywords), own, lift=False)[0]), v
            finally:
                self.fixed -= 1
        for keyer in VALUE_KEYS:
            k = keyer(v)
            if k is not None:
                return ("content", type(v).__module__, type(v).__qualname__, k), v
        if isinstance(v, range):  # range(0) == range(3, 3): by what it is made of
            return ("range", v.start, v.stop, v.step), v
        if _by_items(v):  # ChainMap, UserDict, UserList, MappingProxyType: by content
            return self.items(v, names), v
        return self.obj(v, names), v

    def numbers(self, v: tuple[Any, ...] | list[Any]) -> Hashable:
        """A plain tuple or list of Python numbers (a table of coefficients) by
        a digest of its exact values (``repr`` tells -0.0 from 0.0 and True
        from 1), at the cost of one value of the walk's budget: read item by
        item, a table of 500 went past :data:`BUDGET` and made the kernel
        compile on every call.  A list a trace wrote to stays a sink."""
        if type(v) is list:
            if SINKS.get(id(v), (None,))[0] is v:
                return self.mutable(v, (), False)[0]
            self.containers.append((v, tuple(enumerate(v))))
        for x in v:  # inner lists: a trace writing to one is a counter too
            if type(x) is list and SINKS.get(id(x), (None,))[0] is x:
                return self.tup(tuple(v), (), False)[0]
        text = repr(tuple(v)).encode()
        return ("numbers", type(v).__qualname__, len(v),
                hashlib.blake2b(text, digest_size=16).hexdigest())

    def tup(self, v: tuple[Any, ...], names: tuple[str, ...],
              lift: bool) -> tuple[Hashable, Any]:
        """A tuple by its items; a subclass (a NamedTuple) with its type, its
        arrays lifted only where it can be rebuilt (``_make``)."""
        t = type(v)
        sub = t is not tuple
        if sub and len(getattr(t, "_fields", ())) != len(v):  # not a NamedTuple's own _make
            lift = False
        before = len(self.leaves)
        parts = [self.value(x, names, lift) for x in v]
        key = ("tuple", tuple(p[0] for p in parts))
        if sub:
            key = self.attrs(key + (t,), v, names)
        if self.subst is None or len(self.leaves) == before:
            return key, v
        items = [p[1] for p in parts]
        return key, (t._make(items) if sub else tuple(items))  # type: ignore[attr-defined]

    def attrs(self, key: Hashable, v: Any, names: tuple[str, ...]) -> Hashable:
        """``key``, and for an instance of a subclass of a builtin value type
        (``class Cint(int)``) with an instance dict, that dict's items by value."""
        d = getattr(v, "__dict__", None)
        if not d or type(v) in _ATOMS or isinstance(v, enum.Enum) or not isinstance(d, dict):
            return key
        self.fixed += 1
        try:
            return (key, "dict", self.value(dict(d), names, lift=False)[0])
        finally:
            self.fixed -= 1

    def items(self, v: Any, names: tuple[str, ...]) -> Hashable:
        """A mapping or sequence that is not a list or dict (ChainMap,
        UserDict, MappingProxyType, UserList) by its items, arrays by
        content; a user subclass also by identity and its attributes."""
        pairs = list(v.items()) if isinstance(v, Mapping) else list(enumerate(v))
        self.fixed += 1
        try:
            parts = tuple((self.value(k, ())[0], self.value(x, names, lift=False)[0])
                          for k, x in pairs)
        finally:
            self.fixed -= 1
        mine = None if is_library(type(v).__module__) else self.obj(v, names)
        return ("items", type(v), parts, mine)

    def mutable(self, v: list[Any] | dict[Any, Any], names: tuple[str, ...],
                lift: bool) -> tuple[Hashable, Any]:
        """A list or dict: keyed by its contents, like a tuple, unless a trace
        wrote to it (a trace counter, see :func:`settle`): such a *sink* is
        keyed by identity.  Arrays in it are dynamic inputs either way."""
        sink = SINKS.get(id(v), (None,))[0] is v
        items = list(v.items()) if isinstance(v, dict) else list(enumerate(v))
        if sink:
            items = [(k, x) for k, x in items if is_array(x) and lift]
        before = len(self.leaves)
        parts = [(k, self.value(k, ())[0], self.value(x, names, lift)) for k, x in items]
        key = (type(v).__qualname__, Identity(v) if sink else None,
               tuple((kk, p[0]) for _, kk, p in parts))
        if not sink:
            self.containers.append((v, tuple(items)))
        if self.subst is None or len(self.leaves) == before:
            return key, v
        new = copy.copy(v)  # keeps a defaultdict's factory
        for k, _, p in parts:
            new[k] = p[1]
        return key, new

    def obj(self, v: Any, names: tuple[str, ...]) -> Hashable:
        """Identity, plus the attributes named in the code, for anything else."""
        mod = v.__name__ if isinstance(v, types.ModuleType) else getattr(
            v if isinstance(v, type) else type(v), "__module__", None)
        if isinstance(v, _LRU) and type(v.__wrapped__) is types.FunctionType:
            # a functools.lru_cache helper: by what the function it wraps reads
            # (what its cache returns is Python's to say: an array it holds is
            # the array itself, read afresh, changed in place or not)
            self.fixed += 1
            try:
                return ("lru", Identity(v), self.value(v.__wrapped__, names, lift=False)[0])
            finally:
                self.fixed -= 1
        if callable(v) and not isinstance(v, type) and is_library(mod) or \
                isinstance(v, types.BuiltinFunctionType):
            return ("id", Identity(v))
        if isinstance(v, types.ModuleType | type) and is_library(mod):
            return ("id", Identity(v))
        if is_library(mod) and not isinstance(getattr(v, "__dict__", None), dict):
            # a library object without an instance dict: by value where it hashes by value
            try:
                hash(v)
            except TypeError:
                self.opaque = True
                return ("opaque", Identity(v))
            if type(v).__hash__ is object.__hash__:
                self.opaque = True
                return ("opaque", Identity(v))
            # and by repr: equal is not the same (aware datetimes of one instant
            # in two time zones, a datetime's fold, Decimal("1.0") and ("1.00"))
            return ("value", type(v), v, repr(v))
        if id(v) in self.seen:
            return ("cycle", self.seen[id(v)])
        self.seen[id(v)] = len(self.seen)
        # the attributes its own methods read too: ``lambda u: model.step(u)``
        # reads ``model.c`` inside ``step``, a name the lambda's code lacks
        own = set(names) | _method_names(v if isinstance(v, type) else type(v))
        names = tuple(sorted(own))
        self.names.update(own)
        self.objs.append((v, own))
        return ("obj", Identity(v), self.read(v, names, names))

    def read(self, v: Any, which: Any, names: tuple[str, ...]) -> tuple[Hashable, ...]:
        """The attributes ``which`` of ``v`` that are there, by value (no
        descriptor runs; one that cannot be seen makes the kernel opaque)."""
        attrs = []
        self.fixed += 1
        try:
            for n in which:
                found, a = _static_attr(v, n)
                if found is None:
                    self.opaque = True
                elif found:
                    attrs.append((n, self.value(a, names, lift=False)[0]))
        finally:
            self.fixed -= 1
        return tuple(attrs)

    def late(self, key: Hashable) -> Hashable:
        """``key``, with the attributes of the objects walked that code walked
        elsewhere names (``get_alpha(p)`` reads ``p.alpha`` inside the helper,
        a name the kernel's code lacks; ``getattr(p, "alpha")``; a name read
        by another object's method), until no walked object misses one."""
        tail = []
        grown = True
        while grown:
            grown = False
            for i, (v, own) in enumerate(list(self.objs)):
                missing = self.names - own
                if not missing:
                    continue
                grown = True
                own |= missing
                got = self.read(v, sorted(missing), tuple(sorted(self.names)))
                if got:
                    tail.append((i, got))
        return (key, ("late", tuple(tail))) if tail else key

    def own(self, fn: types.FunctionType, names: tuple[str, ...]) -> Hashable:
        """The function's own attributes (``k.alpha = 2``, read as ``k.alpha``
        by its code), by value: two kernels of one code with different ones
        must not share compiled code.  Arrays there are keyed by content (the
        rebuilt copy keeps the attributes: it reads them, not lifted leaves)."""
        self.fixed += 1
        try:
            return ("attrs", self.value(tuple(sorted(
                (n, v) for n, v in fn.__dict__.items() if n != "__wrapped__")), names,
                lift=False)[0])
        finally:
            self.fixed -= 1

    def function(self, fn: types.FunctionType) -> tuple[Hashable, Any]:
        if id(fn) in self.seen:
            return ("cycle", self.seen[id(fn)]), self.made.get(id(fn), fn)
        self.seen[id(fn)] = len(self.seen)
        code = fn.__code__
        names = code_names(code)
        self.names |= read_names(code)
        g = fn.__globals__
        try:
            cells = [c.cell_contents for c in fn.__closure__ or ()]
        except ValueError:  # an empty cell (a name assigned later)
            raise Opaque from None
        before = len(self.leaves)
        dk, dv = self.value(fn.__defaults__, names)
        kk, kv = self.value(fn.__kwdefaults__, names)
        ck = [self.value(c, names) for c in cells]
        gk = [(n, self.value(g[n], names)) for n in names if n in g]
        key = ("fn", code, Identity(g), dk, kk, tuple(k for k, _ in ck),
               tuple((n, k) for n, (k, _) in gk))
        if fn.__dict__:
            key += (self.own(fn, names),)
        if self.subst is None or len(self.leaves) == before:
            return key, fn
        changed = [(n, v) for n, (_, v) in gk if v is not g[n]]
        glob = g
        if changed:
            glob = dict(g)
            glob.update(changed)
        closure = tuple(types.CellType(v) for _, v in ck) if ck else None
        new = types.FunctionType(code, glob, fn.__name__, dv, closure)
        new.__kwdefaults__ = kv
        new.__qualname__ = fn.__qualname__
        new.__dict__.update(fn.__dict__)
        self.made[id(fn)] = new
        return key, new


#: Plain tuples and lists of more than this many Python numbers (nested ones
#: counted through) are keyed as one value (:meth:`Walk.numbers`).
_MANY = 16


def _table_size(v: tuple[Any, ...] | list[Any]) -> int:
    """How many Python numbers ``v`` holds, counting through plain tuples and
    lists (a nested table such as ``w.tolist()`` of a 2-D array); -1 where it
    holds anything else."""
    n = 0
    for x in v:
        m = 1 if type(x) in (int, float, bool) else \
            _table_size(x) if type(x) in (tuple, list) else -1
        if m < 0:
            return -1
        n += m
    return n


def _by_items(v: Any) -> bool:
    """Whether ``v`` is a mapping or sequence keyed by its items: a library's
    (ChainMap, MappingProxyType) or a UserDict, UserList, ChainMap subclass."""
    if isinstance(v, collections.UserDict | collections.UserList | collections.ChainMap):
        return True
    return isinstance(v, Mapping) and is_library(type(v).__module__)


def _functions(a: Any) -> tuple[types.FunctionType, ...]:
    """The plain functions behind a class attribute: itself, a static or class
    method's, a property's getter, setter and deleter, a cached property's."""
    if isinstance(a, staticmethod | classmethod):
        a = a.__func__
    if isinstance(a, property):
        fns: tuple[Any, ...] = (a.fget, a.fset, a.fdel)
    elif isinstance(a, functools.cached_property):
        fns = (a.func,)
    else:
        fns = (a,)
    return tuple(f for f in fns if type(f) is types.FunctionType)


def _class_names(klass: type) -> frozenset[str]:
    return frozenset(n for a in list(klass.__dict__.values()) for f in _functions(a)
                     for n in code_names(f.__code__))


def _method_names(klass: type) -> set[str]:
    """The names read by the plain functions of a user class and its bases
    (methods, static and class methods, properties' functions)."""
    return {n for c in klass.__mro__ if not is_library(c.__module__)
            for n in _class_names(c)}


def _static_attr(v: Any, name: str) -> tuple[bool | None, Any]:
    """``v.name`` where it is stored plainly (no descriptor runs): ``(True,
    value)``, ``(False, None)`` when absent, ``(None, None)`` when it cannot be
    seen (a library's descriptor or a computed attribute: the kernel is then
    opaque).  A user property stands for its functions, walked like methods."""
    d = getattr(v, "__dict__", None)
    if not isinstance(v, type) and isinstance(d, dict) and name in d:
        return True, d[name]
    for klass in (v.__mro__ if isinstance(v, type) else type(v).__mro__):
        if name in klass.__dict__:
            a = klass.__dict__[name]
            if isinstance(a, staticmethod | classmethod):
                return True, a.__func__
            if isinstance(a, types.MemberDescriptorType) and not isinstance(v, type):
                try:
                    return True, a.__get__(v, type(v))
                except AttributeError:
                    return False, None
            fns = _functions(a) if isinstance(a, property | functools.cached_property) else ()
            if fns and not any(is_library(f.__module__) for f in fns):
                # keyed by what its functions read (their names are in _method_names)
                return True, ("descriptor", type(a), fns)
            if hasattr(type(a), "__get__") and not isinstance(a, types.FunctionType) \
                    and not isinstance(a, type):
                return None, None
            return True, a
    if isinstance(v, types.ModuleType) and isinstance(d, dict):
        return False, None
    if hasattr(type(v), "__getattr__"):
        return None, None
    return False, None


def uncached(k: Any) -> Hashable:
    """The key of a kernel whose walk failed (it grew past :data:`BUDGET`,
    recursed too deep, met an empty cell): what it reads was not all seen,
    so no call may reuse another's code.  The key is the kernel's and a
    marker new on every call: each call traces afresh (slower, never stale),
    which a :class:`~xstencil.CompileWarning` says once per kernel's code."""
    code = getattr(getattr(k, "__func__", k), "__code__", type(k))  # an instance: its class
    with LOCK:
        first = code not in _WARNED
        if len(_WARNED) < 1024:
            _WARNED.add(code)
    if first:
        name = getattr(k, "__qualname__", type(k).__name__)
        warnings.warn(
            f"kernel {name!r} reads more values than the compile cache keys ({BUDGET}, or "
            f"nested too deep), so it is compiled again on every call; put large tables in "
            f"a numpy array (closed over, or passed as an argument)", CompileWarning,
            stacklevel=2)
    return ("callable", Identity(k), ("uncached", Identity(object())))


#: Code of kernels already warned about (:func:`uncached`).
_WARNED: set[Any] = set()


def instance_key(w: Walk, k: Any) -> Hashable:
    """The key of a callable that is not a plain function: by identity, and,
    for an instance of a user class, the attributes its methods name, by value
    (so ``k.nu = 0.1`` after a call is seen).  Nothing is lifted: the kernel
    called is ``k`` itself."""
    if isinstance(k, types.MethodType | functools.partial):
        return _wrapped(w, k)
    klass = type(k)
    call = next((c.__dict__["__call__"] for c in klass.__mro__ if "__call__" in c.__dict__),
                None)
    if type(call) is not types.FunctionType or is_library(klass.__module__):
        return ("callable", Identity(k))
    names = sorted({n for c in klass.__mro__ if not is_library(c.__module__)
                    for f in c.__dict__.values() if type(f) is types.FunctionType
                    for n in code_names(f.__code__)})
    w.opaque = False
    w.budget = BUDGET
    try:
        key = w.late(w.value(types.MethodType(call, k), tuple(names), lift=False)[0])
    except (Opaque, TypeError, RecursionError):
        return uncached(k)
    return ("callable", Identity(k), key)


def _wrapped(w: Walk, k: types.MethodType | functools.partial) -> Hashable:
    """The key of a bound method (``model.step``) or a ``functools.partial``:
    by identity, and by the values they carry (the instance's attributes
    that the method's code names, the partial's function and arguments),
    arrays by content.  The same object called again after ``model.c[0] = 3``
    or ``params["nu"] = 0.3`` must not reuse code traced with the old value."""
    fn = k.__func__ if isinstance(k, types.MethodType) else k.func
    names = code_names(fn.__code__) if type(fn) is types.FunctionType else ()
    w.opaque = False
    w.budget = BUDGET
    w.fixed += 1
    try:
        if isinstance(k, types.MethodType):
            key = w.value(k, names, lift=False)[0]
        else:
            key = ("partial", w.value(fn, names, lift=False)[0],
                   w.value(k.args, names, lift=False)[0],
                   w.value(dict(k.keywords), names, lift=False)[0])
        key = w.late(key)
    except (Opaque, TypeError, RecursionError):
        return uncached(k)
    finally:
        w.fixed -= 1
    return ("callable", _who(k), key)


def _who(k: types.MethodType | functools.partial) -> Hashable:
    """Whose code a bound method or a partial is: a bound method by its
    function and its object (``m.k`` is a new object at each access: keyed by
    identity, an inline ``map(m.k)`` compiled on every call); an exact
    ``functools.partial`` by its function (its arguments are in the key by
    value, arrays and objects by identity); a subclass by identity."""
    if isinstance(k, types.MethodType):
        return ("bound", Identity(k.__func__), Identity(k.__self__))
    if type(k) is functools.partial:
        return ("partial", Identity(k.func))
    return Identity(k)
