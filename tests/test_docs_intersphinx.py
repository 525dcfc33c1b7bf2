"""Cross-references into numpy, scipy, xarray, JAX and dask resolve offline.

CI has no network, so intersphinx cannot read the projects' inventories
there; ``docs/conf.py`` then falls back to the small inventories shipped in
``docs/_intersphinx/`` (written by ``make_inventories.py``).  These tests
check that the shipped files are what the script writes, that every address
lies on the project's public site, and that an offline nitpicky build renders
the references as external links (not as plain code).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.docs_build import built_site

DOCS = Path(__file__).resolve().parents[1] / "docs"
INV = DOCS / "_intersphinx"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_inventories",
                                                  INV / "make_inventories.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_inventories"] = mod
    spec.loader.exec_module(mod)
    return mod


def _load(path: Path, site: str) -> dict[str, dict[str, str]]:
    """``{role type: {name: absolute url}}`` read with Sphinx's own reader."""
    from sphinx.util.inventory import InventoryFile

    with open(path, "rb") as f:
        inv = InventoryFile.load(f, site, lambda base, uri: base + uri)
    return {kind: {name: _uri(item) for name, item in items.items()}
            for kind, items in inv.items()}


def _uri(item: object) -> str:
    """An inventory item's address: an attribute from Sphinx 8.2, a tuple's
    third field before."""
    return item.uri if hasattr(item, "uri") else item[2]  # type: ignore[index]


def test_shipped_inventories_are_what_the_script_writes(tmp_path: Path) -> None:
    pytest.importorskip("sphinx")
    mod = _script()
    assert mod.main([str(tmp_path)]) == 0
    for project, (site, _version, objects) in mod.OBJECTS.items():
        shipped = _load(INV / f"{project}.inv", site)
        fresh = _load(tmp_path / f"{project}.inv", site)
        assert shipped == fresh, f"re-run docs/_intersphinx/make_inventories.py ({project})"
        names = {n for items in shipped.values() for n in items}
        assert names == set(objects)


def test_addresses_are_on_the_projects_sites() -> None:
    pytest.importorskip("sphinx")
    mod = _script()
    conf_sites = dict(re.findall(r'"(\w+)": "(https://[^"]+)"',
                                 (DOCS / "conf.py").read_text().split("_PACKAGES", 1)[0]))
    for project, (site, _version, _objects) in mod.OBJECTS.items():
        assert conf_sites[project] == site  # the same base as intersphinx_mapping
        for items in _load(INV / f"{project}.inv", site).values():
            for name, url in items.items():
                # the object's own page (or its module's) with the full name as anchor
                assert url.startswith(site) and url.endswith(f".html#{name}"), (name, url)
                assert name.split(".")[0] == project


@pytest.mark.slow
@pytest.mark.docs
def test_offline_build_links_out() -> None:
    """The shared ``-n -W`` build: under ``XSTENCIL_DOCS_OFFLINE=1`` (as in CI)
    the references render as links to the projects' sites."""
    pytest.importorskip("sphinx_gallery")
    pytest.importorskip("pydata_sphinx_theme")
    # online, the build reads the sites' own inventories, which give the same addresses
    html = built_site()
    pages = {p.name: p.read_text() for p in html.rglob("*.html")}
    want = {
        "https://docs.xarray.dev/en/stable/generated/xarray.DataArray.html#xarray.DataArray",
        "https://docs.jax.dev/en/latest/_autosummary/jax.lax.custom_linear_solve.html"
        "#jax.lax.custom_linear_solve",
        "https://docs.jax.dev/en/latest/jax.sharding.html#jax.sharding.Mesh",
        "https://docs.dask.org/en/stable/diagnostics-local.html#dask.diagnostics.ProgressBar",
        "https://numpy.org/doc/stable/reference/generated/numpy.pad.html#numpy.pad",
    }
    hrefs = {h for text in pages.values() for h in re.findall(r'href="([^"]+)"', text)}
    assert want <= hrefs, sorted(want - hrefs)
