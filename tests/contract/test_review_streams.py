"""Review of streamed saves (xstencil._labelled.stream): a resume must never
quietly mix two runs or read positions that were never written."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

from xstencil._errors import XStencilError
from xstencil._labelled import stream

zarr = pytest.importorskip("zarr")

C = np.float32(0.25)


def heat(u):
    return u(time=-1) + C * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


def _u0(n: int = 16) -> xr.DataArray:
    x = np.random.default_rng(0).random(n).astype(np.float32)
    return xr.DataArray(x, dims="x", name="T")


OPTS = dict(dim="time", steps=6, save_every=1, dt=0.5, boundary="periodic")


def test_resume_refuses_a_marker_past_the_written_positions(tmp_path):
    """A marker counting more positions than the arrays hold (a store edited,
    or written by a broken run) must be refused: growing the arrays to the
    marker would return (or continue from) positions never computed."""
    store = tmp_path / "m.zarr"
    u0 = _u0()
    ref = u0.stencil.scan(heat, **OPTS)
    u0.stencil.scan(heat, **OPTS, store=store, segment=2)
    g = zarr.open_group(store, mode="r+")
    for name in ("T", "time"):
        g[name].resize((4,) + g[name].shape[1:])  # only 4 of the 7 positions kept
    for complete in (7, 5):  # the run's end, and a point inside it
        meta = dict(g.attrs[stream.STORE_KEY])
        meta["complete"] = complete
        g.attrs[stream.STORE_KEY] = meta
        with pytest.raises(XStencilError, match=rf"holds 4 saved positions along 'time' "
                                                rf"\(array '(T|time)'\) while its marker says "
                                                rf"{complete} are complete.*remove it"):
            u0.stencil.scan(heat, **OPTS, store=store, segment=2, resume=True)
    # the marker's own positions: resumes and equals the uninterrupted run
    meta["complete"] = 4
    g.attrs[stream.STORE_KEY] = meta
    out = u0.stencil.scan(heat, **OPTS, store=store, segment=2, resume=True)
    xr.testing.assert_identical(out.load(), ref)


class _Cfg:
    w = jnp.asarray(np.float32(0.25))


def scaled(u):
    return u(time=-1) + _Cfg.w * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


def test_resume_refuses_another_jax_array_read_through_an_attribute(tmp_path):
    store = tmp_path / "a.zarr"
    u0 = _u0()
    u0.stencil.scan(scaled, **OPTS, store=store)
    old = _Cfg.w
    try:
        _Cfg.w = jnp.asarray(np.float32(0.3))
        with pytest.raises(XStencilError, match=r"different run: the kernel"):
            u0.stencil.scan(scaled, **OPTS, store=store, resume=True)
    finally:
        _Cfg.w = old
    out = u0.stencil.scan(scaled, **OPTS, store=store, resume=True)  # same: accepted
    xr.testing.assert_identical(out.load(), u0.stencil.scan(heat, **OPTS))


def test_fingerprint_of_an_attribute_array_is_the_same_in_another_process(tmp_path):
    """The fingerprint must not hold Python's per-process (salted) hashes: a
    resume from another process with the same kernel is accepted."""
    code = textwrap.dedent("""
        import numpy as np, xarray as xr
        from xstencil._labelled.stream_fingerprint import fingerprint

        class Cfg:
            w = np.full(3, 0.25, np.float32)

        def k(u):
            return u(time=-1) * Cfg.w.sum()

        u0 = xr.DataArray(np.ones(4, np.float32), dims="x")
        print(fingerprint(u0, k, "time", (), {}, dict(steps=2, save_every=1))["kernel"])
    """)
    got = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env={"PYTHONHASHSEED": str(seed), "JAX_PLATFORMS": "cpu",
                                           "PATH": "/usr/bin:/bin"}).stdout
           for seed in (1, 2)}
    assert len(got) == 1, got


def _heat_nu(u, nu):
    return u(time=-1) + nu * (u(time=-1, x=1) - 2 * u(time=-1) + u(time=-1, x=-1))


def test_resume_refuses_a_partial_kernel_with_other_values(tmp_path):
    """A functools.partial kernel hides its function and bound values from the
    kernel walk: the fingerprint must still see them."""

    def make(nu):
        return functools.partial(_heat_nu, nu=np.float32(nu))

    store = tmp_path / "w.zarr"
    u0 = _u0()
    u0.stencil.scan(make(0.25), **OPTS, store=store)
    with pytest.raises(XStencilError, match=r"different run: the kernel"):
        u0.stencil.scan(make(0.125), **OPTS, store=store, resume=True)
    out = u0.stencil.scan(make(0.25), **OPTS, store=store, resume=True)
    xr.testing.assert_identical(out.load(), u0.stencil.scan(heat, **OPTS))


@pytest.mark.parametrize("every, segment", [(1, 3), (2, 3), (3, 4)])
def test_uneven_segments_and_resume_after_a_complete_run(tmp_path, monkeypatch, every, segment):
    """``segment`` not dividing the saved positions: the last segment is
    shorter; a resume of the finished run neither runs a step nor adds a
    position."""
    store = tmp_path / "u.zarr"
    u0 = _u0()
    opts = {**OPTS, "steps": 12, "save_every": every}
    ref = u0.stencil.scan(heat, **opts)
    out = u0.stencil.scan(heat, **opts, store=store, segment=segment)
    xr.testing.assert_identical(out.load(), ref)
    ran = []
    real = stream._segment
    monkeypatch.setattr(stream, "_segment", lambda *a, **k: ran.append(1) or real(*a, **k))
    again = u0.stencil.scan(heat, **opts, store=store, segment=segment, resume=True)
    assert ran == []
    xr.testing.assert_identical(again.load(), ref)
    assert zarr.open_group(store)["T"].shape[0] == ref.sizes["time"]


def test_resume_with_another_segment_size_is_bitwise_the_same(tmp_path):
    store = tmp_path / "s.zarr"
    u0 = _u0()
    ref = u0.stencil.scan(heat, **OPTS)
    u0.stencil.scan(heat, **OPTS, store=store, segment=2)
    g = zarr.open_group(store, mode="r+")
    meta = dict(g.attrs[stream.STORE_KEY])
    meta["complete"] = 3  # as if killed after position 2, the rest half-written
    g.attrs[stream.STORE_KEY] = meta
    g["T"][3:] = np.nan
    out = u0.stencil.scan(heat, **OPTS, store=store, segment=5, resume=True)
    xr.testing.assert_identical(out.load(), ref)
