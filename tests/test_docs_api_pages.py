"""The API pages show what users write, not internals (issue 16).

Reads the site that ``tests/docs_build.py`` builds once per test run.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from tests.docs_build import built_site

pytestmark = [pytest.mark.slow, pytest.mark.docs]

#: classes users get from the library and never construct
NO_CONSTRUCTOR = ["Window", "WindowSet", "Mesh", "KernelMesh", "StencilAccessor"]


def _text(path: Path) -> str:
    page = path.read_text()
    article = re.search(r"<article.*?</article>", page, re.S)
    assert article is not None, path
    return html.unescape(re.sub(r"<[^>]+>", "", article.group(0)))


def _signatures(path: Path) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", m)).replace("\n", " ").strip(" #")
            for m in re.findall(r'<dt class="sig sig-object py"[^>]*>(.*?)</dt>',
                                path.read_text(), re.S)]


@pytest.fixture(scope="module")
def generated() -> Path:
    pytest.importorskip("sphinx_gallery")
    pytest.importorskip("pydata_sphinx_theme")
    return built_site() / "generated"


@pytest.mark.parametrize("name", NO_CONSTRUCTOR)
def test_no_constructor_arguments(generated: Path, name: str) -> None:
    sigs = _signatures(generated / f"xstencil.{name}.html")
    assert sigs[0] == f"class xstencil.{name}", sigs[0]


def test_window_page_documents_the_reads(generated: Path) -> None:
    text = _text(generated / "xstencil.Window.html")
    for written in ('u(x=1, y=-1)', "u[1, -1]", 'u.coord("x")', "jnp.mean(u)"):
        assert written in text, written
    for internal in ("rolled", "absolute", "tree_flatten", "field"):
        assert internal not in text, internal


def test_windowset_page_documents_the_lookup(generated: Path) -> None:
    text = _text(generated / "xstencil.WindowSet.html")
    assert 's["u"](x=1)' in text and "s.u" in text
    for inherited in ("keys()", "items()", "values()", "get(key"):
        assert inherited not in text, inherited


def test_no_internal_members_on_any_page(generated: Path) -> None:
    for page in sorted(generated.glob("xstencil.*.html")):
        sigs = _signatures(page)
        for sig in sigs:
            assert not re.match(r"(__init__|tree_(un)?flatten|regions|count|index)\(", sig), (
                page.name, sig)
