"""Sphinx configuration for the xstencil documentation.

Build with ``sphinx-build -W -b html docs docs/_build/html`` (``-W``: warnings
are errors).  ``XSTENCIL_GALLERY_SMALL=1`` runs the gallery at a small size
(what the test suite does); ``XSTENCIL_DOCS_NO_GALLERY=1`` skips running it.

At start-up this file also

* checks that every name in ``xstencil.__all__`` and every public accessor
  method appears on the API page (``api.rst``), as optax does: a missing name
  is a warning, so the ``-W`` build fails;
* renders ``benchmarks/RESULTS.md`` into ``_generated/benchmarks.rst`` for the
  performance page;
* runs the bad inputs of the common-errors page and writes the messages they
  raise today into ``_generated/errors.rst``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import sphinx_autosummary_accessors

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import xstencil  # noqa: E402

project = "xstencil"
author = "xstencil developers"
copyright = "2026, xstencil developers"  # noqa: A001
release = version = xstencil.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "sphinx_autosummary_accessors",
    "sphinx_gallery.gen_gallery",
]

templates_path = ["_templates", sphinx_autosummary_accessors.templates_path]
exclude_patterns = ["_build", "**.ipynb_checkpoints", "examples/GALLERY_HEADER.rst"]
autosummary_generate = True
autodoc_typehints = "none"
autodoc_default_options = {"members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
default_role = "py:obj"
nitpicky = False

html_theme = "pydata_sphinx_theme"
html_title = f"xstencil {release}"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}

_small = os.environ.get("XSTENCIL_GALLERY_SMALL", "") not in ("", "0")
sphinx_gallery_conf = {
    "examples_dirs": "examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "plot_gallery": os.environ.get("XSTENCIL_DOCS_NO_GALLERY", "") in ("", "0"),
    "abort_on_example_error": True,
    # always rerun: the cache is keyed on the script, not on XSTENCIL_GALLERY_SMALL,
    # so a small test build would otherwise leave small figures for the real one
    "run_stale_examples": True,
    "only_warn_on_example_error": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "show_signature": False,
    "write_computation_times": True,
    "min_reported_time": 10**6,
}


# -- the API page lists every public name --------------------------------------------------
def _api_names() -> set[str]:
    text = (HERE / "api.rst").read_text()
    return set(re.findall(r"^\s{3,}([A-Za-z_][\w.]*)\s*$", text, flags=re.M))


def missing_from_api() -> list[str]:
    """Public names that the API page does not list (used by the tests too)."""
    listed = _api_names()
    want = [n for n in xstencil.__all__ if not n.startswith("__")]
    out = [f"xstencil.{n}" for n in want if n not in listed]
    methods = [m for m in vars(xstencil.StencilAccessor) if not m.startswith("_")]
    for owner in ("DataArray", "Dataset"):
        out += [f"{owner}.stencil.{m}" for m in methods if f"{owner}.stencil.{m}" not in listed]
    return out


# -- benchmarks/RESULTS.md -> rst ---------------------------------------------------------------
def _inline(s: str) -> str:
    s = re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r"\1", s)  # links: keep the text
    s = re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", s)
    return s


def _cells(line: str) -> list[str]:
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [_inline(p.strip().replace("\\|", "|")) or " " for p in parts]


def markdown_to_rst(md: str) -> str:
    """Just enough markdown (headings, tables, lists, paragraphs) for RESULTS.md."""
    out: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("|"):
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            rows = [_cells(b) for b in block if not re.fullmatch(r"[\s|:\-]+", b)]
            width = max(len(r) for r in rows)
            out += ["", ".. list-table::", "   :header-rows: 1", ""]
            for r in rows:
                r = r + [" "] * (width - len(r))
                out.append(f"   * - {r[0]}")
                out += [f"     - {c}" for c in r[1:]]
            out.append("")
            continue
        m = re.match(r"^(#+)\s+(.*)$", line)
        if re.fullmatch(r"\s*<!--.*-->\s*", line):
            pass  # section markers of the benchmark scripts
        elif m:
            out += ["", f".. rubric:: {_inline(m.group(2))}", ""]
        elif line.startswith("```"):
            out += ["", "::", ""]
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                out.append("   " + lines[i])
                i += 1
            out.append("")
        else:
            out.append(_inline(line))
        i += 1
    return "\n".join(out) + "\n"


def write_benchmarks(gen: Path) -> None:
    results = ROOT / "benchmarks" / "RESULTS.md"
    if results.is_file():
        body = markdown_to_rst(results.read_text())
    else:
        body = ("The benchmark results (``benchmarks/RESULTS.md``) have not been generated "
                "in this checkout. Run ``python benchmarks/engine.py`` to produce them.\n")
    _write(gen / "benchmarks.rst", body)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def _on_builder_inited(app) -> None:  # noqa: ANN001
    from sphinx.util import logging

    log = logging.getLogger("xstencil.docs")
    for name in missing_from_api():
        log.warning("public name %s is missing from docs/api.rst; add it to the API page", name)
    gen = HERE / "_generated"
    write_benchmarks(gen)
    import errors_catalogue

    _write(gen / "errors.rst", errors_catalogue.render())
    if not (HERE / "scaling.rst").is_file():
        log.info("docs/scaling.rst is not there yet; the index leaves it out")


def _on_source_read(app, docname, source) -> None:  # noqa: ANN001
    if docname == "index" and not (HERE / "scaling.rst").is_file():
        source[0] = re.sub(r"^\s+scaling\s*$\n", "", source[0], flags=re.M)


def setup(app):  # noqa: ANN001, ANN201
    app.connect("builder-inited", _on_builder_inited)
    app.connect("source-read", _on_source_read)
