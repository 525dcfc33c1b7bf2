"""xstencil: labelled stencil computations on xarray objects, lowered to JAX.

``import xstencil`` registers the ``.stencil`` accessor on
:class:`xarray.DataArray` and :class:`xarray.Dataset`.  The array API
(:func:`kmap`, :func:`kscan`, :func:`smap`, :func:`sscan`) is a drop-in for
kernex 0.2.
"""

from xstencil import _fork as _fork
from xstencil._accessor import StencilAccessor as StencilAccessor
from xstencil._accessor import register as _register
from xstencil._backends.dask import compile_count as compile_count
from xstencil._caches import clear_caches as clear_caches
from xstencil._engine.kernex import KernelMesh as KernelMesh
from xstencil._engine.kernex import kmap as kmap
from xstencil._engine.kernex import kscan as kscan
from xstencil._engine.kernex import smap as smap
from xstencil._engine.kernex import sscan as sscan
from xstencil._engine.window import Window as Window
from xstencil._engine.windowset import WindowSet as WindowSet
from xstencil._errors import CompileWarning as CompileWarning
from xstencil._errors import ConvergenceWarning as ConvergenceWarning
from xstencil._errors import KernelError as KernelError
from xstencil._errors import LabelError as LabelError
from xstencil._errors import WindowIndexError as WindowIndexError
from xstencil._errors import XStencilError as XStencilError
from xstencil._labelled import lenders as _lenders  # noqa: F401 - registers xarray lenders
from xstencil._labelled import pytree as _pytree
from xstencil._labelled import valuekeys as _valuekeys  # noqa: F401 - registers content keys
from xstencil._labelled.dispatch import sharded_hlo as sharded_hlo
from xstencil._labelled.dtypes import PrecisionWarning as PrecisionWarning
from xstencil._labelled.iterate import Converged as Converged
from xstencil._labelled.iterate import iterate as iterate
from xstencil._labelled.map import map as map
from xstencil._labelled.mesh import Mesh as Mesh
from xstencil._labelled.mesh import nearest as nearest
from xstencil._labelled.mesh_make import mesh as mesh
from xstencil._labelled.multihost import gather as gather
from xstencil._labelled.multihost import make_devices as make_devices
from xstencil._labelled.multihost import open_sharded as open_sharded
from xstencil._labelled.multihost import write_sharded as write_sharded
from xstencil._labelled.scan import scan as scan
from xstencil._labelled.solve import solve as solve

__version__ = "0.1.0"

__all__ = [
    "ConvergenceWarning",
    "Converged",
    "KernelError",
    "KernelMesh",
    "LabelError",
    "Mesh",
    "PrecisionWarning",
    "CompileWarning",
    "StencilAccessor",
    "Window",
    "WindowIndexError",
    "WindowSet",
    "XStencilError",
    "clear_caches",
    "compile_count",
    "gather",
    "kmap",
    "iterate",
    "kscan",
    "make_devices",
    "map",
    "mesh",
    "nearest",
    "open_sharded",
    "scan",
    "sharded_hlo",
    "smap",
    "solve",
    "sscan",
    "write_sharded",
    "__version__",
]

_register()
_pytree.register()  # DataArray and Dataset as JAX pytrees (jit/grad/vmap over labelled code)
