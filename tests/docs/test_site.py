"""The documentation site builds strictly (`mkdocs build --strict`, as CI runs it): a broken link, a missing
anchor, a bad `::: module` reference, a report page that is gone, or an `llmperf` command no page shows
fails the build; and the built pages hold what they promise (every option of every command, every
documented module)."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from docblocks import DOCS, ROOT

pytest.importorskip("mkdocs", reason="the docs need mkdocs (pip install -e '.[test]')")
pytest.importorskip("mkdocstrings", reason="the docs need mkdocstrings[python] (pip install -e '.[test]')")
pytest.importorskip("material", reason="the docs need mkdocs-material (pip install -e '.[test]')")


def _hooks():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("llmperf_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory):  # noqa: ANN001, ANN201
    """The site, built once for this module, strictly, into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "NO_COLOR": "1", "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"),
                           "--site-dir", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return out, proc


def test_strict_build_has_no_warning(site) -> None:  # noqa: ANN001
    _, proc = site
    log = proc.stdout + proc.stderr
    warnings = [line for line in log.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert proc.returncode == 0 and not warnings, \
        "mkdocs build --strict failed:\n" + "\n".join(warnings or [log[-4000:]])


def test_cli_page_shows_every_option_of_every_command(site) -> None:  # noqa: ANN001
    out, _ = site
    text = html.unescape((out / "cli" / "index.html").read_text(encoding="utf-8"))
    hooks = _hooks()
    missing = []
    for name in hooks.all_commands():
        for option, _, is_argument in hooks.command_options(name):
            names = [option.split()[0].upper()] if is_argument else re.findall(r"--?[\w-]+", option.split(" <")[0])
            missing += [f"llmperf {name} {flag}" for flag in names if flag not in text]
    assert not missing, f"the CLI page lacks: {missing}"


def test_api_pages_document_their_modules(site) -> None:  # noqa: ANN001
    out, _ = site
    for page in sorted((DOCS / "api").glob("*.md")):
        modules = re.findall(r"^::: ([\w.]+)", page.read_text(encoding="utf-8"), flags=re.M)
        built = out / "api" / ("" if page.stem == "index" else page.stem) / "index.html"
        text = built.read_text(encoding="utf-8")
        for module in modules:
            assert f'id="{module}"' in text, f"{page.name}: `::: {module}` rendered nothing"


def test_every_report_is_a_page(site) -> None:  # noqa: ANN001
    out, _ = site
    for report in sorted((ROOT / "reports").rglob("*.md")):
        rel = report.relative_to(ROOT).with_suffix("")
        built = out / (rel.parent if rel.name == "README" else rel) / "index.html"
        assert built.exists(), f"{report.relative_to(ROOT)} is not in the site"


def test_schema_page_lists_every_column_in_order(site) -> None:  # noqa: ANN001
    """The Output schemas page's table of `estimate` / `sweep` columns is `COLUMNS`, every column in schema order
    (the page renders the constant, so it cannot drift; this checks the rendering)."""
    from llmperf.analysis.schema import COLUMNS

    out, _ = site
    text = html.unescape((out / "schemas" / "index.html").read_text(encoding="utf-8"))
    section = text.split('id="estimate-and-sweep"', 1)[1].split('id="simulate-run-directory"', 1)[0]
    named = re.findall(r"<tr>\s*<td><code>([^<]+)</code></td>", section)
    assert named == list(COLUMNS)
