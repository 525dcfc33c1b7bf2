"""The built docs site as a reader sees it, in headless Chromium at 1280 px.

On every page: the main column and the navbar do not overflow sideways
(``scrollWidth <= clientWidth``), no code block is cut off on the right, and
the user guide, the gallery and the API reference are links in the header
(not hidden under a "More" dropdown, not clipped off the right edge).
Screenshots of the index, a user-guide page, an API page and a gallery
example go to ``docs/_build/screenshots`` for review.

It reads the site that ``tests/docs_build.py`` builds once per test run
(small gallery, ``-n -W``) into ``docs/_build/html``, and drives Chromium
over the DevTools protocol (``websocket-client``).  Install Chromium with
``apt-get install -y chromium`` (Debian); without it the test is skipped.
Run it alone with ``python -m pytest -m browser tests/test_site_browser.py``.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docs_build import BUILD, built_site

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WIDTH, HEIGHT = 1280, 900
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--hide-scrollbars", "--allow-file-access-from-files",
         "--disable-crash-reporter", "--disable-breakpad"]
# name: (page, element scrolled to the top of the view before the shot, or None)
SCREENSHOTS = {"index": ("index.html", None), "user-guide": ("meshes.html", None),
               "api": ("generated/xarray.DataArray.stencil.map.html", None),
               "gallery": ("auto_examples/plot_shallow_water.html", "img.sphx-glr-single-img, "
                           "img.sphx-glr-multi-img")}

MEASURE = """
(() => {
  const box = (sel) => {
    const e = document.querySelector(sel);
    return e ? [e.scrollWidth, e.clientWidth] : null;
  };
  const header = [...document.querySelectorAll(
      ".bd-header .navbar-header-items a.nav-link, .bd-header .navbar-nav a")];
  const shown = header.filter((a) => {
    const r = a.getBoundingClientRect();
    return a.offsetParent !== null && r.width > 0 && r.left >= 0 &&
           r.right <= window.innerWidth && !a.closest(".dropdown-menu");
  }).map((a) => a.textContent.trim());
  const wide = [...document.querySelectorAll(".bd-article *")].filter((e) => {
    const r = e.getBoundingClientRect();
    const art = document.querySelector(".bd-article").getBoundingClientRect();
    return r.right > art.right + 1 && getComputedStyle(e).position !== "fixed" &&
           !e.closest("pre, .highlight, .pst-scrollable-table-container, .table-wrapper");
  }).slice(0, 3).map((e) => e.tagName + "." + e.className);
  return JSON.stringify({
    main: box(".bd-main .bd-content") || box(".bd-main"),
    article: box(".bd-article"),
    navbar: box(".bd-header .bd-header__inner") || box(".bd-header"),
    page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
    header: shown, wide: wide,
    cut: [...document.querySelectorAll(".bd-article pre")].filter(
        (e) => e.scrollWidth > e.clientWidth + 1).length,
  });
})()
"""


class Chromium:
    """A headless Chromium page driven over the DevTools protocol."""

    def __init__(self, binary: str, profile: Path):
        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--window-size={WIDTH},{HEIGHT}", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            self._connect(profile)
        except BaseException:
            self._stop()
            raise

    def _connect(self, profile: Path) -> None:
        import websocket  # websocket-client

        port = self._port(profile)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json") as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("Chromium did not open a page")
            time.sleep(0.2)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60,
                                             suppress_origin=True)
        self.ids = itertools.count(1)
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                  deviceScaleFactor=1, mobile=False)

    def _port(self, profile: Path) -> int:
        marker = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not marker.is_file() or not marker.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Chromium did not start (exit code {self.proc.poll()})")
            time.sleep(0.1)
        return int(marker.read_text().split()[0])

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def wait_event(self, name: str) -> None:
        while json.loads(self.ws.recv()).get("method") != name:
            pass

    def open(self, path: Path) -> None:
        self.call("Page.navigate", url=path.as_uri())
        self.wait_event("Page.loadEventFired")
        # fonts and images settle
        self.call("Runtime.evaluate", expression="document.fonts.ready", awaitPromise=True)

    def evaluate(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return res["result"].get("value")

    def screenshot(self, out: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        out.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        self.ws.close()
        self._stop()

    def _stop(self) -> None:
        """End Chromium and the helper processes it started (its own session)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site() -> Path:
    if _chromium() is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    pytest.importorskip("websocket")
    pytest.importorskip("sphinx_gallery")
    pytest.importorskip("pydata_sphinx_theme")
    return built_site()


def _launch(attempts: int = 3) -> Iterator[Chromium]:
    """A started Chromium, in a fresh profile each attempt: under load (the
    other test worker busy, a second Chromium starting) one start in a CI
    run wrote no DevTools port within 30 s and the run failed."""
    for attempt in range(attempts):
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
            try:
                b = Chromium(_chromium() or "chromium", Path(profile))
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
                continue
            try:
                yield b
            finally:
                b.close()
            return


@pytest.fixture(scope="module")
def browser(site: Path) -> Iterator[Chromium]:
    yield from _launch()


def _pages(html: Path) -> list[Path]:
    skip = {"genindex.html", "search.html", "py-modindex.html"}
    return sorted(p for p in html.rglob("*.html")
                  if p.name not in skip and not p.relative_to(html).parts[0].startswith("_"))


def test_no_overflow_and_navigation_on_every_page(site: Path, browser: Chromium) -> None:
    pages = _pages(site)
    assert len(pages) > 30
    problems = []
    for page in pages:
        browser.open(page)
        m = json.loads(browser.evaluate(MEASURE))
        name = str(page.relative_to(site))
        for part in ("main", "article", "navbar", "page"):
            if m[part] and m[part][0] > m[part][1]:
                problems.append(f"{name}: {part} overflows ({m[part][0]} > {m[part][1]} px); "
                                f"wide elements {m['wide']}")
        if m["cut"]:
            problems.append(f"{name}: {m['cut']} code blocks cut off on the right")
        missing = {"User guide", "Gallery", "API reference"} - set(m["header"])
        if missing:
            problems.append(f"{name}: header links {sorted(missing)} not visible; shown "
                            f"{m['header']}")
    assert not problems, "\n".join(problems)


def test_screenshots(site: Path, browser: Chromium) -> None:
    out = BUILD / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    for name, (rel, target) in SCREENSHOTS.items():
        browser.open(site / rel)
        if target:
            found = browser.evaluate(f"(() => {{ const e = document.querySelector({target!r}); "
                                     f"if (e) e.scrollIntoView(); return !!e; }})()")
            assert found, (rel, target)
        shot = out / f"{name}.png"
        browser.screenshot(shot)
        assert shot.stat().st_size > 10_000, shot
