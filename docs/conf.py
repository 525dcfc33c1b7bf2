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
  raise today into ``_generated/errors.rst``;
* renders ``CHANGELOG.md`` into ``_generated/changelog.rst`` for the what's-new
  page.

Cross-references are checked (``nitpicky = True``; the test builds with
``-n -W``).  Links into the docs of Python, numpy, scipy, xarray, JAX and dask
go through intersphinx.  Their inventories are read from the projects'
sites; when a site cannot be reached within a few seconds (an offline build,
CI without network: set ``XSTENCIL_DOCS_OFFLINE=1`` to skip the probe), from
the small inventory ``docs/_intersphinx/<name>.inv`` shipped with the docs
(written by ``docs/_intersphinx/make_inventories.py``: the names these docs
reference, at their real public addresses), so the references still resolve
and render as external links.  Only a project with neither is left out; its
references are then accepted unresolved (``nitpick_ignore_regex``) and
render as plain code.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

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
    "sphinx.ext.intersphinx",
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
nitpicky = True

# -- intersphinx, with an offline fallback ------------------------------------------------
_SITES = {
    "python": "https://docs.python.org/3/",
    "numpy": "https://numpy.org/doc/stable/",
    "scipy": "https://docs.scipy.org/doc/scipy/",
    "xarray": "https://docs.xarray.dev/en/stable/",
    "jax": "https://docs.jax.dev/en/latest/",
    "dask": "https://docs.dask.org/en/stable/",
}
# the top-level names each project documents (for the offline fallback)
_PACKAGES = {"python": ["collections", "typing", "functools", "math"],
             "numpy": ["numpy"], "scipy": ["scipy"], "xarray": ["xarray"],
             "jax": ["jax"], "dask": ["dask"]}


def _reachable(url: str, timeout: float = 3.0) -> bool:
    if os.environ.get("XSTENCIL_DOCS_OFFLINE", "") not in ("", "0"):
        return False
    host = urlparse(url).hostname or ""
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _intersphinx() -> tuple[dict[str, tuple[str, str | None]], list[str]]:
    mapping: dict[str, tuple[str, str | None]] = {}
    offline: list[str] = []
    for name, url in _SITES.items():
        local = HERE / "_intersphinx" / f"{name}.inv"
        if _reachable(url):  # the site's full inventory (the shipped one if that fails)
            mapping[name] = (url, (None, str(local)) if local.is_file() else None)
        elif local.is_file():  # offline: the names these docs reference
            mapping[name] = (url, str(local))
        else:
            offline.append(name)
    return mapping, offline


intersphinx_mapping, INTERSPHINX_OFFLINE = _intersphinx()
intersphinx_timeout = 10
nitpick_ignore_regex = [
    (r"py:.*", rf"{pkg}(\..*)?")
    for name in INTERSPHINX_OFFLINE for pkg in _PACKAGES[name]
]
nitpick_ignore_regex += [(r"py:.*", r"(Any|Callable|Mapping|Sequence|optional)")]

html_theme = "pydata_sphinx_theme"
html_title = f"xstencil {release}"
html_static_path = ["_static"]
html_css_files = ["xstencil.css"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    # every top-level section in the header at 1280 px, none hidden under "More"
    "header_links_before_dropdown": 7,
    "navbar_align": "left",
    "icon_links": [],
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
    # no stray reprs (<matplotlib.legend.Legend ...>) after a block's last line;
    # what an example prints still shows
    "capture_repr": (),
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
    # a bare "|x|" (max |difference|) would be an rst substitution reference:
    # escape pipes outside the inline literals
    parts = re.split(r"(``.+?``)", s)
    return "".join(p if p.startswith("``") else p.replace("|", r"\|") for p in parts)


def _plain(s: str) -> str:
    s = re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r"\1", s)
    return s.replace("`", "")


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
        elif m:  # headings are plain text: inline code would break into stacked boxes
            out += ["", f".. rubric:: {_plain(m.group(2))}", ""]
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


def changelog_to_rst(md: str) -> str:
    """CHANGELOG.md as reStructuredText: ``##`` releases become sections, ``###``
    subsections, list items keep their continuation lines."""
    out: list[str] = []
    for line in md.splitlines():
        m = re.match(r"^(#+)\s+(.*)$", line)
        if m and len(m.group(1)) == 1:
            continue  # the file's own title; the page has one
        if m:
            title = _plain(m.group(2))
            out += ["", title, ("-" if len(m.group(1)) == 2 else "~") * len(title), ""]
        elif line.startswith("- "):
            out.append("* " + _inline(line[2:]))
        elif line.startswith("  ") and out and out[-1].strip():
            out.append("  " + _inline(line.strip()))
        else:
            out.append(_inline(line))
    return "\n".join(out) + "\n"


# -- the API pages show what users call, not internals -----------------------------------
_HIDDEN = {
    ("Mesh", "regions"),  # engine regions for a plan (used by the backends)
    ("Window", "tree_flatten"), ("Window", "tree_unflatten"),
    ("WindowSet", "tree_flatten"), ("WindowSet", "tree_unflatten"),
    ("KernelMesh", "tree_flatten"), ("KernelMesh", "tree_unflatten"),
}


#: classes that users get from the library, never construct: their pages show
#: no constructor signature (internal arguments), only what users write
_NO_CONSTRUCTOR = {"xstencil.Window", "xstencil.WindowSet", "xstencil.Mesh",
                   "xstencil.KernelMesh", "xstencil.StencilAccessor"}


def _signature(app, what, name, obj, options, signature, return_annotation):  # noqa: ANN001, ANN202
    if what == "class" and name in _NO_CONSTRUCTOR:
        return "", None
    return None


def _skip_member(app, what, name, obj, skip, options):  # noqa: ANN001, ANN202
    owner = getattr(obj, "__qualname__", "").rpartition(".")[0]
    if name in {"tree_flatten", "tree_unflatten"}:
        return True
    if name == "indexers":  # nearest's field: documented under Parameters
        return True
    if owner and (owner.split(".")[-1], name) in _HIDDEN:
        return True
    qual = getattr(obj, "__qualname__", "")
    if qual.startswith(("Mapping.", "Collection.", "Sized.", "Iterable.", "Container.",
                        "tuple.")):
        return True  # inherited Mapping (WindowSet), tuple (Converged) methods: Python's
    return None


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
    _write(gen / "changelog.rst", changelog_to_rst((ROOT / "CHANGELOG.md").read_text()))
    if not (HERE / "scaling.rst").is_file():
        log.info("docs/scaling.rst is not there yet; the index leaves it out")


def _on_source_read(app, docname, source) -> None:  # noqa: ANN001
    if docname == "user_guide" and not (HERE / "scaling.rst").is_file():
        source[0] = re.sub(r"^\s+scaling\s*$\n", "", source[0], flags=re.M)


def setup(app):  # noqa: ANN001, ANN201
    app.connect("builder-inited", _on_builder_inited)
    app.connect("autodoc-skip-member", _skip_member)
    app.connect("autodoc-process-signature", _signature)
    app.connect("source-read", _on_source_read)
