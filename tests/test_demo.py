"""``python -m xstencil demo`` and ``bench``: the command line a new user runs first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from xstencil import __main__ as cli


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xstencil", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def _check_netcdf(path: Path, steps: int) -> None:
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        T = ds["T"].load()
    assert T.dims == ("time", "y", "x")
    assert T.sizes["y"] == T.sizes["x"] == 32
    assert T.attrs["units"] == "°C"
    assert ds["x"].attrs["units"] == "m" and ds["time"].attrs["units"] == "s"
    assert float(T.time[0]) == 0.0 and T.sizes["time"] >= 2
    assert np.isfinite(T.values).all()
    # the edges, set by coordinate label, stay at 0 °C; the plate cools
    assert float(abs(T.isel(time=-1, x=0)).max()) == 0.0
    assert float(abs(T.isel(time=-1, y=-1)).max()) == 0.0
    assert float(T.isel(time=-1).max()) < float(T.isel(time=0).max())
    assert ds.attrs["steps"] == steps


@pytest.mark.slow
def test_demo_no_plot(tmp_path: Path) -> None:
    res = _run("demo", "--steps", "50", "--size", "32", "--out", "tmp", "--no-plot",
               cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "grid        32 x 32" in res.stdout and "wall time" in res.stdout
    assert "max error" in res.stdout
    _check_netcdf(tmp_path / "tmp" / "heat.nc", 50)
    assert not (tmp_path / "tmp" / "heat.png").exists()


@pytest.mark.slow
def test_demo_with_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    res = _run("demo", "--steps", "50", "--size", "32", "--out", "tmp", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    png = tmp_path / "tmp" / "heat.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000
    _check_netcdf(tmp_path / "tmp" / "heat.nc", 50)


def test_demo_mode_decay_matches_analytic(tmp_path: Path) -> None:
    from xstencil import _demo

    res = _demo.run_demo(tmp_path, steps=200, size=32, make_plot=False, progress=False)
    assert res.mode_error < 1e-3
    assert res.trajectory.sizes["time"] == 41


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "bench" in out


def test_demo_rejects_tiny_sizes(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--size >= 8"):
        cli.main(["demo", "--size", "2", "--out", str(tmp_path)])


def test_bench_without_a_checkout_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "benchmarks_dir", lambda: tmp_path / "benchmarks")
    assert cli.main(["bench"]) == 2
    err = capsys.readouterr().err
    assert "not with the wheel" in err and "clone the repository" in err


def test_demo_names_missing_extras(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "h5netcdf" else real(name, *a))
    with pytest.raises(SystemExit, match=r"needs h5netcdf; install them with pip install"):
        cli.main(["demo", "--out", str(tmp_path)])
