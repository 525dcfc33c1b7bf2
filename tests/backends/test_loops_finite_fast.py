"""``check_finite=True`` computed inside the loop scans' nests
(``render(..., finite=...)`` in ``xstencil/_engine/loopnest.py``, run by
``xstencil/_labelled/loop_scan_steps.py``'s ``run_loop``).

The nest folds ``(x - x) == 0`` of every value it writes into one flag per
row; a step whose flags are not all set raises XLA's error.  Each case is
checked to have used that nest (not the read after the step), and compared
with ``backend="xla"`` (same values, same error) and with a numpy time loop
(the step where the values first turn non-finite): ranks 1, 2 and 3, float32
and float64, non-finite values only in the boundary shell or only in the
interior, a Dataset whose second variable overflows, and a runtime weight
(the nest's unmasked and masked variants).  Nests without the option are
written exactly as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from xstencil._errors import XStencilError

pytest.importorskip("numba")

from tests.spies import count_calls  # noqa: E402
from xstencil._engine.loopgen import Param  # noqa: E402
from xstencil._engine.loopweights import generate_variants  # noqa: E402
from xstencil._engine.lower import AxisGeom, Source  # noqa: E402
from xstencil._labelled import loop_scan as LS  # noqa: E402 - after the numba check


@pytest.fixture
def fused(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The checked nests the loop scans ran with (``None``: read after the step)."""
    seen: list[Any] = []
    real = LS.loop_scan_steps._fused

    def spy(built: Any) -> Any:
        nest = real(built)
        seen.append(nest)
        return nest

    monkeypatch.setattr(LS.loop_scan_steps, "_fused", spy)
    yield seen


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    yield count_calls(monkeypatch, LS.loop_scan_steps, "run_loop")


def both(obj: Any, kernel: Any, ran: list[int], **kw: Any) -> tuple[Any, Any]:
    """The scan on the loops (checked to have run there) and on XLA: each the
    result or the XStencilError raised."""
    out = []
    for backend in ("loops", "xla"):
        before = len(ran)
        try:
            out.append(obj.stencil.scan(kernel, "time", backend=backend, **kw))
        except XStencilError as e:
            out.append(e)
        if backend == "loops":
            assert len(ran) == before + 1, "the scan did not run as loops"
    return out[0], out[1]


def first_bad(traj: list[np.ndarray]) -> int:
    return next(t for t, x in enumerate(traj) if not np.isfinite(x).all())


def times10(u: Any) -> Any:
    return 10 * u(time=-1) + 0 * u(time=-1, x=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(40,), (12, 16), (5, 6, 7)])
def test_overflow_in_the_interior(fused: list[Any], ran: list[int], dtype: Any,
                                  shape: tuple[int, ...]) -> None:
    """One cell grows faster than the rest: it overflows first, inside."""
    dims = ("z", "y", "x")[3 - len(shape):]
    big = np.finfo(dtype).max / 1e6
    u0 = np.ones(shape, dtype)
    u0[tuple(n // 2 for n in shape)] = big
    da = xr.DataArray(u0, dims=dims)
    traj = [u0]
    with np.errstate(over="ignore"):
        for _ in range(11):
            traj.append(traj[-1] * dtype(10))
    k = first_bad(traj)
    loops, xla = both(da, times10, ran, steps=12, boundary="periodic", check_finite=True)
    assert fused and fused[-1] is not None, "the checked nest was not used"
    assert isinstance(loops, XStencilError) and str(loops) == str(xla)
    assert f"first appeared at position {k} along 'time'" in str(loops)
    ok, okx = both(da, times10, ran, steps=k - 1, boundary="periodic", check_finite=True,
                   save_every=1)
    plain = da.stencil.scan(times10, "time", steps=k - 1, boundary="periodic",
                            backend="loops", save_every=1)
    xr.testing.assert_identical(ok, plain)  # the check changes nothing
    xr.testing.assert_identical(ok, okx)
    np.testing.assert_array_equal(ok.values, np.stack(traj[:k]))


def ratio(u: Any) -> Any:
    return u(time=-1) / u(time=-1, x=1)


@pytest.mark.parametrize("shape", [(30,), (9, 11), (4, 5, 6)])
def test_division_by_the_fill_only_in_the_shell(fused: list[Any], ran: list[int],
                                                shape: tuple[int, ...]) -> None:
    """Zero fill: only the last column divides by 0 (the boundary shell's
    code), at the first step."""
    dims = ("z", "y", "x")[3 - len(shape):]
    rng = np.random.default_rng(1)
    da = xr.DataArray(1 + rng.random(shape), dims=dims)
    with np.errstate(divide="ignore"):
        ref = da.values / np.concatenate([da.values[..., 1:], np.zeros(shape[:-1] + (1,))], -1)
    assert np.isfinite(ref[..., :-1]).all() and not np.isfinite(ref[..., -1]).any()
    loops, xla = both(da, ratio, ran, steps=3, boundary="fill", fill_value=0.0,
                      check_finite=True)
    assert fused[-1] is not None
    assert isinstance(loops, XStencilError) and str(loops) == str(xla)
    assert "first appeared at position 1 along 'time'" in str(loops)
    # without the check, both run through
    loops, xla = both(da, ratio, ran, steps=1, boundary="fill", fill_value=0.0)
    np.testing.assert_array_equal(loops.values[1], ref)
    xr.testing.assert_identical(loops, xla)


def test_dataset_second_variable_overflows(fused: list[Any], ran: list[int]) -> None:
    """Both advanced variables' values fold into the flags."""
    rng = np.random.default_rng(2)
    ds = xr.Dataset({"u": (("y", "x"), rng.random((10, 12))),
                     "v": (("y", "x"), np.full((10, 12), 1e30, np.float32))})

    def k(s: Any) -> dict[str, Any]:
        return {"u": 0.5 * (s["u"](time=-1, x=1) + s["u"](time=-1, x=-1)),
                "v": 10 * s["v"](time=-1) + 0 * s["v"](time=-1, y=1)}

    with np.errstate(over="ignore"):
        step = first_bad([np.float32(1e30) * np.float32(10) ** i for i in range(12)])
    loops, xla = both(ds, k, ran, steps=12, boundary="periodic", check_finite=True)
    assert fused[-1] is not None
    assert isinstance(loops, XStencilError) and str(loops) == str(xla)
    assert f"position {step} along 'time'" in str(loops)
    ok, okx = both(ds, k, ran, steps=step - 1, boundary="periodic", check_finite=True)
    xr.testing.assert_allclose(ok, okx, rtol=1e-12)
    u = ds["u"].values
    for _ in range(step - 1):
        u = 0.5 * (np.roll(u, -1, 1) + np.roll(u, 1, 1))
    np.testing.assert_allclose(ok["u"].values[-1], u, rtol=1e-12)


@pytest.mark.parametrize("w", [0.0, 3.0])
def test_runtime_weight_both_variants(fused: list[Any], ran: list[int], w: float) -> None:
    """A closed-over weight: the unmasked variant (w != 0) and the masked one
    (w == 0, where an Inf neighbour reads as 0) both report finiteness."""
    weight = np.asarray(w, np.float32)

    def k(u: Any) -> Any:
        return 10 * u(time=-1) + weight * u(time=-1, x=1)

    u0 = np.ones((12, 14), np.float32)
    u0[3, 4] = 1e34
    da = xr.DataArray(u0, dims=("y", "x"))
    traj = [u0]
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(8):
            u = traj[-1]
            nb = np.where(weight != 0, weight * np.roll(u, -1, 1), 0)
            traj.append((10 * u + nb).astype(np.float32))
    step = first_bad(traj)
    loops, xla = both(da, k, ran, steps=8, boundary="periodic", check_finite=True)
    assert fused[-1] is not None
    assert isinstance(loops, XStencilError) and str(loops) == str(xla)
    assert f"first appeared at position {step} along 'time'" in str(loops)
    compiled = fused[-1].compiled
    assert ("plain" in compiled) == (w != 0)


def test_integer_state_is_not_checked(fused: list[Any], ran: list[int]) -> None:
    da = xr.DataArray(np.arange(12 * 10, dtype=np.int32).reshape(12, 10), dims=("y", "x"))

    def k(u: Any) -> Any:
        return u(time=-1, x=1) * 3

    loops, xla = both(da, k, ran, steps=4, boundary="periodic", check_finite=True)
    xr.testing.assert_identical(loops, xla)
    ref = [da.values]
    for _ in range(4):
        ref.append(np.roll(ref[-1], -1, 1) * np.int32(3))
    np.testing.assert_array_equal(loops.values, np.stack(ref))


def test_nest_without_the_option_is_unchanged() -> None:
    """``finite`` off writes no flag; on, the flag is the first argument and
    the rest of the nest is the same statements."""
    src = np.zeros((6, 7), np.float32)
    geom = [AxisGeom(0, 1, 6, 3), AxisGeom(0, 1, 7, 3)]
    sources = [Source(src, (0, 1), (0, 1), ((1, 1), (1, 1)), ("wrap", "wrap"))]

    def kern(cells: Any, p: Any) -> Any:
        return cells[1, 1] * p + cells[0, 1]

    closed = jax.make_jaxpr(kern)(jax.ShapeDtypeStruct((3, 3), np.float32),
                                  jax.ShapeDtypeStruct((), np.float32))
    params = [Param(0, (), np.dtype(np.float32))]
    off = generate_variants(closed, sources, geom, params)
    on = generate_variants(closed, sources, geom, params, finite=True)
    for a, b in ((off.masked, on.masked), (off.plain, on.plain)):
        assert "fz" not in a and "fin_" not in a
        # (the masked nest is outlined: its rows take the flags too)
        assert "\ndef kernel(fz, o0," in "\n" + b and "fz[j0] = fin_ok" in b
        kept = [line.replace("fin_r0", "?") for line in b.splitlines()
                if "fin_ok" not in line and "fin_r0 = " not in line]
        assert len(kept) == len(a.splitlines())
    assert off.check == on.check


def test_a_checked_nest_that_fails_falls_back_to_the_read(monkeypatch: pytest.MonkeyPatch,
                                                          ran: list[int]) -> None:
    """Where the checked nest cannot run (its compile failed), the step runs
    the plain nest and reads the new state: same values, same error, and the
    checked nest is not offered again."""
    u0 = np.ones((10, 12), np.float32)
    u0[4, 5] = 1e33
    da = xr.DataArray(u0, dims=("y", "x"))
    da.stencil.scan(times10, "time", steps=1, boundary="periodic", backend="loops")
    built = [b for b in LS._BUILT.values() if not isinstance(b, str) and b.field == u0.shape]
    assert built
    tried: list[int] = []

    class Broken:
        def __call__(self, *args: Any) -> None:
            tried.append(1)
            raise RuntimeError("no compile")

    for b in built:
        monkeypatch.setattr(b, "_checked", Broken())
    traj = [u0]
    with np.errstate(over="ignore"):
        for _ in range(8):
            traj.append(traj[-1] * np.float32(10))
    k = first_bad(traj)
    loops, xla = both(da, times10, ran, steps=8, boundary="periodic", check_finite=True)
    assert tried == [1]
    assert isinstance(loops, XStencilError) and str(loops) == str(xla)
    assert f"first appeared at position {k} along 'time'" in str(loops)
    ok = da.stencil.scan(times10, "time", steps=k - 1, boundary="periodic", backend="loops",
                         check_finite=True)
    assert tried == [1]  # dropped: the next scan reads the state without trying it
    np.testing.assert_array_equal(ok.values, np.stack(traj[:k]))
