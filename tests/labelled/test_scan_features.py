"""Multi-stage steps (``step=``), gradients and checkpointing, progress bars."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil import _progress


def heat(u, nu):
    return u(time=-1) + nu * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


# -- multi-stage steps -----------------------------------------------------------------

def test_rk4_advection_matches_numpy_rk4(x64):
    nx, c, dt, steps = 32, 1.0, 0.01, 40
    x = np.linspace(0, 1, nx, endpoint=False)
    dx = x[1]
    u0 = xr.DataArray(np.exp(-100 * (x - 0.5) ** 2), dims="x", coords={"x": x})

    def rhs(s):
        return s.stencil.map(lambda u: -c * (u(x=1) - u(x=-1)) / (2 * dx), boundary="periodic")

    def rk4(s):
        k1 = rhs(s)
        k2 = rhs(s + dt / 2 * k1)
        k3 = rhs(s + dt / 2 * k2)
        k4 = rhs(s + dt * k3)
        return s + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)

    out = xstencil.scan(u0, step=rk4, steps=steps, dt=dt, save_every=10)

    def f(u):
        return -c * (np.roll(u, -1) - np.roll(u, 1)) / (2 * dx)

    u = u0.values.copy()
    ref = [u]
    for _ in range(steps):
        k1 = f(u)
        k2 = f(u + dt / 2 * k1)
        k3 = f(u + dt / 2 * k2)
        k4 = f(u + dt * k3)
        u = u + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        ref.append(u)
    assert out.dims == ("time", "x")
    np.testing.assert_allclose(out["time"].values, dt * np.arange(0, steps + 1, 10))
    np.testing.assert_allclose(out.values, np.stack(ref)[::10], rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(out["x"].values, x)


def test_rk2_on_a_dataset_with_a_constant(x64):
    nx, dt = 8, 0.05
    ds = xr.Dataset({"u": ("x", np.sin(np.linspace(0, 2 * np.pi, nx, endpoint=False))),
                     "k": ("x", np.linspace(1, 2, nx))})

    def rhs(s):
        return s.stencil.map(lambda w: {"u": w["k"]() * (w["u"](x=1) - w["u"](x=-1))},
                             boundary="periodic")["u"]

    def rk2(s):
        k1 = rhs(s)
        mid = s.assign(u=s.u + dt / 2 * k1)
        return {"u": s.u + dt * rhs(mid)}

    out = xstencil.scan(ds, step=rk2, steps=4, save_every="last")
    u, k = ds.u.values.copy(), ds.k.values

    def f(u):
        return k * (np.roll(u, -1) - np.roll(u, 1))

    for _ in range(4):
        u = u + dt * f(u + dt / 2 * f(u))
    np.testing.assert_allclose(out.u.values, u, rtol=1e-12)
    np.testing.assert_array_equal(out.k.values, k)
    assert out.k.dims == ("x",)


# -- gradients -------------------------------------------------------------------------

def _loss_fn(u0, data, checkpoint):
    def loss(nu):
        out = u0.stencil.scan(heat, "time", nu, steps=data.shape[0] - 1, boundary="periodic",
                              checkpoint=checkpoint)
        return jnp.mean((out.data - data) ** 2)

    return loss


def test_recover_diffusion_coefficient_by_gradient_descent(x64):
    x = np.linspace(0, 1, 16, endpoint=False)
    u0 = xr.DataArray(np.exp(-30 * (x - 0.5) ** 2), dims="x")
    true = u0.stencil.scan(heat, "time", jnp.asarray(0.3), steps=20, boundary="periodic")
    loss = jax.jit(jax.value_and_grad(_loss_fn(u0, true.data, checkpoint=True)))
    nu, lr = jnp.asarray(0.1), None
    for _ in range(100):
        value, g = loss(nu)
        lr = lr or 0.05 / abs(float(g))  # first step moves nu by 0.05
        nu = nu - lr * g
    assert abs(float(nu) - 0.3) < 1e-3, float(nu)


def test_checkpoint_gives_the_same_gradient_with_less_memory(x64):
    x = np.linspace(0, 1, 64, endpoint=False)
    u0 = xr.DataArray(np.sin(2 * np.pi * x), dims="x")
    data = jnp.zeros((401, 64))
    plain = jax.grad(_loss_fn(u0, data, checkpoint=False))
    ckpt = jax.grad(_loss_fn(u0, data, checkpoint=True))
    nu = jnp.asarray(0.2)
    np.testing.assert_allclose(ckpt(nu), plain(nu), rtol=1e-10)
    temp_plain = jax.jit(plain).lower(nu).compile().memory_analysis().temp_size_in_bytes
    temp_ckpt = jax.jit(ckpt).lower(nu).compile().memory_analysis().temp_size_in_bytes
    assert temp_ckpt < temp_plain


def test_checkpoint_with_save_every_and_last(x64):
    u0 = xr.DataArray(np.sin(np.linspace(0, 6, 16)), dims="x")

    def loss(nu, every, ck):
        out = u0.stencil.scan(heat, "time", nu, steps=24, save_every=every,
                              boundary="periodic", checkpoint=ck)
        return jnp.sum(out.data ** 2)

    for every in (4, "last"):
        a = jax.grad(loss)(jnp.asarray(0.2), every, False)
        b = jax.grad(loss)(jnp.asarray(0.2), every, True)
        np.testing.assert_allclose(a, b, rtol=1e-10)


def test_gradient_with_respect_to_initial_condition(x64):
    u0 = jnp.asarray(np.random.default_rng(0).random(8))

    def final_sum(a):
        out = xr.DataArray(a, dims="x").stencil.scan(heat, "time", 0.25, steps=5,
                                                     boundary="periodic", save_every="last")
        return jnp.sum(out.data)

    # periodic heat conserves the sum: d(sum)/d(u0) = 1
    np.testing.assert_allclose(jax.grad(final_sum)(u0), np.ones(8), rtol=1e-12)


# -- progress --------------------------------------------------------------------------

@pytest.mark.parametrize("every", [10, 1, "last"])
def test_progress_bar_is_fed_from_the_loop(x64, capsys, monkeypatch, every):
    # a due-report test after every step, and every test finds a report due
    monkeypatch.setattr(_progress, "CELLS_PER_CHECK", 1)
    monkeypatch.setattr(_progress, "INTERVAL", 0.0)
    seen = []
    original = _progress.report

    def spy(token, done):
        seen.append(int(done))
        original(token, done)

    monkeypatch.setattr(_progress, "report", spy)
    u0 = xr.DataArray(np.ones(6), dims="x")
    out = u0.stencil.scan(heat, "time", 0.1, steps=100, boundary="periodic", progress=True,
                          save_every=every)
    assert out.sizes.get("time", 1) == {10: 11, 1: 101, "last": 1}[every]
    # one update per step, in order, from inside the loop
    assert seen == list(range(1, 101))
    err = capsys.readouterr().err
    assert "100/100" in err
    assert not _progress._OPEN


def test_progress_off_by_default_is_silent(capsys):
    u0 = xr.DataArray(np.ones(6), dims="x")
    u0.stencil.scan(heat, "time", 0.1, steps=5, boundary="periodic")
    assert capsys.readouterr().err == ""


def test_progress_closes_on_interrupt():
    threads = threading.active_count()
    with pytest.raises(KeyboardInterrupt):
        with _progress.Progress(10, "test") as p:
            _progress.report(p.token, 3)
            raise KeyboardInterrupt
    assert p.closed and p.token not in _progress._OPEN
    assert threading.active_count() <= threads
    _progress.report(p.token, 5)  # a late callback is ignored


def test_progress_with_step_function(capsys):
    u0 = xr.DataArray(np.ones(4, np.float32), dims="x")
    xstencil.scan(u0, step=lambda s: s * 0.5, steps=3, progress=True)
    assert "3/3" in capsys.readouterr().err


def test_check_finite_in_step_function(x64):
    u0 = xr.DataArray(np.ones(4), dims="x")
    with pytest.raises(xstencil.XStencilError, match=r"first appeared at position 2 along "
                                                     r"'time' \(time=2\)"):
        xstencil.scan(u0, step=lambda s: s * 1e200, steps=5, check_finite=True)
