"""The bad inputs shown on the common-errors page.

Each case is run when the docs build, so the page always shows the message
that this version of xstencil really raises.  ``tests/test_docs.py`` checks
that every case raises.
"""

from __future__ import annotations

import textwrap
import traceback
from dataclasses import dataclass

SETUP = """\
import numpy as np, xarray as xr, xstencil
da = xr.DataArray(np.random.rand(4, 5).astype("float32"), dims=("y", "x"),
                  coords={"y": np.arange(4.0), "x": np.linspace(0, 1, 5)})
ints = xr.DataArray(np.arange(5, dtype="int32"), dims="x")
ds = xr.Dataset({"u": da, "h": da})
"""


@dataclass
class Case:
    title: str
    code: str
    fix: str


CASES = [
    Case("A dim name that the data does not have",
         'da.stencil.map(lambda u: u(x=1), window={"z": 3})',
         "Window, boundary and stride keys are dim names of the data. Check ``da.dims``."),
    Case("A kernel that reads a dim the data lacks",
         "da.stencil.map(lambda u: u(z=1))",
         "Offsets are keyed by dim name; a typo or a transposed name shows up here."),
    Case("A read outside the declared window",
         'da.stencil.map(lambda u: u(x=2) - u(x=-2), window={"x": 3})',
         "Reads never wrap around the window (kernex's do). Widen ``window`` or leave it "
         "out and let xstencil infer it from the offsets the kernel reads."),
    Case("An unknown boundary mode",
         'da.stencil.map(lambda u: u(x=1), boundary="clamp")',
         "The modes are ``fill``, ``extend``, ``periodic``, ``reflect``, ``symmetric`` and "
         "``valid``. scipy.ndimage's and numpy's names ``wrap``, ``nearest``/``edge``, "
         "``mirror`` and ``constant`` are accepted; scipy's ``reflect`` is xstencil's "
         "``symmetric``."),
    Case("numpy, math or a Python if inside a kernel",
         "da.stencil.map(lambda u: u(x=1) if u() > 0.5 else u(x=-1))",
         "Kernels are traced: use ``jnp.where(u() > 0.5, u(x=1), u(x=-1))``, ``jnp.sin`` "
         "instead of ``np.sin`` or ``math.sin``, and no ``float()`` on window values."),
    Case("A kernel that returns nothing",
         "def k(u):\n    u(x=1) - u(x=-1)\nda.stencil.map(k)",
         "A missing ``return``; kernels return a number or an array per point."),
    Case("A dim name passed positionally",
         'da.stencil.map(lambda u: u("x"))',
         "Offsets are keywords: ``u(x=1)``; ``u[...]`` takes positional offsets."),
    Case("A coordinate that the window does not cover",
         'da.stencil.map(lambda u: u(x=1) * u.coord("y")())',
         'Put the dim in the window (``window={"y": 1, "x": 3}``); a 2-D coordinate '
         "becomes a Dataset variable."),
    Case("A DataArray passed as an extra kernel argument",
         "da.stencil.map(lambda u, w: u(x=1) * w, w=da)",
         "Put the field in a Dataset with the data and read it as ``s['w']()``; pass "
         "``.values`` for a constant array."),
    Case("Integer data with the default fill",
         "ints.stencil.map(lambda u: u(x=1) - u(x=-1))",
         "The default ``fill_value`` is NaN, which integers cannot hold. Pass "
         "``fill_value=0`` or pick another boundary mode."),
    Case("A window used as an array, with no window given",
         "da.stencil.map(lambda u: u.max())",
         "Whole-window operations (``u.sum()``, ``u * w``) do not say how big the window "
         "is, so it cannot be inferred: pass ``window={dim: size}``."),
    Case("A mesh label that is not in the coordinate",
         'm = da.stencil.mesh()\nm.loc[{"x": 0.3}] = lambda u: 0.0',
         "``.loc`` follows ``.sel``: labels must match exactly. Use "
         "``xstencil.nearest(x=0.3)`` to snap to the nearest label, or a slice."),
    Case("A mesh mask that is not boolean",
         "m = da.stencil.mesh()\nm[da] = lambda u: 0.0",
         "Masks select cells; build one with a comparison such as ``da > 0.5``."),
    Case("A Dataset kernel that reads a variable the Dataset lacks",
         'ds.stencil.map(lambda s: s["w"](x=1))',
         "``s[name]`` must name a data variable of the Dataset."),
    Case("Non-numeric data",
         'xr.DataArray(np.array(["a", "b", "c"]), dims="x").stencil.map(lambda u: u(x=1))',
         "Stencils run on bool, int, float or complex data."),
    Case("A plain array instead of a DataArray",
         "xstencil.map(np.zeros(3), lambda u: u(x=1))",
         "The labelled API needs dim names; wrap the array or use the array API "
         "(``xstencil.kmap``)."),
    Case("A scan that reads ahead while it grows a trajectory",
         'da.isel(y=0).stencil.scan(lambda u: u(time=-1) + u(time=1), dim="time", steps=3)',
         "With ``steps=N`` there is no input ahead of the current position; read the "
         "past with negative offsets (``u(time=-1)``)."),
    Case("steps that are not a whole number of saved intervals",
         'da.stencil.scan(lambda u: u(time=-1), dim="time", steps=10, save_every=3)',
         "The scan stops at the last saved position, so ``steps`` must be a multiple of "
         "``save_every``."),
]


def run(case: Case) -> BaseException:
    """Run one case and return the exception it raised."""
    env: dict = {}
    exec(SETUP, env)  # noqa: S102 - our own snippets
    try:
        exec(case.code, env)  # noqa: S102
    except Exception as e:  # noqa: BLE001 - that is the point
        return e
    raise AssertionError(f"the docs' bad-input case {case.title!r} did not raise")


def render() -> str:
    """The common-errors catalogue as reStructuredText."""
    out = []
    for case in CASES:
        e = run(case)
        msg = "".join(traceback.format_exception_only(type(e), e)).strip()
        msg = msg.split("\n-----")[0].replace("xstencil._errors.", "")  # drop JAX's note
        out += [case.title, "-" * len(case.title), "", ".. code-block:: python", ""]
        out += [textwrap.indent(case.code, "   "), "", "raises", "", ".. code-block:: text", ""]
        out += [textwrap.indent(textwrap.fill(msg, 88, break_long_words=False,
                                              break_on_hyphens=False), "   "), ""]
        out += [case.fix, ""]
    return "\n".join(out)
