"""One Sphinx build of the docs per test run, shared by the tests that read it.

``tests/test_docs.py`` (the build must pass with ``-n -W``) and
``tests/test_site_browser.py`` (the built site in Chromium) both need the
site.  Under ``pytest -n 2`` they may run at the same time on two workers, and
two builds would write the same generated sources (``docs/generated``,
``docs/auto_examples``).  :func:`built_site` builds ``docs/_build/html`` under
a file lock, once per test run (xdist's run id, or the process id without
xdist), and returns it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
BUILD = DOCS / "_build"


def built_site() -> Path:
    """Build the site (small gallery, ``-n -W``) once per test run; its html dir."""
    html = BUILD / "html"
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid-{os.getpid()}"
    stamp = html / ".built-for-test-run"
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file() and stamp.read_text() == run_id:
            return html
        env = {**os.environ, "XSTENCIL_GALLERY_SMALL": "1", "MPLBACKEND": "Agg"}
        cmd = [sys.executable, "-m", "sphinx", "-n", "-W", "--keep-going", "-q", "-b", "html",
               "-d", str(BUILD / "doctrees"), str(DOCS), str(html)]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900,
                             check=False)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
        stamp.write_text(run_id)
    return html
