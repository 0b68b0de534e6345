"""A missing docstring fails: every module of the API reference (the `::: module` lines of docs/api/*.md),
and every public class, function, method and property defined in it, has a docstring. Read statically
with griffe, as mkdocstrings reads them, so nothing is imported."""

from __future__ import annotations

import re

import pytest

from docblocks import DOCS, ROOT

griffe = pytest.importorskip("griffe", reason="the docs need griffe (pip install -e '.[test]')")


def documented_modules() -> list[str]:
    """The modules the API reference renders."""
    found = []
    for page in sorted((DOCS / "api").glob("*.md")):
        found += re.findall(r"^::: ([\w.]+)", page.read_text(encoding="utf-8"), flags=re.M)
    return found


def undocumented(module_path: str, package) -> list[str]:  # noqa: ANN001
    """Dotted paths of the public objects of one module that have no docstring (itself included)."""
    module = package
    for part in module_path.split(".")[1:]:
        module = module.members[part]
    missing = [module.path] if not (module.docstring and module.docstring.value.strip()) else []

    def walk(obj) -> None:  # noqa: ANN001
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias or member.is_module:
                continue  # private, imported from elsewhere, or a submodule (documented on its own)
            if not (member.is_class or member.is_function):
                continue
            if not (member.docstring and member.docstring.value.strip()):
                missing.append(member.path)
            if member.is_class:
                walk(member)

    walk(module)
    return missing


def test_the_api_reference_documents_modules() -> None:
    assert len(documented_modules()) >= 10


def test_every_public_object_has_a_docstring() -> None:
    modules = documented_modules()
    assert {m.split(".")[0] for m in modules} == {"llmperf"}, modules
    package = griffe.GriffeLoader(search_paths=[str(ROOT)]).load("llmperf")  # once: each load reads the package
    offenders = [path for module in modules for path in undocumented(module, package)]
    assert not offenders, f"{len(offenders)} public objects of the API reference have no docstring:\n  " + \
        "\n  ".join(offenders)
