"""docs/scaling.rst: out-of-core Zarr pipelines, several processes and streamed saves,
each with code that runs, written with public names only.

The page's ``>>>`` examples run in tests/test_docs.py (``test_page_examples_run``);
the script it includes, docs/several_processes.py, runs on two processes in
tests/backends/test_multiprocess.py (``test_docs_script_runs_as_written``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import xstencil

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGE = DOCS / "scaling.rst"
SCRIPT = DOCS / "several_processes.py"


def _sections(text: str) -> dict[str, str]:
    """Section title -> its text (up to the next title of any level)."""
    lines = text.splitlines()
    starts = [i for i in range(len(lines) - 1)
              if lines[i].strip() and re.fullmatch(r"([=\-~^])\1{2,}", lines[i + 1].strip())
              and len(lines[i + 1].strip()) >= len(lines[i].strip())]
    return {lines[a].strip(): "\n".join(lines[a + 2:b])
            for a, b in zip(starts, [*starts[1:], len(lines)], strict=True)}


def _code(text: str) -> str:
    """The code of a page: doctest lines and indented code-block lines."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith((">>> ", "... ")):
            out.append(s[4:])
        elif line.startswith("   ") and s:
            out.append(s)
    return "\n".join(out)


@pytest.mark.parametrize("title", ["Out of core: Zarr in, Zarr out", "Several processes",
                                   "Streamed saves and restart"])
def test_each_topic_has_examples_that_run(title: str) -> None:
    body = _sections(PAGE.read_text())[title]
    assert body.count(">>> ") >= 5, f"section {title!r} of {PAGE.name} has no doctest"


def test_the_several_processes_script_is_shown_and_run() -> None:
    assert ".. literalinclude:: several_processes.py" in PAGE.read_text()
    test = Path(__file__).parent / "backends" / "test_multiprocess.py"
    assert '"several_processes.py"' in test.read_text()


def _not_public(code: str) -> list[str]:
    """The xstencil names in ``code`` that are private or not exported."""
    bad = re.findall(r"\bxstencil\._\w+", code)
    used = set(re.findall(r"\bxstencil\.([a-zA-Z]\w*)", code))
    used |= {n.strip() for m in re.findall(r"from xstencil import ([\w, ]+)", code)
             for n in m.split(",")}
    assert used or bad, "the check found no xstencil names: the extraction is broken"
    return sorted(set(bad) | {f"xstencil.{n}" for n in used - set(xstencil.__all__)})


def test_only_public_names() -> None:
    code = _code(PAGE.read_text()) + "\n" + SCRIPT.read_text()
    assert _not_public(code) == []


def test_the_public_name_check_catches_private_and_unexported_names() -> None:
    code = _code(">>> from xstencil._backends.shard import make_mesh\n"
                 "   n = xstencil.compile_count()\n"
                 "...     xstencil.not_a_name(T)\n"
                 ">>> from xstencil import gather, hidden\n")
    assert _not_public(code) == ["xstencil._backends", "xstencil.hidden",
                                 "xstencil.not_a_name"]
