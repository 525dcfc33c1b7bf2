"""Every gallery script (docs/examples/plot_*.py) runs at a small size and makes a figure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
SCRIPTS = sorted(EXAMPLES.glob("plot_*.py"))

RUNNER = """
import runpy, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
runpy.run_path(sys.argv[1], run_name="__main__")
nums = plt.get_fignums()
assert nums, "the example made no figure"
for i in nums:
    plt.figure(i).savefig(f"{sys.argv[2]}/figure{i}.png", dpi=50)
print("figures:", len(nums))
"""


def test_the_gallery_is_there() -> None:
    assert len(SCRIPTS) >= 8, SCRIPTS


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_example_runs_and_plots(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "XSTENCIL_GALLERY_SMALL": "1", "MPLBACKEND": "Agg"}
    # warnings are errors, as in the test suite (e.g. a float64 constant
    # silently truncated to float32 by JAX)
    res = subprocess.run([sys.executable, "-W", "error", "-c", RUNNER, str(script),
                          str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=300, check=False, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    pngs = sorted(tmp_path.glob("figure*.png"))
    assert pngs and all(p.stat().st_size > 5_000 for p in pngs)


def test_examples_have_a_title_and_a_size_switch() -> None:
    for script in SCRIPTS:
        text = script.read_text()
        assert text.startswith('"""\n'), script.name  # sphinx-gallery's title block
        assert "XSTENCIL_GALLERY_SMALL" in text, script.name
