"""Window operations that :mod:`xstencil._engine.lift` unrolls into
elementwise ones: reductions (a balanced tree), cumulative ops, ``dot_general``,
``argmax``/``argmin`` and ``sort`` (Batcher's odd-even merge network, so that
``jnp.median`` stays on the fast path).  Each counts its element operations
against :data:`~xstencil._engine.elements.MAX_ELEMENT_OPS`."""

from __future__ import annotations

from typing import Any

import numpy as np
from jax import lax

from xstencil._engine.elements import Lifted, Table, ids_of

__all__ = ["combine", "reduce", "cumulative", "dot_general", "argminmax", "sort"]


def _identity(prim: Any, dtype: Any) -> np.ndarray:
    """What a reduction over nothing gives (``x[1:1].sum()`` is 0, ``.prod()``
    1, ``max`` the lowest value), as numpy and JAX give it."""
    dt = np.dtype(dtype)
    if prim in (lax.max_p, lax.min_p):
        low = prim is lax.max_p
        if dt.kind == "f":
            return np.asarray(-np.inf if low else np.inf, dt)
        if dt.kind == "b":
            return np.asarray(not low, dt)
        info = np.iinfo(dt)
        return np.asarray(info.min if low else info.max, dt)
    if prim is lax.mul_p:
        return np.asarray(1, dt)
    if prim is lax.and_p:
        return np.asarray(True if dt.kind == "b" else -1, dt)
    return np.asarray(0, dt)  # add, or, xor


def combine(prim: Any, elems: list[Any], dtype: Any, table: Table) -> Any:
    """Balanced tree of a binary associative primitive."""
    if not elems:  # an empty slice of the window
        return _identity(prim, dtype)
    table.count_op(max(len(elems) - 1, 0))
    while len(elems) > 1:
        nxt = [table.algebra.apply(prim, [elems[i], elems[i + 1]], {}, [dtype, dtype])
               for i in range(0, len(elems) - 1, 2)]
        if len(elems) % 2:
            nxt.append(elems[-1])
        elems = nxt
    return elems[0]


def reduce(prim: Any, eqn: Any, x: Lifted, table: Table) -> Lifted:
    axes = tuple(eqn.params["axes"])
    dtype = eqn.outvars[0].aval.dtype
    keep = [d for d in range(x.ids.ndim) if d not in axes]
    moved = np.transpose(x.ids, keep + list(axes))
    out_shape = moved.shape[: len(keep)]
    flat = moved.reshape(out_shape + (-1,))
    ids = np.empty(out_shape, dtype=np.int64)
    for idx in np.ndindex(*out_shape):
        elems = [table.get(int(i)) for i in flat[idx]]
        ids[idx] = table.add(combine(prim, elems, dtype, table))
    return Lifted(ids, dtype)


def cumulative(prim: Any, eqn: Any, x: Lifted, table: Table) -> Lifted:
    axis, reverse = eqn.params["axis"], eqn.params["reverse"]
    dtype = eqn.outvars[0].aval.dtype
    moved = np.moveaxis(x.ids, axis, -1)
    out = np.empty_like(moved)
    table.count_op(moved.size)
    for idx in np.ndindex(*moved.shape[:-1]):
        line = list(moved[idx])
        order = range(len(line) - 1, -1, -1) if reverse else range(len(line))
        acc = None
        for k in order:
            e = table.get(int(line[k]))
            acc = e if acc is None else table.algebra.apply(prim, [acc, e], {}, [dtype, dtype])
            out[idx + (k,)] = table.add(acc)
    return Lifted(np.moveaxis(out, -1, axis), dtype)


def dot_general(eqn: Any, invals: list[Any], table: Table) -> Lifted:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    dtype = eqn.outvars[0].aval.dtype
    lhs, rhs = (ids_of(x, table) for x in invals)
    lf = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    rf = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
    lhs = np.transpose(lhs, list(lb) + lf + list(lc))
    rhs = np.transpose(rhs, list(rb) + rf + list(rc))
    nb, nlf, nrf = len(lb), len(lf), len(rf)
    out_shape = lhs.shape[: nb + nlf] + rhs.shape[nb: nb + nrf]
    csize = int(np.prod(lhs.shape[nb + nlf:], dtype=np.int64))
    lhs = lhs.reshape(lhs.shape[: nb + nlf] + (csize,))
    rhs = rhs.reshape(rhs.shape[: nb + nrf] + (csize,))
    mul = lax.mul_p
    ids = np.empty(out_shape, dtype=np.int64)
    table.count_op(int(np.prod(out_shape, dtype=np.int64)) * max(csize, 1))
    for idx in np.ndindex(*out_shape):
        b, li, ri = idx[:nb], idx[nb: nb + nlf], idx[nb + nlf:]
        terms = [
            table.algebra.apply(mul, [table.get(int(lhs[b + li + (k,)])),
                                      table.get(int(rhs[b + ri + (k,)]))], {}, [dtype, dtype])
            for k in range(csize)
        ]
        if not terms:
            terms = [table.algebra.constant(np.zeros((), dtype), ())]
        ids[idx] = table.add(combine(lax.add_p, terms, dtype, table))
    return Lifted(ids, dtype)


def argminmax(name: str, eqn: Any, x: Lifted, table: Table) -> Lifted:
    (axis,) = eqn.params["axes"]
    index_dtype = eqn.params["index_dtype"]
    vdt = x.dtype
    moved = np.moveaxis(x.ids, axis, -1)
    ids = np.empty(moved.shape[:-1], dtype=np.int64)
    better = lax.gt_p if name == "argmax" else lax.lt_p
    alg = table.algebra
    table.count_op(moved.size * 6)
    floating = np.issubdtype(np.dtype(vdt), np.inexact)
    for idx in np.ndindex(*moved.shape[:-1]):
        line = [table.get(int(i)) for i in moved[idx]]
        best, best_i = line[0], np.zeros((), index_dtype)
        for k, v in enumerate(line[1:], start=1):
            take = alg.apply(better, [v, best], {}, [vdt, vdt])
            if floating:  # the first NaN wins, as in lax.argmax
                v_nan = alg.apply(lax.ne_p, [v, v], {}, [vdt, vdt])
                b_ok = alg.apply(lax.eq_p, [best, best], {}, [vdt, vdt])
                take = alg.apply(lax.or_p, [take, alg.apply(lax.and_p, [v_nan, b_ok], {},
                                                            [np.bool_, np.bool_])],
                                 {}, [np.bool_, np.bool_])
            best = alg.apply(lax.select_n_p, [take, best, v], {}, [np.bool_, vdt, vdt])
            best_i = alg.apply(lax.select_n_p, [take, best_i, np.asarray(k, index_dtype)], {},
                               [np.bool_, index_dtype, index_dtype])
        ids[idx] = table.add(best_i)
    return Lifted(ids, index_dtype)


def merge_network(n: int) -> list[tuple[int, int]]:
    """Batcher's odd-even merge sort comparators for ``n`` items."""
    pairs: list[tuple[int, int]] = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return pairs


def sort(eqn: Any, invals: list[Any], table: Table) -> list[Lifted]:
    """``lax.sort`` over a few window values as a comparator network, in
    ``lax.sort``'s order: floats by the total order of its comparator
    (-0.0 equals 0.0, every NaN equal and after +inf), and ties kept in
    their first order (a stable sort) where a tie can show in the result.
    Batcher's network is not stable, so where the sort carries operands that
    are not keys (an argsort's indices) the original position is the last
    key: every item is then distinct, and the network gives the one stable
    order.  A sort of one float key alone (``jnp.sort``, a median) runs the
    network on the values with each NaN read as +inf, then writes NaN into
    as many of the last places as there were NaNs: a few operations per
    value rather than per comparator, which keeps a 3 x 3 median filter a
    short loop nest (1.1 ms at 1024², as before; the total order with the
    position as a key made it 29 ms).  The NaNs are counted in int32, exact
    for any window (a float16 or bfloat16 count would round past 2048 or
    256 values).  Its only ties that differ in their bits are a -0.0
    and a 0.0, which may then come out in either order."""
    dim = eqn.params["dimension"]
    num_keys = eqn.params["num_keys"]
    dtypes = [v.aval.dtype for v in eqn.outvars]
    grids = [np.moveaxis(ids_of(x, table), dim, -1) for x in invals]
    outs = [np.empty_like(g) for g in grids]
    alg = table.algebra
    n = grids[0].shape[-1]
    floats = [np.issubdtype(np.dtype(dtypes[k]), np.inexact) for k in range(num_keys)]
    ranked = len(grids) > num_keys
    alone = len(grids) == 1 and num_keys == 1  # values only (jnp.sort, a median)
    keys = list(range(num_keys)) + ([len(grids)] if ranked else [])
    kdt = dtypes + [np.dtype(np.int32)]
    network = merge_network(n)
    table.count_op(grids[0].size // max(n, 1) * len(network)
                   * (2 * (len(grids) + ranked) + 6 * len(keys)))

    def nan(x: Any, dt: Any) -> Any:
        return alg.apply(lax.ne_p, [x, x], {}, [dt, dt])

    def both(p: Any, q: Any) -> Any:
        return alg.apply(lax.and_p, [p, q], {}, [bool, bool])

    def either(p: Any, q: Any) -> Any:
        return alg.apply(lax.or_p, [p, q], {}, [bool, bool])

    def less(x: Any, y: Any, dt: Any, total: bool) -> Any:
        """``x < y`` (in the total order of floats where ``total``)."""
        lt = alg.apply(lax.lt_p, [x, y], {}, [dt, dt])
        if not total:
            return lt
        return either(lt, both(nan(y, dt), alg.apply(lax.not_p, [nan(x, dt)], {}, [bool])))

    def same(x: Any, y: Any, dt: Any, total: bool) -> Any:
        eq = alg.apply(lax.eq_p, [x, y], {}, [dt, dt])
        return either(eq, both(nan(x, dt), nan(y, dt))) if total else eq

    for idx in np.ndindex(*grids[0].shape[:-1]):
        cols = [[table.get(int(i)) for i in g[idx]] for g in grids]
        count = None  # a float key alone: how many of its values are NaN
        if alone and floats[0]:
            dt, i32 = kdt[0], np.dtype(np.int32)
            inf = alg.constant(np.asarray(np.inf, dt), ())
            one, zero = (alg.constant(np.asarray(v, i32), ()) for v in (1, 0))
            for i, x in enumerate(cols[0]):
                isnan = nan(x, dt)
                cols[0][i] = alg.apply(lax.select_n_p, [isnan, x, inf], {}, [bool, dt, dt])
                c = alg.apply(lax.select_n_p, [isnan, zero, one], {}, [bool, i32, i32])
                count = c if count is None else alg.apply(lax.add_p, [count, c], {}, [i32, i32])
        if ranked:
            cols.append([alg.constant(np.asarray(i, np.int32), ()) for i in range(n)])
        for a, b in network:
            if alone:  # b < a (NaN read as +inf above)
                swap = alg.apply(lax.lt_p, [cols[0][b], cols[0][a]], {}, [kdt[0], kdt[0]])
                ea, eb = cols[0][a], cols[0][b]
                cols[0][a] = alg.apply(lax.select_n_p, [swap, ea, eb], {}, [bool, kdt[0], kdt[0]])
                cols[0][b] = alg.apply(lax.select_n_p, [swap, eb, ea], {}, [bool, kdt[0], kdt[0]])
                continue
            # swap when (key_b, ...) < (key_a, ...), lexicographically on the keys
            swap, tie = None, None
            for j, k in enumerate(keys):
                total = k < num_keys and floats[k]
                lt = less(cols[k][b], cols[k][a], kdt[k], total)
                term = lt if tie is None else both(tie, lt)
                swap = term if swap is None else either(swap, term)
                if j + 1 < len(keys):
                    eq = same(cols[k][b], cols[k][a], kdt[k], total)
                    tie = eq if tie is None else both(tie, eq)
            for c, dt in zip(cols, kdt, strict=False):
                ea, eb = c[a], c[b]
                c[a] = alg.apply(lax.select_n_p, [swap, ea, eb], {}, [bool, dt, dt])
                c[b] = alg.apply(lax.select_n_p, [swap, eb, ea], {}, [bool, dt, dt])
        if count is not None:  # the last `count` places are the NaNs
            dt, i32 = kdt[0], np.dtype(np.int32)
            for j in range(n):
                tail = alg.apply(lax.ge_p, [count, alg.constant(np.asarray(n - j, i32), ())], {},
                                 [i32, i32])
                cols[0][j] = alg.apply(lax.select_n_p, [tail, cols[0][j],
                                                        alg.constant(np.asarray(np.nan, dt), ())],
                                       {}, [bool, dt, dt])
        for c, o in zip(cols, outs, strict=False):
            for k, e in enumerate(c):
                o[idx + (k,)] = table.add(e)
    return [Lifted(np.moveaxis(o, -1, dim), dt) for o, dt in zip(outs, dtypes, strict=True)]
