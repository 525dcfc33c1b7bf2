"""The OpenMP wait settings the loop backend applies before numba starts its
threads (``xstencil/_backends/loops.py::omp_env``): passive waiting with a
short spin, unless the user set either variable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from xstencil._backends import loops


def test_defaults_where_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    loops.omp_env()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert os.environ["GOMP_SPINCOUNT"] == loops.SPIN_COUNT == "10000"


def test_the_users_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    loops.omp_env()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    assert os.environ["GOMP_SPINCOUNT"] == "7"


@pytest.mark.slow  # a fresh process that compiles a loop map: 40 s on a loaded 2-core host
@pytest.mark.skipif(loops.numba is None, reason="needs numba (the cpu extra)")
def test_set_before_the_first_loop_map_runs() -> None:
    """In a fresh process, the first loop map (which starts numba's OpenMP
    threads) has set both variables by the time it returns, and its result
    is the numpy one."""
    script = textwrap.dedent("""
        import os
        for v in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
            os.environ.pop(v, None)
        import numpy as np, xarray as xr, xstencil
        a = np.arange(40.0).reshape(5, 8)
        out = xr.DataArray(a, dims=("y", "x")).stencil.map(
            lambda u: u(x=1) - u(x=-1), boundary="periodic", backend="loops")
        want = np.roll(a, -1, axis=1) - np.roll(a, 1, axis=1)
        assert np.array_equal(np.asarray(out), want)
        print(os.environ["OMP_WAIT_POLICY"], os.environ["GOMP_SPINCOUNT"])
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, check=False, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.split() == ["PASSIVE", "10000"]
