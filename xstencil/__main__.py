"""Command line: ``python -m xstencil demo`` and ``python -m xstencil bench``."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from xstencil import __version__, _demo

BENCHMARKS = ("engine.py", "scan.py")


def benchmarks_dir() -> Path:
    """Where ``benchmarks/`` is in a source checkout (it is not in the wheel)."""
    return Path(__file__).resolve().parents[1] / "benchmarks"


def _bench(args: argparse.Namespace) -> int:
    bench = benchmarks_dir()
    root = bench.parent
    if not (bench / "engine.py").is_file():
        print(
            f"python -m xstencil bench: no benchmarks/ directory next to the package (looked in "
            f"{bench}). The benchmarks ship with the source, not with the wheel: clone the "
            f"repository, `pip install -e \".[bench]\"` there and rerun this command.",
            file=sys.stderr,
        )
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    status = 0
    for name in BENCHMARKS:
        script = bench / name
        if not script.is_file():
            continue
        cmd = [sys.executable, str(script), "--quick", *args.extra]
        print(f"+ {' '.join(cmd)}", flush=True)
        status = subprocess.run(cmd, cwd=root, env=env, check=False).returncode or status
    return status


def _plain(doc: str) -> str:
    """A reST docstring as terminal text: ``code`` becomes code."""
    return re.sub(r"``([^`]+)``", r"\1", doc)


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m xstencil`` argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m xstencil",
        description="xstencil: stencil kernels on labelled xarray data, run with JAX.",
    )
    p.add_argument("--version", action="version", version=f"xstencil {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    d = sub.add_parser(
        "demo",
        help="2-D heat equation on a plate with edges set by coordinate label: a scan with a "
        "progress bar; writes heat.nc and heat.png",
        description=_plain(_demo.__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _demo.add_arguments(d)
    d.set_defaults(func=_demo.main)
    b = sub.add_parser(
        "bench",
        help="a quick run of the benchmark tables (benchmarks/*.py --quick; needs a source "
        "checkout)",
        description="Run the benchmark scripts (benchmarks/engine.py and benchmarks/scan.py) "
        "with --quick: a few minutes of timings that print the ratio tables of "
        "benchmarks/RESULTS.md (xstencil against hand-written JAX, scipy.ndimage and, when "
        "installed, kernex). Needs a source checkout, installed with pip install -e \".[bench]\".",
    )
    b.add_argument("extra", nargs=argparse.REMAINDER,
                   help="more options for the benchmark scripts, e.g. --no-kernex")
    b.set_defaults(func=_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m xstencil``."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
