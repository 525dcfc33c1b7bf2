"""The "fused" lowering (``XSTENCIL_LOWERING``, the default off the CPU).

On an accelerator XLA fuses padding into the slices that read it, so a map
lowers to slices of one padded block per source, and a scan step's halo is
left to XLA instead of being built behind an optimization barrier; on a TPU
v5e that took a 2048² Laplacian from 192 to 120 µs a call (hand-written
``jnp.pad`` and slices: 117-126 µs) and a 2048² heat scan of 200 steps from
17.3 to 11.8 ms.  CI has no accelerator, so these tests force the lowering
on the CPU and check that it gives the results of the CPU lowering (the same
arithmetic on the same values: bitwise for the 5-point Laplacian, within a
few ulp where XLA contracts a multiply-add in one program and not the
other), through boundary modes, strides,
asymmetric windows, several sources, ``valid``, a function mesh, scans and
gradients (including the NaN guard), that it really lowers differently (no
dynamic-update-slice assembling the pieces), and that a bad value is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil._engine import boundary, lower, tscan
from xstencil._errors import XStencilError

ASKED: list[bool] = []  # what pads_fuse answered since the last lowering() call


@pytest.fixture
def lowering(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Sets ``XSTENCIL_LOWERING`` and clears the compile caches (the choice is
    read when a kernel is traced); ``ASKED`` records the answers given since."""
    real = boundary.pads_fuse

    def spy() -> bool:
        ASKED.append(real())
        return ASKED[-1]

    for module in (lower, tscan, boundary):  # each reads the name it imported
        monkeypatch.setattr(module, "pads_fuse", spy)

    def use(how: str) -> None:
        monkeypatch.setenv(boundary.LOWERING_ENV, how)
        xstencil.clear_caches()
        ASKED.clear()

    yield use
    monkeypatch.delenv(boundary.LOWERING_ENV, raising=False)
    xstencil.clear_caches()


def _both(lowering: Callable[[str], None], run: Callable[[], Any]) -> tuple[Any, Any]:
    """``run()`` under each lowering, each traced anew (checked)."""
    out = {}
    for how in ("cpu", "fused"):
        lowering(how)
        out[how] = jax.tree_util.tree_map(np.asarray, run())
        assert ASKED and set(ASKED) == {how == "fused"}, "the kernel was not traced anew"
    return out["cpu"], out["fused"]


def _equal(a: Any, b: Any, exact: bool = True) -> None:
    """Bitwise equal, or (``exact=False``: XLA may contract a multiply-add
    into one rounding in one program and not the other) within a few ulp."""
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        if exact:
            np.testing.assert_array_equal(x, y)
        else:
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_allclose(x, y, rtol=4 * np.finfo(x.dtype).eps,
                                       atol=4 * np.finfo(x.dtype).eps * np.abs(x).max())


def test_the_default_follows_the_backend_and_the_variable_overrides(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(boundary.LOWERING_ENV, raising=False)
    assert boundary.pads_fuse() is (jax.default_backend() != "cpu")
    monkeypatch.setenv(boundary.LOWERING_ENV, " Fused ")
    assert boundary.pads_fuse() is True
    monkeypatch.setenv(boundary.LOWERING_ENV, "cpu")
    assert boundary.pads_fuse() is False
    monkeypatch.setenv(boundary.LOWERING_ENV, "fuse")
    with pytest.raises(XStencilError, match=r"XSTENCIL_LOWERING='fuse'.*'cpu' or 'fused'"):
        boundary.pads_fuse()


def _lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) + u(y=1) + u(y=-1) - 4 * u()


@pytest.mark.parametrize("opts", [
    {"boundary": "fill", "fill_value": 0.0},
    {"boundary": "fill", "fill_value": 7.5},
    {"boundary": "periodic"},
    {"boundary": "reflect"},
    {"boundary": "symmetric"},
    {"boundary": "extend"},
    {"boundary": {"x": "periodic", "y": "reflect"}},
])
def test_maps_give_the_cpu_lowerings_bits(lowering: Callable[[str], None],
                                          opts: dict[str, Any]) -> None:
    a = np.random.default_rng(1).standard_normal((23, 17)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"), coords={"x": np.arange(17.0)}, attrs={"u": "K"},
                      name="t")

    def run() -> Any:
        return da.stencil.map(_lap, backend="xla", **opts)

    cpu, fused = _both(lowering, run)
    _equal(cpu, fused)
    lowering("fused")
    res = run()
    assert res.dims == da.dims and res.attrs == da.attrs and res.name == "t"
    np.testing.assert_array_equal(res["x"].values, da["x"].values)
    if opts.get("boundary") == "periodic":  # and an independent reference
        want = (np.roll(a, -1, 1) + np.roll(a, 1, 1) + np.roll(a, -1, 0) + np.roll(a, 1, 0)
                - np.float32(4) * a)
        np.testing.assert_allclose(res.values, want, rtol=1e-6, atol=1e-5)


def test_windows_strides_valid_and_several_sources(lowering: Callable[[str], None]) -> None:
    rng = np.random.default_rng(2)
    ds = xr.Dataset({"u": (("y", "x"), rng.standard_normal((19, 26))),
                     "v": (("y", "x"), rng.standard_normal((19, 26)))})
    w = rng.standard_normal((2, 4))

    def k(d: Any) -> Any:  # an asymmetric window, two fields, a product (not linear)
        return d.u(y=1, x=-2) * d.v() + d.u(x=1) - d.v(y=-1, x=2) ** 2

    def dense(u: Any) -> Any:  # a 3 x 5 window's max: no dense lowering
        return u.max() + u(x=1)

    cases = [
        lambda: ds.stencil.map(k, boundary="reflect", backend="xla"),
        lambda: ds.u.stencil.map(dense, window={"y": 3, "x": 5}, boundary="periodic",
                                 stride={"x": 2, "y": 3}, backend="xla"),
        lambda: ds.u.stencil.map(dense, window={"y": 3, "x": 5}, boundary="valid",
                                 backend="xla"),
        lambda: xstencil.kmap(kernel_size=(2, 4), padding="same")(
            lambda u: jnp.sum(u * w))(jnp.asarray(ds.u.values)),
    ]
    for run in cases:
        cpu, fused = _both(lowering, run)
        _equal(cpu, fused, exact=False)


def test_dask_blocks_give_the_cpu_lowerings_results(lowering: Callable[[str], None]) -> None:
    pytest.importorskip("dask")
    a = np.random.default_rng(6).standard_normal((24, 30)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x")).chunk({"y": 10, "x": 12})  # uneven chunks

    def run() -> Any:
        return da.stencil.map(_lap, boundary="periodic").compute(scheduler="synchronous")

    cpu, fused = _both(lowering, run)
    _equal(cpu, fused)
    want = (np.roll(a, -1, 1) + np.roll(a, 1, 1) + np.roll(a, -1, 0) + np.roll(a, 1, 0)
            - np.float32(4) * a)
    np.testing.assert_allclose(fused, want, rtol=1e-6, atol=1e-5)


def test_a_function_mesh_gives_the_cpu_lowerings_bits(lowering: Callable[[str], None]) -> None:
    a = np.random.default_rng(3).standard_normal((16, 20)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))

    def run() -> Any:
        m = da.stencil.mesh(boundary="periodic", backend="xla")
        m[...] = _lap
        m[{"x": slice(0, 3)}] = lambda u: u(x=1) - u(x=-1)
        m[{"y": 5}] = lambda u: 2 * u(y=-1)
        return m.map()

    cpu, fused = _both(lowering, run)
    _equal(cpu, fused)


@pytest.mark.parametrize("boundary", ["fill", "periodic"])
def test_scans_give_the_cpu_lowerings_bits(lowering: Callable[[str], None],
                                           boundary: str) -> None:
    a = np.random.default_rng(4).random((30, 28)).astype(np.float32)
    da = xr.DataArray(a, dims=("y", "x"))

    def heat(u: Any) -> Any:
        c = u(time=-1)
        return c + 0.1 * (u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1)
                          + u(time=-1, y=-1) - 4 * c)

    def run() -> Any:
        return xstencil.scan(da, heat, "time", steps=12, save_every=4, boundary=boundary,
                             fill_value=0.0, backend="xla")

    cpu, fused = _both(lowering, run)
    _equal(cpu, fused)
    assert cpu.shape == (4, 30, 28)


def test_gradients_through_nan_land_match_the_cpu_lowering(
        lowering: Callable[[str], None]) -> None:
    data = (np.random.default_rng(5).random((9, 11)) + 0.5).astype(np.float32)
    land = np.zeros(data.shape, bool)
    land[:, 8:] = True
    data[land] = np.nan
    ocean = ~land
    ocean[:, 7] = False  # a finite coast column: no ocean cell reads land
    T = xr.DataArray(data, dims=("y", "x"))
    sea = xr.DataArray(ocean, dims=("y", "x"))
    keep = jnp.asarray(ocean)

    def loss(nu: Any) -> Any:  # NaN land masked out of the mesh and of the loss
        m = T.stencil.mesh(boundary="extend", backend="xla")
        m[sea] = lambda u, nu: (u(x=1) + u(x=-1) - 2 * u()) * nu + u()
        return jnp.sum(jnp.where(keep, m.map(nu).data, 0.0) ** 2)

    def run() -> Any:
        return jax.grad(loss)(jnp.float32(0.3))

    cpu, fused = _both(lowering, run)
    _equal(cpu, fused, exact=False)
    assert np.isfinite(fused)  # the guard kept land's NaN out of the derivative
    eps = 1e-2  # and it is the derivative (a central difference)
    lowering("fused")
    fd = (loss(jnp.float32(0.3 + eps)) - loss(jnp.float32(0.3 - eps))) / (2 * eps)
    np.testing.assert_allclose(fused, fd, rtol=2e-2)


def test_the_fused_lowering_assembles_no_pieces(lowering: Callable[[str], None]) -> None:
    x = jnp.ones((64, 64), jnp.float32)
    text = {}
    for how in ("cpu", "fused"):
        lowering(how)  # a kmap keeps its trace: a new one per lowering
        f = xstencil.kmap(kernel_size=(3, 3), padding="same", relative=True,
                          boundary="periodic")(
            lambda x: x[1, 0] + x[-1, 0] + x[0, 1] + x[0, -1] - 4 * x[0, 0])
        text[how] = jax.jit(f).lower(x).as_text()
    assert "dynamic_update_slice" in text["cpu"]  # interior and shell written into one buffer
    assert "dynamic_update_slice" not in text["fused"]
