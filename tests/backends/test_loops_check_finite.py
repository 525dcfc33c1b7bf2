"""``check_finite=True`` on scans that run as numba loops
(``xstencil/_labelled/loop_scan_steps.py``'s ``run_loop``).

The loops check the initial state and every step's new slabs, as the XLA
loop does, so the default route stays on the loops.  Each case runs with
``backend="loops"`` (checked to have run as loops) and ``backend="xla"``:
same values for a finite run, same error (type and message) for a run that
turns non-finite at step k, for one whose Inf appears and vanishes again, and
for NaN in the initial data; the step k comes from a numpy time loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil  # noqa: F401 - registers the accessor
from xstencil._errors import XStencilError

pytest.importorskip("numba")

from tests.spies import count_calls  # noqa: E402
from xstencil._labelled import loop_scan as LS  # noqa: E402 - after the numba check

NU = 0.1


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the scans whose time loop ran as loops."""
    yield count_calls(monkeypatch, LS.loop_scan_steps, "run_loop")


def grow(u: Any) -> Any:
    """Heat plus growth by 10 per step: overflows float32 after a few steps."""
    lap = u(time=-1, x=1) + u(time=-1, x=-1) + u(time=-1, y=1) + u(time=-1, y=-1) \
        - 4 * u(time=-1)
    return 10 * (u(time=-1) + NU * lap)


def grow_numpy(u0: np.ndarray, steps: int) -> list[np.ndarray]:
    out = [u0]
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(steps):
            u = out[-1]
            lap = sum(np.roll(u, s, a) for s in (1, -1) for a in (0, 1)) - 4 * u
            out.append((10 * (u + NU * lap)).astype(u.dtype))
    return out


def first_bad(traj: list[np.ndarray]) -> int:
    return next(t for t, x in enumerate(traj) if not np.isfinite(x).all())


def field(scale: float, dtype: Any = np.float32, n: int = 12) -> xr.DataArray:
    rng = np.random.default_rng(5)
    return xr.DataArray((scale * (1 + rng.random((n, n)))).astype(dtype), dims=("y", "x"))


def both(obj: Any, kernel: Any, ran: list[int], **kw: Any) -> tuple[Any, Any]:
    """The scan with backend="loops" (checked: ran as loops) and "xla"; each
    the result, or the exception raised."""
    out = []
    for backend in ("loops", "xla"):
        before = len(ran)
        try:
            out.append(obj.stencil.scan(kernel, "time", boundary="periodic", backend=backend,
                                        **kw))
        except XStencilError as e:
            out.append(e)
        if backend == "loops":
            assert len(ran) == before + 1, "the scan did not run as loops"
    return out[0], out[1]


@pytest.mark.parametrize("save_every", [1, 2, "last"])
def test_finite_run_matches_xla(ran: list[int], save_every: Any) -> None:
    u0 = field(1.0, np.float64)
    loops, xla = both(u0, grow, ran, steps=6, save_every=save_every, check_finite=True)
    plain = u0.stencil.scan(grow, "time", steps=6, save_every=save_every,
                            boundary="periodic", backend="loops")
    xr.testing.assert_identical(loops, plain)  # the check changes nothing
    xr.testing.assert_allclose(loops, xla, rtol=1e-12)
    ref = np.stack(grow_numpy(u0.values, 6))
    want = ref[-1] if save_every == "last" else ref[::save_every]
    np.testing.assert_allclose(loops.values, want, rtol=1e-12)


@pytest.mark.parametrize("save_every", [1, 3, "last"])
def test_overflow_at_step_k_same_error(ran: list[int], save_every: Any) -> None:
    u0 = field(1e30)
    k = first_bad(grow_numpy(u0.values, 12))
    assert 1 <= k < 12
    u0 = u0.assign_coords(time=0.5)  # a scalar time coordinate: labels continue from it
    loops, xla = both(u0, grow, ran, steps=12, dt=0.25, save_every=save_every,
                      check_finite=True)
    assert isinstance(loops, XStencilError) and isinstance(xla, XStencilError)
    assert str(loops) == str(xla)
    assert f"first appeared at position {k} along 'time' (time={0.5 + 0.25 * k})" in str(loops)
    with pytest.raises(XStencilError, match=rf"da\.stencil\.scan\(\.\.\.\): check_finite=True: "
                       rf"a NaN or Inf first appeared at position {k} along 'time'"):
        u0.stencil.scan(grow, "time", steps=12, dt=0.25, boundary="periodic",
                        check_finite=True, save_every=save_every)  # default route


def test_inf_that_vanishes_is_still_reported(ran: list[int]) -> None:
    """An Inf at step 1 that the kernel clamps away at step 2: a check of the
    saved or last positions only would miss it; XLA reports it."""
    u0 = xr.DataArray(np.full((8, 8), 1e37, np.float32), dims=("y", "x"))

    def spike(u: Any) -> Any:
        return jnp.where(u(time=-1) > 1e38, 0.0, u(time=-1) * 100) + 0 * u(time=-1, x=1)

    loops, xla = both(u0, spike, ran, steps=4, save_every="last")
    np.testing.assert_array_equal(loops.values, 0.0)  # finite at the end, without the check
    xr.testing.assert_identical(loops, xla)
    loops, xla = both(u0, spike, ran, steps=4, save_every="last", check_finite=True)
    assert isinstance(loops, XStencilError) and str(loops) == str(xla)
    assert "first appeared at position 1 along 'time'" in str(loops)


def test_nan_in_initial_data_same_error(ran: list[int]) -> None:
    u0 = field(1.0, np.float64)
    u0[3, 4] = np.nan
    before = u0.copy(deep=True)
    errors = []
    for backend in ("loops", "xla"):
        with pytest.raises(XStencilError, match=r"check_finite=True: the initial state "
                           r"\(position 0 along 'time'\) already holds a NaN or Inf") as e:
            u0.stencil.scan(grow, "time", steps=3, boundary="periodic", backend=backend,
                            check_finite=True)
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    xr.testing.assert_identical(u0, before)
    # without the check both run, and agree (NaN spreading alike)
    loops, xla = both(u0, grow, ran, steps=3)
    np.testing.assert_array_equal(np.isnan(loops.values), np.isnan(xla.values))


def test_repeat_calls_check_too(ran: list[int]) -> None:
    """The repeat-call fast path reruns the loop: it checks as the first call."""
    good, bad = field(1.0), field(1e30)
    k = first_bad(grow_numpy(bad.values, 12))
    for _ in range(2):
        out = good.stencil.scan(grow, "time", steps=3, boundary="periodic", backend="loops",
                                check_finite=True)
        np.testing.assert_allclose(out.values, np.stack(grow_numpy(good.values, 3)),
                                   rtol=1e-5)
        with pytest.raises(XStencilError, match=f"first appeared at position {k} along"):
            bad.stencil.scan(grow, "time", steps=12, boundary="periodic", backend="loops",
                             check_finite=True)
        nan = good.copy()
        nan[0, 0] = np.inf
        with pytest.raises(XStencilError, match="the initial state .* already holds"):
            nan.stencil.scan(grow, "time", steps=3, boundary="periodic", backend="loops",
                             check_finite=True)
    assert len(ran) >= 4


def test_dataset_with_an_integer_variable(ran: list[int]) -> None:
    """Only floating-point variables are checked (as on XLA); a Dataset's
    advanced variables are all checked."""
    u = field(1e30)
    ds = xr.Dataset({"u": u, "n": (("y", "x"), np.ones(u.shape, np.int32))})

    def k(s: Any) -> dict[str, Any]:
        return {"u": 10 * s["u"](time=-1), "n": s["n"](time=-1) + s["n"](time=-1, x=1)}

    with np.errstate(over="ignore"):
        step = first_bad([u.values * np.float32(10) ** i for i in range(12)])
    loops, xla = both(ds, k, ran, steps=12, check_finite=True)
    assert isinstance(loops, XStencilError) and str(loops) == str(xla)
    assert f"position {step} along 'time'" in str(loops)
    ok, okx = both(ds, k, ran, steps=2, check_finite=True)
    xr.testing.assert_identical(ok, okx)


def test_mesh_scan_on_loops(ran: list[int]) -> None:
    u0 = field(1e30)
    m = u0.stencil.mesh(boundary="periodic")
    m[...] = lambda u: 10 * u(time=-1)
    m[{"x": 0}] = lambda u: u(time=-1)
    with np.errstate(over="ignore"):
        k = first_bad([u0.values * np.float32(10) ** i for i in range(12)])
    errors = []
    for backend in ("loops", "xla"):
        before = len(ran)
        with pytest.raises(XStencilError, match=f"first appeared at position {k} along") as e:
            m.scan("time", steps=12, check_finite=True, backend=backend)
        errors.append(str(e.value))
        assert len(ran) == before + (backend == "loops")
    assert errors[0] == errors[1]


def test_default_route_stays_on_loops(ran: list[int]) -> None:
    """512² per position: backend="auto" takes the loops with check_finite too."""
    u0 = field(1.0, n=512)
    out = u0.stencil.scan(grow, "time", steps=2, boundary="periodic", check_finite=True)
    assert len(ran) == 1
    np.testing.assert_allclose(out.values, np.stack(grow_numpy(u0.values, 2)), rtol=1e-5)
