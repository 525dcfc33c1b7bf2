"""Packaging contract: version source, the engine/xarray split, py.typed, CI command."""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import re
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

import xstencil

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _version_from_source() -> str:
    """Read ``__version__`` from the file hatch takes the version from."""
    source = ROOT / PYPROJECT["tool"]["hatch"]["version"]["path"]
    match = re.search(
        r'^__version__\s*=\s*["\']([^"\']+)["\']', source.read_text(encoding="utf-8"), re.M
    )
    assert match, f"no __version__ line in {source}"
    return match.group(1)


def test_version_matches_pyproject_version_source() -> None:
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert xstencil.__version__ == _version_from_source()


def test_installed_metadata_version_matches() -> None:
    assert importlib.metadata.version("xstencil") == xstencil.__version__


# `import xstencil` registers the accessor and so imports xarray. To test the engine's
# own imports, the script below puts an empty `xstencil` package object in sys.modules
# (without running `xstencil/__init__.py`), then imports every module under
# `xstencil._engine` and checks after each one that xarray is still absent.
_ENGINE_IMPORT_SCRIPT = textwrap.dedent(
    """
    import importlib, importlib.util, pkgutil, sys

    spec = importlib.util.find_spec("xstencil")
    sys.modules["xstencil"] = importlib.util.module_from_spec(spec)
    engine = importlib.import_module("xstencil._engine")
    names = ["xstencil._engine"] + [
        info.name for info in pkgutil.walk_packages(engine.__path__, "xstencil._engine.")
    ]
    for name in names:
        importlib.import_module(name)
        if "xarray" in sys.modules:
            sys.exit(f"importing {name} imported xarray")
    print(len(names))
    """
)


def test_engine_does_not_import_xarray() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _ENGINE_IMPORT_SCRIPT], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 1


def test_py_typed_is_in_the_package() -> None:
    assert importlib.resources.files("xstencil").joinpath("py.typed").is_file()


@pytest.mark.slow
def test_wheel_ships_py_typed_and_version(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = tmp_path.glob("xstencil-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"xstencil-{xstencil.__version__}.dist-info/METADATA").decode()
    assert "xstencil/py.typed" in names
    assert "xstencil/__init__.py" in names
    assert f"\nVersion: {xstencil.__version__}\n" in metadata
    assert not any(name.startswith("tests/") for name in names)


def test_ci_runs_the_readme_test_commands() -> None:
    """`.ci/run` must run exactly the two test commands that README.md shows:
    everything but the slow tests, then the slow tests."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in ("TEST_COMMAND", "SLOW_COMMAND"):
        match = re.search(rf"^{name}='([^']+)'$", ci, re.M)
        assert match, f"{name}='...' not found in .ci/run"
        assert f"\n{match.group(1)}\n" in readme
        assert f'run_stage "${name}"' in ci
    fast = re.search(r"^TEST_COMMAND='([^']+)'$", ci, re.M).group(1)
    slow = re.search(r"^SLOW_COMMAND='([^']+)'$", ci, re.M).group(1)
    assert '-m "not slow"' in fast and "-m slow" in slow
