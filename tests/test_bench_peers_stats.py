"""benchmarks/peers.py's dense timing: fast columns sampled in sub-rounds of their
own, in alternating order, and ratios paired by sub-round."""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path

import pytest

PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"


@pytest.fixture(scope="module")
def peers():  # noqa: ANN201
    saved = list(sys.path)  # peers.py puts benchmarks/ on sys.path for its helpers
    try:
        sys.path.insert(0, str(PEERS.parent))
        spec = importlib.util.spec_from_file_location("xstencil_bench_peers", PEERS)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path[:] = saved


def test_paired_is_the_median_of_same_sub_round_ratios(peers) -> None:  # noqa: ANN001
    a = [(1, 2.0, 5.0), (2, 9.0, 1.0), (3, 3.0, 3.0), (7, 100.0, 100.0)]
    b = [(1, 1.0, 1.0), (2, 3.0, 2.0), (3, 2.0, 1.0), (8, 1.0, 1.0)]
    # sub-rounds 7 and 8 have no partner; the others pair one to one
    assert peers.paired(a, b) == pytest.approx(statistics.median([2.0, 3.0, 1.5]))
    assert peers.paired(a, b, cpu=True) == pytest.approx(statistics.median([5.0, 0.5, 3.0]))
    assert peers.paired(a[3:], b) is None


def _columns(calls: list[str]) -> dict:
    def col(name: str, seconds: float):  # noqa: ANN202
        def run() -> None:
            calls.append(name)
            time.sleep(seconds)
        return run

    # over 10 ms (one call a sample), under FAST_S; and one over FAST_S
    return {"a": col("a", 0.012), "b": col("b", 0.012), "slow": col("slow", 0.07)}


def test_measure_samples_fast_columns_in_alternating_sub_rounds(peers) -> None:  # noqa: ANN001
    assert 0.012 < peers.FAST_S < 0.07
    calls: list[str] = []
    got: dict = {}
    rounds, repeat = 2, 3
    med, first = peers.measure(_columns(calls), rounds, repeat=repeat, samples=got)
    assert set(med) == set(first) == {"a", "b", "slow"}
    for name in ("a", "b", "slow"):
        assert len(med[name]) == 2 and len(got[name]) == 2  # two passes
        assert all(m >= 0.012 for m in med[name])
    for p in range(2):
        a, b, slow = (got[n][p] for n in ("a", "b", "slow"))
        assert len(a) == len(b) == rounds * repeat and len(slow) == rounds
        assert [s[0] for s in a] == [s[0] for s in b]  # the fast pair shares sub-rounds
        assert not {s[0] for s in slow} & {s[0] for s in a}  # the slow one has its own
        assert all(s[1] > 0 and s[2] >= 0 for s in a + b + slow)
    # after the first, settling (a second call each) and warm calls, the fast pair
    # alternates its order sub-round by sub-round, each timed call after an untimed
    # one (steady state), and the slow column closes each round without one
    assert calls[:9] == ["a", "a", "b", "b", "slow", "slow", "a", "b", "slow"]
    timed = calls[9:]
    per_round = ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b", "slow"]
    assert timed == per_round * (2 * rounds)
    for name in ("a", "b"):  # the untimed call is not in the sample: one call's time
        assert statistics.median(s[1] for p in range(2) for s in got[name][p]) < 0.024


def test_measure_default_is_one_interleaved_round(peers) -> None:  # noqa: ANN001
    calls: list[str] = []
    got: dict = {}
    peers.measure(_columns(calls), 2, samples=got)
    assert calls[9:] == ["a", "a", "b", "b", "slow"] * 4  # fast columns: untimed call first
    for p in range(2):
        subs = [[s[0] for s in got[n][p]] for n in ("a", "b", "slow")]
        assert subs[0] == subs[1] == subs[2]  # one sub-round per round, all columns in it
