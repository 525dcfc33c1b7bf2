"""The keyword options of each labelled call, written once.

Everything else a call receives as a keyword goes to the kernel.  The
tables serve three purposes: splitting a call's keywords into options and
kernel keywords (:func:`split_options`), suggesting the option a misspelled
keyword meant (:func:`options_for`, used by ``plan.unknown_keyword``), and
the option names a function mesh stores.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MAP", "SCAN", "MESH", "options_for", "split_options"]

#: ``map``'s options (``mesh`` is the deprecated spelling of ``devices``).
MAP = ("window", "boundary", "fill_value", "stride", "output_dims", "period", "devices", "mesh",
       "new_vars", "grid", "at", "dtype", "progress", "backend", "out")
#: ``scan``'s options, ``step=``, ``halo_every=`` and ``blocking=`` included.
SCAN = ("dim", "window", "boundary", "fill_value", "steps", "dt", "coord", "save_every",
        "period", "progress", "checkpoint", "check_finite", "step", "devices", "mesh",
        "halo_every", "grid", "at", "dtype", "store", "resume", "segment", "blocking",
        "backend")
#: The options ``xstencil.mesh(obj, ...)`` stores for its ``map`` and ``scan``.
MESH = ("window", "boundary", "fill_value", "stride", "output_dims", "period", "devices", "mesh",
        "new_vars", "grid", "at", "dtype", "backend")
#: The scan options the scale-out scans take from keywords (kernel keywords are the rest).
SCAN_KEYWORDS = tuple(k for k in SCAN
                      if k not in ("dim", "devices", "mesh", "halo_every", "grid", "at", "dtype",
                                   "store", "resume", "segment", "blocking", "backend"))


def options_for(call: str) -> tuple[str, ...]:
    """The options of the call named in ``call`` (``"da.stencil.map(...)"``...)."""
    if ".scan(" in call or "scan()" in call:
        return SCAN
    if ".map(" in call or "map()" in call:
        return MAP
    return tuple(dict.fromkeys(MAP + SCAN))


def split_options(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(scan options, kernel keyword arguments)."""
    opts = {k: v for k, v in kwargs.items() if k in SCAN_KEYWORDS}
    return opts, {k: v for k, v in kwargs.items() if k not in SCAN_KEYWORDS}
