"""
Fitting a diffusion coefficient with ``jax.grad``
=================================================

An inverse problem: a rod's temperature was measured once, at the end of an
experiment, and we want the diffusion coefficient ``kappa`` that explains it.
The forward model is a scan of the heat equation. ``kappa`` is passed to the
kernel as an extra argument; because it is a JAX array, it is traced, so
``jax.grad`` differentiates the loss through every time step, and changing it
does not recompile.
"""

import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import xstencil  # noqa: F401

SMALL = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")
n = 32 if SMALL else 64
x = np.linspace(0.0, 1.0, n)
dx = float(x[1] - x[0])
dt = 0.2 * dx**2  # stable for kappa < 2.5
steps = int(0.008 / dt)

T0 = xr.DataArray(
    (np.exp(-((x - 0.3) / 0.05) ** 2) + 0.5 * np.exp(-((x - 0.7) / 0.08) ** 2)).astype(
        np.float32),
    dims="x", coords={"x": ("x", x, {"units": "m"})}, name="T",
    attrs={"units": "K", "long_name": "temperature"},
)


def heat(u, kappa):
    lap = u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1)
    return u(time=-1) + kappa * dt / dx**2 * lap


def forward(kappa):
    """The rod at the end of the experiment, for a given kappa."""
    return T0.stencil.scan(heat, "time", kappa, steps=steps, dt=dt, save_every="last",
                           boundary={"x": "extend"})


true_kappa = 0.8
rng = np.random.default_rng(0)
observed = np.asarray(forward(jnp.float32(true_kappa)).values)
observed = observed + rng.normal(0, 0.005, n).astype(np.float32)


def loss(kappa):
    return jnp.mean((forward(kappa).data - observed) ** 2)


# %%
# Gradient descent on ``log(kappa)``, so that kappa stays positive.
value_and_grad = jax.jit(jax.value_and_grad(lambda logk: loss(jnp.exp(logk))))
logk = jnp.log(jnp.float32(0.2))
history = []
for _ in range(15 if SMALL else 30):
    value, grad = value_and_grad(logk)
    history.append((float(jnp.exp(logk)), float(value)))
    logk = logk - 40.0 * grad
kappa_fit = float(jnp.exp(logk))
print(f"true kappa {true_kappa}, fitted {kappa_fit:.4f}")

# %%
# The fit converges to the true coefficient, within the noise.
ks, losses = np.array(history).T
fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
ax0.plot(ks, "o-")
ax0.axhline(true_kappa, color="k", ls="--", label="true kappa")
ax0.set_xlabel("iteration")
ax0.set_ylabel("kappa")
ax0.legend()
ax0.set_title(f"fitted kappa = {kappa_fit:.3f}")
T0.plot(ax=ax1, color="0.6", label="initial")
ax1.plot(x, observed, ".", ms=4, label="observed")
forward(jnp.float32(kappa_fit)).plot(ax=ax1, label="fitted model")
ax1.legend()
ax1.set_title("rod temperature")
