"""The markdown-to-rst conversion of benchmarks/RESULTS.md (docs/conf.py) keeps
a literal ``|`` literal: a bare ``|difference|`` is an rst substitution
reference, which fails the ``-W`` docs build."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import docutils.core
import docutils.utils
import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture(scope="module")
def conf():  # noqa: ANN201
    pytest.importorskip("sphinx_autosummary_accessors")
    spec = importlib.util.spec_from_file_location("xstencil_docs_conf_md", DOCS / "conf.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["xstencil_docs_conf_md"] = mod
    spec.loader.exec_module(mod)
    return mod


def _text(rst: str) -> str:
    """The rendered plain text; a docutils error raises (halt_level 2)."""
    doc = docutils.core.publish_doctree(rst, settings_overrides={"halt_level": 2,
                                                                 "report_level": 5})
    return doc.astext()


def test_pipes_in_text_lists_and_cells_stay_literal(conf) -> None:  # noqa: ANN001
    md = ("- step 9: max |difference| 7.8e-15 and `a|b`.\n\n"
          "| case | note |\n|---|---|\n| one | \\|x\\| small |\n")
    rst = conf.markdown_to_rst(md)
    text = _text(rst)
    assert "max |difference| 7.8e-15" in text
    assert "a|b" in text and "|x| small" in text
    assert "``a|b``" in rst  # inline literals are not escaped


def test_unescaped_pipes_would_fail(conf) -> None:  # noqa: ANN001
    with pytest.raises(docutils.utils.SystemMessage, match="substitution"):
        _text("- max |difference| 7.8e-15\n")
