"""benchmarks/scale.py's peak memory per worker: the measurement sees an allocation,
and the report shows it."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

SCALE = Path(__file__).resolve().parents[1] / "benchmarks" / "scale.py"


@pytest.fixture(scope="module")
def scale():  # noqa: ANN201
    saved = list(sys.path)  # scale.py puts benchmarks/ on sys.path for its _harness
    try:
        spec = importlib.util.spec_from_file_location("xstencil_bench_scale", SCALE)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path[:] = saved


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux only")
def test_the_peak_sees_an_allocation_made_after_the_reset(scale) -> None:  # noqa: ANN001
    before = scale._reset_peak()
    assert before > 0
    block = np.ones(64 * 2**20 // 8)  # 64 MiB, written so that its pages are resident
    peak = scale._peak()
    del block
    assert peak - before >= 60 * 2**20
    # after a reset the old peak is gone: the peak is again about what is resident now
    now = scale._reset_peak()
    assert scale._peak() - now < 32 * 2**20


def test_the_report_shows_memory_per_worker(scale) -> None:  # noqa: ANN001
    mib = 2**20
    L = {"n": 64, "chunk": 16,
         "tasks": {"map periodic": 5.0, "map_overlap periodic": 25.0, "map extend": 4.0,
                   "map_overlap extend": 25.0, "scan periodic × periodic": 7.0},
         "compiles": {"periodic × periodic": [1, 1]},
         "memory": {"xstencil map": [(300 * mib, 310 * mib), (301 * mib, 320 * mib)]},
         "t": {"xstencil, threads": 0.1, "map_overlap + numpy, threads": 0.2,
               "xstencil, LocalCluster": 0.3, "map_overlap + numpy, LocalCluster": 0.4}}
    text = scale.lean_section(L)
    assert "| xstencil map | 310, 320 MiB | 300, 301 MiB | 10, 19 MiB |" in text
    assert "| periodic × periodic | [2, 2] | [1, 1] |" in text
    assert "| xstencil, threads | 100 ms | 0.50× | 43 ms |" in text
