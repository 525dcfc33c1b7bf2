"""The documentation: the API page is complete, the pages' examples run, the
common-errors catalogue raises, and the Sphinx site builds without warnings.

The full build (``test_docs_build``, via ``tests/docs_build.py``, which the
browser test shares) runs the gallery at its small size and takes well under
a minute on two cores, so CI runs it. To run it alone:
``python -m pytest -m docs tests/test_docs.py``; to skip it in a quick loop:
``python -m pytest -m "not slow"``.
"""

from __future__ import annotations

import doctest
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_build import built_site

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(p for p in DOCS.glob("*.rst") if ">>>" in p.read_text())


def _load(name: str, path: Path):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def conf():  # noqa: ANN201
    pytest.importorskip("sphinx_autosummary_accessors")
    return _load("xstencil_docs_conf", DOCS / "conf.py")


def test_api_page_lists_every_public_name(conf) -> None:  # noqa: ANN001
    assert conf.missing_from_api() == []


def test_api_check_catches_a_missing_name(conf, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    import xstencil

    monkeypatch.setattr(xstencil, "__all__", [*xstencil.__all__, "not_documented"])
    assert conf.missing_from_api() == ["xstencil.not_documented"]


def test_benchmark_markdown_becomes_a_table(conf) -> None:  # noqa: ANN001
    md = "## Maps\n\n| case | ratio |\n|---|---:|\n| `lap` 2048² | 1.02× |\n"
    rst = conf.markdown_to_rst(md)
    assert ".. rubric:: Maps" in rst and ".. list-table::" in rst
    assert "   * - ``lap`` 2048²\n     - 1.02×" in rst


def test_error_catalogue_cases_raise() -> None:
    cat = _load("xstencil_docs_errors", DOCS / "errors_catalogue.py")
    for case in cat.CASES:
        e = cat.run(case)
        assert "xstencil" in str(e) or "stencil" in str(e), (case.title, e)


def test_pages_have_runnable_examples() -> None:
    assert len(PAGES) >= 6


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_page_examples_run(page: Path) -> None:
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    res = doctest.testfile(str(page), module_relative=False, optionflags=flags,
                           verbose=False, report=True)
    assert res.failed == 0, f"{res.failed} of {res.attempted} examples failed in {page.name}"


@pytest.mark.slow
@pytest.mark.docs
def test_docs_build() -> None:
    pytest.importorskip("sphinx_gallery")
    pytest.importorskip("pydata_sphinx_theme")
    html = built_site()  # docs/_build/html, with -n -W; shared with the browser test
    assert (html / "generated" / "xarray.DataArray.stencil.map.html").is_file()
    assert (html / "auto_examples" / "plot_heat_dirichlet.html").is_file()
    assert "Common errors" in (html / "errors.html").read_text()


def _readme_taste() -> str:
    text = (DOCS.parent / "README.md").read_text()
    section = text.split("## A taste of the API", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_readme_quick_start_is_unchanged() -> None:
    text = (DOCS.parent / "README.md").read_text()
    assert 'pip install -e ".[demo]" && python -m xstencil demo' in text


@pytest.mark.slow
def test_readme_taste_runs(tmp_path: Path) -> None:
    code = _readme_taste()
    assert "stencil.map" in code and ".loc[" in code and ".scan(" in code
    res = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                         text=True, timeout=300, check=False, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "'time': 11" in res.stdout and "'x': 120" in res.stdout
