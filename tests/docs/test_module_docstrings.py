"""A module docstring says what the module is for and cites its sources in 25 lines or fewer, with no
issue numbers: the long explanations live on the documentation site (docs/), the dated figures in
reports/. Every module of llmperf/ and kernels/ is read statically (ast), so nothing is imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("llmperf", "kernels")
MAX_LINES = 25
# An issue reference: "issue 9", "issues 22, 24", "Issue #22", or a bare "#70" (a `#` that starts a
# comment or a heading, or an anchor in a URL, is not one).
ISSUE = re.compile(r"\bissues?\s*#?\d+|(?<![\w&/#])#\d+\b", re.IGNORECASE)


def modules() -> list[Path]:
    """Every Python module of the packages, in a stable order."""
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def module_docstring(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))


def offences(path: Path) -> list[str]:
    """What is wrong with one module's docstring (empty: nothing)."""
    doc = module_docstring(path)
    if doc is None:
        return []
    found = []
    lines = len(doc.splitlines())
    if lines > MAX_LINES:
        found.append(f"{lines} lines (at most {MAX_LINES}: move the explanation to docs/)")
    found += [f"mentions an issue ({m.group(0)!r})" for m in ISSUE.finditer(doc)]
    return found


def test_the_packages_have_modules() -> None:
    assert len(modules()) >= 50


@pytest.mark.parametrize("text, hit", [
    ("as issue 24 asks", True), ("Issue #22's targets", True), ("since its PR #70", True),
    ("issues 9 and 22", True), ("`# comment` in an example", False), ("page.html#section-2", False),
    ("#include <immintrin.h>", False), ("an issue with the cache", False),
])
def test_issue_pattern(text: str, hit: bool) -> None:
    assert bool(ISSUE.search(text)) is hit


def test_module_docstrings_are_short_and_cite_no_issue() -> None:
    bad = {}
    for path in modules():
        name = path.relative_to(ROOT).as_posix()
        if found := offences(path):
            bad[name] = found
    assert not bad, "module docstrings over the rule:\n  " + "\n  ".join(
        f"{name}: {'; '.join(found)}" for name, found in bad.items())
