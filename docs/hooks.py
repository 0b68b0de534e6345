"""MkDocs hooks of the llmperf site (mkdocs.yml `hooks:`), three jobs:

1. The dated measurements stay in `reports/` (never copied into `docs/`): every `reports/**/*.md` becomes a
   page at the same path in the site, with a generated index (`reports/index.md`) listing them, and the
   notebooks are served as files under `notebooks/`. A page in `docs/` links to them as GitHub does,
   `../reports/<topic>/README.md`, and the link is rewritten here to the page in the site, so the same
   Markdown reads right on GitHub and in the strict build (which fails if the report is missing).
2. `<!-- llmperf-cli: NAME -->` (outside a code span) in a page is replaced by the options table of
   `llmperf NAME`, read from the typer app at build time (each option, its metavar, help and default, as
   `--help` prints them), so the tables never drift from the code. A group (`llmperf NAME SUB`) gets one
   table per subcommand.
3. After the build, a command of `llmperf` that no page shows is a warning, so the strict build fails
   until the command is documented.
4. `<!-- llmperf-columns: MODULE.NAME -->` is replaced by the names the code declares in that constant:
   a mapping (name -> description) as a table (`(title, title)` after the name sets its column titles),
   a tuple or an Enum as a list, so the schema pages and the lists of supported things are the code's.
5. `<!-- llmperf-output: ARGS -->` is replaced by what `llmperf ARGS` prints (100 columns), run at build
   time: a page shows real output without a pasted copy to go stale. A failing command fails the build.
"""

from __future__ import annotations

import logging
import posixpath
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.llmperf")

ROOT = Path(__file__).resolve().parent.parent  # the repository
if str(ROOT) not in sys.path:  # `mkdocs build` from a checkout that is not installed
    sys.path.insert(0, str(ROOT))
INCLUDED_ROOTS = ("reports", "notebooks")      # repository folders whose files the site serves
COLUMNS_MARKER = re.compile(r"(?<!`)<!--\s*llmperf-columns:\s*([\w.]+)\s*(?:\(([^)]*)\))?\s*-->(?!`)")
OUTPUT_MARKER = re.compile(r"(?<!`)<!--\s*llmperf-output:\s*(.+?)\s*-->(?!`)")
CLI_MARKER = re.compile(r"(?<!`)<!--\s*llmperf-cli:\s*([a-z0-9_ -]+?)\s*-->(?!`)")
LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")

_rendered: set[str] = set()


def on_config(config):  # noqa: ANN001, ANN201
    """Start a build with no command rendered yet (`mkdocs serve` rebuilds in one process)."""
    _rendered.clear()
    return config


def on_files(files: Files, config) -> Files:  # noqa: ANN001
    """Add the reports' Markdown as pages, a generated reports index, and the notebooks as files."""
    reports = sorted((ROOT / "reports").rglob("*.md"))
    for path in reports:
        files.append(File.generated(config, path.relative_to(ROOT).as_posix(), abs_src_path=str(path)))
    if not (ROOT / "reports" / "README.md").exists():
        files.append(File.generated(config, "reports/index.md", content=_reports_index(reports)))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        files.append(File.generated(config, path.relative_to(ROOT).as_posix(), abs_src_path=str(path)))
    seen: dict[str, str] = {}
    for file in files:  # a page of docs/ and a report must not land on the same URL (one would vanish)
        if file.dest_uri in seen:
            log.warning("docs: %s and %s are both built to %s: rename the page in docs/",
                        seen[file.dest_uri], file.src_uri, file.dest_uri)
        seen[file.dest_uri] = file.src_uri
    return files


def _reports_index(reports: list[Path]) -> str:
    lines = [
        "# Measured reports",
        "",
        "Every dated measurement lives in `reports/<topic>/` of the repository, beside the data it was",
        "computed from; the rest of this site links here rather than quoting figures without their",
        "source. These pages are the repository's own files, rendered as they are.",
        "",
    ]
    for path in reports:
        rel = path.relative_to(ROOT / "reports").as_posix()
        title = _first_heading(path) or rel
        lines.append(f"- [{title}]({rel}) (`reports/{rel}`)")
    return "\n".join(lines) + "\n"


def _first_heading(path: Path) -> str | None:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return None


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001
    """Rewrite links into `reports/` and `notebooks/`; expand the CLI markers."""
    src_uri = page.file.src_uri
    # a page of docs/: it sits in the repository at docs/<src_uri>
    if not src_uri.startswith(tuple(root + "/" for root in INCLUDED_ROOTS)):
        markdown = LINK.sub(lambda m: _rewrite_link(m, src_uri), markdown)
    markdown = OUTPUT_MARKER.sub(lambda m: _output(m.group(1), src_uri), markdown)
    markdown = COLUMNS_MARKER.sub(lambda m: _columns(m.group(1), src_uri, m.group(2)), markdown)
    return CLI_MARKER.sub(lambda m: _cli_section(m.group(1).split()), markdown)


def _output(args: str, src_uri: str) -> str:
    import shlex

    from typer.testing import CliRunner

    from llmperf.cli import app
    result = CliRunner().invoke(app, shlex.split(args), env={"COLUMNS": "100", "NO_COLOR": "1"})
    if result.exit_code != 0:
        log.warning("docs: %s: `llmperf %s` exited %s: %s", src_uri, args, result.exit_code, result.output[-500:])
    return f"```text\n$ llmperf {args}\n{result.output.rstrip()}\n```\n"


def _columns(dotted: str, src_uri: str, headers: str | None = None) -> str:
    """The names a constant declares: a mapping as a two-column table (`headers`: its two column titles,
    default `column, meaning`), a sequence or an Enum as an inline list."""
    import enum
    import importlib

    module, _, name = dotted.rpartition(".")
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        log.warning("docs: %s: <!-- llmperf-columns: %s --> names nothing importable (%s)", src_uri, dotted, exc)
        return ""
    if isinstance(value, type) and issubclass(value, enum.Enum):
        value = [member.value for member in value]
    if isinstance(value, Mapping):
        left, right = (h.strip() for h in (headers or "column, meaning").split(",", 1))
        rows = [f"| {left} | {right} |", "|---|---|"]
        rows += [f"| `{column}` | {_cell(str(text))} |" for column, text in value.items()]
        return "\n".join(rows) + "\n"
    return ", ".join(f"`{column}`" for column in value) + "\n"


def _rewrite_link(match: re.Match, src_uri: str) -> str:
    target = match.group(2)
    if "://" in target or target.startswith(("/", "mailto:")):
        return match.group(0)
    page_dir = posixpath.dirname(src_uri)
    in_repo = posixpath.normpath(posixpath.join("docs", page_dir, target))
    if not in_repo.startswith(tuple(root + "/" for root in INCLUDED_ROOTS)):
        return match.group(0)
    return match.group(1) + posixpath.relpath(in_repo, page_dir or ".") + match.group(3)


# ---- the command line -----------------------------------------------------------------------------------

def _root_command():  # noqa: ANN202
    import typer.main

    from llmperf.cli import app
    return typer.main.get_command(app)


def _walk(command, ctx, path: tuple[str, ...]):  # noqa: ANN001, ANN202
    """(path, command, context) of every leaf command under `command`."""
    names = command.list_commands(ctx) if hasattr(command, "list_commands") else None
    if names is None:
        yield path, command, ctx
        return
    for name in names:
        sub = command.get_command(ctx, name)
        if sub is None or getattr(sub, "hidden", False):
            continue
        yield from _walk(sub, sub.context_class(sub, info_name=name, parent=ctx), (*path, name))


def all_commands() -> list[str]:
    """Every leaf command of `llmperf`, as `estimate`, `bench kernels`, ... (also used by the tests)."""
    root = _root_command()
    ctx = root.context_class(root, info_name="llmperf")
    return [" ".join(path) for path, _, _ in _walk(root, ctx, ())]


def command_options(name: str) -> list[tuple[str, str, bool]]:
    """(option, help, is_argument) of every parameter of `llmperf NAME` (also used by the tests)."""
    root = _root_command()
    ctx = root.context_class(root, info_name="llmperf")
    for path, command, sub in _walk(root, ctx, ()):
        if " ".join(path) == name:
            rows = []
            for param in command.params:
                if getattr(param, "hidden", False):
                    continue
                record = param.get_help_record(sub)
                if record is None:
                    continue
                rows.append((record[0], record[1], param.param_type_name == "argument"))
            return rows
    raise KeyError(name)


def _cli_section(words: list[str]) -> str:
    prefix = " ".join(words)
    names = [n for n in all_commands() if n == prefix or n.startswith(prefix + " ")]
    if not names:
        log.warning("docs: <!-- llmperf-cli: %s --> names no command of llmperf (%s)",
                    prefix, ", ".join(all_commands()))
        return ""
    parts = []
    for name in names:
        _rendered.add(name)
        if name != prefix:
            parts.append(f"#### `llmperf {name}`\n")
        parts.append(_options_table(name))
    return "\n".join(parts)


def _options_table(name: str) -> str:
    lines = ["| option | what it sets (default) |", "|---|---|"]
    for option, text, is_argument in command_options(name):
        if is_argument:  # `model <str>` -> `MODEL <str>`, as typer's usage line names it
            name, _, rest = option.partition(" ")
            option = f"{name.upper()} {rest}".strip()
        lines.append(f"| `{option}` | {_cell(text)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Help text as one Markdown table cell: `|` and `<` escaped outside code spans (a pipe inside one does
    not split the cell), so that it reads as text."""
    pieces = text.replace("\n", " ").split("`")
    for i in range(0, len(pieces), 2):  # even pieces are outside code spans
        pieces[i] = pieces[i].replace("<", "&lt;").replace("|", "\\|")
    return "`".join(pieces)


def on_post_build(config) -> None:  # noqa: ANN001
    """A command that no page shows fails the strict build."""
    missing = [name for name in all_commands() if name not in _rendered]
    if missing:
        log.warning("docs: no page shows the options of `llmperf %s`: add <!-- llmperf-cli: NAME --> to docs/cli.md",
                    "`, `llmperf ".join(missing))
