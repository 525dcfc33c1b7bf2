"""numba's on-disk cache for the generated loop nests.

numba compiles a loop nest of the CPU loop backend on its first call: about
1-2 s for a 5-point Laplacian and 2-5 s for a 5 x 5 to 9 x 9 weighted sum
(its ``parallel=True`` passes take half of that).  A script run again, or
a second process of a test suite or a dask worker, paid it again for the
same nest.  :func:`njit_source` writes each generated source to a file named
by a digest of its text and compiles it with numba's ``cache=True``: numba
keeps the machine code beside the file (``__pycache__``), keyed by the
file's stamp, the argument types and the CPU, and a later process with the
same nest loads it (measured: a 5 x 5 weighted sum's first call, 2.8 s
compiled, 0.4 s loaded).

Why that cannot return stale code: a file's name is the digest of exactly
the text it holds (the nest, the ``np``/``prange`` header and the numba
options), a file is written once, atomically, and never rewritten, and the
nest reads nothing but its arguments, those two names and the ``rows``
function of the same file (an outlined nest's body).  numba checks the
file's stamp and its own version before it uses a cache entry.

Where: ``$XSTENCIL_CACHE_DIR/loops`` when set, else
``$XDG_CACHE_HOME/xstencil/loops`` (``~/.cache/xstencil/loops``).
``XSTENCIL_CACHE_DIR=off`` (or ``0``, ``none``) turns it off.  A directory
that cannot be used (not writable, or numba finds nowhere to keep its index)
is reported once at ``INFO`` level on the
``xstencil.loops`` logger and the nests compile in memory, as without it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - the loop backend is off without numba
    numba = None

__all__ = ["ENV", "directory", "njit_source"]

ENV = "XSTENCIL_CACHE_DIR"
_OFF = ("off", "0", "none", "false", "no")
_LOG = logging.getLogger("xstencil.loops")
_LOCK = threading.Lock()
_WARNED: set[str] = set()
_HEADER = "import numpy as np\nfrom numba import prange\n\n"


def directory() -> Path | None:
    """Where the nests' files go (``None``: the cache is off)."""
    env = os.environ.get(ENV)
    if env is not None and env.strip().lower() in _OFF:
        return None
    if env:
        return Path(env).expanduser() / "loops"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "xstencil" / "loops"


def njit_source(source: str, label: str, **options: Any) -> Any:
    """``numba.njit(**options)`` of the function ``kernel`` that ``source``
    defines (it may use ``np`` and ``prange``), cached on disk where it can
    be (see the module notes); ``label`` names it in tracebacks where not.
    A function ``rows`` that the source also defines (an outlined nest:
    :func:`xstencil._engine.loopnest.outline`) is compiled with the same
    options, serially, and ``kernel`` calls it."""
    where = directory()
    if where is not None:
        try:
            return numba.njit(cache=True, **options)(_from_file(where, source, options))
        # OSError: a read-only home, a full disk, a damaged file; RuntimeError: numba
        # finds no writable place for its index (a read-only directory of nests and no
        # writable user cache) and refuses cache=True as it decorates
        except (OSError, RuntimeError) as e:
            with _LOCK:
                if str(where) not in _WARNED:
                    _WARNED.add(str(where))
                    _LOG.info("loop nests compile in memory: cannot use the cache "
                              "directory %s (%s); set %s to another or to 'off'",
                              where, e, ENV)
    namespace: dict[str, Any] = {"np": np, "prange": numba.prange}
    exec(compile(source, label, "exec"), namespace)  # noqa: S102
    _serial_rows(namespace, options, cache=False)
    return numba.njit(**options)(namespace["kernel"])


def _serial_rows(namespace: dict[str, Any], options: dict[str, Any], cache: bool) -> None:
    """Compile the source's ``rows`` (where it has one), just executed, as
    ``kernel`` finds it, a global of its own namespace: with ``options`` but
    serial."""
    rows = namespace.get("rows")
    if rows is not None:
        serial = {k: v for k, v in options.items() if k != "parallel"}
        namespace["rows"] = numba.njit(cache=cache, **serial)(rows)


def _from_file(where: Path, source: str, options: dict[str, Any]) -> Any:
    """The function ``kernel`` of the module file holding ``source``,
    written first where it is missing."""
    text = _HEADER + f"# numba options: {sorted(options.items())!r}\n" + source
    digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
    name = f"xstencil_nest_{digest}"
    path = where / f"{name}.py"
    if not path.exists():
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".tmp-", suffix=".py")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o644)  # as a plain file (mkstemp makes it private)
            if not path.exists():  # another process may have written it meanwhile
                os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    elif path.read_text(encoding="utf-8") != text:  # not ours, or damaged: never trust it
        raise OSError(f"{path} does not hold the nest its name stands for")
    with _LOCK:
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise OSError(f"cannot import {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _serial_rows(vars(module), options, cache=True)
            sys.modules[name] = module
    return module.kernel
