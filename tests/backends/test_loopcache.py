"""numba's disk cache of the loop nests (xstencil._backends.loopcache).

A second process with the same nest loads the machine code instead of
compiling it, and gets the same numbers; the cache can be turned off; a
directory that cannot be used, or a file that does not hold what its name
says, only costs the compile, never a wrong nest.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from xstencil._backends import loopcache  # noqa: E402

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, xarray as xr
    import xstencil
    import xstencil._backends.tiered as L  # where the loop nests are compiled
    made = []
    real = L.njit_source
    def spy(*a, **k):
        d = real(*a, **k)
        made.append(d)
        return d
    L.njit_source = spy
    a = np.random.default_rng(3).standard_normal((400, 300)).astype(np.float32)
    w = np.arange(1.0, 10.0, dtype=np.float32).reshape(3, 3)
    da = xr.DataArray(a, dims=("y", "x"))
    out = da.stencil.map(lambda u: (u * w).sum(), window={"y": 3, "x": 3},
                         boundary="periodic", backend="loops")
    got = np.asarray(out)
    ref = np.zeros_like(a)
    for i in range(3):
        for j in range(3):
            ref += w[i, j] * np.roll(a, (1 - i, 1 - j), axis=(0, 1))
    print(json.dumps({
        "hits": sum(len(d.stats.cache_hits) for d in made),
        "misses": sum(len(d.stats.cache_misses) for d in made),
        "nests": len(made),
        "bytes": got.tobytes().hex()[:4000],
        "err": float(np.abs(got - ref).max())}))
""")


def _run(env_dir: str) -> dict:
    env = dict(os.environ, XSTENCIL_CACHE_DIR=env_dir)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_nest_and_gets_the_same_numbers(tmp_path: Path) -> None:
    first = _run(str(tmp_path))
    second = _run(str(tmp_path))
    assert first["nests"] >= 1 and second["nests"] >= 1
    assert first["hits"] == 0 and first["misses"] >= 1
    assert second["hits"] >= 1 and second["misses"] == 0
    assert first["bytes"] == second["bytes"]
    assert first["err"] < 1e-4 and second["err"] < 1e-4
    files = list((tmp_path / "loops").glob("xstencil_nest_*.py"))
    assert files and any((tmp_path / "loops" / "__pycache__").glob("*.nbi"))


@pytest.mark.parametrize("value", ["off", "0", "None"])
def test_off_compiles_without_the_disk_cache(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loopcache.ENV, value)
    assert loopcache.directory() is None
    fn = loopcache.njit_source("def kernel(a):\n    return a + 1\n", "<t>")
    assert fn(2) == 3
    assert type(fn._cache).__name__ == "NullCache"


def test_same_text_same_file_other_text_other_file(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loopcache.ENV, str(tmp_path))
    src = ("def kernel(a):\n    s = 0.0\n    for i in prange(a.shape[0]):\n"
           "        s += a[i]\n    return s\n")
    f1 = loopcache.njit_source(src, "<t>", parallel=False)
    f2 = loopcache.njit_source(src, "<t>", parallel=False)
    f3 = loopcache.njit_source(src.replace("+= a[i]", "+= 2 * a[i]"), "<t>", parallel=False)
    f4 = loopcache.njit_source(src, "<t>", parallel=True)  # other options: other file
    x = np.arange(5.0)
    assert f1(x) == f2(x) == 10.0 and f3(x) == 20.0 and f4(x) == 10.0
    assert len(list((tmp_path / "loops").glob("xstencil_nest_*.py"))) == 3


def test_an_unusable_directory_compiles_in_memory(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(loopcache.ENV, str(blocker))
    with caplog.at_level(logging.INFO, logger="xstencil.loops"):
        fn = loopcache.njit_source("def kernel(a):\n    return a * 3\n", "<t>")
    assert fn(2) == 6
    assert any("cannot use the cache directory" in r.getMessage() and loopcache.ENV
               in r.getMessage() for r in caplog.records)


def test_a_file_that_does_not_hold_its_nest_is_not_used(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loopcache.ENV, str(tmp_path))
    src = "def kernel(a):\n    return a - 1\n"
    assert loopcache.njit_source(src, "<t>")(5) == 4
    (path,) = (tmp_path / "loops").glob("xstencil_nest_*.py")
    path.write_text(path.read_text().replace("a - 1", "a + 100"))  # damaged or planted
    # drop the good module this process imported, so that only the file's check stands
    # between the next call and the planted text
    sys.modules.pop(path.stem, None)
    assert loopcache.njit_source(src, "<t>")(5) == 4


def test_numba_refusing_cache_true_compiles_in_memory(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """numba raises RuntimeError ("no locator available") as it decorates when it
    finds no writable place for its index (a read-only directory of nests and no
    writable user cache): the nest compiles in memory instead of failing the map."""
    real = loopcache.numba.njit

    def njit(*args: object, **kwargs: object) -> object:
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function 'kernel': no locator available")
        return real(*args, **kwargs)

    monkeypatch.setattr(loopcache.numba, "njit", njit)
    monkeypatch.setenv(loopcache.ENV, str(tmp_path / "elsewhere"))
    with caplog.at_level(logging.INFO, logger="xstencil.loops"):
        fn = loopcache.njit_source("def kernel(a):\n    return a * 5\n", "<t>")
    assert fn(2) == 10
    assert type(fn._cache).__name__ == "NullCache"
    assert any("no locator available" in r.getMessage() for r in caplog.records)


FINITE = textwrap.dedent("""
    import json
    import numpy as np
    from xstencil._backends import finite
    a = np.arange(1000, dtype=np.float32)
    b = a.astype(np.float64)
    b[517] = np.nan
    got = [finite.all_finite(a), finite.all_finite(b), finite.all_finite(a[::-1])]
    d = finite._jitted()
    print(json.dumps({"got": got, "hits": len(d.stats.cache_hits),
                      "misses": len(d.stats.cache_misses)}))
""")


@pytest.mark.slow  # two fresh processes; the nests' disk cache is tested above in the fast run
def test_the_finiteness_check_is_cached_on_disk_too(tmp_path: Path) -> None:
    """``finite.all_finite`` (the host FFT's and ``check_finite``'s test)
    compiles its loop once per dtype; a second process loads both."""
    env = dict(os.environ, XSTENCIL_CACHE_DIR=str(tmp_path))
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", FINITE], env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0]["got"] == runs[1]["got"] == [True, False, True]
    assert runs[0]["hits"] == 0 and runs[0]["misses"] >= 2
    assert runs[1]["hits"] >= 2 and runs[1]["misses"] == 0
    files = (tmp_path / "loops").glob("xstencil_nest_*.py")
    assert any("flat.size" in f.read_text() for f in files)
