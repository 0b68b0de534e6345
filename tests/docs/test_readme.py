"""The README stays a short front page: its relative links resolve, its quick start is the two commands CI
runs, and its length stays near 200 lines (the rest belongs to the docs pages in docs/)."""

from __future__ import annotations

import re

from docblocks import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_short() -> None:
    assert len(README.splitlines()) <= 220


def test_readme_links_resolve() -> None:
    targets = re.findall(r"\]\(([^)\s]+)\)", README)
    missing = [t for t in targets if "://" not in t and not (ROOT / t.split("#", 1)[0]).exists()]
    assert targets and not missing, missing


def test_readme_quick_start_is_the_two_commands() -> None:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert block == ['pip install -e . && llmperf estimate',
                     'pip install -e ".[test]" -c constraints.txt && python -m pytest -q']
    assert '-e ".[test]" -c constraints.txt' in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_indexes_every_docs_page() -> None:
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    assert [p for p in pages if p not in README] == []
