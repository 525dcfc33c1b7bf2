"""The time-scan engine (``xstencil._engine.tscan``): its fused halo (built by
``xstencil._engine.boundary.pad``), its purity (no xarray), and the loop's
saving and checkpointing on raw arrays."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xstencil._engine.boundary import pad
from xstencil._engine.tscan import Loop, run_loop

NP_MODES = {"fill": "constant", "extend": "edge", "periodic": "wrap", "reflect": "reflect",
            "symmetric": "symmetric"}
PADS = [((1, 1), (1, 1)), ((2, 0), (0, 3)), ((0, 0), (1, 2)), ((3, 3), (2, 2))]


def test_nested_halo_equals_numpy_pad():
    x = np.arange(20.0).reshape(4, 5)
    cases = [(m, p) for m in NP_MODES for p in PADS]
    got = jax.jit(lambda a: [pad(a, p, [m, m], -7.0) for m, p in cases])(x)
    for (m, p), g in zip(cases, got, strict=True):
        kw = {"constant_values": -7.0} if m == "fill" else {}
        np.testing.assert_array_equal(np.asarray(g), np.pad(x, p, mode=NP_MODES[m], **kw),
                                      err_msg=f"{m} {p}")


def test_engine_modules_do_not_import_xarray():
    import ast

    import xstencil._engine.tscan as tscan
    import xstencil._progress as progress

    for mod in (tscan, progress):
        tree = ast.parse(Path(mod.__file__).read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(str(n).split(".")[0] == "xarray" for n in names), mod.__name__


@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("every", [0, 1, 3])
def test_run_loop_saves_and_counts(every, checkpoint):
    def step(t, hist):
        (h,) = hist
        return (h[-1] + t.astype(h[-1].dtype),)

    loop = Loop(start=1, steps=9, every=every, lo=1, hi=0, checkpoint=checkpoint)
    saved, bad = run_loop(step, [[jnp.zeros(2, jnp.float32)]], loop)
    totals = np.cumsum(np.arange(1, 10))  # value after step t is 1 + 2 + ... + t
    want = totals[-1:] if every == 0 else totals[every - 1::every]
    np.testing.assert_array_equal(np.asarray(saved[0])[:, 0], want)
    assert int(bad) == -1
