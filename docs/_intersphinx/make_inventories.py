"""Write the offline intersphinx inventories ``docs/_intersphinx/<project>.inv``.

The docs link into the API docs of numpy, scipy, xarray, JAX and dask through
intersphinx.  When a project's site can be reached, ``docs/conf.py`` reads
that project's full inventory from the site; when it cannot (an offline
build, a CI machine without network), it falls back to the small inventory
written here, which lists only the names the xstencil docs reference, each
at its real public address.  So the nitpicky build (``sphinx-build -n -W``)
resolves those references, and renders them as external links, offline too.

Run from the repository root after adding a reference to a new external name
(the nitpicky build fails offline until the name is listed in ``OBJECTS``)::

    python docs/_intersphinx/make_inventories.py

The files are written with Sphinx's own inventory writer
(:meth:`sphinx.util.inventory.InventoryFile.dump`), so they have exactly the
format that the projects publish as ``objects.inv``.  The addresses follow
each site's layout (checked against the published pages): numpy, scipy and
xarray put one page per object under ``generated/``, JAX under
``_autosummary/`` (``jax.sharding`` classes on the module page), dask's
``ProgressBar`` is on its local-diagnostics page.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from sphinx.util.inventory import InventoryFile

HERE = Path(__file__).resolve().parent

#: project -> (site, version written in the header, {name: (py role type, page)});
#: the page is relative to the site, the anchor is always the full name.
OBJECTS: dict[str, tuple[str, str, dict[str, tuple[str, str]]]] = {
    "numpy": ("https://numpy.org/doc/stable/", "stable", {
        "numpy.pad": ("function", "reference/generated/numpy.pad.html"),
    }),
    "scipy": ("https://docs.scipy.org/doc/scipy/", "stable", {
        "scipy.ndimage.correlate": ("function",
                                    "reference/generated/scipy.ndimage.correlate.html"),
    }),
    "xarray": ("https://docs.xarray.dev/en/stable/", "stable", {
        "xarray.DataArray": ("class", "generated/xarray.DataArray.html"),
        "xarray.Dataset": ("class", "generated/xarray.Dataset.html"),
        "xarray.DataArray.rolling": ("method", "generated/xarray.DataArray.rolling.html"),
        "xarray.DataArray.sel": ("method", "generated/xarray.DataArray.sel.html"),
        "xarray.DataArray.isel": ("method", "generated/xarray.DataArray.isel.html"),
        "xarray.Dataset.to_zarr": ("method", "generated/xarray.Dataset.to_zarr.html"),
        "xarray.open_dataset": ("function", "generated/xarray.open_dataset.html"),
    }),
    "jax": ("https://docs.jax.dev/en/latest/", "latest", {
        "jax.Array": ("class", "_autosummary/jax.Array.html"),
        "jax.jit": ("function", "_autosummary/jax.jit.html"),
        "jax.devices": ("function", "_autosummary/jax.devices.html"),
        "jax.clear_caches": ("function", "_autosummary/jax.clear_caches.html"),
        "jax.make_mesh": ("function", "_autosummary/jax.make_mesh.html"),
        "jax.shard_map": ("function", "_autosummary/jax.shard_map.html"),
        "jax.make_array_from_callback": (
            "function", "_autosummary/jax.make_array_from_callback.html"),
        "jax.distributed.initialize": (
            "function", "_autosummary/jax.distributed.initialize.html"),
        "jax.experimental.multihost_utils.process_allgather": (
            "function", "_autosummary/jax.experimental.multihost_utils.process_allgather.html"),
        "jax.lax.custom_linear_solve": (
            "function", "_autosummary/jax.lax.custom_linear_solve.html"),
        "jax.scipy.sparse.linalg.gmres": (
            "function", "_autosummary/jax.scipy.sparse.linalg.gmres.html"),
        "jax.test_util.check_grads": ("function", "_autosummary/jax.test_util.check_grads.html"),
        "jax.sharding.Mesh": ("class", "jax.sharding.html"),
    }),
    "dask": ("https://docs.dask.org/en/stable/", "stable", {
        "dask.diagnostics.ProgressBar": ("class", "diagnostics-local.html"),
    }),
}


class _Domain:
    """The one domain of an offline inventory: Python objects."""

    name = "py"

    def __init__(self, objects: dict[str, tuple[str, str]]):
        self.objects = objects

    def get_objects(self) -> list[tuple[str, str, str, str, str, int]]:
        # (full name, display name, type, "docname" (the page), anchor, priority)
        return [(name, name, kind, page, name, 1) for name, (kind, page) in self.objects.items()]


def write(project: str, path: Path) -> None:
    """Write ``project``'s inventory to ``path`` with Sphinx's writer."""
    _site, version, objects = OBJECTS[project]
    domain = _Domain(objects)
    env = SimpleNamespace(config=SimpleNamespace(project=project, version=version),
                          domains=SimpleNamespace(sorted=lambda: [domain]))
    builder = SimpleNamespace(get_target_uri=lambda page: page)
    InventoryFile.dump(path, env, builder)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    out = Path(argv[0]) if argv else HERE
    for project in OBJECTS:
        write(project, out / f"{project}.inv")
        print(f"wrote {out / f'{project}.inv'} ({len(OBJECTS[project][2])} names)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
