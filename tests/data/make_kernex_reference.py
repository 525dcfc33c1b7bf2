"""Regenerate tests/data/kernex_reference.npz from kernex 0.2.1.

Run it with a Python that has kernex installed (kernex is *not* a dependency of
xstencil; see tests/data/README.md):

    python tests/data/make_kernex_reference.py            # writes the .npz
    python tests/data/make_kernex_reference.py --check    # compare, write nothing

Every case of tests/kernex_cases.py is run with ``lib=kernex`` in float32 (JAX
default); the cases listed in ``F64_CASES`` are then run again with JAX's x64
flag on and ``dtype=np.float64`` and stored as ``NAME__f64``.  The archive also
holds ``__meta__``: a JSON string with the versions used.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
OUT = os.path.join(HERE, "kernex_reference.npz")


def build():
    # Imported here, not at module level: pytest --doctest-modules imports this
    # file during collection, where kernex is not installed.
    import jax
    import kernex

    if TESTS not in sys.path:
        sys.path.insert(0, TESTS)
    import kernex_cases

    results = {}
    with warnings.catch_warnings():
        # kernex casts float results into int arrays (kscan/smap/sscan on int input);
        # jax 0.10 warns about that scatter cast.  The cast is the behaviour we record.
        warnings.simplefilter("ignore", FutureWarning)
        for name in sorted(kernex_cases.CASES):
            results[name] = np.asarray(kernex_cases.run_case(name, kernex))
        jax.config.update("jax_enable_x64", True)
        try:
            for name in sorted(kernex_cases.F64_CASES):
                out = np.asarray(kernex_cases.run_case(name + "__f64", kernex))
                assert out.dtype == np.float64, (name, out.dtype)
                results[name + "__f64"] = out
        finally:
            jax.config.update("jax_enable_x64", False)
    meta = {
        "kernex": kernex.__version__,
        "jax": jax.__version__,
        "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else None,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "divergent": sorted(kernex_cases.DIVERGENT),
        "quirks": sorted(kernex_cases.QUIRKS),
    }
    return results, meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored file")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)

    results, meta = build()
    if args.check:
        stored = np.load(args.out)
        bad = []
        for name, value in results.items():
            if name not in stored.files:
                bad.append(f"{name}: missing from {args.out}")
                continue
            ref = stored[name]
            if ref.shape != value.shape or ref.dtype != value.dtype:
                bad.append(f"{name}: {ref.shape}/{ref.dtype} vs {value.shape}/{value.dtype}")
            elif not np.allclose(ref, value, rtol=1e-6, atol=1e-6, equal_nan=True):
                bad.append(f"{name}: values differ")
        print("\n".join(bad) if bad else f"{len(results)} arrays match")
        return 1 if bad else 0

    np.savez_compressed(args.out, __meta__=np.array(json.dumps(meta)), **results)
    print(f"wrote {len(results)} arrays to {args.out}")
    print(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
