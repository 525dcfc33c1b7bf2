"""The bad-input catalogue: every misuse gives a clear, early error.

Each case names the call, the argument and the bad value in its message, and
says what to do.  ``docs/errors.rst`` lists the same cases for users.  Option
errors are raised before the kernel is traced, and a bug inside a kernel is
reported with the kernel's name and the window it received.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

import xstencil
from xstencil import KernelError, LabelError, WindowIndexError, XStencilError


def _da() -> xr.DataArray:
    return xr.DataArray(
        np.arange(48.0).reshape(6, 8), dims=("y", "x"), name="T", attrs={"units": "K"},
        coords={"y": np.arange(6.0), "x": np.linspace(0.0, 1.4, 8)},
    )


DA = _da()
DS = xr.Dataset({"u": DA, "h": 2 * DA})
X1 = jnp.arange(6.0)


def lap(u: Any) -> Any:
    return u(x=1) + u(x=-1) - 2 * u()


def first(x: Any) -> Any:
    return x[1]


def total(x: Any) -> Any:
    return x.sum()


def _mesh_assign(key: Any, kernel: Any = lap, obj: Any = DA, loc: bool = False) -> Any:
    m = obj.stencil.mesh(boundary="extend")
    if loc:
        m.loc[key] = kernel
    else:
        m[key] = kernel
    return m.map()


def _kmesh(index: Any, n: int = 6) -> Any:
    f = xstencil.kmap(kernel_size=(3,))
    f[index] = first
    return f(jnp.ones(n))


def _mesh_run(**options: Any) -> Any:
    m = DA.stencil.mesh(**options)
    m[...] = lap
    return m.map()


def shape_bug(u: Any) -> Any:
    return u.array @ jnp.ones(5)


def heat(u: Any) -> Any:
    return u(time=-1) + 0.25 * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


U0 = xr.DataArray(np.linspace(0.0, 1.0, 8), dims="x")
U = xr.DataArray(np.random.default_rng(0).random((5, 8)), dims=("time", "x"))
M = "da.stencil.map(...)"
S = "da.stencil.scan(...)"
MESH = "da.stencil.mesh(...)"
DSM = "ds.stencil.map(...)"
E = re.escape

# (id, call, exception type, regex the message must match)
CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    # -- map: window ------------------------------------------------------------
    ("map-window-unknown-dim", lambda: DA.stencil.map(lap, window={"z": 3}), XStencilError,
     E(f"{M}: window={{'z': 3}}: dimension 'z' not found; available dims are ('y', 'x')")),
    ("map-window-zero", lambda: DA.stencil.map(lap, window={"x": 0}), XStencilError,
     E(f"{M}: window={{'x': 0}}: a window size must be >= 1; use {{'x': 3}}")),
    ("map-window-negative", lambda: DA.stencil.map(lap, window={"x": -3}), XStencilError,
     E("window={'x': -3}: a window size must be >= 1")),
    ("map-window-float", lambda: DA.stencil.map(lap, window={"x": 3.0}), XStencilError,
     E(f"{M}: window={{'x': 3.0}}: give a size (an int >= 1) or a (lo, hi) pair")),
    ("map-window-negative-pair", lambda: DA.stencil.map(lap, window={"x": (-1, 1)}),
     XStencilError, E("window={'x': (-1, 1)}: (lo, hi) count the cells") + ".*must be >= 0"),
    ("map-window-not-dict", lambda: DA.stencil.map(lap, window=[3, 3]), XStencilError,
     E(f"{M}: window=[3, 3] must be a dict mapping dim names to values, such as {{'x': 3}}")),
    ("map-window-huge", lambda: DA.stencil.map(lap, window={"x": 10**30}), XStencilError,
     E(f"{M}: window={{'x': {10**30}}} reaches") + ".*is not supported; use a smaller window"),
    ("map-valid-window-too-big",
     lambda: DA.stencil.map(total, window={"x": 9}, boundary="valid"), XStencilError,
     E(f"{M}: window={{'x': 9}} spans 9 cells along 'x', which has only 8; with boundary "
       "'valid' nothing is left")),
    ("map-infer-array-use", lambda: DA.stencil.map(total), XStencilError,
     E(f"{M}: cannot infer the window because the kernel uses the window as an array")
     + ".*pass window="),
    # -- map: boundary, stride, fill_value, output_dims, period -------------------
    ("map-boundary-unknown", lambda: DA.stencil.map(lap, boundary="clamp"), XStencilError,
     E(f"{M}: boundary='clamp' is not a boundary mode; use one of ('fill', 'extend', "
       "'periodic', 'reflect', 'symmetric', 'valid')")),
    ("map-boundary-none", lambda: DA.stencil.map(lap, boundary=None), XStencilError,
     E(f"{M}: boundary=None is not a boundary mode")),
    ("map-boundary-dict-mode", lambda: DA.stencil.map(lap, boundary={"x": "zero"}),
     XStencilError,
     E(f"{M}: boundary={{'x': 'zero'}}: 'zero' is not a boundary mode for dim 'x'; use one of")),
    ("map-boundary-dict-dim", lambda: DA.stencil.map(lap, boundary={"t": "periodic"}),
     XStencilError, E(f"{M}: boundary={{'t': 'periodic'}}: dimension 't' not found")),
    ("map-stride-zero", lambda: DA.stencil.map(lap, stride={"x": 0}), XStencilError,
     E(f"{M}: stride={{'x': 0}}: strides must be ints >= 1")),
    ("map-stride-float", lambda: DA.stencil.map(lap, stride=1.5), XStencilError,
     E(f"{M}: stride=1.5 must be a dict mapping dim names to values")),
    ("map-stride-dim", lambda: DA.stencil.map(lap, stride={"q": 2}), XStencilError,
     E(f"{M}: stride={{'q': 2}}: dimension 'q' not found")),
    ("map-int-fill-default", lambda: DA.astype("int32").stencil.map(lap), XStencilError,
     E(f"{M}: boundary 'fill' on int32 data needs fill_value=...") + ".*pass e.g. fill_value=0"),
    ("map-fill-not-number", lambda: DA.stencil.map(lap, fill_value="zero"), XStencilError,
     E(f"{M}: fill_value='zero' must be a number, such as fill_value=0.0")),
    ("map-fill-fraction-int", lambda: DA.astype("int32").stencil.map(lap, fill_value=0.5),
     XStencilError, E(f"{M}: fill_value=0.5 cannot be stored in int32 data")),
    ("map-fill-overflow-int8", lambda: DA.astype("int8").stencil.map(lap, fill_value=300),
     XStencilError, E(f"{M}: fill_value=300 cannot be stored in int8 data")),
    ("map-fill-complex-real", lambda: DA.stencil.map(lap, fill_value=1j), XStencilError,
     E(f"{M}: fill_value=1j cannot be stored in float64 data")),
    ("map-output-dims-repeat",
     lambda: DA.stencil.map(lambda u: u.array, window={"x": 3}, output_dims=("x",)),
     XStencilError, E(f"{M}: output_dims=('x',) repeats dim 'x' of the data")),
    ("map-output-dims-not-str", lambda: DA.stencil.map(lap, output_dims=3), XStencilError,
     E(f"{M}: output_dims=3 must be a dim name or a tuple of dim names")),
    ("map-period-not-dict",
     lambda: DA.stencil.map(lambda u: u.coord("x")(x=1), boundary="periodic", period=3.0),
     XStencilError, E(f"{M}: period=3.0 must be a dict mapping dim names to periods")),
    ("map-period-negative",
     lambda: DA.stencil.map(lambda u: u.coord("x")(x=1), boundary="periodic",
                            period={"x": -1.0}),
     XStencilError, E(f"{M}: period={{'x': -1.0}}: the period of 'x' must be a positive number")),
    ("map-reflect-one-point",
     lambda: DA.isel(y=slice(0, 1)).stencil.map(lambda u: u(y=1) + u(x=1), boundary="reflect"),
     XStencilError, E(f"{M}: boundary 'reflect' along 'y' needs at least 2 points, it has 1")
     + ".*" + E("use 'symmetric' along 'y'")),
    ("map-period-not-periodic",
     lambda: DA.stencil.map(lambda u: u.coord("x")(x=1), boundary="extend", period={"x": 1.6}),
     XStencilError, E(f"{M}: period={{'x': 1.6}}: the boundary of 'x' is 'extend', and a period "
                      "applies only across a periodic boundary") + ".*boundary=.'x': 'periodic'"),
    ("map-nonuniform-periodic-coord",
     lambda: DA.assign_coords(x=np.geomspace(1, 2, 8)).stencil.map(
         lambda u: u.coord("x")(x=1), boundary="periodic"),
     XStencilError, E(f"{M}: coordinate 'x' is not uniformly spaced") + ".*pass period="),
    ("map-periodic-coord-not-monotonic",
     lambda: DA.roll(x=3, roll_coords=True).stencil.map(
         lambda u: u.coord("x")(x=1), boundary="periodic", period={"x": 1.6}),
     XStencilError, E(f"{M}: boundary 'periodic' on 'x', whose coordinate is not monotonic")
     + ".*sortby"),
    # -- map: the kernel and the data ---------------------------------------------
    ("map-kernel-not-callable", lambda: DA.stencil.map(3), XStencilError,
     E(f"{M}: kernel=3 is not callable; pass a function of one window")),
    ("map-read-outside-window", lambda: DA.stencil.map(lambda u: u(x=2), window={"x": 3}),
     WindowIndexError,
     E(f"{M}: kernel '<lambda>': u read at offset 2 along 'x' is outside the window, which "
       "reaches offsets -1..1; widen the window")),
    ("map-read-unknown-dim", lambda: DA.stencil.map(lambda u: u(z=1)), XStencilError,
     E(f"{M}: kernel '<lambda>': u(z=...): dimension 'z' not found; available dims are")),
    ("map-read-float-offset", lambda: DA.stencil.map(lambda u: u(x=1.0)), XStencilError,
     E(f"{M}: kernel '<lambda>': u(x=1.0): offsets must be integers")),
    ("map-coord-missing", lambda: DA.stencil.map(lambda u: u() + u.coord("t")(x=1)),
     XStencilError, E(f"{M}: kernel '<lambda>': u.coord('t'): no coordinate 't' is available")),
    ("map-returns-array", lambda: DA.stencil.map(lambda u: u.array, window={"x": 3}),
     XStencilError, E(f"{M}: kernel '<lambda>' returned an array of shape (3,) per point; "
                      "name its dims with output_dims=")),
    ("map-returns-dict", lambda: DA.stencil.map(lambda u: {"a": u()}), XStencilError,
     E(f"{M}: kernel '<lambda>' returned a dict, which only a Dataset kernel may do")),
    ("map-string-data",
     lambda: xr.DataArray(np.array(["a", "b"]), dims="x").stencil.map(lambda u: u()),
     XStencilError, E(f"{M}: the data has dtype <U1, which is not numeric") + ".*astype"),
    ("map-scalar-data", lambda: xr.DataArray(1.0).stencil.map(lambda u: u()), XStencilError,
     E(f"{M}: the DataArray is a scalar; stencils need dims")),
    ("map-not-xarray", lambda: xstencil.map(np.ones(3), lap), XStencilError,
     E("xstencil.map(...): expected an xarray DataArray or Dataset, got ndarray")
     + ".*xarray.DataArray"),
    ("map-kernel-bug", lambda: DA.stencil.map(shape_bug, window={"y": 3, "x": 3}), KernelError,
     E(f"{M}: kernel 'shape_bug' failed on a window {{'y': 3, 'x': 3}} (TypeError: "
       "dot_general requires contracting dimensions")),
    ("map-misspelled-option", lambda: DA.stencil.map(lap, bondary="periodic"), XStencilError,
     E(f"{M}: unknown keyword bondary='periodic': extra keywords are passed to the kernel, "
       "and kernel 'lap' does not take 'bondary'; did you mean boundary=...?")),
    ("map-misspelled-option-explicit-window",
     lambda: DA.stencil.map(lap, window={"x": 3}, fill_vale=0.0), XStencilError,
     E(f"{M}: unknown keyword fill_vale=0.0") + ".*did you mean fill_value="),
    ("map-kernex-spelling", lambda: DA.stencil.map(lap, strides={"x": 2}), XStencilError,
     E(f"{M}: unknown keyword strides={{'x': 2}}") + ".*did you mean stride="),
    # -- Dataset ----------------------------------------------------------------
    ("ds-unknown-variable", lambda: DS.stencil.map(lambda s: s["q"](x=1)), XStencilError,
     E(f"{DSM}: kernel '<lambda>': s['q']: the Dataset has no data variable 'q'; "
       "available are ('u', 'h')")),
    ("ds-dict-key-not-str", lambda: DS.stencil.map(lambda s: {1: s["u"]()}), XStencilError,
     E(f"{DSM}: kernel '<lambda>' returned a dict with key 1; keys must be variable names")),
    ("ds-no-variables", lambda: xr.Dataset().stencil.map(lambda s: 1.0), XStencilError,
     E(f"{DSM}: the Dataset has no data variables")),
    ("ds-string-variable",
     lambda: DS.assign(c=("x", np.array(list("abcdefgh")))).stencil.map(lambda s: s["u"]()),
     XStencilError, E(f"{DSM}: data variable 'c' has dtype <U1, which is not numeric")),
    ("ds-int-fill-default",
     lambda: DS.assign(n=DA.astype("int16")).stencil.map(lambda s: s["u"](x=1)),
     XStencilError, E(f"{DSM}: boundary 'fill' on int16 data needs fill_value=...")),
    # -- mesh -------------------------------------------------------------------
    ("mesh-unknown-option", lambda: DA.stencil.mesh(bndry="fill"), XStencilError,
     E("unknown option(s) ['bndry']; accepted are ['at', 'backend', 'boundary', 'devices'")),
    ("mesh-no-regions", lambda: DA.stencil.mesh().map(), XStencilError,
     E(f"{MESH}: the mesh has no regions; assign kernels with m[...] = f")),
    ("mesh-bad-key", lambda: _mesh_assign(3), XStencilError,
     E(f"{MESH}: m[3] = ...: select with '...' (everywhere), a dict of positions")),
    ("mesh-kernel-not-callable", lambda: _mesh_assign(..., 3), XStencilError,
     E(f"{MESH}: m[Ellipsis] = 3: assign a kernel function")),
    ("mesh-unknown-dim", lambda: _mesh_assign({"z": 0}), XStencilError,
     E(f"{MESH}: m[{{'z': 0}}]: dimension 'z' not found; available dims are ('y', 'x')")),
    ("mesh-position-out-of-range", lambda: _mesh_assign({"x": 20}), XStencilError,
     E(f"{MESH}: m[{{'x': 20}}]: position 20 is out of range for dim 'x' of length 8")),
    ("mesh-label-missing", lambda: _mesh_assign({"x": 0.33}, loc=True), LabelError,
     E(f"{MESH}: m.loc[{{'x': 0.33}}]: label 0.33 not found in coordinate 'x'") +
     ".*xstencil.nearest"),
    ("mesh-label-no-index", lambda: _mesh_assign({"x": 0.2}, obj=DA.drop_vars("x"), loc=True),
     XStencilError, E(f"{MESH}: m.loc[{{'x': ...}}]: dim 'x' has no index coordinate")),
    ("mesh-loc-not-dict", lambda: _mesh_assign(0.3, loc=True), XStencilError,
     E(f"{MESH}: m.loc[0.3]: select with a dict of labels")),
    ("mesh-mask-not-bool", lambda: _mesh_assign(DA), XStencilError,
     E(f"{MESH}: m[mask] = ...: the mask has dtype float64; use a boolean DataArray")),
    ("mesh-mask-dims", lambda: _mesh_assign(xr.DataArray(np.ones(3, bool), dims="q")),
     XStencilError, E(f"{MESH}: m[mask] = ...: the mask has dims ('q',), and ['q'] are not")),
    ("mesh-mask-length", lambda: _mesh_assign(xr.DataArray(np.ones(3, bool), dims="x")),
     XStencilError, E(f"{MESH}: m[mask] = ...: the mask has length 3 along 'x' but the data "
                      "has 8")),
    # a mesh's options are checked when it runs
    ("mesh-bad-boundary", lambda: _mesh_run(boundary="clamp"), XStencilError,
     E("da.stencil.mesh(...).map(): boundary='clamp' is not a boundary mode")),
    ("mesh-bad-stride", lambda: _mesh_run(stride={"x": -2}), XStencilError,
     E("da.stencil.mesh(...).map(): stride={'x': -2}: strides must be ints >= 1")),
    # -- scan ---------------------------------------------------------------------
    ("scan-unknown-dim", lambda: U.stencil.scan(heat, dim="t"), XStencilError,
     E(f"{S}: dimension 't' not found; available dims are ('time', 'x') (to grow a "
       "trajectory from an initial state without 't', pass steps=N)")),
    ("scan-no-dim-no-steps", lambda: U0.stencil.scan(heat, dim="time"), XStencilError,
     E(f"{S}: dimension 'time' not found") + ".*pass steps=N"),
    ("scan-steps-negative", lambda: U0.stencil.scan(heat, dim="time", steps=-3),
     XStencilError, E(f"{S}: steps=-3 must be an int >= 1")),
    ("scan-save-every-zero", lambda: U0.stencil.scan(heat, dim="time", steps=4, save_every=0),
     XStencilError, E(f"{S}: save_every=0 must be an int >= 1 or 'last'")),
    ("scan-save-every-not-dividing",
     lambda: U0.stencil.scan(heat, dim="time", steps=5, save_every=2), XStencilError,
     E(f"{S}: steps=5 is not a multiple of save_every=2; use steps=4")),
    ("scan-grow-without-past-read",
     lambda: U0.stencil.scan(lambda u: u(x=1), dim="time", steps=3), XStencilError,
     E(f"{S}: the kernel reads no earlier position along 'time' (such as u(time=-1))")),
    ("scan-valid-boundary", lambda: U.stencil.scan(heat, dim="time", boundary="valid"),
     XStencilError, E(f"{S}: boundary 'valid' along 'x' would shrink each step's output")),
    ("scan-no-kernel", lambda: U.stencil.scan(None, dim="time"), XStencilError,
     E(f"{S}: kernel=None is not callable")),
    ("scan-kernel-and-step",
     lambda: U0.stencil.scan(heat, dim="time", step=lambda s: s, steps=2), XStencilError,
     E(f"{S}: pass a kernel or step=, not both")),
    ("scan-step-without-steps", lambda: xstencil.scan(U0, step=lambda s: s), XStencilError,
     E(f"{S}: step= grows a trajectory from an initial state; pass steps=N")),
    ("scan-dt-and-coord",
     lambda: U0.stencil.scan(heat, dim="time", steps=2, dt=1.0, coord=[1, 2, 3]),
     XStencilError, E(f"{S}: pass dt= or coord=, not both")),
    ("scan-coord-length",
     lambda: U0.stencil.scan(heat, dim="time", steps=2, coord=[1, 2, 3, 4, 5]),
     XStencilError, E(f"{S}: coord= has shape (5,); give 3 values")),
    ("scan-misspelled-option",
     lambda: U0.stencil.scan(heat, dim="time", steps=2, progres=True), XStencilError,
     E(f"{S}: unknown keyword progres=True") + ".*did you mean progress="),
    ("scan-input-longer-than-initial-conditions",
     lambda: U.stencil.scan(heat, dim="time", steps=3), XStencilError,
     E(f"{S}: steps=3 grows a trajectory from its initial conditions, which are the first 1 "
       "position(s) along 'time'")),
    ("scan-non-monotonic-time",
     lambda: U.assign_coords(time=[0.0, 2.0, 1.0, 3.0, 4.0]).stencil.scan(
         lambda u: u(time=-1) * u.coord("time")(), dim="time"),
     XStencilError, E(f"{S}: the kernel reads u.coord('time'), but coordinate 'time' does "
                      "not increase strictly")),
    ("scan-check-finite",
     lambda: U0.stencil.scan(lambda u: u(time=-1) / 0.0, dim="time", steps=3,
                             check_finite=True),
     XStencilError, E(f"{S}: check_finite=True: a NaN or Inf first appeared at position 1 "
                      "along 'time'")),
    ("scan-read-outside-window",
     lambda: U.stencil.scan(lambda u: u(time=-1, x=2), dim="time",
                            window={"time": (1, 0), "x": 3}),
     WindowIndexError, E(f"{S}: kernel '<lambda>': u read at offset 2 along 'x' is outside "
                         "the window")),
    ("mesh-scan-no-regions", lambda: U.stencil.mesh().scan(dim="time"), XStencilError,
     E("da.stencil.mesh(...).scan(): the mesh has no regions")),
    # -- the array API ------------------------------------------------------------
    ("kmap-no-kernel-size", lambda: xstencil.kmap(first)(X1), XStencilError,
     E("xstencil.kmap: kernel_size is required, e.g. kernel_size=(3,)")),
    ("kmap-unknown-argument", lambda: xstencil.kmap(kernel_siz=(3,)), XStencilError,
     E("xstencil.kmap: unknown argument(s) ['kernel_siz']; accepted are")),
    ("kmap-kernel-size-rank", lambda: xstencil.kmap(total, kernel_size=(3,))(jnp.ones((3, 3))),
     XStencilError, E("xstencil.kmap: kernel_size=(3,) has rank 1 but the array has shape "
                      "(3, 3); give one size per dim")),
    ("kmap-kernel-size-negative", lambda: xstencil.kmap(total, kernel_size=(-3,))(X1),
     XStencilError, E("xstencil.kmap: kernel_size=(-3,) holds -3; sizes must be positive ints")),
    ("kmap-kernel-size-int-2d", lambda: xstencil.kmap(total, kernel_size=3)(jnp.ones((3, 3))),
     XStencilError, E("xstencil.kmap: kernel_size=3 is a single int but the array has 2 dims")
     + ".*kernel_size=\\(3, 3\\)"),
    ("kmap-kernel-size-too-big", lambda: xstencil.kmap(total, kernel_size=(9,))(X1),
     XStencilError, E("xstencil.kmap: kernel_size 9 along axis 0 is larger than the padded "
                      "length 6")),
    ("kmap-strides-zero", lambda: xstencil.kmap(total, kernel_size=(3,), strides=(0,))(X1),
     XStencilError, E("xstencil.kmap: strides=(0,) holds 0; strides must be positive ints")),
    ("kmap-padding-unknown",
     lambda: xstencil.kmap(total, kernel_size=(3,), padding="full")(X1), XStencilError,
     E("xstencil.kmap: padding='full' holds 'full'; use 'same', 'valid', an int")),
    ("kmap-padding-huge",
     lambda: xstencil.kmap(total, kernel_size=(3,), padding=10**9)(X1), XStencilError,
     E(f"xstencil.kmap: padding={10**9} pads axis 0 (length 6) by") + ".*not supported"),
    ("kmap-boundary-unknown",
     lambda: xstencil.kmap(total, kernel_size=(3,), boundary="clamp")(X1), XStencilError,
     E("xstencil.kmap: boundary='clamp' is not a boundary mode; use one of")),
    ("kmap-valid-with-padding",
     lambda: xstencil.kmap(first, kernel_size=(3,), padding=1, boundary="valid")(X1),
     XStencilError, E("xstencil.kmap: boundary 'valid' along axis 0 has no halo, but "
                      "padding=1 pads it")),
    ("kmap-fill-not-number",
     lambda: xstencil.kmap(first, kernel_size=(3,), padding="same", fill_value="a")(X1),
     XStencilError, E("xstencil.kmap: fill_value='a' must be a number")),
    ("kmap-fill-int-overflow",
     lambda: xstencil.kmap(first, kernel_size=(3,), padding="same", fill_value=1000)(
         jnp.ones(6, jnp.int8)),
     XStencilError, E("xstencil.kmap: fill_value=1000 cannot be stored in int8 data")),
    ("kmap-named-axis-not-dict",
     lambda: xstencil.kmap(first, kernel_size=(3,), named_axis=["i"])(X1), XStencilError,
     E("xstencil.kmap: named_axis=['i'] must be a dict such as {0: 'i', 1: 'j'}")),
    ("kmap-named-axis-bad-name",
     lambda: xstencil.kmap(first, kernel_size=(3,), named_axis={0: "i+"})(X1), XStencilError,
     E("xstencil.kmap: named_axis={0: 'i+'} uses 'i+'; axis names must be identifiers")),
    ("kmap-named-axis-out-of-range",
     lambda: xstencil.kmap(first, kernel_size=(3,), named_axis={5: "i"})(X1), XStencilError,
     E("xstencil.kmap: named_axis={5: 'i'} names axis 5, but the array has 1 dims")),
    ("kmap-named-read-malformed",
     lambda: xstencil.kmap(lambda x: x["i++1"], kernel_size=(3,), named_axis={0: "i"})(X1),
     XStencilError, E("xstencil.kmap: kernel '<lambda>': x[...]: window index 'i++1': "
                      "expected a name with an optional offset, such as 'i', 'i+1'")),
    ("kmap-relative-read-outside",
     lambda: xstencil.kmap(lambda x: x[2], kernel_size=(3,), relative=True)(X1),
     WindowIndexError, E("xstencil.kmap: kernel '<lambda>': x read at offset 2 along axis 0 "
                         "is outside the window")),
    ("kmap-list-input", lambda: xstencil.kmap(total, kernel_size=(3,))([1.0, 2.0, 3.0]),
     XStencilError, E("xstencil.kmap: the input must be an array (numpy or JAX), got list")),
    ("kmap-scalar-input", lambda: xstencil.kmap(total, kernel_size=(3,))(jnp.float32(1)),
     XStencilError, E("xstencil.kmap: the input is a scalar; stencils need an array")),
    ("kmap-no-input", lambda: xstencil.kmap(first, kernel_size=(3,))(), XStencilError,
     E("xstencil.kmap: call the transform with an array")),
    ("kmap-kernel-bug", lambda: xstencil.kmap(lambda x: x + jnp.ones(5), kernel_size=(3,))(X1),
     KernelError, E("xstencil.kmap: kernel '<lambda>' failed on a window of shape (3,) "
                    "(TypeError: add got incompatible shapes")),
    ("kscan-returns-array", lambda: xstencil.kscan(lambda x: x, kernel_size=(3,))(X1),
     XStencilError, E("xstencil.kscan: kernel '<lambda>' returned shape (3,); a scan writes "
                      "each result back")),
    ("smap-negative-offset", lambda: xstencil.smap(first, kernel_size=(3,), offset=-1)(X1),
     XStencilError, E("xstencil.smap: offset=-1 holds (-1, -1) along axis 0; offsets count "
                      "positions skipped")),
    ("kmap-mesh-not-callable",
     lambda: xstencil.kmap(kernel_size=(3,)).__setitem__(0, 3), XStencilError,
     E("xstencil.kmap: F[0] = 3: a mesh region takes a kernel function")),
    ("kmap-mesh-index-rank", lambda: _kmesh((0, 0, 0)), XStencilError,
     E("xstencil.kmap: mesh index (0, 0, 0) has 3 entries but the output has 1 dims")),
    ("kmap-mesh-index-out-of-range", lambda: _kmesh(10), XStencilError,
     E("xstencil.kmap: mesh index 10 is out of range along axis 0, whose output length is 4")),
    ("kmap-mesh-mask-shape", lambda: _kmesh(np.ones(3, bool)), XStencilError,
     E("xstencil.kmap: a mask region has shape (3,) but the output has shape (4,)")),
]

@pytest.mark.parametrize(("call", "exc", "match"), [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_misuse(call: Callable[[], Any], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        call()


def test_catalogue_size() -> None:
    ids = [c[0] for c in CASES]
    assert len(set(ids)) == len(ids)
    assert len(ids) >= 30


def test_every_error_is_a_library_error() -> None:
    """Users can catch every bad-input error with XStencilError (or the
    IndexError/KeyError subclasses that Python convention asks for)."""
    assert issubclass(XStencilError, ValueError)
    assert issubclass(KernelError, XStencilError)
    assert issubclass(WindowIndexError, IndexError)
    assert issubclass(LabelError, KeyError)


# -- errors come before tracing -----------------------------------------------------

BAD_OPTIONS = [
    pytest.param({"boundary": "clamp"}, id="boundary"),
    pytest.param({"boundary": {"x": "zero"}}, id="boundary-dict"),
    pytest.param({"stride": {"x": 0}}, id="stride"),
    pytest.param({"stride": {"q": 1}}, id="stride-dim"),
    pytest.param({"fill_value": "zero"}, id="fill_value"),
    pytest.param({"window": {"z": 3}}, id="window"),
    pytest.param({"window": {"x": -1}}, id="window-size"),
    pytest.param({"output_dims": ("x",)}, id="output_dims"),
]


@pytest.mark.parametrize("options", BAD_OPTIONS)
def test_option_errors_do_not_call_the_kernel(options: dict[str, Any]) -> None:
    calls = []

    def kernel(u: Any) -> Any:
        calls.append(1)  # a Python side effect: runs whenever the kernel is traced
        return u(x=1) - u()

    with pytest.raises(XStencilError):
        DA.stencil.map(kernel, **options)
    with pytest.raises(XStencilError):
        m = DA.stencil.mesh(**options)
        m[...] = kernel
        m.map()
    assert calls == []


@pytest.mark.parametrize("options", BAD_OPTIONS[:-1] + [
    pytest.param({"save_every": 0}, id="save_every"),
    pytest.param({"steps": -1}, id="steps"),
    pytest.param({"dt": 1.0, "coord": [0.0, 1.0, 2.0, 3.0, 4.0]}, id="dt-and-coord"),
])
def test_scan_option_errors_do_not_call_the_kernel(options: dict[str, Any]) -> None:
    calls = []

    def kernel(u: Any) -> Any:
        calls.append(1)
        return u(time=-1) + 0.1 * u(time=-1, x=1)

    with pytest.raises(XStencilError, match=E(S)):
        U0.stencil.scan(kernel, **{"dim": "time", "steps": 4, **options})
    assert calls == []


@pytest.mark.parametrize("options", [
    pytest.param({"boundary": "clamp"}, id="boundary"),
    pytest.param({"strides": (0,)}, id="strides"),
    pytest.param({"padding": "full"}, id="padding"),
    pytest.param({"fill_value": None, "padding": "same"}, id="fill_value"),
    pytest.param({"named_axis": {3: "i"}}, id="named_axis"),
])
def test_array_api_option_errors_do_not_call_the_kernel(options: dict[str, Any]) -> None:
    calls = []

    def kernel(x: Any) -> Any:
        calls.append(1)
        return x.sum()

    with pytest.raises(XStencilError, match="xstencil.kmap: "):
        xstencil.kmap(kernel, kernel_size=(3,), **options)(X1)
    assert calls == []


def test_kernel_error_names_kernel_and_window() -> None:
    """A bug inside the kernel names the kernel and the window it got, and
    keeps the original exception as the cause."""

    def my_filter(u: Any) -> Any:
        return (u.array * jnp.ones((2, 2))).sum()

    with pytest.raises(KernelError, match=E("kernel 'my_filter' failed on a window "
                                            "{'y': 3, 'x': 5}")) as info:
        DA.stencil.map(my_filter, window={"y": 3, "x": 5})
    assert isinstance(info.value.__cause__, TypeError)

    with pytest.raises(KernelError, match=E("ds.stencil.map(...): kernel '<lambda>' failed")):
        DS.stencil.map(lambda s: my_filter(s["u"]), window={"y": 3, "x": 5})

    m = DA.stencil.mesh(window={"y": 3, "x": 5})
    m[{"x": 0}] = my_filter
    with pytest.raises(KernelError, match=E("da.stencil.mesh(...).map(): kernel 'my_filter' "
                                            "failed on a window {'y': 3, 'x': 5}")):
        m.map()


def test_kernel_error_while_inferring_the_window() -> None:
    def broken(u: Any) -> Any:
        return u(x=1) + jnp.ones(3) @ jnp.ones(4)

    with pytest.raises(KernelError, match=E(f"{M}: kernel 'broken' failed while its window was "
                                            "being inferred")):
        DA.stencil.map(broken)


# -- the docs page lists every case ------------------------------------------------------------

DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "errors.rst"


def _case_sources() -> dict[str, str]:
    """Each case's code, as written in this file (for the docs table)."""
    tree = ast.parse(Path(__file__).read_text())
    text = Path(__file__).read_text()
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple) and len(node.elts) == 4 and isinstance(
                node.elts[0], ast.Constant) and isinstance(node.elts[1], ast.Lambda):
            src = ast.get_source_segment(text, node.elts[1].body) or ""
            out[node.elts[0].value] = " ".join(src.split())
    return out


_HELPERS = {"_mesh_assign", "_mesh_run", "_kmesh"}


def _display(src: str) -> str:
    """A case's code as a user would write it: the calls of this file's helpers
    (``_mesh_assign`` and friends) spelled out."""
    node = ast.parse(src, mode="eval").body
    seg = lambda n: ast.get_source_segment(src, n) or ""  # noqa: E731
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "__setitem__" and len(node.args) == 2):  # f[k] = v
        key, value = (seg(a) for a in node.args)
        return f"f = {seg(node.func.value)}\nf[{key}] = {value}"
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _HELPERS):
        return src
    args = [seg(a) for a in node.args]
    kw = {k.arg: seg(k.value) for k in node.keywords}
    if node.func.id == "_mesh_assign":
        key = args[0]
        kernel = args[1] if len(args) > 1 else kw.get("kernel", "lap")
        obj = kw.get("obj", "DA")
        loc = ".loc" if kw.get("loc") == "True" else ""
        return (f'm = {obj}.stencil.mesh(boundary="extend")\nm{loc}[{key}] = {kernel}\n'
                f"m.map()")
    if node.func.id == "_mesh_run":
        opts = ", ".join(f"{k}={v}" for k, v in kw.items())
        return f"m = DA.stencil.mesh({opts})\nm[...] = lap\nm.map()"
    n = args[1] if len(args) > 1 else kw.get("n", "6")
    return f"f = xstencil.kmap(kernel_size=(3,))\nf[{args[0]}] = first\nf(jnp.ones({n}))"


def _indent(text: str) -> list[str]:
    return ["   " + line if line else "" for line in text.splitlines()]


def render_table() -> str:
    """The "full catalogue" of docs/errors.rst (``python tests/test_errors.py``):
    per case its id and exception, the code, and the message wrapped to fit a
    narrow column."""
    sources = _case_sources()
    rows: list[str] = []
    for cid, call, exc, _ in CASES:
        try:
            call()
        except exc as e:
            msg = str(e).split("\n")[0]
        else:  # pragma: no cover - test_misuse fails first
            raise AssertionError(f"{cid} did not raise")
        wrapped = textwrap.fill(msg, 76, break_long_words=False, break_on_hyphens=False)
        rows += [f"**{cid}** (``{exc.__name__}``)", "", ".. code-block:: python", "",
                 *_indent(_display(sources[cid])), "", ".. code-block:: text", "",
                 *_indent(wrapped), ""]
    return "\n".join(rows)


def test_docs_page_lists_every_case() -> None:
    """docs/errors.rst shows each case with a message its pattern still matches;
    regenerate the catalogue with ``python tests/test_errors.py`` after a change."""
    page = DOCS_PAGE.read_text()
    for cid, _, exc, match in CASES:
        row = re.search(rf"^\*\*{re.escape(cid)}\*\* \(``{exc.__name__}``\)\n\n"
                        rf"\.\. code-block:: python\n\n(?:   .*\n|\n)*?"
                        rf"\.\. code-block:: text\n\n((?:   .*\n)+)", page, flags=re.M)
        assert row, f"docs/errors.rst has no entry for {cid}; run python tests/test_errors.py"
        message = " ".join(line.strip() for line in row.group(1).splitlines())
        assert re.search(match, message), (cid, message)
    assert "_mesh_assign" not in page and "_kmesh" not in page


def test_catalogue_code_has_no_private_helpers() -> None:
    shown = [_display(src) for src in _case_sources().values()]
    assert not [c for c in shown if re.search(r"(?<![\w.])_\w+\(|__\w+__", c)]
    assert _display("_mesh_assign({'x': 0.33}, loc=True)") == (
        'm = DA.stencil.mesh(boundary="extend")\nm.loc[{\'x\': 0.33}] = lap\nm.map()')


if __name__ == "__main__":
    print(render_table())
