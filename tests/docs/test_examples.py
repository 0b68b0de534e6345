"""Every example in the documentation runs: each page's ```python blocks in order, in one namespace, and
each `llmperf ...` command of its ```bash / ```console blocks through typer's CliRunner, all with exit
code 0, in a scratch folder (docblocks.py says which blocks run and how to mark one that must not)."""

from __future__ import annotations

import importlib.util
import os
import re
import traceback

import pytest
from typer.testing import CliRunner

from docblocks import DOCS, NORUN, ROOT, SHELL_LANGS, Block, blocks, pages, shell_commands

PAGES = pages()


@pytest.fixture
def scratch(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    """A scratch working folder where `reports/` and `models_spec/` resolve as from the repository root.
    The cache folder stays the suite's (`LLMPERF_CACHE_DIR`): a fresh one would compile the engine's CPU
    kernels again (seconds), and no example that runs writes to it (`calibrate` examples are norun)."""
    for name in ("reports", "models_spec"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("COLUMNS", "100")
    return tmp_path


def test_the_docs_have_examples() -> None:
    runnable = [b for p in PAGES for b in blocks(p) if b.runs and (b.lang == "python" or b.lang in SHELL_LANGS)]
    assert len(runnable) >= 10, [b.where for b in runnable]


def test_norun_is_used_sparingly() -> None:
    """`<!-- norun -->` is for what cannot run here (a GPU, a long measurement), not for a broken example."""
    skipped = [b.where for p in PAGES for b in blocks(p) if not b.runs]
    total = sum(1 for p in PAGES for b in blocks(p) if b.lang == "python" or b.lang in SHELL_LANGS)
    assert len(skipped) <= max(3, total // 3), f"{len(skipped)} of {total} blocks are marked {NORUN}: {skipped}"


def missing_extras(page) -> list[str]:  # noqa: ANN001
    """Optional packages the page's examples need that are not installed (the page is then skipped):
    torch for the engine, the kernels and the measuring commands, matplotlib for `llmperf report`."""
    needs = set()
    for block in blocks(page):
        if not block.runs:
            continue
        if block.lang == "python" and re.search(r"\b(torch|kernels|llmperf\.engine|llmperf\.measure)\b", block.text):
            needs.add("torch")
        if block.lang in SHELL_LANGS:
            for argv in shell_commands(block):
                if argv[:2] in (["llmperf", "profile"], ["llmperf", "calibrate"]):
                    needs.add("torch")
                if argv[:2] == ["llmperf", "report"]:
                    needs.add("matplotlib")
    return sorted(n for n in needs if importlib.util.find_spec(n) is None)


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(DOCS).as_posix() for p in PAGES])
def test_page_examples_run(page, scratch) -> None:  # noqa: ANN001
    from llmperf.cli import app

    if missing := missing_extras(page):
        pytest.skip(f"the examples need {', '.join(missing)} (pip install -e '.[test]')")
    namespace: dict = {"__name__": "__docs__"}
    runner = CliRunner()
    for block in blocks(page):
        if block.file is not None:
            assert not block.file.startswith("/") and ".." not in block.file, f"{block.where}: {block.file}"
            (scratch / block.file).parent.mkdir(parents=True, exist_ok=True)
            (scratch / block.file).write_text(block.text, encoding="utf-8")
        if not block.runs:
            continue
        if block.lang == "python":
            _run_python(block, namespace)
        elif block.lang in SHELL_LANGS:
            for argv in shell_commands(block):
                assert argv[0] == "llmperf", (
                    f"{block.where}: `{' '.join(argv)}` is not an llmperf command: write it in a ```text block "
                    f"or mark the block {NORUN}")
                result = runner.invoke(app, argv[1:])
                if result.exception is not None and not isinstance(result.exception, SystemExit):
                    detail = "".join(traceback.format_exception(result.exception))
                else:
                    detail = result.output
                assert result.exit_code == 0, f"{block.where}: `{' '.join(argv)}` exited {result.exit_code}:\n{detail}"


def _run_python(block: Block, namespace: dict) -> None:
    code = compile(block.text, block.where, "exec")
    cwd = os.getcwd()
    try:
        exec(code, namespace)  # noqa: S102 - the documentation's own examples
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"{block.where}: the example raised {exc!r}\n{traceback.format_exc()}") from exc
    finally:
        os.chdir(cwd)
