"""The fenced code blocks of the documentation pages, and how each one runs.

A block runs unless the line before it (blank lines aside) is `<!-- norun -->`:

- ```python: executed with `exec`, in one namespace per page, in page order (a block may use the names
  an earlier block of its page defined);
- ```bash, ```console, ```shell: each command is an `llmperf ...` line (in ```console, the lines that
  start with `$ `; the others are its output), run through `llmperf.cli.app` with typer's CliRunner.
  A command that is not `llmperf` (pip, python -m, a GPU benchmark) is an error: write it in a
  ```text block, or mark its block `<!-- norun -->`;
- any other language (text, yaml, json, ...) is shown, not run.

A block of any language after `<!-- file: NAME -->` is also written to NAME in the scratch folder
before the page's later blocks run, so a page can show a YAML file and then run a command on it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
NORUN = "<!-- norun -->"
FILE = re.compile(r"<!--\s*file:\s*([\w./-]+)\s*-->")
SHELL_LANGS = frozenset({"bash", "console", "shell", "sh"})
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")


@dataclass(frozen=True, kw_only=True)
class Block:
    """One fenced block: its page, the line of its opening fence (1-based), language, text and whether it runs."""

    page: Path
    line: int
    lang: str
    text: str
    runs: bool
    file: str | None = None  # written to this path (relative to the scratch folder) when the page runs

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"


def pages() -> list[Path]:
    """Every Markdown page under docs/."""
    return sorted(DOCS.rglob("*.md"))


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of one page, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    previous = ""  # the last non-blank line outside a block
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        fence, indent, start = match.group("fence"), len(match.group("indent")), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        file = FILE.fullmatch(previous)
        out.append(Block(page=page, line=start + 1, lang=match.group("lang").lower(), text="\n".join(body) + "\n",
                         runs=previous != NORUN, file=file.group(1) if file else None))
        previous = ""
        i += 1
    return out


def shell_commands(block: Block) -> list[list[str]]:
    """The commands of a shell block, each as argv (backslash continuations joined, comments dropped)."""
    raw = block.text.splitlines()
    if block.lang == "console":
        raw = [line[2:] for line in raw if line.startswith("$ ")]
    joined: list[str] = []
    carry = ""
    for line in raw:
        if line.rstrip().endswith("\\"):
            carry += line.rstrip()[:-1] + " "
            continue
        joined.append(carry + line)
        carry = ""
    commands = []
    for line in joined:
        argv = shlex.split(line, comments=True)
        if argv:
            commands.append(argv)
    return commands
