"""What a user sees first: help() and IDE signatures of the accessor methods,
the reprs, the command line and the length of an error's traceback."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import traceback

import numpy as np
import pytest
import xarray as xr

import xstencil

METHODS = sorted(n for n, v in vars(xstencil.StencilAccessor).items()
                 if not n.startswith("_") and callable(v))


#: The accessor's object is the function's first argument, except here: the
#: method -> the parameter the object stands for (da.stencil.solve(operator)
#: is xstencil.solve(operator, rhs=da)).
DATA = {"solve": "rhs"}


def _data_parameter(name: str) -> str:
    return DATA.get(name) or next(iter(inspect.signature(getattr(xstencil, name)).parameters))


def _da() -> xr.DataArray:
    return xr.DataArray(np.arange(12.0).reshape(3, 4), dims=("y", "x"),
                        coords={"x": [0.0, 0.5, 1.0, 1.5]}, name="T")


def test_the_accessor_has_methods() -> None:
    assert {"map", "mesh", "scan"} <= set(METHODS)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("owner", [xr.DataArray, xr.Dataset])
def test_accessor_signature_is_the_function_minus_its_first_argument(owner: type,
                                                                     name: str) -> None:
    function = getattr(xstencil, name)
    want = [p for p in inspect.signature(function).parameters.values()
            if p.name != _data_parameter(name)]
    assert len(want) == len(inspect.signature(function).parameters) - 1
    # through the class (what help(xr.DataArray.stencil.map) and the API page read) ...
    on_class = list(inspect.signature(getattr(owner.stencil, name)).parameters.values())
    assert on_class[0].name == "self"
    assert on_class[1:] == want
    # ... and bound to an object (what IDEs and da.stencil.map? read)
    obj = _da() if owner is xr.DataArray else _da().to_dataset()
    bound = list(inspect.signature(getattr(obj.stencil, name)).parameters.values())
    assert bound == want
    assert inspect.signature(getattr(obj.stencil, name)).return_annotation == \
        inspect.signature(function).return_annotation


@pytest.mark.parametrize("name", METHODS)
def test_accessor_docstring_is_the_functions(name: str) -> None:
    doc = getattr(xr.DataArray.stencil, name).__doc__
    function_doc = getattr(xstencil, name).__doc__
    first = _data_parameter(name)
    assert doc.splitlines()[0] == function_doc.splitlines()[0]
    assert "Parameters" in doc and "Returns" in doc and "see xstencil" not in doc
    # the object's own entry is gone (it is self), every other parameter stays
    entry = rf"\n    {first}( :[^\n]*)?\n"
    assert re.search(entry, function_doc) and not re.search(entry, doc)
    assert len(doc.splitlines()) < len(function_doc.splitlines())


def test_accessor_methods_still_delegate() -> None:
    da = _da()
    k = lambda u: u(x=1) - u(x=-1)  # noqa: E731
    xr.testing.assert_identical(da.stencil.map(k, boundary="periodic"),
                                xstencil.map(da, k, boundary="periodic"))
    step = lambda u: u(y=-1) + 1.0  # noqa: E731
    xr.testing.assert_identical(da.stencil.scan(step, "y"), xstencil.scan(da, step, "y"))
    np.testing.assert_array_equal(da.stencil.scan(step, "y").values[:, 0], [0.0, 1.0, 2.0])


def test_accessor_repr() -> None:
    assert repr(_da().stencil) == \
        "<xstencil accessor .stencil on a DataArray (y: 3, x: 4): " + ", ".join(METHODS) + ">"
    assert repr(_da().to_dataset().stencil).startswith("<xstencil accessor .stencil on a Dataset")


def test_mesh_repr_lists_regions_in_order() -> None:
    da = _da()
    m = da.stencil.mesh(boundary="extend")
    assert "no regions" in repr(m) and "boundary='extend'" in repr(m)

    def interior(u):  # noqa: ANN001, ANN202
        return u()

    m[...] = interior
    m.loc[{"x": 0.0}] = lambda u: 1.0
    m[{"y": -1}] = interior
    m[da > 5] = lambda u: 0.0
    lines = repr(m).splitlines()
    assert lines[0] == ("<xstencil.Mesh over a DataArray (y: 3, x: 4), boundary='extend': "
                        "4 regions, later wins")
    assert [ln.split("=")[0].strip() for ln in lines[1:]] == \
        ["m[...]", "m.loc[{'x': 0.0}]", "m[{'y': -1}]", "m[<mask>]"]
    assert lines[1].endswith("= interior") and lines[2].endswith("= <lambda>")
    html = m._repr_html_()
    assert html.count("<tr>") == 5 and "m.loc[{&#x27;x&#x27;: 0.0}]" in html
    assert "_Loc" not in repr(m.loc) and "coordinate label" in repr(m.loc)


def test_errors_are_raised_from_the_public_call() -> None:
    da = _da()
    with pytest.raises(xstencil.XStencilError, match="dimension 'z' not found") as info:
        da.stencil.map(lambda u: u(z=1))
    files = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
    inside = [f for f in files if "xstencil" in f and "tests" not in f]
    assert len(inside) <= 2, files  # the accessor's line and the public function's raise
    m = da.stencil.mesh()
    with pytest.raises(xstencil.LabelError, match="label 7.0 not found") as info:
        m.loc[{"x": 7.0}] = lambda u: 1.0
    files = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
    assert len([f for f in files if "xstencil" in f and "tests" not in f]) <= 1, files


def test_a_kernels_own_error_keeps_its_frames() -> None:
    def bad(u):  # noqa: ANN001, ANN202
        return u() + undefined_name  # noqa: F821

    with pytest.raises(Exception) as info:  # noqa: B017, PT011 - whatever wraps it
        _da().stencil.map(bad, window={"x": 3})
    chain = [info.value, info.value.__cause__, info.value.__context__]
    tbs = [traceback.extract_tb(e.__traceback__) for e in chain if e is not None]
    assert any(f.name == "bad" for tb in tbs for f in tb)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "xstencil", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def test_cli_version_and_help() -> None:
    res = _cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"xstencil {xstencil.__version__}"
    demo = _cli("demo", "--help")
    assert demo.returncode == 0 and "heat" in demo.stdout and "``" not in demo.stdout
    bench = _cli("bench", "--help")
    assert bench.returncode == 0 and "benchmarks/engine.py" in bench.stdout
    assert "`" not in bench.stdout
