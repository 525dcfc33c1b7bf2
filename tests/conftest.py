"""Session-wide test configuration.

- JAX runs with strict dtype promotion, so a kernel that silently mixes dtypes
  (for example float32 data with a float64 constant array) fails in the tests.
- The ``x64`` fixture turns on float64 for one test only; everything else runs
  with JAX's default 32-bit mode, as users get it.
- Hypothesis profiles: ``ci`` (the default, 25 examples) and ``dev`` (200 examples).
  Pick one with the ``HYPOTHESIS_PROFILE`` environment variable.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import hypothesis
import jax
import pytest

jax.config.update("jax_numpy_dtype_promotion", "strict")

# Scripts that tests start as separate processes (they read sys.argv at import), not
# test modules: --doctest-modules must not import them.
# driver scripts run in their own interpreters (they set XLA_FLAGS at import, which
# would give the importing test process several simulated devices)
collect_ignore = ["backends/multiprocess_checks.py"]
collect_ignore_glob = ["backends/*_checks.py", "contract/*_cases.py"]

# JIT compilation makes the first example of a property test slow, so neither
# profile has a deadline.
hypothesis.settings.register_profile("ci", max_examples=25, deadline=None, print_blob=True)
hypothesis.settings.register_profile("dev", max_examples=200, deadline=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def x64() -> Iterator[None]:
    """Enable float64 in JAX for the duration of one test."""
    with jax.enable_x64(True):
        yield
