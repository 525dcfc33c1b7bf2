"""A mesh's regions are resolved once (``xstencil/_labelled/mesh_resolved.py``):
their coverage, the loop backend's nests and the mask digests are not built
again on every call, and the cache never goes stale.

Each mesh runs on the loop backend (checked to have run as loops) and on
XLA, against a numpy reference (the helpers of ``test_loops_mesh.py``); the
two backends agree bitwise (float32, the same operations in the same order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import xarray as xr

import xstencil
from tests.backends.test_loops_mesh import _lap, _lap_ref, _reference
from tests.spies import count_calls
from xstencil._backends import loops as L
from xstencil._backends import loops_mesh as LM
from xstencil._labelled import mesh as mesh_module
from xstencil._labelled import mesh_resolved, mesh_run

pytest.importorskip("numba")


@pytest.fixture
def mesh_ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the meshes that ran as loops."""
    monkeypatch.delenv(L.ENV, raising=False)
    yield count_calls(monkeypatch, LM, "run_mesh")


def _half(u: Any) -> Any:
    return u() * 0.5


def _half_ref(get: Callable[[int, int], np.ndarray]) -> np.ndarray:
    return get(0, 0) * np.float32(0.5)


def _up(u: Any) -> Any:
    return u(y=-1) - u()


def _up_ref(get: Callable[[int, int], np.ndarray]) -> np.ndarray:
    return get(-1, 0) - get(0, 0)


def _each(kernel: Callable[..., Any], names: tuple[str, ...]) -> Callable[..., Any]:
    """A Dataset kernel: ``kernel`` on each of the variables ``names``."""
    return lambda s: {v: kernel(s[v]) for v in names}


def _mesh(obj: Any, masks: list[Any], backend: str) -> Any:
    """Laplacian everywhere, then ``masks`` with two kernels in turn, then a
    column (on a Dataset: on each variable)."""
    m = obj.stencil.mesh(boundary="periodic", backend=backend)
    names = tuple(obj.data_vars) if isinstance(obj, xr.Dataset) else None
    lap, half, up = (_lap, _half, _up) if names is None else \
        (_each(_lap, names), _each(_half, names), _each(_up, names))
    m[...] = lap
    for i, mask in enumerate(masks):
        m[mask] = (half, up)[i % 2]
    m[{"x": 0}] = up
    return m


def _ref(a: np.ndarray, masks: list[np.ndarray]) -> np.ndarray:
    regions = [(..., _lap_ref)] + [(mk, (_half_ref, _up_ref)[i % 2])
                                    for i, mk in enumerate(masks)]
    return _reference(a, regions + [((slice(None), 0), _up_ref)], "periodic", 0, np.float32)


def _both(obj: Any, masks: list[Any]) -> tuple[Any, Any, Any, Any]:
    """``(loops mesh, its result, xla mesh, its result)``."""
    lo, xl = _mesh(obj, masks, "loops"), _mesh(obj, masks, "xla")
    return lo, lo.map(), xl, xl.map()


def test_a_mask_changed_after_assignment_is_not_seen_and_a_new_mesh_sees_it(
        mesh_ran: list[int]) -> None:
    rng = np.random.default_rng(11)
    a = rng.random((14, 12), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    raw = rng.random(a.shape) > 0.6  # the mask DataArray wraps this array, no copy
    mask = xr.DataArray(raw, dims=("y", "x"))
    old = raw.copy()
    lo, got, xl, xla = _both(da, [mask])
    np.testing.assert_array_equal(got.values, _ref(a, [old]))
    np.testing.assert_array_equal(got.values, xla.values)
    raw[:] = ~raw  # the user changes the mask in place after building the meshes
    assert mask.values[0, 0] != old[0, 0]
    # the meshes keep the region fixed when it was assigned
    np.testing.assert_array_equal(lo.map().values, _ref(a, [old]))
    np.testing.assert_array_equal(xl.map().values, _ref(a, [old]))
    # new meshes with the changed mask see it: nothing cached by the old one is reused
    _, got, _, xla = _both(da, [mask])
    want = _ref(a, [~old])
    assert not np.array_equal(want, _ref(a, [old]))
    np.testing.assert_array_equal(got.values, want)
    np.testing.assert_array_equal(got.values, xla.values)
    assert len(mesh_ran) == 3


def test_a_dataset_mesh_with_new_masks_gives_the_new_result(mesh_ran: list[int]) -> None:
    """A Dataset mesh resolves its regions on every call (no fast path): a
    rebuilt mesh with other masks must not reuse the first one's."""
    rng = np.random.default_rng(12)
    a = rng.random((12, 13), dtype=np.float32)
    ds = xr.Dataset({"u": (("y", "x"), a), "h": (("y", "x"), 2 * a)})
    for cut in (0.3, 0.7):
        masks = [ds["u"] > cut, ds["u"] < cut / 2]
        lo, got, _, xla = _both(ds, masks)
        again = lo.map()  # the second call reuses what the first resolved
        ref_u = _ref(a, [a > cut, a < cut / 2])
        ref_h = _ref(2 * a, [a > cut, a < cut / 2])
        for out in (got, again):
            for v, ref in (("u", ref_u), ("h", ref_h)):
                np.testing.assert_array_equal(out[v].values, ref)
                np.testing.assert_array_equal(out[v].values, xla[v].values)
    assert len(mesh_ran) == 4


@pytest.mark.parametrize("kind", ["DataArray", "Dataset"])
def test_coverage_nests_and_digests_are_built_once(kind: str, mesh_ran: list[int],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    covered = count_calls(monkeypatch, mesh_resolved, "covered")
    nests = count_calls(monkeypatch, mesh_resolved, "pieces")
    digests = count_calls(monkeypatch, mesh_run, "region_key")
    varying = count_calls(monkeypatch, mesh_module, "region_dims")
    rng = np.random.default_rng(13)
    a = rng.random((16, 15), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))
    obj = da if kind == "DataArray" else xr.Dataset({"u": da})
    raw = [rng.random(a.shape) > 0.5 for _ in range(5)]
    # masks no other test uses: this mesh's regions are resolved afresh
    m = _mesh(obj, [xr.DataArray(r, dims=("y", "x")) for r in raw], "loops")
    ref = _ref(a, raw)
    outs = [m.map() for _ in range(4)]
    assert len(mesh_ran) == 4  # every call ran as loops
    assert len(covered) == 1
    assert len(nests) == 1
    assert len(digests) == 7  # once per region (the mesh's layout), not per call
    assert len(varying) == (kind == "Dataset")  # only a Dataset mesh asks
    xla = _mesh(obj, [xr.DataArray(r, dims=("y", "x")) for r in raw], "xla").map()
    for out in outs:
        got = out if kind == "DataArray" else out["u"]
        np.testing.assert_array_equal(got.values, ref)
        np.testing.assert_array_equal(got.values, (xla if kind == "DataArray" else xla["u"]).values)


@pytest.mark.parametrize("mode", ["periodic", "fill", "reflect"])
def test_strips_of_one_kernel_share_one_compiled_nest(mode: str, mesh_ran: list[int],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A boundary kernel on every edge, on strided and reversed strips: the
    strips' nests take their box at run time, so each kernel (per step
    pattern) compiles once, and every strip still reads its own halo."""
    compiled = count_calls(monkeypatch, LM, "_compile")
    xstencil.clear_caches()
    rng = np.random.default_rng(14)
    a = rng.random((19, 17), dtype=np.float32)
    da = xr.DataArray(a, dims=("y", "x"))

    def bc(u: Any) -> Any:
        return u(x=1) * 2 - u(y=-1)

    def bc_ref(get: Callable[[int, int], np.ndarray]) -> np.ndarray:
        return get(0, 1) * np.float32(2) - get(-1, 0)

    edges = [({"x": 0}, (slice(None), 0)), ({"x": -1}, (slice(None), -1)),
             ({"y": 0}, (0, slice(None))), ({"y": -1}, (-1, slice(None))),
             ({"y": slice(3, 8)}, (slice(3, 8),)),
             ({"x": 5, "y": slice(2, 15)}, (slice(2, 15), 5))]
    strided = [({"y": slice(1, None, 4), "x": 2}, (slice(1, None, 4), 2)),
               ({"y": slice(14, 2, -4), "x": 9}, (slice(14, 2, -4), 9))]
    outs = []
    for backend in ("loops", "xla"):
        m = da.stencil.mesh(boundary=mode, fill_value=0.5 if mode == "fill" else None,
                            backend=backend)
        m[...] = _lap
        for key, _ in edges + strided:
            m[key] = bc
        outs.append(m.map())
    assert len(mesh_ran) == 1
    # the Laplacian; bc on unit steps (rows and columns alike); bc on steps of 4
    # (the reversed strip runs forwards with the same step)
    assert len(compiled) == 3
    ref = _reference(a, [(..., _lap_ref)] + [(index, bc_ref) for _, index in edges + strided],
                     mode, 0.5, np.float32)
    np.testing.assert_array_equal(outs[0].values, ref)
    np.testing.assert_array_equal(outs[0].values, outs[1].values)
