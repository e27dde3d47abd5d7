"""The README is the front door (issue 38): under 300 lines, every relative link of it and of docs/ resolves (the file,
and the heading an anchor names), the reference moved to docs/ is reachable from it, and its test command is what
CI runs (.ci/run)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# What moved out of the README, by the page it moved to and a heading there.
MOVED = {"docs/cli.md": ("## attr-compute", "### Faithfulness metrics", "### Export to Parquet or CSV", "## attr-tui"),
         "docs/store.md": ("## Store schema (format 2.1)", "## Python API"),
         "docs/benchmarks.md": ("## GPU work (issue 26): kernel launches, fused kernels, the run pipeline",
                                "## Method costs on the CPU"),
         "docs/testing.md": ("## What runs, and how long",),
         "docs/method-details.md": ("## The families' computation", "## Mask-LRP on the shared model (SST-2)",
                                    "## Departures from the reference code"),
         "docs/layout.md": ("# Layout",)}


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings (lower case, punctuation dropped, spaces as hyphens)."""
    out, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # code is not a link
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_readme_is_under_300_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) < 300


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert broken == []


def test_every_moved_section_is_reachable_from_the_readme():
    linked = {unquote(t.partition("#")[0]) for t in relative_links(README)}
    for page, headings in MOVED.items():
        assert page in linked, page
        lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
        for h in headings:
            assert h in lines, (page, h)


def test_the_readme_test_command_is_what_ci_runs():
    blocks = re.findall(r"```\n(.*?)\n```", README.read_text(encoding="utf-8"), flags=re.S)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert ci in blocks
    assert "pip install torch==2.13.0 && pip install -e . && attr-compute" in blocks  # the first command: the job
