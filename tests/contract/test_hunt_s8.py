"""Silently wrong results found by changing something between two calls of
the compiled loops of ``iterate``, ``solve``, ``scan(step=...)``, sharded
maps and scans and the array API (``kmap``/``kscan``), and by handing
``iterate``/``solve`` a field in another dim order than their mesh's data
(session 8 hunt).  Every test compares against an independent reference: a
numpy loop or a dense numpy solve written here.

Before the fix, these loops were cached under the kernel's identity and the
shapes of the arrays it closes over, but traced with those arrays (and,
for ``scan(step=...)``, the state's coordinates and attrs) baked in as
constants: a second call after ``w[0] = 2.0``, after rebinding a global to a
new array of the same shape, after changing a global read by a mesh kernel
other than the first one, or on data with other coordinates or attrs
reran the first call's loop and returned the first call's numbers.

Tried and found correct (no test kept here; they pass):

* boundary modes on length 1, 2, 3 and 5 axes with offsets up to 5 (every
  mode against ``np.pad``; reflect on one point raises), for float64,
  float32, int32, uint8, bool, float16, complex64 and int8, loops and XLA;
* 2-D maps on C, Fortran, negative-stride, step-2, read-only and
  broadcast (zero-stride) numpy inputs, and transposed DataArrays, for
  eight dtypes and four modes, loops and XLA, against ``np.pad``;
* about 55 elementwise operations and window reductions (floor division,
  modulo, bitwise ops, shifts, casts, ``where``, ``clip``, NaN-propagating
  ``maximum``, ``argmax``, counts) on int8, int32, uint8, float32, float64
  and bool data: ``backend="loops"`` equals ``backend="xla"``;
* the map fast path with a coordinate read: coords reassigned, data
  changed in place; the scan fast path with a global scalar, a global
  array changed in place, transposed dims, the scanned dim in the middle,
  data changed in place, every ``save_every`` form;
* dask maps with chunks smaller than the halo and uneven chunks in six
  modes and three dtypes, and dask scans with ``halo_every`` from 1 to 12,
  against the in-memory result (too-small chunks raise);
* a Dataset map mixing float64, int16, float32 and bool variables with
  different dim orders, loops and XLA, and after an in-place change;
* staggered ``right`` and ``left`` grids in five modes, against hand
  indexing;
* ``solve`` by cg, bicgstab, gmres and multigrid on four grid shapes and
  seven boundary combinations against a dense ``numpy.linalg`` solve;
* mesh ``map`` and mesh ``scan`` after a global or a closed-over array
  changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import xarray as xr

import xstencil

_N = 9
_A = np.array([1.0])  # read by the kernels below; tests change it in place or rebind it
_R = 1.0


def _shift_next(v: np.ndarray, scale: float) -> np.ndarray:
    """``scale * v[i + 1]``, the last cell repeated (``extend``)."""
    return scale * np.r_[v[1:], v[-1]]


def _scaled_next(u):
    return _A[0] * u(x=1)


def test_iterate_kernel_reads_a_closed_over_array_changed_in_place() -> None:
    """(a) ``iterate`` with a kernel reading ``_A``: ``_A[0] = 2.0`` between
    calls returned the first call's field (``u(x=1) * 1``)."""
    global _A
    t0 = xr.DataArray(np.arange(1.0, _N + 1), dims="x")
    _A = np.array([1.0])
    first = t0.stencil.iterate(_scaled_next, boundary="extend", tol=None, max_steps=1)
    np.testing.assert_allclose(first.field.values, _shift_next(t0.values, 1.0))
    _A[0] = 2.0
    again = t0.stencil.iterate(_scaled_next, boundary="extend", tol=None, max_steps=1)
    np.testing.assert_allclose(again.field.values, _shift_next(t0.values, 2.0))
    _A = np.array([5.0])  # rebound to a new array of the same shape
    rebound = t0.stencil.iterate(_scaled_next, boundary="extend", tol=None, max_steps=1)
    np.testing.assert_allclose(rebound.field.values, _shift_next(t0.values, 5.0))
    _A = np.array([1.0])


def _wall(u):
    return _R + 0.0 * u()


def test_iterate_mesh_second_kernel_reads_a_changed_global() -> None:
    """(b) A mesh body: only its first kernel's globals keyed the loop, so
    ``_R = 2.0`` (read by the wall region's kernel) reused the loop with
    ``_R = 1.0``; ``m.map()`` gave the new value meanwhile."""
    global _R
    t0 = xr.DataArray(np.zeros(_N), dims="x")
    m = t0.stencil.mesh(boundary="extend")
    m[...] = lambda u: 0.5 * (u(x=-1) + u(x=1))
    m[{"x": -1}] = _wall

    def ref(r: float) -> np.ndarray:
        v = t0.values.copy()
        for _ in range(3):
            p = np.r_[v[0], v, v[-1]]
            v = 0.5 * (p[:-2] + p[2:])
            v[-1] = r
        return v

    try:
        for r in (1.0, 2.0):
            _R = r
            got = t0.stencil.iterate(m, tol=None, max_steps=3)
            np.testing.assert_allclose(got.field.values, ref(r))
    finally:
        _R = 1.0


def test_solve_operator_reads_a_closed_over_array_changed_in_place() -> None:
    """(c) ``solve`` with an operator reading a diagonal from an array:
    after ``d[0] = 4.0`` the solution was the one for ``d[0] = 2.0`` (an
    error of 4.7 against the dense solve)."""
    d = np.array([2.0])

    def op(u):
        return d[0] * u() - 0.5 * (u(x=1) + u(x=-1))

    rhs = xr.DataArray(np.arange(1.0, _N + 1), dims="x")
    for diag in (2.0, 4.0):
        d[0] = diag
        matrix = diag * np.eye(_N) - 0.5 * (np.eye(_N, k=1) + np.eye(_N, k=-1))
        got = xstencil.solve(op, rhs, method="cg", boundary="fill", fill_value=0.0,
                             tol=1e-12)
        np.testing.assert_allclose(got.field.values, np.linalg.solve(matrix, rhs.values),
                                   atol=1e-9)


def _grow(s):
    return s * _A[0]


def test_scan_step_reads_a_closed_over_array_changed_or_rebound() -> None:
    """(d) ``scan(step=fn)`` with ``fn`` reading ``_A``: in-place changes
    and rebinding were both ignored (three calls gave the same result)."""
    global _A
    t0 = xr.DataArray(np.arange(1.0, _N + 1), dims="x")
    try:
        for scale, change in ((1.0, None), (2.0, "in place"), (3.0, "rebind")):
            if change == "in place":
                _A[0] = scale
            elif change == "rebind":
                _A = np.array([scale])
            out = t0.stencil.scan(None, "time", step=_grow, steps=2, dt=1.0,
                                  save_every="last")
            np.testing.assert_allclose(out.values, t0.values * scale ** 2)
    finally:
        _A = np.array([1.0])


def _advect(s):
    def ddx(u):
        x = u.coord("x")
        return (u(x=1) - u(x=-1)) / (x(x=1) - x(x=-1))

    return s + 0.1 * s.stencil.map(ddx, boundary="extend") + s.attrs.get("k", 0.0)


def _advect_ref(v: np.ndarray, x: np.ndarray, k: float) -> np.ndarray:
    vp, xp = np.r_[v[0], v, v[-1]], np.r_[2 * x[0] - x[1], x, 2 * x[-1] - x[-2]]
    return v + 0.1 * (vp[2:] - vp[:-2]) / (xp[2:] - xp[:-2]) + k


def test_scan_step_sees_each_calls_coords_and_attrs() -> None:
    """(e) The compiled step loop wrapped every state with the first call's
    coordinates and attrs: a second call on data with another ``x`` spacing
    (or another ``attrs["k"]``) differentiated over the old spacing (1.05
    instead of 1.025 in the first cell) and added the old ``k``.
    ``iterate(step=...)`` is checked the same way."""
    v = np.arange(1.0, _N + 1, dtype=np.float32)  # float64 trips strict promotion (below)
    t1 = xr.DataArray(v, dims="x", coords={"x": np.arange(_N) * 1.0})
    t2 = t1.assign_coords(x=np.arange(_N) * 2.0)
    t3 = t2.assign_attrs(k=5.0)
    for t in (t1, t2, t3):
        want = _advect_ref(v, t.x.values, t.attrs.get("k", 0.0))
        out = t.stencil.scan(None, "time", step=_advect, steps=1, dt=1.0, save_every="last")
        np.testing.assert_allclose(out.values, want, rtol=1e-6)
        it = xstencil.iterate(t, step=_advect, tol=None, max_steps=1)
        np.testing.assert_allclose(it.field.values, want, rtol=1e-6)


_SHARDED = """
import json
import numpy as np, xarray as xr, xstencil
n = 16
t = xr.DataArray(np.arange(n * 8, dtype=np.float32).reshape(n, 8), dims=("y", "x"))
w = np.array([1.0], np.float32)
def k(u):
    return w[0] * u(y=1)
def ks(u):
    return w[0] * u(time=-1, y=1)
errors = []
for scale in (1.0, 2.0, 3.0):
    w[0] = scale
    want = scale * np.roll(t.values, -1, 0)
    got = t.stencil.map(k, boundary="periodic", devices={"y": "i"}).values
    errors.append(float(np.abs(got - want).max()))
    got = t.stencil.scan(ks, "time", steps=1, dt=1.0, save_every="last",
                         boundary="periodic", devices={"y": "i"}).values
    errors.append(float(np.abs(got - want).max()))
print(json.dumps(errors))
"""


def test_sharded_map_and_scan_read_a_closed_over_array_changed_in_place() -> None:
    """(f) Sharded maps and scans (4 simulated devices, in a fresh
    interpreter) keyed their compiled ``shard_map`` by the kernels' identity
    and traced closed-over arrays as constants: after ``w[0] = 2.0`` the
    result was still ``1 * u(y=1)`` (an error of 127 on this field)."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _SHARDED], capture_output=True, text=True,
                          env=env, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert errors == [0.0] * 6, errors


def test_kmap_and_kscan_read_their_globals_afresh_as_kernex_does() -> None:
    """(g) ``xstencil.kmap``/``kscan`` jitted their transform once per
    object, so a global array changed in place, rebound, or a global scalar
    changed after the first call was ignored (kernex 0.2, which does not
    jit, reads the new values): the first call's numbers came back."""
    global _A
    a = np.arange(8.0, dtype=np.float32)
    try:
        _A = np.array([1.0, 2.0, 1.0], np.float32)

        @xstencil.kmap(kernel_size=(3,), padding="same", relative=True)
        def f(x):
            return _A[0] * x[-1] + _A[1] * x[0] + _A[2] * x[1]

        @xstencil.kscan(kernel_size=(3,), padding="same", relative=True)
        def g(x):
            return _A[0] * x[-1] + x[0]

        for change in (None, "in place", "rebind"):
            if change == "in place":
                _A[:] = [3.0, 5.0, -1.0]
            elif change == "rebind":
                _A = np.array([0.5, 1.0, 2.0], np.float32)
            p = np.r_[0.0, a, 0.0]
            want = _A[0] * p[:-2] + _A[1] * p[1:-1] + _A[2] * p[2:]
            np.testing.assert_allclose(np.asarray(f(a)), want, rtol=1e-6)
            seq = np.zeros_like(a)
            for i in range(a.size):  # kscan: the left neighbour is already updated
                seq[i] = _A[0] * (seq[i - 1] if i else 0.0) + a[i]
            np.testing.assert_allclose(np.asarray(g(a)), seq, rtol=1e-6)
    finally:
        _A = np.array([1.0])


def _wall_mask(n: int) -> xr.DataArray:
    mask = xr.DataArray(np.zeros((n, n), bool), dims=("y", "x"))
    mask[:, 0] = True
    return mask


def test_iterate_transposed_field_reads_a_mask_region_in_its_own_dims() -> None:
    """(h) ``iterate(obj, mesh)`` with ``obj`` in the other dim order than
    the mesh's data: a mask region (stored in the mesh's order) was applied
    to the transposed arrays, so on a square field the wall column became a
    wall row (an error of 14 here; a non-square field failed inside JAX).
    The field now runs in the mesh's order and comes back in its own."""
    n = 4
    da = xr.DataArray(np.arange(16.0).reshape(n, n), dims=("y", "x"))
    m = da.stencil.mesh(boundary="extend")
    m[...] = lambda u: u(x=1)
    m[_wall_mask(n)] = lambda u: -1.0 + 0.0 * u()
    want = np.c_[np.full(n, -1.0), da.values[:, 2:], da.values[:, -1:]]
    for obj in (da, da.transpose("x", "y")):
        got = xstencil.iterate(obj, m, tol=None, max_steps=1).field
        assert got.dims == obj.dims
        np.testing.assert_array_equal(got.transpose("y", "x").values, want)


def test_solve_transposed_rhs_reads_a_mask_region_in_its_own_dims() -> None:
    """(i) ``solve(mesh, rhs)`` with ``rhs`` transposed against the mesh's
    data solved the system with the mask's rows transposed: 1.6 off the
    dense solution on a 5 x 5 Poisson problem with a masked wall column
    (an ``x0`` given as a plain array in ``rhs``'s order is transposed too)."""
    n = 5
    rhs = xr.DataArray(np.random.default_rng(1).standard_normal((n, n)), dims=("y", "x"))
    m = rhs.stencil.mesh(boundary="fill", fill_value=0.0)
    m[...] = lambda u: u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()
    m[_wall_mask(n)] = lambda u: u()
    dense = np.zeros((n * n, n * n))
    for i in range(n):
        for j in range(n):
            row = i * n + j
            if j == 0:
                dense[row, row] = 1.0
                continue
            dense[row, row] = -4.0
            for di, dj in ((0, 1), (0, -1), (1, 0), (-1, 0)):
                if 0 <= i + di < n and 0 <= j + dj < n:
                    dense[row, (i + di) * n + j + dj] += 1.0
    want = np.linalg.solve(dense, rhs.values.ravel()).reshape(n, n)
    for obj in (rhs, rhs.transpose("x", "y")):
        for x0 in (None, np.full((n, n), 0.1)):
            got = xstencil.solve(m, obj, method="gmres", tol=1e-12, x0=x0).field
            assert got.dims == obj.dims
            np.testing.assert_allclose(got.transpose("y", "x").values, want, atol=1e-9)
